//! Host-side description of kernels: what the launcher needs to know.

use core::ffi::c_void;

/// A kernel declared with [`#[kernel]`](crate::kernel).
///
/// Implemented by the zero-sized marker type the macro emits next to the
/// function; the host launcher uses it to find the PTX entry point by name
/// and to run the same function on the CPU emulator.
pub trait Kernel: 'static {
    /// PTX entry point name (the function's name, unmangled).
    const NAME: &'static str;
    /// Marked `#[kernel(no_spill)]`: the PTX check fails on local-memory spills.
    const NO_SPILL: bool;
    /// `#[kernel(launch_bounds(threads = N, ...))]`: the most threads per
    /// block the entry may be launched with (the PTX says `.maxntid N`);
    /// 0 when unbounded (1024).
    const MAX_THREADS: u32 = 0;
    /// The parameter types, as a tuple.
    type Args: KernelArgs;
    /// Runs the kernel body on the calling thread (one emulated GPU thread).
    ///
    /// # Safety
    /// The kernel's own contract (valid pointers, sizes) must hold, and the
    /// caller must be a thread set up by [`crate::emu`].
    unsafe fn emulate(args: Self::Args);
}

/// A value that can be passed by value as a kernel parameter.
///
/// # Safety
/// The type's in-memory representation must be exactly what the PTX entry
/// point declares for that parameter (size and alignment), as for
/// `#[repr(C)]` plain-data structs, integers, floats and raw pointers.
pub unsafe trait KernelParam: Copy + 'static {}

macro_rules! params {
    ($($t:ty),*) => { $(
        // SAFETY: scalar with the same size/alignment as its PTX .param.
        unsafe impl KernelParam for $t {}
    )* };
}
params!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64);
// SAFETY: pointers are 64-bit on both nvptx64 and the host.
unsafe impl<T: 'static> KernelParam for *const T {}
// SAFETY: as above.
unsafe impl<T: 'static> KernelParam for *mut T {}

/// The argument tuple of a kernel.
pub trait KernelArgs: Copy + 'static {
    /// Number of parameters.
    const LEN: usize;
    /// Pointers to each parameter value inside `self`, in order, as
    /// `cuLaunchKernel` expects them.
    fn param_ptrs(&mut self) -> Vec<*mut c_void>;
}

macro_rules! tuple_args {
    ($($n:tt $T:ident),*) => {
        impl<$($T: KernelParam),*> KernelArgs for ($($T,)*) {
            const LEN: usize = 0 $(+ { let _ = $n; 1 })*;
            #[allow(unused_mut)]
            fn param_ptrs(&mut self) -> Vec<*mut c_void> {
                let mut v = Vec::with_capacity(Self::LEN);
                $( v.push(&mut self.$n as *mut $T as *mut c_void); )*
                v
            }
        }
    };
}
tuple_args!();
tuple_args!(0 A);
tuple_args!(0 A, 1 B);
tuple_args!(0 A, 1 B, 2 C);
tuple_args!(0 A, 1 B, 2 C, 3 D);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L, 12 M);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L, 12 M, 13 N);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L, 12 M, 13 N, 14 O);
tuple_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L, 12 M, 13 N, 14 O, 15 P);

/// A kernel family written once, generic over its transport, and exported
/// per transport by `#[kernel(transports(A, B))]`: `<k as
/// ForTransport<A>>::Kernel` is the entry point `k_a`. Host code generic
/// over the transport picks the entry with it.
pub trait ForTransport<T> {
    /// The entry point of this family for transport `T`.
    type Kernel: Kernel;
}

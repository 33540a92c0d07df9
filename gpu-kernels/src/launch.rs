//! Host-side description of kernels: what the launcher needs to know.

use core::any::{Any, TypeId};
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
///
/// The transport handle is the family's first parameter; [`Self::Rest`] is
/// the tuple of the others, and [`Self::args`] joins a handle and the rest
/// into the entry's argument tuple, which is what lets the host launch a
/// family with one call whatever its transport (`Stream::launch_family` in
/// the `doorbell` crate).
#[diagnostic::on_unimplemented(
    message = "kernel family `{Self}` is not exported for transport `{T}`",
    label = "no entry of `{Self}` for `{T}`",
    note = "list the transport in the family's `#[kernel(transports(...))]`, or launch it with a transport it lists"
)]
pub trait ForTransport<T> {
    /// The entry point of this family for transport `T`.
    type Kernel: Kernel;
    /// The parameters after the transport handle, as a tuple (`()` when the
    /// handle is the only one).
    type Rest: Copy + 'static;
    /// The entry's arguments: the handle `t` followed by `rest`.
    fn args(t: T, rest: Self::Rest) -> <Self::Kernel as Kernel>::Args;
}

/// One transport a kernel family is exported for.
#[derive(Clone, Copy, Debug)]
pub struct FamilyEntry {
    /// The transport's name: its type's name in snake case, the entry's
    /// suffix (`"p2p"` for `P2p`, `"soft_nic"` for `SoftNic`).
    pub transport: &'static str,
    /// The transport type's `TypeId::of` (a handle of that type launches
    /// this entry).
    pub transport_type: fn() -> TypeId,
    /// The PTX entry point of the family for that transport (e.g. `"k_p2p"`).
    pub entry: &'static str,
}

/// A kernel family declared with `#[kernel(transports(...))]`: its name and
/// every entry it exports. Implemented by the family's marker type.
pub trait KernelFamily: 'static {
    /// The family's name (the generic function's).
    const NAME: &'static str;
    /// One entry per transport, in the order `transports(...)` lists them.
    const ENTRIES: &'static [FamilyEntry];
}

/// Receives a family's entry chosen at run time, with its arguments
/// (see [`AnyFamily::visit_entry`]).
pub trait EntryVisitor {
    /// What the visit returns.
    type Output;
    /// Called once, with the chosen entry `K` and its full argument tuple.
    fn visit<K: Kernel>(self, args: K::Args) -> Self::Output;
}

/// A kernel family whose parameters after the transport handle do not
/// depend on the transport: one [`Self::Rest`] fits every entry, so the
/// entry can be chosen from a handle whose type is known only at run time.
/// `#[kernel(transports(...))]` implements it whenever no parameter but
/// the first names the transport type.
#[diagnostic::on_unimplemented(
    message = "kernel family `{Self}` cannot be launched with a transport handle chosen at run time",
    label = "its entries take different arguments after the handle",
    note = "a parameter after the transport handle names the transport type; launch it with a concrete handle (P2p, Ibgda, Routed, Proxy)"
)]
pub trait AnyFamily: KernelFamily {
    /// The parameters after the transport handle, as a tuple: the same
    /// type as `<Self as ForTransport<T>>::Rest` for every exported `T`.
    type Rest: Copy + 'static;
    /// If `handle` is a value of one of the family's transport types, calls
    /// `visitor` with that transport's entry and the arguments `handle`
    /// followed by `rest`, and returns its output; `None` (and `visitor`
    /// unused) when the family is not exported for the handle's type.
    fn visit_entry<V: EntryVisitor>(handle: &dyn Any, rest: Self::Rest, visitor: V) -> Option<V::Output>;
}

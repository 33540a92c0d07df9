//! Tier 1: one always-inline function per PTX instruction.
//!
//! Every function has two bodies: inline asm on `nvptx64`, and the emulator's
//! host implementation with the same semantics elsewhere. Memory-ordering
//! primitives are generated from tables below, named
//! `<op>_<sem>_<scope>_<type>`; a golden-PTX test checks that each emits the
//! instruction its name spells.
//!
//! Addresses are generic (no state space in the instruction), so the same
//! primitive works on global, shared, peer (P2P) and mapped host memory.
//!
//! Scopes: `cta` (threads of one block), `gpu` (all threads of one GPU),
//! `sys` (the GPU, its peers over NVLink/PCIe, the CPU and the NIC). On the
//! emulator every scope behaves as `sys` — stronger than the GPU, so a missing
//! scope is caught by the golden/PTX tests and GPU runs, not by the emulator.
//!
//! Never mark an asm block that orders memory `nomem`/`pure`; only the index
//! reads below are.

#![allow(clippy::missing_safety_doc)]

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

#[cfg(not(target_arch = "nvptx64"))]
use crate::emu;

// ---------------------------------------------------------------------------
// Indices
// ---------------------------------------------------------------------------

macro_rules! special_reg {
    ($( $(#[$m:meta])* $name:ident => $reg:literal, $field:ident, $i:tt; )*) => { $(
        $(#[$m])*
        #[inline(always)]
        pub fn $name() -> u32 {
            #[cfg(target_arch = "nvptx64")]
            {
                let r: u32;
                // SAFETY: reads a special register; no memory is touched.
                unsafe { asm!(concat!("mov.u32 {0}, ", $reg, ";"), out(reg32) r, options(nomem, nostack, pure)) };
                r
            }
            #[cfg(not(target_arch = "nvptx64"))]
            { emu::with_thread(|t| t.$field[$i]) }
        }
    )* };
}

special_reg! {
    /// `%tid.x`: thread index in the block.
    thread_idx_x => "%tid.x", thread_idx, 0;
    /// `%tid.y`
    thread_idx_y => "%tid.y", thread_idx, 1;
    /// `%tid.z`
    thread_idx_z => "%tid.z", thread_idx, 2;
    /// `%ntid.x`: block size.
    block_dim_x => "%ntid.x", block_dim, 0;
    /// `%ntid.y`
    block_dim_y => "%ntid.y", block_dim, 1;
    /// `%ntid.z`
    block_dim_z => "%ntid.z", block_dim, 2;
    /// `%ctaid.x`: block index in the grid.
    block_idx_x => "%ctaid.x", block_idx, 0;
    /// `%ctaid.y`
    block_idx_y => "%ctaid.y", block_idx, 1;
    /// `%ctaid.z`
    block_idx_z => "%ctaid.z", block_idx, 2;
    /// `%nctaid.x`: grid size in blocks.
    grid_dim_x => "%nctaid.x", grid_dim, 0;
    /// `%nctaid.y`
    grid_dim_y => "%nctaid.y", grid_dim, 1;
    /// `%nctaid.z`
    grid_dim_z => "%nctaid.z", grid_dim, 2;
}

/// `%laneid`: lane of the calling thread in its warp (0..32).
#[inline(always)]
pub fn lane_id() -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: reads a special register.
        unsafe { asm!("mov.u32 {0}, %laneid;", out(reg32) r, options(nomem, nostack, pure)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::with_thread(|t| t.lane)
    }
}

/// `%smid` and `%warpid`: the SM the calling thread runs on and its warp's
/// slot on that SM. Together they tell apart every warp resident at one
/// moment (a warp's pair may change over its life and be reused after it
/// exits). The emulator gives the block's linear index and the thread's
/// rank in its block: each emulated thread is a warp of its own there,
/// since emulated lanes do not run in lockstep.
#[inline(always)]
pub fn sm_and_warp_slot() -> (u32, u32) {
    #[cfg(target_arch = "nvptx64")]
    {
        let (sm, warp): (u32, u32);
        // SAFETY: reads special registers. Not `pure`: they may change.
        unsafe {
            asm!("mov.u32 {0}, %smid;", out(reg32) sm, options(nomem, nostack));
            asm!("mov.u32 {0}, %warpid;", out(reg32) warp, options(nomem, nostack));
        }
        (sm, warp)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        (
            block_idx_x() + grid_dim_x() * (block_idx_y() + grid_dim_y() * block_idx_z()),
            thread_rank_in_block(),
        )
    }
}

/// Warp size (32 on every NVIDIA GPU this crate targets).
pub const WARP_SIZE: u32 = 32;

/// Linear thread index in the block (x fastest).
#[inline(always)]
pub fn thread_rank_in_block() -> u32 {
    thread_idx_x() + block_dim_x() * (thread_idx_y() + block_dim_y() * thread_idx_z())
}

/// Warp index in the block.
#[inline(always)]
pub fn warp_id_in_block() -> u32 {
    thread_rank_in_block() / WARP_SIZE
}

/// `blockIdx.x * blockDim.x + threadIdx.x`.
#[inline(always)]
pub fn global_thread_id_x() -> u32 {
    block_idx_x() * block_dim_x() + thread_idx_x()
}

/// `gridDim.x * blockDim.x`: the stride of a grid-stride loop.
#[inline(always)]
pub fn grid_stride_x() -> u32 {
    grid_dim_x() * block_dim_x()
}

// ---------------------------------------------------------------------------
// Barriers, warp collectives
// ---------------------------------------------------------------------------

/// `bar.sync 0`: block-wide barrier; also orders shared and global memory
/// among the block's threads (CTA scope). Every non-exited thread of the
/// block must call it, at this same call in the code: `bar.sync` is
/// `barrier.sync.aligned`, which PTX allows only where every thread of a
/// warp executes the same barrier instruction. Where the threads arrive
/// from different paths (thread 0 did work alone just before), the compiler
/// may duplicate the barrier into each path: use [`sync_threads_divergent`]
/// there.
///
/// Built with the device trace's hooks (the `trace` feature), it is the
/// non-aligned `barrier.sync 0` instead: the hooks add branches taken by
/// one thread next to barriers, which the compiler may turn into copies
/// of an aligned barrier on divergent paths (a hang).
#[inline(always)]
pub fn sync_threads() {
    #[cfg(all(target_arch = "nvptx64", not(feature = "trace")))]
    // SAFETY: a barrier; the asm orders memory, so no `nomem`.
    unsafe {
        asm!("bar.sync 0;", options(nostack))
    };
    #[cfg(all(target_arch = "nvptx64", feature = "trace"))]
    // SAFETY: as above.
    unsafe {
        asm!("barrier.sync 0;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    emu::block_barrier();
}

/// `barrier.sync 0`: [`sync_threads`] in its non-aligned form, which the
/// threads of a warp may reach at different instructions. For a barrier
/// after work one thread did alone (`barrier_block`): LLVM copied the
/// aligned barrier there into the thread-0 path and the others' path, and
/// the block hung on an H200.
#[inline(always)]
pub fn sync_threads_divergent() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a barrier; the asm orders memory, so no `nomem`.
    unsafe {
        asm!("barrier.sync 0;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    emu::block_barrier();
}

/// `bar.red.or.pred`: [`sync_threads`] that also returns whether any
/// thread of the block passed `pred` true (CUDA's `__syncthreads_or`).
/// Every non-exited thread of the block must call it. Non-aligned
/// (`barrier.red`) with the `trace` feature, as [`sync_threads`].
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    #[cfg(target_arch = "nvptx64")]
    {
        let out: u32;
        // SAFETY: a barrier with a reduction; it orders memory, so no `nomem`.
        unsafe {
            asm!(
                #[cfg(not(feature = "trace"))]
                "{{ .reg .pred p, q; setp.ne.u32 p, {i}, 0; bar.red.or.pred q, 0, p; selp.u32 {o}, 1, 0, q; }}",
                #[cfg(feature = "trace")]
                "{{ .reg .pred p, q; setp.ne.u32 p, {i}, 0; barrier.red.or.pred q, 0, p; selp.u32 {o}, 1, 0, q; }}",
                i = in(reg32) pred as u32,
                o = out(reg32) out,
                options(nostack)
            )
        };
        out != 0
    }
    #[cfg(not(target_arch = "nvptx64"))]
    emu::block_barrier_or(pred)
}

/// `bar.warp.sync mask`: the lanes in `mask` converge; orders memory among
/// them. Called by every lane in `mask`.
#[inline(always)]
pub fn sync_warp(mask: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a warp barrier.
    unsafe {
        asm!("bar.warp.sync {0};", in(reg32) mask, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    emu::warp_barrier(mask);
}

/// Full-warp mask.
pub const FULL_MASK: u32 = 0xffff_ffff;

macro_rules! shfl {
    ($( $(#[$m:meta])* $name:ident, $mode:literal, $clamp:literal, $emu:ident; )*) => { $(
        $(#[$m])*
        ///
        /// Collective over the lanes in `mask` (all of them must call it with
        /// the same mask; lanes outside it are not waited for).
        #[inline(always)]
        pub fn $name(mask: u32, value: u32, lane_arg: u32) -> u32 {
            #[cfg(target_arch = "nvptx64")]
            {
                let r: u32;
                // SAFETY: register-to-register exchange among lanes.
                unsafe {
                    asm!(concat!("shfl.sync.", $mode, ".b32 {0}, {1}, {2}, ", $clamp, ", {3};"),
                        out(reg32) r, in(reg32) value, in(reg32) lane_arg, in(reg32) mask, options(nostack))
                };
                r
            }
            #[cfg(not(target_arch = "nvptx64"))]
            emu::shuffle(mask, value, emu::ShuffleMode::$emu(lane_arg))
        }
    )* };
}

shfl! {
    /// `shfl.sync.idx`: value of lane `lane_arg`.
    shfl_sync_idx_u32, "idx", "0x1f", Idx;
    /// `shfl.sync.down`: value of lane `lane + lane_arg` (own value past the end).
    shfl_sync_down_u32, "down", "0x1f", Down;
    /// `shfl.sync.up`: value of lane `lane - lane_arg` (own value below 0).
    shfl_sync_up_u32, "up", "0x0", Up;
    /// `shfl.sync.bfly`: value of lane `lane ^ lane_arg`.
    shfl_sync_xor_u32, "bfly", "0x1f", Xor;
}

/// [`shfl_sync_down_u32`] on an `f32`'s bits.
#[inline(always)]
pub fn shfl_sync_down_f32(mask: u32, value: f32, delta: u32) -> f32 {
    f32::from_bits(shfl_sync_down_u32(mask, value.to_bits(), delta))
}

/// [`shfl_sync_xor_u32`] on an `f32`'s bits.
#[inline(always)]
pub fn shfl_sync_xor_f32(mask: u32, value: f32, lane_mask: u32) -> f32 {
    f32::from_bits(shfl_sync_xor_u32(mask, value.to_bits(), lane_mask))
}

/// [`shfl_sync_idx_u32`] for a `u64` (two 32-bit shuffles).
#[inline(always)]
pub fn shfl_sync_idx_u64(mask: u32, value: u64, src: u32) -> u64 {
    let lo = shfl_sync_idx_u32(mask, value as u32, src);
    let hi = shfl_sync_idx_u32(mask, (value >> 32) as u32, src);
    (hi as u64) << 32 | lo as u64
}

/// `vote.sync.ballot.b32`: bit `i` set when lane `i` passed `pred`.
#[inline(always)]
pub fn vote_sync_ballot(mask: u32, pred: bool) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: warp vote on registers.
        unsafe {
            asm!("{{ .reg .pred p; setp.ne.u32 p, {1}, 0; vote.sync.ballot.b32 {0}, p, {2}; }}",
                out(reg32) r, in(reg32) pred as u32, in(reg32) mask, options(nostack))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    emu::ballot(mask, pred)
}

/// `vote.sync.any.pred`: true when any lane in `mask` passed `pred`.
#[inline(always)]
pub fn vote_sync_any(mask: u32, pred: bool) -> bool {
    vote_sync_ballot(mask, pred) & mask != 0
}

/// `vote.sync.all.pred`: true when every lane in `mask` passed `pred`.
#[inline(always)]
pub fn vote_sync_all(mask: u32, pred: bool) -> bool {
    let b = vote_sync_ballot(mask, pred);
    #[cfg(not(target_arch = "nvptx64"))]
    let mask = mask & emu::active_lane_mask();
    b & mask == mask
}

// ---------------------------------------------------------------------------
// Memory ordering table
// ---------------------------------------------------------------------------

macro_rules! gen_ld {
    ($scope:ident, $sem:ident, $ord:ident, $ty:ident, $aty:ident, $reg:ident) => {
        paste::paste! {
            #[doc = concat!("`ld.", stringify!($sem), ".", stringify!($scope), ".", stringify!($ty),
                "`: load observing at ", stringify!($scope), " scope (pairs with a `st_release_*`/fence at that scope when acquire).")]
            #[inline(always)]
            pub unsafe fn [<ld_ $sem _ $scope _ $ty>](p: *const $ty) -> $ty {
                #[cfg(target_arch = "nvptx64")]
                {
                    let v: $ty;
                    // SAFETY: caller guarantees `p` is valid and aligned.
                    unsafe {
                        asm!(concat!("ld.", stringify!($sem), ".", stringify!($scope), ".", stringify!($ty), " {0}, [{1}];"),
                            out($reg) v, in(reg64) p, options(nostack))
                    };
                    v
                }
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    emu::check_align(p as usize, core::mem::size_of::<$ty>(), concat!("ld.", stringify!($sem), ".", stringify!($scope), ".", stringify!($ty)));
                    // SAFETY: caller guarantees `p` is valid, and only
                    // accessed atomically while shared; aligned (checked).
                    unsafe { core::sync::atomic::$aty::from_ptr(p as *mut $ty) }.load(core::sync::atomic::Ordering::$ord)
                }
            }
        }
    };
}

macro_rules! gen_st {
    ($scope:ident, $sem:ident, $ord:ident, $ty:ident, $aty:ident, $reg:ident) => {
        paste::paste! {
            #[doc = concat!("`st.", stringify!($sem), ".", stringify!($scope), ".", stringify!($ty),
                "`: store publishing at ", stringify!($scope), " scope (pairs with `ld_acquire_*` at that scope when release).")]
            #[inline(always)]
            pub unsafe fn [<st_ $sem _ $scope _ $ty>](p: *mut $ty, v: $ty) {
                #[cfg(target_arch = "nvptx64")]
                // SAFETY: caller guarantees `p` is valid and aligned.
                unsafe {
                    asm!(concat!("st.", stringify!($sem), ".", stringify!($scope), ".", stringify!($ty), " [{0}], {1};"),
                        in(reg64) p, in($reg) v, options(nostack))
                };
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    emu::check_align(p as usize, core::mem::size_of::<$ty>(), concat!("st.", stringify!($sem), ".", stringify!($scope), ".", stringify!($ty)));
                    // SAFETY: as for the load.
                    unsafe { core::sync::atomic::$aty::from_ptr(p) }.store(v, core::sync::atomic::Ordering::$ord)
                }
            }
        }
    };
}

macro_rules! gen_atom {
    ($scope:ident, $op:ident, $ptxop:literal, $tyk:literal, $sem:ident, $ord:ident, $ty:ident, $aty:ident, $reg:ident, $host:ident) => {
        paste::paste! {
            #[doc = concat!("`atom.", stringify!($sem), ".", stringify!($scope), ".", $ptxop, ".", $tyk,
                "`: returns the old value.")]
            #[inline(always)]
            pub unsafe fn [<atom_ $op _ $sem _ $scope _ $ty>](p: *mut $ty, v: $ty) -> $ty {
                #[cfg(target_arch = "nvptx64")]
                {
                    let old: $ty;
                    // SAFETY: caller guarantees `p` is valid and aligned.
                    unsafe {
                        asm!(concat!("atom.", stringify!($sem), ".", stringify!($scope), ".", $ptxop, ".", $tyk, " {0}, [{1}], {2};"),
                            out($reg) old, in(reg64) p, in($reg) v, options(nostack))
                    };
                    old
                }
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    emu::check_align(p as usize, core::mem::size_of::<$ty>(), concat!("atom.", stringify!($sem), ".", stringify!($scope), ".", $ptxop, ".", $tyk));
                    // SAFETY: as for the load.
                    unsafe { core::sync::atomic::$aty::from_ptr(p) }.$host(v, core::sync::atomic::Ordering::$ord)
                }
            }
        }
    };
}

macro_rules! gen_cas {
    ($scope:ident, $sem:ident, $ord:ident, $fail:ident, $ty:ident, $aty:ident, $reg:ident, $tyk:literal) => {
        paste::paste! {
            #[doc = concat!("`atom.", stringify!($sem), ".", stringify!($scope), ".cas.", $tyk,
                "`: stores `new` if `*p == compare`; returns the old value.")]
            #[inline(always)]
            pub unsafe fn [<atom_cas_ $sem _ $scope _ $ty>](p: *mut $ty, compare: $ty, new: $ty) -> $ty {
                #[cfg(target_arch = "nvptx64")]
                {
                    let old: $ty;
                    // SAFETY: caller guarantees `p` is valid and aligned.
                    unsafe {
                        asm!(concat!("atom.", stringify!($sem), ".", stringify!($scope), ".cas.", $tyk, " {0}, [{1}], {2}, {3};"),
                            out($reg) old, in(reg64) p, in($reg) compare, in($reg) new, options(nostack))
                    };
                    old
                }
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    use core::sync::atomic::Ordering;
                    emu::check_align(p as usize, core::mem::size_of::<$ty>(), concat!("atom.", stringify!($sem), ".", stringify!($scope), ".cas.", $tyk));
                    // SAFETY: as for the load.
                    match unsafe { core::sync::atomic::$aty::from_ptr(p) }.compare_exchange(compare, new, Ordering::$ord, Ordering::$fail) {
                        Ok(v) | Err(v) => v,
                    }
                }
            }
        }
    };
}

macro_rules! gen_fence {
    ($scope:ident, $sem:ident, $ord:ident) => {
        paste::paste! {
            #[doc = concat!("`fence.", stringify!($sem), ".", stringify!($scope),
                "`: orders this thread's earlier and later memory operations at ", stringify!($scope), " scope.")]
            #[inline(always)]
            pub fn [<fence_ $sem _ $scope>]() {
                #[cfg(target_arch = "nvptx64")]
                // SAFETY: a fence; it orders memory, so no `nomem`.
                unsafe { asm!(concat!("fence.", stringify!($sem), ".", stringify!($scope), ";"), options(nostack)) };
                #[cfg(not(target_arch = "nvptx64"))]
                core::sync::atomic::fence(core::sync::atomic::Ordering::$ord);
            }
        }
    };
}

/// The memory-ordering table: calls `$cb!` once per primitive, so the
/// primitives here and the golden-PTX kernels of the test kernel crate are
/// generated from one list. Arguments per kind:
/// `ld`/`st`: scope, sem, host ordering, type, host atomic type, register class;
/// `fence`: scope, sem, host ordering;
/// `atom`: scope, op, PTX op, PTX type, sem, ordering, type, atomic type, register class, host method;
/// `cas`: scope, sem, ordering, failure ordering, type, atomic type, register class, PTX type.
#[macro_export]
#[doc(hidden)]
macro_rules! ordering_table {
    ($cb:ident) => {
        $crate::ordering_table!(@scope $cb, cta);
        $crate::ordering_table!(@scope $cb, gpu);
        $crate::ordering_table!(@scope $cb, sys);
    };
    (@scope $cb:ident, $scope:ident) => {
        $cb!(ld, $scope, relaxed, Relaxed, u32, AtomicU32, reg32);
        $cb!(ld, $scope, relaxed, Relaxed, u64, AtomicU64, reg64);
        $cb!(ld, $scope, acquire, Acquire, u32, AtomicU32, reg32);
        $cb!(ld, $scope, acquire, Acquire, u64, AtomicU64, reg64);
        $cb!(st, $scope, relaxed, Relaxed, u32, AtomicU32, reg32);
        $cb!(st, $scope, relaxed, Relaxed, u64, AtomicU64, reg64);
        $cb!(st, $scope, release, Release, u32, AtomicU32, reg32);
        $cb!(st, $scope, release, Release, u64, AtomicU64, reg64);
        $cb!(fence, $scope, sc, SeqCst);
        $cb!(fence, $scope, acq_rel, AcqRel);
        $crate::ordering_table!(@atom $cb, $scope, relaxed, Relaxed, Relaxed);
        $crate::ordering_table!(@atom $cb, $scope, acquire, Acquire, Acquire);
        $crate::ordering_table!(@atom $cb, $scope, release, Release, Relaxed);
        $crate::ordering_table!(@atom $cb, $scope, acq_rel, AcqRel, Acquire);
    };
    (@atom $cb:ident, $scope:ident, $sem:ident, $ord:ident, $fail:ident) => {
        $cb!(atom, $scope, add, "add", "u32", $sem, $ord, u32, AtomicU32, reg32, fetch_add);
        $cb!(atom, $scope, add, "add", "u64", $sem, $ord, u64, AtomicU64, reg64, fetch_add);
        $cb!(atom, $scope, exch, "exch", "b32", $sem, $ord, u32, AtomicU32, reg32, swap);
        $cb!(atom, $scope, exch, "exch", "b64", $sem, $ord, u64, AtomicU64, reg64, swap);
        $cb!(atom, $scope, or, "or", "b32", $sem, $ord, u32, AtomicU32, reg32, fetch_or);
        $cb!(atom, $scope, or, "or", "b64", $sem, $ord, u64, AtomicU64, reg64, fetch_or);
        $cb!(atom, $scope, max, "max", "u32", $sem, $ord, u32, AtomicU32, reg32, fetch_max);
        $cb!(atom, $scope, max, "max", "u64", $sem, $ord, u64, AtomicU64, reg64, fetch_max);
        $cb!(cas, $scope, $sem, $ord, $fail, u32, AtomicU32, reg32, "b32");
        $cb!(cas, $scope, $sem, $ord, $fail, u64, AtomicU64, reg64, "b64");
    };
}

macro_rules! gen_cell {
    (ld, $($a:tt)*) => { gen_ld!($($a)*); };
    (st, $($a:tt)*) => { gen_st!($($a)*); };
    (fence, $($a:tt)*) => { gen_fence!($($a)*); };
    (atom, $($a:tt)*) => { gen_atom!($($a)*); };
    (cas, $($a:tt)*) => { gen_cas!($($a)*); };
}

crate::ordering_table!(gen_cell);

// ---------------------------------------------------------------------------
// Plain wide stores (no ordering)
// ---------------------------------------------------------------------------

/// `st.v4.u32`: one 16-byte store (weak). `p` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn st_v4_u32(p: *mut u32, v: [u32; 4]) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: caller guarantees a valid, 16-byte aligned destination.
    unsafe {
        asm!("st.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};", in(reg64) p,
            in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::check_align(p as usize, 16, "st.v4.u32");
        // SAFETY: valid (caller) and 16-byte aligned (checked).
        unsafe { core::ptr::write_volatile(p as *mut [u32; 4], v) };
    }
}

/// `ld.v4.u32`: one 16-byte load (weak). `p` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn ld_v4_u32(p: *const u32) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    {
        let (a, b, c, d): (u32, u32, u32, u32);
        // SAFETY: caller guarantees a valid, 16-byte aligned source.
        unsafe {
            asm!("ld.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];", out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
                in(reg64) p, options(nostack))
        };
        [a, b, c, d]
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::check_align(p as usize, 16, "ld.v4.u32");
        // SAFETY: valid (caller) and 16-byte aligned (checked).
        unsafe { core::ptr::read_volatile(p as *const [u32; 4]) }
    }
}

/// `ld.u32`: one 4-byte load (weak). `p` must be 4-byte aligned.
#[inline(always)]
pub unsafe fn ld_u32(p: *const u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let v: u32;
        // SAFETY: caller guarantees a valid, 4-byte aligned source.
        unsafe { asm!("ld.u32 {0}, [{1}];", out(reg32) v, in(reg64) p, options(nostack, readonly)) };
        v
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::check_align(p as usize, 4, "ld.u32");
        // SAFETY: valid (caller) and 4-byte aligned (checked).
        unsafe { core::ptr::read_volatile(p) }
    }
}

/// `ld.u64`: one 8-byte load (weak). `p` must be 8-byte aligned.
#[inline(always)]
pub unsafe fn ld_u64(p: *const u64) -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let v: u64;
        // SAFETY: caller guarantees a valid, 8-byte aligned source.
        unsafe { asm!("ld.u64 {0}, [{1}];", out(reg64) v, in(reg64) p, options(nostack, readonly)) };
        v
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::check_align(p as usize, 8, "ld.u64");
        // SAFETY: valid (caller) and 8-byte aligned (checked).
        unsafe { core::ptr::read_volatile(p) }
    }
}

/// `prefetch.global.L1`: asks for the cache line holding `p` to be
/// brought into this SM's L1, without waiting for it. A hint: it changes
/// no value and orders nothing. On an H200 it does not shorten a chain of
/// loads that follows a fence (each load still waits for L2: 255 against
/// 252 cycles, `ibgda_bench`'s primitives), so nothing in the library
/// relies on it. `p` must lie in global memory the caller may read. No-op
/// on the CPU emulator.
#[inline(always)]
pub unsafe fn prefetch_l1<T>(p: *const T) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller's contract; a prefetch writes nothing.
    unsafe {
        asm!("prefetch.global.L1 [{0}];", in(reg64) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let _ = p;
}

/// A copy of the `T` at `p`, read as its `N` 8-byte words by `N`
/// independent [`ld_u64`]s, all in flight at once. Rust copies a value out
/// of memory with a `memcpy`, and the NVPTX backend expands a `memcpy` of
/// 128 bytes or more into a loop of byte loads and local stores (on an
/// H200, ~5 000 cycles for a 128-byte struct a call copied); kernels read
/// such structs (a QP's 128-byte entry) through this instead. `T` is `N`
/// words long and 8-byte aligned (checked at compile time); `p` is valid.
#[inline(always)]
pub unsafe fn load_words<T: Copy, const N: usize>(p: *const T) -> T {
    const { assert!(core::mem::size_of::<T>() == 8 * N && core::mem::align_of::<T>() >= 8) };
    #[derive(Clone, Copy)]
    #[repr(C)]
    union Words<T: Copy, const N: usize> {
        words: [u64; N],
        value: T,
    }
    let w = p as *const u64;
    let mut words = [0u64; N];
    let mut i = 0;
    while i < N {
        // SAFETY: word `i` of the caller's valid, 8-byte aligned `T`.
        words[i] = unsafe { ld_u64(w.add(i)) };
        i += 1;
    }
    // SAFETY: `T` is plain data of exactly these words (asserted above).
    unsafe { Words { words }.value }
}

// ---------------------------------------------------------------------------
// Float reductions
// ---------------------------------------------------------------------------

/// `red.relaxed.gpu.add.f32`: `*p += v` done by the memory system, no value
/// returned. Unlike a compare-and-swap loop it never retries, so many
/// threads adding into one hot word cost one L2 add each. The order of
/// concurrent adds is not fixed (float sums then round differently).
/// `p` must be 4-byte aligned.
#[inline(always)]
pub unsafe fn red_add_relaxed_gpu_f32(p: *mut f32, v: f32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: caller guarantees a valid, aligned destination.
    unsafe {
        asm!("red.relaxed.gpu.add.f32 [{0}], {1};", in(reg64) p, in(reg32) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    {
        use core::sync::atomic::{AtomicU32, Ordering};
        emu::check_align(p as usize, 4, "red.relaxed.gpu.add.f32");
        // SAFETY: valid (caller), aligned (checked), accessed atomically while shared.
        let w = unsafe { AtomicU32::from_ptr(p as *mut u32) };
        let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some((f32::from_bits(old) + v).to_bits())
        });
    }
}

// ---------------------------------------------------------------------------
// Time, sleep, trap
// ---------------------------------------------------------------------------

/// `%globaltimer`: nanoseconds, coarse (about 1 µs updates on H100/H200).
#[inline(always)]
pub fn globaltimer_ns() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u64;
        // SAFETY: reads a special register. Not `pure`: it changes over time.
        unsafe { asm!("mov.u64 {0}, %globaltimer;", out(reg64) r, options(nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::now_ns()
    }
}

/// `%clock64`: the SM's cycle counter (host: nanoseconds).
#[inline(always)]
pub fn clock64() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u64;
        // SAFETY: reads a special register.
        unsafe { asm!("mov.u64 {0}, %clock64;", out(reg64) r, options(nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::now_ns()
    }
}

/// `nanosleep.u32`: back off inside a spin. On the emulator: yield the OS
/// thread (and notice an aborted launch).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: suspends the thread; no memory effects.
    unsafe {
        asm!("nanosleep.u32 {0};", in(reg32) ns, options(nomem, nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = ns;
        emu::spin_yield();
    }
}

/// `trap`: abort the kernel (the host sees a launch failure).
#[inline(always)]
pub fn trap() -> ! {
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: aborts the kernel.
        unsafe { asm!("trap;", options(nostack, noreturn)) }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        panic!("kernel executed `trap`")
    }
}

// ---------------------------------------------------------------------------
// Programmatic dependent launch
// ---------------------------------------------------------------------------

/// `griddepcontrol.wait`: waits until the grids this launch depends on
/// have completed and their memory operations are visible to it. Only a
/// kernel launched to overlap the previous kernel on its stream (the
/// host's `LaunchConfig::overlap_previous`) has such grids; everywhere else
/// it returns at once. Every block of such a kernel calls it first,
/// unconditionally, before it reads or writes anything the previous kernel
/// may touch. On the emulator, where a
/// stream's launches never overlap: nothing.
#[inline(always)]
pub fn wait_prior_grids() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a wait that orders memory (no `nomem`).
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack))
    };
}

/// `griddepcontrol.launch_dependents`: lets the next kernel on the stream,
/// when it was launched to overlap this one, start launching before this
/// grid ends (it still waits in [`wait_prior_grids`] for this grid to
/// complete). Takes effect once every block has called it or exited. A
/// hint with no memory effect; on the emulator: nothing.
#[inline(always)]
pub fn allow_dependent_launch() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no memory effects.
    unsafe {
        asm!("griddepcontrol.launch_dependents;", options(nostack))
    };
}

// ---------------------------------------------------------------------------
// Dynamic shared memory
// ---------------------------------------------------------------------------

#[cfg(target_arch = "nvptx64")]
core::arch::global_asm!(".extern .shared .align 16 .b8 doorbell_dynamic_smem[];");

/// Generic pointer to the block's dynamic shared memory (the launch's
/// `shared_mem_bytes`), 16-byte aligned.
#[inline(always)]
pub fn dynamic_shared_mem() -> *mut u8 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u64;
        // SAFETY: takes the address of the module's shared window.
        unsafe { asm!("cvta.shared.u64 {0}, doorbell_dynamic_smem;", out(reg64) r, options(nomem, nostack, pure)) };
        r as *mut u8
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::with_thread(|t| t.block.shared_mem_ptr())
    }
}

/// Bytes of the block's dynamic shared memory (`%dynamic_smem_size`: the
/// launch's `shared_mem_bytes`; on the emulator rounded up to 16).
#[inline(always)]
pub fn dynamic_shared_mem_bytes() -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u32;
        // SAFETY: reads a special register.
        unsafe { asm!("mov.u32 {0}, %dynamic_smem_size;", out(reg32) r, options(nomem, nostack, pure)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        emu::with_thread(|t| t.block.shared_mem_len()) as u32
    }
}

// ---------------------------------------------------------------------------
// Arithmetic with identical rounding on both backends
// ---------------------------------------------------------------------------

/// `fma.rn.f32`: `a * b + c` with one rounding. The host uses
/// `f32::mul_add`, also one rounding, so GPU and emulator agree bit for bit.
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: register arithmetic.
        unsafe {
            asm!("fma.rn.f32 {0}, {1}, {2}, {3};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) c, options(nomem, nostack, pure))
        };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.mul_add(b, c)
    }
}

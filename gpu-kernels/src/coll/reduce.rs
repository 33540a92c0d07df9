//! Element types and the block-wide sum the collectives share.
//!
//! Every reduction sums in `f32`, in rank order (`x0 + x1 + ... + x(n-1)`,
//! left to right), and rounds once to the element type at the end: the
//! same on the GPU and the emulator, and what the host reference
//! (`doorbell::coll::reference`) computes, so results compare bit for bit.

use crate::ptx;

/// A `bfloat16` value: the top 16 bits of an IEEE `f32` (8 exponent bits,
/// 7 mantissa bits). Plain data, the same layout on host and device.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Positive zero.
    pub const ZERO: Bf16 = Bf16(0);

    /// The exact `f32` of this value.
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }

    /// `x` rounded to the nearest `bfloat16`, ties to even; NaN stays a
    /// (quiet) NaN of the same sign, overflow becomes infinity.
    #[inline(always)]
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even.
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }
}

/// Element types of the collectives, as a kernel argument.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// IEEE `f32`.
    F32 = 0,
    /// [`Bf16`], summed in `f32`.
    Bf16 = 1,
}

impl DType {
    /// From the raw kernel argument.
    #[inline(always)]
    pub fn from_u32(v: u32) -> Option<DType> {
        match v {
            0 => Some(DType::F32),
            1 => Some(DType::Bf16),
            _ => None,
        }
    }
    /// Bytes per element.
    #[inline(always)]
    pub const fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
    /// The name users type (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

/// An element type the reductions handle: how to widen to `f32` and round
/// back, one element at a time and by 16-byte vectors.
pub trait Element: Copy + 'static {
    /// The kernel-argument tag.
    const DTYPE: DType;
    /// Elements per 16-byte vector (4 for `f32`, 8 for `bf16`).
    const PER_VEC: usize;
    /// Loads element `i` of `p` as `f32`.
    ///
    /// # Safety
    /// `p.add(i)` is valid and aligned.
    unsafe fn load(p: *const u8, i: u64) -> f32;
    /// Stores `v` rounded to the element type at element `i` of `p`.
    ///
    /// # Safety
    /// `p.add(i)` is valid and aligned.
    unsafe fn store(p: *mut u8, i: u64, v: f32);
    /// Widens a 16-byte vector into `acc[..PER_VEC]` (`add`: `acc += v`, else `acc = v`).
    fn unpack(acc: &mut [f32; 8], v: [u32; 4], add: bool);
    /// Rounds `acc[..PER_VEC]` into a 16-byte vector.
    fn pack(acc: &[f32; 8]) -> [u32; 4];
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    const PER_VEC: usize = 4;
    #[inline(always)]
    unsafe fn load(p: *const u8, i: u64) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *(p as *const f32).add(i as usize) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, i: u64, v: f32) {
        // SAFETY: the caller's contract.
        unsafe { *(p as *mut f32).add(i as usize) = v }
    }
    #[inline(always)]
    fn unpack(acc: &mut [f32; 8], v: [u32; 4], add: bool) {
        for k in 0..4 {
            let x = f32::from_bits(v[k]);
            acc[k] = if add { acc[k] + x } else { x };
        }
    }
    #[inline(always)]
    fn pack(acc: &[f32; 8]) -> [u32; 4] {
        [acc[0].to_bits(), acc[1].to_bits(), acc[2].to_bits(), acc[3].to_bits()]
    }
}

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
    const PER_VEC: usize = 8;
    #[inline(always)]
    unsafe fn load(p: *const u8, i: u64) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { (*(p as *const Bf16).add(i as usize)).to_f32() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, i: u64, v: f32) {
        // SAFETY: the caller's contract.
        unsafe { *(p as *mut Bf16).add(i as usize) = Bf16::from_f32(v) }
    }
    #[inline(always)]
    fn unpack(acc: &mut [f32; 8], v: [u32; 4], add: bool) {
        for k in 0..4 {
            // Little-endian: the element with the lower index is the low half.
            let lo = f32::from_bits(v[k] << 16);
            let hi = f32::from_bits(v[k] & 0xffff_0000);
            if add {
                acc[2 * k] += lo;
                acc[2 * k + 1] += hi;
            } else {
                acc[2 * k] = lo;
                acc[2 * k + 1] = hi;
            }
        }
    }
    #[inline(always)]
    fn pack(acc: &[f32; 8]) -> [u32; 4] {
        let mut v = [0u32; 4];
        for k in 0..4 {
            v[k] = Bf16::from_f32(acc[2 * k]).0 as u32 | (Bf16::from_f32(acc[2 * k + 1]).0 as u32) << 16;
        }
        v
    }
}

/// Where a reduction reads its `n` inputs: input `r` is
/// `base + r * stride + offset` (bytes) — the slots of one staging area or
/// ring, which lie in local memory (the collectives push data to the rank
/// that reduces it, so sums never read a peer). Three scalars: no array of
/// addresses held in registers.
#[derive(Clone, Copy)]
pub struct Sources {
    /// Address of input 0.
    pub base: u64,
    /// Bytes from one input to the next.
    pub stride: u64,
    /// How many inputs.
    pub n: u32,
}

impl Sources {
    /// Input `r`'s address at byte `offset`.
    #[inline(always)]
    pub fn at(&self, r: usize, offset: u64) -> *const u8 {
        (self.base + r as u64 * self.stride + offset) as *const u8
    }
}

/// Vectors each thread keeps in flight per source in [`sum_into`] (see
/// [`crate::copy::UNROLL`] for why several): its rounds hold an
/// accumulator per vector, and two keep the collectives' kernels within
/// their register budget.
const SUM_UNROLL: u64 = 2;

pub use crate::copy::copy_bytes;

/// `dst[i] = src_0[i] + ... + src_(n-1)[i]` for `i` in `0..elems`, summed
/// in `f32` in that order, by the threads of `g` (`me` of `count`). 16-byte
/// vectors (`SUM_UNROLL` per thread and source in flight) when every address is 16-byte
/// aligned, else one element at a time. `dst` may be one of the sources
/// (each element is read before it is written, by the same thread).
///
/// # Safety
/// Every source holds `elems` elements at `src_off`; `dst` holds `elems`.
#[inline(always)]
pub unsafe fn sum_into<E: Element>(dst: *mut u8, srcs: &Sources, src_off: u64, elems: u64, me: u64, count: u64) {
    let align = dst as u64 | src_off | srcs.base | srcs.stride;
    let mut done = 0u64;
    if align & 15 == 0 {
        let per = E::PER_VEC as u64;
        let vecs = elems / per;
        let mut v = me;
        // SUM_UNROLL vectors per thread: every source's loads of a round are
        // independent, so they are all in flight before the first add.
        while v + (SUM_UNROLL - 1) * count < vecs {
            let mut acc = [[0f32; 8]; SUM_UNROLL as usize];
            for r in 0..srcs.n as usize {
                let base = srcs.at(r, src_off);
                let mut x = [[0u32; 4]; SUM_UNROLL as usize];
                for (u, x) in x.iter_mut().enumerate() {
                    // SAFETY: in bounds (v + u * count < vecs), 16-byte aligned (checked).
                    *x = unsafe { ptx::ld_v4_u32(base.add(((v + u as u64 * count) * 16) as usize) as *const u32) };
                }
                for u in 0..SUM_UNROLL as usize {
                    E::unpack(&mut acc[u], x[u], r != 0);
                }
            }
            for (u, acc) in acc.iter().enumerate() {
                // SAFETY: as above.
                unsafe { ptx::st_v4_u32(dst.add(((v + u as u64 * count) * 16) as usize) as *mut u32, E::pack(acc)) };
            }
            v += SUM_UNROLL * count;
        }
        while v < vecs {
            let off = v * 16;
            let mut acc = [0f32; 8];
            for r in 0..srcs.n as usize {
                // SAFETY: in bounds (v < vecs), 16-byte aligned (checked).
                let x = unsafe { ptx::ld_v4_u32(srcs.at(r, src_off + off) as *const u32) };
                E::unpack(&mut acc, x, r != 0);
            }
            // SAFETY: as above.
            unsafe { ptx::st_v4_u32(dst.add(off as usize) as *mut u32, E::pack(&acc)) };
            v += count;
        }
        done = vecs * per;
    }
    let mut i = done + me;
    while i < elems {
        let mut acc = 0f32;
        for r in 0..srcs.n as usize {
            // SAFETY: in bounds.
            let x = unsafe { E::load(srcs.at(r, src_off), i) };
            acc = if r == 0 { x } else { acc + x };
        }
        // SAFETY: in bounds.
        unsafe { E::store(dst, i, acc) };
        i += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).0, 0x3f80);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).0, 0x3f82);
        assert_eq!(Bf16::from_f32(1.0 + 1.5 / 256.0).0, 0x3f81);
        assert_eq!(Bf16::from_f32(-2.5).to_f32(), -2.5);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(Bf16::from_f32(f32::MAX).to_f32(), f32::INFINITY);
        assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
        for i in -300i32..300 {
            assert_eq!(Bf16::from_f32(i as f32).to_f32(), bf16_reference(i as f32));
        }
    }

    /// Round to nearest even the slow way.
    fn bf16_reference(x: f32) -> f32 {
        let lo = f32::from_bits(x.to_bits() & 0xffff_0000);
        let hi = f32::from_bits((x.to_bits() & 0xffff_0000) + 0x1_0000);
        let (dl, dh) = ((x - lo).abs(), (hi - x).abs());
        if dl < dh || (dl == dh && (lo.to_bits() >> 16) & 1 == 0) {
            lo
        } else {
            hi
        }
    }

    #[test]
    fn vectors_round_trip() {
        let mut acc = [0f32; 8];
        let v = [0x3f80_4000u32, 0xc000_3f80, 0, 0x4040_4080];
        Bf16::unpack(&mut acc, v, false);
        assert_eq!(&acc[..4], &[2.0, 1.0, 1.0, -2.0]);
        assert_eq!(Bf16::pack(&acc), v);
    }
}

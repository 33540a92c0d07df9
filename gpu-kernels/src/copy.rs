//! Moving bytes with the threads of a group: the one copy loop the
//! transports' puts and gets and the collectives' staging share.

use crate::ptx;

/// Vectors each thread keeps in flight in [`copy_bytes`]: a peer link (or
/// HBM) reaches its bandwidth only with many bytes in flight, and one
/// dependent load per thread leaves it latency-bound.
pub const UNROLL: u64 = 4;

/// Copies `bytes` from `src` to `dst` with the threads of a group (`me` of
/// `count`): 16-byte vectors ([`UNROLL`] per thread in flight) when both
/// are 16-byte aligned, else 4-byte words when both are 4-byte aligned,
/// else bytes; the tail byte by byte.
///
/// # Safety
/// Both ranges are valid and do not overlap.
#[inline(always)]
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, bytes: u64, me: u64, count: u64) {
    let align = (dst as u64 | src as u64) & 15;
    let mut done = 0u64;
    if align == 0 {
        let vecs = bytes / 16;
        let at = |i: u64| (i * 16) as usize;
        let mut i = me;
        // All loads of a round before its stores: the stores may alias
        // nothing the loads read (contract), but the compiler cannot know.
        while i + (UNROLL - 1) * count < vecs {
            let mut x = [[0u32; 4]; UNROLL as usize];
            for (u, x) in x.iter_mut().enumerate() {
                // SAFETY: in bounds, 16-byte aligned.
                *x = unsafe { ptx::ld_v4_u32(src.add(at(i + u as u64 * count)) as *const u32) };
            }
            for (u, x) in x.iter().enumerate() {
                // SAFETY: as above.
                unsafe { ptx::st_v4_u32(dst.add(at(i + u as u64 * count)) as *mut u32, *x) };
            }
            i += UNROLL * count;
        }
        while i < vecs {
            // SAFETY: in bounds, 16-byte aligned.
            unsafe { ptx::st_v4_u32(dst.add(at(i)) as *mut u32, ptx::ld_v4_u32(src.add(at(i)) as *const u32)) };
            i += count;
        }
        done = vecs * 16;
    } else if align & 3 == 0 {
        let words = bytes / 4;
        let mut i = me;
        while i < words {
            // SAFETY: in bounds, 4-byte aligned.
            unsafe { *(dst.add((i * 4) as usize) as *mut u32) = *(src.add((i * 4) as usize) as *const u32) };
            i += count;
        }
        done = words * 4;
    }
    let mut i = done + me;
    while i < bytes {
        // SAFETY: in bounds.
        unsafe { *dst.add(i as usize) = *src.add(i as usize) };
        i += count;
    }
}

//! Kernels used by the examples.

use crate::{kernel, ptx};

/// `out[i] = a[i] * b[i] + c[i]` over `n` elements, grid-stride.
#[kernel(hot)]
pub unsafe fn fused_multiply_add(a: *const f32, b: *const f32, c: *const f32, out: *mut f32, n: u64) {
    let mut i = ptx::global_thread_id_x() as u64;
    let stride = ptx::grid_stride_x() as u64;
    while i < n {
        let k = i as usize;
        // SAFETY: the launcher passes buffers of at least `n` elements.
        unsafe { *out.add(k) = ptx::fma_f32(*a.add(k), *b.add(k), *c.add(k)) };
        i += stride;
    }
}

use doorbell_kernels::kernel;

// No block has zero threads.
#[kernel(launch_bounds(threads = 0))]
pub unsafe fn no_threads(x: *mut u32) {
    unsafe { *x = 0 };
}

// CUDA allows at most 1024 threads per block.
#[kernel(launch_bounds(threads = 2048))]
pub unsafe fn too_many_threads(x: *mut u32) {
    unsafe { *x = 0 };
}

// At least one block per SM.
#[kernel(launch_bounds(threads = 256, min_blocks = 0))]
pub unsafe fn no_blocks(x: *mut u32) {
    unsafe { *x = 0 };
}

// Integers only: no strings, floats or expressions.
#[kernel(launch_bounds(threads = "512"))]
pub unsafe fn string_threads(x: *mut u32) {
    unsafe { *x = 0 };
}

#[kernel(launch_bounds(threads = 512, min_blocks = 1.5))]
pub unsafe fn float_blocks(x: *mut u32) {
    unsafe { *x = 0 };
}

fn main() {}

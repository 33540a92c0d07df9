use doorbell_kernels::kernel;

// `threads` is required; `min_blocks` alone says nothing about the block.
#[kernel(launch_bounds(min_blocks = 2))]
pub unsafe fn missing_threads(x: *mut u32) {
    unsafe { *x = 0 };
}

#[kernel(launch_bounds())]
pub unsafe fn empty_bounds(x: *mut u32) {
    unsafe { *x = 0 };
}

// CUDA's `maxThreadsPerBlock` spelling is not a key here.
#[kernel(launch_bounds(threads = 256, max_registers = 64))]
pub unsafe fn unknown_key(x: *mut u32) {
    unsafe { *x = 0 };
}

// Positional values are not accepted: every value is named.
#[kernel(launch_bounds(256, 2))]
pub unsafe fn positional(x: *mut u32) {
    unsafe { *x = 0 };
}

// A key given twice is refused (not: the last one wins).
#[kernel(launch_bounds(threads = 256, threads = 512))]
pub unsafe fn key_twice(x: *mut u32) {
    unsafe { *x = 0 };
}

fn main() {}

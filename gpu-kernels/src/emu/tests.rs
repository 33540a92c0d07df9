//! Emulator fidelity where the GPU would fault or a warp collective would
//! misbehave: alignment of vector and atomic accesses, member masks of warp
//! collectives.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::ptx;

/// Every test of this module uses a short barrier timeout (read once per
/// process), so a collective that waits for the wrong lanes fails quickly.
fn launch(block: u32, body: &(dyn Fn() + Sync)) -> Result<(), EmuError> {
    std::env::set_var("DOORBELL_EMU_BARRIER_TIMEOUT_S", "3");
    run(
        EmuLaunch {
            grid: [1, 1, 1],
            block: [block, 1, 1],
            shared_mem_bytes: 0,
        },
        body,
    )
}

fn panicked(r: Result<(), EmuError>) -> ([u32; 3], [u32; 3], String) {
    match r {
        Err(EmuError::Panicked { block, thread, message }) => (block, thread, message),
        other => panic!("expected a failed launch, got {other:?}"),
    }
}

#[test]
fn misaligned_vector_load_fails_the_launch_naming_the_thread() {
    let buf = [0u128; 4];
    let base = buf.as_ptr() as usize;
    // Aligned: fine.
    launch(32, &|| {
        // SAFETY: inside `buf`, 16-byte aligned.
        let v = unsafe { ptx::ld_v4_u32((base + 16) as *const u32) };
        assert_eq!(v, [0; 4]);
    })
    .unwrap();
    let (block, thread, msg) = panicked(launch(32, &|| {
        let off = if ptx::thread_idx_x() == 5 { 20 } else { 16 };
        // SAFETY: inside `buf` (the misaligned one is caught before the access).
        unsafe { ptx::ld_v4_u32((base + off) as *const u32) };
    }));
    assert_eq!((block, thread), ([0, 0, 0], [5, 0, 0]));
    assert!(msg.contains("ld.v4.u32") && msg.contains("16-byte aligned"), "{msg}");
}

#[test]
fn misaligned_vector_store_fails_the_launch() {
    let mut buf = [0u128; 4];
    let base = buf.as_mut_ptr() as usize;
    let (_, thread, msg) = panicked(launch(1, &|| {
        // SAFETY: inside `buf` (caught before the access).
        unsafe { ptx::st_v4_u32((base + 8) as *mut u32, [1, 2, 3, 4]) };
    }));
    assert_eq!(thread, [0, 0, 0]);
    assert!(msg.contains("st.v4.u32") && msg.contains(&format!("{:#x}", base + 8)), "{msg}");
    assert_eq!(buf, [0; 4], "nothing was stored");
}

#[test]
fn misaligned_64_bit_atomics_fail_the_launch() {
    let buf = [0u64; 4];
    let base = buf.as_ptr() as usize;
    // SAFETY (all bodies): inside `buf`; misaligned addresses are caught first.
    launch(1, &|| unsafe {
        ptx::atom_add_relaxed_gpu_u64((base + 8) as *mut u64, 1);
    })
    .unwrap();
    let (_, _, msg) = panicked(launch(1, &|| unsafe {
        ptx::atom_add_relaxed_gpu_u64((base + 4) as *mut u64, 1);
    }));
    assert!(msg.contains("atom.relaxed.gpu.add.u64") && msg.contains("8-byte aligned"), "{msg}");
    let (_, _, msg) = panicked(launch(1, &|| unsafe {
        ptx::atom_cas_acq_rel_sys_u64((base + 12) as *mut u64, 0, 1);
    }));
    assert!(msg.contains("cas.b64"), "{msg}");
    let (_, _, msg) = panicked(launch(1, &|| unsafe {
        ptx::ld_acquire_sys_u64((base + 2) as *const u64);
    }));
    assert!(msg.contains("ld.acquire.sys.u64"), "{msg}");
    let (_, _, msg) = panicked(launch(1, &|| unsafe {
        ptx::st_release_gpu_u32((base + 2) as *mut u32, 1);
    }));
    assert!(msg.contains("st.release.gpu.u32") && msg.contains("4-byte aligned"), "{msg}");
    assert_eq!(buf, [0, 1, 0, 0]);
}

#[test]
fn lanes_outside_the_mask_are_not_waited_for() {
    // Lanes 16..32 wait until lanes 0..16 are past their shuffle: a shuffle
    // that waited for the whole warp would never return.
    let done = AtomicU32::new(0);
    let out: Vec<AtomicU32> = (0..32).map(|_| AtomicU32::new(u32::MAX)).collect();
    let t0 = Instant::now();
    launch(32, &|| {
        let lane = ptx::lane_id();
        if lane < 16 {
            let v = ptx::shfl_sync_idx_u32(0x0000_ffff, lane * 10, 3);
            out[lane as usize].store(v, Ordering::Relaxed);
            ptx::sync_warp(0x0000_ffff);
            done.fetch_add(1, Ordering::Release);
        } else {
            while done.load(Ordering::Acquire) < 16 {
                spin_yield();
            }
            let b = ptx::vote_sync_ballot(0xffff_0000, lane.is_multiple_of(2));
            out[lane as usize].store(b, Ordering::Relaxed);
        }
    })
    .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    for (l, o) in out.iter().enumerate() {
        let want = if l < 16 { 30 } else { 0x5555_0000 };
        assert_eq!(o.load(Ordering::Relaxed), want, "lane {l}");
    }
}

#[test]
fn disjoint_groups_of_one_warp_shuffle_at_the_same_time() {
    let out: Vec<AtomicU64> = (0..32).map(|_| AtomicU64::new(0)).collect();
    launch(32, &|| {
        let lane = ptx::lane_id();
        let (mask, src) = if lane < 16 { (0x0000_ffff, 3) } else { (0xffff_0000, 20) };
        let v = ptx::shfl_sync_idx_u32(mask, lane + 100, src);
        // A source lane outside the group gives the caller's own value.
        let w = ptx::shfl_sync_idx_u32(mask, lane + 200, 31 - src);
        let b = ptx::vote_sync_ballot(mask, true);
        out[lane as usize].store((v as u64) << 40 | (w as u64) << 32 | b as u64, Ordering::Relaxed);
    })
    .unwrap();
    for l in 0..32u64 {
        let (mask, src) = if l < 16 { (0xffffu64, 3) } else { (0xffff_0000, 20) };
        let want = (src + 100) << 40 | (l + 200) << 32 | mask;
        assert_eq!(out[l as usize].load(Ordering::Relaxed), want, "lane {l}");
    }
}

#[test]
fn a_lane_in_the_mask_that_never_arrives_is_an_error() {
    let t0 = Instant::now();
    let (_, thread, msg) = panicked(launch(32, &|| {
        let lane = ptx::lane_id();
        if lane == 1 {
            // Never reaches the collective (until the launch is aborted).
            loop {
                spin_yield();
            }
        }
        if lane < 4 {
            ptx::sync_warp(0b1111);
        }
    }));
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    assert!(thread[0] == 0 || thread[0] == 2 || thread[0] == 3, "{thread:?}");
    assert!(msg.contains("sync_warp") && msg.contains("lane(s) [1] never arrived"), "{msg}");
}

#[test]
fn a_mask_without_the_calling_lane_is_an_error() {
    let (_, thread, msg) = panicked(launch(2, &|| {
        if ptx::lane_id() == 1 {
            ptx::shfl_sync_idx_u32(0b01, 7, 0);
        }
    }));
    assert_eq!(thread, [1, 0, 0]);
    assert!(msg.contains("does not include the lane itself"), "{msg}");
}

/// Shapes whose thread counts overflow 64 bits are refused before any
/// thread starts (they used to wrap to a count under the limit, and the
/// launch then spawned threads without bound). Each runs on a helper thread
/// so that a regression fails here instead of exhausting the host.
#[test]
fn launch_shapes_that_overflow_64_bits_are_refused() {
    let cases: [([u32; 3], [u32; 3]); 3] = [
        ([1 << 22, 1 << 21, 1 << 21], [1, 1, 1]),
        ([1, 1, 1], [1 << 22, 1 << 21, 1 << 21]),
        ([u32::MAX, u32::MAX, 2], [32, 1, 1]),
    ];
    for (grid, block) in cases {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = run(
                EmuLaunch {
                    grid,
                    block,
                    shared_mem_bytes: 0,
                },
                &|| {},
            );
            let _ = tx.send(r);
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Err(EmuError::InvalidLaunch(m))) => assert!(m.contains("grid") || m.contains("block"), "{m}"),
            Ok(Err(EmuError::TooManyThreads { threads, .. })) => {
                panic!("grid {grid:?} block {block:?}: reported {threads} threads (a wrapped count)")
            }
            Ok(other) => panic!("grid {grid:?} block {block:?}: expected a refusal, got {other:?}"),
            Err(_) => panic!("grid {grid:?} block {block:?}: still spawning threads after 5 s"),
        }
    }
}

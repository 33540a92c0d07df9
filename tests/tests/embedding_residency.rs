//! The embedding exchange's grid must be resident all at once (its kernels
//! meet at grid barriers), and how many blocks an SM holds depends on the
//! kernel: the `Ibgda` and `Routed` entries use about twice P2P's
//! registers. These checks run without a GPU: the occupancy arithmetic, the
//! fitting of the requested grid, and — with ptxas — the grid the exchange
//! would launch on an H200 (132 SMs) for each transport, from the register
//! counts ptxas gives the entries it would load.
//!
//! On two H200s a grid of two blocks per SM (256) over IBGDA started only
//! the ~129 blocks that fit: they waited out the first grid barrier, voted
//! "bad" and left; the others then passed the barrier among themselves,
//! sent no rows and counted 127 of the 256 signals the wait expected.

use doorbell_examples::embedding::{fit_grid, grid_request, resident_blocks_per_sm, SmLimits, MAX_BLOCKS_PER_SM};
use doorbell_tests::{examples_ptx_and_ptxas, ptxas_registers};

const H200_SMS: u32 = 132;

#[test]
fn registers_bound_the_blocks_an_sm_holds() {
    let sm = SmLimits::SM_90;
    // 256 threads: 8 warps; a warp's registers round up to 256.
    assert_eq!(resident_blocks_per_sm(&sm, 80, 256), 3, "P2P's forward (80 registers)");
    assert_eq!(resident_blocks_per_sm(&sm, 128, 256), 2, "128 registers: exactly two");
    assert_eq!(resident_blocks_per_sm(&sm, 129, 256), 1, "129 registers round up to 136: one");
    assert_eq!(resident_blocks_per_sm(&sm, 182, 256), 1, "IBGDA's forward (182 registers)");
    assert_eq!(resident_blocks_per_sm(&sm, 32, 256), 8, "threads bound it at 2048 / 256");
    assert_eq!(resident_blocks_per_sm(&sm, 16, 32), 32, "the block limit");
    assert_eq!(resident_blocks_per_sm(&sm, 255, 1024), 0, "does not fit");
}

#[test]
fn the_fitted_grid_is_resident_where_the_request_assumed_two_blocks_per_sm() {
    // One rank per H200, soft NIC engine on one SM: 262 asked, 256 after the cap.
    let asked = grid_request(H200_SMS, 1, 1);
    assert_eq!(asked, 256);
    // Kernels holding two or more per SM launch what was asked.
    assert_eq!(fit_grid(asked, 2, H200_SMS), Ok(256));
    assert_eq!(fit_grid(asked, 3, H200_SMS), Ok(256));
    // One per SM: half, within the 131 SMs left beside the engine.
    let one = fit_grid(asked, 1, H200_SMS).unwrap();
    assert_eq!(one, 128);
    assert!(one < H200_SMS);
    // Eight ranks on one GPU: every rank's grid together stays resident.
    for per_sm in 1..=3 {
        let g = fit_grid(grid_request(H200_SMS, 8, 1), per_sm, H200_SMS).unwrap();
        assert!(8 * g <= per_sm * (H200_SMS - 8), "8 ranks, {per_sm} per SM: {g} blocks each");
    }
    // A grid no SM count can hold is refused, naming the fix.
    let e = fit_grid(300, 2, 100).unwrap_err();
    assert!(e.contains("launch_config_for"), "{e}");
    assert!(fit_grid(8, 0, H200_SMS).is_err());
    assert_eq!(MAX_BLOCKS_PER_SM, 2);
}

/// For each transport, the grid `Exchange::with_transport` would launch on
/// an H200 with one rank per GPU (the request of `launch_config_for`,
/// fitted to the registers of the entries it loads) is resident beside the
/// soft NIC engine. Without the fitting, IBGDA's 256 blocks would need two
/// per SM where its forward's registers leave room for one.
#[test]
fn the_exchange_grid_on_an_h200_is_resident_for_every_transport() {
    // The exchange's kernels are the library's; the put floor the benchmark
    // launches with the same grid is the examples'.
    let Some((ptx, ptxas)) = examples_ptx_and_ptxas(doorbell::KERNELS_PTX, "residency check") else {
        return;
    };
    let transports: [(&str, &[&str], bool); 3] = [
        (
            "p2p",
            &["emb_forward_p2p", "emb_backward_p2p", "emb_forward_pull_p2p", "emb_put_floor_p2p"],
            false,
        ),
        ("ibgda", &["emb_forward_ibgda", "emb_backward_ibgda"], true),
        (
            "routed",
            &["emb_forward_routed", "emb_backward_routed", "emb_forward_pull_routed"],
            true,
        ),
    ];
    let all: Vec<&str> = transports
        .iter()
        .flat_map(|(_, e, _)| e.iter().copied())
        .filter(|e| *e != "emb_put_floor_p2p")
        .collect();
    let mut used = ptxas_registers(&ptxas, ptx, &all);
    used.extend(ptxas_registers(&ptxas, doorbell_examples::USER_KERNELS_PTX, &["emb_put_floor_p2p"]));
    let sm = SmLimits::SM_90;
    let mut report = Vec::new();
    for (name, entries, soft_nic) in transports {
        let regs = used
            .iter()
            .filter(|(e, _)| entries.contains(&e.as_str()))
            .map(|&(_, r)| r)
            .max()
            .unwrap();
        let per_sm = resident_blocks_per_sm(&sm, regs, 256);
        let free = if soft_nic { H200_SMS - 1 } else { H200_SMS };
        let asked = grid_request(H200_SMS, 1, soft_nic as u32);
        let grid = fit_grid(asked, per_sm, H200_SMS).unwrap_or_else(|e| panic!("{name}: {e}"));
        report.push(format!("{name}: {regs} registers, {per_sm} per SM, {asked} asked, {grid} launched"));
        assert!(
            grid <= per_sm * free,
            "{name}: {grid} blocks of {regs} registers x 256 threads are not resident on {free} SMs ({per_sm} per SM)"
        );
    }
    eprintln!("{}", report.join("\n"));
}

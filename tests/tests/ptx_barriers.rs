//! No aligned block barrier that the lanes of a warp may reach at
//! different instructions, in any module the workspace builds
//! (`doorbell_tests::ptx_text`): the hang the CPU emulator cannot see.

use doorbell_tests::ptx_text::{aligned_barriers_under_divergence, Class};

/// The modules, with their findings of the classes that fail (`Arms`,
/// `Guarded`); the loops the check cannot prove leave together are
/// listed, not failed (module docs: a lane's own loop of `Coop::Thread`
/// puts calls `put_raw`, whose barriers only `Coop::Block` reaches).
#[test]
fn no_module_has_an_aligned_barrier_the_lanes_of_a_warp_may_reach_apart() {
    let modules = [
        ("doorbell_kernels", doorbell::KERNELS_PTX),
        ("doorbell_example_kernels", doorbell_examples::USER_KERNELS_PTX),
        ("doorbell_test_kernels", doorbell_tests::TEST_KERNELS_PTX),
        ("doorbell_softnic", doorbell::comm::SOFTNIC_PTX),
    ];
    let mut bad = Vec::new();
    for (name, ptx) in modules {
        let Some(ptx) = doorbell_tests::built_ptx(name, ptx) else {
            continue;
        };
        let found = aligned_barriers_under_divergence(ptx);
        let loops: Vec<_> = found.iter().filter(|f| f.class == Class::Loop).collect();
        eprintln!(
            "{name}: {} aligned barriers in loops whose exit the check cannot prove uniform (not failed){}",
            loops.len(),
            loops.iter().map(|f| format!("\n  {f}")).collect::<String>()
        );
        bad.extend(found.iter().filter(|f| f.class != Class::Loop).map(|f| format!("{name}: {f}")));
    }
    assert!(
        bad.is_empty(),
        "aligned barriers a warp may reach at different instructions (make them `ptx::sync_threads_divergent`):\n{}",
        bad.join("\n")
    );
}

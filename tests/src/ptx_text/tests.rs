//! The divergence check on small hand-written kernels.

use super::*;

fn kernel(body: &str) -> String {
    format!(".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{{\n{body}\n}}\n")
}

/// The shape that hung on a GPU: thread 0 signals, and LLVM copied the
/// barrier after it into thread 0's path and the others' path.
const COPIED: &str = "\t.reg .pred %p<3>;\n\t.reg .b32 %r<5>;\n\t// begin inline asm\n\tmov.u32 %r1, %tid.x;\n\t// end inline asm\n\tsetp.ne.b32 \t%p1, %r1, 0;\n\t@%p1 bra \t$L__BB0_2;\n\tst.global.u32 \t[%rd1], %r1;\n\t// begin inline asm\n\tbar.sync 0;\n\t// end inline asm\n\tbra.uni \t$L__BB0_3;\n$L__BB0_2:\n\t// begin inline asm\n\tbar.sync 0;\n\t// end inline asm\n$L__BB0_3:\n\tret;";

#[test]
fn a_barrier_copied_into_both_arms_of_a_branch_on_the_thread_index_is_found() {
    let f = aligned_barriers_under_divergence(&kernel(COPIED));
    assert_eq!(f.len(), 2, "{f:?}");
    assert!(
        f.iter()
            .all(|x| x.function == "k" && x.instruction == "bar.sync 0" && x.class == Class::Arms),
        "{f:?}"
    );
    assert_eq!(f[1].block, "$L__BB0_2");
}

#[test]
fn a_barrier_after_the_arms_meet_or_in_its_non_aligned_form_is_not() {
    // One barrier where the arms meet.
    let merged = COPIED
        .replacen(
            "\t// begin inline asm\n\tbar.sync 0;\n\t// end inline asm\n\tbra.uni",
            "\tbra.uni",
            1,
        )
        .replace(
            "$L__BB0_2:\n\t// begin inline asm\n\tbar.sync 0;\n\t// end inline asm\n$L__BB0_3:",
            "$L__BB0_2:\n$L__BB0_3:\n\tbar.sync 0;",
        );
    assert!(merged.matches("bar.sync").count() == 1);
    assert_eq!(aligned_barriers_under_divergence(&kernel(&merged)), Vec::new());
    // Non-aligned barriers may be reached apart.
    let plain = COPIED.replace("bar.sync 0", "barrier.sync 0");
    assert_eq!(aligned_barriers_under_divergence(&kernel(&plain)), Vec::new());
    // A branch on a parameter (the same in every lane).
    let uniform = COPIED.replace("mov.u32 %r1, %tid.x;", "ld.param.u32 %r1, [k_param_0];");
    assert_eq!(aligned_barriers_under_divergence(&kernel(&uniform)), Vec::new());
    // A branch on the warp's index (the same in every lane of a warp).
    let linear = "\tmov.u32 %r5, %tid.x;\n\tmov.u32 %r6, %ntid.x;\n\tmov.u32 %r7, %tid.y;\n\tmad.lo.s32 %r1, %r7, %r6, %r5;";
    let warp = COPIED
        .replace("\tmov.u32 %r1, %tid.x;", linear)
        .replace("setp.ne.b32 \t%p1, %r1, 0;", "setp.lt.u32 \t%p1, %r1, 32;");
    assert_eq!(aligned_barriers_under_divergence(&kernel(&warp)), Vec::new());
    assert_eq!(
        aligned_barriers_under_divergence(&kernel(&warp.replace("%r1, 32;", "%r1, 16;"))).len(),
        2
    );
    // The grid's index (the block's times its size, plus the thread's) is
    // not the warp's: a warp of a block of 48 threads spans two values of
    // it divided by 32.
    let grid = warp.replace("mov.u32 %r7, %tid.y;", "mov.u32 %r7, %ctaid.x;");
    assert_eq!(aligned_barriers_under_divergence(&kernel(&grid)).len(), 2);
    // A branch on a vote of the thread index (the same in every lane).
    let voted = COPIED.replace(
        "\tsetp.ne.b32 \t%p1, %r1, 0;",
        "\t{ .reg .pred p; setp.ne.u32 p, %r1, 0; vote.sync.ballot.b32 %r2, p, -1; }\n\tsetp.ne.b32 \t%p1, %r2, 0;",
    );
    assert_eq!(aligned_barriers_under_divergence(&kernel(&voted)), Vec::new());
}

#[test]
fn divergence_through_registers_merges_local_memory_and_calls_is_followed() {
    // Through an add, a spill to local memory and its reload.
    let spilled = COPIED.replace(
        "\tsetp.ne.b32 \t%p1, %r1, 0;",
        "\tadd.s32 %r2, %r1, 7;\n\tst.local.u32 [%rd9], %r2;\n\tld.local.u32 %r3, [%rd9];\n\tsetp.ne.b32 \t%p1, %r3, 7;",
    );
    assert_eq!(aligned_barriers_under_divergence(&kernel(&spilled)).len(), 2);
    // A predicated barrier on a lane-dependent predicate.
    let guarded = "\tmov.u32 %r1, %laneid;\n\tsetp.eq.b32 %p1, %r1, 0;\n\t@%p1 bar.sync 0;\n\tret;";
    let f = aligned_barriers_under_divergence(&kernel(guarded));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].class, Class::Guarded, "{f:?}");
    // A loop whose exit depends on the lane, with a barrier inside.
    let looped = "\tmov.u32 %r1, %tid.x;\n$L__BB0_1:\n\tbar.sync 0;\n\tadd.s32 %r1, %r1, -1;\n\tsetp.ne.b32 %p1, %r1, 0;\n\t@%p1 bra $L__BB0_1;\n\tret;";
    let f = aligned_barriers_under_divergence(&kernel(looped));
    assert_eq!(f.iter().map(|x| x.class).collect::<Vec<_>>(), vec![Class::Loop], "{f:?}");
    // A call, from thread 0's arm, of a function with a barrier, while
    // the other arm waits at a barrier of its own.
    let callee = ".func f()\n{\n\tbar.sync 0;\n\tret;\n}\n";
    let caller = "\tmov.u32 %r1, %tid.x;\n\tsetp.ne.b32 %p1, %r1, 0;\n\t@%p1 bra $L__BB0_2;\n\tcall.uni f, ();\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\tbar.sync 0;\n$L__BB0_3:\n\tret;";
    let ptx = format!("{}\n{callee}", kernel(caller));
    let f = aligned_barriers_under_divergence(&ptx);
    assert_eq!(f.len(), 2, "{f:?}");
    assert!(f.iter().any(|x| x.instruction.starts_with("call.uni f")), "{f:?}");
    // Both arms calling it: two call sites, which ptxas may make two
    // copies of its barrier by inlining.
    let both = caller.replace("$L__BB0_2:\n\tbar.sync 0;", "$L__BB0_2:\n\tcall.uni f, ();");
    assert_eq!(aligned_barriers_under_divergence(&format!("{}\n{callee}", kernel(&both))).len(), 2);
    // In a loop with no way out but a trap (a persistent kernel): the
    // arms meet at the loop's head, and the copies are still found.
    let endless = "\tmov.u32 %r1, %tid.x;\n\tsetp.ne.b32 %p1, %r1, 0;\n$L__BB0_1:\n\t@%p1 bra $L__BB0_2;\n\tst.global.u32 [%rd1], %r1;\n\tbar.sync 0;\n\tbra.uni $L__BB0_1;\n$L__BB0_2:\n\tbar.sync 0;\n\tbra.uni $L__BB0_1;";
    let f = aligned_barriers_under_divergence(&kernel(endless));
    assert_eq!(f.iter().filter(|x| x.class == Class::Arms).count(), 2, "{f:?}");
    // A barrier in one arm only, the other arm waiting at none: every
    // lane that reaches a barrier reaches the same one (the CPU
    // emulator times out on such a block; this check leaves it).
    let one_arm = caller.replace("$L__BB0_2:\n\tbar.sync 0;", "$L__BB0_2:");
    assert_eq!(
        aligned_barriers_under_divergence(&format!("{}\n{callee}", kernel(&one_arm))),
        Vec::new()
    );
    // A frame slot reused: a lane-dependent value stored, then a
    // uniform one over it, then read back and branched on.
    let reused = COPIED.replace(
        "\tsetp.ne.b32 \t%p1, %r1, 0;",
        "\tadd.u64 %rd9, %SPL, 8;\n\tst.local.u32 [%rd9], %r1;\n\tld.param.u32 %r2, [k_param_0];\n\tst.local.u32 [%rd9], %r2;\n\tld.local.u32 %r3, [%rd9];\n\tsetp.ne.b32 \t%p1, %r3, 0;",
    );
    assert_eq!(aligned_barriers_under_divergence(&kernel(&reused)), Vec::new());
    assert_eq!(
        aligned_barriers_under_divergence(&kernel(&reused.replace("st.local.u32 [%rd9], %r2;", ""))).len(),
        2
    );
    // A flag set, in thread 0's arm, to the value the branch found it
    // has stays uniform: a branch on it later is no lane's own.
    let same = "\tld.param.u32 %r2, [k_param_0];\n\tsetp.ne.b32 %p2, %r2, 0;\n\tmov.u32 %r1, %tid.x;\n\tsetp.eq.b32 %p3, %r1, 0;\n\tor.pred %p4, %p2, %p3;\n\t@%p4 bra $L__BB0_2;\n\tmov.pred %p2, 0;\n$L__BB0_2:\n\t@%p2 bra $L__BB0_3;\n\tbar.sync 0;\n\tbra.uni $L__BB0_4;\n$L__BB0_3:\n\tbar.sync 0;\n$L__BB0_4:\n\tret;";
    assert_eq!(aligned_barriers_under_divergence(&kernel(same)), Vec::new());
    // Set to the other value, it is the lanes' own.
    assert_eq!(
        aligned_barriers_under_divergence(&kernel(&same.replace("mov.pred %p2, 0", "mov.pred %p2, -1"))).len(),
        2
    );
    // A callee's result from a lane-dependent argument.
    let is_zero = ".func (.param .b32 func_retval0) z(\n\t.param .b32 z_param_0\n)\n{\n\tld.param.u32 %r1, [z_param_0];\n\tsetp.eq.b32 %p1, %r1, 0;\n\tselp.u32 %r2, 1, 0, %p1;\n\tst.param.b32 [func_retval0], %r2;\n\tret;\n}\n";
    let called = COPIED.replace(
        "\tsetp.ne.b32 \t%p1, %r1, 0;",
        "\t{ // callseq 0, 0\n\t.param .b32 param0;\n\tst.param.b32 [param0], %r1;\n\t.param .b32 retval0;\n\tcall.uni (retval0), z, (param0);\n\tld.param.b32 %r3, [retval0];\n\t} // callseq 0\n\tsetp.ne.b32 \t%p1, %r3, 0;",
    );
    assert_eq!(
        aligned_barriers_under_divergence(&format!("{}\n{is_zero}", kernel(&called))).len(),
        2
    );
    // The same callee given a uniform value.
    let uniform_arg = called.replace("mov.u32 %r1, %tid.x;", "ld.param.u32 %r1, [k_param_0];");
    assert_eq!(
        aligned_barriers_under_divergence(&format!("{}\n{is_zero}", kernel(&uniform_arg))),
        Vec::new()
    );
    // A guarded write may not happen: the register keeps what it held.
    let guarded_mov = COPIED.replace(
        "\tsetp.ne.b32 \t%p1, %r1, 0;",
        "\tld.param.u32 %r4, [k_param_0];\n\tsetp.eq.b32 %p2, %r4, 0;\n\t@%p2 mov.u32 %r1, 0;\n\tsetp.ne.b32 \t%p1, %r1, 0;",
    );
    assert_eq!(aligned_barriers_under_divergence(&kernel(&guarded_mov)).len(), 2);
    // An atomic's result differs between lanes.
    let atomic = COPIED.replace("mov.u32 %r1, %tid.x;", "atom.global.add.u32 %r1, [%rd1], 1;");
    assert_eq!(aligned_barriers_under_divergence(&kernel(&atomic)).len(), 2);
}

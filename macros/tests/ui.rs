//! trybuild UI tests of `#[descriptor]`, `#[kernel]` and `pipeline!`: every rejected
//! layout or kernel option reports an error on the offending token (pinned
//! in the .stderr next to each case), and accepted layouts compile and
//! encode as documented.
//!
//! After an intended change to a message: `TRYBUILD=overwrite cargo test -p
//! doorbell-macros --test ui`, then review the .stderr diff.

#[test]
fn descriptor_ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/descriptor/fail/*.rs");
    t.pass("tests/ui/descriptor/pass/*.rs");
}

#[test]
fn kernel_ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/kernel/fail/*.rs");
}

#[test]
fn pipeline_ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/pipeline/fail/*.rs");
    t.pass("tests/ui/pipeline/pass/*.rs");
}

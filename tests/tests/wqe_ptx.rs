//! Golden PTX for the IBGDA send path: in the kernel that rings the doorbell
//! the doorbell record is published (`st.release.sys`), then a system fence,
//! then the 8-byte doorbell store — in that order; and WQEs are written with
//! 16-byte stores only.
//!
//! The ordering instructions of each mlx5 kernel are also pinned in
//! `tests/tests/wqe_golden/<kernel>.txt`; after an intended change, rerun with
//! `DOORBELL_BLESS=1` to rewrite them and review the diff.

use std::path::PathBuf;

/// The test kernels' PTX; a build without it fails these tests unless the
/// PTX was skipped on purpose (`DOORBELL_SKIP_PTX=1`), which they say.
fn ptx() -> Option<&'static str> {
    doorbell_tests::built_ptx("the test kernels'", doorbell_tests::TEST_KERNELS_PTX)
}

fn entry_body<'a>(ptx: &'a str, entry: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {entry}("))
        .unwrap_or_else(|| panic!("no entry {entry} in the test kernels"));
    let body = &ptx[start..];
    &body[..body.find("\n}\n").unwrap_or(body.len())]
}

/// The opcode prefixes of the instructions that order memory or
/// synchronize, and of the 4-wide vector stores and loads.
const ORDERING_OPS: [&str; 11] = [
    "fence.",
    "atom.",
    "ld.acquire",
    "st.release",
    "st.relaxed",
    "ld.relaxed",
    "bar.",
    "membar",
    "shfl.",
    "st.v4",
    "ld.v4",
];

/// The instructions that order memory or synchronize ([`ORDERING_OPS`]),
/// opcode only (operands carry register numbers that change with unrelated
/// code).
fn ordering_ops(body: &str) -> Vec<String> {
    body.lines()
        .map(str::trim)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|op| ORDERING_OPS.iter().any(|p| op.starts_with(p)))
        .map(str::to_string)
        .collect()
}

#[test]
fn doorbell_record_release_then_fence_then_doorbell_store() {
    let Some(ptx) = ptx() else { return };
    let body = entry_body(ptx, "mlx5_post_wqes");
    let lines: Vec<&str> = body.lines().map(str::trim).collect();
    let dbr = lines
        .iter()
        .position(|l| l.starts_with("st.release.sys.u32"))
        .expect("doorbell record store-release (st.release.sys.u32)");
    let fence = dbr
        + lines[dbr..]
            .iter()
            .position(|l| l.starts_with("fence.sc.sys"))
            .expect("fence.sc.sys after the doorbell record");
    let db = fence
        + lines[fence..]
            .iter()
            .position(|l| l.starts_with("st.relaxed.sys.u64"))
            .expect("64-bit doorbell store after the fence");
    // Nothing that could reorder or replace them sits in between.
    for l in &lines[dbr + 1..db] {
        assert!(
            !l.starts_with("st.") && !l.starts_with("atom."),
            "unexpected store between doorbell record and doorbell: {l}"
        );
    }
    // The turn passes to the next batch only after the doorbell.
    let next = db
        + lines[db..]
            .iter()
            .position(|l| l.starts_with("st.release.gpu.u32"))
            .expect("ready index release after the doorbell");
    assert!(next > db);
    // The reservation is one atomic; the wait for the turn is an acquire.
    assert_eq!(lines.iter().filter(|l| l.starts_with("atom.")).count(), 1, "one atomic per batch");
    assert!(lines.iter().any(|l| l.starts_with("ld.acquire.gpu.u32")));
}

#[test]
fn wqes_are_written_with_four_16_byte_stores_and_no_read_back() {
    let Some(ptx) = ptx() else { return };
    for k in ["mlx5_write_wqes", "mlx5_bench_write_wqes"] {
        let body = entry_body(ptx, k);
        let stores: Vec<&str> = body.lines().map(str::trim).filter(|l| l.starts_with("st.")).collect();
        let v4 = stores
            .iter()
            .filter(|l| l.starts_with("st.v4.u32") || l.starts_with("st.global.v4.u32"))
            .count();
        assert_eq!(v4, 4, "{k}: expected four 16-byte stores per WQE, got {stores:?}");
        if k == "mlx5_write_wqes" {
            assert_eq!(stores.len(), 4, "{k}: only the WQE stores, got {stores:?}");
        }
    }
}

#[test]
fn ordering_instructions_match_the_golden_files() {
    let Some(ptx) = ptx() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/wqe_golden");
    let bless = std::env::var("DOORBELL_BLESS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for k in ["mlx5_post_wqes", "mlx5_poll_cq", "mlx5_write_wqes"] {
        let got = ordering_ops(entry_body(ptx, k)).join("\n") + "\n";
        let path = dir.join(format!("{k}.txt"));
        if bless {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != got {
            stale.push(format!("{k}:\n--- golden\n{want}--- now\n{got}"));
        }
    }
    assert!(
        stale.is_empty(),
        "ordering instructions changed (rerun with DOORBELL_BLESS=1 if intended):\n{}",
        stale.join("\n")
    );
}

/// The IBGDA transport's `transfer` rings doorbells both ways, chosen by
/// the QP handle's flag: at system scope (doorbell record release,
/// `fence.sc.sys`, 8-byte doorbell store: a NIC across PCIe) and, for the
/// soft NIC's engine on the same GPU (`QP_GPU_SCOPE`), the record and the
/// doorbell word as two GPU-scope releases with no other store between.
#[test]
fn ibgda_transfer_rings_at_system_scope_or_gpu_scope() {
    let Some(ptx) = ptx() else { return };
    // The non-inlined `Ibgda::transfer` (its mangled name ends so).
    let start = ptx
        .find("5Ibgda8transfer(")
        .expect("Ibgda::transfer is a function of its own in the test kernels' PTX");
    let start = ptx[..start].rfind(".func").expect("its .func line");
    let body = &ptx[start..];
    let body = &body[..body.find("\n}\n").unwrap_or(body.len())];
    let ops: Vec<String> = ordering_ops(body)
        .into_iter()
        .filter(|o| o.starts_with("st.") || o.starts_with("fence.") || o.starts_with("atom."))
        .collect();
    let has = |seq: &[&str]| ops.windows(seq.len()).any(|w| w.iter().zip(seq).all(|(o, s)| o.starts_with(s)));
    assert!(
        has(&["st.release.sys.u32", "fence.sc.sys", "st.relaxed.sys.u64"]),
        "system-scope doorbell missing: {ops:?}"
    );
    assert!(
        has(&["st.release.gpu.u32", "st.release.gpu.u64"]),
        "GPU-scope doorbell missing: {ops:?}"
    );
}

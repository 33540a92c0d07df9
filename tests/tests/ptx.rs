//! Checks on the PTX the workspace produces: ptxas accepts every module for
//! sm_90, kernels marked `#[kernel(no_spill)]` do not spill to local memory,
//! every memory-ordering primitive emits the instruction its name spells, and
//! no function reaches itself through calls.

use std::path::PathBuf;
use std::process::Command;

use doorbell_tests::ptx_text::{functions, operands};
use doorbell_tests::{built_ptx, examples_ptx_and_ptxas, ptxas_registers, try_find_ptxas};

/// Every PTX module the workspace builds and embeds.
fn modules() -> Vec<(&'static str, &'static str)> {
    vec![
        ("doorbell_kernels", doorbell::KERNELS_PTX),
        ("doorbell_example_kernels", doorbell_examples::USER_KERNELS_PTX),
        ("doorbell_test_kernels", doorbell_tests::TEST_KERNELS_PTX),
        ("doorbell_softnic", doorbell::comm::SOFTNIC_PTX),
    ]
}

fn find_ptxas() -> PathBuf {
    try_find_ptxas().unwrap_or_else(|| {
        panic!("ptxas not found: run scripts/setup.sh (it installs the PyPI wheel nvidia-cuda-nvcc-cu12), or set DOORBELL_PTXAS")
    })
}

/// Per entry function: (name, spill store bytes, spill load bytes, stack bytes).
fn ptxas_report(name: &str, ptx: &str) -> Vec<(String, u64, u64, u64)> {
    let dir = std::env::temp_dir().join(format!("doorbell-ptxas-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.ptx"));
    std::fs::write(&src, ptx).unwrap();
    let out = Command::new(find_ptxas())
        .args(["-arch=sm_90", "-v", "-o"])
        .arg(dir.join("out.cubin"))
        .arg(&src)
        .output()
        .expect("run ptxas");
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ptxas rejected {name}:\n{text}");
    assert!(!text.contains("error"), "ptxas reported errors for {name}:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
    let mut res = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = Some(rest.split('\'').next().unwrap().to_string());
        } else if line.contains("bytes stack frame") {
            let nums: Vec<u64> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            if let (Some(k), [stack, st, ld, ..]) = (current.take(), nums.as_slice()) {
                res.push((k, *st, *ld, *stack));
            }
        }
    }
    res
}

#[test]
fn ptxas_accepts_every_module_and_no_spill_kernels_do_not_spill() {
    for (name, ptx) in modules() {
        assert!(doorbell::ptx_is_built(ptx), "{name}: the PTX was not built (DOORBELL_SKIP_PTX?)");
        assert!(ptx.contains(".target sm_90"), "{name} is not built for sm_90");
        let report = ptxas_report(name, ptx);
        let entries = ptx.matches(".entry ").count();
        assert_eq!(
            report.len(),
            entries,
            "{name}: ptxas reported {} of {entries} entries",
            report.len()
        );
        let no_spill: Vec<&str> = ptx
            .lines()
            .filter_map(|l| l.split("DOORBELL_NO_SPILL_").nth(1))
            .map(|s| s.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap())
            .collect();
        for (kernel, st, ld, _) in &report {
            if no_spill.contains(&kernel.as_str()) {
                assert!(
                    *st == 0 && *ld == 0,
                    "{name}: no_spill kernel {kernel} spills ({st} bytes stored, {ld} loaded)"
                );
            }
        }
    }
}

/// The instruction a primitive's name spells: `atom_add_acq_rel_sys_u64` →
/// `atom.acq_rel.sys.add.u64`.
fn expected_instruction(prim: &str) -> String {
    let parts: Vec<&str> = prim.split('_').collect();
    let (sem, rest) = if prim.contains("_acq_rel_") {
        let i = parts.iter().position(|p| *p == "acq").unwrap();
        ("acq_rel".to_string(), [&parts[..i], &parts[i + 2..]].concat())
    } else {
        (String::new(), parts.clone())
    };
    let ty_b = |t: &str| t.replace('u', "b");
    match rest[0] {
        "ld" | "st" => {
            let sem = if sem.is_empty() { rest[1].to_string() } else { sem };
            let (scope, ty) = if rest.len() == 4 { (rest[2], rest[3]) } else { (rest[1], rest[2]) };
            format!("{}.{sem}.{scope}.{ty}", rest[0])
        }
        "fence" => {
            let sem = if sem.is_empty() { rest[1].to_string() } else { sem };
            format!("fence.{sem}.{}", rest.last().unwrap())
        }
        "atom" => {
            let op = rest[1];
            let sem = if sem.is_empty() { rest[2].to_string() } else { sem };
            let scope = rest[rest.len() - 2];
            let ty = rest[rest.len() - 1];
            let ty = if matches!(op, "add" | "max") { ty.to_string() } else { ty_b(ty) };
            format!("atom.{sem}.{scope}.{op}.{ty}")
        }
        other => panic!("unknown primitive kind {other} in {prim}"),
    }
}

fn entry_body<'a>(ptx: &'a str, entry: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {entry}(")).unwrap_or_else(|| panic!("no entry {entry}"));
    let body = &ptx[start..];
    let end = body.find("\n}\n").unwrap_or(body.len());
    &body[..end]
}

#[test]
fn every_ordering_primitive_emits_the_instruction_it_names() {
    let ptx = doorbell_tests::TEST_KERNELS_PTX;
    let goldens: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry golden_"))
        .map(|s| s.split('(').next().unwrap())
        .collect();
    // 3 scopes × (4 ld + 4 st + 2 fences + 4 semantics × 10 atomics).
    assert_eq!(goldens.len(), 3 * (4 + 4 + 2 + 40), "golden kernels found: {goldens:?}");
    for prim in goldens {
        let want = expected_instruction(prim);
        let body = entry_body(ptx, &format!("golden_{prim}"));
        let asm: Vec<&str> = body
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("ld.") || l.starts_with("st.") || l.starts_with("atom.") || l.starts_with("fence."))
            .filter(|l| !l.starts_with("ld.param") && !l.starts_with("st.global") && !l.starts_with("ld.global"))
            .collect();
        assert_eq!(
            asm.len(),
            1,
            "golden_{prim}: expected exactly one ordering instruction, got {asm:?}"
        );
        assert!(
            asm[0].starts_with(&format!("{want} ")) || asm[0] == format!("{want};"),
            "golden_{prim}: emits `{}`, expected `{want}`",
            asm[0]
        );
    }
}

/// The `.entry` names of a PTX module.
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|s| s.split('(').next().unwrap_or(s))
        .collect()
}

/// The library's PTX holds the library's kernels only: no golden, test,
/// WQE-test, example or benchmark entry points (those live in their own
/// kernel crates): today, the all-reduce, the embedding exchange, the
/// communicator's self-test and the trace's clock calibration.
#[test]
fn library_ptx_holds_no_test_example_or_bench_kernels() {
    let lib = entries(doorbell::KERNELS_PTX);
    // The embedding exchange's entries (`doorbell::coll::EmbeddingExchange`).
    let embedding = [
        "emb_backward_ibgda",
        "emb_backward_p2p",
        "emb_backward_proxy",
        "emb_backward_routed",
        "emb_forward_ibgda",
        "emb_forward_p2p",
        "emb_forward_proxy",
        "emb_forward_pull_p2p",
        "emb_forward_pull_routed",
        "emb_forward_routed",
        "emb_zero_words",
    ];
    for want in embedding {
        assert!(lib.contains(&want), "{want} missing from doorbell::KERNELS_PTX: {lib:?}");
    }
    let lib: Vec<&str> = lib.into_iter().filter(|e| !embedding.contains(e)).collect();
    let library_kernels: &[&str] = &[
        "allreduce_ibgda",
        "allreduce_p2p",
        "allreduce_proxy",
        "allreduce_routed",
        "allreduce_wide_p2p",
        "selftest_ibgda",
        "selftest_p2p",
        "trace_clock",
    ];
    assert_eq!(lib, library_kernels, "entry points in doorbell::KERNELS_PTX");
    // The test and example kernels are built, just elsewhere.
    let tests = entries(doorbell_tests::TEST_KERNELS_PTX);
    for want in [
        "golden_fence_sc_sys",
        "ring_p2p",
        "ring_shadow",
        "mlx5_write_wqes",
        "divergent_barrier",
    ] {
        assert!(tests.contains(&want), "{want} missing from the test kernels: {tests:?}");
    }
    let examples = entries(doorbell_examples::USER_KERNELS_PTX);
    for want in ["fused_multiply_add", "pingpong_p2p", "put_bw_p2p", "byte_histogram"] {
        assert!(examples.contains(&want), "{want} missing from the example kernels: {examples:?}");
    }
    // A kernel crate's module holds its own kernels only: its PTX build
    // sets no feature, and the library exports its entries only under
    // `library-kernels`, which only doorbell's own build sets.
    for (what, list) in [("test", &tests), ("example", &examples)] {
        let leaked: Vec<&&str> = list
            .iter()
            .filter(|e| library_kernels.contains(e) || embedding.contains(e))
            .collect();
        assert!(leaked.is_empty(), "the library's entries {leaked:?} are in the {what} kernels' PTX");
    }
    // The soft NIC is a device: its engine kernel (one entry per block size
    // it is built for: 256, 512 and 1024 threads; listed sorted by name) is
    // in its own PTX, alone (built without the library's kernels, which fat
    // LTO would carry in and the driver would JIT before the engine could
    // start).
    assert_eq!(
        entries(doorbell::comm::SOFTNIC_PTX),
        ["softnic_engine_1024", "softnic_engine_256", "softnic_engine_512"],
        "entry points in the soft NIC's PTX"
    );
}

#[test]
fn expected_instruction_spelling() {
    assert_eq!(expected_instruction("ld_acquire_gpu_u32"), "ld.acquire.gpu.u32");
    assert_eq!(expected_instruction("st_release_sys_u64"), "st.release.sys.u64");
    assert_eq!(expected_instruction("fence_acq_rel_cta"), "fence.acq_rel.cta");
    assert_eq!(expected_instruction("fence_sc_gpu"), "fence.sc.gpu");
    assert_eq!(expected_instruction("atom_add_acq_rel_sys_u64"), "atom.acq_rel.sys.add.u64");
    assert_eq!(expected_instruction("atom_cas_relaxed_cta_u32"), "atom.relaxed.cta.cas.b32");
    assert_eq!(expected_instruction("atom_exch_release_gpu_u64"), "atom.release.gpu.exch.b64");
}

/// The `.maxntid` and `.minnctapersm` directives of `entry`: what sits
/// between its parameter list and its body.
fn entry_directives(ptx: &str, entry: &str) -> (Option<String>, Option<String>) {
    let body = entry_body(ptx, entry);
    let head = &body[..body.find("\n{").unwrap_or_else(|| panic!("{entry} has no body"))];
    let directive = |name: &str| {
        head.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    (directive(".maxntid"), directive(".minnctapersm"))
}

/// `#[kernel(launch_bounds(threads = 512, min_blocks = M))]` reaches the
/// examples' PTX as the entry's directives; the unbounded entry of the same
/// body has none.
#[test]
fn launch_bounds_are_written_into_the_examples_ptx() {
    let Some(ptx) = built_ptx("the examples'", doorbell_examples::USER_KERNELS_PTX) else {
        return;
    };
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        entry_directives(ptx, "fused_grad_allreduce_512_p2p"),
        (some("512, 1, 1"), some("1")),
        "fused_grad_allreduce_512_p2p: launch_bounds(threads = 512, min_blocks = 1)"
    );
    assert_eq!(
        entry_directives(ptx, "fused_grad_allreduce_512x2_p2p"),
        (some("512, 1, 1"), some("2")),
        "fused_grad_allreduce_512x2_p2p: launch_bounds(threads = 512, min_blocks = 2)"
    );
    assert_eq!(
        entry_directives(ptx, "fused_grad_allreduce_p2p"),
        (None, None),
        "fused_grad_allreduce_p2p has no launch_bounds"
    );
    // The benchmark's put floor, launched with the embedding exchange's grid.
    assert_eq!(
        entry_directives(ptx, "emb_put_floor_p2p"),
        (some("256, 1, 1"), some("3")),
        "emb_put_floor_p2p: launch_bounds(threads = 256, min_blocks = 3)"
    );
    // Only the bounded entries carry directives.
    assert_eq!(ptx.matches(".maxntid").count(), 3, "entries with .maxntid");
    assert_eq!(ptx.matches(".minnctapersm").count(), 3, "entries with .minnctapersm");
    // The embedding exchange's grid-barrier kernels, in the library's PTX:
    // three blocks of 256 per SM (their grids ask for two: one to spare),
    // every transport.
    let lib = doorbell::KERNELS_PTX;
    let emb = [
        "emb_forward_p2p",
        "emb_forward_ibgda",
        "emb_forward_routed",
        "emb_backward_p2p",
        "emb_backward_ibgda",
        "emb_backward_routed",
        "emb_forward_proxy",
        "emb_backward_proxy",
        "emb_forward_pull_p2p",
        "emb_forward_pull_routed",
    ];
    for e in emb {
        assert_eq!(
            entry_directives(lib, e),
            (some("256, 1, 1"), some("3")),
            "{e}: launch_bounds(threads = 256, min_blocks = 3)"
        );
    }
    // With the all-reduce's entry for blocks of 512.
    assert_eq!(lib.matches(".maxntid").count(), 1 + emb.len(), "library entries with .maxntid");
    assert_eq!(
        lib.matches(".minnctapersm").count(),
        1 + emb.len(),
        "library entries with .minnctapersm"
    );
}

/// ptxas keeps the bounded entries within what `min_blocks` blocks of 512
/// threads per SM allow (65 536 registers per SM): 128 registers a thread
/// for one block, 64 for two.
#[test]
fn launch_bounds_cap_the_registers_ptxas_allocates() {
    let Some((ptx, ptxas)) = examples_ptx_and_ptxas(doorbell_examples::USER_KERNELS_PTX, "register check") else {
        return;
    };
    let limits = [("fused_grad_allreduce_512_p2p", 128), ("fused_grad_allreduce_512x2_p2p", 64)];
    let names: Vec<&str> = limits.iter().map(|(e, _)| *e).collect();
    let used = ptxas_registers(&ptxas, ptx, &names);
    for (entry, limit) in limits {
        let &(_, n) = used.iter().find(|(e, _)| e == entry).expect("reported (ptxas_registers checks)");
        assert!(n <= limit, "{entry} uses {n} registers; its launch bounds allow {limit}");
    }
}

/// The functions a body calls by name.
fn callees(body: &str) -> Vec<&str> {
    body.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("call"))
        .filter_map(|l| {
            let args = l.split_once(char::is_whitespace)?.1.trim_start();
            // `call.uni (retval0), name, (params);` or `call.uni name, (params);`
            let args = match args.strip_prefix('(') {
                Some(a) => a.split_once("),")?.1.trim_start(),
                None => args,
            };
            let name = args.split(|c: char| c == ',' || c == ';' || c.is_whitespace()).next()?;
            (!name.starts_with('%')).then_some(name)
        })
        .collect()
}

/// `entry` and every function it reaches through calls: the code a launch
/// of it runs.
fn reachable<'a>(ptx: &'a str, entry: &str) -> Vec<(&'a str, &'a str)> {
    let all = functions(ptx);
    let mut seen: Vec<(&str, &str)> = Vec::new();
    let mut todo = vec![entry.to_string()];
    while let Some(name) = todo.pop() {
        if seen.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let Some(&(n, body)) = all.iter().find(|(n, _)| *n == name) else {
            assert_ne!(name, entry, "no entry {entry} in the module");
            continue; // declared only (none today), nothing to inspect
        };
        seen.push((n, body));
        todo.extend(callees(body).into_iter().map(str::to_string));
    }
    seen
}

/// The instruction lines of a body: no labels, comments, braces or
/// declarations.
fn instructions(body: &str) -> Vec<&str> {
    body.lines()
        .map(|l| l.trim().trim_end_matches(';').trim())
        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with('.') && !l.starts_with('$'))
        .filter(|l| !l.starts_with('{') && !l.starts_with('}'))
        .collect()
}

/// A PTX integer literal: `60`, `0x123U`.
fn int(s: &str) -> Option<i64> {
    let s = s.trim_end_matches('U');
    match s.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Address operands resolved to (base register, byte offset) through the
/// `add.s64 r, base, constant` lines of one body, so that patterns compare
/// registers by name, never by number.
struct Addrs {
    adds: Vec<(String, String, i64)>,
}

impl Addrs {
    fn of(body: &[&str]) -> Addrs {
        let adds = body
            .iter()
            .filter(|l| l.starts_with("add.s64"))
            .filter_map(|l| {
                let ops = operands(l);
                Some((ops[0].clone(), ops[1].clone(), int(&ops[2])?))
            })
            .collect();
        Addrs { adds }
    }

    /// Every (base, offset) an address operand `[r]` / `[r+k]` may be.
    fn resolve(&self, operand: &str) -> Vec<(String, i64)> {
        let inner = operand.trim_start_matches('[').trim_end_matches(']');
        let (reg, k) = match inner.split_once('+') {
            Some((r, k)) => (r.trim(), int(k.trim()).unwrap_or(0)),
            None => (inner.trim(), 0),
        };
        let mut v = vec![(reg.to_string(), k)];
        v.extend(self.adds.iter().filter(|(d, _, _)| d == reg).map(|(_, b, o)| (b.clone(), o + k)));
        v
    }
}

/// What the IBGDA send and completion paths compile to (see
/// `gpu-kernels/src/mlx5/{wqe,queue,cq}.rs`), each found by its shape:
#[derive(Debug, Default, PartialEq)]
struct IbgdaPath {
    /// `store_wqe`: a 64-byte WQE as four 16-byte stores (`st.v4.u32`, or
    /// `st.global.v4`) at +0 (the control segment: opcode, WQE index, QPN,
    /// DS count, signaled flag), +16, +32, +48 of one send-queue slot. Data
    /// copies store 16-byte vectors too, but strided by a register, never
    /// at those four constant offsets of one base.
    wqe: bool,
    /// `update_doorbell_record`: `st.release.sys.u32` of a byte-reversed
    /// (`prmt.b32 r, x, 0, 0x0123`: big-endian) counter. Also the CQ's
    /// consumer-index record.
    doorbell_record: bool,
    /// `ring_doorbell`: right after a doorbell record, `fence.sc.sys` then
    /// the 8-byte `st.relaxed.sys.u64` to the UAR, no memory operation in
    /// between.
    ring: bool,
    /// `progress` / `poll_cq`: `ld.acquire.sys.u32` of a CQE's last word
    /// (+60: `op_own`, the owner bit), then `ld.v4.u32` of the rest of the
    /// same CQE (+32, +48) — read only after the acquire.
    cq_poll: bool,
}

/// Memory and ordering instructions (not parameter or local-memory traffic).
fn is_memory(l: &str) -> bool {
    let op = l.split_whitespace().next().unwrap_or("");
    (op.starts_with("ld.")
        || op.starts_with("st.")
        || op.starts_with("atom.")
        || op.starts_with("red.")
        || op.starts_with("fence.")
        || op.starts_with("membar"))
        && !op.contains(".param")
        && !op.contains(".local")
}

fn ibgda_path(body: &str) -> IbgdaPath {
    let ins = instructions(body);
    let addrs = Addrs::of(&ins);
    let mut found = IbgdaPath::default();

    // WQE: stores at +0, +16, +32, +48 of one base.
    let v4_stores: Vec<(String, i64)> = ins
        .iter()
        .filter(|l| l.starts_with("st.v4.") || l.starts_with("st.global.v4."))
        .flat_map(|l| addrs.resolve(&operands(l)[0]))
        .collect();
    found.wqe = v4_stores
        .iter()
        .filter(|(_, o)| *o == 0)
        .any(|(b, _)| [16, 32, 48].iter().all(|k| v4_stores.contains(&(b.clone(), *k))));

    // Doorbell record, then fence and doorbell.
    let bswapped: Vec<String> = ins
        .iter()
        .filter(|l| l.starts_with("prmt.b32"))
        .map(|l| operands(l))
        .filter(|o| o.len() == 4 && int(&o[3]) == Some(0x0123))
        .map(|o| o[0].clone())
        .collect();
    let mem: Vec<&str> = ins.iter().copied().filter(|l| is_memory(l)).collect();
    for (i, l) in mem.iter().enumerate() {
        if l.starts_with("st.release.sys.u32") && bswapped.contains(&operands(l)[1]) {
            found.doorbell_record = true;
            if mem.get(i + 1).is_some_and(|f| f.starts_with("fence.sc.sys"))
                && mem.get(i + 2).is_some_and(|d| d.starts_with("st.relaxed.sys.u64"))
            {
                found.ring = true;
            }
        }
    }

    // CQ poll: acquire of +60, then 16-byte loads of +32 and +48.
    for (i, l) in ins.iter().enumerate() {
        if !l.starts_with("ld.acquire.sys.u32") {
            continue;
        }
        for (base, _) in addrs.resolve(&operands(l)[1]).into_iter().filter(|(_, o)| *o == 60) {
            let later: Vec<(String, i64)> = ins[i + 1..]
                .iter()
                .filter(|l| l.starts_with("ld.v4.") || l.starts_with("ld.global.v4."))
                .flat_map(|l| addrs.resolve(&operands(l)[1]))
                .collect();
            if later.contains(&(base.clone(), 32)) && later.contains(&(base, 48)) {
                found.cq_poll = true;
            }
        }
    }
    found
}

/// [`ibgda_path`] over `entry` and everything it calls, with the functions
/// each part was found in.
fn ibgda_path_of(ptx: &str, entry: &str) -> (IbgdaPath, Vec<String>) {
    let mut all = IbgdaPath::default();
    let mut wher = Vec::new();
    for (name, body) in reachable(ptx, entry) {
        let p = ibgda_path(body);
        if p != IbgdaPath::default() {
            wher.push(format!("{name}: {p:?}"));
        }
        all.wqe |= p.wqe;
        all.doorbell_record |= p.doorbell_record;
        all.ring |= p.ring;
        all.cq_poll |= p.cq_poll;
    }
    (all, wher)
}

/// The user's fused kernel over IBGDA does the networking itself: a launch
/// of `fused_grad_allreduce_ibgda` writes WQEs, publishes the doorbell
/// record, rings the doorbell and polls the CQ — no proxy, no other kernel.
/// The P2P entry of the same body does none of it (stores into peer memory
/// only), so an IBGDA entry that ran the P2P path would fail here. The
/// routed entry (P2P or IBGDA per peer) does both.
///
/// Where: the producer loop and the all-reduce algorithm are inlined into
/// the entry; the transport's send path (`Ibgda::post_xfer`, `transfer`,
/// with the WQE writes, doorbell record and doorbell inlined into them) and
/// its CQ poll (`Ibgda::progress`, `#[inline(never)]`) are device functions
/// the entry calls, so the entry and everything it reaches are searched.
#[test]
fn fused_ibgda_entry_builds_wqes_rings_and_polls() {
    let Some(ptx) = built_ptx("the examples'", doorbell_examples::USER_KERNELS_PTX) else {
        return;
    };
    let all = IbgdaPath {
        wqe: true,
        doorbell_record: true,
        ring: true,
        cq_poll: true,
    };
    let (ibgda, wher) = ibgda_path_of(ptx, "fused_grad_allreduce_ibgda");
    assert_eq!(ibgda, all, "fused_grad_allreduce_ibgda; found in:\n{}", wher.join("\n"));
    eprintln!("fused_grad_allreduce_ibgda:\n{}", wher.join("\n"));
    let (routed, wher) = ibgda_path_of(ptx, "fused_grad_allreduce_routed");
    assert_eq!(routed, all, "fused_grad_allreduce_routed; found in:\n{}", wher.join("\n"));
    let (p2p, wher) = ibgda_path_of(ptx, "fused_grad_allreduce_p2p");
    assert_eq!(
        p2p,
        IbgdaPath::default(),
        "fused_grad_allreduce_p2p; found in:\n{}",
        wher.join("\n")
    );
}

/// The patterns on the library's own golden kernels: the mlx5 send path
/// has the WQE stores, the doorbell record and the doorbell, the CQ poll
/// the acquire-then-read; each has nothing of the other.
#[test]
fn ibgda_patterns_match_the_mlx5_golden_kernels() {
    let Some(ptx) = built_ptx("the test kernels'", doorbell_tests::TEST_KERNELS_PTX) else {
        return;
    };
    let (post, _) = ibgda_path_of(ptx, "mlx5_post_wqes");
    assert_eq!(
        post,
        IbgdaPath {
            wqe: true,
            doorbell_record: true,
            ring: true,
            cq_poll: false
        },
        "mlx5_post_wqes"
    );
    let (poll, _) = ibgda_path_of(ptx, "mlx5_poll_cq");
    assert!(poll.cq_poll && !poll.wqe && !poll.ring, "mlx5_poll_cq: {poll:?}");
    let (write, _) = ibgda_path_of(ptx, "mlx5_write_wqes");
    assert!(write.wqe && !write.ring && !write.cq_poll, "mlx5_write_wqes: {write:?}");
}

/// Every module image embeds the very PTX of its `*_PTX` constant, and a
/// cubin that is either absent (no `ptxas` at build time) or an `sm_90`
/// CUDA ELF image made from it — not some other file, and not a truncated
/// one: the loader hands it to the driver as is.
#[test]
fn module_images_hold_their_ptx_and_an_elf_cubin_or_none() {
    let images = [
        ("doorbell_kernels", doorbell::KERNELS, doorbell::KERNELS_PTX),
        (
            "doorbell_example_kernels",
            doorbell_examples::USER_KERNELS,
            doorbell_examples::USER_KERNELS_PTX,
        ),
        (
            "doorbell_test_kernels",
            doorbell_tests::TEST_KERNELS,
            doorbell_tests::TEST_KERNELS_PTX,
        ),
        ("doorbell_softnic", doorbell::comm::SOFTNIC, doorbell::comm::SOFTNIC_PTX),
    ];
    for (name, image, ptx) in images {
        assert!(
            std::ptr::eq(image.ptx, ptx) || image.ptx == ptx,
            "{name}: the image's PTX is not the module's"
        );
        let c = image.cubin;
        if c.is_empty() {
            eprintln!("{name}: no cubin embedded (the build found no ptxas): the driver compiles the PTX");
            continue;
        }
        // ELF64, little-endian, machine EM_CUDA (190).
        assert_eq!(&c[..4], b"\x7fELF", "{name}: the cubin is not an ELF image");
        assert_eq!((c[4], c[5]), (2, 1), "{name}: not a little-endian ELF64 image");
        assert_eq!(u16::from_le_bytes([c[18], c[19]]), 190, "{name}: not a CUDA ELF image");
        // Section headers lie inside the image: nothing cut off.
        let shoff = u64::from_le_bytes(c[40..48].try_into().unwrap());
        let (shentsize, shnum) = (u16::from_le_bytes([c[58], c[59]]) as u64, u16::from_le_bytes([c[60], c[61]]) as u64);
        assert!(shoff + shentsize * shnum <= c.len() as u64, "{name}: the cubin is truncated");
        // Every entry of the PTX is a function of the image (its name is in
        // the string table).
        for entry in ptx.lines().filter_map(|l| l.trim().strip_prefix(".visible .entry ")) {
            let n = &entry[..entry.find('(').unwrap_or(entry.len())];
            assert!(
                c.windows(n.len()).any(|w| w == n.as_bytes()),
                "{name}: entry {n} is not in the cubin"
            );
        }
    }
}

/// The definition (not a forward declaration) of the `.func` whose name
/// contains `name`: its header runs to a `{` line, a declaration's to `;`.
fn func_body<'a>(ptx: &'a str, name: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(at) = ptx[from..].find("\n.func") {
        let start = from + at + 1;
        let rest = &ptx[start..];
        let head_end = match (rest.find("\n{"), rest.find("\n;")) {
            (Some(b), Some(d)) if d < b => d,
            (Some(b), _) => b,
            (None, Some(d)) => d,
            (None, None) => return None,
        };
        if rest[..head_end].contains(name) && rest[head_end..].starts_with("\n{") {
            return Some(&rest[..rest.find("\n}\n").unwrap_or(rest.len())]);
        }
        from = start + head_end;
    }
    None
}

/// What makes ptxas compile a loop for intra-warp forward progress (a
/// `YIELD` in its poll loops, `BSSY`/`BSYNC` around its branches) when the
/// loop can reach it: a read-modify-write atomic (`atom.`, `red.`), a warp
/// vote, or reading the lane's identity.
fn forward_progress_uses(body: &str, tid_too: bool) -> Vec<&str> {
    body.lines()
        .map(str::trim)
        .filter(|l| {
            l.starts_with("atom.")
                || l.starts_with("red.")
                || l.starts_with("vote.")
                || l.starts_with("activemask")
                || l.contains("%laneid")
                || (tid_too && l.contains("%tid"))
        })
        .collect()
}

/// The error record every checked call can reach, and the function that
/// works out which check failed, stay free of those (heap.rs, `record`):
/// with a CAS claim in the record, every call of a signal round trip on an
/// H200 took about 30 ns more (`benchmarks/p2p_h200_rtt_report_claim_ab.txt`).
/// The signal ping-pong's entry (`p2p_bench`'s checked round trip) reads
/// `%tid` once, before its loop, and has none of the others.
#[test]
fn the_error_record_and_the_signal_round_trip_keep_ptxas_from_adding_forward_progress_barriers() {
    for (module, ptx) in [
        ("doorbell_kernels", doorbell::KERNELS_PTX),
        ("doorbell_example_kernels", doorbell_examples::USER_KERNELS_PTX),
    ] {
        for f in ["4heap6record", "4heap6reject"] {
            let body = func_body(ptx, f).unwrap_or_else(|| panic!("{module}: no function {f}"));
            let bad = forward_progress_uses(body, true);
            assert!(bad.is_empty(), "{module}: {f} uses {bad:?}");
        }
    }
    let entry = entry_body(doorbell_examples::USER_KERNELS_PTX, "signal_pingpong_p2p");
    let bad = forward_progress_uses(entry, false);
    assert!(bad.is_empty(), "signal_pingpong_p2p uses {bad:?}");
}

/// The device trace's hooks are in the PTX of a kernel crate built with
/// the `trace` feature and nowhere else: the test kernels built without
/// it, the library and the examples (their default images, also in a
/// build with `DOORBELL_TRACE_KERNELS=1`) hold no trace code at all (no call of
/// the recorder, no read of the heap header's trace word), and entries
/// without a transport call come out of both builds byte for byte the
/// same.
#[test]
fn trace_hooks_are_in_the_traced_build_only() {
    let Some(plain) = built_ptx("test kernels", doorbell_tests::TEST_KERNELS_PTX) else {
        return;
    };
    let traced = doorbell_tests::TEST_KERNELS_TRACED.ptx;
    // The default images hold no trace code, in a build with
    // DOORBELL_TRACE_KERNELS=1 too (its hooks are in the traced images,
    // loaded only while tracing is requested).
    let untraced = [
        ("doorbell_test_kernels", plain),
        ("doorbell_kernels", doorbell::KERNELS_PTX),
        ("doorbell_example_kernels", doorbell_examples::USER_KERNELS_PTX),
    ];
    if option_env!("DOORBELL_TRACE_KERNELS") == Some("1") {
        for image in [doorbell_tests::TEST_KERNELS, doorbell::KERNELS, doorbell_examples::USER_KERNELS] {
            assert!(
                image.traced_ptx.contains("trace_record"),
                "{}: no traced image with a recorder",
                image.name
            );
        }
    }
    // The trace word's offset in the heap header, as PTX writes an immediate.
    let word = format!("+{}]", doorbell::kernels::trace::TRACE_OFFSET);
    for (name, ptx) in untraced {
        assert!(
            !ptx.contains("trace_record"),
            "{name}: the trace recorder is in a build without the `trace` feature"
        );
        assert!(
            !ptx.contains(&word),
            "{name}: the trace word is read in a build without the `trace` feature"
        );
    }
    assert!(traced.contains("trace_record"), "the traced build has no trace recorder");
    let hooked = entry_body(traced, "pipe_by_launch_p2p");
    assert!(hooked.contains(&word), "the traced pipeline kernel does not read the trace word");
    assert!(!entry_body(plain, "pipe_by_launch_p2p").contains("trace"));
    assert_eq!(entries(plain), entries(traced), "the two builds export different entries");
    let mut same = 0;
    for e in entries(plain).into_iter().filter(|e| e.starts_with("golden_")) {
        assert_eq!(entry_body(plain, e), entry_body(traced, e), "{e} differs between the two builds");
        same += 1;
    }
    assert!(same >= 100, "only {same} golden entries compared");
}

/// The fixed-size byte loops of a body: a loop (a label, at most 16
/// instruction lines, a predicated branch back to it) that loads and stores
/// one byte per step, stepping its counter by one up to a literal bound of
/// 16 or more — the NVPTX backend's expansion of a `memcpy` of a value
/// (Rust copies a struct by value with one). Returns each loop's bound.
fn byte_copy_loops(body: &str) -> Vec<i64> {
    let lines: Vec<&str> = body.lines().map(str::trim).collect();
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(target) = l
            .strip_prefix('@')
            .and_then(|r| r.split_once(" bra"))
            .map(|(_, t)| t.trim().trim_end_matches(';'))
        else {
            continue;
        };
        let label = format!("{target}:");
        let Some(start) = (i.saturating_sub(16)..i).rev().find(|&j| lines[j] == label) else {
            continue;
        };
        let loop_body = instructions(&lines[start..=i].join("\n"))
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<_>>();
        let byte = |op: &str| {
            loop_body
                .iter()
                .any(|x| x.starts_with(op) && x.split_whitespace().next().is_some_and(|m| m.ends_with(".b8")))
        };
        if !(byte("ld.") && byte("st.")) {
            continue;
        }
        // `add.s64 %c, %c, 1` and `setp.lt.u64 %p, %c, N`.
        let counters: Vec<String> = loop_body
            .iter()
            .filter(|x| x.starts_with("add.s64"))
            .map(|x| operands(x))
            .filter(|o| o.len() == 3 && o[0] == o[1] && o[2] == "1")
            .map(|o| o[0].clone())
            .collect();
        for x in loop_body.iter().filter(|x| x.starts_with("setp.lt.u64")) {
            let o = operands(x);
            if let (true, Some(n)) = (o.len() == 3 && counters.contains(&o[1]), int(&o[2])) {
                if n >= 16 {
                    found.push(n);
                }
            }
        }
    }
    found
}

/// No module copies a value byte by byte. A by-value read of a struct of
/// 128 bytes (the IBGDA transport's QP entry, once in every call) had been
/// such a loop: ~5 000 of the ~8 700 cycles a one-thread put spent before
/// its doorbell on an H200. Kernels read such structs word by word
/// (`ptx::load_words`) or through a reference.
#[test]
fn no_module_copies_a_value_byte_by_byte() {
    let mut bad = Vec::new();
    for (name, ptx) in modules() {
        if !doorbell::ptx_is_built(ptx) {
            eprintln!("{name}: PTX not built (DOORBELL_SKIP_PTX): not checked");
            continue;
        }
        for (f, body) in functions(ptx) {
            for n in byte_copy_loops(body) {
                bad.push(format!("{name}: {f}: a {n}-byte copy"));
            }
        }
    }
    assert!(bad.is_empty(), "byte-by-byte copies of values:\n{}", bad.join("\n"));
}

#[test]
fn byte_copy_loops_are_found_in_a_struct_copy_and_not_in_a_strided_tail() {
    let struct_copy = "{\n\tmov.b64 \t%rd5, 0;\n$L__BB0_3:\n\tadd.s64 \t%rd6, %rd1, %rd5;\n\tld.b8 \t%rs1, [%rd6];\n\tadd.s64 \t%rd7, %rd2, %rd5;\n\tst.local.b8 \t[%rd7], %rs1;\n\tadd.s64 \t%rd5, %rd5, 1;\n\tsetp.lt.u64 \t%p1, %rd5, 128;\n\t@%p1 bra \t$L__BB0_3;\n\tret;\n}\n";
    assert_eq!(byte_copy_loops(struct_copy), vec![128]);
    // A tail copied by a thread stride (a register step): data, not a value.
    let tail = struct_copy.replace("add.s64 \t%rd5, %rd5, 1;", "add.s64 \t%rd5, %rd5, %rd9;");
    assert_eq!(byte_copy_loops(&tail), Vec::<i64>::new());
    // Word loads: not a byte loop.
    let words = struct_copy
        .replace("ld.b8 \t%rs1", "ld.b64 \t%rd8")
        .replace("st.local.b8 \t[%rd7], %rs1", "st.local.b64 \t[%rd7], %rd8");
    assert_eq!(byte_copy_loops(&words), Vec::<i64>::new());
}

/// `barrier_block` after one thread's work (`p2p_barrier_rounds`: thread 0
/// signals every peer, then the block meets) compiles to non-aligned block
/// barriers only. With an aligned `bar.sync` on entry LLVM copied it into
/// thread 0's path and the other threads' path (two `bar.sync` a warp
/// reached at different instructions), and the kernel hung on an H200; the
/// CPU emulator cannot see it.
#[test]
fn a_block_barrier_after_one_thread_s_work_is_never_an_aligned_barrier() {
    let body = entry_body(doorbell_tests::TEST_KERNELS_PTX, "p2p_barrier_rounds");
    let aligned: Vec<&str> = body
        .lines()
        .map(str::trim)
        // Predicated too (`@%p1 bar.sync 0;`).
        .filter(|l| {
            l.split_whitespace()
                .any(|w| w.starts_with("bar.sync") || w.starts_with("barrier.sync.aligned"))
        })
        .collect();
    assert!(aligned.is_empty(), "aligned block barriers in p2p_barrier_rounds: {aligned:?}");
    assert!(body.contains("barrier.sync"), "p2p_barrier_rounds has no block barrier at all");
}

/// A cycle of calls among `ptx`'s functions, if any (each name once, the
/// first repeated at the end).
fn call_cycle(ptx: &str) -> Option<Vec<String>> {
    let all = functions(ptx);
    let graph: Vec<(&str, Vec<&str>)> = all.iter().map(|&(n, body)| (n, callees(body))).collect();
    // Depth-first, with the path kept: a callee already on the path closes
    // a cycle.
    fn visit<'a>(n: &'a str, graph: &[(&'a str, Vec<&'a str>)], path: &mut Vec<&'a str>, done: &mut Vec<&'a str>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| *p == n) {
            let mut c: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(&n) {
            return None;
        }
        path.push(n);
        let callees = graph.iter().find(|(m, _)| *m == n).map(|(_, c)| c.as_slice()).unwrap_or(&[]);
        for &c in callees {
            if let Some(cycle) = visit(c, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(n);
        None
    }
    let mut done = Vec::new();
    for &(n, _) in &graph {
        if let Some(c) = visit(n, &graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_module_calls_a_function_within_its_own_calls() {
    // Device recursion needs a stack ptxas cannot size; a dead recursive
    // path (a drain that calls back into itself where nothing can be in
    // flight) still makes one.
    for (name, ptx) in modules() {
        if let Some(c) = call_cycle(ptx) {
            panic!("{name}: a function reaches itself through calls: {}", c.join(" -> "));
        }
    }
    // The check itself: a self-call and a cycle of two are found.
    let one = "\n.func a(\n)\n{\n\tcall.uni a, (p);\n}\n";
    assert!(call_cycle(one).is_some(), "a self-call");
    let two = "\n.func a(\n)\n{\n\tcall.uni b, (p);\n}\n.func b(\n)\n{\n\tcall.uni (r), a, (p);\n}\n";
    assert_eq!(call_cycle(two).map(|c| c.len()), Some(3));
    assert!(call_cycle("\n.func a(\n)\n{\n\tret;\n}\n").is_none());
}

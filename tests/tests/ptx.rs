//! Checks on the PTX the workspace produces: ptxas accepts every module for
//! sm_90, kernels marked `#[kernel(hot)]` do not spill to local memory, and
//! every memory-ordering primitive emits the instruction its name spells.

use std::path::PathBuf;
use std::process::Command;

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
    if let Some(p) = std::env::var_os("DOORBELL_PTXAS") {
        return PathBuf::from(p);
    }
    if let Ok(out) = Command::new("ptxas").arg("--version").output() {
        if out.status.success() {
            return PathBuf::from("ptxas");
        }
    }
    for py in ["python3", "python"] {
        let out = Command::new(py)
            .args(["-c", "import nvidia, os; print([p for p in nvidia.__path__][0])"])
            .output();
        if let Ok(out) = out {
            let base = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let cand = PathBuf::from(base).join("cuda_nvcc/bin/ptxas");
            if cand.exists() {
                return cand;
            }
        }
    }
    panic!("ptxas not found: run scripts/setup.sh (it installs the PyPI wheel nvidia-cuda-nvcc-cu12), or set DOORBELL_PTXAS");
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
fn ptxas_accepts_every_module_and_hot_kernels_do_not_spill() {
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
        let hot: Vec<&str> = ptx
            .lines()
            .filter_map(|l| l.split("DOORBELL_HOT_").nth(1))
            .map(|s| s.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap())
            .collect();
        for (kernel, st, ld, _) in &report {
            if hot.contains(&kernel.as_str()) {
                assert!(
                    *st == 0 && *ld == 0,
                    "{name}: hot kernel {kernel} spills ({st} bytes stored, {ld} loaded)"
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
/// kernel crates): today, the all-reduce.
#[test]
fn library_ptx_holds_no_test_example_or_bench_kernels() {
    let lib = entries(doorbell::KERNELS_PTX);
    let library_kernels: &[&str] = &["allreduce_ibgda", "allreduce_p2p", "allreduce_routed"];
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
    // The soft NIC is a device: its engine kernel is in its own PTX, alone
    // (built without the library's kernels, which fat LTO would carry in
    // and the driver would JIT before the engine could start).
    assert_eq!(
        entries(doorbell::comm::SOFTNIC_PTX),
        ["softnic_engine"],
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

//! `doorbell doctor`, the built binary, run here: its exit status, its
//! sections, its JSON, a bad variable and a bad flag.

use std::process::{Command, Output};

/// Runs `doorbell doctor <args>` with `DOORBELL_*` cleared and `set` added.
fn doctor(args: &[&str], set: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_doorbell"));
    cmd.arg("doctor").args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DOORBELL_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(set.iter().copied());
    cmd.output().expect("the doorbell binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{}", stdout(o)))
}

/// On a machine without a GPU the emulator runs: a warning, exit 0 (on a
/// machine where something is wrong the report names it, and exits 1).
#[test]
fn plain_report_has_every_section() {
    let o = doctor(&[], &[]);
    let text = stdout(&o);
    for head in [
        "== GPUs ==",
        "== Kernels ==",
        "== Peer access ==",
        "== RDMA ==",
        "== Routes (",
        "== Environment ==",
        "result: ",
    ] {
        assert!(text.contains(head), "no {head:?} in\n{text}");
    }
    let report = json(&doctor(&["--json"], &[]));
    let problems = report["problems"].as_array().expect("problems").clone();
    assert_eq!(o.status.code(), Some(if problems.is_empty() { 0 } else { 1 }), "{text}");
    if report["gpus"]["devices"].as_array().is_some_and(Vec::is_empty) {
        assert!(problems.is_empty(), "without a GPU nothing should be wrong here: {problems:?}");
        assert_eq!(o.status.code(), Some(0), "{text}");
        assert!(text.contains("the CPU emulator will be used"), "{text}");
        // With --require-gpu, no GPU is a problem.
        let o = doctor(&["--require-gpu"], &[]);
        assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
        assert!(stdout(&o).contains("--require-gpu asks for one"));
    }
}

#[test]
fn json_is_one_object_with_the_sections() {
    let o = doctor(&["--json", "--ranks", "3", "--launch", "threads"], &[]);
    let v = json(&o);
    for key in doorbell::doctor::Report::SECTIONS {
        assert!(v.get(key).is_some(), "no {key} in {v}");
    }
    assert_eq!(v["routes"]["ranks"], 3);
    assert_eq!(v["routes"]["launch"], "threads");
    assert_eq!(v["routes"]["pairs"].as_array().map(Vec::len), Some(3), "three pairs of three ranks");
    for lib in ["libibverbs.so.1", "libmlx5.so.1"] {
        assert!(
            v["rdma"]["libraries"].as_array().unwrap().iter().any(|l| l["name"] == lib),
            "{lib} not reported: {}",
            v["rdma"]
        );
    }
    // The embedded PTX, reported as it is: built (ISA and target read from
    // its header) or a placeholder (DOORBELL_SKIP_PTX=1), never both.
    let built = doorbell::ptx_is_built(doorbell::KERNELS_PTX);
    let k = &v["kernels"]["images"][0];
    assert_eq!(k["name"], "doorbell_kernels");
    assert_eq!(k["ptx_built"].as_bool(), Some(built), "{k}");
    assert_eq!(k["ptx_isa"].is_string(), built, "{k}");
    assert_eq!(k["target"].is_string(), built, "{k}");
    let text = stdout(&doctor(&[], &[]));
    assert_eq!(text.contains("doorbell_kernels: built without PTX"), !built, "{text}");
    assert_eq!(text.contains("doorbell_kernels: PTX ISA "), built, "{text}");
}

#[test]
fn a_bad_variable_exits_1_naming_it() {
    let o = doctor(&[], &[("DOORBELL_WAIT_TIMEOUT_S", "abc")]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    let problems = &text[text.find("== Problems ==").expect("a problems section")..];
    assert!(
        problems.contains("DOORBELL_WAIT_TIMEOUT_S") && problems.contains("abc"),
        "{problems}"
    );
    assert!(problems.contains("fix: "), "{problems}");

    let v = json(&doctor(&["--json"], &[("DOORBELL_WAIT_TIMEOUT_S", "abc")]));
    let p = v["problems"].as_array().expect("problems");
    assert!(
        p.iter().any(|f| f["section"] == "environment"
            && f["message"].as_str().is_some_and(|m| m.contains("DOORBELL_WAIT_TIMEOUT_S"))
            && f["fix"].as_str().is_some_and(|m| !m.is_empty())),
        "{p:?}"
    );
    let var = v["environment"]["vars"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "DOORBELL_WAIT_TIMEOUT_S")
        .cloned()
        .expect("listed");
    assert_eq!(var["status"], "bad");
}

#[test]
fn an_unknown_variable_is_flagged_with_a_suggestion() {
    let o = doctor(&[], &[("DOORBELL_WAIT_TIMEOUT", "5")]);
    let text = stdout(&o);
    assert!(text.contains("did you mean DOORBELL_WAIT_TIMEOUT_S?"), "{text}");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["--no-such-flag"][..],
        &["--ranks", "0"],
        &["--ranks", "many"],
        &["--launch", "pigeons"],
    ] {
        let o = doctor(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_doorbell")).output().expect("runs");
    assert_eq!(o.status.code(), Some(2), "no subcommand");
}

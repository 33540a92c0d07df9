//! The examples' command lines (`doorbell_examples::cli`): every defect a
//! reviewer hit with bad flags is refused by the parser (clap exits with
//! status 2 and a message naming the flag), plus one end-to-end run of a
//! built example binary.

use std::path::PathBuf;
use std::process::Command;

use doorbell_examples::clap::error::ErrorKind;
use doorbell_examples::clap::{CommandFactory, Parser};
use doorbell_examples::cli::{FmaArgs, HistogramArgs, P2pBenchArgs, PingpongArgs, WqeDumpArgs, MAX_BYTES};
use doorbell_examples::{host_vec, ratio};

fn argv(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

/// Parses `line` with `P` and returns the error message, asserting that it
/// is a usage error (exit status 2) that names `flag`.
fn refused<P: Parser + std::fmt::Debug>(line: &str, flag: &str) -> String {
    let e = P::try_parse_from(argv(line)).expect_err(line);
    assert_eq!(e.exit_code(), 2, "{line}: {e}");
    let msg = e.to_string();
    assert!(msg.contains(flag), "`{line}` does not name {flag}: {msg}");
    msg
}

/// [`refused`] for every `(line, flag)` of `cases`.
fn refuses_all<P: Parser + std::fmt::Debug>(cases: &[(&str, &str)]) {
    for &(line, flag) in cases {
        refused::<P>(line, flag);
    }
}

#[test]
fn fma_refuses_sizes_and_counts_that_used_to_panic_or_lie() {
    let m = refused::<FmaArgs>("fma --n 18446744073709551615", "--n");
    assert!(m.contains("out of range"), "{m}");
    refuses_all::<FmaArgs>(&[
        ("fma --n 1000000000000000", "--n"),
        ("fma --n 0", "--n"),
        // 2^32 launches used to wrap to 0 and print `time: inf ms`.
        ("fma --iters 4294967296", "--iters"),
        ("fma --iters 0", "--iters"),
        ("fma --iters -1", "-1"),
        ("fma --n abc", "--n"),
    ]);
    let a = FmaArgs::try_parse_from(argv("fma --n 0x1000 --iters 3 --device cpu")).unwrap();
    assert_eq!((a.n, a.iters), (Some(4096), Some(3)));
    assert_eq!(a.device.backend().unwrap(), doorbell::Backend::Cpu);
}

#[test]
fn unknown_flags_stray_arguments_and_bad_devices_are_usage_errors() {
    let e = FmaArgs::try_parse_from(argv("fma --frobnicate")).unwrap_err();
    assert_eq!((e.kind(), e.exit_code()), (ErrorKind::UnknownArgument, 2));
    let e = FmaArgs::try_parse_from(argv("fma stray")).unwrap_err();
    assert_eq!((e.kind(), e.exit_code()), (ErrorKind::UnknownArgument, 2));
    // `--device foo` names the flag, not DOORBELL_DEVICE.
    let m = refused::<FmaArgs>("fma --device foo", "--device");
    assert!(!m.contains("DOORBELL_DEVICE") && m.contains("gpu, cpu or auto"), "{m}");
    refused::<PingpongArgs>("pingpong --device foo", "--device");
    refused::<PingpongArgs>("pingpong --transport rdma", "--transport");
    refused::<HistogramArgs>("histogram --n 1 --n 2", "--n");
}

/// Asserts that `example`'s help text `help` holds every one of `wants`.
fn lists(example: &str, help: &str, wants: &[&str]) {
    for want in wants {
        assert!(help.contains(want), "{example} --help lacks {want}: {help}");
    }
}

#[test]
fn help_lists_every_flag_with_its_default() {
    let e = FmaArgs::try_parse_from(argv("fma --help")).unwrap_err();
    assert_eq!((e.kind(), e.exit_code()), (ErrorKind::DisplayHelp, 0));
    lists(
        "fma",
        &e.to_string(),
        &["--device", "--n", "--iters", "default: 67108864", "default: 20 on a GPU"],
    );
    lists(
        "pingpong",
        &PingpongArgs::command().render_long_help().to_string(),
        &[
            "--iters",
            "[default: 1000]",
            "--size",
            "[default: 8]",
            "--transport",
            "DOORBELL_TOKEN",
        ],
    );
    lists(
        "p2p_bench",
        &P2pBenchArgs::command().render_help().to_string(),
        &[
            "-b, --minbytes",
            "-e, --maxbytes",
            "-f, --stepfactor",
            "-n, --iters",
            "-w, --warmup_iters",
            "--rtt-iters",
            "--rounds",
            "--out",
            "--spread",
        ],
    );
    for cmd in [HistogramArgs::command(), WqeDumpArgs::command()] {
        cmd.debug_assert();
    }
}

#[test]
fn histogram_and_pingpong_refuse_sizes_past_the_limit() {
    refused::<HistogramArgs>("histogram --n 1000000000000000", "--n");
    refuses_all::<PingpongArgs>(&[
        ("pingpong --size 100000000000", "--size"),
        // Used to wrap the heap-size arithmetic.
        ("pingpong --size 18446744073709551615", "--size"),
        ("pingpong --iters 4294967296", "--iters"),
    ]);
    // The largest accepted size has a heap size that does not overflow.
    let a = PingpongArgs::try_parse_from(["pingpong", "--size", &MAX_BYTES.to_string()]).unwrap();
    assert!(a.heap_bytes() > MAX_BYTES && a.heap_bytes().is_power_of_two());
    let a = PingpongArgs::try_parse_from(argv("pingpong --size 0")).unwrap();
    assert_eq!(a.params(), [("iters", 1000), ("size", 0)]);
}

#[test]
fn p2p_bench_takes_nccl_tests_flags_and_checks_them() {
    refuses_all::<P2pBenchArgs>(&[
        ("p2p_bench --max-size 1000000000000000", "--maxbytes"),
        // Used to panic building a Layout.
        ("p2p_bench --max-size 18446744073709551615", "--maxbytes"),
        // Used to print `ratio NaN`.
        ("p2p_bench --rtt-iters 0", "--rtt-iters"),
        ("p2p_bench -f 1", "--stepfactor"),
        ("p2p_bench --rounds 0", "--rounds"),
        ("p2p_bench --put-by thread", "--put-by"),
    ]);
    assert_eq!(P2pBenchArgs::try_parse_from(argv("p2p_bench")).unwrap().put_by, "block");
    assert_eq!(
        P2pBenchArgs::try_parse_from(argv("p2p_bench --put-by warp")).unwrap().put_by,
        "warp"
    );
    let a = P2pBenchArgs::try_parse_from(argv("p2p_bench -b 1024 -e 65536 -f 4 -n 7 -w 0")).unwrap();
    let plan = a.plan(false).unwrap();
    assert_eq!(plan.sizes, [1024, 4096, 16384, 65536]);
    assert_eq!((plan.iters_for(1024), a.warmup_iters, plan.max_bytes), (7, 0, 65536));
    assert_eq!(plan.heap_bytes, 2 * 65536 + (1 << 20));
    let a = P2pBenchArgs::try_parse_from(argv("p2p_bench --minbytes 8192 --maxbytes 4096")).unwrap();
    let e = a.plan(true).unwrap_err();
    assert!(e.contains("--minbytes") && e.contains("--maxbytes"), "{e}");
    // Defaults per backend, old long name kept as an alias.
    let a = P2pBenchArgs::try_parse_from(argv("p2p_bench")).unwrap();
    assert_eq!(a.plan(true).unwrap().max_bytes, 256 << 20);
    assert_eq!((a.plan(false).unwrap().rtt_iters, a.plan(true).unwrap().rounds), (200, 5));
    let (gpu, emu) = (a.plan(true).unwrap(), a.plan(false).unwrap());
    assert_eq!(gpu.iters_for(4096), 2000);
    assert_eq!(
        [gpu.iters_for(1 << 20), gpu.iters_for(16 << 20), gpu.iters_for(256 << 20)],
        [1024, 64, 4]
    );
    assert_eq!([emu.iters_for(1 << 20), emu.iters_for(4 << 20)], [256, 64]);
    // Rank 1 waits for a put after rank 0's timed launch unless asked.
    assert_eq!(a.peer_waits, "after");
    assert_eq!(
        P2pBenchArgs::try_parse_from(argv("p2p_bench --peer-waits during"))
            .unwrap()
            .peer_waits,
        "during"
    );
    refused::<P2pBenchArgs>("p2p_bench --peer-waits sometimes", "--peer-waits");
    let a = P2pBenchArgs::try_parse_from(argv("p2p_bench --max-size 8192 --warmup-iters 2")).unwrap();
    assert_eq!((a.max_bytes, a.warmup_iters), (Some(8192), 2));
}

#[test]
fn wqe_dump_checks_ranges_and_meaning() {
    refuses_all::<WqeDumpArgs>(&[
        ("wqe_dump write --index 70000", "--index"),
        ("wqe_dump write --qpn 0x1000000", "--qpn"),
        ("wqe_dump frob", "frob"),
    ]);
    let a = WqeDumpArgs::try_parse_from(argv("wqe_dump write --imm 1")).unwrap();
    assert!(a.request().unwrap_err().contains("--imm means nothing"));
    let a = WqeDumpArgs::try_parse_from(argv(
        "wqe_dump read --index 3 --qpn 0x10 --raddr 0x40 --rkey 1 --laddr 0x80 --lkey 2 --len 64",
    ))
    .unwrap();
    let want = doorbell_kernels::mlx5::dump::parse_args(&argv(
        "read --index 3 --qpn 0x10 --raddr 0x40 --rkey 1 --laddr 0x80 --lkey 2 --len 64",
    ))
    .unwrap();
    assert_eq!(a.request().unwrap(), want);
}

#[test]
fn host_buffers_too_large_are_errors_and_ratios_never_nan() {
    assert!(host_vec(u64::MAX, |i| i as u8).unwrap_err().contains("elements"));
    assert!(host_vec(1 << 50, |i| i as u32).unwrap_err().contains("could not allocate"));
    assert_eq!(host_vec(3, |i| i * 2).unwrap(), [0, 2, 4]);
    assert_eq!(ratio(1.0, 0.0), None);
    assert_eq!(ratio(f64::INFINITY, 1.0), None);
    assert_eq!(ratio(3.0, 2.0), Some(1.5));
}

/// A built example next to this test binary (target/<profile>/examples).
fn example_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    p.exists().then_some(p)
}

#[test]
fn built_examples_refuse_bad_input_with_status_2_and_no_backtrace() {
    let Some(fma) = example_binary("fma") else {
        eprintln!("fma not built in this profile (cargo build --release --example fma): skipping the binary check");
        return;
    };
    for (args, env, needle) in [
        ("--n 18446744073709551615", None, "--n"),
        ("--iters 4294967296", None, "--iters"),
        ("--device foo", None, "--device"),
        ("--bogus", None, "--bogus"),
        ("", Some(("DOORBELL_WAIT_TIMEOUT_S", "1e300")), "DOORBELL_WAIT_TIMEOUT_S"),
        ("", Some(("DOORBELL_EMU_MAX_THREADS", "abc")), "DOORBELL_EMU_MAX_THREADS"),
        ("", Some(("DOORBELL_DEVICE", "foo")), "DOORBELL_DEVICE"),
        ("", Some(("DOORBELL_LOG", "loud")), "DOORBELL_LOG"),
        ("", Some(("DOORBELL_IBGDA_MAX_MSG", "2147483648")), "DOORBELL_IBGDA_MAX_MSG"),
        ("", Some(("DOORBELL_IBGDA_MAX_MSG", "0")), "DOORBELL_IBGDA_MAX_MSG"),
    ] {
        let mut cmd = Command::new(&fma);
        cmd.args(argv(args)).env("RUST_BACKTRACE", "1");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "fma {args} {env:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(needle), "fma {args} {env:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("backtrace"), "fma {args} {env:?}: {err}");
    }
    let out = Command::new(&fma).arg("--help").output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--iters"));
}

/// A variable only the world can check (`DOORBELL_NODES` that does not
/// divide the ranks) is bad input as a bad flag is: status 2, naming it.
#[test]
fn a_node_count_that_does_not_divide_the_world_exits_2_naming_it() {
    for (ex, args) in [
        ("allreduce", "--device cpu --transport proxy"),
        ("embedding_exchange", "--device cpu --transport routed"),
    ] {
        let Some(bin) = example_binary(ex) else {
            eprintln!("{ex} not built in this profile (cargo build --release --example {ex}): skipping");
            continue;
        };
        let out = Command::new(&bin)
            .args(argv(args))
            .env("DOORBELL_NODES", "3")
            .env_remove("DOORBELL_RDMA_PEERS")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{ex} {args}: {err}");
        assert!(
            err.contains("DOORBELL_NODES=\"3\" does not divide") && !err.contains("panicked"),
            "{ex} {args}: {err}"
        );
    }
}

/// `proxy_bench --ranks 4` as 2 modeled nodes on the emulator: the
/// GPU-initiated side is the routed transport, both sides plan the
/// hierarchical all-reduce (the example checks it against the node-wise
/// sum), both pairs across the nodes (ranks 0-2 and 1-3) measure the round
/// trip and the rates at once (each receiver checks every word its
/// partner put), and without `DOORBELL_NODES`, with 2 ranks on one node
/// or with more pairs than a node has ranks the run is refused as bad
/// input.
#[test]
fn proxy_bench_with_more_ranks_compares_both_transports_across_modeled_nodes() {
    let Some(bin) = example_binary("proxy_bench") else {
        eprintln!("proxy_bench not built in this profile (cargo build --release --example proxy_bench): skipping");
        return;
    };
    // Four ranks without nodes; two ranks on one node (the pairs would
    // time load/store); three pairs of two nodes of two ranks.
    for (args, nodes, needle) in [
        ("--device cpu --ranks 4", None, "DOORBELL_NODES"),
        ("--device cpu", Some("1"), "different nodes"),
        ("--device cpu --ranks 4 --pairs 3", Some("2"), "--pairs 3"),
    ] {
        let mut cmd = Command::new(&bin);
        cmd.args(argv(args)).env_remove("DOORBELL_NODES").env_remove("DOORBELL_RDMA_PEERS");
        if let Some(n) = nodes {
            cmd.env("DOORBELL_NODES", n);
        }
        let refused = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{args} {nodes:?}: {err}");
        assert!(err.contains(needle), "{args} {nodes:?}: {err}");
    }
    let dir = std::env::temp_dir().join(format!("doorbell-proxy-bench-nodes-{}", std::process::id()));
    let out = Command::new(&bin)
        .args(argv(
            "--device cpu --ranks 4 --rounds 1 --rtt-iters 4 --wqes 8 --lane-rounds 1 --lane-blocks 2 --ar-sizes 4K --ar-chunks 1K --ar-steps 1 --emb-dims 4 --emb-steps 1 --out",
        ))
        .arg(&dir)
        .env("DOORBELL_NODES", "2")
        .env_remove("DOORBELL_RDMA_PEERS")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "proxy_bench --ranks 4 failed:\n{stdout}\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("proxy_bench.json")).unwrap()).unwrap();
    assert_eq!((r["ranks"].as_u64(), r["gpu_transport"].as_str()), (Some(4), Some("routed")));
    assert_eq!(r["pairs"], serde_json::json!([[0, 2], [1, 3]]));
    // A round trip per pair and side; a rate (the pairs' sum) per side.
    for (key, n) in [
        ("rtt_ibgda_us", 2),
        ("rtt_proxy_us", 2),
        ("rtt_p2p_us", 2),
        ("rate_ibgda_mput_s", 1),
        ("rate_proxy_mput_s", 1),
        ("lanes_ibgda_mput_s", 1),
        ("lanes_proxy_mput_s", 1),
    ] {
        let v = r[key].as_array().unwrap_or_else(|| panic!("{key}: {}", r[key]));
        assert_eq!(v.len(), n, "{key}: {v:?}");
        assert!(
            v.iter().all(|x| x.as_f64().is_some_and(|x| x > 0.0 && x.is_finite())),
            "{key}: {v:?}"
        );
    }
    assert!(stdout.contains("pairs across nodes, at once: 0-2, 1-3"), "{stdout}");
    let row = &r["allreduce"][0];
    assert_eq!(row["checked"].as_u64(), Some(1024));
    for way in ["fused_ibgda", "fused_proxy", "cpu_ibgda", "cpu_proxy"] {
        let us = row[way]["median_us"].as_f64().unwrap();
        assert!(us > 0.0 && us.is_finite(), "{way}: {us}");
    }
    let us = r["embedding"][0]["fwd_proxy_median_us"].as_f64().unwrap();
    assert!(us > 0.0 && us.is_finite(), "embedding forward over the proxy: {us}");
    // One pair: ranks 1 and 3 take no part (they launch with no peer).
    let out = Command::new(&bin)
        .args(argv(
            "--device cpu --ranks 4 --pairs 1 --rounds 1 --rtt-iters 4 --wqes 8 --lane-rounds 1 --lane-blocks 2 --ar-sizes 4K --ar-steps 1 --emb-steps 0 --out",
        ))
        .arg(&dir)
        .env("DOORBELL_NODES", "2")
        .env_remove("DOORBELL_RDMA_PEERS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "proxy_bench --ranks 4 --pairs 1 failed:\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("proxy_bench.json")).unwrap()).unwrap();
    assert_eq!(r["pairs"], serde_json::json!([[0, 2]]));
    assert_eq!(r["rtt_proxy_us"].as_array().map(Vec::len), Some(1), "{}", r["rtt_proxy_us"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `proxy_bench` on the emulator: every part runs over both transports,
/// with its results checked by the example itself (a wrong all-reduce
/// element or embedding output makes it exit non-zero), and the report
/// holds a positive time for every way, transport and shape.
#[test]
fn proxy_bench_runs_every_part_over_both_transports_on_the_emulator() {
    let Some(bin) = example_binary("proxy_bench") else {
        eprintln!("proxy_bench not built in this profile (cargo build --release --example proxy_bench): skipping");
        return;
    };
    let dir = std::env::temp_dir().join(format!("doorbell-proxy-bench-{}", std::process::id()));
    let out = Command::new(&bin)
        .args(argv(
            "--device cpu --rounds 1 --rtt-iters 4 --wqes 8 --lane-rounds 1 --lane-blocks 2",
        ))
        .args(argv(
            "--ar-sizes 4K,6K --ar-chunks 4K --ar-steps 1 --emb-dims 4,12 --emb-steps 1 --out",
        ))
        .arg(&dir)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "proxy_bench failed:\n{stdout}\n{stderr}");
    let json = std::fs::read_to_string(dir.join("proxy_bench.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    let positive = |v: &serde_json::Value, what: &str| {
        let x = v.as_f64().unwrap_or_else(|| panic!("{what}: {v}"));
        assert!(x > 0.0 && x.is_finite(), "{what}: {x}");
    };
    assert_eq!(r["pairs"], serde_json::json!([[0, 1]]));
    for key in [
        "rtt_ibgda_median_us",
        "rtt_proxy_median_us",
        "rate_ibgda_median_mput_s",
        "lanes_proxy_median_mput_s",
    ] {
        positive(&r[key], key);
    }
    let ar = r["allreduce"].as_array().unwrap();
    // 4 KiB in one chunk, 6 KiB in a 4 KiB chunk and a 2 KiB tail.
    assert_eq!(
        ar.iter().map(|row| row["bytes"].as_u64().unwrap()).collect::<Vec<_>>(),
        [4096, 6144]
    );
    for row in ar {
        assert_eq!(row["checked"].as_u64().unwrap(), row["bytes"].as_u64().unwrap() / 4);
        for way in ["fused_ibgda", "fused_proxy", "cpu_ibgda", "cpu_proxy"] {
            positive(&row[way]["median_us"], way);
        }
        positive(&row["producer_chunks_median_us"], "producer per chunk");
        positive(&row["producer_proxy_median_us"], "producer while the proxy is set up");
    }
    let emb = r["embedding"].as_array().unwrap();
    assert_eq!(emb.iter().map(|row| row["dim"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 12]);
    for row in emb {
        for t in [
            "fwd_ibgda_median_us",
            "fwd_proxy_median_us",
            "bwd_ibgda_median_us",
            "bwd_proxy_median_us",
        ] {
            positive(&row[t], t);
        }
    }
    for f in ["proxy_bench.png", "proxy_bench_embedding.png"] {
        assert!(dir.join(f).exists(), "{f}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

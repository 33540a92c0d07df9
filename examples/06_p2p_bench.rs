//! Benchmark of the P2P transport against the raw floors, measured in the
//! same run:
//!
//! * signal round trip between two ranks (`signal_pingpong`: `signal` +
//!   `wait_until` by one thread per rank, through the transport) vs the
//!   flag ping-pong floor (one thread per rank bouncing a flag between the
//!   two ranks' memories with st.release / ld.acquire, no doorbell API);
//! * put bandwidth, 4 KiB .. 256 MiB (`put_bw`: rank 0's blocks put slices
//!   into rank 1's symmetric buffer, repeatedly in one launch) vs a plain
//!   copy kernel with the same grid (`copy_raw`).
//!
//! ```text
//! cargo run --release --example p2p_bench -- --help
//! cargo run --release --example p2p_bench -- [--device gpu|cpu] [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR]
//!     [-n ITERS] [-w WARMUP_ITERS] [--rtt-iters N] [--spread] [--out DIR]
//! ```
//! Flags follow nccl-tests (`-b/--minbytes`, `-e/--maxbytes`, `-f/--stepfactor`,
//! `-n/--iters`, `-w/--warmup_iters`). Two ranks are threads of this process:
//! on one GPU both ranks share it (puts are device-local copies); with
//! `--spread` and two GPUs, rank r runs on GPU r and puts cross NVLink (then
//! the floor is a copy kernel writing into the peer GPU). After each size
//! rank 1 checks the bytes that arrived (`#wrong`), and a progress line goes
//! to stderr. Writes `p2p_bench.json`, `p2p_bench.csv`, `p2p_bench.png` and
//! `p2p_bench.svg` to `--out` (default `.`). On the CPU emulator the timings
//! say nothing about a GPU; the run then only checks that everything works.

use std::time::Duration;

use clap::Parser;
use doorbell::comm::{CommOptions, Communicator};
use doorbell::LaunchConfig;
use doorbell_example_kernels::comm::{
    copy_raw, flag_pingpong_pair, put_bw_p2p as put_bw, signal_pingpong_p2p as signal_pingpong, PINGPONG_OK,
};
use doorbell_examples::cli::P2pBenchArgs;
use doorbell_examples::plot::{write_chart, Chart, Series};
use doorbell_examples::{main_with, ratio, BoxError};

fn main() {
    let args = P2pBenchArgs::parse();
    main_with(|| run(&args));
}

/// One put size, as measured on rank 0 (`wrong`: bytes rank 1 received wrong).
#[derive(Clone, Debug, serde::Serialize)]
struct Row {
    bytes: u64,
    iters: u32,
    put_us: f64,
    floor_us: f64,
    wrong: u64,
}

/// The byte at `i` of the data put for `size`: differs from one size to the
/// next, so stale data from an earlier size counts as wrong.
fn pattern_byte(i: u64, size: u64) -> u8 {
    (i.wrapping_mul(131) ^ size.trailing_zeros() as u64 ^ (i >> 8)) as u8
}

fn run(args: &P2pBenchArgs) -> Result<(), BoxError> {
    let backend = args.device.backend()?;
    let gpu = args.device.wants_gpu()?;
    let plan = args.plan(gpu).unwrap_or_else(|e| {
        use clap::CommandFactory;
        P2pBenchArgs::command().error(clap::error::ErrorKind::ArgumentConflict, e).exit()
    });
    let max_size = plan.max_bytes;
    let rtt_iters = plan.rtt_iters;
    let env_opts = CommOptions::from_env()?;
    let opts = CommOptions {
        heap_bytes: plan.heap_bytes,
        wait_timeout: Duration::from_secs(30),
        spread_gpus: args.spread || env_opts.spread_gpus,
    };
    if !gpu {
        eprintln!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }

    let results = Communicator::local(2, backend, opts, |comm| {
        let dev = comm.device();
        let m = dev.load_module(doorbell_examples::USER_KERNELS_PTX)?;
        let sp = m.function::<signal_pingpong>()?;
        let raw_flag = m.function::<flag_pingpong_pair>()?;
        let copy = m.function::<copy_raw>()?;
        let put = m.function::<put_bw>()?;
        let s = dev.new_stream()?;
        let (sm_blocks, threads) = if dev.is_gpu() {
            (dev.multiprocessor_count() as u64, 512u32)
        } else {
            (2, 32)
        };

        // Signal round trip: one thread per rank, `signal` then `wait_until`
        // through the transport (argument checks included), a warm-up
        // launch first.
        let sig = comm.alloc::<u64>(1)?;
        let mut out_ns = dev.alloc_zeroed::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let mut epoch = 0u64;
        let mut rtt_us = 0.0;
        for (k, iters) in [rtt_iters / 10 + 1, rtt_iters].into_iter().enumerate() {
            comm.barrier()?;
            // SAFETY: one symmetric word, one ns word, one status word.
            unsafe {
                s.launch(
                    &sp,
                    LaunchConfig::linear(1, 32),
                    (comm.p2p(), sig.as_mut_ptr(), epoch, iters, out_ns.as_mut_ptr(), status.as_mut_ptr()),
                )?
            };
            comm.synchronize(&s)?;
            if status.to_host()?[0] != PINGPONG_OK {
                return Err(doorbell::Error::Comm("the signal ping-pong did not complete".into()));
            }
            epoch += iters as u64;
            if k == 1 {
                rtt_us = out_ns.to_host()?[0] as f64 / iters as f64 / 1e3;
            }
        }

        let mut rows = Vec::new();
        let mut floor_rtt_us = 0.0;
        let mut src = dev.alloc_zeroed::<u8>(max_size as usize)?;
        let dst = comm.alloc::<u8>(max_size as usize)?;
        let local_dst = dev.alloc_zeroed::<u8>(max_size as usize)?;
        let psig = comm.alloc::<u64>(1)?;
        let mut expect = 0u64;
        for &bytes in &plan.sizes {
            let blocks = bytes.div_ceil(64 << 10).clamp(1, sm_blocks);
            let iters = args.iters_for(bytes);
            let cfg = LaunchConfig::linear(blocks as u32, threads);
            // Fresh data for this size; rank 1 checks what arrived (#wrong).
            if comm.rank() == 0 {
                src.copy_from_host(&doorbell_examples::host_vec(max_size, |i| pattern_byte(i, bytes)).map_err(doorbell::Error::Comm)?)?;
            }
            if args.warmup_iters > 0 {
                // Warm-up: the same put, untimed.
                expect += blocks;
                comm.barrier()?;
                // SAFETY: buffers hold max_size >= bytes.
                unsafe {
                    s.launch(
                        &put,
                        cfg,
                        (
                            comm.p2p(),
                            dst.as_mut_ptr(),
                            src.as_ptr(),
                            bytes,
                            args.warmup_iters as u32,
                            psig.as_mut_ptr(),
                            expect,
                            status.as_mut_ptr(),
                        ),
                    )?
                };
                comm.synchronize(&s)?;
            }
            // Put: rank 0 writes into rank 1.
            expect += blocks;
            comm.barrier()?;
            let t0 = s.record()?;
            // SAFETY: buffers hold max_size >= bytes.
            unsafe {
                s.launch(
                    &put,
                    cfg,
                    (
                        comm.p2p(),
                        dst.as_mut_ptr(),
                        src.as_ptr(),
                        bytes,
                        iters,
                        psig.as_mut_ptr(),
                        expect,
                        status.as_mut_ptr(),
                    ),
                )?
            };
            let t1 = s.record()?;
            comm.synchronize(&s)?;
            let put_us = t0.elapsed_ms(&t1)? as f64 * 1e3 / iters as f64;
            if status.to_host()?[0] != PINGPONG_OK {
                return Err(doorbell::Error::Comm(format!("put of {bytes} bytes did not complete")));
            }
            let wrong = if comm.rank() == 1 {
                let got = dst.to_host()?;
                (0..bytes).filter(|&i| got[i as usize] != pattern_byte(i, bytes)).count() as u64
            } else {
                0
            };
            let wrong = u64::from_le_bytes(
                comm.world().broadcast_bytes(1, &wrong.to_le_bytes())?[..8]
                    .try_into()
                    .expect("8 bytes"),
            );
            comm.barrier()?;
            // Floor: the same copy with a plain kernel, same grid, on rank 0.
            let mut floor_us = 0.0;
            if comm.rank() == 0 {
                let target = if comm.describe_peers()[1] == doorbell::comm::PeerRoute::PeerAccess {
                    // Write into the peer GPU, like the put.
                    comm.peer_address(dst.as_ptr(), 1)?
                } else {
                    local_dst.as_raw() as *mut u8
                };
                let t0 = s.record()?;
                // SAFETY: both hold max_size bytes.
                unsafe { s.launch(&copy, cfg, (target, src.as_ptr(), bytes, iters))? };
                let t1 = s.record()?;
                s.synchronize()?;
                floor_us = t0.elapsed_ms(&t1)? as f64 * 1e3 / iters as f64;
            }
            if comm.rank() == 0 {
                eprintln!("# {bytes:>12} bytes x {iters:>5}: put {put_us:>10.2} us, copy floor {floor_us:>10.2} us, {wrong} wrong");
            }
            rows.push(Row {
                bytes,
                iters,
                put_us,
                floor_us,
                wrong,
            });
        }
        comm.barrier()?;
        // Flag ping-pong floor: one thread per rank bouncing a flag between
        // the two ranks' memories, same placement and scope as the transport.
        let flag = comm.alloc::<u32>(1)?;
        let theirs = comm.peer_address(flag.as_ptr(), 1 - comm.rank())?;
        let sys_scope = (comm.describe_peers()[1 - comm.rank()] != doorbell::comm::PeerRoute::SameProcess) as u32;
        let mut ns = dev.alloc_zeroed::<u64>(1)?;
        comm.barrier()?;
        // SAFETY: both flags are single words; the launch is unbounded but both ranks run it.
        unsafe {
            s.launch(
                &raw_flag,
                LaunchConfig::linear(1, 32),
                (flag.as_mut_ptr(), theirs, comm.rank() as u32, sys_scope, rtt_iters, ns.as_mut_ptr()),
            )?
        };
        s.synchronize()?;
        if comm.rank() == 0 {
            floor_rtt_us = ns.to_host()?[0] as f64 / rtt_iters as f64 / 1e3;
        }
        let scope = if comm.p2p().same_gpu != 0 { "gpu" } else { "sys" };
        Ok((
            rtt_us,
            floor_rtt_us,
            rows,
            dev.name(),
            format!("{:?}, signals at .{scope} scope", comm.describe_peers()[1]),
        ))
    })?;
    let (rtt_us, floor_rtt_us, rows, name, route) = results.into_iter().next().expect("rank 0");

    report(&args.out, rtt_us, floor_rtt_us, &rows, &name, &route, gpu)?;
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        return Err(format!("{wrong} bytes arrived wrong (see the #wrong column)").into());
    }
    Ok(())
}

/// The whole run, as written to `p2p_bench.json`.
#[derive(serde::Serialize)]
struct Report<'a> {
    device: &'a str,
    route: &'a str,
    emulator: bool,
    signal_rtt_us: f64,
    flag_floor_rtt_us: f64,
    rtt_ratio: Option<f64>,
    put: Vec<JsonRow>,
}

/// One row of the table, in nccl-tests' columns plus the floor.
#[derive(serde::Serialize)]
struct JsonRow {
    bytes: u64,
    count: u64,
    r#type: &'static str,
    iters: u32,
    put_us: f64,
    put_gbps: Option<f64>,
    floor_us: f64,
    floor_gbps: Option<f64>,
    ratio: Option<f64>,
    wrong: u64,
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.prec$}"))
}

fn report(
    out_dir: &std::path::Path,
    rtt_us: f64,
    floor_rtt_us: f64,
    rows: &[Row],
    name: &str,
    route: &str,
    gpu: bool,
) -> Result<(), BoxError> {
    println!("# doorbell P2P benchmark: 2 ranks on {name}, route {route}");
    if !gpu {
        println!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    let rtt_ratio = ratio(rtt_us, floor_rtt_us);
    println!(
        "# signal round trip: {rtt_us:.3} us; flag ping-pong floor: {floor_rtt_us:.3} us; ratio {}",
        fmt_opt(rtt_ratio, 2)
    );
    println!(
        "{:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}",
        "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "floor(us)", "floor(GB/s)", "ratio", "#wrong"
    );
    let mut csv = String::from("bytes,count,type,iters,put_us,put_gbps,floor_us,floor_gbps,ratio,wrong\n");
    let mut json_rows = Vec::new();
    for r in rows {
        let bw = ratio(r.bytes as f64, r.put_us * 1e-6).map(|b| b / 1e9);
        let fbw = ratio(r.bytes as f64, r.floor_us * 1e-6).map(|b| b / 1e9);
        let rr = bw.zip(fbw).and_then(|(a, b)| ratio(a, b));
        println!(
            "{:>12} {:>12} {:>6} {:>12.2} {:>12} {:>12.2} {:>12} {:>8} {:>8}",
            r.bytes,
            r.bytes,
            "uint8",
            r.put_us,
            fmt_opt(bw, 1),
            r.floor_us,
            fmt_opt(fbw, 1),
            fmt_opt(rr, 2),
            r.wrong
        );
        let c = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        csv += &format!(
            "{},{},uint8,{},{:.3},{},{:.3},{},{},{}\n",
            r.bytes,
            r.bytes,
            r.iters,
            r.put_us,
            c(bw),
            r.floor_us,
            c(fbw),
            c(rr),
            r.wrong
        );
        json_rows.push(JsonRow {
            bytes: r.bytes,
            count: r.bytes,
            r#type: "uint8",
            iters: r.iters,
            put_us: r.put_us,
            put_gbps: bw,
            floor_us: r.floor_us,
            floor_gbps: fbw,
            ratio: rr,
            wrong: r.wrong,
        });
    }
    let json = serde_json::to_string_pretty(&Report {
        device: name,
        route,
        emulator: !gpu,
        signal_rtt_us: rtt_us,
        flag_floor_rtt_us: floor_rtt_us,
        rtt_ratio,
        put: json_rows,
    })?;
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(out_dir.join("p2p_bench.json"), json + "\n")?;
    std::fs::write(out_dir.join("p2p_bench.csv"), csv)?;
    let gbps = |us: f64, bytes: u64| ratio(bytes as f64, us * 1e3).unwrap_or(f64::NAN);
    let title = format!("doorbell P2P put vs copy floor ({name})");
    write_chart(
        &Chart {
            title: &title,
            x_label: "bytes",
            y_label: "GB/s",
            series: &[
                Series {
                    name: "put_block (P2P transport)",
                    points: rows.iter().map(|r| (r.bytes as f64, gbps(r.put_us, r.bytes))).collect(),
                },
                Series {
                    name: "copy kernel (floor)",
                    points: rows.iter().map(|r| (r.bytes as f64, gbps(r.floor_us, r.bytes))).collect(),
                },
            ],
        },
        &out_dir.join("p2p_bench.png"),
        &out_dir.join("p2p_bench.svg"),
    )?;
    println!("# wrote {}/p2p_bench.{{json,csv,png,svg}}", out_dir.display());
    Ok(())
}

//! Benchmark of the P2P transport against the raw floors, measured in the
//! same run:
//!
//! * signal round trip between two ranks (`pingpong` with 0 bytes) vs the
//!   flag ping-pong floor (one thread per rank bouncing a flag between the
//!   two ranks' memories with st.release / ld.acquire, no doorbell API);
//! * put bandwidth, 4 KiB .. 256 MiB (`put_bw`: rank 0's blocks put slices
//!   into rank 1's symmetric buffer, repeatedly in one launch) vs a plain
//!   copy kernel with the same grid (`copy_raw`).
//!
//! ```text
//! cargo run --release --example p2p_bench -- [--device gpu|cpu] [--max-size BYTES] [--out DIR]
//! ```
//! Two ranks are threads of this process: on one GPU both ranks share it
//! (puts are device-local copies); with `--spread` and two GPUs, rank r
//! runs on GPU r and puts cross NVLink (then the floor is a copy kernel
//! writing into the peer GPU). Writes `p2p_bench.json`, `p2p_bench.csv` and
//! `p2p_bench.svg` to `--out` (default `.`).

use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator};
use doorbell::{Backend, LaunchConfig, KERNELS_PTX};
use doorbell_examples::plot::{svg_chart, Series};
use doorbell_examples::{die, Args};
use doorbell_kernels::examples::{copy_raw, flag_pingpong_pair, pingpong, put_bw, PINGPONG_OK};

fn main() {
    if let Err(e) = run() {
        die(e);
    }
}

struct Row {
    bytes: u64,
    put_us: f64,
    floor_us: f64,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse(&["spread"])?;
    let bad = args.unknown(&["device", "max-size", "out", "spread", "rtt-iters"]);
    if !bad.is_empty() {
        return Err(format!("unknown option(s): {}", bad.join(", ")).into());
    }
    let backend = args.backend()?;
    let gpu = backend == Backend::Gpu || (backend == Backend::Auto && doorbell::gpu_count() > 0);
    let max_size = args.num("max-size", if gpu { 256 << 20 } else { 4 << 20 })?;
    let rtt_iters = args.num("rtt-iters", if gpu { 20_000 } else { 200 })? as u32;
    let out_dir = std::path::PathBuf::from(args.get("out").unwrap_or("."));
    let spread = args.flag("spread");
    let opts = CommOptions {
        heap_bytes: max_size * 2 + (1 << 20),
        wait_timeout: Duration::from_secs(30),
        spread_gpus: spread || CommOptions::default().spread_gpus,
    };

    let results = Communicator::local(2, backend, opts, |comm| {
        let dev = comm.device();
        let m = dev.load_module(KERNELS_PTX)?;
        let pp = m.function::<pingpong>()?;
        let raw_flag = m.function::<flag_pingpong_pair>()?;
        let copy = m.function::<copy_raw>()?;
        let put = m.function::<put_bw>()?;
        let s = dev.new_stream()?;
        let (sm_blocks, threads) = if dev.is_gpu() {
            (dev.multiprocessor_count() as u64, 512u32)
        } else {
            (2, 32)
        };

        // Signal round trip.
        let sig = comm.alloc::<u64>(1)?;
        let mut out_ns = dev.alloc_zeroed::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let mut epoch = 0u64;
        let mut rtt_us = 0.0;
        for (k, iters) in [rtt_iters / 10 + 1, rtt_iters].into_iter().enumerate() {
            comm.barrier()?;
            // SAFETY: sizes as pingpong documents (0 bytes: no buffer access).
            unsafe {
                s.launch(
                    &pp,
                    LaunchConfig::linear(1, 32),
                    (
                        comm.p2p(),
                        sig.as_mut_ptr() as *mut u8,
                        0u64,
                        16u64,
                        sig.as_mut_ptr(),
                        epoch,
                        iters,
                        out_ns.as_mut_ptr(),
                        status.as_mut_ptr(),
                    ),
                )?
            };
            comm.synchronize(&s)?;
            epoch += iters as u64;
            if k == 1 {
                rtt_us = out_ns.to_host()?[0] as f64 / iters as f64 / 1e3;
            }
        }
        if status.to_host()?[0] != PINGPONG_OK {
            return Err(doorbell::Error::Comm("pingpong did not complete".into()));
        }

        let mut rows = Vec::new();
        let mut floor_rtt_us = 0.0;
        let src = dev.alloc_zeroed::<u8>(max_size as usize)?;
        let dst = comm.alloc::<u8>(max_size as usize)?;
        let local_dst = dev.alloc_zeroed::<u8>(max_size as usize)?;
        let psig = comm.alloc::<u64>(1)?;
        let mut expect = 0u64;
        let mut bytes = 4096u64;
        while bytes <= max_size {
            let blocks = bytes.div_ceil(64 << 10).clamp(1, sm_blocks);
            let iters = ((256u64 << 20) / bytes).clamp(4, 2000) as u32;
            let cfg = LaunchConfig::linear(blocks as u32, threads);
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
            rows.push(Row { bytes, put_us, floor_us });
            bytes *= 4;
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
        Ok((rtt_us, floor_rtt_us, rows, dev.name(), format!("{:?}", comm.describe_peers()[1])))
    })?;
    let (rtt_us, floor_rtt_us, rows, name, route) = results.into_iter().next().expect("rank 0");

    println!("# doorbell P2P benchmark: 2 ranks on {name}, route {route}");
    println!(
        "# signal round trip: {rtt_us:.3} us; flag ping-pong floor: {floor_rtt_us:.3} us; ratio {:.2}",
        rtt_us / floor_rtt_us
    );
    println!(
        "{:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "floor(us)", "floor(GB/s)", "ratio"
    );
    let mut csv = String::from("bytes,count,type,put_us,put_gbps,floor_us,floor_gbps,ratio\n");
    let mut json_rows = Vec::new();
    for r in &rows {
        let bw = r.bytes as f64 / (r.put_us * 1e-6) / 1e9;
        let fbw = r.bytes as f64 / (r.floor_us * 1e-6) / 1e9;
        println!(
            "{:>12} {:>12} {:>6} {:>12.2} {:>12.1} {:>12.2} {:>12.1} {:>8.2}",
            r.bytes,
            r.bytes,
            "uint8",
            r.put_us,
            bw,
            r.floor_us,
            fbw,
            bw / fbw
        );
        csv += &format!(
            "{},{},uint8,{:.3},{:.2},{:.3},{:.2},{:.3}\n",
            r.bytes,
            r.bytes,
            r.put_us,
            bw,
            r.floor_us,
            fbw,
            bw / fbw
        );
        json_rows.push(format!(
            "{{\"bytes\":{},\"put_us\":{:.3},\"put_gbps\":{:.2},\"floor_us\":{:.3},\"floor_gbps\":{:.2},\"ratio\":{:.3}}}",
            r.bytes,
            r.put_us,
            bw,
            r.floor_us,
            fbw,
            bw / fbw
        ));
    }
    let json = format!(
        "{{\"device\":\"{name}\",\"route\":\"{route}\",\"signal_rtt_us\":{rtt_us:.3},\"flag_floor_rtt_us\":{floor_rtt_us:.3},\"put\":[{}]}}\n",
        json_rows.join(",")
    );
    std::fs::create_dir_all(&out_dir)?;
    std::fs::write(out_dir.join("p2p_bench.json"), json)?;
    std::fs::write(out_dir.join("p2p_bench.csv"), csv)?;
    let chart = svg_chart(
        &format!("doorbell P2P put vs copy floor ({name})"),
        "bytes",
        "GB/s",
        &[
            Series {
                name: "put_block (P2P transport)",
                points: rows.iter().map(|r| (r.bytes as f64, r.bytes as f64 / r.put_us / 1e3)).collect(),
            },
            Series {
                name: "copy kernel (floor)",
                points: rows.iter().map(|r| (r.bytes as f64, r.bytes as f64 / r.floor_us / 1e3)).collect(),
            },
        ],
    );
    std::fs::write(out_dir.join("p2p_bench.svg"), chart)?;
    println!("# wrote {}/p2p_bench.{{json,csv,svg}}", out_dir.display());
    Ok(())
}

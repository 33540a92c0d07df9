//! `p2p_bench`'s results and report: the round trips and put rows as
//! measured on rank 0, the two tables it prints, and the files it writes
//! (`p2p_bench.json`, `p2p_bench.csv`, `p2p_bench_rtt.csv`, the figure).
//! The JSON and CSV columns are kept as earlier outputs have them (stored
//! results are compared with new runs), one field each.

use doorbell_examples::cli::{P2pBenchArgs, P2pBenchPlan};
use doorbell_examples::plot::Series;
use doorbell_examples::{ratio, BoxError};

use super::bench::{self, fmt_opt, Stat, Table};

/// Transport calls per signal round trip (`signal` and `wait_until` on
/// each rank): the divisor of the per-call check cost.
pub const CALLS_PER_ROUND_TRIP: u32 = 4;

/// The three signal round trips, us per round trip (rank 0's clock).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Rtt {
    pub floor: Stat,
    pub unchecked: Stat,
    pub checked: Stat,
}

impl Rtt {
    /// `s`'s median over the floor's.
    fn vs_floor(&self, s: &Stat) -> Option<f64> {
        ratio(s.median_us, self.floor.median_us)
    }

    /// What the argument checks cost per call, ns, of medians.
    fn check_ns_per_call(&self) -> f64 {
        (self.checked.median_us - self.unchecked.median_us) * 1e3 / CALLS_PER_ROUND_TRIP as f64
    }
}

/// One put size as measured on rank 0, in nccl-tests' columns plus the
/// floors: a row of the table, `p2p_bench.csv` and `p2p_bench.json`.
#[derive(serde::Serialize)]
pub struct Row {
    bytes: u64,
    count: u64,
    r#type: &'static str,
    iters: u32,
    blocks: u64,
    /// Median over the rounds; `put_min_us` the fastest round.
    put_us: f64,
    put_min_us: f64,
    put_gbps: Option<f64>,
    /// The faster copy (medians), and which one.
    floor_us: f64,
    floor_kind: &'static str,
    floor_gbps: Option<f64>,
    /// put bandwidth / floor bandwidth.
    ratio: Option<f64>,
    copy: Stat,
    piece_copy: Stat,
    put: Stat,
    /// Bytes rank 1 received wrong from the size's first put.
    wrong: u64,
}

impl Row {
    pub fn new(bytes: u64, iters: u32, blocks: u64, [put, copy, piece_copy]: [Stat; 3], wrong: u64) -> Row {
        let (floor_us, floor_kind) = if piece_copy.median_us < copy.median_us {
            (piece_copy.median_us, "pieces")
        } else {
            (copy.median_us, "grid-stride")
        };
        let put_gbps = ratio(bytes as f64, put.median_us * 1e-6).map(|b| b / 1e9);
        let floor_gbps = ratio(bytes as f64, floor_us * 1e-6).map(|b| b / 1e9);
        let (put_us, put_min_us) = (put.median_us, put.min_us);
        let ratio = put_gbps.zip(floor_gbps).and_then(|(a, b)| ratio(a, b));
        let r#type = "uint8";
        Row {
            bytes,
            count: bytes,
            r#type,
            iters,
            blocks,
            put_us,
            put_min_us,
            put_gbps,
            floor_us,
            floor_kind,
            floor_gbps,
            ratio,
            copy,
            piece_copy,
            put,
            wrong,
        }
    }

    /// The progress line rank 0 prints on stderr once the size is measured.
    pub fn progress(&self) -> String {
        let (bytes, iters, blocks) = (self.bytes, self.iters, self.blocks);
        format!(
            "# {bytes:>12} bytes x {iters:>5}, {blocks:>3} blocks: put {:>10.2} us, copy {:>10.2} us, piece copy {:>10.2} us (medians), {} wrong",
            self.put.median_us, self.copy.median_us, self.piece_copy.median_us, self.wrong
        )
    }
}

/// The whole run, as written to `p2p_bench.json`. The flat `*_rtt_us`
/// fields are medians (kept for readers of earlier outputs).
#[derive(serde::Serialize)]
struct Report<'a> {
    device: &'a str,
    route: &'a str,
    emulator: bool,
    rounds: u32,
    rtt_iters: u32,
    /// Bytes per put call (and per piece of the piece-copy floor).
    piece_bytes: u64,
    /// Who calls each put: `block` or `warp`.
    put_by: &'a str,
    /// When rank 1's waiter ran: `after` or `during` the timed put launch.
    peer_waits: &'a str,
    /// Checked signal round trip (`signal` + `wait_until`), median.
    signal_rtt_us: f64,
    /// The same round trip without argument checks, median.
    unchecked_rtt_us: f64,
    /// Flag ping-pong floor, median.
    flag_floor_rtt_us: f64,
    /// checked / floor, of medians.
    rtt_ratio: Option<f64>,
    /// unchecked / floor, of medians.
    unchecked_rtt_ratio: Option<f64>,
    /// (checked - unchecked) / calls_per_round_trip, ns, of medians.
    check_ns_per_call: f64,
    calls_per_round_trip: u32,
    /// Every round of the three round trips.
    rtt: &'a Rtt,
    put: Vec<Row>,
}

/// Prints the round-trip table; returns `p2p_bench_rtt.csv`.
fn print_rtt(plan: &P2pBenchPlan, rtt: &Rtt) -> String {
    let (rtt_ratio, unchecked_ratio) = (rtt.vs_floor(&rtt.checked), rtt.vs_floor(&rtt.unchecked));
    let check_ns = rtt.check_ns_per_call();
    println!(
        "# signal round trip, us, {} rounds x {} round trips, same word (median / min / vs floor):",
        plan.rounds, plan.rtt_iters
    );
    let mut csv = String::from("variant,calls_per_round_trip,rounds,iters,median_us,min_us,ratio_to_floor,check_ns_per_call\n");
    for (label, key, st, calls, r) in [
        ("flag ping-pong floor", "floor", &rtt.floor, 0, Some(1.0)),
        ("unchecked (peer_ptr)", "unchecked", &rtt.unchecked, 0, unchecked_ratio),
        ("signal + wait_until", "checked", &rtt.checked, CALLS_PER_ROUND_TRIP, rtt_ratio),
    ] {
        println!("#   {label:<22} {:>9.3} {:>9.3} {:>7}", st.median_us, st.min_us, fmt_opt(r, 2));
        let check = if key == "checked" {
            format!("{check_ns:.1}")
        } else {
            String::new()
        };
        let r = r.map_or(String::new(), |r| format!("{r:.3}"));
        csv += &format!(
            "{key},{calls},{},{},{:.4},{:.4},{r},{check}\n",
            plan.rounds, plan.rtt_iters, st.median_us, st.min_us
        );
    }
    println!(
        "# argument checks: (checked - unchecked) / {CALLS_PER_ROUND_TRIP} calls = {check_ns:.1} ns per call; signal round trip / floor = {}",
        fmt_opt(rtt_ratio, 2)
    );
    csv
}

/// Prints the put table; returns `p2p_bench.csv`.
fn print_puts(rows: &[Row]) -> String {
    let t = [
        ("size(B)", 12),
        ("count", 12),
        ("type", 6),
        ("time(us)", 12),
        ("algbw(GB/s)", 12),
        ("floor(us)", 12),
    ]
    .into_iter()
    .chain([
        ("floor(GB/s)", 12),
        ("ratio", 8),
        ("#wrong", 8),
        ("blocks", 6),
        ("min(us)", 12),
        ("copy(us)", 12),
        ("pieces(us)", 12),
    ])
    .fold(Table::new(), |t, (h, w)| t.col(h, w));
    println!("{}", t.heading());
    let mut csv = String::from(
        "bytes,count,type,iters,blocks,put_us,put_min_us,put_gbps,floor_us,floor_kind,floor_gbps,ratio,copy_us,piece_copy_us,wrong\n",
    );
    for r in rows {
        let f2 = |v: f64| format!("{v:.2}");
        let cells = [
            r.bytes.to_string(),
            r.count.to_string(),
            r.r#type.into(),
            f2(r.put_us),
            fmt_opt(r.put_gbps, 1),
            f2(r.floor_us),
            fmt_opt(r.floor_gbps, 1),
            fmt_opt(r.ratio, 2),
            r.wrong.to_string(),
            r.blocks.to_string(),
            f2(r.put_min_us),
            f2(r.copy.median_us),
            f2(r.piece_copy.median_us),
        ];
        println!("{}", t.row(&cells));
        let c = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        csv += &format!(
            "{},{},uint8,{},{},{:.3},{:.3},{},{:.3},{},{},{},{:.3},{:.3},{}\n",
            r.bytes,
            r.count,
            r.iters,
            r.blocks,
            r.put_us,
            r.put_min_us,
            c(r.put_gbps),
            r.floor_us,
            r.floor_kind,
            c(r.floor_gbps),
            c(r.ratio),
            r.copy.median_us,
            r.piece_copy.median_us,
            r.wrong
        );
    }
    csv
}

/// Prints both tables and writes the files; an error when any byte
/// arrived wrong. `name`: the device; `route`: how rank 0 reaches rank 1.
pub fn report(
    args: &P2pBenchArgs,
    plan: &P2pBenchPlan,
    rtt: &Rtt,
    rows: Vec<Row>,
    name: &str,
    route: &str,
    gpu: bool,
) -> Result<(), BoxError> {
    let (out, put_by, peer_waits) = (args.out.as_path(), args.put_by.as_str(), args.peer_waits.as_str());
    let (shown, who) = match put_by {
        "warp" => (
            format!("{} bytes per block split over its warps", plan.piece),
            "each put by one warp, pieces dealt round-robin to every warp of the grid (as many blocks as for block puts)",
        ),
        _ => (format!("{} bytes", plan.piece), "one block per piece"),
    };
    println!("# doorbell P2P benchmark: 2 ranks on {name}, route {route}; puts of {shown}, {who}; rank 1 waits {peer_waits} the timed put launch");
    if !gpu {
        println!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    let rtt_csv = print_rtt(plan, rtt);
    let csv = print_puts(&rows);
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let times = |name: &'static str, us: fn(&Row) -> f64| Series {
        name,
        points: rows.iter().map(|r| (r.bytes as f64, us(r))).collect(),
    };
    let times = [
        times("put_block (P2P transport), median", |r| r.put_us),
        times("copy kernel (floor: faster of grid-stride and pieces), median", |r| r.floor_us),
    ];
    let title = format!("doorbell P2P put vs copy floor ({name})");
    let report = Report {
        device: name,
        route,
        emulator: !gpu,
        rounds: plan.rounds,
        rtt_iters: plan.rtt_iters,
        piece_bytes: plan.piece,
        put_by,
        peer_waits,
        signal_rtt_us: rtt.checked.median_us,
        unchecked_rtt_us: rtt.unchecked.median_us,
        flag_floor_rtt_us: rtt.floor.median_us,
        rtt_ratio: rtt.vs_floor(&rtt.checked),
        unchecked_rtt_ratio: rtt.vs_floor(&rtt.unchecked),
        check_ns_per_call: rtt.check_ns_per_call(),
        calls_per_round_trip: CALLS_PER_ROUND_TRIP,
        rtt,
        put: rows,
    };
    bench::write_json(out, "p2p_bench.json", &report)?;
    bench::write_text(out, "p2p_bench.csv", &csv)?;
    bench::write_text(out, "p2p_bench_rtt.csv", &rtt_csv)?;
    bench::write_times_figure(out, "p2p_bench", &title, "bytes", &times)?;
    println!("# wrote {}/p2p_bench.{{json,csv,png,svg}} and p2p_bench_rtt.csv", out.display());
    if wrong > 0 {
        return Err(format!("{wrong} bytes arrived wrong (see the #wrong column)").into());
    }
    Ok(())
}

//! The multi-process world: real OS processes meeting through the TCP
//! rendezvous. The test binary re-runs itself as the child ranks: with
//! `DOORBELL_TEST_CHILD` set, the `child_entry` test plays a role instead
//! of testing, prints one `CHILD-RESULT` line and exits.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use doorbell::world::{RendezvousHost, World, WorldConfig, WorldKind};
use doorbell::Error;

const TOKEN: &str = "integration-test-token-6b1f";

/// Launcher variables a child must not inherit from whoever runs the tests.
const LAUNCH_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NNODES",
    "DOORBELL_TOKEN",
    "DOORBELL_MASTER_ADDR",
    "DOORBELL_MASTER_PORT",
    "DOORBELL_BIND_ADDR",
    "DOORBELL_RENDEZVOUS_TIMEOUT_S",
    "DOORBELL_WORLD_TIMEOUT_S",
];

/// What a child rank does in the world it joins from its environment.
fn child_role(role: &str) -> Result<String, Error> {
    let world = World::from_env(format!("layout of pid {}", std::process::id()).as_bytes())?;
    let (r, n) = (world.rank(), world.world_size());
    if role == "join-then-exit" {
        return Ok(format!("joined as rank {r} of {n}"));
    }
    let all = world.all_gather_bytes(format!("rank{r}").as_bytes())?;
    let expect: Vec<Vec<u8>> = (0..n).map(|q| format!("rank{q}").into_bytes()).collect();
    assert_eq!(all, expect, "rank {r}: all_gather_bytes");
    let b = world.broadcast_bytes(n - 1, if r == n - 1 { b"from the last rank" } else { b"" })?;
    assert_eq!(b, b"from the last rank");
    world.check_same("symmetric heap", b"64 MiB at offset 0")?;
    world.barrier()?;
    Ok(format!("rank {r} of {n}: collectives ok"))
}

#[test]
#[ignore = "a child process's entry point: the tests that need it run it with --ignored"]
fn child_entry() {
    let Some(role) = doorbell_tests::child_var("DOORBELL_TEST_CHILD") else {
        return;
    };
    let result = child_role(&role);
    let mut out = std::io::stdout();
    writeln!(out, "CHILD-RESULT {result:?}").unwrap();
    out.flush().unwrap();
    std::process::exit(if result.is_ok() { 0 } else { 1 });
}

fn spawn_child(role: &str, vars: &[(&str, String)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_entry", "--ignored", "--nocapture", "--test-threads=1"]);
    for v in LAUNCH_VARS {
        c.env_remove(v);
    }
    c.env("DOORBELL_TEST_CHILD", role)
        .env("DOORBELL_RENDEZVOUS_TIMEOUT_S", "20")
        .env("DOORBELL_WORLD_TIMEOUT_S", "20");
    for (k, v) in vars {
        c.env(k, v);
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("could not re-run the test binary as a child")
}

/// Waits for a child; returns whether it succeeded and its result line.
fn finish(child: Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CHILD-RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| {
            panic!(
                "child printed no result; stdout:\n{stdout}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string();
    (out.status.success(), line)
}

fn torchrun_vars(rank: usize, size: usize, port: u16, token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", size.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", size.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("DOORBELL_TOKEN", token.to_string()),
    ]
}

/// A child joining as rank `rank` of `size` through the torchrun variables.
fn join(rank: usize, size: usize, port: u16, token: &str) -> Child {
    spawn_child("join", &torchrun_vars(rank, size, port, token))
}

/// Waits for `child`, which must succeed; returns its result line.
fn succeeds(child: Child) -> String {
    let (ok, line) = finish(child);
    assert!(ok, "the child failed: {line}");
    line
}

/// Waits for `child`, which must fail with a result line holding every one
/// of `words`.
fn fails_with(child: Child, words: &[&str]) {
    let (ok, line) = finish(child);
    assert!(
        !ok && words.iter().all(|w| line.contains(w)),
        "expected a failure naming {words:?}, got: {line}"
    );
}

/// Rank 0 of this test process, on a port the system picks.
fn host(size: usize, timeout: Duration) -> (RendezvousHost, u16) {
    let cfg = WorldConfig::new(0, size, "127.0.0.1", 0, TOKEN)
        .with_rendezvous_timeout(timeout)
        .with_world_timeout(Duration::from_secs(20));
    let h = RendezvousHost::bind(&cfg).unwrap();
    let port = h.local_addr().port();
    (h, port)
}

/// Rank 0's part of `child_role`.
fn root_role(world: &World) {
    let n = world.world_size();
    let all = world.all_gather_bytes(b"rank0").unwrap();
    assert_eq!(all, (0..n).map(|q| format!("rank{q}").into_bytes()).collect::<Vec<_>>());
    assert_eq!(world.broadcast_bytes(n - 1, b"").unwrap(), b"from the last rank");
    world.check_same("symmetric heap", b"64 MiB at offset 0").unwrap();
    world.barrier().unwrap();
}

#[test]
fn processes_launched_like_torchrun_form_a_world() {
    let (h, port) = host(3, Duration::from_secs(20));
    let children: Vec<Child> = (1..3).map(|r| join(r, 3, port, TOKEN)).collect();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let world = h.accept(b"layout of rank 0").unwrap();
    assert_eq!((world.rank(), world.world_size(), world.kind()), (0, 3, WorldKind::Tcp));
    // The table names the real processes and carries their layout blobs.
    for (r, pid) in (1..3).zip(&pids) {
        assert_eq!(world.peers()[r].pid, *pid);
        assert_eq!(world.peers()[r].local_rank, r);
        assert_eq!(world.peers()[r].layout, format!("layout of pid {pid}").into_bytes());
    }
    root_role(&world);
    for c in children {
        let line = succeeds(c);
        assert!(line.contains("collectives ok"), "{line}");
    }
}

#[test]
fn processes_launched_like_mpirun_form_a_world() {
    let (h, port) = host(2, Duration::from_secs(20));
    let child = spawn_child(
        "join",
        &[
            ("OMPI_COMM_WORLD_RANK", "1".into()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
            ("DOORBELL_MASTER_PORT", port.to_string()),
            ("DOORBELL_TOKEN", TOKEN.into()),
        ],
    );
    let world = h.accept(b"").unwrap();
    root_role(&world);
    succeeds(child);
}

#[test]
fn wrong_token_is_refused_and_the_right_process_still_joins() {
    let (h, port) = host(2, Duration::from_secs(20));
    let root = std::thread::spawn(move || h.accept(b""));
    fails_with(join(1, 2, port, "some other job's token"), &["TokenMismatch"]);
    let good = join(1, 2, port, TOKEN);
    let world = root.join().unwrap().unwrap();
    root_role(&world);
    succeeds(good);
}

#[test]
fn rank_0_times_out_cleanly_when_its_only_peer_has_the_wrong_token() {
    let (h, port) = host(2, Duration::from_millis(1500));
    let child = join(1, 2, port, "the-token-of-another-job");
    let r = h.accept(b"");
    assert!(
        matches!(&r, Err(Error::RendezvousTimeout { rank: 0, missing, .. }) if missing == &vec![1]),
        "{r:?}"
    );
    fails_with(child, &["TokenMismatch"]);
}

#[test]
fn mismatched_world_size_is_rejected_naming_rank_and_field() {
    let (h, port) = host(2, Duration::from_secs(20));
    let child = join(1, 3, port, TOKEN);
    let r = h.accept(b"");
    match &r {
        Err(Error::RendezvousMismatch {
            rank: 1,
            field,
            ours,
            theirs,
        }) => {
            assert_eq!((field.as_str(), ours.as_str(), theirs.as_str()), ("world size", "2", "3"))
        }
        other => panic!("expected a world size mismatch, got {other:?}"),
    }
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("rank 1") && msg.contains("world size"), "{msg}");
    fails_with(child, &["RendezvousMismatch", "world size"]);
}

#[test]
fn a_rank_that_never_comes_is_named_on_every_rank() {
    let (h, port) = host(3, Duration::from_millis(1500));
    let child = join(2, 3, port, TOKEN);
    let r = h.accept(b"");
    assert!(
        matches!(&r, Err(Error::RendezvousTimeout { rank: 0, missing, .. }) if missing == &vec![1]),
        "{r:?}"
    );
    fails_with(child, &["RendezvousTimeout", "missing: [1]"]);
}

#[test]
fn a_process_that_exits_is_named_by_the_others() {
    let (h, port) = host(2, Duration::from_secs(20));
    let child = spawn_child("join-then-exit", &torchrun_vars(1, 2, port, TOKEN));
    let world = h.accept(b"").unwrap();
    succeeds(child);
    let r = world.all_gather_bytes(b"anyone?");
    assert!(matches!(&r, Err(Error::PeerLost { rank: 0, peer: 1, .. })), "{r:?}");
}

#[test]
fn thread_worlds_of_2_to_8_ranks() {
    for n in 2..=8 {
        let out = World::run_threads(n, |w| {
            let all = w.all_gather_bytes(&(w.rank() as u64 * 7).to_le_bytes())?;
            w.barrier()?;
            Ok::<_, Error>(all.iter().map(|b| u64::from_le_bytes(b[..].try_into().unwrap())).sum::<u64>())
        });
        let want = 7 * (n as u64) * (n as u64 - 1) / 2;
        assert!(out.into_iter().all(|s| s.unwrap() == want), "n = {n}");
    }
}

#[test]
fn a_short_token_is_refused_before_connecting_with_how_to_make_one() {
    // 15 bytes: one short of doorbell::world::MIN_TOKEN_BYTES. Nobody listens
    // on the port: the child must fail on its token, not on a timeout.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let t0 = std::time::Instant::now();
    fails_with(join(1, 2, port, "0123456789abcde"), &["TokenTooShort", "len: 15"]);
    assert!(t0.elapsed() < Duration::from_secs(15), "the child waited for a rendezvous");
    assert_eq!(doorbell::world::MIN_TOKEN_BYTES, 16);
}

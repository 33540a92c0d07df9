//! Thread worlds, and TCP worlds whose ranks are threads of this test
//! process (the OS-process tests live in tests/tests/rendezvous.rs).

use super::*;
use std::time::Instant;

fn gather_barrier_broadcast(w: World) -> Result<()> {
    let (r, n) = (w.rank(), w.size());
    // Different lengths per rank.
    let mine: Vec<u8> = (0..=r as u8).map(|i| i * 10 + r as u8).collect();
    for round in 0..5u8 {
        let mut mine = mine.clone();
        mine.push(round);
        let all = w.all_gather_bytes(&mine)?;
        assert_eq!(all.len(), n);
        for (q, b) in all.iter().enumerate() {
            let mut expect: Vec<u8> = (0..=q as u8).map(|i| i * 10 + q as u8).collect();
            expect.push(round);
            assert_eq!(b, &expect, "rank {r} sees rank {q}'s bytes wrong in round {round}");
        }
        w.barrier()?;
        let root = round as usize % n;
        let got = w.broadcast_bytes(root, if r == root { b"from root" } else { b"ignored" })?;
        assert_eq!(got, b"from root");
    }
    w.check_same("layout", b"same everywhere")?;
    Ok(())
}

#[test]
fn thread_worlds_of_1_to_8_ranks_gather_barrier_broadcast() {
    for n in 1..=8 {
        for res in World::run_threads(n, gather_barrier_broadcast) {
            res.unwrap();
        }
    }
}

#[test]
fn thread_world_handles_and_metadata() {
    let ws = World::local_threads(3);
    assert_eq!(ws.iter().map(World::rank).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(ws.iter().all(|w| w.size() == 3 && w.kind() == WorldKind::Threads));
    assert_eq!(ws[2].peers()[1].rank, 1);
    assert_eq!(ws[2].peers()[1].pid, std::process::id());
    let single = World::single();
    assert_eq!((single.rank(), single.size(), single.kind()), (0, 1, WorldKind::Single));
    assert_eq!(single.all_gather_bytes(b"x").unwrap(), vec![b"x".to_vec()]);
    single.barrier().unwrap();
    assert!(matches!(
        single.broadcast_bytes(1, b""),
        Err(Error::InvalidRank { rank: 1, size: 1, .. })
    ));
}

#[test]
fn barrier_really_waits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let before = AtomicUsize::new(0);
    World::run_threads(6, |w| {
        std::thread::sleep(Duration::from_millis(5 * w.rank() as u64));
        before.fetch_add(1, Ordering::SeqCst);
        w.barrier().unwrap();
        assert_eq!(before.load(Ordering::SeqCst), 6, "rank {} left the barrier early", w.rank());
    });
}

#[test]
fn check_same_names_field_and_first_differing_rank() {
    let res = World::run_threads(4, |w| {
        let v: &[u8] = match w.rank() {
            2 => b"other",
            3 => b"longer value",
            _ => b"value",
        };
        w.check_same("heap layout", v)
    });
    for e in res {
        match e {
            Err(Error::NotSame { field, rank: 2, detail }) => {
                assert_eq!(field, "heap layout");
                assert!(detail.contains("different contents"), "{detail}");
            }
            other => panic!("expected NotSame for rank 2, got {other:?}"),
        }
    }
    let res = World::run_threads(2, |w| w.check_same("a", if w.rank() == 0 { b"xy" } else { b"xyz" }));
    assert!(res
        .iter()
        .all(|e| matches!(e, Err(Error::NotSame { rank: 1, detail, .. }) if detail.contains("3 bytes where rank 0 has 2"))));
}

#[test]
fn different_collectives_are_an_error_not_a_mixup() {
    let res = World::run_threads(3, |w| {
        let first = if w.rank() == 1 {
            w.barrier().map(|_| ())
        } else {
            w.all_gather_bytes(b"x").map(|_| ())
        };
        (first, w.barrier())
    });
    for (first, then) in res {
        assert!(matches!(first, Err(Error::CollectiveMismatch { rank: 1, .. })), "{first:?}");
        assert!(then.is_err(), "a world out of step must refuse further use");
    }
}

#[test]
fn thread_world_timeout_names_missing_rank() {
    let mut ws = World::local_threads_with_timeout(3, Duration::from_millis(200));
    let late = ws.pop().unwrap();
    let res: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ws.iter().map(|w| s.spawn(move || w.barrier())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in res {
        assert!(
            matches!(&r, Err(Error::CollectiveTimeout { missing, .. }) if missing == &vec![2]),
            "{r:?}"
        );
    }
    assert!(late.barrier().is_err());
}

#[test]
fn dropped_rank_turns_into_an_error_naming_it() {
    let mut ws = World::local_threads(2);
    let gone = ws.pop().unwrap();
    let t0 = Instant::now();
    let h = std::thread::spawn(move || ws[0].barrier());
    std::thread::sleep(Duration::from_millis(50));
    drop(gone);
    let r = h.join().unwrap();
    assert!(matches!(r, Err(Error::PeerLost { rank: 0, peer: 1, .. })), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

// ---- TCP worlds, ranks as threads ----

const TOKEN: &str = "unit-test-token";

fn cfg(rank: usize, size: usize, port: u16) -> WorldConfig {
    WorldConfig::new(rank, size, "127.0.0.1", port, TOKEN)
        .with_rendezvous_timeout(Duration::from_secs(20))
        .with_world_timeout(Duration::from_secs(20))
}

/// Rank 0 on an ephemeral port plus `peers` configs, each joining on a thread.
fn tcp_world<T: Send>(size: usize, peers: Vec<WorldConfig>, host_timeout: Duration, f: impl Fn(Result<World>) -> T + Sync) -> (T, Vec<T>) {
    let host = RendezvousHost::bind(&cfg(0, size, 0).with_rendezvous_timeout(host_timeout)).unwrap();
    let port = host.local_addr().port();
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = peers
            .into_iter()
            .map(|mut c| {
                c.master_port = port;
                s.spawn(move || f(World::rendezvous(&c, format!("layout{}", c.rank).as_bytes())))
            })
            .collect();
        let root = f(host.accept(b"layout0"));
        (root, hs.into_iter().map(|h| h.join().unwrap()).collect())
    })
}

#[test]
fn tcp_world_of_threads_runs_every_collective() {
    let n = 4;
    let (root, peers) = tcp_world(n, (1..n).map(|r| cfg(r, n, 0)).collect(), Duration::from_secs(20), |w| {
        let w = w?;
        assert_eq!(w.kind(), WorldKind::Tcp);
        let layouts: Vec<_> = w.peers().iter().map(|p| p.layout.clone()).collect();
        assert_eq!(layouts, (0..n).map(|r| format!("layout{r}").into_bytes()).collect::<Vec<_>>());
        gather_barrier_broadcast(w)
    });
    root.unwrap();
    peers.into_iter().for_each(|p| p.unwrap());
}

#[test]
fn tcp_peer_may_start_before_rank_0() {
    // Reserve a port, free it, let the peer retry against it, then host there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let peer = std::thread::spawn(move || World::rendezvous(&cfg(1, 2, port), b"").map(|w| w.all_gather_bytes(b"one")));
    std::thread::sleep(Duration::from_millis(300));
    let root = World::rendezvous(&cfg(0, 2, port), b"").unwrap();
    let all = root.all_gather_bytes(b"zero").unwrap();
    assert_eq!(all, vec![b"zero".to_vec(), b"one".to_vec()]);
    assert_eq!(peer.join().unwrap().unwrap().unwrap(), all);
}

#[test]
fn tcp_wrong_token_is_refused_and_the_right_peer_still_joins() {
    let host = RendezvousHost::bind(&cfg(0, 2, 0)).unwrap();
    let port = host.local_addr().port();
    let root = std::thread::spawn(move || host.accept(b""));
    let wrong = World::rendezvous(&cfg(1, 2, port).with_token("not-the-token"), b"");
    assert!(matches!(wrong, Err(Error::TokenMismatch { rank: 1, .. })), "{wrong:?}");
    let right = World::rendezvous(&cfg(1, 2, port), b"").unwrap();
    let root = root.join().unwrap().unwrap();
    let h = std::thread::spawn(move || right.all_gather_bytes(b"b"));
    assert_eq!(root.all_gather_bytes(b"a").unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
    h.join().unwrap().unwrap();
}

#[test]
fn tcp_peer_refuses_an_impostor_rank_0() {
    let host = RendezvousHost::bind(&cfg(0, 2, 0).with_token("impostor").with_rendezvous_timeout(Duration::from_secs(2))).unwrap();
    let port = host.local_addr().port();
    let root = std::thread::spawn(move || host.accept(b""));
    // The impostor refuses our proof first; either way the peer must not join.
    let r = World::rendezvous(&cfg(1, 2, port), b"");
    assert!(matches!(r, Err(Error::TokenMismatch { .. })), "{r:?}");
    assert!(matches!(root.join().unwrap(), Err(Error::RendezvousTimeout { rank: 0, ref missing, .. }) if missing == &vec![1]));
}

#[test]
fn tcp_mismatched_world_size_names_rank_and_field_on_both_sides() {
    let (root, peers) = tcp_world(2, vec![cfg(1, 3, 0)], Duration::from_secs(20), |w| w.map(|_| ()));
    for r in std::iter::once(root).chain(peers) {
        match r {
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
    }
}

#[test]
fn tcp_duplicate_rank_is_refused() {
    let (root, peers) = tcp_world(3, vec![cfg(1, 3, 0), cfg(1, 3, 0)], Duration::from_secs(20), |w| w.map(|_| ()));
    assert!(
        matches!(&root, Err(Error::RendezvousMismatch { rank: 1, field, .. }) if field == "rank"),
        "{root:?}"
    );
    for p in peers {
        assert!(
            matches!(&p, Err(Error::RendezvousMismatch { rank: 1, field, .. }) if field == "rank"),
            "{p:?}"
        );
    }
}

#[test]
fn tcp_timeout_names_the_missing_rank_everywhere() {
    let t0 = Instant::now();
    let (root, peers) = tcp_world(4, vec![cfg(1, 4, 0), cfg(3, 4, 0)], Duration::from_millis(800), |w| w.map(|_| ()));
    assert!(
        matches!(&root, Err(Error::RendezvousTimeout { rank: 0, missing, .. }) if missing == &vec![2]),
        "{root:?}"
    );
    for p in peers {
        assert!(
            matches!(&p, Err(Error::RendezvousTimeout { missing, .. }) if missing == &vec![2]),
            "{p:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn tcp_peer_without_rank_0_times_out_naming_rank_0() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let r = World::rendezvous(&cfg(2, 3, port).with_rendezvous_timeout(Duration::from_millis(300)), b"");
    assert!(
        matches!(&r, Err(Error::RendezvousTimeout { rank: 2, missing, .. }) if missing == &vec![0]),
        "{r:?}"
    );
}

#[test]
fn tcp_peer_talking_to_something_else_says_so() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let r = World::rendezvous(&cfg(1, 2, port).with_rendezvous_timeout(Duration::from_secs(5)), b"");
    assert!(
        matches!(&r, Err(Error::WorldProtocol { detail, .. }) if detail.contains("not a doorbell rendezvous")),
        "{r:?}"
    );
    t.join().unwrap();
}

#[test]
fn tcp_lost_peer_and_slow_peer_are_named() {
    let n = 3;
    let (root, peers) = tcp_world(
        n,
        (1..n)
            .map(|r| cfg(r, n, 0).with_world_timeout(Duration::from_millis(500)))
            .collect(),
        Duration::from_secs(20),
        |w| {
            let w = w.unwrap();
            match w.rank() {
                // Rank 2 leaves without a word.
                2 => {
                    drop(w);
                    None
                }
                _ => Some(w.barrier()),
            }
        },
    );
    let root = root.unwrap();
    assert!(matches!(&root, Err(Error::PeerLost { rank: 0, peer: 2, .. })), "{root:?}");
    let p1 = peers[0].as_ref().unwrap();
    assert!(
        matches!(p1, Err(Error::WorldAborted { rank: 1, reason, .. }) if reason.contains("lost rank 2")),
        "{p1:?}"
    );

    // A rank that is alive but never calls the collective: a timeout naming it.
    let host = RendezvousHost::bind(&cfg(0, 2, 0).with_world_timeout(Duration::from_millis(300))).unwrap();
    let port = host.local_addr().port();
    let peer = std::thread::spawn(move || World::rendezvous(&cfg(1, 2, port), b"").unwrap());
    let root = host.accept(b"").unwrap();
    let _idle = peer.join().unwrap();
    let r = root.barrier();
    assert!(
        matches!(&r, Err(Error::CollectiveTimeout { rank: 0, missing, .. }) if missing == &vec![1]),
        "{r:?}"
    );
    assert!(matches!(root.barrier(), Err(Error::WorldBroken { .. })));
}

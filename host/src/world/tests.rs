//! Thread worlds, and TCP worlds whose ranks are threads of this test
//! process (the OS-process tests live in tests/tests/rendezvous.rs).

use super::*;
use std::time::Instant;

fn gather_barrier_broadcast(w: World) -> Result<()> {
    let (r, n) = (w.rank(), w.world_size());
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
    assert!(ws.iter().all(|w| w.world_size() == 3 && w.kind() == WorldKind::Threads));
    assert_eq!(ws[2].peers()[1].rank, 1);
    assert_eq!(ws[2].peers()[1].pid, std::process::id());
    let single = World::single();
    assert_eq!((single.rank(), single.world_size(), single.kind()), (0, 1, WorldKind::Single));
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

const TOKEN: &str = "unit-test-token-5d0c9a";

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
    let wrong = World::rendezvous(&cfg(1, 2, port).with_token("not-the-token-of-this-job"), b"");
    assert!(matches!(wrong, Err(Error::TokenMismatch { rank: 1, .. })), "{wrong:?}");
    let right = World::rendezvous(&cfg(1, 2, port), b"").unwrap();
    let root = root.join().unwrap().unwrap();
    let h = std::thread::spawn(move || right.all_gather_bytes(b"b"));
    assert_eq!(root.all_gather_bytes(b"a").unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
    h.join().unwrap().unwrap();
}

#[test]
fn tcp_peer_refuses_an_impostor_rank_0() {
    let host = RendezvousHost::bind(
        &cfg(0, 2, 0)
            .with_token("an-impostor-with-a-long-token")
            .with_rendezvous_timeout(Duration::from_secs(2)),
    )
    .unwrap();
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
        assert!(
            matches!(&r, Err(Error::RendezvousMismatch { rank: 1, field, ours, theirs })
                if (field.as_str(), ours.as_str(), theirs.as_str()) == ("world size", "2", "3")),
            "expected rank 1's world size mismatch (2, 3), got {r:?}"
        );
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

// ---- Hostile peers: a client speaking the wire protocol by hand ----

use super::auth::{self, FrameKey, Side, PEER_LABEL, ROOT_LABEL, TAG_LEN};
use super::wire::{self as w, Enc as E, Kind, Link};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// The bytes of tagged frame number `seq`, as `Link::write` puts them on the wire.
fn sealed(key: &FrameKey, seq: u64, kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut head = Vec::from(w::MAGIC);
    head.push(kind as u8);
    head.extend_from_slice(&((body.len() + TAG_LEN) as u64).to_be_bytes());
    let tag = key.tag(seq, &head, body);
    [&head[..], body, &tag].concat()
}

/// One collective step as a rank sends it: `(op, argument, sequence number, bytes)`.
fn step(op: u8, seq: u64, payload: &[u8]) -> Vec<u8> {
    E::default().u8(op).u64(0).u64(seq).bytes(payload).0
}
const BARRIER: u8 = 3;

/// A peer that knows the token and writes its frames by hand after the
/// proofs; it reads with a real [`Link`].
struct FakePeer {
    raw: TcpStream,
    send: FrameKey,
    sent: u64,
    link: Link,
}

impl FakePeer {
    /// Proves the token to rank 0 at `port` and says hello as `rank` of
    /// `size`, claiming process id `pid`.
    fn join(port: u16, rank: usize, size: usize, pid: u32) -> FakePeer {
        Self::join_built(port, rank, size, pid, LIBRARY_VERSION, heap_layout_word())
    }

    /// [`Self::join`] claiming the build `library` with heap layout `layout_word`.
    fn join_built(port: u16, rank: usize, size: usize, pid: u32, library: &str, layout_word: u64) -> FakePeer {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let ch = w::read_frame(&mut s, w::MAX_UNAUTHENTICATED, soon()).unwrap();
        assert_eq!(ch.kind, Kind::Challenge);
        let n0: auth::Nonce = ch.body[4..].try_into().unwrap();
        let n1 = auth::nonce().unwrap();
        let proof = E::default()
            .raw(&n1)
            .raw(&auth::prove(&auth::stretch(TOKEN.as_bytes()), PEER_LABEL, &n0, &n1))
            .0;
        w::write_frame(&mut s, Kind::Proof, &proof, soon()).unwrap();
        let rp = w::read_frame(&mut s, w::MAX_UNAUTHENTICATED, soon()).unwrap();
        assert!(auth::verify(&auth::stretch(TOKEN.as_bytes()), ROOT_LABEL, &n1, &n0, &rp.body));
        let (send, recv) = auth::session_keys(&auth::stretch(TOKEN.as_bytes()), &n0, &n1, Side::Peer);
        let link = Link::new(s.try_clone().unwrap(), (send.clone(), recv));
        let mut p = FakePeer {
            raw: s,
            send,
            sent: 0,
            link,
        };
        let hello = E::default()
            .u32(PROTOCOL_VERSION)
            .u64(size as u64)
            .u64(rank as u64)
            .u64(0)
            .str("fake-host")
            .u32(pid)
            .bytes(b"")
            .str(library)
            .u64(layout_word)
            .0;
        p.send(Kind::Hello, &hello);
        p
    }

    /// Reads frames up to and including the welcome.
    fn await_welcome(&mut self) {
        loop {
            match self.link.read(MAX_FRAME_BYTES, soon()).unwrap().kind {
                Kind::Status => {}
                Kind::Welcome => return,
                k => panic!("unexpected {k:?} frame"),
            }
        }
    }

    /// The next frame, correctly tagged.
    fn next(&mut self, kind: Kind, body: &[u8]) -> Vec<u8> {
        let f = sealed(&self.send, self.sent, kind, body);
        self.sent += 1;
        f
    }

    fn send(&mut self, kind: Kind, body: &[u8]) {
        let f = self.next(kind, body);
        self.raw.write_all(&f).unwrap();
    }
}

/// Rank 0 of a world of two in this process, with `FakePeer` as rank 1.
fn root_with_fake_peer(pid: u32) -> (World, FakePeer) {
    let host = RendezvousHost::bind(&cfg(0, 2, 0)).unwrap();
    let port = host.local_addr().port();
    let root = std::thread::spawn(move || host.accept(b""));
    let mut fake = FakePeer::join(port, 1, 2, pid);
    fake.await_welcome();
    (root.join().unwrap().unwrap(), fake)
}

fn assert_forged_by(r: &Result<()>, rank: usize, peer: &str) {
    match r {
        Err(Error::WorldProtocol {
            rank: got,
            peer: p,
            detail,
        }) => {
            assert_eq!((*got, p.as_str()), (rank, peer), "{r:?}");
            assert!(detail.contains("failed authentication"), "{detail}");
        }
        other => panic!("expected a forged-frame error naming {peer}, got {other:?}"),
    }
}

#[test]
fn tcp_altered_collective_frame_ends_the_world_naming_the_peer() {
    let (root, mut fake) = root_with_fake_peer(1);
    let mut frame = fake.next(Kind::Collective, &step(BARRIER, 0, b""));
    // One bit of the payload length, flipped on the way.
    frame[13 + 17 + 7] ^= 1;
    fake.raw.write_all(&frame).unwrap();
    let r = root.barrier();
    assert_forged_by(&r, 0, "rank 1");
    // Rank 0 tells the others why, and refuses further use.
    let fail = fake.link.read(MAX_FRAME_BYTES, soon()).unwrap();
    assert_eq!(fail.kind, Kind::Fail);
    assert!(String::from_utf8_lossy(&fail.body).contains("rank 1"), "{fail:?}");
    assert!(matches!(root.barrier(), Err(Error::WorldBroken { rank: 0, .. })));
}

#[test]
fn tcp_replayed_and_untagged_frames_end_the_world_naming_the_peer() {
    let (root, mut fake) = root_with_fake_peer(1);
    // A good barrier first.
    let good = fake.next(Kind::Collective, &step(BARRIER, 0, b""));
    fake.raw.write_all(&good).unwrap();
    root.barrier().unwrap();
    assert_eq!(fake.link.read(MAX_FRAME_BYTES, soon()).unwrap().kind, Kind::Collective);
    // The same bytes again, where frame number 2 is due.
    fake.raw.write_all(&good).unwrap();
    assert_forged_by(&root.barrier(), 0, "rank 1");

    // A well-formed step without a tag (what version 1 sent).
    let (root, mut fake) = root_with_fake_peer(1);
    w::write_frame(
        &mut fake.raw,
        Kind::Collective,
        &[step(BARRIER, 0, b""), vec![0; TAG_LEN]].concat(),
        soon(),
    )
    .unwrap();
    assert_forged_by(&root.barrier(), 0, "rank 1");
}

#[test]
fn tcp_peer_ends_the_world_on_a_forged_answer_naming_rank_0() {
    // A fake rank 0 that knows the token.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let peer = std::thread::spawn(move || {
        let w = World::rendezvous(&cfg(1, 2, port), b"")?;
        w.barrier()
    });
    let (mut s, _) = l.accept().unwrap();
    let n0 = auth::nonce().unwrap();
    w::write_frame(&mut s, Kind::Challenge, &E::default().u32(PROTOCOL_VERSION).raw(&n0).0, soon()).unwrap();
    let proof = w::read_frame(&mut s, w::MAX_UNAUTHENTICATED, soon()).unwrap().body;
    let n1: auth::Nonce = proof[..16].try_into().unwrap();
    w::write_frame(
        &mut s,
        Kind::RootProof,
        &auth::prove(&auth::stretch(TOKEN.as_bytes()), ROOT_LABEL, &n1, &n0),
        soon(),
    )
    .unwrap();
    let (send, recv) = auth::session_keys(&auth::stretch(TOKEN.as_bytes()), &n0, &n1, Side::Root);
    let mut link = Link::new(s.try_clone().unwrap(), (send.clone(), recv));
    assert_eq!(link.read(MAX_FRAME_BYTES, soon()).unwrap().kind, Kind::Hello);
    let info = |r: u64| E::default().u64(r).u64(r).str("h").u32(7).bytes(b"");
    let welcome = E::default().raw(&[9; WORLD_ID_LEN]).u64(2).raw(&info(0).0).raw(&info(1).0).0;
    link.write(Kind::Welcome, &welcome, soon()).unwrap();
    assert_eq!(link.read(MAX_FRAME_BYTES, soon()).unwrap().kind, Kind::Collective);
    // The answer, correctly tagged, then altered on the way.
    let answer = E::default().u8(BARRIER).u64(0).u64(0).u64(2).bytes(b"").bytes(b"").0;
    let mut frame = sealed(&send, 1, Kind::Collective, &answer);
    let n = frame.len();
    frame[n - 1] ^= 0x80;
    s.write_all(&frame).unwrap();
    let r = peer.join().unwrap();
    assert_forged_by(&r, 1, "rank 0");
}

#[test]
fn tcp_oversize_frame_is_refused_unread_naming_the_peer() {
    let (root, mut fake) = root_with_fake_peer(1);
    // A header announcing 2 GiB, and nothing behind it.
    let mut head = Vec::from(w::MAGIC);
    head.push(Kind::Collective as u8);
    head.extend_from_slice(&((2u64 << 30) + TAG_LEN as u64).to_be_bytes());
    fake.raw.write_all(&head).unwrap();
    let t0 = Instant::now();
    let r = root.barrier();
    assert!(t0.elapsed() < Duration::from_secs(5), "rank 0 waited for the body");
    match &r {
        Err(e @ Error::FrameTooLarge { rank: 0, what, max, .. }) => {
            assert!(what.contains("rank 1"), "{e}");
            assert_eq!(*max, MAX_FRAME_BYTES);
            assert!(e.to_string().contains("MAX_FRAME_BYTES"), "{e}");
        }
        other => panic!("expected FrameTooLarge naming rank 1, got {other:?}"),
    }
}

#[test]
fn tcp_short_tokens_are_refused_with_how_to_make_one() {
    for token in ["", "short", "0123456789abcde"] {
        let r = World::rendezvous(&cfg(1, 2, 1).with_token(token), b"");
        assert!(
            matches!(&r, Err(Error::TokenTooShort { rank: 1, len, min: MIN_TOKEN_BYTES }) if *len == token.len()),
            "{r:?}"
        );
        let e = RendezvousHost::bind(&cfg(0, 2, 0).with_token(token)).unwrap_err();
        assert!(e.to_string().contains("head -c16 /dev/urandom"), "{e}");
    }
}

/// `n` connections to rank 0 on `port`, each of which has read its challenge.
fn challenged(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            assert_eq!(w::read_frame(&mut s, 256, soon()).unwrap().kind, Kind::Challenge);
            s
        })
        .collect()
}

/// Asserts that rank 0 closed `s` within 5 s: end of stream (or a reset),
/// not a read timeout; `kept` says what it means when it did not.
fn assert_closed(s: &mut TcpStream, kept: &str) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    match s.read(&mut [0u8; 1]) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{kept}: {other:?}"),
    }
}

#[test]
fn tcp_pre_auth_connections_are_capped_and_timed_out() {
    let cap = 8;
    let handshake = Duration::from_millis(600);
    let quick = 2;
    let host = RendezvousHost::bind(&cfg(0, 2, 0))
        .unwrap()
        .with_handshake_limits(cap, handshake)
        .with_address_limits(cap, quick);
    let port = host.local_addr().port();
    let root = std::thread::spawn(move || host.accept(b""));
    // `cap` silent connections each get a challenge, and hold a slot.
    let mut silent = challenged(port, cap);
    // `quick` more get a challenge too, in the quick slots, and lose them
    // when no proof comes within QUICK_PROOF_TIMEOUT.
    let t0 = Instant::now();
    let mut quick_ones = challenged(port, quick);
    // One more is closed at once, without a challenge.
    let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(extra.read(&mut b).unwrap(), 0, "a connection over the cap got an answer");
    for s in &mut quick_ones {
        assert_closed(s, "a silent connection kept its quick slot");
    }
    let held = t0.elapsed();
    assert!(
        held < QUICK_PROOF_TIMEOUT.min(handshake) + Duration::from_secs(1),
        "quick slots held for {held:?}"
    );
    // The silent ones are dropped after the handshake timeout.
    let t0 = Instant::now();
    for s in &mut silent {
        assert_closed(s, "a silent connection was kept");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "silent connections held for {:?}",
        t0.elapsed()
    );
    // A real rank still joins.
    let peer = World::rendezvous(&cfg(1, 2, port), b"").unwrap();
    let root = root.join().unwrap().unwrap();
    let h = std::thread::spawn(move || peer.barrier());
    root.barrier().unwrap();
    h.join().unwrap().unwrap();
}

#[test]
fn claiming_our_pid_does_not_prove_sharing_our_process() {
    let (root, _fake) = root_with_fake_peer(std::process::id());
    assert_eq!(root.peers()[1].pid, std::process::id());
    assert!(!root.proves_same_process(1, &[0; 32]).unwrap());
    // Not even with the tag this rank itself presents.
    assert!(!root.proves_same_process(1, &root.process_tag().unwrap()).unwrap());
    // Ranks that do share the process prove it, in thread and TCP worlds.
    let ws = World::local_threads(3);
    let mine = ws[2].process_tag().unwrap();
    assert!(ws[0].proves_same_process(2, &mine).unwrap());
    assert!(!ws[0].proves_same_process(1, &mine).unwrap());
    let (root, peers) = tcp_world(2, vec![cfg(1, 2, 0)], Duration::from_secs(20), |w| {
        let w = w.unwrap();
        let tag = w.process_tag().unwrap();
        let all = w.all_gather_bytes(&tag).unwrap();
        (0..2).all(|p| w.proves_same_process(p, &all[p]).unwrap())
    });
    assert!(root && peers[0]);
}

#[test]
fn tcp_low_entropy_tokens_are_refused_with_how_to_make_one() {
    for token in [
        "aaaaaaaaaaaaaaaa",
        "abababababababab",
        "0123456789abcdef",
        "0123456789abcdef0123456789abcdef",
        "passwordpassword",
        "zyxwvutsrqponmlk",
    ] {
        let r = World::rendezvous(&cfg(1, 2, 1).with_token(token), b"");
        let e = r.err().unwrap_or_else(|| panic!("{token:?} was accepted"));
        let msg = e.to_string();
        assert!(
            msg.contains("head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"),
            "{token}: {msg}"
        );
        let e = RendezvousHost::bind(&cfg(0, 2, 0).with_token(token))
            .err()
            .unwrap_or_else(|| panic!("{token:?} was accepted by rank 0"));
        assert!(e.to_string().contains("low-entropy"), "{token}: {e}");
    }
    // Random tokens pass, the shortest accepted length included.
    for token in ["5f0c2e9a7b3d41e8", "5f0c2e9a7b3d41e8a6c09d7f2b1e4a38", "Zq7-vR2m_Kx9pLw4"] {
        RendezvousHost::bind(&cfg(0, 2, 0).with_token(token)).unwrap();
    }
}

/// Whoever squats the rendezvous port gets the peer's proof; it must not be
/// a plain HMAC of the token over the nonces, which would let the squatter
/// test token guesses offline at the speed of one HMAC each.
#[test]
fn tcp_a_squatting_rank_0_gets_no_cheap_verifier() {
    let squat = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squat.local_addr().unwrap().port();
    let peer = std::thread::spawn(move || World::rendezvous(&cfg(1, 2, port).with_rendezvous_timeout(Duration::from_secs(5)), b""));
    let (mut s, _) = squat.accept().unwrap();
    let n0: auth::Nonce = [0u8; auth::NONCE_LEN];
    let challenge = E::default().u32(PROTOCOL_VERSION).raw(&n0).0;
    w::write_frame(&mut s, Kind::Challenge, &challenge, soon()).unwrap();
    let f = w::read_frame(&mut s, w::MAX_UNAUTHENTICATED, soon()).unwrap();
    assert_eq!(f.kind, Kind::Proof);
    let n1: auth::Nonce = f.body[..auth::NONCE_LEN].try_into().unwrap();
    let proof = &f.body[auth::NONCE_LEN..];
    assert!(
        !auth::verify(TOKEN.as_bytes(), PEER_LABEL, &n0, &n1, proof),
        "the proof is a plain HMAC of the token: each offline guess costs one HMAC"
    );
    // It is an HMAC under the stretched token.
    let key = auth::stretch(TOKEN.as_bytes());
    assert!(auth::verify(&key, PEER_LABEL, &n0, &n1, proof));
    drop(s);
    assert!(peer.join().unwrap().is_err());
}

/// A TCP connection to `127.0.0.1:port` from the source address `src`.
fn connect_from(src: std::net::Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; the
    // sockaddr_in structures are fully initialised.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let addr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = addr(src, 0);
        if libc::bind(fd, &local as *const libc::sockaddr_in as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = addr(std::net::Ipv4Addr::LOCALHOST, port);
        if libc::connect(fd, &remote as *const libc::sockaddr_in as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// A client that keeps every handshake slot it can get filled with silent
/// connections (from 127.0.0.2) must not keep a real rank (from 127.0.0.1)
/// out until the rendezvous deadline.
#[test]
fn tcp_a_connection_flood_from_one_address_does_not_starve_real_ranks() {
    let host = RendezvousHost::bind(&cfg(0, 2, 0).with_rendezvous_timeout(Duration::from_secs(30)))
        .unwrap()
        .with_handshake_limits(16, Duration::from_secs(30));
    let port = host.local_addr().port();
    let root = std::thread::spawn(move || host.accept(b""));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let src = std::net::Ipv4Addr::new(127, 0, 0, 2);
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Drop the connections rank 0 closed; refill up to 40.
                held.retain(|s| {
                    let _ = s.set_nonblocking(true);
                    let mut b = [0u8; 64];
                    loop {
                        match (&*s).read(&mut b) {
                            Ok(0) => return false,
                            Ok(_) => continue,
                            Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
                        }
                    }
                });
                while held.len() < 40 {
                    match connect_from(src, port) {
                        Ok(s) => held.push(s),
                        Err(_) => break,
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // Let the flood take every slot it can.
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let peer = World::rendezvous(&cfg(1, 2, port).with_rendezvous_timeout(Duration::from_secs(8)), b"");
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    let peer = peer.unwrap_or_else(|e| panic!("the real rank was starved for {took:?}: {e}"));
    let root = root.join().unwrap().unwrap();
    let h = std::thread::spawn(move || peer.barrier());
    root.barrier().unwrap();
    h.join().unwrap().unwrap();
    assert!(took < Duration::from_secs(5), "the real rank waited {took:?}");
}

/// A rank of another doorbell version, or of a build whose shared
/// structures differ, is refused at the rendezvous naming both.
#[test]
fn tcp_peers_of_another_build_are_refused_naming_both_versions() {
    for (library, layout_word, words) in [
        (
            "0.0.0-elsewhere",
            heap_layout_word(),
            ["doorbell library version", "0.0.0-elsewhere", LIBRARY_VERSION],
        ),
        (LIBRARY_VERSION, heap_layout_word() ^ 1, ["heap layout word", "0x", "0x"]),
    ] {
        let host = RendezvousHost::bind(&cfg(0, 2, 0)).unwrap();
        let port = host.local_addr().port();
        let root = std::thread::spawn(move || host.accept(b""));
        let _fake = FakePeer::join_built(port, 1, 2, 1, library, layout_word);
        let e = root.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::RendezvousMismatch { rank: 1, .. }), "{e}");
        let msg = e.to_string();
        for w in words {
            assert!(msg.contains(w), "{msg}");
        }
    }
}

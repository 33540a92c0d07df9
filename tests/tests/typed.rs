//! The typed transfer calls (`Sym`, `Part`, `Put`, `Get`, `Signal`) over
//! P2P and IBGDA: a part outside its own buffer is refused — not merely one
//! outside the heap — naming the argument and the buffer's bounds, and
//! nothing lands on the peer, not even in the allocation right after the
//! buffer; an unregistered source over IBGDA says how to register it.

use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, RdmaPeers};
use doorbell::{Backend, ForTransport, Kernel, KernelParam, LaunchConfig};
use doorbell_kernels::transport::{Ibgda, P2p, Proxy, Routed, Sym, Transport};
use doorbell_test_kernels::typed::{
    lane_words, many_count, many_words, put_lanes_call, put_lanes_many_call, typed_call, LANE_WORDS, MANY_LONG, MANY_SLOT,
};
use doorbell_tests::{load_test_kernel, per_backend};

const N: usize = 64;
const CANARY: u32 = 0xC0FF_EE00;

/// What rank 0 saw and rank 1 holds after one case.
struct Seen {
    err: Option<String>,
    codes: Vec<u32>,
    buf: Vec<u32>,
    next: Vec<u32>,
    sigs: Vec<u64>,
}

type Args<T> = (T, Sym<u32>, Sym<u64>, *mut u32, u32, *mut u32);

/// A transport handle the test can ask the communicator for.
trait Handle: Transport + KernelParam {
    fn of(comm: &Communicator) -> doorbell::Result<Self>;
    /// Whether a `put_lanes_many` call whose run fits the send queue rings
    /// exactly one doorbell on the soft NIC (IBGDA's one run).
    const ONE_DOORBELL: bool = false;
}
impl Handle for P2p {
    fn of(comm: &Communicator) -> doorbell::Result<Self> {
        comm.p2p()
    }
}
impl Handle for Ibgda {
    fn of(comm: &Communicator) -> doorbell::Result<Self> {
        comm.ibgda()
    }
    const ONE_DOORBELL: bool = true;
}
/// Every peer through the NIC (the routed transport's IBGDA side).
impl Handle for Routed {
    fn of(comm: &Communicator) -> doorbell::Result<Self> {
        comm.routed_with(&RdmaPeers::All)
    }
    const ONE_DOORBELL: bool = true;
}
/// Every peer through the CPU proxy's requests.
impl Handle for Proxy {
    fn of(comm: &Communicator) -> doorbell::Result<Self> {
        comm.proxy()
    }
}

/// The communicators of both tests: a 1 MiB heap, waits of at most 20 s.
fn options() -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

fn run<T: Handle>(backend: Backend, case: u32) -> Seen
where
    typed_call: ForTransport<T>,
    <typed_call as ForTransport<T>>::Kernel: Kernel<Args = Args<T>>,
{
    let mut out = Communicator::local(2, backend, options(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<typed_call as ForTransport<T>>::Kernel>(dev)?;
        let buf = comm.alloc::<u32>(N)?;
        // The allocation right after `buf`: where a put past its end would land.
        let next = comm.alloc::<u32>(N)?;
        next.copy_from_host(&[CANARY; N])?;
        let sigs = comm.alloc::<u64>(2)?;
        // Rank 0's source data differs from what rank 1 holds (zeros).
        if comm.rank() == 0 {
            buf.copy_from_host(&(0..N as u32).map(|i| i * 3 + 1).collect::<Vec<_>>())?;
        }
        let mut local = dev.alloc_from(&(0..N as u32).map(|i| i ^ 0x55).collect::<Vec<_>>())?;
        let mut codes = dev.alloc_zeroed::<u32>(2)?;
        let t = T::of(comm)?;
        let s = dev.new_stream()?;
        comm.barrier()?;
        // SAFETY: symmetric buffers of the sizes the kernel documents.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(1, 64),
                (t, buf.sym(), sigs.sym(), local.as_mut_ptr(), case, codes.as_mut_ptr()),
            )?
        };
        let err = comm.synchronize(&s).err().map(|e| e.to_string());
        comm.barrier()?;
        Ok(Seen {
            err,
            codes: codes.to_host()?,
            buf: buf.to_host()?,
            next: next.to_host()?,
            sigs: sigs.to_host()?,
        })
    })
    .unwrap_or_else(|e| panic!("{backend:?} case {case}: {e}"));
    let r1 = out.pop().expect("rank 1");
    let r0 = out.pop().expect("rank 0");
    Seen {
        err: r0.err,
        codes: r0.codes,
        ..r1
    }
}

/// (case, code, words the error must hold).
const BAD: [(u32, u32, &str); 6] = [
    (0, 8, "the destination is elements [61, 65) of a buffer of 64 elements of 4 bytes"),
    (1, 8, "the source is elements [1, 65) of a buffer of 64 elements"),
    (2, 9, "the destination has 4 elements and the source 5"),
    (3, 8, "the signal word is elements [2, 3) of a buffer of 2 elements of 8 bytes"),
    (4, 8, "the source is elements [64, 65) of a buffer of 64 elements"),
    (5, 8, "the signal word is elements [1, 3) of a buffer of 2 elements"),
];

fn check_all<T: Handle>(backend: Backend)
where
    typed_call: ForTransport<T>,
    <typed_call as ForTransport<T>>::Kernel: Kernel<Args = Args<T>>,
{
    for (case, code, words) in BAD {
        let what = format!("{backend:?} {} case {case}", std::any::type_name::<T>());
        let s = run::<T>(backend, case);
        assert_eq!(s.codes, [code, 0], "{what}: code, threads that disagreed");
        let err = s.err.unwrap_or_else(|| panic!("{what}: no error reported"));
        assert!(err.contains(words), "{what}: {err}");
        assert!(err.contains("nothing was"), "{what}: {err}");
        assert!(s.buf.iter().all(|&v| v == 0), "{what}: the peer's buffer changed");
        assert!(s.next.iter().all(|&v| v == CANARY), "{what}: the next allocation changed");
        assert_eq!(s.sigs, [0, 0], "{what}: the signal words changed");
    }
    // The control: the whole buffer and its signal arrive.
    let s = run::<T>(backend, 6);
    assert!(s.err.is_none(), "{backend:?}: {:?}", s.err);
    assert_eq!(s.codes, [0, 0]);
    assert_eq!(s.buf, (0..N as u32).map(|i| i * 3 + 1).collect::<Vec<_>>());
    assert_eq!(s.sigs, [7, 0]);
    assert!(s.next.iter().all(|&v| v == CANARY));
}

per_backend! {
    /// Every typed argument is checked against its own buffer over P2P.
    fn typed_parts_are_checked_against_their_own_buffer_p2p(backend: Backend) {
        check_all::<P2p>(backend);
        // P2P reads any device memory: a local source arrives.
        let s = run::<P2p>(backend, 7);
        assert!(s.err.is_none(), "{:?}", s.err);
        assert_eq!(s.buf, (0..N as u32).map(|i| i ^ 0x55).collect::<Vec<_>>());
    }
}

/// The same over IBGDA through the soft NIC (the emulator's); there an
/// unregistered local source is refused with how to register it.
#[test]
fn typed_parts_are_checked_against_their_own_buffer_ibgda() {
    check_all::<Ibgda>(Backend::Cpu);
    let s = run::<Ibgda>(Backend::Cpu, 7);
    assert_eq!(s.codes, [4, 0]);
    let err = s.err.expect("an unregistered source is refused");
    assert!(
        err.contains("the source (256 bytes outside the symmetric heap) is neither in the symmetric heap nor in memory registered"),
        "{err}"
    );
    assert!(err.contains("register it with Communicator::ibgda_register"), "{err}");
    assert!(s.buf.iter().all(|&v| v == 0) && s.sigs == [0, 0]);
}

/// What rank 0's lanes returned and rank 1 holds after one launch of
/// `put_lanes_call`.
struct Lanes {
    err: Option<String>,
    codes: Vec<u32>,
    dst: Vec<u64>,
    sigs: Vec<u64>,
}

const LANES: usize = 64;
const LANE_CANARY: u64 = 0xCA11_AB1E_0000_0000;

type LaneArgs<T> = (T, Sym<u64>, Sym<u64>, Sym<u64>, u32, u32, *mut u32);

/// Rank 0's source words in `round`: different in every round.
fn lane_src(round: u32) -> Vec<u64> {
    (0..LANES as u64 * LANE_WORDS)
        .map(|j| (round as u64 + 1) * 0x1_0000_0001 + j * 0x9E37)
        .collect()
}

fn run_lanes<T: Handle>(backend: Backend, case: u32, rounds: u32) -> Vec<Lanes>
where
    put_lanes_call: ForTransport<T>,
    <put_lanes_call as ForTransport<T>>::Kernel: Kernel<Args = LaneArgs<T>>,
{
    let words = LANES * LANE_WORDS as usize;
    let mut out = Communicator::local(2, backend, options(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<put_lanes_call as ForTransport<T>>::Kernel>(dev)?;
        let dst = comm.alloc::<u64>(words)?;
        let src = comm.alloc::<u64>(words)?;
        let sigs = comm.alloc::<u64>(2)?;
        let mut codes = dev.alloc_zeroed::<u32>(LANES)?;
        let t = T::of(comm)?;
        let s = dev.new_stream()?;
        let mut seen = Vec::new();
        for round in 0..rounds {
            dst.copy_from_host(&vec![LANE_CANARY | round as u64; words])?;
            sigs.copy_from_host(&[0, 0])?;
            src.copy_from_host(&lane_src(round))?;
            codes.copy_from_host(&[u32::MAX; LANES])?;
            comm.barrier()?;
            // SAFETY: symmetric buffers of the sizes the kernel documents.
            unsafe {
                s.launch(
                    &f,
                    LaunchConfig::linear(1, LANES as u32),
                    (t, dst.sym(), src.sym(), sigs.sym(), round, case, codes.as_mut_ptr()),
                )?
            };
            let err = comm.synchronize(&s).err().map(|e| e.to_string());
            comm.barrier()?;
            seen.push(Lanes {
                err,
                codes: codes.to_host()?,
                dst: dst.to_host()?,
                sigs: sigs.to_host()?,
            });
            if case == 2 {
                break;
            }
        }
        Ok(seen)
    })
    .unwrap_or_else(|e| panic!("{backend:?} put_lanes case {case}: {e}"));
    let r1 = out.pop().expect("rank 1");
    let r0 = out.pop().expect("rank 0");
    r0.into_iter()
        .zip(r1)
        .map(|(a, b)| Lanes {
            err: a.err,
            codes: a.codes,
            ..b
        })
        .collect()
}

/// Checks warp `w`'s lanes of one round on rank 1: each lane's words
/// arrived and the rest of its four words kept the canary; its warp's
/// signal word holds the sum of its signalling lanes.
fn check_warp(s: &Lanes, round: u32, w: usize, what: &str) {
    let src = lane_src(round);
    for i in w * 32..w * 32 + 32 {
        let n = lane_words(i as u64, round) as usize;
        for k in 0..LANE_WORDS as usize {
            let j = i * LANE_WORDS as usize + k;
            let want = if k < n { src[j] } else { LANE_CANARY | round as u64 };
            assert_eq!(s.dst[j], want, "{what}: lane {i} word {k} (lane words {n})");
        }
    }
    let sum: u64 = (w * 32..w * 32 + 32).filter(|i| i % 3 == 0).map(|i| i as u64 + 1).sum();
    assert_eq!(s.sigs[w], sum, "{what}: warp {w}'s signal word");
}

fn check_lanes<T: Handle>(backend: Backend)
where
    put_lanes_call: ForTransport<T>,
    <put_lanes_call as ForTransport<T>>::Kernel: Kernel<Args = LaneArgs<T>>,
{
    for case in [0, 1] {
        for (round, s) in run_lanes::<T>(backend, case, 3).iter().enumerate() {
            let what = format!("{backend:?} {} case {case} round {round}", std::any::type_name::<T>());
            assert!(s.err.is_none(), "{what}: {:?}", s.err);
            assert_eq!(s.codes, [0; LANES], "{what}: lanes' results");
            check_warp(s, round as u32, 0, &what);
            check_warp(s, round as u32, 1, &what);
        }
    }
    // Lane 33's destination runs past `dst`: its warp writes nothing and
    // every lane of it reports that; warp 0 is untouched by it.
    let s = &run_lanes::<T>(backend, 2, 1)[0];
    let what = format!("{backend:?} {} case 2", std::any::type_name::<T>());
    assert_eq!(&s.codes[..32], &[0; 32], "{what}: warp 0's results");
    assert_eq!(&s.codes[32..], &[8; 32], "{what}: warp 1's results");
    check_warp(s, 0, 0, &what);
    assert!(
        s.dst[32 * LANE_WORDS as usize..].iter().all(|&v| v == LANE_CANARY),
        "{what}: warp 1 wrote"
    );
    assert_eq!(s.sigs[1], 0, "{what}: warp 1 signalled");
    let err = s.err.as_deref().unwrap_or_else(|| panic!("{what}: no error reported"));
    assert!(
        err.contains("the destination is elements [255, 257) of a buffer of 256 elements"),
        "{what}: {err}"
    );
}

per_backend! {
    /// `put_lanes` over P2P: each lane's own part and signal, variable
    /// lengths (empty parts too) changing every round; a refused lane
    /// stops its whole warp before anything is written.
    fn every_lane_puts_its_own_part_p2p(backend: Backend) {
        check_lanes::<P2p>(backend);
    }

    /// `put_lanes` over IBGDA: the warp's WQEs in one run behind one
    /// doorbell, checked as over P2P.
    fn every_lane_puts_its_own_part_ibgda(backend: Backend) {
        check_lanes::<Ibgda>(backend);
    }
}

type ManyArgs<T> = (T, Sym<u64>, Sym<u64>, u32, u32, *mut u32);
const MANY_WORDS: usize = 32 * MANY_LONG as usize * MANY_SLOT as usize;

/// What rank 0's lanes returned and rank 1 holds after each round of
/// `put_lanes_many_call`'s `case`: (error, codes, dst, the doorbells
/// rank 0's soft NIC saw in the launch, if it has one).
type ManySeen = (Option<String>, Vec<u32>, Vec<u64>, Option<u64>);

fn run_many<T: Handle>(backend: Backend, case: u32, rounds: u32) -> Vec<ManySeen>
where
    put_lanes_many_call: ForTransport<T>,
    <put_lanes_many_call as ForTransport<T>>::Kernel: Kernel<Args = ManyArgs<T>>,
{
    let mut out = run_many_on(backend, 2, T::of, case, rounds);
    let r1 = out.pop().expect("rank 1");
    let r0 = out.pop().expect("rank 0");
    r0.into_iter().zip(r1).map(|((e, c, _, n), (_, _, d, _))| (e, c, d, n)).collect()
}

/// `put_lanes_many_call`'s `case` over `ranks` ranks and the handle `of`
/// makes, `rounds` times: each rank's [`ManySeen`] of each round (its own
/// lanes' results and its own `dst`).
fn run_many_on<T: Transport + KernelParam>(
    backend: Backend,
    ranks: usize,
    of: impl Fn(&Communicator) -> doorbell::Result<T> + Sync,
    case: u32,
    rounds: u32,
) -> Vec<Vec<ManySeen>>
where
    put_lanes_many_call: ForTransport<T>,
    <put_lanes_many_call as ForTransport<T>>::Kernel: Kernel<Args = ManyArgs<T>>,
{
    Communicator::local(ranks, backend, options(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<put_lanes_many_call as ForTransport<T>>::Kernel>(dev)?;
        let dst = comm.alloc::<u64>(MANY_WORDS)?;
        let src = comm.alloc::<u64>(MANY_WORDS)?;
        let mut codes = dev.alloc_zeroed::<u32>(32)?;
        let t = of(comm)?;
        let s = dev.new_stream()?;
        let mut seen = Vec::new();
        for round in 0..rounds {
            dst.copy_from_host(&vec![LANE_CANARY | round as u64; MANY_WORDS])?;
            src.copy_from_host(&many_src(round))?;
            codes.copy_from_host(&[u32::MAX; 32])?;
            comm.barrier()?;
            let doorbells = || comm.soft_nic().map(|n| n.stats().doorbells);
            let before = doorbells();
            // SAFETY: symmetric buffers of the sizes the kernel documents.
            unsafe {
                s.launch(
                    &f,
                    LaunchConfig::linear(1, 32),
                    (t, dst.sym(), src.sym(), round, case, codes.as_mut_ptr()),
                )?
            };
            let err = comm.synchronize(&s).err().map(|e| e.to_string());
            let rung = doorbells().zip(before).map(|(a, b)| a - b);
            comm.barrier()?;
            seen.push((err, codes.to_host()?, dst.to_host()?, rung));
        }
        Ok(seen)
    })
    .unwrap_or_else(|e| panic!("{backend:?} put_lanes_many case {case} over {ranks} ranks: {e}"))
}

/// Case 6 of `put_lanes_many_call` over 3 ranks: rank 0's lane `l` puts
/// its transfers to rank `1 + l mod 2`; each word of each lane's slots
/// lands on that rank only (canaries on the other), in every round.
fn check_many_peers<T: Transport + KernelParam>(backend: Backend, of: impl Fn(&Communicator) -> doorbell::Result<T> + Sync, what: &str)
where
    put_lanes_many_call: ForTransport<T>,
    <put_lanes_many_call as ForTransport<T>>::Kernel: Kernel<Args = ManyArgs<T>>,
{
    let ranks = run_many_on(backend, 3, of, 6, 3);
    for round in 0..3u32 {
        let what = format!("{backend:?} {what} round {round}");
        let (err, codes, _, _) = &ranks[0][round as usize];
        assert!(err.is_none(), "{what}: {err:?}");
        assert_eq!(codes, &[0; 32], "{what}: lanes' results");
        let src = many_src(round);
        for (r, seen) in ranks.iter().enumerate().skip(1) {
            let dst = &seen[round as usize].2;
            for l in 0..32u64 {
                let mine = 1 + l as usize % 2 == r;
                for j in 0..MANY_LONG {
                    let n = if mine && j < many_count(l, round, 0) {
                        many_words(l, j, round, 6)
                    } else {
                        0
                    };
                    for k in 0..MANY_SLOT {
                        let w = ((l * MANY_LONG as u64 + j as u64) * MANY_SLOT + k) as usize;
                        let want = if k < n { src[w] } else { LANE_CANARY | round as u64 };
                        assert_eq!(dst[w], want, "{what}: rank {r}, lane {l} transfer {j} word {k} ({n} words put)");
                    }
                }
            }
        }
    }
}

/// Rank 0's source words for `put_lanes_many_call` in `round`.
fn many_src(round: u32) -> Vec<u64> {
    (0..MANY_WORDS as u64)
        .map(|j| (round as u64 + 7) * 0x3_0000_0001 + j * 0x9E37_79B9)
        .collect()
}

fn check_many<T: Handle>(backend: Backend)
where
    put_lanes_many_call: ForTransport<T>,
    <put_lanes_many_call as ForTransport<T>>::Kernel: Kernel<Args = ManyArgs<T>>,
{
    for case in [0, 1, 3] {
        for (round, (err, codes, dst, rung)) in run_many::<T>(backend, case, 3).into_iter().enumerate() {
            let round = round as u32;
            let what = format!("{backend:?} {} case {case} round {round}", std::any::type_name::<T>());
            assert!(err.is_none(), "{what}: {err:?}");
            assert_eq!(codes, [0; 32], "{what}: lanes' results");
            if T::ONE_DOORBELL && case != 3 {
                // The warp's up to 32 × 5 transfers: one run, one doorbell
                // (round by round would ring up to 5).
                assert_eq!(rung, Some(1), "{what}: doorbells rung by the call");
            }
            let src = many_src(round);
            for l in 0..32u64 {
                for j in 0..MANY_LONG {
                    let n = if j < many_count(l, round, case) {
                        many_words(l, j, round, case)
                    } else {
                        0
                    };
                    for k in 0..MANY_SLOT {
                        let w = ((l * MANY_LONG as u64 + j as u64) * MANY_SLOT + k) as usize;
                        let want = if k < n { src[w] } else { LANE_CANARY | round as u64 };
                        assert_eq!(dst[w], want, "{what}: lane {l} transfer {j} word {k} ({n} words put)");
                    }
                }
            }
        }
    }
    // Lane 9's third transfer lands past the heap (raw) or past its
    // buffer (typed): nothing is written and every lane reports it.
    for (case, code, says) in [
        (2, 4, "destination"),
        (
            4,
            8,
            &*format!(
                "the destination is elements [{}, {}) of a buffer of {MANY_WORDS} elements",
                MANY_WORDS - 1,
                MANY_WORDS + 1
            ),
        ),
    ] {
        let (err, codes, dst, _) = run_many::<T>(backend, case, 1).pop().expect("one round");
        let what = format!("{backend:?} {} case {case}", std::any::type_name::<T>());
        assert_eq!(codes, [code; 32], "{what}: every lane gets lane 9's error");
        assert!(dst.iter().all(|&v| v == LANE_CANARY), "{what}: a lane wrote");
        let err = err.unwrap_or_else(|| panic!("{what}: no error reported"));
        assert!(err.contains(says), "{what}: {err}");
    }
    // Nothing to send, to a peer outside the world: nothing happens.
    let (err, codes, dst, rung) = run_many::<T>(backend, 5, 1).pop().expect("one round");
    let what = format!("{backend:?} {} case 5", std::any::type_name::<T>());
    assert!(err.is_none(), "{what}: {err:?}");
    assert_eq!(codes, [0; 32], "{what}: lanes' results");
    assert!(dst.iter().all(|&v| v == LANE_CANARY), "{what}: a lane wrote");
    assert!(rung.unwrap_or(0) == 0, "{what}: rang {rung:?}");
}

per_backend! {
    /// `put_lanes_many_raw` over P2P: each lane its own number of
    /// transfers (none too) of its own lengths, changing every round,
    /// blocking and not; one refused transfer stops the warp before
    /// anything is written.
    fn every_lane_puts_many_transfers_p2p(backend: Backend) {
        check_many::<P2p>(backend);
    }

    /// `put_lanes_many_raw` over IBGDA: the warp's transfers as one run
    /// behind one doorbell, and a run longer than the send queue (case 3)
    /// round by round; checked as over P2P.
    fn every_lane_puts_many_transfers_ibgda(backend: Backend) {
        check_many::<Ibgda>(backend);
    }

    /// `put_lanes_many_raw` over the routed transport with every peer
    /// through the NIC: the call goes to IBGDA's run.
    fn every_lane_puts_many_transfers_routed(backend: Backend) {
        check_many::<Routed>(backend);
    }

    /// `put_lanes_many_raw` through the CPU proxy (round by round, every
    /// source checked before anything is written).
    fn every_lane_puts_many_transfers_proxy(backend: Backend) {
        check_many::<Proxy>(backend);
    }

    /// `put_lanes_many_raw` with lanes naming different peers (3 ranks):
    /// over P2P; over IBGDA (every peer through the NIC: round by round,
    /// not one run); over the routed transport with rank 2 through the NIC
    /// and rank 1 by load/store (lanes on both routes in one call); over
    /// the CPU proxy, every peer through it and with rank 1 by load/store.
    fn lanes_put_many_transfers_to_different_peers(backend: Backend) {
        check_many_peers(backend, |c| c.p2p(), "p2p");
        check_many_peers(backend, |c| c.ibgda(), "ibgda");
        check_many_peers(backend, |c| c.routed_with(&RdmaPeers::Pairs(vec![(0, 2)])), "routed, 0-2 through the NIC");
        check_many_peers(backend, |c| c.proxy(), "proxy");
        check_many_peers(backend, |c| c.proxy_routed(&RdmaPeers::Pairs(vec![(0, 2)])), "proxy, 0-2 through the NIC");
    }
}

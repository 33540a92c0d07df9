//! The transport contract on every backend, for two transports (P2P
//! and the `Shadow` test transport) instantiated from one kernel body:
//! bad arguments are typed errors naming rank, call, peer and offset, with
//! the target memory unchanged; data is visible when its signal is seen;
//! multi-word waits.

use doorbell_tests::per_backend;
use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, RdmaPeers};
use doorbell::{Backend, DeviceBuffer, Error, ForTransport, Kernel, KernelParam, LaunchConfig, Stream};
use doorbell_kernels::transport::{Ibgda, P2p, Proxy, Routed, Transport};
use doorbell_test_kernels::contract::{bad_call, collect_signals, flagged_rounds, Shadow};
use doorbell_tests::{load_test_kernel, BadArgs, CollectArgs, FlaggedRounds, RoundArgs};

fn backends() -> Vec<Backend> {
    doorbell_tests::backends().iter().map(|d| d.backend()).collect()
}

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// The transports under test, as a handle maker: P2P itself, and Shadow
/// counting into `calls`.
trait Make: Transport + KernelParam {
    fn make(comm: &Communicator, calls: &mut DeviceBuffer<u64>) -> Self;
    /// The handle for `via`: [`Via::Plain`] is [`Self::make`]'s; a
    /// transport that routes by node makes its [`Via::OneNode`] handle
    /// with both ranks on one node.
    fn make_via(comm: &Communicator, calls: &mut DeviceBuffer<u64>, _via: Via) -> Self {
        Self::make(comm, calls)
    }
    const NAME: &'static str;
    /// Makes the device buffer `src` usable as a put source (RDMA transports register it).
    fn register(_comm: &Communicator, _src: u64, _bytes: u64) -> doorbell::Result<()> {
        Ok(())
    }
    /// Whether the transport runs on `backend`.
    fn runs_on(_backend: Backend) -> bool {
        true
    }
}
impl Make for P2p {
    fn make(comm: &Communicator, _: &mut DeviceBuffer<u64>) -> Self {
        comm.p2p().expect("every rank of a test world is on one host")
    }
    const NAME: &'static str = "p2p";
}
impl Make for Shadow {
    fn make(comm: &Communicator, calls: &mut DeviceBuffer<u64>) -> Self {
        Shadow {
            inner: comm.p2p().expect("every rank of a test world is on one host"),
            calls: calls.as_mut_ptr(),
        }
    }
    const NAME: &'static str = "shadow";
}

/// A new stream, and `T`'s handle (Shadow counting into `calls`) made once
/// every rank is ready (a barrier): what each launch below starts with.
fn stream_and_handle<T: Make>(comm: &Communicator, calls: &mut DeviceBuffer<u64>, via: Via) -> doorbell::Result<(Stream, T)> {
    let s = comm.device().new_stream()?;
    comm.barrier()?;
    Ok((s, T::make_via(comm, calls, via)))
}

/// Which handle of a transport a test runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// The transport's plain handle.
    Plain,
    /// Both ranks on one modeled node (`RdmaPeers::Nodes(1)`): the CPU
    /// proxy then reaches the peer by load/store, not through the proxy.
    OneNode,
}

/// Runs bad-call `case` from rank 0 to rank 1; returns (rank 0's error,
/// rank 1's dst and sig after the call, the codes, Shadow's call count,
/// or the CPU proxy's requests of rank 0).
fn bad_case<T: Make>(backend: Backend, case: u32, via: Via) -> (Option<Error>, Vec<u8>, Vec<u64>, [u32; 2], u64)
where
    bad_call: ForTransport<T>,
    <bad_call as ForTransport<T>>::Kernel: Kernel<Args = BadArgs<T>>,
{
    let out = Communicator::local(2, backend, opts(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<bad_call as ForTransport<T>>::Kernel>(dev)?;
        let dst = comm.alloc::<u8>(4096)?;
        let sig = comm.alloc::<u64>(2)?;
        let mut calls = dev.alloc_zeroed::<u64>(1)?;
        // Case 1: a range from `dst` one byte past the heap's end.
        let bytes = doorbell_tests::bad_call_bytes(case, dst.offset(), comm.heap_bytes());
        // Case 7's `bytes` is an offset, not a length: the source holds 4096.
        let src_len = if case == 7 { 4096 } else { bytes };
        let src_host: Vec<u8> = (0..src_len).map(|i| (i % 251) as u8 + 1).collect();
        let src = dev.alloc_from(&src_host)?;
        T::register(comm, src.as_ptr() as u64, src_len)?;
        let mut codes = dev.alloc_zeroed::<u32>(2)?;
        let (s, t) = stream_and_handle::<T>(comm, &mut calls, via)?;
        let args = (t, dst.as_mut_ptr(), src.as_ptr(), bytes, sig.as_mut_ptr(), case, codes.as_mut_ptr());
        // SAFETY: symmetric dst/sig, src of `bytes`, two code words.
        let err = unsafe { doorbell_tests::run_bad_call(comm, &s, &f, args)? };
        let c = codes.to_host()?;
        Ok((
            err,
            dst.to_host()?,
            sig.to_host()?,
            [c[0], c[1]],
            comm.proxy_stats().map_or(calls.to_host()?[0], |p| p.requests),
            dst.offset(),
            sig.offset(),
        ))
    })
    .unwrap_or_else(|e| panic!("{backend:?} {} case {case}: {e}", T::NAME));
    let r0 = &out[0];
    let r1 = &out[1];
    if let Some(Error::DeviceCall { offset, .. }) = &r0.0 {
        // Offsets name the argument: the dst range, or the (misaligned) signal word.
        match case {
            1 => assert_eq!(*offset, r0.5, "{} case {case}", T::NAME),
            // The header's start: the get's local destination.
            7 => assert_eq!(*offset, 0, "{} case {case}", T::NAME),
            2 | 3 => assert_eq!(*offset, r0.6 + 4, "{} case {case}", T::NAME),
            _ => {}
        }
    }
    (r0.0.clone_error(), r1.1.clone(), r1.2.clone(), r0.3, r0.4)
}

/// `Error` is not `Clone`; keep what the assertions need.
trait CloneError {
    fn clone_error(&self) -> Option<Error>;
}
impl CloneError for Option<Error> {
    fn clone_error(&self) -> Option<Error> {
        match self {
            Some(Error::DeviceCall {
                rank,
                call,
                peer,
                offset,
                block,
                reason,
            }) => Some(Error::DeviceCall {
                rank: *rank,
                call,
                peer: *peer,
                offset: *offset,
                block: *block,
                reason: reason.clone(),
            }),
            Some(other) => panic!("expected a DeviceCall error, got {other}"),
            None => None,
        }
    }
}

fn bad_arguments_for<T: Make>()
where
    bad_call: ForTransport<T>,
    <bad_call as ForTransport<T>>::Kernel: Kernel<Args = BadArgs<T>>,
{
    bad_arguments_via::<T>(Via::Plain);
}

/// [`bad_arguments_for`] over `via`'s handle. Returns rank 0's count
/// after the control case (Shadow's calls, the proxy's requests).
fn bad_arguments_via<T: Make>(via: Via) -> u64
where
    bad_call: ForTransport<T>,
    <bad_call as ForTransport<T>>::Kernel: Kernel<Args = BadArgs<T>>,
{
    let mut count = 0;
    for backend in backends().into_iter().filter(|&b| T::runs_on(b)) {
        for (case, code, call, peer, words) in doorbell_tests::BAD_CALLS {
            let (err, dst, sig, codes, _) = bad_case::<T>(backend, case, via);
            let what = format!("{backend:?} {} case {case}", T::NAME);
            assert_eq!(codes, [code, 0], "{what}: error code, threads that disagreed");
            match err {
                Some(Error::DeviceCall {
                    rank,
                    call: c,
                    peer: p,
                    ref reason,
                    ..
                }) => {
                    assert_eq!((rank, c, p), (0, call, peer), "{what}");
                    assert!(reason.contains(words), "{what}: {reason}");
                }
                other => panic!("{what}: expected a DeviceCall error, got {other:?}"),
            }
            assert!(dst.iter().all(|&b| b == 0), "{what}: the target buffer changed");
            assert_eq!(sig, vec![0, 0], "{what}: the signal words changed");
        }
        // The control case: the same call with good arguments delivers.
        let (err, dst, sig, codes, calls) = bad_case::<T>(backend, doorbell_tests::BAD_CALL_CONTROL, via);
        assert!(err.is_none(), "{backend:?} {}: {err:?}", T::NAME);
        assert_eq!(codes, [0, 0]);
        let want: Vec<u8> = (0..4096u64).map(|i| (i % 251) as u8 + 1).collect();
        assert_eq!(dst, want, "{backend:?} {}: control put_signal data", T::NAME);
        assert_eq!(sig, vec![7, 0]);
        if T::NAME == "shadow" {
            assert_eq!(calls, 1, "Shadow counts its one put_signal (its own code ran)");
        }
        count = calls;
    }
    count
}

#[test]
fn bad_arguments_are_typed_errors_and_write_nothing_p2p() {
    bad_arguments_for::<P2p>();
}

#[test]
fn bad_arguments_are_typed_errors_and_write_nothing_shadow() {
    bad_arguments_for::<Shadow>();
}

fn flagged_rounds_for<T: Make>(backend: Backend, mode: u32, spread: bool)
where
    flagged_rounds: ForTransport<T>,
    <flagged_rounds as ForTransport<T>>::Kernel: Kernel<Args = RoundArgs<T>>,
{
    flagged_rounds_via::<T>(backend, mode, spread, Via::Plain);
}

/// [`flagged_rounds_for`] over `via`'s handle; returns the CPU proxy's
/// requests on each rank (0 where the transport is not the proxy).
fn flagged_rounds_via<T: Make>(backend: Backend, mode: u32, spread: bool, via: Via) -> Vec<u64>
where
    flagged_rounds: ForTransport<T>,
    <flagged_rounds as ForTransport<T>>::Kernel: Kernel<Args = RoundArgs<T>>,
{
    let gpu = backend == Backend::Gpu;
    let (blocks, threads, words, iters) = if gpu { (16u32, 256u32, 4099u32, 300u32) } else { (3, 32, 1031, 20) };
    let opts = CommOptions {
        spread_gpus: spread,
        ..opts()
    };
    Communicator::local(2, backend, opts, |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<flagged_rounds as ForTransport<T>>::Kernel>(dev)?;
        let mut rounds = FlaggedRounds::new(comm, blocks, words)?;
        let mut calls = dev.alloc_zeroed::<u64>(1)?;
        let (s, t) = stream_and_handle::<T>(comm, &mut calls, via)?;
        // SAFETY: sizes as flagged_rounds documents.
        unsafe { s.launch(&f, LaunchConfig::linear(blocks, threads), rounds.args(t, iters, mode))? };
        comm.synchronize(&s)?;
        let what = format!("{backend:?} {} mode {mode} rank {}", T::NAME, comm.rank());
        rounds.check(comm.rank(), iters, &what)?;
        Ok(comm.proxy_stats().map_or(0, |p| p.requests))
    })
    .unwrap_or_else(|e| panic!("{backend:?} {} mode {mode}: {e}", T::NAME))
}

per_backend! {
    fn put_signal_data_is_visible_when_the_signal_is_seen(backend: Backend) {
        for mode in [0, 1, 2] {
            flagged_rounds_for::<P2p>(backend, mode, false);
        }
        flagged_rounds_for::<Shadow>(backend, 0, false);
    }
}

#[test]
fn put_signal_data_is_visible_when_the_signal_is_seen_across_two_gpus() {
    // The same-GPU and emulator variants run in the test above.
    if !doorbell_tests::have_gpus(2, "put_signal_data_is_visible_when_the_signal_is_seen_across_two_gpus") {
        return;
    }
    for mode in [0, 1, 2] {
        flagged_rounds_for::<P2p>(Backend::Gpu, mode, true);
    }
}

fn collect_for<T: Make>(backend: Backend)
where
    collect_signals: ForTransport<T>,
    <collect_signals as ForTransport<T>>::Kernel: Kernel<Args = CollectArgs<T>>,
{
    collect_via::<T>(backend, Via::Plain);
}

/// [`collect_for`] over `via`'s handle; returns the CPU proxy's requests
/// on each rank (0 where the transport is not the proxy).
fn collect_via<T: Make>(backend: Backend, via: Via) -> Vec<u64>
where
    collect_signals: ForTransport<T>,
    <collect_signals as ForTransport<T>>::Kernel: Kernel<Args = CollectArgs<T>>,
{
    let out = Communicator::local(2, backend, opts(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<collect_signals as ForTransport<T>>::Kernel>(dev)?;
        let sigs = comm.alloc::<u64>(doorbell_tests::COLLECT_WORDS as usize)?;
        let mut out = dev.alloc_zeroed::<u64>(4)?;
        let mut calls = dev.alloc_zeroed::<u64>(1)?;
        let (s, t) = stream_and_handle::<T>(comm, &mut calls, via)?;
        let args = doorbell_tests::collect_args(t, sigs.as_mut_ptr(), out.as_mut_ptr());
        // SAFETY: symmetric words, four output words.
        unsafe { s.launch(&f, LaunchConfig::linear(1, 32), args)? };
        comm.synchronize(&s)?;
        Ok((out.to_host()?, comm.proxy_stats().map_or(0, |p| p.requests)))
    })
    .unwrap();
    doorbell_tests::check_collected(&out[1].0, &format!("{backend:?} {} {via:?}", T::NAME));
    out.iter().map(|r| r.1).collect()
}

per_backend! {
    fn wait_until_some_any_all_collect_every_word(backend: Backend) {
        collect_for::<P2p>(backend);
        collect_for::<Shadow>(backend);
    }
}

// ---- IBGDA over the soft NIC, and the routed transport (on the emulator
// with the host-thread engine, or the engine kernel under
// DOORBELL_SOFTNIC_ENGINE=kernel; on a GPU with the engine kernel) --------

impl Make for Ibgda {
    fn make(comm: &Communicator, _: &mut DeviceBuffer<u64>) -> Self {
        comm.ibgda().expect("IBGDA setup")
    }
    const NAME: &'static str = "ibgda";
    fn register(comm: &Communicator, src: u64, bytes: u64) -> doorbell::Result<()> {
        // SAFETY: `src` is a device buffer that outlives the communicator's use of it in the test.
        unsafe { comm.ibgda_register(src, bytes as usize) }.map(|_| ())
    }
}
impl Make for Routed {
    fn make(comm: &Communicator, _: &mut DeviceBuffer<u64>) -> Self {
        comm.routed_with(&RdmaPeers::All).expect("routed setup")
    }
    const NAME: &'static str = "routed";
    fn register(comm: &Communicator, src: u64, bytes: u64) -> doorbell::Result<()> {
        <Ibgda as Make>::register(comm, src, bytes)
    }
}

#[test]
fn bad_arguments_are_typed_errors_and_write_nothing_ibgda() {
    bad_arguments_for::<Ibgda>();
}

#[test]
fn bad_arguments_are_typed_errors_and_write_nothing_routed() {
    bad_arguments_for::<Routed>();
}

per_backend! {
    fn put_signal_data_is_visible_when_the_signal_is_seen_ibgda_and_routed(backend: Backend) {
        for mode in [0, 1, 2] {
            flagged_rounds_for::<Ibgda>(backend, mode, false);
            flagged_rounds_for::<Routed>(backend, mode, false);
        }
    }
}

per_backend! {
    fn wait_until_some_any_all_collect_every_word_ibgda_and_routed(backend: Backend) {
        collect_for::<Ibgda>(backend);
        collect_for::<Routed>(backend);
    }
}

// ---- The CPU proxy: the same bodies, each request handed to a host thread
// that posts the WQEs on the soft NIC ---------------------------------------

impl Make for Proxy {
    fn make(comm: &Communicator, _: &mut DeviceBuffer<u64>) -> Self {
        comm.proxy().expect("CPU proxy setup")
    }
    fn make_via(comm: &Communicator, calls: &mut DeviceBuffer<u64>, via: Via) -> Self {
        match via {
            Via::Plain => Self::make(comm, calls),
            Via::OneNode => comm.proxy_routed(&RdmaPeers::Nodes(1)).expect("CPU proxy setup"),
        }
    }
    const NAME: &'static str = "proxy";
    fn register(comm: &Communicator, src: u64, bytes: u64) -> doorbell::Result<()> {
        // SAFETY: `src` is a device buffer that outlives the communicator's use of it in the test.
        unsafe { comm.proxy_register(src, bytes as usize) }.map(|_| ())
    }
}

#[test]
fn bad_arguments_are_typed_errors_and_write_nothing_proxy() {
    bad_arguments_for::<Proxy>();
}

/// The CPU proxy's handle with both ranks on one node: every call to the
/// peer goes by load/store through its P2P half, so its bad arguments are
/// caught there, the control case delivers, and the proxy takes no
/// request. (Emulator and GPU where one is present; the GPU half of this
/// handle has not run on one yet.)
#[test]
fn bad_arguments_are_typed_errors_and_write_nothing_proxy_one_node() {
    let requests = bad_arguments_via::<Proxy>(Via::OneNode);
    assert_eq!(requests, 0, "the control put_signal went through the proxy");
}

per_backend! {
    fn put_signal_data_is_visible_when_the_signal_is_seen_proxy_one_node(backend: Backend) {
        // Not mode 3 (a block's put, then one thread's signal with no
        // barrier and fence): the contract leaves it unordered, and only
        // the NIC's one queue per peer orders it; a direct peer is P2P's.
        for mode in [0, 1, 2] {
            let requests = flagged_rounds_via::<Proxy>(backend, mode, false, Via::OneNode);
            assert_eq!(requests, vec![0, 0], "{backend:?} mode {mode}: requests through the proxy");
        }
    }
}

per_backend! {
    fn put_signal_data_is_visible_when_the_signal_is_seen_proxy(backend: Backend) {
        for mode in [0, 1, 2, 3] {
            flagged_rounds_for::<Proxy>(backend, mode, false);
        }
    }
}

per_backend! {
    fn wait_until_some_any_all_collect_every_word_proxy_one_node(backend: Backend) {
        let requests = collect_via::<Proxy>(backend, Via::OneNode);
        assert_eq!(requests, vec![0, 0], "{backend:?}: requests through the proxy");
    }
}

per_backend! {
    fn wait_until_some_any_all_collect_every_word_proxy(backend: Backend) {
        collect_for::<Proxy>(backend);
    }
}

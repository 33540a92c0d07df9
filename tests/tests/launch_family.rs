//! One launch call for a kernel family exported for several transports
//! (`Module::family`, `Stream::launch_family`): the handle's type picks the
//! entry — a concrete handle at compile time, an `AnyTransport` at run time —
//! and a family launched through `AnyTransport` with a transport it was not
//! exported for is a typed error that names the family and its transports,
//! and runs nothing.
//!
//! Every rank's output depends on its rank, the world size, the transport
//! whose entry ran and a salt, and element 0 travelled from the previous
//! rank through the transport: a wrong entry, a wrong argument order or a
//! handle that does not reach its peers changes a value the host checks.

use std::time::Duration;

use doorbell::coll::TransportKind;
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{AnyTransport, Backend, Error, Family, FamilyHandle, LaunchConfig};
use doorbell_kernels::transport::{Ibgda, P2p, Proxy, Routed};
use doorbell_test_kernels::family::{stamp, stamp_pair, stamp_value, Tag, STAMP_FAILED};
use doorbell_tests::{per_backend, TEST_KERNELS};

/// Threads that write (two blocks of 64, the second partly idle).
const N: u32 = 100;

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// How a test hands the transport to `launch_family`.
#[derive(Clone, Copy, Debug)]
enum Handle {
    /// The concrete handle type (`comm.p2p()`, ...).
    Static,
    /// `comm.transport(kind)`: an `AnyTransport`.
    Any,
}

/// The arguments after the handle, as `stamp` and `stamp_pair` take them.
type Rest = (*mut u64, u32, u64, *mut u64);

/// Launches `F` with `handle` and `rest`.
///
/// # Safety
/// `rest` satisfies `stamp`'s contract.
unsafe fn launch<F: doorbell::KernelFamily, H: FamilyHandle<F, Rest = Rest>>(
    comm: &Communicator,
    fam: &Family<F>,
    handle: H,
    rest: Rest,
) -> doorbell::Result<()> {
    let s = comm.device().new_stream()?;
    // SAFETY: the caller's contract.
    unsafe { s.launch_family(fam, LaunchConfig::linear(2, 64), handle, rest)? };
    comm.synchronize(&s)
}

/// Runs `stamp` on `ranks` ranks over `kind`, handed over as `how`, and
/// checks every rank's output.
fn stamp_world(backend: Backend, ranks: usize, kind: TransportKind, how: Handle) {
    let salt = 0x5a17 + ranks as u64 * 7 + kind as u64;
    let tag = match kind {
        TransportKind::P2p => P2p::TAG,
        TransportKind::Ibgda => Ibgda::TAG,
        TransportKind::Routed => Routed::TAG,
        TransportKind::Proxy => Proxy::TAG,
    };
    let outs = Communicator::local(ranks, backend, opts(), |comm| {
        let m = comm.load_module(&TEST_KERNELS)?;
        let fam = m.family::<stamp>()?;
        let mut out = comm.device().alloc_zeroed::<u64>(N as usize + 1)?;
        let sig = comm.alloc::<u64>(1)?;
        let rest = (out.as_mut_ptr(), N, salt, sig.as_mut_ptr());
        comm.barrier()?;
        // SAFETY: `out` holds N + 1 words, `sig` one zeroed symmetric word.
        unsafe {
            match (how, kind) {
                (Handle::Static, TransportKind::P2p) => launch(comm, &fam, comm.p2p()?, rest)?,
                (Handle::Static, TransportKind::Ibgda) => launch(comm, &fam, comm.ibgda()?, rest)?,
                (Handle::Static, TransportKind::Routed) => launch(comm, &fam, comm.routed()?, rest)?,
                (Handle::Static, TransportKind::Proxy) => launch(comm, &fam, comm.proxy()?, rest)?,
                (Handle::Any, k) => launch(comm, &fam, comm.transport(k)?, rest)?,
            }
        }
        let got = out.to_host()?;
        comm.barrier()?;
        Ok(got)
    })
    .unwrap_or_else(|e| panic!("{kind:?} ({how:?}) on {ranks} ranks: {e}"));
    let world = ranks as u32;
    for (r, got) in outs.iter().enumerate() {
        let prev = (r as u32 + world - 1) % world;
        assert_ne!(got[0], STAMP_FAILED, "rank {r}: the transport call failed");
        assert_eq!(
            got[0],
            stamp_value(tag, prev, world, salt, 0),
            "rank {r}, {kind:?} ({how:?}): element 0 should come from rank {prev}"
        );
        for i in 0..N as u64 {
            assert_eq!(
                got[1 + i as usize],
                stamp_value(tag, r as u32, world, salt, i),
                "rank {r}, {kind:?} ({how:?}): element {i}"
            );
        }
    }
}

per_backend! {
    /// A concrete P2P handle launches the P2P entry, on 2 and 3 ranks.
    fn static_p2p_handle_launches_the_p2p_entry(backend: Backend) {
        stamp_world(backend, 2, TransportKind::P2p, Handle::Static);
        stamp_world(backend, 3, TransportKind::P2p, Handle::Static);
    }
}

per_backend! {
    /// `comm.transport(P2p)` (an `AnyTransport`) launches the same entry.
    fn any_p2p_handle_launches_the_p2p_entry(backend: Backend) {
        stamp_world(backend, 2, TransportKind::P2p, Handle::Any);
    }
}

per_backend! {
    /// Through `AnyTransport`, a family without an entry for the transport
    /// is `Error::TransportNotExported`, naming the family and the
    /// transports it has; nothing runs. With a transport it has, it runs.
    fn any_handle_of_a_transport_not_exported_is_a_typed_error(backend: Backend) {
        let results = Communicator::local(2, backend, opts(), |comm| {
            let m = comm.load_module(&TEST_KERNELS)?;
            let fam = m.family::<stamp_pair>()?;
            assert_eq!(fam.name(), "stamp_pair");
            assert_eq!(fam.transports().collect::<Vec<_>>(), ["p2p", "routed"]);
            let mut out = comm.device().alloc_zeroed::<u64>(N as usize + 1)?;
            let sig = comm.alloc::<u64>(1)?;
            let rest = (out.as_mut_ptr(), N, 9, sig.as_mut_ptr());
            let ibgda = comm.transport(TransportKind::Ibgda)?;
            assert_eq!(ibgda.kind(), TransportKind::Ibgda);
            assert!(!fam.exports(&ibgda));
            let attr = fam.attributes(&ibgda).map(|_| ()).map_err(|e| e.to_string());
            // SAFETY: as in `stamp_world` (and nothing is launched).
            let err = unsafe { launch(comm, &fam, ibgda, rest) }.expect_err("stamp_pair has no IBGDA entry");
            let untouched = out.to_host()?.iter().all(|&w| w == 0);
            // The same family with a transport it has.
            let p2p = AnyTransport::from(comm.p2p()?);
            assert!(fam.exports(&p2p));
            comm.barrier()?;
            // SAFETY: as in `stamp_world`.
            unsafe { launch(comm, &fam, p2p, rest)? };
            let got = out.to_host()?;
            comm.barrier()?;
            Ok((err, attr, untouched, got))
        })
        .unwrap();
        for (r, (err, attr, untouched, got)) in results.into_iter().enumerate() {
            let msg = err.to_string();
            match &err {
                Error::TransportNotExported { family, transport, exported } => {
                    assert_eq!((*family, *transport, exported.as_str()), ("stamp_pair", "ibgda", "p2p, routed"));
                }
                other => panic!("rank {r}: expected TransportNotExported, got {other:?}"),
            }
            for part in ["`stamp_pair`", "ibgda transport", "p2p, routed"] {
                assert!(msg.contains(part), "rank {r}: {msg:?} should name {part:?}");
            }
            assert_eq!(attr, Err(msg), "rank {r}: attributes of a missing entry");
            assert!(untouched, "rank {r}: the refused launch wrote its output");
            assert_eq!(got[0], stamp_value(P2p::TAG, 1 - r as u32, 2, 9, 0), "rank {r}");
            assert_eq!(got[N as usize], stamp_value(P2p::TAG, r as u32, 2, 9, N as u64 - 1), "rank {r}");
        }
    }
}

/// IBGDA through the soft NIC (thread ranks on the emulator), by its
/// concrete handle and through `AnyTransport`.
#[test]
fn ibgda_handles_launch_the_ibgda_entry() {
    stamp_world(Backend::Cpu, 2, TransportKind::Ibgda, Handle::Static);
    stamp_world(Backend::Cpu, 2, TransportKind::Ibgda, Handle::Any);
}

/// The CPU proxy, by its concrete handle and through `AnyTransport`.
#[test]
fn proxy_handles_launch_the_proxy_entry() {
    stamp_world(Backend::Cpu, 2, TransportKind::Proxy, Handle::Static);
    stamp_world(Backend::Cpu, 3, TransportKind::Proxy, Handle::Any);
}

/// The routed transport, by its concrete handle and through `AnyTransport`.
#[test]
fn routed_handles_launch_the_routed_entry() {
    stamp_world(Backend::Cpu, 2, TransportKind::Routed, Handle::Static);
    stamp_world(Backend::Cpu, 3, TransportKind::Routed, Handle::Any);
}

/// The names `--transport` flags and configs use.
#[test]
fn transport_kinds_parse_from_their_names() {
    for kind in [
        TransportKind::P2p,
        TransportKind::Ibgda,
        TransportKind::Routed,
        TransportKind::Proxy,
    ] {
        assert_eq!(kind.name().parse::<TransportKind>().unwrap(), kind);
        assert_eq!(kind.to_string(), kind.name());
    }
    assert_eq!(" IBGDA ".parse::<TransportKind>().unwrap(), TransportKind::Ibgda);
    let err = "nvlink".parse::<TransportKind>().unwrap_err();
    assert!(matches!(&err, Error::BadTransport(s) if s == "nvlink"), "{err:?}");
    assert_eq!(err.to_string(), "\"nvlink\" is not a transport: use p2p, ibgda, routed or proxy");
}

/// A stream of another device refuses the family (as `Stream::launch`
/// refuses a function of another device's module).
#[test]
fn a_family_of_another_device_is_refused() {
    let results = Communicator::local(1, Backend::Cpu, opts(), |comm| {
        let m = comm.load_module(&TEST_KERNELS)?;
        let fam = m.family::<stamp>()?;
        let other = doorbell::Device::emulator(1).new_stream()?;
        let mut out = comm.device().alloc_zeroed::<u64>(N as usize + 1)?;
        let sig = comm.alloc::<u64>(1)?;
        // SAFETY: nothing is launched (refused before).
        let r = unsafe {
            other.launch_family(
                &fam,
                LaunchConfig::linear(1, 32),
                comm.p2p()?,
                (out.as_mut_ptr(), N, 1, sig.as_mut_ptr()),
            )
        };
        Ok(r.map_err(|e| e.to_string()))
    })
    .unwrap();
    let msg = results[0].clone().expect_err("another device's stream");
    assert!(msg.contains("another device"), "{msg}");
}

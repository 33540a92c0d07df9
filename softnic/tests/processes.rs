//! Ports of two fabrics, as two processes hold them: each opens its port at
//! an agreed index (`open_device_at`), the QPs connect with
//! `connect_remote`, and one engine drives the requester through a
//! `PortTable` whose window says where the responder's memory is mapped
//! here. The responder's region is registered at an address that is not
//! this process's (its "owner's" address), so only a translated write can
//! land in the right bytes: an untranslated one would hit unmapped memory.

mod common;

use common::*;
use doorbell_kernels::mlx5::wire::CqeSyndrome;
use doorbell_kernels::mlx5::WqeOp;
use doorbell_softnic::engine::{access, poll_port, EngineConfig, EngineRng, Port, PortTable, QpState, Reason, ThreadMover, Window};
use doorbell_softnic::host::{Cqe, HostBuffer};
use doorbell_softnic::{FabricConfig, MemoryRegion, QueuePair, RdmaDevice, SoftFabric, SoftMr};

/// Where the responder's owner says its heap starts (never dereferenced
/// here: nothing is mapped at this address in a test process).
const OWNER_BASE: u64 = 0x5a00_0000_0000;
const HEAP: usize = 4096;

/// Requester port 0 of one fabric, responder port 1 of another, a heap of
/// the responder's seen through a window, and a second responder region
/// outside that window.
struct Pair {
    a: End,
    b: End,
    _fa: SoftFabric,
    _fb: SoftFabric,
    heap: HostBuffer,
    heap_mr: SoftMr,
    outside: Region,
    /// The requester's source and read-back regions (registered before
    /// the engine's images of the ports are taken).
    src: Region,
    back: Region,
    table: PortTable,
    images: (Box<Port>, Box<Port>),
}

impl Pair {
    fn new() -> Pair {
        let cfg = FabricConfig::default();
        let (fa, fb) = (SoftFabric::new(cfg), SoftFabric::new(cfg));
        let da = fa.open_device_at(0, None).unwrap();
        let db = fb.open_device_at(1, None).unwrap();
        assert_eq!(db.port_index(), 1);
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let a = End::new(&da, &pa, 64, 64, true);
        let b = End::new(&db, &pb, 64, 64, true);
        // The remote port is not in fabric A: only connect_remote reaches it.
        assert!(a.qp.connect(b.qp.endpoint(), ALL_ACCESS).is_err());
        a.qp.connect_remote(b.qp.endpoint(), b.qp.slot(), ALL_ACCESS).unwrap();
        b.qp.connect_remote(a.qp.endpoint(), a.qp.slot(), ALL_ACCESS).unwrap();
        let heap = HostBuffer::zeroed(HEAP + 2 * GUARD, 64);
        heap.write(0, &vec![CANARY; HEAP + 2 * GUARD]);
        heap.write(GUARD, &vec![0; HEAP]);
        // SAFETY: registered at the owner's address, which the engine only
        // reaches through the window onto `heap` (alive as long as the pair).
        let heap_mr = unsafe { db.reg_mr(&pb, OWNER_BASE as *mut u8, HEAP, access::ALL) }.unwrap();
        let outside = Region::new(&db, &pb, 64, access::ALL);
        let src = Region::new(&da, &pa, 256, 0);
        let back = Region::new(&da, &pa, 256, access::LOCAL_WRITE);
        let mut p = Pair {
            src,
            back,
            a,
            b,
            _fa: fa,
            _fb: fb,
            heap,
            heap_mr,
            outside,
            table: PortTable::EMPTY,
            images: (
                Box::new(Port::new(0, Default::default())),
                Box::new(Port::new(0, Default::default())),
            ),
        };
        p.images = (p.a.dev.port_image(), p.b.dev.port_image());
        p.table.ports[0] = &mut *p.images.0;
        p.table.ports[1] = &mut *p.images.1;
        p.table.count = 2;
        p.table.windows[1] = Window {
            from: OWNER_BASE,
            len: HEAP as u64,
            to: p.heap.as_ptr() as u64 + GUARD as u64,
        };
        p
    }

    /// Rings the requester's doorbell up to `head` and runs its engine
    /// until a send CQE appears (bounded).
    fn run(&mut self, head: u64) -> Cqe {
        self.a.sq.ring(head);
        let cfg = EngineConfig::default();
        let mut rng = EngineRng::new(1);
        let t0 = std::time::Instant::now();
        loop {
            let now = t0.elapsed().as_nanos() as u64;
            // SAFETY: the table's ports are live images whose rings and
            // regions live in the pair; port 1 is reached through its window.
            unsafe { poll_port(&mut self.table, 0, now, &cfg, &mut rng, &mut ThreadMover) };
            if let Some(c) = self.a.send_cqes.poll() {
                return c;
            }
            assert!(t0.elapsed().as_secs() < 10, "no send CQE within 10 s");
        }
    }

    fn heap_bytes(&self) -> Vec<u8> {
        self.heap.to_vec()[GUARD..GUARD + HEAP].to_vec()
    }

    fn heap_canaries(&self) {
        let b = self.heap.to_vec();
        assert!(
            b[..GUARD].iter().chain(&b[GUARD + HEAP..]).all(|&x| x == CANARY),
            "a canary around the responder's heap was overwritten"
        );
    }
}

/// An error CQE with `syndrome` and the soft NIC's reason `Unmapped`.
fn expect_unmapped(c: Cqe, syndrome: CqeSyndrome) {
    let e = expect_err(c);
    assert_eq!(CqeSyndrome::from_u8(e.syndrome), syndrome);
    assert_eq!(
        Reason::from_u8(e.vendor_err_synd),
        Reason::Unmapped,
        "{}",
        reason_of(e.vendor_err_synd)
    );
}

#[test]
fn write_read_and_atomic_reach_the_responder_through_its_window() {
    let mut p = Pair::new();
    let (src, skey, back, bkey) = (p.src.addr(), p.src.key(), p.back.addr(), p.back.key());
    let mut r = rng(11);
    for round in 0..4u64 {
        let data = random_bytes(&mut r, 200);
        p.src.fill(&data);
        let off = 64 * round + 8;
        let rkey = p.heap_mr.rkey();
        let (_, head) = p.a.sq.write(&req(WqeOp::Write, src, skey, OWNER_BASE + off, rkey, 200, true));
        expect_ok(p.run(head));
        assert_eq!(
            &p.heap_bytes()[off as usize..off as usize + 200],
            &data[..],
            "round {round}: written bytes"
        );
        let (_, head) = p.a.sq.write(&req(WqeOp::Read, back, bkey, OWNER_BASE + off, rkey, 200, true));
        expect_ok(p.run(head));
        assert_eq!(&p.back.bytes()[..200], &data[..], "round {round}: read back");
    }
    // A fetch-add on the responder's last word: the old value comes back,
    // the new one is in the heap.
    let word = (HEAP - 8) as u64;
    let before = u64::from_ne_bytes(p.heap_bytes()[HEAP - 8..].try_into().unwrap());
    let w = doorbell_kernels::mlx5::WqeRequest {
        add: 0x1_2345_6789,
        ..req(WqeOp::FetchAdd, back, bkey, OWNER_BASE + word, p.heap_mr.rkey(), 8, true)
    };
    let (_, head) = p.a.sq.write(&w);
    expect_ok(p.run(head));
    assert_eq!(p.back.u64_at(0), before);
    assert_eq!(
        u64::from_ne_bytes(p.heap_bytes()[HEAP - 8..].try_into().unwrap()),
        before + 0x1_2345_6789
    );
    p.heap_canaries();
    p.src.check_canaries();
    p.back.check_canaries();
    p.outside.check_canaries();
}

#[test]
fn a_region_outside_the_window_is_a_remote_access_error_that_writes_nothing() {
    let mut p = Pair::new();
    p.src.fill(&[0x77; 64]);
    let (_, head) = p.a.sq.write(&req(
        WqeOp::Write,
        p.src.addr(),
        p.src.key(),
        p.outside.addr(),
        p.outside.key(),
        64,
        true,
    ));
    expect_unmapped(p.run(head), CqeSyndrome::RemoteAccess);
    assert_eq!(p.outside.bytes(), vec![0; 64], "the region outside the window was written");
    p.outside.check_canaries();
    p.heap_canaries();
}

#[test]
fn write_with_immediate_toward_another_process_fails_as_unmapped() {
    let mut p = Pair::new();
    p.src.fill(&[0x55; 64]);
    let w = doorbell_kernels::mlx5::WqeRequest {
        imm: 7,
        ..req(WqeOp::WriteImm, p.src.addr(), p.src.key(), OWNER_BASE, p.heap_mr.rkey(), 64, true)
    };
    let (_, head) = p.a.sq.write(&w);
    expect_unmapped(p.run(head), CqeSyndrome::RemoteInvalReq);
    assert_eq!(p.heap_bytes(), vec![0; HEAP], "the responder's heap was written");
    p.heap_canaries();
    // The responder did nothing wrong: its QP stays ready.
    let slot = p.b.qp.slot();
    assert_eq!(p.images.1.qps[slot].state(), QpState::Rts, "the responder's QP changed state");
}

#[test]
fn open_device_at_refuses_a_taken_or_too_large_index() {
    let f = SoftFabric::new(FabricConfig::default());
    let d = f.open_device_at(3, None).unwrap();
    assert_eq!(d.port_index(), 3);
    let e = f.open_device_at(3, None).unwrap_err().to_string();
    assert!(e.contains("already open"), "{e}");
    let e = f.open_device_at(doorbell_softnic::engine::MAX_PORTS, None).unwrap_err().to_string();
    assert!(e.contains("at most"), "{e}");
    // Indices below stay free for this fabric to open later.
    assert_eq!(f.open_device_at(1, None).unwrap().port_index(), 1);
}

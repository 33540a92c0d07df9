//! Many ports send into one receiver at once, each port's engine on its
//! own thread with no lock between them (as the GPU-resident engines run,
//! one block per port, over a shared port table): SENDs and RDMA WRITEs
//! with immediate from every sender complete on the receiver's one receive
//! CQ, every completion exactly once, every byte where it belongs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use doorbell_kernels::mlx5::queue::{ring_doorbell, update_doorbell_record};
use doorbell_kernels::mlx5::wqe::{write_wqe, FLAG_SIGNALED};
use doorbell_kernels::mlx5::{CtrlSeg, DataSeg, WqeOp, WqeRequest, CQE_RESP_SEND, CQE_RESP_WR_IMM, OPCODE_SEND, WQE_CTRL_CQ_UPDATE};
use doorbell_softnic::engine::{access, poll_port, rq, EngineConfig, EngineRng, Port, PortTable, ThreadMover};
use doorbell_softnic::host::{CqMemory, CqReader, Cqe, HostBuffer, QpMemory};
use doorbell_softnic::{CompletionQueue, FabricConfig, MemoryRegion, QueuePair, RdmaDevice, SoftFabric};

/// Sending ports.
const SENDERS: usize = 3;
/// Messages per sender (alternately SEND and WRITE with immediate).
const MSGS: usize = 1024;
/// Bytes per message.
const SIZE: usize = 64;

fn byte(sender: usize, msg: usize, k: usize) -> u8 {
    (sender as u8).wrapping_mul(61) ^ (msg as u8).wrapping_mul(17) ^ (k as u8).wrapping_mul(3) ^ 0x5a
}

/// A pointer to a port's tables that an engine thread may hold.
#[derive(Clone, Copy)]
struct Table(PortTable);
// SAFETY: the ports it names outlive every engine thread (joined below).
unsafe impl Send for Table {}

fn round(iteration: usize) {
    let fabric = SoftFabric::new(FabricConfig::default());
    let rx_dev = fabric.open_device(None).unwrap();
    let rx_pd = rx_dev.alloc_pd().unwrap();
    let total = SENDERS * MSGS;
    let rx_buf = HostBuffer::zeroed(total * SIZE, 64);
    let wr_buf = HostBuffer::zeroed(total * SIZE, 64);
    let flags = access::LOCAL_WRITE | access::REMOTE_WRITE;
    // SAFETY: the buffers outlive the regions (dropped at the end of the round).
    let (rx_mr, wr_mr) = unsafe {
        (
            rx_dev.reg_mr(&rx_pd, rx_buf.as_ptr(), total * SIZE, flags).unwrap(),
            rx_dev.reg_mr(&rx_pd, wr_buf.as_ptr(), total * SIZE, flags).unwrap(),
        )
    };
    // One receive CQ for every receiver QP: the engines of all senders
    // complete into it.
    let rcq_mem = CqMemory::new(4096);
    let scq_mem = CqMemory::new(64);
    // SAFETY: the memory outlives the CQs.
    let (rcq, scq) = unsafe { (rx_dev.create_cq(rcq_mem.ring()).unwrap(), rx_dev.create_cq(scq_mem.ring()).unwrap()) };

    struct Sender {
        _dev: doorbell_softnic::SoftDevice,
        qp: doorbell_softnic::SoftQp,
        _cq: doorbell_softnic::SoftCq,
        _mr: doorbell_softnic::SoftMr,
        mem: QpMemory,
        cq_mem: CqMemory,
        src: HostBuffer,
    }
    let mut senders = Vec::new();
    let mut rx_qps = Vec::new();
    let mut rx_mems = Vec::new();
    for i in 0..SENDERS {
        let dev = fabric.open_device(None).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let src = HostBuffer::zeroed(MSGS * SIZE, 64);
        let bytes: Vec<u8> = (0..MSGS * SIZE).map(|x| byte(i, x / SIZE, x % SIZE)).collect();
        src.write(0, &bytes);
        // SAFETY: the buffer outlives the region.
        let mr = unsafe { dev.reg_mr(&pd, src.as_ptr(), MSGS * SIZE, 0).unwrap() };
        let mem = QpMemory::new(MSGS as u32, 0, 1);
        let cq_mem = CqMemory::new(MSGS as u32);
        // SAFETY: the memory outlives the objects.
        let cq = unsafe { dev.create_cq(cq_mem.ring()).unwrap() };
        // SAFETY: as above.
        let qp = unsafe { dev.create_qp(&pd, &cq, &cq, mem.rings()).unwrap() };
        let rmem = QpMemory::new(64, MSGS as u32, 1);
        // SAFETY: as above.
        let rqp = unsafe { rx_dev.create_qp(&rx_pd, &scq, &rcq, rmem.rings()).unwrap() };
        qp.connect(rqp.endpoint(), 0).unwrap();
        rqp.connect(qp.endpoint(), access::REMOTE_WRITE).unwrap();
        senders.push(Sender {
            _dev: dev,
            qp,
            _cq: cq,
            _mr: mr,
            mem,
            cq_mem,
            src,
        });
        rx_qps.push(rqp);
        rx_mems.push(rmem);
    }
    // Every receive WQE posted up front: receiver QP i's WQE j is message
    // j of sender i's buffer.
    for (i, m) in rx_mems.iter().enumerate() {
        for j in 0..MSGS {
            let sge = DataSeg {
                byte_count: SIZE as u32,
                lkey: rx_mr.lkey(),
                addr: rx_buf.as_ptr() as u64 + ((i * MSGS + j) * SIZE) as u64,
            };
            // SAFETY: the RQ ring holds MSGS WQEs of one entry.
            unsafe { assert!(rq::write_wqe(m.rq.as_ptr(), MSGS as u32, 1, j as u32, &[sge])) };
        }
        // SAFETY: the QP's doorbell record.
        unsafe { rq::publish(m.dbrec.as_ptr() as *mut u32, MSGS as u32) };
    }
    // Every sender's WQEs written and rung before any engine runs.
    for (i, s) in senders.iter().enumerate() {
        let h = s.mem.handle(s.qp.qpn(), &s.cq_mem);
        let mut head = 0;
        for j in 0..MSGS {
            let at = ((i * MSGS + j) * SIZE) as u64;
            let laddr = s.src.as_ptr() as u64 + (j * SIZE) as u64;
            // SAFETY: basic block j of an SQ of MSGS basic blocks.
            let slot = unsafe { h.sq.add(j * 16) };
            if j.is_multiple_of(2) {
                let ctrl = CtrlSeg {
                    opcode: OPCODE_SEND,
                    wqe_index: j as u16,
                    qpn: s.qp.qpn(),
                    ds: 2,
                    fm_ce_se: WQE_CTRL_CQ_UPDATE,
                    ..CtrlSeg::default()
                }
                .to_words();
                let data = DataSeg {
                    byte_count: SIZE as u32,
                    lkey: s._mr.lkey(),
                    addr: laddr,
                }
                .to_words();
                // SAFETY: the slot's first two segments.
                unsafe {
                    std::ptr::write_volatile(slot as *mut [u32; 4], ctrl);
                    std::ptr::write_volatile(slot.add(4) as *mut [u32; 4], data);
                }
                head = ctrl[0] as u64 | (ctrl[1] as u64) << 32;
            } else {
                let r = WqeRequest {
                    op: WqeOp::WriteImm as u32,
                    laddr,
                    lkey: s._mr.lkey(),
                    raddr: wr_buf.as_ptr() as u64 + at,
                    rkey: wr_mr.rkey(),
                    len: SIZE as u32,
                    imm: ((i as u32) << 16) | j as u32,
                    wqe_index: j as u16,
                    qpn: s.qp.qpn(),
                    flags: FLAG_SIGNALED,
                    ..WqeRequest::default()
                };
                // SAFETY: as above.
                head = unsafe { write_wqe(slot, &r) };
            }
        }
        // SAFETY: the handle's doorbell words.
        unsafe {
            update_doorbell_record(&h, MSGS as u32);
            ring_doorbell(&h, head);
        }
    }

    // The GPU-resident layout: each port's tables in an allocation of its
    // own, a table of pointers, one engine per port with no lock.
    let mut images: Vec<Box<Port>> = std::iter::once(rx_dev.port_image())
        .chain(senders.iter().map(|s| s.qp.device().port_image()))
        .collect();
    let mut table = PortTable::EMPTY;
    for (k, img) in images.iter_mut().enumerate() {
        let index = if k == 0 {
            rx_dev.port_index()
        } else {
            senders[k - 1].qp.device().port_index()
        };
        table.ports[index] = &mut **img as *mut Port;
        table.count = table.count.max(index as u32 + 1);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let cfg = EngineConfig {
        transport_timeout_ns: 60_000_000_000,
        rnr_timeout_ns: 60_000_000_000,
        ..EngineConfig::default()
    };
    let mut threads = Vec::new();
    for p in 0..table.count as usize {
        let t = Table(table);
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let t = t;
            let mut t = t.0;
            let mut rng = EngineRng::new(p as u64);
            while !stop.load(Ordering::Acquire) {
                let now = t0.elapsed().as_nanos() as u64;
                // SAFETY: every port, ring and region outlives the threads.
                let r = unsafe { poll_port(&mut t, p, now, &cfg, &mut rng, &mut ThreadMover) };
                if r.progressed == 0 {
                    std::thread::yield_now();
                }
            }
        }));
    }

    // SAFETY: the rings outlive the readers.
    let mut recv = unsafe { CqReader::new(rcq.ring()) };
    let mut sends: Vec<CqReader> = senders.iter().map(|s| unsafe { CqReader::new(s.cq_mem.ring()) }).collect();
    let mut seen = vec![false; total];
    let mut got = 0;
    let mut sent = vec![0usize; SENDERS];
    let deadline = Instant::now() + Duration::from_secs(20);
    while (got < total || sent.iter().any(|&n| n < MSGS)) && Instant::now() < deadline {
        let mut idle = true;
        if let Some(c) = recv.poll() {
            idle = false;
            let c = match c {
                Cqe::Ok(c) => c,
                Cqe::Err(e) => panic!("round {iteration}: a receive completed with an error: {e:?}"),
            };
            let i = rx_qps.iter().position(|q| q.qpn() == c.qpn).expect("a CQE of a receiver QP");
            let j = c.wqe_counter as usize;
            assert!(j < MSGS, "round {iteration}: receive WQE {j} of QP {i} was never posted");
            assert!(!seen[i * MSGS + j], "round {iteration}: receive WQE {j} of QP {i} completed twice");
            seen[i * MSGS + j] = true;
            assert_eq!(c.byte_cnt, SIZE as u32, "round {iteration}: message {j} of sender {i}");
            if j.is_multiple_of(2) {
                assert_eq!(c.opcode, CQE_RESP_SEND, "round {iteration}: message {j} of sender {i}");
            } else {
                assert_eq!(c.opcode, CQE_RESP_WR_IMM, "round {iteration}: message {j} of sender {i}");
                assert_eq!(c.imm_inval_pkey, ((i as u32) << 16) | j as u32, "round {iteration}: the immediate");
            }
            got += 1;
        }
        for (i, r) in sends.iter_mut().enumerate() {
            if let Some(c) = r.poll() {
                idle = false;
                match c {
                    Cqe::Ok(c) => assert_eq!(
                        c.wqe_counter as usize, sent[i],
                        "round {iteration}: sender {i}'s completions in order"
                    ),
                    Cqe::Err(e) => panic!("round {iteration}: sender {i}'s WQE failed: {e:?}"),
                }
                sent[i] += 1;
            }
        }
        if idle {
            std::thread::yield_now();
        }
    }
    // Nothing more may arrive.
    std::thread::sleep(Duration::from_millis(5));
    stop.store(true, Ordering::Release);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(got, total, "round {iteration}: receive completions (sends: {sent:?})");
    assert!(recv.poll().is_none(), "round {iteration}: more receive completions than messages");
    assert_eq!(sent, vec![MSGS; SENDERS], "round {iteration}: send completions");
    let rx = rx_buf.to_vec();
    let wr = wr_buf.to_vec();
    for i in 0..SENDERS {
        for j in 0..MSGS {
            let at = (i * MSGS + j) * SIZE;
            let (landed, untouched) = if j % 2 == 0 { (&rx, &wr) } else { (&wr, &rx) };
            for k in 0..SIZE {
                assert_eq!(
                    landed[at + k],
                    byte(i, j, k),
                    "round {iteration}: byte {k} of message {j} of sender {i}"
                );
                assert_eq!(untouched[at + k], 0, "round {iteration}: message {j} of sender {i} landed twice");
            }
        }
    }
    let stats = images[0].total_stats();
    assert_eq!(stats.cqes, total as u64, "round {iteration}: the receiver's CQE count");
    drop(images);
}

#[test]
fn sends_and_writes_with_immediate_from_many_ports_complete_once_each_on_one_receiver() {
    for iteration in 0..200 {
        round(iteration);
    }
}

//! Shared by the soft NIC tests: a two-port rig, guarded regions with
//! canaries, a host-side poster that writes WQEs into the SQ ring with the
//! device pipeline's own builders.
#![allow(dead_code)]

use doorbell_kernels::mlx5::queue::{ring_doorbell, update_doorbell_record};
use doorbell_kernels::mlx5::wqe::{write_wqe, FLAG_FENCE, FLAG_SIGNALED, FLAG_SOLICITED};
use doorbell_kernels::mlx5::{CtrlSeg, DataSeg, QpHandle, RaddrSeg, WqeOp, WqeRequest, SEND_WQE_BB};
use doorbell_softnic::engine::access;
use doorbell_softnic::host::{CqMemory, CqReader, Cqe, HostBuffer, QpMemory};
use doorbell_softnic::{FabricConfig, MemoryRegion, QueuePair, RdmaDevice, SoftCq, SoftDevice, SoftFabric, SoftMr, SoftPd, SoftQp};
use rand::{Rng, SeedableRng};

pub const GUARD: usize = 256;
pub const CANARY: u8 = 0xa5;

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A buffer with `GUARD` canary bytes on both sides of the registered part.
pub struct Region {
    pub buf: HostBuffer,
    pub len: usize,
    pub mr: Option<SoftMr>,
}

impl Region {
    pub fn new(dev: &SoftDevice, pd: &SoftPd, len: usize, flags: u32) -> Region {
        let buf = HostBuffer::zeroed(len + 2 * GUARD, 64);
        buf.write(0, &vec![CANARY; len + 2 * GUARD]);
        buf.write(GUARD, &vec![0; len]);
        // SAFETY: the buffer outlives the region (field order: mr dropped first
        // is not guaranteed, so Drop below deregisters explicitly).
        let mr = unsafe { dev.reg_mr(pd, buf.as_ptr().add(GUARD), len, flags).unwrap() };
        Region { buf, len, mr: Some(mr) }
    }

    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64 + GUARD as u64
    }
    pub fn key(&self) -> u32 {
        self.mr.as_ref().unwrap().lkey()
    }
    pub fn bytes(&self) -> Vec<u8> {
        self.buf.to_vec()[GUARD..GUARD + self.len].to_vec()
    }
    pub fn fill(&self, data: &[u8]) {
        assert!(data.len() <= self.len);
        self.buf.write(GUARD, data);
    }
    pub fn write_at(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        self.buf.write(GUARD + off, data);
    }
    pub fn u64_at(&self, off: usize) -> u64 {
        let b = self.buf.to_vec();
        u64::from_ne_bytes(b[GUARD + off..GUARD + off + 8].try_into().unwrap())
    }
    /// Every canary byte on both sides is intact.
    pub fn check_canaries(&self) {
        let b = self.buf.to_vec();
        for (i, &x) in b[..GUARD].iter().chain(&b[GUARD + self.len..]).enumerate() {
            assert_eq!(x, CANARY, "canary byte {i} around a region of {} bytes was overwritten", self.len);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.mr.take();
    }
}

/// One end of a connection: its QP, CQs, memory and a poster.
pub struct End {
    pub dev: SoftDevice,
    pub pd: SoftPd,
    pub qp: SoftQp,
    pub scq: SoftCq,
    pub rcq: SoftCq,
    pub mem: QpMemory,
    pub scq_mem: CqMemory,
    pub rcq_mem: CqMemory,
    pub sq: Poster,
    pub send_cqes: CqReader,
    pub recv_cqes: CqReader,
}

impl End {
    pub fn new(dev: &SoftDevice, pd: &SoftPd, sq_wqebbs: u32, cq_entries: u32, uar: bool) -> End {
        let mem = if uar {
            QpMemory::new(sq_wqebbs, 16, 4)
        } else {
            QpMemory::new(sq_wqebbs, 16, 4).without_uar()
        };
        let scq_mem = CqMemory::new(cq_entries);
        let rcq_mem = CqMemory::new(cq_entries);
        // SAFETY: the memory lives in the End, dropped after the objects
        // (fields drop in declaration order: qp, scq, rcq before mem).
        let (scq, rcq) = unsafe { (dev.create_cq(scq_mem.ring()).unwrap(), dev.create_cq(rcq_mem.ring()).unwrap()) };
        // SAFETY: as above.
        let qp = unsafe { dev.create_qp(pd, &scq, &rcq, mem.rings()).unwrap() };
        let sq = Poster {
            h: mem.handle(qp.qpn(), &scq_mem),
            pi: 0,
        };
        let send_cqes = scq.reader();
        let recv_cqes = rcq.reader();
        End {
            dev: dev.clone(),
            pd: pd.clone(),
            qp,
            scq,
            rcq,
            mem,
            scq_mem,
            rcq_mem,
            sq,
            send_cqes,
            recv_cqes,
        }
    }
}

/// Two ports of one fabric, one RC connection between them.
pub struct Rig {
    pub fabric: SoftFabric,
    pub a: End,
    pub b: End,
}

pub const ALL_ACCESS: u32 = access::ALL;

impl Rig {
    pub fn new(cfg: FabricConfig) -> Rig {
        Rig::with(cfg, None, 64, 64, true)
    }

    pub fn with(cfg: FabricConfig, link: Option<doorbell_softnic::engine::LinkModel>, sq_wqebbs: u32, cq_entries: u32, uar: bool) -> Rig {
        let fabric = SoftFabric::new(cfg);
        let da = fabric.open_device(link).unwrap();
        let db = fabric.open_device(link).unwrap();
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let a = End::new(&da, &pa, sq_wqebbs, cq_entries, uar);
        let b = End::new(&db, &pb, sq_wqebbs, cq_entries, uar);
        a.qp.connect(b.qp.endpoint(), ALL_ACCESS).unwrap();
        b.qp.connect(a.qp.endpoint(), ALL_ACCESS).unwrap();
        Rig { fabric, a, b }
    }

    /// Polls until `end`'s send CQ yields a CQE (virtual time jumps; 1 s budget).
    pub fn next_send_cqe(&mut self, which: Which) -> Cqe {
        self.next_cqe(which, false)
    }

    /// Polls until `end`'s receive CQ yields a CQE (as [`Self::next_send_cqe`]).
    pub fn next_recv_cqe(&mut self, which: Which) -> Cqe {
        self.next_cqe(which, true)
    }

    fn next_cqe(&mut self, which: Which, recv: bool) -> Cqe {
        let fabric = self.fabric.clone();
        let end = self.end(which);
        let (what, cq) = if recv {
            ("a receive CQE", &mut end.recv_cqes)
        } else {
            ("a send CQE", &mut end.send_cqes)
        };
        let mut got = None;
        fabric
            .run_until(what, 1_000_000_000, || {
                got = cq.poll();
                got.is_some()
            })
            .unwrap();
        got.unwrap()
    }

    pub fn end(&mut self, which: Which) -> &mut End {
        match which {
            Which::A => &mut self.a,
            Which::B => &mut self.b,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Which {
    A,
    B,
}

/// Writes WQEs into an SQ ring at its producer index and rings the
/// doorbell the way the device pipeline does (doorbell record, then UAR).
pub struct Poster {
    pub h: QpHandle,
    /// Producer counter, in basic blocks.
    pub pi: u32,
}

impl Poster {
    /// Writes `r` (its index and QP number filled in) as one basic block;
    /// returns its WQE counter and the doorbell value.
    pub fn write(&mut self, r: &WqeRequest) -> (u16, u64) {
        let idx = self.pi;
        let mut r = *r;
        r.wqe_index = idx as u16;
        r.qpn = self.h.qpn;
        let slot = unsafe { self.h.sq.add(((idx & (self.h.sq_size - 1)) as usize) * 16) };
        // SAFETY: the slot is inside the SQ ring.
        let head = unsafe { write_wqe(slot, &r) };
        self.pi = self.pi.wrapping_add(1);
        (idx as u16, head)
    }

    /// Writes a WQE made of raw 16-byte segments (the first is the ctrl
    /// segment, whose index/qpn/ds are filled in), wrapping at the ring's end;
    /// pads to whole basic blocks. Returns its WQE counter and doorbell value.
    pub fn write_segments(&mut self, mut ctrl: CtrlSeg, rest: &[[u32; 4]], ds: Option<u8>) -> (u16, u64) {
        let idx = self.pi;
        ctrl.wqe_index = idx as u16;
        ctrl.qpn = self.h.qpn;
        let nseg = 1 + rest.len();
        ctrl.ds = ds.unwrap_or(nseg as u8);
        let ring_bytes = self.h.sq_size as usize * SEND_WQE_BB;
        let base = self.h.sq as *mut u8;
        let c = ctrl.to_words();
        let segs: Vec<[u32; 4]> = std::iter::once(c).chain(rest.iter().copied()).collect();
        for (k, s) in segs.iter().enumerate() {
            let off = (idx as usize * SEND_WQE_BB + k * 16) % ring_bytes;
            // SAFETY: inside the ring.
            unsafe { std::ptr::write_volatile(base.add(off) as *mut [u32; 4], *s) };
        }
        let bbs = nseg.div_ceil(4) as u32;
        self.pi = self.pi.wrapping_add(bbs);
        (idx as u16, c[0] as u64 | (c[1] as u64) << 32)
    }

    /// Publishes everything written so far and rings the doorbell with
    /// `head` (the last WQE's doorbell value).
    pub fn ring(&self, head: u64) {
        // SAFETY: the handle's doorbell record and UAR word are valid.
        unsafe {
            update_doorbell_record(&self.h, self.pi);
            ring_doorbell(&self.h, head);
        }
    }

    /// `write` then `ring`.
    pub fn post(&mut self, r: &WqeRequest) -> u16 {
        let (idx, head) = self.write(r);
        self.ring(head);
        idx
    }
}

/// An RDMA WRITE of `len` bytes from `src` to `dst`, both at offset `off`.
pub fn write_req(src: &Region, dst: &Region, off: u64, len: u32, signaled: bool) -> WqeRequest {
    req(
        WqeOp::Write,
        src.addr() + off,
        src.key(),
        dst.addr() + off,
        dst.key(),
        len,
        signaled,
    )
}

pub fn req(op: WqeOp, laddr: u64, lkey: u32, raddr: u64, rkey: u32, len: u32, signaled: bool) -> WqeRequest {
    WqeRequest {
        op: op as u32,
        laddr,
        lkey,
        raddr,
        rkey,
        len,
        flags: if signaled { FLAG_SIGNALED } else { 0 },
        ..WqeRequest::default()
    }
}

pub const SIGNALED: u16 = FLAG_SIGNALED;
pub const FENCE: u16 = FLAG_FENCE;
pub const SOLICITED: u16 = FLAG_SOLICITED;

pub fn raddr_seg(raddr: u64, rkey: u32) -> [u32; 4] {
    RaddrSeg { raddr, rkey }.to_words()
}

pub fn data_seg(addr: u64, lkey: u32, len: u32) -> [u32; 4] {
    DataSeg {
        byte_count: len,
        lkey,
        addr,
    }
    .to_words()
}

pub fn random_bytes(r: &mut impl Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| r.gen()).collect()
}

/// A virtual-time fabric config with default engine settings.
pub fn virtual_cfg() -> FabricConfig {
    FabricConfig {
        virtual_time: true,
        ..FabricConfig::default()
    }
}

pub fn expect_ok(c: Cqe) -> doorbell_kernels::mlx5::Cqe64 {
    match c {
        Cqe::Ok(c) => c,
        Cqe::Err(e) => panic!(
            "expected a success CQE, got an error CQE {e:?} (reason: {})",
            reason_of(e.vendor_err_synd)
        ),
    }
}

pub fn expect_err(c: Cqe) -> doorbell_kernels::mlx5::ErrCqe {
    match c {
        Cqe::Err(e) => e,
        Cqe::Ok(c) => panic!("expected an error CQE, got {c:?}"),
    }
}

pub fn reason_of(v: u8) -> &'static str {
    doorbell_softnic::engine::Reason::from_u8(v).description()
}

//! Shared by the wqe_*.rs tests: random requests, a QP laid out in device
//! memory, CQE images.
#![allow(dead_code)]

use doorbell::{Device, DeviceBuffer};
use doorbell_kernels::mlx5::wqe::{FLAG_FENCE, FLAG_SIGNALED, FLAG_SOLICITED};
use doorbell_kernels::mlx5::{Cqe64, ErrCqe, QpHandle, WqeOp, WqeRequest};
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A request with every field random (qpn with bits above 24 too: they
/// must be dropped).
pub fn random_request(rng: &mut impl Rng, op: WqeOp) -> WqeRequest {
    WqeRequest {
        op: op as u32,
        raddr: rng.gen(),
        laddr: rng.gen(),
        add: rng.gen(),
        compare: rng.gen(),
        swap: rng.gen(),
        qpn: rng.gen(),
        rkey: rng.gen(),
        lkey: rng.gen(),
        len: rng.gen(),
        imm: rng.gen(),
        wqe_index: rng.gen(),
        flags: rng.gen_range(0..8),
        reserved: 0,
    }
}

/// `n` random requests cycling through every op.
pub fn random_requests(seed: u64, n: usize) -> Vec<WqeRequest> {
    let mut r = rng(seed);
    (0..n).map(|i| random_request(&mut r, WqeOp::ALL[i % WqeOp::ALL.len()])).collect()
}

pub fn raw(reqs: &[WqeRequest]) -> Vec<[u64; 9]> {
    reqs.iter().map(WqeRequest::to_raw).collect()
}

#[cfg(feature = "mlx5-shim")]
pub fn shim_params(r: &WqeRequest) -> rdma_sys_ext::shim::WqeParams {
    use rdma_sys_ext::shim::RefWqeOp as S;
    let op = match r.op().unwrap() {
        WqeOp::Nop => S::Nop,
        WqeOp::Write => S::Write,
        WqeOp::WriteImm => S::WriteImm,
        WqeOp::Read => S::Read,
        WqeOp::FetchAdd => S::FetchAdd,
        WqeOp::CompareSwap => S::CompareSwap,
    };
    rdma_sys_ext::shim::WqeParams {
        op,
        wqe_index: r.wqe_index,
        qpn: r.qpn,
        raddr: r.raddr,
        rkey: r.rkey,
        laddr: r.laddr,
        lkey: r.lkey,
        len: r.len,
        imm: r.imm,
        add: r.add,
        compare: r.compare,
        swap: r.swap,
        signaled: r.flags & FLAG_SIGNALED != 0,
        fence: r.flags & FLAG_FENCE != 0,
        solicited: r.flags & FLAG_SOLICITED != 0,
    }
}

/// An mlx5 QP's memory (SQ ring, counters, doorbell records, UAR word, CQ
/// ring) in a device's memory.
pub struct TestQp {
    pub sq: DeviceBuffer<u32>,
    pub producer: DeviceBuffer<u32>,
    pub ready: DeviceBuffer<u32>,
    pub sq_dbr: DeviceBuffer<u32>,
    pub uar: DeviceBuffer<u64>,
    pub cq: DeviceBuffer<u32>,
    pub consumer: DeviceBuffer<u32>,
    pub cq_dbr: DeviceBuffer<u32>,
    pub sq_size: u32,
    pub cq_size: u32,
    pub qpn: u32,
}

impl TestQp {
    /// SQ of `sq_size` WQEBBs with producer and ready index at `start`; CQ of
    /// `cq_size` CQEs holding `cqes` (64 bytes each, the rest invalid) with
    /// the consumer index at `ci`.
    pub fn new(dev: &Device, sq_size: u32, start: u32, qpn: u32, cq_size: u32, cqes: &[[u8; 64]], ci: u32) -> TestQp {
        let mut cq_words = Vec::with_capacity(cq_size as usize * 16);
        for i in 0..cq_size as usize {
            let img = cqes.get(i).copied().unwrap_or_else(invalid_cqe);
            cq_words.extend_from_slice(&Cqe64::bytes_to_words(&img));
        }
        TestQp {
            sq: dev.alloc_zeroed(sq_size as usize * 16).unwrap(),
            producer: dev.alloc_from(&[start]).unwrap(),
            ready: dev.alloc_from(&[start]).unwrap(),
            sq_dbr: dev.alloc_zeroed(1).unwrap(),
            uar: dev.alloc_zeroed(1).unwrap(),
            cq: dev.alloc_from(&cq_words).unwrap(),
            consumer: dev.alloc_from(&[ci]).unwrap(),
            cq_dbr: dev.alloc_zeroed(1).unwrap(),
            sq_size,
            cq_size,
            qpn,
        }
    }

    pub fn handle(&mut self) -> QpHandle {
        QpHandle {
            sq: self.sq.as_mut_ptr(),
            sq_producer: self.producer.as_mut_ptr(),
            sq_ready: self.ready.as_mut_ptr(),
            sq_dbr: self.sq_dbr.as_mut_ptr(),
            uar: self.uar.as_mut_ptr(),
            cq: self.cq.as_mut_ptr(),
            cq_consumer: self.consumer.as_mut_ptr(),
            cq_dbr: self.cq_dbr.as_mut_ptr(),
            sq_size: self.sq_size,
            qpn: self.qpn,
            cq_size: self.cq_size,
            flags: 0,
        }
    }

    /// The SQ's basic blocks as bytes.
    pub fn sq_blocks(&self) -> Vec<[u8; 64]> {
        let w = self.sq.to_host().unwrap();
        w.chunks(16)
            .map(|c| {
                let mut b = [0u8; 64];
                fill(&mut b, c);
                b
            })
            .collect()
    }
}

fn fill(b: &mut [u8; 64], words: &[u32]) {
    for (i, w) in words.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
}

/// What a CQE holds before the NIC writes it: opcode INVALID, owner 0.
pub fn invalid_cqe() -> [u8; 64] {
    Cqe64 {
        opcode: 0xf,
        ..Default::default()
    }
    .to_bytes()
}

/// A requester success CQE, built with the descriptor.
pub fn req_cqe(owner: bool, wqe_counter: u16, qpn: u32, byte_cnt: u32) -> [u8; 64] {
    Cqe64 {
        opcode: 0,
        owner,
        wqe_counter,
        qpn,
        byte_cnt,
        ..Default::default()
    }
    .to_bytes()
}

/// An error CQE, built with the descriptor.
pub fn err_cqe(opcode: u8, owner: bool, wqe_counter: u16, syndrome: u8, vendor: u8, wqe_opcode: u8, qpn: u32) -> [u8; 64] {
    ErrCqe {
        opcode,
        owner,
        wqe_counter,
        syndrome,
        vendor_err_synd: vendor,
        wqe_opcode,
        qpn,
        ..Default::default()
    }
    .to_bytes()
}

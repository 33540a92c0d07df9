//! Ring memory in host memory (for host-driven use, the CPU emulator and
//! tests) and a host-side CQ poller.

use std::alloc::Layout;

use doorbell_kernels::mlx5::cq::cqe_ready;
use doorbell_kernels::mlx5::{Cqe64, ErrCqe, QpHandle, CQE_REQ_ERR, CQE_RESP_ERR, CQE_SIZE, SEND_WQE_BB};
use doorbell_kernels::ptx;

use crate::verbs::{CqRing, QpRings};

/// Zeroed host memory with a chosen alignment; freed on drop.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: plain memory; whoever shares it synchronises (the engine's
// accesses are atomic where they must be).
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` zeroed bytes (at least 1) aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> HostBuffer {
        let layout = Layout::from_size_align(len.max(1), align.max(1)).expect("a power-of-two alignment");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        HostBuffer { ptr, layout }
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether it is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A copy of the contents (racy while a NIC writes it; read after the
    /// completion that covers the bytes).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        // SAFETY: `len` bytes are allocated at `ptr`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, v.as_mut_ptr(), v.len()) };
        v
    }

    /// Copies `data` in at byte `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            offset.checked_add(data.len()).is_some_and(|e| e <= self.len()),
            "write past the buffer"
        );
        // SAFETY: bounds checked above.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `zeroed`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A CQ's memory in host memory.
#[derive(Debug)]
pub struct CqMemory {
    /// The CQE ring.
    pub ring: HostBuffer,
    /// The doorbell record pair.
    pub dbrec: HostBuffer,
    /// Entries.
    pub entries: u32,
}

impl CqMemory {
    /// Memory for `entries` CQEs.
    pub fn new(entries: u32) -> CqMemory {
        CqMemory {
            ring: HostBuffer::zeroed(entries as usize * CQE_SIZE, 64),
            dbrec: HostBuffer::zeroed(8, 8),
            entries,
        }
    }

    /// What `create_cq` takes.
    pub fn ring(&self) -> CqRing {
        CqRing {
            buf: self.ring.as_ptr(),
            entries: self.entries,
            dbrec: self.dbrec.as_ptr() as *mut u32,
        }
    }
}

/// A QP's memory in host memory, plus the counters of the device-side send
/// pipeline (`QpHandle`'s producer and ready indices, CQ consumer index).
#[derive(Debug)]
pub struct QpMemory {
    /// The SQ ring.
    pub sq: HostBuffer,
    /// The RQ ring.
    pub rq: HostBuffer,
    /// Doorbell record pair.
    pub dbrec: HostBuffer,
    /// UAR word.
    pub uar: HostBuffer,
    /// `[producer, ready, cq_consumer]` of a `QpHandle`.
    pub counters: HostBuffer,
    /// SQ basic blocks.
    pub sq_wqebbs: u32,
    /// RQ WQEs.
    pub rq_wqes: u32,
    /// Scatter entries per receive WQE.
    pub rq_max_sge: u32,
    /// Whether `rings()` names the UAR word.
    pub with_uar: bool,
}

impl QpMemory {
    /// Memory for an SQ of `sq_wqebbs` basic blocks and an RQ of `rq_wqes`
    /// receive WQEs of `rq_max_sge` entries, with a UAR word.
    pub fn new(sq_wqebbs: u32, rq_wqes: u32, rq_max_sge: u32) -> QpMemory {
        QpMemory {
            sq: HostBuffer::zeroed(sq_wqebbs as usize * SEND_WQE_BB, 64),
            rq: HostBuffer::zeroed(rq_wqes as usize * rq_max_sge as usize * 16, 64),
            dbrec: HostBuffer::zeroed(8, 8),
            uar: HostBuffer::zeroed(8, 8),
            counters: HostBuffer::zeroed(16, 8),
            sq_wqebbs,
            rq_wqes,
            rq_max_sge,
            with_uar: true,
        }
    }

    /// As [`Self::new`], without a UAR word: the engine watches the doorbell
    /// record.
    pub fn without_uar(mut self) -> QpMemory {
        self.with_uar = false;
        self
    }

    /// What `create_qp` takes.
    pub fn rings(&self) -> QpRings {
        QpRings {
            sq: self.sq.as_ptr(),
            sq_wqebbs: self.sq_wqebbs,
            rq: if self.rq_wqes == 0 {
                std::ptr::null_mut()
            } else {
                self.rq.as_ptr()
            },
            rq_wqes: self.rq_wqes,
            rq_max_sge: self.rq_max_sge,
            dbrec: self.dbrec.as_ptr() as *mut u32,
            uar: if self.with_uar {
                self.uar.as_ptr() as *mut u64
            } else {
                std::ptr::null_mut()
            },
        }
    }

    /// The device-side handle (`doorbell_kernels::mlx5::QpHandle`) for
    /// posting to this QP with the warp send pipeline and polling `cq` with
    /// `poll_cq`. A UAR-less QP gets a scratch UAR word the engine ignores.
    pub fn handle(&self, qpn: u32, cq: &CqMemory) -> QpHandle {
        let c = self.counters.as_ptr() as *mut u32;
        QpHandle {
            sq: self.sq.as_ptr() as *mut u32,
            // SAFETY (the three adds): inside the 16-byte counter buffer.
            sq_producer: c,
            sq_ready: unsafe { c.add(1) },
            sq_dbr: unsafe { (self.dbrec.as_ptr() as *mut u32).add(1) },
            uar: self.uar.as_ptr() as *mut u64,
            cq: cq.ring.as_ptr() as *mut u32,
            cq_consumer: unsafe { c.add(2) },
            cq_dbr: cq.dbrec.as_ptr() as *mut u32,
            sq_size: self.sq_wqebbs,
            qpn,
            cq_size: cq.entries,
            flags: 0,
        }
    }
}

/// A decoded CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cqe {
    /// A success CQE (`MLX5_CQE_REQ`, `RESP_WR_IMM`, `RESP_SEND`).
    Ok(Cqe64),
    /// An error CQE (`MLX5_CQE_REQ_ERR`, `MLX5_CQE_RESP_ERR`).
    Err(ErrCqe),
}

impl Cqe {
    /// `wqe_counter`.
    pub fn wqe_counter(&self) -> u16 {
        match self {
            Cqe::Ok(c) => c.wqe_counter,
            Cqe::Err(e) => e.wqe_counter,
        }
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        match self {
            Cqe::Ok(c) => c.qpn,
            Cqe::Err(e) => e.qpn,
        }
    }
}

/// Host-side CQ poller (the host's `ibv_poll_cq`): reads CQEs in order
/// with the owner-bit phase, decodes them with the `#[descriptor]`
/// decoders, and publishes the consumer index in the doorbell record.
#[derive(Debug)]
pub struct CqReader {
    ring: CqRing,
    ci: u32,
}

// SAFETY: the ring is memory the CQ's creator keeps valid; one reader
// consumes it.
unsafe impl Send for CqReader {}

impl CqReader {
    /// A reader of `ring` from consumer index 0.
    ///
    /// # Safety
    /// The ring stays valid while the reader is used, and nothing else
    /// consumes it.
    pub unsafe fn new(ring: CqRing) -> CqReader {
        CqReader { ring, ci: 0 }
    }

    /// CQEs consumed.
    pub fn consumed(&self) -> u32 {
        self.ci
    }

    /// The next CQE, if the NIC wrote it.
    pub fn poll(&mut self) -> Option<Cqe> {
        let slot = (self.ci & (self.ring.entries - 1)) as usize;
        // SAFETY: the slot is inside the ring (new's contract).
        let p = unsafe { self.ring.buf.add(slot * CQE_SIZE) } as *mut u32;
        // SAFETY: as above. Acquire pairs with the engine's release of word 15.
        let last = unsafe { ptx::ld_acquire_sys_u32(p.add(15)) };
        if !cqe_ready((last >> 24) as u8, self.ci, self.ring.entries) {
            return None;
        }
        let mut w = [0u32; 16];
        for (i, x) in w.iter_mut().enumerate().take(15) {
            // SAFETY: as above.
            *x = unsafe { std::ptr::read_volatile(p.add(i)) };
        }
        w[15] = last;
        self.ci = self.ci.wrapping_add(1);
        if !self.ring.dbrec.is_null() {
            // SAFETY: new's contract.
            unsafe { ptx::st_release_sys_u32(self.ring.dbrec, (self.ci & 0xff_ffff).to_be()) };
        }
        let opcode = (last >> 28) as u8;
        Some(if opcode == CQE_REQ_ERR || opcode == CQE_RESP_ERR {
            Cqe::Err(ErrCqe::from_words(&w))
        } else {
            Cqe::Ok(Cqe64::from_words(&w))
        })
    }
}

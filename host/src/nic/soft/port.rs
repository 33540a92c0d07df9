//! The soft NIC port's tables in device memory: the fabric's handle on a
//! running engine kernel's tables ([`DevicePort`]), and the check that the
//! engine's view of every QP's rings agrees with the kernels' QP table.

use doorbell_kernels::transport::ibgda::IbgdaQp;
use doorbell_softnic::engine::resident::EngineCtl;
use doorbell_softnic::engine::{EngineConfig, MrEntry, Port};
use doorbell_softnic::host::ResidentPort;

use super::ENGINE_WAIT;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;

/// This port's live tables in device memory, for the fabric (statistics,
/// the error log, new regions, fault configuration).
pub(super) struct DevicePort {
    pub(super) device: Device,
    pub(super) port: u64,
    pub(super) ctl: u64,
    /// The engine's blocks: control blocks at `ctl`, side by side.
    pub(super) blocks: u32,
    pub(super) lid: u16,
}

impl DevicePort {
    fn write(&self, addr: u64, bytes: &[u8], what: &'static str) -> doorbell_softnic::Result<()> {
        // A driver copy while the engine runs: logged on both sides, so a
        // copy that waits behind a kernel shows in a stalled run's log.
        let t0 = std::time::Instant::now();
        tracing::debug!("soft NIC port LID {}: writing {what} into the running engine's tables", self.lid);
        // SAFETY: `addr` lies in this port's table or control block (the
        // callers compute it from field offsets).
        let r = unsafe { self.device.inner.write(addr, bytes) }.map_err(|e| doorbell_softnic::Error::ResidentWrite {
            lid: self.lid,
            what,
            why: e.to_string(),
        });
        tracing::debug!("soft NIC port LID {}: {what} written in {} us", self.lid, t0.elapsed().as_micros());
        r
    }
}

pub(super) fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: plain #[repr(C)] data read as bytes.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

impl ResidentPort for DevicePort {
    fn read_port(&self, into: &mut Port) -> doorbell_softnic::Result<()> {
        let mut b = vec![0u8; std::mem::size_of::<Port>()];
        // SAFETY: the whole port table.
        unsafe { self.device.inner.read(self.port, &mut b) }.map_err(|e| doorbell_softnic::Error::ResidentWrite {
            lid: self.lid,
            what: "port tables (reading)",
            why: e.to_string(),
        })?;
        // SAFETY: Port is plain #[repr(C)] data; these bytes are one.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), into as *mut Port as *mut u8, b.len()) };
        Ok(())
    }

    fn write_mr(&self, slot: usize, mr: &MrEntry) -> doorbell_softnic::Result<()> {
        let at = self.port + (std::mem::offset_of!(Port, mrs) + slot * std::mem::size_of::<MrEntry>()) as u64;
        let valid = at + std::mem::offset_of!(MrEntry, valid) as u64;
        // Never a valid entry with stale fields: invalidate, write, validate.
        self.write(valid, &0u32.to_le_bytes(), "memory region")?;
        self.write(at, bytes_of(&MrEntry { valid: 0, ..*mr }), "memory region")?;
        if mr.valid != 0 {
            self.write(valid, &mr.valid.to_le_bytes(), "memory region")?;
        }
        Ok(())
    }

    fn write_config(&self, cfg: &EngineConfig) -> doorbell_softnic::Result<()> {
        self.write(
            self.ctl + std::mem::offset_of!(EngineCtl, cfg) as u64,
            bytes_of(cfg),
            "configuration",
        )?;
        let epoch_at = self.ctl + std::mem::offset_of!(EngineCtl, cfg_epoch) as u64;
        let epoch = self.read_word(epoch_at)? + 1;
        self.write(epoch_at, &epoch.to_le_bytes(), "configuration")?;
        // In force before this returns, in every block: a kernel launched
        // next sees it.
        let applied_at =
            |b: u32| self.ctl + (b as usize * std::mem::size_of::<EngineCtl>() + std::mem::offset_of!(EngineCtl, cfg_applied)) as u64;
        let t0 = std::time::Instant::now();
        loop {
            let mut seen = u64::MAX;
            for b in 0..self.blocks {
                seen = seen.min(self.read_word(applied_at(b))?);
            }
            if seen >= epoch {
                return Ok(());
            }
            if t0.elapsed() > ENGINE_WAIT {
                return Err(doorbell_softnic::Error::ResidentWrite {
                    lid: self.lid,
                    what: "configuration",
                    why: format!(
                        "the engine kernel did not take it within {} s (it applied epoch {seen}, not {epoch})",
                        ENGINE_WAIT.as_secs()
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

impl DevicePort {
    /// One 8-byte word of the control block.
    fn read_word(&self, addr: u64) -> doorbell_softnic::Result<u64> {
        let mut b = [0u8; 8];
        // SAFETY: `addr` is a word of this port's control block (the
        // callers compute it from field offsets).
        unsafe { self.device.inner.read(addr, &mut b) }.map_err(|x| doorbell_softnic::Error::ResidentWrite {
            lid: self.lid,
            what: "configuration",
            why: x.to_string(),
        })?;
        Ok(u64::from_le_bytes(b))
    }
}

/// The kernels' QP table as the device holds it.
pub(super) fn read_qp_table(dev: &Device, table: &DeviceBuffer<u64>, nqps: usize) -> Result<Vec<IbgdaQp>> {
    let mut b = vec![0u8; nqps * std::mem::size_of::<IbgdaQp>()];
    // SAFETY: the table buffer holds `nqps` entries; no kernel uses it yet.
    unsafe { dev.read_raw(table.as_raw(), &mut b)? };
    Ok((0..nqps)
        // SAFETY: IbgdaQp is plain #[repr(C)] data; entry `i` lies in `b`.
        .map(|i| unsafe { std::ptr::read_unaligned((b.as_ptr() as *const IbgdaQp).add(i)) })
        .collect())
}

/// Logs each QP's SQ, doorbell record, UAR word and CQ as the engine's
/// port table holds them and as the kernels' QP table does, and fails
/// when they differ: the engine would watch words no kernel writes.
pub(super) fn check_ring_addresses(rank: usize, port: &Port, kernel: &[IbgdaQp]) -> Result<()> {
    for (i, k) in kernel.iter().enumerate() {
        let h = &k.qp;
        let Some(q) = port.qps.iter().find(|q| q.in_use() && q.qpn == h.qpn) else {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}) of the kernels' QP table is not in the soft NIC engine's port table; the engine would never see its doorbells",
                h.qpn, k.peer
            )));
        };
        let cq = port
            .cqs
            .get(q.send_cq as usize)
            .copied()
            .unwrap_or(doorbell_softnic::engine::CqEntry::EMPTY);
        let pairs: [(&str, u64, u64); 7] = [
            ("SQ", q.sq as u64, h.sq as u64),
            ("send doorbell record", q.dbrec.wrapping_add(1) as u64, h.sq_dbr as u64),
            ("UAR word", q.uar as u64, h.uar as u64),
            ("CQ ring", cq.ring as u64, h.cq as u64),
            ("CQ doorbell record", cq.dbrec as u64, h.cq_dbr as u64),
            ("SQ size", q.sq_wqebbs as u64, h.sq_size as u64),
            ("CQ size", cq.entries as u64, h.cq_size as u64),
        ];
        tracing::debug!(
            "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}): SQ {:#x}, doorbell record {:#x}, UAR {:#x}, CQ {:#x} \
             (CQ doorbell record {:#x}) in the engine's table; kernel handle {}",
            h.qpn,
            k.peer,
            pairs[0].1,
            pairs[1].1,
            pairs[2].1,
            pairs[3].1,
            pairs[4].1,
            if pairs.iter().all(|p| p.1 == p.2) { "agrees" } else { "DIFFERS" }
        );
        if let Some((what, e, kh)) = pairs.iter().find(|p| p.1 != p.2) {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}): the kernels' handle has {what} {kh:#x}, the soft NIC \
                 engine's port table {e:#x}; the engine would watch other words than the kernels write (a set-up bug: the \
                 two tables must be built from the same ring addresses)",
                h.qpn, k.peer
            )));
        }
        if q.state() != doorbell_softnic::engine::QpState::Rts {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}) is in {:?}, not RTS, in the engine's table; \
                 the engine would ignore its doorbells",
                h.qpn,
                k.peer,
                q.state()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use doorbell_kernels::mlx5::QpHandle;
    use doorbell_softnic::engine::tables::{QP_CONNECTED, QP_IN_USE};
    use doorbell_softnic::engine::{CqEntry, LinkModel, QpEntry};

    /// One QP in RTS with its CQ, in the engine's table and in the
    /// kernels' handle, built from the same ring addresses.
    fn views() -> (Box<Port>, IbgdaQp) {
        let (sq, cq, dbr, uar) = (0x1000u64, 0x5000u64, 0x9000u64, 0x9010u64);
        let mut port = Box::new(Port::new(1, LinkModel::OFF));
        port.cqs[0] = CqEntry {
            ring: cq as *mut u8,
            dbrec: (dbr + 8) as *const u32,
            entries: 64,
            cqn: 1,
            valid: 1,
            ..CqEntry::EMPTY
        };
        port.qps[3] = QpEntry {
            sq: sq as *mut u8,
            dbrec: dbr as *mut u32,
            uar: uar as *const u64,
            qpn: 0x103,
            state: doorbell_softnic::engine::QpState::Rts as u32,
            sq_wqebbs: 64,
            flags: QP_IN_USE | QP_CONNECTED,
            ..QpEntry::EMPTY
        };
        let k = IbgdaQp {
            qp: QpHandle {
                sq: sq as *mut u32,
                sq_producer: std::ptr::null_mut(),
                sq_ready: std::ptr::null_mut(),
                sq_dbr: (dbr + 4) as *mut u32,
                uar: uar as *mut u64,
                cq: cq as *mut u32,
                cq_consumer: std::ptr::null_mut(),
                cq_dbr: (dbr + 8) as *mut u32,
                sq_size: 64,
                qpn: 0x103,
                cq_size: 64,
                flags: 0,
            },
            state: std::ptr::null_mut(),
            scratch: std::ptr::null_mut(),
            scratch_lkey: 0,
            peer: 1,
            remote_base: 0,
            rkey: 0,
            _pad: 0,
            _reserved: 0,
        };
        (port, k)
    }

    #[test]
    fn ring_addresses_that_agree_pass_and_each_mismatch_is_named() {
        let (port, k) = views();
        check_ring_addresses(0, &port, &[k]).expect("the same addresses");
        let mut uar = k;
        uar.qp.uar = 0x9018 as *mut u64;
        let e = check_ring_addresses(0, &port, &[uar]).expect_err("another UAR word").to_string();
        assert!(e.contains("UAR word 0x9018") && e.contains("0x9010"), "{e}");
        let mut dbr = k;
        dbr.qp.sq_dbr = 0x9000 as *mut u32;
        let e = check_ring_addresses(0, &port, &[dbr]).expect_err("the receive counter").to_string();
        assert!(e.contains("send doorbell record"), "{e}");
        let mut cq = k;
        cq.qp.cq = 0x5040 as *mut u32;
        let e = check_ring_addresses(0, &port, &[cq]).expect_err("another CQ").to_string();
        assert!(e.contains("CQ ring"), "{e}");
        let mut qpn = k;
        qpn.qp.qpn = 0x104;
        let e = check_ring_addresses(0, &port, &[qpn]).expect_err("an unknown QP").to_string();
        assert!(e.contains("not in the soft NIC"), "{e}");
        let (mut init, k) = views();
        init.qps[3].state = doorbell_softnic::engine::QpState::Init as u32;
        let e = check_ring_addresses(0, &init, &[k]).expect_err("a QP not in RTS").to_string();
        assert!(e.contains("not RTS"), "{e}");
    }
}

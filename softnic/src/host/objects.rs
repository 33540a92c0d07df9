//! The verbs objects a device hands out, past their creation: memory
//! regions (keys, deregistration that the resident engine may refuse),
//! completion queues (events, the reader), queue pairs (receive WQEs, the
//! state machine, connection) and their teardown.

use super::*;

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl SoftMr {
    /// Deregisters the region, reporting whether the engine that checks
    /// its key took it: the key is invalidated in the engine's tables
    /// first (a resident engine's, through
    /// [`ResidentPort::write_mr`]), and only then in the fabric's. On
    /// success no engine pass touches the memory any more and it may be
    /// freed. On failure nothing changed — the region is registered as
    /// before, everywhere — and the error gives the region back: keep its
    /// memory allocated, and deregister again (or stop the engine, take
    /// the port back with [`SoftDevice::set_resident`], then drop it).
    /// Dropping a `SoftMr` deregisters it too, but cannot report a failure
    /// (see [`SoftDevice::undead_regions`]).
    pub fn deregister(self) -> std::result::Result<(), DeregisterError> {
        match self.try_deregister() {
            Ok(()) => {
                // Its entry is gone: the drop finds nothing to do.
                drop(self);
                Ok(())
            }
            Err(error) => Err(DeregisterError { mr: self, error }),
        }
    }

    /// Invalidates the key where it is checked, then in the fabric's
    /// table; on failure changes nothing.
    fn try_deregister(&self) -> Result<()> {
        let mut st = self.dev.lock();
        if st.ports[self.dev.port].mrs[self.slot].key != self.key {
            return Ok(());
        }
        if let Some(r) = st.resident.get(self.dev.port).cloned().flatten() {
            r.write_mr(self.slot, &MrEntry::EMPTY).map_err(|e| Error::Deregistration {
                lid: self.dev.lid(),
                key: self.key,
                addr: self.addr,
                len: self.len,
                why: e.to_string(),
            })?;
        }
        self.dev.port_mut(&mut st).mrs[self.slot] = MrEntry::EMPTY;
        Ok(())
    }
}

/// A deregistration the engine did not take ([`SoftMr::deregister`]): the
/// region is still registered, its memory must stay allocated.
#[derive(Debug)]
pub struct DeregisterError {
    mr: SoftMr,
    error: Error,
}

impl DeregisterError {
    /// Why ([`Error::Deregistration`]).
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The region, still registered: deregister it again later.
    pub fn into_region(self) -> SoftMr {
        self.mr
    }
}

impl std::fmt::Display for DeregisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for DeregisterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        if self.try_deregister().is_err() {
            // The engine still accepts the key and nobody can be told
            // here: keep the entry valid (the slot is not reused, the
            // fabric's view stays the engine's) and list it, so
            // `undead_regions` reports it and taking the port back or a
            // retry ends it.
            let mut st = self.dev.lock();
            st.stuck[self.dev.port].push((self.slot, self.key));
        }
    }
}

impl SoftCq {
    /// Arms the CQ: the next completion (with `solicited_only`, the next
    /// solicited or error completion) fires an event ([`Self::events`]).
    pub fn req_notify(&self, solicited_only: bool) {
        let mut st = self.dev.lock();
        self.dev.port_mut(&mut st).cqs[self.slot].armed = if solicited_only { 2 } else { 1 };
    }

    /// Completion events fired so far.
    pub fn events(&self) -> u32 {
        let mut st = self.dev.lock();
        self.dev.port_mut(&mut st).cqs[self.slot].events
    }

    /// A host-side poller of this CQ.
    pub fn reader(&self) -> CqReader {
        // SAFETY: create_cq's contract keeps the ring valid while `self` lives;
        // the reader is documented to be used only meanwhile.
        unsafe { CqReader::new(self.ring) }
    }
}

impl CompletionQueue for SoftCq {
    fn cqn(&self) -> u32 {
        self.cqn
    }
    fn ring(&self) -> CqRing {
        self.ring
    }
}

impl Drop for SoftCq {
    fn drop(&mut self) {
        let mut st = self.dev.lock();
        self.dev.port_mut(&mut st).cqs[self.slot] = CqEntry::EMPTY;
    }
}

/// One scatter entry of a receive WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Local key.
    pub lkey: u32,
}

impl SoftQp {
    /// Posts a receive WQE with the scatter list `sges` (writes it into the
    /// RQ ring in mlx5's layout and publishes the receive counter in the
    /// doorbell record). Returns the receive WQE's counter (its CQE's
    /// `wqe_counter`, mod 2^16).
    pub fn post_recv(&self, sges: &[Sge]) -> Result<u32> {
        let r = self.rings;
        if r.rq_wqes == 0 {
            return Err(Error::NoReceiveQueue { qpn: self.qpn });
        }
        if sges.len() > r.rq_max_sge as usize {
            return Err(Error::TooManyScatterEntries {
                qpn: self.qpn,
                given: sges.len(),
                max: r.rq_max_sge,
            });
        }
        let consumed = {
            let mut st = self.dev.lock();
            self.dev.port_mut(&mut st).qps[self.slot].rq_ci
        };
        let pi = self.rq_pi.load(Ordering::Acquire);
        if pi.wrapping_sub(consumed) >= r.rq_wqes {
            return Err(Error::ReceiveQueueFull {
                qpn: self.qpn,
                size: r.rq_wqes,
            });
        }
        let segs: Vec<DataSeg> = sges
            .iter()
            .map(|s| DataSeg {
                byte_count: s.len,
                lkey: s.lkey,
                addr: s.addr,
            })
            .collect();
        // SAFETY: create_qp's contract keeps the RQ ring and doorbell record
        // valid; the slot at `pi` is free (checked above).
        unsafe {
            rq::write_wqe(r.rq, r.rq_wqes, r.rq_max_sge, pi, &segs);
            rq::publish(r.dbrec, pi.wrapping_add(1));
        }
        self.rq_pi.store(pi.wrapping_add(1), Ordering::Release);
        Ok(pi)
    }

    /// The device it lives on.
    pub fn device(&self) -> &SoftDevice {
        &self.dev
    }
}

impl QueuePair for SoftQp {
    type Error = Error;

    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            lid: self.dev.lid(),
            qpn: self.qpn,
        }
    }

    fn rings(&self) -> QpRings {
        self.rings
    }

    fn state(&self) -> QpState {
        self.dev.qp_state(self.slot)
    }

    fn modify_to_init(&self, remote_access: u32) -> Result<()> {
        self.dev.modify(self.slot, QpState::Init, |_, qp| {
            qp.access = remote_access & (access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC);
            Ok(())
        })
    }

    fn modify_to_rtr(&self, remote: QpEndpoint) -> Result<()> {
        self.rtr_to(remote, None)
    }

    fn modify_to_rts(&self) -> Result<()> {
        self.dev.modify(self.slot, QpState::Rts, |_, _| Ok(()))
    }

    fn modify_to_err(&self) -> Result<()> {
        self.dev.modify(self.slot, QpState::Err, |_, _| Ok(()))
    }

    fn modify_to_reset(&self) -> Result<()> {
        self.rq_pi.store(0, Ordering::Release);
        self.dev.modify(self.slot, QpState::Reset, |_, _| Ok(()))
    }
}

impl SoftQp {
    /// The QP's slot in its port's table: what the owner of a port in
    /// another process's fabric sends along with [`QueuePair::endpoint`]
    /// for [`Self::connect_remote`].
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// INIT → RTR → RTS toward `remote`, whose QP sits in `slot` of its
    /// port's table ([`Self::slot`] on its side). A port this fabric
    /// holds is checked as [`QueuePair::connect`] checks it (the QP
    /// exists, with that number, in that slot); a port of another
    /// process's fabric ([`SoftFabric::open_device_at`]) is taken on
    /// trust, as an RC NIC takes an address vector: its engine checks at
    /// run time that the peer QP is connected back and ready, and a WQE
    /// toward one that is not ends in a transport-retry error.
    pub fn connect_remote(&self, remote: QpEndpoint, slot: usize, remote_access: u32) -> Result<()> {
        self.modify_to_init(remote_access)?;
        self.rtr_to(remote, Some(slot))?;
        self.modify_to_rts()
    }

    /// INIT → RTR toward `remote` (in `slot`, when the caller knows it).
    fn rtr_to(&self, remote: QpEndpoint, slot: Option<usize>) -> Result<()> {
        self.dev.modify(self.slot, QpState::Rtr, |st, qp| {
            let not_found = || Error::NoSuchRemote {
                lid: remote.lid,
                qpn: remote.qpn,
            };
            let pp = (remote.lid as usize).checked_sub(1).ok_or_else(not_found)?;
            if pp >= MAX_PORTS {
                return Err(not_found());
            }
            let pq = match (st.ports.get(pp).filter(|p| p.valid != 0), slot) {
                // A port of this fabric: the QP must be there.
                (Some(port), _) => {
                    let at = port
                        .qps
                        .iter()
                        .position(|q| q.in_use() && q.qpn == remote.qpn)
                        .ok_or_else(not_found)?;
                    if slot.is_some_and(|s| s != at) {
                        return Err(not_found());
                    }
                    at
                }
                // Another process's port: its owner named the slot.
                (None, Some(s)) if s < MAX_QPS => s,
                _ => return Err(not_found()),
            };
            qp.peer_port = pp as u32;
            qp.peer_qp = pq as u32;
            qp.flags |= QP_CONNECTED;
            // The peer's next receive WQE is the one its engine completes
            // next (0 for a port of another process: a fresh QP's).
            qp.peer_rq_ci = st.ports.get(pp).filter(|p| p.valid != 0).map_or(0, |p| p.qps[pq].rq_ci);
            Ok(())
        })
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut st = self.dev.lock();
        self.dev.port_mut(&mut st).qps[self.slot] = QpEntry::EMPTY;
    }
}

//! The host wrapper: a fabric of soft NIC devices behind one lock, the
//! verbs-shaped setup ([`crate::verbs`]) for them, an engine thread per
//! device, and a clock (real or virtual).

mod fabric;
mod objects;
mod resident;
mod rings;

pub use objects::{DeregisterError, Sge};
pub use resident::ResidentPort;
pub use rings::{CqMemory, CqReader, Cqe, HostBuffer, QpMemory};

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use doorbell_kernels::mlx5::DataSeg;

use crate::engine::tables::{key_slot, make_key, Inbox, MAX_CQS, MAX_MRS, MAX_QPS, QP_CONNECTED, QP_IN_USE};
use crate::engine::{
    access, cqe, mem, parse_link, poll_port, rq, CqEntry, EngineConfig, EngineRng, ErrorRecord, LinkModel, MrEntry, PollReport, Port,
    PortStats, QpEntry, QpState, ThreadMover,
};
use crate::error::{Error, Result};
use crate::verbs::{CompletionQueue, CqRing, MemoryRegion, QpEndpoint, QpRings, QueuePair, RdmaDevice};

/// The environment variable holding the default link model.
pub const LINK_ENV: &str = "DOORBELL_SOFTNIC_LINK";

/// Most devices (ports) in one fabric.
pub const MAX_PORTS: usize = crate::engine::MAX_PORTS;

/// Reads [`LINK_ENV`]: unset or `off` → `None`; otherwise it must parse
/// (`400gbps,2us`), and an error names the variable and the accepted forms.
pub fn link_from_env() -> Result<Option<LinkModel>> {
    match std::env::var(LINK_ENV) {
        Ok(v) => link_from_str(LINK_ENV, &v),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::LinkSyntax {
            variable: LINK_ENV,
            value: v.to_string_lossy().into_owned(),
            reason: crate::engine::LinkParseError::Shape,
        }),
    }
}

/// Parses a link description (see [`crate::engine::parse_link`]); errors
/// name `variable`.
pub fn link_from_str(variable: &'static str, s: &str) -> Result<Option<LinkModel>> {
    parse_link(s).map_err(|reason| Error::LinkSyntax {
        variable,
        value: s.to_string(),
        reason,
    })
}

/// The engine's clock.
#[derive(Debug)]
enum Clock {
    /// Nanoseconds since the fabric was made.
    Real(Instant),
    /// Whatever the owner sets.
    Virtual(AtomicU64),
}

impl Clock {
    fn now_ns(&self) -> u64 {
        match self {
            Clock::Real(t0) => t0.elapsed().as_nanos() as u64,
            Clock::Virtual(t) => t.load(Ordering::Acquire),
        }
    }
}

/// How a fabric is made.
#[derive(Clone, Copy, Debug, Default)]
pub struct FabricConfig {
    /// Timeouts, atomic reply order, faults.
    pub engine: EngineConfig,
    /// Run on a virtual clock that only [`SoftFabric::set_time_ns`],
    /// [`SoftFabric::advance_ns`] and [`SoftFabric::run_until`] move
    /// (deterministic tests of the link model and of timeouts).
    pub virtual_time: bool,
    /// The rings, doorbell records and UAR words are memory the host
    /// cannot touch (GPU memory for a GPU-resident engine): `create_cq`
    /// and `create_qp` leave them as they are — the caller fills a new CQ
    /// ring with [`crate::engine::cqe::invalid_cqe_words`] and zeroes the
    /// doorbell records and UAR words itself — and moving a QP to RTS
    /// takes its doorbell counters as zero (a fresh QP's).
    pub device_rings: bool,
}

/// The tables of every port, owned by the fabric.
struct State {
    ports: Vec<Port>,
    /// Per port: where its live tables are while an engine other than this
    /// fabric's runs it.
    resident: Vec<Option<Arc<dyn ResidentPort>>>,
    /// Per port: memory regions whose deregistration on drop did not reach
    /// the resident engine (slot, key). Their entries stay valid in the
    /// table (the engine still honours them) and their slots are not
    /// reused; [`SoftDevice::retry_deregistrations`] tries again, and
    /// taking the port back invalidates them.
    stuck: Vec<Vec<(usize, u32)>>,
    cfg: EngineConfig,
    rng: EngineRng,
    next_pd: u32,
    next_qpn: u32,
    next_cqn: u32,
    next_tag: u8,
}

// SAFETY: the raw pointers in the tables name memory the creators promised
// (through the unsafe setup calls) to keep valid for any thread; the
// tables themselves are only touched under the fabric's mutex.
unsafe impl Send for State {}

struct Shared {
    state: Mutex<State>,
    clock: Clock,
    device_rings: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain tables behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A set of soft NIC devices that can reach each other (one address
/// space: threads of a process, the CPU emulator's memory, or device
/// pointers of one GPU). Cheap to clone.
#[derive(Clone)]
pub struct SoftFabric {
    shared: Arc<Shared>,
}

/// One soft NIC device: a port of a [`SoftFabric`]. Cheap to clone.
#[derive(Clone)]
pub struct SoftDevice {
    shared: Arc<Shared>,
    port: usize,
}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftDevice").field("lid", &self.lid()).finish()
    }
}

/// A protection domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftPd {
    shared: *const (),
    port: usize,
    pdn: u32,
}

// SAFETY: `shared` is only compared, never dereferenced.
unsafe impl Send for SoftPd {}
// SAFETY: as above.
unsafe impl Sync for SoftPd {}

impl SoftPd {
    /// The protection domain number.
    pub fn pdn(&self) -> u32 {
        self.pdn
    }
}

/// A registered memory region; deregistered on drop.
#[derive(Debug)]
pub struct SoftMr {
    dev: SoftDevice,
    slot: usize,
    key: u32,
    addr: u64,
    len: usize,
}

/// A completion queue; destroyed on drop.
#[derive(Debug)]
pub struct SoftCq {
    dev: SoftDevice,
    slot: usize,
    cqn: u32,
    ring: CqRing,
}

/// An RC queue pair; destroyed on drop.
#[derive(Debug)]
pub struct SoftQp {
    dev: SoftDevice,
    slot: usize,
    qpn: u32,
    rings: QpRings,
    /// Receive WQEs posted by [`SoftQp::post_recv`] (wrapping).
    rq_pi: AtomicU32,
}

// SAFETY: the ring pointers are memory the creator keeps valid for any
// thread (create_cq / create_qp contracts); the tables are behind the lock.
unsafe impl Send for SoftCq {}
// SAFETY: as above.
unsafe impl Sync for SoftCq {}
// SAFETY: as above.
unsafe impl Send for SoftQp {}
// SAFETY: as above.
unsafe impl Sync for SoftQp {}

fn check_pow2(what: &'static str, n: u32) -> Result<()> {
    if n == 0 || !n.is_power_of_two() {
        return Err(Error::BadRing {
            what,
            why: format!("size {n} is not a power of two"),
        });
    }
    Ok(())
}

pub use crate::engine::wqe::{MAX_RQ_WQES, MAX_SQ_WQEBBS};

fn check_at_most(what: &'static str, unit: &str, n: u32, max: u32, because: &str) -> Result<()> {
    if n > max {
        return Err(Error::BadRing {
            what,
            why: format!("{n} {unit}: at most {max} ({because})"),
        });
    }
    Ok(())
}

const COUNTER_16: &str = "the doorbell record's counters have 16 bits, so a larger ring's overruns cannot be told apart";

fn check_align(what: &'static str, p: *const u8, align: usize) -> Result<()> {
    if p.is_null() || !(p as usize).is_multiple_of(align) {
        return Err(Error::BadRing {
            what,
            why: format!("address {p:p} is null or not {align}-byte aligned"),
        });
    }
    Ok(())
}

/// The first free entry of a port's table of `what` (`max` entries), or
/// [`Error::TableFull`] for the port `lid`.
fn free_slot<T>(table: &[T], free: impl Fn(&T) -> bool, lid: u16, what: &'static str, max: usize) -> Result<usize> {
    table.iter().position(free).ok_or(Error::TableFull { lid, what, max })
}

impl SoftDevice {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    fn port_mut<'a>(&self, st: &'a mut State) -> &'a mut Port {
        // The port was pushed when this device was made and ports are never removed.
        &mut st.ports[self.port]
    }

    /// Names the registered region that holds this port's rank's
    /// symmetric heap (the region starting at `heap`), so the engine
    /// writes its trace events where the heap header's trace word points
    /// ([`crate::engine::trace`]); `None` stops that. Before a
    /// GPU-resident engine takes the port (it copies the tables then).
    pub fn trace_heap(&self, heap: Option<u64>) -> Result<()> {
        let lid = self.lid();
        let mut st = self.lock();
        if st.resident.get(self.port).is_some_and(Option::is_some) {
            return Err(Error::Resident {
                lid,
                what: "naming the region the engine's trace events are found through",
            });
        }
        let port = self.port_mut(&mut st);
        port.trace_mr = match heap {
            None => 0,
            Some(base) => {
                let slot = port
                    .mrs
                    .iter()
                    .position(|m| m.valid != 0 && m.addr == base && m.len >= doorbell_kernels::trace::TRACE_OFFSET + 8)
                    .ok_or(Error::BadRegion {
                        addr: base,
                        len: 0,
                        why: "no registered region starts there with room for the heap header's trace word",
                    })?;
                slot as u32 + 1
            }
        };
        Ok(())
    }

    /// The fabric this device belongs to.
    pub fn fabric(&self) -> SoftFabric {
        SoftFabric {
            shared: self.shared.clone(),
        }
    }

    /// The port's index in its fabric.
    pub fn port_index(&self) -> usize {
        self.port
    }

    /// One engine pass over this device's QPs (deterministic tests drive
    /// the engine with this instead of a thread). Does nothing while the
    /// port is resident elsewhere ([`Self::set_resident`]).
    pub fn poll_once(&self) -> PollReport {
        self.poll_once_with(&mut ThreadMover)
    }

    /// [`Self::poll_once`] with the payload moved by `mover` instead of
    /// the host thread's `memmove`: its [`crate::engine::PayloadMover::lap`] is
    /// called between the steps of each WQE (parse, local checks, peer,
    /// remote checks, receive WQE, data, completions), which is where a
    /// profiler — or a test that plays a misbehaving producer — steps in.
    pub fn poll_once_with<M: crate::engine::PayloadMover>(&self, mover: &mut M) -> PollReport {
        let now = self.shared.clock.now_ns();
        let mut st = self.lock();
        let State {
            ports, resident, cfg, rng, ..
        } = &mut *st;
        if resident.get(self.port).is_some_and(Option::is_some) {
            return PollReport::IDLE;
        }
        // SAFETY: see SoftFabric::poll_all.
        unsafe { poll_port(ports.as_mut_slice(), self.port, now, cfg, rng, mover) }
    }

    /// A copy of this port's tables as set up here: what a GPU-resident
    /// engine starts from (copied into its memory before it is launched).
    pub fn port_image(&self) -> Box<Port> {
        let mut st = self.lock();
        Box::new(self.port_mut(&mut st).clone())
    }

    /// Hands the port to an engine that runs elsewhere (`Some`), or takes
    /// it back (`None`). While resident, this fabric's own engine
    /// ([`Self::poll_once`], [`SoftFabric::poll_all`], the thread of
    /// [`Self::spawn_engine`]) leaves the port alone; counters and the
    /// error log are read from `r`, new memory regions and configurations
    /// are written to it, and QP state changes are refused. Take the port
    /// back only once that engine has stopped.
    pub fn set_resident(&self, r: Option<Arc<dyn ResidentPort>>) {
        let mut st = self.lock();
        let back = r.is_none();
        if let Some(slot) = st.resident.get_mut(self.port) {
            *slot = r;
        }
        if back {
            // The engine that could not be told is stopped: the regions
            // whose deregistration it missed end here.
            let stuck = std::mem::take(&mut st.stuck[self.port]);
            let port = self.port_mut(&mut st);
            for (slot, key) in stuck {
                if port.mrs[slot].key == key {
                    port.mrs[slot] = MrEntry::EMPTY;
                }
            }
        }
    }

    /// Keys of memory regions dropped while this port's engine ran
    /// elsewhere and could not be told ([`ResidentPort::write_mr`]
    /// failed): that engine still accepts them, so their memory must not
    /// be freed until [`Self::retry_deregistrations`] succeeds or the
    /// engine is stopped and the port taken back. Empty in a healthy run;
    /// [`SoftMr::deregister`] reports the same failure to its caller
    /// instead.
    pub fn undead_regions(&self) -> Vec<u32> {
        self.lock().stuck[self.port].iter().map(|&(_, key)| key).collect()
    }

    /// Tells the resident engine again about every region of
    /// [`Self::undead_regions`]; those it takes are deregistered. Errors:
    /// the first write that failed again (those regions stay).
    pub fn retry_deregistrations(&self) -> Result<()> {
        let mut st = self.lock();
        let resident = st.resident.get(self.port).cloned().flatten();
        let stuck = std::mem::take(&mut st.stuck[self.port]);
        let mut first = None;
        for (slot, key) in stuck {
            if st.ports[self.port].mrs[slot].key != key {
                continue;
            }
            let r = match &resident {
                Some(r) => r.write_mr(slot, &MrEntry::EMPTY),
                None => Ok(()),
            };
            match r {
                Ok(()) => st.ports[self.port].mrs[slot] = MrEntry::EMPTY,
                Err(e) => {
                    st.stuck[self.port].push((slot, key));
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn resident(&self) -> Option<Arc<dyn ResidentPort>> {
        self.lock().resident.get(self.port).cloned().flatten()
    }

    /// The live tables: the resident engine's when there is one (read
    /// racily: counters and the log may be mid-update), else this fabric's.
    fn live_port(&self) -> Box<Port> {
        if let Some(r) = self.resident() {
            let mut p = self.port_image();
            if r.read_port(&mut p).is_ok() {
                return p;
            }
        }
        self.port_image()
    }

    /// Starts a thread that polls this device until the returned guard is
    /// dropped.
    pub fn spawn_engine(&self) -> EngineThread {
        let stop = Arc::new(AtomicBool::new(false));
        let dev = self.clone();
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(format!("softnic-lid{}", self.lid()))
            .spawn(move || {
                let mut idle = 0u32;
                while !flag.load(Ordering::Acquire) {
                    let r = dev.poll_once();
                    if r.progressed > 0 {
                        idle = 0;
                        continue;
                    }
                    idle = idle.saturating_add(1);
                    if idle < 64 {
                        std::hint::spin_loop();
                    } else if idle < 1024 {
                        std::thread::yield_now();
                    } else {
                        // Long idle: sleep, but never past the next due event.
                        let now = dev.shared.clock.now_ns();
                        let wait = r.next_event_ns.saturating_sub(now).clamp(1_000, 50_000);
                        std::thread::sleep(Duration::from_nanos(wait));
                    }
                }
            })
            .expect("spawning a thread for the soft NIC engine");
        EngineThread {
            stop,
            handle: Some(handle),
        }
    }

    /// The port's counters.
    pub fn stats(&self) -> PortStats {
        self.live_port().total_stats()
    }

    /// The error log, oldest first (at most [`crate::engine::tables::ERROR_LOG`]
    /// most recent records).
    pub fn error_log(&self) -> Vec<ErrorRecord> {
        let port = self.live_port();
        let n = port.errors_written as usize;
        let len = port.errors.len();
        let first = n.saturating_sub(len);
        (first..n).map(|i| port.errors[i % len]).collect()
    }

    /// The link model of this port.
    pub fn link(&self) -> LinkModel {
        let mut st = self.lock();
        self.port_mut(&mut st).link
    }

    fn owns(&self, pd: &SoftPd) -> Result<()> {
        if pd.shared != Arc::as_ptr(&self.shared) as *const () || pd.port != self.port {
            return Err(Error::Foreign { what: "protection domain" });
        }
        Ok(())
    }

    fn qp_state(&self, slot: usize) -> QpState {
        let mut st = self.lock();
        self.port_mut(&mut st).qps[slot].state()
    }

    fn modify(&self, slot: usize, to: QpState, f: impl FnOnce(&mut State, &mut QpEntry) -> Result<()>) -> Result<()> {
        let now = self.shared.clock.now_ns();
        let device_rings = self.shared.device_rings;
        let mut st = self.lock();
        if st.resident.get(self.port).is_some_and(Option::is_some) {
            return Err(Error::Resident {
                lid: self.lid(),
                what: "changing a QP's state",
            });
        }
        let mut qp = self.port_mut(&mut st).qps[slot];
        let from = qp.state();
        if !from.can_move_to(to) {
            return Err(Error::BadTransition { qpn: qp.qpn, from, to });
        }
        f(&mut st, &mut qp)?;
        qp.state = to as u32;
        match to {
            QpState::Reset => {
                qp.reset_progress();
                qp.flags &= !QP_CONNECTED;
                // No engine runs this port now that would read it (the
                // fabric's lock; a resident port refused above).
                self.port_mut(&mut st).inbox[slot] = Inbox::EMPTY;
            }
            QpState::Rtr => {
                // A new connection: its inbox starts empty on both sides
                // (the peer's requester counts from zero after its RTR).
                qp.inbox_tail = 0;
                qp.out_head = 0;
                qp.out_tail_seen = 0;
                self.port_mut(&mut st).inbox[slot] = Inbox::EMPTY;
            }
            QpState::Rts if from != QpState::Rts => {
                // Doorbells rung before RTS count from here: read the record now.
                qp.last_dbr_read_ns = now.saturating_sub(st.cfg.dbr_reread_ns);
                // SAFETY: create_qp's contract keeps the doorbell memory valid.
                qp.last_doorbell = unsafe {
                    if device_rings {
                        0
                    } else if qp.uar.is_null() {
                        (mem::load_dbrec(qp.dbrec.add(1)) & 0xffff) as u64
                    } else {
                        mem::load_uar(qp.uar)
                    }
                };
            }
            _ => {}
        }
        self.port_mut(&mut st).qps[slot] = qp;
        Ok(())
    }
}

impl RdmaDevice for SoftDevice {
    type Error = Error;
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Qp = SoftQp;

    fn lid(&self) -> u16 {
        self.port as u16 + 1
    }

    fn alloc_pd(&self) -> Result<SoftPd> {
        let mut st = self.lock();
        let pdn = st.next_pd;
        st.next_pd += 1;
        Ok(SoftPd {
            shared: Arc::as_ptr(&self.shared) as *const (),
            port: self.port,
            pdn,
        })
    }

    unsafe fn reg_mr(&self, pd: &SoftPd, addr: *mut u8, len: usize, flags: u32) -> Result<SoftMr> {
        self.owns(pd)?;
        if flags & !access::ALL != 0 {
            return Err(Error::BadAccess {
                flags,
                why: "unknown bits (the soft NIC knows LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC)",
            });
        }
        if flags & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0 && flags & access::LOCAL_WRITE == 0 {
            return Err(Error::BadAccess {
                flags,
                why: "remote write and remote atomic need local write too (verbs refuse this with EINVAL)",
            });
        }
        if len == 0 || addr.is_null() || (addr as u64).checked_add(len as u64).is_none() {
            return Err(Error::BadRegion {
                addr: addr as u64,
                len,
                why: "empty, null, or wrapping the address space",
            });
        }
        let mut st = self.lock();
        let tag = st.next_tag;
        st.next_tag = st.next_tag.wrapping_add(1).max(1);
        let lid = self.lid();
        let port = self.port_mut(&mut st);
        // A slot of an undead region stays valid, so it is never taken.
        let slot = free_slot(&port.mrs, |m| m.valid == 0, lid, "memory region", MAX_MRS)?;
        let key = make_key(slot, tag);
        debug_assert_eq!(key_slot(key), Some(slot));
        let entry = MrEntry {
            addr: addr as u64,
            len: len as u64,
            key,
            access: flags,
            pd: pd.pdn,
            valid: 1,
        };
        port.mrs[slot] = entry;
        if let Some(r) = st.resident.get(self.port).cloned().flatten() {
            if let Err(e) = r.write_mr(slot, &entry) {
                self.port_mut(&mut st).mrs[slot] = MrEntry::EMPTY;
                return Err(e);
            }
        }
        Ok(SoftMr {
            dev: self.clone(),
            slot,
            key,
            addr: addr as u64,
            len,
        })
    }

    unsafe fn create_cq(&self, ring: CqRing) -> Result<SoftCq> {
        check_pow2("CQ", ring.entries)?;
        check_align("CQ ring", ring.buf, 64)?;
        if !ring.dbrec.is_null() {
            check_align("CQ doorbell record", ring.dbrec as *const u8, 8)?;
        }
        let mut st = self.lock();
        let cqn = st.next_cqn;
        st.next_cqn += 1;
        let lid = self.lid();
        let port = self.port_mut(&mut st);
        let slot = free_slot(&port.cqs, |c| c.valid == 0, lid, "CQ", MAX_CQS)?;
        if !self.shared.device_rings {
            // SAFETY: the caller's contract: `entries` CQEs at `buf`.
            unsafe { cqe::init_ring(ring.buf, ring.entries) };
            if !ring.dbrec.is_null() {
                // SAFETY: as above, for the doorbell record.
                unsafe { mem::store_dbrec(ring.dbrec, 0) };
            }
        }
        port.cqs[slot] = CqEntry {
            ring: ring.buf,
            dbrec: ring.dbrec,
            entries: ring.entries,
            cqn,
            valid: 1,
            ..CqEntry::EMPTY
        };
        Ok(SoftCq {
            dev: self.clone(),
            slot,
            cqn,
            ring,
        })
    }

    unsafe fn create_qp(&self, pd: &SoftPd, send_cq: &SoftCq, recv_cq: &SoftCq, rings: QpRings) -> Result<SoftQp> {
        self.owns(pd)?;
        for cq in [send_cq, recv_cq] {
            if !Arc::ptr_eq(&cq.dev.shared, &self.shared) || cq.dev.port != self.port {
                return Err(Error::Foreign { what: "CQ" });
            }
        }
        check_pow2("SQ", rings.sq_wqebbs)?;
        check_at_most("SQ", "basic blocks", rings.sq_wqebbs, MAX_SQ_WQEBBS, COUNTER_16)?;
        check_align("SQ ring", rings.sq, 64)?;
        check_align("QP doorbell record", rings.dbrec as *const u8, 8)?;
        if !rings.uar.is_null() {
            check_align("UAR", rings.uar as *const u8, 8)?;
        }
        if rings.rq_wqes != 0 {
            check_pow2("RQ", rings.rq_wqes)?;
            check_at_most("RQ", "receive WQEs", rings.rq_wqes, MAX_RQ_WQES, COUNTER_16)?;
            check_pow2("RQ max_sge", rings.rq_max_sge)?;
            check_at_most(
                "RQ max_sge",
                "scatter entries",
                rings.rq_max_sge,
                rq::MAX_RECV_SGE as u32,
                "the engine copies at most that many of a receive WQE",
            )?;
            check_align("RQ ring", rings.rq, 16)?;
        }
        let mut st = self.lock();
        let qpn = st.next_qpn;
        st.next_qpn = (st.next_qpn + 1) & 0xff_ffff;
        let lid = self.lid();
        let port = self.port_mut(&mut st);
        let slot = free_slot(&port.qps, |q| !q.in_use(), lid, "QP", MAX_QPS)?;
        if !self.shared.device_rings {
            // SAFETY: the caller's contract: two doorbell words at `dbrec`.
            unsafe {
                mem::store_dbrec(rings.dbrec, 0);
                mem::store_dbrec(rings.dbrec.add(1), 0);
            }
        }
        port.inbox[slot] = Inbox::EMPTY;
        port.qps[slot] = QpEntry {
            sq: rings.sq,
            rq: if rings.rq_wqes == 0 { std::ptr::null_mut() } else { rings.rq },
            dbrec: rings.dbrec,
            uar: rings.uar,
            qpn,
            state: QpState::Reset as u32,
            pd: pd.pdn,
            send_cq: send_cq.slot as u32,
            recv_cq: recv_cq.slot as u32,
            sq_wqebbs: rings.sq_wqebbs,
            rq_wqes: rings.rq_wqes,
            rq_max_sge: if rings.rq_wqes == 0 { 0 } else { rings.rq_max_sge },
            flags: QP_IN_USE,
            ..QpEntry::EMPTY
        };
        Ok(SoftQp {
            dev: self.clone(),
            slot,
            qpn,
            rings,
            rq_pi: AtomicU32::new(0),
        })
    }
}

/// A thread polling one device; stopped and joined on drop.
#[must_use = "dropping the guard stops the engine thread"]
#[derive(Debug)]
pub struct EngineThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

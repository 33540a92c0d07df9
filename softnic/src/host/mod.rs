//! The host wrapper: a fabric of soft NIC devices behind one lock, the
//! verbs-shaped setup ([`crate::verbs`]) for them, an engine thread per
//! device, and a clock (real or virtual).

mod resident;
mod rings;

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

impl std::fmt::Debug for SoftFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftFabric")
            .field("clock", &self.shared.clock)
            .finish_non_exhaustive()
    }
}

impl SoftFabric {
    /// A fabric with `config`.
    pub fn new(config: FabricConfig) -> SoftFabric {
        let clock = if config.virtual_time {
            Clock::Virtual(AtomicU64::new(0))
        } else {
            Clock::Real(Instant::now())
        };
        SoftFabric {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ports: Vec::new(),
                    resident: Vec::new(),
                    stuck: Vec::new(),
                    cfg: config.engine,
                    rng: EngineRng::new(config.engine.faults.seed),
                    next_pd: 1,
                    next_qpn: 0x100,
                    next_cqn: 1,
                    next_tag: 1,
                }),
                clock,
                device_rings: config.device_rings,
            }),
        }
    }

    /// Opens a new device (port) with the link model `link` (`None`: no
    /// model). See [`link_from_env`] for the `DOORBELL_SOFTNIC_LINK` default.
    pub fn open_device(&self, link: Option<LinkModel>) -> Result<SoftDevice> {
        let mut st = self.shared.lock();
        if st.ports.len() >= MAX_PORTS {
            return Err(Error::TableFull {
                lid: 0,
                what: "port",
                max: MAX_PORTS,
            });
        }
        let index = st.ports.len();
        Ok(self.install(&mut st, index, link))
    }

    /// Opens the device that is port `index` (LID `index + 1`) of a fabric
    /// spread over several processes: each process makes a fabric of its
    /// own and opens its ports at indices every process agrees on (a
    /// rank's, say), so LIDs name the same port everywhere. Indices below
    /// `index` that this fabric does not hold stay empty (never valid
    /// here: their ports live in another process). Connect to those
    /// ports' QPs with [`SoftQp::connect_remote`]. Errors: `index` past
    /// [`MAX_PORTS`], or already open in this fabric.
    pub fn open_device_at(&self, index: usize, link: Option<LinkModel>) -> Result<SoftDevice> {
        let mut st = self.shared.lock();
        if index >= MAX_PORTS {
            return Err(Error::PortIndex {
                index,
                why: format!("a fabric has at most {MAX_PORTS} ports (indices 0..{MAX_PORTS})"),
            });
        }
        if st.ports.get(index).is_some_and(|p| p.valid != 0) {
            return Err(Error::PortIndex {
                index,
                why: "already open in this fabric".to_string(),
            });
        }
        Ok(self.install(&mut st, index, link))
    }

    /// Puts a new port at `index` (below [`MAX_PORTS`], not open), the
    /// indices before it that this fabric lacks as empty, never-valid ports.
    fn install(&self, st: &mut State, index: usize, link: Option<LinkModel>) -> SoftDevice {
        while st.ports.len() <= index {
            let mut empty = Port::new(st.ports.len() as u32 + 1, LinkModel::OFF);
            empty.valid = 0;
            st.ports.push(empty);
            st.resident.push(None);
            st.stuck.push(Vec::new());
        }
        st.ports[index] = Port::new(index as u32 + 1, link.unwrap_or(LinkModel::OFF));
        SoftDevice {
            shared: self.shared.clone(),
            port: index,
        }
    }

    /// The engine's time, ns.
    pub fn now_ns(&self) -> u64 {
        self.shared.clock.now_ns()
    }

    /// Sets the virtual clock (no effect on a real clock).
    pub fn set_time_ns(&self, t: u64) {
        if let Clock::Virtual(v) = &self.shared.clock {
            v.fetch_max(t, Ordering::AcqRel);
        }
    }

    /// Advances the virtual clock by `dt` ns (no effect on a real clock).
    pub fn advance_ns(&self, dt: u64) {
        if let Clock::Virtual(v) = &self.shared.clock {
            v.fetch_add(dt, Ordering::AcqRel);
        }
    }

    /// Whether the clock is virtual.
    pub fn is_virtual(&self) -> bool {
        matches!(self.shared.clock, Clock::Virtual(_))
    }

    /// Replaces the engine configuration (faults, timeouts) from now on,
    /// for resident engines too (best effort: see [`Self::try_set_config`]).
    pub fn set_config(&self, cfg: EngineConfig) {
        let _ = self.try_set_config(cfg);
    }

    /// As [`Self::set_config`], reporting a resident engine that could not
    /// be told ([`ResidentPort::write_config`]).
    pub fn try_set_config(&self, cfg: EngineConfig) -> Result<()> {
        let resident: Vec<_> = {
            let mut st = self.shared.lock();
            st.cfg = cfg;
            st.rng = EngineRng::new(cfg.faults.seed);
            st.resident.iter().flatten().cloned().collect()
        };
        for r in resident {
            r.write_config(&cfg)?;
        }
        Ok(())
    }

    /// The engine configuration.
    pub fn config(&self) -> EngineConfig {
        self.shared.lock().cfg
    }

    /// One engine pass over every device.
    pub fn poll_all(&self) -> PollReport {
        let now = self.now_ns();
        let mut st = self.shared.lock();
        let State {
            ports, resident, cfg, rng, ..
        } = &mut *st;
        let mut total = PollReport::IDLE;
        for p in 0..ports.len() {
            if resident.get(p).is_some_and(Option::is_some) {
                continue;
            }
            // SAFETY: every pointer in the tables came through the unsafe
            // setup calls, whose callers keep the memory valid while the
            // objects live; dropped objects are removed from the tables.
            let r = unsafe { poll_port(ports.as_mut_slice(), p, now, cfg, rng, &mut ThreadMover) };
            total.progressed += r.progressed;
            total.next_event_ns = total.next_event_ns.min(r.next_event_ns);
        }
        total
    }

    /// Drives every device until `done()` holds, polling from this thread:
    /// on a virtual clock, jumping to the next due event whenever a pass
    /// makes no progress; on a real clock, polling until the time is up.
    /// Gives up after `budget_ns` of the fabric's clock with
    /// [`Error::Timeout`] naming `what`. Returns the time at which `done()`
    /// held.
    pub fn run_until(&self, what: &str, budget_ns: u64, mut done: impl FnMut() -> bool) -> Result<u64> {
        let t0 = self.now_ns();
        loop {
            let r = self.poll_all();
            if done() {
                return Ok(self.now_ns());
            }
            let now = self.now_ns();
            if now.saturating_sub(t0) > budget_ns {
                return Err(Error::Timeout {
                    waited_ns: now - t0,
                    clock: if self.is_virtual() { "virtual" } else { "real" },
                    what: what.to_string(),
                });
            }
            if r.progressed == 0 {
                if self.is_virtual() {
                    let next = if r.next_event_ns == u64::MAX {
                        now + 1_000
                    } else {
                        r.next_event_ns
                    };
                    self.set_time_ns(next.max(now + 1).min(t0.saturating_add(budget_ns).saturating_add(1)));
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
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
    if p.is_null() || (p as usize) % align != 0 {
        return Err(Error::BadRing {
            what,
            why: format!("address {p:p} is null or not {align}-byte aligned"),
        });
    }
    Ok(())
}

impl SoftDevice {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    fn port_mut<'a>(&self, st: &'a mut State) -> &'a mut Port {
        // The port was pushed when this device was made and ports are never removed.
        &mut st.ports[self.port]
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
        self.live_port().stats
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
        let slot = port.mrs.iter().position(|m| m.valid == 0).ok_or(Error::TableFull {
            lid,
            what: "memory region",
            max: MAX_MRS,
        })?;
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
        let slot = port.cqs.iter().position(|c| c.valid == 0).ok_or(Error::TableFull {
            lid,
            what: "CQ",
            max: MAX_CQS,
        })?;
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
        let slot = port.qps.iter().position(|q| !q.in_use()).ok_or(Error::TableFull {
            lid,
            what: "QP",
            max: MAX_QPS,
        })?;
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

//! The soft NIC engine's reports: its progress record in words
//! ([`IbgdaProgress`]), its counters ([`EngineReport`]), and the watch
//! thread that logs a running kernel engine's record.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use doorbell_softnic::engine::resident::{EngineCounters, EngineProgress, STATE_EXITED, STATE_LAUNCHED, STATE_RUNNING};
use doorbell_softnic::engine::PortStats;

use super::SoftNicEngine;

/// How often the watch logs an engine's progress record (at debug level,
/// and at warn when the engine stopped passing).
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A host thread that reads an engine's progress record (mapped host
/// memory: no driver call, so it reports while a user kernel or a driver
/// call is stuck) and logs it every [`WATCH_EVERY`]. Stopped on drop.
pub(super) struct Watch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    pub(super) fn start(rank: usize, port: u32, record: *const EngineProgress, state: *const u32) -> Watch {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let (record, state) = (record as usize, state as usize);
        let handle = std::thread::Builder::new()
            .name(format!("softnic-watch-{port}"))
            .spawn(move || {
                let mut last_passes = 0u64;
                let mut next = std::time::Instant::now() + WATCH_EVERY;
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    if std::time::Instant::now() < next {
                        continue;
                    }
                    next += WATCH_EVERY;
                    // SAFETY: a record and a word of an engine image's pages,
                    // which are never freed.
                    let (p, st) = unsafe {
                        (
                            std::ptr::read_volatile(record as *const EngineProgress),
                            std::ptr::read_volatile(state as *const u32),
                        )
                    };
                    let line = IbgdaProgress {
                        rank,
                        port,
                        engine: SoftNicEngine::Kernel,
                        record: p,
                    };
                    if st == STATE_RUNNING && p.passes == last_passes {
                        tracing::warn!(
                            "rank {rank}: {line}; no pass for {} s: the engine kernel does not poll (not scheduled, or stuck)",
                            WATCH_EVERY.as_secs()
                        );
                    } else {
                        tracing::debug!("rank {rank}: {line} (state: {})", state_name(st));
                    }
                    last_passes = p.passes;
                }
            })
            .ok();
        Watch { stop, handle }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What a soft NIC engine has seen and done, from its progress record:
/// `Display` gives one line for logs and error messages, e.g.
/// `engine port 0: 1234567 passes, doorbell record 0 (last UAR 0), 0
/// doorbells, 0 WQEs fetched, 0 WQEs, 0 CQEs, 0 errors`.
///
/// Reading a stalled run: passes that do not grow — the engine does not
/// poll; passes but no doorbells and doorbell record 0 — the producer's
/// UAR and doorbell-record stores never reach the engine (visibility or
/// a wrong address: compare the set-up's address log); doorbells but no
/// WQEs fetched — the doorbell record or the WQE is not what the engine
/// expects; WQEs and CQEs written but the user kernel's wait times out —
/// the kernel's CQ poll does not see the engine's CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaProgress {
    /// The rank whose engine this is.
    pub rank: usize,
    /// Its port (index in the fabric).
    pub port: u32,
    /// Where it runs (the host thread has no pass count: 0).
    pub engine: SoftNicEngine,
    /// The record.
    pub record: EngineProgress,
}

impl IbgdaProgress {
    /// The record of a host-thread engine, from its port's counters.
    pub(super) fn from_stats(rank: usize, port: u32, s: &PortStats) -> IbgdaProgress {
        IbgdaProgress {
            rank,
            port,
            engine: SoftNicEngine::Thread,
            record: EngineProgress {
                seq: 0,
                passes: 0,
                time_ns: 0,
                doorbells: s.doorbells,
                last_uar: s.last_uar,
                last_sq_pi: s.last_sq_pi as u64,
                dbr_rereads: s.dbr_rereads,
                fetched: s.fetched,
                executed: s.executed,
                wqes: s.wqes,
                cqes: s.cqes,
                errors: s.errors,
                flushes: s.flushes,
                last_qpn: s.last_qpn as u64,
                last_wqe: s.last_wqe as u64,
            },
        }
    }
}

impl std::fmt::Display for IbgdaProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.record;
        write!(f, "engine port {}: ", self.port)?;
        match self.engine {
            SoftNicEngine::Kernel if p.seq == 0 => write!(f, "no progress record published yet, ")?,
            SoftNicEngine::Kernel => write!(f, "{} passes, ", p.passes)?,
            SoftNicEngine::Thread => write!(f, "host thread, ")?,
        }
        write!(
            f,
            "doorbell record {} (last UAR {:#x}), {} doorbells, {} re-reads, {} WQEs fetched, {} executed, {} WQEs, {} CQEs, {} errors, {} flushes, last QP {:#x} WQE {}",
            p.last_sq_pi,
            p.last_uar,
            p.doorbells,
            p.dbr_rereads,
            p.fetched,
            p.executed,
            p.wqes,
            p.cqes,
            p.errors,
            p.flushes,
            p.last_qpn,
            p.last_wqe
        )
    }
}

/// What the engine of this rank's port is and has done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineReport {
    /// Where it runs.
    pub engine: SoftNicEngine,
    /// Threads of each of its blocks (kernel engine; 1 for the host
    /// thread).
    pub threads: u32,
    /// What it has done, its blocks added up (kernel engine; zero for the
    /// host thread, whose port statistics are `SoftDevice::stats`).
    pub counters: EngineCounters,
    /// Each block's counters (kernel engine; empty for the host thread):
    /// block `b` serves the QPs `Port::assign_shards` gave it.
    pub blocks: Vec<EngineCounters>,
}

/// An engine state word in words.
pub(super) fn state_name(s: u32) -> &'static str {
    match s {
        STATE_LAUNCHED => "launched, never started",
        STATE_RUNNING => "running",
        STATE_EXITED => "exited",
        _ => "not a state",
    }
}

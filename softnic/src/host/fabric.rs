//! The fabric's own operations: opening its devices, its clock (real or
//! virtual), the engine configuration it hands every port, and polling
//! every port from the caller's thread.

use super::*;

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

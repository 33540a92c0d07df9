//! The communicator's side of the device trace ([`crate::trace`]): the
//! rings' device memory, the clock calibration, reading the rings after
//! each synchronize, and writing the files.

use std::time::{SystemTime, UNIX_EPOCH};

use doorbell_kernels::trace::{events_at, trace_bytes, Event, TraceHeader, What, COUNTERS_AT, END, EVENT_BYTES, TRACE_OFFSET};

use super::Communicator;
use crate::error::{Error, Result};
use crate::trace::{TraceEvent, TraceFiles, TraceMeta, TraceOptions};
use crate::DeviceBuffer;

/// Most device memory the rings of one rank may take.
const MAX_TRACE_BYTES: u64 = 1 << 30;

/// A rank's tracing state: the rings' memory and what was read from it.
pub(super) struct Tracer {
    opts: TraceOptions,
    mem: DeviceBuffer<u8>,
    /// Host clock minus device clock, ns.
    offset_ns: i128,
    clock_error_ns: u64,
    events: Vec<TraceEvent>,
    overwritten: u64,
    /// The device wrote events whose kind this build does not know.
    unknown: u64,
}

/// The host's clock, ns since the Unix epoch.
fn host_ns() -> i128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

impl Communicator {
    /// Starts tracing this rank's kernels (see [`crate::trace`]): allocates
    /// the rings, calibrates the device clock against the host's and turns
    /// the hooks on. Call it while no kernel of this rank runs. Tracing
    /// again replaces the rings (events not yet written are kept).
    ///
    /// On a GPU, only kernels built with `doorbell-kernels`' `trace`
    /// feature record anything (a warning says so when the library's own
    /// kernels were built without it); the emulator always records.
    ///
    /// A build with `DOORBELL_TRACE_KERNELS=1` embeds two images of each
    /// kernel crate (see [`crate::ModuleImage`]): from this call on, every
    /// module this process loads takes the traced one. A module loaded
    /// before it (with tracing off, so with the default image, the code of
    /// a build without hooks) stays without hooks and records nothing:
    /// tracing still starts, for everything loaded afterwards, and a
    /// warning names those modules ([`crate::trace::loaded_without_hooks`]
    /// lists them). Load modules after `trace_start`, or set
    /// `DOORBELL_TRACE`, to trace them.
    pub fn trace_start(&self, opts: TraceOptions) -> Result<()> {
        let bad = |what: String| Err(Error::Trace(what));
        if !opts.rings.is_power_of_two() || !opts.events_per_ring.is_power_of_two() {
            return bad(format!(
                "rings ({}) and events per ring ({}) must be powers of two",
                opts.rings, opts.events_per_ring
            ));
        }
        let bytes = trace_bytes(opts.rings, opts.events_per_ring);
        if bytes > MAX_TRACE_BYTES {
            return bad(format!(
                "{} rings of {} events take {bytes} bytes of device memory, more than the {MAX_TRACE_BYTES} allowed; \
                 lower TraceOptions::rings or events_per_ring",
                opts.rings, opts.events_per_ring
            ));
        }
        std::fs::create_dir_all(&opts.dir)
            .map_err(|e| Error::Trace(format!("cannot create the trace directory {}: {e}", opts.dir.display())))?;
        // From here on, loads take the traced images (the clock's
        // calibration below may load the library's own module).
        crate::image::request_tracing();
        if self.device.is_gpu() {
            if let Some(w) = crate::image::late_start_warning(self.rank, &crate::image::loaded_without_hooks()) {
                tracing::warn!("{w}");
            }
        }
        if self.device.is_gpu() && !crate::KERNELS.has_traced() && !crate::KERNELS_PTX.contains("trace_record") {
            tracing::warn!(
                "rank {}: tracing on, but the library's kernels were built without the `trace` feature of \
                 doorbell-kernels: only kernels built with it record events",
                self.rank
            );
        }
        let mem = self.device.alloc_zeroed::<u8>(bytes as usize)?;
        let header = TraceHeader {
            rings: opts.rings,
            capacity: opts.events_per_ring,
            rank: self.rank as u32,
            _pad: 0,
        };
        let (offset_ns, clock_error_ns) = self.calibrate_clock()?;
        // SAFETY: the header fits the fresh allocation; the heap header's
        // trace word is the runtime's, and no kernel of this rank runs (the
        // caller's contract).
        unsafe {
            self.device.write_raw(mem.as_raw(), as_bytes(&header))?;
            self.device.write_raw(self.heap_base + TRACE_OFFSET, &mem.as_raw().to_le_bytes())?;
        }
        let mut t = self.trace.lock().unwrap_or_else(|p| p.into_inner());
        let (events, overwritten, unknown) = t.take().map_or((Vec::new(), 0, 0), |t| (t.events, t.overwritten, t.unknown));
        *t = Some(Tracer {
            opts,
            mem,
            offset_ns,
            clock_error_ns,
            events,
            overwritten,
            unknown,
        });
        Ok(())
    }

    /// Whether this rank traces.
    pub fn tracing(&self) -> bool {
        self.trace.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Host clock minus device clock, and half the round trip it was
    /// measured in (the best of three).
    fn calibrate_clock(&self) -> Result<(i128, u64)> {
        if !self.device.is_gpu() {
            let before = host_ns();
            let dev = doorbell_kernels::emu::now_ns() as i128;
            let after = host_ns();
            return Ok(((before + after) / 2 - dev, ((after - before) / 2) as u64));
        }
        let f = self.library_module()?.function::<doorbell_kernels::trace::trace_clock>()?;
        let out = self.device.alloc_zeroed::<u64>(1)?;
        let stream = self.device.new_stream()?;
        let cfg = crate::LaunchConfig::linear(1, 1);
        let mut best: Option<(i128, u64)> = None;
        for _ in 0..3 {
            let before = host_ns();
            // SAFETY: one thread writes one word of `out`. The library's
            // own launch: not counted as the user's.
            self.device
                .activity()
                .unrecorded(|| unsafe { stream.launch(&f, cfg, (out.as_raw() as *mut u64,)) }.and_then(|()| stream.synchronize()))?;
            let after = host_ns();
            let dev = out.to_host()?[0] as i128;
            let half = ((after - before) / 2) as u64;
            if best.is_none_or(|(_, e)| half < e) {
                best = Some(((before + after) / 2 - dev, half));
            }
        }
        Ok(best.unwrap_or((0, 0)))
    }

    /// Reads this rank's rings into the host's events and empties them;
    /// returns how many events were read. [`Self::synchronize`] calls it;
    /// call it yourself after synchronizing streams some other way, while
    /// no kernel of this rank runs. Does nothing when not tracing.
    pub fn trace_collect(&self) -> Result<usize> {
        let mut guard = self.trace.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = guard.as_mut() else { return Ok(0) };
        let (rings, cap) = (t.opts.rings, t.opts.events_per_ring);
        let base = t.mem.as_raw();
        let mut counters = vec![0u8; rings as usize * 4];
        // SAFETY: the counters lie in the trace allocation; no kernel runs.
        unsafe { self.device.read_raw(base + COUNTERS_AT, &mut counters)? };
        let mut read = 0;
        for (ring, c) in counters.chunks_exact(4).enumerate() {
            let n = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if n == 0 {
                continue;
            }
            let kept = n.min(cap);
            t.overwritten += (n - kept) as u64;
            let mut raw = vec![0u8; kept as usize * EVENT_BYTES as usize];
            let ring_at = base + events_at(rings) + ring as u64 * cap as u64 * EVENT_BYTES;
            // SAFETY: the ring's slots lie in the trace allocation.
            unsafe { self.device.read_raw(ring_at, &mut raw)? };
            // The oldest kept event first: after a wrap, at slot n % cap.
            let first = if n > cap { (n % cap) as usize } else { 0 };
            for i in 0..kept as usize {
                let at = (first + i) % kept as usize * EVENT_BYTES as usize;
                // SAFETY: `Event` is plain #[repr(C)] integers.
                let e: Event = unsafe { std::ptr::read_unaligned(raw[at..].as_ptr() as *const Event) };
                match host_event(&e, self.rank as u32, t.offset_ns) {
                    Some(h) => t.events.push(h),
                    None => t.unknown += 1,
                }
                read += 1;
            }
        }
        // SAFETY: as above.
        unsafe { self.device.write_raw(base + COUNTERS_AT, &vec![0u8; counters.len()])? };
        Ok(read)
    }

    /// This rank's events read so far (and not yet written).
    pub fn trace_events(&self) -> Vec<TraceEvent> {
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or_else(Vec::new, |t| t.events.clone())
    }

    /// Collective: gathers every rank's events (after a
    /// [`Self::trace_collect`] of its own) to rank 0, which writes
    /// `trace.json` and `summary.txt` into its trace directory and returns
    /// where; the other ranks return `None`. Events written are dropped
    /// from the ranks' buffers. Every rank must trace.
    pub fn trace_write(&self) -> Result<Option<TraceFiles>> {
        self.trace_collect()?;
        let mine = {
            let g = self.trace.lock().unwrap_or_else(|p| p.into_inner());
            let Some(t) = g.as_ref() else {
                return Err(Error::Trace(format!(
                    "rank {}: trace_write on a communicator that does not trace (trace_start, or DOORBELL_TRACE)",
                    self.rank
                )));
            };
            let mut b = Vec::with_capacity(16 + t.events.len() * 40);
            b.extend_from_slice(&t.overwritten.to_le_bytes());
            b.extend_from_slice(&t.clock_error_ns.to_le_bytes());
            b.extend_from_slice(&crate::trace::encode(&t.events));
            b
        };
        let all = self.world.all_gather_bytes(&mine)?;
        if let Some(t) = self.trace.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            t.events.clear();
        }
        if self.rank != 0 {
            return Ok(None);
        }
        let mut meta = TraceMeta::default();
        let mut events = Vec::new();
        for (r, b) in all.iter().enumerate() {
            let bad = || Error::Trace(format!("rank {r} sent a malformed trace ({} bytes)", b.len()));
            if b.len() < 16 {
                return Err(bad());
            }
            meta.overwritten.push(u64::from_le_bytes(b[..8].try_into().map_err(|_| bad())?));
            meta.clock_error_ns
                .push(u64::from_le_bytes(b[8..16].try_into().map_err(|_| bad())?));
            events.extend(crate::trace::decode(&b[16..]).ok_or_else(bad)?);
        }
        let dir = self.trace_dir().unwrap_or_default();
        crate::trace::write_files(&dir, "trace", &events, &meta)
            .map(Some)
            .map_err(|e| Error::Trace(format!("cannot write the trace into {}: {e}", dir.display())))
    }

    fn trace_dir(&self) -> Option<std::path::PathBuf> {
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|t| t.opts.dir.clone())
    }

    /// At drop: turns the hooks off and writes this rank's events not yet
    /// written into `rank-<r>.json` / `rank-<r>.txt` (a log line on failure).
    pub(super) fn trace_finish(&mut self) {
        if !self.tracing() {
            return;
        }
        if let Err(e) = self.trace_collect() {
            tracing::warn!("rank {}: the last trace events could not be read: {e}", self.rank);
        }
        // SAFETY: the heap header's trace word; the device is idle.
        let _ = unsafe { self.device.write_raw(self.heap_base + TRACE_OFFSET, &0u64.to_le_bytes()) };
        let Some(t) = self.trace.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        if t.unknown > 0 {
            tracing::warn!("rank {}: {} trace events of an unknown kind were skipped", self.rank, t.unknown);
        }
        if t.events.is_empty() {
            return;
        }
        let mut meta = TraceMeta::default();
        meta.overwritten.resize(self.rank + 1, 0);
        meta.clock_error_ns.resize(self.rank + 1, 0);
        meta.overwritten[self.rank] = t.overwritten;
        meta.clock_error_ns[self.rank] = t.clock_error_ns;
        match crate::trace::write_files(&t.opts.dir, &format!("rank-{}", self.rank), &t.events, &meta) {
            Ok(f) => tracing::info!("rank {}: trace of {} events in {}", self.rank, f.events, f.json.display()),
            Err(e) => tracing::warn!("rank {}: cannot write the trace into {}: {e}", self.rank, t.opts.dir.display()),
        }
    }
}

/// A ring's event on the host's clock; `None` for a kind this build does
/// not know.
fn host_event(e: &Event, rank: u32, offset_ns: i128) -> Option<TraceEvent> {
    let kind = e.what as u16;
    let who = (e.what >> 16) as u16;
    Some(TraceEvent {
        rank,
        at_ns: (e.at_ns as i128 + offset_ns).max(0) as u64,
        what: What::from_u16(kind)?,
        end: kind & END != 0,
        block: e.block,
        warp: (who >> 5) as u32,
        lane: (who & 31) as u32,
        peer: (e.peer != u32::MAX).then_some(e.peer),
        arg: e.arg,
    })
}

/// The bytes of a plain `#[repr(C)]` value.
fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: any initialized value is readable as bytes; `T` has no
    // padding here (`TraceHeader`: four u32).
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

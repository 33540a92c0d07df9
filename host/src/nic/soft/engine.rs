//! The soft NIC's engine kernel: its module and the mapped host pages of
//! the engines' state words and progress records (once per device and
//! process), the collective launch ([`launch`]) and the bounded stop.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use doorbell_kernels::Kernel;
use doorbell_softnic::engine::burst::BURST_MAX;
use doorbell_softnic::engine::resident::{
    EngineCounters, EngineCtl, EngineProgress, IDLE_SLEEP_NS, SHARED_BYTES, SHARED_BYTES_BULK, STATE_EXITED, STATE_LAUNCHED, STATE_RUNNING,
};
use doorbell_softnic::engine::{Port, PortTable, Window, MAX_ENGINE_BLOCKS, MAX_PORTS};
use doorbell_softnic::kernel::{softnic_engine_1024, softnic_engine_256, softnic_engine_512, ENGINE_256_THREADS, ENGINE_512_THREADS};
use doorbell_softnic::{EngineThread, RdmaDevice as _};

use super::port::{bytes_of, check_ring_addresses, read_qp_table, DevicePort};
use super::report::{state_name, IbgdaProgress, Watch};
use super::{SoftNic, SoftNicEngine, ENGINE_BLOCKS_GPU, ENGINE_THREADS_GPU, ENGINE_WAIT, SOFTNIC, SOFTNIC_PTX};
use crate::backend::{FunctionBackend, StreamBackend};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::nic::StartCtx;

/// The engine of a port.
pub(super) enum Engine {
    /// A host thread (stopped and joined on drop).
    Thread(EngineThread),
    /// A running `softnic_engine_256` kernel.
    Kernel(KernelEngine),
}

/// A running `softnic_engine_256` kernel and the device memory it owns.
pub(super) struct KernelEngine {
    /// The untracked stream it runs on (nothing else runs there).
    stream: Option<StreamBackend>,
    /// While it runs, module unloads and frees on its GPU (which would wait
    /// for it) are postponed; dropped once it stopped, leaked with it if
    /// it did not.
    _persistent: Option<crate::backend::cuda::PersistentKernel>,
    ctl: DeviceBuffer<u8>,
    _ports: DeviceBuffer<u8>,
    /// Its port's tables, when not in the symmetric heap.
    _port: Option<DeviceBuffer<u8>>,
    /// Where its port's tables are.
    port_addr: u64,
    device: Device,
    pub(super) threads: u32,
    /// Its blocks, each with a control block of its own in `ctl` (see
    /// `doorbell_softnic::engine::control`).
    pub(super) blocks: u32,
    /// Its state word and progress record in mapped host memory.
    status: StatusSlot,
    /// Its port (index in the fabric).
    port: u32,
    /// Logs its progress record while it runs.
    watch: Option<Watch>,
}

/// State words per device (one 4 KiB page of mapped host memory): engines
/// of one device running at once.
const STATUS_SLOTS: usize = 1024;

/// The engine kernel of one device and a page of mapped host memory for
/// the engines' state words, made once per process and device and never
/// freed: unloading a module whose kernel still runs, or freeing pinned
/// memory (which waits for the whole device), while another rank's engine
/// runs on the same GPU would hang or fault. Loading it once also means the
/// driver compiles the PTX once, not at every set-up and reset.
struct EngineImage {
    /// The entries, by [`EngineEntry`].
    functions: [Arc<FunctionBackend>; 3],
    status_host: usize,
    status_dev: u64,
    /// [`STATUS_SLOTS`] progress records, mapped like the state words.
    progress_host: usize,
    progress_dev: u64,
    free: Vec<u32>,
}

/// Engine images by (GPU?, ordinal).
static ENGINE_IMAGES: Mutex<Option<HashMap<(bool, usize), EngineImage>>> = Mutex::new(None);

/// One engine's state word: [`STATUS_SLOTS`] per device.
struct StatusSlot {
    key: (bool, usize),
    slot: u32,
    host: *mut u32,
    dev: u64,
    /// The engine's progress record (host and device addresses).
    progress_host: *mut EngineProgress,
    progress_dev: u64,
}

// SAFETY: the pointers name a word and a record of an engine image's
// mapped host pages, which are never freed; they are read and written only
// with volatile accesses (the engine is the other party).
unsafe impl Send for StatusSlot {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for StatusSlot {}

impl StatusSlot {
    /// The engine's progress record as it last published it. Reads this
    /// process's memory: no driver call, so it works while the engine or
    /// a user kernel is stuck.
    fn progress(&self) -> EngineProgress {
        // SAFETY: a record of the image's page, which is never freed.
        let v = unsafe { std::ptr::read_volatile(self.progress_host) };
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }

    /// The engine's state as it last published it (acquire: pairs with its
    /// `st.release.sys`). Reads this process's memory: no driver call.
    fn read(&self) -> u32 {
        // SAFETY: a word of the image's page, which is never freed.
        let v = unsafe { std::ptr::read_volatile(self.host) };
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }

    /// Hands the word back once its engine has exited.
    fn release(self) {
        if let Some(img) = ENGINE_IMAGES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|m| m.get_mut(&self.key))
        {
            img.free.push(self.slot);
        }
    }
}

/// The engine kernel's entry for a block size: each is the same engine,
/// built for at most that many threads (so with at most 255, 128 or 64
/// registers per thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EngineEntry {
    /// `softnic_engine_256`: up to [`ENGINE_256_THREADS`] (256).
    UpTo256 = 0,
    /// `softnic_engine_512`: up to [`ENGINE_512_THREADS`] (512).
    UpTo512 = 1,
    /// `softnic_engine_1024`: up to 1024.
    UpTo1024 = 2,
}

impl EngineEntry {
    /// The entry for blocks of `threads`.
    fn for_threads(threads: u32) -> EngineEntry {
        if threads <= ENGINE_256_THREADS {
            EngineEntry::UpTo256
        } else if threads <= ENGINE_512_THREADS {
            EngineEntry::UpTo512
        } else {
            EngineEntry::UpTo1024
        }
    }
}

/// The engine kernel on `dev` (loaded, and compiled by the driver, the
/// first time) — its `entry` — and a free state word, reset to
/// [`STATE_LAUNCHED`].
fn engine_image(dev: &Device, rank: usize, entry: EngineEntry) -> Result<(Arc<FunctionBackend>, StatusSlot)> {
    let key = (dev.is_gpu(), dev.ordinal());
    let mut guard = ENGINE_IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let std::collections::hash_map::Entry::Vacant(vacant) = map.entry(key) {
        let t0 = std::time::Instant::now();
        let module = dev.inner.load_module((&SOFTNIC).into())?;
        let functions = [
            Arc::new(module.function(<softnic_engine_256 as Kernel>::NAME)?),
            Arc::new(module.function(<softnic_engine_512 as Kernel>::NAME)?),
            Arc::new(module.function(<softnic_engine_1024 as Kernel>::NAME)?),
        ];
        let (host, dev_addr) = dev.inner.alloc_mapped(STATUS_SLOTS * 4)?;
        let (progress_host, progress_dev) = dev.inner.alloc_mapped(STATUS_SLOTS * std::mem::size_of::<EngineProgress>())?;
        tracing::debug!(
            "rank {rank}: IBGDA: soft NIC engine module loaded on {} ({} bytes of PTX) in {} ms; kept for the process",
            dev.name(),
            SOFTNIC_PTX.len(),
            t0.elapsed().as_millis()
        );
        vacant.insert(EngineImage {
            functions,
            status_host: host as usize,
            status_dev: dev_addr,
            progress_host: progress_host as usize,
            progress_dev,
            free: (0..STATUS_SLOTS as u32).rev().collect(),
        });
    }
    let img = map.get_mut(&key).expect("inserted above");
    let slot = img.free.pop().ok_or_else(|| {
        Error::comm(format!(
            "rank {rank}: {STATUS_SLOTS} soft NIC engines already run on {}; drop communicators using IBGDA first",
            dev.name()
        ))
    })?;
    let s = StatusSlot {
        key,
        slot,
        host: (img.status_host + 4 * slot as usize) as *mut u32,
        dev: img.status_dev + 4 * slot as u64,
        progress_host: (img.progress_host + std::mem::size_of::<EngineProgress>() * slot as usize) as *mut EngineProgress,
        progress_dev: img.progress_dev + (std::mem::size_of::<EngineProgress>() * slot as usize) as u64,
    };
    // SAFETY: a word and a record of the pages, no engine uses them (the
    // slot was free).
    unsafe {
        std::ptr::write_volatile(s.host, STATE_LAUNCHED);
        std::ptr::write_volatile(s.progress_host, EngineProgress::default());
    }
    Ok((img.functions[entry as usize].clone(), s))
}

impl KernelEngine {
    /// Waits (bounded, reading host memory only) until the engine's state
    /// word is `want`; else the state seen last, and why the kernel ended
    /// when its stream says it failed (a kernel that faulted or, on the
    /// emulator, panicked: it will never set the word).
    fn wait_state(&self, want: u32) -> std::result::Result<(), (u32, String)> {
        let t0 = std::time::Instant::now();
        loop {
            let s = self.status.read();
            if s == want {
                return Ok(());
            }
            if let Some(Err(e)) = self.stream.as_ref().map(StreamBackend::query) {
                return Err((s, format!("; the engine kernel failed: {e}")));
            }
            if t0.elapsed() >= ENGINE_WAIT {
                return Err((s, String::new()));
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Sets the stop word (a driver copy into the control block).
    fn request_stop(&self) -> Result<()> {
        // SAFETY: the stop word of the control block.
        unsafe {
            self.device.inner.write(
                self.ctl.as_raw() + std::mem::offset_of!(EngineCtl, stop) as u64,
                &1u32.to_le_bytes(),
            )
        }
    }

    /// Sets the stop word and waits for the kernel to exit and its stream
    /// to drain. On success the engine's state word is handed back; an
    /// error means it did not stop in time (its memory must then stay
    /// allocated: the caller leaks it).
    pub(super) fn stop(mut self, rank: usize) -> std::result::Result<(), Box<(KernelEngine, String)>> {
        let t0 = std::time::Instant::now();
        tracing::debug!("rank {rank}: IBGDA teardown: stop requested of the soft NIC engine kernel");
        if let Err(e) = self.request_stop() {
            return Err(Box::new((self, format!("setting its stop word failed: {e}"))));
        }
        if let Err((seen, failed)) = self.wait_state(STATE_EXITED) {
            let why = format!(
                "its state word still reads {} ({seen}); {}{failed}",
                state_name(seen),
                self.progress(rank)
            );
            return Err(Box::new((self, why)));
        }
        self.watch = None;
        tracing::debug!("rank {rank}: IBGDA teardown: {}", self.progress(rank));
        if let Some(s) = self.stream.take() {
            if let Err(e) = s.synchronize() {
                tracing::error!("rank {rank}: soft NIC engine kernel: {e}");
            }
        }
        tracing::debug!(
            "rank {rank}: IBGDA teardown: soft NIC engine kernel stopped after {} ms",
            t0.elapsed().as_millis()
        );
        let KernelEngine { status, .. } = self;
        status.release();
        Ok(())
    }

    /// The engine's progress record, read from mapped host memory.
    pub(super) fn progress(&self, rank: usize) -> IbgdaProgress {
        IbgdaProgress {
            rank,
            port: self.port,
            engine: SoftNicEngine::Kernel,
            record: self.status.progress(),
        }
    }

    /// Each block's counters, from its control block.
    pub(super) fn counters(&self) -> Result<Vec<EngineCounters>> {
        let size = std::mem::size_of::<EngineCtl>();
        let mut b = vec![0u8; size * self.blocks as usize];
        // SAFETY: the control blocks, whole.
        unsafe { self.device.inner.read(self.ctl.as_raw(), &mut b)? };
        Ok(b.chunks_exact(size)
            // SAFETY: EngineCtl is plain #[repr(C)] data; each chunk is one.
            .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr() as *const EngineCtl) }.counters)
            .collect())
    }
}

/// Why `blocks` engine blocks per rank cannot run beside the ranks'
/// kernels when `ranks` ranks share a GPU of `sms` SMs: each block holds
/// an SM for as long as the engine runs, and at least one SM must stay for
/// the ranks' own kernels (a persistent kernel that cannot get its SMs
/// would wait for them until its start times out).
pub(super) fn check_engine_sms(blocks: u32, ranks: usize, sms: usize) -> std::result::Result<(), String> {
    let ranks = ranks.max(1);
    let held = blocks as usize * ranks;
    if held < sms {
        return Ok(());
    }
    let fits = sms.saturating_sub(1) / ranks;
    let advice = if fits == 0 {
        "not even one block per rank fits beside them: run fewer ranks on the GPU".to_string()
    } else {
        format!("use at most {fits} engine blocks per rank (DOORBELL_SOFTNIC_ENGINE_BLOCKS, IbgdaOptions::engine_blocks)")
    };
    Err(format!(
        "the soft NIC's engine kernels would hold {held} of the GPU's {sms} SMs ({blocks} block(s) per rank, up to {ranks} rank(s) \
         on one GPU), leaving the ranks' kernels none: {advice}"
    ))
}

/// Collective: copies this rank's port tables to device memory, builds
/// the fabric's port table from every rank's, loads the engine kernel
/// (once per device and process), and — once every rank has done all of
/// that — launches this port's engine kernel (one block) on a stream of
/// its own; waits (bounded) until it runs.
///
/// Every step that may wait for the whole device (a module load, an
/// allocation) is done by every rank before the world barrier that
/// precedes the first launch, so no rank's step waits for another rank's
/// engine, which never ends by itself.
pub(super) fn launch(nic: &SoftNic, ctx: &StartCtx<'_>) -> Result<KernelEngine> {
    let rank = ctx.rank;
    let dev = ctx.device;
    let device = &nic.device;
    let t0 = std::time::Instant::now();
    let port_bytes = std::mem::size_of::<Port>();
    // Where this port's tables live: device memory of their own; in a world
    // spanning processes, the tail past the heap in the heap's allocation,
    // which every rank has mapped (see the module docs).
    let (port, port_addr) = match &nic.cross {
        Some(c) => (None, c.heap_base + c.tables_offset),
        None => {
            let b = dev.alloc_zeroed::<u8>(port_bytes)?;
            let a = b.as_raw();
            (Some(b), a)
        }
    };
    let mut image = device.port_image();
    let want_blocks = nic
        .options
        .engine_blocks
        .unwrap_or(if dev.is_gpu() { ENGINE_BLOCKS_GPU } else { 1 });
    // Which block serves which QP, written into the tables the engine takes.
    // Every block asked for runs: those beyond the QP groups serve no QP and copy chunks of the others'
    // large payloads (the engine's shared copies).
    let served = image.assign_shards(want_blocks);
    let blocks = want_blocks.clamp(served, MAX_ENGINE_BLOCKS as u32);
    // A GPU whose SM count is unknown (1) is not checked.
    let sms = dev.multiprocessor_count();
    let refused = (dev.is_gpu() && sms > 1)
        .then(|| check_engine_sms(blocks, ctx.ranks_per_gpu, sms).err())
        .flatten();
    // SAFETY: the port's memory, whole; `image` is plain data of that size.
    unsafe { dev.write_raw(port_addr, bytes_of(&*image))? };
    // A rank that refuses its engine blocks sends nothing, so that every
    // rank fails here, naming it, rather than in a later collective.
    let mut mine = Vec::new();
    if refused.is_none() {
        mine.extend_from_slice(&(device.port_index() as u64).to_le_bytes());
        mine.extend_from_slice(&port_addr.to_le_bytes());
        mine.extend_from_slice(&nic.cross.as_ref().map_or(0, |c| c.heap_base).to_le_bytes());
    }
    let all = ctx.world.all_gather_bytes(&mine)?;
    if let Some(m) = refused {
        return Err(Error::comm(format!("rank {rank}: {m}")));
    }
    let others: Vec<usize> = (0..all.len()).filter(|&r| all[r].is_empty()).collect();
    if !others.is_empty() {
        return Err(Error::comm(format!(
            "rank {rank}: rank(s) {others:?} refused their soft NIC engine blocks (their own errors say why)"
        )));
    }
    let table = fabric_table(nic, &all)?;
    let ports = dev.alloc_zeroed::<u8>(std::mem::size_of::<PortTable>())?;
    let ctl = dev.alloc_zeroed::<u8>(std::mem::size_of::<EngineCtl>() * blocks as usize)?;
    tracing::debug!(
        "rank {rank}: IBGDA engine set-up: tables allocated ({port_bytes} bytes of port tables, {} ports) in {} ms",
        table.count,
        t0.elapsed().as_millis()
    );
    let threads = nic
        .options
        .engine_threads
        .unwrap_or(if dev.is_gpu() { ENGINE_THREADS_GPU } else { 32 });
    let entry = EngineEntry::for_threads(threads);
    let (function, status) = engine_image(dev, rank, entry)?;
    let sys_scope = dev.is_gpu() && (!nic.same_gpu || nic.options.sys_scope);
    let shared_bytes = if nic.options.thread_copies {
        SHARED_BYTES
    } else {
        SHARED_BYTES_BULK
    };
    // SAFETY: the table buffer, whole.
    unsafe { dev.write_raw(ports.as_raw(), bytes_of(&table))? };
    write_controls(nic, dev, (&ctl, &ports), &status, blocks, sys_scope)?;
    tracing::debug!(
        "rank {rank}: IBGDA engine set-up: tables copied to the device in {} ms",
        t0.elapsed().as_millis()
    );
    let engine = KernelEngine {
        stream: None,
        _persistent: None,
        ctl,
        _ports: ports,
        _port: port,
        port_addr,
        device: dev.clone(),
        threads,
        blocks,
        status,
        port: device.port_index() as u32,
        watch: None,
    };
    if let Err(msg) = check_threads(&function, threads, dev) {
        engine.status.release();
        return Err(Error::comm(format!("rank {rank}: {msg}")));
    }
    let mut engine = engine;
    engine.stream = Some(dev.inner.new_stream_untracked()?);
    engine._persistent = dev.inner.persistent_kernel();
    check_engine_view(nic, &engine, ctx)?;

    // No rank launches before every rank is done loading and allocating.
    ctx.world.barrier()?;
    let launched = std::time::Instant::now();
    // SAFETY: `function` is the engine's entry point for this many threads
    // (`softnic_engine_256`, `_512` or `_1024`, one pointer argument each); the
    // control block names this port's tables, the fabric's port table and
    // (through them) rings and regions that stay allocated until the
    // engine reports that it exited (the stop), and its state word, which
    // is never freed.
    unsafe {
        let stream = engine.stream.as_ref().expect("set above");
        let cfg = crate::LaunchConfig::linear(blocks, threads).with_shared_mem(shared_bytes);
        let args = (engine.ctl.as_raw() as *mut EngineCtl,);
        match entry {
            EngineEntry::UpTo256 => stream.launch::<softnic_engine_256>(&function, &cfg, args)?,
            EngineEntry::UpTo512 => stream.launch::<softnic_engine_512>(&function, &cfg, args)?,
            EngineEntry::UpTo1024 => stream.launch::<softnic_engine_1024>(&function, &cfg, args)?,
        }
    };
    tracing::debug!(
        "rank {rank}: IBGDA engine set-up: engine kernel launched ({blocks} block(s) of {threads} threads, {shared_bytes} bytes of shared memory each)"
    );
    if let Err((seen, failed)) = engine.wait_state(STATE_RUNNING) {
        let msg = format!(
            "rank {rank}: the soft NIC's engine kernel did not start within {} s (its state word reads {seen}: {}){failed}; \
             a persistent kernel needs a free SM per block ({blocks} here): leave room for it beside kernels that occupy every SM",
            ENGINE_WAIT.as_secs(),
            state_name(seen)
        );
        tracing::error!("{msg}");
        // Should it start later, it exits at once; its memory and stream
        // stay allocated (leaked), as it may still run.
        let _ = engine.request_stop();
        std::mem::forget(engine);
        return Err(Error::comm(msg));
    }
    tracing::debug!(
        "rank {rank}: IBGDA engine set-up: engine kernel started {} ms after its launch",
        launched.elapsed().as_millis()
    );
    engine.watch = Some(Watch::start(rank, engine.port, engine.status.progress_host, engine.status.host));
    device.set_resident(Some(Arc::new(DevicePort {
        device: dev.clone(),
        port: engine.port_addr,
        ctl: engine.ctl.as_raw(),
        blocks,
        lid: device.lid(),
    })));
    // Every port reaches its running engine through the fabric before any
    // rank returns: a configuration set right after set-up (fault
    // injection) then reaches every engine, not only those done.
    ctx.world.barrier()?;
    tracing::info!(
        "rank {rank}: soft NIC engine kernel running: port {}, {blocks} block(s) of {threads} threads, fences at {} scope",
        device.port_index(),
        if sys_scope { "sys" } else { "gpu" }
    );
    Ok(engine)
}

/// Writes the engine's `blocks` control blocks into `bufs.0`: each names
/// the fabric's port table (`bufs.1`) and this port, with the fabric's
/// configuration and the ordering scope; only the first carries the
/// host's state and progress words.
fn write_controls(
    nic: &SoftNic,
    dev: &Device,
    bufs: (&DeviceBuffer<u8>, &DeviceBuffer<u8>),
    status: &StatusSlot,
    blocks: u32,
    sys_scope: bool,
) -> Result<()> {
    let (ctl, ports) = bufs;
    let clock = nic.fabric.now_ns();
    for b in 0..blocks as usize {
        // Only the first block's state and progress reach the host.
        let (state, progress) = if b == 0 {
            (status.dev as *mut u32, status.progress_dev as *mut EngineProgress)
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let mut cfg = EngineCtl::new(
            ports.as_raw() as *const PortTable,
            nic.device.port_index() as u32,
            nic.fabric.config(),
            sys_scope,
            clock,
            state,
            progress,
        );
        cfg.burst = nic.options.burst.unwrap_or(BURST_MAX);
        cfg.idle_sleep_ns = nic.options.idle_sleep_ns.unwrap_or(IDLE_SLEEP_NS);
        cfg.bulk_copy = !nic.options.thread_copies as u32;
        // SAFETY: control block `b` of the buffer, whole.
        unsafe { dev.write_raw(ctl.as_raw() + (b * std::mem::size_of::<EngineCtl>()) as u64, bytes_of(&cfg))? };
    }
    Ok(())
}

/// Refuses a block of `threads` threads that the engine kernel's
/// registers do not allow on `dev` (what the driver reports of `function`).
fn check_threads(function: &FunctionBackend, threads: u32, dev: &Device) -> std::result::Result<(), String> {
    match function.attributes() {
        Some(a) if threads as i32 > a.max_threads_per_block => Err(format!(
            "IBGDA options: engine_threads {threads}: the soft NIC engine kernel uses {} registers per thread, so a block of it holds at most {} threads on {}",
            a.registers,
            a.max_threads_per_block,
            dev.name()
        )),
        _ => Ok(()),
    }
}

/// The fabric's port table from every rank's published port (its index,
/// its tables' address and its heap base, 8 bytes each): where each port's
/// tables are, as this process reaches them.
fn fabric_table(nic: &SoftNic, all: &[Vec<u8>]) -> Result<PortTable> {
    let mut table = PortTable::EMPTY;
    for (r, b) in all.iter().enumerate() {
        if b.len() != 24 {
            return Err(Error::comm(format!(
                "rank {r} sent a malformed soft NIC port address ({} bytes, not 24)",
                b.len()
            )));
        }
        let word = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let index = word(0) as usize;
        if index >= MAX_PORTS {
            return Err(Error::comm(format!(
                "rank {r} sent soft NIC port {index}; a fabric has at most {MAX_PORTS}"
            )));
        }
        let (at, heap) = (word(1), word(2));
        let mapped = nic.cross.as_ref().and_then(|c| Some((c, c.mapped.get(r).copied().flatten()?)));
        if let Some((c, base)) = mapped {
            // Its tables (in the tail past its heap) and its regions as this
            // process maps its heap allocation.
            let off = c.tables_offset;
            if index != r || at != heap.wrapping_add(off) {
                return Err(Error::comm(format!(
                    "rank {r} sent soft NIC port {index} with tables at {at:#x}, not port {r} at the end of its heap \
                     allocation ({:#x}); every rank must run this doorbell version",
                    heap.wrapping_add(off)
                )));
            }
            table.ports[index] = (base + off) as *mut Port;
            table.windows[index] = Window {
                from: heap,
                len: c.heap_len,
                to: base,
            };
        } else {
            table.ports[index] = at as *mut Port;
        }
        table.count = table.count.max(index as u32 + 1);
    }
    Ok(table)
}

/// The engine's view of the rings (its port table as copied to the device)
/// against the kernels' (the QP table): a mismatch means the engine would
/// poll other words than the kernels ring.
fn check_engine_view(nic: &SoftNic, engine: &KernelEngine, ctx: &StartCtx<'_>) -> Result<()> {
    let (dev, rank) = (ctx.device, ctx.rank);
    let port_bytes = std::mem::size_of::<Port>();
    let mut b = vec![0u8; port_bytes];
    // SAFETY: the port buffer, whole; no engine runs yet (every rank
    // launches after the set-up's barrier).
    unsafe { dev.read_raw(engine.port_addr, &mut b)? };
    let mut on_device = nic.device.port_image();
    // SAFETY: Port is plain #[repr(C)] data; these bytes are one.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), &mut *on_device as *mut Port as *mut u8, port_bytes) };
    check_ring_addresses(rank, &on_device, &read_qp_table(dev, ctx.kernel_qps, ctx.nqps)?)
}

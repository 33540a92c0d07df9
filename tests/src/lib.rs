//! Shared helpers for doorbell's cross-crate integration tests (tests/tests/).

pub mod guarded;
pub mod pipe;
pub mod ptx_text;
pub mod ring;
pub use guarded::Guarded;
pub use pipe::PipeByLaunch;
pub use ring::{ring_round, RingArgs};

use doorbell::{Backend, Device, Function, Kernel};

/// The PTX of the test kernel crate (`tests/kernels`), built by `tests/build.rs`.
pub const TEST_KERNELS_PTX: &str = TEST_KERNELS.ptx;
/// [`TEST_KERNELS_PTX`] with its cubin where the build found a `ptxas`.
pub const TEST_KERNELS: doorbell::ModuleImage = doorbell::module_image!("doorbell_test_kernels");
/// The test kernel crate built with the device trace's hooks (its `trace`
/// feature; `doorbell::trace`).
pub const TEST_KERNELS_TRACED: doorbell::ModuleImage = doorbell::ModuleImage::new(
    "doorbell_test_kernels",
    include_str!(concat!(env!("OUT_DIR"), "/traced/doorbell_test_kernels.ptx")),
    include_bytes!(concat!(env!("OUT_DIR"), "/traced/doorbell_test_kernels.cubin")),
);

/// Kernel `K` of [`TEST_KERNELS`], loaded on `dev` (the function keeps its
/// module loaded); [`test_kernel`] is the same with a stream, failing the
/// test on an error.
pub fn load_test_kernel<K: Kernel>(dev: &Device) -> doorbell::Result<Function<K>> {
    dev.load_module(&TEST_KERNELS)?.function::<K>()
}

/// The devices a behaviour test runs on: always the CPU emulator, plus GPU 0
/// when one is present. `DOORBELL_TEST_REQUIRE_GPU=1` makes a missing GPU a
/// failure (used on the GPU machine, so a GPU run cannot silently become an
/// emulator-only run).
pub fn backends() -> Vec<Device> {
    let mut v = vec![Device::emulator(0)];
    match Device::open(Backend::Gpu, 0) {
        Ok(d) => {
            gpu_turn();
            v.push(d)
        }
        Err(e) => {
            if std::env::var("DOORBELL_TEST_REQUIRE_GPU").is_ok_and(|x| x == "1") {
                panic!("DOORBELL_TEST_REQUIRE_GPU=1 but no GPU: {e}");
            }
            // Said, not silent: this test ran on the emulator only.
            eprintln!("no GPU ({e}): GPU half skipped, emulator only (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        }
    }
    v
}

/// The one GPU test of this test binary running now.
static GPU_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

std::thread_local! {
    /// This thread's turn on the GPU, once taken: held until the thread
    /// ends (libtest runs each test on a thread of its own).
    static MY_TURN: std::cell::RefCell<Option<std::sync::MutexGuard<'static, ()>>> = const { std::cell::RefCell::new(None) };
}

/// Waits until no other test of this binary holds the GPU, then holds it
/// for the rest of the calling test (its thread). [`backends`], [`gpu`],
/// [`require_gpu`] and [`have_gpus`] take it when they hand out a GPU, so
/// a plain `cargo test` runs the GPU halves one at a time, side by side
/// with the emulator halves: persistent kernels of several tests (the soft
/// NIC's engines, the rank kernels waiting for them) on one GPU at once
/// can each wait for SMs another holds. Taking it again on the same
/// thread returns at once; a test that failed while holding it frees it
/// as well. Threads a test spawns must not call it (they would wait for
/// their own test).
pub fn gpu_turn() {
    MY_TURN.with(|turn| {
        let mut turn = turn.borrow_mut();
        if turn.is_none() {
            *turn = Some(GPU_TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        }
    });
}

/// Environment variables of this test binary's process: tests that set
/// some hold it for writing ([`env_writer`]), tests that read them
/// (options taken from the environment, `doorbell::env::check`) for
/// reading ([`env_reader`]), so no test sees a value another test set to
/// check its refusal.
static ENV: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Holds the process's environment for a test that sets variables.
pub fn env_writer() -> std::sync::RwLockWriteGuard<'static, ()> {
    ENV.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Holds the process's environment for a test that reads variables.
pub fn env_reader() -> std::sync::RwLockReadGuard<'static, ()> {
    ENV.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a [`per_backend!`] test body takes: a [`Device`] or its [`Backend`].
pub trait OnBackend {
    /// `device` as this type.
    fn on(device: Device) -> Self;
}

impl OnBackend for Device {
    fn on(device: Device) -> Self {
        device
    }
}

impl OnBackend for Backend {
    fn on(device: Device) -> Self {
        device.backend()
    }
}

/// GPU 0, for a test's GPU half; a missing GPU fails the test (the half is
/// compiled in only with the `gpu` feature, i.e. where a GPU is promised).
pub fn require_gpu() -> Device {
    let dev = Device::open(Backend::Gpu, 0)
        .unwrap_or_else(|e| panic!("this is a GPU test (built with the `gpu` feature) and there is no GPU: {e}"));
    gpu_turn();
    dev
}

/// Declares a behaviour test once per backend, as a module holding two
/// tests: `name::emulator` (always) and `name::gpu`. Without the crate's
/// `gpu` feature the GPU half is listed as ignored, saying why, so a run
/// that could not reach a GPU shows it in the test list instead of passing;
/// `scripts/gpu-bundle.sh` builds with `--features gpu`, where a missing GPU
/// fails the half.
///
/// ```ignore
/// per_backend! {
///     /// What the test checks.
///     fn adds_two_numbers(dev: Device) {
///         let buf = dev.alloc_zeroed::<u32>(4).unwrap();
///         // ...
///     }
/// }
/// ```
#[macro_export]
macro_rules! per_backend {
    ($($(#[$meta:meta])* fn $name:ident($arg:ident: $ty:ty) $body:block)*) => {$(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($arg: $ty) $body

            #[test]
            fn emulator() {
                body(<$ty as $crate::OnBackend>::on(doorbell::Device::emulator(0)))
            }

            #[test]
            #[cfg_attr(
                not(feature = "gpu"),
                ignore = "the GPU half: needs a GPU, run by the GPU bundle (scripts/gpu-bundle.sh builds with --features gpu)"
            )]
            fn gpu() {
                body(<$ty as $crate::OnBackend>::on($crate::require_gpu()))
            }
        }
    )*};
}

/// How many GPUs this run insists on: `DOORBELL_TEST_REQUIRE_GPUS=<n>`, or 1
/// with `DOORBELL_TEST_REQUIRE_GPU=1`, else 0. An unparsable count fails.
pub fn required_gpus() -> usize {
    let one = std::env::var("DOORBELL_TEST_REQUIRE_GPU").is_ok_and(|x| x == "1") as usize;
    let n = match std::env::var("DOORBELL_TEST_REQUIRE_GPUS") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("DOORBELL_TEST_REQUIRE_GPUS={v:?} is not a count of GPUs")),
        Err(_) => 0,
    };
    n.max(one)
}

/// Whether `test` can run on `n` GPUs here. When it cannot, says so on
/// stderr (naming the test and what it would have checked) and returns
/// false, so the caller returns without passing silently; and fails when
/// the run insists on at least `n` GPUs ([`required_gpus`]:
/// `DOORBELL_TEST_REQUIRE_GPU=1` for one, `DOORBELL_TEST_REQUIRE_GPUS=2` for
/// two-GPU tests), so that a GPU machine's run cannot quietly become an
/// emulator-only one.
pub fn have_gpus(n: usize, test: &str) -> bool {
    let found = doorbell::gpu_count();
    if found >= n {
        gpu_turn();
        return true;
    }
    let required = required_gpus();
    assert!(
        required < n,
        "{test}: needs {n} GPU(s), this machine has {found}, and the run requires {required} \
         (DOORBELL_TEST_REQUIRE_GPU / DOORBELL_TEST_REQUIRE_GPUS)"
    );
    eprintln!(
        "SKIPPED {test}: needs {n} GPU(s), this machine has {found}; NOT RUN \
         (DOORBELL_TEST_REQUIRE_GPUS={n} makes this a failure)"
    );
    false
}

/// The GPU, if present.
pub fn gpu() -> Option<Device> {
    backends().into_iter().find(|d| d.is_gpu())
}

/// `ptx` when it was built; `None` when the PTX build was skipped on purpose
/// (`DOORBELL_SKIP_PTX=1`), which it says. A build without it otherwise
/// fails the calling test (`what`: whose PTX, e.g. "the examples'").
pub fn built_ptx(what: &str, ptx: &'static str) -> Option<&'static str> {
    if doorbell::ptx_is_built(ptx) {
        return Some(ptx);
    }
    let skipped = std::env::var("DOORBELL_SKIP_PTX").is_ok_and(|v| v == "1");
    assert!(skipped, "{what} PTX was not built (and DOORBELL_SKIP_PTX=1 is not set)");
    eprintln!("PTX not built (DOORBELL_SKIP_PTX=1): skipped");
    None
}

/// The examples' PTX and a `ptxas` to compile it with, for a check named
/// `check`; `None` (said on stderr) when either is missing, so the check
/// is skipped rather than passed.
pub fn examples_ptx_and_ptxas(ptx: &'static str, check: &str) -> Option<(&'static str, std::path::PathBuf)> {
    let ptx = built_ptx("the examples'", ptx)?;
    let Some(ptxas) = try_find_ptxas() else {
        eprintln!("ptxas not found (scripts/setup.sh installs it, or set DOORBELL_PTXAS): {check} skipped");
        return None;
    };
    Some((ptx, ptxas))
}

/// `DOORBELL_PTXAS`, `ptxas` on the `PATH`, or the one in the
/// `nvidia-cuda-nvcc-cu12` wheel (`scripts/setup.sh` installs it).
pub fn try_find_ptxas() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    use std::process::Command;
    if let Some(p) = std::env::var_os("DOORBELL_PTXAS") {
        return Some(PathBuf::from(p));
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from("ptxas"));
    }
    for py in ["python3", "python"] {
        if let Ok(out) = Command::new(py)
            .args(["-c", "import nvidia; print(list(nvidia.__path__)[0])"])
            .output()
        {
            let cand = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("cuda_nvcc/bin/ptxas");
            if cand.exists() {
                return Some(cand);
            }
        }
    }
    None
}

/// Registers per thread ptxas allocates (sm_90) for each of `entries` of
/// `ptx` (the count of an entry covers the device functions it calls).
/// Only those entries are compiled: a whole module takes ptxas most of a
/// minute. Panics when ptxas rejects the module or reports no count for an
/// entry.
pub fn ptxas_registers(ptxas: &std::path::Path, ptx: &str, entries: &[&str]) -> Vec<(String, u32)> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("doorbell-ptxas-regs-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("module.ptx");
    std::fs::write(&src, ptx).unwrap();
    let out = std::process::Command::new(ptxas)
        .args(["-arch=sm_90", "-v", "-e", &entries.join(","), "-o"])
        .arg(dir.join("out.cubin"))
        .arg(&src)
        .output()
        .expect("run ptxas");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ptxas rejected the PTX:\n{text}");
    // "Compiling entry function 'E'" ... "Used N registers".
    let mut used = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().map(str::to_string);
        } else if let Some(rest) = line.split("Used ").nth(1).filter(|r| r.contains(" registers")) {
            if let (Some(e), Some(n)) = (current.take(), rest.split_whitespace().next().and_then(|n| n.parse().ok())) {
                used.push((e, n));
            }
        }
    }
    for e in entries {
        assert!(
            used.iter().any(|(u, _)| u == e),
            "ptxas reported no register count for {e}:\n{text}"
        );
    }
    used
}

/// The bad calls of the test kernel `bad_call` (its cases 0 ..= 5 and 7;
/// case 6 is the good control call) and what each must report: (case, the
/// kernel's error code, the call named, the peer named, words in the
/// reason). Case 7 takes `dst`'s heap offset as its `bytes` ([`bad_call_bytes`]).
pub const BAD_CALLS: [(u32, u32, &str, Option<u32>, &str); 7] = [
    (0, 3, "put", Some(2), "rank 2 is not in this world of 2 ranks"),
    (1, 4, "put", Some(1), "not inside the heap"),
    (2, 5, "signal", Some(1), "not 8-byte aligned"),
    (3, 5, "put_signal", Some(1), "not 8-byte aligned"),
    (4, 3, "get", Some(2), "not in this world"),
    (5, 6, "wait_until_some", None, "out of range"),
    (7, 4, "get", Some(1), "reaches into the heap's reserved header"),
];

/// The `bytes` argument of `bad_call`'s `case` for a `dst` at heap offset
/// `dst_offset` in a heap of `heap_bytes`: one past the heap's end (case 1),
/// the distance back to the heap's header (case 7), else 4096.
pub fn bad_call_bytes(case: u32, dst_offset: u64, heap_bytes: u64) -> u64 {
    match case {
        1 => heap_bytes - dst_offset + 1,
        7 => dst_offset,
        _ => 4096,
    }
}

/// `bad_call`'s good control case.
pub const BAD_CALL_CONTROL: u32 = 6;

/// Starts rank 1 of a two-rank launcher world as a child process of this
/// test binary: it runs the `#[ignore]`d test `entry` alone, with the
/// launcher's variables (`RANK=1`, `WORLD_SIZE=2`, `LOCAL_RANK=local_rank`,
/// `MASTER_ADDR=127.0.0.1`, `MASTER_PORT=port`, `DOORBELL_TOKEN=token`) and
/// `env` set, stdout and stderr piped. Rank 0 accepts it on `port`.
pub fn spawn_rank1(entry: &str, port: u16, token: &str, local_rank: u32, env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args(["--exact", entry, "--ignored", "--nocapture", "--test-threads", "1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", local_rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("DOORBELL_MASTER_PORT")
        .env("DOORBELL_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the child rank")
}

/// The value of `var` in a child process's entry point (an `#[ignore]`d
/// test that its parent test runs with `--ignored` and `var` set). `None`,
/// said on stderr, where `var` is unset: the entry was run as a test, not
/// by its parent, and returns at once.
pub fn child_var(var: &str) -> Option<String> {
    let v = std::env::var(var).ok();
    if v.is_none() {
        eprintln!("not a test: a child process's entry point, run by its parent test");
    }
    v
}

/// Test kernel `K` (of [`TEST_KERNELS`]) loaded on `dev`, and a new stream
/// of `dev` to launch it on.
pub fn test_kernel<K: doorbell::Kernel>(dev: &Device) -> (doorbell::Function<K>, doorbell::Stream) {
    let m = dev.load_module(&TEST_KERNELS).expect("load the test kernels");
    let f = m.function::<K>().unwrap_or_else(|e| panic!("{}: {e}", K::NAME));
    (f, dev.new_stream().expect("a new stream"))
}

/// Asserts that `err` is the CPU emulator's report of a failure in the
/// kernel named `kernel`; the failure message shows `err`.
pub fn assert_emulator_failure(err: &doorbell::Error, kernel: &str) {
    assert!(
        matches!(err, doorbell::Error::Emulator { kernel: k, .. } if *k == kernel),
        "expected the emulator to report a failure of {kernel}, got: {err}"
    );
}

/// Once every rank of `comm` is ready (a barrier), launches `f` as `cfg`
/// with `args` on a new stream of `comm`'s device; returns the stream.
///
/// # Safety
/// `args` as `K` documents.
pub unsafe fn launch_after_barrier<K: doorbell::Kernel>(
    comm: &doorbell::comm::Communicator,
    f: &doorbell::Function<K>,
    cfg: doorbell::LaunchConfig,
    args: K::Args,
) -> doorbell::Result<doorbell::Stream> {
    comm.barrier()?;
    let s = comm.device().new_stream()?;
    // SAFETY: the caller's promise.
    unsafe { s.launch(f, cfg, args)? };
    Ok(s)
}

/// A launch of the test kernel `p2p_barrier_rounds` on one rank
/// ([`launch_barrier_rounds`]): its stream, symmetric counter and status
/// word.
pub struct BarrierRounds<'c> {
    pub stream: doorbell::Stream,
    pub counter: doorbell::comm::SymBuffer<'c, u64>,
    pub status: doorbell::DeviceBuffer<u32>,
}

/// Allocates `p2p_barrier_rounds`' symmetric counter (collective) and status
/// word on `comm`, runs `before_launch`, then launches `rounds` barriers
/// over P2P on one block of `threads` threads.
pub fn launch_barrier_rounds<'c>(
    comm: &'c doorbell::comm::Communicator,
    rounds: u32,
    threads: u32,
    before_launch: impl FnOnce() -> doorbell::Result<()>,
) -> doorbell::Result<BarrierRounds<'c>> {
    let dev = comm.device();
    let f = load_test_kernel::<doorbell_test_kernels::testing::p2p_barrier_rounds>(dev)?;
    let counter = comm.alloc::<u64>(1)?;
    let mut status = dev.alloc_zeroed::<u32>(1)?;
    let stream = dev.new_stream()?;
    before_launch()?;
    // SAFETY: symmetric counter, one status word.
    unsafe {
        stream.launch(
            &f,
            doorbell::LaunchConfig::linear(1, threads),
            (comm.p2p()?, counter.as_mut_ptr(), rounds, status.as_mut_ptr()),
        )?
    };
    Ok(BarrierRounds { stream, counter, status })
}

/// The arguments of the test kernel `bad_call`
/// (`doorbell_test_kernels::contract::bad_call`): transport, dst, src,
/// bytes, signal words, case, two code words.
pub type BadArgs<T> = (T, *mut u8, *const u8, u64, *mut u64, u32, *mut u32);
/// The arguments of the test kernel `flagged_rounds`.
pub type RoundArgs<T> = (T, *mut u32, *mut u32, u32, *mut u64, *mut u64, u32, u32, *mut u32, *mut u32);
/// The buffers of the test kernel `flagged_rounds`
/// (`doorbell_test_kernels::contract::flagged_rounds`) on one rank, for
/// `blocks` blocks of `words` words: the symmetric data, source, signal and
/// ack words, and per block the words seen wrong and the status.
pub struct FlaggedRounds<'c> {
    pub blocks: u32,
    pub words: u32,
    pub data: doorbell::comm::SymBuffer<'c, u32>,
    pub src: doorbell::comm::SymBuffer<'c, u32>,
    pub sig: doorbell::comm::SymBuffer<'c, u64>,
    pub ack: doorbell::comm::SymBuffer<'c, u64>,
    pub wrong: doorbell::DeviceBuffer<u32>,
    pub status: doorbell::DeviceBuffer<u32>,
}

impl<'c> FlaggedRounds<'c> {
    /// Allocates the buffers on `comm` (collective: every rank calls it).
    pub fn new(comm: &'c doorbell::comm::Communicator, blocks: u32, words: u32) -> doorbell::Result<Self> {
        let n = (blocks * words) as usize;
        let dev = comm.device();
        Ok(FlaggedRounds {
            blocks,
            words,
            data: comm.alloc(n)?,
            src: comm.alloc(n)?,
            sig: comm.alloc(blocks as usize)?,
            ack: comm.alloc(blocks as usize)?,
            wrong: dev.alloc_zeroed(blocks as usize)?,
            status: dev.alloc_zeroed(blocks as usize)?,
        })
    }

    /// `flagged_rounds`' arguments: `iters` rounds in `mode` over `t`.
    pub fn args<T>(&mut self, t: T, iters: u32, mode: u32) -> RoundArgs<T> {
        (
            t,
            self.data.as_mut_ptr(),
            self.src.as_mut_ptr(),
            self.words,
            self.sig.as_mut_ptr(),
            self.ack.as_mut_ptr(),
            iters,
            mode,
            self.wrong.as_mut_ptr(),
            self.status.as_mut_ptr(),
        )
    }

    /// Checks what `iters` rounds left on rank `rank` (`what` names the case
    /// in a failure): every block's status is 1; on rank 1, the receiver, no
    /// word was seen wrong after its signal, the last round's data is all
    /// there (and differs from round 1's), and every signal word is `iters`.
    pub fn check(&self, rank: usize, iters: u32, what: &str) -> doorbell::Result<()> {
        use doorbell_test_kernels::contract::payload;
        let status = self.status.to_host()?;
        assert!(status.iter().all(|&x| x == 1), "{what}: flagged rounds status {status:?}");
        if rank == 1 {
            let blocks = self.blocks as usize;
            assert_eq!(
                self.wrong.to_host()?,
                vec![0; blocks],
                "{what}: words seen wrong after their signal"
            );
            let d = self.data.to_host()?;
            for b in 0..self.blocks {
                for w in 0..self.words {
                    let at = (b * self.words + w) as usize;
                    assert_eq!(d[at], payload(iters, b, w), "{what}: last round's data, block {b} word {w}");
                }
            }
            assert_ne!(payload(iters, 0, 0), payload(1, 0, 0), "rounds {iters} and 1 carry the same data");
            assert_eq!(self.sig.to_host()?, vec![iters as u64; blocks], "{what}: signals");
        }
        Ok(())
    }
}

/// The arguments of the test kernel `collect_signals`.
pub type CollectArgs<T> = (T, *mut u64, u32, u64, *mut u64);

/// Launches `bad_call` (`f`) with `args` on `s` as one block of 64 threads,
/// waits for it, then for every rank (a barrier); returns what the wait
/// reported: a bad call's error, `None` for the good control call.
///
/// # Safety
/// `args` as `bad_call` documents: symmetric dst and signal words, a
/// source holding every byte the case may read, two code words.
pub unsafe fn run_bad_call<K, T>(
    comm: &doorbell::comm::Communicator,
    s: &doorbell::Stream,
    f: &doorbell::Function<K>,
    args: BadArgs<T>,
) -> doorbell::Result<Option<doorbell::Error>>
where
    K: doorbell::Kernel<Args = BadArgs<T>>,
{
    // SAFETY: the caller's promise.
    unsafe { s.launch(f, doorbell::LaunchConfig::linear(1, 64), args)? };
    let err = comm.synchronize(s).err();
    comm.barrier()?;
    Ok(err)
}

/// How many signal words the contract tests have `collect_signals`
/// (`doorbell_test_kernels::contract::collect_signals`) collect.
pub const COLLECT_WORDS: u32 = 12;

/// `collect_signals`' arguments: rank 0 sets rank 1's [`COLLECT_WORDS`]
/// words at `sigs` 20 µs apart; rank 1 writes its four outcome words to `out`.
pub fn collect_args<T>(t: T, sigs: *mut u64, out: *mut u64) -> CollectArgs<T> {
    (t, sigs, COLLECT_WORDS, 20_000, out)
}

/// Checks rank 1's outcome words `o` of `collect_signals` (`what` names the
/// case in a failure): every word collected, by 1 to [`COLLECT_WORDS`]
/// calls of `wait_until_some`, no error, and `wait_until_any`'s index in range.
pub fn check_collected(o: &[u64], what: &str) {
    let count = COLLECT_WORDS as u64;
    assert_eq!(o[0], (1u64 << count) - 1, "{what}: every word collected");
    assert!(o[1] >= 1 && o[1] <= count, "{what}: wait_until_some calls {}", o[1]);
    assert_eq!(o[2], 0, "{what}: error code");
    assert!(o[3] < count, "{what}: wait_until_any's index {}", o[3]);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// A second thread's turn starts only once the first thread's test
    /// (its thread) has ended; taking the turn twice on one thread does
    /// not wait for itself.
    #[test]
    fn gpu_turns_follow_one_another_and_are_reentrant() {
        let first_done = Arc::new(AtomicBool::new(false));
        let (taken_tx, taken_rx) = mpsc::channel();
        let done = first_done.clone();
        let first = std::thread::spawn(move || {
            super::gpu_turn();
            super::gpu_turn();
            taken_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            done.store(true, Ordering::SeqCst);
        });
        taken_rx.recv().unwrap();
        let done = first_done.clone();
        let second = std::thread::spawn(move || {
            super::gpu_turn();
            done.load(Ordering::SeqCst)
        });
        let saw_first_done = second.join().unwrap();
        first.join().unwrap();
        assert!(
            saw_first_done,
            "the second thread's turn began while the first thread still held it"
        );
    }
}

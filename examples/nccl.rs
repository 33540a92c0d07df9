//! NCCL for the benchmarks' baselines, loaded at run time (`libnccl.so.2`,
//! else `libnccl.so`), so one binary runs with and without NCCL: grouped
//! `ncclSend`/`ncclRecv` for the embedding exchange, `ncclAllReduce` for
//! the all-reduce bench; [`baseline`] says whether a benchmark's NCCL
//! column can run here.
//!
//! cudarc's `nccl` feature is not used: its loader looks for `libnccl.so`
//! and `libnccl.so.<CUDA major>` but not `libnccl.so.2`, the name NCCL
//! packages install. Only the calls the baselines need are bound.

use std::ffi::{c_char, c_int, c_void, CStr};

use doorbell::coll::DType;
use doorbell::comm::Communicator;
use doorbell::Stream;

type NcclComm = *mut c_void;
type Res = c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId([u8; 128]);

struct Api {
    _lib: libloading::Library,
    path: &'static str,
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(NcclComm) -> Res,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> Res,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> Res,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
}

// `ncclDataType_t` and `ncclRedOp_t` values (nccl.h, 2.x).
const NCCL_INT8: c_int = 0;
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
const NCCL_SUM: c_int = 0;

fn api() -> Result<&'static Api, String> {
    static API: std::sync::OnceLock<Result<Api, String>> = std::sync::OnceLock::new();
    API.get_or_init(|| {
        let mut last = String::new();
        for path in ["libnccl.so.2", "libnccl.so"] {
            // SAFETY: loading NCCL runs its initialisers, which only set up the library.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => {
                    // SAFETY: the symbols have these C signatures (nccl.h, 2.x).
                    unsafe {
                        macro_rules! sym {
                            ($n:literal) => {
                                *lib.get($n)
                                    .map_err(|e| format!("{path}: {}: {e}", String::from_utf8_lossy($n)))?
                            };
                        }
                        return Ok(Api {
                            get_version: sym!(b"ncclGetVersion"),
                            get_unique_id: sym!(b"ncclGetUniqueId"),
                            comm_init_rank: sym!(b"ncclCommInitRank"),
                            comm_destroy: sym!(b"ncclCommDestroy"),
                            all_reduce: sym!(b"ncclAllReduce"),
                            send: sym!(b"ncclSend"),
                            recv: sym!(b"ncclRecv"),
                            group_start: sym!(b"ncclGroupStart"),
                            group_end: sym!(b"ncclGroupEnd"),
                            error_string: sym!(b"ncclGetErrorString"),
                            path,
                            _lib: lib,
                        });
                    }
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!("NCCL is not installed ({last})"))
    })
    .as_ref()
    .map_err(|e| e.clone())
}

/// True when `libnccl.so.2` (or `libnccl.so`) loads.
pub fn available() -> Result<(), String> {
    api().map(|_| ())
}

/// Which NCCL loaded.
pub struct Library {
    /// `ncclGetVersion`, as `major.minor.patch`.
    pub version: String,
    /// The name it loaded under (`libnccl.so.2` or `libnccl.so`).
    pub path: &'static str,
}

/// Whether a benchmark's NCCL baseline can run: it needs a GPU, one GPU
/// per rank (NCCL refuses several ranks on one GPU: `ranks_per_gpu` > 1
/// is refused with a hint) and the library. `Ok` says which NCCL; `Err`
/// why the NCCL column is skipped.
pub fn baseline(gpu: bool, ranks_per_gpu: usize) -> Result<Library, String> {
    if !gpu {
        Err("no GPU".to_string())
    } else if ranks_per_gpu > 1 {
        Err(format!(
            "{ranks_per_gpu} ranks share a GPU; NCCL needs one GPU per rank (use --spread with as many GPUs as ranks)"
        ))
    } else {
        library()
    }
}

/// The report's note on [`baseline`]'s answer: which NCCL runs, or why
/// its column is skipped.
pub fn baseline_note(b: &Result<Library, String>) -> String {
    match b {
        Ok(n) => format!("NCCL {} from {}", n.version, n.path),
        Err(e) => format!("NCCL column skipped: {e}"),
    }
}

/// Loads NCCL (once per process) and says which.
pub fn library() -> Result<Library, String> {
    let a = api()?;
    let mut v = 0;
    // SAFETY: writes one int.
    unsafe { (a.get_version)(&mut v) };
    Ok(Library {
        version: format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100),
        path: a.path,
    })
}

fn check(r: Res, call: &str) -> doorbell::Result<()> {
    if r == 0 {
        return Ok(());
    }
    let msg = api()
        .ok()
        // SAFETY: NCCL returns a static string.
        .map(|a| unsafe { CStr::from_ptr((a.error_string)(r)) }.to_string_lossy().into_owned())
        .unwrap_or_default();
    Err(doorbell::Error::Comm(format!("{call} failed: {msg} (ncclResult {r})")))
}

/// The CUDA stream NCCL enqueues on (`cudaStream_t`).
fn cu_stream(s: &Stream) -> doorbell::Result<*mut c_void> {
    let cs = s.as_cuda().ok_or_else(|| doorbell::Error::Comm("NCCL needs a GPU".into()))?;
    Ok(cs.cu_stream() as *mut c_void)
}

/// Makes the stream call `name` (`call`, given the loaded API and `s`'s
/// CUDA stream) and checks its result.
fn on_stream(s: &Stream, name: &str, call: impl FnOnce(&Api, *mut c_void) -> Res) -> doorbell::Result<()> {
    let a = api().map_err(doorbell::Error::Comm)?;
    let stream = cu_stream(s)?;
    check(call(a, stream), name)
}

/// One rank's NCCL communicator over the ranks of a doorbell communicator
/// (one GPU per rank: NCCL refuses two ranks on one GPU).
pub struct Comm {
    comm: NcclComm,
}

impl Comm {
    /// Collective over `comm`'s ranks: `stream`'s context is made current,
    /// rank 0 makes the id, every rank gathers it and joins.
    pub fn new(comm: &Communicator, stream: &Stream) -> doorbell::Result<Comm> {
        let a = api().map_err(doorbell::Error::Comm)?;
        let cs = stream.as_cuda().ok_or_else(|| doorbell::Error::Comm("NCCL needs a GPU".into()))?;
        // Before any NCCL call: ncclCommInitRank takes the GPU from the
        // thread's current context.
        cs.context()
            .bind_to_thread()
            .map_err(|e| doorbell::Error::Comm(format!("cuCtxSetCurrent: {e:?}")))?;
        let mut id = UniqueId([0; 128]);
        if comm.rank() == 0 {
            // SAFETY: writes 128 bytes.
            check(unsafe { (a.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        }
        let ids = comm.world().all_gather_bytes(&id.0)?;
        let root = ids.first().map_or(0, Vec::len);
        if root != id.0.len() {
            return Err(doorbell::Error::Comm(format!("NCCL unique id: rank 0 sent {root} bytes, not 128")));
        }
        id.0.copy_from_slice(&ids[0]);
        let mut c: NcclComm = std::ptr::null_mut();
        // SAFETY: an out-pointer and rank 0's id, by value; every rank calls it.
        check(
            unsafe { (a.comm_init_rank)(&mut c, comm.world_size() as c_int, id, comm.rank() as c_int) },
            "ncclCommInitRank",
        )?;
        Ok(Comm { comm: c })
    }

    /// The `ncclComm_t`, for calls not bound here.
    pub fn as_raw(&self) -> *mut c_void {
        self.comm
    }

    /// Runs `f` (sends and receives) between ncclGroupStart and ncclGroupEnd.
    pub fn group(&self, f: impl FnOnce() -> doorbell::Result<()>) -> doorbell::Result<()> {
        let a = api().map_err(doorbell::Error::Comm)?;
        // SAFETY: plain calls.
        check(unsafe { (a.group_start)() }, "ncclGroupStart")?;
        let r = f();
        // SAFETY: plain call, closes the group opened above.
        let e = check(unsafe { (a.group_end)() }, "ncclGroupEnd");
        r.and(e)
    }

    /// `ncclAllReduce` (sum) of `count` elements of `dtype` from device
    /// address `src` into `dst` (may equal `src`) on `s`.
    pub fn all_reduce(&self, src: u64, dst: u64, count: usize, dtype: DType, s: &Stream) -> doorbell::Result<()> {
        let t = match dtype {
            DType::F32 => NCCL_FLOAT32,
            DType::Bf16 => NCCL_BFLOAT16,
        };
        on_stream(s, "ncclAllReduce", |a, stream| {
            // SAFETY: `src` and `dst` hold `count` elements of `dtype` on this
            // rank's GPU (the caller's buffers); a live communicator and stream.
            unsafe { (a.all_reduce)(src as *const c_void, dst as *mut c_void, count, t, NCCL_SUM, self.comm, stream) }
        })
    }

    /// `ncclSend` of `bytes` at device address `src` to `peer` on `s`.
    pub fn send(&self, src: u64, bytes: u64, peer: usize, s: &Stream) -> doorbell::Result<()> {
        on_stream(s, "ncclSend", |a, stream| {
            // SAFETY: `src` holds `bytes` of device memory (the caller's buffers).
            unsafe { (a.send)(src as *const c_void, bytes as usize, NCCL_INT8, peer as c_int, self.comm, stream) }
        })
    }

    /// `ncclRecv` of `bytes` into device address `dst` from `peer` on `s`.
    pub fn recv(&self, dst: u64, bytes: u64, peer: usize, s: &Stream) -> doorbell::Result<()> {
        on_stream(s, "ncclRecv", |a, stream| {
            // SAFETY: `dst` holds `bytes` of device memory.
            unsafe { (a.recv)(dst as *mut c_void, bytes as usize, NCCL_INT8, peer as c_int, self.comm, stream) }
        })
    }
}

impl Drop for Comm {
    /// `ncclCommDestroy`, its result ignored.
    fn drop(&mut self) {
        if let Ok(a) = api() {
            // SAFETY: created by ncclCommInitRank; destroyed once.
            let _ = unsafe { (a.comm_destroy)(self.comm) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_needs_a_gpu_per_rank_and_says_why_it_is_skipped() {
        let e = baseline(false, 1).err().unwrap();
        assert_eq!(e, "no GPU");
        let e = baseline(true, 3).err().unwrap();
        assert!(e.contains("3 ranks share a GPU") && e.contains("--spread"), "{e}");
        assert_eq!(baseline_note(&Err(e.clone())), format!("NCCL column skipped: {e}"));
        let lib = Library {
            version: "2.21.5".into(),
            path: "libnccl.so.2",
        };
        assert_eq!(baseline_note(&Ok(lib)), "NCCL 2.21.5 from libnccl.so.2");
    }
}

//! The one error type of the host runtime.

/// Result alias for the host runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the host runtime can fail with. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver library could not be loaded.
    #[error(
        "no CUDA driver on this machine (libcuda.so could not be loaded); run on a machine with an NVIDIA GPU and driver, \
         or use the CPU emulator (Backend::Cpu, or DOORBELL_DEVICE=cpu)"
    )]
    NoDriver,
    /// The driver loaded but reports no GPU.
    #[error("the CUDA driver reports no GPU; use the CPU emulator (Backend::Cpu, or DOORBELL_DEVICE=cpu)")]
    NoGpu,
    /// A GPU ordinal past the last GPU.
    #[error("GPU {ordinal} does not exist: this machine has {count} GPU(s)")]
    NoSuchGpu {
        /// Asked for.
        ordinal: usize,
        /// Available.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "runtime")]
    #[error("CUDA call {call} failed: {source}")]
    Cuda {
        /// The driver call.
        call: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// The kernel is not in the loaded PTX module.
    #[error("kernel `{name}` is not in the PTX module; was it declared with #[kernel] in the crate the PTX was built from?")]
    KernelNotFound {
        /// PTX entry name.
        name: &'static str,
    },
    /// The PTX was not built into this binary.
    #[error(
        "this binary carries no PTX (it was built with DOORBELL_SKIP_PTX=1 or without the device toolchain); \
         rebuild after running scripts/setup.sh, or use the CPU emulator (DOORBELL_DEVICE=cpu)"
    )]
    PtxNotBuilt,
    /// A kernel failed on the CPU emulator.
    #[cfg(feature = "runtime")]
    #[error("kernel `{kernel}` failed: {source}")]
    Emulator {
        /// The kernel.
        kernel: &'static str,
        /// What went wrong.
        source: doorbell_kernels::emu::EmuError,
    },
    /// A launch configuration the device cannot run.
    #[error("invalid launch of `{kernel}`: {reason}")]
    InvalidLaunch {
        /// The kernel.
        kernel: &'static str,
        /// Why.
        reason: String,
    },
    /// A kernel family launched with a transport it was not exported for
    /// ([`Stream::launch_family`](crate::Stream::launch_family) with an
    /// [`AnyTransport`](crate::AnyTransport)).
    #[error(
        "kernel family `{family}` is not exported for the {transport} transport: its entries are for {exported}; \
         add the transport to its #[kernel(transports(...))] or launch it with one of those"
    )]
    TransportNotExported {
        /// The family.
        family: &'static str,
        /// The transport asked for.
        transport: &'static str,
        /// The transports it is exported for, comma-separated.
        exported: String,
    },
    /// A transport name other than p2p, ibgda or routed
    /// (`TransportKind::from_str`).
    #[error("{0:?} is not a transport: use p2p, ibgda, routed or proxy")]
    BadTransport(String),
    /// Host and device buffers of different lengths.
    #[error("length mismatch: device buffer holds {device} elements, host slice {host}")]
    LengthMismatch {
        /// Device buffer length.
        device: usize,
        /// Host slice length.
        host: usize,
    },
    /// A backend name other than gpu, cpu or auto (from a flag or an API
    /// call; `DOORBELL_DEVICE` reports [`Error::BadEnv`] naming itself).
    #[error("{0:?} is not a backend: use gpu, cpu or auto")]
    BadBackend(String),
    /// An allocation failed: the device (or, on the emulator, the host) has
    /// no room, or the size cannot be represented.
    #[error("could not allocate {bytes} bytes on the {device}: {detail}; ask for less memory")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
        /// Where ("GPU 0", "CPU emulator").
        device: String,
        /// The allocator's or driver's reason.
        detail: String,
    },
    /// Another rank failed and aborted the world ([`World::abort`](crate::World::abort)).
    #[error("rank {rank}: rank {peer} failed and aborted the job: {reason}")]
    PeerFailed {
        /// The rank that reports it.
        rank: usize,
        /// The rank that failed.
        peer: usize,
        /// Its error.
        reason: String,
    },
    /// Ranks were launched with different work ([`World::check_same_params`](crate::World::check_same_params)).
    #[error("rank {rank}: the ranks disagree on {detail}; launch every rank with the same arguments")]
    ParamsDiffer {
        /// The rank that reports it.
        rank: usize,
        /// Every differing parameter with each rank's value.
        detail: String,
    },
    /// Objects from two different devices were combined.
    #[error("{0}")]
    DeviceMismatch(&'static str),
    /// A worker thread of the emulator could not be started.
    #[error("could not start an emulator stream thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A launcher environment variable holds something unusable.
    #[error("environment variable {var}={value:?} {reason}")]
    BadEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A variable a multi-process launch needs is not set.
    #[error("{var} is not set: {hint}")]
    MissingEnv {
        /// The variable.
        var: &'static str,
        /// Why it is needed and how to set it.
        hint: String,
    },
    /// Rank 0 could not listen for the rendezvous.
    #[error(
        "rank 0 could not listen on {addr} for the rendezvous: {source}; pick a free port with DOORBELL_MASTER_PORT \
         (torch.distributed's own store may already hold MASTER_PORT) or another interface with DOORBELL_BIND_ADDR"
    )]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The two sides of a rendezvous connection do not share the job token.
    #[error(
        "rank {rank}: the job token did not match at the rendezvous with {addr} (DOORBELL_TOKEN differs); \
         give every process of the job the same DOORBELL_TOKEN, and make sure MASTER_ADDR/MASTER_PORT point at this job's rank 0"
    )]
    TokenMismatch {
        /// The rank that reports it.
        rank: usize,
        /// The other side.
        addr: String,
    },
    /// The job token is too short to keep guessers out.
    #[error(
        "rank {rank}: the job token (DOORBELL_TOKEN) has {len} bytes, fewer than the {min} it needs; generate one per job \
         with `export DOORBELL_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n')` (32 hex characters) \
         and give the same one to every process"
    )]
    TokenTooShort {
        /// The rank that reports it.
        rank: usize,
        /// The token's length in bytes.
        len: usize,
        /// The least accepted (`doorbell::world::MIN_TOKEN_BYTES`).
        min: usize,
    },
    /// The job token looks guessable (one symbol repeated, a short pattern
    /// repeated, a run like `abcdef…`, too few distinct characters).
    #[error(
        "rank {rank}: the job token (DOORBELL_TOKEN) is low-entropy: {reason}; a squatter on the rendezvous port could \
         guess it offline. Generate a random one per job with \
         `export DOORBELL_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n')` and give the same one to every process"
    )]
    WeakToken {
        /// The rank that reports it.
        rank: usize,
        /// What makes it guessable.
        reason: String,
    },
    /// A world larger than doorbell forms.
    #[error(
        "rank {rank}: a world of {size} ranks is more than the {max} doorbell forms (doorbell::world::MAX_WORLD_SIZE: \
         rank 0 holds a connection and a slot per rank)"
    )]
    WorldTooLarge {
        /// The rank that reports it.
        rank: usize,
        /// The world size asked for.
        size: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A frame of a process world would exceed its limit.
    #[error(
        "rank {rank}: {what} is {bytes} bytes, more than the {max} a world frame may carry \
         (doorbell::world::MAX_FRAME_BYTES); host collectives carry set-up data: move bulk data with kernels, \
         or split it over several collectives"
    )]
    FrameTooLarge {
        /// The rank that reports it.
        rank: usize,
        /// Which frame, from whom.
        what: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A rank presented a different value than rank 0 at the rendezvous.
    #[error(
        "rendezvous refused rank {rank}: its {field} is {theirs} where rank 0 has {ours}; \
         launch every process of the job with the same settings and doorbell version"
    )]
    RendezvousMismatch {
        /// The offending rank.
        rank: usize,
        /// The field that differs.
        field: String,
        /// Rank 0's value (the reference).
        ours: String,
        /// The offending rank's value.
        theirs: String,
    },
    /// Not every rank arrived before the rendezvous timeout.
    #[error(
        "rank {rank}: rendezvous timed out after {waited:?}; rank(s) {missing:?} never arrived; check that they were launched \
         with the same MASTER_ADDR/MASTER_PORT and DOORBELL_TOKEN and can reach rank 0, or raise DOORBELL_RENDEZVOUS_TIMEOUT_S"
    )]
    RendezvousTimeout {
        /// The rank that reports it.
        rank: usize,
        /// How long it waited.
        waited: std::time::Duration,
        /// The ranks that never arrived (as far as this rank knows).
        missing: Vec<usize>,
    },
    /// The peer on the other end does not speak the rendezvous protocol.
    #[error("rank {rank}: {peer} broke the world protocol: {detail}")]
    WorldProtocol {
        /// The rank that reports it.
        rank: usize,
        /// The other side (a rank or an address).
        peer: String,
        /// What was wrong and what to check.
        detail: String,
    },
    /// A peer disconnected or its connection failed.
    #[error("rank {rank}: lost rank {peer} during {op}: {detail}; look at rank {peer}'s own error output (it may have exited or crashed)")]
    PeerLost {
        /// The rank that reports it.
        rank: usize,
        /// The lost peer.
        peer: usize,
        /// The operation.
        op: String,
        /// How it was lost.
        detail: String,
    },
    /// Some ranks did not join a collective in time.
    #[error(
        "rank {rank}: {op} timed out after {waited:?} waiting for rank(s) {missing:?}; every rank must call the same collectives \
         in the same order (raise DOORBELL_WORLD_TIMEOUT_S if they are merely slow)"
    )]
    CollectiveTimeout {
        /// The rank that reports it.
        rank: usize,
        /// The collective.
        op: String,
        /// How long it waited.
        waited: std::time::Duration,
        /// The ranks that did not arrive.
        missing: Vec<usize>,
    },
    /// Ranks called different collectives at the same step.
    #[error("rank {rank} called {theirs} where rank 0 called {ours}; every rank must call the same collectives in the same order")]
    CollectiveMismatch {
        /// The first rank that differs.
        rank: usize,
        /// Rank 0's call.
        ours: String,
        /// That rank's call.
        theirs: String,
    },
    /// Ranks presented different values where all must be equal (`World::check_same`).
    #[error("rank {rank} has a different `{field}` than rank 0 ({detail}); every rank must present the same {field}")]
    NotSame {
        /// The field.
        field: String,
        /// The first rank that differs.
        rank: usize,
        /// How it differs.
        detail: String,
    },
    /// An earlier failure left the world unusable.
    #[error("rank {rank}: the world is unusable after an earlier failure ({reason}); tear down and form a new world")]
    WorldBroken {
        /// The rank that reports it.
        rank: usize,
        /// The earlier failure.
        reason: String,
    },
    /// Rank 0 aborted a collective because of another rank's failure.
    #[error("rank {rank}: rank 0 aborted {op}: {reason}")]
    WorldAborted {
        /// The rank that reports it.
        rank: usize,
        /// The collective.
        op: String,
        /// Rank 0's reason.
        reason: String,
    },
    /// A rank number that is not in the world.
    #[error("{what}: rank {rank} does not exist in a world of {size} rank(s)")]
    InvalidRank {
        /// Where the rank was given.
        what: &'static str,
        /// The rank.
        rank: usize,
        /// The world size.
        size: usize,
    },
    /// A local system call of the world (entropy, sockets) failed.
    #[error("rank {rank}: {what} failed: {source}")]
    WorldIo {
        /// The rank that reports it.
        rank: usize,
        /// What was attempted.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A device-side wait ran out of budget: a peer never signalled.
    #[error(
        "rank {rank}: {op} gave up after {budget_ms} ms in block {block}: the word at symmetric-heap offset {offset:#x} \
         never became {cmp} {expected} (last seen {seen}){waiting_for}; check that every rank launched its kernel and signals, \
         or raise DOORBELL_WAIT_TIMEOUT_S{hint}{who}",
        waiting_for = peer.map(|p| format!(", waiting for rank {p}")).unwrap_or_default(),
        who = stuck.as_ref().map(|s| format!(". Who is stuck: {}", s.text)).unwrap_or_default()
    )]
    WaitTimeout {
        /// Rank that gave up.
        rank: u32,
        /// `wait_until` or `barrier`.
        op: &'static str,
        /// The peer waited for, when known.
        peer: Option<u32>,
        /// Block of the thread that gave up.
        block: u32,
        /// Offset of the word in the symmetric heap.
        offset: u64,
        /// The comparison (`==`, `>=`, ...).
        cmp: &'static str,
        /// The value compared against.
        expected: u64,
        /// The value last seen.
        seen: u64,
        /// The budget, ms.
        budget_ms: u64,
        /// What else to suspect (empty, or text starting with `; `).
        hint: String,
        /// Which rank is stuck and why, from every rank's state read when
        /// the wait ran out (shown after `. Who is stuck: `); `None` when
        /// the states were not read (see [`crate::comm`], "Errors from
        /// kernels").
        stuck: Option<Box<StuckRanks>>,
    },
    /// Device calls of a rank failed at the same moment and every report
    /// slot they wrote holds a mix of two of them: the calls are not known.
    #[error(
        "rank {rank}: device calls failed at the same moment and their error reports overwrote each other \
         ({slots} report slots written, none intact{what}); a peer that stopped answering while several \
         blocks waited for it is the usual cause"
    )]
    DeviceReportsCollided {
        /// Rank whose kernels failed.
        rank: u32,
        /// Report slots written.
        slots: u32,
        /// What the written slots had in common, if anything (empty, or
        /// text starting with `; `).
        what: String,
    },
    /// The heap header said an error of the rank was recorded, but no report
    /// slot held one: the slots were cleared while a kernel of the rank was
    /// still recording.
    #[error(
        "rank {rank}: a device call recorded an error but no report of it was found (was a kernel of this \
         rank still running when its errors were checked?)"
    )]
    DeviceReportMissing {
        /// Rank whose kernel recorded the error.
        rank: u32,
    },
    /// A device-side transport call was refused (bad argument: nothing was
    /// written) or failed (an error completion).
    #[error("rank {rank}: {call} failed in block {block}: {reason}")]
    DeviceCall {
        /// Rank whose kernel made the call.
        rank: u32,
        /// The call (`put`, `put_signal`, `signal`, ...).
        call: &'static str,
        /// The peer rank the call targeted, when it had one; for a failure of
        /// the CPU proxy, the peer of the request the proxy stopped at.
        peer: Option<u32>,
        /// Offset in the symmetric heap of the range or word involved
        /// (wrapping: huge when below the heap).
        offset: u64,
        /// Block of the thread that made the call.
        block: u32,
        /// What was wrong and how to fix it.
        reason: String,
    },
    /// The symmetric heap has no room for an allocation.
    #[error(
        "symmetric heap exhausted: {requested} bytes requested, the largest free range holds {free} of a heap of {heap}; \
         drop the buffers no kernel uses any more (on every rank) or raise CommOptions::heap_bytes"
    )]
    HeapExhausted {
        /// Bytes asked for.
        requested: u64,
        /// Bytes of the largest free range.
        free: u64,
        /// Heap size.
        heap: u64,
    },
    /// A peer's memory cannot be mapped by this rank.
    #[error("rank {rank} cannot reach rank {peer} with the P2P transport: {reason}")]
    PeerUnreachable {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// Why, and what to do.
        reason: String,
    },
    /// Communicator set-up failed.
    #[error("communicator: {0}")]
    Comm(String),
    /// The RDMA device asked for (`DOORBELL_NIC=mlx5`, or a port named by
    /// `DOORBELL_IB_HCA`) cannot be used on this machine: `missing` says
    /// what is missing and what to change. Examples exit with status 2 on
    /// it, as on a bad flag.
    #[error("NIC: {missing}")]
    NicUnavailable {
        /// What is missing, and what to do.
        missing: String,
    },
    /// The communicator's self-test (`Communicator::self_test`): the message
    /// `sender` put to `receiver` over `route` did not arrive as sent (or
    /// did not arrive within the wait budget). Every rank reports the same.
    #[error(
        "self-test failed: the message rank {sender} sent to rank {receiver} over the {route} route did not arrive as sent: \
         expected {expected}, arrived {arrived}{more}"
    )]
    SelfTest {
        /// The rank that sent.
        sender: usize,
        /// The rank it was sent to.
        receiver: usize,
        /// The route (`P2P`, `IBGDA`).
        route: &'static str,
        /// The message and signal sent.
        expected: String,
        /// What the receiver found.
        arrived: String,
        /// Other failed pairs and device reports (empty, or text starting with `; `).
        more: String,
    },
    /// A collective (`doorbell::coll`) was given arguments it cannot use.
    #[error("{op}: {reason}")]
    Collective {
        /// The collective (`all-reduce`).
        op: &'static str,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The device trace could not start, be read or be written.
    #[error("device trace: {0}")]
    Trace(String),
}

#[cfg(feature = "runtime")]
impl From<doorbell_kernels::env_vars::EnvError> for Error {
    fn from(e: doorbell_kernels::env_vars::EnvError) -> Error {
        Error::BadEnv {
            var: e.var,
            value: e.value,
            reason: e.reason,
        }
    }
}

#[cfg(feature = "runtime")]
pub(crate) trait CudaCall<T> {
    fn call(self, call: &'static str) -> Result<T>;
}

#[cfg(feature = "runtime")]
impl<T> CudaCall<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { call, source })
    }
}

/// Communicator errors (appended; see [`Error`]).
#[cfg(feature = "runtime")]
impl Error {
    /// Builds [`Error::Comm`].
    pub(crate) fn comm(msg: impl Into<String>) -> Error {
        Error::Comm(msg.into())
    }
}

/// Which rank is stuck, as [`Error::WaitTimeout`] names it: the chain of
/// ranks that wait for each other, from the rank whose wait ran out, read
/// from every rank's state at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckRanks {
    /// The ranks of the chain in order, starting with the rank that
    /// reports: each waits for the next (as far as the waits name their
    /// peer; barriers do, a `wait_until` on a word does not).
    pub chain: Vec<usize>,
    /// The last rank of the chain when it is not stuck in a device wait of
    /// its own (it runs no kernel, runs one without a timed-out wait, or is
    /// gone): the rank to look at. `None` when the chain ends at a wait that
    /// does not name its peer, or the waits form a cycle.
    pub culprit: Option<usize>,
    /// The chain as text, each rank's state said (when the chain ends at a
    /// wait that does not name its peer, followed by every other rank's
    /// state, ranks stuck in waits first).
    pub text: String,
}

#[cfg(test)]
mod size_tests {
    /// Every fallible call returns this by value: it stays under the size at
    /// which returning it costs a copy of a large value on every `?`.
    #[test]
    fn the_error_stays_small() {
        assert!(
            std::mem::size_of::<super::Error>() < 128,
            "{} bytes",
            std::mem::size_of::<super::Error>()
        );
    }
}

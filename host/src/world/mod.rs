//! The world: which processes (or threads) take part in a job, and the few
//! host-side collectives the communicator needs to set itself up.
//!
//! The data path never touches this module: kernels move data themselves.
//! The world only carries setup traffic — CUDA IPC handles, buffer
//! addresses, layout checks — over a small TCP star around rank 0, or
//! between threads of one process.
//!
//! ## Quick start
//! ```
//! use doorbell::world::World;
//!
//! # fn main() -> doorbell::Result<()> {
//! // Four ranks as threads of this process: how tests and examples run.
//! let sums = World::run_threads(4, |world| -> doorbell::Result<u32> {
//!     let mine = [world.rank() as u8];
//!     let all = world.all_gather_bytes(&mine)?;
//!     world.barrier()?;
//!     Ok(all.iter().map(|b| b[0] as u32).sum())
//! });
//! assert!(sums.into_iter().all(|s| s.unwrap() == 0 + 1 + 2 + 3));
//!
//! // Under a launcher (torchrun, mpirun, srun): one rank per process.
//! // Without launcher variables this is a world of one.
//! let world = World::from_env(b"")?;
//! println!("rank {} of {}", world.rank(), world.world_size());
//! # Ok(()) }
//! ```
//!
//! ## Launching
//!
//! Every process of a job needs the same **job token** in `DOORBELL_TOKEN`.
//! Generate a fresh one per job:
//!
//! ```sh
//! export DOORBELL_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
//!
//! # torchrun: sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//! torchrun --nproc-per-node 8 --nnodes 2 --rdzv-endpoint node0:29400 ./my_app
//!
//! # Open MPI: export the token with -x; one node needs nothing else
//! mpirun -n 8 -x DOORBELL_TOKEN ./my_app
//! mpirun -n 16 -x DOORBELL_TOKEN -x MASTER_ADDR=node0 -x MASTER_PORT=29510 ./my_app
//!
//! # Slurm
//! export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
//! srun --ntasks 16 --ntasks-per-node 8 ./my_app
//! ```
//!
//! [`World::from_env`] detects the launcher ([`WorldConfig::from_env`]),
//! rank 0 listens on `MASTER_PORT`, the other ranks connect to
//! `MASTER_ADDR:MASTER_PORT` — retrying until the timeout, so start order
//! does not matter — and every rank returns once all are in.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `RANK`, `WORLD_SIZE` | rank and process count (torchrun) | — |
//! | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | rank and process count on this host (torchrun) | 0, unknown |
//! | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` | the same under Open MPI's mpirun | — |
//! | `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE` | the same under srun | — |
//! | `MASTER_ADDR` / `DOORBELL_MASTER_ADDR` | rank 0's host (the `DOORBELL_` one wins) | `127.0.0.1` when mpirun/srun say all ranks share one host; required otherwise |
//! | `MASTER_PORT` / `DOORBELL_MASTER_PORT` | rank 0's port (the `DOORBELL_` one wins) | 29510 under mpirun/srun; torchrun always sets it |
//! | `DOORBELL_TOKEN` | job secret, the same on every process, at least 16 bytes | required when there is more than one process |
//! | `DOORBELL_BIND_ADDR` | address rank 0 listens on | `MASTER_ADDR` if it is a loopback address, else `0.0.0.0` |
//! | `DOORBELL_RENDEZVOUS_TIMEOUT_S` | how long ranks wait for each other to join (seconds, may be fractional) | 60 |
//! | `DOORBELL_WORLD_TIMEOUT_S` | how long a collective waits for every rank | 300 |
//!
//! Launchers are recognised in the order torchrun, mpirun, srun; a world
//! size of 1 is a single process. Unparsable or inconsistent values (a rank
//! not below the world size, say) are errors naming the variable and value.
//!
//! **Port clash with torch.distributed:** if the same job also calls
//! `torch.distributed.init_process_group`, its store listens on
//! `MASTER_PORT` too; give doorbell another port with
//! `DOORBELL_MASTER_PORT`.
//!
//! ## Failures are errors, never hangs
//!
//! - A rank that never arrives: every waiting rank gets
//!   [`Error::RendezvousTimeout`] naming the missing ranks (rank 0 tells the
//!   ranks already connected which ones were missing).
//! - Ranks launched differently (world size, protocol version, two processes
//!   claiming one rank): rank 0 refuses with [`Error::RendezvousMismatch`]
//!   naming the rank and the field, and every connected rank gets the same
//!   error.
//! - A process with the wrong token gets [`Error::TokenMismatch`]; rank 0
//!   notes the refusal on stderr and keeps waiting for the right process.
//! - During collectives, every read and write has a deadline; a peer that
//!   disconnects, is late, or calls a different collective turns into an error
//!   naming it ([`Error::PeerLost`], [`Error::CollectiveTimeout`],
//!   [`Error::CollectiveMismatch`]) on every rank, and the world refuses
//!   further use ([`Error::WorldBroken`]).
//!
//! ## Security model
//!
//! The token keeps processes of *other* jobs (a stale run, a neighbour who
//! picked the same port) out of this one, and it is what every frame after
//! the handshake is checked against.
//!
//! - **Joining.** The token is **never sent**, in clear or otherwise: rank 0
//!   sends a fresh random 16-byte nonce from `/dev/urandom`, the joining
//!   process answers with its own nonce and
//!   `HMAC-SHA256(key, "peer" | nonce0 | nonce1)`, and rank 0 then proves
//!   itself with `HMAC-SHA256(key, "root" | nonce1 | nonce0)`; proofs are
//!   checked in constant time. Both sides prove knowledge of the token, so a
//!   process also refuses an impostor rank 0. `key` is the token stretched
//!   by PBKDF2-HMAC-SHA256 over 100 000 rounds: whoever squats the port and
//!   collects a peer's proof pays those rounds for every guess it tests
//!   offline. Tokens shorter than [`MIN_TOKEN_BYTES`] are refused
//!   ([`Error::TokenTooShort`]), and so are obviously guessable ones (a
//!   repeated character or unit, an `abcdef…` run, fewer than six distinct
//!   characters: [`Error::WeakToken`]); make one with
//!   `head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n'`.
//! - **Every later frame** (hello, welcome, every collective: CUDA IPC
//!   handles, heap file names, addresses) carries
//!   `HMAC-SHA256(key, sequence number | header | body)` under a key per
//!   connection and direction, derived from the token and both nonces. The
//!   sequence numbers are implicit, so an altered, forged, replayed, dropped
//!   or reordered frame fails its check; the world then ends with
//!   [`Error::WorldProtocol`] naming the peer on every rank.
//! - **Sizes are capped before allocation.** Handshake frames are at most 256
//!   bytes, a hello [`MAX_LAYOUT`] plus a little, any later frame
//!   [`MAX_FRAME_BYTES`] ([`Error::FrameTooLarge`]); bodies are read in
//!   chunks, so memory grows only with bytes that really arrive.
//! - **Unauthenticated connections are bounded**: rank 0 handshakes with at
//!   most [`MAX_PENDING_HANDSHAKES`] at once, at most
//!   [`MAX_PENDING_PER_ADDRESS`] from one source address, and each has
//!   [`HANDSHAKE_TIMEOUT`] to finish; [`QUICK_SLOTS`] more are kept for
//!   connections that find those taken and prove the token within
//!   [`QUICK_PROOF_TIMEOUT`], so a client that refills every slot it can
//!   get does not keep real ranks out. Further connections are closed at
//!   once (real ranks retry).
//! - **Peers' claims are not trusted with memory.** A pid proves nothing;
//!   ranks of one process recognise each other by an HMAC under a random
//!   per-process secret that never leaves the process, bound to this world
//!   and the rank, so no peer can make this process use one of its
//!   addresses as a pointer into our own memory.
//! - **Heap files** of emulator ranks in different processes
//!   ([`crate::comm`]) are `/dev/shm/doorbell-<pid>-<32 random hex digits>`,
//!   created with `O_EXCL | O_NOFOLLOW` and mode 0600, and removed as soon as
//!   every rank has mapped them (or the set-up fails). A peer's file name is
//!   accepted only in exactly that shape, opened without following links,
//!   and mapped only if it is a regular file of this user, mode 0600, at
//!   least as long as the heap; otherwise the error names the peer.
//!
//! - **Status ports.** Once a communicator forms, each rank of a process
//!   world also listens on an ephemeral port of its star address, so that a
//!   rank whose device wait ran out can read what the others do without
//!   their cooperation (`Error::WaitTimeout` names the stuck rank). A reader
//!   sends a nonce, gets one, and proves the token with
//!   `HMAC-SHA256(status key, nonces)`, where the status key is the
//!   stretched token bound to this world's identity; only then does the
//!   rank answer, tagging its answer the same way. The answer says what the
//!   rank does (its step, launch count, last kernel name, a timed-out wait's
//!   heap offset and values). One connection is served at a time, each
//!   within [`STATUS_IO_TIMEOUT`] per step; a reader whose connection is
//!   refused reports the rank as exited. Hosts that firewall ephemeral
//!   ports make peers read "did not accept a status connection" instead.
//!
//! Limits: traffic is authenticated, not encrypted (anyone on the path can
//! read handles and addresses); someone who records a handshake can guess
//! tokens offline, so use a long random token, not a word; a process that
//! holds the token is a member of the job.
//!
//! ## Thread worlds
//!
//! [`World::local_threads`] makes `n` handles, one per rank, that run the
//! same collectives through shared memory. Use it for tests, examples and
//! single-process multi-GPU programs; code written against [`World`] does not
//! change when it later runs as one process per GPU.
//!
//! ## Thread safety
//!
//! [`World`] is `Send + Sync`. Collectives are calls that every rank makes in
//! the same order; within one rank, calls from several threads are
//! serialised, but their order then decides which step they match on the
//! other ranks, so drive a world's collectives from one thread per rank.

mod auth;
mod config;
mod params;
mod status;
mod tcp;
mod threads;
pub(crate) mod wire;

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use config::{Launcher, WorldConfig, DEFAULT_PORT, DEFAULT_RENDEZVOUS_TIMEOUT, DEFAULT_WORLD_TIMEOUT};
pub use tcp::{
    RendezvousHost, HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES, MAX_PENDING_PER_ADDRESS, PROTOCOL_VERSION, QUICK_PROOF_TIMEOUT, QUICK_SLOTS,
};

pub(crate) use auth::random_bytes;
pub use status::STATUS_IO_TIMEOUT;
pub(crate) use status::{PeerStatus, StatusSource};

use crate::error::{Error, Result};

/// Largest layout blob a rank may present to the rendezvous.
pub const MAX_LAYOUT: usize = 15 << 20;

/// Largest frame a process world sends or accepts after the handshake. A
/// collective's answer carries every rank's part, so the parts of one
/// collective together (plus 8 bytes per rank) must fit; so must the welcome
/// (every rank's layout blob). The communicator's own collectives carry a few
/// hundred bytes per rank. Anything larger fails on every rank with
/// [`Error::FrameTooLarge`], and a frame announcing more is refused before a
/// byte of it is allocated.
pub const MAX_FRAME_BYTES: u64 = 1 << 30;

/// Shortest job token accepted (`DOORBELL_TOKEN`, [`WorldConfig::new`]).
pub const MIN_TOKEN_BYTES: usize = 16;

/// Bytes of a world's random identity.
pub(crate) const WORLD_ID_LEN: usize = 16;
/// A world's random identity: binds per-world proofs to this world.
pub(crate) type WorldId = [u8; WORLD_ID_LEN];

/// The doorbell library version this process was built from: a process
/// world's ranks must all run the same one (checked at the rendezvous,
/// [`Error::RendezvousMismatch`] naming both).
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A word that changes with the layout of what ranks of different
/// processes share in memory (the heap's reserved header, the IBGDA QP
/// state and handles, the soft NIC's tables tail): ranks built with other
/// layouts are refused at the rendezvous even under one version number.
pub fn heap_layout_word() -> u64 {
    use doorbell_kernels::heap::{ErrorReport, HEAP_RESERVED};
    use doorbell_kernels::transport::ibgda::{IbgdaQp, QpCounters};
    let parts = [
        HEAP_RESERVED,
        std::mem::size_of::<ErrorReport>() as u64,
        std::mem::size_of::<QpCounters>() as u64,
        std::mem::size_of::<IbgdaQp>() as u64,
        // The soft NIC's port tables, which lie in the heap allocation's tail.
        std::mem::size_of::<doorbell_softnic::engine::Port>() as u64,
    ];
    // FNV-1a over the parts' little-endian bytes.
    parts
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Most ranks a world may have: rank 0 of a process world keeps a
/// connection and a table slot per rank (and sets the slots aside before
/// anyone joins), so the size a launcher variable or a caller names is
/// bounded ([`Error::WorldTooLarge`], or [`Error::BadEnv`] naming the
/// launcher's variable).
pub const MAX_WORLD_SIZE: usize = 65536;

/// Refuses tokens too short or too regular to resist guessing, and worlds
/// larger than [`MAX_WORLD_SIZE`].
fn check_token(config: &WorldConfig) -> Result<()> {
    if config.size > MAX_WORLD_SIZE {
        return Err(Error::WorldTooLarge {
            rank: config.rank,
            size: config.size,
            max: MAX_WORLD_SIZE,
        });
    }
    let len = config.token().len();
    if len < MIN_TOKEN_BYTES {
        return Err(Error::TokenTooShort {
            rank: config.rank,
            len,
            min: MIN_TOKEN_BYTES,
        });
    }
    if let Some(reason) = low_entropy(config.token()) {
        return Err(Error::WeakToken { rank: config.rank, reason });
    }
    Ok(())
}

/// Why `token` is obviously guessable, if it is: fewer than six distinct
/// bytes, a shorter unit repeated (`passwordpassword`), or a run of evenly
/// spaced bytes (`abcdefgh`, `98765432`, `aaaaaaaa`) over more than half of
/// it. A random token of 16 hex digits or more trips none of these but
/// with a probability around 10^-5 (a second one then passes).
pub(crate) fn low_entropy(token: &[u8]) -> Option<String> {
    let n = token.len();
    let distinct = {
        let mut seen = [false; 256];
        token.iter().for_each(|&b| seen[b as usize] = true);
        seen.iter().filter(|&&s| s).count()
    };
    if distinct < 6 {
        return Some(format!("it uses only {distinct} distinct character(s)"));
    }
    if let Some(p) = (1..=n / 2).find(|&p| (p..n).all(|i| token[i] == token[i - p])) {
        return Some(format!("it repeats its first {p} characters"));
    }
    // The longest run of bytes with one constant step between neighbours.
    let (mut best, mut run) = (2.min(n), 2);
    for i in 2..n {
        let step = |j: usize| i16::from(token[j]) - i16::from(token[j - 1]);
        run = if step(i) == step(i - 1) { run + 1 } else { 2 };
        best = best.max(run);
    }
    if 2 * best > n {
        return Some(format!("{best} of its {n} characters form an evenly spaced run"));
    }
    None
}

/// A fresh world identity. Thread and single worlds have no remote peers to
/// tell apart, so a failed read of `/dev/urandom` costs nothing there and
/// falls back to the clock.
fn local_world_id() -> WorldId {
    let mut id = [0u8; WORLD_ID_LEN];
    if auth::random_bytes(&mut id).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        id = t.to_le_bytes();
    }
    id
}

/// One rank as the rendezvous saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its rank.
    pub rank: usize,
    /// Its rank on its host.
    pub local_rank: usize,
    /// The host it runs on.
    pub hostname: String,
    /// Its process id, as it claims: proves nothing (a peer may claim any
    /// pid), so nothing that touches memory relies on it.
    pub pid: u32,
    /// The opaque layout blob it presented to the rendezvous (empty in thread
    /// worlds).
    pub layout: Vec<u8>,
}

/// How a world's ranks are connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorldKind {
    /// One rank, nothing to talk to.
    Single,
    /// Ranks are threads of this process.
    Threads,
    /// Ranks are processes connected by TCP to rank 0.
    Tcp,
}

/// The collective a rank is in; ranks must agree on it step by step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    AllGather,
    Broadcast { root: usize },
    Barrier,
    CheckSame,
}

impl Op {
    fn code(self) -> (u8, u64) {
        match self {
            Op::AllGather => (1, 0),
            Op::Broadcast { root } => (2, root as u64),
            Op::Barrier => (3, 0),
            Op::CheckSame => (4, 0),
        }
    }
    fn from_code(tag: u8, arg: u64) -> Option<Op> {
        Some(match tag {
            1 => Op::AllGather,
            2 => Op::Broadcast {
                root: usize::try_from(arg).ok()?,
            },
            3 => Op::Barrier,
            4 => Op::CheckSame,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::AllGather => write!(f, "all_gather_bytes"),
            Op::Broadcast { root } => write!(f, "broadcast_bytes from rank {root}"),
            Op::Barrier => write!(f, "barrier"),
            Op::CheckSame => write!(f, "check_same"),
        }
    }
}

pub(crate) enum Inner {
    Single,
    Threads(Arc<threads::Group>),
    Tcp(Box<tcp::Star>),
}

/// A handle on this rank's place in the world; see the [module docs](self).
pub struct World {
    rank: usize,
    size: usize,
    local_rank: usize,
    peers: Arc<[PeerInfo]>,
    id: WorldId,
    inner: Inner,
    /// This rank's status source ([`World::serve_status`]), shared with its
    /// status responder in a process world.
    status_source: Arc<std::sync::OnceLock<StatusSource>>,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<World>();
};

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank)
            .field("kind", &self.kind())
            .finish()
    }
}

impl World {
    pub(crate) fn from_parts(rank: usize, size: usize, local_rank: usize, peers: Vec<PeerInfo>, id: WorldId, inner: Inner) -> World {
        World {
            rank,
            size,
            local_rank,
            peers: peers.into(),
            id,
            inner,
            status_source: Arc::default(),
        }
    }

    /// A world of one rank.
    pub fn single() -> World {
        let me = PeerInfo {
            rank: 0,
            local_rank: 0,
            hostname: tcp::hostname(),
            pid: std::process::id(),
            layout: Vec::new(),
        };
        World::from_parts(0, 1, 0, vec![me], local_world_id(), Inner::Single)
    }

    /// The world the launcher described ([`WorldConfig::from_env`]): a
    /// rendezvous when there are several processes, [`World::single`] when
    /// there are no launcher variables. `layout` is this rank's opaque blob
    /// for [`World::peers`].
    pub fn from_env(layout: &[u8]) -> Result<World> {
        match WorldConfig::from_env()? {
            None => Ok(World::single()),
            Some(cfg) => World::rendezvous(&cfg, layout),
        }
    }

    /// Joins the world `config` describes: rank 0 listens and waits for the
    /// others, every other rank connects to it. Returns once all ranks are in,
    /// or after `config.rendezvous_timeout` with an error naming the missing
    /// ranks. `layout` (at most [`MAX_LAYOUT`] bytes) is published to every
    /// rank in [`World::peers`].
    pub fn rendezvous(config: &WorldConfig, layout: &[u8]) -> Result<World> {
        if config.rank >= config.size {
            return Err(Error::InvalidRank {
                what: "WorldConfig::rank",
                rank: config.rank,
                size: config.size,
            });
        }
        if layout.len() > MAX_LAYOUT {
            return Err(Error::WorldProtocol {
                rank: config.rank,
                peer: "itself".into(),
                detail: format!(
                    "the layout blob has {} bytes, more than the {MAX_LAYOUT} a rendezvous carries",
                    layout.len()
                ),
            });
        }
        check_token(config)?;
        if config.size == 1 {
            let mut w = World::single();
            Arc::get_mut(&mut w.peers).expect("fresh")[0].layout = layout.to_vec();
            return Ok(w);
        }
        let world = if config.rank == 0 {
            RendezvousHost::bind(config)?.accept(layout)?
        } else {
            tcp::join(config, layout)?
        };
        tracing::info!(
            "rank {} of {}: rendezvous with {}:{} complete",
            config.rank,
            config.size,
            config.master_addr,
            config.master_port
        );
        Ok(world)
    }

    /// `n` ranks as threads of this process: one handle per rank, in rank
    /// order; move each to its own thread. Collectives time out after
    /// [`DEFAULT_WORLD_TIMEOUT`].
    pub fn local_threads(n: usize) -> Vec<World> {
        World::local_threads_with_timeout(n, DEFAULT_WORLD_TIMEOUT)
    }

    /// [`local_threads`](Self::local_threads) with a collective timeout.
    pub fn local_threads_with_timeout(n: usize, timeout: Duration) -> Vec<World> {
        let group = threads::Group::new(n, timeout);
        let id = local_world_id();
        let (host, pid) = (tcp::hostname(), std::process::id());
        let peers: Arc<[PeerInfo]> = (0..n)
            .map(|r| PeerInfo {
                rank: r,
                local_rank: r,
                hostname: host.clone(),
                pid,
                layout: Vec::new(),
            })
            .collect();
        (0..n)
            .map(|r| World {
                rank: r,
                size: n,
                local_rank: r,
                peers: peers.clone(),
                id,
                inner: Inner::Threads(group.clone()),
                status_source: Arc::default(),
            })
            .collect()
    }

    /// Runs `f` on `n` threads, each with its rank's handle of a fresh
    /// thread world, and returns their results in rank order. A panic on any
    /// thread is re-raised here (the others see that rank leave the world).
    pub fn run_threads<T: Send>(n: usize, f: impl Fn(World) -> T + Sync) -> Vec<T> {
        let worlds = World::local_threads(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = worlds
                .into_iter()
                .map(|w| {
                    let f = &f;
                    std::thread::Builder::new()
                        .name(format!("doorbell-rank-{}", w.rank))
                        .spawn_scoped(s, move || f(w))
                        .expect("could not start a rank thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }

    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// This rank's index among the ranks of its host (the launcher's local
    /// rank; selects the GPU).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Every rank as the rendezvous saw it, indexed by rank.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// What this rank presents so that ranks of its own process recognise
    /// it ([`proves_same_process`](Self::proves_same_process)). Only this
    /// process can make it; it is worthless in any other world.
    pub(crate) fn process_tag(&self) -> Result<[u8; 32]> {
        auth::process_tag(&self.id, self.rank).map_err(|source| Error::WorldIo {
            rank: self.rank,
            what: "reading /dev/urandom for the process secret",
            source,
        })
    }

    /// Whether `tag`, presented by rank `peer`, proves that `peer` runs in
    /// this process (and may hand out pointers into this address space).
    /// A pid proves nothing: any peer can claim any pid.
    pub(crate) fn proves_same_process(&self, peer: usize, tag: &[u8]) -> Result<bool> {
        let want = auth::process_tag(&self.id, peer).map_err(|source| Error::WorldIo {
            rank: self.rank,
            what: "reading /dev/urandom for the process secret",
            source,
        })?;
        // Constant time: the expected tag derives from the process secret.
        Ok(tag.len() == want.len() && tag.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0)
    }

    /// How the ranks are connected.
    pub fn kind(&self) -> WorldKind {
        match self.inner {
            Inner::Single => WorldKind::Single,
            Inner::Threads(_) => WorldKind::Threads,
            Inner::Tcp(_) => WorldKind::Tcp,
        }
    }

    fn exchange(&self, op: Op, mine: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        match &self.inner {
            Inner::Single => Ok(Arc::new(vec![mine.to_vec()])),
            Inner::Threads(g) => g.exchange(self.rank, op, mine),
            Inner::Tcp(star) => star.exchange(op, mine),
        }
    }

    /// Every rank's bytes, indexed by rank (collective: all ranks call it).
    /// Lengths may differ between ranks.
    pub fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let table = self.exchange(Op::AllGather, mine)?;
        Ok(Arc::try_unwrap(table).unwrap_or_else(|t| (*t).clone()))
    }

    /// `root`'s `data` on every rank (collective). Other ranks' `data` is
    /// ignored; pass `&[]`.
    pub fn broadcast_bytes(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        if root >= self.size {
            return Err(Error::InvalidRank {
                what: "broadcast_bytes root",
                rank: root,
                size: self.size,
            });
        }
        let mine = if self.rank == root { data } else { &[] };
        let table = self.exchange(Op::Broadcast { root }, mine)?;
        Ok(table[root].clone())
    }

    /// Returns once every rank has called it (collective).
    pub fn barrier(&self) -> Result<()> {
        self.exchange(Op::Barrier, &[]).map(drop)
    }

    /// Checks that every rank presents the same `value` for `field`
    /// (collective), e.g. the layout of a symmetric buffer. Only a SHA-256
    /// digest travels. On a difference every rank gets [`Error::NotSame`]
    /// naming the field and the first rank that differs from rank 0.
    pub fn check_same(&self, field: &str, value: &[u8]) -> Result<()> {
        let digest: [u8; 32] = Sha256::digest(value).into();
        let mine = wire::Enc::default().str(field).u64(value.len() as u64).raw(&digest).0;
        let table = self.exchange(Op::CheckSame, &mine)?;
        let parse = |r: usize| -> Result<(String, u64, Vec<u8>)> {
            let mut d = wire::Dec::new(&table[r]);
            let bad = |detail: String| Error::WorldProtocol {
                rank: self.rank,
                peer: format!("rank {r}"),
                detail,
            };
            Ok((
                d.str("field").map_err(bad)?,
                d.u64("length").map_err(bad)?,
                d.raw(32, "digest").map_err(bad)?.to_vec(),
            ))
        };
        let (field0, len0, digest0) = parse(0)?;
        for r in 1..self.size {
            let (f, len, digest) = parse(r)?;
            if f != field0 {
                return Err(Error::CollectiveMismatch {
                    rank: r,
                    ours: format!("check_same({field0:?})"),
                    theirs: format!("check_same({f:?})"),
                });
            }
            if (len, &digest) != (len0, &digest0) {
                let detail = if len != len0 {
                    format!("{len} bytes where rank 0 has {len0}")
                } else {
                    format!("same length ({len} bytes), different contents")
                };
                return Err(Error::NotSame {
                    field: field.to_string(),
                    rank: r,
                    detail,
                });
            }
        }
        Ok(())
    }
}

impl World {
    /// This rank has failed: every other rank's current or next collective
    /// fails with [`Error::PeerFailed`] (or, relayed by rank 0,
    /// [`Error::WorldAborted`]) carrying `reason`, without waiting out the
    /// world timeout; this handle refuses further collectives. Never blocks
    /// for long (a notification has a one-second grace).
    pub fn abort(&self, reason: &str) {
        let first = match &self.inner {
            Inner::Single => true,
            Inner::Threads(g) => g.abort(self.rank, reason),
            Inner::Tcp(star) => star.abort(reason),
        };
        if first {
            tracing::warn!("rank {}: aborting the world: {reason}", self.rank);
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Inner::Threads(g) = &self.inner {
            g.leave(self.rank);
        }
    }
}

#[cfg(test)]
mod tests;

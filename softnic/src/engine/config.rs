//! Engine configuration: timeouts, the atomic reply byte order, and fault
//! injection.

use doorbell_kernels::mlx5::CqeSyndrome;

/// Faults the engine injects on purpose. Each one ends in a correct result
/// (later) or a typed error CQE, never in a hang or a stray write.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FaultConfig {
    /// Seed of the engine's random choices (reordering).
    pub seed: u64,
    /// Delayed doorbell handling: a doorbell is acted on this long after the
    /// engine sees it, ns.
    pub doorbell_delay_ns: u64,
    /// Dropped doorbells: every n-th doorbell is missed (0: none; 1: all).
    /// The engine recovers on the next doorbell or by re-reading the
    /// doorbell record after [`EngineConfig::dbr_reread_ns`], as hardware's
    /// doorbell-record polling would.
    pub drop_doorbell_every: u32,
    /// Completions reordered across QPs: 1 to process a port's QPs in a
    /// random rotation and hold a QP's completions back for up to two polls
    /// at random. Order within a QP is kept (as on hardware).
    pub reorder_across_qps: u32,
    /// Forced error completions: every n-th WQE a port executes fails with
    /// [`Self::forced_syndrome`] without touching memory (0: none).
    pub force_error_every: u32,
    /// Syndrome of forced errors (`MLX5_CQE_SYNDROME_*`; 0 means
    /// `REMOTE_OP_ERR`).
    pub forced_syndrome: u8,
    /// Zero.
    pub reserved: [u8; 3],
    /// Stalled peer: the port with this index + 1 stops answering (0: no
    /// port) until [`Self::stall_until_ns`]. A requester waits up to
    /// [`EngineConfig::transport_timeout_ns`], then fails with
    /// `TRANSPORT_RETRY_EXC_ERR`.
    pub stall_port: u32,
    /// End of the stall, ns (`u64::MAX`: forever).
    pub stall_until_ns: u64,
}

/// How the engine behaves.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Faults to inject.
    pub faults: FaultConfig,
    /// Re-read a QP's doorbell record this often even without a doorbell,
    /// ns (recovers dropped doorbells; 0: on every poll). Default 1 ms: the
    /// resident engine meets each QP's re-read with a full pass over its
    /// port, and a request rung during that pass waits for it (see
    /// `resident::REFRESH_NS`).
    pub dbr_reread_ns: u64,
    /// How long a requester waits for a peer that does not answer (absent,
    /// not connected back, not in RTR/RTS, stalled) before failing with
    /// `TRANSPORT_RETRY_EXC_ERR`, ns. Hardware: `timeout × retry_cnt`.
    pub transport_timeout_ns: u64,
    /// How long a write-with-immediate / send waits for a receive WQE at
    /// the responder before failing with `RNR_RETRY_EXC_ERR`, ns.
    pub rnr_timeout_ns: u64,
    /// 1: write the old value of an atomic into the local buffer big-endian,
    /// as ConnectX HCAs do on little-endian hosts (verbs'
    /// `IBV_EXP_ATOMIC_HCA_REPLY_BE`); 0: host order. The remote word itself
    /// is read and updated in host order either way.
    pub atomic_reply_be: u32,
    /// Zero.
    pub reserved: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            faults: FaultConfig::default(),
            dbr_reread_ns: 1_000_000,
            transport_timeout_ns: 100_000_000,
            rnr_timeout_ns: 100_000_000,
            atomic_reply_be: 1,
            reserved: 0,
        }
    }
}

impl FaultConfig {
    /// Whether nothing is injected (the seed aside).
    pub const fn quiet(&self) -> bool {
        self.doorbell_delay_ns == 0
            && self.drop_doorbell_every == 0
            && self.reorder_across_qps == 0
            && self.force_error_every == 0
            && self.stall_port == 0
    }

    /// The syndrome forced errors report.
    pub const fn forced(&self) -> CqeSyndrome {
        if self.forced_syndrome == 0 {
            CqeSyndrome::RemoteOp
        } else {
            CqeSyndrome::from_u8(self.forced_syndrome)
        }
    }

    /// Whether port `port` is stalled at `now_ns`.
    pub const fn stalled(&self, port: usize, now_ns: u64) -> bool {
        self.stall_port != 0 && self.stall_port as usize == port + 1 && now_ns < self.stall_until_ns
    }
}

/// The engine's deterministic generator (splitmix64): the QP a pass starts
/// at and the fault injection's choices, seeded by [`FaultConfig::seed`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EngineRng {
    /// State.
    pub state: u64,
}

impl EngineRng {
    /// A generator from `seed`.
    pub const fn new(seed: u64) -> EngineRng {
        EngineRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

//! The embedding exchange: a row-wise sharded embedding lookup fused with
//! its all-to-all (forward), and the gradients routed back to the rows'
//! owners and applied with SGD (backward), one kernel per rank and
//! direction, no CPU in the loop — what DLRM / TorchRec call the sparse
//! "input dist → lookup → output dist" pipeline.
//!
//! ```
//! use doorbell::coll::embedding::{self, EmbeddingExchange, Problem, PAD};
//! use doorbell::comm::{CommOptions, Communicator};
//! use doorbell::Backend;
//! # fn main() -> doorbell::Result<()> {
//! // Two tables of 10 rows of 4 elements, sharded over 2 ranks (row j on
//! // rank j % 2); each rank pools 2 samples, bags of 3 ids.
//! let p = Problem { ranks: 2, tables: 2, rows: 10, dim: 4, batch: 2, pooling: 3 };
//! // Every rank's ids, [table][sample][pooling]; PAD is padding.
//! let ids = vec![vec![1, 1, 3, 4, PAD, 9, 0, 2, 2, 7, 8, PAD], vec![PAD; 12]];
//! embedding::validate_ids(&p, &ids)?;                  // names a bad id before anything runs
//! let cap = embedding::traffic(&p, &ids).max_pair as u32; // longest (requester, owner) list
//! let tables: Vec<f32> = (0..p.tables * p.rows * p.dim).map(|i| i as f32).collect();
//! let opts = CommOptions {
//!     heap_bytes: embedding::heap_bytes_needed(&p, cap).next_multiple_of(1 << 20),
//!     ..CommOptions::default()
//! };
//! // The CPU emulator here; Backend::Auto takes the GPU where there is one.
//! let outs = Communicator::local(2, Backend::Cpu, opts, |comm| {
//!     let r = comm.rank() as u32;
//!     let dev = comm.device();
//!     let mut x = EmbeddingExchange::new(comm, &p, cap)?;   // collective
//!     x.load_shard(&embedding::shard_of(&p, &tables, r))?;
//!     let ids_d = dev.alloc_from(&ids[r as usize])?;
//!     let grad = dev.alloc_from(&vec![1.0f32; p.out_len()])?;
//!     let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
//!     let s = dev.new_stream()?;
//!     x.forward(&s, &ids_d, &mut out)?;                   // every rank, same order
//!     x.finish(&s)?;                                      // an EmbeddingError says which rank, why
//!     let pooled = out.to_host()?;
//!     x.backward(&s, &grad, 0.5)?;                        // SGD on the owners' rows
//!     x.finish(&s)?;
//!     Ok(pooled)
//! })?;
//! for r in 0..2 {
//!     assert_eq!(outs[r], embedding::reference_forward(&p, &tables, &ids[r]));
//! }
//! # Ok(()) }
//! ```
//!
//! ## What it does
//! Every table has `rows` rows of `dim` f32; global row `j` lives on rank
//! `j % ranks` ([`shard_of`]). Each rank looks up bags of `pooling` ids per
//! sample and table ([`PAD`]: padding, so bags of any length fit) and gets
//! each bag's sum, `out[sample][table][dim]`, summed in bag order: the
//! forward is bit-exact against [`reference_forward`]. The backward sends
//! each bag's upstream gradient back to the owners of its rows, which apply
//! `row -= lr * sum` ([`reference_backward`]; exact when every partial sum
//! is, within f32 rounding otherwise, as the float adds are atomic).
//! Rows asked for several times by one rank travel once (dedup,
//! [`Traffic`]). The pull forward ([`EmbeddingExchange::forward_pull`])
//! loads rows straight from the owners' tables instead, where peer
//! pointers exist. The protocol and its phases are in
//! `doorbell_kernels::coll::embedding`.
//!
//! ## Errors
//! Ids are checked on the device before anything moves: an id out of
//! range or a request list past its capacity fails the step on **every**
//! rank within one exchange of messages, nothing is written anywhere, and
//! the next step runs ([`EmbeddingError`], [`EmbeddingError::nothing_written`]).
//! Waits are bounded by the communicator's wait budget.
//!
//! ## Rules
//! * [`EmbeddingExchange::new`] is collective (symmetric memory); every
//!   rank calls `forward`, `backward` and `finish` in the same order, one
//!   backward at most per forward.
//! * Every block of every rank's grid must be resident at once (grid
//!   barriers): keep the grid [`launch_config_for`] gives, which the
//!   exchange fits to its kernels' registers ([`fit_grid`]).
//! * The host must not reuse `ids` or read `out` before [`EmbeddingExchange::finish`].

mod error;
mod exchange;
mod grid;
mod problem;

pub use doorbell_kernels::coll::embedding::{
    EmbBufs, EmbShape, MAX_DIM, MAX_LOOKUPS, MAX_TABLES, PAD, SHARED_BYTES, SLICED_LIST_BYTES, STAMP_BWD, STAMP_FWD,
};
pub use error::EmbeddingError;
pub use exchange::{heap_bytes_needed, EmbeddingExchange, PhaseStamps};
pub use grid::{
    fit_grid, grid_request, launch_config, launch_config_for, resident_blocks_per_sm, SmLimits, GRID_BARRIER_PHASES, MAX_BLOCKS_PER_SM,
};
pub use problem::{reference_backward, reference_forward, shard_of, traffic, unshard, validate_ids, Problem, Traffic};

use crate::coll::TransportKind;
use crate::comm::RdmaPeers;
use crate::error::Error;
use crate::stream::LaunchConfig;

/// Tuning of an [`EmbeddingExchange`]; `Default` picks everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmbeddingOptions {
    /// The device transport (default [`TransportKind::P2p`]). IBGDA and
    /// routed set the transport up on first use (collective, like `new`);
    /// the pull forward needs peer pointers (not over IBGDA).
    pub transport: TransportKind,
    /// Routed transport and CPU proxy: which pairs of ranks go through the
    /// NIC (default: the environment — `DOORBELL_RDMA_PEERS` or
    /// `DOORBELL_NODES` for the routed transport, only `DOORBELL_NODES` for
    /// the proxy, which otherwise sends every pair through the NIC:
    /// `Communicator::proxy`). Ignored otherwise.
    pub rdma_peers: Option<RdmaPeers>,
    /// The launch shape, the same on every rank: a 1-D grid, whole warps
    /// of at most 256 threads, at least [`SHARED_BYTES`] of shared memory
    /// (default [`launch_config_for`] with the communicator's ranks per
    /// GPU). On a GPU its grid is fitted to the kernels' registers.
    pub launch: Option<LaunchConfig>,
    /// From how many bytes a rank's longest request list goes out in
    /// slices from every block (default [`SLICED_LIST_BYTES`]; see
    /// [`EmbeddingExchange::set_sliced_list_bytes`]).
    pub sliced_list_bytes: Option<u64>,
}

/// Bad input to the exchange: an [`Error::Collective`].
fn invalid(reason: impl Into<String>) -> Error {
    Error::Collective {
        op: "embedding exchange",
        reason: reason.into(),
    }
}

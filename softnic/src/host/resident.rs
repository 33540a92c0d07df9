//! Ports whose engine runs elsewhere.

use crate::engine::{EngineConfig, MrEntry, Port};
use crate::error::Result;

/// Where a port's live tables are while an engine other than the fabric's
/// own runs it — the GPU-resident engine kernel, whose tables are in
/// device memory. The fabric stays the setup authority (verbs calls,
/// keys, QP numbers); through this it reads the counters and the error
/// log, and sends new memory regions and configurations.
pub trait ResidentPort: Send + Sync {
    /// Copies the port's live tables into `into` (racy: counters and the
    /// error log may be mid-update).
    fn read_port(&self, into: &mut Port) -> Result<()>;
    /// Writes memory-region slot `slot` (a new registration, or
    /// [`MrEntry::EMPTY`] for a deregistration) so that no engine pass
    /// sees a half-written valid entry.
    fn write_mr(&self, slot: usize, mr: &MrEntry) -> Result<()>;
    /// Hands the engine a new configuration (timeouts, faults).
    fn write_config(&self, cfg: &EngineConfig) -> Result<()>;
}

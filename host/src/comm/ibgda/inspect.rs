//! What the IBGDA transport of a communicator is doing: its NIC, its send
//! queues as the kernels keep them, QPs in error, and the soft NIC's
//! engine record. Every call here only reads; none needs the kernels to
//! have finished except [`Communicator::ibgda_check`].

use doorbell_kernels::mlx5::wire::CqeSyndrome;
use doorbell_kernels::transport::ibgda::{QP_ERR_COMPLETION, QP_ERR_WEDGED};

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::nic::soft::{EngineReport, IbgdaProgress, SoftDevice};
use crate::nic::NicKind;

/// One send queue of the IBGDA transport as its kernels keep it
/// ([`Communicator::ibgda_queues`]). Indices count WQEs and wrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaQueue {
    /// The rank that posts on it.
    pub rank: usize,
    /// The rank it reaches.
    pub peer: usize,
    /// Which of the QPs to that peer.
    pub qp: usize,
    /// WQEs reserved (once `error` is set, posts refused for it count
    /// here too, never rung).
    pub producer: u32,
    /// WQEs rung (submitted in reservation order).
    pub ready: u32,
    /// WQEs known complete.
    pub completed: u32,
    /// CQEs consumed.
    pub cq_consumer: u32,
    /// 1 while a thread consumes CQEs.
    pub poll_lock: u32,
    /// 0, or the completion error / wedge word.
    pub error: u32,
    /// The first WQE not known good once `error` is set.
    pub error_at: u32,
}

impl std::fmt::Display for IbgdaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} QP {} to rank {}: reserved {}, rung {}, completed {}, CQEs consumed {}, poll lock {}, error {:#x} at {}",
            self.rank,
            self.qp,
            self.peer,
            self.producer,
            self.ready,
            self.completed,
            self.cq_consumer,
            self.poll_lock,
            self.error,
            self.error_at
        )
    }
}

impl Communicator {
    /// Which NIC this rank's IBGDA transport runs on, and its one-line
    /// description (device, port, how memory is registered and doorbells
    /// are rung); `None` before the transport is set up.
    pub fn ibgda_nic(&self) -> Option<(NicKind, String)> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let st = guard.as_ref()?;
        Some((st.nic.kind(), st.nic.describe()))
    }

    /// The soft NIC device of this rank (fault injection, statistics, the
    /// error log), once the transport is set up over the soft NIC (`None`
    /// before, or over another NIC).
    pub fn soft_nic(&self) -> Option<SoftDevice> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(st) => st.soft().map(|s| s.device().clone()),
            None => self.proxy_soft_nic(),
        }
    }

    /// SMs each rank's soft NIC engine kernel holds while a transport
    /// through the NIC runs, for grids that must be resident beside it: the
    /// most blocks the transport's options allow
    /// ([`IbgdaOptions::engine_blocks`](crate::comm::IbgdaOptions::engine_blocks),
    /// or `DOORBELL_SOFTNIC_ENGINE_BLOCKS` before the transport is set up),
    /// the same on every rank so that plans made from it agree; 1 over a
    /// ConnectX (its doorbells take no SM, but the count stays what plans
    /// assumed before).
    pub fn engine_sms_per_rank(&self) -> u32 {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let blocks = match guard.as_ref() {
            Some(st) if st.soft().is_none() => return 1,
            Some(st) => st.opts.engine_blocks,
            None => crate::comm::IbgdaOptions::from_env().ok().and_then(|o| o.engine_blocks),
        };
        blocks.unwrap_or(crate::nic::soft::ENGINE_BLOCKS_GPU).max(1)
    }

    /// Reports QPs of this rank in an error state: a completion error (with
    /// its syndrome) or a wedged queue (a post or wait that timed out).
    /// Kernels must not be running. Clean when not set up.
    pub fn ibgda_check(&self) -> Result<()> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = guard.as_ref() else { return Ok(()) };
        let qpp = st.opts.qps_per_peer as usize;
        let mut bad = Vec::new();
        for (i, s) in st.queue_states(self)?.iter().enumerate() {
            if s.error != 0 {
                let what = if s.error & QP_ERR_COMPLETION != 0 {
                    let syn = CqeSyndrome::from_u8(s.error as u8);
                    format!("completion error {} ({:#04x})", syn.c_name(), s.error as u8)
                } else if s.error & QP_ERR_WEDGED != 0 {
                    "wedged (a post or completion wait ran out of budget)".to_string()
                } else {
                    format!("error word {:#x}", s.error)
                };
                bad.push(format!("QP {} to rank {}: {what} at WQE {}", i % qpp, i / qpp, s.error_at));
            }
        }
        if bad.is_empty() {
            return Ok(());
        }
        let log = match st.soft() {
            Some(soft) => {
                let log: Vec<String> = soft.device().error_log().iter().map(|r| format!("{r:?}")).take(4).collect();
                format!("; soft NIC log: [{}]", log.join(", "))
            }
            None => String::new(),
        };
        Err(Error::comm(format!(
            "rank {}: IBGDA queues in error: {}{log}; call Communicator::ibgda_reset (collective) to recover",
            self.rank,
            bad.join("; "),
        )))
    }

    /// Where this rank's soft NIC engine runs and what it has done (`None`
    /// before the transport is set up, or over another NIC).
    pub fn ibgda_engine(&self) -> Option<EngineReport> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref()?.soft()?.engine_report()
    }

    /// What this rank's soft NIC engine has seen and done (`None` before
    /// the transport is set up, or over another NIC): passes, doorbells,
    /// WQEs, CQEs, the last doorbell values read (see the `IbgdaProgress`
    /// docs on reading it). The kernel engine's record is read from mapped
    /// host memory with no driver call, so this answers while a kernel is
    /// stuck; print it when a wait involving IBGDA fails.
    pub fn ibgda_progress(&self) -> Option<IbgdaProgress> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref()?.soft()?.progress()
    }

    /// A snapshot of this rank's send queues as the kernels keep them
    /// (`None` before the transport is set up), over any NIC: per QP its
    /// reservation, ready (rung), completed and CQ-consumer indices, the
    /// CQ poll lock and the error word. Read from device memory with a
    /// driver copy, which kernels running on other streams do not block,
    /// so it answers while a kernel is stuck; read with `ibgda_progress`
    /// it tells a queue whose turn never comes (`ready < producer`,
    /// `completed == ready`, `error` clear) from an engine that does not
    /// run what was rung.
    pub fn ibgda_queues(&self) -> Result<Option<Vec<IbgdaQueue>>> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = guard.as_ref() else { return Ok(None) };
        if st.memory.is_none() {
            return Ok(None);
        }
        let qpp = st.opts.qps_per_peer as usize;
        Ok(Some(
            st.queue_states(self)?
                .iter()
                .enumerate()
                .map(|(i, s)| IbgdaQueue {
                    rank: self.rank,
                    peer: i / qpp,
                    qp: i % qpp,
                    producer: s.producer,
                    ready: s.ready,
                    completed: s.completed,
                    cq_consumer: s.cq_consumer,
                    poll_lock: s.poll_lock,
                    error: s.error,
                    error_at: s.error_at,
                })
                .collect(),
        ))
    }
}

//! The kernels' error reports: [`Communicator::check`] reads the report
//! slots and the reported word of this rank's heap header, clears them, and
//! turns the earliest intact report into the host error that names the
//! rank, the call, the peer and the offset.

use doorbell_kernels::heap::{
    first_report, Arg, Call, ErrorKind, ErrorReport, Reports, FAILURES_OFFSET, HEAP_RESERVED, REPORTED_OFFSET, REPORT_OFFSET, REPORT_SLOTS,
    STALE_OFFSET, STALE_PIPELINE,
};
use doorbell_kernels::transport::Cmp;

use super::Communicator;
use crate::error::{Error, Result};

impl Communicator {
    /// Returns (and clears) the first error this rank's kernels recorded:
    /// a wait that ran out of budget ([`Error::WaitTimeout`]), a refused or
    /// failed transport call ([`Error::DeviceCall`]); when every report was
    /// overwritten by another failing at the same moment,
    /// [`Error::DeviceReportsCollided`] (and [`Error::DeviceReportMissing`]
    /// when the header says an error was recorded but no slot holds one).
    /// Call it when no kernel of this
    /// rank runs (after synchronizing its streams): a kernel recording
    /// while the host clears could leave a stale report behind.
    ///
    /// For a timed-out wait it first reads every rank's state and names
    /// the rank that is stuck in the error's `stuck` field
    /// ([`StuckRanks`](crate::StuckRanks)); while ranks are still inside a
    /// synchronize without a report of their own, it waits for them up to
    /// the wait budget plus [`STUCK_MARGIN`](super::STUCK_MARGIN).
    ///
    /// An error is noted as [`synchronize`](Self::synchronize)'s is: this
    /// rank has failed until a [`barrier`](Self::barrier) with every rank.
    pub fn check(&self) -> Result<()> {
        let r = self.read_reports();
        if let Err(e) = &r {
            self.note_failure(e);
        }
        r
    }

    /// [`Self::check`]'s reading and clearing of the reports.
    fn read_reports(&self) -> Result<()> {
        let mut flag = [0u8; 4];
        // SAFETY: the reported word lives in this rank's heap header.
        unsafe { self.device.read_raw(self.heap_base + REPORTED_OFFSET, &mut flag)? };
        if flag == [0; 4] {
            return Ok(());
        }
        const BYTES: usize = REPORT_SLOTS as usize * std::mem::size_of::<ErrorReport>();
        let mut raw = [0u8; BYTES];
        // SAFETY: the slots live in this rank's heap header; the kernels
        // that wrote them have completed (the caller synchronized).
        unsafe { self.device.read_raw(self.heap_base + REPORT_OFFSET, &mut raw)? };
        let slots: Vec<ErrorReport> = raw
            .chunks_exact(std::mem::size_of::<ErrorReport>())
            // SAFETY: ErrorReport is plain #[repr(C)] integers.
            .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr() as *const ErrorReport) })
            .collect();
        let mut stale = [0u8; 8];
        // SAFETY: as above (the word a refused stale launch leaves).
        unsafe { self.device.read_raw(self.heap_base + STALE_OFFSET, &mut stale)? };
        let stale = u64::from_le_bytes(stale);
        // Cleared before the next launch can record again: slots, then the words.
        // SAFETY: as above.
        unsafe {
            self.device.write_raw(self.heap_base + REPORT_OFFSET, &[0u8; BYTES])?;
            self.device.write_raw(self.heap_base + STALE_OFFSET, &[0u8; 8])?;
            self.device.write_raw(self.heap_base + REPORTED_OFFSET, &[0u8; 4])?;
        }
        let common = |kind: u32, call: u32| {
            let call = Call::from_u32(call).map_or("a transport call", Call::name);
            match ErrorKind::from_u32(kind) {
                Some(ErrorKind::Timeout) => format!("; every one was a {call} that ran out of budget"),
                Some(k) => format!("; every one was a {call} that failed ({k:?})"),
                None => String::new(),
            }
        };
        match first_report(&slots) {
            Reports::First(r) => Err(self.name_the_stuck(self.report_error(&r))),
            Reports::Collided { slots, common: c } => Err(Error::DeviceReportsCollided {
                rank: self.rank as u32,
                slots,
                what: c.map(|(k, call)| common(k, call)).unwrap_or_default(),
            }),
            // A launch of stale all-reduce or pipeline arguments left only
            // its word (every block refused: `pipeline::stale_launch`).
            Reports::None if stale != 0 => Err(self.report_error(&ErrorReport {
                present: 1,
                rank: self.rank as u32,
                kind: ErrorKind::Stale as u32,
                call: if stale & STALE_PIPELINE != 0 {
                    Call::Pipeline
                } else {
                    Call::AllReduce
                } as u32,
                peer: u32::MAX,
                offset: FAILURES_OFFSET,
                bytes: 8,
                expected: (stale & !STALE_PIPELINE) - 1,
                seen: self.failures_met(),
                ..ErrorReport::default()
            })),
            // The word is published after a slot: a kernel that set it
            // wrote one, unless it ran while the host cleared them.
            Reports::None => Err(Error::DeviceReportMissing { rank: self.rank as u32 }),
        }
    }

    /// The host error for a device report.
    fn report_error(&self, r: &ErrorReport) -> Error {
        let call = Call::from_u32(r.call).map_or("a transport call", Call::name);
        let peer = (r.peer != u32::MAX).then_some(r.peer);
        let user = HEAP_RESERVED..self.heap_len;
        let arg = Arg::from_u32(r.arg).unwrap_or(Arg::None);
        let reason = match ErrorKind::from_u32(r.kind) {
            Some(ErrorKind::Timeout) => {
                return Error::WaitTimeout {
                    rank: r.rank,
                    op: call,
                    peer,
                    block: r.block,
                    offset: r.offset,
                    cmp: Cmp::from_u32(r.detail).map_or("?", Cmp::symbol),
                    expected: r.expected,
                    seen: r.seen,
                    budget_ms: r.budget_ns / 1_000_000,
                    hint: if self.ranks_per_gpu > 1 && self.device.is_gpu() {
                        format!(
                            "; {} ranks share a GPU here: CUDA may hold one rank's kernel in a hardware queue behind \
                             another's waiting kernel — keep one launch in flight per rank (synchronize each before \
                             the next) and finish host copies before peers launch (README, \"Ranks sharing a GPU\"); \
                             one rank per GPU avoids it",
                            self.ranks_per_gpu
                        )
                    } else {
                        String::new()
                    },
                    stuck: None,
                }
            }
            Some(ErrorKind::BadPeer) => format!("rank {} is not in this world of {} ranks; nothing was written", r.peer, self.size),
            Some(ErrorKind::OutOfRange) => out_of_range(r, arg, &user),
            Some(ErrorKind::OutsideBuffer) => format!(
                "the {} is elements [{}, {}) of a buffer of {} elements of {} bytes (at symmetric-heap offset {:#x}): \
                 it reaches past the buffer's end; nothing was written (take a part inside the buffer: \
                 `Sym::part(start, n)` with start + n <= {})",
                arg.name(),
                r.seen,
                r.seen.saturating_add(r.bytes / u64::from(r.detail.max(1))),
                r.expected,
                r.detail,
                r.offset,
                r.expected
            ),
            Some(ErrorKind::LengthMismatch) => format!(
                "the destination has {} elements and the source {}: a typed transfer copies one part into \
                 another of the same length; nothing was written (take parts of equal length)",
                r.expected, r.seen
            ),
            Some(ErrorKind::Misaligned) => format!(
                "the signal word at symmetric-heap offset {:#x} is not 8-byte aligned; nothing was written (use a u64 allocation)",
                r.offset
            ),
            Some(ErrorKind::BadCount) if r.call == Call::Pipeline as u32 => format!(
                "the grid has {} blocks; a pipeline of {} pairs runs on exactly {} (a producer and a consumer \
                 block per pair: launch with Rings::blocks()); nothing was sent",
                r.bytes,
                r.offset / 2,
                r.offset
            ),
            Some(ErrorKind::BadCount) => format!(
                "a count of {} is out of range (1..=64 signal words); nothing was waited for",
                r.bytes
            ),
            Some(ErrorKind::QueueStalled) => format!(
                "the send queue to rank {} made no progress for {} ms (completions reached WQE {}, the call needed {}); \
                 the queue is marked failed: check the peer and the NIC, then reset the transport",
                r.peer,
                r.budget_ns / 1_000_000,
                r.seen,
                r.expected
            ),
            Some(ErrorKind::Completion) => format!("a completion from rank {} came back with error syndrome {:#04x}", r.peer, r.detail),
            Some(ErrorKind::ProxyFailed) => format!(
                "the CPU proxy stopped at its request {} to rank {}: {}; it takes no more requests until proxy_reset()",
                r.seen,
                r.peer,
                super::proxy::failure_words(u64::from(r.detail >> 8), u64::from(r.detail & 0xff))
            ),
            Some(ErrorKind::Stale) => format!(
                "its arguments were made before a launch failed on some rank (the ranks had met on {} failures \
                 then, {} now, in the barrier after each): its launch counts and signal words may differ between \
                 ranks, so no block of it ran anything; arguments taken, or a launch captured in a CUDA graph, before a failure \
                 run no more: make a new all-reduce (or `Communicator::rings`), take its arguments and capture again",
                r.expected, r.seen
            ),
            None => format!(
                "an unknown error kind {} was recorded (device and host built from different versions?)",
                r.kind
            ),
        };
        Error::DeviceCall {
            rank: r.rank,
            call,
            peer,
            offset: r.offset,
            block: r.block,
            reason,
        }
    }
}

/// Why a range is refused: outside the heap's user part, and for a put's
/// source or a get's destination (the local side), not registered either.
fn out_of_range(r: &ErrorReport, arg: Arg, user: &std::ops::Range<u64>) -> String {
    let place = if r.offset < user.end {
        format!("at symmetric-heap offset {:#x}", r.offset)
    } else {
        "outside the symmetric heap".to_string()
    };
    let local = matches!(
        (arg, Call::from_u32(r.call)),
        (Arg::Source, Some(Call::Put | Call::PutNbi | Call::PutSignal | Call::PutSignalNbi))
    ) || matches!((arg, Call::from_u32(r.call)), (Arg::Destination, Some(Call::Get | Call::GetNbi)));
    if local && r.offset >= user.start {
        format!(
            "the {} ({} bytes {place}) is neither in the symmetric heap nor in memory registered with the NIC; \
             nothing was written (allocate it with Communicator::alloc, or register it with \
             Communicator::ibgda_register and launch with the handle it returns)",
            arg.name(),
            r.bytes
        )
    } else if local {
        format!(
            "the {} ({} bytes at symmetric-heap offset {:#x}) reaches into the heap's reserved header [0, {:#x}); \
             nothing was written (use a buffer from Communicator::alloc)",
            arg.name(),
            r.bytes,
            r.offset,
            user.start
        )
    } else {
        format!(
            "the {}'s {} bytes {place} are not inside the heap's user part [{:#x}, {:#x}); nothing was written \
             (allocate the buffer with Communicator::alloc and stay within it)",
            arg.name(),
            r.bytes,
            user.start,
            user.end
        )
    }
}

#[cfg(test)]
mod tests {
    use doorbell_kernels::heap::{Call, ErrorKind, ErrorReport, HEAP_RESERVED, REPORTED_OFFSET, REPORT_OFFSET};

    use crate::comm::{CommOptions, Communicator};
    use crate::device::Backend;
    use crate::error::{Error, Result};

    /// An intact report of a timed-out wait, recorded at `at_ns`.
    fn timeout(rank: u32, block: u32, at_ns: u64) -> ErrorReport {
        let mut r = ErrorReport {
            present: 1,
            rank,
            kind: ErrorKind::Timeout as u32,
            call: Call::WaitUntil as u32,
            peer: u32::MAX,
            block,
            offset: HEAP_RESERVED + 8 * block as u64,
            expected: 5,
            seen: 4,
            budget_ns: 2_000_000_000,
            at_ns,
            writer: 1 + block as u64,
            ..ErrorReport::default()
        };
        r.check = r.digest();
        r
    }

    /// Writes `slots` and the reported word as the device would.
    fn plant(comm: &Communicator, slots: &[(usize, ErrorReport)]) -> Result<()> {
        for (i, r) in slots {
            // SAFETY: ErrorReport is plain #[repr(C)] integers.
            let bytes = unsafe { std::slice::from_raw_parts(r as *const ErrorReport as *const u8, std::mem::size_of::<ErrorReport>()) };
            let at = comm.heap_base + REPORT_OFFSET + (*i * std::mem::size_of::<ErrorReport>()) as u64;
            // SAFETY: the slots lie in this rank's heap header.
            unsafe { comm.device.write_raw(at, bytes)? };
        }
        // SAFETY: as above.
        unsafe { comm.device.write_raw(comm.heap_base + REPORTED_OFFSET, &1u32.to_le_bytes()) }
    }

    #[test]
    fn check_names_the_earliest_intact_report_then_the_collision_then_a_missing_one_then_nothing() {
        Communicator::local(1, Backend::Cpu, CommOptions::default(), |comm| {
            assert!(comm.check().is_ok(), "nothing recorded yet");
            // Block 7's wait failed first; slot 2 holds a mix of two writers.
            let mut mixed = timeout(0, 3, 10);
            mixed.seen = 99;
            plant(comm, &[(5, timeout(0, 9, 300)), (2, mixed), (30, timeout(0, 7, 200))])?;
            match comm.check() {
                Err(Error::WaitTimeout { block, offset, .. }) => {
                    assert_eq!((block, offset), (7, HEAP_RESERVED + 56))
                }
                other => panic!("expected block 7's timeout, got {other:?}"),
            }
            assert!(comm.check().is_ok(), "check clears the slots and the word");
            plant(comm, &[(4, mixed)])?;
            let e = comm.check().unwrap_err();
            assert!(matches!(e, Error::DeviceReportsCollided { rank: 0, slots: 1, .. }), "{e}");
            assert!(e.to_string().contains("overwrote each other"), "{e}");
            assert!(e.to_string().contains("every one was a wait_until that ran out of budget"), "{e}");
            assert!(comm.check().is_ok());
            // The reported word without a slot behind it.
            plant(comm, &[])?;
            let e = comm.check().unwrap_err();
            assert!(matches!(e, Error::DeviceReportMissing { rank: 0 }), "{e}");
            assert!(comm.check().is_ok());
            Ok(())
        })
        .unwrap();
    }
}

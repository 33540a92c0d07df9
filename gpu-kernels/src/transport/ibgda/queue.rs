//! The send queue shared by a QP's warps (see the [module docs](super)):
//! reserving slots under flow control, writing WQEs, submitting them in
//! order, consuming completions, and the posts and waits built on them.

use super::*;

/// One batch of WQEs as [`Ibgda::write_item`] writes them: its first slot
/// index, the index of its last WQE within it (the signaled one), the
/// first chunk of the transfer it carries, how many chunks, and the chunk
/// size.
#[derive(Clone, Copy)]
struct Batch {
    start: u32,
    last: u32,
    first: u64,
    chunks: u32,
    max_msg: u64,
}

impl Ibgda {
    /// Consumes every CQE present, if no other thread is doing so. Never
    /// blocks. Each CQE advances the completed index to just past the WQE
    /// it reports; the first error CQE sets the error word.
    ///
    /// # Safety
    /// The QP's rings and state are valid.
    #[inline(never)]
    pub(super) unsafe fn progress(q: &IbgdaQp) {
        let s = q.state;
        // SAFETY: the QP's state words; the lock makes this thread the CQ's
        // only consumer until it releases it.
        unsafe {
            if ptx::atom_cas_acquire_gpu_u32(&raw mut (*s).poll_lock, 0, 1) != 0 {
                return;
            }
            let size = q.qp.cq_size;
            let mut ci = core::ptr::read_volatile(&raw const (*s).cq_consumer);
            let mut done = core::ptr::read_volatile(&raw const (*s).completed);
            let start = done;
            loop {
                let cqe = q.qp.cq.add(((ci & (size - 1)) as usize) * 16);
                // Acquire: the rest of the CQE and the data the NIC moved
                // are read (or published) after it.
                let last = q.qp.acquire_cqe_word(cqe.add(15));
                if !cqe_ready(op_own_of(last), ci, size) {
                    break;
                }
                let mut w = [0u32; 16];
                let a = ptx::ld_v4_u32(cqe.add(8));
                let b = ptx::ld_v4_u32(cqe.add(12));
                w[8..12].copy_from_slice(&a);
                w[12] = b[0];
                w[13] = b[1];
                w[14] = b[2];
                w[15] = last;
                let (counter, err) = match classify_cqe(&w, ci, size) {
                    CqeState::Done(c) => (c.wqe_counter, 0),
                    CqeState::Error(CqError::Failed { wqe_counter, syndrome, .. }) => {
                        (wqe_counter, QP_ERR_COMPLETION | syndrome.as_u8() as u32)
                    }
                    CqeState::Error(CqError::UnexpectedOpcode { wqe_counter, .. }) => (wqe_counter, QP_ERR_COMPLETION | 0xff),
                    CqeState::Error(CqError::Timeout { wqe_counter, .. }) => (wqe_counter, QP_ERR_WEDGED),
                    CqeState::Empty { .. } => break,
                };
                // The 16-bit counter of the WQE reported, widened: every WQE
                // up to it is complete.
                let failed_at = done.wrapping_add(counter.wrapping_sub(done as u16) as u32);
                if err != 0 {
                    publish_qp_error(s, err, failed_at);
                }
                done = failed_at.wrapping_add(1);
                ci = ci.wrapping_add(1);
                core::ptr::write_volatile(&raw mut (*s).cq_consumer, ci);
                q.qp.set_cq_doorbell_record(ci);
            }
            if done != start {
                // Release: what the NIC wrote (get data) and the error word
                // are visible to a thread that sees the new index.
                ptx::st_release_gpu_u32(&raw mut (*s).completed, done);
            }
            ptx::st_release_gpu_u32(&raw mut (*s).poll_lock, 0);
        }
    }

    /// Waits until every WQE before `target` on `q` has completed, driving
    /// the CQ. A queue that moves restarts the budget.
    ///
    /// # Safety
    /// The QP's rings and state are valid.
    pub(super) unsafe fn wait_complete(&self, q: &IbgdaQp, target: u32, call: Call, peer: u32) -> Result<(), CommError> {
        let s = q.state;
        let mut spin = Spin::new(self.budget_ns);
        // SAFETY: the QP's state words.
        let mut last = unsafe { ptx::ld_acquire_gpu_u32(&raw const (*s).completed) };
        loop {
            // SAFETY: as above. A failure still being recorded is looked
            // at again next round, once its `error_at` is published.
            if let Some((err, at)) = unsafe { published_qp_error(s) } {
                if !reached(at, target) {
                    return Err(self.qp_failed(err, call, peer));
                }
            }
            if reached(last, target) {
                crate::trace::hook! { crate::trace::instant(1, self.local_base, crate::trace::What::Completion, peer, last as u64); }
                return Ok(());
            }
            // SAFETY: the caller's contract.
            unsafe { Self::progress(q) };
            // SAFETY: the QP's state words.
            let now = unsafe { ptx::ld_acquire_gpu_u32(&raw const (*s).completed) };
            if now != last {
                last = now;
                spin.restart();
                continue;
            }
            if !spin.again() {
                return Err(self.wedge(q, call, peer, last, target));
            }
        }
    }

    /// Lane 0 / the thread: refuses a QP in error, reserves `count` slots,
    /// waits until they are free. Returns the first index.
    pub(super) unsafe fn reserve(&self, q: &IbgdaQp, count: u32, call: Call, peer: u32) -> Result<u32, CommError> {
        let s = q.state;
        // SAFETY: the QP's state words.
        unsafe {
            // The atomic and both loads are issued together, one memory
            // trip (the acquire waits for neither of the two before it).
            // Relaxed: the ready index orders what the NIC sees. Slots a
            // failed QP hands out are never rung (posters waiting their
            // turn behind them find the error), as when it fails while a
            // reserver waits for room. The error word is only tested here
            // (its `error_at` is not read), so a relaxed load does.
            let start = ptx::atom_add_relaxed_gpu_u32(&raw mut (*s).producer, count);
            let err = ptx::ld_relaxed_gpu_u32(&raw const (*s).error);
            let mut last = ptx::ld_acquire_gpu_u32(&raw const (*s).completed);
            let end = start.wrapping_add(count);
            if err != 0 {
                return Err(self.qp_failed(err, call, peer));
            }
            let mut spin = Spin::new(self.budget_ns);
            while end.wrapping_sub(last) > q.qp.sq_size {
                let err = ptx::ld_acquire_gpu_u32(&raw const (*s).error);
                if err != 0 {
                    return Err(self.qp_failed(err, call, peer));
                }
                Self::progress(q);
                let now = ptx::ld_acquire_gpu_u32(&raw const (*s).completed);
                if now != last {
                    last = now;
                    spin.restart();
                } else if !spin.again() {
                    return Err(self.wedge(q, call, peer, last, end.wrapping_sub(q.qp.sq_size)));
                }
            }
            Ok(start)
        }
    }

    /// Lane 0 / the thread: rings the batch `start..start + count` in
    /// reservation order (waits for the ready index), or gives up when the
    /// QP fails meanwhile or the budget runs out (the QP is then wedged).
    pub(super) unsafe fn submit(&self, q: &IbgdaQp, start: u32, count: u32, head: u64, call: Call, peer: u32) -> Result<u32, CommError> {
        let s = q.state;
        let end = start.wrapping_add(count);
        let mut spin = Spin::new(self.budget_ns);
        // SAFETY: the QP's state words and doorbells.
        unsafe {
            loop {
                // Acquire pairs with the previous batch's release below.
                let r = ptx::ld_acquire_gpu_u32(&raw const (*s).ready);
                if r == start {
                    break;
                }
                let err = ptx::ld_acquire_gpu_u32(&raw const (*s).error);
                if err != 0 {
                    return Err(self.qp_failed(err, call, peer));
                }
                if !spin.again() {
                    return Err(self.wedge(q, call, peer, r, start));
                }
            }
            publish_and_ring(&q.qp, end, head);
            ptx::st_release_gpu_u32(&raw mut (*s).ready, end);
        }
        crate::trace::hook! {
            crate::trace::instant(1, self.local_base, crate::trace::What::WqePosted, peer, count as u64);
            crate::trace::instant(1, self.local_base, crate::trace::What::Doorbell, peer, end as u64);
        }
        Ok(end)
    }

    /// Writes WQE `i` of batch `b` into its slot: chunk `i + b.first` of
    /// `x` when `i < b.chunks`, else the signal.
    #[inline(always)]
    unsafe fn write_item(q: &IbgdaQp, b: &Batch, i: u32, x: &Xfer, sig: &Sig) -> u64 {
        let Batch {
            start,
            last,
            first,
            chunks,
            max_msg,
        } = *b;
        let idx = start.wrapping_add(i);
        let flags = if i == last { FLAG_SIGNALED } else { 0 };
        // SAFETY: the slot is reserved for this WQE and free.
        let slot = unsafe { wqe_slot(&q.qp, idx) };
        if i < chunks {
            let k = first + i as u64;
            let off = k * max_msg;
            let len = (x.bytes - off).min(max_msg) as u32;
            let t = Transfer {
                raddr: x.raddr + off,
                rkey: q.rkey,
                laddr: x.laddr + off,
                lkey: x.lkey,
                len,
            };
            // SAFETY: as above.
            unsafe {
                if x.read {
                    write_rdma_read_wqe(slot, idx as u16, q.qp.qpn, &t, flags)
                } else {
                    write_rdma_write_wqe(slot, idx as u16, q.qp.qpn, &t, flags)
                }
            }
        } else {
            // SAFETY: one scratch word per slot; free with the slot.
            let scratch = unsafe { q.scratch.add((idx & (q.qp.sq_size - 1)) as usize) };
            let t = Transfer {
                raddr: sig.raddr,
                rkey: q.rkey,
                laddr: scratch as u64,
                lkey: q.scratch_lkey,
                len: 8,
            };
            // SAFETY: as above.
            unsafe {
                match sig.op {
                    SignalOp::Set => {
                        core::ptr::write_volatile(scratch, sig.value);
                        write_rdma_write_wqe(slot, idx as u16, q.qp.qpn, &t, flags)
                    }
                    SignalOp::Add => write_atomic_fetch_add_wqe(slot, idx as u16, q.qp.qpn, &t, sig.value, flags),
                }
            }
        }
    }

    /// Posts one batch: chunks `first..first + chunks` of `x`, then the
    /// signal when `with_sig` — 1..=32 WQEs, only the last signaled.
    /// Returns the completion target (the index past the batch), on every
    /// lane of a warp poster.
    pub(super) unsafe fn post_batch(
        &self,
        p: Poster,
        q: &IbgdaQp,
        x: &Xfer,
        part: Chunks,
        sig: Option<&Sig>,
        site: Site,
    ) -> Result<u32, CommError> {
        let Chunks { first, count: chunks } = part;
        let Site { call, peer } = site;
        let count = chunks + sig.is_some() as u32;
        let sig = sig.unwrap_or(&Sig::NONE);
        let max_msg = self.max_msg as u64;
        let last = count - 1;
        if p == Poster::Thread {
            // SAFETY: the handle's QPs are valid.
            unsafe {
                let start = self.reserve(q, count, call, peer)?;
                let b = Batch {
                    start,
                    last,
                    first,
                    chunks,
                    max_msg,
                };
                let mut head = 0;
                for i in 0..count {
                    head = Self::write_item(q, &b, i, x, sig);
                }
                return self.submit(q, start, count, head, call, peer);
            }
        }
        let lane = ptx::lane_id();
        // SAFETY: as above.
        let start = on_lane0(peer, || unsafe { self.reserve(q, count, call, peer) })?;
        let mut head = 0u64;
        if lane < count {
            let b = Batch {
                start,
                last,
                first,
                chunks,
                max_msg,
            };
            // SAFETY: as above.
            head = unsafe { Self::write_item(q, &b, lane, x, sig) };
        }
        // The batch's WQEs are written before lane 0 publishes them.
        ptx::sync_warp(ptx::FULL_MASK);
        let head = ptx::shfl_sync_idx_u64(ptx::FULL_MASK, head, last);
        // SAFETY: as above.
        on_lane0(peer, || unsafe { self.submit(q, start, count, head, call, peer) })
    }

    /// Every lane of a converged warp posts its own transfer `x` (0 bytes:
    /// none) and its own signal `sig` to `q`: each lane's WQEs (its WRITE,
    /// then its signal) follow those of the lanes below it, the warp's
    /// whole run is reserved by one atomic and rung by one doorbell, and
    /// only its last WQE asks for a completion. A lane whose transfer
    /// needs more than one WQE, or a run longer than the send queue, makes
    /// the warp post lane by lane instead (each lane's batches in lane
    /// order). Returns, on every lane, the completion target of the
    /// warp's last WQE (`None` when no lane posted any).
    ///
    /// # Safety
    /// Every lane of the warp calls it with the same `q`; the transfers
    /// are checked.
    pub(super) unsafe fn post_lanes(&self, q: &IbgdaQp, x: &Xfer, sig: Option<&Sig>, site: Site) -> Result<Option<u32>, CommError> {
        let Site { call, peer } = site;
        let lane = ptx::lane_id();
        let chunks = x.bytes.div_ceil(self.max_msg as u64);
        let n = (chunks.min(2) + sig.is_some() as u64) as u32;
        // Each lane's first slot in the run: an exclusive prefix sum.
        let mut incl = n;
        let mut d = 1;
        while d < 32 {
            let v = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, incl, lane.saturating_sub(d));
            if lane >= d {
                incl += v;
            }
            d *= 2;
        }
        let total = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, incl, 31);
        if !ptx::vote_sync_all(ptx::FULL_MASK, chunks <= 1) || total > q.qp.sq_size {
            // SAFETY: the caller's contract.
            return unsafe { self.post_lanes_in_turn(q, x, sig, site) };
        }
        if total == 0 {
            return Ok(None);
        }
        // SAFETY: the handle's QPs are valid.
        let start = on_lane0(peer, || unsafe { self.reserve(q, total, call, peer) })?;
        let mut head = 0u64;
        if n > 0 {
            let b = Batch {
                start: start.wrapping_add(incl - n),
                // Only the run's last WQE is signaled.
                last: if incl == total { n - 1 } else { u32::MAX },
                first: 0,
                chunks: chunks as u32,
                max_msg: self.max_msg as u64,
            };
            for i in 0..n {
                // SAFETY: slots `start .. start + total` are reserved and free.
                head = unsafe { Self::write_item(q, &b, i, x, sig.unwrap_or(&Sig::NONE)) };
                // A WRITE of the run other than its first needs no order
                // with the run's other WRITEs: it says so in its (unused)
                // immediate, which the soft NIC's bursts read.
                if i < b.chunks && !x.read && b.start.wrapping_add(i) != start {
                    // SAFETY: the ctrl segment of the slot just written.
                    unsafe {
                        let ctrl = wqe_slot(&q.qp, b.start.wrapping_add(i));
                        core::ptr::write_volatile(ctrl.add(3), crate::mlx5::UNORDERED_WRITE_IMM.to_be());
                    }
                }
            }
        }
        // Every lane's WQEs are written before lane 0 publishes them.
        ptx::sync_warp(ptx::FULL_MASK);
        let last_lane = 31 - ptx::vote_sync_ballot(ptx::FULL_MASK, n > 0).leading_zeros();
        let head = ptx::shfl_sync_idx_u64(ptx::FULL_MASK, head, last_lane);
        // SAFETY: as above.
        on_lane0(peer, || unsafe { self.submit(q, start, total, head, call, peer) }).map(Some)
    }

    /// [`Transport::put_lanes_many_raw`]'s run: every lane's checked
    /// transfers `x(0..count)`, each of one WQE (a WRITE), as one run
    /// behind one doorbell, round-major (index `i` of every lane in lane
    /// order, then index `i + 1`), so each round's WQEs fill consecutive
    /// slots. Empty transfers post nothing; only the run's last WQE is
    /// signaled; every WRITE but the run's first says it needs no order
    /// with the others. A run longer than the send queue goes round by
    /// round ([`super::super::put_lanes_rounds`]). Returns, on every lane,
    /// the completion target of the run; `None` when it posted nothing, or
    /// went round by round (whose rounds, when blocking, have completed).
    ///
    /// # Safety
    /// Every lane of the warp calls it with the same `q` and `nbi`; every
    /// transfer checked and at most the handle's largest message.
    pub(super) unsafe fn post_lanes_many(
        &self,
        q: &IbgdaQp,
        count: u32,
        nbi: bool,
        x: &impl Fn(u32) -> RawXfer,
        site: Site,
    ) -> Result<Option<u32>, CommError> {
        let Site { call, peer } = site;
        let lane = ptx::lane_id();
        let below = (1u32 << lane) - 1;
        let rounds = super::super::warp_max_u32(count);
        // The run's length: the non-empty transfers of every round (counted
        // only until it outgrows the send queue, so it cannot wrap).
        let mut total = 0u32;
        let mut i = 0;
        while i < rounds && total <= q.qp.sq_size {
            let has = i < count && x(i).bytes != 0;
            total += ptx::vote_sync_ballot(ptx::FULL_MASK, has).count_ones();
            i += 1;
        }
        if total > q.qp.sq_size {
            // SAFETY: the caller's contract.
            return unsafe { super::super::put_lanes_rounds(self, peer, count, nbi, x) }.map(|_| None);
        }
        if total == 0 {
            return Ok(None);
        }
        // SAFETY: the handle's QPs are valid.
        let start = on_lane0(peer, || unsafe { self.reserve(q, total, call, peer) })?;
        let base = self.remote_base(peer);
        let mut at = 0u32;
        let mut head = 0u64;
        let mut wrote_last = false;
        let mut i = 0;
        while i < rounds {
            // This lane's transfer in round `i`, if it moves anything.
            let xi = if i < count { Some(x(i)).filter(|xi| xi.bytes != 0) } else { None };
            let b = ptx::vote_sync_ballot(ptx::FULL_MASK, xi.is_some());
            if let Some(xi) = xi {
                let idx = start.wrapping_add(at + (b & below).count_ones());
                let last = at + (b & below).count_ones() + 1 == total;
                wrote_last |= last;
                let wire = Xfer {
                    read: false,
                    raddr: base + (xi.dst as u64).wrapping_sub(self.local_base),
                    laddr: xi.src as u64,
                    // Checked: the key is found.
                    lkey: self
                        .local_key(call, Arg::Source, xi.src as u64, xi.bytes, peer)
                        .unwrap_or(self.heap_lkey),
                    bytes: xi.bytes,
                };
                let bt = Batch {
                    start: idx,
                    last: if last { 0 } else { u32::MAX },
                    first: 0,
                    chunks: 1,
                    max_msg: self.max_msg as u64,
                };
                // SAFETY: slot `idx` of the reserved run, free.
                head = unsafe { Self::write_item(q, &bt, 0, &wire, &Sig::NONE) };
                if idx != start {
                    // SAFETY: the ctrl segment of the slot just written.
                    unsafe {
                        let ctrl = wqe_slot(&q.qp, idx);
                        core::ptr::write_volatile(ctrl.add(3), crate::mlx5::UNORDERED_WRITE_IMM.to_be());
                    }
                }
            }
            at += b.count_ones();
            i += 1;
        }
        // Every lane's WQEs are written before lane 0 publishes them; the
        // doorbell carries the run's last WQE, written by `wrote_last`.
        ptx::sync_warp(ptx::FULL_MASK);
        let last_lane = ptx::vote_sync_ballot(ptx::FULL_MASK, wrote_last).trailing_zeros();
        let head = ptx::shfl_sync_idx_u64(ptx::FULL_MASK, head, last_lane);
        // SAFETY: as above.
        on_lane0(peer, || unsafe { self.submit(q, start, total, head, call, peer) }).map(Some)
    }

    /// [`Self::post_lanes`] one lane after another, each lane's transfer
    /// in batches of its own: the first failure ends the warp's posts (the
    /// lanes after it post nothing) and is every lane's result.
    unsafe fn post_lanes_in_turn(&self, q: &IbgdaQp, x: &Xfer, sig: Option<&Sig>, site: Site) -> Result<Option<u32>, CommError> {
        let lane = ptx::lane_id();
        let mut target = None;
        let mut failed = false;
        let mut mine = Ok(None);
        for l in 0..32 {
            if lane == l {
                // SAFETY: the caller's contract.
                mine = unsafe { self.post_xfer(Poster::Thread, q, x, sig, Share::ALL, site) };
            }
            let bad = ptx::vote_sync_any(ptx::FULL_MASK, mine.is_err());
            let t = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, matches!(mine, Ok(Some(_))) as u32, l);
            if t != 0 {
                let v = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, mine.map_or(0, |t| t.unwrap_or(0)), l);
                target = Some(v);
            }
            if bad {
                failed = true;
                break;
            }
        }
        if failed {
            return super::super::warp_verdict(mine).map(|_| None);
        }
        Ok(target)
    }

    /// Posts the chunks of `x` whose batch index `j` satisfies
    /// `j % stride == which`, then (when `sig` is given) the signal in the
    /// last batch. Returns the completion target of the last batch posted
    /// (or `None` when none was).
    pub(super) unsafe fn post_xfer(
        &self,
        p: Poster,
        q: &IbgdaQp,
        x: &Xfer,
        sig: Option<&Sig>,
        share: Share,
        site: Site,
    ) -> Result<Option<u32>, CommError> {
        let Share { which, stride } = share;
        let max_msg = self.max_msg as u64;
        let chunks = x.bytes.div_ceil(max_msg);
        let items = chunks + sig.is_some() as u64;
        let batches = items.div_ceil(MAX_BATCH as u64);
        let mut target = None;
        let mut j = which;
        while j < batches {
            let first = j * MAX_BATCH as u64;
            let n = (chunks.saturating_sub(first)).min(MAX_BATCH as u64) as u32;
            let s = if j + 1 == batches { sig } else { None };
            // SAFETY: the caller's contract.
            target = Some(unsafe { self.post_batch(p, q, x, Chunks { first, count: n }, s, site) }?);
            j += stride;
        }
        Ok(target)
    }

    /// A data transfer (and optional signal) by the group `g`: one thread
    /// or a warp posts everything; a block spreads batches over its warps
    /// (the signal, if any, goes last, by warp 0, after a block barrier).
    /// Blocking calls wait for their completion; every thread of the group
    /// returns after the group's WQEs are posted (and complete, if blocking).
    pub(super) unsafe fn transfer(&self, g: Coop, x: Xfer, sig: Option<Sig>, site: Site, nbi: bool) -> Result<(), CommError> {
        let Site { call, peer } = site;
        let q = self.qp(peer);
        let sig = sig.as_ref();
        match g {
            Coop::Thread | Coop::Warp => {
                let p = if g == Coop::Thread { Poster::Thread } else { Poster::Warp };
                // SAFETY: the handle's QPs are valid.
                let t = unsafe { self.post_xfer(p, &q, &x, sig, Share::ALL, site) }?;
                if let (Some(t), false) = (t, nbi) {
                    return self.wait_posted(p, &q, t, call, peer);
                }
                Ok(())
            }
            Coop::Block => {
                let threads = ptx::block_dim_x() * ptx::block_dim_y() * ptx::block_dim_z();
                let tid = ptx::thread_rank_in_block();
                let warps = (threads / 32) as u64;
                let items = x.bytes.div_ceil(self.max_msg as u64) + sig.is_some() as u64;
                // Few WQEs (or an odd block): warp 0 (thread 0) posts all,
                // data and signal in one go.
                let r = if items <= MAX_BATCH as u64 || !threads.is_multiple_of(32) {
                    let p = if !threads.is_multiple_of(32) {
                        Poster::Thread
                    } else {
                        Poster::Warp
                    };
                    let me = if p == Poster::Thread { tid == 0 } else { tid < 32 };
                    if me {
                        // SAFETY: as above.
                        match unsafe { self.post_xfer(p, &q, &x, sig, Share::ALL, site) } {
                            Ok(Some(t)) if !nbi => self.wait_posted(p, &q, t, call, peer),
                            Ok(_) => Ok(()),
                            Err(e) => Err(e),
                        }
                    } else {
                        Ok(())
                    }
                } else {
                    // Data batches spread over the warps (batch j by warp
                    // j mod warps); the signal after a barrier, so its WQE
                    // follows every data WQE on the QP.
                    let w = (tid / 32) as u64;
                    // SAFETY: as above.
                    let mut r = unsafe { self.post_xfer(Poster::Warp, &q, &x, None, Share { which: w, stride: warps }, site) };
                    if sig.is_some() {
                        ptx::sync_threads();
                        if w == 0 && r.is_ok() {
                            let none = Xfer { bytes: 0, ..x };
                            // SAFETY: as above.
                            r = unsafe { self.post_xfer(Poster::Warp, &q, &none, sig, Share::ALL, site) };
                        }
                    }
                    match r {
                        Ok(Some(t)) if !nbi => self.wait_posted(Poster::Warp, &q, t, call, peer),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    }
                };
                // Every thread returns the block's result: a thread that
                // posted nothing learns of a failed post (the QP's error
                // word says which), so a loop over calls ends on every
                // thread at once instead of leaving some at a barrier.
                let failed = ptx::sync_threads_or(r.is_err());
                match r {
                    Ok(()) if failed => {
                        // SAFETY: the QP's state words.
                        let err = unsafe { ptx::ld_acquire_gpu_u32(&raw const (*q.state).error) };
                        Err(if err != 0 {
                            self.qp_failed(err, call, peer)
                        } else {
                            CommError::Timeout(Timeout { seen: 0 })
                        })
                    }
                    r => r,
                }
            }
        }
    }

    /// Waits for completion target `t` (lane 0 of a warp waits, and the
    /// result is broadcast).
    pub(super) fn wait_posted(&self, p: Poster, q: &IbgdaQp, t: u32, call: Call, peer: u32) -> Result<(), CommError> {
        if p == Poster::Thread {
            // SAFETY: the handle's QPs are valid.
            return unsafe { self.wait_complete(q, t, call, peer) };
        }
        // SAFETY: as above.
        on_lane0(peer, || unsafe { self.wait_complete(q, t, call, peer) }.map(|_| 0)).map(drop)
    }

    /// Waits until every WQE rung so far on `q` has completed.
    pub(super) unsafe fn quiet_qp(&self, q: &IbgdaQp, call: Call) -> Result<(), CommError> {
        // SAFETY: the QP's state words.
        let target = unsafe { ptx::ld_acquire_gpu_u32(&raw const (*q.state).ready) };
        // SAFETY: the caller's contract.
        unsafe { self.wait_complete(q, target, call, q.peer) }
    }

    /// Quiets every QP of this rank (every peer, every block's QP). One thread.
    ///
    /// # Safety
    /// The handle's QPs are valid.
    pub(crate) unsafe fn quiet_all(&self, call: Call) -> Result<(), CommError> {
        let mut i = 0;
        while i < self.world * self.qps_per_peer {
            // SAFETY: `qps` has world × qps_per_peer entries.
            let q = unsafe { ptx::load_words::<IbgdaQp, 16>(self.qps.add(i as usize)) };
            if !q.state.is_null() {
                // SAFETY: as above.
                unsafe { self.quiet_qp(&q, call) }?;
            }
            i += 1;
        }
        Ok(())
    }

    /// Writes `value` into the header word at `offset` of `peer`'s heap
    /// (no argument checks: runtime words), non-blocking. One thread.
    ///
    /// # Safety
    /// `peer < world`; `offset` is an aligned header word.
    pub(crate) unsafe fn put_header_word(&self, peer: u32, offset: u64, value: u64) -> Result<(), CommError> {
        let q = self.qp(peer);
        let sig = Sig {
            raddr: q.remote_base + offset,
            value,
            op: SignalOp::Set,
        };
        let site = Site { call: Call::Barrier, peer };
        // SAFETY: the caller's contract.
        unsafe { self.post_xfer(Poster::Thread, &q, &NO_DATA, Some(&sig), Share::ALL, site) }.map(|_| ())
    }
}

/// Where one thread's blocking 8-byte puts spend their time, summed over
/// the WQEs of [`Ibgda::profile_puts`] (`%clock64` cycles of the calling
/// thread's SM).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostProfile {
    /// WQEs posted (and completed).
    pub wqes: u64,
    /// The call's argument checks and key lookups.
    pub checks: u64,
    /// Reserving a slot: the QP's error word, the producer index, flow
    /// control.
    pub reserve: u64,
    /// Writing the WQE into its slot.
    pub write: u64,
    /// Submitting it: waiting for its turn, the doorbell record, the fence
    /// and the doorbell.
    pub doorbell: u64,
    /// From the doorbell until its CQE is seen (a tight poll of the CQE's
    /// owner word): the NIC noticing the doorbell, executing the WQE,
    /// writing the CQE, and the CQE reaching the poster.
    pub cqe_wait: u64,
    /// Consuming the CQE as every wait does (the CQ lock, the CQE, the CQ
    /// doorbell record, the completed index).
    pub consume: u64,
}

impl Ibgda {
    /// Posts the put `x` to `peer` `n` times from the calling thread, each
    /// one WQE, signaled and waited for before the next — the steps of a
    /// blocking `put_raw` by one thread — and adds the cycles of each step
    /// to `out` ([`PostProfile`]); between the doorbell and the wait it
    /// polls the CQE itself, to tell the completion's arrival from its
    /// consumption. For benchmarks: where a poster's time goes. `x.bytes` is at most [`Ibgda::max_msg`] (one WQE).
    ///
    /// # Safety
    /// As for [`Transport::put_raw`].
    pub unsafe fn profile_puts(&self, peer: u32, x: RawXfer, n: u32, out: &mut PostProfile) -> Result<(), CommError> {
        for _ in 0..n {
            let c0 = ptx::clock64();
            let (call, off, _) = super::super::check_put(self, peer, &x, None)?;
            let lkey = self.local_key(call, Arg::Source, x.src as u64, x.bytes, peer)?;
            if x.bytes == 0 || x.bytes > self.max_msg as u64 {
                return Err(CommError::BadCount { count: x.bytes });
            }
            let q = self.qp(peer);
            let (wire, _) = self.put_wire(peer, &x, (off, 0), lkey, None);
            let c1 = ptx::clock64();
            // SAFETY: the caller's contract; the handle's QPs are valid.
            let start = unsafe { self.reserve(&q, 1, call, peer) }?;
            let c2 = ptx::clock64();
            let b = Batch {
                start,
                last: 0,
                first: 0,
                chunks: 1,
                max_msg: self.max_msg as u64,
            };
            // SAFETY: the slot was reserved above.
            let head = unsafe { Self::write_item(&q, &b, 0, &wire, &Sig::NONE) };
            let c3 = ptx::clock64();
            // SAFETY: as above.
            let end = unsafe { self.submit(&q, start, 1, head, call, peer) }?;
            let c4 = ptx::clock64();
            // SAFETY: the QP's CQ ring and state; one WQE outstanding, so
            // the next CQE to consume is its.
            unsafe {
                let ci = core::ptr::read_volatile(&raw const (*q.state).cq_consumer);
                let size = q.qp.cq_size;
                let cqe = q.qp.cq.add(((ci & (size - 1)) as usize) * 16);
                let mut spin = Spin::new(self.budget_ns);
                while !cqe_ready(op_own_of(q.qp.acquire_cqe_word(cqe.add(15))), ci, size) {
                    if !spin.again() {
                        return Err(self.wedge(&q, call, peer, start, end));
                    }
                }
            }
            let c5 = ptx::clock64();
            self.wait_posted(Poster::Thread, &q, end, call, peer)?;
            let c6 = ptx::clock64();
            out.wqes += 1;
            out.checks += c1.wrapping_sub(c0);
            out.reserve += c2.wrapping_sub(c1);
            out.write += c3.wrapping_sub(c2);
            out.doorbell += c4.wrapping_sub(c3);
            out.cqe_wait += c5.wrapping_sub(c4);
            out.consume += c6.wrapping_sub(c5);
        }
        Ok(())
    }
}

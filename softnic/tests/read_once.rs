//! A producer that rewrites a WQE (or a receive WQE) after ringing the
//! doorbell, at every step of the engine the test can reach: the engine
//! works from one copy of each WQE, so the outcome is the original WQE's
//! or a clean error completion, and no byte outside a registered region
//! changes.

mod common;

use common::*;
use doorbell_kernels::mlx5::{CtrlSeg, DataSeg, RaddrSeg, WqeOp, OPCODE_SEND, WQE_CTRL_CQ_UPDATE};
use doorbell_softnic::engine::mover::Phase;
use doorbell_softnic::engine::{access, mem, PayloadMover};
use doorbell_softnic::host::Cqe;
use doorbell_softnic::Sge;

/// Registered bytes of every region (the guards around them hold
/// [`GUARD`] canary bytes).
const LEN: usize = 64;
/// What a rewritten segment claims: past its region, inside the guard.
const LONG: u32 = (LEN + 128) as u32;
/// Registered bytes of the source (and READ destination, atomic result).
const SRC: usize = 4 * LEN;

/// One 16-byte segment to overwrite and what to write there.
#[derive(Clone, Copy)]
struct Rewrite {
    at: *mut [u32; 4],
    words: [u32; 4],
}

/// A mover that counts every step the engine reports (its laps and its
/// copies) and makes the rewrites at step `at`, before doing what the
/// step does.
struct Saboteur {
    step: u32,
    at: u32,
    rewrites: Vec<Rewrite>,
    done: bool,
}

impl Saboteur {
    fn tick(&mut self) {
        if self.step == self.at && !self.done {
            for r in &self.rewrites {
                // SAFETY: the segment lies in a ring the test owns.
                unsafe { std::ptr::write_volatile(r.at, r.words) };
            }
            self.done = true;
        }
        self.step += 1;
    }
}

impl PayloadMover for Saboteur {
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        self.tick();
        // SAFETY: the caller's contract.
        unsafe { mem::copy_bytes(dst, src, len) }
    }
    fn lap(&mut self, _phase: Phase) {
        self.tick();
    }
}

/// Segment `k` of the WQE at SQ counter `idx` of `end`.
fn sq_seg(end: &End, idx: u32, k: u32) -> *mut [u32; 4] {
    let ring = end.sq.h.sq_size as usize * 64;
    let off = (idx as usize * 64 + k as usize * 16) % ring;
    // SAFETY: inside the SQ ring.
    unsafe { (end.sq.h.sq as *mut u8).add(off) as *mut [u32; 4] }
}

/// Scatter entry `k` of receive WQE `idx` of `end` (4 entries a WQE, as
/// the rig's QPs have).
fn rq_seg(end: &End, idx: u32, k: u32) -> *mut [u32; 4] {
    let wqes = end.mem.rq_wqes as usize;
    let sge = end.mem.rq_max_sge as usize;
    // SAFETY: inside the RQ ring.
    unsafe { end.mem.rq.as_ptr().add(((idx as usize % wqes) * sge + k as usize) * 16) as *mut [u32; 4] }
}

fn data(byte_count: u32, lkey: u32, addr: u64) -> [u32; 4] {
    DataSeg { byte_count, lkey, addr }.to_words()
}

/// What each scenario posts and how it is sabotaged.
#[derive(Clone, Copy, Debug)]
enum Case {
    /// RDMA WRITE; its data segment grows past the source region.
    WriteLongGather,
    /// RDMA WRITE; its remote address moves to the end of the target
    /// region (the original length then runs past it).
    WriteShiftedRemote,
    /// RDMA READ; its data segment grows past the destination region.
    ReadLongScatter,
    /// Fetch-and-add; its result address moves past the result region.
    AtomicResultMoved,
    /// SEND; its data segment grows, and the receive WQE's scatter entry
    /// grows past the receive region.
    SendLongBoth,
}

/// Runs `case` with the rewrite at step `at`; returns whether the rewrite
/// was made (the pass had that many steps).
fn run(case: Case, at: u32) -> bool {
    let mut rig = Rig::new(virtual_cfg());
    let flags = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
    // The source is larger than every transfer: a grown gather entry stays
    // inside it, so only the destination's checks stand between a rewrite
    // and an overflow.
    let src = Region::new(&rig.a.dev, &rig.a.pd, SRC, access::LOCAL_WRITE);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, LEN, flags);
    let payload: Vec<u8> = (0..SRC).map(|i| (i as u8).wrapping_mul(7).wrapping_add(3)).collect();
    let remote: Vec<u8> = (0..LEN as u8).map(|i| i.wrapping_mul(13).wrapping_add(1)).collect();
    src.fill(&payload);
    dst.fill(&remote);
    let idx = rig.a.sq.pi;
    let mut rewrites = Vec::new();
    match case {
        Case::WriteLongGather => {
            rig.a.sq.post(&write_req(&src, &dst, 0, LEN as u32, true));
            rewrites.push(Rewrite {
                at: sq_seg(&rig.a, idx, 2),
                words: data(LONG, src.key(), src.addr()),
            });
        }
        Case::WriteShiftedRemote => {
            rig.a.sq.post(&write_req(&src, &dst, 0, LEN as u32, true));
            rewrites.push(Rewrite {
                at: sq_seg(&rig.a, idx, 1),
                words: RaddrSeg {
                    raddr: dst.addr() + LEN as u64 - 8,
                    rkey: dst.key(),
                }
                .to_words(),
            });
        }
        Case::ReadLongScatter => {
            rig.a
                .sq
                .post(&req(WqeOp::Read, src.addr(), src.key(), dst.addr(), dst.key(), LEN as u32, true));
            rewrites.push(Rewrite {
                at: sq_seg(&rig.a, idx, 2),
                words: data(LONG, src.key(), src.addr()),
            });
        }
        Case::AtomicResultMoved => {
            let mut r = req(WqeOp::FetchAdd, src.addr(), src.key(), dst.addr(), dst.key(), 8, true);
            r.add = 5;
            rig.a.sq.post(&r);
            rewrites.push(Rewrite {
                at: sq_seg(&rig.a, idx, 3),
                words: data(8, src.key(), src.addr() + SRC as u64 + 64),
            });
        }
        Case::SendLongBoth => {
            rig.b
                .qp
                .post_recv(&[Sge {
                    addr: dst.addr(),
                    len: LEN as u32,
                    lkey: dst.key(),
                }])
                .unwrap();
            let ctrl = CtrlSeg {
                opcode: OPCODE_SEND,
                fm_ce_se: WQE_CTRL_CQ_UPDATE,
                ..CtrlSeg::default()
            };
            let (_, head) = rig.a.sq.write_segments(ctrl, &[data_seg(src.addr(), src.key(), LEN as u32)], None);
            rig.a.sq.ring(head);
            rewrites.push(Rewrite {
                at: sq_seg(&rig.a, idx, 1),
                words: data(LONG, src.key(), src.addr()),
            });
            rewrites.push(Rewrite {
                at: rq_seg(&rig.b, 0, 0),
                words: data(LONG, dst.key(), dst.addr()),
            });
        }
    }
    let mut saboteur = Saboteur {
        step: 0,
        at,
        rewrites,
        done: false,
    };
    // Port A's pass executes the WQE (and, for a SEND, consumes B's
    // receive WQE) through the saboteur.
    for _ in 0..4 {
        rig.a.dev.poll_once_with(&mut saboteur);
    }
    let made = saboteur.done;
    let cqe = rig.next_send_cqe(Which::A);
    // Let B's engine finish its side too.
    for _ in 0..4 {
        rig.fabric.poll_all();
    }
    let what = format!("{case:?}, rewrite at step {at}");
    src.check_canaries();
    dst.check_canaries();
    match cqe {
        Cqe::Ok(c) => {
            assert_eq!(c.wqe_counter, idx as u16, "{what}");
            match case {
                Case::WriteLongGather | Case::WriteShiftedRemote => {
                    assert_eq!(c.byte_cnt, LEN as u32, "{what}: the original length");
                    assert_eq!(dst.bytes(), payload[..LEN], "{what}: the original WRITE's bytes");
                }
                Case::ReadLongScatter => {
                    assert_eq!(c.byte_cnt, LEN as u32, "{what}");
                    assert_eq!(src.bytes()[..LEN], remote, "{what}: the original READ's bytes");
                    assert_eq!(src.bytes()[LEN..], payload[LEN..], "{what}: the READ wrote past its length");
                }
                Case::AtomicResultMoved => {
                    let old = u64::from_ne_bytes(remote[..8].try_into().unwrap());
                    assert_eq!(dst.u64_at(0), old.wrapping_add(5), "{what}: the remote word");
                    assert_eq!(src.u64_at(0), old.to_be(), "{what}: the old value, at the original result address");
                    assert_eq!(src.bytes()[8..], payload[8..], "{what}: the result landed elsewhere too");
                }
                Case::SendLongBoth => {
                    assert_eq!(c.byte_cnt, LEN as u32, "{what}");
                    assert_eq!(dst.bytes(), payload[..LEN], "{what}: the original SEND's bytes");
                    match rig.next_recv_cqe(Which::B) {
                        Cqe::Ok(r) => assert_eq!(r.byte_cnt, LEN as u32, "{what}: the receive completion"),
                        Cqe::Err(e) => panic!("{what}: the SEND succeeded but its receive completed with an error {e:?}"),
                    }
                }
            }
        }
        Cqe::Err(e) => {
            // A clean error: the WQE it names, and nothing moved.
            assert_eq!(e.wqe_counter, idx as u16, "{what}");
            match case {
                Case::ReadLongScatter | Case::AtomicResultMoved => assert_eq!(src.bytes(), payload, "{what}: an error moved data"),
                _ => assert_eq!(dst.bytes(), remote, "{what}: an error moved data"),
            }
        }
    }
    made
}

/// Every step of the pass, until the rewrite comes after the last one.
fn sweep(case: Case) {
    let mut at = 0;
    while run(case, at) {
        at += 1;
        assert!(at < 500, "{case:?}: the pass never ends");
    }
    assert!(at > 8, "{case:?}: only {at} steps were reached");
}

#[test]
fn a_gather_entry_grown_after_the_doorbell_never_reads_past_its_region() {
    sweep(Case::WriteLongGather);
}

#[test]
fn a_remote_address_moved_after_the_doorbell_never_writes_past_its_region() {
    sweep(Case::WriteShiftedRemote);
}

#[test]
fn a_scatter_entry_grown_after_the_doorbell_never_writes_past_its_region() {
    sweep(Case::ReadLongScatter);
}

#[test]
fn an_atomic_result_moved_after_the_doorbell_never_lands_outside_its_region() {
    sweep(Case::AtomicResultMoved);
}

#[test]
fn a_send_and_a_receive_wqe_grown_after_the_doorbell_never_write_past_a_region() {
    sweep(Case::SendLongBoth);
}

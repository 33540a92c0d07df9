//! Aligned barriers under divergence.
//! `bar.sync` (= `barrier.sync.aligned`), `bar.arrive` and `bar.red` are
//! *aligned*: PTX allows them only where every thread of the warp executes
//! the same barrier instruction. Rust's `asm!` is not marked convergent, so
//! LLVM may copy a barrier into both arms of a branch on the thread index
//! (a barrier right after one thread's work): the warp then waits at two
//! different `bar.sync`, and the kernel may hang on a GPU (it did on an
//! H200) while the CPU emulator, whose threads are threads, runs it fine.
//!
//! [`aligned_barriers_under_divergence`] finds such barriers from the text:
//! 1. Each function is cut into basic blocks at labels and branches; a
//!    trap (or the `exit` after a call that does not return) ends the
//!    launch, so its path is no way around a barrier.
//! 2. A register (or a slot of the thread's frame) is *lane-dependent*
//!    where lanes of a warp may hold different values in it. Tracked per
//!    point of the program, forward over the blocks: it is read from
//!    `%tid.*`, `%laneid` or `%lanemask_*`, returned by an atomic, `match`
//!    or a shuffle from a lane-dependent lane, loaded from a lane-dependent
//!    address or a lane-dependent frame slot, computed from one, returned
//!    (or stored in the frame) by a callee given one or whose own result is
//!    lane-dependent, written under a lane-dependent guard, or set by an
//!    arm of a lane-dependent branch and read where the arms meet (a block
//!    two arms reach, or the post-dominator; an arm that returns meets
//!    none) — unless the branch into its block already gave it that value
//!    (`mov.pred %p, 0` where the branch found `%p` false). The linear
//!    thread index (`(tid.z * ntid.y + tid.y) * ntid.x + tid.x`) divided by
//!    32 (shifted, masked, compared with a multiple of 32) is the warp's,
//!    the same in every lane. Votes, `bar.red`, `redux` and shuffles from
//!    one lane are the same in every lane; so are a function's parameters
//!    and its loads from a uniform address (one transaction for the warp).
//! 3. A branch on a lane-dependent predicate opens a *region*: the blocks
//!    reachable from its targets before its immediate post-dominator, where
//!    the lanes meet again. Regions and lane-dependent registers grow
//!    together until neither changes.
//! 4. Reported ([`Class`]): a barrier (or a call of a function that reaches
//!    one: ptxas may inline it at each call) that one arm of such a branch
//!    reaches before it joins another arm's paths, while another arm's
//!    lanes reach a barrier too — the copied barrier, also in a loop with
//!    no way out (a persistent kernel's: its arms join at the loop's head);
//!    a barrier under a lane-dependent guard; and, apart, a barrier in a
//!    loop whose exit is lane-dependent. A barrier only some lanes reach,
//!    the others waiting at none, is the CPU emulator's to find (its block
//!    barrier times out).
//!
//! It knows values only as far as step 2 says, so it can report a branch
//! that is in fact the same for the whole warp (a loop over `Coop::Thread`
//! puts calls `put_raw`, whose barriers only `Coop::Block` reaches).

use std::collections::{HashMap, HashSet};

use super::cfg::{call_params, call_target, last_call_stmt, registers, special_divergent, Cfg, Stmt};
use super::functions;

/// What a [`Finding`] is (in order of weight: a barrier that is both
/// keeps the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// The lanes of one arm of a lane-dependent branch wait at this
    /// barrier while the other arm's wait at another: what hangs.
    Arms,
    /// An aligned barrier under a lane-dependent guard.
    Guarded,
    /// In a loop whose exit is lane-dependent, as far as the check can
    /// tell: lanes may leave after different numbers of turns.
    Loop,
}

/// One aligned barrier a warp may reach at different instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The function holding it.
    pub function: String,
    /// The label of its basic block (empty: a block without one).
    pub block: String,
    /// The instruction as written.
    pub instruction: String,
    /// What it is.
    pub class: Class,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.class {
            Class::Arms => "the lanes of one arm of a lane-dependent branch wait here while the other arm's wait at another barrier",
            Class::Guarded => "an aligned barrier under a lane-dependent guard",
            Class::Loop => "in a loop the lanes may leave after different numbers of turns",
        };
        write!(f, "{} (block {}): `{}`: {why}", self.function, self.block, self.instruction)
    }
}

/// What a function offers its callers.
#[derive(Clone, Copy, Default)]
struct Summary {
    /// It reaches an aligned barrier (itself or through calls).
    barrier: bool,
    /// Its result may differ between lanes with uniform arguments.
    divergent_result: bool,
    /// How far past a pointer it was given it stores (its out-parameters'
    /// extent), bytes.
    out_bytes: i64,
}

/// What an instruction does to the lane-dependence of registers.
enum Kind {
    /// The same in every lane whatever it reads (votes, `bar.red`, `redux`).
    Uniform,
    /// A shuffle from one lane: uniform when the lane is.
    Broadcast(Vec<usize>),
    /// Different in each lane whatever it reads (atomics, `match`, other
    /// shuffles).
    Source,
    /// A load from this thread's own local memory, at this offset of its
    /// stack frame where known.
    LoadLocal(Option<Vec<usize>>),
    /// A store to local memory, at this offset where known.
    StoreLocal(Option<Vec<usize>>),
    /// The function's result.
    StoreResult,
    /// A call; `true`: the callee's result is divergent with uniform
    /// arguments. It may write the frame slots given (those at and after
    /// a frame address passed to it, as far as the callee stores): they
    /// hold what it wrote, lane-dependent where its result is or any of its
    /// arguments (the registers last) is.
    Call(bool, Vec<usize>, Vec<usize>),
    /// A callee's result: lane-dependent where the callee's is with
    /// uniform arguments (`true`), or where one of its arguments is.
    CallResult(bool, Vec<usize>),
    /// Lane-dependent when what it reads is.
    Plain,
    /// Sets a predicate to the value every path into its block already
    /// gives it (`mov.pred %p, 0` on the path where a branch found `%p`
    /// false): changes nothing.
    Same,
}

/// One instruction with its registers numbered.
struct Ins {
    defs: Vec<usize>,
    uses: Vec<usize>,
    /// Its guard predicate: where it is lane-dependent, so are the
    /// registers it may or may not write.
    guard: Option<usize>,
    /// It reads `%tid`, `%laneid` or `%lanemask_*`.
    special: bool,
    kind: Kind,
}

/// The registers holding an address in the frame (`%SP`, `%SPL` plus a
/// constant), and those holding a pointer the function was given (loaded
/// from its parameters, plus constants): one pass per step of derivation.
fn addresses(name: &str, blocks: &[Vec<Stmt>]) -> (HashMap<String, Vec<i64>>, HashSet<String>) {
    let mut frame: HashMap<String, Vec<i64>> = ["%SP", "%SPL"].iter().map(|r| (r.to_string(), vec![0])).collect();
    let mut given: HashSet<String> = HashSet::new();
    // Registers holding one of a few constants (`mov`, `selp` of them).
    let mut consts: HashMap<String, Vec<i64>> = HashMap::new();
    let int = |x: &str| x.trim().trim_end_matches('U').parse::<i64>().ok();
    let param = format!("[{name}_param_");
    for _ in 0..4 {
        for st in blocks.iter().flatten() {
            let (o, ops) = (st.op.as_str(), &st.ops);
            let Some(d) = ops.first() else { continue };
            let val = |x: &str, consts: &HashMap<String, Vec<i64>>| int(x).map(|v| vec![v]).or_else(|| consts.get(x.trim()).cloned());
            if o.starts_with("ld.param") && ops.get(1).is_some_and(|a| a.starts_with(&param)) {
                given.insert(d.clone());
            }
            if o.starts_with("mov.") && ops.len() == 2 {
                if let Some(v) = int(&ops[1]) {
                    consts.insert(d.clone(), vec![v]);
                }
            }
            if o.starts_with("selp.") && ops.len() == 4 {
                if let (Some(mut a), Some(b)) = (val(&ops[1], &consts), val(&ops[2], &consts)) {
                    a.extend(b);
                    a.sort_unstable();
                    a.dedup();
                    if a.len() <= 16 {
                        consts.insert(d.clone(), a);
                    }
                }
            }
            let src = ops.get(1).map(String::as_str).unwrap_or("");
            let copy = (o.starts_with("mov.") || o.starts_with("cvta.local")) && ops.len() == 2;
            let add = (o.starts_with("add.s64") || o.starts_with("add.u64")) && ops.len() == 3;
            if copy || add {
                let k = if add { val(&ops[2], &consts) } else { Some(vec![0]) };
                if let (Some(b), Some(k)) = (frame.get(src).cloned(), k) {
                    let mut v: Vec<i64> = b.iter().flat_map(|b| k.iter().map(move |k| b + k)).collect();
                    v.sort_unstable();
                    v.dedup();
                    if v.len() <= 16 {
                        frame.insert(d.clone(), v);
                    }
                }
                if given.contains(src) && (copy || int(&ops[2]).is_some()) {
                    given.insert(d.clone());
                }
            }
        }
    }
    (frame, given)
}

/// How far past the pointers it was given a function stores: the largest
/// offset plus width of its generic stores through them, bytes.
fn out_extent(name: &str, body: &str) -> i64 {
    let cfg = Cfg::of(body);
    let (_, given) = addresses(name, &cfg.blocks);
    cfg.blocks
        .iter()
        .flatten()
        .filter(|s| s.is_store() && !s.op.split('.').any(|q| ["global", "shared", "param", "local"].contains(&q)))
        .filter_map(|s| {
            let a = s.ops.first()?.trim().trim_start_matches('[').trim_end_matches(']');
            let (reg, k) = match a.split_once('+') {
                Some((r, k)) => (r.trim(), k.trim().parse::<i64>().ok()?),
                None => (a.trim(), 0),
            };
            let width = if s.op.contains(".v4") || s.op.contains(".v2.b64") || s.op.contains(".v2.u64") {
                16
            } else {
                8
            };
            given.contains(reg).then_some(k + width)
        })
        .max()
        .unwrap_or(0)
}

/// The registers holding the thread's linear index in its block
/// (`(tid.z * ntid.y + tid.y) * ntid.x + tid.x`, as `thread_rank_in_block`
/// computes it), or a copy of it: warps are cut from that index, 32 at a
/// time.
fn linear_thread_index(blocks: &[Vec<Stmt>]) -> HashSet<String> {
    let copies_of = |special: &str| -> HashSet<String> {
        blocks
            .iter()
            .flatten()
            .filter(|s| s.op.starts_with("mov.") && s.ops.get(1).is_some_and(|x| x == special))
            .filter_map(|s| s.ops.first().cloned())
            .collect()
    };
    let (tid_x, ntid_x) = (copies_of("%tid.x"), copies_of("%ntid.x"));
    let (tid_y, ntid_y, tid_z) = (copies_of("%tid.y"), copies_of("%ntid.y"), copies_of("%tid.z"));
    let mad = |s: &Stmt, a: &HashSet<String>, b: &HashSet<String>, c: &HashSet<String>| {
        s.op.starts_with("mad.lo") && s.ops.len() == 4 && a.contains(&s.ops[1]) && b.contains(&s.ops[2]) && c.contains(&s.ops[3])
    };
    // `tid.z * ntid.y + tid.y`, then that `* ntid.x + tid.x`: no other
    // multiplicand (the block's index would make it the grid's).
    let rows: HashSet<String> = blocks
        .iter()
        .flatten()
        .filter(|s| mad(s, &tid_z, &ntid_y, &tid_y))
        .map(|s| s.ops[0].clone())
        .chain(tid_y.iter().cloned())
        .collect();
    let mut linear: HashSet<String> = blocks
        .iter()
        .flatten()
        .filter(|s| mad(s, &rows, &ntid_x, &tid_x))
        .map(|s| s.ops[0].clone())
        .collect();
    for _ in 0..2 {
        for s in blocks.iter().flatten() {
            if (s.op.starts_with("cvt.u64.u32") || s.op.starts_with("mov.")) && s.ops.len() == 2 && linear.contains(&s.ops[1]) {
                linear.insert(s.ops[0].clone());
            }
        }
    }
    linear
}

/// Whether `s` computes, from a linear thread index, something the same
/// in every lane of a warp: the index shifted right by 5 or more, divided
/// by or masked to a multiple of 32, or compared with a warp boundary.
fn warp_of_linear(s: &Stmt, linear: &HashSet<String>) -> bool {
    let int = |x: &String| x.trim_end_matches('U').parse::<i64>().ok();
    let (Some(x), Some(k)) = (s.ops.get(1), s.ops.get(2).and_then(int)) else {
        return false;
    };
    if !linear.contains(x) || s.ops.len() != 3 {
        return false;
    }
    let o = s.op.as_str();
    (o.starts_with("shr.") && k >= 5)
        || (o.starts_with("div.u") && k > 0 && k % 32 == 0)
        || (o.starts_with("and.") && k & 31 == 0)
        || ((o.starts_with("setp.lt.u") || o.starts_with("setp.ge.u")) && k % 32 == 0)
        || ((o.starts_with("setp.le.u") || o.starts_with("setp.gt.u")) && k % 32 == 31)
}

/// The frame offsets an address operand `[%r+k]` may name, where known.
fn frame_offset(frame: &HashMap<String, Vec<i64>>, operand: &str) -> Option<Vec<i64>> {
    let inner = operand.trim().trim_start_matches('[').trim_end_matches(']');
    let (reg, k) = match inner.split_once('+') {
        Some((r, k)) => (r.trim(), k.trim().parse::<i64>().ok()?),
        None => (inner.trim(), 0),
    };
    frame.get(reg).map(|b| b.iter().map(|b| b + k).collect())
}

/// Whether `ins` leaves its results lane-dependent, given the
/// lane-dependent registers (and frame slots) in `set`, which it updates
/// for the slots it writes (a lane-dependent store to an unknown address
/// sets the "anywhere" slot); notes a lane-dependent result in `result`
/// (any result stored inside a `region`: its lanes may return different
/// values).
fn step(ins: &Ins, set: &mut Bits, region: bool, result: &mut bool) -> bool {
    let read = ins.special || set.any(&ins.uses);
    let lanes = region && matches!(ins.kind, Kind::StoreResult)
        || match &ins.kind {
            Kind::Uniform => false,
            Kind::Broadcast(lane) => set.any(lane),
            Kind::Source => true,
            Kind::LoadLocal(at) => {
                read || set.has(set.anywhere()) || at.as_ref().is_some_and(|k| set.any(k)) || at.is_none() && set.any_slot()
            }
            Kind::StoreLocal(_) | Kind::StoreResult | Kind::Plain => read,
            Kind::Call(d, _, args) | Kind::CallResult(d, args) => *d || set.any(args),
            Kind::Same => false,
        };
    match &ins.kind {
        // One slot: it now holds what was stored; one of several: each may.
        Kind::StoreLocal(Some(k)) if k.len() == 1 => set.set(k[0], lanes),
        Kind::StoreLocal(Some(k)) if lanes => k.iter().for_each(|&k| set.set(k, true)),
        Kind::StoreLocal(None) if lanes => set.set(set.anywhere(), true),
        Kind::Call(_, slots, _) => {
            for &k in slots {
                set.set(k, lanes);
            }
        }
        Kind::StoreResult if lanes => *result = true,
        _ => {}
    }
    lanes
}

/// Marks the registers `ins` writes lane-dependent or not (`lanes`); a
/// guarded instruction may leave them as they were, so there they keep
/// what they had, and take the guard's lane-dependence too.
fn write_defs(ins: &Ins, set: &mut Bits, lanes: bool) {
    let guard = ins.guard.is_some_and(|g| set.has(g));
    for &d in &ins.defs {
        let v = if ins.guard.is_some() { set.has(d) || lanes || guard } else { lanes };
        set.set(d, v);
    }
}

/// The registers a call passes.
fn call_args(stmts: &[Stmt], call: &Stmt) -> Vec<String> {
    call_params(stmts, call).flat_map(registers).collect()
}

/// Sets of register numbers: registers, then frame slots from `.1` on,
/// the last of `.2` bits standing for "somewhere in the frame" (a store
/// to an address not known).
#[derive(Clone, PartialEq)]
struct Bits(Vec<u64>, usize, usize);

impl Bits {
    fn new(n: usize, slots: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)], slots, n)
    }
    fn anywhere(&self) -> usize {
        self.2 - 1
    }
    fn any_slot(&self) -> bool {
        (self.1..self.2).any(|i| self.has(i))
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 != 0
    }
    fn set(&mut self, i: usize, on: bool) {
        if on {
            self.0[i / 64] |= 1 << (i % 64);
        } else {
            self.0[i / 64] &= !(1 << (i % 64));
        }
    }
    fn any(&self, regs: &[usize]) -> bool {
        regs.iter().any(|&r| self.has(r))
    }
    /// `self |= other`; whether it grew.
    fn join(&mut self, other: &Bits) -> bool {
        let mut grew = false;
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            grew |= *b & !*a != 0;
            *a |= *b;
        }
        grew
    }
}

/// The divergence analysis of one function; returns its findings and
/// whether its result (`func_retval*`) is divergent. Lane-dependence is
/// tracked per point of the program (a register LLVM reuses for another
/// value is lane-dependent only where that value is), forward over the
/// blocks, joined where paths meet.
fn analyse(name: &str, body: &str, callees: &HashMap<String, Summary>) -> (Vec<Finding>, bool) {
    let cfg = Cfg::of(body);
    let ipdom = cfg.ipdoms();
    let n = cfg.blocks.len();
    let mut numbers: HashMap<String, usize> = HashMap::new();
    let mut number = |r: String| {
        let k = numbers.len();
        *numbers.entry(r).or_insert(k)
    };
    let (frame, _) = addresses(name, &cfg.blocks);
    // Frame slots are numbered after the registers (`slot` below).
    let offsets: Vec<i64> = {
        let mut v: Vec<i64> = cfg
            .blocks
            .iter()
            .flatten()
            .filter(|s| s.op.starts_with("ld.") || s.is_store())
            .filter_map(|s| s.ops.get(if s.is_store() { 0 } else { 1 }).and_then(|a| frame_offset(&frame, a)))
            .flatten()
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let slot_of = |k: i64| offsets.binary_search(&k).ok();
    // The frame addresses passed to a call (its `st.param` values).
    let passed = |stmts: &[Stmt], s: &Stmt| -> Vec<usize> {
        let size = call_target(s).and_then(|c| callees.get(&c).map(|x| x.out_bytes)).unwrap_or(0);
        call_params(stmts, s)
            .filter_map(|v| frame.get(v))
            .flatten()
            .flat_map(|&base| {
                offsets
                    .iter()
                    .enumerate()
                    .filter(move |(_, &k)| k >= base && k < base + size)
                    .map(|(i, _)| i)
            })
            .collect()
    };
    let linear = linear_thread_index(&cfg.blocks);
    let mut code: Vec<Vec<Ins>> = cfg
        .blocks
        .iter()
        .map(|stmts| {
            stmts
                .iter()
                .map(|s| {
                    let o = s.op.as_str();
                    let uses = s.uses();
                    let special = uses.iter().any(|u| special_divergent(u));
                    let kind = if o.starts_with("vote.")
                        || o.starts_with("bar.red")
                        || o.starts_with("redux.")
                        || o.starts_with("activemask")
                        || warp_of_linear(s, &linear)
                    {
                        Kind::Uniform
                    } else if o.starts_with("shfl.sync.idx") {
                        Kind::Broadcast(
                            s.ops
                                .get(2)
                                .map(|l| registers(l))
                                .unwrap_or_default()
                                .into_iter()
                                .map(&mut number)
                                .collect(),
                        )
                    } else if o.starts_with("atom") || o.starts_with("match.") || o.starts_with("shfl.") {
                        Kind::Source
                    } else if o.starts_with("ld.local")
                        || o.starts_with("ld.") && s.ops.get(1).is_some_and(|a| frame_offset(&frame, a).is_some())
                    {
                        Kind::LoadLocal(
                            s.ops
                                .get(1)
                                .and_then(|a| frame_offset(&frame, a))
                                .and_then(|v| v.into_iter().map(slot_of).collect()),
                        )
                    } else if s.is_store() && (o.contains(".local") || s.ops.first().is_some_and(|a| frame_offset(&frame, a).is_some())) {
                        Kind::StoreLocal(
                            s.ops
                                .first()
                                .and_then(|a| frame_offset(&frame, a))
                                .and_then(|v| v.into_iter().map(slot_of).collect()),
                        )
                    } else if s.is_store() && s.ops.first().is_some_and(|a| a.contains("func_retval")) {
                        Kind::StoreResult
                    } else if o.starts_with("call") {
                        Kind::Call(
                            call_target(s).is_some_and(|c| callees.get(&c).is_some_and(|x| x.divergent_result)),
                            passed(stmts, s),
                            call_args(stmts, s).into_iter().map(&mut number).collect(),
                        )
                    } else if o.starts_with("ld.param") && s.ops.get(1).is_some_and(|a| a.contains("retval")) {
                        let call = last_call_stmt(stmts, s);
                        let callee = call.and_then(call_target);
                        Kind::CallResult(
                            callee.is_some_and(|c| callees.get(&c).is_some_and(|x| x.divergent_result)),
                            call.map(|c| call_args(stmts, c))
                                .unwrap_or_default()
                                .into_iter()
                                .map(&mut number)
                                .collect(),
                        )
                    } else {
                        Kind::Plain
                    };
                    Ins {
                        guard: s.guard.clone().map(&mut number),
                        defs: s.defs().into_iter().map(&mut number).collect(),
                        uses: uses.into_iter().filter(|u| !special_divergent(u)).map(&mut number).collect(),
                        special,
                        kind,
                    }
                })
                .collect()
        })
        .collect();
    // Predicates set to what the branches into their block imply.
    let preds_of = cfg.preds();
    for (b, stmts) in cfg.blocks.iter().enumerate() {
        for (i, st) in stmts.iter().enumerate() {
            let value = match (st.op.as_str(), st.ops.get(1).map(String::as_str)) {
                ("mov.pred", Some("0")) => false,
                ("mov.pred", Some("-1" | "1")) => true,
                _ => continue,
            };
            let Some(r) = st.ops.first() else { continue };
            let set_before = stmts[..i].iter().any(|x| x.defs().contains(r));
            if !set_before && !preds_of[b].is_empty() && preds_of[b].iter().all(|&p| cfg.edge_implies(p, b, r) == Some(value)) {
                code[b][i].kind = Kind::Same;
            }
        }
    }
    // Slot `i` is register `regs + i`.
    let first_slot = numbers.len();
    let regs = first_slot + offsets.len() + 1;
    for ins in code.iter_mut().flatten() {
        match &mut ins.kind {
            Kind::LoadLocal(Some(k)) | Kind::StoreLocal(Some(k)) => k.iter_mut().for_each(|k| *k += first_slot),
            Kind::Call(_, slots, _) => slots.iter_mut().for_each(|k| *k += first_slot),
            _ => {}
        }
    }
    let guard_of = |s: &Stmt| s.guard.as_ref().and_then(|g| numbers.get(g).copied());
    // Blocks inside some region (where a store of the result counts as
    // lane-dependent: lanes of different arms return different values).
    let mut in_region = vec![false; n];
    // Registers lane-dependent on entry to a block where the arms of a
    // lane-dependent branch meet: those the arms set.
    let mut merged: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut opened = vec![false; n];
    let mut regions: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut ret_div = false;
    // The lane-dependent registers at the end of each block.
    let mut out: Vec<Bits>;
    loop {
        let mut entry = vec![Bits::new(regs, first_slot); n];
        out = vec![Bits::new(regs, first_slot); n];
        let mut todo: Vec<usize> = (0..n).rev().collect();
        let mut queued = vec![true; n];
        while let Some(b) = todo.pop() {
            queued[b] = false;
            let mut set = entry[b].clone();
            for &r in &merged[b] {
                set.set(r, true);
            }
            for ins in &code[b] {
                let lanes = step(ins, &mut set, in_region[b], &mut ret_div);
                if matches!(ins.kind, Kind::Same) {
                    continue;
                }
                write_defs(ins, &mut set, lanes);
            }
            if set != out[b] {
                out[b] = set;
                for &s in &cfg.succ[b] {
                    if entry[s].join(&out[b]) && !queued[s] {
                        queued[s] = true;
                        todo.push(s);
                    }
                }
            }
        }
        let mut changed = false;
        // A branch on a lane-dependent value opens a region.
        for (b, stmts) in cfg.blocks.iter().enumerate() {
            let Some(last) = stmts.last() else { continue };
            let o = last.op.as_str();
            let on_guard = guard_of(last).is_some_and(|g| out[b].has(g));
            let cond = (o.starts_with("bra") || o.starts_with("ret") || o.starts_with("exit")) && on_guard
                || o.starts_with("brx")
                    && last.ops.first().is_some_and(|r| {
                        registers(r)
                            .iter()
                            .any(|x| special_divergent(x) || numbers.get(x).is_some_and(|&k| out[b].has(k)))
                    });
            if cond && !opened[b] {
                opened[b] = true;
                changed = true;
                let region = cfg.region(b, ipdom[b]);
                for &v in &region {
                    in_region[v] = true;
                }
                // Where the arms meet (a block two arms reach, and the
                // post-dominator), what any of them set is the lanes' own;
                // an arm that ends the launch (a return from the kernel)
                // meets no other.
                let mut reach: HashMap<usize, usize> = HashMap::new();
                for &s in &cfg.succ[b] {
                    for v in cfg.region_from(s, ipdom[b]) {
                        *reach.entry(v).or_default() += 1;
                    }
                }
                let set: Vec<usize> = region
                    .iter()
                    .flat_map(|&v| {
                        code[v].iter().filter(|x| !matches!(x.kind, Kind::Same)).flat_map(|x| {
                            // Registers, and the frame slots it stores to or
                            // hands a callee.
                            let slots: Vec<usize> = match &x.kind {
                                Kind::StoreLocal(Some(k)) | Kind::Call(_, k, _) => k.clone(),
                                Kind::StoreLocal(None) => vec![regs - 1],
                                _ => Vec::new(),
                            };
                            x.defs.iter().copied().chain(slots)
                        })
                    })
                    .collect();
                let joins = reach.iter().filter(|(_, &c)| c >= 2).map(|(&v, _)| v).chain(ipdom[b]);
                for j in joins {
                    merged[j].extend(set.iter().copied());
                }
                regions.push((b, region));
            }
        }
        if !changed {
            break;
        }
    }
    // A guard read before the block's end: the registers at that point.
    let guarded = |b: usize, i: usize| -> bool {
        let Some(g) = guard_of(&cfg.blocks[b][i]) else { return false };
        let mut set = {
            let mut e = Bits::new(regs, first_slot);
            for (p, succ) in cfg.succ.iter().enumerate() {
                if succ.contains(&b) {
                    e.join(&out[p]);
                }
            }
            e
        };
        let mut result = false;
        for &r in &merged[b] {
            set.set(r, true);
        }
        for ins in &code[b][..i] {
            let lanes = step(ins, &mut set, in_region[b], &mut result);
            if matches!(ins.kind, Kind::Same) {
                continue;
            }
            write_defs(ins, &mut set, lanes);
        }
        set.has(g)
    };
    let reaches_barrier = |s: &Stmt| {
        s.aligned_barrier() || (s.op.starts_with("call") && call_target(s).is_some_and(|c| callees.get(&c).is_some_and(|x| x.barrier)))
    };
    // (block, index) of each reported instruction, once.
    let mut reported: Vec<((usize, usize), Class)> = Vec::new();
    // Which barrier an instruction waits at: its own, or its callee's
    // (lanes calling one function from two places meet at its barrier).
    let barriers_in = |b: usize| -> Vec<(usize, usize)> {
        cfg.blocks[b]
            .iter()
            .enumerate()
            .filter(|(_, x)| reaches_barrier(x))
            .map(|(i, _)| (b, i))
            .collect()
    };
    for (branch, region) in &regions {
        let stop = ipdom[*branch];
        let in_loop = region.contains(branch);
        // What each arm of the branch reaches before its lanes meet again
        // (the post-dominator), and where two arms' paths join before that
        // (a merge, a loop's head: also where there is no post-dominator).
        // (Not through the branch again: in a loop, each arm's next turn.)
        let b0 = *branch;
        let reach: Vec<HashSet<usize>> = cfg.succ[b0]
            .iter()
            .map(|&s| cfg.walk_until(vec![s], |v| Some(v) == stop || v == b0).into_iter().collect())
            .collect();
        let mut seen: HashMap<usize, usize> = HashMap::new();
        for r in &reach {
            for &v in r {
                *seen.entry(v).or_default() += 1;
            }
        }
        let has_barrier: Vec<bool> = reach.iter().map(|r| r.iter().any(|&v| !barriers_in(v).is_empty())).collect();
        for (k, &s) in cfg.succ[*branch].iter().enumerate() {
            // An arm's own barriers: reached before any join. Each is an
            // instruction of its own (a call too: ptxas may inline the
            // callee at each call).
            let own = cfg.walk_until(vec![s], |v| Some(v) == stop || v == b0 || seen.get(&v).is_some_and(|&c| c >= 2));
            let other_waits = has_barrier.iter().enumerate().any(|(l, &h)| l != k && h);
            if other_waits {
                for at in own.into_iter().flat_map(barriers_in) {
                    reported.push((at, Class::Arms));
                }
            }
        }
        if in_loop {
            for at in region.iter().flat_map(|&b| {
                cfg.blocks[b]
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| reaches_barrier(x))
                    .map(move |(i, _)| (b, i))
            }) {
                reported.push((at, Class::Loop));
            }
        }
    }
    for (b, stmts) in cfg.blocks.iter().enumerate() {
        for (i, s) in stmts.iter().enumerate() {
            if reaches_barrier(s) && guarded(b, i) {
                reported.push(((b, i), Class::Guarded));
            }
        }
    }
    reported.sort_by_key(|&(at, class)| (at, class));
    reported.dedup_by_key(|(at, _)| *at);
    let found = reported
        .into_iter()
        .map(|((b, i), class)| Finding {
            function: name.to_string(),
            block: cfg.names[b].clone(),
            instruction: cfg.blocks[b][i].text.clone(),
            class,
        })
        .collect();
    (found, ret_div)
}

/// Every aligned barrier of `ptx` a warp may reach at different
/// instructions (module docs). Functions are analysed callees first, so a
/// call knows whether its callee reaches a barrier.
pub fn aligned_barriers_under_divergence(ptx: &str) -> Vec<Finding> {
    let funcs = functions(ptx);
    let names: HashSet<&str> = funcs.iter().map(|(n, _)| *n).collect();
    let calls: HashMap<&str, Vec<String>> = funcs
        .iter()
        .map(|(n, body)| {
            let cfg = Cfg::of(body);
            let c = cfg
                .blocks
                .iter()
                .flatten()
                .filter(|s| s.op.starts_with("call"))
                .filter_map(call_target)
                .filter(|c| names.contains(c.as_str()))
                .collect();
            (*n, c)
        })
        .collect();
    // Callees before callers (a call graph without recursion; a cycle is
    // cut where it closes).
    let mut order: Vec<&str> = Vec::new();
    let mut state: HashMap<&str, u8> = HashMap::new();
    fn visit<'a>(n: &'a str, calls: &HashMap<&'a str, Vec<String>>, state: &mut HashMap<&'a str, u8>, order: &mut Vec<&'a str>) {
        if state.contains_key(n) {
            return;
        }
        state.insert(n, 1);
        for c in calls.get(n).into_iter().flatten() {
            if let Some((&k, _)) = calls.get_key_value(c.as_str()) {
                visit(k, calls, state, order);
            }
        }
        state.insert(n, 2);
        order.push(n);
    }
    for (n, _) in &funcs {
        visit(n, &calls, &mut state, &mut order);
    }
    let bodies: HashMap<&str, &str> = funcs.iter().copied().collect();
    let mut summaries: HashMap<String, Summary> = HashMap::new();
    let mut found = Vec::new();
    for n in order {
        let body = bodies[n];
        let (f, ret_div) = analyse(n, body, &summaries);
        let out_bytes = out_extent(n, body);
        let barrier = Cfg::of(body).blocks.iter().flatten().any(|s| {
            s.aligned_barrier()
                || (s.op.starts_with("call") && call_target(s).is_some_and(|c| summaries.get(&c).is_some_and(|x| x.barrier)))
        });
        summaries.insert(
            n.to_string(),
            Summary {
                barrier,
                divergent_result: ret_div,
                out_bytes,
            },
        );
        found.extend(f);
    }
    found
}

//! PTX text cut into instructions and basic blocks, with post-dominators.

use std::collections::{HashMap, HashSet};

use super::operands;

/// One instruction: its guard predicate (name, negated), opcode, operands.
#[derive(Clone, Debug)]
pub(super) struct Stmt {
    pub(super) guard: Option<String>,
    /// The guard is negated (`@!%p`).
    pub(super) negated: bool,
    pub(super) op: String,
    pub(super) ops: Vec<String>,
    pub(super) text: String,
}

impl Stmt {
    pub(super) fn parse(text: &str, locals: &HashMap<String, String>) -> Option<Stmt> {
        let text = text.trim();
        if text.is_empty() || text.starts_with('.') {
            return None;
        }
        let (guard, ins) = match text.strip_prefix('@') {
            Some(g) => {
                let (p, ins) = g.split_once(char::is_whitespace)?;
                (Some(rename(p.trim_start_matches('!'), locals)), ins.trim())
            }
            None => (None, text),
        };
        let negated = text.starts_with("@!");
        let op = ins.split_whitespace().next()?.to_string();
        let ops = operands(ins).into_iter().map(|o| rename(&o, locals)).collect();
        Some(Stmt {
            guard,
            negated,
            op,
            ops,
            text: text.to_string(),
        })
    }

    /// The registers it writes.
    pub(super) fn defs(&self) -> Vec<String> {
        let o = self.op.as_str();
        let writes = !(o == "st"
            || o.starts_with("st.")
            || o.starts_with("red.")
            || o.starts_with("bra")
            || o.starts_with("brx")
            || o.starts_with("ret")
            || o.starts_with("exit")
            || o.starts_with("trap")
            || o.starts_with("fence")
            || o.starts_with("membar")
            || o.starts_with("bar.sync")
            || o.starts_with("bar.arrive")
            || o.starts_with("bar.warp")
            || o.starts_with("barrier.")
            || o.starts_with("prefetch")
            || o.starts_with("cp.")
            || o.starts_with("nanosleep")
            || o.starts_with("griddepcontrol")
            || o.starts_with("call")
            || o.starts_with("mbarrier.init")
            || o.starts_with("mbarrier.inval"));
        if !writes {
            return Vec::new();
        }
        self.ops.first().map(|d| registers(d)).unwrap_or_default()
    }

    /// The registers it reads (its guard too).
    pub(super) fn uses(&self) -> Vec<String> {
        let skip = usize::from(!self.defs().is_empty());
        let mut v: Vec<String> = self.ops.iter().skip(skip).flat_map(|o| registers(o)).collect();
        v.extend(self.guard.clone());
        v
    }

    pub(super) fn aligned_barrier(&self) -> bool {
        let o = self.op.as_str();
        (o.starts_with("bar.") && !o.starts_with("bar.warp")) || (o.starts_with("barrier.") && o.contains(".aligned"))
    }

    pub(super) fn is_store(&self) -> bool {
        self.op == "st" || self.op.starts_with("st.")
    }
}

/// Renames an asm block's local register (`.reg .pred p;` inside `{ }`).
pub(super) fn rename(operand: &str, locals: &HashMap<String, String>) -> String {
    if locals.is_empty() {
        return operand.to_string();
    }
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(locals.get(word.as_str()).map_or(word.as_str(), String::as_str));
        word.clear();
    };
    for c in operand.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == '%' || c == '$' || c == '#' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// The register names in an operand (`%r1`, `[%rd2+8]`, `{%r3, %r4}`,
/// `%p1|%p2`, an asm block's renamed local `p#3`); special registers keep
/// their `%` name (`%tid.x`).
pub(super) fn registers(operand: &str) -> Vec<String> {
    operand
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '%' || c == '.' || c == '#'))
        .filter(|w| w.starts_with('%') || w.contains('#'))
        .map(str::to_string)
        .collect()
}

pub(super) fn special_divergent(reg: &str) -> bool {
    reg.starts_with("%tid") || reg.starts_with("%laneid") || reg.starts_with("%lanemask")
}

/// A function cut into basic blocks.
pub(super) struct Cfg {
    pub(super) blocks: Vec<Vec<Stmt>>,
    pub(super) succ: Vec<Vec<usize>>,
    pub(super) names: Vec<String>,
}

impl Cfg {
    pub(super) fn of(body: &str) -> Cfg {
        let mut blocks: Vec<Vec<Stmt>> = vec![Vec::new()];
        let mut labels: HashMap<String, usize> = HashMap::new();
        let mut tables: HashMap<String, Vec<String>> = HashMap::new();
        let mut table: Option<(String, Vec<String>)> = None;
        let mut scopes = 0usize;
        for line in body.lines() {
            let line = line.split("//").next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            // An indirect branch's targets: `$L_brx_0: .branchtargets $A, $B;`,
            // over as many lines as it takes.
            let targets = match line.split_once(':').filter(|(_, r)| r.contains(".branchtargets")) {
                Some((name, rest)) => {
                    table = Some((name.trim().to_string(), Vec::new()));
                    Some(rest.replace(".branchtargets", ""))
                }
                None => table.is_some().then(|| line.to_string()),
            };
            if let (Some(targets), Some((_, t))) = (targets, table.as_mut()) {
                t.extend(
                    targets
                        .split([',', ';'])
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                );
                if line.ends_with(';') {
                    let (n, t) = table.take().unwrap();
                    tables.insert(n, t);
                }
                continue;
            }
            if let Some(label) = line.strip_suffix(':').filter(|l| !l.contains(char::is_whitespace)) {
                if !blocks.last().unwrap().is_empty() {
                    blocks.push(Vec::new());
                }
                labels.insert(label.to_string(), blocks.len() - 1);
                continue;
            }
            if line == "{" || line == "}" {
                continue;
            }
            // An asm block on one line: `{ .reg .pred p; setp ... p, ...; }`.
            let mut locals = HashMap::new();
            let mut text = line;
            if let Some(inner) = line.strip_prefix('{') {
                scopes += 1;
                text = inner.trim_end().trim_end_matches('}');
            }
            for s in text.split(';') {
                let s = s.trim();
                if let Some(decl) = s.strip_prefix(".reg") {
                    for name in decl.split_whitespace().skip(1).flat_map(|w| w.split(',')) {
                        let name = name.trim();
                        if !name.is_empty() && !name.starts_with('%') {
                            locals.insert(name.to_string(), format!("{name}#{scopes}"));
                        }
                    }
                    continue;
                }
                let Some(st) = Stmt::parse(s, &locals) else { continue };
                let ends = st.op.starts_with("bra")
                    || st.op.starts_with("brx")
                    || st.op.starts_with("ret")
                    || st.op.starts_with("exit")
                    || st.op.starts_with("trap");
                blocks.last_mut().unwrap().push(st);
                if ends {
                    blocks.push(Vec::new());
                }
            }
        }
        let n = blocks.len();
        let mut succ = vec![Vec::new(); n];
        for (b, stmts) in blocks.iter().enumerate() {
            let fall = (b + 1 < n).then_some(b + 1);
            let Some(last) = stmts.last() else {
                succ[b].extend(fall);
                continue;
            };
            let target = |l: &String| labels.get(l.trim()).copied();
            let o = last.op.as_str();
            if o.starts_with("bra") {
                succ[b].extend(last.ops.first().and_then(target));
                if last.guard.is_some() {
                    succ[b].extend(fall);
                }
            } else if o.starts_with("brx") {
                let t = last.ops.get(1).and_then(|t| tables.get(t.trim())).cloned().unwrap_or_default();
                succ[b].extend(t.iter().filter_map(target));
                if last.guard.is_some() {
                    succ[b].extend(fall);
                }
            } else if o.starts_with("ret") || o.starts_with("exit") || o.starts_with("trap") {
                if last.guard.is_some() {
                    succ[b].extend(fall);
                }
            } else {
                succ[b].extend(fall);
            }
        }
        let mut names = vec![String::new(); n];
        for (l, &b) in &labels {
            names[b] = l.clone();
        }
        Cfg { blocks, succ, names }
    }

    /// Each block's predecessors.
    pub(super) fn preds(&self) -> Vec<Vec<usize>> {
        let mut p = vec![Vec::new(); self.blocks.len()];
        for (b, succ) in self.succ.iter().enumerate() {
            for &s in succ {
                if !p[s].contains(&b) {
                    p[s].push(b);
                }
            }
        }
        p
    }

    /// The value predicate `r` has on the edge from `p` to `s`, where the
    /// branch ending `p` says: its guard is true on the taken edge and
    /// false on the other, and a guard set in `p` by `or.pred` (false: both
    /// false), `and.pred` (true: both true) or `not.pred` passes that on.
    pub(super) fn edge_implies(&self, p: usize, s: usize, r: &str) -> Option<bool> {
        let last = self.blocks[p].last()?;
        let g = last.guard.as_ref()?;
        if !last.op.starts_with("bra") {
            return None;
        }
        let target = self.succ[p].first().copied();
        let fall = self.succ[p].get(1).copied();
        if target == fall {
            return None;
        }
        let taken = if Some(s) == target {
            true
        } else if Some(s) == fall {
            false
        } else {
            return None;
        };
        let mut facts: Vec<(String, bool)> = vec![(g.clone(), taken != last.negated)];
        // Back through the block, each register's latest definition only.
        let mut later: HashSet<String> = HashSet::new();
        for st in self.blocks[p][..self.blocks[p].len() - 1].iter().rev() {
            let defs = st.defs();
            if let Some(d) = defs.first().filter(|d| !later.contains(*d)) {
                if let Some(&(_, v)) = facts.iter().find(|(f, _)| f == d) {
                    let srcs: Vec<String> = st.ops[1..]
                        .iter()
                        .filter(|x| x.starts_with('%') && !later.contains(*x))
                        .cloned()
                        .collect();
                    match (st.op.as_str(), v) {
                        ("or.pred", false) | ("and.pred", true) => facts.extend(srcs.into_iter().map(|x| (x, v))),
                        ("not.pred", _) => facts.extend(srcs.into_iter().map(|x| (x, !v))),
                        _ => {}
                    }
                }
            }
            later.extend(defs);
        }
        facts.iter().find(|(f, _)| f == r).map(|&(_, v)| v)
    }

    /// Each block's immediate post-dominator (`None`: the function's exit,
    /// or none where no exit is reachable), by Cooper, Harvey and Kennedy's
    /// iteration over the reversed graph.
    pub(super) fn ipdoms(&self) -> Vec<Option<usize>> {
        let n = self.blocks.len();
        let exit = n;
        // On the reversed graph, rooted at the exit: a block's
        // predecessors there are its successors here (and the exit for a
        // block that ends the function).
        let mut rpreds: Vec<Vec<usize>> = self.succ.clone();
        for (b, s) in self.succ.iter().enumerate() {
            // A trap ends the whole launch: no lane waits at a barrier
            // after it, so its path does not count as a way around one.
            // Nor does `exit`: the NVPTX backend writes it only after a
            // call that does not return (a panic, which traps).
            let trap = self.blocks[b]
                .last()
                .is_some_and(|x| (x.op.starts_with("trap") || x.op.starts_with("exit")) && x.guard.is_none());
            if s.is_empty() && !trap {
                rpreds[b].push(exit);
            }
        }
        rpreds.push(Vec::new());
        let mut rsucc: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
        for (b, ps) in rpreds.iter().enumerate() {
            for &p in ps {
                rsucc[p].push(b);
            }
        }
        // Postorder of the reversed graph from the exit.
        let mut order = vec![usize::MAX; n + 1];
        let mut post = Vec::with_capacity(n + 1);
        let mut seen = vec![false; n + 1];
        let mut stack = vec![(exit, 0usize)];
        seen[exit] = true;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if let Some(&w) = rsucc[v].get(*i) {
                *i += 1;
                if !seen[w] {
                    seen[w] = true;
                    stack.push((w, 0));
                }
            } else {
                order[v] = post.len();
                post.push(v);
                stack.pop();
            }
        }
        let mut idom = vec![usize::MAX; n + 1];
        idom[exit] = exit;
        let intersect = |idom: &[usize], mut a: usize, mut b: usize| {
            while a != b {
                while order[a] < order[b] {
                    a = idom[a];
                }
                while order[b] < order[a] {
                    b = idom[b];
                }
            }
            a
        };
        let mut changed = true;
        while changed {
            changed = false;
            for &v in post.iter().rev() {
                if v == exit {
                    continue;
                }
                let mut new = usize::MAX;
                for &p in &rpreds[v] {
                    if idom[p] == usize::MAX {
                        continue;
                    }
                    new = if new == usize::MAX { p } else { intersect(&idom, p, new) };
                }
                if new != usize::MAX && idom[v] != new {
                    idom[v] = new;
                    changed = true;
                }
            }
        }
        (0..n)
            .map(|b| (idom[b] != usize::MAX && idom[b] != exit).then_some(idom[b]))
            .collect()
    }

    /// The blocks a branch at the end of `b` leads to before `stop`.
    pub(super) fn region(&self, b: usize, stop: Option<usize>) -> Vec<usize> {
        self.walk(self.succ[b].clone(), stop)
    }

    /// The blocks from `s` on before `stop`.
    pub(super) fn region_from(&self, s: usize, stop: Option<usize>) -> Vec<usize> {
        self.walk(vec![s], stop)
    }

    /// The blocks from `todo` on, not past (nor into) those `stop` names.
    pub(super) fn walk_until(&self, mut todo: Vec<usize>, stop: impl Fn(usize) -> bool) -> Vec<usize> {
        let mut seen = HashSet::new();
        while let Some(v) = todo.pop() {
            if stop(v) || !seen.insert(v) {
                continue;
            }
            todo.extend(self.succ[v].iter().copied());
        }
        seen.into_iter().collect()
    }

    pub(super) fn walk(&self, todo: Vec<usize>, stop: Option<usize>) -> Vec<usize> {
        self.walk_until(todo, |v| Some(v) == stop)
    }
}

/// The function a `call` names.
pub(super) fn call_target(s: &Stmt) -> Option<String> {
    s.ops
        .iter()
        .find(|o| !o.starts_with('(') && !o.starts_with('%') && !o.is_empty())
        .map(|o| o.trim().to_string())
}

/// The last `call` before `s` in its block.
pub(super) fn last_call_stmt<'a>(stmts: &'a [Stmt], s: &Stmt) -> Option<&'a Stmt> {
    let at = stmts.iter().position(|x| std::ptr::eq(x, s))?;
    stmts[..at].iter().rev().find(|x| x.op.starts_with("call"))
}

/// The values a call passes: the `st.param` of its call sequence, each
/// with the operand it stores.
pub(super) fn call_params<'a>(stmts: &'a [Stmt], call: &Stmt) -> impl Iterator<Item = &'a str> {
    let at = stmts.iter().position(|x| std::ptr::eq(x, call)).unwrap_or(0);
    stmts[..at]
        .iter()
        .rev()
        .take_while(|x| !x.op.starts_with("call"))
        .filter(|x| x.op.starts_with("st.param"))
        .filter_map(|x| x.ops.get(1).map(|v| v.trim()))
}

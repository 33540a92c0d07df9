#!/usr/bin/env python3
"""Where an IBGDA put_signal round trip's time goes, from a device trace.

Usage: python3 scripts/rtt-timeline.py DIR/trace.json

DIR is the trace of `ibgda_bench` run with DOORBELL_TRACE=DIR, built with
DOORBELL_TRACE_KERNELS=1 (docs/debugging.md). For each put_signal of the
round trips (one that rings a doorbell), the script matches the poster's
"doorbell", the engine's "NIC: woke" (it was idle), "NIC: doorbell seen",
the signal WQE's "NIC: WQE executed" (the second 8-byte WRITE after the
doorbell), the peer's "wait" end, the "NIC: CQE written" and the poster's
"completion", and prints the median and mean of each step in microseconds.
The trace's hooks cost time of their own: compare the round trip of the
same run without tracing.
"""
import json, sys, bisect, statistics as st
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {}
for e in ev:
    if e.get("ph") == "M" and e["name"] == "thread_name":
        names[(e["pid"], e["tid"])] = e["args"]["name"]
def series(pid, name, end=False, engine=None, bytes_=None):
    out = []
    for e in ev:
        if e.get("pid") != pid or e.get("name") != name:
            continue
        tr = names.get((pid, e.get("tid")), "")
        if engine is not None and (("NIC" in tr or "engine" in tr) != engine):
            continue
        if bytes_ is not None and e["args"].get("bytes") != bytes_:
            continue
        t = e["ts"] + (e.get("dur", 0) if end else 0)
        out.append(t)
    return sorted(out)
def after(xs, t):
    i = bisect.bisect_left(xs, t)
    return xs[i] if i < len(xs) else None
ranks = sorted({e["pid"] for e in ev if "pid" in e})
print("tracks:", sorted(set(names.values())))
S = {}
for r in ranks:
    S[r] = dict(
        ps=[(e["ts"], e["ts"] + e.get("dur", 0)) for e in ev if e.get("pid") == r and e.get("name") == "put_signal"],
        db=series(r, "doorbell"),
        ex=series(r, "NIC: WQE executed", engine=True, bytes_=8),
        cqe=series(r, "NIC: CQE written", engine=True),
        comp=series(r, "completion"),
        wend=series(r, "wait", end=True),
        seen=series(r, "NIC: doorbell seen", engine=True),
        wake=series(r, "NIC: woke", engine=True),
    )
    S[r]["ps"].sort()
    print(r, {k: len(v) for k, v in S[r].items()})
steps = {k: [] for k in ["post (call -> doorbell)", "doorbell -> idle engine wakes", "wake -> engine sees it", "doorbell -> engine sees it (no wake between: passes)", "doorbell -> engine sees it", "engine sees it -> signal executed", "doorbell -> signal executed", "signal executed -> peer's wait ends", "peer's wait end -> its put_signal", "signal executed -> CQE written", "CQE written -> completion seen", "put_signal call"]}
for r in ranks[:2]:
    o = 1 - r
    for (a, e) in S[r]["ps"]:
        b = after(S[r]["db"], a)
        if b is None or b > e + 0.5: continue
        x1 = after(S[r]["ex"], b)
        if x1 is None: continue
        i = bisect.bisect_left(S[r]["ex"], b)
        if i + 1 >= len(S[r]["ex"]): continue
        x2 = S[r]["ex"][i + 1]
        w = after(S[o]["wend"], x2 - 0.5)
        c = after(S[r]["cqe"], x2 - 0.5)
        m = after(S[r]["comp"], (c or x2) - 0.5)
        steps["post (call -> doorbell)"].append(b - a)
        steps["put_signal call"].append(e - a)
        steps["doorbell -> signal executed"].append(x2 - b)
        d = after(S[r]["seen"], b - 0.5)
        if d is not None and d <= x2 + 0.5:
            steps["doorbell -> engine sees it"].append(d - b)
            steps["engine sees it -> signal executed"].append(x2 - d)
            k = after(S[r]["wake"], b - 0.5)
            if k is not None and k <= d + 0.5:
                steps["doorbell -> idle engine wakes"].append(k - b)
                steps["wake -> engine sees it"].append(d - k)
            else:
                steps["doorbell -> engine sees it (no wake between: passes)"].append(d - b)
        if w is not None and w - x2 < 200:
            steps["signal executed -> peer's wait ends"].append(w - x2)
            nxt = [p for p in S[o]["ps"] if p[0] >= w - 0.5]
            if nxt and nxt[0][0] - w < 200:
                steps["peer's wait end -> its put_signal"].append(nxt[0][0] - w)
        if c is not None and c - x2 < 200:
            steps["signal executed -> CQE written"].append(c - x2)
            if m is not None and m - c < 200:
                steps["CQE written -> completion seen"].append(m - c)
for k, v in steps.items():
    if v:
        print(f"{k:40s} n={len(v):5d} median {st.median(v):7.2f} us  mean {st.mean(v):7.2f} us")

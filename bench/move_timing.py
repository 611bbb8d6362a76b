#!/usr/bin/env python3
"""How long a move between steps takes: issue 53's item 5.

usage: bench/move_timing.py DIR...   (a process test's cluster folder, e.g. after
`cargo test -p pipewise-cli --test straggler`: /tmp/pipewise-cluster-straggler-PID)

From DIR/coordinator.log and the workers' JSON logs DIR/w*.log, per move: the time from the
coordinator's decision (it asks the run's workers to stop) to (a) the next run's
assignment, (b) the last worker's hand-over from memory done, (c) the next run's first step
event. Not part of CI."""
import glob, json, re, sys
from datetime import datetime

def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

for d in sys.argv[1:]:
    coord = open(f"{d}/coordinator.log").read().splitlines()
    events = []
    for l in coord:
        t = l.split(" ", 1)[0]
        if "asked the run's workers to stop" in l:
            events.append(("stop", ts(t), l))
        elif "pipewise_coordinator::run: assigned" in l:
            events.append(("assigned", ts(t), l))
        elif re.search(r"step \d+ planned", l):
            events.append(("step", ts(t), l))
        elif "re-planned" in l or "going on after" in l or "resuming from" in l:
            events.append(("replan", ts(t), l))
    handed = []
    for f in glob.glob(f"{d}/w*.log"):
        for l in open(f):
            if "took the stages' state" in l:
                handed.append(ts(json.loads(l)["timestamp"]))
    handed.sort()
    for i, (kind, t0, line) in enumerate(events):
        if kind != "stop":
            continue
        after = events[i + 1:]
        assigned = next((t for k, t, _ in after if k == "assigned"), None)
        first = None
        if assigned is not None:
            first = next((t for k, t, _ in after if k == "step" and t > assigned), None)
        done = [h for h in handed if t0 < h and (first is None or h <= first)]
        why = next((l for k, _, l in after if k == "replan"), "")
        why = why.split("run: ", 1)[-1][:140]
        fmt = lambda t: f"{(t - t0) * 1e3:.0f} ms" if t is not None else "-"
        print(f"{d}: stop -> assigned {fmt(assigned)}, -> hand-over done {fmt(done[-1] if done else None)}, "
              f"-> first step of the new run done {fmt(first)}\n    {why}")

#!/usr/bin/env python3
"""Resident memory of a long emulated job: a `pipewise coordinator` and two `pipewise worker`
processes run one job of --steps steps (emulated compute, passes of --pass-ms), and the
resident set (VmRSS) of each process is printed at the steps in --at and after the last step.
The check: after the last step, every process within --tolerance of its figure after step
--base (5,000; exit status 1 otherwise). Linux only (reads /proc); not part of CI.

    cargo build -p pipewise-cli
    python3 bench/long_run.py --pipewise target/debug/pipewise            # 50,000 steps
    python3 bench/long_run.py --steps 6000 --at 1000,3000 --base 1000      # a shorter try
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

JOB = """[job]
name = "long-run"
description = "{steps} emulated steps on 2 workers, passes of {pass_ms} ms"

[model]
vocab = 256
hidden = 32
heads = 2
layers = 4
seq_len = 16
dtype = "f32"

[training]
global_batch_size = 4
steps = {steps}

[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "1f1b"
pipeline_parallel_microbatch_size = 1

[compute]
mode = "emulate"
f_ms = {pass_ms}
b_ms = {pass_ms}
w_ms = {pass_ms}
"""


def rss_kib(pid):
    """VmRSS of process `pid` in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def start(cmd, log):
    """Starts `cmd` and returns it with the first line it prints (its address line)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    line = p.stdout.readline()
    if not line:
        sys.exit(f"{cmd[1]} did not start; see {log}")
    return p, line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipewise", default="target/debug/pipewise")
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--at", default="5000,10000,20000,30000,40000",
                    help="steps at which to sample before the last (comma-separated)")
    ap.add_argument("--base", type=int, default=5000,
                    help="the step whose figures the last step's are compared with")
    ap.add_argument("--pass-ms", type=float, default=0.1)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--keep", action="store_true", help="keep the data directory and logs")
    args = ap.parse_args()
    at = sorted({int(s) for s in args.at.split(",") if s} | {args.base})
    at = [s for s in at if s < args.steps] + [args.steps]

    tmp = tempfile.mkdtemp(prefix="pipewise-long-run-")
    data = os.path.join(tmp, "data")
    procs = []
    try:
        coord, line = start([args.pipewise, "coordinator", "--listen", "127.0.0.1:0",
                             "--data-dir", data], os.path.join(tmp, "coordinator.log"))
        procs.append(("coordinator", coord))
        url = "http://" + line.split()[3]
        for w in range(2):
            p, _ = start([args.pipewise, "worker", "--coordinator", url, "--id", f"w{w}",
                          "--data-dir", data], os.path.join(tmp, f"w{w}.log"))
            procs.append((f"worker w{w}", p))
        job = os.path.join(tmp, "job.toml")
        with open(job, "w") as f:
            f.write(JOB.format(steps=args.steps, pass_ms=args.pass_ms))
        submit = subprocess.Popen([args.pipewise, "submit", job, "--coordinator", url, "--wait"],
                                  stdout=subprocess.PIPE, text=True)
        rows = []
        started = time.monotonic()
        for line in submit.stdout:
            parts = line.split()
            if len(parts) < 2 or parts[0] != "step":
                continue
            step = int(parts[1])
            if at and step >= at[0]:
                rows.append((step, time.monotonic() - started,
                             [rss_kib(p.pid) for _, p in procs]))
                at = [s for s in at if s > step]
        if submit.wait() != 0:
            sys.exit(f"submit failed; logs in {tmp}")
    finally:
        for _, p in procs:
            p.kill()
            p.wait()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    names = [n for n, _ in procs]
    print(f"resident memory (VmRSS, MB), {args.steps} steps, passes of {args.pass_ms} ms, "
          f"2 workers")
    print(f"{'step':>7} {'s':>7} " + " ".join(f"{n:>12}" for n in names))
    for step, secs, kib in rows:
        print(f"{step:>7} {secs:>7.1f} " + " ".join(f"{k / 1024:>12.1f}" for k in kib))
    base = next(r for r in rows if r[0] >= args.base)
    first, last = base[2], rows[-1][2]
    ok = True
    for name, a, b in zip(names, first, last):
        change = b / a - 1
        within = abs(change) <= args.tolerance
        ok &= within
        print(f"{name}: step {base[0]} {a / 1024:.1f} MB → step {rows[-1][0]} "
              f"{b / 1024:.1f} MB ({change:+.1%}, {'within' if within else 'over'} "
              f"{args.tolerance:.0%})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Many workers: a coordinator and `--workers` emulated `pipewise worker` processes, one job
of R replicas of a d-worker pipeline, planned against measured bubble, the coordinator's
own CPU time and every worker's.

    python3 bench/scale.py --pipewise target/release/pipewise [--replicas 8 --degree 8]

The job: emulated compute (`[compute] mode = "emulate"`, F, B, W of 20 ms each for a stage
holding 1/d of the model), V-Half, R replicas of d workers (R × d worker processes), 16
microbatches per replica, `--steps` steps. After `--warmup` steps it samples the
utime + stime (/proc/PID/stat) of the coordinator and of every worker process over the next
`--window` seconds and prints the coordinator's as a share of the wall time, the workers'
busiest, median and least (the busiest over the median: an emulated pass sleeps, so a
worker's CPU is its frames and collectives, the replicas' gradient sums the largest part),
with the median planned and measured bubble of the steps in that window. Linux only; standard library only (it reuses compare.py's process
handling); not part of CI.
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import compare

LINE = re.compile(
    r"^step\s+(?P<step>\d+)\s+loss\s+\S+\s+(?P<ms>[\d.]+) ms\s+bubble planned\s+(?P<planned>[-\d.]+)%"
    r" measured\s+(?P<measured>[-\d.]+)%", re.M)

JOB = """[job]
name = "scale-r{r}-d{d}"

[model]
vocab = 256
hidden = 64
heads = 4
layers = {layers}
seq_len = 32
dtype = "f32"

[training]
global_batch_size = {batch}
steps = {steps}
seed = 42

[parallelism]
pipeline_parallel_degree = {d}
pipeline_parallel_schedule = "v-half"
pipeline_parallel_microbatch_size = 1
data_parallel_replicate_degree = {r}

[compute]
mode = "emulate"
f_ms = 20.0
b_ms = 20.0
w_ms = 20.0
"""


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """utime + stime of process `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="steps of the job")
    ap.add_argument("--warmup", type=int, default=5, help="steps before the window opens")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of steady state sampled")
    args = ap.parse_args()
    binary = str(Path(args.pipewise).resolve())
    r, d = args.replicas, args.degree
    url_port = port()
    url = f"http://127.0.0.1:{url_port}"
    procs, logs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        job = tmp / "job.toml"
        job.write_text(JOB.format(r=r, d=d, layers=4 * d, batch=16 * r, steps=args.steps))
        try:
            log = open(tmp / "coordinator.log", "w")
            logs.append(log)
            coordinator = subprocess.Popen(
                [binary, "coordinator", "--listen", f"127.0.0.1:{url_port}", "--data-dir",
                 str(tmp / "data")], stdout=log, stderr=subprocess.STDOUT)
            procs.append(coordinator)
            env = dict(os.environ, RAYON_NUM_THREADS="1")
            workers = []
            for w in range(r * d):
                log = open(tmp / f"w{w}.log", "w")
                logs.append(log)
                workers.append(subprocess.Popen(
                    [binary, "worker", "--coordinator", url, "--id", f"w{w:03}",
                     "--timeout", "120"], stdout=log, stderr=subprocess.STDOUT, env=env))
            procs.extend(workers)
            out = tmp / "submit.out"
            with open(out, "w") as f:
                submit = subprocess.Popen(
                    [binary, "submit", str(job), "--coordinator", url, "--wait",
                     "--wait-for-coordinator", "60"], stdout=f, stderr=subprocess.STDOUT)
                window = None
                while submit.poll() is None:
                    steps = LINE.findall(out.read_text())
                    if window is None and len(steps) >= args.warmup:
                        window = (time.monotonic(), cpu_seconds(coordinator.pid), len(steps),
                                  [cpu_seconds(p.pid) for p in workers])
                    if window and time.monotonic() - window[0] >= args.window:
                        break
                    time.sleep(0.2)
                if window is None:
                    raise SystemExit(f"the job ended before {args.warmup} steps:\n{out.read_text()}")
                wall = time.monotonic() - window[0]
                cpu = cpu_seconds(coordinator.pid) - window[1]
                worker_cpu = [cpu_seconds(p.pid) - before for p, before in zip(workers, window[3])]
                text = out.read_text()
                steps = LINE.findall(text)[window[2]:]
                submit.terminate()
            if not steps:
                raise SystemExit(f"no step in the window:\n{text}")
            planned = statistics.median(float(s[2]) for s in steps)
            measured = statistics.median(float(s[3]) for s in steps)
            step_ms = statistics.median(float(s[1]) for s in steps)
            print(f"{r} replicas x {d} workers ({r * d} worker processes), V-Half, emulated 20/20/20 ms")
            print(f"window: {wall:.1f} s, {len(steps)} steps (median {step_ms:.0f} ms a step)")
            print(f"bubble: planned {planned:.1f} %, measured {measured:.1f} % (medians; "
                  f"|difference| {abs(measured - planned):.1f} points)")
            print(f"coordinator CPU: {cpu:.2f} s of {wall:.1f} s wall = {100 * cpu / wall:.1f} %")
            busiest = max(range(len(worker_cpu)), key=worker_cpu.__getitem__)
            median = statistics.median(worker_cpu)
            print(f"worker CPU over the window: busiest w{busiest:03} {worker_cpu[busiest]:.2f} s, "
                  f"median {median:.2f} s, least {min(worker_cpu):.2f} s; busiest / median = "
                  f"{worker_cpu[busiest] / median:.2f}" if median > 0 else
                  f"worker CPU over the window: none measured ({worker_cpu})")
            top = sorted(range(len(worker_cpu)), key=worker_cpu.__getitem__, reverse=True)[:4]
            print("busiest workers: " + ", ".join(f"w{w:03} {worker_cpu[w]:.2f} s" for w in top))
            print(f"load average: {os.getloadavg()}")
        finally:
            compare.stop_all(procs, logs)


if __name__ == "__main__":
    main()

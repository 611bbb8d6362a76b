#!/usr/bin/env python3
"""Activation memory with recomputation: issue 56's item-3 table.

Trains the benches' model (bench/job.toml: GPT, hidden 256, 4 heads, 4 blocks, sequences of
128, microbatches of 4) under 1F1B on 4 workers for a few steps, once per
`[activation_checkpoint] mode` (none, selective, full), and prints every worker's measured
peak activation (bytes from summary.json; the stash is deterministic, so the figure does not
move with the machine's load) beside the planner's predicted peak, scraped from the run's
metrics (`pipewise_activation_memory_bytes{kind="predicted_peak"}`); then the fullest
worker's peak against none's with the acceptance bounds (full ≤ 0.30, selective ≤ 0.70) and
whether planned = measured within 5 % on every worker. With `--processes` the run is a
`pipewise coordinator`, one `pipewise worker` process per worker and `pipewise submit --wait`
(the measured peaks read from its step lines, whole KiB), instead of `pipewise local`.
Linux or macOS; not part of CI.

    cargo build --release -p pipewise-cli
    python3 bench/recompute_memory.py --pipewise target/release/pipewise
    python3 bench/recompute_memory.py --pipewise target/release/pipewise --processes
"""

import argparse
import json
import shutil
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The same scrape of the predicted peaks as the V schedules' memory bench.
from memory import loopback_port, scrape

BOUNDS = {"selective": 0.70, "full": 0.30}


def job_file(base, mode, workers, steps, folder):
    """bench/job.toml on `workers` workers under 1F1B, recomputing as `mode` says."""
    text = base.read_text()
    text = re.sub(r"(?m)^pipeline_parallel_degree = \d+", f"pipeline_parallel_degree = {workers}",
                  text)
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text)
    text += f'\n[activation_checkpoint]\nmode = "{mode}"\n'
    path = folder / f"job-{mode}.toml"
    path.write_text(text)
    return path


def run(binary, job, workers, out, timeout):
    """The measured peak of every worker (largest over the steps) and the predicted ones."""
    port = loopback_port()
    cmd = [binary, "local", str(job), "--quiet", "--output-dir", str(out),
           "--metrics-listen", f"127.0.0.1:{port}", "--metrics-linger", "1"]
    predicted, done = {}, threading.Event()
    poller = threading.Thread(target=scrape,
                              args=(f"http://127.0.0.1:{port}/metrics", predicted, done))
    poller.start()
    try:
        ran = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        done.set()
        poller.join()
    if ran.returncode != 0:
        raise RuntimeError(f"{job.name}: pipewise local failed:\n{(ran.stdout + ran.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    measured = [0] * workers
    for step in summary["steps"]:
        for w, p in enumerate(step.get("peak_activation_bytes", [])):
            measured[w] = max(measured[w], p)
    return measured, [predicted.get(w) for w in range(workers)]


STEP_PEAKS = re.compile(r"peak KiB \[([0-9 ]+)\]")


def start(cmd, log):
    """Starts `cmd` and returns it with the first line it prints (its address line)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"{cmd[1]} did not start; see {log}")
    return p, line


def run_processes(binary, job, workers, out, timeout):
    """`run` on a coordinator, `workers` worker processes and `submit --wait`."""
    out.mkdir(parents=True)
    port = loopback_port()
    procs = []
    predicted, done = {}, threading.Event()
    poller = threading.Thread(target=scrape,
                              args=(f"http://127.0.0.1:{port}/metrics", predicted, done))
    try:
        coord, line = start([binary, "coordinator", "--listen", "127.0.0.1:0", "--data-dir",
                             str(out / "coordinator"), "--metrics-listen", f"127.0.0.1:{port}"],
                            out / "coordinator.log")
        procs.append(coord)
        url = "http://" + line.split()[3]
        for w in range(workers):
            p, _ = start([binary, "worker", "--coordinator", url, "--id", f"w{w}",
                          "--data-dir", str(out / f"w{w}")], out / f"w{w}.log")
            procs.append(p)
        poller.start()
        ran = subprocess.run([binary, "submit", str(job), "--coordinator", url, "--wait"],
                             capture_output=True, text=True, timeout=timeout)
    finally:
        done.set()
        if poller.is_alive():
            poller.join()
        for p in procs:
            p.kill()
            p.wait()
    if ran.returncode != 0:
        raise RuntimeError(f"{job.name}: submit failed:\n{(ran.stdout + ran.stderr)[-3000:]}")
    measured = [0] * workers
    for peaks in STEP_PEAKS.findall(ran.stdout):
        for w, kib in enumerate(peaks.split()):
            measured[w] = max(measured[w], int(kib) * 1024)
    shutil.rmtree(out, ignore_errors=True)
    return measured, [predicted.get(w) for w in range(workers)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--job", default=str(Path(__file__).with_name("job.toml")), help="the job file")
    ap.add_argument("--workers", type=int, default=4, help="pipeline workers")
    ap.add_argument("--modes", default="none,selective,full", help="modes, comma-separated")
    ap.add_argument("--steps", type=int, default=2, help="steps per run")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    ap.add_argument("--processes", action="store_true",
                    help="a coordinator and a process per worker instead of pipewise local")
    args = ap.parse_args()
    binary = str(Path(args.pipewise).resolve())
    if not Path(binary).exists():
        ap.error(f"--pipewise {binary}: no such file (cargo build --release -p pipewise-cli)")
    folder = Path(tempfile.mkdtemp(prefix="pipewise-recompute-"))
    rows, failed = {}, False
    for mode in args.modes.split(","):
        job = job_file(Path(args.job), mode, args.workers, args.steps, folder)
        try:
            runner = run_processes if args.processes else run
            rows[mode] = runner(binary, job, args.workers, folder / mode, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{mode}: {e}", file=sys.stderr)
            failed = True
    how = "worker processes" if args.processes else "workers in one process"
    print(f"1F1B, {args.workers} {how}: peak activation KiB per worker, measured / planned")
    base = max(rows["none"][0]) if "none" in rows else None
    for mode, (measured, predicted) in rows.items():
        cells, close = [], True
        for m, p in zip(measured, predicted):
            cells.append(f"{m / 1024:,.1f}/{'?' if p is None else f'{p / 1024:,.1f}'}")
            close &= p is not None and abs(p - m) <= 0.05 * m
        line = f"{mode:>9}: " + "  ".join(cells)
        if base:
            ratio = max(measured) / base
            bound = BOUNDS.get(mode)
            mark = "" if bound is None else (f" ≤ {bound:.2f} ✓" if ratio <= bound else f" > {bound:.2f} ✗")
            failed |= bound is not None and ratio > bound
            line += f"  | fullest {ratio:.3f} of none's{mark}"
        line += "  | planned = measured ±5 %" if close else "  | planned ≠ measured ✗"
        failed |= not close
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

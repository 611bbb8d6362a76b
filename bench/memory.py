#!/usr/bin/env python3
"""Activation memory of the V schedules against 1F1B: issue 30's item-2 table.

Runs `pipewise local --model small --global-batch 64 --steps 3` for 1f1b, v-half, v-min and
v-zb on each worker count (default 8 and 4) and prints, per worker count, the fullest
worker's measured peak activation (bytes from summary.json; the stash is deterministic, so
every step and every run gives the same figure whatever the load) of 1F1B and of each V
schedule, its ratio to 1F1B's, the acceptance bound and the class's memory fraction, with
✓ or ✗. It also scrapes the run's metrics for the planner's predicted peak of every worker
(`pipewise_activation_memory_bytes{kind="predicted_peak"}`) and says whether each equals
the measured one byte for byte. Linux or macOS; not part of CI.

    cargo build --release -p pipewise-cli
    python3 bench/memory.py --pipewise target/release/pipewise
    python3 bench/memory.py --workers 8 --schedules v-zb
"""

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

SCHEDULES = ["v-half", "v-min", "v-zb"]
# Acceptance bound on the fullest worker's peak over 1F1B's, and the class's fraction of
# 1F1B's memory (the bound adds the embedding's and the head's share), per worker count.
BOUNDS = {
    8: {"v-half": (0.70, "5/8"), "v-min": (0.60, "4/8"), "v-zb": (1.05, "1")},
    4: {"v-half": (0.80, "3/4"), "v-min": (0.60, "2/4"), "v-zb": (1.05, "1")},
}
PREDICTED = re.compile(
    r'^pipewise_activation_memory_bytes\{(?=[^}]*kind="predicted_peak")[^}]*worker="(\d+)"[^}]*\}'
    r"\s+(\S+)", re.M)


def loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url, seen, done):
    """Keeps the predicted peaks of the latest scrape of `url` in `seen` until `done`."""
    while not done.is_set():
        try:
            text = urllib.request.urlopen(url, timeout=1).read().decode()
            found = {int(w): int(float(v)) for w, v in PREDICTED.findall(text)}
            if found:
                seen.update(found)
        except OSError:
            pass
        time.sleep(0.2)


def run(binary, workers, schedule, steps, folder, timeout):
    """The measured peak of every worker (largest over the steps) and the predicted ones."""
    out = folder / f"{schedule}-{workers}"
    port = loopback_port()
    cmd = [binary, "local", "--workers", str(workers), "--model", "small", "--global-batch",
           "64", "--schedule", schedule, "--steps", str(steps), "--quiet", "--output-dir",
           str(out), "--metrics-listen", f"127.0.0.1:{port}", "--metrics-linger", "1"]
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
        raise RuntimeError(f"{schedule} d={workers}: pipewise local failed:\n"
                           f"{(ran.stdout + ran.stderr)[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    measured = [0] * workers
    for step in summary["steps"]:
        # Step 0 of a job with [validation] holds its validation loss alone.
        for w, p in enumerate(step.get("peak_activation_bytes", [])):
            measured[w] = max(measured[w], p)
    return measured, [predicted.get(w) for w in range(workers)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--workers", default="8,4", help="comma-separated worker counts")
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help="V schedules, comma-separated")
    ap.add_argument("--steps", type=int, default=3, help="steps per run")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    args = ap.parse_args()
    binary = str(Path(args.pipewise).resolve())
    if not Path(binary).exists():
        ap.error(f"--pipewise {binary}: no such file (cargo build --release -p pipewise-cli)")
    folder = Path(tempfile.mkdtemp(prefix="pipewise-memory-"))
    print("fullest worker's peak activation (KiB), ratio to 1F1B's, bound (class fraction); "
          "planned = measured on every worker")
    failed = False
    for d in (int(w) for w in args.workers.split(",")):
        cells, planned_ok = [], True
        try:
            base, base_pred = run(binary, d, "1f1b", args.steps, folder, args.timeout)
            planned_ok &= base == base_pred
            for s in args.schedules.split(","):
                measured, predicted = run(binary, d, s, args.steps, folder, args.timeout)
                planned_ok &= measured == predicted
                cells.append((s, max(measured), max(measured) / max(base)))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"d = {d}: {e}", file=sys.stderr)
            failed = True
            continue
        row = [f"d = {d}", f"1f1b {max(base) / 1024:,.1f}"]
        for s, peak, ratio in cells:
            bound, fraction = BOUNDS.get(d, {}).get(s, (None, "?"))
            mark = "" if bound is None else (" ✓" if ratio <= bound else " ✗")
            failed |= bound is not None and ratio > bound
            shown = "" if bound is None else f" ≤ {bound:.2f}"
            row.append(f"{s} {peak / 1024:,.1f} = {ratio:.3f}{shown} ({fraction}){mark}")
        row.append("planned = measured" if planned_ok else "planned ≠ measured ✗")
        failed |= not planned_ok
        print("  |  ".join(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

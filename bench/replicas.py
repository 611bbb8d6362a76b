#!/usr/bin/env python3
"""Data parallel against pipeline parallel on two worker processes, in one run.

    python3 bench/replicas.py --pipewise target/release/pipewise [--rounds 2] [--steps 7]

The model of bench/job.toml (compare.py's: GPT, hidden 256, 4 blocks, seq 128, 8
microbatches of 4 a step) on a coordinator and two `pipewise worker` processes of 1 thread,
pinned to cores 0 and 1, in alternating rounds:

  R=1 d=2: one 1F1B pipeline of two stages (8 microbatches);
  R=2 d=1: two data-parallel replicas of the whole model (4 microbatches each), their
           gradients summed at replica 0's worker over gRPC every step.

Prints tokens/s of the median timed step of each run, and their ratio. Standard library
only (it reuses compare.py's process handling); not part of CI.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import compare

HERE = Path(__file__).resolve().parent


def job_with(replicas, degree, tmp):
    """bench/job.toml with `replicas` replicas of `degree` workers."""
    text = (HERE / "job.toml").read_text()
    text = text.replace("pipeline_parallel_degree = 1",
                        f"pipeline_parallel_degree = {degree}\n"
                        f"data_parallel_replicate_degree = {replicas}")
    path = Path(tmp) / f"job-r{replicas}-d{degree}.toml"
    path.write_text(text)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of both runs")
    ap.add_argument("--steps", type=int, default=7, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    args = ap.parse_args()
    shapes = [("R=1 d=2 (1F1B pipeline)", 1, 2, ["--schedule", "1f1b"]),
              ("R=2 d=1 (data parallel)", 2, 1, [])]
    rates = {name: [] for name, *_ in shapes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, replicas, degree, overrides in shapes:
                job = job_with(replicas, degree, tmp)
                res = compare.pipewise(args, 2, 1, [0, 1], "cpu", Path(tmp), job, overrides)
                rate, _ = compare.tokens_per_s(res, args.warmup)
                rates[name].append(rate)
                print(f"round {r + 1}: {name}: {rate:.0f} tokens/s, loss "
                      f"{res['loss'][0]:.4f} -> {res['loss'][-1]:.4f}", flush=True)
    print()
    for name, rs in rates.items():
        print(f"{name:<28} {statistics.median(rs):>8.0f} tokens/s (median of {len(rs)} runs)")
    (a, b) = (statistics.median(rates[n]) for n, *_ in shapes)
    print(f"data parallel / pipeline: {b / a:.2f}")


if __name__ == "__main__":
    main()

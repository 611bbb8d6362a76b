#!/usr/bin/env python3
"""The planner's recomputation pays: issue 56's item-4 figures.

Under a memory budget below what 1F1B without recomputation needs, the benches' model
(bench/job.toml: GPT, hidden 256, 4 heads, 4 blocks, sequences of 128, microbatches of 4,
8 a step) trains on a `pipewise coordinator` and 4 `pipewise worker` processes, each started
with `--memory-bytes BUDGET`, twice per round, in alternating order:

- **auto**: `pipeline_parallel_schedule = "auto"` with `[activation_checkpoint] mode = "auto"`
  (the planner recomputes only the stages of workers that would overflow);
- **full**: 1F1B with `mode = "full"` on every stage;
- **stage**: 1F1B with `per_stage` as `--per-stage` says (by default what the auto-planner
  gives 1F1B under this budget: `selective` on the first stage only), so a run recomputing
  only where needed is measured even when auto's choice needs no recomputation at all.

The budget is the auto-planner's own figure for 1F1B at this microbatch size, less a quarter
of the fullest worker's activations (`pipewise plan --auto … --format json`), unless
`--memory-bytes` gives one. Per run it prints the plan auto chose (its line), whether any
re-plan was for memory, the median step time of the last `--tail` steps and its tokens/s, and
auto's median predicted step time against its measured one; then auto's tokens/s against
full's per round (the ratio, ≥ 1.10 wanted) with the spread over rounds, and the same for
**stage**. Linux; not part of CI.

    cargo build --release -p pipewise-cli
    python3 bench/recompute_auto.py --pipewise target/release/pipewise --rounds 3
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from recompute_memory import start

STEP = re.compile(r"^step +(\d+)  loss \S+ +([0-9.]+) ms .* predicted ([0-9.]+) ms", re.M)
TOKENS_PER_STEP = 32 * 128


def budget_from_planner(binary, workers):
    """1F1B's fullest worker at microbatch size 4 under the auto-planner's memory model,
    less a quarter of its activations."""
    out = subprocess.run(
        [binary, "plan", "--auto", "--workers", str(workers), "--layers", "4", "--hidden", "256",
         "--heads", "4", "--seq-len", "128", "--vocab", "256", "--dtype", "f32",
         "--global-batch", "32", "--memory-per-worker", "1TiB", "--top", "1000",
         "--format", "json"],
        capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)["plan"]
    for c in plan["ranked"]:
        if c["kind"] == "1f1b" and c["microbatch_size"] == 4:
            w = max(range(workers), key=lambda i: c["worker_bytes"][i])
            return c["worker_bytes"][w] - c["activation_bytes"][w] // 4, c["worker_bytes"]
    raise RuntimeError("the planner gave no 1F1B plan at microbatch size 4")


def job_file(base, name, schedule, mode, workers, steps, folder, per_stage=None):
    text = base.read_text()
    text = re.sub(r"(?m)^pipeline_parallel_degree = \d+", f"pipeline_parallel_degree = {workers}",
                  text)
    text = re.sub(r'(?m)^pipeline_parallel_schedule = "[^"]*"',
                  f'pipeline_parallel_schedule = "{schedule}"', text)
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text)
    text = re.sub(r'(?m)^name = "[^"]*"', f'name = "{name}"', text, count=1)
    if per_stage:
        modes = ", ".join(f'"{m}"' for m in per_stage)
        text += f"\n[activation_checkpoint]\nper_stage = [{modes}]\n"
    else:
        text += f'\n[activation_checkpoint]\nmode = "{mode}"\n'
    path = folder / f"job-{name}.toml"
    path.write_text(text)
    return path


def run(binary, job, workers, budget, out, timeout):
    """Submits `job` to a fresh coordinator and `workers` worker processes of `budget`
    bytes each; its stdout."""
    out.mkdir(parents=True)
    procs = []
    try:
        coord, line = start([binary, "coordinator", "--listen", "127.0.0.1:0", "--data-dir",
                             str(out / "coordinator")], out / "coordinator.log")
        procs.append(coord)
        url = "http://" + line.split()[3]
        for w in range(workers):
            p, _ = start([binary, "worker", "--coordinator", url, "--id", f"w{w}",
                          "--data-dir", str(out / f"w{w}"), "--memory-bytes", str(budget)],
                         out / f"w{w}.log")
            procs.append(p)
        ran = subprocess.run([binary, "submit", str(job), "--coordinator", url, "--wait"],
                             capture_output=True, text=True, timeout=timeout)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    if ran.returncode != 0:
        raise RuntimeError(f"{job.name}: submit failed:\n{(ran.stdout + ran.stderr)[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return ran.stdout


def summarize(stdout, tail):
    steps = [(int(s), float(ms), float(p)) for s, ms, p in STEP.findall(stdout)]
    last = steps[-tail:]
    measured = statistics.median(ms for _, ms, _ in last)
    predicted = statistics.median(p for _, _, p in last)
    choice = [l for l in stdout.splitlines() if l.startswith("auto chose")]
    replans = [l for l in stdout.splitlines() if l.startswith("re-planned")]
    return {
        "steps": len(steps),
        "ms": measured,
        "tokens_per_s": TOKENS_PER_STEP / (measured / 1e3),
        "predicted_ms": predicted,
        "choice": choice[-1] if choice else "",
        "memory_replans": [r for r in replans if "memory" in r],
        "replans": replans,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--job", default=str(Path(__file__).with_name("job.toml")), help="the job file")
    ap.add_argument("--workers", type=int, default=4, help="pipeline workers")
    ap.add_argument("--memory-bytes", type=int, help="each worker's budget (default: see above)")
    ap.add_argument("--steps", type=int, default=24, help="steps per run")
    ap.add_argument("--tail", type=int, default=8, help="last steps the medians are taken over")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (auto, full), alternated")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    ap.add_argument("--per-stage", default="selective,none,none,none",
                    help="the stage side's modes, one per stage")
    args = ap.parse_args()
    binary = str(Path(args.pipewise).resolve())
    if not Path(binary).exists():
        ap.error(f"--pipewise {binary}: no such file (cargo build --release -p pipewise-cli)")
    if args.memory_bytes:
        budget = args.memory_bytes
    else:
        budget, none_bytes = budget_from_planner(binary, args.workers)
        print(f"1F1B without recomputation is planned at {none_bytes} bytes per worker; "
              f"budget {budget} bytes per worker")
    folder = Path(tempfile.mkdtemp(prefix="pipewise-recompute-auto-"))
    sides = {
        "auto": job_file(Path(args.job), "auto", "auto", "auto", args.workers, args.steps, folder),
        "full": job_file(Path(args.job), "full", "1f1b", "full", args.workers, args.steps, folder),
        "stage": job_file(Path(args.job), "stage", "1f1b", None, args.workers, args.steps, folder,
                          per_stage=args.per_stage.split(",")),
    }
    ratios, stage_ratios, failed = [], [], False
    for r in range(args.rounds):
        order = ["auto", "stage", "full"] if r % 2 == 0 else ["full", "stage", "auto"]
        got = {}
        for side in order:
            try:
                got[side] = summarize(run(binary, sides[side], args.workers, budget,
                                          folder / f"{side}-{r}", args.timeout), args.tail)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"round {r + 1} {side}: {e}", file=sys.stderr)
                failed = True
                continue
            g = got[side]
            off = g["ms"] / g["predicted_ms"] - 1 if g["predicted_ms"] else float("nan")
            print(f"round {r + 1} {side:>4}: {g['steps']} steps, median of the last {args.tail} "
                  f"{g['ms']:.1f} ms ({g['tokens_per_s']:,.0f} tokens/s), predicted "
                  f"{g['predicted_ms']:.1f} ms (measured {off:+.1%}); re-plans for memory: "
                  f"{len(g['memory_replans'])}, others: {len(g['replans']) - len(g['memory_replans'])}",
                  flush=True)
            if g["choice"]:
                print(f"    {g['choice']}")
            failed |= bool(g["memory_replans"])
        if "auto" in got and "full" in got:
            ratio = got["auto"]["tokens_per_s"] / got["full"]["tokens_per_s"]
            ratios.append(ratio)
            print(f"round {r + 1}: auto / full tokens/s {ratio:.3f}", flush=True)
        if "stage" in got and "full" in got:
            ratio = got["stage"]["tokens_per_s"] / got["full"]["tokens_per_s"]
            stage_ratios.append(ratio)
            print(f"round {r + 1}: stage / full tokens/s {ratio:.3f}", flush=True)
    if ratios:
        print(f"auto / full tokens/s: median {statistics.median(ratios):.3f} "
              f"(spread {min(ratios):.3f}–{max(ratios):.3f}) over {len(ratios)} rounds")
        failed |= statistics.median(ratios) < 1.10
    if stage_ratios:
        print(f"stage / full tokens/s: median {statistics.median(stage_ratios):.3f} "
              f"(spread {min(stage_ratios):.3f}–{max(stage_ratios):.3f}) over "
              f"{len(stage_ratios)} rounds")
    shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""pipewise's Llama training step against transformers' LlamaForCausalLM (PyTorch eager,
sdpa attention) in one run, the sides alternated round by round (issue 54, item 5).

The same model and step on both sides: hidden 256, 4 layers, 8 heads sharing 2 key/value
heads, SwiGLU 688, vocab 4096, f32, 8 microbatches of 4 sequences of 128 tokens, then AdamW.
pipewise's side is the step bench's `llama` child (`worker/benches/step.rs`, the
single-device Trainer, one process per measurement); PyTorch's is `speed.py`. Each round
runs, for each thread count, both sides one after the other (which goes first alternates),
and prints their tokens/s and ratio; the end prints each thread count's median ratio and
its spread, and the load average before and after (this machine is shared: ratios taken
minutes apart would mostly measure its load).

    cargo bench -p pipewise-worker --bench step --no-run     # builds the bench binary
    python bench/hf/speed_compare.py --rounds 3 --threads 1,2

`--bench-bin` names the bench binary (default: the newest `step-*` under the target
directory, `$CARGO_TARGET_DIR` or `target/`); `--baseline-bin` another build of it (an
earlier commit's), run in the same rounds, its tokens/s and ratio printed beside. Needs
`pip install torch transformers`.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys

TOKENS = 8 * 4 * 128
HERE = os.path.dirname(os.path.abspath(__file__))


def find_bench() -> str:
    root = os.environ.get("CARGO_TARGET_DIR", os.path.join(HERE, "..", "..", "target"))
    found = [
        p
        for p in glob.glob(os.path.join(root, "release", "deps", "step-*"))
        if os.access(p, os.X_OK) and not p.endswith(".d")
    ]
    if not found:
        sys.exit(f"no step bench binary under {root}: build it with cargo bench --no-run")
    return max(found, key=os.path.getmtime)


def pipewise(bench: str, threads: int, mode: str) -> float:
    """Tokens/s of the step bench's Llama child (median step of its timed steps)."""
    env = dict(os.environ)
    env.update(
        PIPEWISE_BENCH_CHILD="llama",
        PIPEWISE_BENCH_MODELS="llama",
        RAYON_NUM_THREADS=str(threads),
        PIPEWISE_SIDE_BY_SIDE="0" if mode == "split" else "1",
    )
    out = subprocess.run(
        [bench], env=env, capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return TOKENS / float(line.split()[1])
    sys.exit(f"the bench child printed no RESULT line:\n{out}")


def torch_side(threads: int, steps: int) -> float:
    """Tokens/s of speed.py at `threads` (median of its timed steps)."""
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "speed.py"), "--threads", str(threads),
         "--steps", str(steps)],
        capture_output=True, text=True, check=True,
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ["threads"] and parts[2] == "tokens/s":
            return float(parts[3])
    sys.exit(f"speed.py printed no tokens/s line:\n{out}")


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5, help="speed.py's timed steps")
    ap.add_argument("--mode", choices=["side", "split"], default="side",
                    help="pipewise's use of several threads (the step bench's modes)")
    ap.add_argument("--bench-bin", default=None)
    ap.add_argument("--baseline-bin", default=None)
    args = ap.parse_args()
    bench = args.bench_bin or find_bench()
    base = args.baseline_bin
    counts = [int(t) for t in args.threads.split(",")]
    print(f"bench {bench}; baseline {base}; load average before: {load()}")
    print("round threads  first     pipewise tok/s   PyTorch tok/s   ratio"
          + ("   baseline tok/s   ratio" if base else ""))
    ratios = {t: [] for t in counts}
    base_ratios = {t: [] for t in counts}
    for r in range(args.rounds):
        for t in counts:
            sides = [lambda: pipewise(bench, t, args.mode), lambda: torch_side(t, args.steps)]
            if base:
                sides.append(lambda: pipewise(base, t, args.mode))
            # Each round starts from another side.
            shift = r % len(sides)
            order = list(range(len(sides)))[shift:] + list(range(len(sides)))[:shift]
            got = [0.0] * len(sides)
            for i in order:
                got[i] = sides[i]()
            ours, theirs = got[0], got[1]
            ratios[t].append(ours / theirs)
            first = ["pipewise", "PyTorch", "baseline"][order[0]]
            line = (f"{r + 1:>5} {t:>7}  {first:<8} {ours:>15.0f} {theirs:>15.0f}   "
                    f"{ours / theirs:.3f}")
            if base:
                base_ratios[t].append(got[2] / theirs)
                line += f"   {got[2]:>14.0f}   {got[2] / theirs:.3f}"
            print(line, flush=True)
    print(f"load average after: {load()}")
    for t in counts:
        for name, rs in [("pipewise", ratios[t]), ("baseline", base_ratios[t])]:
            if rs:
                print(f"threads {t}: {name} / PyTorch median {statistics.median(rs):.3f} "
                      f"(min {min(rs):.3f}, max {max(rs):.3f}, {len(rs)} rounds)")


if __name__ == "__main__":
    main()

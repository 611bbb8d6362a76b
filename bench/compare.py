#!/usr/bin/env python3
"""Training throughput, pipewise against PyTorch, on the same model, in one run.

Needs PyTorch (and numpy, which torch imports): `pip install torch numpy`. Standard library
otherwise. Not part of CI. Linux only (cores are pinned with os.sched_setaffinity, which is
what `taskset -c N` does).

    python3 bench/compare.py --pipewise target/release/pipewise

Three rows, tokens/s of the median timed step (4096 tokens a step), and pipewise/PyTorch:

  (a) one process, 1 thread, pinned to core 0: PyTorch eager (torch.set_num_threads(1))
      against a coordinator and one `pipewise worker` (RAYON_NUM_THREADS=1);
  (b) a 2-stage 1F1B pipeline, two processes of 1 thread pinned to cores 0 and 1: PyTorch
      torch.distributed.pipelining.Schedule1F1B over gloo against a coordinator and two
      `pipewise worker`s, the job submitted with `pipewise submit --wait`, schedule 1f1b;
  (c) one process, every core: PyTorch eager with torch.set_num_threads(os.cpu_count())
      against one `pipewise worker` with RAYON_NUM_THREADS = os.cpu_count() (which runs
      its microbatches side by side, one per thread; PIPEWISE_SIDE_BY_SIDE=0 in this
      script's environment makes it cut every pass over the threads instead).

The model on both sides: GPT with learned positions, pre-LN blocks (LayerNorm eps 1e-5,
fused QKV linear with bias, causal attention, projection, MLP 4x with tanh GELU), final
LayerNorm, bias-free LM head not tied to the embedding; vocab 256, hidden 256, 4 heads,
4 blocks, seq 128; a step is 8 microbatches of 4 sequences (gradient accumulation in eager,
the loss the mean over microbatches); AdamW lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on matrices and embeddings, gradients clipped to global norm 1.0 (across both
stages in the pipeline). PyTorch's attention is F.scaled_dot_product_attention(is_causal=True),
what a PyTorch user writes; pipewise's job is bench/job.toml.

--rounds N runs each side of a row N times, flipping which side goes first every round, and
the table shows the medians over the rounds.

--device cuda runs row (a) on the GPU on both sides (pipewise built with --features cuda);
rows (b) and (c) are CPU rows and are left out unless --rows names them.

For the CPU rows it also prints PyTorch's single-thread f32 GEMM rate (2048^3) and each side's
CPU MFU against it (achieved FLOP/s, the issue's count, over that rate times the threads).
The rate is timed before the first run and after every round, and the median of those is
used: the machine's speed drifts between minutes, and a rate timed once at the start
carries that drift into every MFU.

Other work on the machine skews every figure; the load average is printed.
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB, HIDDEN, HEADS, BLOCKS, SEQ = 256, 256, 4, 4, 128
MICROBATCH, MICROBATCHES = 4, 8
TOKENS_PER_STEP = MICROBATCH * MICROBATCHES * SEQ

# ----------------------------------------------------------------------------- PyTorch side


def torch_model():
    """The model's pieces: (embedding, blocks, head), as torch modules."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, HIDDEN)
            self.pos = nn.Embedding(SEQ, HIDDEN)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.tok(idx) + self.pos(pos)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(HIDDEN, eps=1e-5)
            self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-5)
            self.fc = nn.Linear(HIDDEN, 4 * HIDDEN)
            self.out = nn.Linear(4 * HIDDEN, HIDDEN)

        def forward(self, x):
            b, t, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
            q, k, v = (z.view(b, t, HEADS, h // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, h))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(HIDDEN, eps=1e-5)
            self.lm = nn.Linear(HIDDEN, VOCAB, bias=False)

        def forward(self, x):
            return self.lm(self.ln(x))

    torch.manual_seed(42)
    emb, blocks, head = Embedding(), [Block() for _ in range(BLOCKS)], Head()
    for m in [emb, head, *blocks]:
        for name, p in m.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
    return emb, blocks, head


def adamw(params):
    import torch

    params = list(params)
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=6e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def batch(gen, device):
    """A step's tokens and targets: random windows of this file's bytes (text, so the loss
    falls as on pipewise's generated corpus; the speed does not depend on the data)."""
    import torch

    text = torch.frombuffer(bytearray(Path(__file__).read_bytes()), dtype=torch.uint8).long()
    starts = torch.randint(0, len(text) - SEQ - 1, (MICROBATCH * MICROBATCHES,), generator=gen)
    data = torch.stack([text[s : s + SEQ + 1] for s in starts.tolist()])
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def run_eager(threads, device, steps):
    """Trains in this process; returns per-step seconds and losses."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    emb, blocks, head = torch_model()
    model = nn.Sequential(emb, *blocks, head).to(device)
    opt = adamw(model.parameters())
    gen = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, losses = [], []
    for _ in range(steps):
        x, y = batch(gen, device)
        sync()
        t0 = time.perf_counter()
        total = 0.0
        for xm, ym in zip(x.split(MICROBATCH), y.split(MICROBATCH)):
            loss = F.cross_entropy(model(xm).view(-1, VOCAB), ym.reshape(-1)) / MICROBATCHES
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = float(total)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(total)
    return {"step_s": times, "loss": losses, "threads": torch.get_num_threads()}


def run_pp_rank(rank, port, steps):
    """One rank of the 2-stage 1F1B pipeline (gloo); rank 0 returns the step times."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    emb, blocks, head = torch_model()
    # pipewise's even split of its 6 pieces: embedding + 2 blocks | 2 blocks + head.
    half = BLOCKS // 2
    module = nn.Sequential(emb, *blocks[:half]) if rank == 0 else nn.Sequential(*blocks[half:], head)
    if rank == 0:
        example = torch.zeros(MICROBATCH, SEQ, dtype=torch.long)
    else:
        example = torch.zeros(MICROBATCH, SEQ, HIDDEN)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"), input_args=(example,))

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))

    # The schedule scales the gradients by 1/microbatches (the mean over microbatches).
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    opt = adamw(module.parameters())
    gen = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(steps):
        x, y = batch(gen, "cpu")
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        else:
            mb_losses = []
            schedule.step(target=y, losses=mb_losses)
        # Clip by the norm of both stages' gradients together.
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        sq = torch.stack([g.pow(2).sum() for g in grads]).sum().reshape(1)
        dist.all_reduce(sq)
        norm = float(sq.sqrt())
        if norm > 1.0:
            for g in grads:
                g.mul_(1.0 / (norm + 1e-6))
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(float(dt))
        if rank == 1:
            losses.append(float(torch.stack(mb_losses).mean()))
    loss = torch.tensor(losses if rank == 1 else [0.0] * steps)
    dist.broadcast(loss, src=1)
    dist.destroy_process_group()
    return {"step_s": times, "loss": loss.tolist(), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cores):
    """A preexec_fn pinning the child (and what it execs) to `cores`, as taskset does."""
    return (lambda: os.sched_setaffinity(0, cores)) if cores is not None else None


def thread_env(threads):
    env = dict(os.environ)
    for var in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def self_cmd(args, *extra):
    return [sys.executable, str(Path(__file__).resolve()), "--steps", str(args.steps), *extra]


def parse_result(out, what):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{what}: no result\n{out}")


def torch_eager(args, threads, cores, device):
    cmd = self_cmd(args, "--_eager", str(threads), "--device", device)
    p = subprocess.run(cmd, env=thread_env(threads), preexec_fn=pinned(cores),
                       capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"PyTorch eager failed:\n{p.stderr}")
    return parse_result(p.stdout, "PyTorch eager")


def torch_pipeline(args):
    port = free_port()
    procs = [
        subprocess.Popen(self_cmd(args, "--_pp", str(rank), str(port)), env=thread_env(1),
                         preexec_fn=pinned({rank % os.cpu_count()}), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=args.timeout) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"PyTorch pipeline rank failed:\n{err}")
    return parse_result(outs[0][0], "PyTorch pipeline")


STEP_LINE = re.compile(r"^step\s+(\d+)\s+loss\s+(\S+)\s+([\d.]+) ms", re.M)


def pipewise(args, workers, threads, cores, device, tmp, job=None, overrides=None):
    """A coordinator and `workers` worker processes; the job (`job`, default bench/job.toml,
    with `overrides`, default `--workers N --schedule 1f1b`) submitted and followed."""
    job = job or HERE / "job.toml"
    if overrides is None:
        overrides = ["--workers", str(workers), "--schedule", "1f1b"]
    binary = str(Path(args.pipewise).resolve())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(dir=tmp))
    logs, procs = [], []
    try:
        log = open(tmp / "coordinator.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            [binary, "coordinator", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp / "data")],
            stdout=log, stderr=subprocess.STDOUT))
        for w in range(workers):
            log = open(tmp / f"worker{w}.log", "w")
            logs.append(log)
            core = None if cores is None else {cores[w % len(cores)]}
            procs.append(subprocess.Popen(
                [binary, "worker", "--coordinator", url, "--id", f"bench-{w}", "--device", device],
                env=thread_env(threads), preexec_fn=pinned(core), stdout=log,
                stderr=subprocess.STDOUT))
        out = open(tmp / "submit.out", "w+")
        logs.append(out)
        submit = subprocess.Popen(
            [binary, "submit", str(job), "--coordinator", url, "--wait",
             "--wait-for-coordinator", "60", "--steps", str(args.steps), *overrides],
            stdout=out, stderr=subprocess.STDOUT)
        procs.append(submit)
        # A worker or coordinator that dies would leave the job waiting: stop at once.
        deadline = time.monotonic() + args.timeout
        while submit.poll() is None:
            dead = [p for p in procs[:-1] if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                submit.kill()
                submit.wait()
                break
            time.sleep(0.2)
        out.flush()
        stdout = (tmp / "submit.out").read_text()
        if submit.returncode != 0:
            tails = "".join(f"--- {f.name}\n{f.read_text()[-2000:]}\n" for f in sorted(tmp.glob("*.log")))
            raise RuntimeError(f"pipewise submit failed:\n{stdout}\n{tails}")
        steps = [(int(s), float(l), float(ms) / 1e3) for s, l, ms in STEP_LINE.findall(stdout)]
        if len(steps) != args.steps:
            raise RuntimeError(f"pipewise: {len(steps)} step lines, expected {args.steps}:\n{stdout}")
        return {"step_s": [s for _, _, s in steps], "loss": [l for _, l, _ in steps],
                "threads": threads}
    finally:
        stop_all(procs, logs)


def stop_all(procs, logs):
    """Terminates `procs` (the last started first), kills any still up after 10 s, and
    closes `logs`."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    for log in logs:
        log.close()


# ----------------------------------------------------------------------------- report


def tokens_per_s(result, warmup):
    timed = result["step_s"][warmup:]
    return TOKENS_PER_STEP / statistics.median(timed), statistics.median(timed)


def step_flops():
    """Training FLOPs of a step, the issue's count: 6 * (parameters outside the embeddings)
    * tokens + 12 * blocks * seq * hidden * tokens (attention scores and weighted sum)."""
    params = BLOCKS * (12 * HIDDEN * HIDDEN + 13 * HIDDEN) + 2 * HIDDEN + HIDDEN * VOCAB
    return 6 * params * TOKENS_PER_STEP + 12 * BLOCKS * SEQ * HIDDEN * TOKENS_PER_STEP


def torch_gemm_rate():
    """PyTorch's single-thread f32 GEMM rate at 2048^3 (GFLOP/s, median of 5), in this child
    process pinned to core 0."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return {"gflops": 2 * 2048**3 / statistics.median(times) / 1e9}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipewise", default="target/release/pipewise", help="the pipewise binary")
    ap.add_argument("--device", default="cpu", help="row (a)'s device on both sides: cpu or cuda")
    ap.add_argument("--rows", default=None, help="rows to run, e.g. a,b,c (default: all; a with cuda)")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    ap.add_argument("--steps", type=int, default=7, help="steps per run, warm-up included")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each side per row, the order flipped every round (PyTorch first, "
                         "then pipewise first, ...); the table shows the medians over rounds")
    ap.add_argument("--_eager", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_pp", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_gemm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._gemm:
        print("RESULT " + json.dumps(torch_gemm_rate()), flush=True)
        return

    if args._eager is not None:
        print("RESULT " + json.dumps(run_eager(args._eager, args.device, args.steps)), flush=True)
        return
    if args._pp is not None:
        result = run_pp_rank(args._pp[0], args._pp[1], args.steps)
        if args._pp[0] == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return

    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not Path(args.pipewise).is_file():
        ap.error(f"--pipewise {args.pipewise}: no such file (cargo build --release -p pipewise-cli)")
    cuda = args.device.startswith("cuda")
    rows = (args.rows or ("a" if cuda else "a,b,c")).split(",")
    ncpu = os.cpu_count()
    import torch  # noqa: F401  (fail early, with the version in the header)

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"pipewise vs PyTorch {torch.__version__}: vocab {VOCAB}, hidden {HIDDEN}, {HEADS} heads, "
          f"{BLOCKS} blocks, seq {SEQ}, {MICROBATCHES}x{MICROBATCH} sequences a step "
          f"({TOKENS_PER_STEP} tokens), f32")
    print(f"CPU: {cpu}, {ncpu} cores; load average {open('/proc/loadavg').read().split()[:3]}")
    print(f"{args.steps} steps a run, the first {args.warmup} left out; tokens/s of the median step")
    table = []
    rates = []

    def probe():
        # PyTorch's 1-thread GEMM rate now, in a child pinned to core 0 (CPU rows only).
        if not cuda:
            out = subprocess.run(self_cmd(args, "--_gemm"), env=thread_env(1),
                                 preexec_fn=pinned({0}), capture_output=True, text=True,
                                 timeout=args.timeout)
            rates.append(parse_result(out.stdout, "PyTorch GEMM")["gflops"])

    probe()
    if rates:
        print(f"PyTorch's 1-thread f32 GEMM (2048^3) at the start: {rates[0]:.1f} GFLOP/s; a step "
              f"is {step_flops() / 1e9:.1f} GFLOP")
    with tempfile.TemporaryDirectory(prefix="pipewise-bench-") as tmp:
        for row in rows:
            if row == "a":
                label = f"(a) 1 process, 1 thread, {args.device}"
                sides = (lambda: torch_eager(args, 1, {0}, args.device),
                         lambda: pipewise(args, 1, 1, [0], args.device, tmp))
            elif row == "b":
                label = "(b) 2-stage 1F1B, 1 thread/process"
                sides = (lambda: torch_pipeline(args),
                         lambda: pipewise(args, 2, 1, [0, 1 % ncpu], "cpu", tmp))
            elif row == "c":
                label = f"(c) 1 process, {ncpu} threads"
                sides = (lambda: torch_eager(args, ncpu, None, "cpu"),
                         lambda: pipewise(args, 1, ncpu, None, "cpu", tmp))
            else:
                ap.error(f"--rows: unknown row {row!r} (a, b or c)")
            t_all, p_all = [], []
            for r in range(args.rounds):
                # Flipping the order every round spreads a drift in the machine's speed over
                # both sides instead of charging it to the one that runs second.
                if r % 2 == 0:
                    t, p = sides[0](), sides[1]()
                else:
                    p = sides[1]()
                    t = sides[0]()
                (t_tps, t_med), (p_tps, p_med) = tokens_per_s(t, args.warmup), tokens_per_s(p, args.warmup)
                t_all.append(t_tps)
                p_all.append(p_tps)
                probe()
                print(f"{label}{f' round {r + 1}' if args.rounds > 1 else ''}: PyTorch "
                      f"{t_med * 1e3:.0f} ms/step (threads {t['threads']}, loss "
                      f"{t['loss'][0]:.3f}->{t['loss'][-1]:.3f}), pipewise {p_med * 1e3:.0f} ms/step "
                      f"(loss {p['loss'][0]:.3f}->{p['loss'][-1]:.3f}), ratio {p_tps / t_tps:.2f}",
                      flush=True)
            threads = {"a": 1, "b": 2, "c": ncpu}[row]
            table.append((label, statistics.median(t_all), statistics.median(p_all), threads))
    gemm = statistics.median(rates) if rates else None
    print()
    if gemm:
        print(f"MFU below = achieved / (PyTorch's GEMM rate x threads), the rate the median of "
              f"{len(rates)} timings beside the runs: {gemm:.1f} GFLOP/s (range "
              f"{min(rates):.1f}-{max(rates):.1f})")
    print(f"{'row':<40} {'PyTorch tok/s':>14} {'pipewise tok/s':>15} {'pipewise/PyTorch':>17}"
          + ("   MFU PyTorch  MFU pipewise" if gemm else ""))
    for label, t_tps, p_tps, threads in table:
        mfu = ""
        if gemm and not (cuda and label.startswith("(a)")):
            per_token = step_flops() / TOKENS_PER_STEP / 1e9
            mfu = f"   {t_tps * per_token / (gemm * threads):11.2f}  {p_tps * per_token / (gemm * threads):12.2f}"
        print(f"{label:<40} {t_tps:>14.0f} {p_tps:>15.0f} {p_tps / t_tps:>17.2f}{mfu}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Each worker's peak memory when a Hugging Face Llama is loaded onto a pipeline: issue 54's
item 7.

For each model size (`--sizes`; default about 100 M and 330 M parameters) it writes a random
`LlamaForCausalLM` (untied head, f32) with `save_pretrained` in shards of `--shard-mb`, starts
a `pipewise coordinator` and `--workers` `pipewise worker` processes on one data directory,
submits a few steps of 1F1B from the directory (`[model] path`, the torchtitan layer split
with one block fewer on the first and last stages) and, once the job is done, reads every
worker's peak resident set (VmHWM, /proc/PID/status), and the peak up to when its log says
the training data is loaded (its stages read from the directory, before any pass). Per
worker it prints both peaks, the parameter bytes of its stages (counted here from the
configuration and the split), their training state (f32: an f64 gradient and two f32
moments, `Param::state_bytes`; bf16 adds an f32 master copy), the activations it held (its
own `pipewise_worker_peak_activation_bytes` gauge: the largest stash kept for pending
backward passes in the last step, a fixed amount for a given seq_len, microbatch size and
schedule) and the fixed overhead, peak − (parameters + state + activations): the binary,
thread stacks, allocator slack and the kernels' bounded scratch. The worker's own
`pipewise_parameter_bytes` gauge (value, moments and master copy, no gradient) is scraped
and checked against the count.

The claim: no worker maps or copies the whole model, nor a second copy of its own
largest tensor: the fixed overhead is about the same on every worker and at every model
size. Measured 2026-12-05 (f32, 1F1B, 4 workers, seq 32, microbatches of 1, 2 steps):
after loading, peak − parameters is 30.1–31.5 MiB (112 M parameters) and 37.6–39.9 MiB
(336 M); after training, the fixed overhead is 28.2–34.7 MiB (112 M) and 35.1–46.6 MiB
(336 M) on every worker, the embedding's and the head's included, with activations of
6.8–12.4 and 13.4–44.3 MiB beside it. (Before, peak − (parameters + state) was
70.6–74.3 / 129.9–136.8 MiB on the middle workers, 237.7 / 355.2 MiB on the embedding's and
314.7 / 428.1 MiB on the head's, at 112 M / 336 M: table-sized f32 buffers kept beside the
table's state, the gradient rounded for the optimizer, the head's weight-gradient product,
and a copy of the table while the final parameters were saved.)
The bench prints the spans per size, and exits 1 when a worker's gauge disagrees with the
count or the job fails. Linux only; needs torch and transformers; not part of CI.
Checkpoints go under --tmp (default /tmp) and are deleted after.

    cargo build --release -p pipewise-cli
    /work/venv/bin/python bench/hf/memory.py --pipewise target/release/pipewise
    /work/venv/bin/python bench/hf/memory.py --sizes 330m --steps 2 --keep
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

# hidden, layers, heads, key/value heads, intermediate, vocabulary.
SIZES = {
    "25m": (512, 4, 8, 4, 1408, 16000),
    "100m": (768, 10, 12, 4, 2048, 32000),
    "330m": (1024, 24, 16, 4, 2816, 32000),
}
PARAMETER_GAUGE = re.compile(r'^pipewise_parameter_bytes\{[^}]*worker="(\d+)"[^}]*\}\s+(\S+)', re.M)
ACTIVATION_GAUGE = re.compile(
    r'^pipewise_worker_peak_activation_bytes\{[^}]*worker="(\d+)"[^}]*\}\s+(\S+)', re.M)

JOB = """[job]
name = "hf-memory-{size}"

[model]
path = "{model}"
seq_len = {seq_len}
dtype = "{dtype}"

[training]
global_batch_size = {batch}
steps = {steps}
seed = 1

[parallelism]
pipeline_parallel_degree = {workers}
pipeline_parallel_schedule = "1f1b"
pipeline_parallel_microbatch_size = 1
pipeline_parallel_first_stage_less_layers = 1
pipeline_parallel_last_stage_less_layers = 1

[data]
path = "train.txt"

[checkpoint]
enable_checkpoint = false
"""


def write_model(size, folder, shard_mb):
    """A random LlamaForCausalLM of `size` saved in `folder`; its config as a dict."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    h, layers, heads, kv, inter, vocab = SIZES[size]
    config = LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, max_position_embeddings=512,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, max_shard_size=f"{shard_mb}MB")
    del model
    return json.loads((Path(folder) / "config.json").read_text())


def torchtitan_counts(layers, stages, first_less, last_less):
    """Pieces per stage, as `common/src/partition/torchtitan.rs` cuts them."""
    slots = layers + first_less + last_less
    blocks = [slots // stages + (1 if i < slots % stages else 0) for i in range(stages)]
    blocks[0] -= first_less
    blocks[-1] -= last_less
    pieces = list(blocks)
    pieces[0] += 1
    pieces[-1] += 1
    return pieces


def stage_params(config, workers):
    """Parameters of each worker's stage (1F1B: stage w on worker w)."""
    h, v = config["hidden_size"], config["vocab_size"]
    m = config["intermediate_size"]
    kvd = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    block = 2 * h + h * h + 2 * kvd * h + h * h + 3 * h * m
    piece = ["embedding"] + ["block"] * config["num_hidden_layers"] + ["head"]
    size = {"embedding": v * h, "block": block, "head": h + v * h}
    out, at = [], 0
    for count in torchtitan_counts(config["num_hidden_layers"], workers, 1, 1):
        out.append(sum(size[p] for p in piece[at:at + count]))
        at += count
    return out


def status(pid):
    """The VmHWM, VmRSS, RssAnon and RssFile of process `pid`, in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields


def watch_loads(workers, done, loaded):
    """Polls each worker (process, log) every 20 ms until `done`: its VmHWM when its log
    first says the training data is loaded (after its stages were read from the
    directory, before the first step's passes) goes into `loaded`."""
    while not done.is_set():
        for i, (p, log) in enumerate(workers):
            if i not in loaded and "training data loaded" in Path(log).read_text():
                loaded[i] = status(p.pid)["VmHWM"]
        time.sleep(0.02)


def loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, log):
    """Starts `cmd` and returns it with the first line it prints (its address line)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    line = p.stdout.readline()
    if not line:
        sys.exit(f"{cmd[1]} did not start; see {log}")
    return p, line


def scrape_gauges(port, deadline=30.0):
    """The worker index, its `pipewise_parameter_bytes` and its
    `pipewise_worker_peak_activation_bytes` (the last step's largest stash held for pending
    backward passes), as the metrics on `port` report them."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            params = PARAMETER_GAUGE.findall(text.decode())
            acts = ACTIVATION_GAUGE.findall(text.decode())
            if params and acts:
                (w, v), (_, a) = params[-1], acts[-1]
                return int(w), int(float(v)), int(float(a))
        except OSError:
            pass
        time.sleep(0.2)
    return None, None, 0


def run(args, size, tmp):
    """One size: the job's rows, one per worker."""
    data = tmp / f"data-{size}"
    model = data / "model"
    model.mkdir(parents=True)
    text = Path(args.text).read_text()
    (data / "train.txt").write_text(text)
    t0 = time.monotonic()
    config = write_model(size, model, args.shard_mb)
    shards = sorted(p.name for p in model.glob("*.safetensors"))
    on_disk = sum((model / s).stat().st_size for s in shards)
    print(f"{size}: wrote {len(shards)} shard(s), {on_disk / 2**20:,.0f} MiB, in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    job = data / "job.toml"
    job.write_text(JOB.format(size=size, model="model", seq_len=args.seq_len, dtype=args.dtype,
                              batch=args.batch, steps=args.steps, workers=args.workers))
    procs = []
    try:
        coord, line = start([args.pipewise, "coordinator", "--listen", "127.0.0.1:0",
                             "--data-dir", str(data)], tmp / f"coordinator-{size}.log")
        procs.append(coord)
        url = "http://" + line.split()[3]
        ports, logs = [], []
        for w in range(args.workers):
            port = loopback_port()
            log = tmp / f"w{w}-{size}.log"
            p, _ = start([args.pipewise, "worker", "--coordinator", url, "--id", f"w{w}",
                          "--data-dir", str(data), "--metrics-listen", f"127.0.0.1:{port}"],
                         log)
            procs.append(p)
            ports.append(port)
            logs.append(log)
        loaded, done = {}, threading.Event()
        watcher = threading.Thread(target=watch_loads,
                                   args=(list(zip(procs[1:], logs)), done, loaded))
        watcher.start()
        t0 = time.monotonic()
        try:
            submit = subprocess.run([args.pipewise, "submit", str(job), "--coordinator", url,
                                     "--wait"], capture_output=True, text=True,
                                    timeout=args.timeout)
        finally:
            done.set()
            watcher.join()
        if submit.returncode != 0:
            raise RuntimeError(f"{size}: submit failed:\n{(submit.stdout + submit.stderr)[-3000:]}")
        took = time.monotonic() - t0
        rows = []
        for i, (p, port) in enumerate(zip(procs[1:], ports)):
            worker, gauge, acts = scrape_gauges(port)
            rows.append((worker, status(p.pid), gauge, acts, loaded.get(i)))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(model, ignore_errors=True)
    params = stage_params(config, args.workers)
    print(f"{size}: {sum(params) / 1e6:,.1f} M parameters, {args.steps} steps of "
          f"{args.batch} × {args.seq_len} tokens in {took:.0f} s", flush=True)
    return params, sorted(rows, key=lambda r: -1 if r[0] is None else r[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipewise", default="target/release/pipewise")
    ap.add_argument("--sizes", default="100m,330m", help=f"comma-separated, of {list(SIZES)}")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4, help="global batch (microbatches of 1)")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--shard-mb", type=int, default=200, help="save_pretrained's max_shard_size")
    ap.add_argument("--text", default=str(Path(__file__).resolve().parents[2] /
                                          "examples/shakespeare/val.txt"))
    ap.add_argument("--tmp", default="/tmp", help="where the checkpoints are written")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--keep", action="store_true", help="keep the logs (not the checkpoints)")
    args = ap.parse_args()
    args.pipewise = str(Path(args.pipewise).resolve())
    if not Path(args.pipewise).exists():
        ap.error(f"--pipewise {args.pipewise}: no such file (cargo build --release -p pipewise-cli)")
    # Bytes per parameter of the stages' own state: value, f64 gradient, two f32 moments,
    # and an f32 master copy of a bf16 value.
    value = {"f32": 4, "bf16": 2}[args.dtype]
    per_state = 8 + 4 + 4 + (4 if args.dtype == "bf16" else 0)
    tmp = Path(tempfile.mkdtemp(prefix="pipewise-hf-memory-", dir=args.tmp))
    failed, overheads = False, {}
    try:
        for size in args.sizes.split(","):
            try:
                params, rows = run(args, size, tmp)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(e, file=sys.stderr)
                failed = True
                continue
            print(f"{'worker':>6} {'params M':>9} {'param MiB':>10} {'state MiB':>10} "
                  f"{'loaded MiB':>11} {'peak MiB':>9} {'acts MiB':>9} {'fixed MiB':>10} "
                  f"{'RssFile MiB':>12}  gauge")
            for worker, st, gauge, acts, at_load in rows:
                n = params[worker] if worker is not None else 0
                pb, sb = n * value, n * per_state
                fixed = st["VmHWM"] - pb - sb - acts
                want = n * (value + per_state - 8)
                ok = gauge == want
                failed |= not ok
                overheads.setdefault(size, []).append(
                    (st["VmHWM"] - pb - sb, acts, fixed, None if at_load is None else at_load - pb))
                shown = "?" if at_load is None else f"{at_load / 2**20:.1f}"
                print(f"{worker!s:>6} {n / 1e6:>9.1f} {pb / 2**20:>10.1f} {sb / 2**20:>10.1f} "
                      f"{shown:>11} {st['VmHWM'] / 2**20:>9.1f} {acts / 2**20:>9.1f} "
                      f"{fixed / 2**20:>10.1f} {st['RssFile'] / 2**20:>12.1f}  "
                      f"{'= count' if ok else f'{gauge} ≠ {want} ✗'}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs in {tmp}")
    for size, rows in overheads.items():
        def span(i):
            got = [r[i] for r in rows if r[i] is not None]
            return f"{min(got) / 2**20:.1f} … {max(got) / 2**20:.1f}" if got else "?"
        print(f"{size} MiB: after loading, peak − parameters {span(3)}; after training, "
              f"peak − (parameters + state) {span(0)}, of which activations {span(1)} and "
              f"the fixed overhead {span(2)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

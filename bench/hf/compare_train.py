#!/usr/bin/env python3
"""Twenty training steps of a Hugging Face Llama checkpoint in plain PyTorch, the reference
that pipewise's training of the same checkpoint is compared with.

Needs `pip install torch transformers tokenizers safetensors` (as in /work/venv: torch 2.15.0,
transformers 5.25.0, CPU). Not part of CI.

    # a checkpoint to start from (compare_eval.py writes one)
    /work/venv/bin/python bench/hf/compare_eval.py --skip-pipewise --model-dir /tmp/llama
    # the reference run: prints `step N loss X`, writes the final weights
    /work/venv/bin/python bench/hf/compare_train.py --model /tmp/llama --out /tmp/llama-ref
    # and against pipewise's run of the same job (its watch output, its final checkpoint)
    /work/venv/bin/python bench/hf/compare_train.py --model /tmp/llama --out /tmp/llama-ref \
        --pipewise-log watch.txt --compare-weights /tmp/llama-pipewise

The run: LlamaForCausalLM.from_pretrained(--model) in f32, eager attention, train mode
(dropout is 0). The data (--data, default examples/shakespeare/train.txt) is encoded with the
tokenizer (--tokenizer, else MODEL/tokenizer.json, else examples/shakespeare/tokenizer.json; no
special tokens added) into one stream t of L tokens, cut into the windows k = 0 ..
floor((L-1)/S) - 1, input t[kS .. kS+S], target t[kS+1 .. kS+S+1], S = --seq-len (64). Step
s = 0, 1, ... takes windows sG .. sG+G-1 modulo the window count, G = --batch (8), one window
per microbatch: the step's loss is the mean over its G windows of each window's mean token
cross-entropy, and the gradient is that mean's (each microbatch's loss / G, backward,
accumulated). Then clip_grad_norm_(all parameters, max_norm 1.0) and torch.optim.AdamW (lr 1e-3
constant, betas (0.9, 0.95), eps 1e-8) with two parameter groups: weight decay 0.1 on every
parameter of 2 or more dimensions (embedding, projections, an untied lm_head), none on the
1-dimensional ones (the RMSNorm weights). A tied embedding is one parameter, counted once.
Prints `step N loss X` (N from 1, X with 7 decimals) for --steps (20) steps, then saves the
final weights with save_pretrained to --out (with the tokenizer.json beside them).

Comparisons (each optional; exit 1 if any fails):
  --pipewise-log FILE   lines starting with `step` whose 4th whitespace field is the loss
                        (pipewise watch: `step    1/20  loss 5.5703 ...`; this script's own
                        output reads the same way); the first --steps of them against this
                        run's losses, |a - b| <= --rtol * |b| (1e-4)
  --compare-weights DIR another HF checkpoint folder: the same tensor names as this run's
                        saved model.safetensors, max |a - b| over all of them <= --atol (1e-4)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hfcommon as hc


def optimizer(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # shared (tied) parameters come once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)


def train(model, stream: torch.Tensor, seq_len: int, batch: int, steps: int, lr: float,
          weight_decay: float, max_norm: float) -> list[float]:
    n = hc.window_count(len(stream), seq_len)
    if n == 0:
        raise SystemExit(f"{len(stream)} tokens give no window of {seq_len} + 1")
    model.train()
    opt = optimizer(model, lr, weight_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(batch):
            x, y = hc.window(stream, (s * batch + j) % n, seq_len)
            logits = model(input_ids=x[None]).logits
            loss = F.cross_entropy(logits[0].float(), y)
            (loss / batch).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
        opt.step()
        losses.append(total / batch)
        print(f"step {s + 1} loss {losses[-1]:.7f}", flush=True)
    return losses


def read_step_losses(path: Path) -> list[float]:
    out = []
    for line in path.read_text().splitlines():
        fields = line.split()
        # `step N loss X` / `step N/M  loss X ...`, not pipewise local's `step time ... ms`.
        if len(fields) >= 4 and fields[0] == "step" and fields[2] == "loss":
            out.append(float(fields[3]))
    return out


def safetensors_of(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    files = [f for f in files if f.name != "expected.safetensors"]
    if not files:
        raise SystemExit(f"{model_dir}: no *.safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def compare_losses(ours: list[float], path: Path, rtol: float) -> bool:
    theirs = read_step_losses(path)
    if len(theirs) < len(ours):
        print(f"FAIL: {path} has {len(theirs)} step lines, expected at least {len(ours)}")
        return False
    worst = 0.0
    ok = True
    for i, (a, b) in enumerate(zip(theirs, ours), start=1):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        flag = "" if rel <= rtol else "  <-- over"
        ok &= rel <= rtol
        print(f"step {i:3d}  reference {b:.7f}  other {a:.7f}  relative {rel:.2e}{flag}")
    print(f"losses: max relative difference {worst:.3e} (tolerance {rtol:.0e}): {'OK' if ok else 'FAIL'}")
    return ok


def compare_weights(ours_dir: Path, other_dir: Path, atol: float) -> bool:
    ours, theirs = safetensors_of(ours_dir), safetensors_of(other_dir)
    if set(ours) != set(theirs):
        print(f"FAIL: tensor names differ: only here {sorted(set(ours) - set(theirs))}, "
              f"only in {other_dir} {sorted(set(theirs) - set(ours))}")
        return False
    worst, worst_name = 0.0, ""
    for name in sorted(ours):
        a, b = ours[name], theirs[name]
        if a.shape != b.shape:
            print(f"FAIL: {name}: shape {list(a.shape)} here, {list(b.shape)} in {other_dir}")
            return False
        d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        if d > worst:
            worst, worst_name = d, name
    ok = worst <= atol
    print(f"weights: max abs difference {worst:.3e} ({worst_name or '-'}) over {len(ours)} tensors "
          f"(tolerance {atol:.0e}): {'OK' if ok else 'FAIL'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="HF checkpoint folder to start from")
    ap.add_argument("--data", type=Path, default=hc.ROOT / "examples/shakespeare/train.txt")
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--out", type=Path, help="save_pretrained the final weights here")
    ap.add_argument("--f64", action="store_true",
                    help="train in float64 (a reference for how far f32 rounding moves the weights)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="global batch G (windows per step)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-norm", type=float, default=1.0)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads")
    ap.add_argument("--pipewise-log", type=Path, help="compare the step losses with this file")
    ap.add_argument("--compare-weights", type=Path, help="compare the final weights with this HF folder")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args()
    hc.quiet_transformers()
    torch.use_deterministic_algorithms(True)
    if args.threads:
        torch.set_num_threads(args.threads)

    tok_path = hc.tokenizer_for(args.model, args.tokenizer)
    model = hc.load_llama(args.model, attn="eager",
                          dtype=torch.float64 if args.f64 else torch.float32)
    vocab = model.config.vocab_size
    tok_vocab = hc.load_tokenizer(tok_path).get_vocab_size(with_added_tokens=True)
    if tok_vocab > vocab:
        raise SystemExit(f"tokenizer {tok_path} has {tok_vocab} ids, the model {vocab}")
    stream = hc.encode_file(tok_path, args.data)
    n = hc.window_count(len(stream), args.seq_len)
    print(f"model {args.model} (tie_word_embeddings={model.config.tie_word_embeddings}), "
          f"data {args.data}: {len(stream)} tokens, {n} windows of {args.seq_len}; "
          f"{args.steps} steps of {args.batch} windows", flush=True)

    t0 = time.perf_counter()
    losses = train(model, stream, args.seq_len, args.batch, args.steps, args.lr, args.weight_decay,
                   args.max_norm)
    print(f"{args.steps} steps in {time.perf_counter() - t0:.1f} s", flush=True)

    tmp = None
    out = args.out
    if out is None and args.compare_weights is not None:
        tmp = tempfile.mkdtemp(prefix="pipewise-hf-train-")
        out = Path(tmp)
    ok = True
    try:
        if out is not None:
            model.save_pretrained(out, safe_serialization=True)
            if tok_path.exists():
                shutil.copyfile(tok_path, out / "tokenizer.json")
            if args.out is not None:
                print(f"final weights: {out}")
        if args.pipewise_log is not None:
            ok &= compare_losses(losses, args.pipewise_log, args.rtol)
        if args.compare_weights is not None:
            ok &= compare_weights(out, args.compare_weights, args.atol)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

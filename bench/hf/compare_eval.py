#!/usr/bin/env python3
"""Eval loss of a random Llama: transformers against `pipewise eval`, on the same checkpoint.

Needs `pip install torch transformers tokenizers safetensors` (as in /work/venv: torch 2.15.0,
transformers 5.25.0, CPU). Not part of CI.

    /work/venv/bin/python bench/hf/compare_eval.py --pipewise target/release/pipewise
    /work/venv/bin/python bench/hf/compare_eval.py --untied --seq-len 128 --pipewise BIN
    /work/venv/bin/python bench/hf/compare_eval.py --skip-pipewise    # transformers' half only

1. Makes a LlamaForCausalLM with transformers' init under torch.manual_seed(--seed): hidden
   256, 4 layers, 8 heads, 2 KV heads (head_dim 32), intermediate 688, vocabulary the
   tokenizer's, RMSNorm eps 1e-5, RoPE theta 10000, no biases, f32, tied (--tied, the default)
   or untied (--untied) embeddings; weights normal with std --init-std (default 0.1, wider than
   transformers' 0.02 so the logits are far from uniform), then every RMSNorm weight
   1 + --norm-noise * randn. Saves it with save_pretrained (safetensors) into --model-dir (a
   fresh temporary folder if not given), with the tokenizer.json beside it.
2. Encodes --data with the tokenizer (no special tokens added) into one stream t of L tokens
   and computes the mean token cross-entropy over every window k = 0 .. floor((L-1)/S) - 1 in
   order, input t[kS .. kS+S], target t[kS+1 .. kS+S+1] (S = --seq-len), with transformers'
   forward (eager attention, eval mode; the sum is kept in f64). All windows have S targets, so
   that is also the mean of the windows' means.
3. Runs `PIPEWISE eval --model DIR --data FILE --seq-len S` and reads its line
   `loss X perplexity Y`.
4. Prints both and their relative difference |pipewise - transformers| / transformers; exits 1
   when that is over --rtol (default 1e-5), 2 when pipewise fails or prints no such line.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import hfcommon as hc

LOSS_LINE = re.compile(r"\bloss\s+(\S+)\s+perplexity\s+(\S+)")


@torch.no_grad()
def transformers_eval(model, stream: torch.Tensor, seq_len: int, batch: int) -> tuple[float, int]:
    """(mean token cross-entropy, windows) over every window of the stream, in order."""
    model.eval()
    n = hc.window_count(len(stream), seq_len)
    if n == 0:
        raise SystemExit(f"{len(stream)} tokens give no window of {seq_len} + 1")
    total = 0.0
    for first in range(0, n, batch):
        ks = range(first, min(n, first + batch))
        xs, ys = zip(*(hc.window(stream, k, seq_len) for k in ks))
        x, y = torch.stack(xs), torch.stack(ys)
        logits = model(input_ids=x).logits
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="none")
        total += ce.double().sum().item()
    return total / (n * seq_len), n


def run_pipewise(binary: str, model_dir: Path, data: Path, seq_len: int) -> tuple[float, float]:
    cmd = [binary, "eval", "--model", str(model_dir), "--data", str(data), "--seq-len", str(seq_len)]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        print(f"pipewise eval exited {proc.returncode}", file=sys.stderr)
        sys.exit(2)
    found = [m for m in map(LOSS_LINE.search, proc.stdout.splitlines()) if m]
    if not found:
        sys.stdout.write(proc.stdout)
        print("pipewise eval printed no line `loss X perplexity Y`", file=sys.stderr)
        sys.exit(2)
    m = found[-1]
    return float(m.group(1)), float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipewise", help="the pipewise binary (needed unless --skip-pipewise)")
    ap.add_argument("--skip-pipewise", action="store_true", help="transformers' half only")
    ap.add_argument("--tokenizer", type=Path, default=hc.DEFAULT_TOKENIZER)
    ap.add_argument("--data", type=Path, default=hc.ROOT / "examples/shakespeare/val.txt")
    ap.add_argument("--seq-len", type=int, default=64)
    tie = ap.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=True, help="tied embeddings (default)")
    tie.add_argument("--untied", dest="tied", action="store_false", help="separate lm_head")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.1)
    ap.add_argument("--norm-noise", type=float, default=0.1)
    ap.add_argument("--max-positions", type=int, default=2048, help="config's max_position_embeddings")
    ap.add_argument("--model-dir", type=Path, help="where the checkpoint goes (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary checkpoint folder")
    ap.add_argument("--batch", type=int, default=16, help="windows per forward (does not change the result)")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    if not args.skip_pipewise and not args.pipewise:
        ap.error("--pipewise BIN is needed (or --skip-pipewise)")
    if args.seq_len > args.max_positions:
        ap.error("--seq-len is over --max-positions")
    hc.quiet_transformers()
    torch.use_deterministic_algorithms(True)

    tmp = None
    model_dir = args.model_dir
    if model_dir is None:
        tmp = tempfile.mkdtemp(prefix="pipewise-hf-eval-")
        model_dir = Path(tmp)
    try:
        tok = hc.load_tokenizer(args.tokenizer)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        model = hc.random_llama(vocab, args.tied, args.seed, args.max_positions, args.init_std, args.norm_noise)
        model.set_attn_implementation("eager")
        model.save_pretrained(model_dir, safe_serialization=True)
        shutil.copyfile(args.tokenizer, model_dir / "tokenizer.json")
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model {model_dir}: llama hidden 256, 4 layers, 8 heads / 2 KV, vocab {vocab}, "
              f"{'tied' if args.tied else 'untied'}, {n_params} parameters, seed {args.seed}")

        stream = hc.encode_file(args.tokenizer, args.data)
        t0 = time.perf_counter()
        loss, n = transformers_eval(model, stream, args.seq_len, args.batch)
        print(f"data {args.data}: {len(stream)} tokens, {n} windows of {args.seq_len} "
              f"({time.perf_counter() - t0:.1f} s)")
        print(f"transformers loss {loss:.7f} perplexity {hc.perplexity(loss):.4f}")
        if args.skip_pipewise:
            return
        pw_loss, pw_ppl = run_pipewise(args.pipewise, model_dir, args.data, args.seq_len)
        rel = abs(pw_loss - loss) / abs(loss)
        print(f"pipewise     loss {pw_loss:.7f} perplexity {pw_ppl:.4f}")
        print(f"relative difference {rel:.3e} (tolerance {args.rtol:.0e})")
        if not rel <= args.rtol:
            print("FAIL: pipewise's eval loss differs from transformers'", file=sys.stderr)
            sys.exit(1)
        print("OK")
    finally:
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            print(f"kept {tmp}")


if __name__ == "__main__":
    main()

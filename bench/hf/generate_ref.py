#!/usr/bin/env python3
"""Greedy generation with transformers from a Hugging Face checkpoint folder: the new token ids.

Needs `pip install torch transformers tokenizers safetensors` (as in /work/venv: torch 2.15.0,
transformers 5.25.0, CPU). Not part of CI.

    /work/venv/bin/python bench/hf/generate_ref.py --model DIR --prompt "ROMEO." -n 32
    /work/venv/bin/python bench/hf/generate_ref.py --model DIR --prompt-ids "12 7 301" -n 32

Loads DIR with AutoModelForCausalLM.from_pretrained (f32, eager attention,
eval mode), encodes --prompt with the tokenizer (--tokenizer, else DIR/tokenizer.json, else
examples/shakespeare/tokenizer.json; no special tokens added) or takes --prompt-ids as they
are, and runs model.generate with do_sample=False (greedy), max_new_tokens N, no attention
padding, and no end-of-sequence stop (the checkpoint's eos_token_id is ignored unless
--stop-at-eos), so exactly N tokens come back. Prints the N new ids on one line, separated by
single spaces, on stdout; with --show, the decoded text goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import hfcommon as hc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="HF checkpoint folder")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text, encoded with the tokenizer")
    src.add_argument("--prompt-ids", help="prompt token ids, separated by spaces or commas")
    ap.add_argument("-n", "--new-tokens", type=int, default=32)
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--stop-at-eos", action="store_true", help="stop at the checkpoint's eos_token_id")
    ap.add_argument("--show", action="store_true", help="print the decoded prompt and continuation to stderr")
    args = ap.parse_args()
    hc.quiet_transformers()
    torch.use_deterministic_algorithms(True)

    from transformers import AutoModelForCausalLM, GenerationConfig

    tok_path = hc.tokenizer_for(args.model, args.tokenizer)
    tok = hc.load_tokenizer(tok_path) if (args.prompt is not None or args.show) else None
    if args.prompt is not None:
        prompt = tok.encode(args.prompt, add_special_tokens=False).ids
    else:
        prompt = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
    if not prompt:
        raise SystemExit("empty prompt")

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    eos = model.config.eos_token_id if args.stop_at_eos else None
    if not args.stop_at_eos:
        model.generation_config.eos_token_id = None
    gen = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=args.new_tokens,
        eos_token_id=eos,
        pad_token_id=eos if eos is not None else 0,
    )
    ids = torch.tensor([prompt], dtype=torch.int64)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    new = out[0, len(prompt):].tolist()
    print(" ".join(str(t) for t in new))
    if args.show:
        print(f"prompt: {tok.decode(prompt)!r}", file=sys.stderr)
        print(f"new:    {tok.decode(new)!r}", file=sys.stderr)


if __name__ == "__main__":
    main()

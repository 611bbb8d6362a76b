#!/usr/bin/env python3
"""Writes the tiny Llama fixtures under worker/testdata/llama-tiny/ (tied/ and untied/).

Needs `pip install torch transformers tokenizers safetensors` (as in /work/venv; made with
torch 2.15.0 and transformers 5.25.0 on the CPU). Not part of CI: the Rust test reads the files
this writes, and needs no Python.

    /work/venv/bin/python bench/hf/make_fixtures.py            # writes worker/testdata/llama-tiny
    /work/venv/bin/python bench/hf/make_fixtures.py --out DIR

Each of tied/ and untied/ holds what `LlamaForCausalLM(config).save_pretrained(dir,
safe_serialization=True)` writes, less generation_config.json (config.json, model.safetensors;
f32), and expected.safetensors:

  input_ids  int64 [2, 16]      fixed random ids in [0, 96)
  logits     f32   [2, 16, 96]  model(input_ids).logits, eval mode, eager attention
  loss       f32   []           model(input_ids, labels=input_ids).loss: the mean next-token
                                cross-entropy over the 2 x 15 shifted positions

The model: vocab 96, hidden 32, intermediate 48, 2 layers, 4 heads, 2 KV heads (head_dim 8),
RMSNorm eps 1e-5, RoPE theta 10000, 64 positions, no biases, SiLU; tie_word_embeddings true in
tied/, false in untied/. Weights are HF's init (normal, std = initializer_range = 0.1; wider
than HF's default 0.02 so that attention and logits are far from uniform) under
torch.manual_seed(SEED), then every RMSNorm weight is set to 1 + 0.1 * randn so that none is
all ones. The script checks that sdpa attention gives the eager logits within 1e-6, that the
loss is the shifted cross-entropy of the logits, and that the saved directory loads back to
the same logits.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
VOCAB = 96
BATCH, SEQ = 2, 16


def config(tied: bool) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.1,
        dtype="float32",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def build(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config(tied)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.eval()
    return model


def logits_of(model: LlamaForCausalLM, ids: torch.Tensor, attn: str) -> torch.Tensor:
    model.set_attn_implementation(attn)
    with torch.no_grad():
        return model(input_ids=ids).logits


def make(out: Path, tied: bool, ids: torch.Tensor) -> None:
    if out.exists():
        shutil.rmtree(out)
    model = build(tied)
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert len(norms) == 5 and all((p != 1).any() for p in norms)

    eager = logits_of(model, ids, "eager")
    sdpa = logits_of(model, ids, "sdpa")
    diff = (eager - sdpa).abs().max().item()
    assert diff <= 1e-6, f"sdpa differs from eager by {diff}"
    model.set_attn_implementation("eager")
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    manual = F.cross_entropy(eager[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert abs(loss.item() - manual.item()) <= 1e-6, (loss.item(), manual.item())

    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    save_file(
        {"input_ids": ids.contiguous(), "logits": eager.contiguous(), "loss": loss.detach().reshape(())},
        str(out / "expected.safetensors"),
    )

    back = LlamaForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        again = back(input_ids=ids).logits
    assert torch.equal(again, eager), "saved checkpoint does not reload to the same logits"

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = {k: (str(f.get_slice(k).get_dtype()), list(f.get_slice(k).get_shape())) for k in f.keys()}
    print(f"== {out}  (tie_word_embeddings={tied})")
    print(f"   loss {loss.item():.7f}  logits std {eager.std().item():.4f}  sdpa-eager max diff {diff:.2e}")
    print(f"   lm_head.weight in model.safetensors: {'lm_head.weight' in keys}")
    for k, (dt, shape) in sorted(keys.items()):
        print(f"   {k:48s} {dt:4s} {shape}")
    print("   config.json:", json.dumps(json.loads((out / "config.json").read_text()), sort_keys=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "worker/testdata/llama-tiny")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    hf_logging.disable_progress_bar()
    gen = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    for tied, name in ((True, "tied"), (False, "untied")):
        make(args.out / name, tied, ids)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"total {total} bytes under {args.out}")


if __name__ == "__main__":
    main()

"""Shared pieces of the bench/hf scripts: the tokenizer, the windows of a text, the models.

Needs `pip install torch transformers tokenizers safetensors` (/work/venv has them). Imported
by the scripts beside it (Python puts a script's own folder first on sys.path).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOKENIZER = ROOT / "examples/shakespeare/tokenizer.json"
ENDOFTEXT = "<|endoftext|>"


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def tokenizer_for(model_dir: Path | None, explicit: Path | None) -> Path:
    """--tokenizer if given, else MODEL_DIR/tokenizer.json if there, else the Shakespeare one."""
    if explicit is not None:
        return explicit
    if model_dir is not None and (model_dir / "tokenizer.json").exists():
        return model_dir / "tokenizer.json"
    return DEFAULT_TOKENIZER


def encode_file(tokenizer_path: Path, data: Path) -> torch.Tensor:
    """The whole file as one token stream, no special tokens added (int64)."""
    tok = load_tokenizer(tokenizer_path)
    text = data.read_text(encoding="utf-8")
    ids = tok.encode(text, add_special_tokens=False).ids
    return torch.tensor(ids, dtype=torch.int64)


def window_count(n_tokens: int, seq_len: int) -> int:
    """Windows k = 0 .. floor((L - 1) / S) - 1 of a stream of L tokens."""
    return max(0, (n_tokens - 1) // seq_len)


def window(stream: torch.Tensor, k: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input t[kS .. kS+S], target t[kS+1 .. kS+S+1]."""
    start = k * seq_len
    return stream[start : start + seq_len], stream[start + 1 : start + seq_len + 1]


def llama_config(vocab_size: int, tied: bool, max_positions: int, init_std: float):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=init_std,
        dtype="float32",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def random_llama(vocab_size: int, tied: bool, seed: int, max_positions: int, init_std: float,
                 norm_noise: float):
    """LlamaForCausalLM, transformers' init under torch.manual_seed(seed); then every RMSNorm
    weight set to 1 + norm_noise * randn (from the same generator), so none is all ones."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(vocab_size, tied, max_positions, init_std)).float()
    if norm_noise:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + norm_noise * torch.randn_like(p))
    return model


def load_llama(model_dir: Path, attn: str = "eager", dtype=None):
    from transformers import LlamaForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    return LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

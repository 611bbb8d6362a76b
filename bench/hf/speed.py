"""Training tokens/s of transformers' LlamaForCausalLM in PyTorch eager, for the same-run
comparison with pipewise (issue 54, item 5).

Needs `pip install torch transformers` (outside the repository). The model: hidden 256,
4 layers, 8 heads, 2 KV heads, intermediate 688, vocab 4096, f32, sdpa attention; a step is
8 microbatches of 4 sequences of 128 tokens (gradient accumulation), then AdamW. Prints one
line per thread count: `threads N tokens/s X` (the median of the timed steps).

    python bench/hf/speed.py --threads 1,2 --steps 6
"""

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    mbs, micro, seq = 4, 8, 128
    data = torch.randint(0, 4096, (micro, mbs, seq + 1))
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        times = []
        for step in range(args.warmup + args.steps):
            start = time.perf_counter()
            for m in range(micro):
                x = data[m, :, :seq]
                y = data[m, :, 1:]
                logits = model(x).logits
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 4096), y.reshape(-1))
                (loss / micro).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
        tokens = micro * mbs * seq
        print(f"threads {threads} tokens/s {tokens / statistics.median(times):.0f}")


if __name__ == "__main__":
    main()

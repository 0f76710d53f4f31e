"""Measure, on CPU, what scripts/memory_plan.py predicts for a small model: the resident-set rise of its fp32
weights, of one forward and backward with and without gradient checkpointing (gradients, activations, the
logits chunk), and of AdamW's first step. Prints one JSON object. Run it with MALLOC_MMAP_THRESHOLD_=65536 so
that the allocator hands every freed tensor back to the system and the resident set follows the live tensors.

    python scripts/memory_probe.py --hidden 256 --inter 1024 --layers 4 --vocab 4096 --batch 8 --length 256
"""
import argparse
import gc
import json

import psutil
import torch


def rss() -> int:
    return psutil.Process().memory_info().rss


def reset_peak() -> None:
    """Linux: the peak resident set (VmHWM) starts again from the current one."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak() -> int:
    """This process's peak resident set since reset_peak. Not ru_maxrss: Linux carries a parent's peak into a
    child across fork and exec, so a probe started by a large process (pytest) would read the parent's."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, default in [("hidden", 256), ("inter", 1024), ("layers", 4), ("vocab", 4096), ("heads", 4),
                          ("kv_heads", 2), ("batch", 8), ("length", 256)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from minirl.logprobs import token_logprobs
    from minirl.models import enable_gradient_checkpointing
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.inter,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, tie_word_embeddings=True)
    before = rss()
    model = Qwen2ForCausalLM(config).train()
    out = {"params": sum(p.numel() for p in model.parameters()), "weights": rss() - before}
    ids = torch.randint(0, args.vocab, (args.batch, args.length))
    mask = torch.ones_like(ids)

    def forward_backward() -> int:
        gc.collect()
        start = rss()
        reset_peak()
        logp, _ = token_logprobs(model, ids, mask, args.length // 2)
        logp.sum().backward()
        return peak() - start

    small = torch.randint(0, args.vocab, (1, 16))  # a warm-up pass: the first backward's one-time allocations
    token_logprobs(model, small, torch.ones_like(small), 8)[0].sum().backward()
    model.zero_grad(set_to_none=True)
    enable_gradient_checkpointing(model)
    out["step_with_checkpointing"] = forward_backward()
    model.zero_grad(set_to_none=True)
    model.gradient_checkpointing_disable()
    out["step_without_checkpointing"] = forward_backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gc.collect()
    start = rss()
    optimizer.step()
    out["optimizer"] = rss() - start
    print(json.dumps(out))


if __name__ == "__main__":
    main()

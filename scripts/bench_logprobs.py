"""Peak memory and time of minirl's per-token log-probs vs the naive `log_softmax(logits).gather`, on CPU.

    python scripts/bench_logprobs.py                       # vocab 32k and 152k x sequence 1k and 4k, hidden 896
    python scripts/bench_logprobs.py --vocab 151936 --seq 4096 --hidden 1536

Both compute log pi(y_t) for every token of one sequence from the transformer's last hidden states (N=1, T
tokens, hidden H, vocabulary V) *and backpropagate through it* to the hidden states, as a training step does
(the LM head's own weight gradient, V x H, is the same for both methods and is left out of the measurement):
- naive: logits = h @ W^T (T, V) in fp32, log_softmax, gather; autograd keeps the (T, V) tensors;
- minirl: `policy.chunked_logprobs`, the LM head over chunks of tokens with activation checkpointing, so only
  one chunk's (chunk, V) logits live at a time (recomputed in backward).
Each measurement runs in a fresh process; its peak is the rise of the process's max RSS over the inputs. The
children run with MALLOC_MMAP_THRESHOLD_=65536, so every large tensor is its own mapping and is returned to the
system when freed (glibc's default moves the threshold up and keeps freed blocks, which blurs the peak).

    python scripts/bench_logprobs.py --training code       # the training pass, padded vs packed (issue 52)
    python scripts/bench_logprobs.py --training long_tail --model tiny

`--training SHAPE` times one training pass (update.forward_backward: log-probs, loss, backward) over one
micro-batch of synthetic rows, three ways: padded with the group's prompt shared through its KV cache (minirl's
default), padded without that sharing (what FSDP and gradient checkpointing run), and packed (pack_sequences:
no padding, the prompt laid once). tokens/s counts the rows' real tokens (prompt + response, each row's own).
Shapes: `code` is `make code`'s (recipes/code_cpu.yaml: micro_batch_size 16 = 2 groups of 8, prompts of 205-237
tokens, max_new_tokens 128, responses ~0.46 of the longest on average); `long_tail` has 2 groups of 4, prompts of
60-300 tokens and responses of a log-normal length (median 60) up to 512, one of them truncated at 512.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(method: str, vocab: int, seq: int, hidden: int) -> dict:
    """Child process: allocate inputs, note max RSS, run forward+backward, report the rise and the time."""
    import resource
    import time

    import torch
    from minirl.logprobs import chunked_logprobs

    torch.manual_seed(0)
    h = (torch.randn(1, seq, hidden) * 0.5).requires_grad_()
    head = torch.nn.Linear(hidden, vocab, bias=False)
    head.weight.requires_grad_(False)  # its (V, H) gradient is the same for both methods: leave it out
    y = torch.randint(0, vocab, (1, seq))
    for _ in range(2):  # warm-up (allocator, kernels) on a small slice
        if method == "naive":
            torch.log_softmax(head(h[:, :8]).float(), -1).gather(-1, y[:, :8, None]).sum().backward()
        else:
            chunked_logprobs(h[:, :8], y[:, :8], head)[0].sum().backward()
    h.grad = None
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if method == "naive":
        logp = torch.log_softmax(head(h).float(), dim=-1).gather(-1, y[..., None]).squeeze(-1)
    else:
        logp, _ = chunked_logprobs(h, y, head)
    logp.sum().backward()
    seconds = time.perf_counter() - t0
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"method": method, "vocab": vocab, "seq": seq, "peak_mb": peak_mb, "seconds": seconds,
            "logp_sum": float(logp.sum())}


def training_batch(shape: str, vocab: int, seed: int = 0) -> tuple[dict, int]:
    """Synthetic rows of a shape (see the module docstring): the batch forward_backward takes, and R."""
    import torch
    g = torch.Generator().manual_seed(seed)
    if shape == "code":
        groups, G, R, prompt_range = 2, 8, 128, (205, 237)
        lengths = (8 + torch.empty(groups * G).exponential_(1 / 55, generator=g)).clamp(max=R).long()
    else:
        groups, G, R, prompt_range = 2, 4, 512, (60, 300)
        lengths = (torch.randn(groups * G, generator=g) + torch.log(torch.tensor(60.0))).exp().clamp(4, R).long()
        lengths[torch.randint(groups * G, (1,), generator=g)] = R               # the tail: one truncated row
    prompts = torch.randint(prompt_range[0], prompt_range[1] + 1, (groups,), generator=g)
    P = int(prompts.max())
    ids = torch.randint(10, vocab, (groups * G, P + R), generator=g)
    mask = torch.zeros_like(ids)
    for i in range(groups * G):
        p = int(prompts[i // G])
        ids[i, :P] = ids[(i // G) * G, :P]                                      # the group's prompt
        mask[i, P - p:P + int(lengths[i])] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, P:].float(),
             "advantages": torch.randn(groups * G, generator=g)}
    return batch, R


def measure_training(shape: str, model_name: str, repeats: int) -> None:
    """Print the training pass's time and tokens/s: padded (shared prompt), padded (unshared), packed."""
    import functools
    import time

    import torch
    from minirl import logprobs, update
    from minirl.models import build_policy, resolve_model_path
    path = resolve_model_path("smollm2-135m" if model_name == "smollm2" else model_name)
    model = build_policy(path, torch.device("cpu"), torch.float32, "sdpa").train()
    batch, R = training_batch(shape, model.config.vocab_size)
    N, width = batch["input_ids"].shape
    real = int(batch["attention_mask"].sum())
    resp = batch["response_mask"].sum(1)
    print(f"{shape}: {N} rows, padded {N} x {width} = {N * width} tokens, real {real} "
          f"({real / (N * width):.2f} of padded); mean response {float(resp.mean()):.0f} = "
          f"{float(resp.mean() / resp.max()):.2f} of the longest; model {model_name}, "
          f"{torch.get_num_threads()} threads")
    counts = dict(num_tokens=float(resp.sum()), num_seqs=float(N))
    unshared = functools.partial(logprobs._token_logprobs_unsharded, share_prompts=False)
    ways = {"padded, prompt shared (default)": {}, "padded, unshared (FSDP, ckpt)": {"unshared": True},
            "packed (pack_sequences)": {"packed": True}}
    real_fn = logprobs._token_logprobs_unsharded
    small = {"input_ids": batch["input_ids"][:2, :48], "attention_mask": torch.ones(2, 48, dtype=torch.long),
             "response_mask": torch.ones(2, 8), "advantages": batch["advantages"][:2]}
    for packed in (False, True):  # warm-up: kernels, allocator
        update.forward_backward(model, small, update.LossSettings(), 2, packed=packed, **counts)
    results = {}
    for rep in range(repeats):
        for name, how in (ways.items() if rep % 2 == 0 else reversed(list(ways.items()))):
            logprobs._token_logprobs_unsharded = unshared if how.get("unshared") else real_fn
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            update.forward_backward(model, batch, update.LossSettings(), N, packed=how.get("packed", False),
                                    **counts)
            results.setdefault(name, []).append(time.perf_counter() - t0)
            logprobs._token_logprobs_unsharded = real_fn
    base = min(results["padded, prompt shared (default)"])
    print(f"{'pass':34s} {'s (best)':>9s} {'tokens/s':>9s} {'speed-up':>9s}   all runs (s)")
    for name, times in results.items():
        print(f"{name:34s} {min(times):9.2f} {real / min(times):9.1f} {base / min(times):9.2f}x   "
              + " ".join(f"{t:.2f}" for t in times), flush=True)
    print(f"padding removed: packed runs {real} tokens where padded runs {N * width} "
          f"({N * width / real:.2f}x as many)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="*", default=[32000, 151936])
    ap.add_argument("--seq", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--hidden", type=int, default=896)  # Qwen2.5-0.5B
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--training", choices=["code", "long_tail"], help="time the training pass, padded vs packed")
    ap.add_argument("--model", default="smollm2", help="smollm2 (as recipes/code_cpu.yaml) or tiny")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.training:
        measure_training(args.training, args.model, args.repeats)
        return
    if args.child:
        method, vocab, seq, hidden = args.child
        print(json.dumps(measure(method, int(vocab), int(seq), int(hidden))))
        return
    print(f"hidden {args.hidden}; forward + backward of log-probs for one sequence; peak = RSS rise")
    print(f"{'vocab':>7s} {'seq':>5s} {'naive MB':>9s} {'minirl MB':>9s} {'ratio':>6s} {'naive s':>8s} "
          f"{'minirl s':>8s} {'max |diff|':>10s}")
    for vocab in args.vocab:
        for seq in args.seq:
            res = {}
            for method in ("naive", "minirl"):
                out = subprocess.run([sys.executable, __file__, "--child", method, str(vocab), str(seq),
                                      str(args.hidden)], capture_output=True, text=True, check=True,
                                     env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
                res[method] = json.loads(out.stdout.strip().splitlines()[-1])
            n, m = res["naive"], res["minirl"]
            print(f"{vocab:7d} {seq:5d} {n['peak_mb']:9.0f} {m['peak_mb']:9.0f} {m['peak_mb'] / n['peak_mb']:6.2f} "
                  f"{n['seconds']:8.2f} {m['seconds']:8.2f} {abs(n['logp_sum'] - m['logp_sum']):10.2e}", flush=True)


if __name__ == "__main__":
    main()

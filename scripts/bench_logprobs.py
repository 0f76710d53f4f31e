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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="*", default=[32000, 151936])
    ap.add_argument("--seq", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--hidden", type=int, default=896)  # Qwen2.5-0.5B
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
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

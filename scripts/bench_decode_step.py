"""Milliseconds per step of minirl's decode loop (engines/decode.py) on a fixed shape: B prompts x G rows, R new tokens, no EOS
(every row runs to the end), median of --calls calls. A steadier measure than bench_rollout.py for a change
to the decode step, since the rows' lengths do not vary.

    python scripts/bench_decode_step.py                      # SmolLM2-135M, 8 GSM8K prompts x 8, 128 tokens
    python scripts/bench_decode_step.py --greedy             # without the sampling noise
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from minirl.data import load_rows, prompt_text
from minirl.engines.decode import decode
from minirl.models import load_model, load_tokenizer, resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--gsm8k", default="../shared/data/gsm8k/train.jsonl")
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    model, tokenizer = load_model(path).eval(), load_tokenizer(path)
    prompts = [prompt_text(r, tokenizer) for r in load_rows(args.gsm8k)[:args.prompts]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    run = lambda tokens: decode(model, enc.input_ids, enc.attention_mask, args.group_size, tokens, [],  # noqa: E731
                                not args.greedy, [], tokenizer.pad_token_id)
    run(4)                                                                         # warm-up
    times = []
    for seed in range(args.calls):
        torch.manual_seed(seed)
        start = time.perf_counter()
        run(args.new_tokens)
        times.append((time.perf_counter() - start) / args.new_tokens * 1e3)
    print(f"{args.prompts} x {args.group_size} rows, {args.new_tokens} tokens, prompt {enc.input_ids.shape[1]}: "
          f"ms/step {' '.join(f'{t:.1f}' for t in times)}, median {statistics.median(times):.1f}")


if __name__ == "__main__":
    main()

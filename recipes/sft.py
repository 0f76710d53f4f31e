"""Supervised fine-tuning (cross-entropy on chat data, the prompt masked), as a loop over the sessions API.

    python recipes/sft.py                                         # the toy task: correct "#### N" answers
    python recipes/sft.py --model /path/to/Qwen2.5-0.5B-Instruct --lora_rank 32 --lr 1e-4 --max_tokens 512 \\
        --train_files data/prepared/gsm8k_train.jsonl --val_files data/prepared/gsm8k_test.jsonl

The target of a row is its worked solution in chat format: GSM8K's own solution text (it ends in "#### N"),
or "#### N" for rows without one (the toy task). As in tinker-cookbook's sl_loop, each Datum is the shifted
sequence prompt + answer + EOS, with weight 0 on the prompt's positions. Tinker's cross_entropy sums -w log p
over tokens; the answer tokens' weight 1/(tokens in the batch) makes that the batch's token mean.
"""
from __future__ import annotations

import argparse
import random

import common  # the options and ending every recipe shares

from common import accuracy, answer_of, prompt_tokens
from minirl.data import load_rows
from minirl.sessions import AdamParams, Datum, ModelInput, ServiceClient, TensorData


def target_text(row: dict) -> str:
    solution = (row.get("extra_info") or {}).get("answer")  # raw GSM8K rows keep their solution here
    return solution if solution else f"#### {answer_of(row)}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=32)           # sequences per step, per process
    p.add_argument("--max_tokens", type=int, default=8)            # for the held-out accuracy
    p.add_argument("--lora_rank", type=int, default=0)
    p.add_argument("--lora_alpha", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_dir", default="")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    svc = ServiceClient()
    rank, world = svc.process_index, svc.num_processes
    tc = (svc.create_lora_training_client(args.model, rank=args.lora_rank, alpha=args.lora_alpha, seed=args.seed)
          if args.lora_rank else svc.create_training_client(args.model, seed=args.seed)).result()
    tok = tc.get_tokenizer()
    rows = load_rows(args.train_files, split="train")
    val_rows = load_rows(args.val_files, split="test", limit=args.val_max_samples) if args.val_files else []
    sampler = tc.save_weights_and_get_sampling_client().result()
    before = accuracy(sampler, tok, val_rows, args.max_tokens, rank, world) if val_rows else None
    rng = random.Random(args.seed * 1000 + rank)  # every process its own examples
    losses = []
    for step in range(args.steps):
        batch = rng.sample(rows, args.batch_size)
        pairs = [(prompt_tokens(tok, r), tok(target_text(r), add_special_tokens=False).input_ids + [tok.eos_token_id])
                 for r in batch]
        num_tokens = sum(len(answer) for _, answer in pairs)
        datums = []
        for prompt, answer in pairs:
            tokens = prompt + answer
            weights = [0.0] * (len(prompt) - 1) + [1.0 / num_tokens] * len(answer)
            datums.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": TensorData(tokens[1:], "int64"),
                                                "weights": TensorData(weights)}))
        fb = tc.forward_backward(datums, loss_fn="cross_entropy")
        op = tc.optim_step(AdamParams(learning_rate=args.lr, beta2=0.99, eps=1e-8, grad_clip_norm=1.0))
        losses.append(fb.result().metrics["loss:sum"])
        op.result()
        if rank == 0:
            print(f"step {step + 1}: loss {losses[-1]:.4f}")
    after = common.finish(tc, tok, val_rows, args.max_tokens, before, rank, world, args.output_dir)
    return {"before": before, "after": after, "losses": losses}


if __name__ == "__main__":
    main()

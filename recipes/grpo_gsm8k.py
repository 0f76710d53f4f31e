"""GRPO on GSM8K, written as a loop over the sessions API (minirl/sessions/client.py), as in Tinker's minimal RL loop.

    python recipes/grpo_gsm8k.py                                  # the toy task and tiny model, CPU, a minute
    python recipes/grpo_gsm8k.py --model /path/to/Qwen2.5-0.5B-Instruct --lora_rank 32 --lr 4e-5 \\
        --train_files data/prepared/gsm8k_train.jsonl --val_files data/prepared/gsm8k_test.jsonl \\
        --max_tokens 512 --prompts_per_step 32
    accelerate launch recipes/grpo_gsm8k.py ...                   # every process runs this loop on its prompts

Each step, as tinker-cookbook's rl_loop: a sampler on a snapshot of the current weights, G samples for each
of B prompts (all submitted before waiting: one generate), gsm8k_reward, the reward centred within its group
(no std division: the cookbook's and Dr. GRPO's), one Datum per sample (model_input = prompt + sample[:-1],
target 0 / advantage 0 under the prompt), forward_backward with the clipped "ppo" loss, optim_step. Tinker's
losses sum over tokens; dividing the advantages by the step's sampled-token count over *every* process (each
process's forward_backward is its share, and optim_step sums the gradients over processes) gives train.py's
token mean, so with matching settings this computes what `train.py --adv_estimator dr_grpo` computes, on one
process or several (tests/core/test_loss_convention.py checks the gradient on 1 and 2 processes;
tests/sessions/test_session.py the first step). Groups whose rewards are all equal have advantage 0 and stay
in the batch (they count in the token count, as in train.py).
"""
from __future__ import annotations

import argparse

import common  # the options and ending every recipe shares
import torch

from common import accuracy, answer_of, prompt_tokens
from minirl.data import load_rows, prompt_indices
from minirl.distributed import global_sum
from minirl.rewards import gsm8k_reward
from minirl.sessions import AdamParams, Datum, EncodedTextChunk, ModelInput, SamplingParams, ServiceClient, TensorData


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts_per_step", type=int, default=16)     # B, per process
    p.add_argument("--group_size", type=int, default=8)            # G
    p.add_argument("--max_tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lora_rank", type=int, default=0)             # 0: full fine-tuning
    p.add_argument("--lora_alpha", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup_steps", type=int, default=5)          # linear warm-up, as train.py
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_dir", default="")                     # merged weights are saved here if given
    return p.parse_args(argv)


def step_tokens(groups_P: list) -> float:
    """The token mean's denominator: the step's sampled tokens over every process (train.py's num_tokens)."""
    return float(global_sum(torch.tensor(float(sum(len(s.tokens) for group in groups_P for s in group)))))


def group_datums(prompt: ModelInput, group: list, rewards_G: list[float], num_tokens: float) -> list[Datum]:
    """One Datum per sample of a group: its advantage (reward minus the group's mean) / the step's tokens."""
    mean = sum(rewards_G) / len(rewards_G)
    ob_len = prompt.length - 1
    return [Datum(model_input=prompt.append(EncodedTextChunk(tokens=s.tokens[:-1])), loss_fn_inputs={
        "target_tokens": TensorData([0] * ob_len + s.tokens, "int64"),
        "logprobs": TensorData([0.0] * ob_len + s.logprobs),
        "advantages": TensorData([0.0] * ob_len + [(r - mean) / num_tokens] * len(s.tokens))})
        for s, r in zip(group, rewards_G)]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    B, G, T = args.prompts_per_step, args.group_size, args.temperature
    svc = ServiceClient()
    rank, world = svc.process_index, svc.num_processes
    tc = (svc.create_lora_training_client(args.model, rank=args.lora_rank, alpha=args.lora_alpha, seed=args.seed)
          if args.lora_rank else svc.create_training_client(args.model, seed=args.seed)).result()
    tok = tc.get_tokenizer()
    train_rows = load_rows(args.train_files, split="train")
    val_rows = load_rows(args.val_files, split="test", limit=args.val_max_samples) if args.val_files else []
    torch.manual_seed(args.seed * 1000 + rank)  # as train.py: every process samples differently
    sampling_client = tc.save_weights_and_get_sampling_client().result()
    before = accuracy(sampling_client, tok, val_rows, args.max_tokens, rank, world) if val_rows else None
    sampling_params = SamplingParams(max_tokens=args.max_tokens, temperature=T)
    # train.py's defaults: AdamW betas (0.9, 0.99), eps 1e-8, gradient norm clipped at 1
    adam = dict(beta1=0.9, beta2=0.99, eps=1e-8, grad_clip_norm=1.0)
    history = []
    for step in range(args.steps):
        rows = [train_rows[i] for i in prompt_indices(step * B * world + rank * B, B, len(train_rows), args.seed)]
        prompts_P = [ModelInput.from_ints(prompt_tokens(tok, r)) for r in rows]
        futures_P = [sampling_client.sample(prompt=p, num_samples=G, sampling_params=sampling_params)
                     for p in prompts_P]
        groups_P = [f.result().sequences for f in futures_P]
        num_tokens = step_tokens(groups_P)  # over every process: optim_step sums their gradients
        datums_D, rewards = [], []
        for prompt, row, group in zip(prompts_P, rows, groups_P):
            rewards_G = [gsm8k_reward(tok.decode(s.tokens, skip_special_tokens=True), answer_of(row)) for s in group]
            datums_D += group_datums(prompt, group, rewards_G, num_tokens)
            rewards += rewards_G
        fwd_bwd_future = tc.forward_backward(datums_D, loss_fn="ppo")
        lr = args.lr * min(1.0, (step + 1) / args.warmup_steps) if args.warmup_steps else args.lr
        optim_future = tc.optim_step(AdamParams(learning_rate=lr, **adam))
        out, opt = fwd_bwd_future.result(), optim_future.result().metrics
        history.append({"step": step + 1, "reward": sum(rewards) / len(rewards), "loss": out.metrics["loss:sum"],
                        **opt})
        if rank == 0:
            print(f"step {step + 1}: reward {history[-1]['reward']:.3f} loss {out.metrics['loss:sum']:.4f} "
                  f"grad_norm {opt['grad_norm']:.4f}")
        sampling_client = tc.save_weights_and_get_sampling_client().result()  # the next rollouts' policy
    after = common.finish(tc, tok, val_rows, args.max_tokens, before, rank, world, args.output_dir)
    return {"before": before, "after": after, "history": history}


if __name__ == "__main__":
    main()

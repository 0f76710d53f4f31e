"""Train a language model to reason with RL against verifiable rewards (GRPO and variants).

    python train.py                                    # built-in toy run: tiny model, arithmetic, CPU, minutes
    python train.py --config recipes/gsm8k.yaml --model_name_or_path /path/to/Qwen2.5-0.5B-Instruct
    accelerate launch train.py --config recipes/gsm8k.yaml ...       # same file, several GPUs

Each training step is four stages, each a function that stands on its own:

    sample            G completions per prompt with HF generate        (minirl/rollout.py)
    score             verifiable reward per completion                 (minirl/rewards.py)
    forward_backward  group advantages -> clipped policy loss -> grads (minirl/update.py, formulas in loss.py)
    optim_step        clip grad norm, AdamW, LR schedule               (minirl/update.py)

Distributed training is data parallel: every process samples its own prompts; gradients are summed across
processes before `optim_step`. This file is the only one that knows there are several processes.
Metrics go to <output_dir>/metrics.jsonl with veRL's names; the final model is saved in <output_dir>.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from tqdm import tqdm

from minirl.config import Config, parse_config
from minirl.data import load_rows, prompt_indices, prompt_text
from minirl.evaluate import accuracy_by_source, evaluate
from minirl.loss import group_advantages
from minirl.policy import (load_model, load_tokenizer, pick_attn_implementation, pick_dtype, resolve_model_path,
                           token_logprobs)
from minirl.reference import load_reference, reference_logprobs
from minirl.rewards import score
from minirl.rollout import sample
from minirl.update import LossSettings, forward_backward, optim_step, warmup_constant_schedule


# --- distributed helpers: the only place that knows about several processes ------------------------------

def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def sum_gradients_across_processes(model) -> None:
    """Data parallelism: each process's loss is normalised by the *global* token count, so the global gradient
    is the plain sum of the per-process gradients."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


@torch.no_grad()
def validate(model, tokenizer, rows: list[dict], cfg: Config, rank: int, world: int) -> dict[str, float]:
    """Accuracy on held-out rows, each process scoring its own share; returns val/test_score/<source>."""
    records = evaluate(model, tokenizer, rows[rank::world], n=1 if cfg.val_greedy else cfg.group_size,
                       greedy=cfg.val_greedy, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    sources = sorted({r["data_source"] for r in rows})
    sums = torch.tensor([[sum(r["reward"] for r in records if r["data_source"] == s),
                          sum(1 for r in records if r["data_source"] == s)] for s in sources], dtype=torch.float64)
    sums = all_reduce_sum(sums.to(next(model.parameters()).device)).cpu()
    return {f"val/test_score/{s}": float(v / max(c, 1)) for s, (v, c) in zip(sources, sums.tolist())}


def stats(name: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{name}/mean": float(x.mean()), f"{name}/max": float(x.max()), f"{name}/min": float(x.min())}


def main(argv: list[str] | None = None) -> dict[str, float]:
    cfg = parse_config(argv)
    accelerator = Accelerator()
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    torch.manual_seed(cfg.seed * 1000 + rank)  # different samples on each process
    out_dir = Path(cfg.output_dir)
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(vars(cfg), indent=2))

    # --- policy, reference, data ----------------------------------------------------------------------
    with accelerator.main_process_first():  # the first process builds the toy model if needed
        path = resolve_model_path(cfg.model_name_or_path)
    dtype, attn = pick_dtype(cfg.dtype, device), pick_attn_implementation(cfg.attn_implementation)
    tokenizer = load_tokenizer(path)
    policy = load_model(path, dtype, attn, cfg.gradient_checkpointing).to(device)
    policy.train()
    ref_model = load_reference(path, dtype, attn, device) if cfg.kl_coef > 0 else None

    train_rows = load_rows(cfg.train_files, split="train")
    n_rows = len(train_rows)
    train_rows = [r for r in train_rows
                  if len(tokenizer(prompt_text(r, tokenizer), add_special_tokens=False).input_ids) <= cfg.max_prompt_length]
    if len(train_rows) < n_rows:
        accelerator.print(f"dropped {n_rows - len(train_rows)} of {n_rows} prompts longer than "
                          f"max_prompt_length={cfg.max_prompt_length}")
    if not train_rows:
        raise SystemExit(f"no training prompts fit max_prompt_length={cfg.max_prompt_length}")
    val_rows = load_rows(cfg.val_files, split="test", limit=cfg.val_max_samples) if cfg.val_files else []

    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  betas=(cfg.adam_beta1, cfg.adam_beta2))
    optimizer_steps_per_step = cfg.ppo_epochs * cfg.mini_batches
    scheduler = warmup_constant_schedule(optimizer, cfg.warmup_steps * optimizer_steps_per_step)
    loss_settings = LossSettings.from_config(cfg)
    B, G = cfg.prompts_per_step, cfg.group_size

    before = validate(policy, tokenizer, val_rows, cfg, rank, world) if val_rows else {}
    accelerator.print(f"held-out accuracy before RL: {before}")

    # --- the training loop ----------------------------------------------------------------------------
    metrics_file = out_dir / "metrics.jsonl"
    bar = tqdm(range(cfg.max_steps), desc="train", disable=not accelerator.is_main_process, dynamic_ncols=True)
    for step in bar:
        t_step = time.perf_counter()
        position = step * B * world + rank * B  # this process's slice of the global prompt stream
        rows = [train_rows[i] for i in prompt_indices(position, B, len(train_rows), cfg.seed)]

        # 1. sample: G completions per prompt
        t0 = time.perf_counter()
        rollout = sample(policy, tokenizer, [prompt_text(r, tokenizer) for r in rows], G, cfg.max_new_tokens,
                         cfg.temperature, cfg.top_p, cfg.top_k)
        t_gen = time.perf_counter() - t0

        # 2. score: reward per completion, then group-relative advantages
        t0 = time.perf_counter()
        rewards = torch.tensor(score(rollout.texts, [r for r in rows for _ in range(G)]), dtype=torch.float32)
        adv = group_advantages(rewards, G, cfg.adv_estimator, cfg.adv_std, cfg.adv_eps).to(device)
        t_reward = time.perf_counter() - t0

        # 3+4. forward_backward + optim_step, over mini-batches of whole groups
        t0 = time.perf_counter()
        R = rollout.response_ids.shape[1]
        batch = {"input_ids": rollout.input_ids, "attention_mask": rollout.attention_mask,
                 "response_mask": rollout.response_mask, "advantages": adv}
        with torch.no_grad():
            # log-probs of the sampling policy, from the trainer's own forward pass (not generate's scores)
            batch["old_logp"] = torch.cat([
                token_logprobs(policy, batch["input_ids"][s:s + cfg.micro_batch_size],
                               batch["attention_mask"][s:s + cfg.micro_batch_size], R)[0]
                for s in range(0, B * G, cfg.micro_batch_size)])
            if ref_model is not None:
                batch["ref_logp"] = reference_logprobs(ref_model, batch["input_ids"], batch["attention_mask"], R,
                                                       cfg.micro_batch_size)
        mini = B * G // cfg.mini_batches
        update_metrics, grad_norms = [], []
        for _ in range(cfg.ppo_epochs):
            for s in range(0, B * G, mini):
                mb = {k: v[s:s + mini] for k, v in batch.items()}
                counts = all_reduce_sum(torch.tensor([float(mb["response_mask"].sum()), float(mini)], device=device))
                update_metrics.append(forward_backward(policy, mb, loss_settings, cfg.micro_batch_size,
                                                       num_tokens=float(counts[0]), num_seqs=float(counts[1])))
                sum_gradients_across_processes(policy)
                grad_norms.append(optim_step(policy, optimizer, scheduler, cfg.max_grad_norm))
        t_update = time.perf_counter() - t0

        # --- metrics (veRL names) ---------------------------------------------------------------------
        lengths = rollout.response_mask.sum(dim=1)
        g_rewards, g_adv, g_len, g_trunc = accelerator.gather(
            (rewards.to(device), adv, lengths.to(device).float(), rollout.truncated.to(device).float()))
        m = {"training/global_step": step + 1, **stats("critic/reward", g_rewards),
             **stats("critic/advantages", g_adv), **stats("response_length", g_len),
             "response_length/clip_ratio": float(g_trunc.mean())}
        for key in update_metrics[0]:
            m[f"actor/{key}"] = sum(u[key] for u in update_metrics) / len(update_metrics)
        m["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
        m["actor/lr"] = scheduler.get_last_lr()[0]
        if cfg.val_every and (step + 1) % cfg.val_every == 0 and val_rows and step + 1 < cfg.max_steps:
            m.update(validate(policy, tokenizer, val_rows, cfg, rank, world))
        m.update({"timing_s/gen": t_gen, "timing_s/reward": t_reward, "timing_s/update": t_update,
                  "timing_s/step": time.perf_counter() - t_step})
        if accelerator.is_main_process:
            with metrics_file.open("a") as f:
                f.write(json.dumps(m) + "\n")
            bar.set_postfix(reward=f"{m['critic/reward/mean']:.3f}", len=f"{m['response_length/mean']:.1f}")
        if not math.isfinite(m["actor/pg_loss"]):
            raise FloatingPointError(f"non-finite loss at step {step + 1}; see {metrics_file}")

    # --- after training -------------------------------------------------------------------------------
    after = validate(policy, tokenizer, val_rows, cfg, rank, world) if val_rows else {}
    accelerator.print(f"held-out accuracy after RL:  {after}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        policy.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        summary = {"before": before, "after": after, "steps": cfg.max_steps}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"saved the policy and tokenizer to {out_dir}")
    accelerator.end_training()
    return {"before": before, "after": after}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

"""Train a language model to reason with RL against verifiable rewards (GRPO and variants).

    python train.py                                    # built-in toy run: tiny model, arithmetic, CPU, minutes
    python train.py --config recipes/gsm8k.yaml --model_name_or_path /path/to/Qwen2.5-0.5B-Instruct
    accelerate launch train.py --config recipes/gsm8k.yaml ...       # same file, several GPUs

Each training step is four stages, each a function that stands on its own:

    sample            G completions per prompt with HF generate        (minirl/rollout.py)
    score             verifiable reward per completion                 (minirl/rewards.py)
    forward_backward  group advantages -> clipped policy loss -> grads (minirl/update.py, formulas in loss.py)
    optim_step        clip grad norm, AdamW, LR schedule               (minirl/update.py)

Distributed training is data parallel (every process samples its own prompts; gradients are summed across
processes before `optim_step`), optionally with the policy sharded by FSDP (`--fsdp true`). Only this file
and minirl/distributed.py know there are several processes; the loss takes token counts, never a group.
Metrics go to <output_dir>/metrics.jsonl with veRL's names; the final model is saved in <output_dir>.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm import tqdm

from minirl import checkpoint
from minirl.cli import exit_on_user_error
from minirl.config import Config, ConfigError, parse_config
from minirl.data import load_rows, prompt_indices, prompt_text
from minirl.distributed import (all_reduce_max, all_reduce_min, all_reduce_sum, broadcast_parameters,
                                full_state_dict, gathered, is_sharded, shard, shutdown, sum_gradients_across_processes,
                                sum_over_processes, world_size)
from minirl.engines.vllm_engine import engine_for
from minirl.evaluate import evaluate
from minirl.critic import critic_forward_backward, critic_values, load_critic
from minirl.loss import gae, group_advantages, kl_penalty, outcome_token_rewards, whiten
from minirl.models import (adapter_disabled, autocast, build_policy, config_dtype, load_reference, load_tokenizer,
                           pick_attn_implementation, pick_dtype, resolve_model_path)
from minirl.logprobs import batched_logprobs
from minirl.judge import Judge
from minirl.rewards import is_code, load_reward_fn, overlong_penalty, score
from minirl.rollout import Rollout, concat_rollouts, sample, select_groups
from minirl.update import LossSettings, forward_backward, optim_step, warmup_constant_schedule


@torch.no_grad()
def custom_reward(cfg: Config):
    """--reward_fn's function (loaded once), or None for the built-in rewards."""
    return load_reward_fn(cfg.reward_fn) if cfg.reward_fn else None


def validate(model, tokenizer, rows: list[dict], cfg: Config, rank: int, world: int, judge=None) -> dict[str, float]:
    """Mean reward (accuracy for 0/1 rewards) on held-out rows, each process scoring its own share;
    returns val/test_score/<data_source>."""
    with gathered(model):
        records = evaluate(model, tokenizer, rows[rank::world], n=1 if cfg.val_greedy else cfg.group_size,
                           greedy=cfg.val_greedy, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                           judge=judge, code_style=cfg.code_reward_style, extraction=cfg.answer_extraction,
                           reward_fn=custom_reward(cfg))
    sources = sorted({r["data_source"] for r in rows})
    sums = torch.tensor([[sum(r["reward"] for r in records if r["data_source"] == s),
                          sum(1 for r in records if r["data_source"] == s)] for s in sources], dtype=torch.float64)
    sums = all_reduce_sum(sums.to(next(model.parameters()).device)).cpu()
    return {f"val/test_score/{s}": float(v / max(c, 1)) for s, (v, c) in zip(sources, sums.tolist())}


def sample_round(policy, tokenizer, rows: list[dict], cfg: Config, judge=None) -> tuple[Rollout, torch.Tensor, dict]:
    """Stages 1-2 once: G completions for each row, their rewards (N,), and the time each stage took."""
    G = cfg.group_size
    t0 = time.perf_counter()
    with gathered(policy):  # FSDP: full weights once per rollout, not per token
        generate = sample if cfg.rollout_engine == "hf" else engine_for(cfg).sample  # vLLM: minirl/engines
        rollout = generate(policy, tokenizer, [prompt_text(r, tokenizer) for r in rows], G, cfg.max_new_tokens,
                           cfg.temperature, cfg.top_p, cfg.top_k)
    t1 = time.perf_counter()
    rewards = torch.tensor(score(rollout.texts, [r for r in rows for _ in range(G)], judge, cfg.code_reward_style,
                                 cfg.answer_extraction, custom_reward(cfg)), dtype=torch.float32)
    if cfg.overlong_buffer:  # DAPO's soft overlong punishment
        rewards += torch.tensor(overlong_penalty(rollout.response_mask.sum(1).tolist(), cfg.max_new_tokens,
                                                 cfg.overlong_buffer, cfg.overlong_penalty))
    return rollout, rewards, {"timing_s/gen": t1 - t0, "timing_s/reward": time.perf_counter() - t1}


def sample_and_score(policy, tokenizer, train_rows: list[dict], cfg: Config, position: int, rank: int,
                     world: int, judge=None) -> tuple[Rollout, list[dict], torch.Tensor, int, dict[str, float]]:
    """Stages 1-2 for one step: B prompts from the stream, G completions each, their rewards.

    With DAPO's dynamic sampling, groups whose G rewards are all equal (no learning signal) are dropped and
    further prompts sampled, for at most max_sampling_rounds rounds, until every process has B groups. Every
    process runs the same number of rounds and trains the same number of groups (the most any process kept),
    because the update's collectives (gradient sums, FSDP's gathers) need as many passes everywhere: a process
    that kept fewer adds padding groups, copies with an empty response mask (no token, no loss, no gradient).
    Returns (rollout, rows, rewards (N,), new position in the prompt stream, metrics).
    """
    B, G = cfg.prompts_per_step, cfg.group_size

    def next_prompts(position: int) -> tuple[list[dict], int]:  # this process's slice; all processes advance
        rows = [train_rows[i] for i in prompt_indices(position + rank * B, B, len(train_rows), cfg.seed)]
        return rows, position + B * world

    rows, position = next_prompts(position)
    rollout, rewards, metrics = sample_round(policy, tokenizer, rows, cfg, judge)
    if not cfg.dynamic_sampling:
        return rollout, rows, rewards, position, metrics

    parts, kept_rows, kept_rewards, rounds = [], [], [], 1
    while True:
        keep = [g for g in range(B) if rewards[g * G:(g + 1) * G].std() > 0][:B - len(kept_rows)]
        parts.append(select_groups(rollout, keep))
        kept_rows += [rows[g] for g in keep]
        kept_rewards.append(rewards.view(B, G)[keep].reshape(-1))
        if all_reduce_min(len(kept_rows)) == B or rounds >= cfg.max_sampling_rounds:
            break
        rows, position = next_prompts(position)
        rollout, rewards, m = sample_round(policy, tokenizer, rows, cfg, judge)
        metrics = {k: metrics[k] + m[k] for k in metrics}
        rounds += 1
    kept = len(kept_rows)
    padding = max(int(all_reduce_max(kept)), 1) - kept
    if padding:
        filler = select_groups(rollout, [0] * padding)
        parts.append(replace(filler, response_mask=torch.zeros_like(filler.response_mask),
                             truncated=torch.zeros_like(filler.truncated)))
        kept_rows += [rows[0]] * padding
        kept_rewards.append(torch.zeros(padding * G))
    rollout, rewards = concat_rollouts(parts, tokenizer.pad_token_id), torch.cat(kept_rewards)
    metrics.update(sum_over_processes({"batch/groups": kept, "batch/groups_dropped": rounds * B - kept}))
    metrics["batch/sampling_rounds"] = rounds
    return rollout, kept_rows, rewards, position, metrics


def stats(name: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float() if x.numel() else torch.full((1,), float("nan"))
    return {f"{name}/mean": float(x.mean()), f"{name}/max": float(x.max()), f"{name}/min": float(x.min())}


def is_on_policy(cfg: Config) -> bool:
    """One optimizer step per rollout: the policy being trained is the one that sampled, so the old log-probs
    are the training pass's own (ratio = 1) and their separate forward pass can be skipped. (Not with KL in
    the reward, which needs them before the update.)"""
    return cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and not cfg.kl_in_reward


@torch.no_grad()
def prepare_batch(policy, ref_model, critic, rollout: Rollout, rewards: torch.Tensor, cfg: Config, device,
                  mbs: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, float]]:
    """What the update needs, from the trainer's own forward passes: log-probs of the sampling policy (and the
    reference's, and the critic's values), then advantages. Returns (batch, entropy (N, R) or None when
    on-policy, metrics)."""
    R, G = rollout.response_ids.shape[1], cfg.group_size
    mask = rollout.response_mask.clone()
    if cfg.mask_truncated:  # DAPO overlong filtering: truncated answers teach nothing either way
        mask[rollout.truncated] = 0
    batch = {"input_ids": rollout.input_ids.to(device), "attention_mask": rollout.attention_mask.to(device),
             "response_mask": mask.to(device)}
    ids, attn, T = batch["input_ids"], batch["attention_mask"], cfg.temperature
    entropy = None
    if not is_on_policy(cfg):  # on-policy, forward_backward takes old_logp = logp.detach() (and the entropy)
        batch["old_logp"], entropy = batched_logprobs(policy, ids, attn, R, mbs, T, with_entropy=True)  # (N, R)
    metrics, rewards = {}, rewards.to(device)
    if cfg.kl_coef > 0:
        with adapter_disabled(policy) if ref_model is None else torch.no_grad():
            batch["ref_logp"], _ = batched_logprobs(ref_model or policy, ids, attn, R, mbs, T)
    kl = kl_penalty(batch["old_logp"], batch["ref_logp"], cfg.kl_estimator) * batch["response_mask"] \
        if cfg.kl_in_reward else None                                                            # (N, R)
    if cfg.algorithm == "grpo":
        if kl is not None:  # verl's use_kl_in_reward: the sequence's reward is its score minus beta * sum_t KL_t
            rewards = rewards - cfg.kl_coef * kl.sum(1)
            total = all_reduce_sum(torch.stack([kl.sum(), batch["response_mask"].sum().float()]))
            metrics["actor/reward_kl_penalty"] = float(total[0] / total[1].clamp(min=1))  # per token, all processes
        batch["advantages"] = group_advantages(rewards, G, cfg.adv_estimator, cfg.adv_std, cfg.adv_eps)  # (N,)
    else:  # PPO: GAE on the critic's values, whitened over the whole step (all processes), as one process would
        batch["old_values"] = critic_values(critic, ids, attn, R, mbs)
        token_rewards = outcome_token_rewards(rewards, batch["response_mask"], kl, cfg.kl_coef)
        adv, batch["returns"] = gae(token_rewards, batch["old_values"], batch["response_mask"], cfg.gae_gamma,
                                    cfg.gae_lambda)                                              # (N, R)
        batch["advantages"] = whiten(adv, batch["response_mask"], total=all_reduce_sum) * batch["response_mask"]
    return batch, entropy, metrics


def update(policy, critic, optimizer, scheduler, critic_optimizer, batch: dict[str, torch.Tensor], cfg: Config,
           loss_settings: LossSettings, mbs: int, dtype: torch.dtype) -> dict[str, float]:
    """Stages 3-4 over mini-batches of whole groups, for ppo_epochs passes. Returns step metrics: losses summed
    over processes (each process holds its share of the step's total), averaged over optimizer steps.

    Autocast is entered around each forward_backward and never around an optimizer step: autocast caches the
    bf16 copy of each weight until its context exits, so a later mini-batch would otherwise run on stale weights."""
    N, device, world = batch["input_ids"].shape[0], batch["input_ids"].device, world_size()
    mini = max(N // cfg.mini_batches, cfg.group_size)
    actor, critic_rows = [], []
    for _ in range(cfg.ppo_epochs):
        for s in range(0, N, mini):
            mb = {k: v[s:s + mini] for k, v in batch.items()}
            counts = all_reduce_sum(torch.tensor([float(mb["response_mask"].sum()), float(len(mb["input_ids"]))],
                                                 device=device))
            num_tokens, num_seqs = max(float(counts[0]), 1.0), float(counts[1])
            lr = optimizer.param_groups[0]["lr"]  # the rate this optimizer step uses
            # FSDP averages gradients over processes; the loss wants their sum (see distributed.py)
            with autocast(device, dtype):
                row = sum_over_processes(forward_backward(policy, mb, loss_settings, mbs, num_tokens, num_seqs,
                                                          loss_scale=world if is_sharded(policy) else 1.0))
            sum_gradients_across_processes(policy)
            actor.append({**row, "grad_norm": optim_step(policy, optimizer, scheduler, cfg.max_grad_norm), "lr": lr})
            if critic is not None:
                with autocast(device, dtype):
                    row = sum_over_processes(critic_forward_backward(critic, mb, mbs, num_tokens, cfg.value_clip))
                sum_gradients_across_processes(critic)
                critic_rows.append({**row, "grad_norm": optim_step(critic, critic_optimizer, None, cfg.max_grad_norm)})

    def mean(rows: list[dict], prefix: str) -> dict[str, float]:
        return {f"{prefix}/{k}": sum(r[k] for r in rows) / len(rows) for k in rows[0]} if rows else {}
    return {**mean(actor, "actor"), "actor/lr": actor[-1]["lr"], **mean(critic_rows, "critic")}


def main(argv: list[str] | None = None) -> dict[str, float]:
    cfg = parse_config(argv)
    custom_reward(cfg)  # a missing --reward_fn file or function fails here, before any model is loaded
    trackers = [t.strip() for t in cfg.report_to.split(",") if t.strip()]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        # under torchrun on CPU, accelerate otherwise runs every process as an independent world of one
        os.environ.setdefault("ACCELERATE_USE_CPU", "1")
    accelerator = Accelerator(log_with=trackers or None, project_dir=cfg.output_dir)
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    out_dir = Path(cfg.output_dir)
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        # not config.json: that name belongs to the model that save_pretrained writes here
        (out_dir / "run_config.json").write_text(json.dumps(vars(cfg), indent=2))

    # --- policy, reference, data ----------------------------------------------------------------------
    with accelerator.main_process_first():  # the first process builds the toy model if needed
        path = resolve_model_path(cfg.model_name_or_path)
    # precision (models.build_policy says why): fp32 trained weights, compute in `dtype`, saved in the config's
    dtype, attn = pick_dtype(cfg.dtype, device), pick_attn_implementation(cfg.attn_implementation)
    save_dtype = config_dtype(path) if cfg.save_dtype == "auto" else getattr(torch, cfg.save_dtype)
    tokenizer = load_tokenizer(path)
    lora = dict(rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                target_modules=cfg.lora_target_modules) if cfg.lora_rank > 0 else None
    policy = build_policy(path, device, dtype, attn, lora, cfg.gradient_checkpointing, cfg.load_in_bits, cfg.seed)
    if lora:
        broadcast_parameters(p for p in policy.parameters() if p.requires_grad)  # the same adapter everywhere
    if cfg.fsdp and world > 1:
        shard(policy, dtype)  # before the optimizer exists: it must hold the sharded parameters
    elif cfg.fsdp:
        accelerator.print("fsdp: one process, nothing to shard")
    policy.train()
    torch.manual_seed(cfg.seed * 1000 + rank)  # from here on, different samples on each process
    # the KL reference: a frozen copy, or with LoRA the policy with its adapter switched off (no second copy)
    ref_model = load_reference(path, dtype, attn, device) if cfg.kl_coef > 0 and cfg.lora_rank == 0 else None
    critic = None
    if cfg.algorithm == "ppo":
        critic = load_critic(resolve_model_path(cfg.critic_model_path) if cfg.critic_model_path else path,
                             torch.float32, attn, cfg.gradient_checkpointing, device)
        critic.train()

    train_rows = load_rows(cfg.train_files, split="train")
    n_rows = len(train_rows)
    train_rows = [r for r in train_rows
                  if len(tokenizer(prompt_text(r, tokenizer), add_special_tokens=False).input_ids) <= cfg.max_prompt_length]
    if len(train_rows) < n_rows:
        accelerator.print(f"dropped {n_rows - len(train_rows)} of {n_rows} prompts longer than "
                          f"max_prompt_length={cfg.max_prompt_length}")
    if not train_rows:
        raise ConfigError(f"config key 'max_prompt_length': no training prompt fits in {cfg.max_prompt_length} "
                          "tokens; raise it")
    val_rows = load_rows(cfg.val_files, split="test", limit=cfg.val_max_samples) if cfg.val_files else []
    # one sandboxed judge pool for the whole run, only when there are code problems
    judge = Judge(cfg.judge_workers or None) if any(is_code(r) for r in train_rows + val_rows) \
        and not cfg.reward_fn else None

    trainable = [p for p in policy.parameters() if p.requires_grad]  # with LoRA: the adapter only
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  betas=(cfg.adam_beta1, cfg.adam_beta2))
    scheduler = warmup_constant_schedule(optimizer, cfg.warmup_steps * cfg.ppo_epochs * cfg.mini_batches)
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, weight_decay=cfg.weight_decay,
                                         betas=(cfg.adam_beta1, cfg.adam_beta2)) if critic is not None else None
    loss_settings = LossSettings.from_config(cfg)

    if trackers:  # metrics.jsonl is always written; these are extra (accelerate checks they are installed)
        accelerator.init_trackers("minirl", config={k: v for k, v in vars(cfg).items()})
    start_step, position = checkpoint.resume(accelerator, cfg, policy, optimizer, scheduler, critic, critic_optimizer)
    if start_step == 0:
        if accelerator.is_main_process:
            (out_dir / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run starts a fresh log
        with autocast(device, dtype):
            before = validate(policy, tokenizer, val_rows, cfg, rank, world, judge) if val_rows else {}
        if accelerator.is_main_process and before:
            with (out_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"training/global_step": 0, **before}) + "\n")
    else:  # the validation before training is row 0 of the log
        first = json.loads((out_dir / "metrics.jsonl").open().readline() or "{}")
        before = {k: v for k, v in first.items() if k.startswith("val/")}
    accelerator.print(f"held-out accuracy before RL: {before}")

    # --- the training loop ----------------------------------------------------------------------------
    metrics_file = out_dir / "metrics.jsonl"
    # position: prompts consumed so far, all processes together
    bar = tqdm(range(start_step, cfg.max_steps), desc="train", initial=start_step, total=cfg.max_steps,
               disable=not accelerator.is_main_process, dynamic_ncols=True)
    for step in bar:
        t_step = time.perf_counter()
        # 1-2. sample G completions per prompt, score them
        with autocast(device, dtype):
            rollout, rows, rewards, position, m = sample_and_score(policy, tokenizer, train_rows, cfg, position,
                                                                   rank, world, judge)
        t0 = time.perf_counter()
        # micro-batch size: from a token budget over the widest process's batch, so all run as many passes
        width = all_reduce_max(rollout.input_ids.shape[1])
        mbs = max(1, int(cfg.micro_batch_tokens // width)) if cfg.micro_batch_tokens else cfg.micro_batch_size
        # log-probs of the sampling policy (and reference, and values), advantages
        with autocast(device, dtype):
            batch, entropy, m_batch = prepare_batch(policy, ref_model, critic, rollout, rewards, cfg, device, mbs)
        m["timing_s/old_log_prob"] = time.perf_counter() - t0  # old (unless on-policy) and ref log-probs
        # 3-4. forward_backward + optim_step, over mini-batches of whole groups
        m.update(m_batch)
        m.update(update(policy, critic, optimizer, scheduler, critic_optimizer, batch, cfg, loss_settings, mbs, dtype))
        m["timing_s/update"] = time.perf_counter() - t0

        # --- metrics (veRL names) ---------------------------------------------------------------------
        lengths = rollout.response_mask.sum(dim=1)  # 0 only for dynamic sampling's padding groups
        adv_seq = batch["advantages"] if batch["advantages"].dim() == 1 else \
            (batch["advantages"] * batch["response_mask"]).sum(1) / batch["response_mask"].sum(1).clamp(min=1)
        gathered_rows = accelerator.gather((rewards.to(device), adv_seq, lengths.to(device).float(),
                                            rollout.truncated.to(device).float()))
        g_rewards, g_adv, g_len, g_trunc = (x[gathered_rows[2] > 0] for x in gathered_rows)
        m.update({"training/global_step": step + 1, **stats("critic/reward", g_rewards),
                  **stats("critic/advantages", g_adv), **stats("response_length", g_len),
                  "response_length/clip_ratio": float(g_trunc.mean()) if g_trunc.numel() else float("nan")})
        if entropy is not None:  # else the on-policy update reported it (same policy, same tokens)
            ent = all_reduce_sum(torch.stack([(entropy * batch["response_mask"]).sum(),
                                              batch["response_mask"].sum().float()]))
            m["actor/entropy"] = float(ent[0] / ent[1].clamp(min=1))  # of the sampling policy, per response token
        if val_rows and (step + 1 == cfg.max_steps or (cfg.val_every and (step + 1) % cfg.val_every == 0)):
            with autocast(device, dtype):
                m.update(validate(policy, tokenizer, val_rows, cfg, rank, world, judge))
        m["timing_s/step"] = time.perf_counter() - t_step
        if device.type == "cuda":  # verl's perf/ names; this process's peak since the start
            m["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        if accelerator.is_main_process:
            with metrics_file.open("a") as f:
                f.write(json.dumps(m) + "\n")
            if trackers:
                accelerator.log(m, step=step + 1)
            bar.set_postfix(reward=f"{m['critic/reward/mean']:.3f}", len=f"{m['response_length/mean']:.1f}")
        if not math.isfinite(m["actor/pg_loss"]):
            raise FloatingPointError(f"non-finite loss at step {step + 1}; see {metrics_file}")
        if (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.max_steps:
            checkpoint.save(accelerator, cfg, step + 1, position, policy, optimizer, scheduler, critic,
                            critic_optimizer)

    # --- after training -------------------------------------------------------------------------------
    after = {k: v for k, v in m.items() if k.startswith("val/")} if cfg.max_steps else {}
    accelerator.print(f"held-out accuracy after RL:  {after}")
    accelerator.wait_for_everyone()
    model_state = full_state_dict(policy)  # FSDP: gathered on every process (collective), saved by the first
    if accelerator.is_main_process:
        # with LoRA: the adapter (eval.py loads it); else the full model, in the dtype of its config
        checkpoint.save_model(policy, out_dir, save_dtype, model_state)
        tokenizer.save_pretrained(out_dir)
        if cfg.lora_rank > 0 and cfg.save_merged:  # a plain model that AutoModelForCausalLM loads
            checkpoint.save_merged(policy, path, out_dir / "merged", save_dtype)
            tokenizer.save_pretrained(out_dir / "merged")
        summary = {"before": before, "after": after, "steps": cfg.max_steps}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"saved the policy and tokenizer to {out_dir}")
    if judge is not None:
        judge.close()
    shutdown()  # every process leaves the process group together (see distributed.shutdown)
    accelerator.end_training()
    return {"before": before, "after": after, "policy": policy}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_on_user_error(main)

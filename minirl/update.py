"""The update stages of a training step: `compute_advantages`, `mini_batches`, `forward_backward` (loss,
gradients) and `optim_step`.

Each stands on its own (a model, tensors and numbers; no trainer object, no process group), so a user's own
loop can call them in any order, e.g. several forward_backward calls before one optim_step.

`forward_backward` walks one optimizer step's sequences in micro-batches. Each micro-batch's loss is
normalised by counts of the *whole step* (`num_tokens`, `num_seqs`), so summing the gradients of the
micro-batches gives exactly the gradient of the full batch, whatever the micro-batch size.

Shapes: N sequences in the step, P prompt tokens, R response tokens.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minirl.loss import (aggregate, gae, group_advantages, kl_penalty, outcome_token_rewards, policy_loss,
                         rollout_is_weights, sampler_mismatch, whiten)
from minirl.logprobs import token_logprobs


@dataclass
class LossSettings:
    """The loss's knobs, taken from the config (see minirl/config.py for their meaning)."""
    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    dual_clip: float | None = None
    max_new_tokens: int | None = None  # Dr. GRPO's constant normaliser (seq-mean-token-sum-norm)
    temperature: float = 1.0           # the rollouts' sampling temperature: log-probs are those of pi_T
    rollout_is_cap: float = 0.0        # > 0: truncated IS weights min(pi_old / pi_sampler, cap) on the loss

    @classmethod
    def from_config(cls, cfg) -> "LossSettings":
        kl_loss_coef = 0.0 if cfg.kl_in_reward else cfg.kl_coef  # the KL goes in one place, not both
        return cls(cfg.policy_loss, cfg.clip_low, cfg.clip_high, cfg.loss_agg_mode, kl_loss_coef,
                   cfg.kl_estimator, cfg.dual_clip or None, cfg.max_new_tokens, cfg.temperature,
                   rollout_is_cap=cfg.rollout_is_cap)


@torch.no_grad()
def compute_advantages(cfg, rewards: torch.Tensor, batch: dict[str, torch.Tensor],
                       total: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
                       ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """Advantages from the step's rewards (N,): (advantages (N,) GRPO or (N, R) PPO, returns (N, R) or None,
    metrics). batch: response_mask (N, R), and old_logp/ref_logp (N, R) with kl_in_reward, old_values (N, R)
    for PPO. `total` sums a tensor over the whole step when it is split across processes
    (distributed.global_sum), so PPO's whitening and the KL metric are the whole batch's.

    GRPO: group_advantages of the rewards (minus kl_coef * each sequence's summed KL with kl_in_reward, verl's
    use_kl_in_reward); a NaN reward (a judge error) is left out of its group and gets advantage 0. PPO: the
    outcome reward on the last token (minus the per-token KL), GAE on the critic's values, whitened over the
    step's tokens (loss.py holds each formula)."""
    mask = batch["response_mask"]
    kl = kl_penalty(batch["old_logp"], batch["ref_logp"], cfg.kl_estimator) * mask if cfg.kl_in_reward else None
    metrics = {}
    if kl is not None:
        kl_total = total(torch.stack([kl.sum(), mask.sum().float()]))
        metrics["actor/reward_kl_penalty"] = float(kl_total[0] / kl_total[1].clamp(min=1))  # per token
    rewards = rewards.to(mask.device)
    if cfg.algorithm == "grpo":
        if kl is not None:
            rewards = rewards - cfg.kl_coef * kl.sum(1)
        adv = group_advantages(rewards, cfg.group_size, cfg.adv_estimator, cfg.adv_std, cfg.adv_eps)  # (N,)
        return adv, None, metrics
    rewards = torch.nan_to_num(rewards)  # a judge error's NaN: its sample has no loss (sampling.train_batch)
    token_rewards = outcome_token_rewards(rewards, mask, kl, cfg.kl_coef)                       # (N, R)
    adv, returns = gae(token_rewards, batch["old_values"], mask, cfg.gae_gamma, cfg.gae_lambda)  # (N, R)
    return whiten(adv, mask, total=total) * mask, returns, metrics


def mini_batches(batch: dict[str, torch.Tensor], count: int, group_size: int) -> list[dict[str, torch.Tensor]]:
    """One optimizer step's share of the batch each: `count` contiguous slices of whole groups (the rows of a
    group are adjacent), as equal as whole groups allow (dynamic sampling may keep any number of groups), at
    least one group each (fewer slices when there are fewer groups than `count`)."""
    groups = batch["input_ids"].shape[0] // group_size
    count = max(1, min(count, groups))
    ends = [group_size * (groups * (i + 1) // count) for i in range(count)]   # group boundaries, in rows
    ends[-1] = batch["input_ids"].shape[0]                                      # every row, whatever N is
    return [{k: v[s:e] for k, v in batch.items()} for s, e in zip([0] + ends[:-1], ends)]


def forward_backward(model, batch: dict[str, torch.Tensor], loss: LossSettings, micro_batch_size: int | list[range],
                     num_tokens: float, num_seqs: float,
                     backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
                     packed: bool = False) -> dict[str, float]:
    """Accumulate the policy gradient of one optimizer step into `model`'s .grad.

    batch: input_ids (N, P+R), attention_mask (N, P+R), response_mask (N, R), old_logp (N, R),
           advantages (N,) or (N, R), and ref_logp (N, R) when loss.kl_coef > 0.
           Without old_logp the batch is on-policy (one epoch, one mini-batch: the policy that sampled it is
           the one being trained): old_logp = logp.detach(), so ratio = 1 and the loss and gradients are
           those of an exact old-logp pass, which is skipped (TRL does the same); the entropy metric then
           comes from this pass and is returned as "entropy".
           With sampler_logp (N, R), the engine's own log-probs of the sampled tokens (rollout.Rollout), the
           sampler-vs-trainer mismatch is measured against old_logp (`rollout_corr/` metrics, loss.sampler_mismatch)
           and, with loss.rollout_is_cap > 0, each token's loss is weighted by loss.rollout_is_weights.
    micro_batch_size: rows per micro-batch, or each micro-batch's rows (contiguous ranges covering the batch in
           order: packing.split_rows, micro-batches sized by their real tokens).
    num_tokens / num_seqs: response tokens / sequences in the whole step (all processes), so that summing
           the gradients of every micro-batch and process gives the batch's.
    packed: each micro-batch's rows run packed, without padding (minirl/packing.py; config pack_sequences).
    Returns metrics (verl names, without the "actor/" prefix): this process's share of each step total,
    normalised by the step's counts, so that summing them over processes gives the step's value. (The
    entropy metric comes from the old-logp pass, or on-policy from this one, computed chunk by chunk without a
    graph, so no (tokens, V) tensor stays alive.)
    """
    R = batch["response_mask"].shape[1]
    N = batch["input_ids"].shape[0]
    on_policy = "old_logp" not in batch
    sums = {"pg_loss": 0.0, "kl_loss": 0.0, "pg_clipfrac": 0.0, "ppo_kl": 0.0}
    if on_policy:
        sums["entropy"] = 0.0
    corrected = "sampler_logp" in batch    # the keys are verl's; "_max" ones are maxima (train.mini_batch_steps)
    if corrected:
        sums.update({"rollout_corr/kl": 0.0, "rollout_corr/k3_kl": 0.0, "rollout_corr/abs_logp_diff_max": 0.0})
    if corrected and loss.rollout_is_cap > 0:
        sums.update({"rollout_corr/rollout_is_mean": 0.0, "rollout_corr/rollout_is_ratio_fraction_high": 0.0})
    elif loss.rollout_is_cap > 0:
        raise ValueError("config key 'rollout_is_cap' needs the sampler's log-probs, which this rollout engine "
                         "does not return (the vLLM engine); set it to 0")
    ranges = micro_batch_size if isinstance(micro_batch_size, list) else \
        [range(s, min(s + micro_batch_size, N)) for s in range(0, N, micro_batch_size)]
    for rows in ranges:
        mb = {k: v[rows.start:rows.stop] for k, v in batch.items()}
        mask = mb["response_mask"]
        logp, entropy = token_logprobs(model, mb["input_ids"], mb["attention_mask"], R, loss.temperature,
                                       with_entropy=on_policy, packed=packed)                        # (n, R)
        old_logp = logp.detach() if on_policy else mb["old_logp"]
        share = float(mask.sum()) / max(num_tokens, 1.0)  # this micro-batch's share of the step's tokens
        weights = None
        if corrected:  # the sampler's log-probs against the trainer's pi_old, which the loss assumes
            # a token whose sampler log-prob is unknown (NaN: generate split the rows by the context) is left out
            # of the metrics and gets weight 1, on every process alike
            known = torch.isfinite(mb["sampler_logp"])
            sampler_logp = torch.where(known, mb["sampler_logp"], old_logp)
            for k, v in sampler_mismatch(old_logp, sampler_logp, mask * known).items():
                key = f"rollout_corr/{k}"
                sums[key] = max(sums[key], float(v)) if k.endswith("_max") else sums[key] + float(v) * share
            if loss.rollout_is_cap > 0:
                weights = rollout_is_weights(old_logp, sampler_logp, loss.rollout_is_cap)   # (n, R)
                raw = torch.exp((old_logp - sampler_logp).clamp(-20, 20))
                sums["rollout_corr/rollout_is_mean"] += float((weights * mask).sum()) / max(num_tokens, 1.0)
                sums["rollout_corr/rollout_is_ratio_fraction_high"] += \
                    float(((raw > loss.rollout_is_cap) * mask).sum()) / max(num_tokens, 1.0)
        pg_loss, metrics = policy_loss(logp, old_logp, mb["advantages"], mask, kind=loss.policy_loss,
                                       clip_low=loss.clip_low, clip_high=loss.clip_high, agg=loss.loss_agg_mode,
                                       dual_clip=loss.dual_clip, max_len=loss.max_new_tokens,
                                       num_tokens=num_tokens, num_seqs=num_seqs, is_weights=weights)
        total = pg_loss
        if loss.kl_coef > 0:
            kl = kl_penalty(logp, mb["ref_logp"], loss.kl_estimator)
            kl_loss = aggregate(kl, mask, loss.loss_agg_mode, max_len=loss.max_new_tokens,
                                num_tokens=num_tokens, num_seqs=num_seqs)
            total = total + loss.kl_coef * kl_loss
            sums["kl_loss"] += float(kl_loss.detach())
        backward(total)
        sums["pg_loss"] += float(pg_loss.detach())
        sums["pg_clipfrac"] += float(metrics["pg_clipfrac"]) * share
        sums["ppo_kl"] += float(metrics["ppo_kl"]) * share
        if on_policy:
            sums["entropy"] += float((entropy * mask).sum()) / max(num_tokens, 1.0)
    return sums


def optim_step(model, optimizer: torch.optim.Optimizer, scheduler=None, max_grad_norm: float = 1.0) -> float:
    """Clip the global gradient norm, step the optimizer and the LR schedule, clear gradients.

    Returns the pre-clipping gradient norm. A non-finite norm (an fp16/bf16 overflow, a NaN reward) skips
    the update instead of writing NaNs into the weights.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    limit = max_grad_norm if max_grad_norm > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, limit) if params else torch.zeros(())
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # DTensor under FSDP
    if torch.isfinite(torch.tensor(grad_norm)):
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def warmup_constant_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int):
    """Linear warm-up from 0 over the first `warmup_steps` scheduler.step() calls, then constant (verl's default;
    train.py steps it once per training step, as verl does, however many optimizer steps that one takes)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0)

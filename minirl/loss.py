"""Every RL formula in minirl: advantage estimators, KL estimators, loss aggregation, GAE and policy losses.

One small function per idea, chosen by a string from the config (as in verl's core_algos.py). Nothing here
knows about processes, devices or models: tensors in, tensors out. The trainer passes the token and sequence
counts of the whole optimizer step (`num_tokens`, `num_seqs`, over every process) so that the loss does not
change with micro-batching, gradient accumulation or the number of processes: each process's loss is its share
of the step's, and the gradients are summed over processes (train.py, the recipes on the sessions API alike).

Shapes: N sequences (N = B*G: B prompts, G samples each), T response tokens; `mask` is 1 on real response
tokens and 0 on padding. All per-token tensors are (N, T).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
             "seq-sum-token-sum-norm")


# --- advantages (outcome rewards, one scalar per sequence) -------------------------------------------------

def group_advantages(rewards: torch.Tensor, group_size: int, estimator: str = "grpo", std: str = "unbiased",
                     eps: float = 1e-6) -> torch.Tensor:
    """Per-sequence advantages from rewards of G samples per prompt, laid out group by group.  (N,) -> (N,)

    - "grpo" (Shao et al. 2024, DeepSeekMath):  A_i = (r_i - mean_g) / (std_g + eps).
      std "unbiased" (Bessel, /(G-1)) is torch.std's default, used by verl (+ 1e-6) and TRL (+ 1e-4);
      "population" (/G) is offered for comparison with papers that use it.
    - "dr_grpo" (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_g, no std division,
      which removes the bias towards groups with low reward variance (too easy / too hard prompts).
    - "rloo" (Ahmadian et al. 2024): A_i = r_i - mean of the other G-1 rewards = G/(G-1) * (r_i - mean_g).

    Example: rewards [1, 0, 0, 1], G=4: grpo -> [0.866, -0.866, -0.866, 0.866]; dr_grpo -> ±0.5; rloo -> ±0.667.
    A group whose rewards are all equal gets advantage 0 under every estimator (no learning signal).

    A NaN reward is no reward (a program the judge could not judge, rewards.JUDGE_ERROR): that sample gets
    advantage 0 and its group's statistics are those of the others, as if it had not been sampled (G is then
    the group's count of rewards). [1, 0, NaN, NaN] under grpo: [0.707, -0.707, 0, 0].
    """
    r = rewards.float().view(-1, group_size)                               # (B, G)
    valid = ~torch.isnan(r)
    n = valid.sum(dim=1, keepdim=True).float()                             # (B, 1) rewards per group
    r = torch.where(valid, r, torch.zeros_like(r))
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = torch.where(valid, r - mean, torch.zeros_like(r))
    if estimator == "grpo":
        dof = n - 1 if std == "unbiased" else n                            # Bessel's correction, as torch.std
        s = (centred.square().sum(dim=1, keepdim=True) / dof.clamp(min=1)).sqrt()
        adv = centred / (torch.where(n > 1, s, torch.zeros_like(s)) + eps)
    elif estimator == "dr_grpo":
        adv = centred
    elif estimator == "rloo":
        adv = centred * n / (n - 1).clamp(min=1)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}; use grpo, dr_grpo or rloo")
    return adv.view(-1)


def outcome_token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                          kl_coef: float = 0.0) -> torch.Tensor:
    """Token-level rewards for PPO: the sequence's score on its last real token, minus kl_coef * KL on every
    token when the KL is folded into the reward (InstructGPT / verl `use_kl_in_reward`).  (N,), (N, T) -> (N, T)"""
    m = mask.float()
    last = (m.cumsum(-1) == m.sum(-1, keepdim=True)) & (m > 0)            # the final response token
    rewards = last.float() * scores.float()[:, None]
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float() * m
    return rewards


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
           total: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> torch.Tensor:
    """Normalise x over its masked entries to mean 0 (unless shift_mean=False) and unit (unbiased) variance.

    `total` sums a tensor over the whole batch when the batch is split across processes (the trainer passes
    distributed.global_sum), so the statistics are the global batch's, as with one process."""
    s = total(torch.stack([(x * mask).sum(), mask.sum().to(x.dtype)]))
    n = s[1].clamp(min=1)  # no token at all (e.g. every response masked): everything is 0
    mean = s[0] / n
    var = total((((x - mean) * mask) ** 2).sum()) / (n - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016), right to left over each response.

        delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},   returns = A + V

    Masked (padding) tokens are skipped: they neither receive nor pass on value. Returns (advantages, returns),
    both (N, T) and 0 where mask is 0.
    """
    N, T = token_rewards.shape
    adv = torch.zeros_like(token_rewards, dtype=torch.float32)
    next_value = torch.zeros(N, dtype=torch.float32, device=values.device)
    next_adv = torch.zeros_like(next_value)
    m = mask.float()
    for t in reversed(range(T)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = a * m[:, t]
        # padding keeps the running values of the next real token
        next_value = torch.where(m[:, t] > 0, values[:, t].float(), next_value)
        next_adv = torch.where(m[:, t] > 0, a, next_adv)
    returns = (adv + values) * m
    return adv, returns


# --- KL to the reference policy ------------------------------------------------------------------------------

def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimator of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence").

    x = logp - ref_logp.  k1: x (unbiased, high variance, can be negative);  k2: x^2 / 2 (biased, low variance);
    k3: exp(-x) + x - 1 (unbiased, always >= 0; used by GRPO).  logp=-1.0, ref=-1.5: k1 0.5, k2 0.125, k3 0.1065.
    """
    x = logp - ref_logp
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x.square()
    if kind == "k3":
        x = x.clamp(-20, 20)  # exp(-x) overflows for extreme ratios; verl clamps the same way
        return torch.exp(-x) + x - 1
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2 or k3")


# --- the sampler's distribution against the trainer's ---------------------------------------------------------

def rollout_is_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights (N, T) for tokens an engine sampled from pi_sampler (bf16, other
    kernels) while the loss assumes pi_old, the trainer's: w = min(pi_old / pi_sampler, cap), no gradient. The
    policy loss of each token is multiplied by w (Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training"; verl's token-level `rollout_is` with `rollout_is_threshold`,
    verl/trainer/ppo/rollout_corr_helper.py, applied as `pg_losses * rollout_is_weights` in core_algos.py).
    Equal distributions give 1. Example: pi_old 0.5, pi_sampler 0.2, cap 2: 2.5 -> 2.0; 0.2 vs 0.5: 0.4."""
    return torch.exp((old_logp - sampler_logp).clamp(-20, 20)).clamp(max=cap).detach()


def sampler_mismatch(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """How far the sampler's log-probs are from the trainer's on the sampled tokens, verl's `rollout_corr/`
    names: kl = mean(sampler_logp - old_logp), k3_kl = mean(r - log r - 1) with r = pi_old / pi_sampler (both
    estimate KL(pi_sampler || pi_old) from the sampler's own samples), abs_logp_diff_max = max |difference|.
    All 0 when the two agree; fp32 engines agree up to float rounding (~1e-6)."""
    m = mask.to(old_logp.dtype)
    diff = (sampler_logp - old_logp) * m
    return {"kl": masked_mean(diff, m), "k3_kl": masked_mean(kl_penalty(sampler_logp, old_logp, "k3") * m, m),
            "abs_logp_diff_max": diff.abs().max() if diff.numel() else diff.new_zeros(())}


# --- aggregation ---------------------------------------------------------------------------------------------

def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", max_len: int | None = None,
              num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss (N, T) to a scalar.

    - "token-mean": sum over all tokens / number of tokens (DAPO's token-level loss; long answers weigh more).
    - "seq-mean-token-mean": mean over sequences of each sequence's token mean (the original GRPO).
    - "seq-mean-token-sum": mean over sequences of each sequence's token sum.
    - "seq-mean-token-sum-norm": Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3 and its
      code, understand-r1-zero): each sequence's token sum divided by a constant, max_len (the generation
      budget), then the mean over the step's sequences: (1/N) sum_i sum_t loss_it / max_len. The paper drops
      GRPO's 1/|o_i| and keeps the 1/G average, so the scale does not depend on the batch size or the number
      of processes.
    - "seq-sum-token-sum-norm": verl's "seq-mean-token-sum-norm" (verl/trainer/ppo/core_algos.py, agg_loss, at
      b178a3c: `torch.sum(seq_losses) / loss_scale_factor`): the same token sums over max_len, *summed* over
      sequences. Its scale grows with the batch (4x the rows, 4x the gradient); kept for comparison with verl.

    For gradient accumulation the normaliser must be that of the whole optimizer step, not of this micro-batch:
    pass `num_tokens` (token-mean) or `num_seqs` (seq-mean-*) counted over the step, across all processes.
    Example, [[1,2,3,.],[4,.,.,.]] with max_len 4: 2.5, 3.0, 5.0, 1.25, 2.5.
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        return (loss * mask).sum() / max(float(denom), 1.0)
    seq_sum = (loss * mask).sum(dim=-1)                                    # (N,)
    norm = float(max_len if max_len is not None else loss.shape[-1])       # Dr. GRPO's constant
    if mode == "seq-sum-token-sum-norm":
        return seq_sum.sum() / norm
    denom = float((mask.sum(-1) > 0).sum()) if num_seqs is None else num_seqs  # rows without a token: none
    if mode == "seq-mean-token-sum-norm":
        return (seq_sum / norm).sum() / max(float(denom), 1.0)
    if mode == "seq-mean-token-mean":
        return (seq_sum / mask.sum(dim=-1).clamp(min=1)).sum() / max(float(denom), 1.0)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / max(float(denom), 1.0)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; use one of {AGG_MODES}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


# --- policy losses -------------------------------------------------------------------------------------------

def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                kind: str = "ppo", clip_low: float = 0.2, clip_high: float = 0.2, agg: str = "token-mean",
                dual_clip: float | None = None, max_len: int | None = None, num_tokens: float | None = None,
                num_seqs: float | None = None, is_weights: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient loss from per-token log-probs under the current (logp) and sampling (old_logp) policy.

    advantages may be (N,) (one per sequence, broadcast to its tokens) or (N, T). ratio = exp(logp - old_logp).
    - "ppo" (Schulman et al. 2017): max(-A * ratio, -A * clip(ratio, 1-clip_low, 1+clip_high)); separate low
      and high epsilons give DAPO's clip-higher. With dual_clip=c > 1 (Ye et al. 2020), losses for A < 0 are
      capped at -A * c, so a huge ratio on a bad token cannot blow up the step.
    - "cispo" (MiniMax-M1, 2025): -sg(clip(ratio, 1-clip_low, 1+clip_high)) * A * logp. The clipped ratio is a
      constant weight, so every token keeps a gradient (PPO's clip zeroes it). ratio 1.5 -> 1.28 with (0.2, 0.28).
    - "importance_sampling": -ratio * A, the unclipped REINFORCE-with-importance-weights surrogate.
    - "cross_entropy": -A * logp, the weighted negative log-likelihood (old_logp unused): SFT with A = 1 and the
      weights in `mask`; with A = -dL/dlogp it is the linear surrogate whose gradient is that of any loss L of
      the log-probs (the sessions API's forward_backward_custom, minirl/sessions/client.py).
    `is_weights` (N, T), if given, multiply each token's loss (rollout_is_weights: the sampler's correction).
    Returns (scalar loss aggregated by `aggregate`, metrics: pg_clipfrac, ppo_kl (mean old_logp - logp)).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    log_ratio = (logp - old_logp).clamp(-20, 20)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)
    mask_f = mask.to(logp.dtype)
    if kind == "ppo":
        unclipped, clipped = -advantages * ratio, -advantages * clipped_ratio
        per_token = torch.maximum(unclipped, clipped)
        clipfrac = masked_mean((clipped > unclipped).float(), mask_f)
        if dual_clip is not None:
            capped = torch.minimum(per_token, -advantages * dual_clip)
            per_token = torch.where(advantages < 0, capped, per_token)
    elif kind == "cispo":
        per_token = -cispo_weight(ratio, clip_low, clip_high) * advantages * logp
        clipfrac = masked_mean((clipped_ratio != ratio).float(), mask_f)
    elif kind == "importance_sampling":
        per_token = -ratio * advantages
        clipfrac = logp.new_zeros(())  # logp.dtype, not the default (another thread may be loading a model)
    elif kind == "cross_entropy":
        per_token = -advantages * logp
        clipfrac = logp.new_zeros(())
    else:
        raise ValueError(f"unknown policy loss {kind!r}; use ppo, cispo, importance_sampling or cross_entropy")
    if is_weights is not None:
        per_token = per_token * is_weights
    loss = aggregate(per_token, mask, agg, max_len=max_len, num_tokens=num_tokens, num_seqs=num_seqs)
    metrics = {"pg_clipfrac": clipfrac.detach(), "ppo_kl": masked_mean(-log_ratio, mask_f).detach()}
    return loss, metrics


def cispo_weight(ratio: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28) -> torch.Tensor:
    """CISPO's stop-gradient importance weight, exposed for tests and readers: clip(ratio, 1-lo, 1+hi)."""
    return ratio.clamp(1 - clip_low, 1 + clip_high).detach()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float = 0.2, agg: str = "token-mean", num_tokens: float | None = None,
               num_seqs: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss: 0.5 * max((V - R)^2, (clip(V, V_old ± clip) - R)^2), as in verl and OpenRLHF."""
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_token = 0.5 * torch.maximum((values - returns).square(), (v_clipped - returns).square())
    loss = aggregate(per_token, mask, agg, num_tokens=num_tokens, num_seqs=num_seqs)
    clipfrac = masked_mean(((v_clipped - returns).square() > (values - returns).square()).float(), mask.float())
    return loss, {"vf_clipfrac": clipfrac.detach()}

"""Tinker's built-in losses, the sessions API's `forward_backward(loss_fn=...)` (minirl/sessions/batches.py).

They follow the Tinker docs ("Loss functions"), a convention apart from minirl/loss.py's trainer losses, so they
live here with the sessions, not beside `loss.policy_loss`:
- each is a SUM over tokens, with no mean anywhere, so a datum's gradient does not depend on the rest of the
  batch (a loop tuned on Tinker scales its own advantages or weights);
- clip bounds are ratio bounds (Tinker's clip_low_threshold 0.8, clip_high_threshold 1.2), where
  `loss.policy_loss` takes epsilons (clip_low 0.2 means a ratio bound of 0.8).
q is the sampler's log-prob of each token, p_theta the trained policy's; ratio = p_theta / q. `mask` (N, T)
marks the real target positions (0 on padding); Tinker's inputs carry their own zeros (weights, advantages).

Shapes: N datums, T target positions; every per-token tensor is (N, T).
"""
from __future__ import annotations

import torch

TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo")


def tinker_loss(kind: str, logp: torch.Tensor, sampler_logp: torch.Tensor, adv: torch.Tensor,
                weights: torch.Tensor, mask: torch.Tensor, clip_low: float = 0.8, clip_high: float = 1.2,
                beta: float | None = None, seq_ratio_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One of TINKER_LOSSES, summed over every masked token.  (N, T) each -> scalar.

    - cross_entropy:        -sum w * logp
    - importance_sampling:  -sum ratio * A                              (REINFORCE with importance weights)
    - ppo:                  -sum min(ratio * A, clip(ratio, lo, hi) * A)
    - cispo:                -sum sg(clip(ratio, lo, hi)) * logp * A     (MiniMax-M1)
    - dro:                  -sum (logp * A - beta/2 * (logp - q)^2)     (Richemond et al. 2024; beta required)
    - gspo:                 ppo with each token's ratio replaced by the sequence ratio
                            s = exp(mean over seq_ratio_mask of (sg(logp) - q)), carrying logp's own gradient
                            (GSPO-token, Zheng et al. 2025).
    Example (cross_entropy): logp [[-1, -2]], w [[0, 1]] -> 2.0.
    """
    m = mask.to(logp.dtype)
    log_ratio = (logp - sampler_logp).clamp(-20, 20)
    if kind == "cross_entropy":
        per_token = -weights * logp
    elif kind == "importance_sampling":
        per_token = -torch.exp(log_ratio) * adv
    elif kind in ("ppo", "gspo"):
        if kind == "gspo":
            sel = seq_ratio_mask.to(logp.dtype) * m
            seq = ((logp.detach() - sampler_logp) * sel).sum(-1, keepdim=True) / sel.sum(-1, keepdim=True).clamp(min=1)
            log_ratio = seq.clamp(-20, 20) + logp - logp.detach()                    # (N, T): s's value
        ratio = torch.exp(log_ratio)
        per_token = -torch.minimum(ratio * adv, ratio.clamp(clip_low, clip_high) * adv)
    elif kind == "cispo":
        per_token = -torch.exp(log_ratio).clamp(clip_low, clip_high).detach() * logp * adv
    elif kind == "dro":
        if beta is None:
            raise ValueError("loss_fn 'dro' needs loss_fn_config={'beta': ...} (the quadratic penalty's weight)")
        per_token = -(logp * adv - 0.5 * beta * (logp - sampler_logp).square())
    else:
        raise ValueError(f"unknown loss_fn {kind!r}; use one of {list(TINKER_LOSSES)}")
    return (per_token * m).sum()

"""The frozen reference policy pi_ref for the KL penalty.

It is a second copy of the starting weights, in eval mode with gradients off, used only to score the
response tokens the policy sampled (`ref_logp`). With `kl_coef: 0` the trainer builds none (no memory cost).
With LoRA the reference is the policy with its adapter disabled (`adapter_disabled`): no second copy.
Its log-probs come from `policy.batched_logprobs`, like the sampling policy's.
"""
from __future__ import annotations

import contextlib

import torch

from minirl.policy import load_model


def load_reference(path: str, dtype: torch.dtype, attn_implementation: str, device: torch.device):
    model = load_model(path, dtype=dtype, attn_implementation=attn_implementation).to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def adapter_disabled(model):
    """Context in which a peft model runs as its base model (the LoRA reference); a no-op for plain models."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()

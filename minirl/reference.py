"""The frozen reference policy pi_ref for the KL penalty.

It is a second copy of the starting weights, in eval mode with gradients off, used only to score the
response tokens the policy sampled (`ref_logp`). With `kl_coef: 0` the trainer builds none (no memory cost).
With LoRA the reference is the policy with its adapter disabled: no second copy (see `lora_reference_logprobs`).
"""
from __future__ import annotations

import contextlib

import torch

from minirl.policy import load_model, token_logprobs


def load_reference(path: str, dtype: torch.dtype, attn_implementation: str, device: torch.device):
    model = load_model(path, dtype=dtype, attn_implementation=attn_implementation).to(device)
    model.eval()
    model.requires_grad_(False)
    return model


@torch.no_grad()
def reference_logprobs(ref_model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       num_response_tokens: int, micro_batch_size: int) -> torch.Tensor:
    """log pi_ref of each response token, (N, R), computed in micro-batches."""
    parts = [token_logprobs(ref_model, input_ids[s:s + micro_batch_size], attention_mask[s:s + micro_batch_size],
                            num_response_tokens)[0]
             for s in range(0, input_ids.shape[0], micro_batch_size)]
    return torch.cat(parts)


def adapter_disabled(model):
    """Context in which a peft model runs as its base model (the LoRA reference); a no-op for plain models."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()

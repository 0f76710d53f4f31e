"""Rollouts: sample G completions per prompt, and the choice of the engine that generates them.

`sample` is the first of the four stages of a training step (sample -> score -> forward_backward -> optim_step).
It left-pads the prompts, gives each row its own budget, and hands the batch to an engine (minirl/engines/):
- minirl's decode loop (engines/decode.py) for most models: each prompt prefilled once and its KV cache
  copied to its G rows, rows that have ended leave the batch; it gives generate's tokens;
- Hugging Face `generate` (engines/hf_generate.py), the reference path, for the models the loop cannot take
  (`shares_prompts` says which).
Both sample with minirl/sampler.py (the warpers, then a Gumbel-max draw), so a seed gives the same tokens in
either. What comes back is made a Rollout here: each row ends at its first EOS or stop string, or its budget.

Shapes: B prompts, G samples per prompt, N = B*G sequences (group by group: rows i*G..i*G+G-1 belong to
prompt i), P prompt tokens (left-padded), R <= max_new_tokens response tokens (right-padded).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from minirl.engines import decode, hf_generate
from minirl.logprobs import length_dependent_rope
from minirl.sampler import sampling_processors, warpers


@dataclass
class Rollout:
    prompt_ids: torch.Tensor      # (N, P) left-padded
    prompt_mask: torch.Tensor     # (N, P) 1 on real prompt tokens
    response_ids: torch.Tensor    # (N, R) right-padded
    response_mask: torch.Tensor   # (N, R) 1 on generated tokens up to and including the first EOS
    truncated: torch.Tensor       # (N,) bool: no EOS (nor stop string) within max_new_tokens
    texts: list[str]              # N decoded completions (special tokens removed)
    group_size: int

    @property
    def input_ids(self) -> torch.Tensor:      # (N, P+R), the layout token_logprobs expects
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:  # (N, P+R)
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)


def response_mask_from_ids(response_ids: torch.Tensor, eos_ids: list[int], budgets: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """1 up to and including the first EOS, 0 after it, and 0 from each row's own budget (N,) on (what a batch
    generated past it is not the row's). Returns (mask (N, R), truncated (N,) bool)."""
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device))
    within = None if budgets is None else \
        torch.arange(response_ids.shape[1], device=response_ids.device) < budgets.to(response_ids.device)[:, None]
    if within is not None:
        is_eos &= within
    eos_seen_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0    # strictly before position t
    mask = (~eos_seen_before).long() if within is None else (~eos_seen_before & within).long()
    truncated = ~is_eos.any(dim=1)
    return mask, truncated


def eos_token_ids(tokenizer, model) -> list[int]:
    """The tokenizer's EOS plus any the model's generation config names (chat models often have several)."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(extra if isinstance(extra, list) else [extra])
    return sorted(i for i in ids if i is not None)


def row_budgets(model, prompt_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Each row's max_new_tokens (N,), lowered so that its own prompt (prompt_mask's 1s, not the batch's padded
    width) plus its response fit the model's context: a row gets the budget it would get alone."""
    lengths = prompt_mask.sum(1)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is None or int(lengths.max()) + max_new_tokens <= context:
        return torch.full_like(lengths, max_new_tokens)
    # a constant message: Python's default warning filter then shows it once, not once per batch
    warnings.warn(f"max_new_tokens={max_new_tokens} plus the prompt exceeds the model's context of {context} "
                  f"tokens; responses are capped at {context} minus the prompt's length", stacklevel=3)
    return (context - lengths).clamp(min=1, max=max_new_tokens)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str] | list[list[int]], group_size: int, max_new_tokens: int,
           temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False,
           stop: list[str] | None = None, generator: torch.Generator | None = None) -> Rollout:
    """Generate `group_size` completions for each prompt: strings (chat template already applied) or token
    lists (the sessions API's prompts, minirl/sessions/client.py), left-padded the same way. A row ends at its
    first EOS or, with `stop`, at the token that completes a stop string (kept in the response, as an EOS is),
    or at its own budget (row_budgets). The noise is drawn from `generator` (on the model's device) if given:
    a seeded request's own, which no other thread draws from; else from torch's global generator."""
    enc = encode_prompts(tokenizer, prompts, next(model.parameters()).device)
    prompt_ids = enc.input_ids.repeat_interleave(group_size, dim=0)                               # (N, P)
    prompt_mask = enc.attention_mask.repeat_interleave(group_size, dim=0)
    eos_ids = eos_token_ids(tokenizer, model)
    budgets = row_budgets(model, prompt_mask, max_new_tokens)                                      # (N,)
    budget = int(budgets.max())
    was_training = model.training
    model.eval()  # dropout off; gradient checkpointing is a training-mode feature, so the KV cache stays on
    try:
        response_ids = None
        if shares_prompts(model, enc.input_ids.shape[1]):  # each prompt prefilled once, finished rows dropped
            response_ids = decode.decode(model, enc.input_ids, enc.attention_mask, group_size, budget,
                                         [] if greedy else warpers(temperature, top_p, top_k), not greedy, eos_ids,
                                         tokenizer.pad_token_id, _stop_criteria(tokenizer, stop), budgets, generator)
        if response_ids is None:  # None: the model's cache cannot be shared between rows
            processors = [] if greedy else sampling_processors(temperature, top_p, top_k, generator)
            response_ids = hf_generate.generate(model, tokenizer, prompt_ids, prompt_mask, budgets, eos_ids,
                                                processors, stop)
    finally:
        model.train(was_training)
    return make_rollout(tokenizer, prompt_ids, prompt_mask, response_ids, eos_ids, group_size, stop, budgets)


def encode_prompts(tokenizer, prompts: list[str] | list[list[int]], device):
    """Strings (chat template applied) or token lists, left-padded: .input_ids, .attention_mask (B, P)."""
    if isinstance(prompts[0], str):
        return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    return tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(device)


def make_rollout(tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                 eos_ids: list[int], group_size: int, stop: list[str] | None = None,
                 budgets: torch.Tensor | None = None) -> Rollout:
    """The Rollout of generated (N, R') response ids: each row ends at its first EOS or stop string, or at its
    budget (N,), padding after it (whatever an engine put there), its text decoded."""
    mask, truncated = response_mask_from_ids(response_ids, eos_ids, budgets)
    if stop:
        mask, truncated = _mask_after_stop(prompt_ids, response_ids, mask, truncated, tokenizer, stop)
    response_ids = response_ids.masked_fill(mask == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=mask,
                   truncated=truncated, texts=texts, group_size=group_size)


def shares_prompts(model, prompt_tokens: int) -> bool:
    """Whether minirl's decode loop (each prompt prefilled once, finished rows dropped) gives what generate
    gives. Not for RoPE variants whose frequencies depend on the longest position in the call (a prefill one
    token shorter, or a batch that loses rows, would change them), nor for one-token prompts (nothing to
    prefill). The cache type is checked after the prefill (engines/decode.py)."""
    return prompt_tokens > 1 and not length_dependent_rope(model)


def _stop_criteria(tokenizer, stop: list[str] | None):
    """generate's own test of "the text now ends with a stop string", for the decode loop."""
    from transformers import StopStringCriteria
    return StopStringCriteria(tokenizer, list(stop)) if stop else None


def _mask_after_stop(prompt_ids: torch.Tensor, response_ids: torch.Tensor, mask: torch.Tensor,
                     truncated: torch.Tensor, tokenizer, stop: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """End each row at the first token where generate's own stop test (StopStringCriteria, over prompt and
    response tokens) holds: where generation stopped. Decoding the response's text instead misses a stop string
    that is a special token's text (decoded without it) or that starts in the prompt."""
    mask, truncated = mask.clone(), truncated.clone()
    criteria, P = _stop_criteria(tokenizer, stop), prompt_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)                                        # (N, P + R)
    for t in range(response_ids.shape[1]):
        hit = criteria(ids[:, :P + t + 1], None) & (mask[:, t] == 1)                          # (N,)
        if bool(hit.any()):
            mask[hit, t + 1:] = 0
            truncated[hit] = False
    return mask, truncated


def _pad_to(t: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    pad = t.new_full((t.shape[0], width - t.shape[1]), value)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts of different widths (prompts padded on the left, responses on the right)."""
    P = max(r.prompt_ids.shape[1] for r in parts)
    R = max(r.response_ids.shape[1] for r in parts)
    cat = lambda name, width, value, left: torch.cat([_pad_to(getattr(r, name), width, value, left) for r in parts])
    return Rollout(prompt_ids=cat("prompt_ids", P, pad_id, True), prompt_mask=cat("prompt_mask", P, 0, True),
                   response_ids=cat("response_ids", R, pad_id, False),
                   response_mask=cat("response_mask", R, 0, False),
                   truncated=torch.cat([r.truncated for r in parts]), texts=[t for r in parts for t in r.texts],
                   group_size=parts[0].group_size)


def select_groups(rollout: Rollout, groups: list[int]) -> Rollout:
    """Keep only the listed groups (prompt indices), in order."""
    G = rollout.group_size
    idx = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
    return Rollout(rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.response_ids[idx],
                   rollout.response_mask[idx], rollout.truncated[idx], [rollout.texts[i] for i in idx.tolist()], G)

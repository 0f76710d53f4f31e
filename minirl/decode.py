"""minirl's own decode loop for rollouts: each prompt prefilled once, finished rows out of the batch.

`rollout.sample` calls `decode` for the models it can take (rollout.shares_prompts); it gives the tokens that
Hugging Face `generate` gives over the N = B*G repeated rows with the same seed, for less compute:
- Prefill once. The B distinct prompts run through the model once, all but their last token; the KV cache is
  then copied to the G rows of each group (the trick logprobs.states_before_responses uses for the trainer's
  pass), and the first decoding step feeds every row its prompt's last token. Rows of a group get the same
  logits there, as they would from G separate prefills.
- Finished rows leave. A row that has produced an EOS (or completed a stop string) is dropped from the batch
  and from the cache, instead of decoding padding until the longest row ends.
- The same samples. The warpers are generate's (temperature, top-k, top-p). The Gumbel noise of each step is
  drawn for all N rows, as generate's loop draws it, and the rows still running take theirs: a row's noise
  does not depend on which other rows have ended, so the samples are generate's token for token (up to the
  float rounding of other batch shapes, ~1e-6 in fp32), and the random state after the call is the same too.
- Not handled here (rollout.sample uses generate for them): caches other than plain per-layer keys and values
  (linear-attention or convolution states are written in place; copying rows of them would need their own
  rules), and RoPE variants whose frequencies depend on the batch's longest position.

Shapes: B prompts, G rows per prompt, N = B*G rows, n <= N rows still running, P prompt tokens (left-padded),
V vocabulary, R' <= max_new_tokens steps run.
"""
from __future__ import annotations

import inspect

import torch

from minirl.logprobs import _plain_attention_cache, position_ids_from_mask
from minirl.rollout import add_gumbel_noise


@torch.no_grad()
def decode(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int, max_new_tokens: int,
           warpers: list, noise: bool, eos_ids: list[int], pad_id: int, stop=None) -> torch.Tensor | None:
    """G continuations of each of the B prompts (B, P). `warpers` process the fp32 scores (N, V); `noise` adds
    Gumbel noise (a sample; else greedy); `stop(ids, scores) -> (n,) bool` ends rows (generate's
    StopStringCriteria). Returns the (N, R') response ids, pad after a row's end, or None when the model's
    cache cannot be copied between rows (the caller then uses generate)."""
    B, P = prompt_ids.shape
    N = B * group_size
    owner = torch.arange(B, device=prompt_ids.device).repeat_interleave(group_size)       # (N,) row -> prompt
    positions = position_ids_from_mask(prompt_mask)
    extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    prefill = model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1],
                    position_ids=positions[:, :-1], use_cache=True, **extra)
    cache = prefill.past_key_values
    del prefill
    if not _plain_attention_cache(cache):
        return None
    cache.reorder_cache(owner)                                 # (B, ...) -> (N, ...): each row its prompt's K, V
    ids, mask = prompt_ids[owner], prompt_mask[owner]                            # (n, P+t) each, t steps done
    position = positions[owner, -1:]                                             # (n, 1) the next token's
    running = torch.arange(N, device=prompt_ids.device)       # (n,) the rows still decoding, in batch order
    eos = torch.tensor(eos_ids, device=prompt_ids.device)
    response = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=prompt_ids.device)
    for t in range(max_new_tokens):
        logits = model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=position, past_key_values=cache,
                       use_cache=True).logits[:, -1].float()                                              # (n, V)
        scores = logits
        for warp in warpers:
            scores = warp(ids, scores)
        if noise:  # every row's uniforms are drawn, so that each row's noise is the one generate would give it
            uniforms = torch.rand((N, scores.shape[1]), dtype=scores.dtype, device=scores.device)
            scores = add_gumbel_noise(scores, uniforms[running] if len(running) < N else uniforms)
        tokens = scores.argmax(-1)                                                                         # (n,)
        response[running, t] = tokens
        ids = torch.cat([ids, tokens[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        position = position + 1
        done = torch.isin(tokens, eos)
        if stop is not None:
            done |= stop(ids, scores)
        if bool(done.all()):
            return response[:, :t + 1]
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            running, ids, mask, position = running[keep], ids[keep], mask[keep], position[keep]
            cache.reorder_cache(keep)
    return response


def _accepts(model, argument: str) -> bool:
    """Whether the model's forward takes `argument` (a LoRA wrapper forwards it to the model it wraps)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return argument in inspect.signature(inner.forward).parameters

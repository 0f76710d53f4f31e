"""Per-token log-probabilities of responses under a causal LM: the trainer's teacher-forced forward pass.

`token_logprobs` is the trainer's teacher-forced forward pass. A prompt shared by adjacent rows (a GRPO group)
runs through the transformer once, and its KV cache serves all of its rows (`states_before_responses`). It
never builds the (N, T, V) fp32 log-softmax that `log_softmax(logits).gather(...)` would: it runs the
transformer body, then applies the LM head to chunks of response positions, keeping only logsumexp and the gathered logit of each token. Under
autograd each chunk is checkpointed when the batch's logits exceed one chunk's budget (LOGITS_PER_CHUNK), so
its (chunk, V) logits are recomputed in backward instead of being stored (peak memory ~ one chunk of logits
instead of the whole batch's; scripts/bench_logprobs.py measures).

Shapes: N sequences, P prompt tokens (left-padded), R response tokens (right-padded), V vocabulary, H hidden.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` computes them: the first real token is position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _chunk_logp(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module,
                temperature: float = 1.0) -> torch.Tensor:
    """hidden (n, H), targets (n,) -> logp (n,) fp32. Only logsumexp and the gathered logit leave here."""
    logits = lm_head(hidden).float() / temperature                         # (n, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)  # fused kernels


@torch.no_grad()
def _chunk_logp_entropy(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module,
                        temperature: float = 1.0):
    """As _chunk_logp, plus the entropy -sum p log p (a metric: computed without a graph)."""
    logits = lm_head(hidden).float() / temperature                         # (n, V)
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
    logits -= logz[:, None]                                                # log p, in place
    return logp, -(logits.exp() * logits).sum(-1)


def _chunk_logp_with_entropy(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module,
                             temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """_chunk_logp's exact log-probs (with their graph), plus the entropy from the same log-softmax, without a
    graph: the training pass gives the entropy metric for the price of an elementwise pass over (n, V)."""
    logp_all = torch.log_softmax(lm_head(hidden).float() / temperature, dim=-1)        # (n, V)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[:, None]).squeeze(-1), entropy


LOGITS_PER_CHUNK = 1 << 24  # at most 16M fp32 logits (64 MB) per chunk: ~110 tokens at V=152k
MAX_CHUNK_TOKENS = 128      # and at most 128 tokens (16 MB at V=32k), still large enough for an efficient matmul


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                   temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi_T(y_t | x, y_<t) at each response position, and (with_entropy) the entropy, which never has a graph.

    pi_T is the distribution the rollout sampled from: softmax(logits / temperature). Old, reference and current
    log-probs must all use the sampling temperature, or the ratio compares another policy (verl and TRL divide
    the logits by T the same way; top-p/top-k truncation is not modelled, as in both).
    input_ids/attention_mask: (N, P+R), prompt left-padded then response right-padded. Returns (N, R) fp32
    tensors aligned with the response tokens (values at padding are meaningless; mask them).
    """
    sharded = getattr(model, "minirl_token_logprobs", None)  # FSDP: the root's forward hooks run around it
    if sharded is not None:
        return sharded(input_ids, attention_mask, num_response_tokens, temperature, chunk_tokens, with_entropy)
    return _token_logprobs_unsharded(model, input_ids, attention_mask, num_response_tokens, temperature,
                                     chunk_tokens, with_entropy)


@torch.no_grad()
def batched_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                     micro_batch_size: int, temperature: float = 1.0, with_entropy: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` without gradients, micro-batch by micro-batch: old log-probs (with the entropy metric)
    and the reference's log-probs.  -> (N, R), (N, R) | None"""
    parts = [token_logprobs(model, input_ids[s:s + micro_batch_size], attention_mask[s:s + micro_batch_size],
                            num_response_tokens, temperature, with_entropy=with_entropy)
             for s in range(0, input_ids.shape[0], micro_batch_size)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]) if with_entropy else None


def _token_logprobs_unsharded(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                              temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False,
                              share_prompts: bool = True):
    R = num_response_tokens
    hidden = states_before_responses(model, input_ids, attention_mask, R, share_prompts)          # (N, R, H)
    return chunked_logprobs(hidden, input_ids[:, -R:], model.get_output_embeddings(), temperature, chunk_tokens,
                            with_entropy)


def states_before_responses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, R: int,
                            share_prompts: bool = True) -> torch.Tensor:
    """The last layer's hidden state before each response token: (N, P+R) -> (N, R, H).

    Rows in a row with the same prompt (a GRPO group: G samples of one prompt) share it: the prompt runs through
    the model once, and its KV cache is copied to each of its rows before the responses run on it. A prompt
    token attends only to the prompt, so these are the states one pass over every row computes (up to float
    rounding), for 1/G of the prompt's compute, and gradients flow back through the copies. Not with gradient
    checkpointing (transformers drops the cache there) or under FSDP (each layer would run twice per step)."""
    decoder = model.get_decoder()
    positions = position_ids_from_mask(attention_mask)
    P = input_ids.shape[1] - R
    prompt, prompt_mask = input_ids[:, :P], attention_mask[:, :P]
    first = torch.ones(len(prompt), dtype=torch.bool, device=prompt.device)     # (N,) a new prompt starts here
    first[1:] = (prompt[1:] != prompt[:-1]).any(1) | (prompt_mask[1:] != prompt_mask[:-1]).any(1)
    checkpointing = getattr(decoder, "gradient_checkpointing", False) or (  # transformers 5 renamed the flag
        getattr(model, "is_activation_checkpointing", None) if hasattr(model, "is_activation_checkpointing")
        else getattr(model, "is_gradient_checkpointing", False))
    if not share_prompts or P == 0 or bool(first.all()) or checkpointing:
        return decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       use_cache=False).last_hidden_state[:, -R - 1:-1]
    owner = first.long().cumsum(0) - 1                     # (N,) each row's prompt among the distinct ones
    unique = first.nonzero().squeeze(1)                    # (U,) the row each distinct prompt is taken from
    out = decoder(input_ids=prompt[unique], attention_mask=prompt_mask[unique], position_ids=positions[unique, :P],
                  use_cache=True)
    cache = out.past_key_values
    if not _plain_attention_cache(cache):  # e.g. linear-attention layers update their state in place: no sharing
        return states_before_responses(model, input_ids, attention_mask, R, share_prompts=False)
    cache.reorder_cache(owner)                             # (U, ...) -> (N, ...): each row gets its prompt's K, V
    responses = decoder(input_ids=input_ids[:, P:], attention_mask=attention_mask, position_ids=positions[:, P:],
                        past_key_values=cache, use_cache=True).last_hidden_state                     # (N, R, H)
    # before response token 0: the prompt's last state (left padding: always a real token); then the responses'
    return torch.cat([out.last_hidden_state[owner, -1:], responses[:, :-1]], dim=1)


def _plain_attention_cache(cache) -> bool:
    """Only keys and values that each layer appends to: copying them to rows, then appending the responses',
    is exact. Recurrent or convolution states (hybrid linear-attention models) are written in place, which
    autograd cannot take; a custom model may return no cache at all."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    layers = getattr(cache, "layers", None)
    return bool(layers) and hasattr(cache, "reorder_cache") and \
        all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def chunked_logprobs(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module,
                     temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log-softmax(lm_head(hidden) / temperature)[targets] chunk by chunk (and the entropy, without gradients).
    (N, R, H), (N, R) -> (N, R), (N, R) | None"""
    N, R, H = hidden.shape
    V = lm_head.weight.shape[0]
    chunk_tokens = chunk_tokens or max(16, min(MAX_CHUNK_TOKENS, LOGITS_PER_CHUNK // V))
    # checkpointing bounds the logits kept for backward to one chunk's; when all of them fit in that bound anyway
    # (a small vocabulary or batch), keeping them saves recomputing the LM head in backward (~10% of the step)
    recompute = N * R * V > LOGITS_PER_CHUNK
    run = (lambda fn, *args: checkpoint(fn, *args, use_reentrant=False)) if recompute else (lambda fn, *args: fn(*args))
    flat_h, flat_y = hidden.reshape(N * R, H), targets.reshape(N * R)
    logps, entropies = [], []
    for s in range(0, N * R, chunk_tokens):
        h, y = flat_h[s:s + chunk_tokens], flat_y[s:s + chunk_tokens]
        if with_entropy and torch.is_grad_enabled():  # the training pass
            lp, ent = run(_chunk_logp_with_entropy, h, y, lm_head, temperature)
            entropies.append(ent)
        elif with_entropy:
            lp, ent = _chunk_logp_entropy(h, y, lm_head, temperature)
            entropies.append(ent)
        elif torch.is_grad_enabled():  # keep only the hidden states; rebuild the chunk's logits in backward
            lp = run(_chunk_logp, h, y, lm_head, temperature)
        else:
            lp = _chunk_logp(h, y, lm_head, temperature)
        logps.append(lp)
    entropy = torch.cat(entropies).view(N, R) if with_entropy else None
    return torch.cat(logps).view(N, R), entropy

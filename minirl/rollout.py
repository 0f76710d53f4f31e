"""Rollouts: sample G completions per prompt, and the choice of the engine that generates them.

`sample` is the first of the four stages of a training step (sample -> score -> forward_backward -> optim_step).
It left-pads the prompts, gives each row its own budget, and hands the batch to an engine (minirl/engines/):
- minirl's decode loop (engines/decode.py) for most models: each prompt prefilled once and its KV cache
  copied to its G rows, rows that have ended leave the batch; it gives generate's tokens;
- Hugging Face `generate` (engines/hf_generate.py), the reference path, for the models the loop cannot take
  (`shares_prompts` says which).
Both sample with minirl/sampler.py (the warpers, then a Gumbel-max draw), so a seed gives the same tokens in
either. What comes back is made a Rollout here: each row ends at its first EOS or stop string, or its budget.

Two things travel with the tokens:
- Chunks. The groups are decoded a chunk at a time, each chunk as many whole groups as a key/value budget holds
  (`chunk_groups`: `kv_budget_gb`, else a share of the GPU's free memory; on CPU no limit), so the cache is
  bounded whatever B*G and max_new_tokens are. The chunks draw the noise one batch would draw (step t's
  uniforms for all N rows, hf_generate.NoiseSteps), so they give one batch's tokens and leave the random state
  where one batch leaves it (tests/core/test_rollout_chunks.py).
- The sampler's log-probs (`Rollout.sampler_logp`): each sampled token's log-prob under the engine's own
  softmax(logits / temperature), computed from the logits the engine sampled with (in bf16 under autocast, with
  its cache and kernels). The trainer compares them with its old log-probs (verl's `rollout_log_probs`), and
  can correct for the difference (loss.rollout_is_weights). They are the tempered distribution's, before top-k /
  top-p, because that is the distribution the trainer's log-probs are of (logprobs.token_logprobs): so in fp32
  they equal the trainer's up to float rounding, and what remains is the engine's numerics.

Shapes: B prompts, G samples per prompt, N = B*G sequences (group by group: rows i*G..i*G+G-1 belong to
prompt i), P prompt tokens (left-padded), R <= max_new_tokens response tokens (right-padded).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

from minirl.engines import decode, hf_generate
from minirl.logprobs import length_dependent_rope
from minirl.sampler import sampling_processors, warpers

# The share of a GPU's free memory (plus what torch's allocator holds unused) the rollout's key/value cache may
# take when `kv_budget_gb` is 0: the rest is for the step's activations and logits, and the allocator's slack.
KV_SHARE_OF_FREE = 0.6


@dataclass
class Rollout:
    prompt_ids: torch.Tensor      # (N, P) left-padded
    prompt_mask: torch.Tensor     # (N, P) 1 on real prompt tokens
    response_ids: torch.Tensor    # (N, R) right-padded
    response_mask: torch.Tensor   # (N, R) 1 on generated tokens up to and including the first EOS
    truncated: torch.Tensor       # (N,) bool: no EOS (nor stop string) within max_new_tokens
    texts: list[str]              # N decoded completions (special tokens removed)
    group_size: int
    # (N, R) each sampled token's log-prob under the engine's softmax(logits / T), 0 after a row's end; None
    # where the engine gives none (the vLLM engine, HF generate split by the context: engines/hf_generate.py)
    sampler_logp: torch.Tensor | None = None

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
           stop: list[str] | None = None, generator: torch.Generator | None = None,
           kv_budget_gb: float = 0.0) -> Rollout:
    """Generate `group_size` completions for each prompt: strings (chat template already applied) or token
    lists (the sessions API's prompts, minirl/sessions/client.py), left-padded the same way. A row ends at its
    first EOS or, with `stop`, at the token that completes a stop string (kept in the response, as an EOS is),
    or at its own budget (row_budgets). The noise is drawn from `generator` (on the model's device) if given:
    a seeded request's own, which no other thread draws from; else from torch's global generator.
    The groups run in chunks whose key/value cache fits `kv_budget_gb` (0: derived, chunk_groups), with the
    tokens of one batch."""
    enc = encode_prompts(tokenizer, prompts, next(model.parameters()).device)
    prompt_ids = enc.input_ids.repeat_interleave(group_size, dim=0)                               # (N, P)
    prompt_mask = enc.attention_mask.repeat_interleave(group_size, dim=0)
    eos_ids = eos_token_ids(tokenizer, model)
    budgets = row_budgets(model, prompt_mask, max_new_tokens)                                      # (N,)
    budget = int(budgets.max())
    chunks = chunk_groups(model, len(enc.input_ids), group_size, enc.input_ids.shape[1] + budget, kv_budget_gb)
    logp = torch.zeros(len(prompt_ids), budget, device=prompt_ids.device)       # (N, budget) the sampler's
    was_training = model.training
    model.eval()  # dropout off; gradient checkpointing is a training-mode feature, so the KV cache stays on
    try:
        response_ids = None
        if shares_prompts(model, enc.input_ids.shape[1]):  # each prompt prefilled once, finished rows dropped
            response_ids = _decode_chunks(model, tokenizer, enc, group_size, budget, budgets, chunks, temperature,
                                          top_p, top_k, greedy, eos_ids, stop, generator, logp)
        if response_ids is None:  # None: the model's cache cannot be shared between rows
            response_ids, logp = _generate_chunks(model, tokenizer, prompt_ids, prompt_mask, budgets, chunks,
                                                  group_size, temperature, top_p, top_k, greedy, eos_ids, stop,
                                                  generator, logp)
    finally:
        model.train(was_training)
    rollout = make_rollout(tokenizer, prompt_ids, prompt_mask, response_ids, eos_ids, group_size, stop, budgets)
    if logp is None:  # generate split the rows by the context itself: the sampler's log-probs are unknown (NaN)
        logp = torch.full((len(prompt_ids), response_ids.shape[1]), float("nan"), device=prompt_ids.device)
    rollout.sampler_logp = torch.where(rollout.response_mask.bool(), logp[:, :response_ids.shape[1]], 0.0)  # (N, R)
    return rollout


# --- generation in chunks of whole groups ----------------------------------------------------------------------

def kv_bytes_per_row(model, tokens: int) -> int:
    """Bytes of keys and values one row holds over `tokens` positions: layers x kv heads x (key + value head
    dims) x bytes per element of the cache's dtype (autocast's when it is on). 0 when the config does not say."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    try:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        layers = config.num_hidden_layers
    except AttributeError:
        return 0
    k_dim = getattr(config, "qk_head_dim", None) or head_dim      # MLA (DeepSeek-V3): keys and values differ
    v_dim = getattr(config, "v_head_dim", None) or head_dim
    device = next(model.parameters()).device
    # device-branch: rollout/kv-budget
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else \
        next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return layers * heads * (k_dim + v_dim) * tokens * dtype.itemsize


def free_memory_bytes(device: torch.device) -> int | None:
    """What the rollout may take on `device`: a GPU's free memory plus what torch's allocator holds unused;
    None on CPU (no limit). Tests override it to force the GPU's branch."""
    if device.type != "cuda":  # device-branch: rollout/kv-budget
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def chunk_groups(model, prompts: int, group_size: int, tokens: int, kv_budget_gb: float = 0.0) -> list[range]:
    """The B prompts in consecutive chunks (ranges of prompt indices) whose G rows each hold a key/value cache of
    `tokens` positions (prompt + budget) within the budget: `kv_budget_gb`, or with 0 KV_SHARE_OF_FREE of
    free_memory_bytes (on CPU: one chunk). Whole groups, at least one a chunk, so a group's prompt stays shared.
    Example: 1.5 GB, Qwen2.5-7B (28 layers, 4 kv heads of 128, bf16: 57 kB a token), 9k tokens, G = 8: 3 groups."""
    device = next(model.parameters()).device
    budget = kv_budget_gb * 2**30 if kv_budget_gb > 0 else None
    if budget is None:
        free = free_memory_bytes(device)
        budget = None if free is None else KV_SHARE_OF_FREE * free
    per_group = kv_bytes_per_row(model, tokens) * group_size
    size = prompts if budget is None or per_group == 0 else max(1, min(prompts, int(budget // per_group)))
    return [range(s, min(s + size, prompts)) for s in range(0, prompts, size)]


def _decode_chunks(model, tokenizer, enc, group_size: int, budget: int, budgets: torch.Tensor, chunks: list[range],
                   temperature: float, top_p: float, top_k: int, greedy: bool, eos_ids: list[int], stop,
                   generator, logp: torch.Tensor) -> torch.Tensor | None:
    """minirl's decode loop over each chunk of groups, with one batch's noise (NoiseSteps: a chunk takes its rows
    of step t's uniforms for all N rows); fills logp (N, budget). -> (N, R') response ids, or None when the
    model's cache cannot be shared (found at the first chunk's prefill, before any noise is drawn)."""
    G, N = group_size, len(budgets)
    steps = hf_generate.NoiseSteps(N, generator) if len(chunks) > 1 and not greedy else None
    parts = []
    for chunk in chunks:
        rows = slice(chunk.start * G, chunk.stop * G)
        draw = None if steps is None else \
            (lambda t, vocab, rows=rows: steps.draw(t, vocab, enc.input_ids.device)[rows])  # noqa: E731
        part = decode.decode(model, enc.input_ids[chunk.start:chunk.stop], enc.attention_mask[chunk.start:chunk.stop],
                             G, budget, [] if greedy else warpers(temperature, top_p, top_k), not greedy, eos_ids,
                             tokenizer.pad_token_id, _stop_criteria(tokenizer, stop), budgets[rows], generator,
                             draw, logp[rows], temperature)
        if part is None:
            return None
        parts.append(part)
    return _cat_right(parts, tokenizer.pad_token_id)


def _generate_chunks(model, tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, budgets: torch.Tensor,
                     chunks: list[range], group_size: int, temperature: float, top_p: float, top_k: int,
                     greedy: bool, eos_ids: list[int], stop, generator, logp: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hugging Face generate over each chunk of groups, with one batch's noise (GroupNoise over NoiseSteps), the
    sampler's log-probs recorded by two processors around the sampler's. Where prompt + budget pass the model's
    context, generate already runs the rows in groups of its own (hf_generate.generate): one call, and no
    log-probs (its groups are not known here; sample marks them unknown, NaN, which update.forward_backward
    leaves out of the mismatch metrics and gives IS weight 1). -> ((N, R') response ids, logp or None)."""
    G, (N, P) = group_size, prompt_ids.shape
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is not None and P + int(budgets.max()) > context:
        processors = [] if greedy else sampling_processors(temperature, top_p, top_k, generator)
        return hf_generate.generate(model, tokenizer, prompt_ids, prompt_mask, budgets, eos_ids, processors,
                                    stop), None
    steps = hf_generate.NoiseSteps(N, generator) if len(chunks) > 1 and not greedy else None
    parts = []
    for chunk in chunks:
        rows = torch.arange(chunk.start * G, chunk.stop * G, device=prompt_ids.device)
        processors = [] if greedy else sampling_processors(temperature, top_p, top_k, generator)
        if steps is not None:
            processors = hf_generate.with_group_noise(processors, steps, rows, P)
        recorder = _SampledLogp(temperature)
        part = hf_generate.generate(model, tokenizer, prompt_ids[rows], prompt_mask[rows], budgets[rows], eos_ids,
                                    [recorder.keep] + processors + [recorder.record], stop)
        logp[rows, :part.shape[1]] = torch.stack(recorder.steps, 1)[:, :part.shape[1]]
        parts.append(part)
    return _cat_right(parts, tokenizer.pad_token_id), logp


class _Call(LogitsProcessor):
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.fn(scores)


class _SampledLogp:
    """Two generate processors around the sampler's: `keep` (first, on the raw scores) keeps the step's
    log_softmax(scores / T); `record` (last: after the Gumbel draw only the picked token's score is finite;
    greedy, the scores are the raw ones and generate picks their argmax) records the picked token's."""

    def __init__(self, temperature: float):
        self.temperature, self.steps, self._logp = temperature, [], None
        self.keep, self.record = _Call(self._keep), _Call(self._record)

    def _keep(self, scores: torch.Tensor) -> torch.Tensor:
        self._logp = torch.log_softmax(scores.float() / self.temperature, -1)                           # (n, V)
        return scores

    def _record(self, scores: torch.Tensor) -> torch.Tensor:
        self.steps.append(self._logp.gather(1, scores.argmax(-1, keepdim=True))[:, 0])                  # (n,)
        return scores


def _cat_right(parts: list[torch.Tensor], pad_id: int) -> torch.Tensor:
    """Stack (n_i, R_i) response ids, right-padded to the widest."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([_pad_to(p, width, pad_id, left=False) for p in parts])


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
                   group_size=parts[0].group_size,
                   sampler_logp=None if any(r.sampler_logp is None for r in parts) else cat("sampler_logp", R, 0.0,
                                                                                           False))


def select_groups(rollout: Rollout, groups: list[int]) -> Rollout:
    """Keep only the listed groups (prompt indices), in order."""
    G = rollout.group_size
    idx = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
    return Rollout(rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.response_ids[idx],
                   rollout.response_mask[idx], rollout.truncated[idx], [rollout.texts[i] for i in idx.tolist()], G,
                   None if rollout.sampler_logp is None else rollout.sampler_logp[idx])

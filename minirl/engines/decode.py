"""minirl's own decode loop for rollouts: each prompt prefilled once, finished rows out of the batch.

`rollout.sample` calls `decode` for the models it can take (rollout.shares_prompts; hf_generate.py takes the
others); it gives the tokens that `generate` gives over the N = B*G repeated rows, same seed, for less compute:
- Prefill once. The B distinct prompts run through the model once, all but their last token; the KV cache is
  then copied to the G rows of each group (as logprobs.states_before_responses does for the trainer's pass),
  and the first decoding step feeds every row its prompt's last token.
- Finished rows leave: a row that has produced an EOS, completed a stop string or spent its budget leaves the
  batch and the cache, instead of decoding padding until the longest row ends.
- No copy of the cache per step: each layer's keys and values sit in one buffer sized for the whole rollout
  (engines/decode_cache.py).
- Packed weights on CPU: in fp32 each nn.Linear runs oneDNN's matmul on a weight packed once, 2-3x F.linear.
- The prompt read once per group (sdpa models, fp32): `_SharedPrefix` keeps each prompt's keys and values
  once, and attention runs in two parts merged by their log-sum-exp (engines/decode_cache.py).
- The same samples. The warpers are generate's (temperature, top-k, top-p). Each step's uniforms for the
  noise are drawn for all N rows, as generate's loop draws them, and the running rows take theirs: a row's
  noise does not depend on which rows have ended, so the samples are generate's token for token (up to float
  rounding, ~1e-6 in fp32: other batch shapes, oneDNN, the two-part attention), and so is the random state.
- Not handled here (rollout.sample uses generate for them): caches other than plain per-layer keys and values
  (linear-attention or convolution states are written in place), RoPE whose frequencies depend on the length.

Shapes: B prompts, G rows a prompt, N = B*G rows, n <= N still running, P prompt tokens (left-padded), V vocab.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
import weakref

import torch
from transformers.cache_utils import DynamicLayer

from minirl.engines.decode_cache import _attention, _configs, _Preallocated, _SharedPrefix, _shares_prefix
from minirl.logprobs import _plain_attention_cache, position_ids_from_mask
from minirl.sampler import gumbel_argmax, gumbel_uniforms


@torch.no_grad()
def decode(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int, max_new_tokens: int,
           warpers: list, noise: bool, eos_ids: list[int], pad_id: int, stop=None, budgets=None,
           generator=None, draw=None, logp=None, temperature: float = 1.0) -> torch.Tensor | None:
    """G continuations of each of the B prompts (B, P). `warpers` process the fp32 scores (N, V); `noise` adds
    Gumbel noise from `generator` (else torch's global one; no noise: greedy). A row ends at an EOS, where
    `stop(ids, scores) -> (n,) bool` says (generate's StopStringCriteria) or at its budget (N,). Returns the
    (N, R') response ids, pad after a row's end, or None when the loop does not serve the model (check_model
    says why; rollout.sample then calls generate).
    `draw(t, V)`, if given, returns step t's uniforms for the N rows instead of a fresh draw (rollout.sample's
    chunks replay one batch's noise with it). `logp` (N, max_new_tokens), if given, receives each sampled token's
    log-prob under softmax(logits / temperature): the sampler's own, as the trainer's old_logp define it."""
    with _DECODING:
        path = _path(model)
        if path not in PATHS:
            return None
        with _packed_linears(model, prompt_ids.shape[0] * group_size):
            return _decode(model, prompt_ids, prompt_mask, group_size, max_new_tokens, warpers, noise, eos_ids,
                           pad_id, stop, budgets, generator, draw, logp, temperature, share=path == "shared")


# One decode at a time in a process: both speed-ups below swap something on the shared model for the length of a
# call (its Linear forwards, its configs' attention implementation), which two decodes at once would undo for each
# other. Other threads' calls on the model (a trainer's forward) see the model's own behaviour throughout.
_DECODING = threading.RLock()


def _decode(model, prompt_ids, prompt_mask, group_size, max_new_tokens, warpers, noise, eos_ids, pad_id, stop,
            budgets, generator, draw=None, logp=None, temperature=1.0, share: bool = True):
    B, P = prompt_ids.shape
    N, device = B * group_size, prompt_ids.device
    budgets = torch.full((N,), max_new_tokens, device=device) if budgets is None else budgets
    owner = torch.arange(B, device=device).repeat_interleave(group_size)                 # (N,) row -> prompt
    positions = position_ids_from_mask(prompt_mask)
    cache, configs, shared = _prefill(model, prompt_ids, prompt_mask, positions, owner, group_size, max_new_tokens,
                                      share)
    if cache is None:
        return None
    ids, mask = prompt_ids[owner], prompt_mask[owner]                            # (n, P+t) each, t steps done
    position = positions[owner, -1:]                                             # (n, 1) the next token's
    running = torch.arange(N, device=device)                  # (n,) the rows in the batch, in batch order
    ended = torch.zeros(N, dtype=torch.bool, device=device)   # (n,) rows that have ended but not yet left
    leave_at = finished_rows_leave_at(device)
    eos = torch.tensor(eos_ids, device=device)
    response = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    for t in range(max_new_tokens):
        with _attention(configs, cache if shared else None):   # shared: the prompt's padding is the cache's to mask
            logits = model(input_ids=ids[:, -1:], attention_mask=None if shared else mask, position_ids=position,
                           past_key_values=cache, use_cache=True).logits[:, -1].float()                   # (n, V)
        scores = logits
        for warp in warpers:
            scores = warp(ids, scores)
        # every row's uniforms are drawn, so that each row's noise is the one generate would give it
        if noise:
            u = gumbel_uniforms(N, scores.shape[1], scores.device, generator) if draw is None \
                else draw(t, scores.shape[1])                                                              # (N, W)
        tokens = gumbel_argmax(scores, u[running]) if noise else scores.argmax(-1)                         # (n,)
        response[running, t] = tokens.masked_fill(ended, pad_id)           # an ended row's tokens are discarded
        if logp is not None:
            new = torch.log_softmax(logits / temperature, -1).gather(1, tokens[:, None])[:, 0]
            logp[running, t] = torch.where(ended, logp[running, t], new)
        ids = torch.cat([ids, tokens[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        position = position + (~ended[:, None]).long()   # an ended row stays at its place (learned positions end)
        ended |= torch.isin(tokens, eos) | (budgets[running] <= t + 1)        # an EOS, or the row's budget spent
        if stop is not None:
            ended |= stop(ids, scores)
        # the step's one host sync: how many rows have ended (whether all have, whether enough to leave)
        n_ended = int(ended.sum())
        if n_ended == len(running):
            return response[:, :t + 1]
        if n_ended and n_ended >= leave_at * len(running):
            keep = (~ended).nonzero().squeeze(1)
            running, ids, mask, position, ended = running[keep], ids[keep], mask[keep], position[keep], ended[keep]
            cache.reorder_cache(keep)
    return response


def _prefill(model, prompt_ids, prompt_mask, positions, owner, group_size: int, max_new_tokens: int, share: bool):
    """Run the B prompts but their last token once; -> (the decode cache for the N rows, the model's configs,
    whether attention runs in two parts), or (None, ...) when the cache is not one the loop can copy."""
    P = prompt_ids.shape[1]
    extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    prefill = model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1],
                    position_ids=positions[:, :-1], use_cache=True, **extra)
    cache, prefill = prefill.past_key_values, None
    if not _plain_attention_cache(cache):
        return None, None, False
    # the two-part attention needs every layer's cache in its hands (a sliding-window layer keeps transformers'
    # mask), and fp32 (the two parts are rounded apart: in bf16 that changes samples)
    configs = _configs(model)
    shared = share and _shares_prefix(model, configs) and all(
        type(layer) is DynamicLayer and layer.keys.dtype == torch.float32 for layer in cache.layers)
    for i, layer in enumerate(cache.layers):
        if shared and type(layer) is DynamicLayer:     # the prompt's K, V kept once, the rows' own after it
            cache.layers[i] = _SharedPrefix(layer, prompt_mask[:, :-1], group_size, max_new_tokens)
        else:                                          # (B, ...) -> (N, ...): each row its prompt's K, V
            layer.reorder_cache(owner)
            if type(layer) is DynamicLayer:
                cache.layers[i] = _Preallocated(layer, P - 1 + max_new_tokens)
    return cache, configs, shared


def finished_rows_leave_at(device: torch.device) -> float:
    """The share of the batch's rows that must have ended before they leave it (their cache copied out). On CPU
    every row costs its compute: a row leaves as it ends. On a GPU a decode step's time hardly depends on the
    rows (it reads the weights once), while each departure copies every layer's cache: ended rows stay, their
    tokens discarded, until a quarter of the batch has ended, so a batch of N rows is compacted ~log(N)/log(4/3)
    times instead of up to N. Either way the rows that continue sample the same tokens (up to the rounding of
    other batch shapes), and the one host sync a step is the count of ended rows."""
    # device-branch: decode/rows-leave
    return 0.0 if device.type == "cpu" else 0.25


# --- the check: does the decode loop serve this model? ---------------------------------------------------------
# The loop assumes what a model's cache and attention hold: per-layer keys and values that each step appends to,
# which attention reads as they are (so that a prompt's may be kept once for its group), and a forward that takes
# position ids and the cache. Where one does not hold (DeepSeek-V3's MLA caches a compressed latent and expands
# it after the cache; a custom cache class; a forward without position ids), running the loop once on a short
# batch shows it: by an error, or by scores that are not those of one forward over the sequence. The model is
# then served by the loop without the two-part attention, or by generate, with a warning that says why.

PATHS = ("shared", "one-buffer")        # the two-part attention over a prompt kept once; each row's own copy
_PATHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # model -> one of PATHS, or why neither


def check_model(model) -> str | None:
    """None when the decode loop serves `model` (rollout.sample's fast path), else why not (generate serves it).
    Runs the loop once (2 prompts x 2 rows, 3 greedy tokens, 4 forward passes) the first time a model is seen:
    call it at load to pay that there; `decode` calls it otherwise."""
    path = _path(model)
    return None if path in PATHS else path


def _path(model) -> str:
    with _DECODING:
        if model not in _PATHS:
            errors = {}
            for path in PATHS:
                errors[path] = _probe(model, share=path == "shared")
                if errors[path] is None:
                    break
            _PATHS[model] = path if errors[path] is None else (
                f"minirl's decode loop does not serve {type(model).__name__}, so rollouts use transformers' "
                f"generate (slower, the same samples): {errors['one-buffer']}")
            if errors[path] is not None or path != PATHS[0] and _shares_prefix(model, _configs(model)):
                warnings.warn(_PATHS[model] if errors[path] else "minirl's decode loop reads each row's own copy "
                              f"of its prompt's keys and values for {type(model).__name__}: {errors['shared']}")
        return _PATHS[model]


def _probe(model, share: bool) -> str | None:
    """Greedy decoding of 2 prompts (one left-padded) x 2 rows, 3 tokens, each step's scores kept, against one
    forward over the whole sequences: None when they agree, else what went wrong. Run with autocast off (the
    model as it is: fp32 weights compute fp32), or under bf16 autocast where that fails (a kernel that takes only
    half precision, such as flash-attn). Tolerance: 1e-4 in fp32; in half precision the rounding of two
    differently batched passes, 8 u max|logit| (u its unit roundoff; as logprobs.check_exact's prompt sharing,
    measured there on SmolLM2-135M in bf16), which a wrong prefix or a lost row exceeds."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        # device-branch: decode/check-autocast (the caller's autocast, e.g. a bf16 rollout, is off for the check)
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            got, want = _probe_scores(model, share, device)
    except Exception as e:  # noqa: BLE001  (any assumption that fails: a shape, a cache class, an argument)
        try:  # device-branch: decode/check-autocast (a kernel that takes only half precision: flash-attn)
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
                got, want = _probe_scores(model, share, device)
        except Exception:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
    finally:
        model.train(was_training)
    if got is None:
        return "its cache holds more than per-layer keys and values (e.g. recurrent states)"
    u = torch.finfo(want.dtype).eps / 2
    tolerance = max(1e-4, 8 * u * float(want.float().abs().max()))
    error = float((torch.log_softmax(got, -1) - torch.log_softmax(want.float(), -1)).abs().max())
    if not error <= tolerance:                                                           # also NaN
        return f"its scores differ from one forward over the sequence by {error:.3g} (> {tolerance:.3g})"
    return None


def _probe_scores(model, share: bool, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The decode loop's scores (4, R, V) fp32 and the logits one forward gives at the same places, or Nones
    when the loop does not take the model's cache."""
    V = getattr(getattr(model, "config", None), "vocab_size", None) or 64
    P, R, owner = 6, 3, torch.tensor([0, 0, 1, 1], device=device)
    ids = (torch.arange(2 * P, device=device).view(2, P) * 7 + 3) % V                   # (2, P)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    steps = []
    response = _decode(model, ids, mask, 2, R, [lambda ids, scores: steps.append(scores) or scores], False, [-1],
                       0, None, None, None, share=share)                                 # (4, R), no row ends
    if response is None:
        return None, None
    full, full_mask = torch.cat([ids[owner], response], 1), torch.cat([mask[owner], torch.ones_like(response)], 1)
    logits = model(input_ids=full, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits
    return torch.stack(steps, 1), logits[:, P - 1:P - 1 + R]                             # (4, R, V) each


@contextlib.contextmanager
def _packed_linears(model, rows: int):
    """On CPU in fp32 (no autocast): each nn.Linear runs oneDNN's matmul on its weight packed once for this call
    (torch.ops.mkldnn, what torch.compile's CPU backend and vLLM-CPU run), 2-3x F.linear's speed at decode
    shapes (a few dozen rows), the same products up to float rounding (~1e-6 relative). Packing all weights
    takes ~50 ms for 135M parameters and holds a second copy of them during the call. Modules that already
    have a forward of their own (accelerate's hooks), other dtypes, devices and tensor types run as before."""
    swapped = []
    if packs_linears(model):
        for module in model.modules():
            w, b = getattr(module, "weight", None), getattr(module, "bias", None)
            # device-branch: decode/packed-linears
            if type(module) is not torch.nn.Linear or "forward" in module.__dict__ or \
                    type(w) is not torch.nn.Parameter or w.device.type != "cpu" or w.dtype != torch.float32:
                continue
            # device-branch: decode/packed-linears
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)
            bias = None if b is None else b.detach()
            module.forward = functools.partial(_packed_linear, module, packed, bias, threading.get_ident())
            swapped.append(module)
    try:
        yield
    finally:
        for module in swapped:
            module.__dict__.pop("forward", None)


def packs_linears(model) -> bool:
    """Whether a decode call packs the model's fp32 CPU Linear weights: oneDNN is there and CPU autocast is off
    (autocast runs F.linear in bf16). On a GPU nothing is packed (the weights are not on the CPU); tests override
    this to run that side on CPU."""
    # device-branch: decode/packed-linears
    return torch.backends.mkldnn.is_available() and not torch.is_autocast_enabled("cpu")


def _packed_linear(module: torch.nn.Linear, packed: torch.Tensor, bias: torch.Tensor | None, thread: int,
                   x: torch.Tensor) -> torch.Tensor:
    """The packed matmul for the decoding thread; any other caller (a trainer's thread, autograd) gets the
    module's own forward."""
    if threading.get_ident() != thread or torch.is_grad_enabled():
        return torch.nn.Linear.forward(module, x)
    # device-branch: decode/packed-linears
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _accepts(model, argument: str) -> bool:
    """Whether the model's forward takes `argument` (a LoRA wrapper forwards it to the model it wraps)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return argument in inspect.signature(inner.forward).parameters

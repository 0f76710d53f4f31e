"""minirl's own decode loop for rollouts: each prompt prefilled once, finished rows out of the batch.

`rollout.sample` calls `decode` for the models it can take (rollout.shares_prompts; hf_generate.py takes the
others); it gives the tokens that `generate` gives over the N = B*G repeated rows, same seed, for less compute:
- Prefill once. The B distinct prompts run through the model once, all but their last token; the KV cache is
  then copied to the G rows of each group (as logprobs.states_before_responses does for the trainer's pass),
  and the first decoding step feeds every row its prompt's last token.
- Finished rows leave: a row that has produced an EOS, completed a stop string or spent its budget leaves the
  batch and the cache, instead of decoding padding until the longest row ends.
- No copy of the cache per step: each layer's keys and values sit in one buffer sized for the whole rollout.
- Packed weights on CPU: in fp32 each nn.Linear runs oneDNN's matmul on a weight packed once, 2-3x F.linear.
- The prompt read once per group (sdpa models, fp32): `_SharedPrefix` keeps each prompt's keys and values
  once, and attention runs in two parts merged by their log-sum-exp (see the section below).
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

import torch
from transformers.cache_utils import DynamicLayer

from minirl.logprobs import _plain_attention_cache, position_ids_from_mask
from minirl.sampler import gumbel_argmax, gumbel_uniforms


@torch.no_grad()
def decode(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int, max_new_tokens: int,
           warpers: list, noise: bool, eos_ids: list[int], pad_id: int, stop=None, budgets=None,
           generator=None) -> torch.Tensor | None:
    """G continuations of each of the B prompts (B, P). `warpers` process the fp32 scores (N, V); `noise` adds
    Gumbel noise from `generator` (else torch's global one; no noise: greedy). A row ends at an EOS, where
    `stop(ids, scores) -> (n,) bool` says (generate's StopStringCriteria) or at its budget (N,). Returns the
    (N, R') response ids, pad after a row's end, or None when the cache cannot be copied between rows."""
    with _DECODING, _packed_linears(model, prompt_ids.shape[0] * group_size):
        return _decode(model, prompt_ids, prompt_mask, group_size, max_new_tokens, warpers, noise, eos_ids, pad_id,
                       stop, budgets, generator)


# One decode at a time in a process: both speed-ups below swap something on the shared model for the length of a
# call (its Linear forwards, its configs' attention implementation), which two decodes at once would undo for each
# other. Other threads' calls on the model (a trainer's forward) see the model's own behaviour throughout.
_DECODING = threading.RLock()


def _decode(model, prompt_ids, prompt_mask, group_size, max_new_tokens, warpers, noise, eos_ids, pad_id, stop,
            budgets, generator):
    B, P = prompt_ids.shape
    N = B * group_size
    budgets = torch.full((N,), max_new_tokens, device=prompt_ids.device) if budgets is None else budgets
    owner = torch.arange(B, device=prompt_ids.device).repeat_interleave(group_size)       # (N,) row -> prompt
    positions = position_ids_from_mask(prompt_mask)
    extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    prefill = model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1],
                    position_ids=positions[:, :-1], use_cache=True, **extra)
    cache, prefill = prefill.past_key_values, None
    if not _plain_attention_cache(cache):
        return None
    # the two-part attention needs every layer's cache in its hands (a sliding-window layer keeps transformers'
    # mask), and fp32 (the two parts are rounded apart: in bf16 that changes samples)
    configs = _configs(model)
    shared = _shares_prefix(model, configs) and all(type(layer) is DynamicLayer and layer.keys.dtype == torch.float32
                                             for layer in cache.layers)
    for i, layer in enumerate(cache.layers):
        if shared and type(layer) is DynamicLayer:     # the prompt's K, V kept once, the rows' own after it
            cache.layers[i] = _SharedPrefix(layer, prompt_mask[:, :-1], group_size, max_new_tokens)
        else:                                          # (B, ...) -> (N, ...): each row its prompt's K, V
            layer.reorder_cache(owner)
            if type(layer) is DynamicLayer:
                cache.layers[i] = _Preallocated(layer, P - 1 + max_new_tokens)
    ids, mask = prompt_ids[owner], prompt_mask[owner]                            # (n, P+t) each, t steps done
    position = positions[owner, -1:]                                             # (n, 1) the next token's
    running = torch.arange(N, device=prompt_ids.device)       # (n,) the rows still decoding, in batch order
    eos = torch.tensor(eos_ids, device=prompt_ids.device)
    response = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=prompt_ids.device)
    for t in range(max_new_tokens):
        with _attention(configs, cache if shared else None):   # shared: the prompt's padding is the cache's to mask
            scores = model(input_ids=ids[:, -1:], attention_mask=None if shared else mask, position_ids=position,
                           past_key_values=cache, use_cache=True).logits[:, -1].float()                   # (n, V)
        for warp in warpers:
            scores = warp(ids, scores)
        # every row's uniforms are drawn, so that each row's noise is the one generate would give it
        tokens = gumbel_argmax(scores, gumbel_uniforms(N, scores.shape[1], scores.device, generator)[running]) \
            if noise else scores.argmax(-1)                                                                # (n,)
        response[running, t] = tokens
        ids = torch.cat([ids, tokens[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        position = position + 1
        done = torch.isin(tokens, eos) | (budgets[running] <= t + 1)          # an EOS, or the row's budget spent
        if stop is not None:
            done |= stop(ids, scores)
        if bool(done.all()):
            return response[:, :t + 1]
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            running, ids, mask, position = running[keep], ids[keep], mask[keep], position[keep]
            cache.reorder_cache(keep)
    return response


@contextlib.contextmanager
def _packed_linears(model, rows: int):
    """On CPU in fp32 (no autocast): each nn.Linear runs oneDNN's matmul on its weight packed once for this call
    (torch.ops.mkldnn, what torch.compile's CPU backend and vLLM-CPU run), 2-3x F.linear's speed at decode
    shapes (a few dozen rows), the same products up to float rounding (~1e-6 relative). Packing all weights
    takes ~50 ms for 135M parameters and holds a second copy of them during the call. Modules that already
    have a forward of their own (accelerate's hooks), other dtypes, devices and tensor types run as before."""
    swapped = []
    if torch.backends.mkldnn.is_available() and not torch.is_autocast_enabled("cpu"):
        for module in model.modules():
            w, b = getattr(module, "weight", None), getattr(module, "bias", None)
            if type(module) is not torch.nn.Linear or "forward" in module.__dict__ or \
                    type(w) is not torch.nn.Parameter or w.device.type != "cpu" or w.dtype != torch.float32:
                continue
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)
            bias = None if b is None else b.detach()
            module.forward = functools.partial(_packed_linear, module, packed, bias, threading.get_ident())
            swapped.append(module)
    try:
        yield
    finally:
        for module in swapped:
            module.__dict__.pop("forward", None)


def _packed_linear(module: torch.nn.Linear, packed: torch.Tensor, bias: torch.Tensor | None, thread: int,
                   x: torch.Tensor) -> torch.Tensor:
    """The packed matmul for the decoding thread; any other caller (a trainer's thread, autograd) gets the
    module's own forward."""
    if threading.get_ident() != thread or torch.is_grad_enabled():
        return torch.nn.Linear.forward(module, x)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _Preallocated(DynamicLayer):
    """One layer's keys and values in buffers sized for the whole rollout (prompt + max_new_tokens), each step's
    written in place: DynamicLayer appends with torch.cat, which copies the layer's whole cache at every step
    (a third of a 64 x 256 rollout's time on CPU). `keys` and `values` are views of the filled part, so
    attention reads what it would read from DynamicLayer, and the layer is DynamicLayer for everything else."""

    def __init__(self, layer: DynamicLayer, capacity: int):
        super().__init__()
        self.dtype, self.device, self.is_initialized = layer.dtype, layer.device, True
        self._k, self._v = self._buffers(layer.keys, layer.values, capacity)
        self._set_length(layer.keys.shape[-2])

    @staticmethod
    def _buffers(keys: torch.Tensor, values: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for x in (keys, values):
            buffer = x.new_empty(x.shape[:2] + (capacity, x.shape[-1]))
            buffer[:, :, :x.shape[-2]] = x
            out.append(buffer)
        return out[0], out[1]

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Keep rows `beam_idx` (the rows still running): only the filled part is copied."""
        idx = beam_idx.to(self._k.device)
        self._k, self._v = self._buffers(self.keys[idx], self.values[idx], self._k.shape[2])
        self._set_length(self.length)

    batch_select_indices = reorder_cache


# --- attention over a prompt shared by its group ------------------------------------------------------------
# The G rows of a group attend to the same prompt keys and values. `_SharedPrefix` keeps those once per prompt,
# and `_shared_prefix_attention` (transformers' sdpa attention for every other call) attends in two parts: the
# group's queries together over its prompt (one read of the prompt's K, V for G rows, as vLLM's prefix cache
# gives), each row over its own tokens, then the two softmaxes merged by their log-sum-exp. The result is
# attention over the concatenation, up to float rounding.

SHARED_PREFIX = "minirl_shared_prefix"
_active = threading.local()          # .cache: the decode cache of this thread's decoding call


def _configs(model) -> list:
    """The distinct configs the model's modules read (their attention implementation among them)."""
    return list({id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values())


def _shares_prefix(model, configs: list) -> bool:
    """Whether the decode loop can attend in two parts: sdpa through transformers' attention interface, which the
    two-part function stands in for (Falcon's alibi path tests the name itself), and plain keys (no softcap)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, "_supports_attention_backend", False) and bool(configs) and \
        all(getattr(c, "_attn_implementation", None) == "sdpa" for c in configs)


@contextlib.contextmanager
def _attention(configs: list, cache):
    """With `cache` (a decode cache of _SharedPrefix layers): the model's attention is the two-part one for
    this call, in this thread."""
    if cache is None:
        yield
        return
    _register()
    # the attribute behind transformers' property, whose setter would also overwrite every sub-config
    field = "_attn_implementation_internal" if all(hasattr(c, "_attn_implementation_internal") for c in configs) \
        else "_attn_implementation"
    before, outer = [getattr(c, field) for c in configs], getattr(_active, "cache", None)
    _active.cache = cache
    try:
        for c in configs:
            setattr(c, field, SHARED_PREFIX)
        yield
    finally:
        for c, value in zip(configs, before):
            setattr(c, field, value)
        _active.cache = outer


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(SHARED_PREFIX, _shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX, sdpa_mask)    # the mask sdpa gets: the fallback uses it


def _shared_prefix_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs):
    """transformers' attention-function signature. query (n, H, 1, D); key, value: what _SharedPrefix.update
    returned (the rows' own tokens, (n, Hkv, t, D)). Anything but a one-token step over a _SharedPrefix layer
    with plain keys (another thread's call, a sliding-window layer, softcapping, sinks) goes to sdpa, with the
    full keys and values rebuilt for a _SharedPrefix layer."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    cache = getattr(_active, "cache", None)
    layer = cache.layers[module.layer_idx] if cache is not None else None
    if not isinstance(layer, _SharedPrefix):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    plain = query.shape[2] == 1 and not dropout and all(
        kwargs.get(k) is None for k in ("softcap", "sliding_window", "s_aux", "position_bias"))
    if not plain:
        key, value, mask = layer.full(key, value)
        if attention_mask is not None:       # a mask of transformers' making for this call (e.g. a window)
            mask = mask.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool \
                else mask + attention_mask
        return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, **kwargs)
    return layer.attend(query, key, value, scaling), None


class _SharedPrefix(_Preallocated):
    """One layer's decode cache: the B prompts' keys and values (B, Hkv, P-1, D) once, and the rows' own tokens
    in `_Preallocated`'s buffer (N, Hkv, R, D). `rows`: the rows still running (their index among the N); row r
    belongs to prompt r // G."""

    def __init__(self, layer: DynamicLayer, prefix_mask: torch.Tensor, group_size: int, capacity: int):
        B, heads, P1, D = layer.keys.shape
        own = DynamicLayer()                           # no token of its own yet, for each of the N rows
        own.update(*(x.new_empty((B * group_size, heads, 0, D)) for x in (layer.keys, layer.values)))
        super().__init__(own, capacity)
        self.prompt_k, self.prompt_v = layer.keys, layer.values
        self.G, self.P1 = group_size, P1
        # additive mask over the prompt keys: -inf at left padding; (B, 1, 1, P-1), the queries' dtype
        self.prompt_bias = torch.zeros(B, 1, 1, P1, dtype=layer.dtype, device=layer.device).masked_fill(
            ~prefix_mask.bool()[:, None, None, :], float("-inf"))
        self.no_prefix = ~prefix_mask.bool().any(1)     # (B,) one-token prompts: nothing before their last token
        self._running(torch.arange(B * group_size, device=layer.device))

    def _running(self, rows: torch.Tensor) -> None:
        """Set when rows leave, read by every step: each row's prompt and place in its group, which have no prefix."""
        self.rows, self.owner, self.slot = rows, rows // self.G, rows % self.G
        empty = self.no_prefix[self.owner]
        self.empty = empty if bool(empty.any()) else None

    def get_seq_length(self) -> int:
        return self.P1 + self.length                   # what the mask and the positions count

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Keep rows `beam_idx` of those running: only their own tokens are copied."""
        self._running(self.rows[beam_idx.to(self.device)])
        super().reorder_cache(beam_idx)

    batch_select_indices = reorder_cache

    def full(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each running row's keys and values over the whole sequence (n, Hkv, P-1+t, D), and the additive mask
        of its prompt's padding (n, 1, 1, P-1+t): the fallback."""
        owner = self.owner
        mask = torch.cat([self.prompt_bias[owner], self.prompt_bias.new_zeros(len(owner), 1, 1, key.shape[2])], 3)
        return torch.cat([self.prompt_k[owner], key], 2), torch.cat([self.prompt_v[owner], value], 2), mask

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None):
        """Attention of the running rows' one query each (n, H, 1, D) over their prompt and their own tokens;
        returns (n, 1, H, D), as transformers' attention functions do."""
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu if query.device.type == "cpu" \
            else _attention_with_lse
        n, H, _, D = query.shape
        B, kv_heads = self.prompt_k.shape[:2]
        rep = H // kv_heads                             # query heads per key head (GQA): head h reads h // rep
        q = query.reshape(n, kv_heads, rep, D)
        everyone = n == B * self.G                      # every row running: the groups are the batch's rows
        if everyone:
            grouped = q.view(B, self.G, kv_heads, rep, D).transpose(1, 2)
        else:                                           # the running rows' queries at their place in the group
            grouped = q.new_zeros(B, kv_heads, self.G, rep, D)
            grouped[self.owner, :, self.slot] = q
        out_p, lse_p = flash(grouped.reshape(B, kv_heads, self.G * rep, D), self.prompt_k, self.prompt_v,
                             attn_mask=self.prompt_bias, scale=scale)
        parts = out_p.view(B, kv_heads, self.G, rep, D), lse_p.view(B, kv_heads, self.G, rep, 1)
        out_p, lse_p = [x.transpose(1, 2).reshape(n, kv_heads, rep, -1) if everyone else x[self.owner, :, self.slot]
                        for x in parts]                                             # (n, Hkv, rep, D or 1)
        if self.empty is not None:
            # a prompt of one token has no prefix: its part must weigh 0 (the flash op gives lse 0, not -inf)
            lse_p = lse_p.masked_fill(self.empty[:, None, None, None], float("-inf"))
            out_p = out_p.masked_fill(self.empty[:, None, None, None], 0.0)
        out_r, lse_r = flash(q, key, value, scale=scale)                                       # own tokens
        # the two softmaxes merged: the prompt part's share of the total mass is sigmoid(lse_p - lse_r)
        out = torch.lerp(out_r, out_p, torch.sigmoid(lse_p - lse_r[..., None]))
        return out.reshape(n, 1, H, D).to(query.dtype)


def _attention_with_lse(q, k, v, attn_mask=None, scale=None):
    """(softmax(q k^T * scale + mask) v, logsumexp) in plain torch, for devices without the CPU flash op."""
    scores = (q @ k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        scores = scores + attn_mask
    lse = scores.logsumexp(-1)
    weights = (scores - lse[..., None]).exp().nan_to_num(0.0)     # a fully masked row: 0, not NaN
    return weights.to(v.dtype) @ v, lse


def _accepts(model, argument: str) -> bool:
    """Whether the model's forward takes `argument` (a LoRA wrapper forwards it to the model it wraps)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return argument in inspect.signature(inner.forward).parameters

"""The decode loop's KV cache (engines/decode.py): buffers written in place, and attention over a prompt kept once
for its group.

- `_Preallocated`: one layer's keys and values in buffers sized for the whole rollout, rows that leave compacted
  in place (DynamicLayer's torch.cat would copy the layer's cache at every step).
- `_SharedPrefix` and `_shared_prefix_attention`: each prompt's keys and values kept once, attention in two parts
  merged by their log-sum-exp; it must equal sdpa over the whole sequence (tests/core/test_rollout_speed_paths.py:
  test_two_part_attention_is_attention_over_the_whole_sequence), and the decode loop must sample what generate
  samples (the same file; decode.check_model runs it against one forward on each model before using it).
- `attention_kernel`: the kernel of each part, by device (the CPU flash op; plain torch elsewhere).

Shapes: B prompts, G rows a prompt, N = B*G rows, n <= N still running, Hkv key heads, D head size.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch
from transformers.cache_utils import DynamicLayer


class _Preallocated(DynamicLayer):
    """One layer's keys and values in buffers sized for the whole rollout (prompt + max_new_tokens), each step's
    written in place: DynamicLayer appends with torch.cat, which copies the layer's whole cache at every step
    (a third of a 64 x 256 rollout's time on CPU). `keys` and `values` are views of the filled part, so
    attention reads what it would read from DynamicLayer, and the layer is DynamicLayer for everything else.
    Keys and values each get a buffer of their own shape (DeepSeek-V3's MLA caches a latent and a rotary part of
    other sizes). Rows that leave are compacted in place: the buffers' first n rows are the batch's."""

    def __init__(self, layer: DynamicLayer, capacity: int):
        super().__init__()
        self.dtype, self.device, self.is_initialized = layer.dtype, layer.device, True
        self._k, self._v = self._buffers(layer.keys, layer.values, capacity)
        self.n = len(self._k)                          # rows in the batch: the buffers' first n
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
        self.keys, self.values = self._k[:self.n, :, :length], self._v[:self.n, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        self._k[:self.n, :, self.length:end] = key_states
        self._v[:self.n, :, self.length:end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Keep rows `beam_idx` (the rows still running): their filled part moves to the buffers' first rows; no
        buffer is allocated (but for more rows than the buffers hold, which the decode loop never asks)."""
        idx = beam_idx.to(self._k.device)
        if len(idx) > len(self._k):
            self._k, self._v = self._buffers(self.keys[idx], self.values[idx], self._k.shape[2])
        else:
            for buffer, filled in ((self._k, self.keys), (self._v, self.values)):
                buffer[:len(idx), :, :self.length] = filled[idx]        # the gather copies first: no overlap
        self.n = len(idx)
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


class NotSharedKeysError(RuntimeError):
    """The two-part attention cannot serve a model (check_model then declines it)."""


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
    if not all(x.shape == y.shape and x.data_ptr() == y.data_ptr() for x, y in ((key, layer.keys),
                                                                               (value, layer.values))):
        raise NotSharedKeysError(f"{type(module).__name__} attends to keys and values other than those it cached "
                                 "(e.g. DeepSeek-V3's MLA expands a compressed cache), so the prompt's part cannot "
                                 "be read from the cache")
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
        B, _, P1, _ = layer.keys.shape
        own = DynamicLayer()                           # no token of its own yet, for each of the N rows
        own.update(*(x.new_empty((B * group_size, x.shape[1], 0, x.shape[3])) for x in (layer.keys, layer.values)))
        super().__init__(own, capacity)
        self.prompt_k, self.prompt_v = layer.keys, layer.values
        self.G, self.P1 = group_size, P1
        # additive mask over the prompt keys: -inf at left padding; (B, 1, 1, P-1), the queries' dtype
        self.prompt_bias = torch.zeros(B, 1, 1, P1, dtype=layer.dtype, device=layer.device).masked_fill(
            ~prefix_mask.bool()[:, None, None, :], float("-inf"))
        no_prefix = ~prefix_mask.bool().any(1)          # (B,) one-token prompts: nothing before their last token
        self.no_prefix = no_prefix if bool(no_prefix.any()) else None       # one host sync, here, not per step
        self._running(torch.arange(B * group_size, device=layer.device))

    def _running(self, rows: torch.Tensor) -> None:
        """Set when rows leave, read by every step: each row's prompt and place in its group, which have no prefix."""
        self.rows, self.owner, self.slot = rows, rows // self.G, rows % self.G
        self.empty = None if self.no_prefix is None else self.no_prefix[self.owner]

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
        returns (n, 1, H, D), as transformers' attention functions do. In fp32 with autocast off, whatever the
        caller's autocast: the two parts and their log-sum-exps must be merged in one dtype (under bf16 autocast
        the matmuls would round the parts to bf16 beside an fp32 log-sum-exp, and torch.lerp refuses the mix)."""
        # device-branch: decode/attention-kernel
        with torch.autocast(query.device.type, enabled=False):
            return self._attend(query.float(), key.float(), value.float(), scale).to(query.dtype)

    def _attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None):
        flash = attention_kernel(query.device)
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
        parts = out_p.view(B, kv_heads, self.G, rep, -1), lse_p.view(B, kv_heads, self.G, rep, 1)   # -1: V's dim
        out_p, lse_p = [x.transpose(1, 2).reshape(n, kv_heads, rep, -1) if everyone else x[self.owner, :, self.slot]
                        for x in parts]                                             # (n, Hkv, rep, D or 1)
        if self.empty is not None:
            # a prompt of one token has no prefix: its part must weigh 0 (the flash op gives lse 0, not -inf)
            lse_p = lse_p.masked_fill(self.empty[:, None, None, None], float("-inf"))
            out_p = out_p.masked_fill(self.empty[:, None, None, None], 0.0)
        out_r, lse_r = flash(q, key, value, scale=scale)                                       # own tokens
        # the two softmaxes merged: the prompt part's share of the total mass is sigmoid(lse_p - lse_r)
        out = torch.lerp(out_r, out_p, torch.sigmoid(lse_p - lse_r[..., None]))
        return out.reshape(n, 1, H, -1)


def attention_kernel(device: torch.device):
    """The kernel of each part of the two-part attention: (q, k, v, attn_mask=, scale=) -> (out, logsumexp).
    CPU: torch's flash op for CPU, which returns its log-sum-exp; elsewhere the same in plain torch. Tests
    override this function to run a GPU's kernel on CPU (tests/core/test_decode_device_paths.py)."""
    # device-branch: decode/attention-kernel
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu if device.type == "cpu" \
        else _attention_with_lse


def _attention_with_lse(q, k, v, attn_mask=None, scale=None):
    """(softmax(q k^T * scale + mask) v, logsumexp) in plain torch, for devices without the CPU flash op."""
    scores = (q @ k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        scores = scores + attn_mask
    lse = scores.logsumexp(-1)
    weights = (scores - lse[..., None]).exp().nan_to_num(0.0)     # a fully masked row: 0, not NaN
    return weights.to(v.dtype) @ v, lse

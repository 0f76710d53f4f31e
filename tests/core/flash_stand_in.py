"""A CPU stand-in for flash-attn 2, so that a CPU test runs the branch a GPU with flash-attn installed takes.

`install()` registers `attention` in transformers' AttentionInterface (and flash's 2-D padding mask in its
AttentionMaskInterface) under NAME; a model loaded with `attn_implementation=NAME` then runs it where it would run
transformers' `flash_attention_forward` (integrations/flash_attention.py, 5.23), which this mirrors step by step:

1. the dtype the kernel gets: transformers' own `get_target_dtype` (an fp32 query is cast to the autocast dtype,
   else to the dtype of the model's first nn.Linear: fp32 for an fp32 model outside autocast);
2. flash-attn's dtype rule: fp16 and bf16 only, q/k/v of one dtype; anything else raises flash-attn's own
   RuntimeError ("FlashAttention only support fp16 and bf16 data type");
3. its padding rule: with a padding mask the rows are unpadded by transformers' own `_upad_input` (the queries'
   mask is the last q_len columns of the 2-D mask: left padding assumed when q_len is neither kv_len nor 1), run
   as variable-length sequences, and padded back with zeros at padded query positions;
4. its causal rule: the causal mask is aligned to the bottom right of each (unpadded) sequence (flash-attn >= 2.1),
   and a sliding window of w keeps w - 1 keys to the left, as transformers passes it.

5. its packed-sequence rule: no mask, batch 1, position ids restarting at 0 at each row (minirl/packing.py) ->
   variable-length sequences cut where the positions restart (transformers' `_prepare_from_posids`).

It computes each sequence with torch's sdpa (in the half dtype, as flash-attn does). Left out: softcap, dropout,
the paged cache.
"""
import torch
import torch.nn.functional as F

NAME = "minirl_fa2_stand_in"  # no "flash" in the name: transformers would look for a flash-attn package for it
calls = {"dense": 0, "varlen": 0}  # how often each kernel ran (a test asserts the stand-in was used)


def install() -> str:
    """Register the stand-in (idempotent) and return its attn_implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME


def _check_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """flash-attn's checks (csrc/flash_attn/flash_api.cpp), with its messages."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("query and key must have the same dtype")


def _attend(q, k, v, scale, causal: bool, window_left: int) -> torch.Tensor:
    """One sequence: q (Lq, Hq, D), k and v (Lk, Hk, D) -> (Lq, Hq, D); causal aligned bottom-right."""
    Lq, Lk = q.shape[0], k.shape[0]
    row = torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq)      # each query's position among the keys
    col = torch.arange(Lk, device=q.device)[None, :]
    allowed = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= col <= row
    if window_left >= 0:
        allowed &= col >= row - window_left
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed,
                                         scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(0, 1)                                        # (Lq, Hq, D)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_left=-1) -> torch.Tensor:
    """(B, Lq, Hq, D), (B, Lk, Hk, D) x2 -> (B, Lq, Hq, D)"""
    _check_dtypes(q, k, v)
    calls["dense"] += 1
    return torch.stack([_attend(q[b], k[b], v[b], softmax_scale, causal, window_left) for b in range(len(q))])


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                           window_left=-1) -> torch.Tensor:
    """Sequences concatenated: q (total_q, Hq, D), k and v (total_k, Hk, D), cumulative lengths (B + 1,)."""
    _check_dtypes(q, k, v)
    calls["varlen"] += 1
    out = torch.zeros_like(q)
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if qe > qs:
            out[qs:qe] = _attend(q[qs:qe], k[ks:ke], v[ks:ke], softmax_scale, causal, window_left)
    return out


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, sliding_window=None,
              softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: (B, H, L, D) in, ((B, Lq, Hq, D), None) out."""
    from transformers.integrations.flash_attention import get_target_dtype
    from transformers.modeling_flash_attention_utils import (_is_packed_sequence, _pad_input, _prepare_from_posids,
                                                             _unpad_input, _upad_input, fa_peft_integration_check)
    if softcap is not None or dropout:
        raise NotImplementedError("the flash-attn stand-in has no softcap or dropout")
    q_len, batch = query.shape[2], query.shape[0]
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)             # (B, L, H, D)
    q, k, v = fa_peft_integration_check(q, k, v, get_target_dtype(query, module))
    causal = module.is_causal if is_causal is None else is_causal
    window_left = sliding_window - 1 if sliding_window is not None and k.shape[1] > sliding_window else -1
    position_ids = kwargs.get("position_ids")
    if attention_mask is None and _is_packed_sequence(position_ids, batch):  # rows packed into one: varlen by positions
        qu, ku, vu, (cu_q, cu_k), _ = _prepare_from_posids(q, k, v, position_ids)
        out = flash_attn_varlen_func(qu, ku, vu, cu_q, cu_k, scaling, causal, window_left)
        return out.view(batch, -1, *out.shape[-2:]), None
    if attention_mask is not None:  # a padding token somewhere: unpad, run variable-length, pad back with zeros
        qu, ku, vu, indices_q, (cu_q, cu_k), _ = _upad_input(q, k, v, attention_mask, q_len, _unpad_input)
        out = flash_attn_varlen_func(qu, ku, vu, cu_q, cu_k, scaling, causal, window_left)
        return _pad_input(out, indices_q, batch, q_len), None
    return flash_attn_func(q, k, v, scaling, causal, window_left), None

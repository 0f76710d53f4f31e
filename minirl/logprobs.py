"""Per-token log-probabilities of responses under a causal LM: the trainer's teacher-forced forward pass.

The definition is `logprobs_by_definition`: log_softmax(model(ids).logits / T) at the response tokens, the
distribution `generate` samples from. `token_logprobs` computes the same numbers with two optimisations:

1. The LM head chunk by chunk (`chunked_logprobs`). It never builds the (N, R, V) fp32 log-softmax: the body's
   last hidden states go through the LM head and the model's own final transform (`final_logits_transform`:
   Gemma's soft-capping, Cohere's and Granite's logit scales) a chunk of tokens at a time, and only the gathered
   log-prob (and the entropy) of each token leaves the chunk. The head runs in fp32 whatever the autocast or the
   weights' dtype (`fp32_head`): bf16 logits would be quantised to 0.125 near +-30. Under autograd each chunk is
   checkpointed when the batch's logits exceed one chunk's budget (LOGITS_PER_CHUNK), so its logits are recomputed
   in backward instead of being stored (peak memory ~ one chunk's logits; scripts/bench_logprobs.py measures).
2. Prompt sharing (`states_before_responses`). Adjacent rows with the same prompt (a GRPO group) run it through
   the transformer once; its KV cache serves all of them. Only where that is exact (see its docstring).

3. Packing (`packed_logprobs`, config pack_sequences, off by default): the rows' real tokens end to end without
   padding, a group's prompt laid once in the same pass (minirl/packing.py lays them out); `check_packing` refuses
   a model for which that is not exact.

`check_exact` runs 1 and 2 on a short batch when a model is loaded, and refuses a model whose log-probs they do
not reproduce (docs/architectures.md lists the families refused, and why): a property of the architecture's
forward, checked in fp32 where the model runs in fp32, else at its dtype's resolution.

Shapes: N sequences, P prompt tokens (left-padded), R response tokens (right-padded), V vocabulary, H hidden.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from minirl import packing
from minirl.config import ConfigError


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` computes them: the first real token is position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def logprobs_by_definition(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                           temperature: float = 1.0) -> torch.Tensor:
    """What token_logprobs computes, without its optimisations: the whole (N, P+R, V) logits at once. -> (N, R)"""
    R = num_response_tokens
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask), use_cache=False).logits[:, -R - 1:-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)                        # (N, R, V)
    return logp.gather(-1, input_ids[:, -R:, None]).squeeze(-1)


# -- the model's own logit path ---------------------------------------------------------------------------

def final_logits_transform(model) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What the causal-LM class does to the LM head's output before it returns logits, in the same operations
    (so fp32 results are bitwise the same), read from the config of the families transformers ships with one:
    Granite and MiniCPM3 divide by `logits_scaling` (MiniCPM3 its hidden states: the same for a bias-free head),
    HyperCLOVA X multiplies by it, Cohere multiplies by `logit_scale`, Gemma 2-4 (and others) soft-cap at
    `final_logit_softcapping`, RecurrentGemma at `logits_soft_cap`. None: the head's output is the logits."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    steps = []
    scaling = getattr(config, "logits_scaling", None)
    if scaling not in (None, 1, 1.0):
        multiply = getattr(config, "model_type", "") == "hyperclovax"
        steps.append((lambda x: x * scaling) if multiply else (lambda x: x / scaling))
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, (int, float)) and scale != 1:
        steps.append(lambda x: x * scale)
    cap = getattr(config, "final_logit_softcapping", None) or getattr(config, "logits_soft_cap", None)
    if cap:
        steps.append(lambda x: torch.tanh(x / cap) * cap)
    if not steps:
        return None

    def transform(logits: torch.Tensor) -> torch.Tensor:
        for step in steps:
            logits = step(logits)
        return logits
    return transform


class InexactModelError(ConfigError):
    """A model whose log-probs minirl's forward pass does not reproduce: training it would follow another
    policy's gradient, so it is refused."""


HALF = (torch.float16, torch.bfloat16)


@torch.no_grad()
def check_exact(model, compute_dtype: torch.dtype | None = None, tolerance: float | None = None) -> None:
    """Refuse a model (InexactModelError) whose log-probs token_logprobs does not reproduce. Two properties of the
    architecture's forward, on a short batch (two rows sharing a prompt, then a left-padded one; 3 x 12 tokens):

    1. the logit path: the LM head and `final_logits_transform` over the decoder's last states give the logits
       `model(ids)` returns (the same operations in the same dtype: equal but for a transform the model rounds
       in another order);
    2. prompt sharing: token_logprobs with the group's prompt run once equal those of whole rows.

    Both are properties of the architecture, so they are checked in fp32 (tolerance 1e-4) wherever the model can
    run in fp32: half weights (a frozen LoRA base, the reference) are upcast for the check and cast back (bf16 ->
    fp32 -> bf16 is exact), and an attention kernel that takes only fp16/bf16 (flash-attn) is swapped for sdpa
    for the check (the same maths). That kernel also runs the check under autocast in `compute_dtype`, as the
    trainer runs it, where both comparisons differ by that dtype's rounding, which scales with the logits:
    tolerance k * u * max|logit| (u the unit roundoff, 2^-8 in bf16; k = 2 for 1; k = 8 for 2, measured on
    SmolLM2-135M in bf16: 0.5-2.5 u * max|logit| over a 30-layer body). Only a quantised base (bitsandbytes),
    which cannot run in fp32, is checked at that looser tolerance alone.

    A forward pass that fails in fp32 and runs in half precision is the kernel's dtype rule, never the
    architecture: with `compute_dtype` fp32 (or None) that is a ConfigError naming the fix."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    name = type(model).__name__
    if head is None or not hasattr(head, "weight"):
        raise InexactModelError(f"{name} has no LM head minirl can chunk (get_output_embeddings() is "
                                f"{type(head).__name__}); see docs/architectures.md")
    V, device = head.weight.shape[0], head.weight.device
    ids = (torch.arange(36, device=device).view(3, 12) * 7 + 3) % V
    ids[1, :8] = ids[0, :8]                                         # one prompt of 8 tokens, two responses
    mask = torch.ones_like(ids)
    mask[2, :2] = 0                                                 # and a left-padded prompt
    was_training = model.training
    model.eval()
    try:
        checks = []                                                 # (errors, loose tolerance allowed)
        try:
            # device-branch: logprobs/check-exact-dtype
            with torch.autocast(device.type, enabled=False), _in_fp32(model):  # fp32 weights compute fp32
                checks.append((_exactness_errors(model, ids, mask), False))
        except Exception as e:  # noqa: BLE001  (a kernel that takes no fp32; or no decoder, no position_ids, ...)
            half = compute_dtype if compute_dtype in HALF else torch.bfloat16
            try:
                with torch.autocast(device.type, dtype=half):  # device-branch: logprobs/check-exact-dtype
                    checks.append((_exactness_errors(model, ids, mask), True))
            except Exception:  # noqa: BLE001
                raise InexactModelError(f"minirl cannot run its forward pass on {name}: {type(e).__name__}: {e}; "
                                        "see docs/architectures.md") from e
            if compute_dtype not in HALF:
                attn = getattr(model.config, "_attn_implementation", None)
                raise ConfigError(
                    f"{name} runs in {half} but not in {compute_dtype or torch.float32} ({type(e).__name__}: {e}): "
                    f"its attention kernel ({attn}) computes in float16/bfloat16 only; pass --dtype bfloat16 "
                    "(minirl computes under autocast), or --attn_implementation sdpa") from e
            # device-branch: logprobs/check-exact-dtype (the architecture in fp32 with sdpa: the half-only
            # kernel's rounding hides no bug)
            try:
                with torch.autocast(device.type, enabled=False), _in_fp32(model), _attention(model, "sdpa"):
                    checks.append((_exactness_errors(model, ids, mask), False))
            except Exception:  # noqa: BLE001  (quantised weights, or a model that cannot swap its attention)
                pass
    finally:
        model.train(was_training)
    for (path_error, sharing_error, u, scale), loose in checks:
        for what, error, k in (("logit", path_error, 2), ("sharing", sharing_error, 8)):
            limit = tolerance or (max(1e-4, k * u * scale) if loose else 1e-4)
            if not error <= limit:                                  # also refuses NaN
                raise InexactModelError(f"minirl cannot compute {name}'s log-probs exactly: " + (
                    f"max |log_softmax(final transform(LM head(last states))) - log_softmax(model(ids).logits)| = "
                    f"{error:.3g} > {limit:.3g} on a test batch; its causal-LM class transforms the LM head's "
                    "output in a way minirl does not reproduce" if what == "logit" else
                    f"sharing a prompt's KV cache across its group changes log-probs by {error:.3g} > {limit:.3g} "
                    "on a test batch; its attention or positions depend on more than the prompt") +
                    " (docs/architectures.md lists the families minirl supports)")


@contextlib.contextmanager
def _in_fp32(model):
    """Half-precision weights and buffers upcast to fp32 for the duration, then cast back to the dtype each had
    (bf16/fp16 -> fp32 -> bf16/fp16 is exact). Peak: the model in fp32 while it lasts. A quantised (integer)
    weight cannot be upcast: then this raises, and the caller checks in half precision."""
    tensors = [(m, kind, n) for m in model.modules() for kind in ("_parameters", "_buffers")
               for n, t in getattr(m, kind).items() if t is not None and t.dtype in HALF]
    if any(not p.is_floating_point() for p in model.parameters()):
        raise TypeError("quantised weights run in their own dtype only")
    saved = [(m, kind, n, getattr(m, kind)[n].dtype) for m, kind, n in tensors]
    try:
        for m, kind, n, _ in saved:
            getattr(m, kind)[n].data = getattr(m, kind)[n].data.float()
        yield
    finally:
        for m, kind, n, dtype in saved:
            getattr(m, kind)[n].data = getattr(m, kind)[n].data.to(dtype)


@contextlib.contextmanager
def _attention(model, implementation: str):
    """The model's attention kernel swapped for `implementation` for the duration (transformers'
    set_attn_implementation), then put back."""
    before = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def _exactness_errors(model, ids: torch.Tensor, mask: torch.Tensor, R: int = 4) -> tuple[float, float, float, float]:
    """check_exact's two comparisons at the precision the model runs in now. -> (logit path error, prompt sharing
    error, unit roundoff u of the lowest precision computed in, max|logit|)"""
    head, transform = model.get_output_embeddings(), final_logits_transform(model)
    positions = position_ids_from_mask(mask)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits  # (N, T, V)
    states = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions,
                                 use_cache=False).last_hidden_state                                  # (N, T, H)
    mine = head(states) if transform is None else transform(head(states))  # the model's operations, shapes, dtype
    path_error = (torch.log_softmax(mine.float(), -1) - torch.log_softmax(logits.float(), -1)).abs().max()
    hidden = states[:, -R - 1:-1]                                           # (N, R, H) before each response token
    whole, _ = chunked_logprobs(hidden, ids[:, -R:], head, transform=transform)
    shared, _ = token_logprobs(model, ids, mask, R)
    low = logits.dtype
    if torch.is_autocast_enabled(ids.device.type):  # device-branch: logprobs/check-exact-dtype
        low = max(low, torch.get_autocast_dtype(ids.device.type), key=lambda d: torch.finfo(d).eps)
    return (float(path_error), float((shared - whole).abs().max()), torch.finfo(low).eps / 2,
            float(logits.float().abs().max()))


# -- optimisation 1: the LM head, chunk by chunk ----------------------------------------------------------

LOGITS_PER_CHUNK = 1 << 24  # at most 16M fp32 logits (64 MB) per chunk: ~110 tokens at V=152k
MAX_CHUNK_TOKENS = 128      # and at most 128 tokens (16 MB at V=32k), still large enough for an efficient matmul


def fp32_head(lm_head: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The LM head as a function that returns fp32 logits computed in fp32, whatever the autocast and whatever the
    weight's dtype (FSDP's bf16 parameters, a bf16 frozen base): bf16 logits near +-30 are quantised to 0.125,
    and that noise reaches every ratio and the KL (MiniMax-M1 traced its trainer/sampler mismatch to it). A half
    weight is upcast once per call (V x H x 4 bytes while the call lasts), not per chunk. A head that is no plain
    nn.Linear (a quantised or adapter-wrapped one) runs as it is, its output upcast."""
    weight, bias = getattr(lm_head, "weight", None), getattr(lm_head, "bias", None)
    # FSDP2's FSDPLinear subclasses nn.Linear and keeps its forward: a plain head
    if type(lm_head).forward is not torch.nn.Linear.forward or not weight.is_floating_point():
        return lambda hidden: lm_head(hidden).float()
    # a body in half precision: its states carry bf16's rounding, which TF32's (2^-11) does not add to, and TF32
    # runs the V x H matmul ~8x faster than IEEE fp32 on a GPU; an fp32 run keeps IEEE fp32 (exactness checks)
    tf32 = torch.is_autocast_enabled(weight.device.type) or weight.dtype in HALF  # device-branch: logprobs/fp32-head
    weight, bias = weight.float(), None if bias is None else bias.float()

    def head(hidden: torch.Tensor) -> torch.Tensor:
        # device-branch: logprobs/fp32-head
        with torch.autocast(hidden.device.type, enabled=False), _tf32_matmuls(hidden.device, tf32):
            return torch.nn.functional.linear(hidden.float(), weight, bias)
    return head


@contextlib.contextmanager
def _tf32_matmuls(device: torch.device, on: bool):
    """fp32 matmuls on `device` in TF32 for the duration (CUDA only; torch's new precision API, restored after).
    Where the user set the precision through the legacy flags, torch refuses to read the new one: left as is."""
    matmul = torch.backends.cuda.matmul
    before = None
    if on and device.type == "cuda":  # device-branch: logprobs/fp32-head
        try:
            before = matmul.fp32_precision
            matmul.fp32_precision = "tf32"
        except RuntimeError:  # the legacy allow_tf32 flag was set: mixing the two APIs is an error in torch
            before = None
    try:
        yield
    finally:
        if before is not None:
            matmul.fp32_precision = before


def _chunk_logp(hidden: torch.Tensor, targets: torch.Tensor, head, transform, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden (n, H), targets (n,) -> logp (n,) fp32 (with its graph), entropy (n,) or None (a metric: no graph).
    The chunk's (n, V) logits die here; the fused log-softmax and gather are those of logprobs_by_definition."""
    logits = head(hidden)                                                   # (n, V) fp32
    if transform is not None:
        logits = transform(logits)
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        return logp, -(logp_all.exp() * logp_all).sum(-1)


def chunked_logprobs(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module,
                     temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False,
                     transform: Callable[[torch.Tensor], torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(transform(lm_head(hidden)) / temperature)[targets] chunk by chunk (and the entropy, without
    gradients), the head computed in fp32 (fp32_head). (N, R, H), (N, R) -> (N, R), (N, R) | None"""
    N, R, H = hidden.shape
    V = lm_head.weight.shape[0]
    chunk_tokens = chunk_tokens or max(16, min(MAX_CHUNK_TOKENS, LOGITS_PER_CHUNK // V))
    # checkpointing bounds the logits kept for backward to one chunk's; when all of them fit in that bound anyway
    # (a small vocabulary or batch), keeping them saves recomputing the LM head in backward (~10% of the step)
    recompute = torch.is_grad_enabled() and N * R * V > LOGITS_PER_CHUNK
    head = fp32_head(lm_head)
    flat_h, flat_y = hidden.reshape(N * R, H), targets.reshape(N * R)
    logps, entropies = [], []
    for s in range(0, N * R, chunk_tokens):
        args = (flat_h[s:s + chunk_tokens], flat_y[s:s + chunk_tokens], head, transform, temperature, with_entropy)
        lp, ent = checkpoint(_chunk_logp, *args, use_reentrant=False) if recompute else _chunk_logp(*args)
        logps.append(lp)
        entropies.append(ent)
    entropy = torch.cat(entropies).view(N, R) if with_entropy else None
    return torch.cat(logps).view(N, R), entropy


# -- optimisation 2: a prompt shared by its group ---------------------------------------------------------

def states_before_responses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, R: int,
                            share_prompts: bool = True) -> torch.Tensor:
    """The last layer's hidden state before each response token: (N, P+R) -> (N, R, H).

    Adjacent rows with the same prompt (a GRPO group: G samples of one prompt) share it: the prompt runs through
    the model once, and its KV cache is copied to each of its rows before the responses run on it; gradients
    flow back through the copies. A prompt token attends only to the prompt, so with the same positions and
    rotary frequencies in both passes these are the states of one pass over every row (up to float rounding).
    Every row runs whole instead where that does not hold or cannot work: RoPE whose frequencies depend on the
    longest position in the call (`dynamic`, `longrope`: the prompt-only pass would use the short ones), caches
    that are not plain appended keys and values (linear attention), gradient checkpointing (transformers drops
    the cache there) and FSDP (each layer would be gathered twice per step). A packed pass (`packed_logprobs`,
    config pack_sequences) shares the prompt within its one pass, under both."""
    decoder = model.get_decoder()
    positions = position_ids_from_mask(attention_mask)
    P = input_ids.shape[1] - R
    prompt, prompt_mask = input_ids[:, :P], attention_mask[:, :P]
    first = torch.ones(len(prompt), dtype=torch.bool, device=prompt.device)     # (N,) a new prompt starts here
    first[1:] = (prompt[1:] != prompt[:-1]).any(1) | (prompt_mask[1:] != prompt_mask[:-1]).any(1)
    checkpointing = getattr(decoder, "gradient_checkpointing", False) or (  # the flag's name differs by version
        getattr(model, "is_activation_checkpointing", None) if hasattr(model, "is_activation_checkpointing")
        else getattr(model, "is_gradient_checkpointing", False))
    if not share_prompts or P == 0 or bool(first.all()) or checkpointing or length_dependent_rope(model):
        return decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       use_cache=False).last_hidden_state[:, -R - 1:-1]
    owner = first.long().cumsum(0) - 1                     # (N,) each row's prompt among the distinct ones
    unique = first.nonzero().squeeze(1)                    # (U,) the row each distinct prompt is taken from
    out = decoder(input_ids=prompt[unique], attention_mask=prompt_mask[unique], position_ids=positions[unique, :P],
                  use_cache=True)
    cache = getattr(out, "past_key_values", None)          # a recurrent model (Mamba) may return none
    if not _plain_attention_cache(cache):
        return states_before_responses(model, input_ids, attention_mask, R, share_prompts=False)
    cache.reorder_cache(owner)                             # (U, ...) -> (N, ...): each row gets its prompt's K, V
    responses = decoder(input_ids=input_ids[:, P:], attention_mask=attention_mask, position_ids=positions[:, P:],
                        past_key_values=cache, use_cache=True).last_hidden_state                     # (N, R, H)
    # before response token 0: the prompt's last state (left padding: always a real token); then the responses'
    return torch.cat([out.last_hidden_state[owner, -1:], responses[:, :-1]], dim=1)


def length_dependent_rope(model) -> bool:
    """Whether a rotary embedding recomputes its frequencies from the largest position of each forward call
    (the rope types transformers' dynamic_rope_update acts on: "dynamic" variants and "longrope")."""
    for module in model.modules():
        kinds = getattr(module, "rope_type", None)
        for kind in kinds.values() if isinstance(kinds, dict) else [kinds]:
            if isinstance(kind, str) and ("dynamic" in kind or kind == "longrope"):
                return True
    return False


def _plain_attention_cache(cache) -> bool:
    """Only keys and values that each layer appends to: copying them to rows, then appending the responses',
    is exact. Recurrent or convolution states (hybrid linear-attention models) are written in place, which
    autograd cannot take; a custom model may return no cache at all."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    layers = getattr(cache, "layers", None)
    return bool(layers) and hasattr(cache, "reorder_cache") and \
        all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


# -- optimisation 3: rows packed without padding (config pack_sequences) ------------------------------

def packed_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                    temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False,
                    share_prompts: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs's numbers (N, R), 0 at padding, from one pass over the rows packed without padding
    (minirl/packing.py lays them out and says how attention stays within a row). share_prompts: a group's prompt
    laid once, its responses attending to it, where minirl builds the mask (packing.MASKED_KERNELS)."""
    R = num_response_tokens
    N = input_ids.shape[0]
    kernel = getattr(model.config, "_attn_implementation", None) or "eager"
    masked = kernel in packing.MASKED_KERNELS and packing.plain_causal(model)
    pad_id = getattr(model.config, "pad_token_id", None) or 0
    # one bin for a varlen kernel (flash-attn: batch 1, positions restarting per row), else packing.bin_capacity's
    hidden = getattr(model.config.get_text_config(), "hidden_size", 1024)
    packed = packing.pack(input_ids, attention_mask, R, share_prompts and masked,
                          one_bin=kernel not in packing.MASKED_KERNELS, pad_id=pad_id, hidden=hidden)
    mask = None
    if masked:
        embed = model.get_input_embeddings().weight
        mask = packing.attention_mask_4d(packed, None if kernel == "sdpa" else embed.dtype)
    states = model.get_decoder()(input_ids=packed.ids, attention_mask=mask, position_ids=packed.positions,
                                 use_cache=False).last_hidden_state                          # (b, L, H)
    # no response token at all (dynamic sampling's filler rows only): one state, weighted 0, so that the LM head
    # stays in the graph and the backward (FSDP's collectives on every process) runs as for any micro-batch
    empty = packed.where.numel() == 0
    before = packed.before.new_zeros(1) if empty else packed.before
    hidden = states.reshape(-1, states.shape[-1])[before]                                    # (T, H)
    targets = input_ids[:, -R:].reshape(-1)[packed.where] if not empty else input_ids.new_zeros(1)  # (T,)
    logp, entropy = chunked_logprobs(hidden[None], targets[None], model.get_output_embeddings(), temperature,
                                     chunk_tokens, with_entropy, final_logits_transform(model))  # (1, T)
    if empty:
        return logp.new_zeros(N, R) + 0 * logp.sum(), logp.new_zeros(N, R) if with_entropy else None
    out = logp.new_zeros(N * R).index_put((packed.where,), logp[0]).view(N, R)
    if with_entropy:
        entropy = entropy.new_zeros(N * R).index_put((packed.where,), entropy[0]).view(N, R)
    return out, entropy


@torch.no_grad()
def check_packing(model, compute_dtype: torch.dtype | None = None, tolerance: float | None = None) -> None:
    """Refuse (ConfigError, naming pack_sequences) a model whose packed log-probs are not its padded ones on a
    short batch: three rows sharing a prompt with responses of 6, 2 and 1 tokens, a left-padded row with one of 3
    (laid in two bins, the first holding four segments that must not see each other). Collective under FSDP.
    The tolerance is 1e-4 in fp32; where weights or compute are half (`compute_dtype`: FSDP computes in it) the
    two differ by that rounding, 8 * 2^-8 * max|logp| (check_exact's margin for prompt sharing)."""
    V = model.get_output_embeddings().weight.shape[0]
    device = model.get_output_embeddings().weight.device
    ids = (torch.arange(64, device=device).view(4, 16) * 7 + 3) % V
    ids[1:3, :10] = ids[0, :10]
    mask = torch.ones_like(ids)
    mask[1, 12:], mask[2, 11:], mask[3, :6], mask[3, 13:] = 0, 0, 0, 0
    was_training = model.training
    model.eval()
    try:
        padded, _ = token_logprobs(model, ids, mask, 6)
        packed, _ = token_logprobs(model, ids, mask, 6, packed=True)
    finally:
        model.train(was_training)
    real = mask[:, -6:].bool()
    error = float((padded - packed)[real].abs().max())
    half = {compute_dtype, model.get_input_embeddings().weight.dtype} & {torch.float16, torch.bfloat16}
    limit = tolerance or (8 * 2 ** -8 * float(padded[real].abs().max()) if half else 1e-4)
    if not error <= limit:
        raise ConfigError(f"config key 'pack_sequences': {type(model).__name__}'s packed log-probs differ from its "
                          f"padded ones by {error:.3g} > {limit:.3g} on a test batch (its layers carry state across "
                          "the packed rows, or ignore position_ids); set pack_sequences: false")


# -- the entry points -------------------------------------------------------------------------------------

def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                   temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False,
                   packed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi_T(y_t | x, y_<t) at each response position, and (with_entropy) the entropy, which never has a graph.

    pi_T is the distribution the rollout sampled from: softmax(logits / temperature). Old, reference and current
    log-probs must all use the sampling temperature, or the ratio compares another policy (verl and TRL divide
    the logits by T the same way; top-p/top-k truncation is not modelled, as in both).
    input_ids/attention_mask: (N, P+R), prompt left-padded then response right-padded. Returns (N, R) fp32
    tensors aligned with the response tokens (values at padding are meaningless; mask them).
    packed: the rows' real tokens packed end to end, without padding (minirl/packing.py; config pack_sequences):
    the same numbers up to float rounding, 0 at padding.
    """
    # distributed.shard() gives an FSDP model a `minirl_token_logprobs` method registered as a forward method,
    # so that the root's hooks gather the shards around this whole pass; every other model has none
    sharded = getattr(model, "minirl_token_logprobs", None)
    if sharded is not None:
        return sharded(input_ids, attention_mask, num_response_tokens, temperature, chunk_tokens, with_entropy,
                       packed=packed)
    return _token_logprobs_unsharded(model, input_ids, attention_mask, num_response_tokens, temperature,
                                     chunk_tokens, with_entropy, packed=packed)


@torch.no_grad()
def batched_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                     micro_batch_size: int | list[range], temperature: float = 1.0, with_entropy: bool = False,
                     packed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` without gradients, micro-batch by micro-batch: old log-probs (with the entropy metric)
    and the reference's log-probs. micro_batch_size: rows per micro-batch, or each one's rows (contiguous ranges
    covering the batch in order: packing.split_rows).  -> (N, R), (N, R) | None"""
    N = input_ids.shape[0]
    ranges = micro_batch_size if isinstance(micro_batch_size, list) else \
        [range(s, min(s + micro_batch_size, N)) for s in range(0, N, micro_batch_size)]
    parts = [token_logprobs(model, input_ids[r.start:r.stop], attention_mask[r.start:r.stop], num_response_tokens,
                            temperature, with_entropy=with_entropy, packed=packed) for r in ranges]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]) if with_entropy else None


def _token_logprobs_unsharded(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int,
                              temperature: float = 1.0, chunk_tokens: int | None = None, with_entropy: bool = False,
                              share_prompts: bool = True, packed: bool = False):
    """token_logprobs on a model that is not sharded (or inside FSDP's forward method: distributed.shard).
    share_prompts: the two-pass sharing of states_before_responses (FSDP turns it off); a packed pass shares
    a group's prompt within its one pass whenever its mask allows (packed_logprobs)."""
    if packed:
        return packed_logprobs(model, input_ids, attention_mask, num_response_tokens, temperature, chunk_tokens,
                               with_entropy)
    R = num_response_tokens
    hidden = states_before_responses(model, input_ids, attention_mask, R, share_prompts)          # (N, R, H)
    return chunked_logprobs(hidden, input_ids[:, -R:], model.get_output_embeddings(), temperature, chunk_tokens,
                            with_entropy, final_logits_transform(model))


def __getattr__(name: str):
    """`reference_logprobs`, this function's name before 0.3.1 (CHANGELOG), still resolves, with a warning."""
    if name == "reference_logprobs":
        import warnings
        warnings.warn("minirl.logprobs.reference_logprobs is now logprobs_by_definition", DeprecationWarning, 2)
        return logprobs_by_definition
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

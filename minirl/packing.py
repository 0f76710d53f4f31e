"""Padding-free training passes: rows packed end to end, and micro-batches sized by their real tokens.

A step's rows are one padded (N, P+R) tensor: prompts left-padded to the longest prompt, responses right-padded to
the longest response. `token_logprobs` runs that padding through every layer and the LM head (in `make code`'s runs
the mean response is 0.46 of the longest). `logprobs.packed_logprobs` computes the same numbers (up to float
rounding: tests/core/test_packing.py compares them, and their gradients, with the padded path's) without it,
on the layout built here (this module holds no model code):

1. Each row's real tokens (its prompt without the left padding, its response up to its end) are laid end to end
   in a few bins (first fit, longest first, of the capacity that costs least: `bin_capacity`), each token at the
   position it has in its own row, so the rotary embedding sees the same positions.
2. Attention stays within a row. For the kernels that take a mask (sdpa, eager) minirl builds it: causal within a
   row, nothing across rows. For those that do not (flash-attn) the whole micro-batch is one bin whose
   position_ids restart at 0 at each row, from which transformers derives the varlen boundaries
   (masking_utils.find_packed_sequence_indices, modeling_flash_attention_utils._is_packed_sequence).
3. Prompt sharing in one pass: with a mask, a group's prompt is laid once, followed by its G responses, each
   attending to the prompt and to itself (causally). Unlike logprobs.states_before_responses (the prompt's KV cache
   copied to its rows: a second pass) this needs no cache, so it holds under gradient checkpointing, and under
   FSDP each layer is still gathered once per pass.
4. The LM head runs on the real response tokens only.

Models whose layers are not plain causal attention (sliding windows, chunked attention, linear attention) get no
mask from minirl: they take transformers' own packed path (2.), without prompt sharing; logprobs.check_packing
refuses a model whose packed log-probs differ from its padded ones (a recurrent state leaking across rows).

`split_rows` cuts a step's rows into micro-batches whose real tokens fit a budget (config micro_batch_tokens),
contiguous so that groups stay together, and into a given count (train.py makes it the same on every process:
FSDP's collectives need as many passes everywhere).

Shapes: N rows, P prompt (left-padded), R response (right-padded), H hidden; b bins of L tokens; T response
tokens that are real (the LM head's rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

MASKED_KERNELS = ("sdpa", "eager")  # attention implementations that take minirl's 4D mask


@dataclass
class Packed:
    """A micro-batch laid out without padding. -> (b, L) tensors, and the (T,) indices that map it back."""
    ids: torch.Tensor        # (b, L) the rows' real tokens end to end; a bin's tail is filler
    positions: torch.Tensor  # (b, L) each token's position in its own row (restarting at 0 at each row)
    segment: torch.Tensor    # (b, L) a token attends to the earlier tokens of its segment...
    context: torch.Tensor    # (b, L) ...and to those of this one (its group's prompt; its own segment otherwise)
    laid: torch.Tensor       # (b, L) bool: a row's token (False: a bin's filler)
    before: torch.Tensor     # (T,) flat index into (b * L): the state before each real response token
    where: torch.Tensor      # (T,) flat index into (N * R): that token's place in the padded layout


def plain_causal(model) -> bool:
    """Whether every layer is full causal attention over the positions minirl gives it, so that minirl's own
    mask is the model's (no sliding window, no chunked attention, no linear or recurrent layer)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kinds = getattr(config, "layer_types", None)
    if kinds is not None:
        return all(k == "full_attention" for k in kinds)
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return not window and not getattr(config, "attention_chunk_size", None)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, R: int, share_prompts: bool = True,
         one_bin: bool = False, pad_id: int = 0, hidden: int = 1024) -> Packed:
    """Lay out a micro-batch's real tokens (see the module docstring). share_prompts: adjacent rows with the same
    prompt (a group) lay it once, unless laying each row whole costs less (a group's unit so long that its
    attention outweighs the tokens saved); one_bin: a single bin (varlen kernels), else the bins of
    `bin_capacity` (`hidden`: the model's hidden size, which weighs a bin's attention against its tokens)."""
    N, width = input_ids.shape
    P = width - R
    real = attention_mask.bool()
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)   # logprobs.position_ids_from_mask's
    first = torch.ones(N, dtype=torch.bool)                       # (N,) a new prompt starts at this row
    if share_prompts and N > 1:
        first[1:] = ((input_ids[1:, :P] != input_ids[:-1, :P]) | (real[1:, :P] != real[:-1, :P])).any(1).cpu()
    lengths = real.sum(1).tolist()
    prompt_len, cols = real[:, :P].sum(1).tolist(), [real[r, P:].nonzero().squeeze(1) for r in range(N)]
    piece_len = {"row": lambda r: lengths[r], "prompt": lambda r: prompt_len[r],
                 "response": lambda r: lengths[r] - prompt_len[r]}
    # units: lists of pieces (row, "prompt" | "response" | "row"); a unit never spans two bins
    layouts = []
    for share in [True, False] if share_prompts else [False]:
        units: list[list[tuple[int, str]]] = []
        for r in range(N):
            if not share:
                units.append([(r, "row")])
            elif first[r]:
                units.append([(r, "prompt"), (r, "response")])
            else:
                units[-1].append((r, "response"))
        sizes = [sum(piece_len[kind](r) for r, kind in unit) for unit in units]
        bins = _first_fit(sizes, sum(sizes)) if one_bin else bin_capacity(sizes, hidden)
        L = max(sum(sizes[u] for u in b) for b in bins)
        layouts.append((cost(len(bins), L, hidden), units, bins, L))
    _, units, bins, L = min(layouts, key=lambda layout: layout[0])   # the cheaper; sharing when equal
    ids = torch.full((len(bins), L), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    pos = torch.zeros((len(bins), L), dtype=torch.long, device=input_ids.device)
    seg = torch.zeros((len(bins), L), dtype=torch.long, device=input_ids.device)
    ctx = torch.zeros((len(bins), L), dtype=torch.long, device=input_ids.device)
    laid = torch.zeros((len(bins), L), dtype=torch.bool, device=input_ids.device)
    before, where, n_seg = [], [], 0
    for i, b in enumerate(bins):
        at = 0
        for u in b:
            prompt_seg, prompt_last = None, None
            for r, kind in units[u]:
                take = real[r].clone()                 # (P+R,) this piece's tokens in the padded row
                if kind == "prompt":
                    take[P:] = False
                elif kind == "response":
                    take[:P] = False
                n = int(take.sum())
                ids[i, at:at + n], pos[i, at:at + n] = input_ids[r][take], positions[r][take]
                seg[i, at:at + n], laid[i, at:at + n] = n_seg, True
                ctx[i, at:at + n] = n_seg if prompt_seg is None else prompt_seg
                if kind == "prompt":
                    prompt_seg, prompt_last = n_seg, i * L + at + n - 1  # its last state: before response token 0
                else:
                    start = i * L + at + (prompt_len[r] if kind == "row" else 0)  # the response's first token
                    states = torch.arange(start - 1, start - 1 + len(cols[r]))  # (k,) k may be 0: no response
                    if len(states) and kind == "response":
                        states[0] = prompt_last
                    before.append(states)
                    where.append(r * R + cols[r].cpu())
                n_seg += 1
                at += n
        if at < L:                      # the filler: its own segment, positions from 0 (varlen: its own row)
            seg[i, at:], ctx[i, at:] = n_seg, n_seg
            pos[i, at:] = torch.arange(L - at, device=pos.device)
            n_seg += 1
    device = input_ids.device
    return Packed(ids, pos, seg, ctx, laid, torch.cat(before).to(device), torch.cat(where).to(device))


def bin_capacity(sizes: list[int], hidden: int) -> list[list[int]]:
    """The bins (first fit) of the capacity, among multiples of the longest unit and the total, that costs least:
    b bins of L tokens (the longest bin's; the others are filled up to it) cost b * L token passes through the
    layers plus b * L^2 attention scores (a dense mask computes them all), a score ~1 / (6 * hidden) of a token
    (a layer's matmuls: ~24 H^2 flops a token; its attention: ~4 H a score)."""
    longest, total = max(sizes), sum(sizes)
    best, best_cost = None, float("inf")
    for capacity in sorted({*range(longest, total, longest), total}):
        bins = _first_fit(sizes, capacity)
        price = cost(len(bins), max(sum(sizes[u] for u in b) for b in bins), hidden)
        if price < best_cost:
            best, best_cost = bins, price
    return best


def cost(bins: int, L: int, hidden: int) -> float:
    """A layout's cost in token passes: bins * L tokens through the layers, bins * L^2 attention scores at
    1 / (6 * hidden) of a token each (see bin_capacity)."""
    return bins * L * (1 + L / (6 * hidden))


def _first_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: unit indices per bin, bins in the order of their first unit (deterministic)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for u in sorted(range(len(sizes)), key=lambda u: -sizes[u]):
        for j, left in enumerate(room):
            if sizes[u] <= left:
                bins[j].append(u)
                room[j] -= sizes[u]
                break
        else:
            bins.append([u])
            room.append(capacity - sizes[u])
    for b in bins:
        b.sort()
    return sorted(bins, key=lambda b: b[0])


def attention_mask_4d(packed: Packed, dtype: torch.dtype | None = None) -> torch.Tensor:
    """(b, 1, L, L): query i sees key j <= i of its own segment or of its context. bool (sdpa), or additive in
    `dtype` (eager: 0 where it sees, the dtype's minimum elsewhere, as transformers' eager_mask)."""
    seg, ctx = packed.segment, packed.context
    L = seg.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=seg.device).tril()
    sees = causal & ((seg[:, None, :] == seg[:, :, None]) | (seg[:, None, :] == ctx[:, :, None]))  # (b, L, L)
    if dtype is None:
        return sees[:, None]
    return torch.zeros(sees.shape, dtype=dtype, device=seg.device).masked_fill(~sees, torch.finfo(dtype).min)[:, None]


# -- micro-batches by a token budget ------------------------------------------------------------------------

def split_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, R: int, budget: int, rows: int,
               count: int = 0) -> list[range]:
    """Contiguous micro-batches of rows: with a budget (> 0), as many rows as fit `budget` real tokens (a group's
    prompt counted once, as logprobs.packed_logprobs runs it; a row alone over the budget gets its own
    micro-batch), else `rows` rows each. Then, while there are fewer than `count`, the costliest micro-batch is
    halved (by tokens): every process can run as many passes. -> ranges of rows, covering 0..N-1 in order"""
    N = input_ids.shape[0]
    P = input_ids.shape[1] - R
    real = attention_mask.bool()
    prompt, response = real[:, :P].sum(1).tolist(), real[:, P:].sum(1).tolist()
    new = [True] + ((input_ids[1:, :P] != input_ids[:-1, :P]) | (real[1:, :P] != real[:-1, :P])).any(1).tolist()
    if budget <= 0:
        parts = [range(s, min(s + rows, N)) for s in range(0, N, rows)]
    else:
        parts, start, used = [], 0, 0
        for r in range(N):
            cost = response[r] + (prompt[r] if new[r] or r == start else 0)
            if r > start and used + cost > budget:
                parts.append(range(start, r))
                start, cost = r, response[r] + prompt[r]
                used = 0
            used += cost
        parts.append(range(start, N))

    def tokens(part: range) -> int:
        return sum(response[r] + (prompt[r] if new[r] or r == part.start else 0) for r in part)
    while len(parts) < count:
        splittable = [p for p in parts if len(p) > 1]
        if not splittable:
            raise ValueError(f"cannot split {N} rows into {count} micro-batches")
        part = max(splittable, key=tokens)
        half, acc, cut = tokens(part) / 2, 0, part.start + 1
        for r in part[:-1]:
            acc += response[r] + (prompt[r] if new[r] or r == part.start else 0)
            cut = r + 1
            if acc >= half:
                break
        i = parts.index(part)
        parts[i:i + 1] = [range(part.start, cut), range(cut, part.stop)]
    return parts

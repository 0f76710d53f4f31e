"""The sampler every rollout engine uses: generate's warpers (temperature, top-k, top-p), then the sample.

    processors = sampling_processors(temperature, top_p, top_k, generator)   # for HF generate
    tokens = gumbel_argmax(scores, gumbel_uniforms(n, V, device, generator))  # minirl's decode loop

Sampling uses the Gumbel-max trick (Gumbel 1954; Maddison, Tarlow & Minka 2014, "A* sampling"): the argmax of
logits/T + Gumbel noise is an exact sample from softmax(logits/T). Both paths decode greedily over our own
logits processors (temperature, top-k, top-p, then the sample). The reason is speed on CPUs: torch.multinomial
draws an exponential variate per vocabulary entry, 2.8 ms per token for 64 rows x 2048 entries on a 2-core CPU.
Over a large vocabulary the noise is drawn in two levels (`gumbel_argmax`): a step draws ~450 uniforms per row,
not V, 2 ms instead of 11 for 64 rows x 49k entries (torch's CPU generator is serial).
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessor


class GumbelNoise(LogitsProcessor):
    """The sample, as generate's last processor: the (already tempered and truncated) scores become 0 at the
    token `gumbel_argmax` draws and -inf elsewhere, so generate's greedy pick is that sample. The uniforms come
    from `generator` (a request's own), else from torch's global one."""

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = gumbel_argmax(scores, gumbel_uniforms(*scores.shape, scores.device, self.generator))  # (N,)
        return torch.full_like(scores, -float("inf")).scatter_(1, tokens[:, None], 0.0)


# Vocabularies over GUMBEL_ONE_LEVEL entries are cut into blocks of GUMBEL_BLOCK for the two-level draw
# (gumbel_argmax); up to it, a noise per entry costs little (64 rows x 4k: 0.6 ms) and is the draw.
GUMBEL_BLOCK, GUMBEL_ONE_LEVEL = 256, 4096


def gumbel_uniforms(rows: int, vocab: int, device=None, generator: torch.Generator | None = None) -> torch.Tensor:
    """The uniforms one sampling step of `rows` rows consumes: (rows, V) for a small vocabulary, else
    (rows, V/GUMBEL_BLOCK + GUMBEL_BLOCK), a noise per block then a noise per entry of one block. Both decode
    paths draw them for all N rows."""
    width = vocab if vocab <= GUMBEL_ONE_LEVEL else -(-vocab // GUMBEL_BLOCK) + GUMBEL_BLOCK
    return torch.rand(rows, width, dtype=torch.float32, device=device, generator=generator)


def gumbel_argmax(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """A sample of softmax(scores) per row (n, V) -> (n,): the argmax of scores + Gumbel noise, from the
    uniforms of `gumbel_uniforms`. Over a large vocabulary the noise is drawn in two levels. The largest noisy
    score of a block of entries is Gumbel-distributed around the block's logsumexp, and which entry holds it is
    independent of its value (the Gumbel-max trick applied to the blocks). So a noisy argmax over the blocks'
    logsumexps picks the block, and one over that block's scores the entry: the law of the full argmax, from
    ~450 uniforms a row instead of V. Filtered (-inf) entries are never picked."""
    scores = scores.float()                     # a block's logsumexp rounded to bf16 would bias its odds
    n, V = scores.shape
    if V <= GUMBEL_ONE_LEVEL:                                           # one level: a noise per entry
        return add_gumbel_noise(scores, uniforms).argmax(-1)
    blocks = -(-V // GUMBEL_BLOCK)
    padded = torch.nn.functional.pad(scores, (0, blocks * GUMBEL_BLOCK - V), value=-float("inf")) \
        if blocks * GUMBEL_BLOCK != V else scores
    padded = padded.view(n, blocks, GUMBEL_BLOCK)
    block = add_gumbel_noise(torch.logsumexp(padded, -1), uniforms[:, :blocks]).argmax(-1)           # (n,)
    inside = padded[torch.arange(n, device=scores.device), block]                               # (n, BLOCK)
    return block * GUMBEL_BLOCK + add_gumbel_noise(inside, uniforms[:, blocks:]).argmax(-1)


def add_gumbel_noise(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """scores + Gumbel(0, 1) noise made from uniforms of the same shape (consumed in place)."""
    # U = 0 would give -inf noise: if it hit every kept entry of a row, argmax would pick a filtered token
    u = uniforms.clamp_(min=torch.finfo(uniforms.dtype).tiny)
    return scores - u.log_().neg_().log_()


def warpers(temperature: float, top_p: float, top_k: int) -> list:
    """What generate's sampling mode would apply to the scores, in its order."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    out = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
    out += [TopKLogitsWarper(top_k)] if top_k else []
    return out + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])


def sampling_processors(temperature: float, top_p: float, top_k: int, generator: torch.Generator | None = None
                        ) -> list:
    """The warpers, then the noise that makes greedy decoding a sample."""
    return warpers(temperature, top_p, top_k) + [GumbelNoise(generator)]

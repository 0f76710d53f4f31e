"""Hugging Face `generate`: the readable reference engine, and rollout.sample's path for the models minirl's
decode loop (engines/decode.py) does not take (rollout.shares_prompts says which).

`generate` runs over each prompt repeated G times, with every generation parameter passed explicitly in a fresh
`GenerationConfig`, so a model's shipped `generation_config.json` (a repetition penalty, a default top_p, ...)
cannot change the sampling distribution the loss assumes. The sampling itself is minirl/sampler.py's
processors (the warpers, then the Gumbel-max draw), as in the decode loop.

Where the batch's padded width plus its largest row budget would pass the model's context: `generate` keeps
feeding a finished row, so its positions would run off a learned table (GPT-2, OPT) or rescale a dynamic RoPE
for every row. The rows then run in groups that fit, one generate each, and draw the noise one generate over
all N rows draws: step t's (N, V) uniforms, each group taking its own rows (a replay of the generator's state
at step t for all but the first group to reach it). So the samples, and the random state after them, are the
decode loop's, whichever path the model takes.

Shapes: N rows, P prompt tokens (left-padded), R' response tokens, V entries per step's uniforms
(sampler.gumbel_uniforms)."""
from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList

from minirl.sampler import GumbelNoise, gumbel_argmax, gumbel_uniforms


def generate(model, tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, budgets: torch.Tensor,
              eos_ids: list[int], processors: list, stop: list[str] | None) -> torch.Tensor:
    """Hugging Face generate over the N repeated rows: the path for the models the decode loop does not take.
    Each row ends at its own budget (N,). -> (N, R') response ids, rows that ended early padded.
    generate keeps feeding a finished row, so the batch's padded width plus its largest budget must fit the
    context (else learned positions (GPT-2, OPT) run off their table and dynamic RoPE rescales every row):
    where they do not, the rows run as groups that fit, one generate each, drawing one generate's noise
    (below)."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is None or prompt_ids.shape[1] + int(budgets.max()) <= context:
        return generate_rows(model, tokenizer, prompt_ids, prompt_mask, budgets, eos_ids, processors, stop)
    lengths, parts = prompt_mask.sum(1), []
    noise = [p for p in processors if isinstance(p, GumbelNoise)]
    steps = NoiseSteps(prompt_ids.shape[0], noise[0].generator) if noise else None
    for idx in fitting_groups(lengths.tolist(), budgets.tolist(), context):
        rows = torch.tensor(idx, dtype=torch.long, device=prompt_ids.device)
        width = int(lengths[rows].max())  # the group's own padded width
        parts.append((rows, generate_rows(model, tokenizer, prompt_ids[rows, -width:], prompt_mask[rows, -width:],
                                           budgets[rows], eos_ids, with_group_noise(processors, steps, rows, width),
                                           stop)))
    out = prompt_ids.new_full((prompt_ids.shape[0], max(p.shape[1] for _, p in parts)), tokenizer.pad_token_id)
    for rows, part in parts:
        out[rows, :part.shape[1]] = part
    return out


def generate_rows(model, tokenizer, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, budgets: torch.Tensor,
                   eos_ids: list[int], processors: list, stop: list[str] | None) -> torch.Tensor:
    """One generate over these rows, each ending at its own budget. -> (n, R') response ids."""
    max_new_tokens, P = int(budgets.max()), prompt_ids.shape[1]
    # a row whose budget is spent ends as at an EOS (generate then feeds it padding, which rollout.make_rollout masks)
    at_budget = lambda ids, scores, **kw: ids.shape[1] - P >= budgets.to(ids.device)  # noqa: E731
    # generate() fills every field we leave unset (None) from the model's generation_config, then from HF's
    # global defaults (top_k=50!). So start from those global defaults and set every field ourselves; the
    # sampling fields keep their defaults, because the sampling happens in our processors (module docstring).
    # The length is set once, by max_new_tokens (min_length stays the no-op default 0): setting both
    # min_new_tokens and min_length made transformers warn on every call.
    # Fields whose global default is None (suppress_tokens, sequence_bias, min_new_tokens, ...) would still come
    # from the model's own config, so generate also sees ours as the model's, for this call only.
    fields = {k: v for k, v in GenerationConfig._get_default_generation_params().items() if k != "max_length"}
    fields.update(do_sample=False, max_new_tokens=max_new_tokens, use_cache=True,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids,
                  stop_strings=list(stop) if stop else None)
    gen_config = GenerationConfig(**fields)
    model_config, model.generation_config = model.generation_config, gen_config
    try:
        # synced_gpus=False: with FSDP the trainer gathers the full weights first (distributed.gathered), so no
        # process needs to keep stepping for the others
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, synced_gpus=False,
                             generation_config=gen_config, logits_processor=LogitsProcessorList(processors),
                             stopping_criteria=StoppingCriteriaList([at_budget]),
                             tokenizer=tokenizer if stop else None)                                # (N, P + R')
    finally:
        model.generation_config = model_config
    return out[:, prompt_ids.shape[1]:]


def fitting_groups(lengths: list[int], budgets: list[int], context: int) -> list[list[int]]:
    """Row indices in groups whose longest prompt plus largest budget fit the context: rows by prompt length,
    shortest first (budgets shrink as prompts grow); a row alone always makes a group."""
    groups, top = [], (0, 0)
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        grown = (max(top[0], lengths[i]), max(top[1], budgets[i]))
        if groups and sum(grown) <= context:
            groups[-1].append(i)
        else:
            groups.append([i])
            grown = (lengths[i], budgets[i])
        top = grown
    return groups


class NoiseSteps:
    """Step t's uniforms for all N rows, as one generate draws them: the first group to reach step t draws
    from the generator (a request's own, else torch's global one on that device) after noting its state;
    later groups replay that state on a generator of their own."""

    def __init__(self, rows: int, generator: torch.Generator | None):
        self.rows, self.generator, self.states = rows, generator, []

    def draw(self, t: int, vocab: int, device) -> torch.Tensor:
        source = self.generator or global_generator(device)
        if t == len(self.states):
            self.states.append(source.get_state())
            return gumbel_uniforms(self.rows, vocab, device, self.generator)
        replay = torch.Generator(device).set_state(self.states[t])
        return gumbel_uniforms(self.rows, vocab, device, replay)


def global_generator(device: torch.device) -> torch.Generator:
    """torch's global generator of `device`: the one an unseeded draw there advances."""
    if device.type == "cuda":  # device-branch: generate/cuda-generator
        return torch.cuda.default_generators[device.index or 0]
    return torch.default_generator


class GroupNoise(LogitsProcessor):
    """GumbelNoise for the rows `rows` of a split batch, from the shared NoiseSteps; `width` is the group's
    prompt width (step t's input is width + t tokens)."""

    def __init__(self, steps: NoiseSteps, rows: torch.Tensor, width: int):
        self.steps, self.rows, self.width = steps, rows, width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        u = self.steps.draw(input_ids.shape[1] - self.width, scores.shape[1], scores.device)[self.rows]
        tokens = gumbel_argmax(scores, u)
        return torch.full_like(scores, -float("inf")).scatter_(1, tokens[:, None], 0.0)


def with_group_noise(processors: list, steps: NoiseSteps | None, rows: torch.Tensor, width: int) -> list:
    return [GroupNoise(steps, rows, width) if isinstance(p, GumbelNoise) else p for p in processors]

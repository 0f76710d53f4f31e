"""rollout's generate path where the batch's padded width plus its largest row budget would pass the model's
context: `generate` keeps feeding a finished row, so its positions would run off a learned table (GPT-2, OPT)
or rescale a dynamic RoPE for every row. The rows then run in groups that fit, one generate each, and draw
the noise one generate over all N rows draws: step t's (N, V) uniforms, each group taking its own rows (a
replay of the generator's state at step t for all but the first group to reach it). So the samples, and the
random state after them, are the decode loop's, whichever path the model takes.

Shapes: N rows, V entries per step's uniforms (sampler.gumbel_uniforms)."""
from __future__ import annotations

import torch
from transformers import LogitsProcessor

from minirl.sampler import GumbelNoise, gumbel_argmax, gumbel_uniforms


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
        source = self.generator or (torch.cuda.default_generators[device.index or 0] if device.type == "cuda"
                                    else torch.default_generator)
        if t == len(self.states):
            self.states.append(source.get_state())
            return gumbel_uniforms(self.rows, vocab, device, self.generator)
        replay = torch.Generator(device).set_state(self.states[t])
        return gumbel_uniforms(self.rows, vocab, device, replay)


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

"""The sampling stage of a training step (verl's gen and reward): B prompts from the prompt stream, G
completions each, their rewards, and DAPO's dynamic sampling; then the tensors the trainer's passes take.

    rollout, rows, rewards, position, metrics = sample_and_score(policy, tokenizer, train_rows, scorer, cfg,
                                                                 position, rank, world, timing)
    batch = train_batch(rollout, cfg.mask_truncated, device)

Every process samples its own prompts from one seeded stream (data.prompt_indices); `position` counts the
prompts all processes consumed. Shapes: B prompts, G samples each, N = B*G sequences, R response tokens.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import replace
from typing import Callable

import torch

from minirl.config import Config
from minirl.data import prompt_indices, prompt_text
from minirl.distributed import gathered, global_max, global_min, sum_over_processes
from minirl.rewards import CODE_VERDICTS, JUDGE_ERROR, Scorer, is_code, overlong_penalty
from minirl.rollout import Rollout, concat_rollouts, sample, select_groups


@contextlib.contextmanager
def timed(name: str, timing: dict[str, float]):
    """Add the seconds the block takes to timing[name] (verl's marked_timer; logged as timing_s/<name>)."""
    t0 = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - t0


class JudgeErrors(RuntimeError):
    """More of a step's programs than `max_judge_error_share` got a judge error (JE): the judge is failing (a
    dead server, crashing workers), and training on the rest would learn from a biased few."""


def sample_round(policy, tokenizer, rows: list[dict], scorer: Scorer, cfg: Config, timing: dict[str, float],
                 generate: Callable | None = None, verdicts: Counter | None = None,
                 causes: list[str] | None = None, details_out: list[dict] | None = None
                 ) -> tuple[Rollout, torch.Tensor]:
    """gen and reward once: G completions for each row, and their rewards (N,), NaN for a program the judge
    could not judge (JE: no reward). `generate` has rollout.sample's signature (the vLLM engine's sample,
    minirl/engines); None: rollout.sample. `verdicts`: the judge's verdict of each judged completion ("no code"
    when none was extracted) is counted into it; `causes`: the judge errors' messages are added to it;
    `details_out`: the scorer's details of each completion (answer, verdict) are added to it."""
    with timed("gen", timing), gathered(policy):  # FSDP: full weights once per rollout, not per token
        prompts = [prompt_text(r, tokenizer) for r in rows]
        args = (policy, tokenizer, prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k)
        # the built-in engines decode in chunks that fit the key/value budget (rollout.sample)
        rollout = generate(*args) if generate else sample(*args, kv_budget_gb=cfg.rollout_kv_budget_gb)
    with timed("reward", timing):
        details = scorer.details(rollout.texts, [r for r in rows for _ in range(cfg.group_size)])
        rewards = torch.tensor([d["reward"] for d in details])
        if cfg.overlong_buffer:  # DAPO's soft overlong punishment
            rewards += torch.tensor(overlong_penalty(rollout.response_mask.sum(1).tolist(), cfg.max_new_tokens,
                                                     cfg.overlong_buffer, cfg.overlong_penalty))
    if verdicts is not None:
        verdicts.update(d["verdict"] for d in details if "verdict" in d)
    if causes is not None:
        causes += [d.get("message", "") for d in details if d.get("verdict") == JUDGE_ERROR]
    if details_out is not None:
        details_out += details
    return rollout, rewards.float()


def has_signal(rewards: torch.Tensor) -> bool:
    """Whether a group's rewards differ (NaN, a judge error, is no reward): DAPO's dynamic-sampling filter."""
    r = rewards[~torch.isnan(rewards)]
    return r.numel() > 1 and bool(r.std() > 0)


def check_judge_errors(counts: dict[str, float], max_share: float, causes: list[str]) -> None:
    """Stop the run (JudgeErrors) when more than `max_share` of the step's programs (every process's completions
    sent to the judge) got a judge error; `counts` are the step's critic/verdict/* sums over processes, the
    same on every process, so every process stops together."""
    errors = counts.get(f"critic/verdict/{JUDGE_ERROR}", 0)
    programs = sum(v for k, v in counts.items() if k.startswith("critic/verdict/") and k != "critic/verdict/no code")
    if errors and errors > max_share * programs:
        cause = causes[0] if causes else "(on another process: see its log)"
        raise JudgeErrors(f"{errors:.0f} of the step's {programs:.0f} programs were not judged (judge errors), more "
                          f"than max_judge_error_share {max_share} allows; the first: {cause}")


def sample_and_score(policy, tokenizer, train_rows: list[dict], scorer: Scorer, cfg: Config, position: int,
                     rank: int, world: int, timing: dict[str, float], generate: Callable | None = None,
                     details: list[dict] | None = None
                     ) -> tuple[Rollout, list[dict], torch.Tensor, int, dict[str, float]]:
    """gen and reward for one step: B prompts from the stream, G completions each, their rewards.

    With DAPO's dynamic sampling, groups whose G rewards are all equal (no learning signal) are dropped and
    further prompts sampled, for at most max_sampling_rounds rounds, until every process has B groups. Every
    process runs the same number of rounds and trains the same number of groups (the most any process kept),
    because the update's collectives (gradient sums, FSDP's gathers) need as many passes everywhere: a process
    that kept fewer adds padding groups, copies with an empty response mask (no token, no loss, no gradient).
    Returns (rollout, rows, rewards (N,), new position in the prompt stream, metrics). With a judge, the
    metrics count the verdicts of every completion sampled (dropped groups too), summed over processes:
    `critic/verdict/AC`, ..., `critic/verdict/JE` (a judge error: no server up, a worker's sandbox died),
    `critic/verdict/no code`. A judge error's reward is NaN: `train_batch` masks it out of the loss and
    `group_advantages` leaves it out of its group; more than `max_judge_error_share` of the step's programs
    with one stops the run (JudgeErrors, with the first cause). `details`, if given, receives the scorer's
    details of each trained completion (in the batch's order; {} for padding groups).
    """
    B, G = cfg.prompts_per_step, cfg.group_size
    verdicts: Counter = Counter()
    causes: list[str] = []

    def next_prompts(position: int) -> tuple[list[dict], int]:  # this process's slice; all processes advance
        rows = [train_rows[i] for i in prompt_indices(position + rank * B, B, len(train_rows), cfg.seed)]
        return rows, position + B * world

    def counted() -> dict[str, float]:  # the same keys on every process (the sum is a collective)
        if not scorer.judges_code or not any(map(is_code, train_rows)):
            return {}
        counts = sum_over_processes({f"critic/verdict/{v}": verdicts[v] for v in CODE_VERDICTS})
        check_judge_errors(counts, cfg.max_judge_error_share, causes)
        return counts

    rows, position = next_prompts(position)
    scored: list[dict] = []  # this round's details
    rollout, rewards = sample_round(policy, tokenizer, rows, scorer, cfg, timing, generate, verdicts, causes, scored)
    details = [] if details is None else details
    if not cfg.dynamic_sampling:
        details += scored
        return rollout, rows, rewards, position, counted()
    parts, kept_rows, kept_rewards, rounds = [], [], [], 1
    while True:
        keep = [g for g in range(B) if has_signal(rewards[g * G:(g + 1) * G])][:B - len(kept_rows)]
        details += [scored[g * G + j] for g in keep for j in range(G)]
        parts.append(select_groups(rollout, keep))
        kept_rows += [rows[g] for g in keep]
        kept_rewards.append(rewards.view(B, G)[keep].reshape(-1))
        if global_min(len(kept_rows)) == B or rounds >= cfg.max_sampling_rounds:
            break
        rows, position = next_prompts(position)
        scored = []
        rollout, rewards = sample_round(policy, tokenizer, rows, scorer, cfg, timing, generate, verdicts, causes,
                                        scored)
        rounds += 1
    kept = len(kept_rows)
    padding = max(int(global_max(kept)), 1) - kept
    if padding:
        filler = select_groups(rollout, [0] * padding)
        parts.append(replace(filler, response_mask=torch.zeros_like(filler.response_mask),
                             truncated=torch.zeros_like(filler.truncated)))
        kept_rows += [rows[0]] * padding
        kept_rewards.append(torch.zeros(padding * G))
        details += [{}] * (padding * G)
    rollout, rewards = concat_rollouts(parts, tokenizer.pad_token_id), torch.cat(kept_rewards)
    metrics = sum_over_processes({"batch/groups": kept, "batch/groups_dropped": rounds * B - kept})
    return rollout, kept_rows, rewards, position, {**metrics, "batch/sampling_rounds": rounds, **counted()}


def train_batch(rollout: Rollout, mask_truncated: bool, device: torch.device,
                rewards: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask (N, P+R) and response_mask (N, R) on `device`; with mask_truncated (DAPO's
    overlong filtering) truncated answers get no loss: they teach nothing either way. A sample whose reward is
    NaN (`rewards` (N,): a program the judge could not judge) gets no loss either."""
    mask = rollout.response_mask.clone()
    if mask_truncated:
        mask[rollout.truncated] = 0
    if rewards is not None:
        mask[torch.isnan(rewards.to(mask.device))] = 0
    batch = {"input_ids": rollout.input_ids.to(device), "attention_mask": rollout.attention_mask.to(device),
             "response_mask": mask.to(device)}
    if rollout.sampler_logp is not None:  # the engine's own log-probs (update.forward_backward compares them)
        batch["sampler_logp"] = rollout.sampler_logp.to(device)
    return batch

"""What the model wrote: a few groups of every training step, kept in <output_dir>/samples.jsonl to read.

    write_samples(path, step, rows, texts, details, rewards, advantages, group_size, groups=2)
    steps = read_samples(path)                      # {step: [group, ...]}, each group a list of completions
    python scripts/read_samples.py runs/default     # a step's best and worst groups, as text

One line per completion: step, group (its number in the step), prompt_index (the row's extra_info.index when
it has one), prompt, completion, verdict (code rows) or answer (what the reward looked at), reward (null for a
judge error: no reward), advantage. The file grows by `groups * G` lines a step (config key
`log_sample_groups`; 0 writes nothing), from the first process's groups: enough to look for reward hacking or
show a student what the model writes (TRL's `log_completions`), bounded by the groups kept per step.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path


def write_samples(path: Path, step: int, rows: list[dict], prompts: list[str], texts: list[str],
                  details: list[dict], rewards: list[float], advantages: list[float], group_size: int,
                  groups: int) -> None:
    """Append the first `groups` groups of a step: rows (B), prompts (B), texts/details/rewards/advantages (N)."""
    lines = []
    for g in range(min(groups, len(rows))):
        index = (rows[g].get("extra_info") or {}).get("index")
        for i in range(g * group_size, (g + 1) * group_size):
            d = details[i] if i < len(details) else {}
            outcome = {"verdict": d["verdict"]} if "verdict" in d else {"answer": d.get("answer")}
            lines.append({"step": step, "group": g, "prompt_index": index, "prompt": prompts[g],
                          "completion": texts[i], **outcome,
                          "reward": None if math.isnan(rewards[i]) else rewards[i], "advantage": advantages[i]})
    with path.open("a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


def read_samples(path: Path) -> dict[int, list[list[dict]]]:
    """{step: [group, ...]} from a samples.jsonl, each group its completions in order."""
    steps: dict[int, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            steps[r["step"]][r["group"]].append(r)
    return {s: [groups[g] for g in sorted(groups)] for s, groups in sorted(steps.items())}


def group_reward(group: list[dict]) -> float:
    """A group's mean reward over its judged completions (-inf when none was judged)."""
    rewards = [r["reward"] for r in group if r["reward"] is not None]
    return sum(rewards) / len(rewards) if rewards else -math.inf


def best_and_worst(groups: list[list[dict]], k: int = 1) -> tuple[list[list[dict]], list[list[dict]]]:
    """The k groups of a step with the highest mean reward, and the k with the lowest (best first, worst first)."""
    ranked = sorted(groups, key=group_reward, reverse=True)
    return ranked[:k], ranked[::-1][:k]

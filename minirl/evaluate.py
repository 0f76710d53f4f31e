"""Held-out evaluation: generate for each problem, score with the training reward, report accuracy.

`evaluate` is what `train.py` calls for validation (`val/test_score/<data_source>`); `eval.py` uses the same
function, so a number seen in training and a number from evaluation mean the same thing.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from minirl.data import prompt_text
from minirl.rewards import score
from minirl.rollout import sample


def evaluate(model, tokenizer, rows: list[dict], n: int = 1, greedy: bool = True, temperature: float = 1.0,
             top_p: float = 1.0, max_new_tokens: int = 256, batch_size: int = 32, progress=None, judge=None,
             code_style: str = "codefu") -> list[dict]:
    """One record per completion: data_source, index (row), sample, completion, reward, tokens, seconds.

    n completions per row (greedy decoding needs n=1). `progress`, if given, is called with the number of
    rows just finished (e.g. a tqdm bar's update).
    """
    if greedy and n != 1:
        raise ValueError("greedy evaluation gives n identical completions; use n=1 or greedy=False")
    records = []
    for s in range(0, len(rows), batch_size):
        chunk = rows[s:s + batch_size]
        t0 = time.perf_counter()
        rollout = sample(model, tokenizer, [prompt_text(r, tokenizer) for r in chunk], group_size=n,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, greedy=greedy)
        seconds = time.perf_counter() - t0
        expanded = [r for r in chunk for _ in range(n)]
        rewards = score(rollout.texts, expanded, judge=judge, code_style=code_style)
        lengths = rollout.response_mask.sum(dim=1).tolist()
        total_tokens = max(sum(lengths), 1)
        for i, (row, text, reward, length) in enumerate(zip(expanded, rollout.texts, rewards, lengths)):
            records.append({"data_source": row["data_source"], "index": s + i // n, "sample": i % n,
                            "completion": text, "reward": reward, "tokens": int(length),
                            "truncated": bool(rollout.truncated[i]),
                            "seconds": seconds * length / total_tokens})  # the batch's time, shared by tokens
        if progress is not None:
            progress(len(chunk))
    return records


def accuracy_by_source(records: list[dict]) -> dict[str, float]:
    """Mean reward per data_source (for 0/1 rewards: accuracy), as verl's `val/test_score/<source>`."""
    by_source = defaultdict(list)
    for r in records:
        by_source[r["data_source"]].append(r["reward"])
    return {f"val/test_score/{src}": float(torch.tensor(v).float().mean()) for src, v in by_source.items()}

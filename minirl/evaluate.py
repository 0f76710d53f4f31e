"""Held-out evaluation: generate n completions per problem, score them with the training rewards, summarise.

`evaluate` is what `train.py` calls for validation (`val/test_score/<data_source>`) and what `eval.py` calls,
so a number seen in training and a number from evaluation mean the same thing.

    records = evaluate(model, tokenizer, rows, n=8, greedy=False, temperature=0.6, scorer=Scorer(judge))
    summary = summarize(records, ks=[1, 4, 8])   # per data source: mean@n, pass@k, maj@n, lengths, speed

pass@k is the unbiased estimator of Chen et al. 2021 (Codex): 1 - C(n-c, k) / C(n, k) for c correct out of n.
maj@n (math only) votes over extracted answers compared as normalised strings, so "1/2" and "0.5" count as
different votes (the vote winner is still scored with the full equivalence check).
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict

import torch

from minirl.data import prompt_text
from minirl.rewards import Scorer, normalise_answer
from minirl.rollout import sample


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k)/C(n, k), as a stable product.
    n=8, c=2: pass@1 0.25, pass@4 0.785714, pass@8 1.0."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def majority_vote(answers: list[str | None], rewards: list[float]) -> float:
    """Reward of the most common extracted answer (ties: the first seen); 0 if nothing was extracted."""
    votes = Counter(normalise_answer(a) for a in answers if a is not None)
    if not votes:
        return 0.0
    winner = votes.most_common(1)[0][0]
    return next(r for a, r in zip(answers, rewards) if a is not None and normalise_answer(a) == winner)


def evaluate(model, tokenizer, rows: list[dict], n: int = 1, greedy: bool = True, temperature: float = 1.0,
             top_p: float = 1.0, max_new_tokens: int = 256, batch_size: int = 32, progress=None,
             scorer: Scorer | None = None, seed: int | None = None) -> list[dict]:
    """One record per completion: problem_id, data_source, index, sample, prompt, completion, answer, reward,
    (verdict), tokens, truncated, seconds. `scorer` is the training run's (default: the built-in rewards, no
    judge); `progress`, if given, is called with the number of rows finished. `seed`: sampling draws its noise
    from a generator seeded with it (per batch of rows), so two evaluations of the same rows, say before and
    after training, sample with the same noise and differ by what the model changed, not by the draw."""
    scorer = scorer or Scorer()
    if greedy and n != 1:
        raise ValueError("greedy decoding gives n identical completions; use n=1 or a temperature > 0")
    records = []
    for s in range(0, len(rows), batch_size):
        chunk = rows[s:s + batch_size]
        prompts = [prompt_text(r, tokenizer) for r in chunk]
        t0 = time.perf_counter()
        generator = None if seed is None or greedy else \
            torch.Generator(next(model.parameters()).device).manual_seed(seed + s)
        rollout = sample(model, tokenizer, prompts, group_size=n, max_new_tokens=max_new_tokens,
                         temperature=temperature, top_p=top_p, greedy=greedy, generator=generator)
        seconds = time.perf_counter() - t0
        expanded = [r for r in chunk for _ in range(n)]
        scored = scorer.details(rollout.texts, expanded)
        lengths = rollout.response_mask.sum(dim=1).tolist()
        total_tokens = max(sum(lengths), 1)
        for i, (row, text, sc, length) in enumerate(zip(expanded, rollout.texts, scored, lengths)):
            extra = row.get("extra_info") or {}
            records.append({"problem_id": extra.get("name") or extra.get("unique_id") or f"{s + i // n}",
                            "data_source": row["data_source"], "index": s + i // n, "sample": i % n,
                            "prompt": prompts[i // n], "completion": text, **sc, "tokens": int(length),
                            "truncated": bool(rollout.truncated[i]),
                            "seconds": seconds * length / total_tokens})  # the batch's time, shared by tokens
        if progress is not None:
            progress(len(chunk))
    return records


def summarize(records: list[dict], ks: list[int] | None = None, greedy: bool = False) -> dict[str, dict]:
    """Per data source: mean@n, pass@k, maj@n (math), greedy accuracy, lengths, time per token, tokens/s.
    Completions the judge could not judge (verdict JE: no reward) are not scored, only counted: `judged` and
    `judge_errors` per code source. The keys keep the n asked for (`n`: completions per problem), whatever the
    number of judge errors; mean@n averages the judged completions, pass@k the problems with at least k judged
    ones, and either is NaN where nothing was judged. Lengths and speed count every completion generated."""
    by_source: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_source[r["data_source"]][r["index"]].append(r)
    summary, nan = {}, float("nan")
    mean = lambda xs: sum(xs) / len(xs) if xs else nan  # noqa: E731
    for src, problems in by_source.items():
        everything = [r for g in problems.values() for r in g]
        n = max(len(g) for g in problems.values())                      # the completions asked for per problem
        groups = [[r for r in g if r.get("verdict") != "JE"] for g in problems.values()]  # judged ones
        flat = [r for g in groups for r in g]
        correct = [sum(r["reward"] >= 1.0 - 1e-9 for r in g) for g in groups]
        s = {"problems": len(groups), "n": n, f"mean@{n}": mean([r["reward"] for r in flat])}
        if "verdict" in everything[0]:
            s.update(judged=len(flat), judge_errors=len(everything) - len(flat))
        for k in ks or []:
            scored = [(g, c) for g, c in zip(groups, correct) if len(g) >= k]
            s[f"pass@{k}"] = mean([pass_at_k(len(g), c, k) for g, c in scored])
        if "verdict" not in everything[0]:
            s[f"maj@{n}"] = sum(majority_vote([r["answer"] for r in g], [r["reward"] for r in g])
                                for g in groups) / len(groups)
        if greedy:
            s["greedy_accuracy"] = mean([float(c > 0) for g, c in zip(groups, correct) if g])
        tokens, seconds = sum(r["tokens"] for r in everything), sum(r["seconds"] for r in everything)
        s.update({"mean_completion_tokens": tokens / len(everything), "truncated_fraction":
                  sum(r["truncated"] for r in everything) / len(everything),
                  "seconds_per_token": seconds / max(tokens, 1), "tokens_per_second": tokens / max(seconds, 1e-9)})
        summary[src] = s
    return summary

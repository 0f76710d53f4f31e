"""Verifiable rewards: a completion and a ground truth in, a number out. Training and evaluation share them.

    gsm8k_reward(completion, answer)  -> 1.0 / 0.0   last "#### N" vs the gold number
    math_reward(completion, answer)   -> 1.0 / 0.0   last \\boxed{...} vs the gold answer, checked for
                                                     mathematical equivalence with `math-verify`
    score(completions, rows)          -> list[float] the reward stage of a training step: picks the reward
                                                     function for each row from its `data_source`

The reward for a row is chosen by `data_source` (as veRL's default_compute_score does): anything naming
gsm8k, and the built-in toy task, uses gsm8k_reward; the MATH family (math, math500, aime, amc, custom
SimpleRL rows) uses math_reward. Unknown sources raise: a silent 0 reward would train on nothing.
"""
from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Callable

_GSM8K_ANSWER = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


# --- GSM8K ---------------------------------------------------------------------------------------------------

def extract_gsm8k_answer(text: str) -> str | None:
    """The number after the last '####' with commas and '$' removed, or None."""
    matches = _GSM8K_ANSWER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def _as_number(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", "").replace("$", "").strip())
    except InvalidOperation:
        return None


def gsm8k_reward(completion: str, answer: str) -> float:
    """1.0 if the last '#### N' in the completion equals the gold number (72 == 72.00 == 72.0, '1,000' == 1000).

    `answer` may be the bare gold number or a full GSM8K solution ending in '#### N'.
    """
    pred = extract_gsm8k_answer(completion)
    gold = extract_gsm8k_answer(answer) if "####" in answer else answer
    if pred is None:
        return 0.0
    p, g = _as_number(pred), _as_number(gold)
    return float(p is not None and g is not None and p == g)


# --- MATH ----------------------------------------------------------------------------------------------------

def last_boxed(text: str) -> str | None:
    r"""Content of the last \boxed{...} (or \fbox{...}), nested braces included; None if absent/unclosed."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    if text[start:i].strip() not in ("\\boxed", "\\fbox"):  # "\boxed 5" (no braces) form
        m = re.match(r"\\boxed\s+(\S+)", text[start:])
        return m.group(1).rstrip("$.") if m else None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def _normalise(s: str) -> str:
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", s)
    return re.sub(r"\s+|\\!|\\,|\\ |\$", "", s).rstrip(".")


def math_reward(completion: str, answer: str) -> float:
    r"""1.0 if the last \boxed{} of the completion is mathematically equal to `answer` (e.g. \frac12 == 0.5).

    A cheap string comparison after normalisation runs first; then math-verify parses both sides to sympy and
    compares them. math-verify bounds its parsing and comparison with 5 s timeouts (SIGALRM), which only work
    in the main thread; elsewhere we skip the sympy comparison rather than risk a hang.
    """
    pred = last_boxed(completion)
    if pred is None:
        return 0.0
    if _normalise(pred) == _normalise(answer):
        return 1.0
    try:
        from math_verify import parse, verify
        timeout = 5 if threading.current_thread() is threading.main_thread() else None
        if timeout is None:
            return 0.0
        gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
        target = parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout)
        return float(bool(gold) and bool(target) and verify(gold, target, timeout_seconds=timeout))
    except Exception:  # a parser crash on model output is a wrong answer, not a training crash
        return 0.0


# --- shaping -------------------------------------------------------------------------------------------------

def overlong_penalty(lengths: list[int], max_new_tokens: int, buffer: int, penalty: float = 1.0) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    0 while length <= max_new_tokens - buffer, then falls linearly to -penalty at max_new_tokens.
    With max_new_tokens 20, buffer 4: lengths 16, 18, 20 -> 0, -0.5, -1.0.
    """
    start = max_new_tokens - buffer
    return [-penalty * min(max(length - start, 0) / buffer, 1.0) if buffer > 0 else 0.0 for length in lengths]


# --- dispatch ------------------------------------------------------------------------------------------------

def reward_fn_for(data_source: str) -> Callable[[str, str], float]:
    """The reward function for a dataset, by its veRL `data_source` name."""
    src = data_source.lower()
    if "gsm8k" in src or src == "toy_arithmetic":
        return gsm8k_reward
    if any(k in src for k in ("math", "aime", "amc", "simplerl", "custom")):
        return math_reward
    raise ValueError(f"no reward function for data_source {data_source!r}: name it like 'openai/gsm8k' or "
                     "'math500', or add a line to minirl/rewards.py:reward_fn_for")


def score(completions: list[str], rows: list[dict]) -> list[float]:
    """The reward stage of a training step: one float per completion, `rows[i]` being its problem."""
    return [reward_fn_for(row["data_source"])(text, str(row["reward_model"]["ground_truth"]))
            for text, row in zip(completions, rows, strict=True)]

"""Verifiable rewards: a completion and a ground truth in, a number out. Training and evaluation share them.

    gsm8k_reward(completion, answer)  -> 1.0 / 0.0   last "#### N" vs the gold number ("strict"; or the
                                                     last number anywhere, "flexible", as veRL offers)
    math_reward(completion, answer)   -> 1.0 / 0.0   last \\boxed{...} vs the gold answer, checked for
                                                     mathematical equivalence with `math-verify`
    code_reward(completion, problem, judge, style)  last fenced code block run against the problem's tests
    Scorer(judge, code_style, extraction, reward_fn) the one reward interface: `scorer(completions, rows)`
                                                     -> list[float], picking the reward for each row; code
                                                     rows are judged in one batch. build_scorer(cfg, judge)
                                                     makes the run's scorer from its config.

The reward for a row is chosen by its exact `data_source` name (REWARD_KINDS, as veRL's default_compute_score
does): GSM8K and the built-in arithmetic tasks use gsm8k_reward; the MATH family (MATH, MATH-500, AIME, AMC,
SimpleRL's custom rows) uses math_reward; rows with `ability: code` are judged. Unknown sources raise: a silent
wrong or 0 reward would train on nothing.

Code reward styles (`code_reward_style`):
- "codefu", as the CodeFu write-up describes: -1 no extractable code, -0.5 compile error, 0 if any test
  exceeds the time limit, otherwise the fraction of tests passed. (CodeFu's shipped code differs from its
  write-up: it ends up all-or-nothing. minirl follows the write-up; use "binary" for all-or-nothing.)
- "binary", as the SageMaker code-RL recipe: 1 when every test passes, 0 otherwise, -0.1 with no code block.
"""
from __future__ import annotations

import functools
import json
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from minirl.data import DataError

_GSM8K_ANSWER = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


# --- GSM8K ---------------------------------------------------------------------------------------------------

def extract_gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """The answer number with commas removed, or None. The two methods are veRL's (gsm8k.extract_solution):
    "strict": the number after the last '####' (the format the prompt asks for);
    "flexible": the last number anywhere ("7 + 8 = 15." -> "15"), for models that answer in prose.
    """
    if method == "flexible":
        numbers = _NUMBER.findall(text)
        return numbers[-1].replace(",", "") if numbers else None
    if method != "strict":
        raise ValueError(f"unknown answer extraction {method!r}; use strict or flexible")
    matches = _GSM8K_ANSWER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def _as_number(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", "").replace("$", "").strip())
    except InvalidOperation:
        return None


def gsm8k_reward(completion: str, answer: str, method: str = "strict") -> float:
    """1.0 if the last '#### N' in the completion equals the gold number (72 == 72.00 == 72.0, '1,000' == 1000);
    with method "flexible", the last number in the completion.

    `answer` may be the bare gold number or a full GSM8K solution ending in '#### N'.
    """
    pred = extract_gsm8k_answer(completion, method)
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
    braces = re.match(r"\\(?:boxed|fbox)\s*\{", text[start:])
    if braces is None:  # "\boxed 5" (no braces) form
        m = re.match(r"\\boxed\s+(\S+)", text[start:])
        return m.group(1).rstrip("$.") if m else None
    i = start + braces.end() - 1
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def normalise_answer(s: str) -> str:
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
    if normalise_answer(pred) == normalise_answer(answer):
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


# --- code ----------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```([\w+#-]*)[^\n]*\n(.*?)```", re.DOTALL)
LANGUAGE_TAGS = {"cpp": ("cpp", "c++", "cc", "cxx"), "python": ("python", "python3", "py")}


def extract_code(completion: str, language: str) -> str | None:
    """The last fenced block tagged with the language (```cpp, ```python, ...), else the last untagged one."""
    blocks = _FENCE.findall(completion)
    tagged = [code for tag, code in blocks if tag.lower() in LANGUAGE_TAGS[language]]
    untagged = [code for tag, code in blocks if not tag]
    chosen = tagged or untagged
    return chosen[-1] if chosen and chosen[-1].strip() else None


# The judge's "judge error" (minirl/judge/verdict.py: JUDGE_ERROR): it could not judge the program (a worker's
# sandbox died, no server answered). Not a verdict on the program, so never a reward: its reward is NaN, and the
# trainer leaves the sample out of the loss and of its group's advantages (minirl/sampling.py).
JUDGE_ERROR = "JE"


def unjudged(reward: float) -> bool:
    """Whether a reward is a judge error's NaN (no reward at all), not a number to learn from."""
    return reward != reward


def reward_from_result(result, style: str = "codefu") -> float:
    """Map a JudgeResult (or None for 'no code') to a reward in the given style; NaN for a judge error (JE)."""
    if result is not None and result.verdict == JUDGE_ERROR:
        return float("nan")
    if style == "binary":
        return -0.1 if result is None else float(result.verdict == "AC")
    if style != "codefu":
        raise ValueError(f"unknown code reward style {style!r}; use codefu or binary")
    if result is None:
        return -1.0
    if result.verdict == "CE":
        return -0.5
    if any(t["verdict"] == "TLE" for t in result.tests):
        return 0.0
    return result.passed / max(result.total, 1)


def as_problem(ground_truth) -> dict:
    return json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth


def judge_request(source: str, problem: dict) -> dict:
    """What the judge runs for one program (the keyword arguments of minirl.judge.judge_job): `problem` is a code
    row's ground truth ({"tests": [{"input", "output"}], "language": "cpp"|"python", "time_limit_s",
    "memory_limit_mb", "float_tolerance"?, "checker"?}). `checker` ({"source", "language": "python"|"cpp"}) is
    the problem's special checker, for problems with several right answers: run as `checker input expected
    actual`, exit code 0 accepts (minirl/judge/verdict.py: `_check`); it replaces the token comparison."""
    job = dict(source=source, language=problem.get("language", "python"), tests=problem["tests"],
               time_limit_s=float(problem.get("time_limit_s", 2.0)),
               memory_limit_mb=int(problem.get("memory_limit_mb", 256)),
               float_tolerance=problem.get("float_tolerance"))
    if problem.get("checker"):
        job["checker"] = problem["checker"]
    return job


def judge_completions(completions: list[str], problems: list, judge) -> list:
    """JudgeResult per completion (None where no code block was found), all judged in one `run_many`.
    problems: code rows' `reward_model.ground_truth` (dicts or JSON strings, see judge_request)."""
    problems = [as_problem(p) for p in problems]
    sources = [extract_code(c, p.get("language", "python")) for c, p in zip(completions, problems, strict=True)]
    jobs = [judge_request(src, p) for src, p in zip(sources, problems) if src is not None]
    results = iter(judge.run_many(jobs)) if jobs else iter(())
    return [next(results) if src is not None else None for src in sources]


def code_rewards(completions: list[str], problems: list, judge, style: str = "codefu") -> list[float]:
    """Judge a batch of completions in parallel and map each verdict to a reward (see `judge_completions`)."""
    return [reward_from_result(res, style) for res in judge_completions(completions, problems, judge)]


def code_reward(completion: str, problem: dict, judge, style: str = "codefu") -> float:
    """Reward of one completion for a code problem; see `code_rewards`."""
    return code_rewards([completion], [problem], judge, style)[0]


# --- shaping -------------------------------------------------------------------------------------------------

def overlong_penalty(lengths: list[int], max_new_tokens: int, buffer: int, penalty: float = 1.0) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    0 while length <= max_new_tokens - buffer, then falls linearly to -penalty at max_new_tokens.
    With max_new_tokens 20, buffer 4: lengths 16, 18, 20 -> 0, -0.5, -1.0.
    """
    start = max_new_tokens - buffer
    return [-penalty * min(max(length - start, 0) / buffer, 1.0) if buffer > 0 else 0.0 for length in lengths]


# --- the scorer: one reward interface ---------------------------------------------------------------------

# Which built-in verifier scores a data_source: exact names, as veRL's default_compute_score matches them
# (verl/utils/reward_score/__init__.py: "openai/gsm8k", the MATH names), plus minirl's own datasets. A
# substring rule sent "my_custom_code" and "aftermath" to the math verifier: a wrong reward, silently.
REWARD_KINDS = {
    "openai/gsm8k": "gsm8k", "gsm8k": "gsm8k",
    "toy_arithmetic": "gsm8k", "arithmetic": "gsm8k",      # minirl/toy/tiny.py, scripts/make_sums_data.py
    "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval": "math", "HuggingFaceH4/MATH-500": "math",
    "math": "math", "math500": "math", "aime24": "math", "aime25": "math", "amc23": "math", "math_dapo": "math",
    "aime2024": "math", "aime2025": "math",
    "simplerl_custom": "math",                             # minirl/data.py: SimpleRL's {"instruction", ...} rows
}


def reward_kind(data_source: str) -> str:
    """Which built-in verifier scores a dataset, by its exact veRL `data_source` name: "gsm8k" or "math"."""
    if data_source not in REWARD_KINDS:
        raise DataError(f"no built-in reward for data_source {data_source!r}: use one of {sorted(REWARD_KINDS)}, "
                         "mark code rows with ability: code (judged), pass --reward_fn path.py:function, or add "
                         "the name to minirl/rewards.py:REWARD_KINDS")
    return REWARD_KINDS[data_source]


def reward_fn_for(data_source: str) -> Callable[..., float]:
    """The built-in reward function for a dataset (gsm8k_reward or math_reward)."""
    return {"gsm8k": gsm8k_reward, "math": math_reward}[reward_kind(data_source)]


# what Scorer.details says of a judged completion: the judge's verdicts (minirl/judge/verdict.py: VERDICTS,
# equal by test), JE when the judge could not judge it, and "no code" when no program was extracted
CODE_VERDICTS = ("AC", "WA", "TLE", "MLE", "RE", "CE", "OLE", JUDGE_ERROR, "no code")


def is_code(row: dict) -> bool:
    return row.get("ability") == "code"


@dataclass
class Scorer:
    """The reward of completions against their rows, for training, validation, eval.py and the environments.

        scorer = Scorer(judge)                       # or build_scorer(cfg, judge), from the config
        rewards = scorer(completions, rows)          # list[float], rows[i] being completion i's problem
        details = scorer.details(completions, rows)  # + the extracted answer, and the verdict for code

    A row's reward: `reward_fn` when given (veRL's custom_reward_function, every row); else the judge for rows
    with `ability: code` (all of a call's programs in one `run_many`, so they run in parallel), else the
    built-in verifier of its data_source (reward_kind). `judge` is anything with `run_many(jobs) -> results`
    (minirl.judge.Judge); only code rows need one. `extraction` ("strict"/"flexible") is GSM8K's. Training,
    validation and eval.py all score through `details` (a subclass that changes rewards overrides it).
    """
    judge: Any = None
    code_style: str = "codefu"
    extraction: str = "strict"
    reward_fn: Callable | None = None

    def __post_init__(self):  # (extract the answer, reward) per built-in verifier
        self.verifiers = {"gsm8k": (functools.partial(extract_gsm8k_answer, method=self.extraction),
                                    functools.partial(gsm8k_reward, method=self.extraction)),
                          "math": (last_boxed, math_reward)}

    @property
    def judges_code(self) -> bool:
        """Whether code rows get the judge's verdicts (a judge, and no reward_fn in its place)."""
        return self.judge is not None and self.reward_fn is None

    def __call__(self, completions: list[str], rows: list[dict]) -> list[float]:
        return [d["reward"] for d in self.details(completions, rows)]

    def details(self, completions: list[str], rows: list[dict]) -> list[dict]:
        """Per completion: reward and the extracted answer, plus verdict and tests_passed for code rows. A
        program the judge could not judge has verdict JE, reward NaN (no reward) and the cause in `message`."""
        out = [{"answer": self.extract(text, row)} for text, row in zip(completions, rows, strict=True)]
        code = [i for i, row in enumerate(rows) if is_code(row)] if self.reward_fn is None else []
        if code:
            if self.judge is None:
                raise ValueError("code rows need a judge: pass judge=minirl.judge.Judge()")
            results = judge_completions([completions[i] for i in code],
                                        [rows[i]["reward_model"]["ground_truth"] for i in code], self.judge)
            for i, res in zip(code, results):
                out[i].update(reward=reward_from_result(res, self.code_style),
                              verdict=res.verdict if res else "no code", tests_passed=res.passed if res else 0)
                if res is not None and res.verdict == JUDGE_ERROR:
                    out[i]["message"] = res.message  # the cause, for the run's stop message
        for d, text, row in zip(out, completions, rows):
            truth = row["reward_model"]["ground_truth"]
            if self.reward_fn is not None:
                d["reward"] = float(self.reward_fn(row["data_source"], text, truth, row.get("extra_info")))
            elif not is_code(row):
                d["reward"] = self.verifiers[reward_kind(row["data_source"])][1](text, str(truth))
        return out

    def extract(self, text: str, row: dict) -> str | None:
        """What the reward looks at: the code block, the '#### N' (or last) number, or the last \\boxed{}."""
        if is_code(row):
            return extract_code(text, as_problem(row["reward_model"]["ground_truth"]).get("language", "python"))
        try:
            return self.verifiers[reward_kind(row["data_source"])][0](text)
        except ValueError:  # a source only the user's reward_fn knows: nothing to extract
            if self.reward_fn is None:
                raise
            return None


def build_scorer(cfg, judge=None) -> Scorer:
    """The run's scorer from its config (code_reward_style, answer_extraction, reward_fn) and its judge."""
    return Scorer(judge, cfg.code_reward_style, cfg.answer_extraction,
                  load_reward_fn(cfg.reward_fn) if cfg.reward_fn else None)


def score(completions: list[str], rows: list[dict], judge=None, code_style: str = "codefu",
          extraction: str = "strict", reward_fn: Callable | None = None) -> list[float]:
    """`Scorer(...)(completions, rows)` in one call: one float per completion."""
    return Scorer(judge, code_style, extraction, reward_fn)(completions, rows)


@functools.lru_cache(maxsize=None)
def load_reward_fn(spec: str) -> Callable:
    """A user's reward, veRL's `custom_reward_function`: "path/to/file.py:function" (function defaults to
    compute_score, as in veRL), called as function(data_source, solution_str, ground_truth, extra_info) -> float
    for every row in place of the built-in rewards. Loaded once per spec."""
    import importlib.util
    from pathlib import Path

    from minirl.config import ConfigError
    path, _, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    name, file = name or "compute_score", Path(path)
    usage = "pass --reward_fn path/to/file.py:function"
    if file.suffix != ".py" or not file.is_file():
        raise ConfigError(f"config key 'reward_fn': {str(file)!r} is not an existing .py file; {usage}")
    module_spec = importlib.util.spec_from_file_location(f"minirl_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"config key 'reward_fn': {file} defines no function {name!r}; define def {name}"
                          f"(data_source, solution_str, ground_truth, extra_info) -> float there, or {usage}")
    return fn

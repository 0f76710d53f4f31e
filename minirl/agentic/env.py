"""Environments: what the model sees, how an answer is scored, and whether there is another turn.

An environment is one episode's state. The protocol is two methods:

    messages = env.reset(problem)                           # the chat the model answers (a list of messages)
    new_messages, reward, info = env.step(messages, completion)
        # new_messages None: the episode is over and `reward` is its reward
        # else: messages + [the model's turn as a message, the environment's reply, ...]; the model goes again

`tools` (a list of JSON schemas, or None) is what the chat template receives as `tools=`. The episode runner
(minirl/agentic/episodes.py) renders the messages with the tokenizer's own chat template, samples, calls
`step`, and turns the environment's reply into tokens that stay in the context but out of the loss.

Two environments ship:
- `MathEnv`: single turn, scored by a minirl/rewards.py Scorer (the verifier of the row's data_source, or
  the run's own scorer: the same rewards as train.py).
- `CodeEnv`: the SageMaker code-RL recipe's task. The model may call `check_solution(code)` in every turn but
  the last; the tool runs the problem's *public* tests in the sandboxed judge and returns the verdicts. A turn
  without a tool call (or the last turn) is the final answer: its last fenced code block is judged on the
  *private* tests, reward 1 if all pass, 0 otherwise, -0.1 with no code block (a Scorer with code style
  "binary").

Tool calls are read from the model's text with the tokenizer's `parse_response` when the tokenizer ships a
response schema, else as Hermes-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the
format of the Qwen2.5 / Qwen3 / Hermes chat templates). Left out: several tools, tool calls in parallel.
"""
from __future__ import annotations

import json
import re
from typing import Protocol

from minirl.rewards import Scorer, as_problem, judge_request

Messages = list[dict]


class Env(Protocol):
    tools: list[dict] | None

    def reset(self, problem: dict) -> Messages: ...

    def step(self, messages: Messages, completion: str) -> tuple[Messages | None, float, dict]: ...


# --- single turn: the verifiers ------------------------------------------------------------------------------

class MathEnv:
    """One turn, scored by `scorer` (default: the row's built-in verifier, '#### N' or \\boxed{})."""
    tools = None

    def __init__(self, scorer: Scorer | None = None):
        self.scorer = scorer or Scorer()

    def reset(self, problem: dict) -> Messages:
        self.problem = problem
        return list(problem["prompt"])

    def step(self, messages: Messages, completion: str) -> tuple[None, float, dict]:
        return None, self.scorer([completion], [self.problem])[0], {}


# --- code with a test-running tool ---------------------------------------------------------------------------

CHECK_SOLUTION = {"type": "function", "function": {
    "name": "check_solution",
    "description": "Run a complete program on the problem's example tests and report, for each test, whether "
                   "its output was right (AC), wrong (WA), too slow (TLE), crashed (RE) or did not compile (CE).",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                   "required": ["code"]}}}

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(tokenizer, text: str) -> list[dict]:
    """[{"name": ..., "arguments": {...}}] for each well-formed tool call in `text`; malformed calls are ignored
    (the turn then counts as a final answer)."""
    if getattr(tokenizer, "response_schema", None):
        calls = [c.get("function", c) for c in tokenizer.parse_response(text).get("tool_calls") or []
                 if isinstance(c, dict)]
    else:
        calls = [_json_or_none(body) for body in _HERMES_CALL.findall(text)]
    out = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        args = call.get("arguments")
        args = _json_or_none(args) if isinstance(args, str) else args  # some schemas keep them as a JSON string
        if isinstance(call.get("name"), str) and isinstance(args, dict):
            out.append({"name": call["name"], "arguments": args})
    return out


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # malformed, or nested deeper than the parser's recursion limit
        return None


def public_and_private_tests(truth: dict, num_public: int) -> tuple[list[dict], list[dict]]:
    """The tool's tests and the reward's. Prepared rows keep the hidden tests in `tests`; `public_tests` when
    the source has them (CodeContests), else the first `num_public` tests (the statement's examples come first
    in the shared data sets)."""
    private = truth["tests"]
    return truth.get("public_tests") or private[:num_public], private


class CodeEnv:
    """Up to `max_turns` turns; `check_solution(code)` in every turn but the last (see module docstring)."""
    tools = [CHECK_SOLUTION]

    def __init__(self, judge, tokenizer, max_turns: int = 2, num_public_tests: int = 1,
                 max_tool_chars: int = 1000):
        self.judge, self.tokenizer, self.max_turns = judge, tokenizer, max_turns
        self.scorer = Scorer(judge, code_style="binary")  # the final answer's reward
        self.num_public_tests, self.max_tool_chars = num_public_tests, max_tool_chars

    def reset(self, problem: dict) -> Messages:
        self.problem, self.truth = problem, as_problem(problem["reward_model"]["ground_truth"])
        self.public, self.private = public_and_private_tests(self.truth, self.num_public_tests)
        # few-shot answers in the prompt are not the model's turns
        self.prompt_turns = sum(m["role"] == "assistant" for m in problem["prompt"])
        return list(problem["prompt"])

    def step(self, messages: Messages, completion: str) -> tuple[Messages | None, float, dict]:
        turn = 1 + sum(m["role"] == "assistant" for m in messages) - self.prompt_turns
        calls = parse_tool_calls(self.tokenizer, completion) if turn < self.max_turns else []
        call = next((c for c in calls if c["name"] == "check_solution"
                     and isinstance(c["arguments"].get("code"), str)), None)
        if call is None:  # the final answer: the private tests decide
            private = {**self.problem, "ability": "code",
                       "reward_model": {"ground_truth": {**self.truth, "tests": self.private}}}
            scored = self.scorer.details([completion], [private])[0]
            return None, scored["reward"], {"turns": turn, "verdict": scored["verdict"]}
        public = {**self.truth, "tests": self.public}
        result = self.judge.run_many([judge_request(call["arguments"]["code"], public)])[0]
        content = completion[:completion.find("<tool_call>")].strip() if "<tool_call>" in completion else ""
        tool_call = {"type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
        reply = {"role": "tool", "name": "check_solution", "content": self.report(result)}
        return messages + [{"role": "assistant", "content": content, "tool_calls": [tool_call]}, reply], 0.0, \
            {"turns": turn, "tool_verdict": result.verdict}

    def report(self, result) -> str:
        """What the tool returns: the verdict per public test, the first failing test, the error message."""
        lines = [f"{result.verdict}: passed {result.passed} of {result.total} example tests."]
        lines += [f"test {i + 1}: {t['verdict']}" for i, t in enumerate(result.tests)]
        failed = next((i for i, t in enumerate(result.tests) if t["verdict"] != "AC"), None)
        if failed is not None:
            lines.append(f"input of test {failed + 1}:\n{self.public[failed]['input']}\nexpected output:\n"
                         f"{self.public[failed]['output']}")
        if result.message:
            lines.append(result.message)
        return "\n".join(lines)[:self.max_tool_chars]

"""The built-in code task: beginner stdin -> stdout problems, generated with their tests, as veRL code rows.

    rows = code_task_rows(200, seed=1, split="train", language="python")   # or "cpp"
    python scripts/make_code_task_data.py                                   # the files in data/

What the arithmetic toy (minirl/toy/tiny.py) is for math, this is for code: problems a beginner solves in a
few lines, each a family of statements with parameters (minirl/toy/code_families.py), e.g. "arithmetic":
"Read an integer n. Print 3 * n + 5." Every problem carries a reference program in Python and in C++ and a
*near miss* (an off-by-one, a wrong operator, a > for a >=): its tests start with the edge cases that tell the
two apart, then random inputs.
tests/toy/test_code_task.py judges both for every family: the reference passes, the near miss does not.

Splits, so that a held-out score measures more than recall of paraphrases:
- train: the 6 TRAIN_FAMILIES, with the parameter tuples whose hash is not 0 mod 4;
- test: the same families with the held-out quarter of the parameter tuples (data_source "code_task"), and
  the HELD_OUT_FAMILIES, never seen in training (data_source "code_task/new_families"), each composing two
  training families (multiples: loop + condition; span: pair + loop; compare: pair + condition; spelling:
  strings + condition), so that they measure transfer to new combinations of trained skills.
validate() reports each data_source: `val/test_score/code_task` and `val/test_score/code_task/new_families`.

The rows are those scripts/prepare_codecontests.py writes (same prompt instruction, same ground truth keys:
`tests`, `language`, `time_limit_s`, `memory_limit_mb`, `float_tolerance`, as a JSON string), so the reward
is the real one: rewards.Scorer extracts the last fenced block and the sandboxed judge runs it.
Left out: problems with several right answers (no special checkers), floats, and multi-line statements with
formal Input/Output sections; the statements are one or two sentences and an example.
"""
from __future__ import annotations

import json
import random
import zlib

from minirl.toy.code_families import HELD_OUT_FAMILIES, TRAIN_FAMILIES, Problem

CODE_DATA_SOURCE = "code_task"                   # train rows, and held-out rows with new parameters
NEW_FAMILIES_SOURCE = "code_task/new_families"   # held-out rows of families never trained on
# the same instructions as scripts/prepare_codecontests.py, so a model sees one format for all code rows
INSTRUCTIONS = {
    "cpp": "Solve the problem in C++17. Read from standard input, write to standard output. "
           "Put your complete program in one ```cpp code block at the end of your answer.",
    "python": "Solve the problem in Python 3. Read from standard input, write to standard output. "
              "Put your complete program in one ```python code block at the end of your answer.",
}
# One solved problem before the real one, as a chat turn (a one-shot prompt): SmolLM2-135M-Instruct otherwise
# calls its function on the example's constants and prints a sentence. Measured on 24 held-out problems, 8
# samples at T = 0.7: without it 0 of 192 programs pass (31 read the input); with a shot 9 of 192 pass and
# 87 read it. Its problem (a remainder) belongs to no family, so it solves none of the rows.
SHOT = "Read two integers a and b on one line. Print the remainder of a divided by b.\nExample: for the input\n17 5\n" \
       "the output is\n2"
SHOT_ANSWERS = {
    "python": "```python\na, b = map(int, input().split())\nprint(a % b)\n```",
    "cpp": "```cpp\n#include <bits/stdc++.h>\nusing namespace std;\n\nint main() {\n    long long a, b;\n"
           "    cin >> a >> b;\n    cout << a % b << endl;\n    return 0;\n}\n```",
}
# The multi-turn variant (`tool=True` rows for CodeEnv, as scripts/probe_tool_use.py runs them): the same
# shot, answered by first checking the program with the tool. A chat template that renders no `tools=` (SmolLM2's writes plain ChatML)
# leaves the model unaware of the tool, so the rows say in a system message how to call it (Hermes-style
# <tool_call> JSON, what minirl.agentic.env.parse_tool_calls reads), and the shot shows one call and its reply.
TOOL_SYSTEM = "You can test a program on the example before you answer. To test it, write only\n" \
    '<tool_call>{"name": "check_solution", "arguments": {"code": "THE PROGRAM"}}</tool_call>\n' \
    "with the program as a JSON string. The reply tells you whether the example's output was right. Then give " \
    "your final program in one code block."
SHOT_TOOL_CALL = {
    language: '<tool_call>' + json.dumps({"name": "check_solution", "arguments": {"code": code}}) + '</tool_call>'
    for language, code in [("python", "a, b = map(int, input().split())\nprint(a % b)\n"),
                           ("cpp", "#include <bits/stdc++.h>\nusing namespace std;\n\nint main() {\n"
                                   "    long long a, b;\n    cin >> a >> b;\n    cout << a % b << endl;\n"
                                   "    return 0;\n}\n")]}
SHOT_TOOL_REPLY = "AC: passed 1 of 1 example tests.\ntest 1: AC"


# --- rows ----------------------------------------------------------------------------------------------------

def held_out(key: str) -> bool:
    """A quarter of each family's parameter tuples, fixed by a hash (not Python's: that one is salted)."""
    return zlib.crc32(key.encode()) % 4 == 0


def problems(n: int, seed: int, split: str, families: dict | None = None, num_tests: int = 6) -> list[Problem]:
    """`n` distinct problems of the split, the families taken in turn (train: TRAIN_FAMILIES; test: those and
    HELD_OUT_FAMILIES). A family's parameter space is small: when it runs out, the others fill in."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if families is None:
        families = TRAIN_FAMILIES if split == "train" else {**TRAIN_FAMILIES, **HELD_OUT_FAMILIES}
    rng, out, seen = random.Random(seed), [], set()
    extra = max(num_tests - 3, 0)  # random inputs after the 3 edge cases
    makers, turn = list(families.values()), 0
    while len(out) < n and makers:  # the families in turn; one whose split has no new problem left drops out
        make = makers[turn % len(makers)]
        for _ in range(200):
            p = make(rng, extra)
            in_test = p.family in HELD_OUT_FAMILIES or held_out(p.key)
            if in_test == (split == "test") and not (split == "test" and p.key in seen):
                break  # test problems are distinct; train ones may repeat (a family's tests differ each time)
        else:
            makers.remove(make)
            continue
        seen.add(p.key)
        out.append(p)
        turn += 1
    if len(out) < n:
        raise ValueError(f"the {split} split has only {len(out)} distinct problems of these families, not {n}")
    return out


def to_row(p: Problem, language: str, split: str, index: int, num_tests: int = 6, example: bool = True,
           shot: bool = True, instruction: bool = True, tool: bool = False) -> dict:
    """The veRL code row of a problem, in the format scripts/prepare_codecontests.py writes; `example`: the
    statement shows one test (as contest statements do); `shot`: the SHOT problem and its answer come first;
    `instruction`: the language's instruction follows the statement (the tiny code model is trained with none
    of the three: a bare statement is a third of the tokens, and the model's warm-up costs what its tokens do);
    `tool`: the multi-turn variant's prompt (TOOL_SYSTEM, and a shot that checks its program first)."""
    truth = {"tests": p.tests(num_tests), "language": language, "time_limit_s": 2.0, "memory_limit_mb": 256,
             "float_tolerance": None}
    if tool:  # what check_solution runs (CodeEnv): the statement's example (the last test when num_tests >= 3)
        if not example:
            raise ValueError("tool rows check the statement's example: pass example=True")
        truth["public_tests"] = [{"input": p.inputs[-1] + "\n", "output": p.outputs[-1] + "\n"}]
    source = NEW_FAMILIES_SOURCE if p.family in HELD_OUT_FAMILIES else CODE_DATA_SOURCE
    statement = f"{p.statement}\n{p.example}" if example else p.statement
    content = f"{statement}\n\n{INSTRUCTIONS[language]}" if instruction else statement
    prompt = [{"role": "user", "content": content}]
    if shot:
        checked = [{"role": "assistant", "content": SHOT_TOOL_CALL[language]},
                   {"role": "tool", "name": "check_solution", "content": SHOT_TOOL_REPLY}] if tool else []
        prompt = [{"role": "user", "content": f"{SHOT}\n\n{INSTRUCTIONS[language]}"}, *checked,
                  {"role": "assistant", "content": SHOT_ANSWERS[language]}] + prompt
    if tool:
        prompt = [{"role": "system", "content": TOOL_SYSTEM}] + prompt
    return {"data_source": source, "prompt": prompt,
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
            "extra_info": {"split": split, "index": index, "family": p.family, "key": p.key}}


def code_task_rows(n: int, seed: int, split: str, language: str = "python", families: dict | None = None,
                   num_tests: int = 6, example: bool = True, shot: bool = True, instruction: bool = True,
                   tool: bool = False) -> list[dict]:
    """`n` veRL rows of the split (see `problems`), the prompt asking for `language` ("python" or "cpp")."""
    if language not in INSTRUCTIONS:
        raise ValueError(f"language must be 'python' or 'cpp', got {language!r}")
    return [to_row(p, language, split, i, num_tests, example, shot, instruction, tool)
            for i, p in enumerate(problems(n, seed, split, families, num_tests))]

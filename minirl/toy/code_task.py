"""The built-in code task: beginner stdin -> stdout problems, generated with their tests, as veRL code rows.

    rows = code_task_rows(200, seed=1, split="train", language="python")   # or "cpp"
    python scripts/make_code_task_data.py                                   # the files in data/

What the arithmetic toy (minirl/toy/tiny.py) is for math, this is for code: problems a beginner solves in a
few lines, each a family of statements with parameters, e.g. "arithmetic": "Read an integer n. Print 3 * n + 5."
Every problem carries a reference program in Python and in C++ and a *near miss* (an off-by-one, a wrong
operator, a > for a >=): its tests start with the edge cases that tell the two apart, then random inputs.
tests/toy/test_code_task.py judges both for every family: the reference passes, the near miss does not.

Splits, so that a held-out score measures more than recall of paraphrases:
- train: the TRAIN_FAMILIES, with the parameter tuples whose hash is not 0 mod 4;
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
from dataclasses import dataclass

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
CPP = "#include <bits/stdc++.h>\nusing namespace std;\n\nint main() {{\n{body}\n    return 0;\n}}\n"


@dataclass
class Problem:
    """One generated problem. `key` names the family, the variant and the parameters (the split's unit)."""
    family: str
    key: str
    statement: str     # one or two sentences
    example: str       # "Example: for the input ... the output is ...", shown after the statement by default
    inputs: list[str]  # edge cases that tell `python` from `slip` first, then random inputs
    outputs: list[str]
    python: str        # a reference program
    cpp: str           # the same in C++
    slip: str          # a near miss in Python: what the tests must reject

    def tests(self, n: int) -> list[dict]:
        return [{"input": i + "\n", "output": o + "\n"} for i, o in zip(self.inputs[:n], self.outputs[:n])]


def _cpp(*lines: str) -> str:
    return CPP.format(body="\n".join("    " + line for line in lines))


def _problem(family: str, params: tuple, statement: str, solve, inputs: list[str], python: str, cpp: str,
             slip: str) -> Problem:
    example = f"Example: for the input\n{inputs[-1]}\nthe output is\n{solve(inputs[-1])}"
    return Problem(family, f"{family}{params}", statement, example, inputs, [solve(i) for i in inputs], python, cpp,
                   slip)


# --- the families: each (rng, k random inputs after its 3 edge cases) -> Problem ---------------------------

def arithmetic(rng: random.Random, k: int) -> Problem:
    """n -> a*n + b (or a*n - b). Slip: b off by one."""
    a, b, sign = rng.randint(2, 9), rng.randint(1, 9), rng.choice("+-")
    value = lambda n, b=b: a * n + b if sign == "+" else a * n - b  # noqa: E731
    inputs = ["0", "1", "-2"] + [str(rng.randint(-100, 100)) for _ in range(k)]
    return _problem("arithmetic", (a, sign, b), f"Read an integer n. Print {a} * n {sign} {b}.",
                    lambda s: str(value(int(s))), inputs,
                    f"n = int(input())\nprint({a} * n {sign} {b})\n",
                    _cpp("long long n;", "cin >> n;", f"cout << {a} * n {sign} {b} << endl;"),
                    f"n = int(input())\nprint({a} * n {sign} {b + 1})\n")


PAIR_OPS = {"sum": ("a + b", "a - b"), "difference": ("a - b", "b - a"), "product": ("a * b", "a + b"),
            "maximum": ("max(a, b)", "min(a, b)"), "minimum": ("min(a, b)", "max(a, b)")}


def pair(rng: random.Random, k: int) -> Problem:
    """a b on one line -> c times their sum, difference, ... Slip: the wrong operator."""
    op, c = rng.choice(sorted(PAIR_OPS)), rng.randint(1, 5)
    right, wrong = (f"{c} * {e}" if c > 1 else e for e in PAIR_OPS[op])
    word = {"difference": "difference a - b"}.get(op, op)
    inputs = ["2 2", "3 7", "7 3"] + [f"{rng.randint(-50, 50)} {rng.randint(-50, 50)}" for _ in range(k)]
    read = "a, b = map(int, input().split())\n"
    return _problem("pair", (op, c), f"Read two integers a and b on one line. Print {f'{c} times ' if c > 1 else ''}"
                    f"their {word}.", lambda s: str(eval(right, {}, dict(zip("ab", map(int, s.split()))))), inputs,
                    f"{read}print({right})\n", _cpp("long long a, b;", "cin >> a >> b;", f"cout << {right} << endl;"),
                    f"{read}print({wrong})\n")


def lists(rng: random.Random, k: int) -> Problem:
    """n, then n integers -> their sum, maximum, or how many exceed t. Slip: the first left out, min, >=."""
    op, t = rng.choice(["sum", "maximum", "count", "count", "less"]), rng.randint(0, 9)
    what = {"sum": "the sum of the numbers", "maximum": "the largest number",
            "count": f"how many of the numbers are greater than {t}",
            "less": f"how many of the numbers are less than {t}"}[op]
    py = {"sum": ("sum(xs)", "sum(xs[1:])"), "maximum": ("max(xs)", "min(xs)"),
          "count": (f"sum(1 for x in xs if x > {t})", f"sum(1 for x in xs if x >= {t})"),
          "less": (f"sum(1 for x in xs if x < {t})", f"sum(1 for x in xs if x <= {t})")}[op]
    cpp = {"sum": ("long long s = 0;", "for (long long x : xs) s += x;"),
           "maximum": ("long long s = xs[0];", "for (long long x : xs) s = max(s, x);"),
           "count": ("long long s = 0;", f"for (long long x : xs) s += x > {t};"),
           "less": ("long long s = 0;", f"for (long long x : xs) s += x < {t};")}[op]

    def draw(n: int) -> str:
        return f"{n}\n" + " ".join(str(rng.randint(-9, 20)) for _ in range(n))
    inputs = [f"3\n{t + 1} {t} -1", f"4\n1 {t} 5 {t + 2}", f"2\n{t} {t}"] + [draw(rng.randint(1, 8)) for _ in range(k)]
    read = "n = int(input())\nxs = list(map(int, input().split()))\n"
    return _problem("lists", (op, t) if op in ("count", "less") else (op,),
                    f"The first line holds n, the second n integers. Print {what}.",
                    lambda s: str(eval(py[0], {}, {"xs": list(map(int, s.split()[1:]))})), inputs,
                    f"{read}print({py[0]})\n",
                    _cpp("int n;", "cin >> n;", "vector<long long> xs(n);", "for (auto& x : xs) cin >> x;", *cpp,
                         "cout << s << endl;"),
                    f"{read}print({py[1]})\n")


def condition(rng: random.Random, k: int) -> Problem:
    """n -> YES if n is at least / at most t (or divisible by t), else NO. Slip: > for >=, the other remainder."""
    kind, t = rng.choice(["at least", "at most", "divisible by"]), rng.randint(2, 9)
    test, slip = {"at least": (f"n >= {t}", f"n > {t}"), "at most": (f"n <= {t}", f"n < {t}"),
                  "divisible by": (f"n % {t} == 0", f"n % {t} == 1")}[kind]
    inputs = ([str(t), str(t - 1), str(t + 1)] if kind != "divisible by" else [str(t), str(2 * t), str(t + 1)]) + \
        [str(rng.randint(0, 100)) for _ in range(k)]
    return _problem("condition", (kind, t), f"Read an integer n. Print YES if n is {kind} {t}, otherwise NO.",
                    lambda s: "YES" if eval(test, {}, {"n": int(s)}) else "NO", inputs,
                    f'n = int(input())\nprint("YES" if {test} else "NO")\n',
                    _cpp("long long n;", "cin >> n;", f'cout << ({test} ? "YES" : "NO") << endl;'),
                    f'n = int(input())\nprint("YES" if {slip} else "NO")\n')


LOOP_TERMS = ("i", "i * i", "i * i * i")


def loop(rng: random.Random, k: int) -> Problem:
    """n -> the sum of c*i, c*i*i or c*i*i*i for i = 1..n. Slip: range(1, n)."""
    term, c = rng.choice(LOOP_TERMS), rng.randint(1, 9)
    term_c = term if c == 1 else f"{c} * {term}"
    inputs = ["1", "2", "5"] + [str(rng.randint(0, 60)) for _ in range(k)]
    solve = lambda s: str(sum(c * eval(term, {}, {"i": i}) for i in range(1, int(s) + 1)))  # noqa: E731
    return _problem("loop", (term, c), f"Read an integer n. Print the sum of {term_c} for i = 1, 2, ..., n.",
                    solve, inputs, f"n = int(input())\nprint(sum({term_c} for i in range(1, n + 1)))\n",
                    _cpp("long long n, s = 0;", "cin >> n;", f"for (long long i = 1; i <= n; i++) s += {term_c};",
                         "cout << s << endl;"),
                    f"n = int(input())\nprint(sum({term_c} for i in range(1, n)))\n")


def strings(rng: random.Random, k: int) -> Problem:
    """a word -> its length, or how many times a letter occurs in it. Slip: len - 1, the next letter."""
    c, op = rng.choice("abcdefghijklmnopqrstuvwxy"), rng.choice(["length", "count", "count"])
    next_c = chr(ord(c) + 1)
    what = "its number of letters" if op == "length" else f"how many times the letter {c} occurs in it"
    right, wrong = ("len(s)", "len(s) - 1") if op == "length" else (f"s.count('{c}')", f"s.count('{next_c}')")
    count = "s.size()" if op == "length" else f"count(s.begin(), s.end(), '{c}')"

    def word() -> str:
        return "".join(rng.choice(f"{c}{next_c}xyz") for _ in range(rng.randint(1, 12)))
    inputs = [c * 3, f"{c}{next_c}{next_c}x", next_c] + [word() for _ in range(k)]
    return _problem("strings", (op, c) if op == "count" else (op,),
                    f"Read a word s of lowercase letters. Print {what}.",
                    lambda s: str(eval(right, {}, {"s": s})), inputs,
                    f"s = input().strip()\nprint({right})\n",
                    _cpp("string s;", "cin >> s;", f"cout << {count} << endl;"),
                    f"s = input().strip()\nprint({wrong})\n")


# held-out families: each composes two training families, its statement joining their sentences and its program
# their lines (what SCAN-style tests of compositional generalisation ask of a learner). No new skill is needed;
# an earlier held-out `digits` family (walk the digits of a number) asked for one, and fell in every trained
# seed (docs/benchmarks.md).
def multiples(rng: random.Random, k: int) -> Problem:
    """loop + condition: n -> how many of 1..n are divisible by d, or their sum. Slip: range(1, n)."""
    d, op = rng.randint(2, 9), rng.choice(["count", "sum"])
    term = "1" if op == "count" else "i"
    what = f"how many of the numbers 1, 2, ..., n are divisible by {d}" if op == "count" else \
        f"the sum of the numbers among 1, 2, ..., n that are divisible by {d}"
    inputs = [str(d), str(2 * d), "1"] + [str(rng.randint(0, 200)) for _ in range(k)]
    solve = lambda s: str(sum(eval(term, {}, {"i": i}) for i in range(1, int(s) + 1) if i % d == 0))  # noqa: E731
    return _problem("multiples", (op, d), f"Read an integer n. Print {what}.", solve, inputs,
                    f"n = int(input())\nprint(sum({term} for i in range(1, n + 1) if i % {d} == 0))\n",
                    _cpp("long long n, s = 0;", "cin >> n;",
                         f"for (long long i = 1; i <= n; i++) if (i % {d} == 0) s += {term};", "cout << s << endl;"),
                    f"n = int(input())\nprint(sum({term} for i in range(1, n) if i % {d} == 0))\n")


def span(rng: random.Random, k: int) -> Problem:
    """pair + loop: a b on one line -> the sum of c*i, c*i*i or c*i*i*i for i = a..b. Slip: range(a, b)."""
    term, c = rng.choice(LOOP_TERMS), rng.randint(1, 9)
    term_c = term if c == 1 else f"{c} * {term}"
    starts = [rng.randint(-20, 20) for _ in range(k)]
    inputs = ["3 3", "1 4", "-2 2"] + [f"{a} {a + rng.randint(0, 40)}" for a in starts]

    def solve(s: str) -> str:
        a, b = map(int, s.split())
        return str(sum(c * eval(term, {}, {"i": i}) for i in range(a, b + 1)))
    read = "a, b = map(int, input().split())\n"
    return _problem("span", (term, c), f"Read two integers a and b on one line, a <= b. Print the sum of {term_c} "
                    f"for i = a, a + 1, ..., b.", solve, inputs,
                    f"{read}print(sum({term_c} for i in range(a, b + 1)))\n",
                    _cpp("long long a, b, s = 0;", "cin >> a >> b;",
                         f"for (long long i = a; i <= b; i++) s += {term_c};", "cout << s << endl;"),
                    f"{read}print(sum({term_c} for i in range(a, b)))\n")


def _rejecting(rng: random.Random, draw, k: int, edges: list[str], right: str, wrong: list[str], names) -> list[str]:
    """`k` random inputs from `draw()` after the edge cases, each drawn (up to 100 tries) so that it rejects a
    wrong YES/NO test still passing the inputs so far: `right` and `wrong` are Python conditions over `names`
    (a function of an input). A family with a YES/NO answer otherwise passes programs that skip half the task
    (a alone for a + b, the wrong letter) on all its tests: random inputs mostly answer the same."""
    def answer(test: str, x: str) -> bool:
        return bool(eval(test, {}, names(x)))
    alive = [w for w in wrong if all(answer(w, x) == answer(right, x) for x in edges)]
    inputs = []
    for _ in range(k):
        for _ in range(100):
            x = draw()
            if any(answer(w, x) != answer(right, x) for w in alive):
                break
        alive = [w for w in alive if answer(w, x) == answer(right, x)]
        inputs.append(x)
    return inputs


COMPARISONS = {"at least": ">=", "at most": "<="}


def compare(rng: random.Random, k: int) -> Problem:
    """pair + condition: a b on one line -> YES if their sum, difference, ... is at least / at most t. Slip: >
    for >=, < for <=. The tests reject comparing a alone, b alone, another operation or another bound."""
    op, kind, t = rng.choice(sorted(PAIR_OPS)), rng.choice(sorted(COMPARISONS)), rng.randint(2, 9)
    value, cmp = PAIR_OPS[op][0], COMPARISONS[kind]
    test, slip = f"{value} {cmp} {t}", f"{value} {cmp[0]} {t}"
    word = {"difference": "difference a - b"}.get(op, op)

    def at(v: int) -> tuple[int, int]:  # a and b whose value is v
        return {"sum": (v, 0), "difference": (v, 0), "product": (v, 1), "maximum": (v, v - 1),
                "minimum": (v, v + 1)}[op]
    past = t - 1 if kind == "at least" else t + 1  # the first value on the NO side
    edges = ["%d %d" % at(t), "%d %d" % at(past), "%d %d" % at(t)[::-1]]
    values = ["a", "b", "a + b", "a - b", "b - a", "a * b", "max(a, b)", "min(a, b)"]
    wrong = [f"{v} {c} {bound}" for v in values for c in (">=", ">", "<=", "<", "==")
             for bound in (t - 1, t, t + 1, 0)]
    read = "a, b = map(int, input().split())\n"
    inputs = edges + _rejecting(rng, lambda: f"{rng.randint(-20, 20)} {rng.randint(-20, 20)}", k, edges, test,
                                wrong, lambda x: dict(zip("ab", map(int, x.split()))))
    solve = lambda s: "YES" if eval(test, {}, dict(zip("ab", map(int, s.split())))) else "NO"  # noqa: E731
    return _problem("compare", (op, kind, t), f"Read two integers a and b on one line. Print YES if their {word} is "
                    f"{kind} {t}, otherwise NO.", solve, inputs, f'{read}print("YES" if {test} else "NO")\n',
                    _cpp("long long a, b;", "cin >> a >> b;", f'cout << ({test} ? "YES" : "NO") << endl;'),
                    f'{read}print("YES" if {slip} else "NO")\n')


def spelling(rng: random.Random, k: int) -> Problem:
    """strings + condition: a word -> YES if it has at least t letters, or the letter c occurs in it at least t
    times. Slip: > for >=. The tests reject another bound, another letter, and length for count (or the reverse)."""
    c, op, t = rng.choice("abcdefghijklmnopqrstuvwxy"), rng.choice(["length", "count"]), rng.randint(2, 5)
    what = f"it has at least {t} letters" if op == "length" else f"the letter {c} occurs in it at least {t} times"
    value = "len(s)" if op == "length" else f"s.count('{c}')"
    count = "s.size()" if op == "length" else f"count(s.begin(), s.end(), '{c}')"
    other = chr(ord(c) + 1)

    def word() -> str:
        return "".join(rng.choice(f"{c}{other}xyz") for _ in range(rng.randint(1, 12)))
    edges = [c * t, c * (t - 1) + (other if op == "count" else ""), c * (t - 1) + other * 3]
    wrong = [f"{v} {cmp} {bound}" for v in ("len(s)", f"s.count('{c}')", f"s.count('{other}')")
             for cmp in (">=", ">", "<=", "<") for bound in (t - 1, t, t + 1)]
    inputs = edges + _rejecting(rng, word, k, edges, f"{value} >= {t}", wrong, lambda x: {"s": x})
    return _problem("spelling", (op, c, t) if op == "count" else (op, t),
                    f"Read a word s of lowercase letters. Print YES if {what}, otherwise NO.",
                    lambda s: "YES" if eval(value, {}, {"s": s}) >= t else "NO", inputs,
                    f's = input().strip()\nprint("YES" if {value} >= {t} else "NO")\n',
                    _cpp("string s;", "cin >> s;", f'cout << ({count} >= {t} ? "YES" : "NO") << endl;'),
                    f's = input().strip()\nprint("YES" if {value} > {t} else "NO")\n')


TRAIN_FAMILIES = {f.__name__: f for f in (arithmetic, pair, lists, condition, loop, strings)}
HELD_OUT_FAMILIES = {f.__name__: f for f in (multiples, span, compare, spelling)}


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

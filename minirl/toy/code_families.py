"""The code task's families: each draws a beginner stdin -> stdout problem from its parameters, with the tests
that tell its reference program from a near miss. minirl/toy/code_task.py makes the splits and the rows.

    p = loop(random.Random(0), k=3)   # a Problem: statement, example, inputs/outputs, python, cpp, slip

Two kinds, by what a held-out score measures:
- TRAIN_FAMILIES, one skill each (arithmetic on the input, a pair of numbers, lists, conditions, loops,
  strings): trained, and their held-out parameters are the test split's "code_task" rows;
- HELD_OUT_FAMILIES, two of those skills each (multiples: loop + condition; span: pair + loop; compare:
  pair + condition; spelling: strings + condition): never trained, the "code_task/new_families" rows.
A held-out family with a YES/NO answer draws its random inputs against programs that do half the task
(`_rejecting`): random inputs mostly answer the same and would let them pass.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

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

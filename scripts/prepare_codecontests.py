"""Prepare competitive-programming problems as veRL-format code rows for training and evaluation.

    python scripts/prepare_codecontests.py                                  # the files in ../shared/data/code
    python scripts/prepare_codecontests.py --input rows.jsonl --language python --out data/prepared/cc.jsonl
    python scripts/prepare_codecontests.py --no-verify                      # skip judging the known solutions

Reads, one row at a time, any of:
- DeepMind CodeContests (Hugging Face schema): `description`, `public_tests`/`private_tests`/`generated_tests`
  as {"input": [...], "output": [...]}, `cf_rating`, `time_limit {seconds, nanos}`, `memory_limit_bytes`;
- the variants in ../shared/data/code (see its SOURCES.md): `tests` as [{"input", "output"}], limits as
  `time_limit_seconds`/`memory_limit_bytes` or `time_limit_ms`/`memory_limit_mb`, ICPC rows with
  `validation` and `validator_flags`.
Filters, each reported with how many it removed: rating below 800 (when a rating is known), no tests, an empty
or malformed statement, invalid limits, and problems that need a jury checker (ICPC `custom` validation) the row
does not carry. A row with a `checker` ({"source", "language": "python"|"cpp"}, run as `checker input expected
actual`, exit code 0 accepts: minirl/judge/verdict.py) is kept, the checker in its ground truth, and every judge
backend runs it (minirl/rewards.py: judge_request).
Tags a difficulty tier from the Codeforces rating: Easy 800-1000, Hard 1100-2200, Expert 2300-3500.
`reward_model.ground_truth` (a JSON string, as veRL stores code tests) holds tests and limits only, never a
solution; `public_tests` too where the source has them (the examples CodeEnv's check_solution tool runs).
Missing limits default to 2 s and 256 MB (ICPC rows with no time limit: 2 s, noted in extra_info).

Float tolerance: an ICPC row's `float_tolerance` flag, else inferred: the statement accepts an "absolute or
relative error" (of 10^-k, default 1e-6) and some expected output has a non-integer number. A tolerance is never
set for integer-only outputs, where a relative error would accept wrong answers.
Verification (`--verify`, on when the file carries known-correct solutions: the CodeContests subset and the ICPC
rows do): each problem's known solutions (up to two, the preparation language first) are judged on the prepared
tests with the prepared limits; a problem none of them passes is dropped, counted by the verdict. Then a correct
program earns reward 1 on every kept problem. Prepared files are written 0640 (they hold the tests' answers).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTIONS = {
    "cpp": "Solve the problem in C++17. Read from standard input, write to standard output. "
           "Put your complete program in one ```cpp code block at the end of your answer.",
    "python": "Solve the problem in Python 3. Read from standard input, write to standard output. "
              "Put your complete program in one ```python code block at the end of your answer.",
}
_ERROR_PHRASE = re.compile(r"(absolute|relative)(\s+(error\s+)?or\s+(absolute|relative))?\s+error", re.I)
_POWER = re.compile(r"10\s*(?:\^|\*\*)?\s*\{?\s*[-\u2212\u2013]\s*(\d{1,2})|1e\s*-\s*(\d{1,2})")
_DECIMAL = re.compile(r"^[-+]?\d*\.\d+([eE][-+]?\d+)?$")
HF_LANGUAGES = {2: "cpp", 3: "python"}  # CodeContests' enum: 1 Python 2, 2 C++, 3 Python 3, 4 Java
DEFAULT_FILES = ["codecontests_train_subset300.jsonl", "codecontests_test165_deepcoder.jsonl",
                 "codeforces_2024_deepcoder408.jsonl", "icpc_kattis_problems.jsonl"]


def tier(rating: int | None) -> str:
    if rating is None:
        return "unknown"
    return "Easy" if rating <= 1000 else "Hard" if rating <= 2200 else "Expert"


def infer_tolerance(statement: str, tests: list[dict]) -> float | None:
    """10^-k when the statement accepts an absolute or relative error and an expected output has a decimal."""
    m = _ERROR_PHRASE.search(statement)
    if m is None or not any(_DECIMAL.match(tok) for t in tests for tok in t["output"].split()):
        return None
    power = _POWER.search(statement, m.start(), m.end() + 200)
    return 10.0 ** -int(power.group(1) or power.group(2)) if power else 1e-6


def known_solutions(raw: dict) -> list[dict]:
    """[{"language": "cpp"|"python", "code"}] that the row says are correct, in any schema."""
    sols = raw.get("solutions")
    if isinstance(sols, dict):                                    # Hugging Face: parallel lists
        return [{"language": HF_LANGUAGES[lang], "code": code}
                for lang, code in zip(sols.get("language", []), sols.get("solution", [])) if lang in HF_LANGUAGES]
    out = []
    for sol in sols or []:
        lang = {"cpp": "cpp", "c++": "cpp", "python3": "python", "python": "python"}.get(sol.get("language"))
        if lang and sol.get("verdict") in ("AC", "correct") and sol.get("code"):
            out.append({"language": lang, "code": sol["code"]})
    return out


def _hf_tests(block) -> list[dict]:
    if not block:
        return []
    return [{"input": i, "output": o} for i, o in zip(block.get("input", []), block.get("output", []))]


def normalise(raw: dict) -> tuple[dict | None, str | None]:
    """(problem, None) or (None, reason it was filtered)."""
    statement = raw.get("description") or raw.get("problem") or raw.get("statement")
    rating = raw.get("cf_rating") or None  # CodeContests uses 0 for "unknown"
    tolerance, public = None, []
    if "public_tests" in raw or "private_tests" in raw:          # Hugging Face CodeContests schema
        public = _hf_tests(raw.get("public_tests"))  # the statement's examples: CodeEnv's check_solution tool
        tests = _hf_tests(raw.get("private_tests")) or _hf_tests(raw.get("generated_tests")) or public
        tl = raw.get("time_limit") or {}
        time_limit = (tl.get("seconds") or 0) + (tl.get("nanos") or 0) / 1e9 if isinstance(tl, dict) else None
        memory_mb = (raw.get("memory_limit_bytes") or 0) / 2**20 or None
    else:                                                         # shared/data variants
        if "group" in (raw.get("tests") or [{}])[0]:              # ICPC: secret tests are the real ones
            tests = [t for t in raw["tests"] if t.get("group") == "secret"] or raw["tests"]
        else:
            tests = raw.get("tests") or []
        time_limit = raw.get("time_limit_seconds") or ((raw.get("time_limit_ms") or 0) / 1000) or None
        memory_mb = raw.get("memory_limit_mb") or ((raw.get("memory_limit_bytes") or 0) / 2**20) or None
        if raw.get("validation", "default") != "default" and not isinstance(raw.get("checker"), dict):
            return None, "needs a jury checker"
        flags = (raw.get("validator_flags") or "").split()
        for i, flag in enumerate(flags[:-1]):
            if "tolerance" in flag:
                tolerance = float(flags[i + 1])
    if rating is not None and rating < 800:
        return None, "rated below 800"
    if not tests or not all(isinstance(t.get("input"), str) and isinstance(t.get("output"), str) for t in tests):
        return None, "no tests"
    if not isinstance(statement, str) or len(statement.strip()) < 30:
        return None, "empty or malformed statement"
    if tolerance is None:
        tolerance = infer_tolerance(statement, tests)
    time_limit = 2.0 if time_limit is None else float(time_limit)
    memory_mb = 256 if memory_mb is None else int(memory_mb)
    if not 0 < time_limit <= 60 or not 16 <= memory_mb <= 65536:
        return None, "invalid limits"
    return {"name": raw.get("name") or raw.get("id"), "statement": statement.strip(), "tests": tests,
            "public_tests": public,
            "time_limit_s": time_limit, "memory_limit_mb": memory_mb, "rating": rating,
            "float_tolerance": tolerance, "default_time_limit": raw.get("time_limit_seconds", 0) is None,
            "checker": raw.get("checker") if isinstance(raw.get("checker"), dict) else None}, None


def to_row(problem: dict, language: str, data_source: str, index: int, split: str) -> dict:
    truth = {"tests": problem["tests"], "language": language, "time_limit_s": problem["time_limit_s"],
             "memory_limit_mb": problem["memory_limit_mb"], "float_tolerance": problem["float_tolerance"]}
    if problem.get("public_tests"):
        truth["public_tests"] = problem["public_tests"]
    if problem.get("checker"):
        truth["checker"] = problem["checker"]
    return {"data_source": data_source,
            "prompt": [{"role": "user", "content": f"{problem['statement']}\n\n{INSTRUCTIONS[language]}"}],
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
            "extra_info": {"split": split, "index": index, "name": problem["name"], "rating": problem["rating"],
                           "tier": tier(problem["rating"]), "default_time_limit": problem["default_time_limit"]}}


def prepare(path: Path, language: str, split: str, max_tests: int, judge=None) -> tuple[list[dict], Counter]:
    """Rows and the count of dropped problems per reason; with a `judge`, known solutions are verified."""
    problems, dropped = [], Counter()
    for i, line in enumerate(path.open()):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"{path}, line {i + 1}: not valid JSON ({e.msg})")
        problem, reason = normalise(raw)
        if problem is None:
            dropped[reason] += 1
            continue
        problem["tests"] = problem["tests"][:max_tests]
        problems.append((problem, known_solutions(raw)))
    if judge is not None:
        problems = verify(problems, language, judge, dropped)
    rows = [to_row(p, language, f"code/{path.stem}", i, split) for i, (p, _) in enumerate(problems)]
    return rows, dropped


def verify(problems: list[tuple[dict, list[dict]]], language: str, judge, dropped: Counter) -> list:
    """Keep the problems that one of their known solutions passes (up to two tried, `language` first)."""
    kept, pending = [], []
    for problem, sols in problems:
        sols = sorted(sols, key=lambda s: s["language"] != language)[:2]
        if sols:
            pending.append((problem, sols))
        else:
            dropped["no known solution to verify with"] += 1
    for attempt in range(2):
        jobs = [dict(source=sols[attempt]["code"], language=sols[attempt]["language"], tests=p["tests"],
                     time_limit_s=p["time_limit_s"], memory_limit_mb=p["memory_limit_mb"],
                     float_tolerance=p["float_tolerance"], **({"checker": p["checker"]} if p.get("checker") else {}))
                for p, sols in pending]
        failed = []
        for (problem, sols), res in zip(pending, judge.run_many(jobs)):
            if res.verdict == "AC":
                kept.append((problem, sols))
            elif attempt + 1 < len(sols):
                failed.append((problem, sols))
            else:
                dropped[f"known solution gets {res.verdict}"] += 1
        pending = failed
    order = {id(p): i for i, (p, _) in enumerate(problems)}
    return sorted(kept, key=lambda ps: order[id(ps[0])])


def write_private(target: Path, text: str) -> None:
    """0640: the file holds every test's expected output."""
    target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    os.fchmod(fd, 0o640)  # an older, world-readable file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="*", help="JSONL files (default: the four in ../shared/data/code)")
    ap.add_argument("--out", default=str(ROOT / "data" / "prepared"), help="a folder, or a .jsonl file for one input")
    ap.add_argument("--language", choices=["cpp", "python"], default="cpp")
    ap.add_argument("--max-tests", type=int, default=20, help="tests kept per problem (bounds judging time)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                    help="judge the rows' known solutions and drop what they fail (default: on when rows have them)")
    args = ap.parse_args()
    inputs = [Path(p) for p in args.input] if args.input else \
        [ROOT.parent / "shared" / "data" / "code" / f for f in DEFAULT_FILES]
    out = Path(args.out)
    judge = None
    for path in inputs:
        if not path.is_file():
            sys.exit(f"missing input {path}")
        verify_this = args.verify if args.verify is not None else _has_solutions(path)
        if verify_this and judge is None:
            from minirl.judge import Judge
            judge = Judge()
        rows, dropped = prepare(path, args.language, args.split, args.max_tests, judge if verify_this else None)
        target = out if out.suffix == ".jsonl" else out / f"{path.stem}_{args.language}.jsonl"
        write_private(target, "".join(json.dumps(r) + "\n" for r in rows))
        tiers = Counter(r["extra_info"]["tier"] for r in rows)
        print(f"{path.name}: kept {len(rows)} -> {target}; dropped {dict(dropped) or 'none'}; tiers {dict(tiers)}"
              f"{'; verified' if verify_this else ''}")
    if judge is not None:
        judge.close()


def _has_solutions(path: Path) -> bool:
    with path.open() as f:
        return bool(known_solutions(json.loads(f.readline() or "{}")))


if __name__ == "__main__":
    main()

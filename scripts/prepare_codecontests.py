"""Prepare competitive-programming problems as veRL-format code rows for training and evaluation.

    python scripts/prepare_codecontests.py                                  # the files in ../shared/data/code
    python scripts/prepare_codecontests.py --input rows.jsonl --language python --out data/prepared/cc.jsonl

Reads, one row at a time, any of:
- DeepMind CodeContests (Hugging Face schema): `description`, `public_tests`/`private_tests`/`generated_tests`
  as {"input": [...], "output": [...]}, `cf_rating`, `time_limit {seconds, nanos}`, `memory_limit_bytes`;
- the variants in ../shared/data/code (see its SOURCES.md): `tests` as [{"input", "output"}], limits as
  `time_limit_seconds`/`memory_limit_bytes` or `time_limit_ms`/`memory_limit_mb`, ICPC rows with
  `validation` and `validator_flags`.
Filters, each reported with how many it removed: rating below 800 (when a rating is known), no tests, an empty
or malformed statement, invalid limits, and problems that need a jury checker (ICPC `custom` validation).
Tags a difficulty tier from the Codeforces rating: Easy 800-1000, Hard 1100-2200, Expert 2300-3500.
`reward_model.ground_truth` (a JSON string, as veRL stores code tests) holds tests and limits only, never a
solution; `public_tests` too where the source has them (the examples CodeEnv's check_solution tool runs). Missing limits default to 2 s and 256 MB (ICPC rows with no time limit: 2 s, noted in extra_info).
"""
from __future__ import annotations

import argparse
import json
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
DEFAULT_FILES = ["codecontests_train_subset300.jsonl", "codecontests_test165_deepcoder.jsonl",
                 "codeforces_2024_deepcoder408.jsonl", "icpc_kattis_problems.jsonl"]


def tier(rating: int | None) -> str:
    if rating is None:
        return "unknown"
    return "Easy" if rating <= 1000 else "Hard" if rating <= 2200 else "Expert"


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
        if raw.get("validation", "default") != "default":
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
    time_limit = 2.0 if time_limit is None else float(time_limit)
    memory_mb = 256 if memory_mb is None else int(memory_mb)
    if not 0 < time_limit <= 60 or not 16 <= memory_mb <= 65536:
        return None, "invalid limits"
    return {"name": raw.get("name") or raw.get("id"), "statement": statement.strip(), "tests": tests,
            "public_tests": public,
            "time_limit_s": time_limit, "memory_limit_mb": memory_mb, "rating": rating,
            "float_tolerance": tolerance, "default_time_limit": raw.get("time_limit_seconds", 0) is None}, None


def to_row(problem: dict, language: str, data_source: str, index: int, split: str) -> dict:
    truth = {"tests": problem["tests"], "language": language, "time_limit_s": problem["time_limit_s"],
             "memory_limit_mb": problem["memory_limit_mb"], "float_tolerance": problem["float_tolerance"]}
    if problem.get("public_tests"):
        truth["public_tests"] = problem["public_tests"]
    return {"data_source": data_source,
            "prompt": [{"role": "user", "content": f"{problem['statement']}\n\n{INSTRUCTIONS[language]}"}],
            "ability": "code",
            "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
            "extra_info": {"split": split, "index": index, "name": problem["name"], "rating": problem["rating"],
                           "tier": tier(problem["rating"]), "default_time_limit": problem["default_time_limit"]}}


def prepare(path: Path, language: str, split: str, max_tests: int) -> tuple[list[dict], Counter]:
    rows, dropped = [], Counter()
    source = path.stem
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
        rows.append(to_row(problem, language, f"code/{source}", len(rows), split))
    return rows, dropped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="*", help="JSONL files (default: the four in ../shared/data/code)")
    ap.add_argument("--out", default=str(ROOT / "data" / "prepared"), help="a folder, or a .jsonl file for one input")
    ap.add_argument("--language", choices=["cpp", "python"], default="cpp")
    ap.add_argument("--max-tests", type=int, default=20, help="tests kept per problem (bounds judging time)")
    ap.add_argument("--split", default="train")
    args = ap.parse_args()
    inputs = [Path(p) for p in args.input] if args.input else \
        [ROOT.parent / "shared" / "data" / "code" / f for f in DEFAULT_FILES]
    out = Path(args.out)
    for path in inputs:
        if not path.is_file():
            sys.exit(f"missing input {path}")
        rows, dropped = prepare(path, args.language, args.split, args.max_tests)
        target = out if out.suffix == ".jsonl" else out / f"{path.stem}_{args.language}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tiers = Counter(r["extra_info"]["tier"] for r in rows)
        print(f"{path.name}: kept {len(rows)} -> {target}; dropped {dict(dropped) or 'none'}; tiers {dict(tiers)}")


if __name__ == "__main__":
    main()

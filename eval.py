"""Evaluate a saved model on math or code problems: pass@k, maj@n, per-sample JSONL and a summary.

    python eval.py --model runs/default --data data/arith_test.jsonl --n 8 --k 1,4,8 --temperature 0.6
    python eval.py --model runs/gsm8k --data ../shared/data/gsm8k/test_200.jsonl --n 1 --temperature 0   # greedy
    python eval.py --model runs/code --data data/prepared/codecontests_test165_deepcoder_cpp.jsonl --n 4 --k 1,4

--model: any folder `save_pretrained` wrote (full model, merged LoRA, or a LoRA adapter on its base).
--data: prepared rows (GSM8K, MATH, code), a raw GSM8K or MATH file (recognised by its fields), or SimpleRL
custom rows {"instruction", "expected_output"}. Writes OUT/samples.jsonl (one row per completion) and
OUT/summary.json (strict JSON: a judge error's reward, or a score over nothing judged, is null), and prints a
table. --n > 1 without --temperature samples at 0.6 (SAMPLING_TEMPERATURE).
The scoring is minirl.evaluate.evaluate, the function train.py's held-out evaluation calls, with the same
scorer (minirl.rewards.Scorer) and the same sandboxed judge for code.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from minirl.cli import exit_on_user_error
from minirl.data import load_rows
from minirl.evaluate import evaluate, summarize
from minirl.models import load_model, load_tokenizer, pick_attn_implementation, pick_dtype, resolve_model_path
from minirl.rewards import Scorer, is_code, load_reward_fn


# pass@k with several samples: DeepSeek-R1's evaluation samples at 0.6 (its report, sec. 3); veRL's
# val_kwargs leave it to the user. 0.6 keeps samples diverse without the incoherence of T=1 on small models.
SAMPLING_TEMPERATURE = 0.6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a save_pretrained folder, or 'tiny'")
    ap.add_argument("--data", required=True, help="a .jsonl/.json/.parquet file (comma-separate several)")
    ap.add_argument("--n", type=int, default=1, help="completions per problem")
    ap.add_argument("--k", default="1", help="comma-separated k for pass@k (each <= n)")
    ap.add_argument("--temperature", type=float, default=None,
                    help=f"0 = greedy (needs --n 1). Default: 0 with --n 1, {SAMPLING_TEMPERATURE} with --n > 1")
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument("--max_new_tokens", type=int, default=512)
    ap.add_argument("--limit", type=int, default=0, help="only the first N problems (0 = all)")
    ap.add_argument("--batch_size", type=int, default=16, help="problems per generate call")
    ap.add_argument("--output", default=None, help="output folder (default: <model>/eval)")
    ap.add_argument("--code_reward_style", choices=["codefu", "binary"], default="codefu")
    ap.add_argument("--answer_extraction", choices=["strict", "flexible"], default="strict",
                    help="GSM8K-style rows: the number after '####' (strict) or the last number (flexible)")
    ap.add_argument("--reward_fn", default="", help="path/to/file.py:function scoring every row, as train.py's "
                    "--reward_fn (function(data_source, solution_str, ground_truth, extra_info) -> float)")
    ap.add_argument("--judge_workers", type=int, default=0, help="0 = all cores")
    ap.add_argument("--judge_isolation", choices=["strict", "weak"], default="strict",
                    help="weak: judge even where the sandbox has no namespaces (see minirl/judge/README.md)")
    ap.add_argument("--judge_backend", choices=["local", "remote", "ray"], default="local",
                    help="where code is judged (docs/judge_backends.md)")
    ap.add_argument("--judge_urls", default="", help="remote: comma-separated servers; ray: the cluster address")
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.k.split(",") if k]
    if args.n < 1 or any(k < 1 or k > args.n for k in ks):
        ap.error(f"--k values must be between 1 and --n ({args.n}); got {args.k}")
    if args.limit < 0 or args.batch_size < 1 or args.max_new_tokens < 1 or args.judge_workers < 0:
        ap.error("--limit and --judge_workers must be >= 0, --batch_size and --max_new_tokens >= 1")
    if args.temperature is None:  # several samples of one problem only make sense when sampling
        args.temperature = 0.0 if args.n == 1 else SAMPLING_TEMPERATURE
        if args.n > 1:
            print(f"--n {args.n}: sampling at temperature {SAMPLING_TEMPERATURE} (set --temperature to change)")
    if args.temperature < 0:
        ap.error(f"--temperature must be >= 0, got {args.temperature}")
    if args.temperature == 0 and args.n != 1:
        ap.error("--temperature 0 is greedy decoding: every sample would be identical; use --n 1 or a temperature")
    args.ks = ks
    return args


def json_safe(value):
    """`value` with every NaN (a judge error's reward, a score over nothing judged) as None: JSON has no NaN, and
    json.dumps would write one that strict readers (jq, JSON.parse) refuse."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return [json_safe(v) for v in value] if isinstance(value, list) else value


def print_table(summary: dict[str, dict]) -> None:
    cols = sorted({k for s in summary.values() for k in s}, key=lambda c: (not c.startswith(("mean", "pass", "maj",
                                                                                                "greedy")), c))
    widths = [max(len(c), 10) for c in cols]  # each column as wide as its full name
    src_width = max([len("data_source")] + [len(src) for src in summary])
    print(f"{'data_source':{src_width}s} " + " ".join(f"{c:>{w}s}" for c, w in zip(cols, widths)))
    for src, s in summary.items():
        print(f"{src:{src_width}s} " + " ".join(f"{s[c]:{w}.4f}" if isinstance(s.get(c), float)
                                                else f"{str(s.get(c, '')):>{w}s}" for c, w in zip(cols, widths)))


def main(argv: list[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    reward_fn = load_reward_fn(args.reward_fn) if args.reward_fn else None  # a bad spec fails before loading
    path = resolve_model_path(args.model)
    out = Path(args.output or Path(path) / "eval")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # device-branch: eval/device
    tokenizer = load_tokenizer(path)
    dtype = pick_dtype("auto", device)
    model = load_model(path, dtype, pick_attn_implementation("auto", dtype)).to(device).eval()
    rows = load_rows(args.data, split="test", limit=args.limit)
    judge = None
    if any(is_code(r) for r in rows) and reward_fn is None:  # the sandboxed judge, only for code problems
        from minirl.judge.backends import build_judge
        judge = build_judge(args)
    scorer = Scorer(judge, args.code_reward_style, args.answer_extraction, reward_fn)  # as in training
    greedy = args.temperature == 0
    with tqdm(total=len(rows), desc="generate + score", dynamic_ncols=True) as bar:
        records = evaluate(model, tokenizer, rows, n=args.n, greedy=greedy, temperature=args.temperature or 1.0,
                           top_p=args.top_p, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                           progress=bar.update, scorer=scorer)
    if judge is not None:
        judge.close()
    summary = summarize(records, args.ks, greedy=greedy)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "samples.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(json_safe(r), allow_nan=False) + "\n")
    (out / "summary.json").write_text(json.dumps(json_safe(summary), indent=2, allow_nan=False))
    print_table(summary)
    print(f"wrote {out / 'samples.jsonl'} ({len(records)} completions) and {out / 'summary.json'}")
    return summary


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(0 if exit_on_user_error(main) else 1)

"""Convert the raw GSM8K and MATH files into veRL-format rows (jsonl or parquet) for training and evaluation.

    python scripts/prepare_math_data.py                          # reads ../shared/data, writes data/prepared/
    python scripts/prepare_math_data.py --src DIR --out DIR --format parquet

Writes gsm8k_train, gsm8k_test, math_train (7500 MATH train + 4500 MATH test problems not in MATH-500) and
math500_test. Each row: data_source, prompt (chat list), ability, reward_model {style, ground_truth},
extra_info. Parquet files load in veRL unchanged.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from minirl.data import GSM8K_SOURCE, MATH_SOURCE, gsm8k_row, math_row

SPLITS = [  # (output name, input files, converter, split, data_source)
    ("gsm8k_train", ["gsm8k/train.jsonl"], "gsm8k", "train", GSM8K_SOURCE),
    ("gsm8k_test", ["gsm8k/test_200.jsonl"], "gsm8k", "test", GSM8K_SOURCE),
    ("math_train", ["math/math_train_7500.jsonl", "math/math_test_4500_nonmath500.jsonl"], "math", "train",
     MATH_SOURCE),
    ("math500_test", ["math/math500_test.jsonl"], "math", "test", "HuggingFaceH4/MATH-500"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(ROOT / "data" / "prepared"))
    ap.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, files, kind, split, source in SPLITS:
        rows = []
        for rel in files:
            path = src / rel
            if not path.is_file():
                sys.exit(f"missing {path}: pass --src pointing at the folder holding gsm8k/ and math/")
            for i, line in enumerate(path.open()):
                raw = json.loads(line)
                try:
                    row = gsm8k_row(raw, len(rows), split) if kind == "gsm8k" else \
                        math_row(raw, len(rows), split, data_source=source)
                except KeyError as e:
                    sys.exit(f"{path}, line {i + 1}: missing field {e}")
                rows.append(row)
        target = out / f"{name}.{args.format}"
        if args.format == "jsonl":
            target.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            import datasets
            datasets.Dataset.from_list(rows).to_parquet(str(target))
        print(f"{target}: {len(rows)} rows")


if __name__ == "__main__":
    main()

"""Write the built-in toy task's data files (already shipped in data/; rerun to regenerate them).

    python scripts/make_toy_data.py            # data/arith_train.jsonl (5000 rows), data/arith_test.jsonl (200)
"""
import json
from pathlib import Path

from minirl.toy.tiny import arithmetic_rows

out = Path(__file__).resolve().parents[1] / "data"
for name, n, seed in [("arith_train", 5000, 1), ("arith_test", 200, 2)]:
    rows = arithmetic_rows(n, seed=seed, split=name.split("_")[1])
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {out / name}.jsonl")

"""Write the built-in code task's data files (shipped in data/; rerun to regenerate them).

    python scripts/make_code_task_data.py    # data/code_task_{train,test}_{python,cpp}.jsonl (1000 / 96 rows)

The problems are minirl/toy/code_task.py's: train rows from the 6 training families, test rows with held-out
parameters of those families (data_source "code_task") and from the 4 held-out families
("code_task/new_families"). The Python and C++ files hold the same problems, the prompt asking for the
language. The test files are what recipes/code_cpu.yaml validates on.
"""
import json
from pathlib import Path

from minirl.toy.code_task import code_task_rows

out = Path(__file__).resolve().parents[1] / "data"
for split, n, seed in [("train", 1000, 1), ("test", 96, 2)]:
    for language in ("python", "cpp"):
        rows = code_task_rows(n, seed=seed, split=split, language=language)
        path = out / f"code_task_{split}_{language}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")

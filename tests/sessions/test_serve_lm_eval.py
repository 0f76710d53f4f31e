"""lm-evaluation-harness, the user's real client, against the server: a local task of each kind (generate_until
via chat and via completions, loglikelihood multiple choice) scores as lm-eval's own `hf` backend does on the
same model and rows, output for output (scripts/compare_lm_eval.py, run as a user would)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("lm_eval")
pytest.importorskip("aiohttp")  # lm-eval's API models need its [api] extra


def test_lm_eval_scores_every_task_type_through_the_server_as_its_hf_backend_does(tmp_path):
    rows = 8
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "scripts/compare_lm_eval.py", "--model", "tiny", "--rows", str(rows),
                           "--json", str(tmp_path / "table.json")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = {r["task type"]: r for r in json.loads((tmp_path / "table.json").read_text())}
    assert set(table) == {"generate_until via chat", "generate_until via completions",
                          "loglikelihood (multiple choice)"}
    for kind, r in table.items():
        assert r["identical outputs"] == rows, (kind, r)
        assert r["minirl.serve"] == r["lm-eval hf"], (kind, r)

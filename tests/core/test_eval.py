import json
import subprocess
import sys

import pytest

from minirl.data import GSM8K_SOURCE
from conftest import ROOT, shared_file
from minirl.evaluate import majority_vote, pass_at_k, summarize

import eval as eval_script


def test_pass_at_k_matches_the_codex_estimator():
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(8, 2, 4) == pytest.approx(0.785714, abs=1e-6)
    assert pass_at_k(8, 2, 8) == 1.0
    assert pass_at_k(8, 0, 4) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    from math import comb
    for n, c, k in [(10, 3, 2), (16, 5, 7), (4, 1, 3)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_vote(["72", "72.0", "72", "5"], [1, 1, 1, 0]) == 1        # "72" wins 2 votes to 1
    assert majority_vote(["5", "5", "72", None], [0, 0, 1, 0]) == 0
    assert majority_vote([None, None], [0, 0]) == 0
    assert majority_vote([r"\frac{1}{2}", r"\dfrac{1}{2}", "3"], [1, 1, 0]) == 1  # normalised strings vote together


def test_summarize_per_source():
    recs = [{"data_source": "s", "index": i, "sample": j, "reward": float(j < c), "answer": str(j < c),
             "tokens": 10, "truncated": False, "seconds": 0.1} for i, c in enumerate([2, 0]) for j in range(8)]
    s = summarize(recs, ks=[1, 4, 8])["s"]
    assert s["pass@1"] == pytest.approx(0.125) and s["pass@4"] == pytest.approx(0.785714 / 2, abs=1e-6)
    assert s["pass@8"] == 0.5 and s["mean@8"] == pytest.approx(2 / 16) and s["maj@8"] == 0.0
    assert s["tokens_per_second"] == pytest.approx(100.0)


def test_eval_py_on_real_gsm8k_rows(tmp_path, tiny_path):
    out = tmp_path / "out"
    eval_script.main(["--model", str(tiny_path), "--data", str(shared_file("gsm8k/test_200.jsonl")),
                      "--limit", "6", "--n", "4", "--k", "1,2,4", "--temperature", "0.6",
                      "--max_new_tokens", "12", "--output", str(out)])
    samples = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(samples) == 24
    for field in ("problem_id", "data_source", "prompt", "completion", "answer", "reward", "tokens", "seconds"):
        assert field in samples[0], field
    summary = json.loads((out / "summary.json").read_text())[GSM8K_SOURCE]
    for field in ("mean@4", "pass@1", "pass@2", "pass@4", "maj@4", "mean_completion_tokens", "seconds_per_token",
                  "tokens_per_second"):
        assert field in summary, field


def test_eval_py_greedy_on_the_toy_task_and_on_code(tmp_path, tiny_path):
    summary = eval_script.main(["--model", "tiny", "--data", str(ROOT / "data" / "arith_test.jsonl"), "--limit", "40",
                                "--max_new_tokens", "8", "--output", str(tmp_path / "toy")])
    assert 0.0 < summary["toy_arithmetic"]["greedy_accuracy"] < 1.0
    from prepare_codecontests import prepare
    rows, _ = prepare(shared_file("code/codecontests_train_subset300.jsonl"), "python", "test", max_tests=2)
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    eval_script.main(["--model", str(tiny_path), "--data", str(data), "--n", "2", "--k", "1,2", "--temperature", "1",
                      "--max_new_tokens", "8", "--judge_workers", "2", "--output", str(tmp_path / "code")])
    samples = [json.loads(line) for line in (tmp_path / "code" / "samples.jsonl").open()]
    assert len(samples) == 6 and all(s["verdict"] == "no code" and s["reward"] == -1.0 for s in samples)
    summary = json.loads((tmp_path / "code" / "summary.json").read_text())
    assert list(summary.values())[0]["pass@2"] == 0.0


def test_eval_py_rejects_bad_k():
    with pytest.raises(SystemExit):
        eval_script.parse_args(["--model", "x", "--data", "y", "--n", "2", "--k", "4"])


def test_plot_script_writes_a_png_from_a_real_run(tmp_path, tiny_path):
    import train
    train.main(["--max_steps", "4", "--val_every", "2", "--val_max_samples", "20", "--output_dir", str(tmp_path)])
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_metrics.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    png = tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert rows[0]["training/global_step"] == 0 and "val/test_score/toy_arithmetic" in rows[0]
    assert "val/test_score/toy_arithmetic" in rows[2] and "val/test_score/toy_arithmetic" in rows[-1]

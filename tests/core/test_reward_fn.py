"""train.py --reward_fn path/to/file.py:function (veRL's custom_reward_function)."""
import json

import pytest

import train
from conftest import ROOT
from minirl.config import ConfigError
from minirl.rewards import load_reward_fn


def test_missing_file_or_function_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="'reward_fn'.*is not an existing .py file.*path/to/file.py:function"):
        load_reward_fn(str(tmp_path / "nope.py:score"))
    f = tmp_path / "mine.py"
    f.write_text("def other(*args):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="defines no function 'score'.*def score\\(data_source, solution_str"):
        load_reward_fn(f"{f}:score")
    with pytest.raises(ConfigError, match="defines no function 'compute_score'"):  # veRL's default name
        load_reward_fn(str(f))
    with pytest.raises(ConfigError, match="reward_fn"):  # before any model is loaded
        train.main(["--reward_fn", str(tmp_path / "nope.py:score"), "--output_dir", str(tmp_path / "run")])


def test_train_uses_the_custom_reward_for_every_row(tmp_path, tiny_path):
    f = tmp_path / "length_reward.py"
    f.write_text("seen = []\n"
                 "def score(data_source, solution_str, ground_truth, extra_info):\n"
                 "    seen.append((data_source, ground_truth, extra_info['split']))\n"
                 "    return float(len(solution_str) > 100)  # never: the toy answers are short\n")
    out = train.main(["--reward_fn", f"{f}:score", "--max_steps", "1", "--prompts_per_step", "4",
                      "--group_size", "2", "--val_max_samples", "4", "--output_dir", str(tmp_path / "run")])
    row = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()][-1]
    assert row["critic/reward/mean"] == 0.0 and out["after"]["val/test_score/toy_arithmetic"] == 0.0
    seen = load_reward_fn(f"{f}:score").__globals__["seen"]
    assert [s[2] for s in seen] == ["test"] * 4 + ["train"] * 8 + ["test"] * 4  # before, the step, after
    assert all(s[0] == "toy_arithmetic" for s in seen)


def test_eval_py_scores_with_the_custom_reward_even_on_a_data_source_minirl_does_not_know(tmp_path, tiny_path):
    import eval as eval_script
    f = tmp_path / "half.py"
    f.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                 "    return 0.5 if data_source == 'my_task' else 0.0\n")
    rows = [json.loads(line) for line in (ROOT / "data" / "arith_test.jsonl").open()][:3]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({**r, "data_source": "my_task"}) + "\n" for r in rows))
    summary = eval_script.main(["--model", str(tiny_path), "--data", str(data), "--max_new_tokens", "4",
                                "--reward_fn", str(f), "--output", str(tmp_path / "eval")])
    assert summary["my_task"]["mean@1"] == 0.5 and summary["my_task"]["problems"] == 3
    records = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").open()]
    assert all(r["answer"] is None and r["reward"] == 0.5 for r in records)  # no built-in verifier to extract

"""train.py --reward_fn path/to/file.py:function (veRL's custom_reward_function)."""
import json

import pytest

import train
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

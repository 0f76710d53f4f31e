"""The rough edges a new user hits first: noisy warnings, defaults that error, truncated tables, tracebacks
for user mistakes, unchecked counts, generating past the model's context."""
import json
import subprocess
import sys
import warnings

import pytest

from conftest import ROOT
from minirl.cli import exit_on_user_error
from minirl.config import ConfigError, parse_config
from minirl.rollout import sample

import eval as eval_script
import train

PROMPT = "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"


def test_sampling_prints_no_length_warning(random_model, tiny_tokenizer, capfd):
    for greedy in (True, False):
        sample(random_model, tiny_tokenizer, [PROMPT], group_size=2 - greedy, max_new_tokens=4, greedy=greedy)
    err = capfd.readouterr().err
    assert "min_new_tokens" not in err and "min_length" not in err and "may be ignored" not in err, err


def test_max_new_tokens_is_capped_by_the_context_with_one_warning(random_model, tiny_tokenizer):
    random_model.config.max_position_embeddings = 24  # the prompt is 15 tokens: 9 left for the response
    P = len(tiny_tokenizer(PROMPT, add_special_tokens=False).input_ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default: once per message and place
        for _ in range(3):
            r = sample(random_model, tiny_tokenizer, [PROMPT], 1, max_new_tokens=50, greedy=True)
            assert r.prompt_ids.shape[1] + r.response_ids.shape[1] <= 24
    capped = [w for w in caught if "context of 24 tokens" in str(w.message)]
    assert len(capped) == 1 and P < 24


def test_eval_n_above_1_samples_at_the_documented_temperature():
    args = eval_script.parse_args(["--model", "x", "--data", "y", "--n", "4", "--k", "1,4"])
    assert args.temperature == eval_script.SAMPLING_TEMPERATURE > 0
    assert eval_script.parse_args(["--model", "x", "--data", "y"]).temperature == 0  # n=1: greedy
    with pytest.raises(SystemExit):  # an explicit greedy request with n > 1 is still refused
        eval_script.parse_args(["--model", "x", "--data", "y", "--n", "4", "--temperature", "0"])


def test_eval_table_prints_whole_column_names(capsys):
    eval_script.print_table({"openai/gsm8k": {"mean_completion_tokens": 12.5, "seconds_per_token": 0.01,
                                              "pass@1": 0.5}})
    header, row = capsys.readouterr().out.splitlines()
    assert "mean_completion_tokens" in header and "seconds_per_token" in header
    assert "12.5000" in row and len(header.split()) == len(row.split())


def test_negative_counts_are_config_errors():
    for key in ("max_steps", "val_every", "save_every", "val_max_samples", "warmup_steps"):
        with pytest.raises(ConfigError, match=f"'{key}' must be >= 0"):
            parse_config([f"--{key}", "-3"])


def run_user_error(fn, capsys) -> str:
    """The one line a user sees, after checking the exit status is 2."""
    with pytest.raises(SystemExit) as exit_info:
        exit_on_user_error(fn)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()  # progress bars of loading may come first
    assert "Traceback" not in err and err.splitlines()[-1].startswith("error: "), err
    return err.splitlines()[-1]


def test_user_errors_are_one_line_with_status_2(tmp_path, tiny_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"data_source": "openai/gsm8k", "prompt": "not a list",
                               "reward_model": {"ground_truth": "1"}}) + "\n")
    err = run_user_error(lambda: train.main(["--train_files", str(bad), "--output_dir", str(tmp_path / "r")]),
                         capsys)
    assert "bad.jsonl, line 1" in err and "'prompt'" in err
    assert "model_name_or_path" in run_user_error(lambda: train.main(["--model_name_or_path", "./no/such/model"]),
                                                  capsys)
    assert "does not exist" in run_user_error(lambda: eval_script.main(
        ["--model", str(tiny_path), "--data", str(tmp_path / "missing.jsonl")]), capsys)
    assert "'lr'" in run_user_error(lambda: train.main(["--lr", "fast"]), capsys)
    # a data_source no built-in reward knows fails before the first step, naming the table
    rows = [json.loads(line) for line in (ROOT / "data" / "arith_train.jsonl").open()][:4]
    mystery = tmp_path / "mystery.jsonl"
    mystery.write_text("".join(json.dumps({**r, "data_source": "aftermath"}) + "\n" for r in rows))
    err = run_user_error(lambda: train.main(["--train_files", str(mystery), "--val_files", "", "--output_dir",
                                             str(tmp_path / "m")]), capsys)
    assert "'aftermath'" in err and "REWARD_KINDS" in err
    assert not (tmp_path / "m" / "metrics.jsonl").exists()


def test_bad_values_on_the_command_line_exit_2_without_traceback():
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--max_steps", "-3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: config key 'max_steps' must be >= 0, got -3"

import json

import pytest

from minirl.data import GSM8K_SOURCE
from conftest import ROOT, shared_file
from minirl.data import DataError, load_rows, prompt_indices, prompt_text


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_toy_files_load_in_verl_format():
    rows = load_rows(str(ROOT / "data" / "arith_test.jsonl"))
    assert len(rows) == 200
    r = rows[0]
    assert r["data_source"] == "toy_arithmetic" and r["prompt"][0]["role"] == "user"
    assert r["reward_model"]["ground_truth"].isdigit()


def test_raw_gsm8k_and_math_rows_are_converted():
    g = load_rows(str(shared_file("gsm8k/test_200.jsonl")), limit=5)
    assert g[0]["data_source"] == GSM8K_SOURCE and "####" in g[0]["prompt"][0]["content"]
    assert g[0]["reward_model"]["ground_truth"] == "18"
    m = load_rows(str(shared_file("math/math500_test.jsonl")), limit=5)
    assert "\\boxed{}" in m[0]["prompt"][0]["content"]
    assert m[0]["reward_model"]["ground_truth"] == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_simplerl_custom_rows_train_as_math(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [{"instruction": "What is 2+2?", "expected_output": "4",
                                            "reasoning_steps": ["2+2=4"]}])
    (row,) = load_rows(f)
    assert row["data_source"] == "simplerl_custom" and row["reward_model"]["ground_truth"] == "4"
    from minirl.rewards import score
    assert score([r"\boxed{4}"], [row]) == [1.0]


def test_malformed_rows_name_file_line_and_field(tmp_path):
    good = {"data_source": GSM8K_SOURCE, "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"style": "rule", "ground_truth": "1"}}
    f = write_jsonl(tmp_path / "bad.jsonl", [good, good, {**good, "reward_model": {"style": "rule"}}])
    with pytest.raises(DataError, match=r"bad.jsonl, line 3: missing field 'reward_model.ground_truth'"):
        load_rows(f)
    f2 = write_jsonl(tmp_path / "bad2.jsonl", [good, {"instruction": "x"}])
    with pytest.raises(DataError, match=r"bad2.jsonl, line 2: missing field 'expected_output'"):
        load_rows(f2)
    f3 = tmp_path / "bad3.jsonl"
    f3.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad3.jsonl, line 2: not valid JSON"):
        load_rows(str(f3))
    with pytest.raises(DataError, match="does not exist"):
        load_rows(str(tmp_path / "missing.jsonl"))


def test_chat_template_is_applied(tiny_tokenizer):
    row = {"prompt": [{"role": "user", "content": "What is 1+2?"}]}
    assert prompt_text(row, tiny_tokenizer) == "<|im_start|>user\nWhat is 1+2?<|im_end|>\n<|im_start|>assistant\n"


def test_prompt_order_is_a_function_of_position():
    a = prompt_indices(0, 25, 10, seed=3)
    assert sorted(a[:10]) == list(range(10)) and sorted(a[10:20]) == list(range(10))  # each epoch a permutation
    assert prompt_indices(7, 5, 10, seed=3) == a[7:12]                                 # resumable from a position
    assert prompt_indices(0, 10, 10, seed=4) != a[:10]

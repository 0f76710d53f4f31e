import json

import pytest

from minirl.data import GSM8K_SOURCE, MATH_SOURCE
from conftest import shared_file
from minirl.rewards import extract_gsm8k_answer, gsm8k_reward, last_boxed, math_reward, reward_fn_for, score


@pytest.mark.parametrize("completion,answer,expected", [
    ("so 48 + 24 = 72\n#### 72", "72", 1.0),
    ("#### 72.00", "72", 1.0),
    ("#### $1,000", "1000", 1.0),
    ("#### 1,000", "1,000", 1.0),
    ("#### -3", "-3", 1.0),
    ("#### 71", "72", 0.0),
    ("the answer is 72", "72", 0.0),              # no '####': no answer
    ("#### 5 ... wait\n#### 72", "72", 1.0),      # the last one counts
    ("#### 72 ... no\n#### 5", "72", 0.0),
])
def test_gsm8k_reward_cases(completion, answer, expected):
    assert gsm8k_reward(completion, answer) == expected


def test_gsm8k_reward_scores_real_gold_solutions_as_correct():
    rows = [json.loads(line) for line in shared_file("gsm8k/test_200.jsonl").open()][:50]
    for row in rows:
        gold = row["answer"].split("####")[-1].strip()
        assert gsm8k_reward(row["answer"], gold) == 1.0          # the worked solution itself ends in #### N
        assert gsm8k_reward(row["answer"], row["answer"]) == 1.0  # a full solution as ground truth works too
        assert gsm8k_reward("#### 123456789", gold) == 0.0
    assert extract_gsm8k_answer(rows[0]["answer"]) == rows[0]["answer"].split("#### ")[-1].replace(",", "")


@pytest.mark.parametrize("text,expected", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"\boxed{{a}^{2}}", r"{a}^{2}"),
    (r"\fbox{7}", "7"),
    (r"no box here", None),
    (r"\boxed{unclosed", None),
    (r"so the answer is \boxed 5.", "5"),                 # no braces, nothing after the answer
    (r"\boxed 5 and later {x}", "5"),                     # no braces, a brace later in the text
    (r"\boxed {12}", "12"),                               # a space before the brace
])
def test_last_boxed_handles_nested_braces(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("completion,answer,expected", [
    (r"The answer is $\boxed{\frac{1}{2}}$.", "0.5", 1.0),
    (r"$\boxed{\dfrac{\sqrt{3}}{2}}$", r"\frac{\sqrt3}{2}", 1.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"\boxed{2x+1}", "1+2x", 1.0),
    (r"\boxed{3}", "4", 0.0),
    (r"the answer is 0.5", "0.5", 0.0),           # no box, no reward
])
def test_math_reward_checks_equivalence(completion, answer, expected):
    assert math_reward(completion, answer) == expected


def test_math_reward_accepts_real_math500_solutions():
    rows = [json.loads(line) for line in shared_file("math/math500_test.jsonl").open()][:40]
    ok = sum(math_reward(r["solution"], r["answer"]) for r in rows)
    assert ok == len(rows)
    wrong = sum(math_reward(rows[(i + 1) % len(rows)]["solution"], r["answer"]) for i, r in enumerate(rows))
    assert wrong <= 2  # another problem's solution is (almost) never equivalent


def test_reward_dispatch_by_data_source():
    assert reward_fn_for(GSM8K_SOURCE) is gsm8k_reward
    assert reward_fn_for("toy_arithmetic") is gsm8k_reward
    assert reward_fn_for("math500") is math_reward
    assert reward_fn_for(MATH_SOURCE) is math_reward
    # exact names: a name that merely contains "math" or "gsm8k" is not guessed (it used to be)
    for unknown in ("mystery", "my_custom_code", "aftermath", "gsm8k_v2"):
        with pytest.raises(ValueError, match="no built-in reward for data_source .*REWARD_KINDS"):
            reward_fn_for(unknown)
    rows = [{"data_source": GSM8K_SOURCE, "reward_model": {"ground_truth": "3"}},
            {"data_source": "math500", "reward_model": {"ground_truth": "3"}}]
    assert score(["#### 3", r"\boxed{4}"], rows) == [1.0, 0.0]


def test_flexible_extraction_takes_the_last_number_strict_needs_the_marker():
    from minirl.rewards import extract_gsm8k_answer, gsm8k_reward, score
    prose = "7 + 8 = 15."
    assert extract_gsm8k_answer(prose) is None and extract_gsm8k_answer(prose, "flexible") == "15"
    assert gsm8k_reward(prose, "15") == 0.0 and gsm8k_reward(prose, "15", "flexible") == 1.0
    assert gsm8k_reward("It costs $1,250.00 in total", "1250", "flexible") == 1.0
    assert gsm8k_reward("#### 15 but then 16", "15", "strict") == 1.0      # strict: the marker wins
    assert gsm8k_reward("#### 15 but then 16", "15", "flexible") == 0.0    # flexible: the last number
    row = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "15"}}
    assert score([prose, "no number"], [row, row], extraction="flexible") == [1.0, 0.0]
    with pytest.raises(ValueError, match="strict or flexible"):
        extract_gsm8k_answer(prose, "loose")

"""The code-RL smoke test: GRPO through train.py's real path, the real sandboxed judge included, makes the tiny
code model (minirl/toy/tiny_code.py) better at the built-in code task (minirl/toy/code_task.py).

rows -> rollout -> extraction of the ```python block -> the judge -> the hierarchical reward (-1 no code,
-0.5 a syntax error, else the fraction of tests passed) -> GRPO update -> held-out `val/test_score/code_task`.
A break anywhere on that path fails it. Checked by breaking it (2026-12-03, the v2 build): an extraction that
finds nothing leaves every reward at -1 (flat); verdicts that do not reach the reward (0 for every judged
program) still let the reward rise (-0.15 -> -0.02: the fence alone is learnt) but not the accepted programs
(122 -> 115 in the first / last 8 steps, where the intact path gives +21 to +29 over three builds).
"""
import json
import os

import pytest

import train
from minirl.toy.code_task import code_task_rows
from minirl.toy.tiny_code import FAMILIES


# Not yet in the default suite: from an empty cache the model's build (400 warm-up steps, 59 s on 2 idle cores) and
# the run (31 s) cost 91 s, and over three builds (model seeds 0-2) the held-out reward rose by +0.25, +0.04 and
# +0.21: the one-standard-deviation margins a sampled 24-row validation gives, too narrow for a default test
# (accepted programs, +21, +29, +27 against the +12 asked, are ~3 standard deviations clear). Issue 30.
pytestmark = pytest.mark.skipif(os.environ.get("MINIRL_SLOW_TESTS") != "1",
                                reason="the code-RL smoke test costs ~90 s from a cold cache: MINIRL_SLOW_TESTS=1")


@pytest.fixture(scope="module")
def tiny_code_path():
    from minirl.toy.tiny_code import tiny_code_model_path
    return tiny_code_model_path()


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_grpo_through_the_judge_raises_the_judged_reward_on_the_code_task(tmp_path, tiny_code_path):
    # the tiny model knows its families' templates, without the statement's example line: held-out rows are
    # their new parameters
    train_file = write_rows(tmp_path / "train.jsonl", code_task_rows(400, 1, "train", families=FAMILIES,
                                                                     num_tests=4, example=False, shot=False,
                                                                     instruction=False))
    val_file = write_rows(tmp_path / "val.jsonl", code_task_rows(24, 2, "test", families=FAMILIES, num_tests=4,
                                                                 example=False, shot=False, instruction=False))
    # validation samples (T = 1) as the rollouts do: the warm-up's slips are rarely the greedy choice, so RL's
    # effect on them shows in the sampled held-out reward, not in greedy decoding
    result = train.main(["--model_name_or_path", str(tiny_code_path), "--train_files", train_file,
                         "--val_files", val_file, "--max_steps", "16", "--prompts_per_step", "8",
                         "--group_size", "4", "--max_new_tokens", "40", "--lr", "2e-4", "--warmup_steps", "1",
                         "--val_every", "0", "--val_greedy", "false", "--judge_workers", "2",
                         "--output_dir", str(tmp_path / "run")])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()][1:]
    first = sum(r["critic/reward/mean"] for r in rows[:4]) / 4
    last = sum(r["critic/reward/mean"] for r in rows[-4:]) / 4
    assert last > first + 0.1, (first, last)
    assert min(r["critic/reward/min"] for r in rows[:4]) < 0  # the warm-up's slips: no code or a syntax error
    # the judge's verdicts reach the reward: more programs are accepted, not only more of them fenced
    accepted = [r["critic/verdict/AC"] for r in rows]
    assert sum(accepted[-8:]) >= sum(accepted[:8]) + 12, accepted
    src = "val/test_score/code_task"
    assert result["after"][src] > result["before"][src], (result["before"], result["after"])
    assert all(r["timing_s/reward"] > 0 for r in rows)  # the judge ran in every step

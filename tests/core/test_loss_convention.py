"""One loss convention for the three training loops: train.py, recipes/grpo_gsm8k.py and recipes/code_rl.py
compute the same gradient for the same batch, on one process and on two (torchrun, gloo). grpo_gsm8k is
train.py's token mean with Dr. GRPO's advantages; code_rl is Dr. GRPO's aggregation (seq-mean-token-sum-norm).
Before: grpo_gsm8k divided by its own process's tokens and code_rl by its own process's episodes, while
optim_step sums the processes' gradients, so on 2 processes both gave about twice train.py's gradient."""
import json
import os
import subprocess
import sys

import torch

from conftest import ROOT, assert_close_at_scale


def run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_three_loops_give_the_same_gradient_on_one_and_two_processes(tmp_path, tiny_path):
    g = torch.Generator().manual_seed(0)
    B, G, budget = 4, 2, 6
    data = {"prompts": [torch.randint(3, 200, (3 + b % 3,), generator=g).tolist() for b in range(B)],
            "responses": [[torch.randint(3, 200, (2 + (b + j) % 5,), generator=g).tolist() for j in range(G)]
                          for b in range(B)],
            "rewards": [[float(x) for x in torch.randint(0, 3, (G,), generator=g)] for _ in range(B)],
            "max_tokens": budget}
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(data))
    helper = str(ROOT / "tests" / "core" / "torchrun_loops.py")
    run([sys.executable, helper, str(tiny_path), str(path), str(tmp_path / "one.pt")])
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", helper,
         str(tiny_path), str(path), str(tmp_path / "two.pt")])
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    for grads in (one, two):
        assert_close_at_scale(grads["grpo_gsm8k"], grads["token-mean"])
        assert_close_at_scale(grads["code_rl"], grads["seq-mean-token-sum-norm"])
    for key in one:
        assert_close_at_scale(two[key], one[key])


def test_code_rl_leaves_judge_errors_out_of_the_normaliser_and_stops_on_too_many():
    """As train.py: an unjudged episode (reward NaN) is no episode of the step. Before, code_rl divided by all
    W*B*G episodes, never stopped on judge errors, and logged a reward of 0.0 when nothing was judged."""
    import math
    import sys
    sys.path.insert(0, str(ROOT / "recipes"))
    import code_rl
    import pytest
    from minirl.agentic.env import MathEnv
    from minirl.sampling import JudgeErrors
    nan = float("nan")
    assert code_rl.advantage_scale(2, 4, 10, 1, judge_errors=2) == pytest.approx(1 / (6 * 10))
    assert code_rl.advantage_scale(2, 4, 10, 2) == pytest.approx(1 / (16 * 10))

    class Unjudged(MathEnv):  # every final answer's program: a judge error
        def step(self, messages, completion):
            return None, nan, {"turns": 1, "verdict": "JE"}
    args = ["--env", "math", "--steps", "1", "--prompts_per_step", "2", "--group_size", "2", "--max_tokens", "4"]
    with pytest.raises(JudgeErrors, match="4 of the step's 4 programs"):
        code_rl.main(args, make_env=Unjudged)
    [h] = code_rl.main(args + ["--max_judge_error_share", "1"], make_env=Unjudged)["history"]
    assert math.isnan(h["reward"]) and h["judge_errors"] == 4 and h["grad_norm"] == 0.0

"""Break the code-RL path three ways and check that its smoke test (tests/toy/test_code_rl.py) fails each time.

    HF_HUB_OFFLINE=1 python scripts/break_code_rl.py          # ~2 min a run on 2 cores; the intact run first

A smoke test is only worth what it catches. The breaks, each where a real bug would sit:
- no extraction: the ```python block is never found (every completion scores as "no code", -1);
- verdicts ignored: every judged program scores 0, whatever the judge said (a reward that learns the fence only);
- shuffled rewards: each group's rewards are permuted among its completions (the same values, no longer each
  program's own), so the update sees no link between a program and its verdict.
Prints, for each, whether the test failed and on which assertion. Exit status 1 if a break went uncaught.
"""
import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(2)  # as tests/conftest.py runs the test
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "toy"))
import minirl.rewards as rewards  # noqa: E402
import minirl.sampling as sampling  # noqa: E402
from minirl.toy.tiny_code import tiny_code_model_path  # noqa: E402
from test_code_rl import test_grpo_through_the_judge_raises_the_judged_reward_on_the_code_task as smoke  # noqa: E402


def no_extraction():
    rewards.extract_code = lambda completion, language: None


def verdicts_ignored():
    details = rewards.Scorer.details

    def zeroed(self, completions, rows):
        return [{**d, "reward": 0.0} if d.get("verdict", "no code") != "no code" else d
                for d in details(self, completions, rows)]
    rewards.Scorer.details = zeroed


def shuffled_rewards():
    sample_round = sampling.sample_round

    def shuffled(policy, tokenizer, rows, scorer, cfg, *args, **kwargs):
        rollout, r = sample_round(policy, tokenizer, rows, scorer, cfg, *args, **kwargs)
        G = cfg.group_size
        return rollout, torch.cat([g[torch.randperm(G)] for g in r.view(-1, G)])
    sampling.sample_round = shuffled


def run(break_it) -> str | None:
    """None if the smoke test passed, else the failing assertion's line."""
    saved = rewards.extract_code, rewards.Scorer.details, sampling.sample_round
    if break_it is not None:
        break_it()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            smoke(Path(tmp), tiny_code_model_path())
        return None
    except AssertionError as e:
        return traceback.extract_tb(e.__traceback__)[-1].line
    except Exception as e:  # a crash is a failure too, but say so
        return f"{type(e).__name__}: {e}"
    finally:
        rewards.extract_code, rewards.Scorer.details, sampling.sample_round = saved


if __name__ == "__main__":
    intact = run(None)
    print(f"intact path: {'passes' if intact is None else 'FAILS: ' + intact}", flush=True)
    uncaught = []
    for name, break_it in [("no extraction", no_extraction), ("verdicts ignored", verdicts_ignored),
                           ("shuffled rewards", shuffled_rewards)]:
        failed = run(break_it)
        print(f"{name}: {'caught, at ' + failed if failed else 'NOT CAUGHT'}", flush=True)
        uncaught += [name] if failed is None else []
    sys.exit(1 if uncaught or intact is not None else 0)

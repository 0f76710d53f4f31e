"""A program the judge could not judge (JE: a worker's sandbox died, no server answered) is no reward: it leaves
the loss and its group's advantages, `critic/verdict/JE` counts it, and too many of them stop the run."""
import json
import math

import pytest
import torch

from minirl.judge.verdict import JudgeResult, judge_error
from minirl.loss import group_advantages
from minirl.rewards import Scorer
from minirl.sampling import JudgeErrors, check_judge_errors

CODE_ROW = {"data_source": "toy_code", "ability": "code", "prompt": [{"role": "user", "content": "Print 1."}],
            "reward_model": {"ground_truth": {"language": "python", "tests": [{"input": "", "output": "1"}]}}}
RIGHT, WRONG, PROSE = "```python\nprint(1)\n```", "```python\nprint(2)\n```", "no code here"


class FlakyJudge:
    """A judge that gives AC to `print(1)`, WA to anything else, and a judge error to the jobs `dead` names."""

    def __init__(self, dead=lambda k, job: False):
        self.dead, self.calls = dead, 0

    def run_many(self, jobs):
        out = []
        for k, job in enumerate(jobs):
            if self.dead(k, job):
                out.append(judge_error("a worker's sandbox ended during the run", len(job["tests"])))
            else:
                ok = job["source"].strip() == "print(1)"
                out.append(JudgeResult("AC" if ok else "WA", int(ok), 1))
        self.calls += 1
        return out

    def close(self):
        pass


def loop_advantages(rewards, G, estimator="grpo"):
    """The plain loop: each group's statistics over its rewards that are numbers; NaN -> 0."""
    out = []
    for g in range(0, len(rewards), G):
        group = rewards[g:g + G]
        kept = [r for r in group if not math.isnan(r)]
        n = len(kept)
        mean = sum(kept) / max(n, 1)
        std = math.sqrt(sum((r - mean) ** 2 for r in kept) / (n - 1)) if n > 1 else 0.0
        for r in group:
            if math.isnan(r):
                out.append(0.0)
            elif estimator == "grpo":
                out.append((r - mean) / (std + 1e-6))
            elif estimator == "rloo":
                out.append((r - mean) * n / (n - 1) if n > 1 else 0.0)
            else:
                out.append(r - mean)
    return out


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_an_unjudged_sample_leaves_its_groups_advantages(estimator):
    nan = float("nan")
    rewards = [1.0, 0.0, nan, nan, 0.5, nan, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    got = group_advantages(torch.tensor(rewards), 4, estimator)
    assert torch.allclose(got, torch.tensor(loop_advantages(rewards, 4, estimator)), atol=1e-5)
    # the group [1, 0, NaN, NaN] is the group [1, 0]: as if the unjudged samples had never been drawn
    alone = group_advantages(torch.tensor([1.0, 0.0]), 2, estimator)
    assert torch.allclose(got[:2], alone, atol=1e-6) and got[2:4].abs().sum() == 0
    # with every reward a number, the result is the usual one (torch.std's unbiased std)
    full = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.2, 0.4, 0.4, 0.9])
    assert torch.allclose(group_advantages(full, 4, estimator), torch.tensor(loop_advantages(full.tolist(), 4,
                                                                                             estimator)), atol=1e-5)


def test_a_dead_judge_is_no_reward_for_the_programs_it_did_not_judge():
    """The issue's case: a right program, a wrong one, two without code; the judge answers for neither program.
    Before: both programs were RE (reward 0) and got advantage +0.87 over the two without code."""
    judge = FlakyJudge(dead=lambda k, job: True)
    details = Scorer(judge).details([RIGHT, WRONG, PROSE, PROSE], [CODE_ROW] * 4)
    assert [d["verdict"] for d in details] == ["JE", "JE", "no code", "no code"]
    rewards = torch.tensor([d["reward"] for d in details])
    assert rewards[:2].isnan().all() and rewards[2:].tolist() == [-1.0, -1.0]
    assert details[0]["message"].startswith("judge error")
    assert group_advantages(rewards, 4).tolist() == [0.0, 0.0, 0.0, 0.0]  # nothing to learn from


def test_the_step_stops_with_the_cause_above_the_share_and_not_below():
    counts = {"critic/verdict/AC": 5, "critic/verdict/WA": 3, "critic/verdict/JE": 2, "critic/verdict/no code": 10}
    check_judge_errors(counts, 0.2, ["judge error: x"])           # 2 of 10 programs: not more than 20%
    with pytest.raises(JudgeErrors, match="2 of the step's 10 programs.*judge error: no judge server answered"):
        check_judge_errors(counts, 0.1, ["judge error: no judge server answered"])
    check_judge_errors({"critic/verdict/no code": 4}, 0.0, [])    # no program at all: nothing to stop for


def code_data(tmp_path):
    rows = [{**CODE_ROW, "reward_model": {"ground_truth": json.dumps(CODE_ROW["reward_model"]["ground_truth"])},
             "extra_info": {"index": i}} for i in range(4)]
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def run_train(tmp_path, tiny_path, monkeypatch, judge, *args):
    """train.py on code rows; every completion's program is `print(1)` or `print(2)` (the toy model writes no
    code: its program is made from its text) and `judge` judges them. Returns the metrics and, per optimizer
    step, the batch forward_backward saw."""
    import train
    from minirl import rewards
    monkeypatch.setattr(rewards, "extract_code", lambda text, language: f"print({1 + len(text) % 2})")
    monkeypatch.setattr(train, "build_judge", lambda cfg: judge)
    seen, real = [], train.forward_backward

    def recording(model, batch, **kw):
        seen.append({k: v.clone() for k, v in batch.items()})
        return real(model, batch, **kw)
    monkeypatch.setattr(train, "forward_backward", recording)
    out = tmp_path / "run"
    train.main(["--model_name_or_path", str(tiny_path), "--train_files", str(code_data(tmp_path)),
                "--val_files", "", "--max_steps", "2", "--prompts_per_step", "2", "--group_size", "4",
                "--max_new_tokens", "8", "--output_dir", str(out), *args])
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], seen


def test_a_judge_that_dies_mid_step_stops_the_run_with_the_cause(tmp_path, tiny_path, monkeypatch):
    judge = FlakyJudge(dead=lambda k, job: judge.calls >= 1)  # step 1 judged, then every job fails
    with pytest.raises(JudgeErrors, match="8 of the step's 8 programs.*sandbox ended"):
        run_train(tmp_path, tiny_path, monkeypatch, judge)
    assert judge.calls == 2  # it stopped at the step whose judge died, before any update on it


def test_below_the_share_a_run_trains_without_the_unjudged_samples(tmp_path, tiny_path, monkeypatch):
    judge = FlakyJudge(dead=lambda k, job: k % 4 == 1)  # one program in four is not judged
    metrics, seen = run_train(tmp_path, tiny_path, monkeypatch, judge, "--max_judge_error_share", "0.3")
    assert [m["critic/verdict/JE"] for m in metrics] == [2, 2]
    assert all(math.isfinite(m["critic/reward/mean"]) and math.isfinite(m["actor/pg_loss"]) for m in metrics)
    for batch in seen:  # rows 1 and 5: no token in the loss, advantage 0; the others train
        lengths = batch["response_mask"].sum(1)
        assert lengths[[1, 5]].tolist() == [0, 0] and (lengths[[0, 2, 3, 4, 6, 7]] > 0).all()
        assert batch["advantages"][[1, 5]].tolist() == [0.0, 0.0]


def test_samples_are_written_each_step_and_the_reader_prints_the_best_and_worst_groups(tmp_path, tiny_path,
                                                                                       monkeypatch, capsys):
    judge = FlakyJudge(dead=lambda k, job: k == 1)  # one program of the 8 is not judged
    metrics, _ = run_train(tmp_path, tiny_path, monkeypatch, judge, "--max_judge_error_share", "0.2",
                           "--log_sample_groups", "2")
    from minirl.samples import read_samples
    steps = read_samples(tmp_path / "run" / "samples.jsonl")
    assert sorted(steps) == [1, 2] and all(len(groups) == 2 and all(len(g) == 4 for g in groups)
                                           for groups in steps.values())
    first = steps[1][0]
    assert {"step", "group", "prompt_index", "prompt", "completion", "verdict", "reward", "advantage"} <= set(first[0])
    assert first[1]["verdict"] == "JE" and first[1]["reward"] is None and first[1]["advantage"] == 0.0
    assert {r["verdict"] for g in steps[1] for r in g} <= {"AC", "WA", "JE"} and "Print 1." in first[0]["prompt"]
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "scripts"))
    import read_samples
    text = read_samples.main([str(tmp_path / "run"), "--step", "2"])
    assert text.startswith("step 2: 2 groups") and "=== best" in text and "=== worst" in text
    assert text.count("--- sample") == 8  # the best group and the worst, 4 completions each


def test_eval_does_not_score_a_judge_error_and_counts_it():
    from minirl.evaluate import summarize
    rec = lambda i, s, reward, verdict: {"data_source": "code", "index": i, "sample": s, "reward": reward,  # noqa
                                         "verdict": verdict, "answer": None, "tokens": 4, "truncated": False,
                                         "seconds": 0.1}
    records = [rec(0, 0, 1.0, "AC"), rec(0, 1, float("nan"), "JE"), rec(1, 0, 0.0, "WA"), rec(1, 1, 1.0, "AC")]
    s = summarize(records, ks=[1, 2])["code"]
    # the key keeps the n asked for (mean@1 before: the key changed with the number of judge errors)
    assert s["n"] == 2 and s["judged"] == 3 and s["judge_errors"] == 1 and s["mean@2"] == pytest.approx(2 / 3)
    assert s["pass@1"] == pytest.approx((1.0 + 0.5) / 2) and s["pass@2"] == 1.0  # problem 0: 1 judged sample
    # nothing judged: the same keys, NaN scores (before: {"problems": 0, "judge_errors": 2} and no score at all)
    s = summarize([rec(0, 0, float("nan"), "JE"), rec(0, 1, float("nan"), "JE")], ks=[1])["code"]
    assert (s["n"], s["judged"], s["judge_errors"]) == (2, 0, 2)
    assert math.isnan(s["mean@2"]) and math.isnan(s["pass@1"])


def strict_json(line: str):
    """json.loads that refuses NaN and Infinity, as JSON itself (jq, JSON.parse) does."""
    return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


def test_eval_py_writes_a_judge_errors_reward_as_null_not_nan(tmp_path, tiny_path, monkeypatch):
    import eval as eval_script
    from conftest import ROOT
    nan = float("nan")
    records = [{"problem_id": "p", "data_source": "code", "index": 0, "sample": j, "prompt": "x", "completion": "y",
                "reward": nan, "verdict": "JE", "answer": None, "tokens": 4, "truncated": False, "seconds": 0.1}
               for j in range(2)]
    monkeypatch.setattr(eval_script, "evaluate", lambda *a, **kw: records)   # every program unjudged
    eval_script.main(["--model", str(tiny_path), "--data", str(ROOT / "data" / "arith_test.jsonl"), "--limit", "1",
                      "--n", "2", "--k", "1", "--temperature", "1", "--output", str(tmp_path)])
    samples = [strict_json(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in samples] == [None, None]
    summary = strict_json((tmp_path / "summary.json").read_text())["code"]
    assert summary["mean@2"] is None and summary["judge_errors"] == 2


def test_validation_with_every_program_unjudged_reports_nan_and_counts_the_judge_errors(monkeypatch):
    """Before: judge errors were dropped without a count, and a source with nothing judged scored 0.0 (a
    validation that looks like a model that fails everything)."""
    import train
    from minirl.config import Config
    nan = float("nan")
    rows = [{**CODE_ROW, "extra_info": {"index": i}} for i in range(2)] + [{"data_source": "toy_arithmetic"}]
    records = [{"data_source": "toy_code", "index": i, "reward": nan, "verdict": "JE"} for i in range(2)] + \
              [{"data_source": "toy_arithmetic", "index": 2, "reward": 1.0, "answer": "3"}]
    monkeypatch.setattr(train, "evaluate", lambda *a, **kw: records)
    val = train.validate(torch.nn.Linear(1, 1), None, rows, Scorer(FlakyJudge()), Config(), rank=0, world=1)
    assert math.isnan(val["val/test_score/toy_code"]) and math.isnan(val["val/accepted/toy_code"])
    assert val["val/judge_errors/toy_code"] == 2 and val["val/test_score/toy_arithmetic"] == 1.0


def test_a_step_with_no_token_to_learn_from_leaves_the_weights_and_the_optimizer_alone():
    """Every sequence a judge error (max_judge_error_share 1): no token in the loss, a zero gradient. Before,
    AdamW still stepped, and its momentum and weight decay moved the weights. The choice is made on the step's
    count over every process (global_counts), so every process skips together."""
    import train
    from minirl.config import parse_config
    from minirl.update import warmup_constant_schedule
    cfg = parse_config(["--prompts_per_step", "2", "--group_size", "2", "--warmup_steps", "4"])
    policy = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.1, weight_decay=0.1)
    scheduler = warmup_constant_schedule(optimizer, cfg.warmup_steps)

    def step_fn(mb, num_tokens, num_seqs, micro_batch_size):  # the loss of the masked tokens only
        (policy.weight.sum() * mb["response_mask"].sum()).backward()
        return {"pg_loss": 0.0}
    batch = {"input_ids": torch.zeros(4, 5, dtype=torch.long), "response_mask": torch.ones(4, 3)}
    m = train.mini_batch_steps(policy, optimizer, scheduler, batch, cfg, step_fn, "actor", 4, torch.float32)
    assert m["actor/optimizer_skipped"] == 0.0                    # a step with tokens: AdamW has momentum now
    before, state = policy.weight.detach().clone(), optimizer.state[policy.weight]["step"].clone()
    unjudged = {**batch, "response_mask": torch.zeros(4, 3)}    # every sequence a judge error
    m = train.mini_batch_steps(policy, optimizer, scheduler, unjudged, cfg, step_fn, "actor", 4, torch.float32)
    assert torch.equal(policy.weight, before) and torch.equal(optimizer.state[policy.weight]["step"], state)
    assert m["actor/optimizer_skipped"] == 1.0 and m["actor/grad_norm"] == 0.0
    assert scheduler.last_epoch == 2                              # the schedule still counts the training step

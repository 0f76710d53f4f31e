"""End to end: the real train.py on the toy task and on real GSM8K rows, and through `accelerate launch`."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, shared_file

import train

REQUIRED_METRICS = [
    "training/global_step", "critic/reward/mean", "critic/reward/max", "critic/reward/min",
    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min", "actor/pg_loss", "actor/ppo_kl",
    "actor/pg_clipfrac", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/lr",
    "response_length/mean", "response_length/max", "response_length/min", "response_length/clip_ratio",
    "timing_s/gen", "timing_s/reward", "timing_s/update", "timing_s/step",
    # verl's phases (ray_trainer.fit's marked_timer names), each timed on its own
    "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor"]


def read_metrics(out):
    """The training steps' rows (the step-0 row holds only the validation before training)."""
    return [r for line in (out / "metrics.jsonl").open() if "critic/reward/mean" in (r := json.loads(line))]


def test_grpo_raises_reward_on_the_toy_task(tmp_path, tiny_path):
    result = train.main(["--max_steps", "60", "--output_dir", str(tmp_path), "--val_max_samples", "100"])
    rows = read_metrics(tmp_path)
    assert len(rows) == 60 and all(k in rows[0] for k in REQUIRED_METRICS)
    first = sum(r["critic/reward/mean"] for r in rows[:10]) / 10
    last = sum(r["critic/reward/mean"] for r in rows[-10:]) / 10
    assert last > first + 0.1, (first, last)
    src = "val/test_score/toy_arithmetic"
    assert result["after"][src] > result["before"][src] + 0.2
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "tokenizer.json").exists()


def test_kl_and_off_policy_settings_run_and_report(tmp_path, tiny_path):
    train.main(["--max_steps", "3", "--output_dir", str(tmp_path), "--kl_coef", "0.05", "--mini_batches", "2",
                "--ppo_epochs", "2", "--val_files", "", "--clip_high", "0.28"])
    rows = read_metrics(tmp_path)
    assert rows[-1]["actor/kl_loss"] > 0             # the policy moved away from the reference
    assert any(r["actor/ppo_kl"] != 0 for r in rows)  # later mini-batches are off-policy


def test_gsm8k_recipe_runs_on_real_rows_with_the_tiny_model(tmp_path, tiny_path):
    data = tmp_path / "gsm8k.jsonl"
    lines = list(shared_file("gsm8k/train.jsonl").open())[:64]
    data.write_text("".join(lines))  # raw GSM8K rows are converted on load
    train.main(["--config", str(ROOT / "recipes" / "gsm8k.yaml"), "--model_name_or_path", str(tiny_path),
                "--train_files", str(data), "--val_files", str(data), "--val_max_samples", "4",
                "--max_steps", "2", "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "16",
                "--gradient_checkpointing", "false", "--output_dir", str(tmp_path / "run")])
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and rows[0]["response_length/max"] <= 16


def test_accelerate_launch_runs_the_default(tmp_path, tiny_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "train.py"),
           "--max_steps", "2", "--output_dir", str(tmp_path), "--val_max_samples", "8"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(read_metrics(tmp_path)) == 2


def test_ppo_with_a_critic_raises_reward_on_the_toy_task(tmp_path, tiny_path):
    result = train.main(["--algorithm", "ppo", "--max_steps", "40", "--output_dir", str(tmp_path),
                         "--val_max_samples", "100"])
    rows = read_metrics(tmp_path)
    first = sum(r["critic/reward/mean"] for r in rows[:8]) / 8
    last = sum(r["critic/reward/mean"] for r in rows[-8:]) / 8
    assert last > first + 0.1, (first, last)
    assert "critic/vf_loss" in rows[0] and rows[-1]["critic/vpred_mean"] != 0  # the critic trained
    src = "val/test_score/toy_arithmetic"
    assert result["after"][src] > result["before"][src] + 0.2


def test_dynamic_sampling_keeps_only_groups_with_signal(tiny_path):
    from minirl.config import parse_config
    from minirl.data import load_rows
    from minirl.models import load_model, load_tokenizer
    cfg = parse_config(["--dynamic_sampling", "true", "--prompts_per_step", "8", "--group_size", "4"])
    tok, model = load_tokenizer(str(tiny_path)), load_model(str(tiny_path))
    rows = load_rows(str(ROOT / "data" / "arith_train.jsonl"), limit=200)
    import torch
    torch.manual_seed(0)
    timing = {}
    rollout, kept, rewards, position, m = train.sample_and_score(model, tok, rows, train.Scorer(), cfg, 0, 0, 1,
                                                                 timing)
    assert len(kept) == 8 and len(rollout.texts) == 32 and rewards.shape == (32,)
    assert all(rewards[4 * g:4 * g + 4].std() > 0 for g in range(8))
    assert position == 8 * m["batch/sampling_rounds"] and m["batch/sampling_rounds"] >= 1
    assert m["batch/groups"] == 8 and timing["gen"] > 0 and timing["reward"] > 0  # every round's time counted


def test_code_recipe_trains_on_prepared_problems_with_the_tiny_model(tmp_path, tiny_path):
    from prepare_codecontests import prepare
    rows, _ = prepare(shared_file("code/codecontests_train_subset300.jsonl"), "python", "train", max_tests=3)
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    train.main(["--config", str(ROOT / "recipes" / "code.yaml"), "--model_name_or_path", str(tiny_path),
                "--train_files", str(data), "--val_files", str(data), "--val_max_samples", "2",
                "--max_steps", "2", "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "8",
                "--max_prompt_length", "4096", "--gradient_checkpointing", "false", "--judge_workers", "2",
                "--output_dir", str(tmp_path / "run")])
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 2 and metrics[0]["critic/reward/mean"] == -1.0  # the toy model writes no code
    assert metrics[0]["critic/verdict/no code"] == 4 and metrics[0]["critic/verdict/AC"] == 0


def test_kl_in_reward_with_grpo_folds_the_kl_into_the_sequence_rewards(random_model, tiny_tokenizer, tiny_path):
    import torch
    from minirl.config import ConfigError, parse_config
    from minirl.logprobs import batched_logprobs
    from minirl.loss import group_advantages, kl_penalty
    from minirl.models import load_model
    from minirl.rollout import sample
    from minirl.update import compute_advantages
    cfg = parse_config(["--kl_in_reward", "true", "--kl_coef", "0.5", "--group_size", "4"])
    ref = load_model(str(tiny_path))  # a different model than the random policy: KL > 0
    prompts = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"] * 2
    torch.manual_seed(0)
    rollout = sample(random_model, tiny_tokenizer, prompts, 4, 6)
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0])
    seqs = (rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1])
    batch = {"response_mask": rollout.response_mask, "old_logp": batched_logprobs(random_model, *seqs, 4)[0],
             "ref_logp": batched_logprobs(ref, *seqs, 4)[0]}
    adv, returns, m = compute_advantages(cfg, rewards, batch)
    kl = (kl_penalty(batch["old_logp"], batch["ref_logp"]) * batch["response_mask"]).sum(1)
    assert torch.allclose(adv, group_advantages(rewards - 0.5 * kl, 4), atol=1e-5) and returns is None
    assert m["actor/reward_kl_penalty"] > 0 and not torch.allclose(adv, group_advantages(rewards, 4))
    assert train.LossSettings.from_config(cfg).kl_coef == 0  # and none in the loss
    with pytest.raises(ConfigError, match="kl_in_reward"):
        parse_config(["--kl_in_reward", "true", "--kl_coef", "0"])

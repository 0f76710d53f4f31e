"""Checkpoints: atomic, pruned, and a killed-then-resumed run equals an uninterrupted one bit for bit."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT
from minirl import checkpoint

ARGS = ["--max_steps", "8", "--save_every", "4", "--val_every", "0", "--val_max_samples", "20",
        "--prompts_per_step", "8"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}


def run_train(out, *extra, wait=True):
    cmd = [sys.executable, str(ROOT / "train.py"), *ARGS, "--output_dir", str(out), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    return proc


def training_rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in rows]


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path, tiny_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_train(straight)
    proc = run_train(killed, wait=False)
    deadline = time.time() + 300
    while time.time() < deadline:  # kill it once step 5 is logged: the step-4 checkpoint exists by then
        log = killed / "metrics.jsonl"
        if log.exists() and any(json.loads(line).get("training/global_step", 0) >= 5
                                for line in log.read_text().splitlines() if line.strip()):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert checkpoint.latest_checkpoint(killed).name == "step_000004"
    run_train(killed, "--resume", "auto")
    assert training_rows(killed) == training_rows(straight)
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # resuming a finished run says so and fails instead of training zero steps
    proc = run_train(killed, "--resume", "auto", wait=False)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "already finished step 8" in err


def test_half_written_checkpoints_are_ignored_and_old_ones_pruned(tmp_path):
    root = checkpoint.checkpoint_root(tmp_path)
    for step in (2, 4):
        (root / f"step_{step:06d}").mkdir(parents=True)
        (root / f"step_{step:06d}" / "trainer_state.json").write_text("{}")
    crashed = root / ".tmp-step_000006"
    crashed.mkdir()
    (crashed / "optimizer.pt").write_bytes(b"half")
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_000004"
    tmp = checkpoint.begin_save(tmp_path, 8)
    (tmp / "trainer_state.json").write_text("{}")
    checkpoint.finish_save(tmp_path, tmp, 8, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000004", "step_000008"]  # pruned, tmp cleaned


def test_lora_trains_an_adapter_and_the_merged_export_matches(tmp_path, tiny_path):
    import train
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM
    out = tmp_path / "lora"
    train.main(["--lora_rank", "8", "--lora_alpha", "16", "--lr", "2e-3", "--kl_coef", "0.05", "--max_steps", "3",
                "--save_merged", "true", "--val_max_samples", "20", "--output_dir", str(out)])
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()][1:]
    assert rows[-1]["actor/kl_loss"] > 0  # KL against the adapter-disabled policy
    adapter = AutoPeftModelForCausalLM.from_pretrained(out).eval()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        la, lm, lb = adapter(ids).logits, merged(ids).logits, base(ids).logits
    assert torch.allclose(la, lm, atol=1e-4)
    assert not torch.allclose(la, lb, atol=1e-4)  # the adapter learned something
    with torch.no_grad(), adapter.disable_adapter():
        assert torch.allclose(adapter(ids).logits, lb, atol=1e-5)  # adapter off = the reference policy
    import eval as eval_script
    summary = eval_script.main(["--model", str(out), "--data", str(ROOT / "data" / "arith_test.jsonl"),
                                "--limit", "10", "--max_new_tokens", "8", "--output", str(tmp_path / "ev")])
    assert "toy_arithmetic" in summary  # eval.py loads an adapter on its base


def test_validation_metric_is_logged_every_n_steps_and_matches_evaluate(tmp_path, tiny_path):
    import train
    from minirl.data import load_rows
    from minirl.evaluate import evaluate
    from minirl.models import load_model, load_tokenizer
    train.main(["--max_steps", "4", "--val_every", "2", "--val_max_samples", "40", "--output_dir", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    key = "val/test_score/toy_arithmetic"
    assert [r["training/global_step"] for r in rows if key in r] == [0, 2, 4]
    model, tok = load_model(str(tmp_path)), load_tokenizer(str(tmp_path))
    records = evaluate(model, tok, load_rows(str(ROOT / "data" / "arith_test.jsonl"), limit=40), max_new_tokens=8)
    assert sum(r["reward"] for r in records) / len(records) == pytest.approx(rows[-1][key])


def test_a_process_that_sees_another_checkpoint_than_process_0_says_why(tmp_path):
    """resume's per-process check (checkpoint.unreadable): the folder missing, another run's checkpoint under the
    same name, or a shard file missing are each named; a complete copy is readable."""
    folder = tmp_path / "step_000004"
    assert checkpoint.unreadable(folder, "{}") == "the folder does not exist here"
    (folder / checkpoint.SHARDED).mkdir(parents=True)
    (folder / "trainer_state.json").write_text('{"step": 4}')
    assert "differs from process 0's" in checkpoint.unreadable(folder, '{"step": 8}')
    assert "['.metadata'] are missing" in checkpoint.unreadable(folder, '{"step": 4}')
    (folder / checkpoint.SHARDED).rmdir()
    assert checkpoint.unreadable(folder, '{"step": 4}') == "optimizer.pt is missing here"
    (folder / "optimizer.pt").write_bytes(b"")
    assert checkpoint.unreadable(folder, '{"step": 4}') is None

"""train.py on 2 CPU processes (torchrun, gloo): the paths an 8-GPU `accelerate launch` takes, checked against
one process where the maths says they must agree.

Each run goes through tests/core/torchrun_train.py, whose hooks make the global batch the same whatever the
number of processes (see its docstring). Each 2-process run must also exit cleanly: a hang or an abort at exit fails it.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT

HOOKED_TRAIN = ROOT / "tests" / "core" / "torchrun_train.py"
# B=4 prompts per process on 2 processes = B=8 on one; T=0.7 and a KL term exercise the temperature and reference
COMMON = ["--max_steps", "2", "--group_size", "4", "--temperature", "0.7", "--kl_coef", "0.05",
          "--micro_batch_size", "3", "--val_files", "", "--warmup_steps", "5", "--seed", "3"]
SETTINGS = {"dp": [], "fsdp": ["--fsdp", "true"], "lora": ["--lora_rank", "4", "--lora_alpha", "8", "--lr", "2e-3"],
            "ppo": ["--algorithm", "ppo"]}  # PPO: GAE advantages whitened over the global batch, a critic


def launch(out, hooks, *args, procs=2, timeout=300):
    """Run torchrun_train.py (hooks; or train.py itself for hooks=None) on `procs` processes; returns (metrics rows of
    the training steps, per-rank info)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs)] \
        if procs > 1 else [sys.executable]
    script = [str(HOOKED_TRAIN), str(out), hooks] if hooks else [str(ROOT / "train.py"), "--output_dir", str(out)]
    proc = subprocess.run([*prefix, *script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "exitcode" in line]
    assert proc.returncode == 0, "\n".join(errors[:20]) + "\n...\n" + proc.stderr[-3000:]
    rows = [r for line in (out / "metrics.jsonl").open() if "actor/pg_loss" in (r := json.loads(line))]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(procs)] if hooks else []
    return rows, ranks


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_path):
    """The 1-process references with the same global batch (B=8), by setting (fsdp shares dp's)."""
    runs = {}
    for name in ("dp", "lora", "ppo"):
        out = tmp_path_factory.mktemp(f"one_{name}")
        runs[name] = launch(out, "fixed_sampling", *COMMON, *SETTINGS[name], "--prompts_per_step", "8", procs=1)[0]
    runs["fsdp"] = runs["dp"]
    return runs


@pytest.mark.device_branch("train/cpu-processes")
@pytest.mark.parametrize("setting", ["dp", "fsdp", "lora", "ppo"])
def test_two_processes_train_like_one_process_on_the_same_global_batch(tmp_path, one_process, setting):
    rows, ranks = launch(tmp_path, "fixed_sampling", *COMMON, *SETTINGS[setting], "--prompts_per_step", "4")
    ref = one_process[setting]
    assert rows[0]["critic/reward/mean"] == ref[0]["critic/reward/mean"]  # the same completions were trained on
    keys = ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "actor/lr", "critic/advantages/max"]
    keys += ["critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"] if setting == "ppo" else []
    for key in keys:
        assert rows[0][key] == pytest.approx(ref[0][key], rel=1e-5, abs=1e-5), key  # logged losses: all processes' sum
    assert rows[1]["actor/kl_loss"] > 0 and rows[1]["actor/kl_loss"] == pytest.approx(ref[1]["actor/kl_loss"], rel=1e-3)
    assert rows[0]["actor/lr"] == pytest.approx(2e-4 / 5 if setting != "lora" else 2e-3 / 5)  # the step's own rate
    assert ranks[0]["trainable"] == ranks[1]["trainable"] and ranks[0]["all"] == ranks[1]["all"]  # one model
    assert ranks[0]["sharded"] == (setting == "fsdp")


def test_fsdp_in_bf16_trains_fp32_shards_checkpoints_and_exits_cleanly(tmp_path, tiny_path):
    """train.py itself (its own teardown must exit 0 on both processes), FSDP with bf16 compute at lr 1e-6: the
    sharded checkpoint holds fp32 weights, most of which moved; the final model (a plain save_pretrained
    folder, in the tiny config's fp32) holds the same weights and reloads in transformers."""
    launch(tmp_path, None, "--max_steps", "2", "--group_size", "4", "--prompts_per_step", "4", "--fsdp", "true",
           "--dtype", "bfloat16", "--lr", "1e-6", "--warmup_steps", "0", "--kl_coef", "0.05", "--val_files", "",
           "--save_every", "2")
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert (ckpt / "rng_rank0.pt").exists() and (ckpt / "rng_rank1.pt").exists()
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(ckpt / "sharded", tmp_path / "full.pt")  # the documented way to one file
    trained = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    start = load_file(str(tiny_path / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in trained.values())
    changed = sum(int((trained[k] != v).sum()) for k, v in start.items()) / sum(v.numel() for v in start.values())
    assert changed > 0.5, changed  # bf16 weights would have rounded most of these updates away
    final = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(final[k], trained[k]) for k in final)
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([[5, 17, 42, 8]])
    assert torch.isfinite(AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits).all()


def test_dynamic_sampling_with_unequal_kept_groups_finishes(tmp_path, tiny_path):
    rows, _ = launch(tmp_path, "uneven_rewards", "--max_steps", "3", "--group_size", "4", "--prompts_per_step", "4",
                     "--dynamic_sampling", "true", "--max_sampling_rounds", "1", "--val_files", "")
    assert len(rows) == 3
    for r in rows:  # process 0 zeroed 1 of its 4 groups, process 1 two: at most 3 + 2 kept, counts over both
        assert r["batch/groups"] <= 5 and r["batch/groups"] + r["batch/groups_dropped"] == 8


def test_fsdp_runs_equal_passes_with_unequal_groups_and_widths(tmp_path, tiny_path):
    """FSDP's collectives hang unless every process runs as many forward/backward passes: here the processes
    keep different numbers of groups (dynamic sampling) and see different padded widths (a token budget)."""
    rows, _ = launch(tmp_path, "uneven_rewards,uneven_width", "--max_steps", "3", "--group_size", "4",
                     "--prompts_per_step", "4", "--dynamic_sampling", "true", "--max_sampling_rounds", "1",
                     "--fsdp", "true", "--micro_batch_tokens", "64", "--val_files", "")
    assert len(rows) == 3 and all(r["batch/groups"] + r["batch/groups_dropped"] == 8 for r in rows)


def test_fsdp_shards_ppos_critic_trains_it_like_one_process_and_resumes_it_bit_for_bit(tmp_path, one_process):
    """PPO with fsdp on 2 processes: the critic is sharded like the policy (built on the meta device, filled from
    process 0's read, its AdamW state on the shards, saved in its own sharded folder); its first step equals one
    process's on the same global batch (step 2, where the body's gradients are no longer 0, to 1e-3), and a resume
    from the step-1 checkpoint gives the straight run's step 2 and final critic bit for bit."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = [*COMMON, *SETTINGS["ppo"], "--fsdp", "true", "--prompts_per_step", "4", "--save_every", "1"]
    rows, ranks = launch(straight, "fixed_sampling", *args)
    ref = one_process["ppo"]
    assert ranks[0]["critic_sharded"] and ranks[1]["critic_sharded"] and ranks[0]["sharded"]
    for step, tol in ((0, 1e-5), (1, 1e-3)):
        assert rows[step]["critic/reward/mean"] == ref[step]["critic/reward/mean"]  # the same completions
        for key in ["critic/vf_loss", "critic/grad_norm", "critic/vpred_mean", "actor/pg_loss"]:
            assert rows[step][key] == pytest.approx(ref[step][key], rel=tol, abs=tol), (step, key)
    assert rows[1]["critic/vpred_mean"] != 0.0  # the critic trained (its value head starts at 0)
    ckpt = straight / "checkpoints" / "step_000001"
    assert {p.name for p in (ckpt / "critic_sharded").iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert not (ckpt / "critic.pt").exists()  # nothing gathered
    shutil.copytree(ckpt, resumed / "checkpoints" / ckpt.name)
    shutil.copy(straight / "metrics.jsonl", resumed / "metrics.jsonl")
    again, _ = launch(resumed, "fixed_sampling", *args, "--resume", "auto")
    untimed = lambda r: {k: v for k, v in r.items() if not k.startswith("timing_s/")}  # noqa: E731
    assert [untimed(r) for r in again] == [untimed(r) for r in rows]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    for run in (straight, resumed):
        dcp_to_torch_save(run / "checkpoints" / "step_000002" / "critic_sharded", run / "critic.pt")
    a, b = (torch.load(run / "critic.pt", weights_only=False) for run in (straight, resumed))
    assert any(k.startswith("body.layers.") for k in a["model"]) and "value_head.weight" in a["model"]
    fa, fb = flat(a), flat(b)  # weights and AdamW's state
    assert any("exp_avg_sq" in k for k in fa) and fa.keys() == fb.keys()
    assert all(torch.equal(v, fb[k]) if torch.is_tensor(v) else v == fb[k] for k, v in fa.items())


def flat(x, key: str = "") -> dict:
    """A nested state dict's leaves by their path."""
    if isinstance(x, (dict, list)):
        items = x.items() if isinstance(x, dict) else enumerate(x)
        return {k: v for name, sub in items for k, v in flat(sub, f"{key}/{name}").items()}
    return {key: x}

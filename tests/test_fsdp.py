"""FSDP on 2 CPU processes (gloo): the same code path that shards on GPUs."""
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from conftest import ROOT

ARGS = ["--max_steps", "3", "--save_every", "3", "--val_max_samples", "20", "--prompts_per_step", "8"]


def torchrun(script, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_fsdp_grpo_on_two_processes_matches_data_parallel_and_reloads(tmp_path, tiny_path):
    fsdp, dp = tmp_path / "fsdp", tmp_path / "dp"
    torchrun(ROOT / "tests" / "fsdp_worker.py", str(fsdp), *ARGS, "--fsdp", "true")
    ranks = json.loads((fsdp / "ranks.json").read_text())
    assert ranks["sharded"] and ranks["checksums"][0] == ranks["checksums"][1]  # identical weights on both ranks
    ckpt = fsdp / "checkpoints" / "step_000003"
    assert (ckpt / "rng_rank0.pt").exists() and (ckpt / "rng_rank1.pt").exists()

    torchrun(ROOT / "train.py", *ARGS, "--output_dir", str(dp))  # plain data parallel, same seeds
    a, b = load_file(str(fsdp / "model.safetensors")), load_file(str(dp / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in b)
    rows = lambda d: [json.loads(line) for line in (d / "metrics.jsonl").open()]  # noqa: E731
    assert [r.get("critic/reward/mean") for r in rows(fsdp)] == [r.get("critic/reward/mean") for r in rows(dp)]

    from transformers import AutoModelForCausalLM  # the full checkpoint reloads with plain transformers
    model = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    ids = torch.tensor([[5, 17, 42, 8]])
    reloaded = AutoModelForCausalLM.from_pretrained(fsdp)
    assert torch.allclose(model(ids).logits, reloaded(ids).logits)

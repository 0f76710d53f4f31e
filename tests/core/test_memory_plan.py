"""scripts/memory_plan.py against measured peaks: a small model's forward/backward and AdamW step on CPU (each
within 25%), and the one GPU figure on record (22.9 GiB, full fine-tuning of a 0.5B model, docs/benchmarks.md;
within 15%)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import memory_plan  # noqa: E402

SMALL = dict(hidden=256, inter=1024, layers=4, vocab=4096, heads=4, kv_heads=2, batch=8, length=256)


def test_plan_matches_cpu_peaks_of_a_small_model():
    """Measured in a fresh process whose allocator returns every freed tensor to the system at once
    (MALLOC_MMAP_THRESHOLD_), so that its resident set follows the live tensors."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH", "HF_HUB_OFFLINE") if k in os.environ}
    env.update(MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")  # nothing else the other tests set
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_probe.py"),
                           *[f"--{k}={v}" for k, v in SMALL.items()]], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    m = dict(hidden=SMALL["hidden"], inter=SMALL["inter"], layers=SMALL["layers"], vocab=SMALL["vocab"],
             kv_dim=SMALL["kv_heads"] * SMALL["hidden"] // SMALL["heads"])
    P, tokens = measured["params"], SMALL["batch"] * SMALL["length"]
    for gc in (True, False):  # fp32 on CPU: compute and residual 4 bytes; gradients 4 bytes a parameter
        planned = 4 * P + memory_plan.activation_bytes(m, tokens, 4, 4, gc) + memory_plan.logits_bytes(m)
        got = measured["step_with_checkpointing" if gc else "step_without_checkpointing"]
        print(f"forward+backward, checkpointing {gc}: planned {planned / 2**20:.0f} MB, measured {got / 2**20:.0f} MB")
        assert got == pytest.approx(planned, rel=0.25)
    print(f"AdamW: planned {8 * P / 2**20:.0f} MB, measured {measured['optimizer'] / 2**20:.0f} MB")
    assert measured["optimizer"] == pytest.approx(8 * P, rel=0.25)


def test_plan_matches_the_gpu_figure_on_record():
    """scripts/gpu_check.sh's full fine-tuning run on one H200: a random Qwen2.5-0.5B-shaped model, bf16 compute,
    32 x 8 arithmetic prompts of 15 tokens + 256, micro-batch 32, KL 0.001, no checkpointing: peak 22.9 GiB."""
    from minirl.config import parse_config
    cfg = parse_config(["--dtype", "bfloat16", "--prompts_per_step", "32", "--group_size", "8", "--max_new_tokens",
                        "256", "--micro_batch_size", "32", "--kl_coef", "0.001", "--val_files", ""])
    plan = memory_plan.plan(cfg, memory_plan.model_sizes("qwen2.5-0.5b"), 1, 141 * 2**30, prompt_tokens=15)
    peak = max(plan[k] for k in plan if k.startswith("peak/")) / 2**30
    print(f"planned {peak:.1f} GiB, measured 22.9 GiB")
    assert peak == pytest.approx(22.9, rel=0.15)

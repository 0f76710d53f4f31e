"""One-shot GPU acceptance check: each path only a GPU takes, run once, a PASS or FAIL line per check.

    bash scripts/gpu_check.sh              # on a CUDA machine: ~6 min on one H200; exit status 1 on any FAIL
    bash scripts/gpu_check.sh --cpu        # the same checks on CPU at toy sizes (tests/core/test_gpu_check.py)
    bash scripts/gpu_check.sh --only train,exact     # some checks (names below)

Nothing is downloaded: on a GPU the model is a randomly initialised Qwen2.5-0.5B-shaped model
(scripts/make_random_model.py: its shapes, vocabulary and memory are the real model's, its outputs noise); on
CPU the built-in tiny model. The checks:

  train      GRPO steps of train.py in bf16 with validation, full fine-tuning and LoRA (gradient checkpointing),
             with sdpa and, where flash-attn is installed, flash_attention_2: finite losses, actor/ppo_kl = 0
             (on-policy: the ratio is 1), the KL to the reference at step 1 below 1e-3
  exact      token_logprobs against log_softmax(model(ids).logits) in fp32 and under bf16 autocast; check_exact
             passes the fp32 policy and the bf16 reference; the decode loop's greedy tokens against HF generate's
             over ~2k tokens (a difference only where generate's own top two logits tie within rounding)
  fsdp       torchrun over every GPU (one rank where there is one): FSDP2 on NCCL with gradient checkpointing,
             its gathered rollouts, 2 steps and a checkpoint, `--resume auto` for a third step whose metrics equal
             those of a run that never stopped, and a final folder that from_pretrained loads with the same logits
  memory     the peak GPU memory of a step at recipes/gsm8k.yaml's shape (and the memory plan's, if present)
  pytest     the suite's tests that force a GPU branch (tests marked device_branch), run on this machine

Each check prints `PASS name: figures` or `FAIL name: why`; the last line counts them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS: list[tuple[str, bool, str]] = []


def report(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def run_check(name: str, fn, *args) -> None:
    """Run one check; an exception is its FAIL line (with the last frames), never the end of the script."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        tail = "".join(traceback.format_exception(e)[-3:]).strip().replace("\n", " | ")
        report(name, False, f"{type(e).__name__}: {tail[-600:]}")


def python(args: list[str], env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    if run.returncode:
        raise RuntimeError(f"`{' '.join(args[:3])} ...` exited {run.returncode}: {run.stderr[-1500:]}")
    return run


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- the shapes: a real model's on a GPU, the toy's on CPU ------------------------------------------------

def setup(args) -> dict:
    import torch
    gpu = not args.cpu
    if gpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device (use --cpu for the dry run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if gpu:
        model = out / "random-0.5b"
        if not (model / "config.json").exists():
            python(["scripts/make_random_model.py", "--out", str(model), "--size", "0.5b"])
    else:
        from minirl.toy.tiny import tiny_model_path
        model = tiny_model_path()
    try:
        import flash_attn  # noqa: F401
        attns = ["sdpa", "flash_attention_2"] if gpu else ["sdpa"]
    except ImportError:
        attns = ["sdpa"]
    shape = dict(prompts_per_step=8, group_size=4, max_new_tokens=64 if gpu else 16, val_max_samples=16 if gpu else 8)
    return dict(gpu=gpu, out=out, model=str(model), attns=attns, shape=shape, decode_tokens=2048 if gpu else 128,
                device="cuda" if gpu else "cpu", gpus=torch.cuda.device_count() if gpu else 1)


def train_args(s: dict, run_dir: Path, *extra: str) -> list[str]:
    shape = [x for k, v in s["shape"].items() for x in (f"--{k}", str(v))]
    return ["train.py", "--model_name_or_path", s["model"], "--dtype", "bfloat16", "--max_steps", "2",
            "--kl_coef", "0.001", "--val_files", "data/arith_test.jsonl", "--seed", "0", *shape,
            "--output_dir", str(run_dir), *extra]


# --- train: full fine-tuning and LoRA, each attention ------------------------------------------------------

def check_train(s: dict, kind: str, attn: str) -> None:
    name = f"train/{kind}/{attn}"
    run_dir = s["out"] / name.replace("/", "_")
    extra = ["--lora_rank", "16", "--lora_alpha", "32", "--gradient_checkpointing", "true", "--lr", "2e-5"] \
        if kind == "lora" else ["--lr", "1e-6"]
    t0 = time.time()
    python(train_args(s, run_dir, "--attn_implementation", attn, *extra))
    rows = [r for r in metrics(run_dir) if "actor/pg_loss" in r]
    losses = [r[k] for r in rows for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm") if k in r]
    ppo_kl = max(abs(r["actor/ppo_kl"]) for r in rows)
    kl1 = rows[0].get("actor/kl_loss", float("nan"))
    val = [r for r in metrics(run_dir) if any(k.startswith("val/") for k in r)]
    ok = len(rows) == 2 and all(map(math.isfinite, losses)) and ppo_kl < 1e-6 and abs(kl1) < 1e-3 and len(val) >= 2
    report(name, ok, f"{len(rows)} steps in {time.time() - t0:.0f} s, pg_loss {rows[0]['actor/pg_loss']:.4g}, "
                     f"ppo_kl {ppo_kl:.2g}, kl at step 1 {kl1:.3g}, validations {len(val)}"
                     + (f", peak {rows[-1]['perf/max_memory_allocated_gb']:.1f} GiB" if s["gpu"] else ""))


# --- exact: log-probs, check_exact, the decode loop against generate ---------------------------------------

def check_exact_paths(s: dict) -> None:
    import torch
    from minirl import rollout
    from minirl.logprobs import logprobs_by_definition, position_ids_from_mask, token_logprobs
    from minirl.models import autocast, build_policy, load_reference, load_tokenizer
    device = torch.device(s["device"])
    tokenizer = load_tokenizer(s["model"])
    for attn in s["attns"]:  # check_exact runs inside build_policy: a refusal is an exception
        policy = build_policy(s["model"], device, torch.float32, attn).eval()
        report(f"exact/check_exact/fp32-policy/{attn}", True, "build_policy passed check_exact")
    policy = build_policy(s["model"], device, torch.float32, "sdpa").eval()
    load_reference(s["model"], torch.bfloat16, "sdpa", device)
    report("exact/check_exact/bf16-reference", True, "load_reference passed check_exact")

    g = torch.Generator().manual_seed(0)
    V = policy.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, min(V, 300), (8, 96), generator=g).to(device)
    ids[1, :64] = ids[0, :64]                                          # a shared prompt
    mask = torch.ones_like(ids)
    mask[2:, :7] = 0                                                    # left padding
    with torch.no_grad():
        want = logprobs_by_definition(policy, ids, mask, 32)
        err32 = float((token_logprobs(policy, ids, mask, 32)[0] - want).abs().max())
        with autocast(device, torch.bfloat16):
            err16 = float((token_logprobs(policy, ids, mask, 32)[0] - want).abs().max())
    report("exact/logprobs/fp32", err32 < 1e-4, f"max |token_logprobs - definition| = {err32:.2g} (< 1e-4)")
    report("exact/logprobs/bf16", err16 < 5e-2, f"under bf16 autocast, against the fp32 definition: {err16:.2g} "
                                                f"(< 5e-2)")

    prompts = ["1 + 2 =", "7 + 5 = 1"]
    T = s["decode_tokens"]
    torch.manual_seed(0)
    ours = rollout.sample(policy, tokenizer, prompts, 2, T, greedy=True)
    real = rollout.shares_prompts
    rollout.shares_prompts = lambda *a, **k: False                        # HF generate serves the same call
    try:
        theirs = rollout.sample(policy, tokenizer, prompts, 2, T, greedy=True)
    finally:
        rollout.shares_prompts = real
    a, b = ours.response_ids, theirs.response_ids
    width = min(a.shape[1], b.shape[1])
    differ = (a[:, :width] != b[:, :width]).any(1) | (ours.response_mask.sum(1) != theirs.response_mask.sum(1))
    if not bool(differ.any()):
        report("exact/decode", True, f"greedy tokens equal generate's: {int(ours.response_mask.sum())} tokens over "
                                     f"{a.shape[0]} rows of up to {T}")
        return
    row = int(differ.nonzero()[0])
    t = int((a[row, :width] != b[row, :width]).nonzero()[0]) if (a[row, :width] != b[row, :width]).any() else width
    ids = torch.cat([theirs.prompt_ids[row], theirs.response_ids[row, :t]])[None]
    mask = torch.cat([theirs.prompt_mask[row], torch.ones(t, dtype=torch.long, device=device)])[None]
    with torch.no_grad():
        logits = policy(ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[0, -1].float()
    gap = float(logits.topk(2).values.diff().abs())
    report("exact/decode", gap < 1e-4, f"row {row} differs from generate's at token {t}, where generate's top two "
                                       f"logits differ by {gap:.2g} (a tie within rounding passes: < 1e-4)")


# --- fsdp, memory, pytest ------------------------------------------------------------------------------------

def torchrun(s: dict, args: list[str]) -> str:
    procs = min(2, s["gpus"]) if s["gpu"] else 1
    return python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs), *args]).stdout


def check_fsdp_resume(s: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM
    fsdp = ["--fsdp", "true", "--gradient_checkpointing", "true", "--kl_coef", "0", "--val_files", "",
            "--save_every", "2", "--lr", "1e-5"]
    whole, parts = s["out"] / "fsdp_whole", s["out"] / "fsdp_parts"
    said = torchrun(s, [*train_args(s, whole, *fsdp), "--max_steps", "3"])
    procs = min(2, s["gpus"]) if s["gpu"] else 1
    report("fsdp/shard", f"fsdp: policy sharded over {procs} process(es)" in said,
           f"FSDP2 over {procs} process(es) on {'NCCL' if s['gpu'] else 'gloo'}, gradient checkpointing, 3 steps")
    torchrun(s, [*train_args(s, parts, *fsdp), "--max_steps", "2"])
    torchrun(s, [*train_args(s, parts, *fsdp), "--max_steps", "3", "--resume", "auto"])
    want, got = [[r for r in metrics(d) if r.get("training/global_step") == 3] for d in (whole, parts)]
    keys = [k for k in want[0] if not k.startswith(("timing_s/", "perf/"))]
    diff = {k: abs(want[0][k] - got[0][k]) for k in keys if isinstance(want[0][k], float)}
    worst = max(diff, key=diff.get)
    report("fsdp/resume", diff[worst] == 0, f"step 3 after --resume auto vs a run that never stopped: "
                                            f"{len(diff)} metrics, max difference {diff[worst]:.2g} ({worst})")
    models = [AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for d in (whole, parts)]
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        gap = float((models[0](ids).logits - models[1](ids).logits).abs().max())
    report("fsdp/final_model", gap == 0, f"both final folders load with from_pretrained; max |logits diff| {gap:.2g}")


def check_memory(s: dict) -> None:
    run_dir = s["out"] / "memory"
    shape = s["shape"] if not s["gpu"] else dict(prompts_per_step=16, group_size=8, max_new_tokens=512,
                                                 val_max_samples=0)
    args = train_args({**s, "shape": shape}, run_dir, "--max_steps", "1", "--val_files", "", "--kl_coef", "0.001")
    python(args)
    row = [r for r in metrics(run_dir) if "actor/pg_loss" in r][-1]
    peak = row.get("perf/max_memory_allocated_gb")
    detail = f"peak {peak:.1f} GiB at 16 prompts x 8 samples x 512 tokens" if peak is not None else \
        "no CUDA peak on CPU (the step ran)"
    plan = ROOT / "scripts" / "memory_plan.py"
    if plan.exists() and s["gpu"]:
        planned = python([str(plan), "--model", s["model"], "--config", "recipes/gsm8k.yaml"]).stdout.strip()
        detail += f"; memory plan: {planned.splitlines()[-1] if planned else '?'}"
    report("memory", True, detail)


def check_pytest(s: dict) -> None:
    # left out: the 2-process CPU runs (two processes on one GPU cannot share NCCL; the fsdp check covers them)
    # and SmolLM2 (its wheel, 93 MB, does not travel to a device machine)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "device_branch", "-k",
                          "not two_processes and not smollm2", "tests/core", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=540, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    last = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
    report("pytest/device_branch", run.returncode == 0, last if run.returncode == 0 else run.stdout[-1500:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="the dry run: the same checks on CPU at toy sizes")
    ap.add_argument("--only", default="train,exact,fsdp,memory,pytest", help="comma-separated checks")
    ap.add_argument("--out", default=str(ROOT / "runs" / "gpu_check"))
    args = ap.parse_args()
    only = set(args.only.split(","))
    s = setup(args)
    print(f"gpu_check on {s['device']} ({s['gpus']} device(s)), model {s['model']}, attention {s['attns']}",
          flush=True)
    if "train" in only:
        for attn in s["attns"]:
            for kind in ("full", "lora"):
                if kind == "lora" and not s["gpu"] and attn != "sdpa":
                    continue
                run_check(f"train/{kind}/{attn}", check_train, s, kind, attn)
    if "exact" in only:
        run_check("exact", check_exact_paths, s)
    if "fsdp" in only:
        run_check("fsdp", check_fsdp_resume, s)
    if "memory" in only:
        run_check("memory", check_memory, s)
    if "pytest" in only:
        run_check("pytest/device_branch", check_pytest, s)
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(f"gpu_check: {len(RESULTS) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed or not RESULTS else 0


if __name__ == "__main__":
    sys.exit(main())

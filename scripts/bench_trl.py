"""minirl's GRPO step vs TRL's GRPOTrainer, side by side in one run, with a per-stage breakdown.

    python3 -m venv /work/trl-venv && /work/trl-venv/bin/pip install "trl==1.16.*" torch==2.13.0 ...
    .venv/bin/python scripts/bench_trl.py --trl_python /work/trl-venv/bin/python --steps 6 --repeats 2

TRL lives in its own environment (it pins its own versions of things); this script builds the model in
minirl's environment, then runs each trainer as a separate process, alternating minirl, TRL, minirl, TRL, ...
so that all see the same machine load. TRL runs twice per round: with its defaults (`trl`: GRPOConfig turns
gradient checkpointing on) and with `gradient_checkpointing=False` (`trl-nogc`, as minirl runs by default: the
fairer comparison of the two codes on a model this small). The configuration: a random Qwen2 (hidden 256, 4 layers, vocab 2048), 8 prompts x 8 completions x 64 new tokens, k3 KL 0.04
against a reference copy, lr 1e-5, T = 1, one optimizer step per rollout, fp32, 2 CPU threads.

Stages (seconds per step; the first step of each run is a warm-up and is dropped):
  gen      generate (both: HF `generate` with the KV cache)
  reward   the reward function
  logp     no-grad passes: reference log-probs (and old log-probs where computed; both skip them on-policy)
  update   the rest of the step: the training forward/backward, the optimizer step, bookkeeping
TRL's stages are measured by wrapping its methods (`_generate`, `_calculate_rewards`,
`_get_per_token_logps_and_entropies` outside autograd) and a callback around each step; minirl's come from
its own metrics.jsonl (timing_s/*).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["gen", "reward", "logp", "update", "step"]
B, G, NEW_TOKENS, KL, LR, THREADS = 8, 8, 64, 0.04, 1e-5, 2


def build_model(out: Path) -> None:
    """The benchmark's random Qwen2, with the toy tokenizer (ids < 2048), saved in fp32."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from minirl.toy.tiny import tiny_model_path
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    assert len(tokenizer) <= 2048
    config = Qwen2Config(vocab_size=2048, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


def run_minirl(model: Path, steps: int, out: Path) -> list[dict[str, float]]:
    """minirl's train.py on the benchmark's configuration; per-step stage times from its metrics.jsonl."""
    import torch
    torch.set_num_threads(THREADS)
    import train
    train.main(["--model_name_or_path", str(model), "--train_files", str(ROOT / "data" / "arith_train.jsonl"),
                "--val_files", "", "--prompts_per_step", str(B), "--group_size", str(G),
                "--max_new_tokens", str(NEW_TOKENS), "--kl_coef", str(KL), "--kl_estimator", "k3", "--lr", str(LR),
                "--temperature", "1.0", "--warmup_steps", "0", "--micro_batch_size", str(B * G),
                "--dtype", "float32", "--max_steps", str(steps), "--output_dir", str(out)])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open() if "timing_s/step" in line]
    return [{"gen": r["timing_s/gen"], "reward": r["timing_s/reward"],
             "logp": r["timing_s/old_log_prob"] + r["timing_s/ref"] + r["timing_s/adv"],
             "update": r["timing_s/update_actor"], "step": r["timing_s/step"]} for r in rows]


def run_trl(model: Path, steps: int, out: Path, gradient_checkpointing: bool = True) -> list[dict[str, float]]:
    """TRL's GRPOTrainer on the same model, prompts and configuration (run in TRL's environment)."""
    import torch
    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in (ROOT / "data" / "arith_train.jsonl").open()][:512]
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]} for r in rows])

    def reward(completions, answer, **kwargs):  # what minirl's gsm8k_reward checks: "#### N"
        return [float(f"#### {a}" in c[0]["content"]) for c, a in zip(completions, answer)]

    config = GRPOConfig(output_dir=str(out), per_device_train_batch_size=B * G, num_generations=G,
                        steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1,
                        max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, beta=KL, learning_rate=LR,
                        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, max_steps=steps,
                        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                        seed=0, dataloader_num_workers=0, gradient_checkpointing=gradient_checkpointing)
    trainer = GRPOTrainer(model=str(model), reward_funcs=reward, args=config, train_dataset=data)
    times: list[dict[str, float]] = []
    current: dict[str, float] = {}

    def timed(name: str, fn, only_without_grad: bool = False):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if not only_without_grad or not torch.is_grad_enabled():
                    current[name] = current.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    trainer._generate = timed("gen", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed("logp", trainer._get_per_token_logps_and_entropies, True)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            current.clear()
            current["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step = time.perf_counter() - current.pop("t0")
            row = {k: current.get(k, 0.0) for k in ("gen", "reward", "logp")}
            times.append({**row, "update": step - sum(row.values()), "step": step})

    trainer.add_callback(StepTimer())
    trainer.train()
    return times


def summarise(runs: dict[str, list[list[dict]]]) -> None:
    """Median and range over all measured steps (each run's first step dropped), per stage."""
    med = {}
    print(f"\n{'trainer':8s} " + " ".join(f"{s:>20s}" for s in STAGES) + "   (s/step: median [min-max])")
    for name, rs in runs.items():
        steps = [row for r in rs for row in r[1:]]
        cells = []
        for s in STAGES:
            xs = [row[s] for row in steps]
            med[(name, s)] = statistics.median(xs)
            cells.append(f"{med[(name, s)]:6.2f} [{min(xs):5.2f}-{max(xs):5.2f}]")
        print(f"{name:8s} " + " ".join(f"{c:>20s}" for c in cells))
    print()
    for trl in ("trl", "trl-nogc"):
        if (trl, "step") in med and ("minirl", "step") in med:
            print(f"minirl / {trl} step time (medians): {med[('minirl', 'step')] / med[(trl, 'step')]:.2f}x "
                  f"over {sum(len(r) - 1 for r in runs['minirl'])} and {sum(len(r) - 1 for r in runs[trl])} steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl_python", default="/work/trl-venv/bin/python", help="a python with trl==1.16 installed")
    ap.add_argument("--steps", type=int, default=6, help="steps per run (the first is dropped)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each trainer, alternating")
    ap.add_argument("--trainer", choices=["minirl", "trl", "trl-nogc"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trainer:  # one trainer, in its own process; prints its per-step times as the last line
        model, out = Path(args.model), Path(args.out)
        times = run_minirl(model, args.steps, out) if args.trainer == "minirl" else \
            run_trl(model, args.steps, out, gradient_checkpointing=args.trainer == "trl")
        print("BENCH " + json.dumps(times))
        return

    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs: dict[str, list[list[dict]]] = {"minirl": [], "trl": [], "trl-nogc": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model)
        for i in range(args.repeats):
            for name, python in (("minirl", sys.executable), ("trl", args.trl_python), ("trl-nogc", args.trl_python)):
                cmd = [python, __file__, "--trainer", name, "--model", str(model), "--steps", str(args.steps),
                       "--out", str(Path(tmp) / f"{name}{i}")]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                last = [line for line in proc.stdout.splitlines() if line.startswith("BENCH ")]
                if proc.returncode != 0 or not last:
                    raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
                runs[name].append(json.loads(last[-1][6:]))
                print(f"{name} run {i + 1}: " + ", ".join(f"{r['step']:.2f}" for r in runs[name][-1]) + " s/step")
    summarise(runs)


if __name__ == "__main__":
    main()

"""Steps per second of recipes/code_rl.py without (k=0) and with (k=2) sampling ahead of the trainer, same
settings, in one run; with the reward curves and staleness statistics.

    python scripts/bench_overlap.py [--steps 10] [--workers 4] [--out runs/bench_overlap.json]

The task must have a reward whose latency is real, or there is nothing to overlap. The tiny model writes no
programs, so it runs the toy arithmetic task scored *through the sandboxed judge*: the answer "#### N" becomes
the program print(N), judged on one test whose output is the gold sum (the reward gsm8k_reward would give, at
the cost of a sandboxed Python start per completion, as for a real program). The tiny model learns this task,
so the reward curves can be compared. Both runs use the same seeds, rollout workers and judge workers.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import torch

from minirl.agentic.env import MathEnv
from minirl.judge import Judge
from minirl.rewards import extract_gsm8k_answer, judge_request


class JudgedArithmeticEnv(MathEnv):
    """The toy task, its answer run as a program by the judge (see the module docstring)."""

    def __init__(self, judge: Judge):
        self.judge = judge

    def step(self, messages, completion):
        answer = extract_gsm8k_answer(completion)
        if answer is None:
            return None, 0.0, {}
        test = {"input": "", "output": str(self.problem["reward_model"]["ground_truth"])}
        result = self.judge.run_many([judge_request(f"print({answer})", {"language": "python", "tests": [test]})])[0]
        return None, float(result.verdict == "AC"), {"verdict": result.verdict}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts_per_step", type=int, default=4)
    ap.add_argument("--group_size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4, help="rollout workers (both runs)")
    ap.add_argument("--judge_workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--torch_threads", type=int, default=1,
                    help="intra-op threads; 1 on a small shared CPU, where OpenMP threads spin against each other")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_overlap.json"))
    args = ap.parse_args()
    import code_rl
    torch.set_num_threads(args.torch_threads)
    common = ["--env", "math", "--steps", str(args.steps), "--prompts_per_step", str(args.prompts_per_step),
              "--group_size", str(args.group_size), "--max_tokens", "8", "--lr", str(args.lr),
              "--num_rollout_workers", str(args.workers), "--stale_policy", "requeue"]
    results = {}
    with Judge(workers=args.judge_workers) as judge:
        for k in (0, 2):
            history = code_rl.main(common + ["--max_steps_off_policy", str(k)],
                                   make_env=lambda: JudgedArithmeticEnv(judge))["history"]
            wall = sum(h["step_s"] for h in history)  # the training loop only, not loading the model
            stale = [h["async/staleness/mean"] for h in history]
            results[f"k={k}"] = {
                "loop_s": round(wall, 2), "steps_per_s": round(len(history) / wall, 4),
                "reward": [round(h["reward"], 3) for h in history],
                "reward_mean_second_half": round(sum(h["reward"] for h in history[len(history) // 2:])
                                                 / (len(history) - len(history) // 2), 4),
                "staleness_mean": round(sum(stale) / len(stale), 3),
                "staleness_max": max(h["async/staleness/max"] for h in history),
                "requeued": sum(h["async/requeued"] for h in history),
                "queue_depth_mean": round(sum(h["async/queue_depth"] for h in history) / len(history), 2)}
    results["speedup"] = round(results["k=2"]["steps_per_s"] / results["k=0"]["steps_per_s"], 3)
    results["settings"] = vars(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

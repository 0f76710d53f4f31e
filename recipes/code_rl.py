"""Agentic code RL on the sessions API: multi-turn episodes with a test-running tool, sampled ahead of the
trainer with bounded staleness (the SageMaker training-sessions `code_rl` recipe, locally).

    python scripts/prepare_codecontests.py --language python                  # once: data/prepared/*.jsonl
    python recipes/code_rl.py --model /path/to/Qwen2.5-Coder-7B-Instruct --lora_rank 32 \\
        --train_files data/prepared/codecontests_train_subset300_python.jsonl --max_tokens 2048 \\
        --max_steps_off_policy 3 --stale_policy requeue --num_rollout_workers 4
    python recipes/code_rl.py --env math --steps 5                            # tiny model, toy arithmetic

Each step trains B groups of G episodes (minirl/agentic/episodes.py; CodeEnv: up to --max_turns turns, check_solution
on the public tests, reward 1/0/-0.1 on the private tests). Rollout workers (minirl/agentic/overlap.py) keep sampling
and judging while the trainer steps, at most --max_steps_off_policy policy versions ahead; older groups are
requeued or dropped. The step's B groups are taken as they are ready, then their forward_backward calls are
submitted together, with Dr. GRPO's aggregation as train.py's `--loss_agg_mode seq-mean-token-sum-norm` (each
episode's token sum over the constant max_tokens, averaged over the step's judged episodes of all W processes,
since optim_step sums the processes' gradients), so the same batch gives the same gradient on 1 or 2 processes
(tests/core/test_loss_convention.py). The loss (cispo by default) corrects for the policy gap with the sampler's
own log-probs. Advantages: reward minus the group mean. An episode whose program the judge could not judge
(reward NaN, verdict JE) is no episode of the step, as in train.py: advantage 0, out of its group's mean and of
the normaliser (which is why the step's groups are counted before any is trained), and more than
--max_judge_error_share of the step's programs with one stops the run (minirl/sampling.py: check_judge_errors).
With --max_steps_off_policy 0 the run is the synchronous loop, whatever --num_rollout_workers is.

Metrics: reward (of the judged episodes; NaN if none was), judge_errors, loss, grad_norm, turns,
async/staleness/{mean,max}, async/requeued, async/dropped, async/queue_depth (groups sampled and waiting when the
step's optim_step was submitted), step_s.
"""
from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (the options every recipe shares)
import torch

from common import ROOT
from minirl.data import load_rows, prompt_indices
from minirl.distributed import global_sum
from minirl.agentic.env import CodeEnv, MathEnv
from minirl.agentic.episodes import episode_datum, run_episodes
from minirl.judge import JUDGE_ERROR, Judge
from minirl.agentic.overlap import RolloutPool
from minirl.sampling import check_judge_errors
from minirl.sessions import AdamParams, SamplingParams, ServiceClient


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--env", choices=["code", "math"], default="code")
    p.add_argument("--train_files", default="")                     # default: the toy task for --env math
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--prompts_per_step", type=int, default=8)       # B groups per step
    p.add_argument("--group_size", type=int, default=8)             # G episodes per group
    p.add_argument("--max_tokens", type=int, default=1024)          # per turn
    p.add_argument("--max_turns", type=int, default=2)              # CodeEnv: turns with the tool, then the answer
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--loss_fn", default="cispo", choices=["cispo", "importance_sampling", "ppo"])
    p.add_argument("--max_steps_off_policy", type=int, default=0)   # k: groups at most k versions old are trained
    p.add_argument("--stale_policy", choices=["requeue", "drop"], default="requeue")
    p.add_argument("--num_rollout_workers", type=int, default=0)    # 0: sample in the trainer's thread
    p.add_argument("--judge_workers", type=int, default=0)          # 0: one per CPU
    p.add_argument("--max_judge_error_share", type=float, default=0.1)  # stop above this share of JE programs
    p.add_argument("--lora_rank", type=int, default=0)              # 0: full fine-tuning
    p.add_argument("--lora_alpha", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_dir", default="")                      # merged weights are saved here if given
    args = p.parse_args(argv)
    if args.max_steps_off_policy < 0 or args.num_rollout_workers < 0:
        p.error("--max_steps_off_policy and --num_rollout_workers must be >= 0")
    if args.env == "code" and not args.train_files:
        p.error("--env code needs --train_files (prepared code rows: scripts/prepare_codecontests.py)")
    return args


def advantage_scale(B: int, G: int, max_tokens: int, world: int, judge_errors: float = 0.0) -> float:
    """Dr. GRPO's normaliser: 1 / (the step's judged episodes over every process * the constant token budget);
    `judge_errors`, the step's episodes the judge could not judge on every process, are no episodes of it."""
    return 1.0 / (max(world * B * G - judge_errors, 1.0) * max_tokens)


def judge_error_counts(groups: list) -> torch.Tensor:
    """(judge errors, programs sent to the judge) of this process's groups: a judge error's reward is NaN, and
    an episode whose final answer had no code is no program (as sampling.check_judge_errors counts them)."""
    episodes = [ep for group in groups for ep in group.episodes]
    errors = sum(ep.reward != ep.reward for ep in episodes)
    programs = sum(ep.info.get("verdict", "no code") != "no code" for ep in episodes)
    return torch.tensor([errors, programs], dtype=torch.float64)


def group_datums(episodes: list, scale: float) -> list:
    """One Datum per episode: (reward - the group's mean) * scale; a judge error's NaN reward gets 0 and stays
    out of the mean (as train.py leaves it out of the loss: advantage 0 under this constant normaliser)."""
    judged = [ep.reward for ep in episodes if ep.reward == ep.reward]
    mean = sum(judged) / max(len(judged), 1)
    return [episode_datum(ep, (ep.reward - mean) * scale if ep.reward == ep.reward else 0.0) for ep in episodes]


def main(argv: list[str] | None = None, make_env=None) -> dict:
    """make_env: a factory of environments in place of --env's (scripts/bench_overlap.py passes one)."""
    args = parse_args(argv)
    B, G, T, k = args.prompts_per_step, args.group_size, args.temperature, args.max_steps_off_policy
    svc = ServiceClient()
    tc = (svc.create_lora_training_client(args.model, rank=args.lora_rank, alpha=args.lora_alpha, seed=args.seed)
          if args.lora_rank else svc.create_training_client(args.model, seed=args.seed)).result()
    # model_path None: the live weights, in the session's call order (minirl), which the rollout workers need
    tok, sc = tc.get_tokenizer(), tc.create_sampling_client().result()
    rows = load_rows(args.train_files or str(ROOT / "data" / "arith_train.jsonl"), split="train")
    judge = Judge(workers=args.judge_workers or None) if args.env == "code" and make_env is None else None
    make_env = make_env or ((lambda: CodeEnv(judge, tok, args.max_turns)) if judge else MathEnv)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=T)

    def run_group(problem: dict, seed: int) -> tuple[list, int]:
        [episodes] = run_episodes(sc, tok, make_env, [problem], G, params, seed=seed)
        return episodes, min(ep.policy_version for ep in episodes)

    position = iter(range(10**12))
    next_problem = lambda: rows[prompt_indices(next(position), 1, len(rows), args.seed)[0]]  # noqa: E731
    pool = RolloutPool(run_group, next_problem, B, k, args.num_rollout_workers, args.seed)
    # Tinker's losses sum over tokens: advantages scaled by 1 / (the step's judged episodes * a constant token
    # budget) give a step size that grows neither with the batch nor with the processes (Dr. GRPO's aggregation)
    device = next(tc.model.parameters()).device  # where the step's counts are summed over processes
    adam = AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.99, eps=1e-8, grad_clip_norm=1.0)
    history = []
    try:
        for step in range(args.steps):
            t0 = time.perf_counter()
            groups = list(pool.fresh_groups(step, args.stale_policy))
            # the step's judge errors over every process, before any training: they leave the normaliser
            errors, programs = global_sum(judge_error_counts(groups).to(device)).tolist()
            check_judge_errors({f"critic/verdict/{JUDGE_ERROR}": errors, "critic/verdict/judged": programs - errors},
                               args.max_judge_error_share, ["see the judge's log for the cause"])
            scale = advantage_scale(B, G, args.max_tokens, svc.num_processes, errors)
            fbs = [tc.forward_backward(group_datums(group.episodes, scale), args.loss_fn) for group in groups]
            rewards = [ep.reward for g in groups for ep in g.episodes if ep.reward == ep.reward]  # judged ones
            turns = [ep.turns for g in groups for ep in g.episodes]
            depth = pool.queue_depth
            op = tc.optim_step(adam)
            losses, opt = [f.result().loss for f in fbs], op.result()
            pool.set_policy(int(opt["policy_version"]))  # workers may now start groups up to this version + k
            stale = pool.stats["staleness"]
            history.append({"step": step + 1, "reward": sum(rewards) / len(rewards) if rewards else float("nan"),
                            "judge_errors": errors, "loss": sum(losses),
                            "grad_norm": opt["grad_norm"], "turns": sum(turns) / len(turns),
                            "async/staleness/mean": sum(stale) / len(stale), "async/staleness/max": max(stale),
                            "async/requeued": pool.stats["requeued"], "async/dropped": pool.stats["dropped"],
                            "async/queue_depth": depth, "step_s": time.perf_counter() - t0})
            h = history[-1]
            print(f"step {step + 1}: reward {h['reward']:.3f} loss {h['loss']:.4f} grad_norm {h['grad_norm']:.4f} "
                  f"staleness {h['async/staleness/mean']:.2f}/{h['async/staleness/max']} "
                  f"requeued {h['async/requeued']} queue {depth} {h['step_s']:.1f}s", flush=True)
    finally:
        pool.close()
        if judge is not None:
            judge.close()
    if args.output_dir:
        tc.save_weights_for_sampler(args.output_dir, merge_weights=True).result()
    tc.stop()
    return {"history": history}


if __name__ == "__main__":
    torch.manual_seed(0)
    main()

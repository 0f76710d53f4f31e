"""Train a language model to reason with RL against verifiable rewards (GRPO, PPO and variants).

    python train.py                                    # built-in toy run: tiny model, arithmetic, CPU, minutes
    python train.py --config recipes/gsm8k.yaml --model_name_or_path /path/to/Qwen2.5-0.5B-Instruct
    accelerate launch train.py --config recipes/gsm8k.yaml ...       # same file, several GPUs

The file reads top to bottom: setup, the training loop, the end. Each step runs the phases of verl's trainer
with verl's names (verl/trainer/ppo/ray_trainer.py, `fit`: `with marked_timer("gen", timing_raw)`, ...; logged
by metric_utils.compute_timing_metrics as `timing_s/<name>`; `timing_s/update` is actor + critic):

    gen            G completions per prompt (minirl's decode loop, or HF generate) (sampling.py, rollout.py)
    reward         the scorer's reward per completion (DAPO: resample) (minirl/sampling.py, rewards.py)
    old_log_prob   log-probs of the sampling policy (skipped on-policy) (minirl/logprobs.py)
    ref            log-probs of the KL reference (kl_coef > 0)
    values         the critic's values (PPO)                           (minirl/critic.py)
    adv            group advantages, or GAE (formulas in loss.py)      (minirl/update.py)
    update_critic  value loss -> grads -> optimizer step (PPO)
    update_actor   clipped policy loss -> grads -> optimizer step      (minirl/update.py)
    testing        held-out accuracy every val_every steps             (minirl/evaluate.py)

Distributed training is data parallel: every process samples its own prompts, and the step's numbers that
span processes (token counts, gradient sums, statistics) go through the named helpers of
minirl/distributed.py (`global_counts`, `global_mean`, ...), which are the identity on one process. With
`--fsdp true` the policy, the reference and the critic are sharded; nothing below changes. The judge (sandboxed
programs for code rows) is built here and handed to the scorer: the core never imports it.
Metrics go to <output_dir>/metrics.jsonl with verl's names; the final model is saved in <output_dir>.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import warnings
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from tqdm import tqdm

from minirl import checkpoint
from minirl.cli import exit_on_user_error
from minirl.config import Config, check_launcher, parse_config
from minirl.critic import critic_forward_backward, critic_values, load_critic
from minirl.data import drop_long_prompts, load_rows, prompt_text
from minirl.distributed import (broadcast_parameters, gather_rows, gathered, global_counts, global_max,
                                global_mean, global_sum, is_sharded, shard_and_load, shutdown,
                                sum_gradients_across_processes,
                                sum_over_processes)
from minirl.engines import decode
from minirl.engines.vllm_engine import engine_for
from minirl.evaluate import evaluate
from minirl.judge.backends import build_judge
from minirl.logprobs import batched_logprobs, check_packing
from minirl.packing import split_rows
from minirl.models import (adapter_disabled, autocast, build_policy, config_dtype, load_reference,
                           load_tokenizer, pick_attn_implementation, pick_dtype, resolve_model_path)
from minirl.rewards import Scorer, build_scorer, is_code, reward_kind
from minirl.rollout import Rollout
from minirl.samples import write_samples
from minirl.sampling import sample_and_score, timed, train_batch
from minirl.update import (LossSettings, compute_advantages, forward_backward, mini_batches, optim_step,
                           warmup_constant_schedule)


def validate(model, tokenizer, rows: list[dict], scorer: Scorer, cfg: Config, rank: int, world: int
             ) -> dict[str, float]:
    """Held-out validation: mean reward (accuracy for 0/1 rewards) per data source, each process scoring its
    share of the rows; returns val/test_score/<data_source>, and for code sources val/accepted/<data_source>,
    the fraction of programs the judge accepted (pass@1 when greedy: partly right programs score > 0), and
    val/judge_errors/<data_source>, the programs the judge could not judge (not scored; NaN scores if none was).
    Sampled validation (val_greedy false) draws with the run's seed every time, so that two validations differ
    by what training changed, not by the draw."""
    with gathered(model):
        records = evaluate(model, tokenizer, rows[rank::world], n=1 if cfg.val_greedy else cfg.group_size,
                           greedy=cfg.val_greedy, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                           scorer=scorer, seed=cfg.seed)
    errors = [r for r in records if r.get("verdict") == "JE"]  # judge errors: not scored, counted
    records = [r for r in records if r.get("verdict") != "JE"]
    sources = sorted({r["data_source"] for r in rows})
    code = {r["data_source"] for r in rows if is_code(r)} if scorer.judges_code else set()
    sums = torch.tensor([[sum(r["reward"] for r in records if r["data_source"] == s),
                          sum(1 for r in records if r["data_source"] == s),
                          sum(1 for r in records if r["data_source"] == s and r.get("verdict") == "AC"),
                          sum(1 for r in errors if r["data_source"] == s)]
                         for s in sources], dtype=torch.float64)
    sums = global_sum(sums.to(next(model.parameters()).device)).cpu().tolist()
    score = lambda x, c: float(x / c) if c else float("nan")  # noqa: E731 -- nothing judged: no score, not 0
    out = {f"val/test_score/{s}": score(v, c) for s, (v, c, _, _) in zip(sources, sums)}
    for s, (_, c, a, e) in zip(sources, sums):
        if s in code:
            out.update({f"val/accepted/{s}": score(a, c), f"val/judge_errors/{s}": e})
    return out


def is_on_policy(cfg: Config) -> bool:
    """One optimizer step per rollout: the policy being trained is the one that sampled, so the old log-probs
    are the training pass's own (ratio = 1) and their separate forward pass can be skipped. (Not with KL in
    the reward, which needs them before the update.)"""
    return cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and not cfg.kl_in_reward


def mini_batch_steps(model, optimizer, scheduler, batch: dict[str, torch.Tensor], cfg: Config, step_fn,
                     prefix: str, micro_batch_size: int, dtype: torch.dtype, split=None) -> dict[str, float]:
    """ppo_epochs passes over mini-batches of whole groups, one optimizer step each. step_fn(mb, num_tokens,
    num_seqs, micro_batch_size) accumulates one mini-batch's gradients (normalised by the step's counts over
    all processes) and returns this process's share of its metrics.
    Returns the metrics summed over processes, averaged over optimizer steps (lr: the last step's rate;
    optimizer_skipped: the share of them skipped because no sequence of the mini-batch had a token).
    split: mini-batch -> its micro-batches' rows (packed_micro_batches), passed as micro_batch_size instead.

    Autocast is entered around each step_fn and never around an optimizer step: autocast caches the bf16
    copy of each weight until its context exits, so a later mini-batch would otherwise run on stale weights."""
    rows, device = [], batch["input_ids"].device
    steps = mini_batches(batch, cfg.mini_batches, cfg.group_size)
    for epoch in range(cfg.ppo_epochs):
        for i, mb in enumerate(steps):
            last = epoch == cfg.ppo_epochs - 1 and i == len(steps) - 1  # the LR schedule: once per training step
            lr = optimizer.param_groups[0]["lr"]  # the rate this optimizer step uses
            num_tokens, num_seqs = global_counts(mb["response_mask"])  # the loss's normalisers
            with autocast(device, dtype):
                row = step_fn(mb, num_tokens=num_tokens, num_seqs=num_seqs,
                              micro_batch_size=split(mb) if split else micro_batch_size)
            # shares of step totals are summed over processes; "_max" metrics (rollout_corr/) are maxima
            row = {**sum_over_processes({k: v for k, v in row.items() if not k.endswith("_max")}),
                   **{k: global_max(v) for k, v in row.items() if k.endswith("_max")}}
            sum_gradients_across_processes(model)
            if num_seqs:  # sequences with a token, over every process: each one makes the same choice
                grad_norm = optim_step(model, optimizer, scheduler if last else None, cfg.max_grad_norm)
            else:  # no token to learn from (every sequence a judge error): AdamW's momentum and weight decay
                optimizer.zero_grad(set_to_none=True)  # would still move the weights, so no optimizer step
                grad_norm = 0.0
                if last and scheduler is not None:
                    scheduler.step()  # the schedule counts training steps
            rows.append({**row, "grad_norm": grad_norm, "lr": lr, "optimizer_skipped": float(not num_seqs)})
    over_steps = lambda k: rows[-1][k] if k == "lr" else max(r[k] for r in rows) if k.endswith("_max") \
        else sum(r[k] for r in rows) / len(rows)  # noqa: E731
    # a metric with its own namespace (verl's rollout_corr/) keeps it
    return {k if "/" in k else f"{prefix}/{k}": over_steps(k) for k in rows[0]}


def packed_micro_batches(cfg: Config, batch: dict[str, torch.Tensor], R: int) -> list[range]:
    """pack_sequences: each micro-batch's rows, by a budget of real tokens (micro_batch_tokens; 0: micro_batch_size
    rows each), as many micro-batches on every process (FSDP's collectives need as many passes everywhere)."""
    args = (batch["input_ids"], batch["attention_mask"], R, cfg.micro_batch_tokens, cfg.micro_batch_size)
    return split_rows(*args, count=int(global_max(len(split_rows(*args)))))


def per_sequence(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sequence's advantage (N,): GRPO's, or PPO's token advantages averaged over its response."""
    adv, mask = batch["advantages"], batch["response_mask"]
    return adv if adv.dim() == 1 else (adv * mask).sum(1) / mask.sum(1).clamp(min=1)


def step_metrics(step: int, rollout: Rollout, rewards: torch.Tensor, batch: dict[str, torch.Tensor],
                 entropy: torch.Tensor | None, timing: dict[str, float], *parts: dict[str, float]) -> dict:
    """The step's row of metrics.jsonl, with verl's names: rewards, advantages and lengths over every
    process's sequences (dynamic sampling's padding groups left out), the entropy, the phases' times
    (timing_s/update: actor and critic together), and the phases' own metrics (`parts`)."""
    def stats(name: str, x: torch.Tensor) -> dict[str, float]:
        x = x.float() if x.numel() else torch.full((1,), float("nan"))
        return {f"{name}/mean": float(x.mean()), f"{name}/max": float(x.max()), f"{name}/min": float(x.min())}
    mask, adv_seq = batch["response_mask"], per_sequence(batch)
    lengths = rollout.response_mask.sum(1).to(mask.device).float()  # 0 only for padding groups
    g_rewards, g_adv, g_len, g_trunc = gather_rows(rewards.to(mask.device), adv_seq, lengths,
                                                   rollout.truncated.to(mask.device).float())
    real = g_len > 0
    m = {"training/global_step": step, **stats("critic/reward", g_rewards[real & ~g_rewards.isnan()]),
         **stats("critic/advantages", g_adv[real]), **stats("response_length", g_len[real]),
         "response_length/clip_ratio": float(g_trunc[real].mean()) if real.any() else float("nan")}
    if entropy is not None:  # of the sampling policy, per response token (on-policy: the update reports it)
        m["actor/entropy"] = global_mean(entropy, mask)
    for part in parts:
        m.update(part)
    timing = {**timing, "update": timing.get("update_actor", 0.0) + timing.get("update_critic", 0.0)}
    m.update({f"timing_s/{k}": v for k, v in timing.items()})
    return {**m, **peak_memory(mask.device)}


def peak_memory(device: torch.device) -> dict[str, float]:
    """verl's perf/ name for this process's peak GPU memory since the start; nothing on CPU."""
    if device.type != "cuda":  # device-branch: train/peak-memory
        return {}
    return {"perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30}


def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(argv)
    scorer = build_scorer(cfg)  # a missing --reward_fn file or function fails here, before any model is loaded
    trackers = [t.strip() for t in cfg.report_to.split(",") if t.strip()]
    # device-branch: train/launcher
    launcher_notes = check_launcher(cfg, os.environ, torch.cuda.is_available())  # accelerate's config, honoured
    # device-branch: train/cpu-processes
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        # under torchrun on CPU, accelerate otherwise runs every process as an independent world of one
        os.environ.setdefault("ACCELERATE_USE_CPU", "1")
    # collectives wait up to dist_timeout_s (a big checkpoint or a slow first step must not trip NCCL's 600 s)
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=cfg.dist_timeout_s))
    accelerator = Accelerator(log_with=trackers or None, project_dir=cfg.output_dir, kwargs_handlers=[timeout])
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    out_dir, is_main = Path(cfg.output_dir), accelerator.is_main_process
    for note in launcher_notes:
        accelerator.print(note)
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        # not config.json: that name belongs to the model that save_pretrained writes here
        (out_dir / "run_config.json").write_text(json.dumps(vars(cfg), indent=2))

    # --- setup: policy, reference, critic, data, judge, optimizers ------------------------------------------
    with accelerator.main_process_first():  # the first process builds the toy model if needed
        path = resolve_model_path(cfg.model_name_or_path)
    # precision (models.build_policy says why): fp32 trained weights, compute in `dtype`, saved in the config's
    dtype = pick_dtype(cfg.dtype, device)
    attn = pick_attn_implementation(cfg.attn_implementation, dtype)  # flash-attn computes in fp16/bf16 only
    save_dtype = config_dtype(path) if cfg.save_dtype == "auto" else getattr(torch, cfg.save_dtype)
    tokenizer = load_tokenizer(path)
    lora = dict(rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                target_modules=cfg.lora_target_modules) if cfg.lora_rank > 0 else None
    # fsdp: built on the meta device, sharded, then filled from the files that process 0 reads: no process holds
    # the whole model (one process: the same path; sharded over a group of one under torchrun); before the
    # optimizer, which holds shards
    place = functools.partial(shard_and_load, device=device, compute_dtype=dtype) if cfg.fsdp else None
    policy = build_policy(path, device, dtype, attn, lora, cfg.gradient_checkpointing, cfg.load_in_bits,
                          cfg.seed, keep_dropout=cfg.keep_dropout, place=place)
    if lora:
        broadcast_parameters(p for p in policy.parameters() if p.requires_grad)  # the same adapter everywhere
    if cfg.fsdp:
        accelerator.print(f"fsdp: policy {'sharded over' if is_sharded(policy) else 'not sharded (no process group)'}"
                          f" {world} process(es)")
    if cfg.rollout_engine == "hf":  # whether minirl's decode loop serves the model (else HF generate): said now
        with gathered(policy):
            decode.check_model(policy)
    policy.train()
    torch.manual_seed(cfg.seed * 1000 + rank)  # from here on, different samples on each process
    # the KL reference: a frozen copy, or with LoRA the policy with its adapter switched off (no second copy)
    ref_model = load_reference(path, dtype, attn, device, place) if cfg.kl_coef > 0 and cfg.lora_rank == 0 else None
    critic = load_critic(resolve_model_path(cfg.critic_model_path or path), torch.float32, attn,  # fsdp: as the
                         cfg.gradient_checkpointing, device, cfg.keep_dropout, place).train() \
        if cfg.algorithm == "ppo" else None  # policy, sharded, its optimizer (below) on the shards

    train_rows = drop_long_prompts(load_rows(cfg.train_files, split="train"), tokenizer, cfg.max_prompt_length,
                                   log=accelerator.print)
    val_rows = load_rows(cfg.val_files, split="test", limit=cfg.val_max_samples) if cfg.val_files else []
    # the sandboxed judge pool, one for the run, only for code rows: the scorer takes anything with run_many
    needs_judge = any(map(is_code, train_rows + val_rows)) and not cfg.reward_fn
    for source in set() if cfg.reward_fn else {r["data_source"] for r in train_rows + val_rows if not is_code(r)}:
        reward_kind(source)  # an unknown data_source fails now, on every process, not when the stream draws it
    judge = build_judge(cfg) if needs_judge else None
    scorer = build_scorer(cfg, judge)

    adam = dict(weight_decay=cfg.weight_decay, betas=(cfg.adam_beta1, cfg.adam_beta2))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, **adam)
    scheduler = warmup_constant_schedule(optimizer, cfg.warmup_steps)
    if cfg.pack_sequences:  # after the optimizer: FSDP's root keeps its gathered weights after a forward pass
        check_packing(policy, dtype)  # a model whose packed log-probs are not its padded ones is refused
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, **adam) if critic else None
    # one mini-batch's gradients: (mb, num_tokens, num_seqs) -> this process's share of the metrics
    actor_step = functools.partial(forward_backward, policy, loss=LossSettings.from_config(cfg),
                                   packed=cfg.pack_sequences)
    critic_step = lambda mb, num_tokens, num_seqs, micro_batch_size: critic_forward_backward(  # noqa: E731
        critic, mb, micro_batch_size, num_tokens, cfg.value_clip)

    if trackers:  # metrics.jsonl is always written; these are extra (accelerate checks they are installed)
        accelerator.init_trackers("minirl", config=vars(cfg))
    start_step, position = checkpoint.resume(accelerator, cfg, policy, optimizer, scheduler, critic,
                                             critic_optimizer)
    metrics_file, samples_file = out_dir / "metrics.jsonl", out_dir / "samples.jsonl"
    if start_step == 0:
        if is_main:
            metrics_file.unlink(missing_ok=True)  # a fresh run starts a fresh log
            samples_file.unlink(missing_ok=True)
        with autocast(device, dtype):
            before = validate(policy, tokenizer, val_rows, scorer, cfg, rank, world) if val_rows else {}
        if is_main and before:
            with metrics_file.open("a") as f:
                f.write(json.dumps({"training/global_step": 0, **before}) + "\n")
    else:  # the validation before training is row 0 of the log
        first = json.loads(metrics_file.open().readline() or "{}") if metrics_file.exists() else {}  # node-local
        before = {k: v for k, v in first.items() if k.startswith("val/")}
    accelerator.print(f"held-out accuracy before RL: {before}")

    # --- the training loop: verl's phases, each timed ----------------------------------------------------
    bar = tqdm(range(start_step, cfg.max_steps), desc="train", initial=start_step, total=cfg.max_steps,
               disable=not is_main, dynamic_ncols=True)
    for step in range(start_step + 1, cfg.max_steps + 1):  # position: prompts consumed by all processes
        timing, entropy, val, details = {}, None, {}, []
        with timed("step", timing):
            with autocast(device, dtype):  # gen, reward
                rollout, rows, rewards, position, m_batch = sample_and_score(
                    policy, tokenizer, train_rows, scorer, cfg, position, rank, world, timing,
                    None if cfg.rollout_engine == "hf" else engine_for(cfg).sample, details)  # vLLM: minirl/engines
            batch = train_batch(rollout, cfg.mask_truncated, device, rewards)  # judge errors: no loss
            seqs = (batch["input_ids"], batch["attention_mask"], rollout.response_ids.shape[1])  # ids, mask, R
            # micro-batch size from a token budget over the widest process's batch, so all run as many passes
            mbs = max(1, int(cfg.micro_batch_tokens // global_max(seqs[0].shape[1]))) \
                if cfg.micro_batch_tokens else cfg.micro_batch_size
            # pack_sequences: micro-batches by their real tokens, run without padding (minirl/packing.py)
            split = functools.partial(packed_micro_batches, cfg, R=seqs[2]) if cfg.pack_sequences else None
            pack = dict(packed=True) if cfg.pack_sequences else {}
            with timed("old_log_prob", timing), autocast(device, dtype):  # on-policy: the update's own pass
                if not is_on_policy(cfg):
                    batch["old_logp"], entropy = batched_logprobs(policy, *seqs, split(batch) if split else mbs,
                                                                  cfg.temperature, with_entropy=True, **pack)
            with timed("ref", timing), autocast(device, dtype):
                if cfg.kl_coef > 0:  # the frozen copy, or with LoRA the policy with its adapter switched off
                    with adapter_disabled(policy) if ref_model is None else contextlib.nullcontext():
                        batch["ref_logp"], _ = batched_logprobs(ref_model or policy, *seqs,
                                                                split(batch) if split else mbs, cfg.temperature,
                                                                **pack)
            with timed("values", timing), autocast(device, dtype):
                if critic is not None:
                    batch["old_values"] = critic_values(critic, *seqs, mbs)                          # (N, R)
            with timed("adv", timing):
                batch["advantages"], returns, m_adv = compute_advantages(cfg, rewards, batch, total=global_sum)
            m_update = {}
            if critic is not None:
                with timed("update_critic", timing):
                    m_update = mini_batch_steps(critic, critic_optimizer, None, {**batch, "returns": returns},
                                                cfg, critic_step, "critic", mbs, dtype)
            with timed("update_actor", timing):
                m_update.update(mini_batch_steps(policy, optimizer, scheduler, batch, cfg, actor_step, "actor",
                                                 mbs, dtype, split))
            if val_rows and (step == cfg.max_steps or (cfg.val_every and step % cfg.val_every == 0)):
                with timed("testing", timing), autocast(device, dtype):
                    val = validate(policy, tokenizer, val_rows, scorer, cfg, rank, world)
        m = step_metrics(step, rollout, rewards, batch, entropy, timing, m_batch, m_adv, m_update, val)
        if is_main and cfg.log_sample_groups:  # a few groups to read (scripts/read_samples.py)
            shown = rows[:cfg.log_sample_groups]
            write_samples(samples_file, step, shown, [prompt_text(r, tokenizer) for r in shown], rollout.texts,
                          details, rewards.tolist(), per_sequence(batch).tolist(), cfg.group_size,
                          cfg.log_sample_groups)
        if is_main:
            with metrics_file.open("a") as f:
                f.write(json.dumps(m) + "\n")
            if trackers:
                accelerator.log(m, step=step)
            bar.update()
            bar.set_postfix(reward=f"{m['critic/reward/mean']:.3f}", len=f"{m['response_length/mean']:.1f}")
        if not math.isfinite(m["actor/pg_loss"]):
            raise FloatingPointError(f"non-finite loss at step {step}; see {metrics_file}")
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.max_steps:
            checkpoint.save(accelerator, cfg, step, position, policy, optimizer, scheduler, critic,
                            critic_optimizer)
    bar.close()

    # --- the end: the final model, the summary --------------------------------------------------------------
    after = {k: v for k, v in m.items() if k.startswith("val/")} if cfg.max_steps > start_step else {}
    accelerator.print(f"held-out accuracy after RL:  {after}")
    checkpoint.save_final(accelerator, policy, tokenizer, path, out_dir, save_dtype, cfg.lora_rank > 0 and
                          cfg.save_merged, {"before": before, "after": after, "steps": cfg.max_steps})
    if judge is not None:
        judge.close()
    shutdown()  # every process leaves the process group together (see distributed.shutdown)
    accelerator.end_training()
    return {"before": before, "after": after, "policy": policy, "critic": critic}


def __getattr__(name: str):
    """`update`, mini_batch_steps's name before 0.3.1 (it shadowed the module minirl/update.py), still resolves."""
    if name == "update":
        warnings.warn("train.update is now train.mini_batch_steps", DeprecationWarning, 2)
        return mini_batch_steps
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_on_user_error(main)

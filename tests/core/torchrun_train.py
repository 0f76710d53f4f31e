"""Helper for test_multiprocess.py: run train.main (under torchrun, or in the test's own process) with test hooks,
then write what each process ended with to <output_dir>/rank<r>.json.

    torchrun --nproc_per_node 2 tests/core/torchrun_train.py OUT_DIR HOOKS [train.py args...]

HOOKS is a comma-separated list (or "none"):
- fixed_sampling: each prompt's G completions are sampled alone, under a seed derived from the prompt text, so a
  prompt gets the same completions whichever process samples it and whatever else is in the batch. Then 2
  processes with B prompts each and 1 process with 2B prompts train on the same global batch.
- uneven_rewards: process r scores its first r+1 groups 0 for every sample (no signal), so that dynamic sampling
  keeps a different number of groups on each process.
- own_output_dir: process r > 0 writes into OUT_DIR/rank<r>_own_output_dir instead (node-local folders).
- uneven_width: process r pads its responses with 5*r extra columns (masked out), so processes see different
  padded widths (as they do with real data) without changing any number the loss uses.
- perturbed_sampler: the engine's log-probs (Rollout.sampler_logp) of every other row of each group are lowered by
  0.5, as a bf16 sampler's would differ from the trainer's: the rollout_corr/ metrics and the correction respond.
- chunk_check: the first rollout of each process is also sampled twice more from the same random state, in
  chunks (the run's rollout_kv_budget_gb) and in one batch (budget 0); whether they are equal and the chunk
  counts go to rank<r>.json ("chunks").
- count_packing: each packed layout (packing.pack) is recorded in rank<r>.json ("packed": calls, calls that
  shared a prompt, tokens laid, real tokens of the padded rows).
"""
import json
import os
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import torch

import train
from minirl import packing, rollout, sampling
from minirl.distributed import gathered, is_sharded, world_size
from minirl.rollout import concat_rollouts


def rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if world_size() > 1 else 0


RECORD: dict = {}  # what the checking hooks saw, written to rank<r>.json


def check_chunks(real_sample, model, tokenizer, prompts, G, *args, **kwargs) -> None:
    """chunk_check: the same prompts from the same random state, in chunks and in one batch."""
    counts, real_chunk_groups = [], rollout.chunk_groups
    rollout.chunk_groups = lambda *a, **k: counts.append(len(out := real_chunk_groups(*a, **k))) or out
    state, runs = torch.get_rng_state(), []
    try:
        for budget in (kwargs.get("kv_budget_gb", 0.0), 0.0):
            torch.set_rng_state(state)
            runs.append(real_sample(model, tokenizer, prompts, G, *args, **{**kwargs, "kv_budget_gb": budget}))
    finally:
        rollout.chunk_groups = real_chunk_groups
        torch.set_rng_state(state)
    a, b = runs
    RECORD["chunks"] = {"counts": counts, "prompts": len(prompts),
                        "equal": torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts and
                        torch.equal(a.response_mask, b.response_mask),
                        "sampler_logp_diff": float((a.sampler_logp - b.sampler_logp).abs().max())}


def install_hooks(hooks: set[str], group_size: int) -> None:
    real_sample, real_build_scorer = sampling.sample, train.build_scorer
    if "count_packing" in hooks:
        real_pack = packing.pack
        RECORD["packed"] = {"calls": 0, "shared": 0, "laid": 0, "rows_real": 0}

        def pack(input_ids, attention_mask, *args, **kwargs):
            out = real_pack(input_ids, attention_mask, *args, **kwargs)
            seen = RECORD["packed"]
            seen["calls"] += 1
            seen["shared"] += int(bool((out.context != out.segment).any()))
            seen["laid"] += int(out.laid.sum())
            seen["rows_real"] += int(attention_mask.sum())
            return out
        packing.pack = pack

    def sample(model, tokenizer, prompts, G, *args, **kwargs):
        if "chunk_check" in hooks and "chunks" not in RECORD:
            check_chunks(real_sample, model, tokenizer, prompts, G, *args, **kwargs)
        if "fixed_sampling" in hooks:
            parts = []
            for p in prompts:
                torch.manual_seed(zlib.crc32(p.encode()))
                parts.append(real_sample(model, tokenizer, [p], G, *args, **kwargs))
            out = concat_rollouts(parts, tokenizer.pad_token_id)
        else:
            out = real_sample(model, tokenizer, prompts, G, *args, **kwargs)
        extra = 5 * rank() if "uneven_width" in hooks else 0
        if extra:
            pad = lambda t, v: torch.cat([t, t.new_full((t.shape[0], extra), v)], dim=1)  # noqa: E731
            out = replace(out, response_ids=pad(out.response_ids, tokenizer.pad_token_id),
                          response_mask=pad(out.response_mask, 0),  # and the engine's log-probs, kept: 0 there
                          sampler_logp=None if out.sampler_logp is None else pad(out.sampler_logp, 0.0))
        if "perturbed_sampler" in hooks:
            shift = torch.zeros_like(out.sampler_logp)
            shift[1::2] = 0.5                    # rows 1, 3, ... of each group (G even): the same on any process
            out = replace(out, sampler_logp=(out.sampler_logp - shift) * out.response_mask)
        return out

    class UnevenScorer(train.Scorer):  # details: what the sampling stage scores with (its tests run no validation)
        def details(self, texts, rows):
            out = super().details(texts, rows)
            return [{**d, "reward": 0.0} if i < (rank() + 1) * group_size else d for i, d in enumerate(out)]

    def build_scorer(cfg, judge=None):
        s = real_build_scorer(cfg, judge)
        return UnevenScorer(s.judge, s.code_style, s.extraction, s.reward_fn) if "uneven_rewards" in hooks else s

    sampling.sample, train.build_scorer = sample, build_scorer


def checksum(params) -> float:
    return float(sum(p.detach().double().sum() * (i + 1) for i, p in enumerate(params)))


def run(out: Path, hooks: str, args: list[str]) -> dict:
    group_size = int(args[args.index("--group_size") + 1]) if "--group_size" in args else 8
    install_hooks(set(hooks.split(",")) - {"none"}, group_size)
    # keep the process group for the cross-process checks below (test_multiprocess also runs train.py unpatched)
    train.shutdown = lambda: None
    train.Accelerator.end_training = lambda self: None
    if "own_output_dir" in hooks and os.environ.get("RANK", "0") != "0":
        out = out / f"rank{os.environ['RANK']}_own_output_dir"  # as on a node with a node-local output folder
    result = train.main(args + ["--output_dir", str(out)])
    policy = result["policy"]
    with gathered(policy), torch.no_grad():  # full parameters, as this process sees them
        info = {"sharded": is_sharded(policy), "world": world_size(),
                "critic_sharded": result.get("critic") is not None and is_sharded(result["critic"]),
                "trainable": checksum(p for p in policy.parameters() if p.requires_grad),
                "all": checksum(policy.parameters()), **RECORD}
    if world_size() > 1:  # what the process group's collectives wait for (config key dist_timeout_s)
        from torch.distributed import distributed_c10d
        backend = distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        info["timeout_s"] = backend.options._timeout.total_seconds()
    (out / f"rank{rank()}.json").write_text(json.dumps(info))
    if world_size() > 1:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    return result


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])

"""Issue 52 on 2 CPU processes (torchrun, gloo), in one launch against one process with the same global batch:
chunked generation (a key/value budget that forces a chunk per group) equals one batch's under FSDP's gathered
weights; the sampler-mismatch metrics (rollout_corr/*) and the truncated-IS correction, with a perturbed sampler,
are the whole batch's; and training passes packed under FSDP with gradient checkpointing and micro-batches by a
token budget (a group's prompt laid once) give the losses, gradient norm and entropy of padded passes on one
process. The hooks are tests/core/torchrun_train.py's."""
from test_multiprocess import launch

ARGS = ["--max_steps", "2", "--group_size", "4", "--temperature", "0.7", "--kl_coef", "0.05", "--micro_batch_size",
        "3", "--val_files", "", "--warmup_steps", "5", "--seed", "3", "--rollout_kv_budget_gb", "1e-9",
        "--rollout_is_cap", "1.5"]
HOOKS = "fixed_sampling,perturbed_sampler"


def test_chunked_rollouts_sampler_metrics_and_packed_fsdp_passes_on_two_processes_match_one(tmp_path, tiny_path):
    one, _ = launch(tmp_path / "one", HOOKS, *ARGS, "--prompts_per_step", "8", procs=1)   # padded, unsharded
    two, ranks = launch(tmp_path / "two", HOOKS + ",chunk_check,count_packing", *ARGS, "--prompts_per_step", "4",
                        "--fsdp", "true", "--pack_sequences", "true", "--gradient_checkpointing", "true",
                        "--micro_batch_tokens", "120")
    for r in ranks:
        assert r["sharded"] and r["chunks"]["equal"] and r["chunks"]["sampler_logp_diff"] < 1e-5
        assert r["chunks"]["counts"] == [4, 1]        # a chunk per group (4 prompts), then one batch
        packed = r["packed"]                          # every pass packed, the groups' prompts laid once
        assert packed["calls"] > 2 and packed["shared"] == packed["calls"] and packed["laid"] < packed["rows_real"]
    assert two[0]["critic/reward/mean"] == one[0]["critic/reward/mean"]       # the same completions were trained on
    keys = ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "rollout_corr/kl",
            "rollout_corr/k3_kl", "rollout_corr/abs_logp_diff_max", "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_ratio_fraction_high"]
    for key in keys:
        assert two[0][key] == approx(one[0][key]), key
    assert one[0]["rollout_corr/abs_logp_diff_max"] == approx(0.5)          # the perturbation, seen
    assert 0.3 < one[0]["rollout_corr/rollout_is_ratio_fraction_high"] < 0.7  # the shifted rows' tokens: capped
    assert two[1]["actor/kl_loss"] > 0 and two[1]["actor/kl_loss"] == approx(one[1]["actor/kl_loss"], rel=1e-3)


def approx(value: float, rel: float = 1e-5):
    import pytest
    return pytest.approx(value, rel=rel, abs=1e-6)


def test_fsdp_runs_equal_packed_passes_with_unequal_groups_and_widths(tmp_path, tiny_path):
    """Packed micro-batches come from each process's own real lengths (here different groups kept and different
    widths): every process must still run as many passes, or FSDP's collectives hang (train.packed_micro_batches)."""
    rows, ranks = launch(tmp_path, "uneven_rewards,uneven_width,count_packing", "--max_steps", "3", "--group_size",
                         "4", "--prompts_per_step", "4", "--dynamic_sampling", "true", "--max_sampling_rounds", "1",
                         "--fsdp", "true", "--pack_sequences", "true", "--micro_batch_tokens", "40", "--val_files", "")
    assert len(rows) == 3 and all(r["batch/groups"] + r["batch/groups_dropped"] == 8 for r in rows)
    assert ranks[0]["packed"]["calls"] == ranks[1]["packed"]["calls"] > 3

"""Reproductions of what an adversarial read of the RL core (train.py, sampling, update, distributed) found.

Each test states the property that must hold; they are small and run on the tiny random model.
"""
import pytest
import torch

import train
from minirl.distributed import global_counts
from minirl.update import LossSettings, forward_backward, mini_batches


def _batch(groups: int, G: int, R: int = 3, P: int = 2) -> dict[str, torch.Tensor]:
    N = groups * G
    return {"input_ids": torch.arange(N * (P + R)).view(N, P + R) % 50 + 3,
            "attention_mask": torch.ones(N, P + R, dtype=torch.long),
            "response_mask": torch.ones(N, R, dtype=torch.long),
            "advantages": torch.linspace(-1, 1, N)}


@pytest.mark.parametrize("groups", [5, 3, 7, 8])
def test_mini_batches_hold_whole_groups_when_dynamic_sampling_keeps_fewer_groups(groups):
    """Dynamic sampling trains however many groups it kept (B=8 wanted, 5 kept): each optimizer step must still
    get whole groups (a group's advantages are relative to each other) and there are `mini_batches` steps."""
    G, count = 4, 2
    parts = mini_batches(_batch(groups, G), count, G)
    assert [len(p["input_ids"]) % G for p in parts] == [0] * len(parts)
    assert len(parts) == count
    assert sum(len(p["input_ids"]) for p in parts) == groups * G


def test_mini_batches_with_fewer_groups_than_steps_still_hold_whole_groups():
    parts = mini_batches(_batch(1, 4), 2, 4)
    assert [len(p["input_ids"]) for p in parts] == [4]


def test_keep_dropout_reaches_the_policy_and_the_critic(monkeypatch, tmp_path):
    """config key keep_dropout must reach build_policy (and load_critic): otherwise it is silently ignored."""
    seen = {}

    class Stop(Exception):
        pass

    def spy(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(train, "build_policy", spy)
    with pytest.raises(Stop):
        train.main(["--keep_dropout", "true", "--val_files", "", "--output_dir", str(tmp_path)])
    assert seen.get("keep_dropout") is True


def test_padding_rows_do_not_change_the_seq_mean_gradient(random_model):
    """Dynamic sampling pads a process that kept fewer groups with empty-mask copies so that all processes run
    as many passes; those rows must not count as sequences in seq-mean-* normalisers, or the gradient depends
    on how the kept groups happened to fall across processes (2 processes, 3 + 1 groups kept: 6 groups counted
    instead of 4)."""
    torch.manual_seed(0)
    loss = LossSettings(loss_agg_mode="seq-mean-token-mean")
    batch = _batch(2, 2)
    padded = {k: torch.cat([v, v[:2]]) for k, v in batch.items()}
    padded["response_mask"][4:] = 0

    def grads(b):
        random_model.zero_grad()
        num_tokens, num_seqs = global_counts(b["response_mask"])
        forward_backward(random_model, b, loss, micro_batch_size=8, num_tokens=num_tokens, num_seqs=num_seqs)
        return torch.cat([p.grad.flatten() for p in random_model.parameters() if p.grad is not None])

    torch.testing.assert_close(grads(padded), grads(batch))

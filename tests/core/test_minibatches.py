"""Mini-batches are whole groups, whatever number of groups dynamic sampling kept, and the LR schedule advances
once per training step however many optimizer steps it took."""
import pytest
import torch

import train
from minirl.config import parse_config
from minirl.update import LossSettings, minibatch_slices, warmup_constant_schedule


@pytest.mark.parametrize("groups, expected", [(8, [16, 16]), (5, [12, 8]), (3, [8, 4]), (1, [4])])
def test_minibatches_are_whole_groups_whatever_number_was_kept(groups, expected):
    slices = minibatch_slices(groups, 4, 2)
    assert [s.stop - s.start for s in slices] == expected
    assert slices[0].start == 0 and slices[-1].stop == groups * 4
    assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))


@pytest.mark.parametrize("groups", [5, 1])
def test_the_update_never_splits_a_group_and_the_schedule_counts_training_steps(groups, monkeypatch):
    """B=8, G=4, mini_batches=2 with 5 groups kept: steps of 3 and 2 whole groups (not 10 + 10 rows); with 1
    group kept, one optimizer step, and the warm-up still advances one training step."""
    G, R = 4, 3
    cfg = parse_config(["--prompts_per_step", "8", "--group_size", str(G), "--mini_batches", "2",
                        "--warmup_steps", "4"])
    seen = []

    def fake_forward_backward(policy, mb, *args, **kwargs):
        seen.append(mb["group"].tolist())
        (policy.weight.sum() * 0).backward()
        return {"pg_loss": 0.0}
    monkeypatch.setattr(train, "forward_backward", fake_forward_backward)
    policy = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = warmup_constant_schedule(optimizer, cfg.warmup_steps)
    lrs = []
    for kept in (groups, 8):                           # two training steps: `groups` kept, then all 8
        seen.clear()
        N = kept * G
        batch = {"input_ids": torch.zeros(N, 5, dtype=torch.long), "response_mask": torch.ones(N, R),
                 "group": torch.arange(N) // G}
        lrs.append(train.update(policy, None, optimizer, scheduler, None, batch, cfg, LossSettings(), 32,
                                torch.float32)["actor/lr"])
        assert len(seen) == min(kept, 2)
        for rows in seen:                              # each group's rows all in one optimizer step
            assert len(rows) % G == 0 and all(rows.count(g) == G for g in set(rows))
        assert sorted(g for rows in seen for g in set(rows)) == list(range(kept))
    assert scheduler.last_epoch == 2 and lrs == pytest.approx([0.25, 0.5])  # warm-up over 4 training steps

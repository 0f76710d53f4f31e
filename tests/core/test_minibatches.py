"""Mini-batches are whole groups, whatever number of groups dynamic sampling kept, and the LR schedule advances
once per training step however many optimizer steps it took."""
import pytest
import torch

import train
from minirl.config import parse_config
from minirl.update import mini_batches, warmup_constant_schedule


@pytest.mark.parametrize("groups, expected", [(8, [16, 16]), (5, [8, 12]), (3, [4, 8]), (1, [4])])
def test_minibatches_are_whole_groups_whatever_number_was_kept(groups, expected):
    batch = {"input_ids": torch.zeros(groups * 4, 3)}
    assert [len(mb["input_ids"]) for mb in mini_batches(batch, 2, 4)] == expected


@pytest.mark.parametrize("groups", [5, 1])
def test_the_update_never_splits_a_group_and_the_schedule_counts_training_steps(groups):
    """B=8, G=4, mini_batches=2 with 5 groups kept: steps of whole groups (not 10 + 10 rows); with 1 group
    kept, one optimizer step, and the warm-up still advances one training step."""
    G, R = 4, 3
    cfg = parse_config(["--prompts_per_step", "8", "--group_size", str(G), "--mini_batches", "2",
                        "--warmup_steps", "4"])
    policy = torch.nn.Linear(2, 2)
    seen = []

    def step_fn(mb, num_tokens, num_seqs, micro_batch_size):
        seen.append(mb["group"].tolist())
        (policy.weight.sum() * 0).backward()
        return {"pg_loss": 0.0}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = warmup_constant_schedule(optimizer, cfg.warmup_steps)
    lrs = []
    for kept in (groups, 8):                           # two training steps: `groups` kept, then all 8
        seen.clear()
        N = kept * G
        batch = {"input_ids": torch.zeros(N, 5, dtype=torch.long), "response_mask": torch.ones(N, R),
                 "group": torch.arange(N) // G}
        lrs.append(train.mini_batch_steps(policy, optimizer, scheduler, batch, cfg, step_fn, "actor", 32,
                                          torch.float32)["actor/lr"])
        assert len(seen) == min(kept, 2)
        for rows in seen:                              # each group's rows all in one optimizer step
            assert len(rows) % G == 0 and all(rows.count(g) == G for g in set(rows))
        assert sorted(g for rows in seen for g in set(rows)) == list(range(kept))
    assert scheduler.last_epoch == 2 and lrs == pytest.approx([0.25, 0.5])  # warm-up over 4 training steps

"""Every formula pinned to hand-computed values (re-derived with numpy / plain loops)."""
import numpy as np
import pytest
import torch

from minirl.loss import aggregate, cispo_weight, gae, group_advantages, kl_penalty, policy_loss, value_loss, whiten


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# --- advantages ----------------------------------------------------------------------------------------------

def test_grpo_advantages_match_verl_and_trl_conventions():
    r = t([1, 0, 0, 1])
    assert torch.allclose(group_advantages(r, 4), t([1, -1, -1, 1]) * 0.866024, atol=1e-6)     # verl
    # TRL 1.16 (GRPOTrainer, scale_rewards="group"): rewards.view(-1, G).std(dim=1) is torch's Bessel-corrected
    # std, plus 1e-4: 0.5 / (sqrt(1/3) + 1e-4) = 0.865875
    assert torch.allclose(group_advantages(r, 4, std="unbiased", eps=1e-4), t([1, -1, -1, 1]) * 0.865875, atol=1e-6)
    assert torch.allclose(group_advantages(r, 4, std="population", eps=1e-4), t([1, -1, -1, 1]) * 0.9998, atol=1e-4)
    assert torch.equal(group_advantages(t([1, 1, 1, 1]), 4), torch.zeros(4))
    expected = t([0.439155, -1.317464, -0.146385, 1.024694])
    assert torch.allclose(group_advantages(t([0.5, -1, 0, 1]), 4), expected, atol=1e-5)


def test_grpo_advantages_match_a_plain_numpy_loop():
    rng = np.random.default_rng(0)
    r = rng.normal(size=12)
    out = group_advantages(torch.tensor(r), 4).numpy()
    for g in range(3):
        grp = r[4 * g:4 * g + 4]
        ref = (grp - grp.mean()) / (grp.std(ddof=1) + 1e-6)
        assert np.allclose(out[4 * g:4 * g + 4], ref, atol=1e-5)


def test_dr_grpo_and_rloo_advantages():
    r = t([1, 0, 0, 1])
    assert torch.allclose(group_advantages(r, 4, "dr_grpo"), t([0.5, -0.5, -0.5, 0.5]))
    assert torch.allclose(group_advantages(r, 4, "rloo"), t([2, -2, -2, 2]) / 3, atol=1e-6)
    # rloo by definition: r_i minus the mean of the others
    x = t([3.0, 1.0, 4.0, 1.5])
    loo = torch.stack([x[i] - (x.sum() - x[i]) / 3 for i in range(4)])
    assert torch.allclose(group_advantages(x, 4, "rloo"), loo, atol=1e-6)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages(r, 4, "nope")


# --- KL ------------------------------------------------------------------------------------------------------

def test_kl_estimators_values():
    lp, ref = t([-1.0]), t([-1.5])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.106531, abs=1e-6)
    assert kl_penalty(t([-2.0]), t([-2.0]), "k3").item() == 0.0


# --- aggregation ---------------------------------------------------------------------------------------------

LOSS = t([[1, 2, 3, 0], [4, 0, 0, 0]])
MASK = t([[1, 1, 1, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("mode,expected", [("token-mean", 2.5), ("seq-mean-token-mean", 3.0),
                                           ("seq-mean-token-sum", 5.0), ("seq-mean-token-sum-norm", 1.25),
                                           ("seq-sum-token-sum-norm", 2.5)])
def test_aggregate_modes(mode, expected):
    assert aggregate(LOSS, MASK, mode, max_len=4).item() == pytest.approx(expected)


def dr_grpo_loop(loss, mask, max_len):
    """Dr. GRPO's aggregation as its paper's code computes it: each response's token sum over a constant,
    averaged over the responses."""
    sums = [sum(l * m for l, m in zip(row, mrow)) / max_len for row, mrow in zip(loss.tolist(), mask.tolist())]
    return sum(sums) / len(sums)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_loss_scale_does_not_grow_with_the_batch(mode):
    """The same rows repeated 4 times give the same loss (and so the same gradient); only verl's batch-summed
    variant grows 4x. Dr. GRPO's mode equals the paper's loop."""
    big_loss, big_mask = LOSS.repeat(4, 1), MASK.repeat(4, 1)
    assert aggregate(big_loss, big_mask, mode, max_len=4).item() == pytest.approx(
        aggregate(LOSS, MASK, mode, max_len=4).item())
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=4).item() == pytest.approx(
        dr_grpo_loop(LOSS, MASK, 4))
    assert aggregate(big_loss, big_mask, "seq-sum-token-sum-norm", max_len=4).item() == pytest.approx(
        4 * aggregate(LOSS, MASK, "seq-sum-token-sum-norm", max_len=4).item())


def test_aggregate_with_step_counts_sums_over_micro_batches():
    """Two micro-batches normalised by the step's counts add up to the whole batch's value."""
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                 "seq-sum-token-sum-norm"):
        whole = aggregate(LOSS, MASK, mode, max_len=4)
        parts = sum(aggregate(LOSS[i:i + 1], MASK[i:i + 1], mode, max_len=4, num_tokens=4, num_seqs=2)
                    for i in range(2))
        assert parts.item() == pytest.approx(whole.item()), mode


# --- GAE -----------------------------------------------------------------------------------------------------

def test_gae_values_and_whitening():
    adv, ret = gae(t([[0, 0, 1]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]]), gamma=1.0, lam=0.95)
    assert torch.allclose(adv, t([[0.46575, 0.385, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, t([[0.96575, 0.985, 1.0]]), atol=1e-6)
    w = whiten(adv, t([[1, 1, 1]]))
    assert torch.allclose(w, t([[0.991344, 0.017092, -1.008436]]), atol=1e-5)


def test_whitening_with_no_token_left_is_zero_not_nan():
    """mask_truncated can mask every response of a step: nothing to normalise, nothing to train."""
    w = whiten(t([[0.3, -0.2], [0.1, 0.0]]), t([[0, 0], [0, 0]]))
    assert torch.isfinite(w).all() and (w * 0 == 0).all()


def test_whitening_with_a_global_total_uses_the_whole_batch_statistics():
    """Two "processes" hold half the batch each; `total` returns the sum over both, as distributed.global_sum does."""
    x, m = t([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]]), t([[1, 1, 0], [1, 0, 0]])
    full = whiten(x, m)
    halves = [(x[:1], m[:1]), (x[1:], m[1:])]
    # what whiten asks `total` for, summed over both halves: [sum of x, count], then the sum of squared deviations
    first = sum(torch.stack([(xi * mi).sum(), mi.sum()]) for xi, mi in halves)
    second = sum((((xi - first[0] / first[1]) * mi) ** 2).sum() for xi, mi in halves)
    for i, (xi, mi) in enumerate(halves):
        answers = iter([first, second])
        out = whiten(xi, mi, total=lambda s: next(answers))  # noqa: B023
        assert torch.allclose(out * mi, full[i:i + 1] * mi, atol=1e-6)
    assert not torch.allclose(whiten(*halves[0]) * m[:1], full[:1] * m[:1], atol=1e-3)  # local stats differ


def test_gae_skips_padding():
    """A padded position neither gets an advantage nor breaks the recursion across it."""
    adv_pad, _ = gae(t([[0, 0, 1, 0]]), t([[0.5, 0.6, 0.7, 9.0]]), t([[1, 1, 1, 0]]), 1.0, 0.95)
    adv, _ = gae(t([[0, 0, 1]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]]), 1.0, 0.95)
    assert torch.allclose(adv_pad[:, :3], adv) and adv_pad[0, 3] == 0


# --- policy losses -------------------------------------------------------------------------------------------

def test_ppo_loss_clips_and_reports_clipfrac():
    old = torch.zeros(1, 4)
    logp = torch.log(t([[1.5, 0.5, 1.1, 1.0]]))        # ratios 1.5, 0.5, 1.1, 1.0
    adv = t([1.0])
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 4), "ppo", clip_low=0.2, clip_high=0.28)
    # A>0: min(r, clip(r)) -> 1.28, 0.5, 1.1, 1.0 (the low clip never binds for A > 0)
    assert loss.item() == pytest.approx(-(1.28 + 0.5 + 1.1 + 1.0) / 4, abs=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)


def test_ppo_gradient_is_zero_where_clipped():
    old = torch.zeros(1, 2)
    logp = torch.log(t([[1.5, 1.0]])).requires_grad_()
    loss, _ = policy_loss(logp, old, t([1.0]), torch.ones(1, 2), "ppo")
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0


def test_dual_clip_caps_negative_advantage_loss():
    old, logp = torch.zeros(1, 1), torch.log(t([[10.0]]))
    loss, _ = policy_loss(logp, old, t([-1.0]), torch.ones(1, 1), "ppo", dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)


def test_cispo_weight_and_gradient_flow():
    assert cispo_weight(t(1.5), 0.2, 0.28).item() == pytest.approx(1.28)
    assert cispo_weight(t(0.5), 0.2, 0.28).item() == pytest.approx(0.8)
    old = torch.zeros(1, 1)
    logp = torch.log(t([[1.5]])).requires_grad_()
    loss, _ = policy_loss(logp, old, t([2.0]), torch.ones(1, 1), "cispo", 0.2, 0.28)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-1.28 * 2.0)  # clipped tokens still get a gradient


def test_importance_sampling_loss():
    old, logp = torch.zeros(1, 2), torch.log(t([[2.0, 0.5]]))
    loss, _ = policy_loss(logp, old, t([1.0]), torch.ones(1, 2), "importance_sampling")
    assert loss.item() == pytest.approx(-1.25)


def test_on_policy_loss_gradient_is_reinforce():
    """ratio == 1: the gradient of the PPO loss equals -A * grad logp / num_tokens."""
    logp = t([[-1.0, -2.0, -0.5]]).requires_grad_()
    loss, m = policy_loss(logp, logp.detach(), t([0.7]), torch.ones(1, 3), "ppo")
    loss.backward()
    assert torch.allclose(logp.grad, torch.full((1, 3), -0.7 / 3))
    assert m["ppo_kl"].item() == 0.0


def test_value_loss_clipping():
    v, old, ret = t([[1.0]]), t([[0.0]]), t([[1.0]])
    loss, m = value_loss(v, old, ret, torch.ones(1, 1), clip=0.2)
    # unclipped error 0, clipped (0.2 - 1)^2 = 0.64 -> max -> 0.5 * 0.64
    assert loss.item() == pytest.approx(0.32) and m["vf_clipfrac"].item() == 1.0


def test_outcome_token_rewards_put_the_score_on_the_last_token_and_kl_everywhere():
    from minirl.loss import outcome_token_rewards
    mask = t([[1, 1, 1, 0], [1, 0, 0, 0]])
    r = outcome_token_rewards(t([2.0, -1.0]), mask)
    assert r.tolist() == [[0, 0, 2, 0], [-1, 0, 0, 0]]
    r = outcome_token_rewards(t([2.0, -1.0]), mask, kl=torch.ones(2, 4), kl_coef=0.1)
    assert torch.allclose(r, t([[-0.1, -0.1, 1.9, 0], [-1.1, 0, 0, 0]]))


def test_dapo_overlong_penalty_ramps_over_the_buffer():
    from minirl.rewards import overlong_penalty
    assert overlong_penalty([10, 16, 18, 20], max_new_tokens=20, buffer=4) == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty([20], 20, 0) == [0.0]

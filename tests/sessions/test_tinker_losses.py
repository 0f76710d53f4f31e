"""Each of Tinker's built-in losses (sessions/losses.py), value and gradient, against a plain loop over datums
and tokens that writes Tinker's documented formula out (tinker-docs "Loss functions"), summed over tokens.
And the session's loss pass: the same loss, summed over datums, whatever the micro-batch size."""
import math

import pytest
import torch

from minirl.sessions.losses import TINKER_LOSSES, tinker_loss
from minirl.sessions import AdamParams, Datum, ServiceClient
from conftest import assert_close_at_scale


def reference(kind, logp, q, adv, w, lengths, seq_mask, lo=0.8, hi=1.2, beta=0.1):
    """Tinker's formulas, one datum and one token at a time (lists of scalars; logp keeps its graph)."""
    total = 0.0
    for i, n in enumerate(lengths):
        sel = [t for t in range(n) if seq_mask[i][t] != 0]
        seq_log_ratio = sum(float(logp[i][t].detach()) - float(q[i][t]) for t in sel) / max(len(sel), 1)
        for t in range(n):
            p, a = logp[i][t], float(adv[i][t])
            ratio = torch.exp(p - float(q[i][t]))
            if kind == "cross_entropy":
                total = total - float(w[i][t]) * p
            elif kind == "importance_sampling":
                total = total - ratio * a
            elif kind == "ppo":
                total = total - torch.minimum(ratio * a, ratio.clamp(lo, hi) * a)
            elif kind == "cispo":
                total = total - ratio.clamp(lo, hi).detach() * p * a
            elif kind == "dro":
                total = total - (p * a - 0.5 * beta * (p - float(q[i][t])) ** 2)
            elif kind == "gspo":  # the sequence ratio's value, the token's own gradient
                s = math.exp(seq_log_ratio) * torch.exp(p - p.detach())
                total = total - torch.minimum(s * a, s.clamp(lo, hi) * a)
    return total


@pytest.mark.parametrize("kind", TINKER_LOSSES)
def test_tinker_loss_value_and_gradient_match_the_documented_formula(kind):
    g = torch.Generator().manual_seed(0)
    N, T = 3, 5
    lengths = [5, 3, 1]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths])
    logp = (-torch.rand(N, T, generator=g) * 2).requires_grad_()
    q = logp.detach() + 0.3 * torch.randn(N, T, generator=g)          # some ratios fall outside [0.8, 1.2]
    adv, w = torch.randn(N, T, generator=g), torch.rand(N, T, generator=g)
    seq_mask = (torch.rand(N, T, generator=g) > 0.3).float()
    got = tinker_loss(kind, logp, q, adv, w * mask, mask, beta=0.1, seq_ratio_mask=seq_mask)
    (grad,) = torch.autograd.grad(got, logp)
    leaf = logp.detach().clone().requires_grad_()
    want = reference(kind, leaf, q, adv, w, lengths, seq_mask)
    (want_grad,) = torch.autograd.grad(want, leaf)
    assert float(got) == pytest.approx(float(want), rel=1e-5, abs=1e-6)
    assert torch.allclose(grad, want_grad * mask, atol=1e-6)
    assert torch.all(grad[mask == 0] == 0)                              # padding never contributes


def test_dro_without_beta_raises():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="beta"):
        tinker_loss("dro", x, x, x, x, torch.ones(1, 2))


def test_session_loss_is_the_sum_over_datums_whatever_the_micro_batch(tiny_path):
    """forward_backward sums: the loss of a batch is the sum of its datums' losses, and the gradient of one
    call equals that of micro-batches of 1 (no step-wide normaliser to get wrong)."""
    svc = ServiceClient()
    g = torch.Generator().manual_seed(1)
    datums = [Datum([1, 2, 3 + i], torch.randint(3, 200, (2 + i,), generator=g).tolist(),
                    (-torch.rand(2 + i, generator=g)).tolist(), advantages=float(torch.randn(1, generator=g)))
              for i in range(4)]
    grads, losses = [], []
    for mb in (4, 1):
        tc = svc.create_training_client(str(tiny_path), micro_batch_size=mb).result()
        losses.append(tc.forward_backward(datums, "cispo").result().metrics["loss:sum"])
        grads.append({n: p.grad.clone() for n, p in tc.model.named_parameters() if p.grad is not None})
        singles = sum(tc.forward([d], "cispo").result().metrics["loss:sum"] for d in datums)
        assert losses[-1] == pytest.approx(singles, rel=1e-5)
        tc.optim_step(AdamParams(learning_rate=0.0)).result()
        tc.stop()
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert_close_at_scale(grads[0], grads[1])


def test_stable_reinforce_raises_with_the_reason():
    """Its objective uses sampler-side records Tinker does not document: refuse rather than guess."""
    from minirl.sessions.batches import needed_inputs
    with pytest.raises(ValueError, match="stable_reinforce.*not supported"):
        needed_inputs("stable_reinforce")

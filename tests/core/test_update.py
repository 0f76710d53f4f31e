import pytest
import torch

from minirl.loss import policy_loss
from minirl.logprobs import token_logprobs
from minirl.rollout import sample
from minirl.update import LossSettings, forward_backward, optim_step
from conftest import assert_close_at_scale

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45?<|im_end|>\n<|im_start|>assistant\n"]


def make_batch(model, tokenizer, kl=False):
    torch.manual_seed(1)
    r = sample(model, tokenizer, PROMPTS, group_size=4, max_new_tokens=6)
    R = r.response_ids.shape[1]
    with torch.no_grad():
        logp = token_logprobs(model, r.input_ids, r.attention_mask, R)[0]
    batch = {"input_ids": r.input_ids, "attention_mask": r.attention_mask, "response_mask": r.response_mask,
             "old_logp": logp + 0.05 * torch.randn_like(logp),  # slightly off-policy: ratios != 1
             "advantages": torch.randn(8)}
    if kl:
        batch["ref_logp"] = logp - 0.1
    return batch


def grads_for(model, batch, settings, micro_batch_size):
    model.zero_grad(set_to_none=True)
    n_tok, n_seq = float(batch["response_mask"].sum()), float(batch["input_ids"].shape[0])
    metrics = forward_backward(model, batch, settings, micro_batch_size, num_tokens=n_tok, num_seqs=n_seq)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_is_invariant_to_micro_batch_size(random_model, tiny_tokenizer, agg):
    batch = make_batch(random_model, tiny_tokenizer, kl=True)
    settings = LossSettings(loss_agg_mode=agg, kl_coef=0.1, max_new_tokens=6)
    g1, m1 = grads_for(random_model, batch, settings, micro_batch_size=1)
    g4, m4 = grads_for(random_model, batch, settings, micro_batch_size=4)
    g8, _ = grads_for(random_model, batch, settings, micro_batch_size=8)
    assert_close_at_scale(g1, g8)
    assert_close_at_scale(g4, g8)
    assert m1["pg_loss"] == pytest.approx(m4["pg_loss"], abs=1e-6)


def test_forward_backward_matches_the_full_batch_loss(random_model, tiny_tokenizer):
    batch = make_batch(random_model, tiny_tokenizer)
    g, metrics = grads_for(random_model, batch, LossSettings(), micro_batch_size=3)
    random_model.zero_grad(set_to_none=True)
    R = batch["response_mask"].shape[1]
    logp, _ = token_logprobs(random_model, batch["input_ids"], batch["attention_mask"], R)
    loss, _ = policy_loss(logp, batch["old_logp"], batch["advantages"], batch["response_mask"])
    loss.backward()
    assert metrics["pg_loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert_close_at_scale({n: p.grad for n, p in random_model.named_parameters() if p.grad is not None}, g)
    assert 0 <= metrics["pg_clipfrac"] <= 1 and metrics["ppo_kl"] != 0


def test_a_step_raises_the_logprob_of_a_positive_advantage_sequence(random_model, tiny_tokenizer):
    batch = make_batch(random_model, tiny_tokenizer)
    R = batch["response_mask"].shape[1]
    with torch.no_grad():
        batch["old_logp"] = token_logprobs(random_model, batch["input_ids"], batch["attention_mask"], R)[0]
    batch["advantages"] = torch.tensor([1.0, -1, -1, -1, -1, -1, -1, -1])
    opt = torch.optim.AdamW(random_model.parameters(), lr=1e-3)
    m = batch["response_mask"][0].bool()
    before = batch["old_logp"][0][m].sum()
    n_tok = float(batch["response_mask"].sum())
    forward_backward(random_model, batch, LossSettings(), 4, num_tokens=n_tok, num_seqs=8)
    norm = optim_step(random_model, opt, None, max_grad_norm=1.0)
    assert norm > 0 and all(p.grad is None for p in random_model.parameters())
    with torch.no_grad():
        after = token_logprobs(random_model, batch["input_ids"], batch["attention_mask"], R)[0][0][m].sum()
    assert after > before


def test_optim_step_skips_non_finite_gradients(random_model):
    opt = torch.optim.AdamW(random_model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in random_model.parameters()]
    for p in random_model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    optim_step(random_model, opt, None, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, random_model.parameters()))


def test_mini_batches_are_contiguous_slices_of_whole_groups():
    from minirl.update import mini_batches
    batch = {"input_ids": torch.arange(12)[:, None], "response_mask": torch.ones(12, 3)}
    parts = mini_batches(batch, 3, group_size=2)
    assert [p["input_ids"].flatten().tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [len(p["input_ids"]) for p in mini_batches(batch, 12, group_size=3)] == [3, 3, 3, 3]  # one group each

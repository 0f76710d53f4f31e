"""Skipping the old-logp pass on-policy (one epoch, one mini-batch) changes no number the update computes."""
import pytest
import torch

from minirl.config import parse_config
from minirl.logprobs import batched_logprobs
from minirl.update import LossSettings

import train
from test_update import grads_for, make_batch
from conftest import assert_close_at_scale


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_skip_gives_bit_identical_loss_and_gradients(random_model, tiny_tokenizer, temperature):
    batch = make_batch(random_model, tiny_tokenizer, kl=True)
    R = batch["response_mask"].shape[1]
    settings = LossSettings(kl_coef=0.1, temperature=temperature)
    skipped = {k: v for k, v in batch.items() if k != "old_logp"}
    g_skip, m_skip = grads_for(random_model, skipped, settings, micro_batch_size=4)
    # a separate no-grad pass computing log-probs as the training pass does, on the same micro-batches
    batch["old_logp"], _ = batched_logprobs(random_model, batch["input_ids"], batch["attention_mask"], R, 4,
                                            temperature)
    g_pass, m_pass = grads_for(random_model, batch, settings, micro_batch_size=4)
    assert m_skip["pg_loss"] == m_pass["pg_loss"] and m_skip["kl_loss"] == m_pass["kl_loss"]
    assert m_skip["ppo_kl"] == 0.0 == m_pass["ppo_kl"] and m_skip["pg_clipfrac"] == 0.0
    assert g_skip.keys() == g_pass.keys() and all(torch.equal(g_skip[k], g_pass[k]) for k in g_pass)
    # the pass train.py ran before (log-probs fused with the entropy: logit - logsumexp) rounds differently,
    # so its ratio was 1 +- 1e-7, not exactly 1: the same update up to rounding
    batch["old_logp"], entropy = batched_logprobs(random_model, batch["input_ids"], batch["attention_mask"], R, 4,
                                                  temperature, with_entropy=True)
    g_old, m_old = grads_for(random_model, batch, settings, micro_batch_size=4)
    assert m_skip["pg_loss"] == pytest.approx(m_old["pg_loss"], rel=1e-5, abs=1e-7)
    assert_close_at_scale(g_skip, g_old)
    # the entropy metric from the training pass equals the old pass's, token-averaged
    mask = batch["response_mask"]
    assert m_skip["entropy"] == pytest.approx(float((entropy * mask).sum() / mask.sum()), rel=1e-5)


def test_training_pass_entropy_keeps_no_graph(random_model, tiny_tokenizer):
    from minirl.logprobs import token_logprobs
    batch = make_batch(random_model, tiny_tokenizer)
    logp, entropy = token_logprobs(random_model, batch["input_ids"], batch["attention_mask"], 6, with_entropy=True)
    assert logp.requires_grad and not entropy.requires_grad and entropy.min() >= 0


def test_on_policy_is_one_epoch_one_mini_batch_without_kl_in_reward():
    assert train.is_on_policy(parse_config([]))
    assert not train.is_on_policy(parse_config(["--ppo_epochs", "2"]))
    assert not train.is_on_policy(parse_config(["--mini_batches", "2"]))
    assert not train.is_on_policy(parse_config(["--kl_in_reward", "true", "--kl_coef", "0.1"]))

"""The sampler's distribution, accounted for: the rollout brings back the engine's own log-probs of the sampled
tokens (Rollout.sampler_logp), forward_backward logs how far they are from the trainer's (rollout_corr/*, verl's
names), and the truncated importance-sampling correction (rollout_is_cap, loss.rollout_is_weights) weighs each
token's loss by min(pi_old / pi_sampler, cap). In fp32 the two agree and the correction changes nothing; a
perturbed sampler moves the metrics and has its weights capped."""
import copy
import math

import pytest
import torch

import minirl.rollout as rollout
from minirl.logprobs import token_logprobs
from minirl.loss import rollout_is_weights, sampler_mismatch
from minirl.sampling import train_batch
from minirl.update import LossSettings, forward_backward

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n"]
T = 1.3


def sampled(monkeypatch, model, tokenizer, engine: str) -> rollout.Rollout:
    if engine == "generate":
        monkeypatch.setattr(rollout, "shares_prompts", lambda *args: False)
    torch.manual_seed(0)
    return rollout.sample(model, tokenizer, PROMPTS, 3, 8, temperature=T, top_k=40)


@pytest.mark.parametrize("engine", ["decode", "generate"])
def test_sampler_logprobs_are_the_trainers_in_fp32(monkeypatch, random_model, tiny_tokenizer, engine):
    r = sampled(monkeypatch, random_model, tiny_tokenizer, engine)
    logp, _ = token_logprobs(random_model, r.input_ids, r.attention_mask, r.response_ids.shape[1], T)   # (N, R)
    m = r.response_mask.bool()
    assert r.sampler_logp.shape == logp.shape and (r.sampler_logp[~m] == 0).all()
    assert (r.sampler_logp[m] < -1e-3).any()                               # real log-probs, not zeros
    torch.testing.assert_close(r.sampler_logp[m], logp[m], rtol=0, atol=1e-5)
    metrics = sampler_mismatch(logp, r.sampler_logp, r.response_mask)
    assert metrics["abs_logp_diff_max"] < 1e-5 and abs(metrics["kl"]) < 1e-6 and metrics["k3_kl"] < 1e-9


def test_truncated_is_weights_follow_the_formula_token_by_token():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3], [0.9, 0.01, 0.4]]))
    sampler = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.3, 0.02, 0.8]]))
    w = rollout_is_weights(old, sampler, cap=2.0)
    for i in range(2):
        for t in range(3):
            want = min(math.exp(float(old[i, t]) - float(sampler[i, t])), 2.0)
            assert abs(float(w[i, t]) - want) < 1e-6
    assert float(w[0, 0]) == 2.0 and abs(float(w[0, 1]) - 0.4) < 1e-6 and float(w[0, 2]) == 1.0
    assert not w.requires_grad


def step(model, batch, cap: float):
    """One forward_backward (off-policy: old_logp given) -> (metrics, {name: grad})."""
    model = copy.deepcopy(model)
    settings = LossSettings(temperature=T, rollout_is_cap=cap)
    metrics = forward_backward(model, batch, settings, micro_batch_size=4,
                               num_tokens=float(batch["response_mask"].sum()), num_seqs=float(len(batch["input_ids"])))
    return metrics, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def batch_of(model, r: rollout.Rollout) -> dict[str, torch.Tensor]:
    batch = train_batch(r, mask_truncated=False, device=torch.device("cpu"))
    assert "sampler_logp" in batch                                        # the rollout's log-probs travel along
    with torch.no_grad():
        batch["old_logp"], _ = token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                              r.response_ids.shape[1], T)
    batch["advantages"] = torch.linspace(-1, 1, len(batch["input_ids"]))
    return batch


def test_the_correction_changes_nothing_where_the_sampler_is_the_trainer(monkeypatch, random_model,
                                                                          tiny_tokenizer):
    r = sampled(monkeypatch, random_model, tiny_tokenizer, "decode")
    batch = batch_of(random_model, r)
    exact = {**batch, "sampler_logp": batch["old_logp"].clone()}         # the same numbers: weights exactly 1
    m_off, g_off = step(random_model, exact, cap=0.0)
    m_on, g_on = step(random_model, exact, cap=2.0)
    assert m_off["pg_loss"] == m_on["pg_loss"] and all(torch.equal(g_off[n], g_on[n]) for n in g_off)
    assert m_on["rollout_corr/abs_logp_diff_max"] == 0 and m_on["rollout_corr/rollout_is_mean"] == pytest.approx(1)
    m_fp32, g_fp32 = step(random_model, batch, cap=2.0)                 # the engine's own fp32 log-probs
    assert m_fp32["rollout_corr/k3_kl"] < 1e-9 and m_fp32["rollout_corr/abs_logp_diff_max"] < 1e-5
    assert m_fp32["pg_loss"] == pytest.approx(m_off["pg_loss"], rel=1e-5, abs=1e-7)
    scale = max(float(g.abs().max()) for g in g_off.values())
    assert all(float((g_fp32[n] - g_off[n]).abs().max()) <= 1e-5 * scale for n in g_off)


def test_a_perturbed_sampler_moves_the_metrics_and_its_weights_are_capped(monkeypatch, random_model,
                                                                          tiny_tokenizer):
    r = sampled(monkeypatch, random_model, tiny_tokenizer, "decode")
    batch = batch_of(random_model, r)
    mask = batch["response_mask"].float()
    shift = torch.zeros_like(mask)
    shift[::2] = 1.5                                # every other row: the sampler thought its tokens e^1.5 less likely
    perturbed = {**batch, "sampler_logp": (batch["old_logp"] - shift) * mask}
    m_plain, g_plain = step(random_model, perturbed, cap=0.0)
    m_cap, g_cap = step(random_model, perturbed, cap=2.0)
    assert m_cap["rollout_corr/abs_logp_diff_max"] == pytest.approx(1.5, abs=1e-5)
    k3 = math.exp(1.5) - 1.5 - 1                     # r - log r - 1 with r = e^1.5, on the shifted rows' tokens
    share = float((shift * mask).sum() / 1.5 / mask.sum())
    assert m_cap["rollout_corr/k3_kl"] == pytest.approx(k3 * share, rel=1e-4)
    assert m_cap["rollout_corr/kl"] == pytest.approx(-1.5 * share, rel=1e-4)
    assert m_plain["rollout_corr/k3_kl"] == m_cap["rollout_corr/k3_kl"]   # logged whether or not it corrects
    assert m_cap["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(share, rel=1e-6)
    assert m_cap["rollout_corr/rollout_is_mean"] == pytest.approx(2.0 * share + (1 - share), rel=1e-4)  # capped
    # the capped loss is the plain loss with the shifted rows' tokens weighed 2 (PPO's ratio is 1 here: old_logp is
    # the trainer's), so its gradient is the plain one with those rows' advantages doubled
    doubled = {**batch, "advantages": batch["advantages"] * torch.where(shift[:, 0] > 0, 2.0, 1.0)}
    _, g_want = step(random_model, doubled, cap=0.0)
    scale = max(float(g.abs().max()) for g in g_want.values())
    assert all(float((g_cap[n] - g_want[n]).abs().max()) <= 1e-5 * scale for n in g_want)
    assert any(float((g_cap[n] - g_plain[n]).abs().max()) > 1e-3 * scale for n in g_plain)


def test_the_cap_without_sampler_logprobs_is_refused_by_name(random_model):
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.ones(2, 4, dtype=torch.long),
             "response_mask": torch.ones(2, 2), "advantages": torch.ones(2)}
    with pytest.raises(ValueError, match="rollout_is_cap"):
        forward_backward(random_model, batch, LossSettings(rollout_is_cap=2.0), 2, 4.0, 2.0)


def test_sampler_logprobs_unknown_past_the_context_leave_the_metrics_and_get_weight_one(random_model, tiny_tokenizer,
                                                                                       monkeypatch):
    """A model the decode loop does not serve (length-dependent RoPE), where prompt + budget pass its context:
    generate splits the rows itself and the sampler's log-probs are not recorded. They are NaN on the response's
    tokens (0 after it), the step keeps every metric key (so processes stay in step) and the correction gives
    those tokens weight 1 instead of stopping the run."""
    import minirl.rollout as rollout
    monkeypatch.setattr(rollout, "shares_prompts", lambda *a: False)
    from minirl.update import LossSettings, forward_backward
    prompts = ["1+2=", "7+5=12 and 3+4="]
    P = max(len(tiny_tokenizer(p, add_special_tokens=False).input_ids) for p in prompts)
    random_model.config.max_position_embeddings = P + 5
    torch.manual_seed(0)
    ro = rollout.sample(random_model, tiny_tokenizer, prompts, 2, 8, temperature=1.0)
    real = ro.response_mask.bool()
    assert torch.isnan(ro.sampler_logp[real]).all() and (ro.sampler_logp[~real] == 0).all()
    batch = {"input_ids": ro.input_ids, "attention_mask": ro.attention_mask, "response_mask": ro.response_mask,
             "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]), "sampler_logp": ro.sampler_logp}
    settings = LossSettings("ppo", max_new_tokens=8, rollout_is_cap=2.0)
    n = float(ro.response_mask.sum())
    metrics = forward_backward(random_model, batch, settings, 4, n, 4.0)
    assert metrics["rollout_corr/k3_kl"] == 0 and metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)
    assert all(v == v for v in metrics.values())                      # no NaN reaches a metric

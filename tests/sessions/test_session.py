"""The sessions API in process (minirl/sessions/client.py) and the recipes written on it, on the tiny model and the
toy task. The official SDK over HTTP: test_tinker_sdk.py; the loss formulas: test_tinker_losses.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, assert_close_at_scale

from minirl.sessions import sampling as session
from minirl.sessions import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient, SessionError


@pytest.fixture(scope="module")
def svc():
    return ServiceClient()


def toy_prompts(tok, n):
    return [tok.apply_chat_template([{"role": "user", "content": f"What is {i}+{i + 3}?"}], tokenize=True,
                                    add_generation_prompt=True, return_dict=False) for i in range(n)]


def trainable(tc):
    return {n: p.detach().clone() for n, p in tc.model.named_parameters() if p.requires_grad}


def test_futures_run_in_submission_order_and_errors_surface_at_result(svc, tiny_path, monkeypatch):
    tc = svc.create_training_client(str(tiny_path)).result()
    tok = tc.get_tokenizer()
    prompts = toy_prompts(tok, 3)
    calls = []
    real_sample = session.sample
    monkeypatch.setattr(session, "sample", lambda *a, **k: calls.append(len(a[2])) or real_sample(*a, **k))
    sc = tc.create_sampling_client().result()
    params = SamplingParams(max_tokens=4, temperature=1.0)
    samples = [sc.sample(p, 2, params) for p in prompts] + [sc.sample(prompts[0], 2, SamplingParams(max_tokens=3))]
    order = []

    def record(i, fail=False):
        def fn(datums, logprobs):
            order.append(i)
            if fail:
                raise ValueError("bad loss")
            return sum(lp.sum() for lp in logprobs) * 0.0, {}
        return fn

    datums = [Datum(prompts[0], [5, 6, 7])]
    futures = [tc.forward_backward_custom(datums, record(i, fail=i == 2)) for i in range(5)]
    op = tc.optim_step(AdamParams(learning_rate=0.0))
    assert op.result().metrics["policy_version"] == 1 and all(f.done() for f in futures)  # in call order
    assert order == [0, 1, 2, 3, 4]
    with pytest.raises(SessionError, match="forward_backward_custom failed: ValueError: bad loss"):
        futures[2].result()
    assert futures[3].result().loss == 0.0                                        # later calls still run
    assert calls == [3, 1]  # the three sample calls that agree ran as one generate, the fourth alone
    responses = [f.result() for f in samples]
    assert all(len(r.sequences) == 2 and r.policy_version == 0 for r in responses)
    assert all(len(s.tokens) == len(s.logprobs) <= 4 and s.stop_reason in ("stop", "length")
               for r in responses for s in r.sequences)
    with pytest.raises(SessionError, match="forward failed: ValueError: unknown loss_fn 'nope'"):
        tc.forward(datums, loss_fn="nope").result()
    tc.stop()


def test_custom_loss_gets_the_gradient_of_the_built_in_loss(svc, tiny_path):
    """forward_backward_custom's surrogate pass gives the gradient of the user's loss: here the summed NLL,
    which is also the built-in cross_entropy (Tinker's, a sum)."""
    tc = svc.create_training_client(str(tiny_path), micro_batch_size=2).result()
    prompts = toy_prompts(tc.get_tokenizer(), 3)
    datums = [Datum(p, [20 + i, 30, 40 + i][:i + 1], weights=[1.0, 0.5, 2.0][:i + 1]) for i, p in enumerate(prompts)]
    ce = tc.forward_backward(datums, "cross_entropy").result()
    expected = {n: p.grad.clone() for n, p in tc.model.named_parameters()}
    tc.model.zero_grad(set_to_none=True)
    nll = lambda ds, lps: (-sum((lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(ds, lps)), {})  # noqa: E731
    custom = tc.forward_backward_custom(datums, nll).result()
    assert custom.loss == pytest.approx(ce.loss, rel=1e-5)
    assert_close_at_scale({n: p.grad for n, p in tc.model.named_parameters()}, expected)
    tc.stop()


def test_waiting_for_a_result_inside_a_custom_loss_raises_instead_of_hanging(svc, tiny_path):
    """The loss runs on the session's worker thread; a .result() there would wait for that thread forever."""
    tc = svc.create_training_client(str(tiny_path), micro_batch_size=2).result()
    datums = [Datum(toy_prompts(tc.get_tokenizer(), 1)[0], [5, 6])]

    def loss_that_waits(ds, lps):
        tc.forward(ds, "cross_entropy").result()  # queued behind this very operation
        return -lps[0].sum(), {}
    with pytest.raises(SessionError, match="inside another operation"):
        tc.forward_backward_custom(datums, loss_that_waits).result(timeout=60)
    assert tc.forward(datums, "cross_entropy").result(timeout=60).loss > 0  # the session still works
    tc.stop()


def test_grpo_recipe_first_step_equals_train_py(tmp_path, tiny_path):
    """Same seeds and settings (advantages centred within the group = train.py's dr_grpo): the same rollouts,
    so the same rewards exactly, and the same first-step loss and gradient norm. Not to the last bit: train.py's
    on-policy step takes old = logp.detach() (ratio exactly 1), the recipe passes the sampler's log-probs from a
    separate pass (ratio 1 +- 1e-7)."""
    import grpo_gsm8k
    import train
    train.main(["--adv_estimator", "dr_grpo", "--max_steps", "1", "--val_files", "", "--prompts_per_step", "8",
                "--output_dir", str(tmp_path)])
    row = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()][-1]
    step = grpo_gsm8k.main(["--steps", "1", "--val_files", "", "--prompts_per_step", "8"])["history"][0]
    assert row["critic/reward/mean"] == step["reward"]
    assert row["actor/pg_loss"] == pytest.approx(step["loss"], rel=1e-5)
    assert row["actor/grad_norm"] == pytest.approx(step["grad_norm"], rel=1e-5)


def test_save_state_then_resume_continues_bit_identically(svc, tiny_path, tmp_path):
    tc = svc.create_lora_training_client(str(tiny_path), rank=4, alpha=8).result()
    tok = tc.get_tokenizer()
    prompt = toy_prompts(tok, 1)[0]
    adam = AdamParams(learning_rate=1e-3, beta2=0.99)

    def step(tc):  # sample, then an RL step on the samples
        sc = tc.save_weights_and_get_sampling_client().result()
        seqs = sc.sample(ModelInput.from_ints(prompt), 4, SamplingParams(max_tokens=4)).result().sequences
        datums = [Datum(prompt, s.tokens, s.logprobs, advantages=float(i) - 1.5) for i, s in enumerate(seqs)]
        tc.forward_backward(datums, "ppo")
        tc.optim_step(adam).result()
        return [s.tokens for s in seqs]

    torch.manual_seed(0)
    step(tc)
    path = tc.save_state("state").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/state")
    tokens, weights = step(tc), trainable(tc)
    tc2 = svc.create_training_client_from_state_with_optimizer(path).result()
    assert tc2.policy_version == 1
    assert step(tc2) == tokens                                   # the RNG state came back too
    resumed = trainable(tc2)
    assert all(torch.equal(weights[n], resumed[n]) for n in weights)
    tc.stop(), tc2.stop()


def test_merged_weights_load_in_plain_transformers(svc, tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM
    tc = svc.create_lora_training_client(str(tiny_path), rank=4, alpha=8).result()
    prompt = toy_prompts(tc.get_tokenizer(), 1)[0]
    tc.forward_backward([Datum(prompt, [7, 8, 9])], "cross_entropy")
    tc.optim_step(AdamParams(learning_rate=1e-2))
    tc.save_weights_for_sampler(str(tmp_path / "merged"), merge_weights=True).result()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    ids = torch.tensor([prompt + [7, 8, 9]])
    with torch.no_grad():
        live = tc.model(ids).logits
        assert torch.allclose(merged(ids).logits, live, atol=1e-4)
        assert not torch.allclose(base(ids).logits, live, atol=1e-3)  # the adapter did change the model
    loaded = svc.create_sampling_client(str(tmp_path / "merged")).result()  # and the session samples from it
    assert len(loaded.sample(prompt, 2, SamplingParams(max_tokens=3)).result().sequences) == 2
    tc.stop()


def test_sft_recipe_loss_falls_and_accuracy_rises(tiny_path):
    import sft
    out = sft.main(["--steps", "12", "--val_max_samples", "50"])
    assert sum(out["losses"][-3:]) < 0.8 * sum(out["losses"][:3]), out["losses"]
    assert out["after"] > out["before"] + 0.2, out


def test_kto_recipe_prefers_desirable_completions(tiny_path):
    import kto
    out = kto.main(["--prompts", "32", "--steps", "15", "--batch_size", "16", "--val_max_samples", "50"])
    assert 0 < out["desirable_fraction"] < 1
    last = out["history"][-5:]
    margin = sum(h["rewards/desirable"] - h["rewards/undesirable"] for h in last) / len(last)
    assert margin > 0.5, out["history"]  # pi/pi_ref rose on desirable completions relative to undesirable ones
    assert out["after"] > out["before"] + 0.1, out


def test_spmd_gradients_on_two_processes_equal_one_process(svc, tiny_path, tmp_path):
    """Each of 2 processes (torchrun, gloo) runs forward_backward on its half of a batch; their gradients sum
    to one process's on the whole batch, and optim_step (which sums them) reports the same gradient norm."""
    tc = svc.create_training_client(str(tiny_path), micro_batch_size=3).result()
    prompts = toy_prompts(tc.get_tokenizer(), 4)
    g = torch.Generator().manual_seed(0)
    datums = []
    for i, p in enumerate(prompts):
        for j in range(2):
            n = 2 + (i + j) % 4
            datums.append(Datum(p, torch.randint(3, 200, (n,), generator=g).tolist(),
                                (-torch.rand(n, generator=g)).tolist(), advantages=float(torch.randn(1, generator=g))))
    one = tc.forward_backward(datums, "ppo").result()
    expected = {n: p.grad.clone() for n, p in tc.model.named_parameters() if p.grad is not None}
    norm = tc.optim_step(AdamParams(learning_rate=0.0)).result().metrics["grad_norm"]
    tc.stop()
    data = tmp_path / "datums.json"
    data.write_text(json.dumps([{"tokens": d.model_input.to_ints(),
                                 "inputs": {k: v.data for k, v in d.loss_fn_inputs.items()}} for d in datums]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "sessions" / "session_worker.py"), str(tiny_path), str(data), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shares = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert shares[0]["loss"] == pytest.approx(one.loss, rel=1e-5, abs=1e-6)  # losses summed over processes
    assert shares[0]["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert_close_at_scale({n: shares[0]["grads"][n] + shares[1]["grads"][n] for n in expected}, expected)


# --- Tinker's semantics, and the defects they replace ---------------------------------------------------------

def sampled_datums(tc, prompt, T, n=4):
    sc = tc.save_weights_and_get_sampling_client().result()
    seqs = sc.sample(ModelInput.from_ints(prompt), n, SamplingParams(max_tokens=5, temperature=T)).result().sequences
    assert all(s.sequence_id for s in seqs) and len({s.sequence_id for s in seqs}) == n
    return [Datum(prompt, s.tokens, s.logprobs, advantages=float(i) - 1.5) for i, s in enumerate(seqs)]


def test_rl_losses_score_at_the_sampling_temperature_so_on_policy_ratios_are_one(svc, tiny_path):
    """Sampled at T=0.7 and trained without a temperature in loss_fn_config: the ratio is 1 (ppo_kl 0), where
    a default of T=1 gave ppo_kl 0.02 and clipped tokens."""
    tc = svc.create_training_client(str(tiny_path)).result()
    datums = sampled_datums(tc, toy_prompts(tc.get_tokenizer(), 1)[0], T=0.7)
    out = tc.forward(datums, "ppo").result()
    assert abs(out.metrics["ppo_kl:mean"]) < 1e-5, out.metrics
    at_one = tc.forward(datums, "ppo", {"temperature": 1.0}).result()         # the override still works
    assert abs(at_one.metrics["ppo_kl:mean"]) > 1e-3
    tc.stop()


def test_rl_loss_without_sampler_logprobs_raises_instead_of_taking_them_as_zero(svc, tiny_path):
    tc = svc.create_training_client(str(tiny_path)).result()
    datum = Datum(toy_prompts(tc.get_tokenizer(), 1)[0], [5, 6, 7], advantages=1.0)   # no logprobs
    for loss_fn in ("importance_sampling", "ppo", "cispo"):
        with pytest.raises(SessionError, match=r"needs loss_fn_inputs \['logprobs'\]"):
            tc.forward([datum], loss_fn).result()
    tc.stop()


def test_losses_are_sums_and_an_unknown_aggregation_raises_instead_of_averaging(svc, tiny_path):
    tc = svc.create_training_client(str(tiny_path)).result()
    datum = Datum(toy_prompts(tc.get_tokenizer(), 1)[0], [5, 6, 7])
    one = tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    two = tc.forward([datum, datum], "cross_entropy").result().metrics["loss:sum"]
    assert two == pytest.approx(2 * one, rel=1e-6)                           # Tinker's sum, not a token mean
    with pytest.raises(SessionError, match="unknown loss_fn_config keys"):
        tc.forward([datum], "cross_entropy", {"loss_agg_mode": "seq-mean-token-mean"}).result()
    tc.stop()


def test_a_failed_forward_backward_fails_its_optim_step_which_applies_nothing(svc, tiny_path):
    """The loop queues fb(bad), fb(good), optim_step before reading results (as recipes/code_rl.py does): the
    step must not apply the good half alone; the next step trains normally."""
    tc = svc.create_training_client(str(tiny_path)).result()
    prompt = toy_prompts(tc.get_tokenizer(), 1)[0]
    good, bad = Datum(prompt, [5, 6, 7]), Datum(prompt, [5, 6, 7], advantages=1.0)  # bad: no logprobs
    before = trainable(tc)
    fbs = [tc.forward_backward([bad], "ppo"), tc.forward_backward([good], "cross_entropy")]
    op = tc.optim_step(AdamParams(learning_rate=1e-2))
    with pytest.raises(SessionError, match="needs loss_fn_inputs"):
        fbs[0].result()
    with pytest.raises(SessionError, match="skipped: an earlier forward_backward of this step failed"):
        fbs[1].result()
    with pytest.raises(SessionError, match="not applied"):
        op.result()
    assert all(torch.equal(before[n], p) for n, p in trainable(tc).items())
    tc.forward_backward([good], "cross_entropy")
    assert tc.optim_step(AdamParams(learning_rate=1e-2)).result().metrics["policy_version"] == 1
    assert not all(torch.equal(before[n], p) for n, p in trainable(tc).items())
    tc.stop()


def test_samplers_are_snapshots_and_saved_paths_load_the_saved_weights(svc, tiny_path):
    """save_weights_and_get_sampling_client keeps the weights of its moment (a loop that keeps an old sampler
    for off-policy data gets the old policy); create_sampling_client(path) samples the saved weights."""
    tc = svc.create_training_client(str(tiny_path)).result()
    prompt = toy_prompts(tc.get_tokenizer(), 1)[0]
    seq = ModelInput.from_ints(prompt + [5, 6, 7])
    old = tc.save_weights_and_get_sampling_client().result()
    saved = tc.save_weights_for_sampler("step0").result().path
    first = old.compute_logprobs(seq).result()
    tc.forward_backward([Datum(prompt, [5, 6, 7])], "cross_entropy")
    tc.optim_step(AdamParams(learning_rate=1e-2))
    new = tc.save_weights_and_get_sampling_client().result()
    assert old.compute_logprobs(seq).result() == first                        # unchanged by the step
    assert new.compute_logprobs(seq).result()[1:] != first[1:]
    from_path = tc.create_sampling_client(saved).result().compute_logprobs(seq).result()
    assert from_path[1:] == pytest.approx(first[1:], abs=1e-5)
    tc.stop()

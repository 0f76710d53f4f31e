"""The official Tinker SDK against minirl: `python -m minirl.sessions.server` on a free loopback port, and the
loops of tinker-cookbook's recipes/sl_loop.py and rl_loop.py written the same way (the cookbook itself needs a
package PyPI lacks), on the tiny model and the toy arithmetic task. The loops only change `base_url`.
The same loops also run in process on minirl.sessions.ServiceClient with the SDK's own types."""
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import torch

from conftest import ROOT

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.types.tensor_data import TensorData  # noqa: E402

from minirl.rewards import gsm8k_reward  # noqa: E402
from minirl.sessions import ServiceClient as LocalServiceClient  # noqa: E402

API_KEY = "tml-minirl-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    cmd = [sys.executable, "-m", "minirl.sessions.server", "--base_model", "tiny", "--port", "0",
           "--api_key", API_KEY, "--checkpoint_dir", str(tmp_path_factory.mktemp("tinker"))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    while not (lines and "http://" in lines[-1]):
        lines.append(proc.stdout.readline())
        assert lines[-1] or proc.poll() is None, "".join(lines)
    os.environ["TINKER_API_KEY"] = API_KEY
    yield re.search(r"http://\S+", lines[-1]).group(0)
    proc.terminate()
    proc.wait(timeout=30)


def toy_rows(n: int, offset: int = 0) -> list[dict]:
    rows = [json.loads(line) for line in (ROOT / "data" / "arith_train.jsonl").open()]
    return rows[offset:offset + n]


def prompt_of(tokenizer, row) -> list[int]:
    return tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)


# --- the loops, as the cookbook writes them -------------------------------------------------------------------

def sl_loop(service_client, steps: int = 5, batch_size: int = 4, lr: float = 3e-3) -> list[float]:
    """recipes/sl_loop.py: cross-entropy on prompt + answer, prompt weights 0, on the same few toy rows every step
    (a few steps of a tiny model then show learning); returns the mean NLL per step."""
    training_client = service_client.create_lora_training_client(base_model="tiny", rank=8).result()
    tokenizer = training_client.get_tokenizer()
    nlls = []
    for step in range(steps):
        batch = []
        for row in toy_rows(batch_size):
            prompt = prompt_of(tokenizer, row)
            answer = tokenizer.encode(f"#### {row['reward_model']['ground_truth']}", add_special_tokens=False)
            tokens = prompt + answer + [tokenizer.eos_token_id]
            weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(answer) + 1)
            batch.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                     loss_fn_inputs={"target_tokens": TensorData.from_torch(torch.tensor(tokens[1:])),
                                                     "weights": TensorData.from_torch(torch.tensor(weights))}))
        adam_params = tinker.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)
        fwd_bwd_future = training_client.forward_backward(batch, loss_fn="cross_entropy")
        optim_step_future = training_client.optim_step(adam_params)
        fwd_bwd_result = fwd_bwd_future.result()
        optim_result = optim_step_future.result()
        assert optim_result.metrics["grad_norm"] > 0
        logprobs = [x["logprobs"].to_torch() for x in fwd_bwd_result.loss_fn_outputs]
        weights = [d.loss_fn_inputs["weights"].to_torch() for d in batch]
        nll = -sum(lp.dot(w) for lp, w in zip(logprobs, weights)) / sum(w.sum() for w in weights)
        assert float(nll * sum(w.sum() for w in weights)) == pytest.approx(fwd_bwd_result.metrics["loss:sum"],
                                                                            rel=1e-4)
        nlls.append(float(nll))
    return nlls


def rl_loop(service_client, steps: int = 6, batch_size: int = 4, group_size: int = 8, lr: float = 3e-3) -> list:
    """recipes/rl_loop.py: GRPO-style centred rewards, importance_sampling, on the same few toy prompts every
    step (so that a few steps of a tiny model show learning); returns the mean sampled reward per step."""
    training_client = service_client.create_lora_training_client(base_model="tiny", rank=16).result()
    tokenizer = training_client.get_tokenizer()
    adam_params = types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)
    rows = toy_rows(batch_size)
    rewards_per_step = []
    for batch_idx in range(steps):
        sampling_client = training_client.save_weights_and_get_sampling_client().result()
        sampling_params = tinker.types.SamplingParams(max_tokens=5, temperature=1.0, seed=batch_idx)
        prompts_P = [types.ModelInput.from_ints(prompt_of(tokenizer, row)) for row in rows]
        futures_P = [sampling_client.sample(prompt=p, num_samples=group_size, sampling_params=sampling_params)
                     for p in prompts_P]
        datums_D, rewards_P = [], []
        for future, prompt, row in zip(futures_P, prompts_P, rows):
            sequences = future.result().sequences
            rewards_G = [gsm8k_reward(tokenizer.decode(s.tokens, skip_special_tokens=True),
                                      row["reward_model"]["ground_truth"]) for s in sequences]
            mean_reward = sum(rewards_G) / len(rewards_G)
            rewards_P.append(mean_reward)
            if all(r == mean_reward for r in rewards_G):
                continue
            for sequence, reward in zip(sequences, rewards_G):
                ob_len = prompt.length - 1
                model_input = prompt.append(types.EncodedTextChunk(tokens=sequence.tokens[:-1]))
                datums_D.append(types.Datum(model_input=model_input, loss_fn_inputs={
                    "target_tokens": TensorData.from_torch(torch.tensor([0] * ob_len + sequence.tokens)),
                    "logprobs": TensorData.from_torch(torch.tensor([0.0] * ob_len + sequence.logprobs)),
                    "advantages": TensorData.from_torch(torch.tensor(
                        [0.0] * ob_len + [reward - mean_reward] * (model_input.length - ob_len)))}))
        if datums_D:
            fwd_bwd_future = training_client.forward_backward(datums_D, loss_fn="importance_sampling")
            optim_step_future = training_client.optim_step(adam_params)
            fwd_bwd_future.result(), optim_step_future.result()
        rewards_per_step.append(sum(rewards_P) / len(rewards_P))
    return rewards_per_step


# --- the tests ------------------------------------------------------------------------------------------------

def test_sl_loop_over_http_learns_and_matches_the_in_process_loop(server):
    http = sl_loop(tinker.ServiceClient(base_url=server))
    assert http[-1] < 0.6 * http[0], http
    local = sl_loop(LocalServiceClient())                  # the same loop, the SDK's types, in this process
    assert local == pytest.approx(http, abs=1e-6)


def test_rl_loop_over_http_raises_the_reward_as_in_process(server):
    """Seeded sampling: a seeded call's samples depend on its seed only, so both paths see the same samples."""
    rewards = rl_loop(tinker.ServiceClient(base_url=server))
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.15, rewards
    assert rl_loop(LocalServiceClient()) == rewards


def test_save_state_then_resume_with_optimizer_over_http_is_bit_identical(server):
    service_client = tinker.ServiceClient(base_url=server)
    tc = service_client.create_lora_training_client(base_model="tiny", rank=8).result()
    tok = tc.get_tokenizer()
    tokens = prompt_of(tok, toy_rows(1)[0]) + tok.encode("#### 11", add_special_tokens=False)
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    adam = types.AdamParams(learning_rate=1e-3)

    def step(client) -> list[float]:
        fb = client.forward_backward([datum], "cross_entropy")
        client.optim_step(adam).result()
        return fb.result().loss_fn_outputs[0]["logprobs"].to_torch().tolist()

    step(tc)
    saved = tc.save_state("after-one").result()
    assert saved.path.startswith("tinker://")
    reference = [step(tc) for _ in range(2)]
    resumed = service_client.create_training_client_from_state_with_optimizer(saved.path).result()
    assert [step(resumed) for _ in range(2)] == reference                   # Adam's moments came back too
    fresh = service_client.create_training_client_from_state(saved.path).result()
    weights_only = [step(fresh) for _ in range(2)]
    assert weights_only[0] == reference[0] and weights_only[1] != reference[1]  # same weights, fresh Adam


def test_server_checks_the_api_key(server):
    request = urllib.request.Request(server + "/api/v1/healthz", headers={"X-API-Key": "tml-wrong"})
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(request, timeout=10)
    request = urllib.request.Request(server + "/api/v1/healthz", headers={"X-API-Key": API_KEY})
    assert json.loads(urllib.request.urlopen(request, timeout=10).read()) == {"status": "ok"}


def test_forward_backward_custom_and_a_sampler_from_a_saved_path_work_over_http(server):
    """Two SDK paths of the minimal loops' neighbours, over HTTP: `forward_backward_custom` (the SDK runs a
    forward, differentiates the user's loss locally, and sends its gradient back as cross-entropy weights) and
    `save_weights_for_sampler(name)` -> `create_sampling_client(model_path=)`, a sampler of those weights even
    after training goes on."""
    service_client = tinker.ServiceClient(base_url=server)
    tc = service_client.create_lora_training_client(base_model="tiny", rank=8).result()
    tok = tc.get_tokenizer()
    tokens = prompt_of(tok, toy_rows(1, offset=3)[0]) + tok.encode("#### 7", add_special_tokens=False)
    weights = [0.0] * 10 + [1.0] * (len(tokens) - 11)
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})

    def nll() -> float:
        out = tc.forward([datum], "cross_entropy").result()
        return -float((out.loss_fn_outputs[0]["logprobs"].to_torch() * torch.tensor(weights)).sum())

    def custom(data, logprobs):
        loss = -(logprobs[0] * torch.tensor(weights)).sum()
        return loss, {"custom_nll": float(loss)}

    before = nll()
    saved = tc.save_weights_for_sampler("before").result()
    result = tc.forward_backward_custom([datum], custom).result()
    assert result.metrics["custom_nll"] == pytest.approx(before, rel=1e-5)
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert nll() < before - 1e-3                                   # the custom loss's gradient was applied

    prompt = types.ModelInput.from_ints(tokens)
    old = service_client.create_sampling_client(model_path=saved.path).result()
    old_lp = old.compute_logprobs(prompt).result()
    now_lp = tc.save_weights_and_get_sampling_client().result().compute_logprobs(prompt).result()
    assert old_lp[1:] != pytest.approx(now_lp[1:], abs=1e-4)        # the saved sampler kept the old weights
    again = service_client.create_sampling_client(model_path=saved.path).result().compute_logprobs(
        prompt).result()
    assert again == old_lp

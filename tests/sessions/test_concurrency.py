"""Many clients at once, on both servers: every request gets what it would get alone.

The OpenAI endpoint (the `openai` client, K threads) and the Tinker server (the official SDK, K clients in
threads) each get a mix of requests: seeds, temperatures, top-p/top-k, stop strings, lengths, a prompt that
nearly fills the context, log-probs, LoRA creation with a seed, an RL step's temperature. Each request runs
alone first, one after another, then all of them at once; where the result is fixed (greedy, seeded, a seeded
adapter) the concurrent one must equal the lone one: the same tokens, finish reasons and usage, and log-probs
equal up to the float rounding of another batch shape (1e-4 of their scale). Unseeded samples are checked for
what holds of any sample. Nothing here depends on timing: each property holds for every interleaving.
Regression test for issue 32 (rows end at their stop, per-row budgets, per-request generators, the
temperature carried with the data, model creation under concurrency)."""
import concurrent.futures
import os
import re
import subprocess
import sys

import pytest
import torch

openai = pytest.importorskip("openai")
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.types.tensor_data import TensorData  # noqa: E402

from minirl.sessions import ServiceClient  # noqa: E402
from minirl.sessions.serve import serve  # noqa: E402

CONTEXT = 48                   # the served model's context: the long prompt leaves it 8 tokens
LONG = [272, 270, 223, 21, 13, 22, 33, 223] * 5            # 40 tokens
SHORT, OTHER = [272, 270, 223, 21, 13, 22, 33], [272, 33]


def at_once(fns: list) -> list:
    """Run every fn in its own thread, all started together; their results in order (errors re-raised)."""
    with concurrent.futures.ThreadPoolExecutor(len(fns)) as pool:
        return [f.result(timeout=300) for f in [pool.submit(fn) for fn in fns]]


def close(a: list[float], b: list[float]) -> bool:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool((a - b).abs().max() <= 1e-4 * max(1.0, float(b.abs().max())))


# --- the OpenAI endpoint ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, tiny_tokenizer):
    """A random-weights tiny model (its rows run to max_tokens: budgets show) with a context of 48 tokens."""
    from minirl.toy.tiny import build_model
    folder = tmp_path_factory.mktemp("random_model")
    build_model(len(tiny_tokenizer), seed=0, eos_id=tiny_tokenizer.eos_token_id,
                pad_id=tiny_tokenizer.pad_token_id).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    sampler = ServiceClient().create_sampling_client(str(folder)).result()
    sampler.model.config.max_position_embeddings = CONTEXT
    server = serve(sampler, tiny_tokenizer, "m", port=0, batch_window_s=0.05)
    yield openai.OpenAI(base_url=server.url, api_key="unused", timeout=300, max_retries=0)
    server.close()


REQUESTS = [  # (fixed: greedy or seeded, the /v1/completions body)
    (True, dict(prompt=SHORT, max_tokens=20, temperature=0, logprobs=2)),
    (True, dict(prompt=LONG, max_tokens=20, temperature=0, logprobs=0)),            # 8 tokens of room
    (True, dict(prompt=[SHORT, OTHER], max_tokens=12, temperature=0, stop=["4", "e"])),
    (True, dict(prompt=SHORT, max_tokens=10, temperature=1.2, seed=7, n=2, logprobs=1)),
    (True, dict(prompt=OTHER, max_tokens=10, temperature=0.8, top_p=0.9, top_k=20, seed=3, stop=["a"])),
    (True, dict(prompt=SHORT, max_tokens=3, temperature=0, echo=True, logprobs=1)),
    (True, dict(prompt=OTHER, max_tokens=16, temperature=0)),
    (False, dict(prompt=SHORT, max_tokens=10, temperature=1.0, stop=["4"])),
]


def _complete(client, body: dict) -> dict:
    extra = {"top_k": body["top_k"]} if "top_k" in body else None              # vLLM's field, not the client's
    out = client.completions.create(model="m", **{k: v for k, v in body.items() if k != "top_k"}, extra_body=extra)
    return {"choices": [(c.text, c.finish_reason, c.logprobs and c.logprobs.tokens,
                         c.logprobs and c.logprobs.token_logprobs[int(bool(body.get("echo"))):]) for c in out.choices],
            "usage": (out.usage.prompt_tokens, out.usage.completion_tokens)}


def test_concurrent_openai_requests_each_get_what_they_get_alone(endpoint):
    alone = [_complete(endpoint, body) for _, body in REQUESTS]
    together = at_once([lambda body=body: _complete(endpoint, body) for _, body in REQUESTS * 2])
    assert alone[1]["usage"] == (len(LONG), CONTEXT - len(LONG))       # the long prompt's own room
    assert alone[0]["usage"][1] == 20                                    # the short one's whole budget
    for i, got in enumerate(together):
        (fixed, body), want = REQUESTS[i % len(REQUESTS)], alone[i % len(REQUESTS)]
        if not fixed:  # an unseeded sample: what holds of any
            (text, finish, _, _), = got["choices"]
            assert (finish == "length") == (got["usage"][1] == body["max_tokens"]) and "4" not in text
            continue
        assert got["usage"] == want["usage"], (i, body)
        for (text, finish, tokens, logps), (text1, finish1, tokens1, logps1) in zip(got["choices"], want["choices"]):
            assert (text, finish, tokens) == (text1, finish1, tokens1), (i, body)
            assert logps is None or close([x for x in logps if x is not None], [x for x in logps1 if x is not None])


# --- the Tinker server, through the official SDK --------------------------------------------------------------

@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    cmd = [sys.executable, "-m", "minirl.sessions.server", "--base_model", "tiny", "--port", "0",
           "--checkpoint_dir", str(tmp_path_factory.mktemp("tinker"))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    while not (lines and "http://" in lines[-1]):
        lines.append(proc.stdout.readline())
        assert lines[-1] or proc.poll() is None, "".join(lines)
    os.environ.setdefault("TINKER_API_KEY", "tml-minirl-test")
    yield re.search(r"http://\S+", lines[-1]).group(0)
    proc.terminate()
    proc.wait(timeout=30)


def _prompt(i: int) -> list[int]:
    from minirl.models import load_tokenizer, resolve_model_path
    tok = load_tokenizer(resolve_model_path("tiny"))  # the SDK's sampler would load it by the name "tiny"
    return tok.apply_chat_template([{"role": "user", "content": f"What is {i}+{i + 2}?"}], tokenize=True,
                                   add_generation_prompt=True, return_dict=False)


def _sample(url: str, i: int, params: dict, n: int) -> list:
    """A client of its own: a sampler on the base model, one sample call."""
    sc = tinker.ServiceClient(base_url=url).create_sampling_client(base_model="tiny").result()
    res = sc.sample(prompt=types.ModelInput.from_ints(_prompt(i)), num_samples=n,
                    sampling_params=types.SamplingParams(**params)).result()
    return [(s.tokens, s.stop_reason, s.logprobs) for s in res.sequences]


def _lora_step(url: str, i: int) -> tuple[float, float]:
    """A client of its own: a LoRA client of seed 1, one cross-entropy step (lr 1e-2: the adapter's A matters
    for the step), the loss after it; then a sample at T=0.7 from its saved weights, scored by
    importance_sampling with no temperature given: ppo_kl is 0 only at the sampling temperature."""
    tc = tinker.ServiceClient(base_url=url).create_lora_training_client(base_model="tiny", rank=4, seed=1).result()
    tok = tc.get_tokenizer()
    prompt = _prompt(i)
    tokens = prompt + tok.encode(f"#### {2 * i + 2}", add_special_tokens=False) + [tok.eos_token_id]
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    loss = tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    sc = tc.save_weights_and_get_sampling_client().result()
    seqs = sc.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=2,
                     sampling_params=types.SamplingParams(max_tokens=6, temperature=0.7)).result().sequences
    data = [types.Datum(model_input=types.ModelInput.from_ints(prompt + s.tokens[:-1]), loss_fn_inputs={
        "target_tokens": TensorData.from_torch(torch.tensor([0] * (len(prompt) - 1) + s.tokens)),
        "logprobs": TensorData.from_torch(torch.tensor([0.0] * (len(prompt) - 1) + s.logprobs)),
        "advantages": TensorData.from_torch(torch.tensor([0.0] * (len(prompt) - 1) + [1.0] * len(s.tokens)))})
        for s in seqs]
    return loss, tc.forward(data, "importance_sampling").result().metrics["ppo_kl:mean"]


SAMPLES = [  # (params, num_samples): each greedy or seeded
    (dict(max_tokens=12, temperature=0.0, stop=["#"]), 1),
    (dict(max_tokens=12, temperature=1.0, seed=5), 3),
    (dict(max_tokens=2, temperature=0.0), 1),
    (dict(max_tokens=10, temperature=0.9, top_p=0.8, top_k=30, seed=9, stop=["3"]), 2),
]


def test_concurrent_sdk_clients_each_get_what_they_get_alone(tinker_server):
    jobs = [lambda i=i, p=p, n=n: _sample(tinker_server, i, p, n) for i, (p, n) in enumerate(SAMPLES)]
    jobs += [lambda i=i: _lora_step(tinker_server, i) for i in range(2)]
    alone = [job() for job in jobs]
    together = at_once(jobs)
    for i, (got, want) in enumerate(zip(together, alone)):
        if i >= len(SAMPLES):                                         # a LoRA client's step
            assert got[0] == pytest.approx(want[0], rel=1e-6) and abs(got[1]) < 1e-5, (got, want)
            continue
        assert [(t, r) for t, r, _ in got] == [(t, r) for t, r, _ in want], SAMPLES[i]
        assert all(close(lp, lp1) for (_, _, lp), (_, _, lp1) in zip(got, want))
    assert alone[0][0][1] == "stop" and alone[2][0][1] == "length" and len(alone[2][0][0]) == 2

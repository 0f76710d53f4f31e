"""The OpenAI-compatible endpoint (minirl/sessions/serve/), asked by the official `openai` client over 127.0.0.1:
chat and completions, log-probs against the trainer's log-prob path, seeds, stop strings, the usage chunk and
the refusal of every field the server does not honour. Batching and disconnects: test_serve_batching.py."""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import torch

from conftest import ROOT
from minirl.sessions.serve import serve
from minirl.logprobs import token_logprobs
from minirl.sessions import SamplingParams, ServiceClient

openai = pytest.importorskip("openai")
ASK = [{"role": "user", "content": "What is 3+4?"}]


@pytest.fixture(scope="module")
def live(tiny_path):
    """A server on a live training client's sampler (what a training run would expose). One intra-op thread:
    the server's threads and the session's share the model, and OpenMP threads spin against each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tc = ServiceClient().create_training_client(str(tiny_path))
    sc = tc.create_sampling_client()
    server = serve(sc, tc.get_tokenizer(), "tiny", port=0)
    client = openai.OpenAI(base_url=server.url, api_key="unused", timeout=120, max_retries=0)
    yield server, client, sc, tc.get_tokenizer()
    server.close()
    tc.stop()
    torch.set_num_threads(threads)


def test_models_lists_the_served_model(live):
    _, client, _, _ = live
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_completions_plain_and_streaming_agree_with_the_sampler(live):
    _, client, sc, tok = live
    out = client.chat.completions.create(model="tiny", messages=ASK, n=3, temperature=1.0, top_p=0.9, max_tokens=5)
    assert len(out.choices) == 3 and [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") and c.message.role == "assistant" for c in out.choices)
    assert 0 < out.usage.completion_tokens <= 15 and out.usage.prompt_tokens > 0
    # greedy: the endpoint's text is the session sampler's, plain and streamed
    prompt = tok.apply_chat_template(ASK, tokenize=True, add_generation_prompt=True, return_dict=False)
    seq = sc.sample(prompt, 1, SamplingParams(max_tokens=8, temperature=0)).result().sequences[0]
    expected = tok.decode(seq.tokens, skip_special_tokens=True)
    plain = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8)
    assert plain.choices[0].message.content == expected and expected
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert len([c for c in chunks if c.choices[0].delta.content]) > 1          # token by token, not one chunk
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


BAD = [({"temperature": -1}, "temperature"), ({"n": 0}, "n"), ({"max_tokens": 10**6}, "max_tokens"),
       ({"top_p": "high"}, "top_p"), ({"stop": [""]}, "stop"), ({"messages": []}, "messages"),
       ({"messages": [{"role": "user"}]}, "messages"), ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
       ({"top_logprobs": 2}, "top_logprobs"), ({"seed": "x"}, "seed"), ({"top_k": 1.5}, "top_k"),
       ({"do_sample": "yes"}, "do_sample"), ({"stream_options": {"include_usage": True}}, "stream_options"),
       ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages"),
       ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages")]
# fields the server does not honour: refused (at any value that would change the reply), never ignored
UNSUPPORTED = [("presence_penalty", 0.5), ("frequency_penalty", 1.0), ("repetition_penalty", 1.2),
               ("logit_bias", {"5": 10}), ("tools", [{"type": "function", "function": {"name": "f"}}]),
               ("tool_choice", "auto"), ("response_format", {"type": "json_object"}), ("min_p", 0.1),
               ("logprobs", 3), ("functions", [{"name": "f"}]), ("ignore_eos", True)]
UNSUPPORTED_COMPLETIONS = [("best_of", 2), ("suffix", "!"), ("echo", "yes"), ("logprobs", True),
                           ("messages", ASK), ("min_tokens", 3), ("prompt", [[10**6]]), ("prompt", [])]


def test_bad_requests_get_a_400_naming_the_field_and_the_server_keeps_serving(live):
    _, client, _, _ = live
    for bad, param in BAD:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, extra_body=bad)
        assert e.value.status_code == 400 and e.value.body["param"] == param, bad
        assert param in e.value.body["message"], bad
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2).choices  # still serving


def test_every_unsupported_field_gets_a_400_naming_it_and_no_op_values_are_accepted(live):
    _, client, _, _ = live
    cases = [(client.chat.completions.create, {"messages": ASK}, f, v) for f, v in UNSUPPORTED] + \
            [(client.completions.create, {"prompt": [[5, 6]]}, f, v) for f, v in UNSUPPORTED_COMPLETIONS]
    for create, base, field, value in cases:
        args = {"model": "tiny", "max_tokens": 2, **base}
        with pytest.raises(openai.BadRequestError) as e:
            create(**args, extra_body={field: value})
        assert e.value.body["param"] == field and field in e.value.body["message"], (field, value)
    ok = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, presence_penalty=0,
                                        frequency_penalty=0, logit_bias={}, user="u",
                                        extra_body={"repetition_penalty": 1.0, "top_k": -1})
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_malformed_json_and_unknown_model_are_json_errors(live):
    server, client, _, _ = live
    req = urllib.request.Request(server.url + "/chat/completions", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400 and "not valid JSON" in json.loads(e.value.read())["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)


def test_hostile_bodies_get_a_4xx_not_a_dropped_connection(live):
    """A negative or non-numeric Content-Length (which bypassed the size limit or dropped the connection) and
    non-finite numbers (json accepts NaN and Infinity) are 4xx JSON errors."""
    import http.client
    server = live[0]
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    cases = [({"Content-Length": "-1"}, b"{}"), ({"Content-Length": "abc"}, b"{}"),
             ({}, b'{"model": "m", "messages": [], "n": Infinity}'),
             ({}, b'{"model": "m", "messages": [], "max_tokens": NaN}')]
    for headers, body in cases:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.putrequest("POST", "/v1/chat/completions")
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(body)
        reply = conn.getresponse()
        assert 400 <= reply.status < 500 and "error" in json.loads(reply.read()), (headers, body)
        conn.close()


def test_command_line_server_answers(tiny_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "minirl.sessions.serve", "--model", str(tiny_path),
                             "--port", "0"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "serving DIR on http://127.0.0.1:PORT/v1" once the model is loaded
        assert line.startswith("serving"), proc.stderr.read() if proc.poll() is not None else line
        client = openai.OpenAI(base_url=line.split()[-1], api_key="unused", timeout=120, max_retries=0)
        out = client.chat.completions.create(model=str(tiny_path), messages=ASK, max_tokens=3)
        assert out.choices[0].finish_reason in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _prompt(tok) -> list[int]:
    return tok.apply_chat_template(ASK, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_completions_take_token_id_prompts_in_a_batch_and_answer_as_the_chat_endpoint(live):
    _, client, _, tok = live
    ids = _prompt(tok)
    chat = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8)
    out = client.completions.create(model="tiny", prompt=[ids, ids[:-3]], n=2, temperature=0, max_tokens=8)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]               # prompt-major: prompt i's n samples
    assert out.choices[0].text == out.choices[1].text == chat.choices[0].message.content
    assert out.usage.prompt_tokens == 2 * len(ids) - 3
    text = client.completions.create(model="tiny", prompt=tok.decode(ids), temperature=0, max_tokens=8)
    assert text.choices[0].text == chat.choices[0].message.content     # a string prompt, tokenized here


def test_echo_logprobs_are_the_training_log_prob_path_and_top_logprobs_hold_the_greedy_token(live):
    _, client, sc, tok = live
    ids = _prompt(tok)
    out = client.completions.create(model="tiny", prompt=[ids], max_tokens=4, echo=True, logprobs=3,
                                    temperature=0).choices[0]
    lp = out.logprobs
    generated = tok(lp.tokens[len(ids):], add_special_tokens=False).input_ids  # one token per piece
    seq = ids + [t for piece in generated for t in piece]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.token_logprobs) == len(seq)
    assert out.text.startswith(tok.decode(ids))
    x = torch.tensor([seq])
    ref, _ = token_logprobs(sc.model, x, torch.ones_like(x), len(seq) - 1)             # the trainer's pass
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), ref[0], atol=1e-5)
    for i in range(len(ids), len(seq)):  # greedy tokens: the most likely of their position, to the same number
        assert len(lp.top_logprobs[i]) <= 4 and max(lp.top_logprobs[i].values()) == lp.token_logprobs[i]
    # max_tokens 0 scores the prompt alone (lm-eval's loglikelihood); chat log-probs are the same numbers
    score = client.completions.create(model="tiny", prompt=[ids], max_tokens=0, echo=True, logprobs=0)
    scored = score.choices[0].logprobs.token_logprobs
    assert scored[0] is None and scored[1:] == pytest.approx(lp.token_logprobs[1:len(ids)], abs=1e-5)
    assert score.usage.completion_tokens == 0
    chat = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, temperature=0, logprobs=True,
                                          top_logprobs=2).choices[0].logprobs.content
    assert [e.logprob for e in chat] == pytest.approx(lp.token_logprobs[len(ids):], abs=1e-5)
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob for e in chat)


def test_a_seed_makes_sampling_reproducible_per_request(live):
    _, client, _, _ = live
    ask = lambda seed: [c.message.content for c in client.chat.completions.create(  # noqa: E731
        model="tiny", messages=ASK, n=6, temperature=1.0, max_tokens=6, seed=seed).choices]
    first = ask(7)
    client.chat.completions.create(model="tiny", messages=ASK, n=3, temperature=1.0, max_tokens=6)  # unseeded
    assert ask(7) == first
    assert any(ask(seed) != first for seed in (8, 9, 10))


def test_stop_strings_end_generation_at_the_token_that_completes_one(live):
    _, client, sc, _ = live
    calls = []
    hook = sc.model.get_decoder().register_forward_hook(lambda *a: calls.append(1))
    try:
        full = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8)
        steps_full, calls[:] = len(calls), []
        text = full.choices[0].message.content              # "#### 7": a stop at " " ends it after "####"
        cut = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8, stop=[" "])
    finally:
        hook.remove()
    assert cut.choices[0].message.content == text[:text.index(" ")] and cut.choices[0].finish_reason == "stop"
    # + 1: rollout's decode loop prefills the prompts (all but their last token) in a decoder call of its own
    assert len(calls) == cut.usage.completion_tokens + 1 == 3 < steps_full == full.usage.completion_tokens + 1


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streams_end_with_a_usage_chunk_when_include_usage_is_asked(live, endpoint):
    _, client, _, tok = live
    args = {"model": "tiny", "temperature": 0, "max_tokens": 6}
    create = (lambda **kw: client.chat.completions.create(messages=ASK, **args, **kw)) if endpoint == "chat" \
        else (lambda **kw: client.completions.create(prompt=[_prompt(tok)], **args, **kw))
    plain = create()
    chunks = list(create(stream=True, stream_options={"include_usage": True}, logprobs=True if endpoint == "chat"
                         else 1))
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == plain.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])
    pieces = [c.choices[0].delta.content if endpoint == "chat" else c.choices[0].text for c in chunks[:-1]]
    expected = plain.choices[0].message.content if endpoint == "chat" else plain.choices[0].text
    assert "".join(p or "" for p in pieces) == expected
    lps = [c.choices[0].logprobs for c in chunks[:-1] if c.choices[0].logprobs]
    n = sum(len(x.content) if endpoint == "chat" else len(x.token_logprobs) for x in lps)
    assert n == plain.usage.completion_tokens                            # every token's log-prob, once
    assert all(c.usage is None for c in create(stream=True))            # no usage chunk unless asked

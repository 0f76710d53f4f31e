"""The OpenAI-compatible endpoint (minirl/sessions/serve.py), asked by the official `openai` client over 127.0.0.1."""
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
    # stop strings cut the text before the first match, with finish_reason "stop"
    stop = expected[-1]
    cut = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8, stop=[stop])
    assert cut.choices[0].message.content == expected[:expected.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


BAD = [({"temperature": -1}, "temperature"), ({"n": 0}, "n"), ({"max_tokens": 10**6}, "max_tokens"),
       ({"top_p": "high"}, "top_p"), ({"stop": [""]}, "stop"), ({"messages": []}, "messages"),
       ({"messages": [{"role": "user"}]}, "messages")]


def test_bad_requests_get_a_400_naming_the_field_and_the_server_keeps_serving(live):
    _, client, _, _ = live
    for bad, param in BAD:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**{"model": "tiny", "messages": ASK, "max_tokens": 2, **bad})
        assert e.value.status_code == 400 and e.value.body["param"] == param, bad
        assert param in e.value.body["message"], bad
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2).choices  # still serving


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
    proc = subprocess.Popen([sys.executable, "-m", "minirl.sessions.serve", "--model", str(tiny_path), "--port", "0"],
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

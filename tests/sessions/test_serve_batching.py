"""The server's engine under concurrency: concurrent requests share one generate, a seeded request is the same
alone or among others, and a client that hangs up frees the server at once. On a random-weights model, whose
greedy continuations run to max_tokens (no early EOS), so step counts are exact."""
import http.client
import json
import threading

import pytest
import torch

from minirl.sessions import ServiceClient
from minirl.sessions.serve import serve

openai = pytest.importorskip("openai")
ASK = [{"role": "user", "content": "What is 3+4?"}]


@pytest.fixture(scope="module")
def random_sampler(tmp_path_factory, tiny_tokenizer):
    from minirl.toy.tiny import build_model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("random_model")
    build_model(len(tiny_tokenizer), seed=0, eos_id=tiny_tokenizer.eos_token_id,
                pad_id=tiny_tokenizer.pad_token_id).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    yield ServiceClient().create_sampling_client(str(folder))
    torch.set_num_threads(threads)


class DecoderCalls:
    """Counts the decoder's forward calls (one per generate step for the whole batch); `started` is set at the
    first."""

    def __init__(self, model):
        self.count, self.started = 0, threading.Event()
        self._handle = model.get_decoder().register_forward_hook(self._hook)

    def _hook(self, *args):
        self.count += 1
        self.started.set()

    def remove(self):
        self._handle.remove()


def _concurrently(fns: list) -> list:
    results = [None] * len(fns)
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fns[i]())) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def test_four_concurrent_requests_run_as_one_generate_of_one_decoder_call_per_step(random_sampler):
    # a long window, ended by the 4th request's rows filling max_batch_rows: the batch cannot depend on timing
    server = serve(random_sampler, random_sampler.tokenizer, "m", port=0, batch_window_s=60, max_batch_rows=4)
    client = openai.OpenAI(base_url=server.url, api_key="unused", timeout=120, max_retries=0)
    from minirl.engines import decode
    decode.check_model(random_sampler.model)  # the decode loop's one-time check at load, before counting
    calls = DecoderCalls(random_sampler.model)
    try:
        asks = [lambda i=i: client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"What is {i}+{i}?"}], temperature=0, max_tokens=8)
            for i in range(4)]
        outs = _concurrently(asks)
    finally:
        calls.remove()
        server.close()
    assert [o.usage.completion_tokens for o in outs] == [8, 8, 8, 8]
    # one generate: the shared prefill, then 8 steps for all 4 requests (one after another: 4 x 9 = 36)
    assert calls.count == 1 + 8


def test_a_seeded_request_samples_the_same_alone_and_among_concurrent_requests(random_sampler):
    """Two requests with the same parameters and seed would share a generate, whose noise depends on both."""
    server = serve(random_sampler, random_sampler.tokenizer, "m", port=0, batch_window_s=60, max_batch_rows=2)
    client = openai.OpenAI(base_url=server.url, api_key="unused", timeout=120, max_retries=0)
    ask = lambda q: [c.message.content for c in client.chat.completions.create(  # noqa: E731
        model="m", messages=[{"role": "user", "content": q}], n=2, temperature=1.0, max_tokens=6, seed=5).choices]
    try:
        alone = [ask("What is 3+4?"), ask("What is 5+5?")]   # each one's 2 rows fill the batch
        server.engine.max_batch_rows = 4                      # both requests' rows now do
        together = _concurrently([lambda: ask("What is 3+4?"), lambda: ask("What is 5+5?")])
    finally:
        server.close()
    assert together == alone


def test_a_client_that_hangs_up_mid_request_frees_the_server_at_once(random_sampler):
    server = serve(random_sampler, random_sampler.tokenizer, "m", port=0, batch_window_s=0)
    client = openai.OpenAI(base_url=server.url, api_key="unused", timeout=120, max_retries=0)
    ids = random_sampler.tokenizer.apply_chat_template(ASK, tokenize=True, add_generation_prompt=True,
                                                       return_dict=False)
    long = 512 - len(ids)  # the whole context: ~500 steps if computed to the end
    try:
        assert client.completions.create(model="m", prompt=[ids], temperature=0, max_tokens=60
                                         ).choices[0].finish_reason == "length"  # no EOS to end it early
        calls = DecoderCalls(random_sampler.model)
        conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "m", "prompt": [ids], "temperature": 0, "max_tokens": long}),
            {"Content-Type": "application/json"})
        assert calls.started.wait(60)       # generating
        conn.close()                        # the client gives up
        after = client.completions.create(model="m", prompt=[ids], temperature=0, max_tokens=2)
        calls.remove()
    finally:
        server.close()
    assert after.usage.completion_tokens == 2
    assert calls.count < long / 2           # the dropped request stopped long before its end, then ours ran


def test_scores_and_top_logprobs_are_the_models_own_log_softmax_with_its_final_logit_transform():
    """Gemma 2 soft-caps its logits after the LM head: the top tokens must see the capped logits too."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    from minirl.sessions.serve import score
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=2.0,
                          attn_implementation="eager")
    model = Gemma2ForCausalLM(config).eval()
    prefixes, targets = [[5, 9, 11], [7]], [[3, 4, 8, 1], [2, 2]]
    logp, top = score(model, prefixes, targets, top=3)
    for p, t, lp, tp in zip(prefixes, targets, logp, top):
        ids = torch.tensor([p + t])
        with torch.no_grad():
            ref = torch.log_softmax(model(ids).logits[0, len(p) - 1:-1].float(), dim=-1)        # (R, V)
        assert torch.allclose(torch.tensor(lp), ref.gather(-1, torch.tensor(t)[:, None])[:, 0], atol=1e-5)
        values, tokens = ref.topk(3, dim=-1)
        assert [[tok for tok, _ in pos] for pos in tp] == tokens.tolist()
        assert torch.allclose(torch.tensor([[v for _, v in pos] for pos in tp]), values, atol=1e-5)

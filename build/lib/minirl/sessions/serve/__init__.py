"""An OpenAI-compatible endpoint on a sampler of the sessions API: /v1/completions, /v1/chat/completions and
/v1/models, enough for evaluation harnesses (lm-evaluation-harness's local-completions and
local-chat-completions: generate_until and loglikelihood tasks) and for agents built on the OpenAI client.

    python -m minirl.sessions.serve --model DIR [--host 127.0.0.1] [--port 8000]     # saved weights (or "tiny")
    server = serve(tc.create_sampling_client(), tc.get_tokenizer())          # the live policy of a training run

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="DIR", prompt=[[12, 7, 99]], max_tokens=0, echo=True, logprobs=1)
    client.chat.completions.create(model="DIR", messages=[...], n=2, temperature=0.7, seed=1, stop=["\\n\\n"],
                                   logprobs=True, top_logprobs=5, stream=True,
                                   stream_options={"include_usage": True})

Read in this order: openai_api.py (request fields in, JSON out), engine.py (batching, generate, log-probs),
server.py (HTTP, disconnects, the command line).

What happens to a request: its fields are checked (each honoured or refused with a 400 naming it); it waits a
short window for others whose sampling parameters agree, and they run as one `rollout.sample` (the trainer's
sampler; stop strings end generation at the token that completes one); if it asks for log-probs, one
teacher-forced pass of the trainer's log-prob path (logprobs.py) scores prompt (with echo) and completion;
a request whose client hung up is dropped.

Left out: tool calls, penalties (refused unless at their no-op value), best_of, suffix, streaming during
generation (a stream sends the finished completion piece by piece: OpenAI's chunks, after generation, not
during it), a running generate shrinking when one of its clients leaves (it ends when all of them have).
"""
from minirl.sessions.serve.engine import Engine, Job, Output, Sampling, score
from minirl.sessions.serve.openai_api import RequestError, parse_request
from minirl.sessions.serve.server import Server, main, serve

__all__ = ["Engine", "Job", "Output", "Sampling", "score", "RequestError", "parse_request", "Server", "main",
           "serve"]

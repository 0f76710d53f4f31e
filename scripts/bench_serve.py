"""Throughput of the OpenAI-compatible server under concurrent clients: C client threads, each sending K chat
requests one after another (greedy, max_tokens M), against a server on a saved model.

    HF_HUB_OFFLINE=1 python scripts/bench_serve.py --model smollm2-135m --clients 4 --requests 4 --max_tokens 32

Prints requests/s and completion tokens/s over the whole run, and the process's CPU time per request (less
sensitive than wall time to other work on a shared machine). It uses only the chat endpoint and `serve`, so
the same script measures an older checkout (PYTHONPATH=that checkout) for a before/after comparison.
"""
from __future__ import annotations

import argparse
import threading
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4, help="per client, one after another")
    ap.add_argument("--max_tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import openai

    import minirl
    from minirl.sessions import ServiceClient
    from minirl.sessions.serve import serve
    sampler = ServiceClient().create_sampling_client(args.model)
    server = serve(sampler, sampler.tokenizer, "m", port=0)
    client = openai.OpenAI(base_url=server.url, api_key="unused", timeout=600, max_retries=0)
    tokens = [0] * args.clients

    def run(c: int) -> None:
        for k in range(args.requests):
            ask = [{"role": "user", "content": f"What is {c}+{k}? Explain step by step."}]
            out = client.chat.completions.create(model="m", messages=ask, temperature=0,
                                                 max_tokens=args.max_tokens)
            tokens[c] += out.usage.completion_tokens

    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)  # warm
    threads = [threading.Thread(target=run, args=(c,)) for c in range(args.clients)]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    server.close()
    n = args.clients * args.requests
    print(f"{minirl.__file__}: {args.clients} clients x {args.requests} requests, {sum(tokens)} tokens in "
          f"{seconds:.1f} s: {n / seconds:.2f} requests/s, {sum(tokens) / seconds:.1f} tokens/s, "
          f"{cpu / n * 1000:.0f} CPU ms/request")


if __name__ == "__main__":
    main()

"""Load on both servers: requests per second and p50/p99 latency for 1, 4, 16 and 64 concurrent clients, with
the server process's peak thread count and peak memory, and the failed requests (there should be none).

    HF_HUB_OFFLINE=1 python scripts/bench_load.py --model tiny --requests 4 --max_tokens 16

Each server runs as its own process, as a user starts it: `python -m minirl.sessions.serve` (the OpenAI
endpoint, driven by the `openai` client: chat completions) and `python -m minirl.sessions.server` (the Tinker
server, driven by the official SDK: one sampling client shared by the client threads, `sample` calls). C client
threads each send `--requests` requests one after another; a request's latency is from its send to its
answer. Requests mix what clients send: greedy, and sampled at T=0.8 with a per-request seed every other one
(a seeded request runs in a generate of its own, so seeds cost batching). Threads and memory are read from
/proc/<pid>/status while the load runs (Linux). Wall times on a shared CPU vary from run to run; this is a
benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import threading
import time


def start(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """Start a server process; wait for the line that names its URL."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_API_KEY": os.environ.get("TINKER_API_KEY", "tml-bench")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    while not (lines and "http://" in lines[-1]):
        lines.append(proc.stdout.readline())
        if not lines[-1] and proc.poll() is not None:
            raise RuntimeError("".join(lines))
    threading.Thread(target=proc.stdout.read, daemon=True).start()     # drain: a full pipe would block it
    return proc, re.search(r"http://\S+", lines[-1]).group(0)


class Watch:
    """Peak threads and peak resident memory (VmHWM) of a process, sampled every 0.1 s."""

    def __init__(self, pid: int):
        self.pid, self.threads, self.rss_mb, self._stop = pid, 0, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            status = open(f"/proc/{self.pid}/status").read()
            self.threads = max(self.threads, int(re.search(r"Threads:\s+(\d+)", status).group(1)))
            self.rss_mb = max(self.rss_mb, int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def load(call, clients: int, requests: int) -> dict:
    """`clients` threads, each calling call(client, k) for k < requests one after another."""
    latencies, errors = [], []

    def one_client(c: int) -> None:
        for k in range(requests):
            t0 = time.perf_counter()
            try:
                call(c, k)
                latencies.append(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001  (counted and reported, not raised)
                errors.append(f"{type(e).__name__}: {e}")
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(one_client, range(clients)))
    wall = time.perf_counter() - t0
    ranked = sorted(latencies) or [float("nan")]
    pick = lambda q: ranked[min(len(ranked) - 1, int(q * len(ranked)))]  # noqa: E731
    return {"rps": len(latencies) / wall, "p50": pick(0.50), "p99": pick(0.99), "errors": errors}


def openai_call(url: str, max_tokens: int):
    import openai
    client = openai.OpenAI(base_url=url, api_key="unused", timeout=600, max_retries=0)

    def call(c: int, k: int) -> None:
        seeded = dict(temperature=0.8, seed=1000 * c + k) if (c + k) % 2 else dict(temperature=0)
        client.chat.completions.create(model="tiny", max_tokens=max_tokens, **seeded,
                                       messages=[{"role": "user", "content": f"What is {c % 10}+{k % 10}?"}])
    return call


def tinker_call(url: str, max_tokens: int):
    import tinker
    from tinker import types

    from minirl.models import load_tokenizer, resolve_model_path
    tok = load_tokenizer(resolve_model_path("tiny"))
    sampler = tinker.ServiceClient(base_url=url).create_sampling_client(base_model="tiny").result()

    def call(c: int, k: int) -> None:
        prompt = tok.apply_chat_template([{"role": "user", "content": f"What is {c % 10}+{k % 10}?"}],
                                         tokenize=True, add_generation_prompt=True, return_dict=False)
        seeded = dict(temperature=0.8, seed=1000 * c + k) if (c + k) % 2 else dict(temperature=0.0)
        sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=max_tokens, **seeded)).result()
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=4, help="per client, one after another")
    ap.add_argument("--max_tokens", type=int, default=16)
    ap.add_argument("--servers", default="serve,sessions", help="which: serve (OpenAI), sessions (Tinker)")
    args = ap.parse_args()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")     # the SDK insists on one; the server checks none
    servers = {
        "OpenAI endpoint (openai client)": ([sys.executable, "-m", "minirl.sessions.serve", "--model", args.model,
                                             "--port", "0"], openai_call),
        "Tinker server (official SDK)": ([sys.executable, "-m", "minirl.sessions.server", "--base_model",
                                          args.model, "--port", "0"], tinker_call),
    }
    print("| server | clients | requests | requests/s | p50 s | p99 s | errors | peak threads | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (cmd, make_call) in servers.items():
        if cmd[2].rsplit(".", 1)[1].replace("server", "sessions") not in args.servers.split(","):
            continue
        proc, url = start(cmd)
        try:
            call = make_call(url, args.max_tokens)     # the endpoint's URL ends in /v1, the Tinker server's not
            load(call, 2, 1)                                   # warm-up: first-call costs out of the numbers
            for clients in map(int, args.clients.split(",")):
                watch = Watch(proc.pid)
                r = load(call, clients, args.requests)
                watch.stop()
                print(f"| {name} | {clients} | {clients * args.requests} | {r['rps']:.1f} | {r['p50']:.2f} | "
                      f"{r['p99']:.2f} | {len(r['errors'])} | {watch.threads} | {watch.rss_mb:.0f} |", flush=True)
                for e in r["errors"][:3]:
                    print("   error:", e[:300], flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()

"""The vLLM side of minirl's optional rollout engine: one vLLM model behind a small HTTP API on loopback.

Runs in its own environment (`make vllm` builds .venv-vllm), because vLLM pins its own transformers; it imports
vLLM and the standard library only, never minirl. The trainer starts it (minirl/engines/vllm_engine.py) with

    .venv-vllm/bin/python minirl/engines/vllm_server.py --model PATH [--port 0] [--max-model-len 2048]

and reads the line `minirl-vllm listening on PORT` from its stdout. The API, JSON over HTTP on 127.0.0.1:
- POST /generate {"prompts": [[token ids]], "n", "max_tokens": [one per prompt, or one for all], "temperature",
  "top_p", "top_k", "seeds": [one per prompt], "stop": [strings], "stop_token_ids": [ids]}
  -> {"completions": [[n lists of token ids]]}.
  Token ids in and out: the trainer tokenizes and decodes, so both sides agree on every token.
- POST /load_weights {"path": folder of *.safetensors} -> {"seconds"}: the weights are reloaded in place
  (vLLM's reload_weights, which also repacks the CPU backend's linear layers) and the prefix cache is dropped,
  since it holds keys and values of the old weights.
- GET /health -> {"ok": true}.
It leaves out batching across clients and streaming: one request at a time, as one trainer step needs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


def build_engine(model: str, max_model_len: int, seed: int):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")          # GiB of KV cache: the machine is shared
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: one less on 2 cores
    from vllm import LLM
    # no chunked prefill: vLLM-CPU rewinds a seeded request's generator after a partial prefill, which CPU
    # generators cannot do ("CPU Generator does not use offset"); so each prompt is prefilled in one step
    return LLM(model=model, dtype="float32", max_model_len=max_model_len, seed=seed, enable_prefix_caching=True,
               enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 16384))


def generate(llm, request: dict) -> dict:
    from vllm import SamplingParams, TokensPrompt
    n, greedy = request["n"], request.get("temperature", 1.0) == 0.0
    stop = request.get("stop") or None

    budgets = request["max_tokens"]      # each prompt's own room in the context (rollout.row_budgets)
    budgets = budgets if isinstance(budgets, list) else [budgets] * len(request["prompts"])

    def params(seed, children, max_tokens):
        return SamplingParams(n=children, max_tokens=max_tokens,
                              temperature=request.get("temperature", 1.0), top_p=request.get("top_p", 1.0),
                              top_k=request.get("top_k", 0) or -1, seed=None if greedy else seed, stop=stop,
                              include_stop_str_in_output=True,
                              stop_token_ids=request.get("stop_token_ids") or None,
                              detokenize=stop is not None)   # stop strings are matched on the text

    # vLLM samples child i of a request with seed + i; greedy decoding takes one child per request (n copies)
    copies, children = (n, 1) if greedy else (1, n)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"] for _ in range(copies)]
    sampling = [params(seed, children, budget) for seed, budget in zip(request["seeds"], budgets)
                for _ in range(copies)]
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    rows = [list(c.token_ids) for out in outputs for c in out.outputs]
    return {"completions": [rows[i * n:(i + 1) * n] for i in range(len(request["prompts"]))]}


def load_weights(llm, request: dict) -> dict:
    start = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": request["path"]})
    llm.reset_prefix_cache()
    return {"seconds": time.perf_counter() - start}


def make_handler(llm):
    routes = {"/generate": generate, "/load_weights": load_weights}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply(200, {"ok": True}) if self.path == "/health" else self._reply(404, {"error": self.path})

        def do_POST(self):
            if self.path not in routes:
                return self._reply(404, {"error": self.path})
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                self._reply(200, routes[self.path](llm, request))
            except Exception as e:  # the trainer raises it with the engine's message
                self._reply(500, {"error": f"{type(e).__name__}: {e}"})

        def log_message(self, *args):  # one line per request would drown the trainer's output
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    llm = build_engine(args.model, args.max_model_len, args.seed)
    server = HTTPServer(("127.0.0.1", args.port), make_handler(llm))
    print(f"minirl-vllm listening on {server.server_port}", flush=True)
    try:
        server.serve_forever()
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    main()

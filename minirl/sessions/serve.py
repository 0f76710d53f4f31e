"""An OpenAI-compatible endpoint on a sampler of the sessions API: /v1/chat/completions and /v1/models.

    python -m minirl.sessions.serve --model DIR [--host 127.0.0.1] [--port 8000]     # saved weights (or "tiny")
    server = serve(tc.create_sampling_client(), tc.get_tokenizer())          # the live policy of a training run

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.chat.completions.create(model="DIR", messages=[...], n=2, temperature=0.7, top_p=0.9, max_tokens=64,
                                   stop=["\\n\\n"], stream=True)

Each request becomes one `SamplingClient.sample` call on the chat-templated prompt (rollout.sample underneath,
the same sampler the trainer uses); from a live training client, requests run in that client's queue between
its operations, on the current weights. Requests are checked field by field: a bad one gets a 400 with an
OpenAI-style JSON error naming the field, and the server keeps serving.

Why the standard library (http.server, one thread per request) and not FastAPI + uvicorn: two endpoints, JSON
in and out, and Server-Sent Events are a few lines each; the model runs one batch at a time anyway (the
session's worker), so an async server would buy nothing here and add three dependencies.

Left out: tool calls, logprobs, penalties, seeds, the legacy /v1/completions. `stop` strings are applied to the
finished text (generation runs to EOS or max_tokens, then the text is cut at the first stop string), and a
stream sends the finished completion token by token: the chunks are OpenAI's, but they arrive after
generation, not during it.
"""
from __future__ import annotations

import argparse
import json
import math
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from minirl.sessions.types import SamplingParams

MAX_BODY_BYTES = 1 << 20
MAX_N = 16


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def _number(body: dict, name: str, default, lo: float, hi: float, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (kind is int and value != int(value)):
        raise RequestError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    if not lo <= value <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {value}", name)
    return kind(value)


def parse_request(body: dict, model_name: str, max_tokens_limit: int) -> dict:
    """The sampling request in a chat-completions body, or RequestError naming the bad field."""
    if body.get("model") not in (None, model_name):
        raise RequestError(f"model {body['model']!r} does not exist; this server serves {model_name!r}", "model", 404)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    chat = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role' and text 'content'", "messages")
        chat.append({"role": m["role"], "content": content})
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {"messages": chat, "stop": stop, "stream": bool(body.get("stream", False)),
            "n": _number(body, "n", 1, 1, MAX_N, int),
            "params": SamplingParams(
                max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", min(256, max_tokens_limit), 1,
                                   max_tokens_limit, int),
                temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                top_p=_number(body, "top_p", 1.0, 1e-6, 1.0))}


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """The text before the first stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


class Server:
    """A ThreadingHTTPServer answering the OpenAI chat API from `sampler` (a session SamplingClient)."""

    def __init__(self, sampler, tokenizer, model_name: str = "minirl", host: str = "127.0.0.1", port: int = 8000,
                 max_tokens_limit: int = 2048):
        self.sampler, self.tokenizer, self.model_name = sampler, tokenizer, model_name
        self.max_tokens_limit = max_tokens_limit
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="minirl-serve")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "Server":
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def complete(self, req: dict) -> tuple[list[dict], dict]:
        """Sample n completions: (choices as [{text, tokens, finish_reason}], usage)."""
        prompt = self.tokenizer.apply_chat_template(req["messages"], tokenize=False, add_generation_prompt=True)
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        seqs = self.sampler.sample(prompt_ids, req["n"], req["params"]).result().sequences
        choices = []
        for s in seqs:
            text, stopped = cut_at_stop(self.tokenizer.decode(s.tokens, skip_special_tokens=True), req["stop"])
            reason = "stop" if stopped or s.stop_reason == "stop" else "length"
            choices.append({"text": text, "tokens": s.tokens, "finish_reason": reason})
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": sum(len(s.tokens) for s in seqs)}
        return choices, {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def _handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # seconds a connection may stall (e.g. a body never sent) before its thread is freed

        def log_message(self, *args):  # quiet: one line per request on stderr is noise in a training log
            pass

        def send_json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def send_error_json(self, status: int, message: str, param: str | None = None) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self.send_json(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": server.model_name, "object": "model", "created": 0, "owned_by": "minirl"}]})
            else:
                self.send_error_json(404, f"no route GET {self.path}; try /v1/models or POST /v1/chat/completions")

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self.send_error_json(404, f"no route POST {self.path}; try /v1/chat/completions")
            try:
                length = self.headers.get("Content-Length") or "0"
                if not length.isdigit():
                    raise RequestError(f"Content-Length must be a byte count, got {length!r}")
                length = int(length)
                if length > MAX_BODY_BYTES:
                    raise RequestError(f"request body over {MAX_BODY_BYTES} bytes", None, 413)
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise RequestError(f"the body is not valid JSON ({e})") from None
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                req = parse_request(body, server.model_name, server.max_tokens_limit)
            except RequestError as e:
                return self.send_error_json(e.status, str(e), e.param)
            try:
                choices, usage = server.complete(req)
            except Exception as e:  # noqa: BLE001  (a failed generate is the server's fault: 500, keep serving)
                return self.send_error_json(500, f"{type(e).__name__}: {e}")
            head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.model_name}
            if req["stream"]:
                self.stream(head, choices)
            else:
                self.send_json(200, {**head, "object": "chat.completion", "usage": usage, "choices": [
                    {"index": i, "message": {"role": "assistant", "content": c["text"]},
                     "finish_reason": c["finish_reason"], "logprobs": None} for i, c in enumerate(choices)]})

        def stream(self, head: dict, choices: list[dict]) -> None:
            """Server-Sent Events: a role chunk, then the text token by token, then finish_reason, then [DONE]."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()

            def event(i: int, delta: dict, finish: str | None = None) -> None:
                chunk = {**head, "object": "chat.completion.chunk",
                         "choices": [{"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())

            for i, c in enumerate(choices):
                event(i, {"role": "assistant", "content": ""})
                sent = ""
                for t in range(1, len(c["tokens"]) + 1):  # decode growing prefixes: multi-byte characters stay whole
                    text = server.tokenizer.decode(c["tokens"][:t], skip_special_tokens=True)[:len(c["text"])]
                    if len(text) > len(sent) and not text.endswith("\ufffd"):
                        event(i, {"content": text[len(sent):]})
                        sent = text
                event(i, {}, c["finish_reason"])
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def serve(sampler, tokenizer, model_name: str = "minirl", host: str = "127.0.0.1", port: int = 8000,
          max_tokens_limit: int = 2048) -> Server:
    """Start serving in a background thread (port 0: any free port; see .url). Call .close() to stop."""
    return Server(sampler, tokenizer, model_name, host, port, max_tokens_limit).start()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible chat endpoint for a saved model.")
    ap.add_argument("--model", required=True, help="a model folder (save_weights_for_sampler's, a base model) or tiny")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max_tokens_limit", type=int, default=2048, help="the largest max_tokens a request may ask")
    args = ap.parse_args(argv)
    from minirl.sessions import ServiceClient
    sampler = ServiceClient().create_sampling_client(args.model)
    server = Server(sampler, sampler.tokenizer, args.model, args.host, args.port, args.max_tokens_limit)
    print(f"serving {args.model} on {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()

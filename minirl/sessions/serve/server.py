"""The HTTP side: a ThreadingHTTPServer whose handler threads parse a request (openai_api.py), hand it to the
engine (engine.py) and wait for it, watching the client's socket: a client that hangs up (a harness's timeout)
cancels its request, which is then dropped instead of computed for nobody.

Why the standard library (http.server, one thread per connection) and not FastAPI + uvicorn: three endpoints,
JSON in and out, and Server-Sent Events are a few lines each; the model runs one batch at a time anyway, so an
async server would buy nothing and add three dependencies.
"""
from __future__ import annotations

import argparse
import json
import select
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler

from minirl.httpd import BackgroundServer
from minirl.sessions.serve.engine import Engine, Job
from minirl.sessions.serve.openai_api import RequestError, parse_request, reply, stream_chunks

MAX_BODY_BYTES = 16 << 20   # a batch of 64 long token-id prompts is a few MB of JSON
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
POLL_S = 0.05               # how often a waiting handler checks whether its client is still there


class Server(BackgroundServer):
    """Serves the OpenAI API from a session `SamplingClient` (its model, on its worker thread, so requests
    run between a live training client's operations, on the current weights)."""

    def __init__(self, sampler, tokenizer, model_name: str = "minirl", host: str = "127.0.0.1", port: int = 8000,
                 max_tokens_limit: int = 2048, batch_window_s: float = 0.02, max_batch_rows: int = 64):
        self.tokenizer, self.model_name, self.max_tokens_limit = tokenizer, model_name, max_tokens_limit
        while "model" not in vars(sampler) and callable(getattr(type(sampler), "result", None)):
            sampler = sampler.result()  # the future of a client (the sessions API's create_* may return one)
        self.model = sampler.model
        self.engine = Engine(self.model, tokenizer, _worker_runner(sampler), getattr(sampler, "_adapter", None),
                             batch_window_s, max_batch_rows, getattr(sampler, "micro_batch_size", 16))
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.context = getattr(self.model.config, "max_position_embeddings", None)
        super().__init__(_handler(self), host, port, "minirl-serve")

    url_path = "/v1"

    def close(self) -> None:
        super().close()
        self.engine.close()


def _worker_runner(sampler):
    """Run a function in the sampler's session queue (in order with its training client's operations)."""
    worker = getattr(sampler, "_worker", None)
    if worker is None:
        return None
    return lambda fn: worker.submit("serve", fn).result()


def _client_gone(sock: socket.socket) -> bool:
    """Whether the peer closed its end: the socket reads as ready, yet holds no byte."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # seconds a connection may stall (e.g. a body never sent) before its thread is freed
        protocol_version = "HTTP/1.1"  # keep-alive: lm-eval and the openai client reuse connections

        def log_message(self, *args):  # quiet: one line per request on stderr is noise in a training log
            pass

        def send_json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
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
                self.send_error_json(404, f"no route GET {self.path}; try /v1/models")

        def do_POST(self):
            kind = ROUTES.get(self.path.rstrip("/"))
            if kind is None:
                self.close_connection = True
                return self.send_error_json(404, f"no route POST {self.path}; try {' or '.join(ROUTES)}")
            try:
                req = parse_request(kind, self.read_body(), server.tokenizer, server.model_name,
                                    server.max_tokens_limit, server.vocab_size, server.context)
            except RequestError as e:  # the body may be unread (a bad length): start the next request afresh
                self.close_connection = True
                return self.send_error_json(e.status, str(e), e.param)
            job = server.engine.submit(Job(req.prompts, req.sampling, req.top_logprobs, req.echo))
            if not self.wait_for(job):
                return
            if job.error is not None:
                return self.send_error_json(500, job.error)
            prefix = "chatcmpl" if kind == "chat" else "cmpl"
            head = {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": server.model_name}
            try:
                if req.stream:
                    self.stream(stream_chunks(req, head, job.outputs, server.tokenizer))
                else:
                    self.send_json(200, reply(req, head, job.outputs, server.tokenizer))
            except (BrokenPipeError, ConnectionResetError):  # the client left while we answered: nobody to tell
                self.close_connection = True

        def read_body(self) -> dict:
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit():
                raise RequestError(f"Content-Length must be a byte count, got {length!r}")
            if int(length) > MAX_BODY_BYTES:
                raise RequestError(f"request body over {MAX_BODY_BYTES} bytes", None, 413)
            try:
                body = json.loads(self.rfile.read(int(length)) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the body is not valid JSON ({e})") from None
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            return body

        def wait_for(self, job: Job) -> bool:
            """Wait for the job; False (and the job cancelled) if the client hangs up first."""
            while not job.done.wait(POLL_S):
                if _client_gone(self.connection):
                    job.cancelled.set()
                    self.close_connection = True
                    return False
            return job.outputs is not None or job.error is not None

        def stream(self, chunks) -> None:
            """Server-Sent Events, then [DONE]; the connection closes after (no Content-Length to delimit it)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for c in chunks:
                self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def serve(sampler, tokenizer, model_name: str = "minirl", host: str = "127.0.0.1", port: int = 8000,
          max_tokens_limit: int = 2048, batch_window_s: float = 0.02, max_batch_rows: int = 64) -> Server:
    """Start serving in a background thread (port 0: any free port; see .url). Call .close() to stop."""
    return Server(sampler, tokenizer, model_name, host, port, max_tokens_limit, batch_window_s,
                  max_batch_rows).start()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible endpoint for a saved model.")
    ap.add_argument("--model", required=True,
                    help="a model folder (save_weights_for_sampler's, a base model) or tiny")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max_tokens_limit", type=int, default=2048, help="the largest max_tokens a request may ask")
    ap.add_argument("--batch_window_ms", type=float, default=20.0,
                    help="how long the first request waits for others to share its generate")
    ap.add_argument("--max_batch_rows", type=int, default=64, help="the most sequences one generate runs")
    args = ap.parse_args(argv)
    from minirl.sessions import ServiceClient
    sampler = ServiceClient().create_sampling_client(args.model)
    server = Server(sampler, sampler.tokenizer, args.model, args.host, args.port, args.max_tokens_limit,
                    args.batch_window_ms / 1000, args.max_batch_rows)
    print(f"serving {args.model} on {server.url}", flush=True)
    try:
        server.serve_until_interrupted()
    finally:
        server.engine.close()

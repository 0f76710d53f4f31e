"""Tinker's REST protocol over minirl's sessions: an unmodified loop using the official SDK trains here.

    python -m minirl.sessions.server --base_model tiny --port 8000       # 127.0.0.1 by default
    TINKER_API_KEY=tml-anything python my_tinker_loop.py                  # with tinker.ServiceClient(
                                                                          #     base_url="http://127.0.0.1:8000")

Every call of the SDK is a POST that returns a future id at once ({"request_id": ...}); the SDK then polls
`/api/v1/retrieve_future` until the result is there ({"type": "try_again"} until then). Behind each endpoint is
the in-process client of minirl/sessions/client.py, so ordering, batching and the losses are the same as in
process (the SDK sends a client's requests one after another, in call order). Formats: minirl/sessions/wire.py.

What the SDK needs besides a base_url: an API key starting "tml-" (TINKER_API_KEY or api_key=; the server checks
it only when started with --api_key), and the tokenizer on the loop's machine: the SDK loads it by the name this
server reports, the base model's local folder.
Left out: one base model per server (--base_model; requests for another fail), no persistence across restarts
(checkpoints are folders under --checkpoint_dir and survive; futures and clients do not), REST listing of runs
and checkpoints, server-side custom losses, pickled samplers, sampling-session polling (retrieve_futures).
Why the standard library (http.server, one thread per request) as serve.py does: a handful of endpoints, and
the work happens on each client's worker thread, not in the request handler.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from minirl.models import resolve_model_path
from minirl.sessions import wire
from minirl.sessions.client import ServiceClient
from minirl.sessions.worker import Future

RETRIEVE_WAIT_S = 20.0  # how long one retrieve_future call waits before answering try_again


class TinkerService:
    """The server's state: the training and sampling clients by the ids the SDK uses, and the pending futures."""

    def __init__(self, base_model: str, checkpoint_dir: str | None = None, api_key: str | None = None,
                 dtype: str = "auto"):
        self.svc = ServiceClient(checkpoint_dir=checkpoint_dir, dtype=dtype)
        self.base_model, self.base_path, self.api_key = base_model, resolve_model_path(base_model), api_key
        self.models, self.samplers, self.futures = {}, {}, {}
        self._ids, self._lock = itertools.count(1), threading.Lock()

    def _future(self, fut: Future, kind: str = "json", **extra) -> dict:
        with self._lock:
            rid = str(next(self._ids))
            self.futures[rid] = (fut, kind)
        return {"request_id": rid, **extra}

    def _done(self, value: dict) -> dict:
        return self._future(Future.completed("request", value))

    def _check_base(self, name: str | None) -> None:
        if name not in (None, self.base_model, self.base_path):
            raise ValueError(f"this server serves {self.base_model!r} only, not {name!r}")

    # -- sessions and models
    def create_model(self, b: dict) -> dict:
        self._check_base(b["base_model"])
        model_id, lora = f"{b['session_id']}:train:{b['model_seq_id']}", b.get("lora_config")
        self.models[model_id] = (self.svc.create_lora_training_client(self.base_model, rank=lora["rank"],
                                                                      seed=lora.get("seed")) if lora
                                 else self.svc.create_training_client(self.base_model)).result()
        return self._done({"model_id": model_id, "type": "create_model"})

    def get_info(self, b: dict) -> dict:
        info = wire.to_json(self.models[b["model_id"]].get_info())
        # the SDK loads the tokenizer by these names: the folder the base model is in
        info["model_data"].update(model_name=self.base_path, tokenizer_id=self.base_path)
        return {**info, "model_name": self.base_path}

    def forward_backward(self, body: bytes, encoding: str) -> dict:
        req = wire.forward_backward_request(body, encoding)
        tc = self.models[req["model_id"]]
        op = tc.forward if req["forward_only"] else tc.forward_backward
        return self._future(op(req["data"], req["loss_fn"], req["loss_fn_config"]), "forward_backward")

    def optim_step(self, b: dict) -> dict:
        return self._future(self.models[b["model_id"]].optim_step(wire.adam_params(b.get("adam_params") or b["optim_params"])))

    def save_weights(self, b: dict) -> dict:
        return self._future(self.models[b["model_id"]].save_state(b.get("path") or uuid.uuid4().hex[:8]))

    def save_weights_for_sampler(self, b: dict) -> dict:
        tc = self.models[b["model_id"]]
        if b.get("path"):
            return self._future(tc.save_weights_for_sampler(b["path"]))
        sid = f"{b['model_id']}:sample:{b['sampling_session_seq_id']}"
        self.samplers[sid] = (tc.save_weights_and_get_sampling_client(kind=b.get("kind", "snapshot")), None)
        return self._done({"sampling_session_id": sid, "type": "save_weights_for_sampler"})

    def load_weights(self, b: dict) -> dict:
        if b.get("model_id") in self.models:
            tc = self.models[b["model_id"]]
            load = tc.load_state_with_optimizer if b.get("optimizer") else tc.load_state
            return self._future(load(b["path"]))
        model_id = f"{b['session_id']}:train:{b['model_seq_id']}"
        create = (self.svc.create_training_client_from_state_with_optimizer if b.get("optimizer")
                  else self.svc.create_training_client_from_state)
        self.models[model_id] = create(b["path"]).result()
        return self._done({"path": b["path"], "model_id": model_id, "type": "load_weights"})

    # -- sampling
    def create_sampling_session(self, b: dict) -> dict:
        self._check_base(b.get("base_model"))
        sid = f"{b['session_id']}:sample:{b['sampling_session_seq_id']}"
        path = b.get("model_path")
        self.samplers[sid] = (self.svc.create_sampling_client(model_path=path) if path
                              else self.svc.create_sampling_client(base_model=self.base_model), path)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    def get_sampler(self, sid: str) -> dict:
        return {"sampler_id": sid, "base_model": self.base_path, "model_path": self.samplers[sid][1]}

    def asample(self, b: dict) -> dict:
        sc = self.samplers[b["sampling_session_id"]][0].result()
        fut = sc.sample(wire.model_input(b["prompt"]), b["num_samples"], wire.sampling_params(b["sampling_params"]),
                        include_prompt_logprobs=bool(b.get("prompt_logprobs")),
                        topk_prompt_logprobs=b.get("topk_prompt_logprobs", 0),
                        topk_sample_logprobs=b.get("topk_sample_logprobs", 0))
        return self._future(fut, "sample", sample_sequence_ids=[uuid.uuid4().hex for _ in range(b["num_samples"])])

    # -- results
    def retrieve_future(self, b: dict) -> tuple[bytes | dict, str]:
        """(body, content type): the result, {"type": "try_again"}, or {"error": ...} for a failed operation."""
        fut, kind = self.futures[b["request_id"]]
        try:
            result = fut.result(timeout=RETRIEVE_WAIT_S)
        except concurrent.futures.TimeoutError:
            return {"type": "try_again"}, "json"
        except Exception as e:  # the operation failed: the SDK raises RequestFailedError with this message
            self.futures.pop(b["request_id"], None)
            return {"error": str(e), "category": "user"}, "json"
        self.futures.pop(b["request_id"], None)
        if kind == "forward_backward":
            return wire.forward_backward_output(result), "proto"
        if kind == "sample":
            return wire.sample_response(result), "proto"
        return wire.to_json(result), "json"


SERVICE_ONLY = {  # endpoints whose answer is fixed: the SDK's handshake, heartbeats and telemetry
    "/api/v1/client/config": {"pjwt_auth_enabled": False, "use_pyqwest_transport": False,
                              "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False},
    "/api/v1/client/dynamic_config": {"refresh_interval_sec": 300, "sample_cancel_enabled": False},
    "/api/v1/session_heartbeat": {"type": "session_heartbeat"},
    "/api/v1/telemetry": {"status": "accepted"},
    "/api/v1/healthz": {"status": "ok"},
}


def make_handler(service: TinkerService):
    json_routes = {"/api/v1/create_model": service.create_model, "/api/v1/get_info": service.get_info,
                   "/api/v1/optim_step": service.optim_step, "/api/v1/save_weights": service.save_weights,
                   "/api/v1/save_weights_for_sampler": service.save_weights_for_sampler,
                   "/api/v1/load_weights": service.load_weights, "/api/v1/asample": service.asample,
                   "/api/v1/create_sampling_session": service.create_sampling_session}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the SDK pools its connections

        def log_message(self, *args) -> None:  # one line per request would drown the training log
            pass

        def _send(self, code: int, body, kind: str = "json") -> None:
            data = body if kind == "proto" else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", wire.PROTO if kind == "proto" else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _answer(self, fn) -> None:
            if service.api_key and self.headers.get("X-API-Key") != service.api_key:
                return self._send(401, {"detail": "invalid API key"})
            try:
                self._send(200, *fn())
            except Exception as e:  # a value the SDK raises at once (it retries 5xx answers for minutes)
                self._send(400, {"detail": f"{type(e).__name__}: {e}"})

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in SERVICE_ONLY:
                return self._answer(lambda: (SERVICE_ONLY[path],))
            if path == "/api/v1/get_server_capabilities":
                return self._answer(lambda: ({"supported_models": [{"model_name": service.base_model}]},))
            if path.startswith("/api/v1/samplers/"):
                return self._answer(lambda: (service.get_sampler(path.rsplit("/", 1)[1]),))
            self._send(404, {"detail": f"no endpoint {path}"})

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if path == "/api/v1/forward_backward":
                encoding = self.headers.get("Content-Encoding", "")
                return self._answer(lambda: (service.forward_backward(body, encoding),))
            request = json.loads(body or b"{}")
            if path in SERVICE_ONLY:
                return self._answer(lambda: (SERVICE_ONLY[path],))
            if path == "/api/v1/create_session":
                return self._answer(lambda: ({"type": "create_session", "session_id": uuid.uuid4().hex[:12]},))
            if path.startswith("/api/v1/sessions/") and path.endswith("/finish"):
                return self._answer(lambda: (None,))
            if path == "/api/v1/retrieve_future":
                return self._answer(lambda: service.retrieve_future(request))
            if path in json_routes:
                return self._answer(lambda: (json_routes[path](request),))
            self._send(404, {"detail": f"no endpoint {path}"})

    return Handler


def serve(service: TinkerService, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """Start serving in a background thread; returns the server (server.server_address; .shutdown())."""
    server = ThreadingHTTPServer((host, port), make_handler(service))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="minirl-tinker-server").start()
    return server


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base_model", default="tiny")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)          # 0: any free port (printed)
    p.add_argument("--api_key", default=None)                 # if set, requests must carry it (X-API-Key)
    p.add_argument("--checkpoint_dir", default=None)          # tinker:// paths live here
    p.add_argument("--dtype", default="auto")
    args = p.parse_args(argv)
    server = serve(TinkerService(args.base_model, args.checkpoint_dir, args.api_key, args.dtype), args.host,
                   args.port)
    host, port = server.server_address[:2]
    print(f"minirl Tinker server on http://{host}:{port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()

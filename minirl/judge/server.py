"""minirl's judge behind SandboxFusion's HTTP API: POST /run_code, POST /submit (CommonOJ), GET /v1/ping.

    python -m minirl.judge.server [--host 127.0.0.1] [--port 8080] [--workers N] [--memory-limit-mb 1024]
                                  [--judge-isolation strict|weak] [--max-connections 128]    # SIGTERM: as Ctrl-C

    from sandbox_fusion import RunCodeRequest, run_code, set_endpoint      # the official client (PyPI)
    set_endpoint("http://127.0.0.1:8080")
    run_code(RunCodeRequest(code="print(input())", language="python", stdin="7\\n")).run_result.stdout  # "7\\n"

    # veRL's code reward posts the same JSON to the same URL:
    check_correctness("http://127.0.0.1:8080/run_code", {"inputs": [...], "outputs": [...]}, code, language="cpp")

The schema is SandboxFusion's own (bytedance/SandboxFusion: sandbox/server/sandbox_api.py, runners/types.py,
datasets/types.py, datasets/common_oj.py); verdicts are reported as its runners report the same run
(sandbox/runners/base.py, `parse_run_status`):
    AC, WA      status Success, run_result Finished, return_code 0, stdout (the caller compares it)
    CE (C++)    status Failed, compile_result Finished with return_code 1 and the compiler's stderr
    CE (Python) status Failed, run_result Finished with return_code 1 (SandboxFusion runs python3 directly)
    TLE         status Failed, run_result TimeLimitExceeded, return_code null
    RE, MLE, OLE  status Failed, run_result Finished with the program's non-zero return code
    judge fault status SandboxError, message (the official client retries it; veRL scores it -1)
    refused     HTTP 400 {"detail"}: a job the judge refuses for what it asks (a checker that does not compile or fails,
                processes=True under strict isolation without cgroups), which no retry would change
`memory_limit_MB` is optional (the official client drops it, veRL's `call_sandbox_api` sends it): missing or -1
is --memory-limit-mb, over --max-memory-mb (4096) refused. `compile_timeout` is ignored (the compiler has limits).

POST /submit judges a whole program on all its tests in one `Judge.run_many` job: `config.provided_data.test`
holds the tests, `config.run_timeout` the time limit, `config.extra.minirl` minirl's own settings (`memory_limit_mb`,
`float_tolerance`, `processes`, `checker`); the reply: an `EvalResult`, minirl's verdict in `extra.minirl` (for remote.py).
A checker runs with the job's limits (verdict.py: `_check`), so --max-memory-mb and the rest hold for it too.

Left out (400): languages but cpp and python, `files`, `fetch_files`, /run_jupyter, the dataset endpoints.
Nothing authenticates: it binds 127.0.0.1 unless told otherwise (a private network only). Under abuse:
server_guard.py. The standard library, not FastAPI: three JSON endpoints, the work in sandboxed processes.
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import signal
import sys
from http.server import BaseHTTPRequestHandler
from json.encoder import encode_basestring_ascii  # json.dumps's own string encoder (C)

from minirl.httpd import BackgroundServer
from minirl.judge import Judge, JudgeResult
from minirl.judge.verdict import is_refusal, judge_error
from minirl.judge.server_guard import GuardedHTTPServer, RequestError, content_length, parse_body, refuse

MAX_BODY_BYTES = 256 << 20         # a program and its tests (CodeContests problems carry MBs of tests)
LANGUAGES = ("cpp", "python")      # SandboxFusion's names for the two languages minirl judges
_LANG = re.compile(r"[\w+#-]*")      # a fence's language: the start of its info line
SERVER_NAME = "minirl-judge"       # the Server header: how minirl/judge/remote.py tells this server from SandboxFusion
DEFAULT_RUN_TIMEOUT_S = 10.0       # RunCodeRequest's default run_timeout
MAX_MEMORY_MB = 4096               # the most a request may ask for: workers x this must fit the host
# a reply's stdout and stderr together, as JSON: a 16 MiB output of text lines passes whole ("\n" takes 2 bytes),
# while 16 MiB of "\x01" (6 bytes of JSON each) was a 96 MiB reply to a 400-byte request (round 5)
REPLY_OUTPUT_BYTES = 32 << 20


def _field(body: dict, name: str, kinds: type | tuple, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RequestError(f"'{name}' has the wrong type: {value!r}")
    if not isinstance(value, kinds):
        raise RequestError(f"'{name}' has the wrong type: {type(value).__name__}")
    if isinstance(value, str):
        _utf8(value, name)
    return value


def _utf8(text: str, name: str) -> None:
    """JSON may carry lone surrogates ("\\ud800"), which no program's bytes can hold: the client's error, not
    a fault of the judge (which would answer SandboxError, and clients retry those)."""
    try:
        text.encode()
    except UnicodeEncodeError as e:
        raise RequestError(f"'{name}' is not valid Unicode ({e.reason} at {e.start})") from None


def _language(value) -> str:
    if value not in LANGUAGES:
        raise RequestError(f"language {value!r} is not supported by minirl's judge; use one of {list(LANGUAGES)}")
    return value


def _limits(run_timeout, memory_mb, default_memory_mb: int, max_memory_mb: int) -> tuple[float, int]:
    try:
        time_limit_s = float(run_timeout if run_timeout is not None else DEFAULT_RUN_TIMEOUT_S)
    except OverflowError:  # an integer too large for a float
        time_limit_s = float("inf")
    if not 0 < time_limit_s <= 600:
        raise RequestError(f"'run_timeout' must be in (0, 600] seconds, got {run_timeout!r}")
    memory_mb = default_memory_mb if memory_mb is None or memory_mb == -1 else int(memory_mb)
    if memory_mb <= 0:
        raise RequestError(f"'memory_limit_MB' must be > 0 (or -1 for the server's default), got {memory_mb}")
    if memory_mb > max_memory_mb:  # every worker may hold this much at once: a client must not size the host
        raise RequestError(f"'memory_limit_MB' {memory_mb} is over this server's cap of {max_memory_mb} MB "
                           "(--max-memory-mb)")
    return time_limit_s, memory_mb


def parse_run_code(body: dict, default_memory_mb: int, max_memory_mb: int = MAX_MEMORY_MB) -> dict:
    """The `Judge.run_many` job of a RunCodeRequest: one test whose output the reply reports (keep_output)."""
    code = _field(body, "code", str)
    if code is None:
        raise RequestError("'code' is required")
    if _field(body, "files", dict, {}) or _field(body, "fetch_files", list, []):
        raise RequestError("'files' and 'fetch_files' are not supported by minirl's judge; send them empty")
    time_limit_s, memory_mb = _limits(_field(body, "run_timeout", (int, float)),
                                      _field(body, "memory_limit_MB", int), default_memory_mb, max_memory_mb)
    stdin = _field(body, "stdin", str, "")
    return dict(source=code, language=_language(body.get("language")), time_limit_s=time_limit_s,
                memory_limit_mb=memory_mb, tests=[{"input": stdin, "output": "", "keep_output": True}])


def _fenced_code(completion: str, language: str) -> str:
    """SandboxFusion's default extraction, in short: the first fenced block of the language, else the first
    fenced block, else the completion as it is."""
    names = {"cpp", "c++"} if language == "cpp" else {"python", "python3", "py"}
    first, pos = None, 0
    # a scan with str.find, not a regex: a lazy match retried from every unclosed fence is quadratic, and a
    # completion of 600 KB of backticks would hold the GIL, hence the whole server, for minutes
    while (start := completion.find("```", pos)) != -1:
        eol = completion.find("\n", start + 3)
        end = completion.find("```", eol + 1) if eol != -1 else -1
        if end == -1:
            break
        lang, code = _LANG.match(completion, start + 3).group().lower(), completion[eol + 1:end]
        if lang in names:
            return code
        first = code if first is None else first
        pos = end + 3
    return completion if first is None else first


def parse_submit(body: dict, default_memory_mb: int, max_memory_mb: int = MAX_MEMORY_MB) -> tuple[dict, str]:
    """The job of a CommonOJ SubmitRequest (config.provided_data.test), and the code it judges."""
    config = _field(body, "config", dict, {})
    data = _field(config, "provided_data", dict, {})
    cases = _field(data, "test", list)
    if not cases:
        raise RequestError("'config.provided_data.test' must be a non-empty list of CommonOJ tests "
                           "[{'input': {'stdin': ...}, 'output': {'stdout': ...}}]")
    tests = []
    for i, case in enumerate(cases):
        given, wanted = (case.get("input"), case.get("output")) if isinstance(case, dict) else (None, None)
        stdin = given.get("stdin") if isinstance(given, dict) else None
        stdout = wanted.get("stdout") if isinstance(wanted, dict) else None
        if not isinstance(stdin, str) or not isinstance(stdout, str):
            raise RequestError(f"'config.provided_data.test[{i}]' must be {{'input': {{'stdin': str}}, "
                               "'output': {'stdout': str}}; files other than stdin/stdout are not supported")
        _utf8(stdin + stdout, f"config.provided_data.test[{i}]")
        tests.append({"input": stdin, "output": stdout})
    ours = _field(_field(config, "extra", dict, {}), "minirl", dict, {})
    language = _language(config.get("language"))
    completion = _field(body, "completion", str, "")
    code = completion if ours else _fenced_code(completion, language)  # minirl sends the program itself
    time_limit_s, memory_mb = _limits(_field(config, "run_timeout", (int, float)),
                                      _field(ours, "memory_limit_mb", int), default_memory_mb, max_memory_mb)
    tolerance = _field(ours, "float_tolerance", (int, float))
    job = dict(source=code, language=language, tests=tests, time_limit_s=time_limit_s, memory_limit_mb=memory_mb,
               float_tolerance=tolerance, processes=_field(ours, "processes", bool, False))
    checker = _field(ours, "checker", dict, None)  # minirl's own: {"source", "language"} (verdict.py: _check)
    if checker is not None:
        if not isinstance(checker.get("source"), str) or checker.get("language", "python") not in ("python", "cpp"):
            raise RequestError("'config.extra.minirl.checker' must be {'source': str, 'language': 'python'|'cpp'}")
        job["checker"] = {"source": checker["source"], "language": checker.get("language", "python")}
    return job, code


# --- minirl's verdicts in SandboxFusion's words ----------------------------------------------------------

def _command(status: str, time_s: float | None = None, rc: int | None = None, stdout: str = "",
             stderr: str = "") -> dict:
    return {"status": status, "execution_time": time_s, "return_code": rc, "stdout": stdout, "stderr": stderr}


def exec_info(verdict: str, test: dict, language: str, compile_s: float = 0.0, message: str = "") -> dict:
    """A RunCodeResponse for one run: `verdict` minirl's, `test` the run's entry of JudgeResult.tests."""
    compiled = _command("Finished", compile_s, 0) if language == "cpp" else None
    if verdict == "CE":
        if language == "cpp":
            return _response("Failed", _command("Finished", compile_s, 1, stderr=message), None)
        return _response("Failed", None, _command("Finished", 0.0, 1, stderr=message))
    time_s, stdout = test.get("wall_s"), test.get("stdout", "")
    stderr = test.get("stderr", message)
    if verdict == "TLE":
        return _response("Failed", compiled, _command("TimeLimitExceeded", time_s, None, stdout, stderr))
    if verdict in ("AC", "WA"):
        return _response("Success", compiled, _command("Finished", time_s, 0, stdout, stderr))
    rc = test.get("returncode") or 1  # RE, MLE, OLE: a non-zero return code, the program's own where known
    return _response("Failed", compiled, _command("Finished", time_s, rc, stdout, stderr))


def _response(status: str, compile_result: dict | None, run_result: dict | None, message: str = "") -> dict:
    return {"status": status, "message": message, "compile_result": compile_result, "run_result": run_result,
            "executor_pod_name": None, "files": {}}


def is_judge_fault(res: JudgeResult) -> bool:
    """A failure of the judge itself (pool.py returns it as JE; older versions as RE with this message and no test
    run), not of the program: a program's RE has its test's run, and its message is the program's stderr, which may say anything."""
    return res.verdict == "JE" or (res.verdict == "RE" and not res.tests and res.message.startswith("judge error"))


def run_code_response(res: JudgeResult, language: str) -> dict:
    if is_judge_fault(res):
        return _response("SandboxError", None, None, res.message)
    return cut_outputs(exec_info(res.verdict, res.tests[0] if res.tests else {}, language, res.compile_s,
                                 res.message))


def cut_outputs(reply: dict, budget: int = REPLY_OUTPUT_BYTES) -> dict:
    """Cut the stdout and stderr of a RunCodeResponse's commands so that, as JSON, they take at most `budget`
    bytes together (in that order: the compiler's, then the run's stdout, then its stderr), and say so in
    its `message`: the reply then is the budget and a few hundred bytes, whatever the program printed."""
    cuts = []
    for part in ("compile_result", "run_result"):
        command = reply.get(part) or {}
        for stream in ("stdout", "stderr"):
            text = command.get(stream) or ""
            kept, size = _json_prefix(text, budget)
            budget -= size
            if len(kept) < len(text):
                command[stream] = kept
                cuts.append(f"{part}.{stream} cut to its first {len(kept)} of {len(text)} characters")
    if cuts:
        note = f"{'; '.join(cuts)} (a reply's outputs take at most {REPLY_OUTPUT_BYTES >> 20} MiB of JSON)"
        reply["message"] = f"{note}. {reply['message']}" if reply.get("message") else note
    return reply


def _json_prefix(text: str, budget: int, step: int = 1 << 16) -> tuple[str, int]:
    """The longest prefix of `text` whose cost takes at most `budget` bytes, and that cost: the larger of its JSON
    string escapes and what it holds in memory (a str with one character past U+FFFF takes 4 bytes a character, so
    16 MiB of ASCII and one emoji is 16 MiB of JSON but 64 MiB held); encoded a chunk at a time (never the whole
    text's escapes at once: up to 6x its size)."""
    width = min(4, max(1, round((sys.getsizeof(text) - sys.getsizeof("")) / max(len(text), 1))))  # bytes a char
    cost = lambda piece: max(len(encode_basestring_ascii(piece)) - 2, len(piece) * width)  # noqa: E731
    size, pos = 0, 0
    while pos < len(text):
        chunk = text[pos:pos + step]
        n = cost(chunk)
        if size + n > budget:                          # the last chunk that fits in part: bisect it
            lo, hi = 0, len(chunk)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if cost(chunk[:mid]) <= budget - size:
                    lo = mid
                else:
                    hi = mid - 1
            return text[:pos + lo], size + cost(chunk[:lo])
        size, pos = size + n, pos + len(chunk)
    return text, size


def json_pieces(obj, step: int = 1 << 16):
    """json.dumps(obj) (its default separators, ASCII) as pieces of at most ~6 x `step` characters: a long
    string is escaped a chunk at a time, so writing a reply never holds its whole JSON (up to 6x its outputs)."""
    if isinstance(obj, str):
        yield '"'
        for pos in range(0, len(obj), step):
            yield encode_basestring_ascii(obj[pos:pos + step])[1:-1]
        yield '"'
    elif isinstance(obj, dict):
        yield "{"
        for k, (key, value) in enumerate(obj.items()):
            yield (", " if k else "") + encode_basestring_ascii(key if isinstance(key, str) else json.dumps(key)) + ": "
            yield from json_pieces(value, step)
        yield "}"
    elif isinstance(obj, (list, tuple)):
        yield "["
        for k, value in enumerate(obj):
            if k:
                yield ", "
            yield from json_pieces(value, step)
        yield "]"
    else:
        yield json.dumps(obj)


def submit_response(res: JudgeResult, job: dict, code: str, sample_id) -> dict:
    """An EvalResult: one EvalTestCase per test the judge ran (all of a CE program's tests fail at once)."""
    cases = []
    runs = res.tests or [{"verdict": res.verdict}]
    for i, (run, test) in enumerate(zip(runs, job["tests"])):
        message = res.message if run["verdict"] == res.verdict else ""
        info = (_response("SandboxError", None, None, res.message) if is_judge_fault(res) else
                exec_info(run["verdict"], run, job["language"], res.compile_s, message))
        cases.append({"passed": run["verdict"] == "AC", "exec_info": info,
                      "test_info": {"input": {"stdin": test["input"][:1000]},
                                    "output": {"stdout": test["output"][:1000]}}})
    return {"id": sample_id, "accepted": res.verdict == "AC", "extracted_code": code, "full_code": None,
            "test_code": None, "tests": cases, "extracted_type": None, "extra": {"minirl": res.to_dict()}}


# --- the server ------------------------------------------------------------------------------------------

class JudgeServer(BackgroundServer):
    """SandboxFusion's API from one `Judge` (a thread per connection, guarded by server_guard.py)."""

    server_class = GuardedHTTPServer

    def __init__(self, judge: Judge, host: str = "127.0.0.1", port: int = 8080, memory_limit_mb: int = 1024,
                 max_memory_mb: int = MAX_MEMORY_MB, max_connections: int = 128, request_deadline_s: float = 60.0,
                 **guard):
        self.judge, self.memory_limit_mb, self.max_memory_mb = judge, memory_limit_mb, max_memory_mb
        # descriptors beyond the connections': the listening socket, and each worker's sandbox socket, a test's
        # stdin, stdout and stderr (both ends), its output files (`connection_cap`)
        super().__init__(_handler(self), host, port, "minirl-judge-server", max_connections=max_connections,
                         request_deadline_s=request_deadline_s, spare_descriptors=32 + 8 * judge.workers,
                         **guard)  # reply_deadline_s, reply_budget_bytes, body_budget_bytes (server_guard.py)

    def handle(self, path: str, body: dict) -> dict:
        """The reply to POST `path`; RequestError for a request to refuse."""
        if path == "/run_code":
            job = parse_run_code(body, self.memory_limit_mb, self.max_memory_mb)
            return run_code_response(self._judge(job), job["language"])
        job, code = parse_submit(body, self.memory_limit_mb, self.max_memory_mb)
        return submit_response(self._judge(job), job, code, body.get("id"))

    def _judge(self, job: dict) -> JudgeResult:
        """The job's result; RequestError (400) for a job the judge refuses for what it asks (`is_refusal`: a checker
        that does not compile, processes=True under strict isolation without cgroups): the client's doing, which
        a retry on any server would meet again. The judge's own faults stay SandboxError (clients retry those)."""
        try:
            res = self.judge.run_many([job])[0]
        except Exception as e:  # noqa: BLE001 -- the judge's fault: SandboxError, and keep serving
            return judge_error(e, len(job["tests"]))
        if is_refusal(res):
            raise RequestError(res.message)
        return res


def _handler(server: JudgeServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client judging many tests reuses its connection
        timeout = property(lambda self: server.httpd.request_deadline_s)  # a recv's own bound, as a backstop

        def handle_one_request(self):
            server.httpd.reading(self.connection)  # its deadline runs until the request is read
            super().handle_one_request()

        def version_string(self) -> str:
            return SERVER_NAME

        def log_message(self, *args):  # quiet: a line per program is noise in a training log
            pass

        def send_json(self, status: int, obj) -> None:
            """Write `obj` as JSON. Its size (exact, counted a piece at a time) is reserved from the server's reply
            budget before any of its JSON exists, and the JSON is written a piece at a time: a reply waiting for
            room holds only its (cut) outputs, and one that gets none by the deadline drops them and is a 503."""
            size = sum(map(len, json_pieces(obj)))
            server.httpd.replying(self.connection)  # a short deadline, and evictable: a slow reader of it
            held = size if server.httpd.take_reply(size) else 0  # replies being written hold the server's budget
            if not held:
                if isinstance(obj, dict):
                    obj.clear()          # its outputs go now, not when the caller returns
                status, self.close_connection = 503, True
                obj = {"detail": "the server holds its limit of replies being written; retry"}
                size = sum(map(len, json_pieces(obj)))
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                buffer, buffered = [], 0
                for piece in json_pieces(obj):      # a write per 256 KiB, not per piece (small segments are slow)
                    buffer.append(piece)
                    buffered += len(piece)
                    if buffered >= 1 << 18:
                        self.wfile.write("".join(buffer).encode("ascii"))
                        buffer, buffered = [], 0
                self.wfile.write("".join(buffer).encode("ascii"))
            finally:
                if held:
                    server.httpd.give_reply(held)

        def do_GET(self):
            server.httpd.working(self.connection)
            if self.path.rstrip("/") == "/v1/ping":
                return self.send_json(200, "pong")
            self.send_json(404, {"detail": f"no route GET {self.path}; try /v1/ping, POST /run_code or /submit"})

        def do_POST(self):
            path = self.path.rstrip("/")
            try:
                if "Transfer-Encoding" in self.headers:  # its body would be read as the next request
                    raise RequestError("send the body with a Content-Length, not a Transfer-Encoding")
                length = content_length(self.headers.get("Content-Length"), MAX_BODY_BYTES)
            except RequestError as e:                   # the body (if any) is not read: nothing after it parses
                return refuse(self, 413, str(e))
            if not server.httpd.take_body(length):      # the server-wide budget of bodies held: 503, unread
                return refuse(self, 503, "the server holds its limit of request bodies; retry")
            try:
                self._post(path, length)
            finally:
                server.httpd.give_body(length)

        def _post(self, path: str, length: int) -> None:  # the body's bytes are reserved (take_body)
            raw = self.rfile.read(length)
            if len(raw) < length:                        # the deadline (or the client) cut it short
                self.close_connection = True
                return
            server.httpd.working(self.connection)
            if path not in ("/run_code", "/submit"):
                return self.send_json(404, {"detail": f"no route POST {self.path}; try /run_code or /submit"})
            try:  # ValueError: also integers past Python's 4300 digits; RecursionError: arrays nested too deep
                body = parse_body(raw)
            except RequestError as e:
                return self.send_json(400, {"detail": str(e)})
            except (ValueError, RecursionError) as e:
                return self.send_json(400, {"detail": f"the body is not valid JSON ({str(e)[:200]})"})
            try:
                reply = server.handle(path, body)
            except RequestError as e:
                return self.send_json(400, {"detail": str(e)})
            except Exception as e:  # noqa: BLE001 -- a request this code did not foresee: answer, keep serving
                return self.send_json(500, {"detail": f"the server failed on this request ({type(e).__name__})"})
            self.send_json(200, reply)

    return Handler


def serve(judge: Judge, host: str = "127.0.0.1", port: int = 8080, memory_limit_mb: int = 1024,
          max_memory_mb: int = MAX_MEMORY_MB, **guard) -> JudgeServer:
    """Serve in a background thread (port 0: any port; .url); .close() stops. guard: max_connections,
    request_deadline_s, reply_deadline_s, reply_budget_bytes, body_budget_bytes."""
    return JudgeServer(judge, host, port, memory_limit_mb, max_memory_mb, **guard).start()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="minirl's sandboxed judge behind SandboxFusion's HTTP API.")
    ap.add_argument("--host", default="127.0.0.1", help="nothing authenticates: bind a private address only")
    ap.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    ap.add_argument("--workers", type=int, default=0, help="parallel sandboxed programs (0 = all cores)")
    ap.add_argument("--memory-limit-mb", type=int, default=1024, help="when a request gives none")
    ap.add_argument("--max-memory-mb", type=int, default=MAX_MEMORY_MB,
                    help="the most a request may ask for (each worker may hold it at once)")
    ap.add_argument("--judge-isolation", choices=["strict", "weak"], default="strict",
                    help="weak: also serve where the sandbox has no namespaces (train.py's judge_isolation)")
    ap.add_argument("--max-connections", type=int, default=128,
                    help="open connections at most (at the cap, the one idle longest is closed)")
    args = ap.parse_args(argv)
    from minirl.judge.pool import require_isolation
    # SIGTERM ends it as Ctrl-C does: Judge.close removes its sandboxes, cgroups and staging folder (death did not)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # room for every connection and the sandboxes' pipes
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with require_isolation(Judge(workers=args.workers or None), args.judge_isolation) as judge:
        server = JudgeServer(judge, args.host, args.port, args.memory_limit_mb, args.max_memory_mb,
                             args.max_connections)
        print(f"minirl judge ({judge.workers} workers) serving SandboxFusion's API on {server.url}", flush=True)
        server.serve_until_interrupted()


if __name__ == "__main__":
    main()

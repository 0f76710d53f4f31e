"""A judge on other hosts, over HTTP: `RemoteJudge(urls)` has `Judge`'s `run` / `run_many` and returns its verdicts.

    judge = RemoteJudge(["http://10.0.0.5:8080", "http://10.0.0.6:8080"])     # or "url1,url2"
    judge.run_many([dict(source=..., language="cpp", tests=[{"input": "1 2\\n", "output": "3"}]), ...])

Two kinds of server, told apart once per URL by the Server header of GET /v1/ping:
- minirl's own (`python -m minirl.judge.server`, minirl/judge/server.py): each program is one POST /submit
  with all its tests (CommonOJ's `config.provided_data.test`), and the reply's `extra.minirl` is the verdict
  that server's `Judge` gave: the same as a local Judge's, compared by the same code.
- a real SandboxFusion (bytedance/SandboxFusion, sandbox/server/sandbox_api.py): one POST /run_code per test,
  in order up to the first TLE (as minirl's judge counts them), the stdout compared here with minirl's own
  comparator (`outputs_match`, token-wise, float tolerance), so rewards mean the same thing on both. What
  SandboxFusion cannot tell: memory use (a run killed for memory is RE, unless its stderr says
  MemoryError/bad_alloc, then MLE) and OLE. A Python program that does not parse is CE here, as minirl's judge
  says, before anything is sent.

Jobs run on a thread pool of `concurrency` requests per URL (the servers' judges do the work; a thread here
only waits). Job k starts on URL k mod n, so the URLs are used in turn; a connection error, a timeout, a 5xx or
a SandboxError marks that URL down for `cooldown_s` and sends the job to the next one (judging is pure: running
a program twice gives the same verdict). When no server answers after `retries` rounds over all URLs, the
job's result is JE, a judge error, with a message starting "judge error: no judge server answered" (and an error
in the log), never an exception and never a verdict on the program: the trainer leaves it out of the loss. A 4xx
(a job the server refuses for what it asks: minirl's server answers 400 to a checker that does not compile or to
processes=True it cannot hold) is not retried and marks no server down (JE too).

A job's special checker (`checker`) goes to minirl's server in /submit's `extra.minirl`; a SandboxFusion server
has none, so such a job is refused there (a judge error that says so). Left out: authentication (neither server
has any; keep them on a private network).
"""
from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from minirl.judge import JudgeResult, outputs_match
from minirl.judge.frontend import JudgeFrontend, unjudged
from minirl.judge.verdict import REFUSED

log = logging.getLogger(__name__)
SERVER_NAME = "minirl-judge"       # minirl/judge/server.py's Server header


class Unavailable(Exception):
    """This server could not judge the job now (down, overloaded, its sandbox failed): try another."""


class Refused(Exception):
    """The server refuses the job itself (4xx): another server would too."""


def parse_urls(urls: str | list[str]) -> list[str]:
    urls = [u.strip().rstrip("/") for u in (urls.split(",") if isinstance(urls, str) else urls) if u.strip()]
    if not urls:
        raise ValueError("RemoteJudge needs at least one server URL, e.g. http://127.0.0.1:8080")
    return urls


class RemoteJudge(JudgeFrontend):
    """`Judge`'s interface on judge servers over HTTP (minirl's or SandboxFusion); one per training run."""

    def __init__(self, urls: str | list[str], concurrency: int = 8, retries: int = 3, cooldown_s: float = 5.0,
                 timeout_s: float | None = None, protocol: str = "auto"):
        if protocol not in ("auto", "minirl", "sandboxfusion"):
            raise ValueError(f"protocol must be 'auto', 'minirl' or 'sandboxfusion', got {protocol!r}")
        self.urls = parse_urls(urls)
        self.workers = concurrency * len(self.urls)   # requests in flight at most
        self.retries, self.cooldown_s, self.timeout_s = retries, cooldown_s, timeout_s
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="remote-judge")
        self._lock = threading.Lock()
        # url -> "minirl" | "sandboxfusion": probed once per URL unless given (a minirl server speaks both)
        self._kind: dict[str, str] = {} if protocol == "auto" else {url: protocol for url in self.urls}
        self._down_until: dict[str, float] = {}  # url -> time before which it is tried only as a last resort
        # url -> failures in a row: a server that keeps failing (hung, not just restarting) stays out for longer,
        # cooldown_s * 2**failures up to 10 minutes, so that not every step waits a timeout on it
        self._failures: dict[str, int] = {}

    def run_many(self, jobs: list[dict]) -> list[JudgeResult]:
        """Judge many programs on the servers; results in the order of `jobs`."""
        self.check(jobs)
        return list(self._pool.map(self._judge, jobs, range(len(jobs))))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # --- one job, on the first server that answers ---------------------------------------------------------

    def _judge(self, job: dict, k: int) -> JudgeResult:
        job = {**job, "language": "cpp" if job["language"] in ("cpp", "c++") else "python"}
        n, error = len(self.urls), "no attempt"
        for attempt in range(self.retries * n):
            url = self._pick(k + attempt)
            try:
                result = self._on(url, job)
                with self._lock:
                    self._failures.pop(url, None)
                return result
            except Refused as e:
                return unjudged(f"the server refused the job: {e}", len(job["tests"]))
            except Unavailable as e:
                error = f"{url}: {e}"
                with self._lock:
                    failures = self._failures[url] = self._failures.get(url, 0) + 1
                    self._down_until[url] = time.monotonic() + min(600.0, self.cooldown_s * 2 ** (failures - 1))
                if attempt % n == n - 1:  # a whole round failed: give the servers a moment
                    time.sleep(min(2.0, 0.25 * 2 ** (attempt // n)))
        log.error("no judge server answered for a job (%s)", error)
        return unjudged(f"no judge server answered ({error})", len(job["tests"]))

    def _pick(self, i: int) -> str:
        """URL i mod n, or the next one not marked down (all down: that one anyway, as a last resort)."""
        now, n = time.monotonic(), len(self.urls)
        with self._lock:
            for j in range(n):
                url = self.urls[(i + j) % n]
                if self._down_until.get(url, 0.0) <= now:
                    return url
        return self.urls[i % n]

    def _on(self, url: str, job: dict) -> JudgeResult:
        kind = self._kind.get(url) or self._probe(url)
        if kind == "minirl":
            return self._submit(url, job)
        return self._run_tests(url, job)

    def _probe(self, url: str) -> str:
        with self._request(url + "/v1/ping", None, 10.0) as r:
            server = r.headers.get("Server", "")
        kind = "minirl" if server.startswith(SERVER_NAME) else "sandboxfusion"
        self._kind[url] = kind
        return kind

    def _timeout(self, job: dict, tests: int) -> float:
        return self.timeout_s or 60.0 + 2.0 * float(job.get("time_limit_s", 2.0)) * tests

    def _submit(self, url: str, job: dict) -> JudgeResult:
        """The whole program on minirl's server: its own verdict, from extra.minirl."""
        body = {"dataset": "minirl", "id": 0, "completion": job["source"], "config": {
            "language": job["language"], "run_timeout": float(job.get("time_limit_s", 2.0)),
            "provided_data": {"test": [{"input": {"stdin": t["input"]}, "output": {"stdout": t["output"]}}
                                       for t in job["tests"]]},
            "extra": {"minirl": {"memory_limit_mb": int(job.get("memory_limit_mb", 256)),
                                 "float_tolerance": job.get("float_tolerance"),
                                 "processes": bool(job.get("processes", False)),
                                 **({"checker": job["checker"]} if job.get("checker") else {})}}}}
        reply = self._post(url + "/submit", body, self._timeout(job, len(job["tests"])))
        verdict = (reply.get("extra") or {}).get("minirl")
        if not isinstance(verdict, dict):
            raise Unavailable("the reply to /submit has no extra.minirl verdict")
        if str(verdict.get("message", "")).startswith(REFUSED) and verdict.get("verdict") == "JE":
            raise Refused(verdict["message"][:300])  # the job's own doing (a server that did not answer it 400)
        if verdict.get("verdict") == "JE" or (verdict.get("verdict") == "RE" and not verdict.get("tests")
                                              and str(verdict.get("message", "")).startswith("judge error")):
            # JE: that server's judge failed, not the program (an older server says RE with no test run)
            raise Unavailable(verdict["message"][:300])  # that server's judge failed, not the program
        try:
            return JudgeResult(**verdict)
        except TypeError as e:  # a server of another minirl version: fields this one does not know
            raise Unavailable(f"extra.minirl is not a verdict of this minirl ({e})") from None

    def _run_tests(self, url: str, job: dict) -> JudgeResult:
        """SandboxFusion: one /run_code per test, in order up to the first TLE; outputs compared here."""
        tests, total = job["tests"], len(job["tests"])
        if job.get("checker"):
            raise Refused("a SandboxFusion server runs no special checker; use minirl's judge server")
        if job["language"] == "python":
            try:
                compile(job["source"], "main.py", "exec")
            except Exception as e:  # noqa: BLE001 -- SyntaxError, ValueError (NUL), RecursionError, ...
                return JudgeResult("CE", 0, total, message=f"{type(e).__name__}: {e}"[:2000])
        runs, passed, verdict, message, compile_s = [], 0, "AC", "", 0.0
        for test in tests:
            reply = self._post(url + "/run_code", {
                "code": job["source"], "language": job["language"], "stdin": test["input"],
                "run_timeout": float(job.get("time_limit_s", 2.0)), "compile_timeout": 30.0,
                "memory_limit_MB": int(job.get("memory_limit_mb", 256)), "files": {}, "fetch_files": []},
                self._timeout(job, 1))
            v, err, compile_s = _verdict(reply, test["output"], job.get("float_tolerance"))
            if v == "CE":
                return JudgeResult("CE", 0, total, message=err[:2000], compile_s=compile_s)
            run = reply.get("run_result") or {}
            runs.append({"verdict": v, "time_s": run.get("execution_time"), "wall_s": run.get("execution_time"),
                         "memory_mb": None})
            passed += v == "AC"
            if v != "AC" and verdict == "AC":
                verdict, message = v, err[:2000]
            if v == "TLE":
                break
        return JudgeResult(verdict, passed, total, runs, message, compile_s)

    def _post(self, url: str, body: dict, timeout: float) -> dict:
        try:  # the body may break off (the server died), stall past the timeout, or not be JSON (a proxy)
            with self._request(url, json.dumps(body).encode(), timeout) as r:
                reply = json.loads(_read_by(r, time.monotonic() + timeout))
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise Unavailable(f"the reply broke off or is not JSON ({type(e).__name__}: {e})") from None
        if not isinstance(reply, dict):
            raise Unavailable(f"the reply is not a JSON object: {str(reply)[:100]}")
        if reply.get("status") == "SandboxError":
            raise Unavailable(f"SandboxError: {str(reply.get('message'))[:300]}")
        return reply

    def _request(self, url: str, data: bytes | None, timeout: float):
        req = urllib.request.Request(url, data, {"Content-Type": "application/json", "Accept": "application/json"})
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode("utf-8", "replace")
            if e.code >= 500:
                raise Unavailable(f"HTTP {e.code}: {detail}") from None
            raise Refused(f"HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, OSError) as e:
            raise Unavailable(f"{type(e).__name__}: {e}") from None


def _read_by(r, deadline: float) -> bytes:
    """The reply's body, or TimeoutError past `deadline`: urlopen's timeout bounds each read of the socket, not
    the whole body, so a server sending a byte now and then would hold the job for ever."""
    chunks = []
    while chunk := r.read1(1 << 16):
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError("the reply's body took longer than the timeout")
    return b"".join(chunks)


def _verdict(reply: dict, expected: str, float_tolerance: float | None) -> tuple[str, str, float]:
    """minirl's verdict of one RunCodeResponse, the message to keep, and the compile time."""
    comp, run = reply.get("compile_result"), reply.get("run_result")
    if not isinstance(comp, (dict, type(None))) or not isinstance(run, (dict, type(None))):
        raise Unavailable(f"compile_result and run_result must be objects (status {reply.get('status')!r})")
    compile_s = float((comp or {}).get("execution_time") or 0.0)
    if comp and (comp.get("status") != "Finished" or comp.get("return_code") != 0):
        return "CE", comp.get("stderr") or comp.get("stdout") or "", compile_s
    if not run or run.get("status") == "Error":
        raise Unavailable(f"no run result in the reply (status {reply.get('status')!r})")
    err = run.get("stderr") or ""
    if run.get("status") == "TimeLimitExceeded":
        return "TLE", err, compile_s
    if run.get("return_code") != 0:
        return ("MLE" if "MemoryError" in err or "bad_alloc" in err else "RE"), err, compile_s
    ok = outputs_match(run.get("stdout") or "", expected, float_tolerance)
    return ("AC" if ok else "WA"), ("" if ok else err), compile_s


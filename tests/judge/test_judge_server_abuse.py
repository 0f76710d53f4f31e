"""Round 4 (issue 31): the judge server under abuse. Each test is an attacker's request (or many) that took the
server down before: a body that parses into GiBs, a Content-Length int() chokes on, connections that never
finish their request, SIGTERM skipping the judge's cleanup. Servers run on loopback ports, over a judge with
and without cgroups (the `judge` fixture)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from attack_helpers import judge, root_only  # noqa: F401 (judge: a fixture)
from minirl.judge.host import cache_dir
from minirl.judge.server import serve

AB_PY = "a, b = map(int, input().split())\nprint(a + b)\n"
AB_CPP = '#include <cstdio>\nint main(){long a,b; scanf("%ld %ld",&a,&b); printf("%ld\\n",a+b);}\n'


@pytest.fixture(scope="module")
def server(judge):
    s = serve(judge, port=0, memory_limit_mb=128, max_connections=8, request_deadline_s=2.0)
    yield s
    s.close()


def post(url: str, body: bytes, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def honest(url: str, language: str = "python") -> str:
    """A correct A+B through /run_code: its stdout ("3" when judged right)."""
    code = AB_PY if language == "python" else AB_CPP
    status, reply = post(url + "/run_code", json.dumps({"code": code, "language": language, "stdin": "1 2\n"}).encode())
    assert status == 200, reply
    return (reply["run_result"] or {}).get("stdout", "").strip()


def connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=30)


def closed_by_server(sock: socket.socket, within_s: float, trickle: bytes = b"") -> bool:
    """Whether the server closes `sock` within `within_s` while the client sends `trickle` a byte at a time,
    one every 0.3 s (nothing if empty), never finishing its request."""
    deadline = time.monotonic() + within_s
    sock.settimeout(0.3)
    i = 0
    while time.monotonic() < deadline:
        try:
            if sock.recv(1 << 16) == b"":
                return True
        except socket.timeout:
            pass
        except OSError:
            return True
        if trickle:
            try:
                sock.sendall(trickle[i % len(trickle):i % len(trickle) + 1])
            except OSError:
                return True
            i += 1
    return False


# --- finding 5: JSON amplification -----------------------------------------------------------------------

@pytest.mark.parametrize("wrap", [False, True], ids=["array", "in-an-object"])
def test_a_body_of_many_small_values_is_refused_before_it_is_built(server, wrap):
    """16 MiB of `[{},{},...]` was 417 MiB of dicts before the server looked at it."""
    values = b"[" + b"{}," * ((16 << 20) // 3) + b"{}]"
    body = b'{"code": "print(1)", "language": "python", "x": ' + values + b"}" if wrap else values
    tracemalloc.start()
    try:
        status, reply = post(server.url + "/run_code", body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 400, reply
    assert peak < 100 << 20, f"parsing took {peak >> 20} MiB"


# --- finding 7: Content-Length ---------------------------------------------------------------------------

@pytest.mark.parametrize("length", ["\u00b2", "9" * 5000, "-1", "1e3"], ids=["superscript", "5000-digits", "negative",
                                                                           "float"])
def test_a_content_length_that_is_not_a_byte_count_gets_an_answer(server, length):
    with connect(server) as sock:
        sock.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: " + length.encode("latin-1")
                     + b"\r\n\r\n{}")
        sock.settimeout(30)
        reply = sock.recv(1 << 16)
    assert reply.startswith(b"HTTP/1.1 4"), reply[:200]
    assert honest(server.url) == "3"                  # and the server still serves


# --- finding 6: idle connections -------------------------------------------------------------------------

@pytest.mark.parametrize("trickle", [b"", b"X-Slow: " + b"a" * 200], ids=["silent", "a-byte-at-a-time"])
def test_a_connection_that_never_finishes_its_request_is_closed_at_the_deadline(server, trickle):
    """A byte every 0.3 s (every 59 s before, against a 60 s timeout per recv) held a thread for ever."""
    with connect(server) as sock:
        sock.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\n")
        assert closed_by_server(sock, within_s=20, trickle=trickle)   # the deadline is 2 s


def test_idle_connections_past_the_cap_never_lock_out_an_honest_request(server):
    idle = [connect(server) for _ in range(3 * server.httpd.max_connections)]
    try:
        time.sleep(0.5)
        assert server.httpd.open_connections() <= server.httpd.max_connections
        assert honest(server.url) == "3"
        assert server.httpd.open_connections() <= server.httpd.max_connections
    finally:
        for s in idle:
            s.close()


def test_honest_requests_keep_their_verdicts_under_idle_and_abusive_clients(server):
    """The load test: N idle connections (3x the cap) and M abusive clients at once (amplified JSON, bad
    Content-Lengths, trickled headers, garbage), while honest C++ and Python requests are judged. The bound on
    their latency is generous (a shared 2-core machine): what fails is a server that stops answering."""
    stop, n_idle, abusers = threading.Event(), 3 * server.httpd.max_connections, 4
    amplified = b'{"x": [' + b"{}," * (2 << 20) + b"{}]}"

    def abuse(k: int) -> None:
        while not stop.is_set():
            try:
                with connect(server) as sock:
                    if k == 0:
                        sock.sendall(b"POST /run_code HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(amplified)
                                     + amplified)
                    elif k == 1:
                        sock.sendall(b"POST /submit HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
                    elif k == 2:
                        sock.sendall(b"POST /run_code HTTP/1.1\r\n")
                        closed_by_server(sock, within_s=1, trickle=b"X: yyyyyyy")
                    else:
                        sock.sendall(os.urandom(4096))
                    sock.settimeout(5)
                    sock.recv(1 << 16)
            except OSError:
                pass

    threads = [threading.Thread(target=abuse, args=(k,), daemon=True) for k in range(abusers)]
    for t in threads:
        t.start()
    idle = []
    latencies = []
    try:
        for _ in range(3):
            idle += [connect(server) for _ in range(n_idle - len(idle))]
            for language in ("python", "cpp"):
                t0 = time.monotonic()
                assert honest(server.url, language) == "3"
                latencies.append(time.monotonic() - t0)
    finally:
        stop.set()
        for s in idle:
            s.close()
        for t in threads:
            t.join(timeout=30)
    print(f"load test: {n_idle} idle, {abusers} abusive clients; honest latency max {max(latencies):.2f} s, "
          f"median {sorted(latencies)[len(latencies) // 2]:.2f} s")
    assert max(latencies) < 60, latencies


# --- finding 9: SIGTERM ----------------------------------------------------------------------------------

def _left_behind(pid: int) -> list[str]:
    """What a judge process `pid` leaves if it does not close: its sandboxes' error files and its cgroups."""
    left = [str(p) for p in cache_dir().glob(f"sandbox-*-{pid}.err")]
    for root in (Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").glob("*")):
        left += [str(p) for p in root.glob(f"**/minirl-judge-*-{pid}") if p.is_dir()] if root.is_dir() else []
    return left


@root_only
@pytest.mark.parametrize("cgroups", ["1", "0"], ids=["cgroups", "no-cgroups"])
def test_sigterm_closes_the_judge_like_ctrl_c(cgroups):
    env = {**os.environ, "MINIRL_JUDGE_CGROUPS": cgroups}
    proc = subprocess.Popen([sys.executable, "-m", "minirl.judge.server", "--port", "0", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line + proc.stdout.read(4000) if proc.poll() is not None else line
        url = line.rsplit(" ", 1)[1].strip()
        assert honest(url) == "3"                       # a worker's sandbox is open now
        assert _left_behind(proc.pid)                   # the files this test watches exist while it serves
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not _left_behind(proc.pid)
    assert rc == 0                                      # a clean exit, not death by the signal

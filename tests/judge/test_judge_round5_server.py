"""Round 5 (issue 54), the judge server: replies that amplified what a program printed, and a connection cap
above what the descriptor limit allowed. One judge without cgroups: the server's behaviour, not the sandbox's."""
import json
import os
import resource
import select
import socket
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from conftest import ROOT
from minirl.judge import Judge
from minirl.judge.server import REPLY_OUTPUT_BYTES, cut_outputs, serve


@pytest.fixture(scope="module")
def judge():
    with Judge(workers=1, cgroups=False) as j:
        yield j


def post_raw(url: str, body: dict, timeout: float = 60) -> bytes:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def test_a_reply_of_escapes_is_cut_to_the_budget_and_says_so(judge):
    """A 400-byte request printing 16 MiB of "\\x01" got a 96 MiB reply ("\\u0001" per byte)."""
    server = serve(judge, port=0, memory_limit_mb=128)
    try:
        code = "import sys\nsys.stdout.buffer.write(b'\\x01' * (16 << 20))\n"
        raw = post_raw(server.url + "/run_code", {"code": code, "language": "python"})
    finally:
        server.close()
    reply = json.loads(raw)
    assert len(raw) <= REPLY_OUTPUT_BYTES + 4096, len(raw)
    stdout = reply["run_result"]["stdout"]
    assert stdout == "\x01" * len(stdout) and 0 < len(stdout) < 16 << 20, len(stdout)
    assert "run_result.stdout cut to its first" in reply["message"], reply["message"]


def test_text_output_within_the_budget_is_kept_whole():
    """The budget is what JSON takes: 12 MiB of text lines (18 MiB of JSON) stays whole, with no note."""
    text = "12\n" * (4 << 20)
    reply = cut_outputs({"message": "", "compile_result": None, "run_result": {"stdout": text, "stderr": "e"}})
    assert reply["run_result"]["stdout"] == text and reply["message"] == ""
    cut = cut_outputs({"message": "", "run_result": {"stdout": "\ufffd" * (8 << 20), "stderr": "x" * 100}})
    assert len(json.dumps(cut["run_result"])) <= REPLY_OUTPUT_BYTES + 200
    assert len(cut["run_result"]["stderr"]) < 100 and "stderr cut" in cut["message"], cut["message"][:300]


IDLE = """
import resource, socket, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))            # the clients' own limit, not the server's
held, failed = [], 0
while len(held) < int(sys.argv[2]) and failed < 10:          # a server out of descriptors accepts no more
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1.5))
    except OSError:
        failed += 1
print("held", flush=True)
time.sleep(60)
"""


def test_the_connection_cap_is_clamped_to_the_descriptor_limit(judge):
    """Under a low descriptor limit accept() failed before --max-connections was reached, so idle connections
    were never evicted and an honest request timed out. Now the cap is what the limit leaves, and at the cap
    the idle ones are evicted."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = len(os.listdir("/proc/self/fd")) + 100
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))      # what the server lives under, from its start
    server = idle = None
    try:
        server = serve(judge, port=0, memory_limit_mb=128, max_connections=128, request_deadline_s=60.0)
        idle = subprocess.Popen([sys.executable, "-c", textwrap.dedent(IDLE), str(server.port), "140"],
                                stdout=subprocess.PIPE, text=True)
        assert idle.stdout.readline().strip() == "held"
        raw = post_raw(server.url + "/run_code", {"code": "print(1 + 2)", "language": "python"}, timeout=20)
        assert json.loads(raw)["run_result"]["stdout"].strip() == "3"
        assert server.httpd.max_connections < 100, server.httpd.max_connections
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if idle is not None:
            idle.kill()
            idle.wait()
        if server is not None:
            server.close()


def test_replies_being_written_share_a_server_wide_budget():
    """8 clients that never read their replies held 1.1 GiB: a reply's bytes are reserved from one budget while it
    is written; past it a reply waits (up to the reply deadline), then the caller answers 503."""
    from http.server import BaseHTTPRequestHandler

    from minirl.judge.server_guard import GuardedHTTPServer

    httpd = GuardedHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, reply_deadline_s=0.2,
                              reply_budget_bytes=100)
    try:
        assert httpd.take_reply(80)
        assert not httpd.take_reply(30)                 # 110 > 100: waited 0.2 s, no room
        httpd.give_reply(80)
        assert httpd.take_reply(30) and httpd.take_reply(70)
        httpd.give_reply(30)
        httpd.give_reply(70)
        assert httpd.take_reply(500)                    # larger than the budget: alone, once nothing else is held
        httpd.give_reply(500)
    finally:
        httpd.server_close()


SERVER = """
import sys, tracemalloc
from minirl.judge import Judge
from minirl.judge.server import serve
tracemalloc.start()
with Judge(workers=2, cgroups=False) as judge:
    server = serve(judge, port=0, memory_limit_mb=256, reply_budget_bytes=32 << 20, reply_deadline_s=8.0)
    print(server.port, flush=True)
    for line in sys.stdin:                  # "reset": the memory held now, and the peak starts over; "peak": it
        if line.strip() == "reset":
            tracemalloc.reset_peak()
        print(tracemalloc.get_traced_memory()[line.strip() == "peak"] >> 20, flush=True)
    server.close()
"""


def test_clients_that_never_read_hold_no_more_than_the_reply_budgets():
    """Before: a reply's JSON was built before it waited for budget, so each waiting request held its output and
    its JSON, and each result waited for its call's idle second judge thread: 40 non-reading clients took the
    server to 1.7 GiB under a 256 MiB budget. Now the budget is reserved before any JSON exists, the JSON is
    written a piece at a time, waiters hold their outputs within a second budget, and a call's result comes back
    when its job ends: 24 clients printing 8 MiB of text each, under a 32 MiB budget, keep what Python holds
    within the two budgets (64 MiB) and a margin of 48 MiB (2 workers reading an output: the read buffer and its
    text); measured 392 MiB before, 82 after. Measured with tracemalloc: the process's RSS also counts what malloc keeps of freed memory."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)     # this tree's minirl ("" heads sys.path)
    socks = []
    try:
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        assert json.loads(post_raw(url + "/run_code", {"code": "print(3)", "language": "python"}))["run_result"]
        proc.stdin.write("reset\n")
        proc.stdin.flush()
        idle = int(proc.stdout.readline())
        code = "import sys\nsys.stdout.write('ab' * (4 << 20))\n"          # 8 MiB of text: 8 MiB of JSON
        body = json.dumps({"code": code, "language": "python", "run_timeout": 10}).encode()
        request = (f"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        for _ in range(24):
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request)
            socks.append(s)
        waiting = list(socks)
        while waiting:                       # each has its status line (200 or 503): it was judged and replied
            readable, _, _ = select.select(waiting, [], [], 120)
            assert readable, "the server answered none of the clients in 120 s"
            waiting = [s for s in waiting if s not in readable]
        proc.stdin.write("peak\n")
        proc.stdin.flush()
        peak = int(proc.stdout.readline())
        statuses = [s.recv(12, socket.MSG_PEEK).split()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
        proc.stdin.close()
        proc.wait(timeout=60)
    assert b"503" in statuses, statuses       # the budgets were full: some clients were refused
    assert peak - idle <= 64 + 48, (idle, peak, statuses)

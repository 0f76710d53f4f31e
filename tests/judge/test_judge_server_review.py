"""Issue 31's review (round 4) of the judge server: a JSON pre-check that refused honest bodies, slow readers of
their replies that locked honest clients out, and request bodies bounded only by max_connections x 256 MiB."""
import json
import socket
import time

import pytest

from minirl.judge import Judge
from minirl.judge.server import serve
from test_judge_server_abuse import post as post_url


@pytest.fixture(scope="module")
def judge():
    with Judge(workers=1, cgroups=False) as j:
        yield j


@pytest.fixture
def server(judge):
    s = serve(judge, port=0, memory_limit_mb=128, max_connections=3, request_deadline_s=20.0)
    yield s
    s.close()


def post(server, body: bytes, timeout: float = 60) -> tuple[int, dict]:
    return post_url(f"http://{server.host}:{server.port}/run_code", body, timeout)


def run_code(code: str, stdin: str = "") -> bytes:
    return json.dumps({"code": code, "language": "python", "stdin": stdin}).encode()


def test_separators_inside_strings_are_not_counted(server):
    """One test input of 1.1M comma-separated numbers (2.2 MB) is one JSON string: it was refused 400."""
    status, reply = post(server, run_code("print(len(input().split(',')))", ",".join(["1"] * 1_100_000)))
    assert status == 200 and reply["run_result"]["stdout"].strip() == "1100000", (status, str(reply)[:300])


def test_slow_readers_of_their_replies_cannot_lock_honest_clients_out(server):
    """max_connections clients whose replies (36 MiB of JSON escapes) they never read: writing them counted as
    being judged, no deadline, never evicted, and every honest client got 503 or a reset."""
    server.httpd.reply_deadline_s = 2.0
    body = run_code("import sys\nsys.stdout.write('\\x01' * (6 << 20))")
    hogs = []
    for _ in range(3):
        s = socket.create_connection((server.host, server.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        hogs.append(s)
    try:
        time.sleep(6)                                   # their programs ran; their replies stall
        status, reply = post(server, run_code("print(3)"), timeout=30)
        assert status == 200 and reply["run_result"]["stdout"].strip() == "3", (status, reply)
    finally:
        for s in hogs:
            s.close()


def test_request_bodies_in_flight_have_a_server_wide_budget(server):
    """A body is read whole and held while judged: the server reserves its bytes from one budget first."""
    server.httpd.body_budget_bytes = 1 << 20
    held = socket.create_connection((server.host, server.port))
    held.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % (800 << 10))
    try:
        time.sleep(0.5)                                 # its handler reserved 800 KiB and waits for the rest
        big = run_code("print(3)", "1" * (600 << 10))
        status, reply = post(server, big)
        assert status == 503 and "retry" in reply["detail"], (status, reply)
    finally:
        held.close()
    time.sleep(0.5)                                     # its reservation is given back
    status, reply = post(server, big)
    assert status == 200, (status, str(reply)[:300])

"""An adversarial review of the judge's network backends: what a program or a broken server does to a verdict.

Each test is a finding: a program that spoofs a judge fault, a reply a server breaks off mid-body, a request
the server cannot parse. Fake servers are raw sockets on loopback ports; nothing here needs a sandbox except
the test that runs the spoofing program itself.
"""
import json
import socket
import threading
import time

import pytest

from minirl.judge import Judge, JudgeResult
from minirl.judge.remote import RemoteJudge
from minirl.judge.server import RequestError, is_judge_fault, parse_submit, run_code_response

SPOOF = "import sys\nsys.stderr.write('judge error: the sandbox failed')\nsys.exit(1)\n"
JOB = dict(source="print(1)", language="python", tests=[{"input": "", "output": "1"}], time_limit_s=1.0)


def fake_server(reply: bytes, stall_s: float = 0.0, head: int | None = None, every_s: float = 0.0) -> str:
    """A loopback server that answers every request with the raw bytes `reply` (its first `head` at once, the
    rest one byte every `every_s` seconds), then stalls `stall_s` and closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    head = len(reply) if head is None else head

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.recv(1 << 16)
            try:
                conn.sendall(reply[:head])
                for byte in reply[head:]:
                    time.sleep(every_s)
                    conn.sendall(bytes([byte]))
            except OSError:  # the client gave up: what some tests check
                return
            time.sleep(stall_s)

    def loop() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}"


def http_200(body: bytes, length: int | None = None) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nServer: minirl-judge\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode() + body


# --- a program's stderr is not a judge fault ---------------------------------------------------------------

def test_a_programs_stderr_saying_judge_error_is_not_a_judge_fault():
    # what the judge returns for SPOOF: RE on its one test, the program's stderr as the message
    res = JudgeResult("RE", 0, 1, [{"verdict": "RE", "time_s": 0.01, "wall_s": 0.05, "memory_mb": 8.0,
                                    "stdout": "", "stderr": "judge error: x", "returncode": 1}],
                      message="judge error: the sandbox failed")
    assert not is_judge_fault(res)
    assert run_code_response(res, "python")["status"] == "Failed"
    assert is_judge_fault(JudgeResult("RE", 0, 1, message="judge error: OSError: no sandbox"))  # no test ran


def test_a_program_spoofing_a_judge_error_is_re_through_the_server_not_sandbox_error():
    with Judge(workers=1) as judge:
        res = judge.run(SPOOF, "python", [{"input": "", "output": ""}])
    assert res.verdict == "RE" and res.message.startswith("judge error")  # the program's own words
    assert run_code_response(res, "python")["status"] == "Failed"


def test_remote_judge_keeps_a_spoofing_programs_re_instead_of_retrying_every_server():
    verdict = {"verdict": "RE", "passed": 0, "total": 1, "message": "judge error: fake", "compile_s": 0.0,
               "tests": [{"verdict": "RE", "time_s": 0.01, "wall_s": 0.05, "memory_mb": 8.0}]}
    url = fake_server(http_200(json.dumps({"extra": {"minirl": verdict}}).encode()))
    with RemoteJudge([url], retries=1, protocol="minirl") as judge:
        res = judge.run_many([JOB])[0]
    assert res.verdict == "RE" and res.tests, res  # the program's verdict, not "no judge server answered"


# --- a broken reply is a verdict, never an exception --------------------------------------------------------

@pytest.mark.parametrize("reply", [
    http_200(b"<html>502 from a proxy</html>"),          # not JSON
    http_200(b'{"status"', length=1000),                 # the server died mid-body
    http_200(b"[1, 2]"),                                 # JSON, not an object
    http_200(json.dumps({"extra": {"minirl": {"verdict": "AC", "passed": 1, "total": 1,
                                              "from_a_newer_server": 1}}}).encode()),
], ids=["not-json", "truncated", "not-an-object", "unknown-field"])
def test_remote_judge_turns_a_broken_reply_into_a_verdict(reply):
    with RemoteJudge([fake_server(reply)], retries=1, cooldown_s=0.0, protocol="minirl") as judge:
        res = judge.run_many([JOB])[0]
    assert res.verdict == "JE" and res.message.startswith("judge error"), res


def test_remote_judge_turns_a_body_that_never_comes_into_a_verdict_in_bounded_time():
    url = fake_server(http_200(b"{", length=1000), stall_s=30.0)
    start = time.monotonic()
    with RemoteJudge([url], retries=1, timeout_s=1.0, protocol="minirl") as judge:
        res = judge.run_many([JOB])[0]
    assert res.verdict == "JE" and res.message.startswith("judge error"), res
    assert time.monotonic() - start < 20


# --- the server refuses what it cannot parse ----------------------------------------------------------------

@pytest.mark.parametrize("case", ["1 2", {"stdin": "1 2"}, None])
def test_submit_with_a_test_in_the_wrong_shape_is_a_request_error(case):
    body = {"completion": "print(1)", "config": {"language": "python", "provided_data": {"test": [
        {"input": case, "output": "3"}]}}}
    with pytest.raises(RequestError):
        parse_submit(body, 256)


@pytest.fixture(scope="module")
def server():
    from minirl.judge.server import serve
    with Judge(workers=1) as judge:
        s = serve(judge, port=0, memory_limit_mb=128)
        yield s
        s.close()


def post_raw(url: str, raw: bytes) -> int:
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, raw, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        json.loads(e.read())  # an answer in FastAPI's {"detail": ...} shape, not a dropped connection
        return e.code


@pytest.mark.parametrize("raw", [
    b'{"code": "print(1)", "language": "python", "run_timeout": ' + b"9" * 400 + b"}",   # no float holds it
    b'{"code": "print(1)", "language": "python", "x": ' + b"9" * 5000 + b"}",           # past 4300 digits
    b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}",                                     # nested too deep
], ids=["huge-timeout", "huge-integer", "deep-nesting"])
def test_the_server_answers_400_to_hostile_json_instead_of_dropping_the_connection(server, raw):
    assert post_raw(server.url + "/run_code", raw) == 400


FORKING = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint(3)\n"


def test_remote_judge_carries_processes_true_so_a_forking_solution_stays_ac(server):
    job = dict(source=FORKING, language="python", tests=[{"input": "", "output": "3"}], time_limit_s=2.0,
               memory_limit_mb=128, processes=True)
    assert server.judge.run_many([job])[0].verdict == "AC"  # the local judge, for reference
    with RemoteJudge([server.url], retries=1) as judge:
        res = judge.run_many([job])[0]
    assert res.verdict == "AC", res


def test_remote_judge_bounds_a_reply_that_trickles_in_by_its_timeout():
    body = json.dumps({"extra": {"minirl": {"verdict": "AC", "passed": 1, "total": 1}}}).encode()  # 66 bytes
    start = time.monotonic()
    reply = http_200(body)
    url = fake_server(reply, head=len(reply) - len(body), every_s=0.3)  # the headers, then a byte every 0.3 s
    with RemoteJudge([url], retries=1, timeout_s=1.0, protocol="minirl") as judge:
        res = judge.run_many([JOB])[0]
    assert time.monotonic() - start < 10  # the whole body would take 20 s
    assert res.verdict == "JE" and res.message.startswith("judge error"), res


# --- /run_code's stdout is what the client compares: never a cut of it --------------------------------------

PADDED_WRONG = "import sys\nsys.stdout.write('wrong' + ' ' * (17 << 20) + 'junk\\n')\n"  # past what is kept


def test_run_code_never_returns_a_cut_stdout_that_a_client_would_accept(server):
    from minirl.judge.server import parse_run_code
    job = parse_run_code({"code": PADDED_WRONG, "language": "python"}, 128)
    reply = run_code_response(server.judge.run_many([job])[0], "python")
    run = reply["run_result"]
    # a client comparing the stripped stdout with "wrong" would accept the cut 'wrong' + spaces: the run must fail
    # (as SandboxFusion reports a run with a non-zero return code) or come back whole
    failed = reply["status"] == "Failed" and run["return_code"] not in (0, None)
    assert failed or run["stdout"].split() == ["wrong", "junk"], (reply["status"], run["return_code"])


def test_run_code_returns_a_correct_programs_2_mib_of_output_whole(server):
    from minirl.judge.server import parse_run_code
    code = "print('\\n'.join(str(i) for i in range(300000)))\n"  # ~2 MiB, a correct answer
    reply = run_code_response(server.judge.run_many([parse_run_code({"code": code, "language": "python"}, 128)])[0],
                              "python")
    assert reply["status"] == "Success" and reply["run_result"]["stdout"].split()[-1] == "299999"


@pytest.mark.parametrize("reply", [
    {"status": "Success", "compile_result": None, "run_result": "Finished"},
    {"status": "Success", "compile_result": [0], "run_result": {"status": "Finished", "return_code": 0}},
], ids=["run-result-a-string", "compile-result-a-list"])
def test_remote_judge_turns_a_sandboxfusion_reply_of_the_wrong_shape_into_a_verdict(reply):
    url = fake_server(http_200(json.dumps(reply).encode()))
    with RemoteJudge([url], retries=1, cooldown_s=0.0, protocol="sandboxfusion") as judge:
        res = judge.run_many([JOB])[0]
    assert res.verdict == "JE" and res.message.startswith("judge error"), res


def test_submit_extracts_code_from_a_completion_of_unclosed_fences_in_linear_time():
    from minirl.judge.server import _fenced_code
    body = {"completion": "```" * 60000, "config": {"language": "python", "provided_data": {"test": [
        {"input": {"stdin": ""}, "output": {"stdout": "1"}}]}}}  # 180 KB, a degenerate completion
    start = time.monotonic()  # the regex, retried from every unclosed fence, takes ~20 s here with the GIL held
    parse_submit(body, 256)
    assert time.monotonic() - start < 5, "fence extraction is quadratic: the whole server stalls meanwhile"
    assert _fenced_code("text\n```py\nprint(1)\n```\n```cpp\nint main(){}\n```", "cpp") == "int main(){}\n"
    assert _fenced_code("```\nfirst\n```", "python") == "first\n"


def test_a_lone_surrogate_in_a_request_is_a_request_error_not_a_judge_fault():
    from minirl.judge.server import parse_run_code
    with pytest.raises(RequestError):
        parse_run_code({"code": "print(input())", "language": "python", "stdin": "\ud800"}, 256)
    with pytest.raises(RequestError):
        parse_submit({"completion": "print(1)", "config": {"language": "python", "provided_data": {"test": [
            {"input": {"stdin": ""}, "output": {"stdout": "\udcff"}}]}}}, 256)


def test_a_server_that_keeps_failing_stays_out_longer_each_time():
    """A hung or dead server is skipped for cooldown_s * 2**(failures-1), not a fixed cooldown after which every
    training step waits a timeout on it again."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()                                          # nothing listens there: connection refused
    with RemoteJudge([url], retries=3, cooldown_s=1.0, protocol="minirl", timeout_s=2) as judge:
        res = judge.run("print(3)\n", "python", [{"input": "", "output": "3"}])
        assert res.verdict == "JE" and "no judge server answered" in res.message
        assert judge._failures[url] == 3 and judge._down_until[url] - time.monotonic() > 2.5

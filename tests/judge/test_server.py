"""minirl's judge behind SandboxFusion's API: the official client and veRL's reward code get SandboxFusion's answers."""
import importlib.util
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from judge_programs import AB, MEMORY_MB, PROGRAMS, TIME_LIMIT_S
from minirl.judge import Judge
from minirl.judge.server import serve

sandbox_fusion = pytest.importorskip("sandbox_fusion")

# what SandboxFusion reports for each minirl verdict: (status, compile return code, run status, run return code)
SANDBOXFUSION = {
    "AC": ("Success", 0, "Finished", 0),
    "WA": ("Success", 0, "Finished", 0),
    "CE": ("Failed", 1, None, None),
    "TLE": ("Failed", 0, "TimeLimitExceeded", None),
    "RE": ("Failed", 0, "Finished", "non-zero"),
    "MLE": ("Failed", 0, "Finished", "non-zero"),
}
# veRL's check_correctness codes on AB: True/False per test, -2 runtime error, -3 timeout, -4 compile error
VERL = {"AC": [True, True], "WA": [True, False], "CE": [-4, -4], "TLE": [-3, -3], "RE": [-2, -2], "MLE": [-2, -2]}


@pytest.fixture(scope="module")
def server():
    with Judge(workers=2) as judge:
        s = serve(judge, port=0, memory_limit_mb=MEMORY_MB)  # the default for requests that give none
        yield s
        s.close()


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("name,language,source,verdict", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_official_client_gets_what_sandboxfusion_reports(server, name, language, source, verdict):
    from sandbox_fusion import RunCodeRequest, run_code
    resp = run_code(RunCodeRequest(code=source, language=language, stdin="5 7\n", run_timeout=TIME_LIMIT_S),
                    endpoint=server.url, max_attempts=1)
    status, compile_rc, run_status, run_rc = SANDBOXFUSION[verdict]
    if language == "python" and verdict == "CE":  # SandboxFusion runs python directly: a syntax error exits 1
        status, compile_rc, run_status, run_rc = "Failed", None, "Finished", "non-zero"
    if language == "python":  # nothing is compiled: no compile_result
        compile_rc = None
    assert resp.status == status, resp
    assert (resp.compile_result.return_code if resp.compile_result else None) == compile_rc
    assert (resp.run_result.status if resp.run_result else None) == run_status
    if run_rc == "non-zero":
        assert resp.run_result.return_code not in (0, None)
    else:
        assert (resp.run_result.return_code if resp.run_result else None) == run_rc
    if verdict in ("AC", "WA"):
        assert resp.run_result.stdout == ("12\n" if verdict == "AC" else "3\n")


def _verl_utils():
    spec = importlib.util.find_spec("verl")  # verl's own __init__ needs its heavy deps: load only this file
    if spec is None:
        pytest.skip("verl is not installed (requirements-nodeps.txt)")
    path = Path(spec.origin).parent / "utils" / "reward_score" / "sandbox_fusion" / "utils.py"
    module_spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,language,source,verdict", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_verl_check_correctness_scores_like_sandboxfusion(server, name, language, source, verdict):
    utils = _verl_utils()
    in_outs = {"inputs": [t["input"] for t in AB], "outputs": [t["output"] + "\n" for t in AB]}
    results, _ = utils.check_correctness(server.url + "/run_code", in_outs, source, timeout=1,  # veRL's timeout is whole seconds
                                        
                                         memory_limit_mb=MEMORY_MB, language=language)
    expected = VERL[verdict] if not (language == "python" and verdict == "CE") else [-2, -2]
    assert results == expected


def test_missing_memory_limit_is_the_servers_default(server):
    big = "x = bytearray(200 * 1024**2)\nprint(len(x) > 0)\n"  # over the server's 128 MiB, under 512
    body = {"code": big, "language": "python", "stdin": "", "run_timeout": 5}
    assert post(server.url + "/run_code", body)[1]["status"] == "Failed"
    assert post(server.url + "/run_code", {**body, "memory_limit_MB": -1})[1]["status"] == "Failed"
    status, reply = post(server.url + "/run_code", {**body, "memory_limit_MB": 512})
    assert (status, reply["status"], reply["run_result"]["stdout"]) == (200, "Success", "True\n")


def test_a_request_over_the_servers_memory_cap_is_refused_with_the_cap_named(server):
    """Every worker may hold a request's limit at once: a client must not size the host (a 1 TiB limit would
    let its programs take the machine)."""
    body = {"code": "print(1)\n", "language": "python", "stdin": "", "run_timeout": 5,
            "memory_limit_MB": 1 << 20}
    status, reply = post(server.url + "/run_code", body)
    assert status == 400 and "cap of 4096 MB" in json.dumps(reply) and "--max-memory-mb" in json.dumps(reply)
    status, reply = post(server.url + "/run_code", {**body, "memory_limit_MB": 4096})
    assert (status, reply["status"]) == (200, "Success")


def test_submit_judges_a_commonoj_program_and_gives_minirls_verdict(server):
    from sandbox_fusion import SubmitRequest, TestConfig, submit
    tests = [{"input": {"stdin": t["input"]}, "output": {"stdout": t["output"]}} for t in AB]
    res = submit(SubmitRequest(dataset="commonoj", id=7, completion=f"Here:\n```python\n{PROGRAMS[3][2]}```\n",
                               config=TestConfig(language="python", provided_data={"test": tests})),
                 endpoint=server.url, max_attempts=1)
    assert (res.id, res.accepted, res.extracted_code) == (7, False, PROGRAMS[3][2])
    assert [t.passed for t in res.tests] == [True, False]
    assert (res.extra["minirl"]["verdict"], res.extra["minirl"]["passed"]) == ("WA", 1)


@pytest.mark.parametrize("change,word", [({"language": "java"}, "language"), ({"files": {"a.txt": "eA=="}}, "files"),
                                         ({"fetch_files": ["out.txt"]}, "fetch_files"), ({"code": None}, "code")])
def test_unsupported_requests_get_a_400_naming_the_field(server, change, word):
    status, reply = post(server.url + "/run_code", {"code": "print(1)", "language": "python", **change})
    assert status == 400 and word in reply["detail"]


def test_ping_answers_pong(server):
    with urllib.request.urlopen(server.url + "/v1/ping", timeout=10) as r:
        assert json.loads(r.read()) == "pong" and r.headers["Server"] == "minirl-judge"

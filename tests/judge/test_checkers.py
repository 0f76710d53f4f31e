"""A row's special checker (ground truth `checker`: {"source", "language"}) reaches the judge from every path:
the scorer's request, the local pool, minirl's judge server through RemoteJudge, and the preparation script keeps
the problems that carry one. The problem: print any divisor of n greater than 1 (several right answers)."""
import json
import sys

from conftest import ROOT
from minirl.judge import Judge
from minirl.rewards import Scorer, judge_request

CHECKER = {"language": "python", "source": (
    "import sys\nn = int(open(sys.argv[1]).read())\nout = open(sys.argv[3]).read().split()\n"
    "sys.exit(0 if len(out) == 1 and out[0].isdigit() and 1 < int(out[0]) <= n and n % int(out[0]) == 0 else 1)\n")}
TRUTH = {"language": "python", "tests": [{"input": "12\n", "output": "2"}], "checker": CHECKER}
ROW = {"data_source": "toy_code", "ability": "code", "reward_model": {"ground_truth": json.dumps(TRUTH)}}
# 12 % 3 == 0: right, though the expected output says 2; 5 does not divide 12
ANSWERS = ["```python\nprint(3)\n```", "```python\nprint(5)\n```"]


def test_the_rows_checker_is_in_the_judge_request_and_decides_the_local_verdict():
    assert judge_request("print(3)", TRUTH)["checker"] == CHECKER
    with Judge(workers=1) as judge:
        details = Scorer(judge).details(ANSWERS, [ROW, ROW])
    assert [d["verdict"] for d in details] == ["AC", "WA"]  # before: the checker was dropped, 3 was WA


def test_the_checker_reaches_minirls_judge_server_through_remote_judge():
    from test_remote import start_server, stop
    from minirl.judge.remote import RemoteJudge
    proc, url = start_server()
    try:
        with RemoteJudge([url]) as judge:
            details = Scorer(judge).details(ANSWERS, [ROW, ROW])
    finally:
        stop(proc)
    assert [d["verdict"] for d in details] == ["AC", "WA"]  # before: refused ("local Judge only")


def test_preparation_keeps_a_problem_that_carries_its_checker(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from prepare_codecontests import prepare
    statement = "Given n, print any divisor of n that is greater than 1. " * 2
    raw = {"name": "divisor", "statement": statement, "tests": TRUTH["tests"], "time_limit_seconds": 2,
           "validation": "custom", "checker": CHECKER}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(raw) + "\n" + json.dumps({**raw, "name": "no checker", "checker": None}) + "\n")
    rows, dropped = prepare(path, "python", "train", max_tests=5)
    assert dropped == {"needs a jury checker": 1} and len(rows) == 1
    assert json.loads(rows[0]["reward_model"]["ground_truth"])["checker"] == CHECKER


# --- a checker is the request's program too: the server's limits hold for it (review of issue 50) ---------------

def _submit(url: str, checker: str, processes: bool = False, run_timeout: float = 1.0) -> tuple[int, dict]:
    """POST /submit of a program that prints nothing, judged by `checker` (Python), as the reviewer's repro does."""
    import urllib.error
    import urllib.request
    body = {"dataset": "minirl", "id": 0, "completion": "pass", "config": {
        "language": "python", "run_timeout": run_timeout,
        "provided_data": {"test": [{"input": {"stdin": ""}, "output": {"stdout": "x"}}]},
        "extra": {"minirl": {"memory_limit_mb": 64, "processes": processes,
                             "checker": {"source": checker, "language": "python"}}}}}
    req = urllib.request.Request(url + "/submit", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# each exits 0 (accepts the empty output) only if it got what the request did not give its program
OVER_MEMORY = "import sys\nb = bytearray(700 << 20)\nsys.exit(0)\n"                         # 700 MiB > the cap of 64
FORKS = ("import subprocess, sys\nr = subprocess.run(['/bin/sh', '-c', 'echo forked'], capture_output=True)\n"
         "sys.exit(0 if r.stdout.strip() == b'forked' else 1)\n")                           # processes=False
OVER_CPU = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 4: pass\nsys.exit(0)\n"


def test_a_client_checker_gets_the_jobs_limits_not_more_from_the_judge_server():
    """Before: a checker ran with 1024 MiB, processes and 10 s of CPU whatever --max-memory-mb, processes=False and
    run_timeout said, so each of these attacks was accepted (AC)."""
    from minirl.judge.server import serve
    with Judge(workers=1) as judge:
        server = serve(judge, port=0, memory_limit_mb=64, max_memory_mb=64)
        try:
            answers = {name: _submit(server.url, src) for name, src in
                       [("memory", OVER_MEMORY), ("forks", FORKS), ("cpu", OVER_CPU)]}
            # the other mode: a job that may start processes (the strict judge holds them only with cgroups)
            allowed = _submit(server.url, FORKS, processes=True)
        finally:
            server.close()
        cgroups = judge.cgroups is not None
    for name, (status, reply) in answers.items():
        verdict = reply["extra"]["minirl"]
        assert status == 200 and verdict["verdict"] != "AC", (name, verdict)
        assert verdict["verdict"] in ("WA", "JE") if name == "cpu" else verdict["verdict"] == "WA", (name, verdict)
    status, reply = allowed
    if cgroups:  # processes given to the job are the checker's too: the same checker accepts
        assert status == 200 and reply["extra"]["minirl"]["verdict"] == "AC", reply
    else:        # strict isolation refuses processes without cgroups: the client's request, 400
        assert status == 400 and "needs cgroups" in reply["detail"], reply

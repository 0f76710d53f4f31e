"""Attacks on the judge from outside the program: a worker's sandbox killed mid-batch, a server that is gone.
Each program the judge could not judge is JE (a judge error), never a verdict such as RE that a trainer would
reward; the judge keeps judging afterwards."""
import os
import signal
import socket
import threading
import time

import pytest

from minirl.judge import Judge
from minirl.judge.remote import RemoteJudge
from minirl.judge.verdict import is_refusal
from minirl.rewards import Scorer

AB = [{"input": "1 2\n", "output": "3"}]
SLOW = "import time\ntime.sleep(0.3)\na, b = map(int, input().split())\nprint(a + b)\n"


def test_a_worker_sandbox_killed_mid_batch_gives_judge_errors_not_runtime_errors():
    with Judge(workers=2) as judge:
        if judge.isolation != "namespaces":
            import pytest
            pytest.skip("worker sandboxes are kept only in namespaces mode")
        killed = []

        def kill_the_sandboxes():  # as soon as both workers' sandboxes run a program
            deadline = time.monotonic() + 60
            while len([b for b in list(judge._boxes.values()) if b.alive]) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            for box in list(judge._boxes.values()):
                os.kill(box._proc.pid, signal.SIGKILL)
                killed.append(box._proc.pid)
        killer = threading.Thread(target=kill_the_sandboxes)
        killer.start()
        results = judge.run_many([dict(source=SLOW, language="python", tests=AB * 3, time_limit_s=2.0)
                                  for _ in range(4)])
        killer.join()
        assert len(killed) == 2
        verdicts = [r.verdict for r in results]
        assert "JE" in verdicts and set(verdicts) <= {"AC", "JE"}, [(r.verdict, r.message) for r in results]
        assert all(r.message.startswith("judge error") for r in results if r.verdict == "JE")
        # new sandboxes replace the dead ones: the next batch is judged
        after = judge.run_many([dict(source=SLOW, language="python", tests=AB, time_limit_s=2.0)] * 2)
        assert [r.verdict for r in after] == ["AC", "AC"]


def test_a_stopped_server_gives_judge_errors_that_are_no_reward():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the with ends: nothing listens there
    with RemoteJudge([f"http://127.0.0.1:{port}"], retries=1, cooldown_s=0.01) as judge:
        res = judge.run("print(3)", "python", AB)
        assert (res.verdict, res.passed) == ("JE", 0) and "no judge server answered" in res.message
        completions = ["```python\nprint(3)\n```", "```python\nprint(4)\n```", "no code", "no code"]
        row = {"data_source": "toy_code", "ability": "code",
               "reward_model": {"ground_truth": {"language": "python", "tests": AB}}}
        details = Scorer(judge).details(completions, [row] * 4)
    assert [d["verdict"] for d in details] == ["JE", "JE", "no code", "no code"]
    assert [d["reward"] != d["reward"] for d in details] == [True, True, False, False]  # NaN: no reward


def test_a_program_that_exits_with_the_sandboxes_own_failure_code_is_a_runtime_error_not_a_judge_error():
    # 111 is sandbox.c's "could not set up" status; a program may exit with it too. Were that a judge error, any
    # program could dodge its negative reward (JE is no reward) and stop a run past max_judge_error_share.
    with Judge(workers=1) as judge:
        results = judge.run_many([dict(source="import sys\nsys.exit(111)\n", language="python", tests=AB),
                                  dict(source="int main() { return 111; }", language="cpp", tests=AB)])
    assert [r.verdict for r in results] == ["RE", "RE"], [(r.verdict, r.message) for r in results]


# --- the judge's own failures around the program: the compiler's and the checker's (review of issue 50) ----------

def _adder(nonce: str) -> str:
    """A right C++ program, new to the compile cache (`nonce` changes its hash)."""
    return f"// {nonce}\nint main(){{int a,b;__builtin_scanf(\"%d%d\",&a,&b);__builtin_printf(\"%d\",a+b);}}\n"


def test_a_compiler_whose_sandbox_failed_or_that_the_wall_clock_stopped_is_a_judge_error_not_a_compile_error(
        monkeypatch):
    """Before: compile_cpp returned no binary for the sandbox's rc 111 and for a wall-clock timeout, and prepare
    called that CE: a negative reward for the judge's fault. Neither is cached: the next compile is judged."""
    import uuid
    import minirl.judge.compile as compile_module
    real, nonce = compile_module._run_compiler, uuid.uuid4().hex
    with Judge(workers=1) as judge:
        for fake in [(111, "sandbox: mount: Cannot allocate memory"), ("timeout", "compilation timed out")]:
            monkeypatch.setattr(compile_module, "_run_compiler", lambda *a, fake=fake: fake)
            res = judge.run(_adder(nonce), "cpp", AB)
            assert res.verdict == "JE" and res.message.startswith("judge error"), (fake, res)
        monkeypatch.setattr(compile_module, "_run_compiler", real)
        assert judge.run(_adder(nonce), "cpp", AB).verdict == "AC"


CHECKER_EXITS = "import sys\nsys.exit({})\n"


def test_a_checker_that_gave_no_verdict_is_a_judge_error_and_one_that_rejects_is_a_wrong_answer():
    """The checker's exit code: 0 accepts, 1 rejects (WA); 111 (the sandbox's failure), 3 (testlib's "checker
    failure") and a wall-clock stop with its CPU time unspent (a loaded host) give no verdict: JE, not WA."""
    sleeps = "import time\ntime.sleep(30)\n"
    checkers = [CHECKER_EXITS.format(0), CHECKER_EXITS.format(1), CHECKER_EXITS.format(111),
                CHECKER_EXITS.format(3), sleeps]
    with Judge(workers=1) as judge:
        results = judge.run_many([dict(source="print(3)", language="python", tests=AB, time_limit_s=1.0,
                                       checker={"language": "python", "source": c}) for c in checkers])
    assert [r.verdict for r in results] == ["AC", "WA", "JE", "JE", "JE"], [(r.verdict, r.message) for r in results]
    assert "checker" in results[2].message and "wall-clock" in results[4].message


# testlib's habit: _fail (exit 3) when the participant's answer beats the jury's, on a minimisation problem
BEATS_THE_JURY = ("import sys\nj = int(open(sys.argv[2]).read()); p = int(open(sys.argv[3]).read())\n"
                  "sys.exit(1 if p > j else 3 if p < j else 0)\n")


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroups", "no-cgroups"])
def test_a_checker_failure_caused_by_the_programs_answer_is_a_wrong_answer_not_a_judge_error(cgroups):
    """Before: exit code 3 was always JE, so a wrong program printing 0 on a minimisation problem whose testlib
    checker fails on answers better than the jury's dodged its negative reward (JE is masked out). Now the checker
    judges the jury's own answer too: it accepts it, so the failure is the program's (WA); a checker that fails
    on the jury's answer as well is still the job's fault (JE, refused)."""
    tests = [{"input": "5\n", "output": "7"}, {"input": "6\n", "output": "7"}]
    always_fails = CHECKER_EXITS.format(3)
    jobs = [dict(source=src, language="python", tests=tests, checker={"language": "python", "source": chk})
            for src, chk in [("print(7)", BEATS_THE_JURY), ("print(8)", BEATS_THE_JURY),
                             ("print(0)", BEATS_THE_JURY), ("print(0)", BEATS_THE_JURY), ("print(7)", always_fails)]]
    with Judge(workers=1, cgroups=cgroups) as judge:
        results = judge.run_many(jobs)
    assert [r.verdict for r in results] == ["AC", "WA", "WA", "WA", "JE"], [(r.verdict, r.message) for r in results]
    assert is_refusal(results[4]) and "jury's own answer" in results[4].message, results[4]


def test_a_job_refused_for_what_it_asks_is_a_400_that_no_client_retries():
    """A checker that does not compile, or processes=True where the strict judge has no cgroups, is the request's
    doing: before, the server answered SandboxError and RemoteJudge retried it on every server, marking healthy
    servers down. Now: HTTP 400, one request, no server marked down, JE (no reward) for the trainer."""
    import json
    import urllib.error
    import urllib.request
    from minirl.judge.server import serve
    with Judge(workers=1, cgroups=False) as judge:
        judge.strict = True                       # as require_isolation(judge, "strict") sets it
        server = serve(judge, port=0)
        try:
            bad_checker = dict(source="print(3)", language="python", tests=AB,
                               checker={"language": "cpp", "source": "this is not C++"})
            forks = dict(source="print(3)", language="python", tests=AB, processes=True)
            with RemoteJudge([server.url], retries=3, cooldown_s=0.01, protocol="minirl") as remote:
                results = remote.run_many([bad_checker, forks])
                assert remote._failures == {} and remote._down_until == {}   # the server is healthy
            body = {"dataset": "minirl", "id": 0, "completion": "print(3)", "config": {
                "language": "python", "provided_data": {"test": [{"input": {"stdin": ""}, "output": {"stdout": "3"}}]},
                "extra": {"minirl": {"checker": {"language": "cpp", "source": "this is not C++"}}}}}
            req = urllib.request.Request(server.url + "/submit", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=60)
                status = 200
            except urllib.error.HTTPError as e:
                status, detail = e.code, json.loads(e.read())["detail"]
        finally:
            server.close()
    assert status == 400 and "does not compile" in detail, status
    assert [r.verdict for r in results] == ["JE", "JE"]
    assert "refused" in results[0].message and "does not compile" in results[0].message, results[0]
    assert "refused" in results[1].message and "needs cgroups" in results[1].message, results[1]


def test_the_staging_tmpfs_holds_a_largest_binary_for_every_worker_uid():
    """Before: a fixed 2 GiB for every judge of the host, so 16 workers staging 128 MiB binaries (the compiler's
    file limit) filled it, and a program's own binary became a judge error (StageFull). Now it grows (never
    shrinks) with the highest worker uid that stages."""
    import pytest
    from minirl.judge.compile import COMPILE_FILE_BYTES
    from minirl.judge.host import STAGE, UID_RANGE, stage_dir
    if os.geteuid() != 0:
        pytest.skip("the staging tmpfs is mounted by root only")
    uid = UID_RANGE.start + 23                      # the 24th worker of the host
    stage_dir(uid)
    if not os.path.ismount(STAGE):
        pytest.skip("no tmpfs can be mounted here")
    st = os.statvfs(STAGE)
    assert st.f_blocks * st.f_frsize >= 24 * COMPILE_FILE_BYTES

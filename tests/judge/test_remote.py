"""RemoteJudge: a local Judge's verdicts from judge servers, through a server's death and when all are down."""
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from judge_programs import AB, MEMORY_MB, PROGRAMS, eval_verdicts, jobs, summary, train_verdicts
from judge_programs import local_eval, local_train, local_verdicts  # noqa: F401 -- fixtures
from minirl.judge.remote import RemoteJudge


def start_server() -> tuple[subprocess.Popen, str]:
    """`python -m minirl.judge.server` on a free loopback port, as a user starts it."""
    proc = subprocess.Popen([sys.executable, "-m", "minirl.judge.server", "--port", "0", "--workers", "1",
                             "--memory-limit-mb", str(MEMORY_MB)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "... serving SandboxFusion's API on http://127.0.0.1:PORT"
    assert "http://127.0.0.1:" in line, line
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def servers():
    procs = [start_server() for _ in range(2)]
    yield [url for _, url in procs]
    for proc, _ in procs:
        stop(proc)


def test_remote_judge_gives_the_local_judges_verdicts(servers, local_verdicts):
    with RemoteJudge(servers, concurrency=2) as judge:
        results = judge.run_many(jobs())
    assert summary(results) == local_verdicts
    assert [r.verdict for r in results] == [p[3] for p in PROGRAMS]


def test_sandboxfusion_protocol_gives_the_same_verdicts(servers, local_verdicts):
    """One /run_code per test, outputs compared client-side: what RemoteJudge does against a real SandboxFusion."""
    with RemoteJudge(servers, concurrency=2, protocol="sandboxfusion") as judge:
        assert summary(judge.run_many(jobs())) == local_verdicts


def test_a_server_killed_mid_batch_leaves_the_batch_to_the_other(servers):
    proc, url = start_server()
    slow = "import time\ntime.sleep(0.4)\na, b = map(int, input().split())\nprint(a + b)\n"
    batch = [dict(source=slow, language="python", tests=AB[:1], time_limit_s=2.0) for _ in range(12)]
    killer = threading.Timer(1.0, os.kill, (proc.pid, signal.SIGKILL))  # ~2 programs into its ~6
    killer.start()
    try:
        with RemoteJudge([url, servers[0]], concurrency=2, cooldown_s=30) as judge:
            results = judge.run_many(batch)
    finally:
        killer.cancel()
        stop(proc)
    assert proc.returncode == -signal.SIGKILL  # it was killed while the batch ran
    assert summary(results) == [("AC", 1, 1)] * 12


def test_every_server_down_gives_a_judge_error_verdict_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the with ends: nothing listens there
    with RemoteJudge([f"http://127.0.0.1:{port}"], retries=2, cooldown_s=0.1) as judge:
        res = judge.run(PROGRAMS[1][2], "python", AB)
    assert (res.verdict, res.passed, res.total) == ("JE", 0, 2)
    assert res.message.startswith("judge error: no judge server answered")


def test_train_py_with_remote_judges_gets_the_local_rewards(servers, local_train, tmp_path, tiny_path, monkeypatch):
    remote = train_verdicts(tmp_path, tiny_path, monkeypatch, "--judge_backend", "remote",
                            "--judge_urls", ",".join(servers))
    assert remote == local_train
    assert len(local_train[0]) == 8 and {v for v, _, _ in local_train[0]} == {"AC", "WA"}  # the judge decided


def test_eval_py_with_remote_judges_gets_the_local_scores(servers, local_eval, tmp_path, tiny_path, monkeypatch):
    assert eval_verdicts(tmp_path, tiny_path, monkeypatch, "--judge_backend", "remote",
                         "--judge_urls", servers[0]) == local_eval
    assert len(local_eval[0]) == 4


@pytest.mark.parametrize("args,words", [
    (["--judge_backend", "remote"], "at least one server"),
    (["--judge_backend", "remote", "--judge_urls", "10.0.0.5:8080"], "http://"),
    (["--judge_backend", "ray", "--judge_urls", "a:6379,b:6379"], "one Ray address"),
    (["--judge_urls", "http://127.0.0.1:8080"], "judge_backend"),
    (["--judge_backend", "grpc"], "judge_backend")])
def test_judge_config_errors_name_the_field(args, words):
    from minirl.config import ConfigError, parse_config
    with pytest.raises(ConfigError, match=words):
        parse_config(args)


def test_a_job_the_server_refuses_is_not_retried_and_says_why(servers):
    with RemoteJudge(servers, retries=3) as judge:
        res = judge.run(PROGRAMS[1][2], "python", AB, memory_limit_mb=0)  # the server answers 400
    assert (res.verdict, res.passed) == ("JE", 0)
    assert res.message.startswith("judge error: the server refused the job") and "memory_limit" in res.message

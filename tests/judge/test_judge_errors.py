"""Attacks on the judge from outside the program: a worker's sandbox killed mid-batch, a server that is gone.
Each program the judge could not judge is JE (a judge error), never a verdict such as RE that a trainer would
reward; the judge keeps judging afterwards."""
import os
import signal
import socket
import threading
import time

from minirl.judge import Judge
from minirl.judge.remote import RemoteJudge
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

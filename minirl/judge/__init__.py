"""The sandboxed judge: compile and run model-written C++ and Python programs against tests, return a verdict.

    from minirl.judge import Judge
    with Judge() as judge:
        res = judge.run(source, "cpp", tests=[{"input": "1 2\\n", "output": "3"}], time_limit_s=2)

Read in this order: README.md (what is guaranteed, per mode), pool.py (the Judge), verdict.py (one program's
verdict), compare.py (outputs) and checker.py (special checkers), compile.py, worker_sandbox.py, sandbox.py and
sandbox.c (the isolation), stdio.py (what a run reads and writes), host.py and cgroup.py (the host's folders, uids,
cgroups).
"""
from minirl.judge.pool import Judge, default_workers, main, require_isolation
from minirl.judge.verdict import CXX_FLAGS, JUDGE_ERROR, LANGUAGES, VERDICTS, JudgeResult, judge_job, outputs_match

__all__ = ["Judge", "require_isolation", "JudgeResult", "judge_job", "outputs_match", "default_workers", "main",
           "CXX_FLAGS", "LANGUAGES", "VERDICTS", "JUDGE_ERROR"]

"""A Python source's syntax check, run in the sandbox: CE (or TLE) before any test runs.

    failed = python_syntax_check(job / "main.py", job, sandbox, time_limit_s=2, memory_mb=256)
    failed                                   # None, or ("CE", message) / ("TLE", message)

Why not compile() in the judge: CPython's compiler is quadratic in an f-string's replacement fields (100k of
them: 22 s), and in the judging process it would hold the GIL, and every worker thread with it, for that long; an
honest program judged meanwhile got TLE. In the sandbox it is a program like any other, under the job's limits.
"""
from __future__ import annotations

from pathlib import Path

from minirl.judge.compile import tail
from minirl.judge.sandbox import Sandbox

WALL_SLACK_S = 10.0                # a check's wall limit beyond twice its CPU limit: python3's start on a busy host
CHECK = """import sys
try:
    compile(open("main.py", "rb").read(), "main.py", "exec")
except Exception as e:  # SyntaxError, ValueError (NUL), RecursionError, MemoryError: could not run either
    sys.stderr.write(f"{type(e).__name__}: {e}")
    sys.exit(3)
"""


def python_syntax_check(path: Path, rundir: Path, sandbox: Sandbox, time_limit_s: float,
                        memory_mb: int) -> tuple[str, str] | None:
    """None if the source at `path` compiles; else ("CE", the error), or ("TLE", ...) if compiling alone takes
    more CPU time than the time limit (CPython compiles the whole file before it runs a line: every test would be
    TLE). A check stopped at its wall limit says nothing (a loaded host may have stopped it): None, and the tests
    decide, as they would have without a check."""
    r = sandbox.run(["python3", "-I", "-c", CHECK], rundir, "syntax", time_limit_s=time_limit_s,
                    memory_mb=memory_mb, files={"main.py": path}, wall_s=2 * time_limit_s + WALL_SLACK_S)
    try:
        if r["cpu_s"] > time_limit_s:
            return "TLE", "compiling the source alone took longer than the time limit"
        if r["returncode"] == 0 or r["timed_out"]:
            return None
        return "CE", tail(r["err"]) if r["returncode"] == 3 else f"the syntax check failed: {tail(r['err'])}"
    finally:
        r["out"].unlink(missing_ok=True)
        r["err"].unlink(missing_ok=True)

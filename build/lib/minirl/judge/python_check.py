"""A Python source's syntax check, folded into each test's run: no sandbox of its own, no extra python3 start.

    argv = PYTHON_ARGV                       # ["python3", "-I", "-c", WRAPPER]: compiles main.py, then runs it
    syntax_error(r)                          # the SyntaxError message if the run was stopped by one, else None

Each test runs `python3 -I -c WRAPPER` in /work, which compiles main.py and, if that raises (SyntaxError,
ValueError for a NUL byte, RecursionError or MemoryError of a pathological source), writes MARKER and the error
to stderr and exits with SYNTAX_EXIT; otherwise it runs the code object in __main__ as `python3 -I main.py`
would (`__name__ == "__main__"`, `__file__` /work/main.py, sys.argv ["main.py"], no names of its own left
behind). The job is CE at the first such test (verdict.py), with no test counted. A program that writes the
marker and exits 3 itself gets CE: no better than its RE.

Why not compile() in the judge: CPython's compiler is quadratic in an f-string's replacement fields (100k of
them: 22 s), and in the judging process it would hold the GIL, and every worker thread with it, for that long.
In the test's run it is the program's own CPU time: over the time limit it is TLE, as it always was. Why not a
sandboxed run of its own before the tests (the previous design): it was a second sandbox and python3 start per
job, 2.4x the wall time of a one-test Python job (issue 31's review, finding 11), and turned any start-up failure
(python3 cannot load at 16 MiB) into CE where the tests say MLE.
"""
from __future__ import annotations

from pathlib import Path

from minirl.judge.compile import tail

MARKER = "\0minirl-judge: syntax error\0"
SYNTAX_EXIT = 3
WRAPPER = f"""def _minirl_compile():
    import sys
    try:
        with open("main.py", "rb") as f:
            code = compile(f.read(), "/work/main.py", "exec", dont_inherit=True)
    except Exception as e:  # SyntaxError, ValueError (NUL), RecursionError, MemoryError: it cannot run either
        sys.stderr.write({MARKER!r} + type(e).__name__ + ": " + str(e))
        sys.exit({SYNTAX_EXIT})
    sys.argv[:] = ["main.py"]
    return code
__file__, __cached__ = "/work/main.py", None
exec(globals().pop("_minirl_compile")(), globals())
"""
PYTHON_ARGV = ["python3", "-I", "-c", WRAPPER]


def syntax_error(returncode: int, err: Path) -> str | None:
    """The compile error's message if the wrapper stopped the run on one, else None (the run is the program's)."""
    if returncode != SYNTAX_EXIT:
        return None
    text = tail(err)
    return text[len(MARKER):] if text.startswith(MARKER) else None

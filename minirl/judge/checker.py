"""A problem's special checker: prepared once per job, run after each test as `checker input expected actual`.

    checker_run = prepare_checker({"source": ..., "language": "python"}, job_folder, sandbox, CXX_FLAGS)
    ok = run_checker(checker_run, test, out, root, i, sandbox, time_limit_s=2, memory_mb=256, forks=False)

minirl/judge/verdict.py calls both. A checker is the problem's program (the row's, or a judge server's client's),
not the judge's: it runs in the sandbox with the job's own limits, the program's: its memory, its time limit per
test, processes only where the job has them (and the strict judge holds them). It used to get 1 GiB, processes and
10 s of CPU whatever the request said, so a client of the judge server could run anything it liked past
--max-memory-mb and processes=False as a "checker". Exit code 0 accepts and any other rejects (WA), except where
it gave no verdict: the sandbox's failure (111) or the wall clock of a loaded host (CheckerFault, a judge error the
server answers SandboxError), testlib's "checker failure" (3) where the jury's data or checker is at fault (JobRefused,
answered 400).

Exit code 3 alone does not say whose fault it is: testlib checkers `quitf(_fail, ...)` when the participant's answer
beats the jury's (`if (pans < jans)` on a minimisation problem), so a wrong program printing `0` got JE (masked out,
no negative reward; past max_judge_error_share it stopped the run). On exit 3 the checker runs once more with the
jury's answer in the participant's slot: if it accepts that, the jury's data and checker are sound and the failure
came from the program's output (WA); only if it fails on the jury's own answer too is the job refused. That second
verdict is cached by (checker, test, limits) for the process (`_jury_verdicts`): one extra run per test at most.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from minirl.judge.compile import SANDBOX_ERROR, compile_cpp, tail
from minirl.judge.sandbox import Sandbox

TESTLIB_FAIL = 3                   # testlib's _fail: the checker itself failed (a jury bug, an answer better than
                                   # the jury's): no verdict on the program
_JURY_CACHE_SIZE = 4096            # (checker, test) pairs whose jury-answer verdict is remembered
_jury_verdicts: dict[str, bool] = {}  # key (`_jury_key`) -> whether the checker accepts the jury's own answer
_jury_lock = threading.Lock()


class JobRefused(ValueError):
    """A job the judge cannot judge for what it asks (its checker does not compile or says it failed, testlib's
    exit code 3): JE with a REFUSED message (verdict.py), the same on any judge (no retry elsewhere helps)."""


class CheckerFault(RuntimeError):
    """The special checker did not give a verdict for the judge's own reasons (its sandbox failed, the wall clock
    of a loaded host stopped it): a judge error, never the program's WA."""


def prepare_checker(checker: dict, own: Path, sandbox: Sandbox, flags: tuple[str, ...]
                    ) -> tuple[list[str], str, Path]:
    """The checker's (argv, file name in /work, host file), in the job's own folder `own`: a Python checker's
    source written once (tests may run at once and all read it), a C++ checker compiled once, before any test
    runs (JobRefused if it does not compile)."""
    if checker.get("language", "python").startswith("python"):
        (own / "checker.py").write_text(checker["source"])
        return ["python3", "-I", "checker.py"], "checker.py", own / "checker.py"
    binary, message, _ = compile_cpp(checker["source"], flags, sandbox, keep=own / "checker")  # cached
    if binary is None:
        raise JobRefused(f"the special checker does not compile: {message[:500]}")
    return ["./checker"], "checker", binary


def run_checker(checker_run: tuple[list[str], str, Path], test: dict, out: Path, root: Path, i: int,
                sandbox: Sandbox, *, time_limit_s: float, memory_mb: int, forks: bool) -> bool:
    """Whether the checker accepts test `i`'s output `out` (a file in the job's run folder `root`), run with the
    job's limits; CheckerFault or JobRefused where it gave no verdict."""
    sandbox.give(out)                                  # the program's output, root's while it ran
    limits = dict(time_limit_s=time_limit_s, memory_mb=memory_mb, forks=forks)
    rc = _check(checker_run, test, out, root, i, sandbox, f"c{i}", **limits)
    if rc != TESTLIB_FAIL:
        return rc == 0
    # testlib's "checker failure": the jury's (a bug in its data or checker) or the program's (an answer "better"
    # than the jury's): the checker judges the jury's own answer to tell them apart
    key = _jury_key(checker_run, test, limits)
    with _jury_lock:
        jury_ok = _jury_verdicts.get(key)
    if jury_ok is None:
        _write_private(root / f"j{i}.ans", test["output"], sandbox)
        try:
            jury_ok = _check(checker_run, test, root / f"j{i}.ans", root, i, sandbox, f"j{i}", **limits) == 0
        finally:
            (root / f"j{i}.ans").unlink(missing_ok=True)
        with _jury_lock:
            if len(_jury_verdicts) >= _JURY_CACHE_SIZE:
                _jury_verdicts.pop(next(iter(_jury_verdicts)))   # the oldest
            _jury_verdicts[key] = jury_ok
    if jury_ok:  # the checker accepts the jury's answer: the program's output made it fail
        return False
    # the problem's own data or checker: the same on any judge (the server: 400)
    raise JobRefused(f"the special checker failed on test {i} (exit code {TESTLIB_FAIL}, testlib's checker "
                     "failure) and does not accept the jury's own answer either")


def _check(checker_run: tuple[list[str], str, Path], test: dict, out: Path, root: Path, i: int, sandbox: Sandbox,
           name: str, *, time_limit_s: float, memory_mb: int, forks: bool) -> int:
    """One run of the checker on test `i` with `out` (a file the worker uid may read) as the participant's
    answer: 0 (accepts), TESTLIB_FAIL, or 1 for any other rejection (past its CPU time or memory too: the output
    it was given is to blame); CheckerFault where it gave no verdict for the judge's own reasons."""
    _write_private(root / f"{name}.in", test["input"], sandbox)   # its own copy, made after the program ended
    _write_private(root / f"{name}.exp", test["output"], sandbox)
    argv, file_name, path = checker_run
    files = {"input.txt": root / f"{name}.in", "expected.txt": root / f"{name}.exp", "actual.txt": out,
             file_name: path}
    r = sandbox.run(argv + ["input.txt", "expected.txt", "actual.txt"], root, name, time_limit_s=time_limit_s,
                    memory_mb=memory_mb, files=files, forks=forks)
    try:
        rc, over_cpu = r["returncode"], r["cpu_s"] > time_limit_s
        if rc == 0 and not r["timed_out"]:
            return 0
        # the wall clock stopped it before its CPU time was spent: a loaded host, not the output's doing (past its
        # CPU time or memory, the output it was given is to blame: WA)
        why = "the wall-clock limit (a loaded host)" if r["timed_out"] and not over_cpu and not r["oom"] else \
            f"exit code {rc} (the sandbox's failure)" if rc == SANDBOX_ERROR else None
        if why is not None:  # the judge's fault, perhaps not on another judge (the server: SandboxError, retried)
            raise CheckerFault(f"the special checker gave no verdict on test {i}: {why}; {tail(r['err'], 300)}")
        return TESTLIB_FAIL if rc == TESTLIB_FAIL and not r["timed_out"] else 1
    finally:
        for p in (r["out"], r["err"], root / f"{name}.in", root / f"{name}.exp"):
            p.unlink(missing_ok=True)


def _jury_key(checker_run: tuple[list[str], str, Path], test: dict, limits: dict) -> str:
    """The cache key of the checker's verdict on test's own expected answer: the checker file's bytes, the
    test's input and output, the limits it ran with."""
    h = hashlib.sha256(checker_run[2].read_bytes())
    for part in (test["input"], test["output"], repr(sorted(limits.items()))):
        h.update(b"\0" + part.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _write_private(path: Path, text: str, sandbox: Sandbox) -> None:
    """A special checker's copy of a test's input or expected output: readable by the uid running the checker
    and nobody else (outside namespaces a program sees the run folder, where another test of its job may run)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as f:
        f.write(text)
    sandbox.give(path)

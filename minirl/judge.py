"""A sandboxed judge for model-written C++ and Python programs, run by a pool of workers.

    judge = Judge()                                     # workers: this process's share of the cores
    res = judge.run(source, "cpp", tests=[{"input": "1 2\\n", "output": "3"}], time_limit_s=2, memory_limit_mb=256)
    res.verdict, res.passed, res.total                  # "AC" | "WA" | "TLE" | "MLE" | "RE" | "CE" | "OLE"
    results = judge.run_many([dict(source=..., language="python", tests=...), ...])   # parallel, order kept

    python -m minirl.judge --language cpp --source sol.cpp --tests tests.json [--time-limit-s 2] [--memory-limit-mb 256]

The pool: `workers` threads (default: this process's share of the cores, `cores // LOCAL_WORLD_SIZE`), each
driving one sandboxed process at a time (compiler or program): the work happens in those processes, so threads
give the parallelism without a process pool's pitfalls. Each worker runs as a sandbox uid leased for this Judge
alone, host-wide (minirl/sandbox.py: `lease_uids`), so judges of several ranks, or eval.py beside train.py,
never touch each other's programs.

Speed: C++ is compiled once per unique (source, flags), against a force-included precompiled <bits/stdc++.h>
(minirl/compile.py); binaries and compile errors are cached by hash. Python syntax errors are found by
`compile()` in the worker, without running anything, and reported as CE. Jobs run in parallel; the tests of one
program run one after another and stop at the first TLE (every later test would cost a full time limit, and
both reward styles give the same reward from that point). Output is compared as bytes, token by token, and
never decoded (a 64 MiB flood of garbage costs one token).

Failures are verdicts: whatever a program does, `run`/`run_many` return a result for it (a failure of the judge
itself on one job is logged and returned as RE); only a call the caller got wrong (an unknown language) raises.

Isolation: minirl/sandbox.c and sandbox.py (a new root per run, seccomp, cgroups, leased uids; `Judge.isolation`
says which mode this machine allows, the README what each guarantees).
"""
from __future__ import annotations

import concurrent.futures as futures
import json
import logging
import math
import mmap
import os
import queue
import re
import signal
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minirl.cgroup import Cgroups
from minirl.compile import MESSAGE_LIMIT, compile_cpp, pch_dir, tail
from minirl.sandbox import OUTPUT_LIMIT_BYTES, cache_dir, isolation_mode, lease_uids, remove_tree, run_sandboxed

log = logging.getLogger(__name__)
VERDICTS = ("AC", "WA", "TLE", "MLE", "RE", "CE", "OLE")
CXX_FLAGS = ("-std=c++17", "-O2")
PYTHON_SOURCE_LIMIT = 1 << 20      # compile() of a larger source in the judge's own process is not worth the risk
LANGUAGES = {"cpp": "cpp", "c++": "cpp", "python": "python", "python3": "python"}


@dataclass
class JudgeResult:
    verdict: str                   # overall: the first non-AC test's verdict, AC if all passed
    passed: int                    # tests passed
    total: int                     # tests in the job (tests skipped after a TLE count as not passed)
    tests: list[dict] = field(default_factory=list)  # per test run: verdict, time_s, memory_mb
    message: str = ""              # compiler error or the failing test's stderr, truncated
    compile_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# --- comparing -------------------------------------------------------------------------------------------

_TOKEN = re.compile(rb"\S+")       # bytes.split()'s whitespace: space, \t, \n, \r, \v, \f


def outputs_match(actual: bytes | str | mmap.mmap, expected: str, float_tolerance: float | None = None) -> bool:
    """Token-wise and whitespace-insensitive, on bytes; stops at the first mismatch or the first token past the
    expected ones, so 64 MiB of garbage costs one token. With a tolerance, numeric tokens match if both are
    finite and |a-b| <= tol*max(1,|b|) (an expected "inf" must then be printed as the same token)."""
    want = expected.encode().split()
    actual = actual.encode() if isinstance(actual, str) else actual
    n = 0
    for m in _TOKEN.finditer(actual):
        if n == len(want):
            return False
        x, y = m.group(), want[n]
        n += 1
        if x != y and not (float_tolerance is not None and _close(x, y, float_tolerance)):
            return False
    return n == len(want)


def _close(x: bytes, y: bytes, tol: float) -> bool:
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return False
    return math.isfinite(fx) and math.isfinite(fy) and abs(fx - fy) <= tol * max(1.0, abs(fy))


def _output_matches(path: Path, expected: str, float_tolerance: float | None) -> bool:
    """The program's output file against the expected text, mapped rather than read (never decoded)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return outputs_match(b"", expected, float_tolerance)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return outputs_match(data, expected, float_tolerance)


# --- one job ---------------------------------------------------------------------------------------------

def _classify(r: dict, time_limit_s: float, memory_mb: int, output_limit: int) -> str | None:
    """Verdict of a finished run, or None if it exited cleanly (then the output decides AC/WA)."""
    rc = r["returncode"]
    if r["timed_out"] or r["cpu_s"] > time_limit_s or rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "TLE"
    if r["oom"]:
        return "MLE"
    if r["out"].stat().st_size > output_limit or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "OLE"
    if rc != 0:
        err = tail(r["err"], 20000)
        near_limit = r["max_rss_mb"] is not None and r["max_rss_mb"] >= 0.95 * memory_mb
        if "MemoryError" in err or "bad_alloc" in err or near_limit:
            return "MLE"
        return "RE"
    return None


def judge_job(source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
              memory_limit_mb: int = 256, float_tolerance: float | None = None, checker: dict | None = None,
              cxx_flags: tuple[str, ...] = CXX_FLAGS, mode: str | None = None, uid: int | None = None,
              cgroups: Cgroups | None = None) -> JudgeResult:
    """Compile (if needed) and run `source` on every test, in the calling thread. Never raises for anything a
    program does: a failure of the judge itself on this job is logged and returned as RE."""
    lease = lease_uids(1) if uid is None else None
    try:
        uid = lease.uids[0] if lease else uid
        mode = isolation_mode(uid) if mode is None else mode
        return _judge(source, LANGUAGES[language], tests, time_limit_s, memory_limit_mb, float_tolerance,
                      checker, tuple(cxx_flags), mode, uid, cgroups)
    except Exception as e:  # noqa: BLE001 -- one job must never stop a training run
        log.exception("judge error on one job")
        return JudgeResult("RE", 0, len(tests), message=f"judge error: {type(e).__name__}: {e}"[:MESSAGE_LIMIT])
    finally:
        if lease:
            lease.release()


def _judge(source: str, language: str, tests: list[dict], time_limit_s: float, memory_mb: int,
           float_tolerance: float | None, checker: dict | None, cxx_flags: tuple[str, ...], mode: str, uid: int,
           cgroups: Cgroups | None) -> JudgeResult:
    total = len(tests)
    root = Path(tempfile.mkdtemp(prefix="run-", dir=cache_dir()))  # 0700: host-side files of this job
    try:
        if mode == "uid":
            os.chmod(root, 0o711)  # the program's own work folder (0700, its uid) is inside
        if language == "cpp":
            binary, message, compile_s = compile_cpp(source, cxx_flags, uid, mode, cgroups)
            if binary is None:
                return JudgeResult("CE", 0, total, message=message[:MESSAGE_LIMIT], compile_s=compile_s)
            argv, files = ["./main"], {"main": binary}
        else:
            message = _python_syntax_error(source)
            if message:
                return JudgeResult("CE", 0, total, message=message[:MESSAGE_LIMIT])
            (root / "main.py").write_text(source)
            # -I (no user site, no environment), not -S: site defines exit() and quit(), which solutions call
            argv, files, compile_s = ["python3", "-I", "main.py"], {"main.py": root / "main.py"}, 0.0
        results, passed, verdict, message = [], 0, "AC", ""
        for i, test in enumerate(tests):
            (root / f"t{i}.in").write_text(test["input"])
            r = run_sandboxed(argv, root, f"t{i}", uid=uid, time_limit_s=time_limit_s, memory_mb=memory_mb,
                              mode=mode, stdin_path=root / f"t{i}.in", files=files, cgroups=cgroups)
            v = _classify(r, time_limit_s, memory_mb, OUTPUT_LIMIT_BYTES)
            if v is None:
                ok = _check(checker, test, r["out"], root, i, uid, mode, cgroups) if checker else \
                    _output_matches(r["out"], test["output"], float_tolerance)
                v = "AC" if ok else "WA"
            results.append({"verdict": v, "time_s": round(r["cpu_s"], 4), "wall_s": round(r["wall_s"], 4),
                            "memory_mb": None if r["max_rss_mb"] is None else round(r["max_rss_mb"], 1)})
            if v == "AC":
                passed += 1
            elif verdict == "AC":
                verdict, message = v, tail(r["err"])
            for name in (f"t{i}.in", f"t{i}.out", f"t{i}.err"):
                (root / name).unlink(missing_ok=True)
            if v == "TLE":
                break
        return JudgeResult(verdict, passed, total, results, message, compile_s)
    finally:
        remove_tree(root)


def _python_syntax_error(source: str) -> str:
    """CE message, or "" if `source` compiles. Pathological sources make compile() raise RecursionError or
    MemoryError: the program could not run either, so those are compile errors too."""
    if len(source) > PYTHON_SOURCE_LIMIT:
        return f"source longer than {PYTHON_SOURCE_LIMIT} characters"
    try:
        compile(source, "main.py", "exec")
    except Exception as e:  # noqa: BLE001 -- SyntaxError, ValueError (NUL), RecursionError, MemoryError, ...
        return f"{type(e).__name__}: {e}"
    return ""


def _check(checker: dict, test: dict, out: Path, root: Path, i: int, uid: int, mode: str,
           cgroups: Cgroups | None) -> bool:
    """A special checker: a program run as `checker input expected actual`; exit code 0 accepts."""
    (root / f"c{i}.exp").write_text(test["output"])
    files = {"input.txt": root / f"t{i}.in", "expected.txt": root / f"c{i}.exp", "actual.txt": out}
    if checker.get("language", "python").startswith("python"):
        (root / "checker.py").write_text(checker["source"])
        argv, files["checker.py"] = ["python3", "-I", "checker.py"], root / "checker.py"
    else:
        binary, _, _ = compile_cpp(checker["source"], CXX_FLAGS, uid, mode, cgroups)
        if binary is None:
            raise ValueError("the special checker does not compile")
        argv, files["checker"] = ["./checker"], binary
    r = run_sandboxed(argv + ["input.txt", "expected.txt", "actual.txt"], root, f"c{i}", uid=uid,
                      time_limit_s=10.0, memory_mb=1024, mode=mode, files=files, cgroups=cgroups)
    for p in (r["out"], r["err"], root / f"c{i}.exp"):
        p.unlink(missing_ok=True)
    return r["returncode"] == 0


# --- the pool --------------------------------------------------------------------------------------------

def default_workers() -> int:
    """This process's share of the cores: torchrun starts LOCAL_WORLD_SIZE judging processes per host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


class Judge:
    """A pool of worker threads that judge programs; reuse one across training steps. Each worker drives one
    sandboxed process at a time with a uid leased for this Judge alone (flock, host-wide)."""

    def __init__(self, workers: int | None = None, cxx_flags: tuple[str, ...] = CXX_FLAGS,
                 cgroups: bool = True):
        self.workers = workers or default_workers()
        self.cxx_flags = tuple(cxx_flags)
        self._lease = lease_uids(self.workers)
        self.uids = list(self._lease.uids)  # this Judge's sandbox uids, its alone on this host
        self._uids: queue.SimpleQueue[int] = queue.SimpleQueue()
        for uid in self._lease.uids:
            self._uids.put(uid)
        self.isolation = isolation_mode(self._lease.uids[0])
        self.cgroups = Cgroups.detect() if cgroups and self.isolation != "rlimits" else None
        self._pool = futures.ThreadPoolExecutor(self.workers, thread_name_prefix="judge")
        pch_dir(self.cxx_flags)  # build the precompiled header once, up front

    def run(self, source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
            memory_limit_mb: int = 256, float_tolerance: float | None = None,
            checker: dict | None = None) -> JudgeResult:
        return self.run_many([dict(source=source, language=language, tests=tests, time_limit_s=time_limit_s,
                                   memory_limit_mb=memory_limit_mb, float_tolerance=float_tolerance,
                                   checker=checker)])[0]

    def run_many(self, jobs: list[dict]) -> list[JudgeResult]:
        """Judge many programs in parallel; results in the order of `jobs`."""
        for job in jobs:
            if job["language"] not in LANGUAGES:
                raise ValueError(f"unsupported language {job['language']!r}; use 'cpp' or 'python'")
        subs = [self._pool.submit(self._job, job) for job in jobs]
        return [s.result() for s in subs]

    def _job(self, job: dict) -> JudgeResult:
        uid = self._uids.get()  # as many uids as workers: never waits
        try:
            return judge_job(**{"cxx_flags": self.cxx_flags, **job, "mode": self.isolation, "uid": uid,
                                "cgroups": self.cgroups})
        finally:
            self._uids.put(uid)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.cgroups:
            self.cgroups.close()
        self._lease.release()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Judge one program against tests; prints the result as JSON.")
    ap.add_argument("--language", required=True, choices=["cpp", "python"])
    ap.add_argument("--source", required=True, help="the program's file")
    ap.add_argument("--tests", required=True, help='JSON file: [{"input": ..., "output": ...}, ...]')
    ap.add_argument("--time-limit-s", type=float, default=2.0)
    ap.add_argument("--memory-limit-mb", type=int, default=256)
    ap.add_argument("--float-tolerance", type=float, default=None)
    args = ap.parse_args(argv)
    tests = json.loads(Path(args.tests).read_text())
    with Judge(workers=1) as judge:
        res = judge.run(Path(args.source).read_text(), args.language, tests, args.time_limit_s,
                        args.memory_limit_mb, args.float_tolerance)
        print(json.dumps({**res.to_dict(), "isolation": judge.isolation}, indent=2))
    return 0 if res.verdict == "AC" else 1


if __name__ == "__main__":
    raise SystemExit(main())

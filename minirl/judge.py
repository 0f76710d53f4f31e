"""A sandboxed judge for model-written C++ and Python programs, run by a pool of workers.

    judge = Judge(workers=os.cpu_count())
    res = judge.run(source, "cpp", tests=[{"input": "1 2\\n", "output": "3"}], time_limit_s=2, memory_limit_mb=256)
    res.verdict, res.passed, res.total                  # "AC" | "WA" | "TLE" | "MLE" | "RE" | "CE" | "OLE"
    results = judge.run_many([dict(source=..., language="python", tests=...), ...])   # parallel, order kept

    python -m minirl.judge --language cpp --source sol.cpp --tests tests.json [--time-limit-s 2] [--memory-limit-mb 256]

The pool: `workers` threads, each driving one sandboxed process at a time (compiler or program): the work
happens in those processes, so threads give the parallelism without a process pool's pitfalls (a spawn/
forkserver pool re-imports the caller's __main__). Each worker has its own sandbox uid.

Speed: C++ is compiled once per unique (source, flags) (binaries cached by hash), against a precompiled
<bits/stdc++.h> built once per flag set (g++ 12: ~1.5 s -> ~0.25 s per compile). Python syntax errors are found
by `compile()` in the worker, without running anything, and reported as CE. Jobs run in parallel; the tests of
one program run one after another and stop at the first TLE (every later test would cost a full time limit,
and both reward styles give the same reward from that point).

Isolation: see minirl/sandbox.py (namespaces, private tmpfs, rlimits, a uid per worker; `Judge.isolation`
says which mode this machine allows).
"""
from __future__ import annotations

import concurrent.futures as futures
import hashlib
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minirl.sandbox import OUTPUT_LIMIT_BYTES, cache_dir, isolation_mode, run_sandboxed, unique_tmp

VERDICTS = ("AC", "WA", "TLE", "MLE", "RE", "CE", "OLE")
CXX_FLAGS = ("-std=c++17", "-O2")
MESSAGE_LIMIT = 2000               # characters of compiler/stderr text kept in a result
UID_BASE = 61000
_worker = threading.local()       # .uid: this worker thread's sandbox uid
_slots = itertools.count()


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


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link costs nothing (the 100 MB PCH, binaries); root owns the file, so the sandbox can't change it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy(src, dst)


def _tail(path: Path, limit: int = MESSAGE_LIMIT) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


# --- comparing -------------------------------------------------------------------------------------------

def outputs_match(actual: str, expected: str, float_tolerance: float | None = None) -> bool:
    """Token-wise, whitespace-insensitive; with a tolerance, numeric tokens match if |a-b| <= tol*max(1,|b|)."""
    a, e = actual.split(), expected.split()
    if len(a) != len(e):
        return False
    for x, y in zip(a, e):
        if x == y:
            continue
        if float_tolerance is None:
            return False
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not (math.isfinite(fx) and abs(fx - fy) <= float_tolerance * max(1.0, abs(fy))):
            return False
    return True


# --- compiling -------------------------------------------------------------------------------------------

def _pch_dir(flags: tuple[str, ...]) -> Path | None:
    """Folder holding bits/stdc++.h and its precompiled .gch for these flags (built once, under a lock)."""
    header = next(iter(sorted(Path("/usr/include").glob("*/c++/*/bits/stdc++.h"))), None)
    if header is None:
        return None
    key = hashlib.sha256(("\0".join(flags) + str(header)).encode()).hexdigest()[:16]
    d = cache_dir() / "pch" / key
    gch = d / "bits" / "stdc++.h.gch"
    if gch.exists():
        return d
    (d / "bits").mkdir(parents=True, exist_ok=True)
    import fcntl
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not gch.exists():
            shutil.copy(header, d / "bits" / "stdc++.h")
            tmp = unique_tmp(gch)
            r = subprocess.run(["g++", *flags, "-x", "c++-header", str(d / "bits" / "stdc++.h"), "-o", str(tmp)],
                               capture_output=True, timeout=120)
            if r.returncode != 0:
                return None
            os.replace(tmp, gch)
    return d


def _compile_cpp(source: str, flags: tuple[str, ...], uid: int, mode: str) -> tuple[Path | None, str, float]:
    """Binary path (cached by hash of source and flags), compiler message, seconds spent compiling."""
    key = hashlib.sha256(("\0".join(flags) + "\0" + source).encode()).hexdigest()
    binary = cache_dir() / "bin" / key
    if binary.exists():
        return binary, "", 0.0
    binary.parent.mkdir(parents=True, exist_ok=True)
    pch = _pch_dir(flags)
    work = Path(tempfile.mkdtemp(prefix="cc-", dir=cache_dir()))
    try:
        (work / "main.cpp").write_text(source)
        if mode != "rlimits":
            os.chown(work, uid, uid)
        include = ["-I", str(pch)] if pch else []
        if pch and mode == "namespaces":  # the sandbox cannot see the cache (tmpfs over /tmp): link the PCH in, read-only
            (work / "pch" / "bits").mkdir(parents=True)
            for f in ("stdc++.h", "stdc++.h.gch"):
                _link_or_copy(pch / "bits" / f, work / "pch" / "bits" / f)
            include = ["-I", "pch"]
        t0 = time.perf_counter()
        # gold links ~5x faster than bfd (0.01 vs 0.05 s): 10% of a compile with the PCH
        link = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
        r = run_sandboxed(["g++", *flags, *include, *link, "main.cpp", "-o", "main"], work, None, uid,
                           time_limit_s=30, memory_mb=4096, mode=mode, output_limit=1 << 20)
        seconds = time.perf_counter() - t0
        if r["returncode"] != 0 or not (work / "main").exists():
            why = "compilation timed out" if r["timed_out"] else _tail(r["err"])
            return None, why, seconds
        tmp = unique_tmp(binary)
        shutil.copy(work / "main", tmp)
        os.replace(tmp, binary)
        return binary, "", seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for suffix in (".out", ".err", ".usage"):
            Path(str(work) + suffix).unlink(missing_ok=True)


# --- one job (runs in a worker process) ------------------------------------------------------------------

def _classify(r: dict, time_limit_s: float, memory_mb: int, output_limit: int) -> str | None:
    """Verdict of a finished run, or None if it exited cleanly (then the output decides AC/WA)."""
    rc = r["returncode"]
    if r["timed_out"] or r["cpu_s"] > time_limit_s or rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "TLE"
    if r["out"].stat().st_size > output_limit or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "OLE"
    if rc != 0:
        err = _tail(r["err"], 20000)
        near_limit = r["max_rss_mb"] is not None and r["max_rss_mb"] >= 0.95 * memory_mb
        if "MemoryError" in err or "bad_alloc" in err or near_limit:
            return "MLE"
        return "RE"
    return None


def judge_job(source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
              memory_limit_mb: int = 256, float_tolerance: float | None = None, checker: dict | None = None,
              cxx_flags: tuple[str, ...] = CXX_FLAGS, mode: str | None = None) -> JudgeResult:
    """Compile (if needed) and run `source` on every test. Runs in the calling process."""
    mode = isolation_mode() if mode is None else mode
    uid = getattr(_worker, "uid", UID_BASE + 999)
    total = len(tests)
    if language in ("cpp", "c++"):
        binary, message, compile_s = _compile_cpp(source, tuple(cxx_flags), uid, mode)
        if binary is None:
            return JudgeResult("CE", 0, total, message=message[:MESSAGE_LIMIT], compile_s=compile_s)
        argv, files = ["./main"], {"main": binary}
    elif language in ("python", "python3"):
        try:
            compile(source, "main.py", "exec")
        except (SyntaxError, ValueError) as e:
            return JudgeResult("CE", 0, total, message=f"{type(e).__name__}: {e}"[:MESSAGE_LIMIT])
        argv, files, compile_s = ["python3", "-I", "-S", "main.py"], {}, 0.0
    else:
        raise ValueError(f"unsupported language {language!r}; use 'cpp' or 'python'")
    results, passed, verdict, message = [], 0, "AC", ""
    root = Path(tempfile.mkdtemp(prefix="run-", dir=cache_dir()))
    os.chmod(root, 0o755)
    try:
        for i, test in enumerate(tests):
            work = root / f"t{i}"
            work.mkdir()
            if language.startswith("python"):
                (work / "main.py").write_text(source)
            for name, src in files.items():
                _link_or_copy(src, work / name)
            (root / f"t{i}.in").write_text(test["input"])
            if mode != "rlimits":
                os.chown(work, uid, uid)
            r = run_sandboxed(argv, work, root / f"t{i}.in", uid, time_limit_s, memory_limit_mb, mode)
            v = _classify(r, time_limit_s, memory_limit_mb, OUTPUT_LIMIT_BYTES)
            if v is None:
                actual = r["out"].read_bytes().decode("utf-8", "replace")
                ok = _check(checker, test, actual, root, i, uid, mode) if checker else \
                    outputs_match(actual, test["output"], float_tolerance)
                v = "AC" if ok else "WA"
            results.append({"verdict": v, "time_s": round(r["cpu_s"], 4), "wall_s": round(r["wall_s"], 4),
                            "memory_mb": None if r["max_rss_mb"] is None else round(r["max_rss_mb"], 1)})
            shutil.rmtree(work, ignore_errors=True)
            if v == "AC":
                passed += 1
            elif verdict == "AC":
                verdict, message = v, _tail(r["err"])
            if v == "TLE":
                break
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return JudgeResult(verdict, passed, total, results, message, compile_s)


def _check(checker: dict, test: dict, actual: str, root: Path, i: int, uid: int, mode: str) -> bool:
    """A special checker: a program run as `checker input expected actual`; exit code 0 accepts."""
    work = root / f"c{i}"
    work.mkdir()
    for name, text in (("input.txt", test["input"]), ("expected.txt", test["output"]), ("actual.txt", actual)):
        (work / name).write_text(text)
    if checker.get("language", "python").startswith("python"):
        (work / "checker.py").write_text(checker["source"])
        argv = ["python3", "-I", "checker.py"]
    else:
        binary, _, _ = _compile_cpp(checker["source"], CXX_FLAGS, uid, mode)
        if binary is None:
            raise ValueError("the special checker does not compile")
        _link_or_copy(binary, work / "checker")
        argv = ["./checker"]
    if mode != "rlimits":
        os.chown(work, uid, uid)
    r = run_sandboxed(argv + ["input.txt", "expected.txt", "actual.txt"], work, None, uid, 10.0, 1024, mode)
    shutil.rmtree(work, ignore_errors=True)
    return r["returncode"] == 0


# --- the pool --------------------------------------------------------------------------------------------

def _init_worker() -> None:
    _worker.uid = UID_BASE + next(_slots) % 900


class Judge:
    """A pool of worker processes that judge programs; reuse one across training steps."""

    def __init__(self, workers: int | None = None, cxx_flags: tuple[str, ...] = CXX_FLAGS):
        self.workers = workers or os.cpu_count() or 1
        self.cxx_flags = tuple(cxx_flags)
        self.isolation = isolation_mode()
        self._pool = futures.ThreadPoolExecutor(self.workers, thread_name_prefix="judge",
                                                initializer=_init_worker)
        if shutil.which("g++"):
            _pch_dir(self.cxx_flags)  # build the precompiled header once, up front

    def run(self, source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
            memory_limit_mb: int = 256, float_tolerance: float | None = None,
            checker: dict | None = None) -> JudgeResult:
        return self.run_many([dict(source=source, language=language, tests=tests, time_limit_s=time_limit_s,
                                   memory_limit_mb=memory_limit_mb, float_tolerance=float_tolerance,
                                   checker=checker)])[0]

    def run_many(self, jobs: list[dict]) -> list[JudgeResult]:
        """Judge many programs in parallel; results in the order of `jobs`."""
        subs = [self._pool.submit(judge_job, **{"cxx_flags": self.cxx_flags, **job, "mode": self.isolation})
                for job in jobs]
        return [s.result() for s in subs]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

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

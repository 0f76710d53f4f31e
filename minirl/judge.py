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

Isolation, when running as root with util-linux's `unshare` (checked at start; `Judge.isolation` says which):
each test runs in fresh network, PID and mount namespaces (no network; `/proc` shows only the sandbox; private
tmpfs over /tmp, /var/tmp and /dev/shm, so nothing written there survives), as an unprivileged uid of its
own (61000 + worker slot: root ignores RLIMIT_NPROC, and a non-root uid cannot write the system's files), in a
fresh working directory that is deleted afterwards, with a scrubbed environment and rlimits on CPU time,
address space, stack, file size (bounds the output), processes (no fork bombs) and core dumps (none). When a
test ends the whole namespace is killed (its init dies -> the kernel kills every process in it), so a child
that called setsid() or daemonised does not survive. Not guaranteed: the filesystem is not hidden (programs
can *read* world-readable files), and seccomp is not used. As root without working namespaces ("uid"), programs
still run as a sandbox uid with rlimits (no fork bombs, no writes to root's files), but can use the network,
write to /tmp and outlive a test via setsid(). Not root ("rlimits"): resource limits and a process group
only; RLIMIT_NPROC then counts all of your processes. Judge untrusted code only with "namespaces".
"""
from __future__ import annotations

import concurrent.futures as futures
import functools
import hashlib
import itertools
import json
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

VERDICTS = ("AC", "WA", "TLE", "MLE", "RE", "CE", "OLE")
CXX_FLAGS = ("-std=c++17", "-O2")
OUTPUT_LIMIT_BYTES = 64 << 20      # a program printing more than this is OLE
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


# --- environment -----------------------------------------------------------------------------------------

def _cache_dir() -> Path:
    """Binaries, the PCH and the sandboxes' working directories. Not under /tmp when root: the sandbox mounts a
    private tmpfs there, which would hide its own working directory from absolute paths (python3 uses them)."""
    default = Path("/var/lib/minirl-judge") if os.geteuid() == 0 else \
        Path(tempfile.gettempdir()) / f"minirl-judge-{os.getuid()}"
    d = Path(os.environ.get("MINIRL_JUDGE_CACHE", default)).resolve()
    if os.geteuid() == 0 and any(d.is_relative_to(t) for t in ("/tmp", "/var/tmp", "/dev/shm")):
        raise ValueError(f"MINIRL_JUDGE_CACHE={d} is under a directory the sandbox replaces with a private tmpfs; "
                         "choose another folder (default /var/lib/minirl-judge)")
    d.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0 and d.stat().st_mode & 0o755 != 0o755:
        os.chmod(d, 0o755)  # sandbox uids must traverse it (python3 opens its script by absolute path)
    return d


def isolation_mode() -> str:
    """"namespaces" (root + unshare works), "uid" (root, no namespaces: still drop to a sandbox uid) or
    "rlimits" (not root: resource limits and a process group only)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return "rlimits"
    if shutil.which("unshare"):
        probe = subprocess.run(["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "true"],
                               capture_output=True, timeout=10)
        if probe.returncode == 0:
            return "namespaces"
    return "uid"


def _unique_tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


@functools.lru_cache(maxsize=None)
def _sandbox_helper_in(cache: Path) -> str | None:
    """minirl/sandbox.c compiled once per machine (one process instead of six execs per test); None if no cc."""
    src = Path(__file__).with_name("sandbox.c")
    key = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    binary = cache / f"sandbox-{key}"
    if binary.exists():
        return str(binary)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    tmp = _unique_tmp(binary)
    r = subprocess.run([compiler, "-O2", "-o", str(tmp), str(src)], capture_output=True, timeout=60)
    if r.returncode != 0:
        return None
    os.replace(tmp, binary)
    return str(binary)


def _sandbox_helper() -> str | None:
    return _sandbox_helper_in(_cache_dir())


def _sandbox_command(argv: list[str], uid: int, cpu_s: int, memory_mb: int, file_limit: int,
                     mode: str, report: Path) -> list[str]:
    """argv wrapped in: namespaces -> private tmpfs mounts -> rlimits -> drop to `uid`."""
    mem = memory_mb << 20
    helper = _sandbox_helper() if mode != "rlimits" else None
    if helper:
        return [helper, str(uid), str(cpu_s), str(mem), str(file_limit), "64",
                "1" if mode == "namespaces" else "0", str(report), "--"] + argv
    limits = ["prlimit", f"--cpu={cpu_s}", f"--as={mem}", f"--stack={mem}", f"--fsize={file_limit}",
              "--core=0", "--nproc=64", "--nofile=64", "--"]
    if mode == "rlimits":
        return limits + argv
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
    if mode == "uid":
        return limits + drop + argv
    mounts = ("for d in /tmp /var/tmp /dev/shm; do mount -t tmpfs -o size=64m,mode=1777 tmpfs $d || exit 111; done; "
              'exec "$@"')
    return ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child",
            "sh", "-c", mounts, "sandbox"] + limits + drop + argv


def _run_sandboxed(argv: list[str], workdir: Path, stdin_path: Path | None, uid: int, time_limit_s: float,
                   memory_mb: int, mode: str, output_limit: int = OUTPUT_LIMIT_BYTES) -> dict:
    """Run one process tree; return exit status, CPU/wall time, peak memory and the paths of its output."""
    out_path, err_path = workdir.parent / (workdir.name + ".out"), workdir.parent / (workdir.name + ".err")
    report = workdir.parent / (workdir.name + ".usage")
    report.unlink(missing_ok=True)
    cmd = _sandbox_command(argv, uid, max(1, math.ceil(time_limit_s)) + 1, memory_mb, output_limit + 1, mode,
                           report)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir)}
    with open(out_path, "wb") as out, open(err_path, "wb") as err, \
            (open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb")) as inp:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=inp, stdout=out, stderr=err, cwd=workdir, env=env,
                                start_new_session=True)  # its own process group
        wall_limit = time_limit_s * 2 + 1.0  # catches sleep() and blocking reads; CPU time is checked below
        timed_out = not _wait_exit(proc.pid, wall_limit)
        if timed_out:
            _kill_group(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    _kill_group(proc.pid)  # anything left in the group goes too
    if mode != "rlimits":
        _kill_uid(uid)
    cpu_s, rss_mb = usage.ru_utime + usage.ru_stime, None  # rss of the whole chain is not the program's
    if report.exists() and report.stat().st_size:
        rss_kb, user_s, sys_s = report.read_text().split()
        cpu_s, rss_mb = float(user_s) + float(sys_s), int(rss_kb) / 1024
    report.unlink(missing_ok=True)
    return {"returncode": proc.returncode, "timed_out": timed_out, "wall_s": wall, "cpu_s": cpu_s,
            "max_rss_mb": rss_mb, "out": out_path, "err": err_path}


def _wait_exit(pid: int, timeout_s: float) -> bool:
    """Block until `pid` exits (True) or the timeout passes (False), waking the moment it exits (pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # old kernel or Python: poll
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            time.sleep(0.001)
        return False
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _kill_uid(uid: int, timeout_s: float = 2.0) -> None:
    """SIGKILL every process owned by a sandbox uid and wait until they are gone. A killed PID namespace is
    torn down asynchronously, and in "uid" mode a setsid() child has left our process group: the uid is
    this worker's alone, so it names exactly what this test started."""
    deadline = time.perf_counter() + timeout_s
    while True:
        alive = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat(f"/proc/{name}").st_uid == uid:
                        os.kill(int(name), signal.SIGKILL)
                        alive.append(name)
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    pass
        if not alive or time.perf_counter() > deadline:
            return
        time.sleep(0.002)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    d = _cache_dir() / "pch" / key
    gch = d / "bits" / "stdc++.h.gch"
    if gch.exists():
        return d
    (d / "bits").mkdir(parents=True, exist_ok=True)
    import fcntl
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not gch.exists():
            shutil.copy(header, d / "bits" / "stdc++.h")
            tmp = _unique_tmp(gch)
            r = subprocess.run(["g++", *flags, "-x", "c++-header", str(d / "bits" / "stdc++.h"), "-o", str(tmp)],
                               capture_output=True, timeout=120)
            if r.returncode != 0:
                return None
            os.replace(tmp, gch)
    return d


def _compile_cpp(source: str, flags: tuple[str, ...], uid: int, mode: str) -> tuple[Path | None, str, float]:
    """Binary path (cached by hash of source and flags), compiler message, seconds spent compiling."""
    key = hashlib.sha256(("\0".join(flags) + "\0" + source).encode()).hexdigest()
    binary = _cache_dir() / "bin" / key
    if binary.exists():
        return binary, "", 0.0
    binary.parent.mkdir(parents=True, exist_ok=True)
    pch = _pch_dir(flags)
    work = Path(tempfile.mkdtemp(prefix="cc-", dir=_cache_dir()))
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
        r = _run_sandboxed(["g++", *flags, *include, *link, "main.cpp", "-o", "main"], work, None, uid,
                           time_limit_s=30, memory_mb=4096, mode=mode, output_limit=1 << 20)
        seconds = time.perf_counter() - t0
        if r["returncode"] != 0 or not (work / "main").exists():
            why = "compilation timed out" if r["timed_out"] else _tail(r["err"])
            return None, why, seconds
        tmp = _unique_tmp(binary)
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
    root = Path(tempfile.mkdtemp(prefix="run-", dir=_cache_dir()))
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
            r = _run_sandboxed(argv, work, root / f"t{i}.in", uid, time_limit_s, memory_limit_mb, mode)
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
    r = _run_sandboxed(argv + ["input.txt", "expected.txt", "actual.txt"], work, None, uid, 10.0, 1024, mode)
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

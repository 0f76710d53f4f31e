"""Run one process tree in a sandbox: namespaces, a private tmpfs, rlimits, an unprivileged uid, a time limit.

    result = run_sandboxed(["./main"], workdir, stdin_path, uid, time_limit_s=2, memory_mb=256, mode=isolation_mode())
    result["returncode"], result["timed_out"], result["cpu_s"], result["max_rss_mb"], result["out"], result["err"]

The judge (minirl/judge.py) decides verdicts; this file only runs things. The work is done by sandbox.c,
compiled once per machine (one process instead of six execs of util-linux's unshare/prlimit/setpriv, which
remain the fallback without a C compiler).

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

import functools
import hashlib
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

OUTPUT_LIMIT_BYTES = 64 << 20      # a program printing more than this is OLE


# --- where sandboxes live -----------------------------------------------------------------------------------------

def cache_dir() -> Path:
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


def unique_tmp(path: Path) -> Path:
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
    tmp = unique_tmp(binary)
    r = subprocess.run([compiler, "-O2", "-o", str(tmp), str(src)], capture_output=True, timeout=60)
    if r.returncode != 0:
        return None
    os.replace(tmp, binary)
    return str(binary)


def _sandbox_helper() -> str | None:
    return _sandbox_helper_in(cache_dir())


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


def run_sandboxed(argv: list[str], workdir: Path, stdin_path: Path | None, uid: int, time_limit_s: float,
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

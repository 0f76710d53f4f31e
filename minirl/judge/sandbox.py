"""Run programs in a deny-by-default sandbox: one run at a time, or many in a worker's sandbox kept open.

    lease = lease_uids(2)                            # minirl/judge/host.py: uids no other live Judge holds
    mode = isolation_mode(lease.uids[0])             # "namespaces" | "uid" | "rlimits"
    r = run_sandboxed(["python3", "main.py"], rundir, "t0", uid=lease.uids[0], time_limit_s=2, memory_mb=256,
                      mode=mode, stdin_path=rundir / "t0.in", files={"main.py": rundir / "main.py"})
    r["returncode"], r["timed_out"], r["cpu_s"], r["max_rss_mb"], r["oom"], r["out"], r["err"]
    box = WorkerSandbox(uid, cgroup)                  # "namespaces": one sandbox, many runs, one at a time
    r = box.run(["./main"], ("main", binary), rundir, "t0", rundir / "t0.in", time_limit_s=2, memory_mb=256)

The judge (minirl/judge/verdict.py, minirl/judge/pool.py) decides verdicts; this file only runs things. The sandbox itself is
minirl/judge/sandbox.c (compiled once per machine), which says what a program sees: in "namespaces" mode (root, the
normal case) a new root holding read-only /usr and /lib*, a minimal /etc and /dev, /proc of its own PID namespace,
and an empty /work on a tmpfs bounded by the memory limit; no network, a seccomp filter, an unprivileged uid leased
for this Judge alone. A cgroup per run (minirl/judge/cgroup.py, when writable) counts memory outside the address space
and the CPU time of every descendant; without one, sandbox.c's init still kills and reaps every descendant and
reports their CPU time. "uid" (root, no namespaces): uid, rlimits, seccomp and the kill-and-reap, but the host's
files are visible. "rlimits" (not root): rlimits and a process group only. Judge untrusted code only with
"namespaces". README, section isolation, lists what holds in each case.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from minirl.judge.cgroup import Cgroups, RunCgroup
from minirl.judge.host import cache_dir, remove_tree, unique_tmp

log = logging.getLogger(__name__)
OUTPUT_LIMIT_BYTES = 64 << 20      # a program printing more than this is OLE
NPROC = 64                         # processes per run (no fork bombs)


# --- the sandbox helper ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _sandbox_helper_in(cache: Path) -> str | None:
    """minirl/judge/sandbox.c compiled once per machine; None without a C compiler. Linked statically where libc.a
    exists: no dynamic loading on every run saves ~0.3 ms of the ~3 ms a sandbox costs."""
    src = Path(__file__).with_name("sandbox.c")
    key = hashlib.sha256(src.read_bytes() + b"static-first").hexdigest()[:16]
    binary = cache / f"sandbox-{key}"
    if binary.exists():
        return str(binary)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    tmp = unique_tmp(binary)
    for static in (["-static"], []):
        r = subprocess.run([compiler, "-O2", *static, "-o", str(tmp), str(src)], capture_output=True, timeout=60)
        if r.returncode == 0:
            break
    if r.returncode != 0:
        log.warning("cannot build the sandbox helper: %s", r.stderr.decode(errors="replace")[-2000:])
        return None
    os.replace(tmp, binary)
    return str(binary)


def _new_root(cache: Path) -> Path:
    """The empty folder each sandbox mounts its own root on (inside its private mount namespace)."""
    d = cache / "newroot"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def isolation_mode(uid: int) -> str:
    """"namespaces" (root, sandbox.c builds and its namespaces work), "uid" (root, no namespaces) or
    "rlimits" (not root)."""
    if os.geteuid() != 0:
        return "rlimits"
    helper = _sandbox_helper_in(cache_dir())
    if helper is None:
        raise RuntimeError("the judge needs a C compiler (cc) to build its sandbox (minirl/judge/sandbox.c) when run as "
                           "root: install gcc")
    probe = [helper, "-u", str(uid), "-t", "5", "-m", str(1 << 30), "-f", "1024", "-p", "8"]
    ok = subprocess.run(probe + ["-i", str(_new_root(cache_dir())), "-s", "1", "--", "true"], capture_output=True,
                        timeout=30)
    if ok.returncode == 0:
        return "namespaces"
    log.warning("sandbox namespaces do not work here (%s): programs will see the host's files",
                ok.stderr.decode(errors="replace").strip())
    return "uid"


# --- one run -----------------------------------------------------------------------------------------------------

def _rlimits(time_limit_s: float, memory_mb: int, output_limit: int) -> tuple[int, int, int]:
    """RLIMIT_CPU (per process; the total is checked by the judge), RLIMIT_AS and RLIMIT_FSIZE of one run."""
    return max(1, math.ceil(time_limit_s)) + 1, memory_mb << 20, output_limit + 1


def _begin(cg: RunCgroup, memory_mb: int) -> None:
    """A run's cgroup limits (memory: 64 MiB more, for page cache and kernel memory) and counters' start."""
    cg.begin((memory_mb + 64) << 20, NPROC)


def _joins(cg: RunCgroup) -> list[str]:
    """sandbox.c's options that make it join the cgroup."""
    return [a for p in cg.procs for a in ("-g", p)]


ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def run_sandboxed(argv: list[str], rundir: Path, name: str, *, uid: int, time_limit_s: float, memory_mb: int,
                  mode: str, stdin_path: Path | None = None, files: dict[str, Path] | None = None,
                  workdir: Path | None = None, output_limit: int = OUTPUT_LIMIT_BYTES,
                  cgroups: Cgroups | None = None, scratch_mb: int | None = None) -> dict:
    """Run one process tree with `files` (name in /work -> host file, read-only) or the host folder `workdir`
    (read-write) as its working folder. Output goes to rundir/name.out and .err."""
    out_path, err_path, report = (rundir / f"{name}.{s}" for s in ("out", "err", "usage"))
    files = files or {}
    cache = cache_dir()
    helper = _sandbox_helper_in(cache) if mode != "rlimits" else None
    cg, host_work = None, None
    if mode == "namespaces":
        cwd = "/"
        opts = ["-i", str(_new_root(cache)), "-s", str(scratch_mb or memory_mb)]
        opts += ["-w", str(workdir)] if workdir else []
        opts += [a for dest, src in files.items() for a in ("-b", f"{src}:{dest}")]
    else:                                             # the host's folders: a work folder of its own
        host_work = workdir or _work_folder(rundir / name, files, uid if mode == "uid" else None)
        cwd, opts = str(host_work), []
    if cgroups is not None:
        try:
            cg = cgroups.run(f"u{uid}")
            _begin(cg, memory_mb)
            opts += _joins(cg)
        except OSError as e:
            log.warning("no cgroup for this run (%s): rlimits only", e)
            cg = None
    cpu_s, mem, fsize = _rlimits(time_limit_s, memory_mb, output_limit)
    if helper:
        cmd = [helper, "-u", str(uid), "-t", str(cpu_s), "-m", str(mem), "-f", str(fsize), "-p", str(NPROC),
               "-r", str(report), *opts, "--", *argv]
    else:
        cmd = ["prlimit", f"--cpu={cpu_s}", f"--as={mem}", f"--stack={mem}", f"--fsize={fsize}",
               "--core=0", f"--nproc={NPROC}", "--nofile=64", "--", *argv]
    env = {**ENV, "HOME": "/work" if mode == "namespaces" else cwd}
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err, \
                (open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb")) as inp:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdin=inp, stdout=out, stderr=err, cwd=cwd, env=env,
                                    start_new_session=True)  # its own process group
            timed_out = not _wait_exit(proc.pid, time_limit_s * 2 + 1.0)  # sleep(), blocking reads
            if timed_out:
                _kill_group(proc.pid)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
        _kill_group(proc.pid)                         # anything left in the group goes too
        if mode == "uid":
            _kill_uid(uid)                            # the leased uid is ours alone: it names what this run started
        cpu, rss_mb = usage.ru_utime + usage.ru_stime, None
        if report.exists() and report.stat().st_size:
            rss_kb, user_s, sys_s = report.read_text().split()
            cpu, rss_mb = float(user_s) + float(sys_s), int(rss_kb) / 1024
        oom = False
        if cg is not None:
            cpu = max(cpu, cg.cpu_s())                # counts even what a killed init never reaped
            oom = cg.oom_killed()
    finally:
        if cg is not None:
            cg.kill_all()
        report.unlink(missing_ok=True)
        if host_work is not None and workdir is None:
            remove_tree(host_work)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "wall_s": wall,
            "cpu_s": cpu, "max_rss_mb": rss_mb, "oom": oom, "out": out_path, "err": err_path}


class WorkerSandbox:
    """A worker's sandbox, kept open for its whole life ("namespaces" mode; sandbox.c's -c): the new root and
    namespaces are built, and the cgroup joined, once; each `run` is a request that the sandbox's init serves
    with a fresh process in mount, PID and IPC namespaces of its own (fresh /work and /tmp), killed and reaped
    with everything it started before the reply. ~1.3 ms a run instead of ~3.5 ms, and no cgroup join per program
    (a join can wait ~15 ms for an RCU grace period). `run` returns what `run_sandboxed` does. A run past its wall
    limit, or a sandbox that died, ends it: `alive` turns False and the next run needs a new one. The cgroup
    must be this sandbox's alone while it is open."""

    def __init__(self, uid: int, cgroup: RunCgroup | None):
        self.uid, self.cgroup = uid, cgroup
        cache = cache_dir()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # the program file of the run in progress, hard-linked here (a bind from it costs no copy, and nothing of
        # it counts against the run's memory); bound read-only at /.run/bin, in a folder programs cannot list
        for left in cache.glob(f"sandbox-{uid}-*"):    # a judge that died holding this uid left them
            if left.is_dir():
                remove_tree(left)
            else:
                left.unlink(missing_ok=True)
        self._files = cache / f"sandbox-{uid}-{os.getpid()}"
        self._files.mkdir(mode=0o700)
        opts = ["-u", str(uid), "-p", str(NPROC), "-i", str(_new_root(cache)), "-b", f"{self._files}:/.run/bin",
                "-c", str(theirs.fileno())]
        opts += _joins(cgroup) if cgroup else []
        self._errors = cache / f"sandbox-{uid}-{os.getpid()}.err"   # the sandbox's own failures
        try:
            with open(self._errors, "wb") as err:
                self._proc = subprocess.Popen(
                    [_sandbox_helper_in(cache), *opts], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err, cwd="/", env={**ENV, "HOME": "/work"}, pass_fds=(theirs.fileno(),),
                    start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock, self.alive = ours, True

    def run(self, argv: list[str], file: tuple[str, Path], rundir: Path, name: str, stdin_path: Path, *,
            time_limit_s: float, memory_mb: int, output_limit: int = OUTPUT_LIMIT_BYTES) -> dict:
        """Run `argv` in /work, where `file` (name, host path) is bound read-only; stdin from `stdin_path`,
        output to rundir/name.out and .err."""
        out_path, err_path = rundir / f"{name}.out", rundir / f"{name}.err"
        cgroup = self.cgroup
        if cgroup is not None:
            try:
                _begin(cgroup, memory_mb)
            except OSError as e:                          # v1: a limit below what is still charged (EBUSY)
                log.warning("no cgroup for this run (%s): rlimits only", e)
                cgroup = None
        fields = [*map(str, _rlimits(time_limit_s, memory_mb, output_limit)), str(memory_mb), file[0], *argv]
        staged = self._files / file[0]
        staged.unlink(missing_ok=True)
        try:
            os.link(file[1], staged)
        except OSError:                                # another filesystem
            shutil.copy(file[1], staged)
        timed_out, reply = False, b""
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(stdin_path, "rb") as inp:
            t0 = time.perf_counter()
            try:
                socket.send_fds(self._sock, [b"".join(f.encode() + b"\0" for f in fields)],
                                [inp.fileno(), out.fileno(), err.fileno()])
                self._sock.settimeout(time_limit_s * 2 + 1.0)  # sleep(), blocking reads
                reply = self._sock.recv(128)
            except TimeoutError:
                timed_out = True
            except OSError:                            # init is gone: reply stays empty
                pass
            wall = time.perf_counter() - t0
        staged.unlink(missing_ok=True)
        status, cpu, rss_mb = 128 + signal.SIGKILL, 0.0, None
        if reply:
            fields = reply.split()
            status, rss_mb = int(fields[0]), int(fields[1]) / 1024
            cpu = float(fields[2]) + float(fields[3])
        else:
            self.close(kill=timed_out)
            if not timed_out:
                status = 111
                log.warning("a worker's sandbox ended: %s", self._errors.read_text(errors="replace")[-2000:])
        oom = False
        if cgroup is not None:
            cpu = max(cpu, cgroup.cpu_s())            # counts even what a killed init never reaped
            oom = cgroup.oom_killed()
        return {"returncode": status, "timed_out": timed_out, "wall_s": wall, "cpu_s": cpu, "max_rss_mb": rss_mb,
                "oom": oom, "out": out_path, "err": err_path}

    def close(self, kill: bool = False) -> None:
        """End it: closing the socket makes an idle init exit; one that does not within a second, or a program
        past its limit, is killed (init, and with it its PID namespace)."""
        if not self.alive:
            return
        self.alive = False
        self._sock.close()
        try:
            if kill:
                _kill_group(self._proc.pid)
            self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            _kill_group(self._proc.pid)
            self._proc.wait()
        if self.cgroup:
            self.cgroup.kill_all()
        self._errors.unlink(missing_ok=True)
        remove_tree(self._files)


def _work_folder(path: Path, files: dict[str, Path], uid: int | None) -> Path:
    """Outside namespaces: a folder only `uid` can enter, holding hard links (or copies) of `files`."""
    path.mkdir(mode=0o700)
    for dest, src in files.items():
        try:
            os.link(src, path / dest)
        except OSError:
            shutil.copy(src, path / dest)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


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
    """SIGKILL every process owned by a sandbox uid and wait until they are gone ("uid" mode, where a setsid()
    child may have left the process group and the run has no PID namespace)."""
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

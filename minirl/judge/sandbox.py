"""Run programs in a deny-by-default sandbox: one run at a time, or many in a worker's sandbox kept open.

    lease = lease_uids(2)                            # minirl/judge/host.py: uids no other live Judge holds
    mode = isolation_mode(lease.uids[0])             # "namespaces" | "uid" | "rlimits"
    r = run_sandboxed(["python3", "main.py"], rundir, "t0", uid=lease.uids[0], time_limit_s=2, memory_mb=256,
                      mode=mode, stdin="1 2\n", files={"main.py": rundir / "main.py"})
    r["returncode"], r["timed_out"], r["cpu_s"], r["max_rss_mb"], r["oom"], r["out"], r["err"]
    box = WorkerSandbox(uid, cgroup)                  # "namespaces": one sandbox, many runs, one at a time
    r = box.run(["./main"], ("main", binary), rundir, "t0", "1 2\n", time_limit_s=2, memory_mb=256)

The judge (minirl/judge/verdict.py, pool.py) decides verdicts; this file only runs things. The sandbox itself is
minirl/judge/sandbox.c (compiled once per machine), which says what a program sees: in "namespaces" mode (root, the
normal case) a new root holding read-only /usr and /lib*, a minimal /etc and /dev, /proc of its own PID namespace,
and an empty /work and /tmp on a tmpfs that takes its share of the memory limit (`memory_plan`); no network, a
seccomp filter (one process, threads allowed, unless the problem asks for processes), an unprivileged uid leased
for this Judge alone. A cgroup per run (minirl/judge/cgroup.py, when writable) counts memory outside the address
space. stdin is sealed and stdout/stderr are pipes (minirl/judge/stdio.py): nothing of the host is writable.
"uid" (root, no namespaces): uid, rlimits, seccomp (no file creation either) and the kill-and-reap, but the
host's files are visible. "rlimits" (not root): rlimits and seccomp as the judge's own uid. Judge untrusted code
only with "namespaces"; minirl/judge/README.md lists what holds in each mode.
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
from minirl.judge.host import cache_dir, remove_tree, stage_dir, unique_tmp
from minirl.judge.stdio import OUTPUT_LIMIT_BYTES, Capture, private_file, sealed_input

log = logging.getLogger(__name__)
NPROC = 64                         # processes (threads too) per run


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
        if _sandbox_helper_in(cache_dir()) is None:
            log.warning("no C compiler to build the sandbox (minirl/judge/sandbox.c): programs can signal the judge")
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

KERNEL_MB = 16                     # a cgroup's room beyond the limit: page tables, the sandbox's own processes
PIPES_MB = 2                       # at most 31 pipes (64 descriptors) of 64 KiB the filter keeps them at


def memory_plan(memory_mb: int, scratch_mb: int | None = None) -> tuple[int, int]:
    """(RLIMIT_AS bytes, tmpfs MiB) of a run: the tmpfs (/work and /tmp) takes its share of the limit, so the
    address space, the files and the pipes a program can hold stay within it with or without a cgroup. Contest
    programs write no files: 1/16 of the limit, 4 to 64 MiB. With `scratch_mb` (the compiler, trusted) the
    limit is the address space's alone."""
    if scratch_mb is not None:
        return memory_mb << 20, scratch_mb
    tmpfs = min(64, max(4, memory_mb // 16))
    return max(memory_mb - tmpfs - PIPES_MB, 1) << 20, tmpfs


def _begin(cg: RunCgroup, memory_mb: int) -> None:
    """A run's cgroup limits (memory: the limit and KERNEL_MB; page cache is reclaimed before it counts) and
    counters' start."""
    cg.begin((memory_mb + KERNEL_MB) << 20, NPROC)


def _joins(cg: RunCgroup) -> list[str]:
    """sandbox.c's options that make it join the cgroup."""
    return [a for p in cg.procs for a in ("-g", p)]


def _as_uid(uid: int, mode: str) -> int:
    """The uid a run gets: the leased one, or without root ("rlimits") the judge's own."""
    return os.getuid() if mode == "rlimits" else uid


ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def run_sandboxed(argv: list[str], rundir: Path, name: str, *, uid: int, time_limit_s: float, memory_mb: int,
                  mode: str, stdin: str | None = None, files: dict[str, Path] | None = None,
                  workdir: Path | None = None, output_limit: int = OUTPUT_LIMIT_BYTES,
                  cgroups: Cgroups | None = None, scratch_mb: int | None = None, forks: bool = False,
                  compiler: bool = False, wall_s: float | None = None) -> dict:
    """Run one process tree with `files` (name in /work -> host file, read-only) or the host folder `workdir`
    (read-write) as its working folder; stdin `stdin` (sealed) or /dev/null. Output: rundir/name.out and .err,
    through pipes (stdio.Capture), or with `compiler` written directly to files only root can open, with /dev/null
    as stdin and no /proc, so a source cannot #include a descriptor of the compiler's (a pipe would block it).
    `forks`: new processes allowed (else threads only). Wall limit: `wall_s`, default twice the CPU limit + 1 s."""
    files = files or {}
    report = rundir / f"{name}.usage"
    cache = cache_dir()
    helper = _sandbox_helper_in(cache)
    cg, host_work = None, None
    as_bytes, tmpfs_mb = memory_plan(memory_mb, scratch_mb)
    if mode == "namespaces":
        cwd = "/"
        opts = ["-i", str(_new_root(cache)), "-s", str(tmpfs_mb)]
        opts += ["-w", str(workdir)] if workdir else []
        opts += [a for dest, src in files.items() for a in ("-b", f"{src}:{dest}")]
    else:                                             # the host's folders: a work folder of its own
        host_work = workdir or _work_folder(rundir / name, files, uid if mode == "uid" else None)
        cwd, opts = str(host_work), []
    opts += ["-F"] * (forks and mode != "rlimits") + ["-N"] * compiler + ["-C"] * (mode == "uid" and not forks)
    if cgroups is not None:
        try:
            cg = cgroups.run(f"u{uid}")
            _begin(cg, memory_mb)
            opts += _joins(cg)
        except OSError as e:
            log.warning("no cgroup for this run (%s): rlimits only", e)
            cg = None
    cpu_s, fsize = _cpu_and_file_limits(time_limit_s, output_limit)
    nproc = 0 if mode == "rlimits" else NPROC         # RLIMIT_NPROC counts all the judge's own processes there
    if helper:
        cmd = [helper, "-u", str(_as_uid(uid, mode)), "-t", str(cpu_s), "-m", str(as_bytes), "-f", str(fsize),
               "-p", str(nproc), "-r", str(report), *opts, "--", *argv]
    else:                                             # "rlimits" without a C compiler: nothing stops signals
        cmd = ["prlimit", f"--cpu={cpu_s}", f"--as={as_bytes}", f"--fsize={fsize}", "--core=0", "--nofile=64",
               "--", *argv]
    env = {**ENV, "HOME": "/work" if mode == "namespaces" else cwd}
    wall_s = time_limit_s * 2 + 1.0 if wall_s is None else wall_s
    inp = sealed_input(stdin) if stdin is not None else os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with Capture(rundir, name, output_limit) if not compiler else _CompilerOutput(rundir, name) as cap:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdin=inp, stdout=cap.out_w, stderr=cap.err_w, cwd=cwd, env=env,
                                    start_new_session=True)  # its own process group
            cap.close_writers()
            timed_out = not _wait(proc.pid, cap, t0 + wall_s)  # sleep(), blocking reads
            if timed_out:
                _stop(proc.pid)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            _kill_group(proc.pid)                     # anything left in the group goes too
            if mode == "uid":
                _kill_uid(uid)                        # the leased uid is ours alone: it names what this run started
            if cg is not None:
                cg.kill_all()
            cap.finish()
        cpu, rss_mb = usage.ru_utime + usage.ru_stime, None
        if report.exists() and report.stat().st_size:
            rss_kb, user_s, sys_s = report.read_text().split()
            cpu, rss_mb = float(user_s) + float(sys_s), int(rss_kb) / 1024
        oom = False
        if cg is not None:
            cpu = max(cpu, cg.cpu_s())                # counts even what a killed init never reaped
            oom = cg.oom_killed()
    finally:
        os.close(inp)
        if cg is not None:
            cg.kill_all()
        report.unlink(missing_ok=True)
        if host_work is not None and workdir is None:
            remove_tree(host_work)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "wall_s": wall,
            "cpu_s": cpu, "max_rss_mb": rss_mb, "oom": oom, "out": cap.out, "err": cap.err}


def _cpu_and_file_limits(time_limit_s: float, output_limit: int) -> tuple[int, int]:
    """RLIMIT_CPU (the total is checked by the judge) and RLIMIT_FSIZE of one run."""
    return max(1, math.ceil(time_limit_s)) + 1, output_limit + 1


class _CompilerOutput:
    """The compiler's stdout and stderr: files only root can open (so no source can #include them)."""

    def __init__(self, rundir: Path, name: str):
        self.out, self.err = rundir / f"{name}.out", rundir / f"{name}.err"
        self.out_w, self.err_w = private_file(self.out), private_file(self.err)

    def __enter__(self) -> "_CompilerOutput":
        return self

    def __exit__(self, *exc) -> None:
        self.close_writers()

    def close_writers(self) -> None:
        for fd in (self.out_w, self.err_w):
            if fd >= 0:
                os.close(fd)
        self.out_w = self.err_w = -1

    def drain(self, done: int, deadline: float) -> bool:
        return bool(select.select([done], [], [], max(0.0, deadline - time.perf_counter()))[0])

    def finish(self) -> None:
        pass


class WorkerSandbox:
    """A worker's sandbox, kept open for its whole life ("namespaces" mode; sandbox.c's -c): the new root and
    namespaces are built, and the cgroup joined, once; each `run` is a request that the sandbox's init serves
    with a fresh process in mount, PID and IPC namespaces of its own (fresh /work and /tmp), killed and reaped
    with everything it started before the reply. ~1.3 ms a run instead of ~3.5 ms, and no cgroup join per program
    (a join can wait ~15 ms for an RCU grace period). `run` returns what `run_sandboxed` does. A run past its wall
    limit, or a sandbox that died, ends it (and everything it ran, before `run` returns): `alive` turns False and
    the next run needs a new one. The cgroup must be this sandbox's alone while it is open."""

    def __init__(self, uid: int, cgroup: RunCgroup | None):
        self.uid, self.cgroup = uid, cgroup
        cache = cache_dir()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for left in cache.glob(f"sandbox-{uid}-*"):    # a judge that died holding this uid left them
            if left.is_dir():
                remove_tree(left)
            else:
                left.unlink(missing_ok=True)
        # the program file of the run in progress, copied here: a folder on a tmpfs of the judge's own, bound
        # read-only at /.run/bin, so that the program's /proc/self/mountinfo names "/u<uid>", no host path
        self._files = stage_dir() / f"u{uid}"
        remove_tree(self._files)
        self._files.mkdir(mode=0o700)
        self._staged: dict[str, tuple] = {}            # name -> (device, inode, size, mtime) of the file staged
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

    def _stage(self, name: str, src: Path) -> None:
        """Copy the program's file in, unless it is the one already there (a job's tests, one after another)."""
        st = os.stat(src)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._staged.get(name) != key:
            self._staged.pop(name, None)
            tmp = unique_tmp(self._files / name)
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, self._files / name)
            self._staged[name] = key

    def run(self, argv: list[str], file: tuple[str, Path], rundir: Path, name: str, stdin: str, *,
            time_limit_s: float, memory_mb: int, output_limit: int = OUTPUT_LIMIT_BYTES,
            forks: bool = False) -> dict:
        """Run `argv` in /work, where `file` (name, host path) is bound read-only; stdin `stdin` (sealed),
        output to rundir/name.out and .err (through pipes)."""
        cgroup = self.cgroup
        if cgroup is not None:
            try:
                _begin(cgroup, memory_mb)
            except OSError as e:                          # v1: a limit below what is still charged (EBUSY)
                log.warning("no cgroup for this run (%s): rlimits only", e)
                cgroup = None
        as_bytes, tmpfs_mb = memory_plan(memory_mb)
        cpu_s, fsize = _cpu_and_file_limits(time_limit_s, output_limit)
        fields = [str(cpu_s), str(as_bytes), str(fsize), str(tmpfs_mb), "1" if forks else "0", file[0], *argv]
        self._stage(*file)
        timed_out, reply = False, b""
        inp = sealed_input(stdin)
        try:
            with Capture(rundir, name, output_limit) as cap:
                t0 = time.perf_counter()
                try:
                    socket.send_fds(self._sock, [b"".join(f.encode() + b"\0" for f in fields)],
                                    [inp, cap.out_w, cap.err_w])
                    cap.close_writers()
                    timed_out = not cap.drain(self._sock.fileno(), t0 + time_limit_s * 2 + 1.0)  # sleep(), reads
                    if not timed_out:
                        reply = self._sock.recv(128)
                except OSError:                        # init is gone: reply stays empty
                    pass
                wall = time.perf_counter() - t0
                if not reply:
                    self.close(kill=timed_out)         # every process of the run is gone when this returns
                cap.finish()
        finally:
            os.close(inp)
        status, cpu, rss_mb = 128 + signal.SIGKILL, 0.0, None
        if reply:
            fields = reply.split()
            status, rss_mb = int(fields[0]), int(fields[1]) / 1024
            cpu = float(fields[2]) + float(fields[3])
        elif not timed_out:
            status = 111
            log.warning("a worker's sandbox ended: %s", self._errors.read_text(errors="replace")[-2000:])
        oom = False
        if cgroup is not None:
            cpu = max(cpu, cgroup.cpu_s())            # counts even what a killed init never reaped
            oom = cgroup.oom_killed()
        return {"returncode": status, "timed_out": timed_out, "wall_s": wall, "cpu_s": cpu, "max_rss_mb": rss_mb,
                "oom": oom, "out": cap.out, "err": cap.err}

    def close(self, kill: bool = False) -> None:
        """End it: closing the socket makes an idle init exit; one that does not within a second, or a program
        past its limit, is stopped (init killed, and with it its PID namespace, before the launcher exits)."""
        if not self.alive:
            return
        self.alive = False
        self._sock.close()
        try:
            if kill:
                _stop(self._proc.pid)
            self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            _stop(self._proc.pid)
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


def _wait(pid: int, cap, deadline: float) -> bool:
    """Drain the run's output until `pid` exits (True) or the deadline passes (False)."""
    fd = os.pidfd_open(pid)
    try:
        return cap.drain(fd, deadline)
    finally:
        os.close(fd)


def _stop(launcher: int, timeout_s: float = 2.0) -> None:
    """End a run past its wall limit: SIGTERM makes sandbox.c's launcher kill its init (and with it the init's
    PID namespace) and exit once it is reaped, so that nothing of the run is left when the launcher's exit is
    seen. A launcher that does not exit in time is killed with its whole process group."""
    try:
        os.kill(launcher, signal.SIGTERM)
        fd = os.pidfd_open(launcher)
    except ProcessLookupError:
        return
    try:
        if not select.select([fd], [], [], timeout_s)[0]:
            _kill_group(launcher)
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

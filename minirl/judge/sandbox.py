"""Run a program in a deny-by-default sandbox (minirl/judge/worker_sandbox.py keeps one open for many runs).

    lease = lease_uids(2)                            # minirl/judge/host.py: uids no other live Judge holds
    mode = isolation_mode(lease.uids[0])             # "namespaces" | "uid" | "rlimits"
    r = run_sandboxed(["python3", "main.py"], rundir, "t0", uid=lease.uids[0], time_limit_s=2, memory_mb=256,
                      mode=mode, stdin="1 2\n", files={"main.py": rundir / "main.py"})
    r["returncode"], r["timed_out"], r["cpu_s"], r["max_rss_mb"], r["oom"], r["out"], r["err"]

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
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from minirl.judge.cgroup import Cgroups, RunCgroup
from minirl.judge.host import cache_dir, remove_tree, unique_tmp
from minirl.judge.stdio import OUTPUT_LIMIT_BYTES, Capture, private_file, sealed_input

log = logging.getLogger(__name__)
NPROC = 64                         # processes (threads too) per run


# --- the sandbox helper ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def sandbox_helper(cache: Path) -> str | None:
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


def new_root(cache: Path) -> Path:
    """The empty folder each sandbox mounts its own root on (inside its private mount namespace)."""
    d = cache / "newroot"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def isolation_mode(uid: int) -> str:
    """"namespaces" (root, sandbox.c builds and its namespaces work), "uid" (root, no namespaces) or
    "rlimits" (not root)."""
    if os.geteuid() != 0:
        if sandbox_helper(cache_dir()) is None:
            log.warning("no C compiler to build the sandbox (minirl/judge/sandbox.c): programs can signal "
                        "the judge")
        _not_dumpable()
        return "rlimits"
    helper = sandbox_helper(cache_dir())
    if helper is None:
        raise RuntimeError("the judge needs a C compiler (cc) to build its sandbox (minirl/judge/sandbox.c) when run as "
                           "root: install gcc")
    probe = [helper, "-u", str(uid), "-t", "5", "-m", str(1 << 30), "-f", "1024", "-p", "8"]
    ok = subprocess.run(probe + ["-i", str(new_root(cache_dir())), "-s", "1", "--", "true"], capture_output=True,
                        timeout=30)
    if ok.returncode == 0:
        return "namespaces"
    log.warning("sandbox namespaces do not work here (%s): programs will see the host's files",
                ok.stderr.decode(errors="replace").strip())
    return "uid"


def _not_dumpable() -> None:
    """Without root, programs run as this process's uid: make its /proc/PID files (mem, fd, environ) root's, so
    they cannot write its memory or reopen its descriptors. (Core dumps of this process are lost with it.)"""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        log.warning("cannot make the judging process undumpable: programs may write its memory")


# --- one run -----------------------------------------------------------------------------------------------------

KERNEL_MB = 16                     # a cgroup's room beyond the limit: page tables, the sandbox's own processes
PIPES_MB = 4                       # 31 pipes of 64 KiB (the filter keeps them at that): with processes only
LOADER_MB = 8                      # what is mapped before main(): the loader, libc, libstdc++, libm, libgcc_s, the
                                   # vDSO (5.6 MiB of address space for an empty C++ program here, 2026-12-05)


def memory_plan(memory_mb: int, scratch_mb: int | None = None, forks: bool = False) -> tuple[int, int]:
    """(RLIMIT_AS bytes, tmpfs MiB) of a run: what the program itself allocates (its arrays, heap, stacks) plus
    its files (the tmpfs: /work and /tmp) and pipes stays within the limit with or without a cgroup, and the
    address space has LOADER_MB more for the libraries mapped before main() (without it a 240 MiB table at a
    256 MiB limit died before main(), RE). Contest programs write no files: the tmpfs is 1/64 of the limit,
    4 to 64 MiB. Pipes (PIPES_MB) only where processes are allowed (the filter refuses them otherwise). With
    `scratch_mb` (the compiler, trusted) the limit is the address space's alone."""
    if scratch_mb is not None:
        return memory_mb << 20, scratch_mb
    tmpfs = min(64, max(4, memory_mb // 64))
    return max(memory_mb - tmpfs - PIPES_MB * forks + LOADER_MB, 1) << 20, tmpfs


def begin_cgroup(cg: RunCgroup, memory_mb: int) -> None:
    """A run's cgroup limits (memory: the limit and KERNEL_MB; page cache is reclaimed before it counts) and
    counters' start."""
    cg.begin((memory_mb + KERNEL_MB) << 20, NPROC)


def cgroup_options(cg: RunCgroup) -> list[str]:
    """sandbox.c's options that make it join the cgroup."""
    return [a for p in cg.procs for a in ("-g", p)]


def _as_uid(uid: int, mode: str) -> int:
    """The uid a run gets: the leased one, or without root ("rlimits") the judge's own."""
    return os.getuid() if mode == "rlimits" else uid


# MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space for each thread's malloc arena, which RLIMIT_AS
# counts: a threaded program would then run out of address space (its stack cannot grow: SIGSEGV) long before
# it uses its memory limit, depending on how its threads happened to race
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "1"}


def run_sandboxed(argv: list[str], rundir: Path, name: str, *, uid: int, time_limit_s: float, memory_mb: int,
                  mode: str, stdin: str | None = None, files: dict[str, Path] | None = None,
                  workdir: Path | None = None, output_limit: int = OUTPUT_LIMIT_BYTES,
                  cgroups: Cgroups | None = None, scratch_mb: int | None = None, forks: bool = False,
                  compiler: bool = False, wall_s: float | None = None, create_files: bool = True) -> dict:
    """Run one process tree with `files` (name in /work -> host file, read-only) or the host folder `workdir`
    (read-write) as its working folder; stdin `stdin` (sealed) or /dev/null. Output: rundir/name.out and .err,
    through pipes (stdio.Capture), or with `compiler` written directly to files only root can open, with /dev/null
    as stdin and no /proc, so a source cannot #include a descriptor of the compiler's (a pipe would block it).
    `forks`: new processes allowed (else threads only). `create_files=False`: in "uid" mode, where the folders
    are the host's, no file can be created (a program's state would outlive it in /tmp or /dev/shm). Wall limit:
    `wall_s`, default twice the CPU limit + 1 s."""
    files = files or {}
    report = rundir / f"{name}.usage"
    cache = cache_dir()
    helper = sandbox_helper(cache)
    cg, host_work = None, None
    as_bytes, tmpfs_mb = memory_plan(memory_mb, scratch_mb, forks)
    if mode == "namespaces":
        cwd = "/"
        opts = ["-i", str(new_root(cache)), "-s", str(tmpfs_mb)]
        opts += ["-w", str(workdir)] if workdir else []
        opts += [a for dest, src in files.items() for a in ("-b", f"{src}:{dest}")]
    else:                                             # the host's folders: a work folder of its own
        host_work = workdir or _work_folder(rundir / name, files, uid if mode == "uid" else None)
        cwd, opts = str(host_work), []
    opts += ["-F"] * (forks and mode != "rlimits") + ["-N"] * compiler
    opts += ["-C"] * (mode == "uid" and not create_files)
    if cgroups is not None:
        try:
            cg = cgroups.run(f"u{uid}")
            begin_cgroup(cg, memory_mb)
            opts += cgroup_options(cg)
        except OSError as e:
            log.warning("no cgroup for this run (%s): rlimits only", e)
            cg = None
    cpu_s, fsize = cpu_and_file_limits(time_limit_s, output_limit)
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
                stop_launcher(proc.pid)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            _kill_group(proc.pid)                     # anything left in the group goes too
            if mode == "uid":
                _kill_uid(uid)                        # the leased uid is ours alone: it names what the run started
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


@dataclass(frozen=True)
class Sandbox:
    """Where one worker's programs run: this machine's isolation mode, the worker's leased uid and its cgroups
    (None: rlimits only). What the compiler, checkers and the modes without namespaces run through."""
    mode: str
    uid: int
    cgroups: Cgroups | None = None

    def run(self, argv: list[str], rundir: Path, name: str, **limits) -> dict:
        """`run_sandboxed` as this worker."""
        return run_sandboxed(argv, rundir, name, uid=self.uid, mode=self.mode, cgroups=self.cgroups, **limits)

    def give(self, path: Path) -> None:
        """Make a root-written file the worker uid's (without root there is nobody else to keep out)."""
        if self.mode != "rlimits":
            os.chown(path, self.uid, self.uid)


def cpu_and_file_limits(time_limit_s: float, output_limit: int) -> tuple[int, int]:
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


def stop_launcher(launcher: int, timeout_s: float = 2.0) -> None:
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

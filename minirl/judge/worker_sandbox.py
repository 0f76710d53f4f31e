"""A worker's sandbox, kept open for the Judge's life: many runs, one at a time, each fresh.

    box = WorkerSandbox(uid, cgroup)                  # "namespaces" mode only
    r = box.run(["./main"], ("main", binary), rundir, "t0", "1 2\\n", time_limit_s=2, memory_mb=256)
    r["returncode"], r["timed_out"], r["cpu_s"], r["max_rss_mb"], r["oom"], r["out"], r["err"]
    box.close()

sandbox.c's -c mode: the launcher builds the new root and namespaces once and serves run requests on a unix
socket; minirl/judge/sandbox.py runs single programs (the compiler, checkers, the modes without namespaces) and
holds what both share (limits, stopping a launcher).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from minirl.judge.cgroup import RunCgroup
from minirl.judge.host import cache_dir, remove_tree, stage_dir, unique_tmp
from minirl.judge.sandbox import (ENV, NPROC, begin_cgroup, cgroup_options, cpu_and_file_limits, memory_plan,
                                  new_root, sandbox_helper, stop_launcher)
from minirl.judge.stdio import OUTPUT_LIMIT_BYTES, Capture, sealed_input
from minirl.judge.sysroot import program_root

log = logging.getLogger(__name__)
STAGE_TRIES = 3                    # copies tried while the staging tmpfs is full, 0.5 s apart


def _tail(path: Path) -> str:
    """The last 2000 characters of a file, "" if it is gone."""
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError:
        return ""


class SandboxDied(OSError):
    """The worker's sandbox ended during a run without its reply (killed, crashed), and not for memory: the
    judge's fault, so the job is a judge error (verdict.py), never the program's RE."""


class StageFull(OSError):
    """The staging tmpfs had no room for a program's file: the judge's fault (verdict.py: a judge error)."""


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
        system = program_root(uid)                     # this worker's own copy of what programs load
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for left in cache.glob(f"sandbox-{uid}-*"):    # a judge that died holding this uid left them
            if left.is_dir():
                remove_tree(left)
            else:
                left.unlink(missing_ok=True)
        # the program file of the run in progress, copied here: a folder on a tmpfs of the judge's own, bound
        # read-only at /.run/bin, so that the program's /proc/self/mountinfo names "/u<uid>", no host path
        self._files = stage_dir(uid) / f"u{uid}"           # stage_dir: room for a binary of every uid
        remove_tree(self._files)
        self._files.mkdir(mode=0o700)
        self._staged: dict[str, tuple] = {}            # name -> (device, inode, size, mtime) of the file staged
        opts = ["-u", str(uid), "-p", str(NPROC), "-i", str(new_root(cache)), "-b", f"{self._files}:/.run/bin",
                "-R", str(system), "-c", str(theirs.fileno())]
        opts += cgroup_options(cgroup) if cgroup else []
        self._errors = cache / f"sandbox-{uid}-{os.getpid()}.err"   # the sandbox's own failures
        try:
            with open(self._errors, "wb") as err:
                self._proc = subprocess.Popen(
                    [sandbox_helper(cache), *opts], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
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
        if not self._files.is_dir():                   # removed under us: this sandbox can never see a new file
            self.close()
            raise RuntimeError(f"the staging folder {self._files} was removed; the next run gets a new sandbox")
        if self._staged.get(name) != key:
            self.unstage()                             # the last job's file first: one file of ours at a time
            tmp = unique_tmp(self._files / name)
            for attempt in range(STAGE_TRIES):
                try:
                    shutil.copyfile(src, tmp)
                    break
                except OSError as e:
                    tmp.unlink(missing_ok=True)        # a failed copy's part would fill the tmpfs for good
                    if e.errno != errno.ENOSPC:
                        raise
                    if attempt == STAGE_TRIES - 1:     # other judges' files: a judge fault, not the program's
                        raise StageFull(f"the staging tmpfs {self._files.parent} is full ({st.st_size} bytes "
                                        "to stage): a judge error, not the program's") from e
                    time.sleep(0.5)                    # their jobs end and unstage theirs
            os.chmod(tmp, 0o755)
            os.replace(tmp, self._files / name)
            self._staged[name] = key

    def unstage(self) -> None:
        """Remove the staged program files (a job's end: a worker held its last binary, up to 128 MiB, until its
        next job, and the stage is one tmpfs for every judge on the host)."""
        for name in list(self._staged):
            self._staged.pop(name)
            try:
                os.unlink(self._files / name)
            except OSError:
                pass

    def run(self, argv: list[str], file: tuple[str, Path], rundir: Path, name: str, stdin: str, *,
            time_limit_s: float, memory_mb: int, output_limit: int = OUTPUT_LIMIT_BYTES,
            forks: bool = False) -> dict:
        """Run `argv` in /work, where `file` (name, host path) is bound read-only; stdin `stdin` (sealed),
        output to rundir/name.out and .err (through pipes)."""
        cgroup = self.cgroup
        if cgroup is not None:
            try:
                begin_cgroup(cgroup, memory_mb)
            except OSError as e:                          # v1: a limit below what is still charged (EBUSY)
                log.warning("no cgroup for this run (%s): rlimits only", e)
                cgroup = None
        as_bytes, tmpfs_mb = memory_plan(memory_mb, forks=forks)
        cpu_s, fsize = cpu_and_file_limits(time_limit_s, output_limit)
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
                    why = "" if timed_out else _tail(self._errors)  # close() removes the file
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
            log.warning("a worker's sandbox ended: %s", why)
        oom = False
        if cgroup is not None:
            cpu = max(cpu, cgroup.cpu_s())            # counts even what a killed init never reaped
            oom = cgroup.oom_killed()
        # the sandbox died under the program (killed, crashed; no reply): not its verdict. A reply of 111 is the
        # program's own exit code (exit(111)), its RE: never a judge error a program could choose
        if not reply and not timed_out and not oom:
            raise SandboxDied(f"the worker's sandbox ended during the run {why[-300:]}".strip())
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
                stop_launcher(self._proc.pid)
            self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            stop_launcher(self._proc.pid)
            self._proc.wait()
        if self.cgroup:
            self.cgroup.kill_all()
        self._errors.unlink(missing_ok=True)
        remove_tree(self._files)

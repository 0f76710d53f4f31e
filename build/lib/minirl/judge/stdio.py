"""What a sandboxed run reads and writes: nothing of the host that it could change or keep.

    fd = sealed_input("1 2\\n")                        # stdin: a sealed memfd (nobody can write it, even reopened)
    with Capture(rundir, "t0") as cap:                 # stdout/stderr: pipes the judge drains, capped
        ... start the run with stdin=fd, stdout=cap.out_w, stderr=cap.err_w; cap.close_writers() ...
        timed_out = not cap.drain(done_fd, deadline)   # until `done_fd` is readable (the run ended) or deadline
        ... end the run if it timed out ...; cap.finish() # the rest, once nothing of the run is left
    cap.out, cap.err                                   # host files, root's 0600: what the run printed

A program's stdin is a memfd written by the judge and sealed (F_SEAL_WRITE and friends): reopening
/proc/self/fd/0 for writing gets a file that refuses every write, so a special checker, which gets its own
copy anyway, always sees the instance the program was given; it names no host path either. stdout and stderr are
pipes: the program cannot read back what it wrote, nor keep storage the memory limit does not count, and the
judge moves the bytes (splice, no copy through Python) into root's files, stdout up to OUTPUT_LIMIT_BYTES + 1
(one more byte makes the verdict OLE; then the pipe is closed and the program's next write fails), stderr's first
STDERR_KEPT bytes (the message of a failed test) with the rest drained to /dev/null up to the same cap.
"""
from __future__ import annotations

import fcntl
import os
import select
import time
from pathlib import Path

OUTPUT_LIMIT_BYTES = 64 << 20      # a program printing more than this is OLE
STDERR_KEPT = 64 << 10             # stderr bytes kept for the verdict's message; the rest is discarded
PIPE_BYTES = 1 << 20               # the judge's side may size its pipes (the program's filter forbids it)
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def sealed_input(text: str | bytes) -> int:
    """A read-only, unchangeable file holding `text`, at offset 0 (the caller closes it)."""
    fd = os.memfd_create("input", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        data = memoryview(text.encode() if isinstance(text, str) else text)
        while data:
            data = data[os.write(fd, data):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd
    except BaseException:
        os.close(fd)
        raise


def private_file(path: Path) -> int:
    """A new file only root can open (0600), opened write-only: a run's output, or a compiler's, which cannot
    reopen it through /proc/self/fd (a regular file is permission-checked again there)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)


class Capture:
    """A run's stdout and stderr: two pipes, drained into rundir/name.out and .err."""

    def __init__(self, rundir: Path, name: str, output_limit: int = OUTPUT_LIMIT_BYTES):
        self.out, self.err = rundir / f"{name}.out", rundir / f"{name}.err"
        self._limit = output_limit
        self._files = [private_file(self.out), private_file(self.err)]
        self._null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        (out_r, self.out_w), (err_r, self.err_w) = os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)
        for r in (out_r, err_r):
            try:
                fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:                            # above /proc/sys/fs/pipe-max-size: the default size
                pass
            os.set_blocking(r, False)
        self._open = {out_r: 0, err_r: 1}              # read end -> 0 (stdout) or 1 (stderr)
        self._moved = [0, 0]

    def __enter__(self) -> "Capture":
        return self

    def __exit__(self, *exc) -> None:
        self.close_writers()
        for fd in [*self._open, *self._files, self._null]:
            os.close(fd)
        self._open, self._files, self._null = {}, [], -1

    def close_writers(self) -> None:
        """Once the run holds its copies: the pipes reach EOF when the run's last process is gone."""
        for name in ("out_w", "err_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def _move(self, r: int) -> None:
        """Move what pipe `r` holds; at EOF or past the cap, close it."""
        k = self._open[r]
        while True:
            room = self._limit + 1 - self._moved[k]
            if room <= 0:
                break
            kept = STDERR_KEPT - self._moved[1] if k else room
            target = self._files[k] if kept > 0 else self._null
            try:
                n = os.splice(r, target, min(room, kept if kept > 0 else room, PIPE_BYTES))
            except BlockingIOError:
                return
            if n == 0:
                break
            self._moved[k] += n
        del self._open[r]
        os.close(r)

    def drain(self, done: int, deadline: float) -> bool:
        """Drain both pipes until `done` (a pidfd or the sandbox's socket) is readable; False if the deadline
        passed first. Either way the caller ends what is left of the run, then calls `finish`."""
        poll = select.poll()
        for fd in (done, *self._open):
            poll.register(fd, select.POLLIN)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            events = poll.poll(left * 1000)
            ended = False
            for fd, _ in events:
                if fd == done:
                    ended = True
                elif fd in self._open:
                    self._move(fd)
                    if fd not in self._open:
                        poll.unregister(fd)
            if ended:
                return True

    def finish(self, quiet_s: float = 1.0) -> None:
        """Drain to EOF once the run is over (every writer gone); a pipe still open after `quiet_s` without a
        byte (a writer the run left behind) is closed."""
        poll = select.poll()
        for fd in self._open:
            poll.register(fd, select.POLLIN)
        while self._open:
            events = poll.poll(quiet_s * 1000)
            if not events:
                break
            for fd, _ in events:
                if fd in self._open:
                    self._move(fd)
                    if fd not in self._open:
                        poll.unregister(fd)

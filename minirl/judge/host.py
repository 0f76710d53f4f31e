"""What the judge keeps on the host: its folders, and the sandbox uids it leases.

    d = cache_dir()                                  # binaries, the PCH, run folders: root's (0711)
    lease = lease_uids(2)                            # uids no other live Judge on this host holds
    lease.uids; lease.release()
    remove_tree(folder)                              # any depth, never raises

minirl/judge/sandbox.py runs programs as these uids in these folders.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import grp
import logging
import os
import pwd
import tempfile
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
_stage_lock = threading.Lock()
# Sandbox uids; any that names an account or group is skipped. Not 61000-61899: judges from before leases took
# those without asking and killed every process of their uid after each test, so one still running beside us
# would kill our programs.
UID_RANGE = range(62000, 62900)


# --- where sandboxes live -----------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """Binaries, the PCH and run folders: root's alone (0711: a "uid"-mode sandbox may pass through to its own
    folder, but no sandbox can list it). Not under /tmp when root, where sandboxes of older versions mounted
    their private tmpfs."""
    d = _cache_path(os.environ.get("MINIRL_JUDGE_CACHE"), os.geteuid())
    try:
        if d.stat().st_mode & 0o777 == 0o711:  # every run asks: one stat when all is in place
            return d
    except FileNotFoundError:
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o711)
    return d


@functools.lru_cache(maxsize=None)
def _cache_path(setting: str | None, euid: int) -> Path:
    default = Path("/var/lib/minirl-judge") if euid == 0 else Path(tempfile.gettempdir()) / f"minirl-judge-{euid}"
    d = Path(setting or default).resolve()
    if euid == 0 and any(d.is_relative_to(t) for t in ("/tmp", "/var/tmp", "/dev/shm")):
        raise ValueError(f"MINIRL_JUDGE_CACHE={d} is under a world-writable directory; choose another folder "
                         "(default /var/lib/minirl-judge)")
    return d


STAGE = Path("/run/minirl-judge-stage")
# one program file per worker at a time, at most the compiler's file limit (compile.py's COMPILE_FILE_BYTES, 128 MiB;
# a Python source is far smaller). The tmpfs holds one such file for every uid up to the highest one a judge of
# this host has used (`stage_bytes`): with a fixed 2 GiB, 16 workers staging big binaries filled it, and the
# programs' own files became judge errors. Its size is a cap, not memory taken: what is staged is at most
# workers x 128 MiB, which the host must hold anyway.
STAGE_FILE_BYTES = 128 << 20
STAGE_MIN_BYTES = 2 << 30
STAGE_OPTIONS = "mode=700,nosuid,nodev,nr_inodes=65536"
_stage_checked = 0                 # the size this process made sure of (0: none yet)


def stage_bytes(uid: int) -> int:
    """The staging tmpfs's size when worker uids up to `uid` may stage at once: a largest file (and a page) for
    each uid of UID_RANGE up to it, and a margin, at least STAGE_MIN_BYTES."""
    uids = max(1, uid - UID_RANGE.start + 1)
    return max(STAGE_MIN_BYTES, uids * (STAGE_FILE_BYTES + (4 << 10)) + (64 << 20))


def _mounted_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def stage_dir(uid: int = UID_RANGE.start) -> Path:
    """Where worker sandboxes take their programs' files from (sandbox.py: `WorkerSandbox`): a tmpfs of the
    judge's own (mounted once per host, root's alone), so that the bind a program sees names a path of that
    tmpfs ("/u62000/main"), not one of the host; host-wide, whatever MINIRL_JUDGE_CACHE says. Grown (never
    shrunk: other judges' uids may be higher) to `stage_bytes(uid)` for the worker uid `uid` that will stage."""
    global _stage_checked
    need = stage_bytes(uid)
    with _stage_lock:
        if _stage_checked < need or not os.path.ismount(STAGE):
            STAGE.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(STAGE.with_name(STAGE.name + ".lock"), "w") as lock:   # judges of other processes
                fcntl.flock(lock, fcntl.LOCK_EX)
                mounted = os.path.ismount(STAGE)
                size = max(need, _mounted_bytes(STAGE) if mounted else 0)
                options = f"{STAGE_OPTIONS},size={size}"
                how = ["-o", f"remount,{options}"] if mounted else ["-t", "tmpfs", "-o", options, "tmpfs"]
                try:
                    r = subprocess.run(["mount", *how, str(STAGE)], capture_output=True, text=True)
                    error = r.stderr.strip() if r.returncode else ""
                except OSError as e:        # no mount(8)
                    error = str(e)
                _stage_checked = size
                if error and not mounted:   # still private (0700), but a program's mountinfo names the path
                    log.warning("cannot mount the judge's staging tmpfs (%s): programs see its host path", error)
                elif error:
                    log.warning("cannot give the judge's staging tmpfs a size (%s)", error)
        return STAGE


SYSROOTS = Path("/run/minirl-judge-sysroot")
# the workers' copies of the system files (sysroot.py, ~57 MB each): in RAM and never swapped (noswap, Linux 6.4+),
# so that every page of them is resident for every run and no run can leave a cold page warm for the next one
SYSROOT_OPTIONS = "mode=700,nosuid,nodev,size=4g,nr_inodes=1048576"
_sysroot_checked: Path | None = None


def sysroot_dir() -> Path:
    """Where the workers' copies of the system files live: a tmpfs of the judge's own, mounted once per host
    (noswap where the kernel has it). A page of a file on disk is cached or not, and a run could tell which (a
    major fault in getrusage, or the time of a read: round 5's channel between consecutive runs of one worker);
    a tmpfs page is always in memory. Where no tmpfs can be mounted: the cache folder, with a warning."""
    global _sysroot_checked
    with _stage_lock:
        if _sysroot_checked is not None and (_sysroot_checked != SYSROOTS or os.path.ismount(SYSROOTS)):
            return _sysroot_checked
        SYSROOTS.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(SYSROOTS.with_name(SYSROOTS.name + ".lock"), "w") as lock:   # judges of other processes
            fcntl.flock(lock, fcntl.LOCK_EX)
            error = ""
            if not os.path.ismount(SYSROOTS):
                for options in (f"{SYSROOT_OPTIONS},noswap", SYSROOT_OPTIONS):
                    try:
                        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(SYSROOTS)],
                                           capture_output=True, text=True)
                        error = r.stderr.strip() if r.returncode else ""
                    except OSError as e:    # no mount(8)
                        error = str(e)
                    if not error:
                        if "noswap" not in options:
                            log.warning("the copies of the system files are on a tmpfs without noswap (a kernel "
                                        "before 6.4): under swap pressure a page of them may leave memory")
                        break
            _sysroot_checked = SYSROOTS if not error else cache_dir()
            if error:
                log.warning("cannot mount a tmpfs for the programs' copies of the system files (%s): they stay "
                            "on disk, where one run can leave a page cached for the next", error)
        return _sysroot_checked


def job_folder(prefix: str) -> Path:
    """A new private folder in the cache for one job's host-side files, named after this process
    (`<prefix>-<pid>-...`), so that a later judge can tell it from a live judge's and remove it."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=cache_dir()))


def remove_orphans(prefixes: tuple[str, ...] = ("run", "cc")) -> int:
    """Remove the job folders of judges that are gone (killed before they could clean up): named by
    `job_folder` after a process that no longer exists. Returns how many were removed."""
    removed = 0
    for path in cache_dir().iterdir():
        head, _, rest = path.name.partition("-")
        pid = rest.split("-", 1)[0]
        if head not in prefixes or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue                            # its judge is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue                            # alive, as another user
        remove_tree(path)
        removed += 1
    return removed


def unique_tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


def remove_tree(path: Path) -> None:
    """Delete a folder tree of any depth without recursion and without raising (a program can build a tree
    deeper than Python's recursion limit or PATH_MAX). Walks with one open folder at a time, by relative names."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):  # a file or a link where a folder was: remove it as it is
            log.warning("cannot remove %s: %s", path, e)
            return
        try:
            os.unlink(path)
        except OSError as e:
            log.warning("cannot remove %s: %s", path, e)
        return
    names: list[str] = []                       # the way down from `path` to the folder `fd` is open on
    try:
        while True:
            sub = None
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if sub is not None:                 # go down
                child = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd, _ = child, names.append(sub)
            elif names:                         # empty: go up and remove it
                parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(names.pop(), dir_fd=fd)
            else:
                break
        os.close(fd)
        os.rmdir(path)
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)
        try:
            os.close(fd)
        except OSError:
            pass


# --- uids ------------------------------------------------------------------------------------------------------

@dataclass
class UidLease:
    """Uids held through flock()ed files: the kernel releases them when this process ends, crash or not."""
    uids: list[int]
    fds: list[int]

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.uids, self.fds = [], []


def lease_folder() -> Path:
    """Host-wide, whatever MINIRL_JUDGE_CACHE says: judges with different caches still share uids.
    MINIRL_JUDGE_LEASES moves it (tests use a folder of their own, so other judges on the host don't race them)."""
    default = Path("/run/minirl-judge-uids") if os.geteuid() == 0 else \
        Path(tempfile.gettempdir()) / f"minirl-judge-uids-{os.getuid()}"
    return Path(os.environ.get("MINIRL_JUDGE_LEASES", default))


def lease_uids(n: int) -> UidLease:
    """`n` sandbox uids that no other live lease on this host holds, none of them an account's or a group's."""
    folder = lease_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    lease = UidLease([], [])
    for uid in UID_RANGE:
        if len(lease.uids) == n:
            return lease
        if uid in taken:
            continue
        fd = os.open(folder / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        lease.uids.append(uid)
        lease.fds.append(fd)
    if len(lease.uids) == n:
        return lease
    lease.release()
    raise RuntimeError(f"no {n} free sandbox uids in {UID_RANGE.start}-{UID_RANGE.stop - 1}: too many judges "
                       "on this host; use fewer workers")


CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


def core_pattern_warning() -> str | None:
    """A warning if the host's core_pattern sends dumps to a socket ("@..."), which the kernel (6.16 and later)
    does with RLIMIT_CORE set to infinity: the sandbox's limit of 1 (which stops a "|helper" pipe) does not hold,
    and a crashing program's memory would reach the socket's root listener. None otherwise."""
    try:
        pattern = CORE_PATTERN.read_text().strip()
    except OSError:
        return None
    if not pattern.startswith("@"):
        return None
    return (f"kernel.core_pattern is {pattern[:80]!r}, a socket: RLIMIT_CORE=1 does not stop a crashing program's "
            "dump from reaching it; set a file or '|' pattern on judge hosts")

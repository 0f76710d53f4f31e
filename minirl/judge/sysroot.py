"""A worker's own copy of the system files programs run on: no file page shared with a sibling sandbox.

    root = program_root(uid)        # sysroot_dir()/sysroot-<uid>-<key>: python3, its stdlib, the shared libraries
    # sandbox.c -R root: the worker's sandbox binds root's /usr and /lib* (and the /etc files) for the host's

Why copies. Two programs judged at once in sibling sandboxes must have nothing to talk through. A futex on a
file page is keyed by the file's inode and offset, not by the process: a thread created with
CLONE_CHILD_CLEARTID pointing into a mapped system library makes the kernel wake, at the thread's exit, whoever
waits on that word, in any sandbox that maps the same file (issue 31's review; seccomp cannot see the pointer's
target). The same holds for every other per-inode state of a shared file (its page cache, its locks). A copy
is a new inode: programs of different workers then map different files, and the futex keys never meet (hard
links would not do: one inode).

What is copied: what programs load, derived, not listed by hand: the `python3` on the sandbox's PATH and its
standard library (without its tests, IDLE, Tk, the static library and third-party packages: contest
programs import the standard library), the shell and a few tools (`TOOLS`, for problems that allow processes),
the shared libraries `ldd` names for all of these, its extension modules, libstdc++ and libgcc_s (what a C++
program links against), with the dynamic loader, and the loader's cache; the C.UTF-8 locale and the time
zones (`DATA`); the host's top-level links (/bin -> usr/bin). About 57 MB per worker uid, built once per
boot (kept across Judges; rebuilt when python3, its stdlib folders, the loader's cache, localtime, `DATA`,
a tool, g++ or `VERSION` change: `_key`), in RAM: on a tmpfs of the judge's own that is never swapped
(host.py: `sysroot_dir`), so that every page of it is resident for every run. The compiler and the checkers
are trusted: they keep the host's root. Only "namespaces" mode has copies; where one cannot be built the
worker's sandbox does not start (never the host's files instead).

Programs of one worker, one after another, share that worker's copy. On disk, one run could leave pages of it
cached for the next to find (a major fault in getrusage, or a fast read: round 5); in RAM every page is always
there, and reading one changes nothing a later run can see. The cost: ~57 MB of memory per worker uid in use on
the host (until reboot), and ~0.85 s to build each copy once per boot (load 6-7, 2026-12-05).
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from minirl.judge.host import cache_dir, remove_tree, sysroot_dir, unique_tmp
from minirl.judge.sandbox import ENV

SANDBOX_PATH = tuple(ENV["PATH"].split(":"))          # where the sandbox finds python3, sh and g++
# parts of the standard library no contest program imports, or that are not Python at all
STDLIB_LEFT_OUT = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
                   "dist-packages"}
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")   # what exec and libc's time functions read
# data libc and Python read: the locale sandbox.ENV's LANG names (C.UTF-8: without it setlocale("") and
# std::locale("") fail), and the time zones (zoneinfo, localtime_r with TZ)
DATA = ("/usr/lib/locale/C.utf8", "/usr/share/zoneinfo")
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")  # merged /usr: links sandbox.c mirrors
VERSION = "2"  # bump when what is copied changes in a way the key below does not see
# for problems that allow processes: the shell (os.system, shell=True) and the tools a shell line calls
TOOLS = ("sh", "cat", "echo", "sleep", "true", "false", "env", "ls", "head", "tail", "sort", "wc", "tr", "cut",
         "seq")


def _which(name: str) -> str | None:
    for d in SANDBOX_PATH:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return None


@functools.lru_cache(maxsize=None)
def _interpreter() -> tuple[str, Path]:
    """The python3 programs run (the first on the sandbox's PATH) and its standard library folder."""
    python = _which("python3")
    if python is None:
        raise FileNotFoundError(f"no python3 in {':'.join(SANDBOX_PATH)}")
    out = subprocess.run([python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return python, Path(out.strip())


def _libraries(files: list[str]) -> set[str]:
    """The shared libraries (and the loader) these ELF files load, as `ldd` resolves them."""
    out = subprocess.run(["ldd", *files], capture_output=True, text=True, timeout=120).stdout
    return set(re.findall(r"(/\S+)\s+\(0x", out))


def sources() -> tuple[str, Path, list[str]]:
    """(python3, its stdlib folder, the other files to copy): what `program_root` copies."""
    python, stdlib = _interpreter()
    gxx = _which("g++")                                       # the compiler the judge runs (sandbox.ENV's PATH)
    cxx = [subprocess.run([gxx, f"-print-file-name={n}"], capture_output=True, text=True, timeout=60).stdout
           .strip() for n in ("libstdc++.so.6", "libgcc_s.so.1")] if gxx else []
    tools = [t for t in map(_which, TOOLS) if t]
    elf = [python, *map(str, sorted((stdlib / "lib-dynload").glob("*.so"))), *(p for p in cxx if os.path.isabs(p)),
           *tools]
    libraries = _libraries(elf)
    if not any("/ld-linux" in p for p in libraries) or not any(p.endswith("/libc.so.6") for p in libraries):
        raise FileNotFoundError(f"ldd named no loader or libc for {python}")
    files = {os.path.normpath(p) for p in elf} | libraries | {p for p in ETC_FILES if os.path.exists(p)}
    return python, stdlib, sorted(files)


def _place(path: str, dest: Path) -> Path:
    """dest/path with the host's symlinks on the way mirrored (/lib -> usr/lib stays a link in the copy, as
    sandbox.c mirrors it): the real place the copy goes."""
    parts, cur = Path(path).parts[1:], "/"
    for i, name in enumerate(parts):
        nxt = os.path.join(cur, name)
        if os.path.islink(nxt) and i < len(parts) - 1:         # a folder reached through a link
            link = dest / nxt.lstrip("/")
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.readlink(nxt), link)
            target = os.path.normpath(os.path.join(cur, os.readlink(nxt)))
            return _place(os.path.join(target, *parts[i + 1:]), dest)
        cur = nxt
    return dest / path.lstrip("/")


def _copy_file(path: str, dest: Path) -> None:
    to = _place(path, dest)
    if not to.exists():
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(path), to)              # a copy of what the name points at: a new inode


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in STDLIB_LEFT_OUT or n.startswith("config-") or ".opt-" in n}


def build(dest: Path, python: str, stdlib: Path, files: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for link in TOP_LINKS:                                    # /bin -> usr/bin: /bin/sh is what system() runs
        if os.path.islink(link) and not os.path.lexists(dest / link.lstrip("/")):
            os.symlink(os.readlink(link), dest / link.lstrip("/"))
    for f in [python, *files]:
        _copy_file(f, dest)
    for d in DATA:
        if os.path.isdir(d):
            shutil.copytree(d, _place(d, dest), symlinks=True, dirs_exist_ok=True)
    # python3 finds its prefix from its own path: keep the name the sandbox runs it by (/usr/bin/python3)
    shutil.copytree(stdlib, _place(str(stdlib), dest), symlinks=False, ignore=_ignore,
                    ignore_dangling_symlinks=True, dirs_exist_ok=True)
    for d, dirs, names in os.walk(dest):                      # root's, read-only for everyone else
        os.chmod(d, 0o755)
        for n in names:
            p = os.path.join(d, n)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)


@functools.lru_cache(maxsize=None)
def _key() -> str:
    """What the copy depends on, cheaply (once per process): python3, its stdlib and extension folders, the
    loader's cache (ldconfig rewrites it whenever a library is installed), /etc/localtime, `DATA`, the tools,
    g++, and what this file copies (`VERSION` and the lists above)."""
    python, stdlib = _interpreter()
    gxx = _which("g++")
    paths = [os.path.realpath(python), str(stdlib), str(stdlib / "lib-dynload"), *ETC_FILES, *DATA,
             *(os.path.realpath(t) for t in map(_which, TOOLS) if t), *([os.path.realpath(gxx)] if gxx else [])]
    stamp = [(p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths if os.path.exists(p)]
    what = (VERSION, TOOLS, sorted(STDLIB_LEFT_OUT), ETC_FILES, DATA, TOP_LINKS)   # and what this file copies
    return hashlib.sha256(repr((stamp, what)).encode()).hexdigest()[:12]


def program_root(uid: int) -> Path:
    """This uid's copy of the program's system files, built if missing or stale. Where it cannot be built the
    sandbox does not start (RuntimeError, a judge error for the job): sharing the host's files would open the
    channels the copy closes, silently."""
    cache = sysroot_dir()
    try:
        root = cache / f"sysroot-{uid}-{_key()}"
        if (root / ".complete").exists():
            return root
        if cache != cache_dir():                              # copies of older versions, on disk
            for old in cache_dir().glob(f"sysroot-{uid}-*"):
                remove_tree(old)
        tmp = unique_tmp(root)
        try:
            build(tmp, *sources())
        except BaseException:
            remove_tree(tmp)                                  # no half-built copy left behind
            raise
        (tmp / ".complete").touch()
        os.replace(tmp, root)
        for old in cache.glob(f"sysroot-{uid}-*"):           # this uid's older copies, and builds a crash left
            if old != root:
                remove_tree(old)
        return root
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"cannot build the programs' own copy of the system files in {cache} ({e}): the judge "
                           "needs python3 and ldd on the host and ~57 MB of memory per worker there "
                           "(minirl/judge/sysroot.py)") from e

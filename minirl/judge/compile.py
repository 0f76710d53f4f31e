"""Compile C++ in the sandbox, against a forced-include precompiled <bits/stdc++.h>, with a capped cache.

    binary, message, seconds = compile_cpp(source, ("-std=c++17", "-O2"), sandbox, keep=job / "main")

Every source is compiled with `-include bits/stdc++.h` against a PCH built once per flag set and machine (g++ 12:
~1.3 s -> ~0.3 s for a typical contest source; a source that includes only what it needs gets the same speed-up
instead of ~0.6 s of parsing its own headers). The PCH's header is GCC's own without <future> and <filesystem>
(PCH_LEFT_OUT): a PCH saves parsing, not the instantiation of the header's pending templates, which g++ redoes in
every compile, and those two headers are half of that (0.22 -> 0.11 s for an empty program) while contest programs
do not use them. The copy sits first on the include path, so a source's own `#include <bits/stdc++.h>` gets it too.
(So the judge is a little more lenient than g++: a global named `future` beside `using namespace std;` compiles,
where g++ with the whole header calls the name ambiguous.) A forced include can clash with a source (it declares
`y1`, `index`, ...), and a source may use what was left out: a compile error under it is never final, the source is
compiled again the plain way (system headers, no PCH). Results are cached by hash of (flags, source): binaries, and
compile errors too, the CPU limit's included. A wall-clock timeout (which a loaded host may cause) or a sandbox
that would not start is no compile error: `CompileFault`, a judge error (JE), never cached. The
compiler reads no descriptor of its own: its stdin is /dev/null, its stdout and stderr files it cannot open, and it
has no /proc. The cache is root's
alone (0700), capped at MINIRL_JUDGE_CACHE_MB (default 2048) by evicting the least recently used. The compiler runs
in a one-shot sandbox, as programs do, but with its own limits (COMPILE_*): a correct program with a large constant
table must not get CE from the programs' 64 MiB output limit.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from minirl.judge.sandbox import Sandbox
from minirl.judge.host import STAGE_FILE_BYTES, cache_dir, job_folder, remove_tree, unique_tmp

MESSAGE_LIMIT = 2000               # characters of compiler/stderr text kept in a result
COMPILE_CPU_S = 30
COMPILE_WALL_S = COMPILE_CPU_S + 5  # a compiler blocked on something (not CPU) is stopped soon after
COMPILE_MEMORY_MB = 4096
COMPILE_FILE_BYTES = STAGE_FILE_BYTES  # 128 MiB: the binary, the assembler's temporary files (a 96 MiB
                                      # table fits); host.py sizes the staging tmpfs by it
SANDBOX_ERROR = 111                # sandbox.c could not set itself up: not the source's fault, not cached
PCH_LEFT_OUT = ("<future>", "<filesystem>")  # half of every compile's template instantiation, unused in contests
_cache_lock = threading.Lock()
_cache_bytes: int | None = None    # this process's running estimate of the cache's size


class CompileFault(RuntimeError):
    """The compiler's sandbox failed (SANDBOX_ERROR) or the compiler hit the wall-clock limit (a loaded host): no
    verdict on the source, so the job is a judge error (verdict.py: JE), never its CE."""


def tail(path: Path, limit: int = MESSAGE_LIMIT) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


# --- the precompiled header ----------------------------------------------------------------------------------

def pch_dir(flags: tuple[str, ...]) -> Path | None:
    """Folder holding bits/stdc++.h (GCC's, less PCH_LEFT_OUT) and its precompiled .gch for these flags (built
    once, under a lock)."""
    header = next(iter(sorted(Path("/usr/include").glob("*/c++/*/bits/stdc++.h"))), None)
    if header is None or shutil.which("g++") is None:
        return None
    key = hashlib.sha256(("\0".join(flags + PCH_LEFT_OUT) + str(header)).encode()).hexdigest()[:16]
    d = cache_dir() / "pch" / key
    gch = d / "bits" / "stdc++.h.gch"
    if gch.exists():
        return d
    (d / "bits").mkdir(parents=True, exist_ok=True)
    for p in (d.parent, d, d / "bits"):
        os.chmod(p, 0o755)  # readable by a "uid"-mode compiler; in namespaces it is bound in read-only
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not gch.exists():
            lines = header.read_text().splitlines(keepends=True)
            kept = [line for line in lines if not any(line.split() == ["#include", h] for h in PCH_LEFT_OUT)]
            (d / "bits" / "stdc++.h").write_text("".join(kept))
            tmp = unique_tmp(gch)
            r = subprocess.run(["g++", *flags, "-x", "c++-header", str(d / "bits" / "stdc++.h"), "-o", str(tmp)],
                               capture_output=True, timeout=300)
            if r.returncode != 0:
                return None
            os.chmod(tmp, 0o644)
            os.replace(tmp, gch)
    return d


# --- the cache ---------------------------------------------------------------------------------------------------

def _bin_dir() -> Path:
    d = cache_dir() / "bin"
    d.mkdir(mode=0o700, exist_ok=True)
    if d.stat().st_mode & 0o777 != 0o700:  # a cache from before this rule
        os.chmod(d, 0o700)
    return d


def cache_limit_bytes() -> int:
    return int(os.environ.get("MINIRL_JUDGE_CACHE_MB", "2048")) << 20


def _cache_add(path: Path) -> None:
    """Count a new entry; past the cap, evict the least recently used (mtime, refreshed on every hit) of those no
    job holds. A job's binary is a hard link to its entry (`compile_cpp`'s `keep`): it counts here, and evicting
    it would free nothing until the job ends (round 5: jobs' own copies held 726-1,090 MiB beside a 256 MiB cap)."""
    global _cache_bytes
    with _cache_lock:
        if _cache_bytes is None:
            _cache_bytes = sum(e.stat().st_size for e in os.scandir(_bin_dir()) if e.is_file())
        else:
            _cache_bytes += path.stat().st_size
        if _cache_bytes <= cache_limit_bytes():
            return
        entries = []
        for e in os.scandir(_bin_dir()):
            try:
                st = e.stat()
                entries.append((st.st_mtime, st.st_size, e.path, st.st_nlink > 1))
            except OSError:
                pass
        total = sum(entry[1] for entry in entries)
        for _, size, p, held in sorted(entries):
            if total <= 0.8 * cache_limit_bytes():
                break
            if p != str(path) and not held:            # never the entry its caller is about to use
                Path(p).unlink(missing_ok=True)
                total -= size
        _cache_bytes = total


def _cached(key: str) -> tuple[Path | None, str | None]:
    """(binary, None) or (None, compile error) from the cache, or (None, None)."""
    binary, error = _bin_dir() / key, _bin_dir() / f"{key}.ce"
    for path in (binary, error):
        try:
            os.utime(path)
        except OSError:
            continue
        return (binary, None) if path == binary else (None, error.read_text())
    return None, None


def _store(key: str, built: Path | None, message: str, keep: Path | None = None) -> Path | None:
    """Cache a binary (linked at `keep` too, before eviction can see it) or a compile error."""
    target = _bin_dir() / (key if built else f"{key}.ce")
    tmp = unique_tmp(target)
    if built:
        shutil.copy(built, tmp)
        os.chmod(tmp, 0o755)
        if keep is not None:
            os.link(tmp, keep)
    else:
        tmp.write_text(message)
    os.replace(tmp, target)
    _cache_add(target)
    return target if built else None


# --- compiling ---------------------------------------------------------------------------------------------------

def compile_cpp(source: str, flags: tuple[str, ...], sandbox: Sandbox,
                keep: Path | None = None) -> tuple[Path | None, str, float]:
    """Binary path (or None: a compile error), compiler message, seconds spent compiling (0 when cached);
    CompileFault where the compiler's sandbox failed or it hit the wall-clock limit (no verdict on the source).
    With `keep`, the binary is also linked there (a hard link to the cache's entry, never a copy) and that path
    returned: the caller's own, whatever the cache evicts later (a hit evicted before it could be linked is
    compiled again); the cache counts it and evicts it only once `keep` is gone."""
    key = hashlib.sha256(("\0".join(flags) + "\0" + source).encode()).hexdigest()
    binary, error = _cached(key)
    if error is not None:
        return None, error, 0.0
    if binary is not None and (keep is None or _link(binary, keep)):
        return keep or binary, "", 0.0
    pch = pch_dir(flags)
    work = job_folder("cc")
    try:
        (work / "main.cpp").write_text(source)
        sandbox.give(work)
        t0 = time.perf_counter()
        rc, message = _run_compiler(work, flags, pch, sandbox)
        if rc not in (0, "timeout", "cpu") and pch:   # a clash with the forced include is not the source's error
            rc, message = _run_compiler(work, flags, None, sandbox)
        seconds = time.perf_counter() - t0
        # a wall-clock stop may be a loaded host's doing, a sandbox that would not start the judge's: neither is
        # the source's CE (a negative reward for the judge's fault), nor cached: a judge error (CompileFault).
        # The CPU limit is the source's own doing (31 s of compiler CPU on every resubmission of a compile bomb
        # otherwise): cached, as any CE
        if rc in (SANDBOX_ERROR, "timeout"):
            raise CompileFault(f"the compiler did not finish (rc {rc}): {message[-300:]}")
        # the cache's copy (root's: the build is the compiling uid's), linked at `keep`: one file on disk
        stored = _store(key, work / "main" if rc == 0 else None, message, keep if rc == 0 else None)
        return (keep or stored) if rc == 0 else None, message, seconds
    finally:
        remove_tree(work)


def _link(src: Path, dest: Path) -> bool:
    """Hard-link (or copy, across filesystems) `src` to `dest`; False if `src` is gone."""
    try:
        os.link(src, dest)
    except FileNotFoundError:
        return False
    except OSError:
        shutil.copy(src, dest)
    return True


def _run_compiler(work: Path, flags: tuple[str, ...], pch: Path | None, sandbox: Sandbox) -> tuple[int | str, str]:
    """(0 | exit code | "timeout", message) of one g++ run that writes work/main: with `pch`, its folder first on
    the include path and its header forced in; without, the plain way."""
    mode = sandbox.mode
    include = ["-I", "/pch" if mode == "namespaces" else str(pch), "-include", "bits/stdc++.h"] if pch else []
    # gold links ~5x faster than bfd (0.01 vs 0.05 s): 10% of a compile with the PCH
    link = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
    # -pipe only where the compiler has no /proc: elsewhere `#include "/proc/self/fd/1"` opens cc1plus's pipe to
    # the assembler for reading, and blocks until the wall limit
    pipe = ["-pipe"] if mode == "namespaces" else []
    (work / "main").unlink(missing_ok=True)
    r = sandbox.run(["g++", *flags, *include, *link, *pipe, "main.cpp", "-o", "main"], work.parent, work.name,
                    time_limit_s=COMPILE_CPU_S, memory_mb=COMPILE_MEMORY_MB,
                    files={"/pch": pch} if pch and mode == "namespaces" else None, workdir=work,
                    output_limit=COMPILE_FILE_BYTES, scratch_mb=1024, forks=True, compiler=True,
                    wall_s=COMPILE_WALL_S)
    try:
        if r["cpu_s"] > COMPILE_CPU_S:
            return "cpu", f"compilation took more than {COMPILE_CPU_S} s of CPU"
        if r["timed_out"]:
            return "timeout", "compilation timed out"
        if r["returncode"] == 0 and (work / "main").exists():
            return 0, ""
        if r["oom"]:
            return 1, "the compiler ran out of memory"
        return r["returncode"] or 1, tail(r["err"])
    finally:
        r["out"].unlink(missing_ok=True)
        r["err"].unlink(missing_ok=True)

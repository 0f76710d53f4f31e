"""Round 4 (issue 31): what a sample could share with a sibling, hold outside its limits, or cost the judge, and
the allow-list seccomp filter that closes the class. As in test_judge_attacks.py, a program earns AC only if its
attack works, so `verdict != "AC"` is the property; judges run with and without cgroups. The honest matrix at
the end is the other half: everything the allow-list was derived from still gets AC."""
import time
import uuid
from pathlib import Path

import pytest

from attack_helpers import AB, judge, root_only, run, x86_64  # noqa: F401 (judge: a fixture)
from minirl.judge import require_isolation
from minirl.judge.host import STAGE

SYSTEM_FILE = "/usr/lib/x86_64-linux-gnu/libc.so.6"   # every sandbox reads the same inode
AB_PY = "a, b = map(int, input().split())\nprint(a + b)\n"


# --- finding 1: the page cache through /proc/self/pagemap and readahead advice -------------------------------

@root_only
@x86_64
def test_a_program_cannot_see_which_pages_of_a_system_file_are_cached(judge):
    """The receiving half of the channel: map a shared library with MADV_RANDOM (no readahead), fault page 0
    of a window and read /proc/self/pagemap for the neighbours fault-around mapped (only cached pages)."""
    src = rf"""
    #include <cstdio>
    #include <fcntl.h>
    #include <sys/mman.h>
    #include <unistd.h>
    int main() {{
        int fd = open("{SYSTEM_FILE}", O_RDONLY);
        char *p = (char *)mmap(0, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
        int got = 0;
        if (madvise(p, 1 << 16, MADV_RANDOM) == 0) got |= 1;
        volatile char c = p[0]; (void)c;
        int pm = open("/proc/self/pagemap", O_RDONLY);
        unsigned long long entry = 0;
        if (pm >= 0 && pread(pm, &entry, 8, ((unsigned long)p / 4096 + 1) * 8) == 8) got |= 2;
        printf("%s\n", got ? "3" : "none");
        fprintf(stderr, "%d\n", got);
    }}
    """
    res = run(judge, src, "cpp")
    assert res.verdict != "AC", res


# --- finding 2: file locks between concurrent siblings -------------------------------------------------------

LOCKER = f"""
import fcntl, os, struct, sys, time
fd = os.open({SYSTEM_FILE!r}, os.O_RDONLY)
role = sys.stdin.readline().strip()
START = 1 << 40                                    # far past the end of the file: no honest program locks there
def lock_at(offset):
    fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, START + offset, 1, 0))
def locked_at(offset):
    got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, START + offset, 1, 0))
    return struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK
try:
    if role == "send":
        lock_at(3)                                 # the answer: a lock at offset 3
        time.sleep(4)
        print("sent")
    else:
        t0 = time.time()
        while time.time() - t0 < 4:
            for k in range(8):
                if locked_at(k):
                    print(k); sys.exit(0)
            time.sleep(0.01)
        print("none")
except OSError as e:
    print("refused", e, file=sys.stderr); print("none")
"""


@root_only
def test_file_locks_carry_nothing_between_concurrent_siblings(judge):
    """A correct sample's F_RDLCK far past the end of a system file (allowed on an O_RDONLY descriptor) is a
    sibling's answer, read with F_GETLK while both are judged at once by run_many."""
    jobs = [dict(source=LOCKER, language="python", tests=[{"input": role + "\n", "output": out}], time_limit_s=6)
            for role, out in (("send", "sent"), ("receive", "3"))]
    sender, receiver = judge.run_many(jobs)
    assert receiver.verdict != "AC", (sender, receiver)


@root_only
@x86_64
def test_no_lock_or_lease_of_any_kind_is_taken(judge):
    src = rf"""
    #include <cstdio>
    #include <fcntl.h>
    #include <string>
    #include <sys/file.h>
    #include <unistd.h>
    int main() {{
        std::string got;
        int fd = open("{SYSTEM_FILE}", O_RDONLY);
        struct flock l = {{}};
        l.l_type = F_RDLCK; l.l_start = 1L << 40; l.l_len = 1;
        if (fcntl(fd, F_SETLK, &l) == 0) got += "posix ";
        l.l_start += 1;
        if (fcntl(fd, F_OFD_SETLK, &l) == 0) got += "ofd ";
        if (fcntl(fd, F_GETLK, &l) == 0) got += "getlk ";
        if (flock(fd, LOCK_SH | LOCK_NB) == 0) got += "flock ";
        int mine = open("/tmp/x", O_CREAT | O_RDWR, 0600);
        if (fcntl(mine, F_SETLEASE, F_RDLCK) == 0) got += "lease ";
        puts(got.empty() ? "denied" : got.c_str());
    }}
    """
    res = run(judge, src, "cpp", tests=[{"input": "", "output": "denied"}])
    assert res.verdict == "AC", res


# --- finding 3: memory in xattrs -------------------------------------------------------------------------------

@root_only
def test_xattrs_hold_no_memory_outside_the_limit(judge):
    """96 MiB in user.* xattrs of a file in the run's own /tmp at a 64 MiB limit (tmpfs charges them to its
    inode space: not to size=, not to RLIMIT_AS)."""
    src = """
    import os
    open('/tmp/x', 'w').close()
    value, held = b'x' * 65000, 0
    try:
        while held < 96 << 20:
            os.setxattr('/tmp/x', f'user.k{held}', value)
            held += len(value)
    except OSError:
        pass
    print(3 if held >= 96 << 20 else held)
    """
    res = run(judge, src, memory_limit_mb=64)
    assert res.verdict != "AC", res


# --- finding 4: the Python syntax check ------------------------------------------------------------------------

def test_the_python_syntax_check_costs_the_judging_process_no_cpu(judge):
    """CPython's compiler is quadratic in an f-string's fields: 60k of them are seconds of CPU, which compile()
    in the judging process spent holding the GIL (every judge thread stalled). The check now runs sandboxed."""
    src = 'x = f"' + "{1}" * 60000 + '"\nprint(3)\n'
    t0 = time.process_time()
    res = judge.run(src, "python", AB, time_limit_s=1.0)
    spent = time.process_time() - t0
    assert spent < 1.0, (spent, res)
    assert res.verdict == "TLE", res                # compiling alone is over the limit: every test would be


def test_a_python_syntax_error_is_still_a_compile_error(judge):
    res = judge.run("print(1\n", "python", AB)
    assert res.verdict == "CE" and "SyntaxError" in res.message, res


# --- finding 8: huge binaries and the staging tmpfs -----------------------------------------------------------

@root_only
@pytest.mark.parametrize("mb,limit_mb,verdict", [(40, 32, "MLE"), (130, 256, "CE")], ids=["over-the-limit",
                                                                                       "over-the-compilers"])
def test_a_huge_binary_is_refused_before_it_is_staged(judge, mb, limit_mb, verdict):
    """`static volatile char big[N] = {1};` is an N-byte binary from 3 lines: over the memory limit it is MLE
    without a copy in the staging tmpfs, over the compiler's 128 MiB file limit it is CE."""
    src = f"static volatile char big[{mb} << 20] = {{1}};\nint main() {{ return big[0] - 1; }}\n// {uuid.uuid4()}\n"
    res = judge.run(src, "cpp", AB, memory_limit_mb=limit_mb)
    staged = [p.stat().st_size for uid in judge.uids for p in (STAGE / f"u{uid}").glob("*") if p.is_file()]
    assert res.verdict == verdict, res
    assert all(size < limit_mb << 20 for size in staged), staged


@root_only
def test_the_staging_tmpfs_has_a_size(judge):
    """An explicit size (host.stage_bytes: a largest binary per worker uid that has staged, which only grows;
    checked in test_judge_faults.py), below tmpfs's default of half the host's memory."""
    import os
    judge.run(AB_PY, "python", AB)                   # a worker's sandbox staged its program
    line = next(line for line in Path("/proc/mounts").read_text().splitlines() if line.split()[1] == str(STAGE))
    size = next(o for o in line.split()[3].split(",") if o.startswith("size="))[5:]
    assert size.endswith("k") and int(size[:-1]) << 10 < os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2, line


# --- finding 10: a CPU-bound compile bomb is compiled once -----------------------------------------------------

def test_a_compile_that_hits_the_cpu_limit_is_cached(judge, monkeypatch):
    """Hitting the compiler's CPU limit is the source's doing, and deterministic: CE, cached (a wall-clock stop is
    not: test_judge_limits.py::test_a_compile_timeout_is_never_cached)."""
    import minirl.judge.compile as compile_module
    monkeypatch.setattr(compile_module, "COMPILE_CPU_S", 1)   # the real bomb cost 31 s of CPU per resubmission
    src = ("constexpr long f() { long s = 0; for (long i = 0; i < 200000; i++) for (long j = 0; j < 200000; j++) "
           "s += i ^ j; return s; }\nconstexpr long v = f();\nint main() { return v == 1; }\n"
           f"// {uuid.uuid4()}\n")
    first, second = judge.run(src, "cpp", AB), judge.run(src, "cpp", AB)
    assert first.verdict == "CE" and "CPU" in first.message and first.compile_s > 0, first
    assert second.verdict == "CE" and second.compile_s == 0.0, second


# --- finding 11: processes=True without cgroups ----------------------------------------------------------------

@root_only
def test_processes_without_cgroups_are_refused_under_strict_isolation(judge):
    """8 children each hold 40 MiB at a 64 MiB limit (each process has its own RLIMIT_AS without a cgroup)."""
    src = """
    import os
    kids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            block = bytearray(40 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os._exit(0 if sum(block[::4096]) == len(block) // 4096 else 1)
        kids.append(pid)
    print(3 if all(os.waitpid(k, 0)[1] == 0 for k in kids) else 'none')
    """
    require_isolation(judge, "strict")
    try:
        res = run(judge, src, memory_limit_mb=64, processes=True, time_limit_s=5)
    finally:
        judge.strict = False                         # the fixture's judge is shared by the module's other tests
    assert res.verdict != "AC", res
    if judge.cgroups is None:
        assert "needs cgroups" in res.message, res


# --- finding 12: core dumps to a core_pattern pipe --------------------------------------------------------------

@root_only
def test_a_crash_can_never_reach_a_core_pattern_pipe(judge):
    """A pipe in /proc/sys/kernel/core_pattern ignores RLIMIT_CORE except at exactly 1: the limit is 1, and the
    program cannot lower it to 0 (the host's core_pattern is not ours to change in a test)."""
    src = """
    import resource
    before = resource.getrlimit(resource.RLIMIT_CORE)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, before[1]))
    except (OSError, ValueError):
        pass
    after = resource.getrlimit(resource.RLIMIT_CORE)
    print('none' if before == after == (1, 1) else 3)
    """
    res = run(judge, src, tests=[{"input": "", "output": "none"}])   # the outcome itself, not only "not AC"
    assert res.verdict == "AC", res

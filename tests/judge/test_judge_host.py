"""What a program shares with the host, and limits that hold with and without cgroups: attacks written the way a
policy optimised against the judge would find them.

Each attack program gets AC only if its attack works (it prints the answer it could not have computed, or the
capability it should not have), so `verdict != "AC"` is the property; honest controls (threads, recursion, large
arrays, heavy output) must still get AC. Every judge here runs with and without cgroups.
"""
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from conftest import ROOT
from minirl.judge import Judge, judge_job
from minirl.judge.host import cache_dir, lease_uids

AB = [{"input": "1 2\n", "output": "3"}]
PYTHON = "/usr/bin/python3"   # an interpreter any uid may run (the venv's may sit in root's home)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's namespaces need root")
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers are x86_64's")


@pytest.fixture(scope="module", params=[True, False], ids=["cgroups", "no-cgroups"])
def judge(request):
    with Judge(workers=2, cgroups=request.param) as j:
        yield j


def run(judge, src, language="python", tests=AB, **kw):
    return judge.run(textwrap.dedent(src), language, tests, **kw)


def processes_of(uids) -> list[str]:
    """Pids of processes owned by `uids`, read straight from /proc (no time for stragglers to exit)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid in uids:
                found.append(pid)
        except FileNotFoundError:
            pass
    return found


# --- reward integrity: nothing of the host the program can write ------------------------------------------------

DIVISOR_CHECKER = dict(language="python", source=textwrap.dedent("""
    import sys
    n = int(open(sys.argv[1]).read())
    d = open(sys.argv[3]).read().split()
    sys.exit(0 if len(d) == 1 and d[0].isdigit() and 1 < int(d[0]) < n and n % int(d[0]) == 0 else 1)
    """))


@root_only
def test_a_program_cannot_rewrite_the_input_its_checker_reads(judge):
    """Print a nontrivial divisor of a large semiprime: the program replaces its instance by "4" through
    /proc/self/fd/0 (or its stdin's path) and answers 2."""
    src = """
    import os
    for path in ('/proc/self/fd/0', os.readlink('/proc/self/fd/0')):
        try:
            with open(path, 'w') as f:
                f.write('4\\n')
        except OSError:
            pass
    print(2)
    """
    tests = [{"input": f"{1000003 * 998244353}\n", "output": "1000003"}] * 2
    res = run(judge, src, tests=tests, checker=DIVISOR_CHECKER)
    assert res.verdict == "WA" and res.passed == 0, res


@root_only
def test_stdio_is_no_storage_outside_the_memory_limit(judge):
    """Park 48 MiB in the files behind stdin, stdout and stderr (write, then read back through a reopened
    descriptor), at a 64 MiB limit, and report what came back."""
    src = """
    import os, sys
    block, back = os.urandom(1 << 20), 0
    for fd in (0, 1, 2):
        try:
            w = os.open(f'/proc/self/fd/{fd}', os.O_RDWR)
            r = os.open(f'/proc/self/fd/{fd}', os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            for _ in range(16):
                os.write(w, block)
            os.lseek(r, 0, 0)
            while len(os.read(r, 1 << 20)) == 1 << 20:
                back += 1
        except OSError:
            pass
    print(3 if back >= 16 else back, file=sys.__stdout__)
    """
    res = run(judge, src, memory_limit_mb=64)
    assert res.verdict != "AC", res


@root_only
@x86_64
def test_page_cache_residency_cannot_be_probed(judge):
    """A sibling's answer would cross through which pages of a shared library are cached: every probe of
    residency (mincore, preadv2 with RWF_NOWAIT, cachestat) and every eviction (fadvise, madvise PAGEOUT) must
    fail. The program prints the answer only if one of them works."""
    src = r"""
    #include <bits/stdc++.h>
    #include <fcntl.h>
    #include <sys/mman.h>
    #include <sys/syscall.h>
    #include <sys/uio.h>
    #include <unistd.h>
    int main() {
        long a, b; std::cin >> a >> b;
        std::string got;
        int fd = open("/usr/bin/g++", O_RDONLY);
        if (fd < 0) fd = open("/proc/self/exe", O_RDONLY);
        void *m = mmap(nullptr, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
        unsigned char vec[16];
        if (m != MAP_FAILED && mincore(m, 1 << 16, vec) == 0) got += "mincore ";
        char buf[4096]; struct iovec io = {buf, sizeof buf};
        if (syscall(SYS_preadv2, fd, &io, 1, 0, 0, 8 /* RWF_NOWAIT */) >= 0) got += "preadv2 ";
        struct { unsigned long long off, len; } range = {0, 1 << 16};
        unsigned long long stats[8];
        if (syscall(451 /* cachestat */, fd, &range, stats, 0) == 0) got += "cachestat ";
        if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0) got += "fadvise ";
        if (m != MAP_FAILED && madvise(m, 1 << 16, 21 /* MADV_PAGEOUT */) == 0) got += "pageout ";
        if (syscall(SYS_readahead, fd, 0, 1 << 16) == 0) got += "readahead ";
        std::cerr << got << "\n";
        std::cout << (got.empty() ? 0 : a + b) << "\n";
    }
    """
    res = run(judge, src, "cpp")
    assert res.verdict == "WA", res


@root_only
@x86_64
def test_memfd_secret_is_denied(judge):
    """memfd_secret memory is outside RLIMIT_AS: hold 96 MiB of it at a 64 MiB limit (where the kernel has it)."""
    src = r"""
    #include <bits/stdc++.h>
    #include <sys/mman.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    int main() {
        long a, b; std::cin >> a >> b;
        size_t held = 0, size = 16 << 20;                  // pieces under RLIMIT_FSIZE
        for (int k = 0; k < 6; k++) {
            int fd = syscall(447 /* memfd_secret */, 0);
            if (fd < 0 || ftruncate(fd, size)) break;
            char *p = (char *)mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) break;
            for (size_t i = 0; i < size; i += 4096) p[i] = 1;
            munmap(p, size);                                // the memory stays with the descriptor
            held += size;
        }
        std::cerr << (held >> 20) << " MiB\n";
        std::cout << (held >= (96u << 20) ? a + b : 0) << "\n";
    }
    """
    res = run(judge, src, "cpp", memory_limit_mb=64)
    assert res.verdict != "AC", res


# --- one process per test: children cannot hide CPU time or memory ------------------------------------------

@root_only
def test_children_cannot_hide_cpu_time_with_sigchld_ignored(judge):
    """With SIGCHLD ignored the kernel reaps children itself, and their CPU time never reaches the init: two
    children burn 1.1 CPU-s each at a 2 s limit while the parent waits on a pipe."""
    src = r"""
    #include <bits/stdc++.h>
    #include <signal.h>
    #include <unistd.h>
    int main() {
        long a, b; std::cin >> a >> b;
        signal(SIGCHLD, SIG_IGN);
        int p[2];
        if (pipe(p)) return 1;
        for (int k = 0; k < 2; k++) {
            pid_t pid = fork();
            if (pid < 0) { std::cout << "no fork\n"; return 0; }
            if (pid == 0) {
                clock_t t = clock();
                while (clock() - t < CLOCKS_PER_SEC * 11 / 10) {}
                if (write(p[1], "x", 1) != 1) _exit(1);
                _exit(0);
            }
        }
        char c[2];
        for (int got = 0; got < 2;) { ssize_t n = read(p[0], c, 2 - got); if (n <= 0) return 1; got += n; }
        std::cout << a + b << "\n";
    }
    """
    res = run(judge, src, "cpp", time_limit_s=2.0)
    assert res.verdict != "AC", res


@root_only
def test_children_cannot_each_hold_a_whole_memory_limit(judge):
    """RLIMIT_AS is per process: 6 children hold 40 MiB each at a 64 MiB limit, and the parent counts them."""
    src = """
    import os, time
    r, w = os.pipe()
    try:
        for _ in range(6):
            if os.fork() == 0:
                held = bytearray(40 << 20)
                for i in range(0, len(held), 4096):
                    held[i] = 1
                os.write(w, b'x')
                time.sleep(2)
                os._exit(0)
        print(3 if len(b''.join(os.read(r, 1) for _ in range(6))) == 6 else 0, flush=True)
        os._exit(0)
    except OSError:
        print(0)
    """
    res = run(judge, src, memory_limit_mb=64, time_limit_s=3)
    assert res.verdict != "AC", res


@root_only
@x86_64
@pytest.mark.parametrize("how", ["fork", "vfork", "posix_spawn", "clone3", "clone"])
def test_new_processes_are_denied_by_default_and_allowed_per_problem(judge, how):
    src = r"""
    #include <bits/stdc++.h>
    #include <linux/sched.h>
    #include <sched.h>
    #include <signal.h>
    #include <spawn.h>
    #include <sys/syscall.h>
    #include <sys/wait.h>
    #include <unistd.h>
    extern char **environ;
    int main() {
        std::string how; std::cin >> how;
        long pid = -1;
        if (how == "fork") pid = fork();
        else if (how == "vfork") { pid = vfork(); if (pid == 0) _exit(0); }
        else if (how == "posix_spawn") {
            pid_t p; char *argv[] = {(char *)"true", nullptr};
            pid = posix_spawnp(&p, "true", nullptr, nullptr, argv, environ) == 0 ? p : -1;
        } else if (how == "clone3") {
            struct clone_args args = {}; args.exit_signal = SIGCHLD;
            pid = syscall(SYS_clone3, &args, sizeof args);
        } else pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid(pid, nullptr, 0);
        std::cout << (pid > 0 ? "forked" : "denied") << "\n";
    }
    """
    tests = [{"input": how, "output": "denied"}]
    assert run(judge, src, "cpp", tests=tests).verdict == "AC"
    allowed = "denied" if how == "clone3" else "forked"  # clone3 is always ENOSYS: libc falls back to clone
    assert run(judge, src, "cpp", tests=[{"input": how, "output": allowed}], processes=True).verdict == "AC"


# --- memory: the limit holds in every mode ------------------------------------------------------------------------

@root_only
def test_files_and_heap_together_stay_within_the_limit(judge):
    """At a 128 MiB limit: as much as /work and /tmp take, then as much heap as the address space gives; the
    program prints the answer if it held more than its limit in all."""
    src = """
    import os
    held, chunk = 0, b'x' * (1 << 20)
    for d in ('/tmp', '.'):
        try:
            fd = os.open(os.path.join(d, 'f'), os.O_CREAT | os.O_WRONLY)
            while True:
                os.write(fd, chunk)
                held += 1
        except OSError:
            pass
    heap = []
    try:
        while True:
            heap.append(bytearray(1 << 20))
            held += 1
    except MemoryError:
        heap = None
    print(3 if held > 128 else 'held %d MiB' % held)
    """
    res = run(judge, src, memory_limit_mb=128, time_limit_s=5)
    assert res.verdict != "AC", res


# --- the compiler -------------------------------------------------------------------------------------------

@root_only
@pytest.mark.parametrize("path", ["/proc/self/fd/0", "/proc/self/fd/1", "/proc/self/fd/2", "/dev/stdin",
                                  "/dev/fd/1"])
def test_the_compiler_cannot_include_its_own_descriptors(judge, path):
    """`#include` of the compiler's stdio (or, with -pipe, cc1plus's pipe to the assembler) blocked the compile
    until its wall limit: now it is a quick CE, never a timeout."""
    src = f'#include "{path}"\nint main() {{ return 0; }}\n// {uuid.uuid4().hex}\n'
    res = judge.run(src, "cpp", AB)
    assert res.verdict == "CE" and "timed out" not in res.message, res


@root_only
def test_the_compiler_in_uid_mode_cannot_include_its_own_descriptors():
    lease = lease_uids(1)
    try:
        for fd in (1, 2):
            src = f'#include "/proc/self/fd/{fd}"\nint main() {{ return 0; }}\n// {uuid.uuid4().hex}\n'
            res = judge_job(src, "cpp", AB, mode="uid", uid=lease.uids[0])
            assert res.verdict == "CE" and "timed out" not in res.message, res
    finally:
        lease.release()


def test_a_compile_timeout_is_never_cached(judge, monkeypatch):
    """A compile stopped at its wall limit (a loaded host) is CE this time, and compiled again next time."""
    import minirl.judge.compile as compile_module
    src = '#include <cstdio>\nint main(){long a,b; if(scanf("%ld %ld",&a,&b)!=2) return 1; printf("%ld\\n",a+b);}\n' \
          f"// {uuid.uuid4().hex}\n"
    monkeypatch.setattr(compile_module, "COMPILE_WALL_S", 0.01)
    first = judge.run(src, "cpp", AB)
    monkeypatch.undo()
    second = judge.run(src, "cpp", AB)
    assert (first.verdict, "timed out" in first.message) == ("CE", True)
    assert second.verdict == "AC" and second.compile_s > 0, second


# --- availability ---------------------------------------------------------------------------------------------

@root_only
def test_run_returns_only_after_every_process_of_a_wall_tle_is_gone(judge):
    """A program of a problem that allows processes starts 40 that spin in sessions of their own, and sleeps:
    a wall-clock TLE. When `run` returns, none of them is alive (the next run on the uid may start)."""
    src = """
    import os, time
    for _ in range(40):
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
    time.sleep(60)
    """
    res = run(judge, src, time_limit_s=0.3, processes=True)
    left = processes_of(judge.uids)
    assert res.verdict == "TLE" and left == [], left


@root_only
def test_the_judging_process_cannot_be_signalled_or_reniced(judge):
    """Find the judge (the uid's other processes, the parent of the sandbox) and kill, renice or limit it: kill,
    tgkill, rt_sigqueueinfo, pidfd_send_signal, setpriority (PRIO_USER), prlimit and SIGIO ownership."""
    src = f"""
    import ctypes, fcntl, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    judge, got = {os.getpid()}, []
    for pid in (judge, 1, os.getppid(), -1):
        try:
            os.kill(pid, 0)
            got.append(f'kill {{pid}}')
        except OSError:
            pass
        if libc.syscall(234, pid, pid, 0) == 0:                      # tgkill
            got.append(f'tgkill {{pid}}')
        if libc.syscall(302, pid, 7, None, ctypes.create_string_buffer(16)) == 0 and pid not in (0, os.getpid()):
            got.append(f'prlimit {{pid}}')                          # prlimit64 (read)
    if libc.setpriority(2, 0, 19) == 0:                             # PRIO_USER: every process of the uid
        got.append('setpriority user')
    try:
        r, w = os.pipe()
        fcntl.fcntl(r, fcntl.F_SETOWN, judge)
        got.append('F_SETOWN')
    except OSError:
        pass
    print(got, file=__import__('sys').stderr)
    print(3 if got else 'none')
    """
    res = run(judge, src)
    assert res.verdict == "WA", res.message


@root_only
@pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason="needs /usr/bin/python3")
def test_rlimits_mode_a_program_cannot_kill_the_judge():
    """Without root ("rlimits" mode) programs run as the judge's own uid: one kills every process it may
    (kill(-1), each pid it sees) and the judge must survive to give its verdict."""
    lease = lease_uids(1)
    uid = lease.uids[0]
    tmp_path = Path(tempfile.mkdtemp(prefix="minirl-rlimits-"))   # pytest's is root's alone
    os.chown(tmp_path, uid, uid)
    (tmp_path / "attack.py").write_text(
        "import os, signal\n"
        "for pid in [-1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "print(3)\n")
    (tmp_path / "judge.py").write_text(
        "from pathlib import Path\nfrom minirl.judge import judge_job\n"
        f"r = judge_job(Path('attack.py').read_text(), 'python', [{{'input': '', 'output': '3'}}], uid={uid})\n"
        "print('verdict', r.verdict, r.message[-300:])\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           "MINIRL_JUDGE_LEASES": str(tmp_path / "leases")}
    try:
        proc = subprocess.run([PYTHON, "judge.py"], capture_output=True, text=True, timeout=120, env=env,
                              cwd=tmp_path, user=uid, group=uid, extra_groups=[])
    finally:
        lease.release()
        subprocess.run(["rm", "-rf", str(tmp_path)])
    assert proc.returncode == 0 and "verdict" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])


@root_only
def test_the_program_sees_no_host_path_pid_or_cgroup(judge):
    """/proc/self/mountinfo, cgroup, maps, the links of its descriptors and what its init (PID 1) shows anyone
    must name nothing of the host: not the judge's folders, its pid, or its cgroups."""
    cache = str(cache_dir())
    src = f"""
    import os, re, sys
    seen = []
    text = ''
    for name in ('self/mountinfo', 'self/cgroup', 'self/maps', 'self/mounts', '1/cmdline', '1/mountinfo',
                 '1/cgroup', '1/environ', 'self/environ'):
        try:
            text += open('/proc/' + name, errors='replace').read()
        except OSError:
            pass
    for fd in os.listdir('/proc/self/fd'):
        try:
            text += os.readlink('/proc/self/fd/' + fd) + '\\n'
        except OSError:
            pass
    for needle in ({cache!r}, 'minirl', 'sandbox-', 'run-', '/var/lib', '/work/wt'):
        if needle in text:
            seen.append(needle)
    if re.search(r'(?<![0-9]){os.getpid()}(?![0-9])', open('/proc/self/cgroup').read() + ''.join(
            line.split()[3] + line.split()[4] for line in open('/proc/self/mountinfo'))):
        seen.append('pid')
    print(seen, file=sys.stderr)
    print(3 if seen else 'none')
    """
    res = run(judge, src)
    assert res.verdict == "WA", res.message


# --- uid mode (root, no namespaces) ---------------------------------------------------------------------------

@root_only
def test_uid_mode_no_state_in_shared_folders_and_no_sibling_output():
    """Outside namespaces /dev/shm and /tmp are the host's: one run leaves the answer there, the next reads it; a
    run also looks for any other run's output files in the judge's folders."""
    tag = f"minirl-{uuid.uuid4().hex[:8]}"
    store = f"""
    for d in ('/dev/shm', '/tmp', '/var/tmp'):
        try:
            open(d + '/{tag}', 'w').write('3')
        except OSError:
            pass
    print(3)
    """
    load = f"""
    import glob, sys
    for p in glob.glob('/dev/shm/{tag}') + glob.glob('/tmp/{tag}') + glob.glob('/var/tmp/{tag}') + \\
             glob.glob({str(cache_dir())!r} + '/run-*/t*.out'):
        try:
            print(open(p).read()); sys.exit(0)
        except OSError:
            pass
    print('none')
    """
    try:
        with Judge(workers=2, cgroups=False) as j:
            j.isolation = "uid"
            assert run(j, store).verdict == "AC"
            assert run(j, load).verdict == "WA"
    finally:
        for d in ("/dev/shm", "/tmp", "/var/tmp"):
            Path(d, tag).unlink(missing_ok=True)


# --- honest programs still pass --------------------------------------------------------------------------------

HONEST_CPP = r"""
#include <bits/stdc++.h>
int depth(int n) { volatile char pad[256]; pad[0] = 1; return n == 0 ? 0 : depth(n - 1) + pad[0]; }
int main() {
    long long a, b; std::cin >> a >> b;
    std::vector<std::future<long long>> parts;
    for (int k = 0; k < 4; k++) parts.push_back(std::async(std::launch::async, [k] { return (long long)k; }));
    std::vector<std::thread> pool;
    std::atomic<long long> sum{0};
    for (int k = 0; k < 8; k++) pool.emplace_back([&sum, k] { sum += k; });
    for (auto &t : pool) t.join();
    long long s = 0;
    for (auto &f : parts) s += f.get();
    std::vector<int> big(50 << 20 >> 2, 1);                                    // 50 MiB
    long long d = depth(100000);                                                 // ~25 MB of stack
    std::string line(99, 'x');
    for (int i = 0; i < 100000; i++) std::cout << line << "\n";                 // 10 MB of output
    std::cout << a + b + s - 6 + sum - 28 + big[12345] - 1 + d - 100000 << "\n";
}
"""

HONEST_PY = """
import sys, threading
from concurrent.futures import ThreadPoolExecutor
sys.setrecursionlimit(100000)
def depth(n):
    return 0 if n == 0 else depth(n - 1) + 1
a, b = map(int, input().split())
with ThreadPoolExecutor(4) as ex:
    s = sum(ex.map(lambda k: k, range(4)))
t = threading.Thread(target=lambda: None); t.start(); t.join()
big = bytearray(50 << 20)
out = sys.stdout
for _ in range(100000):
    out.write('x' * 99 + '\\n')
print(a + b + s - 6 + big[7] + depth(20000) - 20000)
"""


@pytest.mark.parametrize("language,src", [("cpp", HONEST_CPP), ("python", HONEST_PY)])
def test_honest_programs_with_threads_recursion_arrays_and_output_still_pass(judge, language, src):
    expected = "\n".join(["x" * 99] * 100000 + ["3"])
    res = judge.run(src, language, [{"input": "1 2\n", "output": expected}], time_limit_s=5, memory_limit_mb=256)
    assert res.verdict == "AC", res.message


def test_weak_isolation_is_refused_unless_the_config_says_so():
    from minirl.judge import require_isolation

    class Fake:
        closed = False

        def __init__(self, isolation):
            self.isolation = isolation

        def close(self):
            self.closed = True
    for mode in ("uid", "rlimits"):
        with pytest.raises(RuntimeError, match="judge_isolation: weak"):
            require_isolation(judge := Fake(mode), "strict")
        assert judge.closed
        assert require_isolation(Fake(mode), "weak").isolation == mode
    assert require_isolation(Fake("namespaces"), "strict").isolation == "namespaces"
    with pytest.raises(ValueError, match="judge_isolation"):
        require_isolation(Fake("namespaces"), "loose")

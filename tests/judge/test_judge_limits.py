"""Limits that hold with and without cgroups: one process per test, memory within the limit, a compiler that
cannot be blocked, nothing left when `run` returns; honest programs (threads, recursion, large arrays, heavy
output) still AC. Attack programs get AC only if their attack works, so `verdict != "AC"` is the property.
"""
import uuid

import pytest

from attack_helpers import AB, judge, processes_of, root_only, run, x86_64  # noqa: F401 (judge: a fixture)
from minirl.judge import Judge, judge_job
from minirl.judge.host import lease_uids


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
    """At a 128 MiB limit: up to 80 MiB in files of /tmp and /work, then up to 80 MiB of heap; the program
    prints the answer if it held more than its limit in all (a cgroup with slack, or a tmpfs sized to the whole
    limit beside an address space of the whole limit, let 160 MiB through)."""
    src = """
    import os
    held, chunk = 0, b'x' * (1 << 20)
    for d in ('/tmp', '.'):
        try:
            fd = os.open(os.path.join(d, 'f'), os.O_CREAT | os.O_WRONLY)
            while held < 80:
                os.write(fd, chunk)
                held += 1
        except OSError:
            pass
    heap = []
    try:
        while len(heap) < 80:
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
    """A compile stopped at its wall limit (a loaded host) is a judge error this time (JE: not the program's
    fault, so no reward), and compiled again next time."""
    import minirl.judge.compile as compile_module
    src = '#include <cstdio>\nint main(){long a,b; if(scanf("%ld %ld",&a,&b)!=2) return 1; printf("%ld\\n",a+b);}\n' \
          f"// {uuid.uuid4().hex}\n"
    monkeypatch.setattr(compile_module, "COMPILE_WALL_S", 0.01)
    first = judge.run(src, "cpp", AB)
    monkeypatch.undo()
    second = judge.run(src, "cpp", AB)
    assert first.verdict == "JE" and ("timed out" in first.message or "wall-clock" in first.message), first
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


@root_only
def test_a_staging_folder_removed_under_a_sandbox_costs_one_run():
    """The staging tmpfs is host-wide: if a worker's folder there is removed (by hand, another judge's sweep),
    its sandbox can never see a new program; that run is an error verdict and the next one gets a new sandbox."""
    import shutil
    with Judge(workers=1) as j:
        ok = "print(sum(map(int, input().split())))"
        assert j.run(ok, "python", AB).verdict == "AC"
        shutil.rmtree(j._boxes[j.uids[0]]._files)
        assert [j.run(ok, "python", AB).verdict for _ in range(2)] == ["JE", "AC"]  # a judge error, then a new sandbox

"""The seccomp allow-list (sandbox.c, `install_seccomp`; issue 31): the honest matrix it was derived from still
gets AC, and calls it does not list are refused. Judges run with and without cgroups."""
import pytest

from attack_helpers import AB, judge, root_only, run, x86_64  # noqa: F401 (judge: a fixture)

HONEST_CPP = r"""
#include <bits/stdc++.h>
#include <future>
using namespace std;
static int big[25000000];                                   // 100 MB of static array
int rec(int d) { volatile int pad[4]; pad[0] = d; return d ? rec(d - 1) + (pad[0] & 1) : 0; }
int main() {
    ios::sync_with_stdio(false); cin.tie(nullptr);
    long a, b; cin >> a >> b;
    for (int i = 0; i < 25000000; i += 1024) big[i] = i;
    vector<thread> ts; atomic<long> s{0};
    for (int t = 0; t < 4; t++) ts.emplace_back([&, t] { s += t; this_thread::sleep_for(chrono::milliseconds(1)); });
    for (auto &t : ts) t.join();
    auto f = async(launch::async, [] { return 42; });
    mutex m; condition_variable cv; bool ready = false;
    thread th([&] { lock_guard<mutex> g(m); ready = true; cv.notify_one(); });
    { unique_lock<mutex> g(m); cv.wait(g, [&] { return ready; }); }
    th.join();
    long depth = rec(500000);                               // deep recursion: the main stack is unlimited
    vector<long> v(1 << 21); iota(v.begin(), v.end(), 0); sort(v.rbegin(), v.rend());
    mt19937 rng(random_device{}());
    string out; for (int i = 0; i < 300000; i++) { out += to_string(i); out += ' '; }   // heavy output
    cout << out << '\n' << a + b + s - 6 + f.get() - 42 + depth % 2 + big[1024] - 1024 + v[0] - (1 << 21) + 1 << '\n';
}
"""
HONEST_PY = """
import sys, itertools, collections, heapq, bisect, math, functools, re, threading, decimal, fractions, array
import string, random, operator, typing, copy, statistics, time, io, os, resource
sys.setrecursionlimit(1 << 20)
resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
threading.stack_size(1 << 26)
def rec(n): return 0 if n == 0 else rec(n - 1) + 1
got = []
t = threading.Thread(target=lambda: got.append(rec(50000))); t.start(); t.join()
a, b = map(int, sys.stdin.readline().split())
h = []
for x in range(1000): heapq.heappush(h, -x)
x = bisect.bisect(list(range(100)), 50) + math.gcd(12, 18) + functools.reduce(operator.add, range(10))
d = decimal.Decimal(1) / decimal.Decimal(3); f = fractions.Fraction(1, 3); arr = array.array('i', range(1000))
assert re.findall(r'\\d+', 'a1b22') == ['1', '22'] and collections.Counter('hello')['l'] == 2
assert len(list(itertools.permutations(range(6)))) == 720 and statistics.mean([1, 2, 3]) == 2
random.seed(1); time.time(); time.perf_counter(); time.sleep(0.01); os.cpu_count()
big = [0] * (10 ** 7)
sys.stdout.write(' '.join(map(str, range(300000))) + '\\n')
print(a + b + got[0] - 50000 + (x - 102) + (f * 3 == 1) - 1 + (str(d)[:4] == '0.33') - 1)
"""
HEAVY_OUT = " ".join(map(str, range(300000)))
CHECKER = {"language": "python", "source": (
    "import sys\nexp = open(sys.argv[2]).read().split()\ngot = open(sys.argv[3]).read().split()\n"
    "sys.exit(0 if exp == got else 1)\n")}
SUBPROCESS = """
import subprocess, sys
a, b = map(int, input().split())
print(subprocess.run([sys.executable, '-c', f'print({a} + {b})'], capture_output=True, text=True).stdout.strip())
"""


@root_only
@pytest.mark.parametrize("language,source,output", [("cpp", HONEST_CPP, HEAVY_OUT + "\n3"),
                                                    ("python", HONEST_PY, HEAVY_OUT + "\n3")], ids=["cpp", "python"])
def test_the_honest_matrix_gets_ac_under_the_allow_list(judge, language, source, output):
    """Threads, std::async, condition variables, deep recursion, big arrays, heavy output; Python's contest
    modules, threads with a big stack, RLIMIT_STACK raised, recursion; the compiler ran first, under it too."""
    res = run(judge, source, language, tests=[{"input": "1 2\n", "output": output}] * 2, memory_limit_mb=512,
              time_limit_s=10)
    assert res.verdict == "AC", res


@root_only
def test_a_checker_and_a_program_that_needs_processes_get_ac_under_the_allow_list(judge):
    assert run(judge, "print(sum(map(int, input().split())))", checker=CHECKER).verdict == "AC"
    res = run(judge, SUBPROCESS, processes=True, time_limit_s=5)
    assert res.verdict == "AC", res


@root_only
@x86_64
def test_calls_the_allow_list_leaves_out_are_refused(judge):
    """One of each kind: locks, xattrs, inotify on shared inodes, AIO, futex2 and shared futex wakes, readahead
    advice, KSM, a program's own fault counters, core limits, unlisted ioctl and prctl commands, utimes of a
    shared device, splice, sync (every dirty page of the host)."""
    src = r"""
    #include <cerrno>
    #include <cstdio>
    #include <fcntl.h>
    #include <linux/futex.h>
    #include <linux/fs.h>
    #include <string>
    #include <sys/file.h>
    #include <sys/inotify.h>
    #include <sys/ioctl.h>
    #include <sys/mman.h>
    #include <sys/prctl.h>
    #include <sys/resource.h>
    #include <sys/stat.h>
    #include <sys/syscall.h>
    #include <sys/xattr.h>
    #include <unistd.h>
    int main() {
        std::string got;
        int lib = open("/usr/lib/x86_64-linux-gnu/libc.so.6", O_RDONLY);
        int mine = open("/tmp/f", O_CREAT | O_RDWR, 0600);
        if (flock(lib, LOCK_SH | LOCK_NB) == 0) got += "flock ";
        if (fsetxattr(mine, "user.k", "v", 1, 0) == 0) got += "setxattr ";
        if (inotify_init1(0) >= 0) got += "inotify ";
        unsigned long ctx = 0;
        if (syscall(SYS_io_setup, 8, &ctx) == 0) got += "io_setup ";
        if (syscall(449, 0, 0, 0, 0, 0) != -1 || errno != ENOSYS) got += "futex_waitv ";
        char *p = (char *)mmap(0, 4096, PROT_READ, MAP_SHARED, lib, 0);
        if (syscall(SYS_futex, p, FUTEX_WAKE, 1, 0, 0, 0) >= 0) got += "shared-futex-wake ";
        if (madvise(p, 4096, MADV_RANDOM) == 0) got += "MADV_RANDOM ";
        if (madvise(p, 4096, MADV_WILLNEED) == 0) got += "MADV_WILLNEED ";
        void *anon = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (madvise(anon, 4096, MADV_MERGEABLE) == 0) got += "MADV_MERGEABLE ";
        struct rlimit core = {0, 0};
        if (setrlimit(RLIMIT_CORE, &core) == 0) got += "RLIMIT_CORE ";
        int flags;
        if (ioctl(mine, FS_IOC_GETFLAGS, &flags) == 0) got += "FS_IOC_GETFLAGS ";
        if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0) got += "PR_SET_DUMPABLE ";
        if (utimensat(AT_FDCWD, "/dev/null", NULL, 0) == 0) got += "utimensat ";
        int fds[2];
        if (pipe(fds) == 0 && splice(mine, NULL, fds[1], NULL, 1, 0) >= 0) got += "splice ";
        if (syscall(SYS_sync) == 0) got += "sync ";
        puts(got.empty() ? "denied" : got.c_str());
    }
    """
    res = run(judge, src, "cpp", tests=[{"input": "", "output": "denied"}])
    assert res.verdict == "AC", res

"""Attacks on the judge, written the way a policy optimised against it would find them (issue 10).

Each program here earns AC only if its attack works (it prints the right answer it could not have computed, or
reports a capability it should not have), so `verdict != "AC"` is the property. The judges run with and without
cgroups (`cgroups=False` is what a host without writable cgroups gets), so both paths stay tested.
"""
import json
import os
import uuid
from pathlib import Path

import pytest

from attack_helpers import AB, judge, root_only, run, x86_64  # noqa: F401 (judge: a fixture)
from conftest import ROOT, SHARED
from minirl.judge import Judge, outputs_match
from minirl.judge.host import cache_dir



# --- reward integrity: a non-solution must not get AC -----------------------------------------------------------

@root_only
def test_stored_answers_are_not_readable(judge):
    """Search every data file we know of for our own stdin and print the stored output."""
    row = json.loads(next((SHARED / "code" / "icpc_kattis_problems.jsonl").open())) \
        if (SHARED / "code").is_dir() else {"tests": [{"input": "1 2\n", "output": "3"}]}
    test = row["tests"][0]
    src = f"""
    import glob, json, os, sys
    stdin = sys.stdin.read()
    paths = glob.glob({str(SHARED)!r} + '/**/*.jsonl', recursive=True) + glob.glob({str(ROOT)!r} + '/data/**/*.jsonl',
                                                                                   recursive=True)
    for p in paths:
        for line in open(p):
            if json.dumps(stdin)[1:-1] in line:
                for t in json.loads(line).get('tests', []):
                    if t['input'] == stdin:
                        print(t['output']); sys.exit(0)
    print('none', len(paths), file=sys.stderr)
    """
    assert run(judge, src, tests=[test], time_limit_s=10).verdict != "AC"


@root_only
def test_the_program_sees_a_minimal_root(judge):
    src = f"""
    import os, sys
    top = set(os.listdir('/'))
    seen = [p for p in ({str(ROOT)!r}, {str(SHARED)!r}, {str(cache_dir())!r}, '/root', '/home', '/run', '/var',
                        '/dev/shm', '/etc/passwd', '/etc/shadow') if os.path.exists(p)]
    extra = top - {{'usr', 'bin', 'lib', 'lib64', 'lib32', 'libx32', 'sbin', 'etc', 'dev', 'proc', 'tmp', 'work',
                    '.run', '.scratch'}}
    hidden = []  # the sandbox's own folders (its files before they are bound into /work; the tmpfs of /work, /tmp)
    for d in ('/.run', '/.scratch'):
        try:
            hidden.append(os.listdir(d))
        except PermissionError:
            pass
    print(seen, sorted(extra), hidden, os.listdir('.'), file=sys.stderr)
    print(3 if seen or extra or hidden or os.listdir('.') != ['main.py'] else 'minimal')
    """
    res = run(judge, src)
    assert res.verdict == "WA", res.message  # WA: it printed 'minimal'


@root_only
def test_cached_binaries_and_other_run_folders_are_out_of_reach(judge):
    """Run another sample's binary (an earlier AC) from the cache, or read a sibling run's files."""
    ab_cpp = '#include <cstdio>\nint main(){long a,b; scanf("%ld %ld",&a,&b); printf("%ld\\n",a+b);}\n'
    assert run(judge, ab_cpp, "cpp").verdict == "AC"
    src = f"""
    import glob, os, subprocess, sys
    stdin = sys.stdin.read()
    mine = os.path.dirname(os.readlink('/proc/self/fd/0'))       # a run folder, if stdin were a file in one
    found = glob.glob({str(cache_dir())!r} + '/**', recursive=True)
    if mine.startswith({str(cache_dir())!r}):
        found += glob.glob(os.path.dirname(mine) + '/**', recursive=True)
    for p in sorted(found, key=lambda p: -os.path.getmtime(p) if os.path.exists(p) else 0)[:50]:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            try:
                out = subprocess.run([p], input=stdin, capture_output=True, text=True, timeout=1).stdout
            except Exception:
                continue
            if out.strip() == '3':
                print(out); sys.exit(0)
    print('none', len(found), file=sys.stderr)
    """
    assert run(judge, src, time_limit_s=5).verdict != "AC"


@root_only
def test_cpu_time_of_unreaped_children_is_counted(judge):
    """Two children burn 0.75 CPU-s each at a 1 s limit; the parent prints the answer and never waits."""
    src = """
    import os, time
    r, w = os.pipe()
    for _ in range(2):
        if os.fork() == 0:
            t0 = time.process_time()
            while time.process_time() - t0 < 0.75:
                pass
            os.write(w, b'x')
            os._exit(0)
    for _ in range(2):
        os.read(r, 1)
    print(3, flush=True)
    os._exit(0)
    """
    res = run(judge, src, time_limit_s=1.0, processes=True)   # a problem that allows processes
    assert res.verdict == "TLE", (res.verdict, res.tests)


@root_only
def test_memory_outside_the_address_space_counts(judge):
    """Hold 200 MB at a 64 MB limit in memfds, shared memory and tmpfs files (each under the output limit)."""
    src = """
    import os
    held, chunk = 0, b'x' * (1 << 20)
    def fill(fd):
        global held
        for _ in range(60):
            os.write(fd, chunk)
            held += 1
    for i in range(4):
        for make in (lambda: os.memfd_create('m'), lambda: os.open(f'/dev/shm/f{i}', os.O_CREAT | os.O_WRONLY),
                     lambda: os.open(f'/tmp/f{i}', os.O_CREAT | os.O_WRONLY), lambda: os.open(f'f{i}', os.O_CREAT | os.O_WRONLY)):
            try:
                fill(make())
            except OSError:
                pass
    print(3 if held >= 200 else 'held %d MB' % held)
    """
    res = run(judge, src, memory_limit_mb=64, time_limit_s=5)
    assert res.verdict != "AC" and res.verdict in ("WA", "MLE", "RE"), (res.verdict, res.message)


@root_only
@x86_64
def test_no_state_survives_between_runs():
    """One run stores the answer in the uid's keyring and in /run/lock; the next one (same worker) reads it."""
    tag = f"minirl-{uuid.uuid4().hex[:8]}"
    store = f"""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(248, b'user', b'{tag}', b'3', 1, -4)        # add_key to the user keyring
    for d in ('/run/lock', '/dev/shm', '/tmp', '/var/tmp', '..'):
        try:
            open(os.path.join(d, '{tag}'), 'w').write('3')
        except OSError:
            pass
    print(3)
    """
    load = f"""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(250, 10, -4, b'user', b'{tag}', 0)     # keyctl(KEYCTL_SEARCH, user keyring)
    buf = ctypes.create_string_buffer(16)
    if key > 0 and libc.syscall(250, 11, key, buf, 16) > 0:  # keyctl(KEYCTL_READ)
        print(buf.value.decode()); sys.exit(0)
    for d in ('/run/lock', '/dev/shm', '/tmp', '/var/tmp', '..'):
        try:
            print(open(os.path.join(d, '{tag}')).read()); sys.exit(0)
        except OSError:
            pass
    print('none')
    """
    try:
        with Judge(workers=1) as j:
            assert run(j, store).verdict == "AC"
            assert run(j, load).verdict == "WA"
    finally:
        Path("/run/lock", tag).unlink(missing_ok=True)


@root_only
def test_no_state_survives_between_tests_of_one_program(judge):
    """A worker runs a program's tests one after another in one sandbox: files the program left in /work or
    /tmp, processes it left running, PIDs it used up and CPU time its init counted are gone before its next
    test. The first test leaves all of these; the next ones get AC only by finding one."""
    src = """
    import os, sys, time
    n = int(input())
    if n == 0:
        for d in ('.', '/tmp'):
            open(os.path.join(d, 'answer'), 'w').write('0')
        for _ in range(50):                        # 50 PIDs used, and CPU time for init's counters
            if os.fork() == 0:
                t = time.process_time()
                while time.process_time() - t < 0.002:
                    pass
                os._exit(0)
            os.wait()
        if os.fork() == 0:                         # a process that outlives the test, if it can
            os.setsid()
            time.sleep(30)
            os._exit(0)
        print(n)
    else:
        found = [open(os.path.join(d, 'answer')).read() for d in ('.', '/tmp') if os.path.exists(os.path.join(d, 'answer'))]
        proc = os.path.exists('/proc/1')               # programs have no /proc since round 4: nothing to see there
        others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())] if proc else []
        stat = open('/proc/1/stat').read() if proc else ') ' + '0 ' * 20
        init_cpu = sum(map(int, stat.rsplit(')', 1)[1].split()[11:15]))  # utime..cstime
        leaks = found or others or os.getpid() > 10 or init_cpu > 0
        print(found, others, os.getpid(), init_cpu, file=sys.stderr)
        print(n if leaks else 'none')
    """
    tests = [{"input": f"{i}\n", "output": str(i)} for i in range(4)]
    with Judge(workers=1, cgroups=judge.cgroups is not None) as j:
        res = run(j, src, tests=tests, time_limit_s=5, processes=True)
    assert (res.verdict, res.passed) == ("WA", 1), res.message


@root_only
def test_a_program_cannot_reach_the_sandbox_that_runs_it(judge):
    """The sandbox that runs a program's tests takes them from the judge over a socket, as root: the program has
    no descriptor of it, cannot read init's, cannot signal init, and inherits nothing that shields it from the
    OOM killer."""
    src = """
    import os, signal, sys
    a, b = map(int, input().split())
    got = []
    for fd in range(3, 64):                          # its descriptors past stdio (no /proc to list them since round 4)
        try:
            got.append((fd, os.fstat(fd).st_mode))
        except OSError:
            pass
    try:
        got.append(os.listdir('/proc/1/fd'))
    except OSError:
        pass
    try:
        os.kill(1, signal.SIGTERM)
        got.append('signalled init')
    except OSError:
        pass
    if os.path.exists('/proc/self') and int(open('/proc/self/oom_score_adj').read()) < 0:   # no MLE then
        got.append('oom_score_adj')
    print(got, file=sys.stderr)
    print(a + b if got else 'none')
    """
    res = run(judge, src, tests=AB * 3)
    assert res.verdict != "AC" and res.passed == 0, res.message


def test_threads_get_a_usable_stack(judge):
    """A program's main stack may grow to the memory limit (deep recursion), and threads still start: glibc sizes
    thread stacks from RLIMIT_STACK, which is therefore unlimited (RLIMIT_AS bounds the total; threads get 2 MiB)."""
    src = r"""
    #include <bits/stdc++.h>
    int depth(int n) { volatile char pad[512]; pad[0] = 1; return n == 0 ? pad[0] - 1 : depth(n - 1) + pad[0]; }
    int main() {
        long long a, b; std::cin >> a >> b;
        auto f = std::async(std::launch::async, [&] { return a + b; });
        int in_thread = -1;
        std::thread t([&] { in_thread = depth(2000); });              // ~1 MB of a thread's 2 MiB
        t.join();
        std::cout << f.get() + depth(200000) - 200000 + in_thread - 2000 << "\n";    // ~100 MB of main stack
    }
    """
    res = run(judge, src, "cpp", memory_limit_mb=256)
    assert res.verdict == "AC", res.message
    py = "import threading\nr = []\nt = threading.Thread(target=lambda: r.append(sum(map(int, input().split()))))\n" \
         "t.start(); t.join(); print(r[0])\n"
    assert run(judge, py).verdict == "AC"


@root_only
def test_a_large_binary_does_not_count_against_its_memory(judge):
    """The program's file is bound into its sandbox, not copied: a 96 MiB data segment, all written, fits a
    128 MiB limit (a copy in the test's tmpfs would count it twice)."""
    src = r"""
    #include <cstdio>
    static char data[96 << 20] = {1};
    int main() { long a, b, s = 0; if (scanf("%ld %ld", &a, &b) != 2) return 1;
                 for (long i = 0; i < (96 << 20); i += 4096) { data[i] += 1; s += data[i]; }
                 printf("%ld\n", a + b + s - (96 << 20) / 4096 - 1); }
    """
    res = run(judge, src, "cpp", memory_limit_mb=128)
    assert res.verdict == "AC", res.message


def test_a_binary_evicted_from_the_cache_still_runs_its_tests(monkeypatch):
    """A job keeps its own link to its binary: a cache cap that evicts it while its tests run costs nothing."""
    monkeypatch.setenv("MINIRL_JUDGE_CACHE_MB", "0")  # every new binary evicts all the others
    progs = [f"#include <cstdio>\nint main(){{long a,b; if(scanf(\"%ld %ld\",&a,&b)!=2) return 1;"
             f" printf(\"%ld\\n\", a+b+{k}-{k});}}\n" for k in range(3)]
    with Judge(workers=2) as j:
        res = j.run_many([dict(source=p, language="cpp", tests=AB * 20) for p in progs])
    assert [(r.verdict, r.passed) for r in res] == [("AC", 20)] * 3, [r.message for r in res]


def test_a_program_sandbox_without_its_cgroup_still_judges(judge, monkeypatch):
    """Where a program's cgroup cannot be set (a v1 memory limit lowered below memory still charged: EBUSY),
    its tests run on rlimits, as single runs do, instead of failing."""
    from minirl.judge.cgroup import RunCgroup
    begin = RunCgroup.begin

    def busy(self, *args):
        if any(str(d).endswith(f"-tests-{os.getpid()}") for d in self.dirs.values()):
            raise OSError(16, "Device or resource busy")
        return begin(self, *args)
    monkeypatch.setattr(RunCgroup, "begin", busy)
    res = run(judge, "print(sum(map(int, input().split())))", tests=AB * 3, memory_limit_mb=300)
    assert (res.verdict, res.passed) == ("AC", 3), res.message


@root_only
def test_a_judge_keeps_one_sandbox_per_worker_and_leaves_none(judge):
    """Each worker's sandbox serves every program it runs, batch after batch (no new one per program, none
    leaked), and closing the Judge ends them all."""
    from minirl.judge.sandbox import sandbox_helper
    helper = sandbox_helper(cache_dir())

    def sandboxes():  # this process's launchers (an init blanks its command line, which named host paths)
        def ours(pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() == helper and \
                    f"PPid:\t{os.getpid()}\n" in status
            except OSError:
                return False
        return [p for p in os.listdir("/proc") if p.isdigit() and ours(p)]
    before = sandboxes()  # the module's judges'
    jobs = [dict(source="print(sum(map(int, input().split())))", language="python", tests=AB * 4)] * 3
    with Judge(workers=2, cgroups=judge.cgroups is not None) as j:
        for _ in range(2):
            assert [r.verdict for r in j.run_many(jobs)] == ["AC"] * 3
            assert len(set(sandboxes()) - set(before)) == 2
    assert set(sandboxes()) - set(before) == set()


def test_float_tolerance_needs_both_values_finite():
    assert not outputs_match(b"12345", "inf", float_tolerance=1e-6)
    assert not outputs_match(b"inf", "1.0", float_tolerance=1e-6)
    assert not outputs_match(b"-inf", "-infinity", float_tolerance=1e-6)
    assert outputs_match(b"inf", "inf", float_tolerance=1e-6)       # the same token is still the same token
    assert outputs_match(b"1.0000001", "1", float_tolerance=1e-6)


@root_only
@x86_64
def test_seccomp_denies_namespaces_io_uring_keyrings_and_ptrace(judge):
    src = r"""
    #include <cstdio>
    #include <sched.h>
    #include <string>
    #include <sys/ptrace.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    int main() {
        std::string got;
        if (unshare(CLONE_NEWUSER) == 0) got += "userns ";
        char params[120] = {0};
        long ring = syscall(425, 4, params);                         // io_uring_setup
        if (ring >= 0) got += "io_uring ";
        if (syscall(SYS_add_key, "user", "k", "v", 1, -2) >= 0) got += "add_key ";
        if (syscall(SYS_keyctl, 1, 0) >= 0) got += "keyctl ";       // KEYCTL_JOIN_SESSION_KEYRING
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) == 0) got += "ptrace ";
        if (syscall(SYS_memfd_create, "m", 0) >= 0) got += "memfd ";
        if (syscall(SYS_mq_open, "q", 0100 | 02, 0600, 0) >= 0) got += "mq_open ";  // O_CREAT | O_RDWR
        if (syscall(SYS_socket, 1, 1, 0) >= 0) got += "socket ";                    // AF_UNIX: SCM_RIGHTS
        int sv[2];
        if (syscall(SYS_socketpair, 1, 1, 0, sv) >= 0) got += "socketpair ";
        puts(got.empty() ? "denied" : got.c_str());
    }
    """
    res = run(judge, src, "cpp", tests=[{"input": "", "output": "denied"}])
    assert res.verdict == "AC", res

"""Round 5 (issue 54): host-wide counters a program could read, limits it inherited, memory held outside the
limits, and a false refusal. As in the earlier rounds, an attack program earns AC only if its attack works, so
`verdict != "AC"` is the property; judges run with and without cgroups (attack_helpers.judge)."""
import pytest

from attack_helpers import AB, judge, root_only, run, x86_64  # noqa: F401 (judge: a fixture)

EMPTY = [{"input": "", "output": "denied"}]


# --- finding 7: an honest table a few MiB under the limit, without cgroups ------------------------------------

TABLE = r"""
#include <cstdio>
static char table[{mib} << 20];
int main() {{
    long a, b;
    if (scanf("%ld %ld", &a, &b) != 2) return 1;
    for (long i = 0; i < (long)sizeof table; i += 4096) table[i] = (char)i;   // every page resident
    long s = 0;
    for (long i = 0; i < (long)sizeof table; i += 4096) s += table[i];
    printf("%ld\n", a + b + (s == -1));
}}
"""


@root_only
@pytest.mark.parametrize("mib", [240, 248])
def test_a_table_a_few_mib_under_the_limit_is_ac(judge, mib):
    """What the program allocates is what is limited: the loader and libc get room of their own (a 240 MiB
    table at 256 MiB was RE without cgroups: RLIMIT_AS left no room to map libc, so it died before main())."""
    res = run(judge, TABLE.format(mib=mib), "cpp", memory_limit_mb=256, time_limit_s=4)
    assert res.verdict == "AC", res


@root_only
def test_a_table_over_the_limit_is_not_ac(judge):
    """The other side of the room given to the loader: 264 MiB of table at 256 MiB never runs to the end."""
    res = run(judge, TABLE.format(mib=264), "cpp", memory_limit_mb=256, time_limit_s=4)
    assert res.verdict != "AC", res


# --- finding 3 and item 4: every resource limit set, none inherited -------------------------------------------

LIMITS = r"""
#include <cstdio>
#include <sys/resource.h>
int main() {
    const int which[] = {RLIMIT_SIGPENDING, RLIMIT_MSGQUEUE, RLIMIT_MEMLOCK, RLIMIT_LOCKS, RLIMIT_NICE,
                         RLIMIT_RTPRIO, RLIMIT_CORE, RLIMIT_NOFILE};
    for (int r : which) {
        struct rlimit l;
        getrlimit(r, &l);
        printf("%llu %llu ", (unsigned long long)l.rlim_cur, (unsigned long long)l.rlim_max);
    }
    printf("\n");
}
"""


@root_only
def test_no_resource_limit_is_inherited_from_the_judge(judge):
    """Pending signals 64, message queues, locked memory, locks, nice and real-time priority 0 (the host's were
    96k signals, 800 KB of queues, 8 MiB locked), a core of 1 byte, 64 descriptors."""
    want = " ".join(f"{v} {v}" for v in (64, 0, 0, 0, 0, 0, 1, 64))
    res = run(judge, LIMITS, "cpp", tests=[{"input": "", "output": want}])
    assert res.verdict == "AC", (res, res.tests)


TIMERS = r"""
#include <csignal>
#include <cstdio>
#include <ctime>
int main() {
    long made = 0;
    struct sigevent ev = {};
    ev.sigev_notify = SIGEV_NONE;
    timer_t t;
    while (made < 200000 && timer_create(CLOCK_MONOTONIC, &ev, &t) == 0) made++;
    fprintf(stderr, "%ld timers\n", made);
    puts(made * 390 > (16L << 20) ? "3" : "few");               // ~390 bytes of kernel memory each
}
"""


@root_only
def test_posix_timers_hold_no_memory_past_the_limit(judge):
    """Each POSIX timer is ~390 bytes of unswappable kernel memory that RLIMIT_AS never sees and only
    RLIMIT_SIGPENDING bounds: with the host's limit inherited, 43k+ timers held more than a 16 MiB limit
    without a cgroup (with one: MLE)."""
    res = run(judge, TIMERS, "cpp", memory_limit_mb=16, time_limit_s=4)
    assert res.verdict != "AC", res


# --- finding 1: host-wide sequence numbers --------------------------------------------------------------------

COUNTERS = r"""
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdio>
#include <string>
static char stack[1 << 16];
static int quit(void *) { syscall(SYS_exit, 0); return 0; }
static std::string ino(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 ? std::to_string(st.st_ino) + " " : "";
}
int main() {
    std::string got;
    int p[2];
    if (pipe(p) == 0) got += "pipe " + ino(p[0]);
    if (pipe2(p, O_CLOEXEC) == 0) got += "pipe2 " + ino(p[0]);
    int self = syscall(SYS_pidfd_open, getpid(), 0);
    if (self >= 0) got += "pidfd_open " + ino(self);
    int pidfd = -1;
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM | CLONE_PIDFD;
    if (clone(quit, stack + sizeof stack, flags, nullptr, &pidfd) > 0) got += "CLONE_PIDFD " + ino(pidfd);
    // a new inode of the kernel's internal tmpfs each: the counter stdin's memfd shows (fstat(0))
    if (mmap(0, 4096, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) got += "MAP_SHARED|MAP_ANONYMOUS ";
    int zero = open("/dev/zero", O_RDONLY);
    if (zero >= 0 && mmap(0, 4096, PROT_READ, MAP_SHARED, zero, 0) != MAP_FAILED) got += "/dev/zero ";
    puts(got.empty() ? "denied" : got.c_str());
}
"""


@root_only
@x86_64
def test_no_object_with_a_host_wide_inode_number_is_made(judge):
    """A pipe's inode number comes from one counter for the whole host (get_next_ino), a pidfd's from another
    (pidfs), a shared anonymous mapping's from a third, the one a test's stdin (a memfd) shows to fstat: a
    correct sample advanced one while a sibling read the differences, no timing needed (20k mappings moved
    stdin's number by 20k). A single-process program gets none of them: pipe, pipe2, pidfd_open, CLONE_PIDFD
    and MAP_SHARED with MAP_ANONYMOUS are refused, and there is no /dev/zero to map shared."""
    res = run(judge, COUNTERS, "cpp", tests=EMPTY)
    assert res.verdict == "AC", (res, res.tests)


PIPES = """
import os, subprocess, sys
r, w = os.pipe()
os.write(w, b'3')
out = subprocess.run([sys.executable, '-c', 'print(1 + 2)'], capture_output=True, text=True).stdout.strip()
print(os.read(r, 1).decode() if out == '3' else 'no')
"""


@root_only
def test_a_problem_with_processes_keeps_its_pipes(judge):
    """processes=True: subprocess and os.pipe still work (the README says what remains there)."""
    res = run(judge, PIPES, tests=[{"input": "", "output": "3"}], processes=True, time_limit_s=4)
    assert res.verdict == "AC", res


# --- finding 4: job folders' binaries beside the cache's cap ----------------------------------------------------

@root_only
def test_a_job_holds_its_binary_once_and_the_cache_counts_it(monkeypatch):
    """Six programs with 100 MiB tables held 726-1,090 MiB under a 256 MiB cache cap: each job kept a copy of its
    binary, and the cache evicted entries whose jobs still held them (freeing nothing). Now a job's binary is a
    hard link to its cache entry, which is counted and not evicted while held: three fresh 2 MiB binaries under
    a 1 MiB cap take three binaries' room on disk, not four or six. (A private cache, without the PCH.)"""
    import os
    import uuid
    from pathlib import Path

    from minirl.judge import compile as compile_mod
    from minirl.judge.host import lease_uids, remove_tree
    from minirl.judge.sandbox import Sandbox, isolation_mode
    from minirl.judge.verdict import prepare

    cache = Path("/var/lib") / f"minirl-judge-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MINIRL_JUDGE_CACHE", str(cache))
    monkeypatch.setenv("MINIRL_JUDGE_CACHE_MB", "1")
    monkeypatch.setattr(compile_mod, "_cache_bytes", None)
    monkeypatch.setattr(compile_mod, "pch_dir", lambda flags: None)
    lease, jobs = lease_uids(1), []
    try:
        sandbox = Sandbox(isolation_mode(lease.uids[0]), lease.uids[0])
        for k in range(3):
            src = f"#include <cstdio>\nstatic char t[2 << 20] = {{{k + 1}}};\nint main() {{ puts(t + {k}); }}\n"
            jobs.append(prepare(src, "cpp", AB, sandbox=sandbox))
        held = {os.stat(job.files["main"]).st_ino: os.stat(job.files["main"]).st_size for job in jobs}
        on_disk = {}
        for folder, _, names in os.walk(cache):
            for name in names:
                st = os.stat(os.path.join(folder, name))
                if st.st_size >= 1 << 20:
                    on_disk[st.st_ino] = st.st_size
        assert len(held) == 3 and on_disk == held, (held, on_disk)
        assert all(os.stat(job.files["main"]).st_nlink == 2 for job in jobs)   # and its cache entry is there
    finally:
        for job in jobs:
            remove_tree(job.root)
        lease.release()
        remove_tree(cache)


# --- finding 1 and item 2: siblings never run at the same time ----------------------------------------------------

@root_only
def test_siblings_never_run_at_the_same_time():
    """Whatever channel two programs judged at once find (host-wide counters, caches, the CPU), it must never
    join a correct sample and its siblings: jobs with the same tests never overlap, while other problems fill
    the workers, in one run_many call or in several at once. Each program reports its own run's interval on
    the host's clock."""
    import threading

    from minirl.judge import Judge

    src = "import time\nt0 = time.time()\ntime.sleep(0.3)\nprint({tag!r}, t0, time.time())\n"
    problem = {"A": [{"input": "a\n", "output": "", "keep_output": True}],
               "B": [{"input": "b\n", "output": "", "keep_output": True}]}
    jobs = [dict(source=src.format(tag=tag), language="python", tests=problem[tag], time_limit_s=2)
            for tag in "AABBAABB"]
    results = []
    with Judge(workers=2, cgroups=False) as judge:              # two batches at once (the server's clients)
        calls = [threading.Thread(target=lambda part: results.extend(judge.run_many(part)), args=(part,))
                 for part in (jobs[:4], jobs[4:])]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
    spans = {"A": [], "B": []}
    for res in results:
        tag, t0, t1 = res.tests[0]["stdout"].split()
        spans[tag].append((float(t0), float(t1)))
    for tag, runs in spans.items():
        runs.sort()
        assert len(runs) == 4 and all(a[1] <= b[0] for a, b in zip(runs, runs[1:])), (tag, runs)


# --- finding 2: the page cache of a worker's copy of the system files, between its runs -------------------------

PAGES = r"""
#include <cstdio>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
const char *files[] = {%s};
int main() {
    char role[16] = "";
    if (scanf("%%15s", role) != 1) return 1;
    int answer = 0;
    for (int i = 0; i < 8; i++) {
        int fd = open(files[i], O_RDONLY);
        if (fd < 0) { puts("no file"); return 0; }
        if (role[0] == 's') {                          // send: make the files of the answer's bits resident
            char c;
            if ((165 >> i) & 1 && pread(fd, &c, 1, 0) != 1) return 1;
        } else {                                       // receive: a major fault says "not cached"
            struct rusage a, b;
            getrusage(RUSAGE_SELF, &a);
            volatile char *p = (volatile char *)mmap(0, 4096, PROT_READ, MAP_SHARED, fd, 0);
            char c = p[0]; (void)c;
            getrusage(RUSAGE_SELF, &b);
            if (b.ru_majflt == a.ru_majflt) answer |= 1 << i;
        }
        close(fd);
    }
    if (role[0] == 's') puts("sent"); else printf("%%d\n", answer);
}
"""


@root_only
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroups", "no-cgroups"])
def test_no_page_cache_state_survives_between_runs_of_a_worker(cgroups):
    """One run reads a byte of some of the worker's copy of the time zone files; the next run on that worker maps
    each and reads the bits back from getrusage's major-fault count: deterministic while the copy is cold (here:
    its pages dropped first, as memory pressure or a reboot would). The copy now lives in RAM (a noswap tmpfs):
    every page is there for every run, and the receiver reads all ones."""
    import os
    from minirl.judge import Judge
    from minirl.judge.sysroot import program_root

    with Judge(workers=1, cgroups=cgroups) as judge:
        zones = program_root(judge.uids[0]) / "usr" / "share" / "zoneinfo" / "Europe"
        names = sorted(n for n in os.listdir(zones) if (zones / n).is_file() and not (zones / n).is_symlink())[:8]
        for name in names:                                 # cold, as after memory pressure
            fd = os.open(zones / name, os.O_RDONLY)
            os.fsync(fd)                                   # a copy just built: its dirty pages stay otherwise
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        src = PAGES % ", ".join(f'"/usr/share/zoneinfo/Europe/{n}"' for n in names)
        sender = run(judge, src, "cpp", tests=[{"input": "send", "output": "sent"}])
        receiver = run(judge, src, "cpp", tests=[{"input": "receive", "output": "165"}])
    assert sender.verdict == "AC", sender
    assert receiver.verdict != "AC", (receiver, receiver.tests)

"""Issue 31's review (round 4): the allow-list's channels it still left open and the honest calls it refused. As
in test_judge_round4.py, an attack earns AC only if it works (`verdict != "AC"` is the property), an honest
program must be AC; judges run with and without cgroups."""
import pytest

from attack_helpers import AB, judge, run  # noqa: F401 (judge: a fixture)

ATTACK_CPP = """
#include <cstdio>
#include <sys/statfs.h>
#include <sys/sysinfo.h>
#include <fcntl.h>
int main() {
    int ok = 0;
    %s
    printf("%%d\\n", ok ? 3 : 0);
}
"""


# --- findings 2 and 3: sysinfo counts the host's processes, statfs shows its disks' free space -----------------

@pytest.mark.parametrize("call", [
    "struct sysinfo si; ok = sysinfo(&si) == 0 && si.procs > 0;",
    'struct statfs s; ok = statfs("/usr", &s) == 0 && s.f_bfree > 0;',
    'struct statfs s; int fd = open("/usr/lib", O_RDONLY); ok = fstatfs(fd, &s) == 0 && s.f_blocks > 0;',
], ids=["sysinfo", "statfs", "fstatfs"])
def test_a_program_cannot_read_host_wide_counts(judge, call):
    res = run(judge, ATTACK_CPP % call, "cpp")
    assert res.verdict != "AC", res


# --- finding 5: the scratch tmpfs's inodes are memory that size= never counts -----------------------------------

def test_the_scratch_tmpfs_has_an_inode_limit(judge):
    src = """
    import os
    n = 0
    try:
        while n < 100000:
            os.mkdir(f'/tmp/{n}')
            n += 1
    except OSError:
        pass
    print(3 if n >= 100000 else n)
    """
    res = run(judge, src, memory_limit_mb=64)
    assert res.verdict != "AC", res


# --- findings 8 and 9: honest calls the allow-list refused -------------------------------------------------------

HONEST_CPP = {
    "getrusage": """
    #include <cstdio>
    #include <sys/resource.h>
    int main() { struct rusage r; if (getrusage(RUSAGE_SELF, &r)) return 1; int a, b; scanf("%d %d", &a, &b);
                 printf("%d\\n", a + b); }
    """,
    "timer_create": """
    #include <csignal>
    #include <cstdio>
    #include <ctime>
    int main() {
        timer_t t; struct sigevent ev = {}; ev.sigev_notify = SIGEV_NONE;
        if (timer_create(CLOCK_MONOTONIC, &ev, &t)) return 1;
        struct itimerspec its = {}; its.it_value.tv_sec = 10;
        if (timer_settime(t, 0, &its, nullptr) || timer_gettime(t, &its) || timer_getoverrun(t) < 0) return 2;
        if (timer_delete(t)) return 3;
        int a, b; scanf("%d %d", &a, &b); printf("%d\\n", a + b);
    }
    """,
}


@pytest.mark.parametrize("name", sorted(HONEST_CPP))
def test_honest_cpp_calls_are_allowed(judge, name):
    res = run(judge, HONEST_CPP[name], "cpp")
    assert res.verdict == "AC", res


def test_python_getrusage_is_allowed(judge):
    src = """
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    a, b = map(int, input().split())
    print(a + b)
    """
    res = run(judge, src)
    assert res.verdict == "AC", res

"""Issue 31's review (round 4): the allow-list's channels it still left open and the honest calls it refused. As
in test_judge_round4.py, an attack earns AC only if it works (`verdict != "AC"` is the property), an honest
program must be AC; judges run with and without cgroups."""
import subprocess
import uuid

import pytest

from attack_helpers import AB, judge, root_only, run  # noqa: F401 (judge: a fixture)
from minirl.judge.host import STAGE

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


# --- findings 10 and 11: the Python syntax check, folded into the test's run ----------------------------------

def test_a_python_start_up_failure_is_not_a_compile_error(judge):
    """At 16 MiB python3 cannot map libm: the tests' verdict (RE, as before any syntax check), not CE."""
    res = run(judge, "a, b = map(int, input().split())\nprint(a + b)\n", memory_limit_mb=16)
    assert res.verdict != "CE", res


def test_a_one_test_python_job_is_one_run(judge, monkeypatch):
    """The syntax check costs no sandbox or python3 start of its own (it was 2.4x a job's wall time)."""
    from minirl.judge.sandbox import Sandbox
    from minirl.judge.worker_sandbox import WorkerSandbox
    runs = []
    for cls in (Sandbox, WorkerSandbox):
        original = cls.run
        monkeypatch.setattr(cls, "run", lambda self, *a, _o=original, **kw: runs.append(a) or _o(self, *a, **kw))
    res = run(judge, f"# {uuid.uuid4()}\na, b = map(int, input().split())\nprint(a + b)\n")
    assert res.verdict == "AC" and len(runs) == 1, (res, runs)


def test_a_python_program_runs_as_a_script(judge):
    """The wrapper that compiles main.py leaves the program what `python3 -I main.py` gives it."""
    src = """
    import sys
    print(__name__, __file__, __cached__, sys.argv, sorted(globals()))
    """
    want = ("__main__ /work/main.py None ['main.py'] ['__annotations__', '__builtins__', '__cached__', '__doc__', "
            "'__file__', '__loader__', '__name__', '__package__', '__spec__', 'sys']")
    res = run(judge, src, tests=[{"input": "", "output": want}])
    assert res.verdict == "AC", res


@pytest.mark.parametrize("src,verdict", [("print(1\n", "CE"), ("x = 1\0\n", "CE"), ("import sys\nsys.exit(3)\n", "RE")],
                         ids=["syntax-error", "nul-byte", "exit-3"])
def test_python_compile_errors_are_ce_and_nothing_else_is(judge, src, verdict):
    res = judge.run(src, "python", AB * 3)
    assert res.verdict == verdict, res
    if verdict == "CE":
        assert res.tests == [] and res.passed == 0 and "Error" in res.message and "\0" not in res.message, res


# --- finding 4: the staging tmpfs, shared by every judge on the host, filled for good ---------------------------

@root_only
def test_a_workers_file_is_unstaged_when_its_job_ends(judge):
    """A worker kept its last binary (up to 128 MiB) staged until its next job."""
    res = run(judge, f"#include <cstdio>\nint main() {{ puts(\"3\"); }}\n// {uuid.uuid4()}\n", "cpp")
    staged = [p.name for uid in judge.uids for p in (STAGE / f"u{uid}").glob("*")]
    assert res.verdict == "AC" and staged == [], (res, staged)


@pytest.fixture
def small_stage(monkeypatch, tmp_path):
    """A private 8 MiB tmpfs as the stage (never the host-wide one: other judges use it)."""
    import minirl.judge.worker_sandbox as ws
    stage = tmp_path / "stage"
    stage.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=700", "tmpfs", str(stage)], check=True)
    monkeypatch.setattr(ws, "stage_dir", lambda uid=None: stage)
    monkeypatch.setattr(ws, "STAGE_TRIES", 1, raising=False)
    yield stage
    subprocess.run(["umount", "-l", str(stage)], check=False)


@root_only
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroups", "no-cgroups"])
def test_a_full_stage_is_a_judge_error_that_leaves_nothing_behind(small_stage, cgroups):
    """A 12 MiB binary does not fit: the job is a judge error (not the program's RE), no part of the copy is
    left, and the next honest job on the same worker gets AC."""
    from minirl.judge import Judge
    from minirl.judge.server import is_judge_fault
    big = f"static volatile char big[12 << 20] = {{1}};\nint main() {{ return big[0] - 1; }}\n// {uuid.uuid4()}\n"
    with Judge(workers=1, cgroups=cgroups) as j:
        res = j.run(big, "cpp", AB, memory_limit_mb=256)
        left = [p.name for p in small_stage.rglob("*") if p.is_file()]
        assert is_judge_fault(res) and "staging tmpfs" in res.message and left == [], (res, left)
        res = j.run("a, b = map(int, input().split())\nprint(a + b)\n", "python", AB)
        assert res.verdict == "AC", res


# --- finding 15: a socket core_pattern ignores RLIMIT_CORE ------------------------------------------------------

@pytest.mark.parametrize("pattern,warns", [("@/run/systemd/coredump", True), ("|/usr/lib/coredump %P", False),
                                           ("core", False)], ids=["socket", "pipe", "file"])
def test_a_socket_core_pattern_is_warned_about(monkeypatch, tmp_path, pattern, warns):
    import minirl.judge.host as host
    (tmp_path / "core_pattern").write_text(pattern + "\n")
    monkeypatch.setattr(host, "CORE_PATTERN", tmp_path / "core_pattern", raising=False)
    warning = host.core_pattern_warning() if hasattr(host, "core_pattern_warning") else None
    assert (warning is not None) == warns and (not warns or "socket" in warning), warning

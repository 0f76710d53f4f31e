"""Availability: one completion must never stop or starve a run (the second half of the attacks in
tests/judge/test_judge_attacks.py): deep trees, pathological sources, garbage output, two judges on one host, the
compiler's limits, the "uid" fallback, a killed judge. With and without cgroups where a judge is used.
"""
import fcntl
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
import uuid

import pytest

from attack_helpers import AB, judge, root_only, run  # noqa: F401 (judge: a fixture)
from minirl.judge import Judge
from minirl.judge.host import cache_dir, lease_folder, lease_uids, remove_tree


# --- availability: one completion must never stop or starve a run ----------------------------------------------

@root_only
def test_a_deep_folder_tree_is_a_verdict_and_leaves_nothing(judge):
    src = """
    import os
    for _ in range(3000):
        os.mkdir('d'); os.chdir('d')
    print(3)
    """
    before = set(os.listdir(cache_dir()))
    assert run(judge, src, time_limit_s=5).verdict in ("AC", "RE")
    assert [n for n in set(os.listdir(cache_dir())) - before if n.startswith(("run-", "cc-"))] == []


def test_remove_tree_is_iterative_and_never_raises(tmp_path):
    d = tmp_path / "deep"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        new = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
        open(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd), "w").close()
    os.close(fd)
    remove_tree(d)
    assert not d.exists()
    remove_tree(tmp_path / "missing")  # nothing to do, no error


def test_remove_tree_removes_a_file_or_a_link_where_a_folder_was(tmp_path):
    # an orphan `cc-<pid>-x.err` left as a file (seen in a fresh machine's cache) is removed, not warned about;
    # a link is removed itself, never followed
    (tmp_path / "f").write_text("x")
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "inside").write_text("y")
    (tmp_path / "link").symlink_to(keep)
    remove_tree(tmp_path / "f")
    remove_tree(tmp_path / "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"] and (keep / "inside").exists()


@pytest.mark.parametrize("src", ["x = " + "-" * 100000 + "1", "a" + ".b" * 200000], ids=["MemoryError", "RecursionError"])
def test_a_pathological_python_source_is_a_verdict(judge, src):
    res = judge.run(src, "python", AB)
    assert (res.verdict, res.passed) == ("CE", 0) and res.message


@pytest.mark.parametrize("prefix", ["", "3 "], ids=["garbage", "right-then-more"])
def test_garbage_output_is_compared_without_decoding_it(judge, prefix):
    src = f"""
    import os, sys
    sys.stdout.write({prefix!r}); sys.stdout.flush()
    chunk = b'\\xff\\xfe 1 ' * (1 << 18)
    for _ in range((60 << 20) // len(chunk)):
        os.write(1, chunk)
    """
    tracemalloc.start()
    try:
        res = run(judge, src, time_limit_s=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.verdict == "WA", res.message
    assert peak < 16 << 20, f"judging 60 MiB of output took {peak >> 20} MiB in the judge"


def test_two_judges_on_one_host_lease_disjoint_uids_never_an_accounts(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRL_JUDGE_LEASES", str(tmp_path))  # both processes; no other judge can race the check
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom minirl.judge.host import lease_uids\n"
                               "uids = lease_uids(3); print(*uids.uids, flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = set(map(int, holder.stdout.readline().split()))
        mine = lease_uids(3)
        assert len(theirs) == 3 and len(set(mine.uids)) == 3 and not theirs & set(mine.uids)
        import pwd
        assert all(u not in {p.pw_uid for p in pwd.getpwall()} for u in mine.uids)
        mine.release()
    finally:
        holder.stdin.close()
        holder.wait()
    for uid in theirs:  # the holder's process ended: the kernel released its uids, nothing leaked
        fd = os.open(lease_folder() / f"{uid}.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


@root_only
def test_two_judges_on_one_host_do_not_kill_each_others_programs():
    """Two processes judge at the same moment (e.g. eval.py beside train.py); each must get all its ACs."""
    jobs = [dict(source="import time\ntime.sleep(0.2)\nprint(3)\n", language="python", tests=AB)] * 12
    code = ("import sys\nfrom minirl.judge import Judge\n"
            "with Judge(workers=2) as j:\n"
            "    print('ready', flush=True); sys.stdin.readline()\n"
            "    print(sum(r.verdict == 'AC' for r in j.run_many(%r)))\n" % (jobs,))
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with Judge(workers=2) as j:
        assert other.stdout.readline().strip() == "ready"
        other.stdin.write("go\n")
        other.stdin.flush()
        mine = sum(r.verdict == "AC" for r in j.run_many(jobs))
    assert (mine, int(other.communicate(timeout=120)[0])) == (12, 12)


def test_default_workers_share_the_cores_between_local_processes(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with Judge() as j:
        assert j.workers == max(1, len(os.sched_getaffinity(0)) // 2)


def test_the_compiler_has_its_own_limits(judge):
    """A correct program with a 3 MB constant table: a binary over the programs' 1 MiB file-size limit."""
    table = "".join("abcdefghij"[i % 10] for i in range(3 << 20))
    src = ('#include <cstdio>\nconst char T[] = "%s";\n'
           'int main(){long a,b; scanf("%%ld %%ld",&a,&b); printf("%%ld\\n",a+b+(T[a*b]==\'z\'));}\n' % table)
    res = judge.run(src, "cpp", AB)
    assert res.verdict == "AC", res.message


def test_a_compile_error_is_cached(judge):
    src = "int main() { return undefined_%s; }\n" % uuid.uuid4().hex
    first, second = judge.run(src, "cpp", AB), judge.run(src, "cpp", AB)
    assert first.verdict == second.verdict == "CE" and first.compile_s > 0 and second.compile_s == 0.0
    assert "undefined_" in second.message


@root_only
def test_uid_mode_without_namespaces_still_judges_and_leaves_no_process():
    """The fallback where namespaces fail: the kill-and-reap by uid must still catch setsid() children."""
    from minirl.judge import judge_job
    lease = lease_uids(1)
    uid = lease.uids[0]
    orphan = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint(3)\n"
    try:
        verdicts = [judge_job(src, "python", AB, time_limit_s=1.0, mode="uid", uid=uid, processes=True).verdict
                    for src in ("print(sum(map(int, input().split())))", "while True:\n    pass\n", orphan)]
        alive = subprocess.run(["ps", "-o", "pid=", "-u", str(uid)], capture_output=True, text=True).stdout.split()
    finally:
        lease.release()
    assert verdicts == ["AC", "TLE", "AC"] and alive == []


@root_only
def test_uid_mode_a_program_cannot_read_the_expected_output_of_a_test_running_beside_it():
    """Work stealing runs tests of one program at once. Outside namespaces the run folder is visible (by
    name): test 0 polls for test 1's expected output, which the special checker's file holds meanwhile."""
    spy = textwrap.dedent("""
        import sys, time
        if input() == "0":
            t, got = time.time(), None
            while time.time() - t < 1.5 and got is None:
                try:
                    got = open("../c1.exp").read()
                except OSError:
                    pass
            print(got)
        else:
            print("SECRET")
        """)
    checker = dict(language="python", source="import sys, time\ntime.sleep(0.3)\n"
                   "sys.exit(open(sys.argv[2]).read().split() != open(sys.argv[3]).read().split())\n")
    tests = [{"input": "0\n", "output": "SECRET"}, {"input": "1\n", "output": "SECRET"}]
    with Judge(workers=2, cgroups=False) as j:
        j.isolation = "uid"
        r = j.run_many([dict(source=spy, language="python", tests=tests, checker=checker, time_limit_s=3)])[0]
    assert r.tests[1]["verdict"] == "AC" and r.verdict == "WA"  # test 0 printed "None": it read nothing


@root_only
def test_uid_mode_a_program_cannot_run_another_jobs_binary():
    """Outside namespaces run folders are reachable by name, and the sandbox launchers' command lines name them:
    a program looks for a sibling's binary there (a correct one, running beside it) and runs it on its input."""
    good = "#include <cstdio>\n#include <unistd.h>\nint main(){long a,b; if(scanf(\"%ld %ld\",&a,&b)!=2) return 1;" \
           " sleep(2); printf(\"%ld\\n\",a+b);}\n"
    thief = textwrap.dedent("""
        import glob, os, subprocess, time
        data, t, got = input(), time.time(), None
        while time.time() - t < 1.5 and got is None:
            for cmd in glob.glob('/proc/*/cmdline'):
                try:
                    args = open(cmd, 'rb').read().split(b'\\0')
                except OSError:
                    continue
                for a in args:
                    run = os.path.dirname(a.decode(errors='replace'))
                    if '/run-' not in run:
                        continue
                    for exe in (run + '/main', run + '/.job/main'):
                        try:
                            got = subprocess.run([exe], input=data, capture_output=True, text=True, timeout=3).stdout
                            break
                        except (OSError, subprocess.SubprocessError):
                            pass
        print(got)
        """)
    tests = [{"input": "40 2\n", "output": "42"}]
    with Judge(workers=2, cgroups=False) as j:
        j.isolation = "uid"
        good_res, thief_res = j.run_many([dict(source=good, language="cpp", tests=tests, time_limit_s=4),
                                          dict(source=thief, language="python", tests=tests, time_limit_s=4)])
    assert good_res.verdict == "AC" and thief_res.verdict == "WA", thief_res


@root_only
def test_a_killed_judge_leaves_no_program_running():
    """The judge is SIGKILLed while a program of its sleeps: the worker's sandbox sees its socket close and
    kills the program, and the next Judge on the uid sweeps what the dead one left."""
    code = ("import sys\nfrom minirl.judge import Judge\n"
            "j = Judge(workers=1)\nprint(j.uids[0], flush=True)\n"
            "j.run('import time\\ntime.sleep(60)\\n', 'python', [{'input': '', 'output': ''}], time_limit_s=30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    uid = int(proc.stdout.readline())
    leftovers = lambda: [p.name for p in cache_dir().glob(f"sandbox-{uid}-*")]  # noqa: E731
    deadline = time.time() + 20
    # the worker's sandbox (its files in the cache), then a process of the uid: the program (the Python syntax
    # check, a process of the uid too, ended before the worker's sandbox started)
    while time.time() < deadline and not (leftovers() and _processes_of(uid)):
        time.sleep(0.05)
    assert _processes_of(uid), "the program never started"
    proc.kill()
    proc.wait()
    deadline = time.time() + 5
    while time.time() < deadline and _processes_of(uid):
        time.sleep(0.05)
    assert _processes_of(uid) == []
    assert leftovers()  # what the dead judge left: its staging folder
    from minirl.judge.worker_sandbox import WorkerSandbox
    WorkerSandbox(uid, None).close()
    assert leftovers() == []


def _processes_of(uid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid="], capture_output=True, text=True).stdout
    return [line.split()[1] for line in out.splitlines() if int(line.split()[0]) == uid]


def test_close_waits_for_a_run_many_in_flight_before_giving_its_uids_back():
    import threading
    import time
    j = Judge(workers=1)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", j.run("import time\ntime.sleep(1)\nprint(3)", "python",
                                                                  AB, time_limit_s=3)))
    t.start()
    time.sleep(0.3)
    j.close()             # must not hand the uid on while the program still runs as it
    assert not t.is_alive() and out["r"].verdict == "AC"


def test_cgroups_can_be_switched_off_for_hosts_where_they_are_not_writable(monkeypatch):
    monkeypatch.setenv("MINIRL_JUDGE_CGROUPS", "0")
    with Judge(workers=1) as j:
        assert j.cgroups is None
        assert j.run("print(sum(map(int, input().split())))", "python", AB).verdict == "AC"

"""What a program shares with the host: attacks written the way a policy optimised against the judge would find
them, each getting AC only if it works (so `verdict != "AC"` is the property), with and without cgroups.
Limits (processes, memory, the compiler, the end of a run) are tests/judge/test_judge_limits.py.
"""
import os
import shutil
import subprocess
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from attack_helpers import judge, root_only, run, x86_64  # noqa: F401 (judge: a fixture)
from conftest import ROOT
from minirl.judge import Judge
from minirl.judge.host import cache_dir, lease_uids

PYTHON = "/usr/bin/python3"   # an interpreter any uid may run (the venv's may sit in root's home)


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
    paths = ['/proc/self/fd/0', '/dev/stdin']
    try:
        paths.append(os.readlink('/proc/self/fd/0'))
    except OSError:                                   # no /proc (programs have none since round 4)
        pass
    for path in paths:
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
    """Without root ("rlimits" mode) programs run as the judge's own uid: one opens the memory of every process
    it sees for writing, then kills every process it may (kill(-1), each pid); the judge must survive to give its
    verdict, AC only if no memory but its own could be opened."""
    lease = lease_uids(1)
    uid = lease.uids[0]
    tmp_path = Path(tempfile.mkdtemp(prefix="minirl-rlimits-"))   # pytest's is root's alone
    os.chown(tmp_path, uid, uid)
    (tmp_path / "attack.py").write_text(
        "import os, signal\n"
        "pids = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]\n"
        "opened = []\n"
        "for pid in pids:                                      # the judge's or the sandbox's memory\n"
        "    try:\n        os.close(os.open(f'/proc/{pid}/mem', os.O_RDWR)); opened.append(pid)\n"
        "    except OSError:\n        pass\n"
        "for pid in [-1] + pids:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "print(3 if not opened else opened)\n")
    (tmp_path / "judge.py").write_text(
        "from pathlib import Path\nfrom minirl.judge import judge_job\n"
        f"r = judge_job(Path('attack.py').read_text(), 'python', [{{'input': '', 'output': '3'}}], uid={uid})\n"
        "print('verdict', r.verdict, r.message[-300:])\n")
    # the package itself, where the sandbox uid can read it: the checkout may sit under a folder only root enters
    shutil.copytree(ROOT / "minirl", tmp_path / "minirl", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           "MINIRL_JUDGE_LEASES": str(tmp_path / "leases")}
    try:
        proc = subprocess.run([PYTHON, "judge.py"], capture_output=True, text=True, timeout=120, env=env,
                              cwd=tmp_path, user=uid, group=uid, extra_groups=[])
    finally:
        lease.release()
        subprocess.run(["rm", "-rf", str(tmp_path)])
    assert proc.returncode == 0 and "verdict AC" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])


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
    for fd in os.listdir('/proc/self/fd') if os.path.isdir('/proc/self/fd') else []:   # no /proc: nothing to see
        try:
            text += os.readlink('/proc/self/fd/' + fd) + '\\n'
        except OSError:
            pass
    for needle in ({cache!r}, 'minirl', 'sandbox-', 'run-', '/var/lib', '/work/wt'):
        if needle in text:
            seen.append(needle)
    if os.path.exists('/proc/self/cgroup') and re.search(r'(?<![0-9]){os.getpid()}(?![0-9])', open(
            '/proc/self/cgroup').read() + ''.join(line.split()[3] + line.split()[4]
                                                  for line in open('/proc/self/mountinfo'))):
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


def test_a_new_judge_removes_the_job_folders_of_judges_that_were_killed():
    """Job folders are named after their judge's process; a judge SIGKILLed mid-batch leaves its own behind,
    and the next Judge removes them, never a live judge's."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    tag = uuid.uuid4().hex[:8]
    gone = [f"run-{dead.pid}-{tag}", f"cc-{dead.pid}-{tag}"]
    kept = [f"run-{os.getpid()}-{tag}", f"run-1-{tag}", f"other-{dead.pid}-{tag}"]   # live judges; not a job's
    try:
        for name in gone + kept:
            (cache_dir() / name / ".job").mkdir(parents=True)
        with Judge(workers=1) as j:
            assert j.run("print(1)\n", "python", [{"input": "", "output": "1"}]).verdict == "AC"
        left = {p.name for p in cache_dir().iterdir()}
        assert not set(gone) & left and set(kept) <= left
        assert not any(n.startswith(f"run-{os.getpid()}-") and n not in kept for n in left)  # its own: removed
    finally:
        for name in gone + kept:
            subprocess.run(["rm", "-rf", str(cache_dir() / name)])

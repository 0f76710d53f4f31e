"""Each worker's sandbox runs programs on its own copy of the system files (minirl/judge/sysroot.py): siblings
judged at once map no file in common, so a futex keyed by a file's inode carries nothing between them."""
import os

import pytest

from attack_helpers import judge, root_only, x86_64  # noqa: F401 (judge: a fixture)

# The kernel's wake at a thread's exit (CLONE_CHILD_CLEARTID) is a shared FUTEX_WAKE on the word the thread was
# given, even when the word is read-only and cannot be cleared; a shared FUTEX_WAIT (glibc's pthread_join needs
# it) on the same file page in another sandbox is woken by it. The word: page 1 of libc, mapped read-only.
FUTEX = r"""
#include <bits/stdc++.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
using namespace std;
static char stack_[1 << 16];
static int quit(void *) { return 0; }
static void send(uint32_t *word) {         // threads whose exit wakes whoever waits on the word, for 3 s
    auto t0 = chrono::steady_clock::now();
    while (chrono::steady_clock::now() - t0 < chrono::seconds(3)) {
        int tid = clone(quit, stack_ + sizeof stack_, CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND |
                        CLONE_THREAD | CLONE_SYSVSEM | CLONE_CHILD_CLEARTID, nullptr, nullptr, nullptr, word);
        while (tid > 0 && syscall(SYS_tgkill, getpid(), tid, 0) == 0) sched_yield();  // gone: its stack is free
        usleep(2000);
    }
}
int main() {
    string role; cin >> role;
    int fd = open("/lib/x86_64-linux-gnu/libc.so.6", O_RDONLY);
    if (fd < 0) { cout << "no libc" << endl; return 0; }
    char *base = (char *)mmap(nullptr, 1 << 16, PROT_READ, MAP_PRIVATE, fd, 0);
    uint32_t *word = (uint32_t *)(base + 4096);
    if (role == "send") { send(word); cout << "sent" << endl; return 0; }
    if (role == "both") thread(send, word).detach();   // the control: sender and receiver in one program
    struct timespec ts = {2, 500000000};               // a shared wait on the word, 2.5 s at most
    long r = syscall(SYS_futex, word, FUTEX_WAIT, *word, &ts, nullptr, 0);
    cout << (r == 0 ? "woken" : "timeout") << endl;
    _exit(0);
}
"""


def jobs(roles):
    return [dict(source=FUTEX, language="cpp", tests=[{"input": role + "\n", "output": out}], time_limit_s=5)
            for role, out in roles]


@root_only
@x86_64
def test_a_thread_exit_futex_wake_reaches_no_sibling(judge):
    """Sender and receiver judged at once by run_many (two workers): the receiver is never woken, so it does not
    get the answer "woken" that it would get if the siblings shared libc's inode (before sysroot.py: AC)."""
    if not os.path.exists("/lib/x86_64-linux-gnu/libc.so.6"):
        pytest.skip("no Debian-style libc path on this host")
    sender, receiver = judge.run_many(jobs([("send", "sent"), ("receive", "woken")]))
    assert sender.verdict == "AC", sender
    assert receiver.verdict == "WA", receiver


@root_only
@x86_64
def test_the_futex_attack_works_inside_one_sandbox(judge):
    """The control: the same wake reaches a waiter on the same word of the same file in one program, so the
    test above passes for the right reason (the wake is made, and it is not the filter that stops it)."""
    if not os.path.exists("/lib/x86_64-linux-gnu/libc.so.6"):
        pytest.skip("no Debian-style libc path on this host")
    r = judge.run(FUTEX, "cpp", [{"input": "both\n", "output": "woken"}], time_limit_s=5)
    assert r.verdict == "AC", r


@root_only
def test_honest_programs_find_the_shell_the_locale_and_the_time_zones_in_the_copy(judge):
    """What the copy must hold beside the libraries: /bin/sh (system(), shell=True), the C.UTF-8 locale that
    the sandbox's LANG names (setlocale(""), std::locale("")), and the time zones."""
    shell = ("import os, subprocess\nassert os.system('true') == 0\n"
             "print(subprocess.run('echo ok', shell=True, capture_output=True, text=True).stdout.strip())\n")
    locale = ("import locale, zoneinfo\nlocale.setlocale(locale.LC_ALL, '')\n"
              "zoneinfo.ZoneInfo('Europe/Paris')\nprint('ok')\n")
    cpp = ("#include <bits/stdc++.h>\n#include <clocale>\nint main() {\n"
           "    if (!std::setlocale(LC_ALL, \"\")) return 1;\n    std::locale l(\"\");\n"
           "    std::cout << \"ok\\n\";\n}\n")
    ok = [{"input": "", "output": "ok"}]
    results = judge.run_many([dict(source=shell, language="python", tests=ok, processes=True),
                              dict(source=locale, language="python", tests=ok),
                              dict(source=cpp, language="cpp", tests=ok)])
    assert [r.verdict for r in results] == ["AC"] * 3, results


@root_only
def test_a_copy_that_cannot_be_built_is_a_judge_error_never_the_hosts_files(monkeypatch):
    """Fail closed: without the copy the worker's sandbox does not start, and the job says why."""
    from minirl.judge import Judge, sysroot

    def no_ldd():
        raise FileNotFoundError("no ldd here")
    monkeypatch.setattr(sysroot, "_key", lambda: "unbuildable")    # a copy that does not exist yet
    monkeypatch.setattr(sysroot, "sources", no_ldd)
    with Judge(workers=1) as j:
        if j.isolation != "namespaces":
            pytest.skip("copies are namespaces mode's")
        r = j.run("print(3)\n", "python", [{"input": "", "output": "3"}])
    assert r.verdict == "JE" and "cannot build the programs' own copy" in r.message and "no ldd" in r.message, r

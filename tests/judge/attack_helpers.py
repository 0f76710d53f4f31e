"""Shared by the judge's attack tests: a judge with and without cgroups, and a way to run an attack program."""
import os
import platform
import textwrap

import pytest

from minirl.judge import Judge

AB = [{"input": "1 2\n", "output": "3"}]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's namespaces need root")
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="raw syscall numbers are x86_64's")


@pytest.fixture(scope="module", params=[True, False], ids=["cgroups", "no-cgroups"])
def judge(request):
    """Both paths: `cgroups=False` is what a host without writable cgroups gets."""
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

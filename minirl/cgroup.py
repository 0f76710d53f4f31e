"""A cgroup per sandboxed run: memory that rlimits miss (tmpfs, page cache, kernel memory), a process count,
and the CPU time of every descendant.

    groups = Cgroups.detect()              # None where cgroups are not writable, or MINIRL_JUDGE_CGROUPS=0
    run = groups.create("w61000", memory_bytes=..., pids=64)
    ... start the sandbox with `-g path` for each path in run.procs ...
    run.cpu_s(), run.peak_bytes(), run.oom_killed(); run.remove()

Both layouts: cgroup v1 (one hierarchy per controller: memory, pids, cpuacct; runs are created under this
process's own cgroup of each, so a limit set on us still holds) and v2 (one hierarchy; runs go under
/sys/fs/cgroup/minirl-judge, because v2 lets a cgroup that holds processes, such as ours, have no children with
controllers). Anything that fails here makes `detect` return None, or `create` raise OSError, which the sandbox
treats as "no cgroup for this run": the judge then relies on rlimits, the PID namespace and the sandbox's own
accounting (README, isolation).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

V1_CONTROLLERS = ("memory", "pids", "cpuacct")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _own_path(controller: str) -> str:
    """This process's cgroup in a v1 hierarchy ("" for v2's line), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return "/"


class RunCgroup:
    """The cgroups of one run (one folder per v1 controller, or one v2 folder)."""

    def __init__(self, dirs: dict[str, Path], v2: bool):
        self.dirs, self.v2 = dirs, v2
        self.procs = [str(d / "cgroup.procs") for d in dict.fromkeys(dirs.values())]

    def _read(self, controller: str, name: str) -> str:
        return (self.dirs[controller] / name).read_text()

    def cpu_s(self) -> float:
        if self.v2:
            stat = dict(line.split() for line in self._read("cpu", "cpu.stat").splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int(self._read("cpuacct", "cpuacct.usage")) / 1e9

    def peak_bytes(self) -> int | None:
        try:
            return int(self._read("memory", "memory.peak" if self.v2 else "memory.max_usage_in_bytes"))
        except (OSError, ValueError):  # v2 before Linux 5.19 has no memory.peak
            return None

    def oom_killed(self) -> bool:
        text = self._read("memory", "memory.events" if self.v2 else "memory.oom_control")
        fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(fields.get("oom_kill", 0)) > 0

    def remove(self) -> None:
        """Kill whatever is left (nothing, after the sandbox's init reaped all) and remove the folders."""
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(100):
                try:
                    pids = (d / "cgroup.procs").read_text().split()
                    if not pids:
                        d.rmdir()
                        break
                    for pid in pids:
                        os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, FileNotFoundError):
                    continue
                except OSError:  # EBUSY while the last ones exit
                    pass
                os.sched_yield()


class Cgroups:
    """Where this process creates its runs' cgroups."""

    def __init__(self, bases: dict[str, Path], v2: bool):
        self.bases, self.v2 = bases, v2

    @staticmethod
    def detect() -> Cgroups | None:
        if os.environ.get("MINIRL_JUDGE_CGROUPS", "1") == "0" or os.geteuid() != 0:
            return None
        top = Path("/sys/fs/cgroup")
        tag = f"minirl-judge-{os.getpid()}"
        try:
            if (top / "cgroup.controllers").exists():                           # v2
                base = top / "minirl-judge"
                base.mkdir(exist_ok=True)
                _write(top / "cgroup.subtree_control", "+memory +pids +cpu")
                _write(base / "cgroup.subtree_control", "+memory +pids +cpu")
                groups = Cgroups({c: base for c in ("memory", "pids", "cpu")}, v2=True)
            else:                                                               # v1
                bases = {}
                for c in V1_CONTROLLERS:
                    d = top / c / _own_path(c).lstrip("/") / tag
                    d.mkdir(exist_ok=True)
                    bases[c] = d
                groups = Cgroups(bases, v2=False)
            groups.create("probe", 64 << 20, 8).remove()
            return groups
        except (OSError, ValueError, KeyError):
            return None

    def create(self, name: str, memory_bytes: int, pids: int) -> RunCgroup:
        dirs = {c: base / f"{name}-{os.getpid()}" for c, base in self.bases.items()}
        for d in dict.fromkeys(dirs.values()):
            d.mkdir(exist_ok=True)
        run = RunCgroup(dirs, self.v2)
        if self.v2:
            _write(dirs["memory"] / "memory.max", str(memory_bytes))
            if (dirs["memory"] / "memory.swap.max").exists():
                _write(dirs["memory"] / "memory.swap.max", "0")
            _write(dirs["pids"] / "pids.max", str(pids))
        else:
            _write(dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
            if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():  # no swapping past the limit
                _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(dirs["memory"] / "memory.max_usage_in_bytes", "0")   # a reused folder: reset the peak
            _write(dirs["cpuacct"] / "cpuacct.usage", "0")
            _write(dirs["pids"] / "pids.max", str(pids))
        return run

    def close(self) -> None:
        for d in set(self.bases.values()):
            if not self.v2:
                try:
                    d.rmdir()
                except OSError:
                    pass

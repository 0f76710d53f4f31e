"""A cgroup per sandboxed run: memory that rlimits miss (tmpfs, page cache, kernel memory), a process count,
and the CPU time of every descendant.

    groups = Cgroups.detect()              # None where cgroups are not writable, or MINIRL_JUDGE_CGROUPS=0
    cg = groups.run("u62000")              # one per worker, reused
    cg.begin(memory_bytes=..., pids=64)    # limits, counters' starting values
    ... start the sandbox with `-g path` for each path in cg.procs ...
    cg.cpu_s(), cg.oom_killed(); cg.kill_all()
    groups.close()

Both layouts: cgroup v1 (one hierarchy per controller: memory, pids, cpuacct; runs are created under this
process's own cgroup of each, so a limit set on us still holds) and v2 (one hierarchy; runs go under
/sys/fs/cgroup/minirl-judge, because v2 lets a cgroup that holds processes, such as ours, have no children with
controllers). Anything that fails here makes `detect` return None, or `create` raise OSError, which the sandbox
treats as "no cgroup for this run": the judge then relies on rlimits, the PID namespace and the sandbox's own
accounting (README, isolation).
"""
from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path

V1_CONTROLLERS = ("memory", "pids", "cpuacct")
_judges = itertools.count()


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


def _remove_stale(parent: Path) -> None:
    """Folders left by judges that ended without close() (their pid is gone): empty, so rmdir works."""
    for d in parent.glob("minirl-judge-*"):
        pid = d.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for sub in d.iterdir():
                if sub.is_dir():
                    try:
                        sub.rmdir()
                    except OSError:
                        pass
            try:
                d.rmdir()
            except OSError:
                pass


class RunCgroup:
    """The cgroups of one worker (one folder per v1 controller, or one v2 folder), reused run after run:
    creating and removing a memory cgroup costs more than the run of a small program."""

    def __init__(self, dirs: dict[str, Path], v2: bool):
        self.dirs, self.v2, self.limits = dirs, v2, (0, 0)
        self.procs = [str(d / "cgroup.procs") for d in dict.fromkeys(dirs.values())]
        self._cpu0, self._oom0 = 0.0, 0

    def _read(self, controller: str, name: str) -> str:
        return (self.dirs[controller] / name).read_text()

    def _cpu(self) -> float:
        if self.v2:
            stat = dict(line.split() for line in self._read("cpu", "cpu.stat").splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int(self._read("cpuacct", "cpuacct.usage")) / 1e9

    def _ooms(self) -> int:
        text = self._read("memory", "memory.events" if self.v2 else "memory.oom_control")
        fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(fields.get("oom_kill", 0))

    def begin(self, memory_bytes: int, pids: int) -> None:
        """Set this run's limits and take the counters' starting values."""
        if self.limits != (memory_bytes, pids):
            if self.v2:
                _write(self.dirs["memory"] / "memory.max", str(memory_bytes))
                if (self.dirs["memory"] / "memory.swap.max").exists():
                    _write(self.dirs["memory"] / "memory.swap.max", "0")
            else:
                files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]  # memsw: no swapping past it
                files = [f for f in files if (self.dirs["memory"] / f).exists()]
                # memsw must stay >= the plain limit: raise it first, lower it last (a new folder: unlimited)
                for f in (files[::-1] if 0 < self.limits[0] < memory_bytes else files):
                    _write(self.dirs["memory"] / f, str(memory_bytes))
            _write(self.dirs["pids"] / "pids.max", str(pids))
            self.limits = (memory_bytes, pids)
        self._cpu0, self._oom0 = self._cpu(), self._ooms()

    def cpu_s(self) -> float:
        """CPU time of every process of this run, reaped or not."""
        return self._cpu() - self._cpu0

    def oom_killed(self) -> bool:
        return self._ooms() > self._oom0

    def kill_all(self) -> None:
        """Nothing is left once the sandbox's init reaped all; this covers an init that was itself killed."""
        for _ in range(1000):
            pids = []
            for f in self.procs:
                try:
                    pids += [int(p) for p in Path(f).read_text().split()]
                except FileNotFoundError:
                    pass
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.sched_yield()

    def remove(self) -> None:
        self.kill_all()
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last ones exit
                    os.sched_yield()


class Cgroups:
    """Where this process creates its workers' cgroups."""

    def __init__(self, bases: dict[str, Path], v2: bool):
        self.bases, self.v2 = bases, v2
        self._runs: dict[str, RunCgroup] = {}

    @staticmethod
    def detect() -> Cgroups | None:
        if os.environ.get("MINIRL_JUDGE_CGROUPS", "1") == "0" or os.geteuid() != 0:
            return None
        top = Path("/sys/fs/cgroup")
        tag = f"minirl-judge-{next(_judges)}-{os.getpid()}"  # one per Judge: closing one leaves the others
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
                    _remove_stale(d.parent)
                    d.mkdir(exist_ok=True)
                    bases[c] = d
                groups = Cgroups(bases, v2=False)
            probe = groups.run("probe")
            probe.begin(64 << 20, 8)
            probe.remove()
            del groups._runs["probe"]
            return groups
        except (OSError, ValueError, KeyError):
            return None

    def run(self, name: str) -> RunCgroup:
        """The cgroup of worker `name` (created on first use)."""
        if name not in self._runs:
            dirs = {c: base / f"{name}-{os.getpid()}" for c, base in self.bases.items()}
            for d in dict.fromkeys(dirs.values()):
                d.mkdir(exist_ok=True)
            self._runs[name] = RunCgroup(dirs, self.v2)
        return self._runs[name]

    def close(self) -> None:
        for run in self._runs.values():
            run.remove()
        self._runs.clear()
        for d in set(self.bases.values()):
            if not self.v2:
                try:
                    d.rmdir()
                except OSError:
                    pass

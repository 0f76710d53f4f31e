"""A sandboxed judge for model-written C++ and Python programs, run by a pool of workers.

    judge = Judge()                                     # workers: this process's share of the cores
    res = judge.run(source, "cpp", tests=[{"input": "1 2\\n", "output": "3"}], time_limit_s=2, memory_limit_mb=256)
    res.verdict, res.passed, res.total                  # "AC" | "WA" | "TLE" | "MLE" | "RE" | "CE" | "OLE"
    results = judge.run_many([dict(source=..., language="python", tests=...), ...])   # parallel, order kept

    python -m minirl.judge --language cpp --source sol.cpp --tests tests.json [--time-limit-s 2] [--memory-limit-mb 256]

The pool: `workers` threads (default: this process's share of the cores, `cores // LOCAL_WORLD_SIZE`), each
driving one sandboxed process at a time (compiler or program): the work happens in those processes, so threads
give the parallelism without a process pool's pitfalls. Each worker runs as a sandbox uid leased for this Judge
alone, host-wide (minirl/judge/host.py: `lease_uids`), so judges of several ranks, or eval.py beside train.py,
never touch each other's programs. Each uid keeps one sandbox open for the Judge's life (`WorkerSandbox`:
each test a fresh process, in namespaces of its own, with fresh /work and /tmp), so a test costs a fork and an
exec, not a whole sandbox.

Speed: C++ is compiled once per unique (source, flags), against a force-included precompiled <bits/stdc++.h>
(minirl/judge/compile.py); binaries and compile errors are cached by hash. Workers start (compile) every job first and
then share the tests of all prepared ones, so the last work of a batch is short tests spread over all cores,
not one long compile on one core while the others idle. One program's verdict (compiling, running its tests, comparing outputs, the result
the sequential judge gives whatever order its tests ran in) is minirl/judge/verdict.py; this file is the pool.
Siblings (samples of one problem: the same tests) never have tests running at once, in any of this Judge's
run_many calls (`_Batch`): no channel between programs judged at once can join a correct sample and its siblings.

Failures are verdicts: whatever a program does, `run`/`run_many` return a result for it (a failure of the judge
itself on one job, a worker's sandbox that died mid-run included, is logged and returned as JE, "judge error":
no verdict on the program); only a call the caller got wrong (an unknown language) raises.

Isolation: minirl/judge/sandbox.c, worker_sandbox.py and sandbox.py (a new root per program, seccomp, cgroups,
leased uids; `Judge.isolation` says which mode this machine allows, minirl/judge/README.md what each
guarantees, `require_isolation` refuses the weak ones for model output unless the config accepts them).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from pathlib import Path

from minirl.judge.cgroup import Cgroups
from minirl.judge.compile import pch_dir
from minirl.judge.sandbox import Sandbox, isolation_mode
from minirl.judge.worker_sandbox import WorkerSandbox
from minirl.judge.host import core_pattern_warning, lease_uids, remove_orphans
from minirl.judge.verdict import (CXX_FLAGS, JUDGE_ERROR, LANGUAGES, REFUSED, VERDICTS,  # noqa: F401
                                  Job, JudgeResult, Worker, finish, is_refusal, judge_error, judge_job,
                                  outputs_match, prepare)

log = logging.getLogger(__name__)
WEAK = {  # the modes short of "namespaces", and what each loses
    "uid": "without namespaces, programs see the host's files and may read what other runs leave there",
    "rlimits": "without root, programs run as this process's uid and can read and write all its files"}


# --- the pool --------------------------------------------------------------------------------------------

def default_workers() -> int:
    """This process's share of the cores: torchrun starts LOCAL_WORLD_SIZE judging processes per host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def problem_key(spec: dict) -> str:
    """What makes two jobs siblings: the same tests (inputs and expected outputs) and the same checker."""
    h = hashlib.sha256()
    for test in spec["tests"]:
        for text in (test.get("input", ""), test.get("output", "")):
            data = text.encode(errors="surrogatepass")
            h.update(len(data).to_bytes(8, "little") + data)
    h.update(json.dumps(spec.get("checker"), sort_keys=True).encode(errors="surrogatepass"))
    return h.hexdigest()


class _Batch:
    """One `run_many` call's work: jobs not started yet, jobs being prepared, and prepared jobs whose tests any
    worker may take. Starting (compiling) comes first: tests wait for a worker with nothing left to start, so
    the compiles, the long part of a C++ batch, are never the last work left while the other cores idle.

    Siblings never overlap: jobs that answer the same problem (`problem_key`: the same tests and checker) never
    have tests running at the same time, in this batch or in any other of the same Judge (`holders` and `cond`
    are the Judge's: the server's clients and a Ray node's chunks are separate batches). A job holds its problem
    from its first test taken until its last one ran; the other workers meanwhile take tests of other problems
    (or more of the same job's). So whatever channel two programs judged at once might find, a correct sample
    never shares a moment with its siblings, the ones that could use its answer (round 5: host-wide inode
    counters carried it, without timing). A holder's batch always has a worker (the one that took its test) to
    run the rest, so a batch waiting for a problem waits for that job's end, never for ever."""

    def __init__(self, jobs: list[dict], cond: threading.Condition | None = None,
                 holders: dict[str, tuple] | None = None):
        self.jobs = jobs
        self.results: list[JudgeResult | None] = [None] * len(jobs)
        self._cond = cond or threading.Condition()
        self._next = 0            # the next job to start
        self._preparing = 0       # jobs being compiled: their tests will soon be there to take
        self._running: list[tuple[int, Job]] = []  # (index, job) of prepared jobs with tests left to hand out
        keys: dict[int, str] = {}                  # id(tests) -> key: a group's samples often share one list
        self._key = [keys.setdefault(id(j["tests"]), problem_key(j)) for j in jobs]
        self._holder = {} if holders is None else holders   # problem -> (batch, job) whose tests are running
        self._taken = [0] * len(jobs)              # tests of each job taken and not yet run to the end

    def next_work(self) -> int | tuple[int, Job, int] | None:
        """The index of a job to start; else (index, job, test) of a test taken from the running job with most
        tests left whose problem no other job holds; else None once no more work can come (while a job is still
        being prepared, or a sibling waits for its problem, wait: that is work to come)."""
        with self._cond:
            while True:
                if self._next < len(self.jobs):
                    self._next += 1
                    self._preparing += 1
                    return self._next - 1
                left = [(kj[1].left(), kj) for kj in self._running]
                self._running = [kj for n, kj in left if n]  # a job never gets more tests to hand out
                free = [(n, kj) for n, kj in left
                        if n and self._holder.get(self._key[kj[0]], (self, kj[0])) == (self, kj[0])]
                for _, (k, job) in sorted(free, key=lambda n_kj: -n_kj[0]):
                    if (i := job.take()) is not None:
                        self._holder[self._key[k]] = (self, k)
                        self._taken[k] += 1
                        return k, job, i
                if not self._running and not self._preparing:
                    return None
                self._cond.wait()

    def ran(self, k: int, job: Job) -> None:
        """A test of job `k` (from `next_work`) ran: once none is left to take or running, its problem is free."""
        with self._cond:
            self._taken[k] -= 1
            if not self._taken[k] and not job.left() and self._holder.get(self._key[k]) == (self, k):
                del self._holder[self._key[k]]
            self._cond.notify_all()

    def prepared(self, k: int, job: Job | None) -> None:
        """Job `k`'s preparation ended: its tests may be taken (None: it has none to run, e.g. CE)."""
        with self._cond:
            self._preparing -= 1
            if job is not None:
                self._running.append((k, job))
            self._cond.notify_all()


class Judge:
    """A pool of worker threads that judge programs; reuse one across training steps. Each worker drives one
    sandboxed process at a time with a uid leased for this Judge alone (flock, host-wide)."""

    def __init__(self, workers: int | None = None, cxx_flags: tuple[str, ...] = CXX_FLAGS,
                 cgroups: bool = True):
        self.workers = workers or default_workers()
        self.cxx_flags = tuple(cxx_flags)
        self._lease = lease_uids(self.workers)
        self.uids = list(self._lease.uids)  # this Judge's sandbox uids, its alone on this host
        self._uids: queue.SimpleQueue[int] = queue.SimpleQueue()
        for uid in self._lease.uids:
            self._uids.put(uid)
        self.isolation = isolation_mode(self._lease.uids[0])
        if self.isolation in WEAK:
            log.warning("the judge runs in %r mode: %s", self.isolation, WEAK[self.isolation])
        if warning := core_pattern_warning():
            log.warning("%s", warning)
        self.cgroups = Cgroups.detect() if cgroups and self.isolation != "rlimits" else None
        self.strict = False  # require_isolation(self, "strict"): refuse what the sandbox cannot hold here
        self._boxes: dict[int, WorkerSandbox] = {}  # uid -> its sandbox, kept open across run_many calls
        self._schedule = threading.Condition()   # every batch's: siblings never overlap across run_many calls
        self._holders: dict[str, tuple] = {}     # problem -> (batch, job) whose tests are running (_Batch)
        self._calls = 0                        # run_many calls in flight: close() waits for them
        self._calls_done = threading.Condition()
        pch_dir(self.cxx_flags)  # build the precompiled header once, up front
        remove_orphans()         # the run folders of judges killed before they could remove them

    def run(self, source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
            memory_limit_mb: int = 256, float_tolerance: float | None = None,
            checker: dict | None = None, processes: bool = False) -> JudgeResult:
        """Judge one program. `processes`: the problem needs new processes (by default one process, threads
        allowed: fork, vfork and posix_spawn fail)."""
        return self.run_many([dict(source=source, language=language, tests=tests, time_limit_s=time_limit_s,
                                   memory_limit_mb=memory_limit_mb, float_tolerance=float_tolerance,
                                   checker=checker, processes=processes)])[0]

    def run_many(self, jobs: list[dict]) -> list[JudgeResult]:
        """Judge many programs in parallel; results in the order of `jobs`."""
        for job in jobs:
            if job["language"] not in LANGUAGES:
                raise ValueError(f"unsupported language {job['language']!r}; use 'cpp' or 'python'")
        batch = _Batch(jobs, self._schedule, self._holders)
        # no more threads than tests (or jobs, to compile): an idle one would wait for a uid behind other calls'
        # work, and the call (its finished results: a server's outputs, 8 MiB each) with it
        useful = max(len(jobs), sum(len(job["tests"]) for job in jobs))
        threads = [threading.Thread(target=self._worker, args=(batch,), name=f"judge-{k}", daemon=True)
                   for k in range(min(self.workers, useful))]
        with self._calls_done:
            self._calls += 1
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            with self._calls_done:
                self._calls -= 1
                self._calls_done.notify_all()
        # a worker thread that died (a bug in the judge, not anything a program did) left its jobs unjudged
        return [r if r is not None else judge_error("a judge worker died before judging it", len(j["tests"]))
                for r, j in zip(batch.results, jobs)]

    def _worker(self, batch: _Batch) -> None:
        """Start jobs while any is left, then run the tests of prepared ones; whoever runs a job's last test
        gives its result. The uid is this worker's for its whole life: every test it takes runs as it (and in
        its cgroup), never beside another run of the same uid."""
        uid = self._uids.get()  # as many uids as workers: waits only while another run_many's workers hold them
        try:
            worker = Worker(Sandbox(self.isolation, uid, self.cgroups), self._boxes)
            while (work := batch.next_work()) is not None:
                if isinstance(work, int):
                    self._start(batch, work, worker)
                    continue
                k, job, i = work
                try:
                    last = job.run(i, worker)
                finally:
                    batch.ran(k, job)
                if job.left() == 0:            # nothing more of it for this worker: unstage its file
                    worker.done_with_job()
                if last:
                    batch.results[k] = self._finish(job, batch.jobs[k])
            worker.done_with_job()             # the batch is over for it (its job's last test went elsewhere)
        finally:
            self._uids.put(uid)

    def _start(self, batch: _Batch, k: int, worker: Worker) -> None:
        """Prepare job `k`: its result if it needs no tests run (a compile error), else its tests to take."""
        spec = batch.jobs[k]
        job = None
        try:
            if spec.get("processes") and self.strict and self.cgroups is None:
                batch.results[k] = JudgeResult(JUDGE_ERROR, 0, len(spec["tests"]), message=PROCESSES_NEED_CGROUPS)
                return
            prepared = prepare(**{"cxx_flags": self.cxx_flags, **spec, "sandbox": worker.sandbox})
            if isinstance(prepared, JudgeResult):
                batch.results[k] = prepared
            elif prepared.complete():  # no tests
                batch.results[k] = self._finish(prepared, spec)
            else:
                job = prepared
        except Exception as e:  # noqa: BLE001 -- one job must never stop a training run
            batch.results[k] = judge_error(e, len(spec["tests"]))
        finally:
            batch.prepared(k, job)  # exactly once: idle workers wait on it

    @staticmethod
    def _finish(job: Job, spec: dict) -> JudgeResult:
        try:
            return finish(job)
        except Exception as e:  # noqa: BLE001 -- a judge error in a counted test is this job's verdict
            return judge_error(e, len(spec["tests"]))

    def close(self) -> None:
        """Wait for run_many calls in flight (their sandboxes run as our uids), then close the sandboxes and release
        the uids and cgroups."""
        with self._calls_done:
            self._calls_done.wait_for(lambda: self._calls == 0)
        for box in self._boxes.values():
            box.close()
        if self.cgroups:
            self.cgroups.close()
        self._lease.release()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Without cgroups, limits are per process: 64 children may each hold the memory limit, and a child reaped by the
# kernel (SIGCHLD ignored) takes its CPU time with it. Under "strict", such a job is a judge error (JE), never a verdict.
PROCESSES_NEED_CGROUPS = (f"{REFUSED}processes=True needs cgroups under judge_isolation: strict (without them "
                          "each process has its own memory and CPU limits)")  # is_refusal: the server answers 400


def require_isolation(judge: Judge, setting: str) -> Judge:
    """The judge, if its isolation is what `setting` ("strict" or "weak", the config's judge_isolation) accepts
    for model output; else it is closed and a RuntimeError says what the weak mode loses. Under "strict", a job
    with processes=True on a judge without cgroups is refused (a judge error: JE, no test run)."""
    if setting not in ("strict", "weak"):
        judge.close()
        raise ValueError(f"judge_isolation must be 'strict' or 'weak', got {setting!r}")
    judge.strict = setting == "strict"
    if judge.isolation in WEAK:
        line = f"the judge runs in {judge.isolation!r} mode: {WEAK[judge.isolation]}"
        if setting == "strict":
            judge.close()
            raise RuntimeError(f"{line}. Run as root where namespaces work, or set judge_isolation: weak")
        log.warning("%s (judge_isolation: weak)", line)
    return judge


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Judge one program against tests; prints the result as JSON.")
    ap.add_argument("--language", required=True, choices=["cpp", "python"])
    ap.add_argument("--source", required=True, help="the program's file")
    ap.add_argument("--tests", required=True, help='JSON file: [{"input": ..., "output": ...}, ...]')
    ap.add_argument("--time-limit-s", type=float, default=2.0)
    ap.add_argument("--memory-limit-mb", type=int, default=256)
    ap.add_argument("--float-tolerance", type=float, default=None)
    args = ap.parse_args(argv)
    tests = json.loads(Path(args.tests).read_text())
    with Judge(workers=1) as judge:
        res = judge.run(Path(args.source).read_text(), args.language, tests, args.time_limit_s,
                        args.memory_limit_mb, args.float_tolerance)
        print(json.dumps({**res.to_dict(), "isolation": judge.isolation}, indent=2))
    return 0 if res.verdict == "AC" else 1


if __name__ == "__main__":
    raise SystemExit(main())

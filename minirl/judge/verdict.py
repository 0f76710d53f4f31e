"""One program's verdict: compile or syntax-check it, run its tests in the sandbox, compare the output.

    res = judge_job(source, "cpp", tests=[{"input": "1 2\\n", "output": "3"}], time_limit_s=2, memory_limit_mb=256)
    res.verdict, res.passed, res.total                  # "AC" | "WA" | "TLE" | "MLE" | "RE" | "CE" | "OLE"

`judge_job` judges one program in the calling thread; minirl/judge/pool.py's `Judge` runs many on a pool of workers
with the same pieces: `prepare` (compile or syntax check, the run folder), a `Job` whose tests any worker may
take, run as that worker's uid in the sandbox it keeps for the program (`Worker`), and the result as the
sequential judge gives it, whatever order the tests ran in. C++ is compiled by minirl/judge/compile.py; programs run
through minirl/judge/sandbox.py.

Tests count in order up to the first TLE, where a program's testing stops (every later test would cost a full
time limit, and both reward styles give the same reward from that point). Output is compared as bytes, token by
token, and never decoded (a 64 MiB flood of garbage costs one token). Failures are verdicts: whatever a program
does, a result comes back. A failure of the judge itself on one job (a worker's sandbox that died or would not
start, a full staging tmpfs, a compiler stopped by the wall clock) is logged and returned as JE, "judge error": no
verdict on the program, so a trainer leaves it out of the loss and never rewards it (minirl/rewards.py). A job the
judge refuses for what it asks (a special checker that does not compile or reports its own failure, processes where
they cannot be held) is JE too, its message starting REFUSED (`is_refusal`): the judge server answers it 400, so
that no client retries it.

A special checker (minirl/judge/checker.py) runs in the sandbox with the job's own limits, never more.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minirl.judge.cgroup import Cgroups
from minirl.judge.compare import output_file_matches, outputs_match  # noqa: F401 (re-exported)
from minirl.judge.checker import CheckerFault, JobRefused, prepare_checker, run_checker  # noqa: F401
from minirl.judge.compile import MESSAGE_LIMIT, CompileFault, compile_cpp, tail  # noqa: F401
from minirl.judge.python_check import PYTHON_ARGV, syntax_error
from minirl.judge.sandbox import Sandbox, isolation_mode
from minirl.judge.worker_sandbox import WorkerSandbox
from minirl.judge.stdio import OUTPUT_LIMIT_BYTES
from minirl.judge.host import job_folder, lease_uids, remove_tree

log = logging.getLogger(__name__)
VERDICTS = ("AC", "WA", "TLE", "MLE", "RE", "CE", "OLE")
JUDGE_ERROR = "JE"                 # not one of VERDICTS: the judge could not judge the program (never a reward)
CXX_FLAGS = ("-std=c++17", "-O2")
KEPT_OUTPUT_BYTES = 16 << 20       # a keep_output test's output limit (server.py returns its stdout whole)
PYTHON_SOURCE_LIMIT = 1 << 20      # a larger source is CE without a syntax check
LANGUAGES = {"cpp": "cpp", "c++": "cpp", "python": "python", "python3": "python"}
REFUSED = "judge error: refused: "  # a JE message for a job refused for what it asks: another judge would refuse it


@dataclass
class JudgeResult:
    verdict: str                   # overall: the first non-AC test's verdict, AC if all passed
    passed: int                    # tests passed
    total: int                     # tests in the job (tests skipped after a TLE count as not passed)
    tests: list[dict] = field(default_factory=list)  # per test run: verdict, time_s, memory_mb
    message: str = ""              # compiler error or the failing test's stderr, truncated
    compile_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# --- one job ---------------------------------------------------------------------------------------------
#
# A job is judged in three pieces, the same for `judge_job` (one thread) and `Judge.run_many` (a pool whose
# idle workers take tests of programs still running): `prepare` (compile or syntax check, the run folder),
# `_run_test` (one test, under the uid of whichever worker runs it) and `finish` (the result, as the
# sequential judge gives it, whatever order the tests ran in).

def _classify(r: dict, time_limit_s: float, memory_mb: int, output_limit: int) -> str | None:
    """Verdict of a finished run, or None if it exited cleanly (then the output decides AC/WA)."""
    rc = r["returncode"]
    if r["timed_out"] or r["cpu_s"] > time_limit_s or rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "TLE"
    if r["oom"]:
        return "MLE"
    if r["out"].stat().st_size > output_limit or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "OLE"
    if rc != 0:
        err = tail(r["err"], 20000)
        near_limit = r["max_rss_mb"] is not None and r["max_rss_mb"] >= 0.95 * memory_mb
        if "MemoryError" in err or "bad_alloc" in err or near_limit:
            return "MLE"
        return "RE"
    return None


def judge_job(source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
              memory_limit_mb: int = 256, float_tolerance: float | None = None, checker: dict | None = None,
              cxx_flags: tuple[str, ...] = CXX_FLAGS, mode: str | None = None, uid: int | None = None,
              cgroups: Cgroups | None = None, processes: bool = False) -> JudgeResult:
    """Compile (if needed) and run `source` on every test, in the calling thread. Never raises for anything a
    program does: a failure of the judge itself on this job is logged and returned as JE (`judge_error`)."""
    lease = lease_uids(1) if uid is None else None
    try:
        uid = lease.uids[0] if lease else uid
        mode = isolation_mode(uid) if mode is None else mode
        sandbox = Sandbox(mode, uid, cgroups)
        job = prepare(source, language, tests, time_limit_s, memory_limit_mb, float_tolerance, checker,
                      cxx_flags, sandbox=sandbox, processes=processes)
        if isinstance(job, JudgeResult):
            return job
        boxes: dict[int, WorkerSandbox] = {}
        try:
            return job.own(Worker(sandbox, boxes))
        finally:
            for box in boxes.values():
                box.close()
    except Exception as e:  # noqa: BLE001 -- one job must never stop a training run
        return judge_error(e, len(tests))
    finally:
        if lease:
            lease.release()


def judge_error(e: Exception | str, total: int) -> JudgeResult:
    """The result of a job the judge could not judge: JE, no test counted, the cause in the message (a JobRefused
    one starts with REFUSED)."""
    if isinstance(e, JobRefused):
        log.warning("a job was refused: %s", e)
        return JudgeResult(JUDGE_ERROR, 0, total, message=f"{REFUSED}{e}"[:MESSAGE_LIMIT])
    if isinstance(e, Exception):
        log.error("judge error on one job", exc_info=e)
        e = f"{type(e).__name__}: {e}"
    return JudgeResult(JUDGE_ERROR, 0, total, message=f"judge error: {e}"[:MESSAGE_LIMIT])


def is_refusal(res: JudgeResult) -> bool:
    """A judge error caused by the job itself (JobRefused, or processes the strict judge cannot hold), not by a
    fault of the judge: any judge would answer the same."""
    return res.verdict == JUDGE_ERROR and res.message.startswith(REFUSED)


class Job:
    """A prepared program whose tests any worker may run, taken in index order (`take`, `run`); whoever runs
    the last one `finish`es it. Outcomes are kept by index: `finish` gives the sequential judge's result
    whatever order they arrived in."""

    def __init__(self, root: Path, tests: list[dict], argv: list[str], files: dict[str, Path], time_limit_s: float,
                 memory_mb: int, float_tolerance: float | None, checker: dict | None, compile_s: float,
                 forks: bool = False, checker_run: tuple[list[str], str, Path] | None = None):
        self.root, self.tests, self.argv, self.files = root, tests, argv, files
        self.time_limit_s, self.memory_mb, self.float_tolerance, self.checker = \
            time_limit_s, memory_mb, float_tolerance, checker
        self.compile_s, self.forks = compile_s, forks
        self.checker_run = checker_run  # the checker's (argv, file name in /work, host file), from `prepare`
        self.outcomes: dict[int, tuple[dict, str] | Exception] = {}  # test index -> (result, stderr) or error
        self._cond = threading.Condition()
        self._next = 0            # the next test to hand out
        self._in_flight = 0       # tests handed out and not yet recorded: they use the run folder
        self._stopped = False     # a TLE, a judge error or the owner finishing: later tests would not count
        self._finished = False    # complete() said so: somebody finishes it

    def left(self) -> int:
        """Tests not handed out yet (0 once stopped)."""
        with self._cond:
            return 0 if self._stopped else len(self.tests) - self._next

    def take(self) -> int | None:
        """The next test's index for the caller to `run`, or None once all are taken or the job has stopped."""
        with self._cond:
            if self._stopped or self._next == len(self.tests):
                return None
            self._next += 1
            self._in_flight += 1
            return self._next - 1

    def run(self, i: int, worker: Worker) -> bool:
        """Run taken test `i` as the calling worker and record its outcome; True for exactly one call, the one
        after which no test is left to take or in flight (its caller `finish`es the job). Never raises an
        Exception: a judge error is recorded for `finish` to report, and the test is never left counted as in
        flight, so nobody waits forever on a thread that died."""
        outcome: tuple[dict, str] | Exception = RuntimeError(f"test {i} was interrupted")
        try:
            outcome = _run_test(self, i, worker)
        except Exception as e:  # noqa: BLE001 -- becomes this job's verdict in finish
            outcome = e
        finally:
            with self._cond:
                self.outcomes[i] = outcome
                if isinstance(outcome, Exception) or outcome[0]["verdict"] in ("TLE", "CE"):
                    self._stopped = True  # the sequential judge stops here: save the cores
                self._in_flight -= 1
                self._cond.notify_all()
        return self.complete()

    def complete(self) -> bool:
        """True once, when no test is left to hand out and none is in flight (a job with no tests: at once)."""
        with self._cond:
            if self._finished or self._in_flight or not (self._stopped or self._next == len(self.tests)):
                return False
            self._finished = True
            return True

    def own(self, worker: Worker) -> JudgeResult:
        """Run its tests in the calling thread until none is left to take, then its result (after any tests
        other threads took have ended)."""
        while (i := self.take()) is not None:
            self.run(i, worker)
        return finish(self)

    def wait_idle(self) -> None:
        """Hand out no more tests and wait until none is in flight."""
        with self._cond:
            self._stopped = True
            self._cond.wait_for(lambda: self._in_flight == 0)


def prepare(source: str, language: str, tests: list[dict], time_limit_s: float = 2.0, memory_limit_mb: int = 256,
             float_tolerance: float | None = None, checker: dict | None = None,
             cxx_flags: tuple[str, ...] = CXX_FLAGS, *, sandbox: Sandbox,
             processes: bool = False) -> JudgeResult | Job:
    """Compile `source` (C++; a Python source is syntax-checked in its first test's run) and make its run folder: a
    job ready to run, or its result (CE). Raises for a judge error: CompileFault (the compiler did not finish),
    JobRefused (a C++ checker that does not compile).
    `processes`: the problem needs new processes (fork, subprocess); by default a program is one process (its
    threads included), so that no child can hide its CPU time or hold an address space of its own."""
    language = LANGUAGES[language]
    root = job_folder("run")  # 0700: host-side files of this job
    own = root / ".job"  # the program and checker: root's alone even where root/ is 0711 ("uid" mode)
    try:
        own.mkdir(mode=0o700)
        if sandbox.mode == "uid":
            os.chmod(root, 0o711)  # each test's work folder (0700, the uid running it) is inside
        compile_s = 0.0
        if language == "cpp":
            # the job's own link to its binary: the cache may evict it while the tests run
            binary, message, compile_s = compile_cpp(source, tuple(cxx_flags), sandbox, keep=own / "main")
            if binary is None:
                remove_tree(root)
                return JudgeResult("CE", 0, len(tests), message=message[:MESSAGE_LIMIT], compile_s=compile_s)
            if binary.stat().st_size > memory_limit_mb << 20:  # could never be loaded: not worth staging
                remove_tree(root)
                return JudgeResult("MLE", 0, len(tests), message="the binary is larger than the memory limit",
                                   compile_s=compile_s)
            argv, files = ["./main"], {"main": binary}
        else:
            if len(source) > PYTHON_SOURCE_LIMIT:
                remove_tree(root)
                return JudgeResult("CE", 0, len(tests), message=f"source over {PYTHON_SOURCE_LIMIT} characters")
            (own / "main.py").write_text(source)
            # -I (no user site, no environment), not -S: site defines exit() and quit(), which solutions call;
            # the wrapper compiles main.py first: a syntax error is CE at the first test (python_check.py)
            argv, files = PYTHON_ARGV, {"main.py": own / "main.py"}
        checker_run = prepare_checker(checker, own, sandbox, CXX_FLAGS) if checker else None
        return Job(root, tests, argv, files, time_limit_s, memory_limit_mb, float_tolerance, checker, compile_s,
                   forks=processes, checker_run=checker_run)
    except BaseException:
        remove_tree(root)
        raise


class Worker:
    """A worker: where its programs run (`sandbox`: the mode, its uid, its cgroups) and, in "namespaces" mode,
    the sandbox it keeps open (worker_sandbox.py: `WorkerSandbox`), kept in `boxes` (uid -> sandbox) by whoever
    holds the uid (a Judge: for its life) and made on first use, or again after a test past its wall limit ended
    it. Its tests' cgroup ("u<uid>-tests") is that sandbox's alone."""

    def __init__(self, sandbox: Sandbox, boxes: dict[int, WorkerSandbox]):
        self.sandbox, self.uid, self.cgroups, self.boxes = sandbox, sandbox.uid, sandbox.cgroups, boxes

    def box(self) -> WorkerSandbox:
        box = self.boxes.get(self.uid)
        if box is None or not box.alive:
            cgroup = None
            if self.cgroups is not None:
                try:
                    cgroup = self.cgroups.run(f"u{self.uid}-tests")
                except OSError as e:
                    log.warning("no cgroup for this worker's tests (%s): rlimits only", e)
            box = self.boxes[self.uid] = WorkerSandbox(self.uid, cgroup)
        return box

    def done_with_job(self) -> None:
        """This worker takes no more tests of the job it ran: its staged file goes (worker_sandbox.py)."""
        box = self.boxes.get(self.uid)
        if box is not None and box.alive:
            box.unstage()


def _run_test(job: Job, i: int, worker: Worker) -> tuple[dict, str]:
    """Test `i`'s result and its stderr (for a non-AC verdict). Its files are its own (t{i}.*, c{i}.*, the work
    folder t{i} outside namespaces), so tests of one job may run at once, each as its worker's uid."""
    root, test, sandbox = job.root, job.tests[i], worker.sandbox
    if sandbox.mode == "namespaces":
        (name, path), = job.files.items()
        r = worker.box().run(job.argv, (name, path), root, f"t{i}", test["input"],
                             time_limit_s=job.time_limit_s, memory_mb=job.memory_mb, forks=job.forks)
    else:
        r = sandbox.run(job.argv, root, f"t{i}", time_limit_s=job.time_limit_s, memory_mb=job.memory_mb,
                        stdin=test["input"], files=job.files, forks=job.forks, create_files=False)
    # a kept output is returned for the caller to compare: a cut of it could compare equal where the whole would
    # not, so past what is returned the test is OLE
    v = _classify(r, job.time_limit_s, job.memory_mb, KEPT_OUTPUT_BYTES if test.get("keep_output") else
                  OUTPUT_LIMIT_BYTES)
    error = syntax_error(r["returncode"], r["err"]) if v in ("RE", "MLE") and job.argv is PYTHON_ARGV \
        else None
    if error is not None:
        v = "CE"
    if v is None:
        ok = run_checker(job.checker_run, test, r["out"], root, i, sandbox, time_limit_s=job.time_limit_s,
                         memory_mb=job.memory_mb, forks=job.forks) if job.checker else \
            output_file_matches(r["out"], test["output"], job.float_tolerance)
        v = "AC" if ok else "WA"
    result = {"verdict": v, "time_s": round(r["cpu_s"], 4), "wall_s": round(r["wall_s"], 4),
              "memory_mb": None if r["max_rss_mb"] is None else round(r["max_rss_mb"], 1)}
    message = error if error is not None else tail(r["err"]) if v != "AC" else ""
    if test.get("keep_output"):  # the SandboxFusion endpoint reports the run itself (minirl/judge/server.py)
        result.update(stdout=tail(r["out"], KEPT_OUTPUT_BYTES), stderr=tail(r["err"], KEPT_OUTPUT_BYTES),
                      returncode=r["returncode"])
    for name in (f"t{i}.out", f"t{i}.err"):
        (root / name).unlink(missing_ok=True)
    return result, message


def finish(job: Job) -> JudgeResult:
    """Wait for the job's tests in flight, then its result as the sequential judge gives it: tests count in
    index order up to the first TLE (any later ones that ran beside it are dropped); a judge error in a counted
    test raises. Removes the run folder."""
    try:
        job.wait_idle()
        results, passed, verdict, message = [], 0, "AC", ""
        for i in range(len(job.tests)):
            if i not in job.outcomes:  # never taken: the job stopped before it
                break
            outcome = job.outcomes[i]
            if isinstance(outcome, Exception):
                raise outcome
            result, err = outcome
            if result["verdict"] == "CE":  # the wrapper's syntax check: the job is CE, no test counts
                return JudgeResult("CE", 0, len(job.tests), message=err[:MESSAGE_LIMIT], compile_s=job.compile_s)
            results.append(result)
            if result["verdict"] == "AC":
                passed += 1
            elif verdict == "AC":
                verdict, message = result["verdict"], err
            if result["verdict"] == "TLE":
                break
        return JudgeResult(verdict, passed, len(job.tests), results, message, job.compile_s)
    finally:
        remove_tree(job.root)

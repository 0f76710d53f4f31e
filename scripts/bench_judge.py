"""Benchmark minirl's judge against a naive judge on real submissions (a training step's worth of programs).

    python scripts/bench_judge.py [--problems 8] [--tests 10] [--workers N]
    python scripts/bench_judge.py --backend remote|ray     # that backend against a local Judge, same batch

Submissions: for each ICPC problem (../shared/data/code/icpc_kattis_problems.jsonl) with a token-diff checker
and a known time limit, its jury AC C++ solution plus two mutated copies (a changed constant: usually wrong; a
comment: right but a distinct source, so nothing is served from the compile cache), and the same for Python.
Both judges get the same batch, one after the other, in one run:
- naive: compile each C++ sample with g++ -O2 and no precompiled header, run its tests one by one, no pool.
  Like minirl it runs every test up to the first TLE, because CodeFu's reward (the one the issue compares
  with: the pass ratio of the tests, 0 on a TLE; codefu-7b-v0.1's model card, "Reward") needs the count of
  passed tests, not just the first failure;
- minirl: `Judge.run_many` (compile once per unique source against a precompiled <bits/stdc++.h>, sandboxed
  runs, programs in parallel). Its binary cache starts empty; the PCH is built before timing (once per flag
  set and machine, as in training).
Prints programs/s for both, the ratio, the agreement of the results (verdict and tests passed), and minirl's
fraction of the limit: the busy time it needs (sum of compile-with-PCH and of test run times) divided by cores x
wall time. 100% would mean every core judged all the time with zero overhead. The CPU-seconds the whole machine
spent on each judge (/proc/stat, so kernel work and the judges' own processes count too; run nothing else beside
it) are printed too. Last, the sandbox's per-test overhead: the wall time per test of a C++ program that does
nothing (one worker, binary cached, so it is all judge and sandbox: per test a fork, namespaces, a fresh /work and
/tmp, seccomp, exec, kill-and-reap, the cgroup's counters and the output comparison), with cgroups and without.

--backend remote|ray (`bench_backend`) measures the way out of one host instead, on this host: the same batch on
a local `Judge`, then on `python -m minirl.judge.server` through `RemoteJudge`, or on a one-node Ray cluster
through `RayJudge`, each with --workers workers and warm caches (a first untimed pass compiles), so the
difference is the transport: reported per program, on the batch and on a batch of trivial programs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"
CORES = len(os.sched_getaffinity(0))


def machine_cpu_s() -> float:
    """CPU-seconds the machine has spent (all cores; not idle, not waiting for I/O): minirl's sandboxes live as
    long as its Judge, so their children's rusage would come too late."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def mutate(code: str, rng: random.Random) -> str:
    """Change one small integer constant (usually makes the program wrong)."""
    spots = [m for m in re.finditer(r"(?<![\w.])([1-9])(?![\w.])", code)]
    if not spots:
        return code + "\n// mutated\n"
    m = rng.choice(spots)
    return code[:m.start()] + str(int(m.group(1)) + 1) + code[m.end():]


def build_batch(n_problems: int, n_tests: int) -> list[dict]:
    path = ROOT.parent / "shared" / "data" / "code" / "icpc_kattis_problems.jsonl"
    rows = [json.loads(line) for line in path.open()]
    rng = random.Random(0)
    jobs = []
    usable = [r for r in rows if r["validation"] == "default" and r["time_limit_seconds"] and not r["validator_flags"]]
    for row in usable[:n_problems]:
        tests = [t for t in row["tests"] if t["group"] == "secret"][:n_tests]
        for lang, key in (("cpp", "cpp"), ("python", "python3")):
            sol = next((s for s in row["solutions"] if s["verdict"] == "AC" and s["language"] == key), None)
            if sol is None:
                continue
            copy = sol["code"] + ("\n// copy\n" if lang == "cpp" else "\n# copy\n")
            for src in (sol["code"], mutate(sol["code"], rng), copy):
                jobs.append(dict(source=src, language=lang, tests=tests, time_limit_s=2 * row["time_limit_seconds"],
                                 memory_limit_mb=1024))
    return jobs


NAIVE_COMPILE_S = [0.0]  # the naive judge's time in g++, summed


def naive_judge(job: dict) -> tuple[str, int]:
    """Compile per sample (no PCH), run tests sequentially up to the first TLE, no sandbox: the baseline.
    Returns (verdict: the first non-AC test's, tests passed)."""
    work = Path(tempfile.mkdtemp(prefix="naive-"))
    try:
        if job["language"] == "cpp":
            (work / "a.cpp").write_text(job["source"])
            t0 = time.perf_counter()
            failed = subprocess.run(["g++", "-std=c++17", "-O2", "a.cpp", "-o", "a"], cwd=work,
                                    capture_output=True).returncode
            NAIVE_COMPILE_S[0] += time.perf_counter() - t0
            if failed:
                return "CE", 0
            argv = ["./a"]
        else:
            (work / "a.py").write_text(job["source"])
            argv = [PYTHON, "a.py"]  # the interpreter minirl's judge uses, for a fair comparison
        verdict, passed = "AC", 0
        for t in job["tests"]:
            try:
                p = subprocess.run(argv, cwd=work, input=t["input"].encode(), capture_output=True,
                                   timeout=job["time_limit_s"])
            except subprocess.TimeoutExpired:
                return ("TLE" if verdict == "AC" else verdict), passed
            v = "RE" if p.returncode else "AC" if p.stdout.split() == t["output"].encode().split() else "WA"
            passed += v == "AC"
            verdict = v if verdict == "AC" else verdict
        return verdict, passed
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--tests", type=int, default=10)
    ap.add_argument("--workers", type=int, default=CORES)
    ap.add_argument("--backend", choices=["local", "remote", "ray"], default="local",
                    help="remote or ray: that backend's throughput against a local Judge's (bench_backend)")
    args = ap.parse_args()
    jobs = build_batch(args.problems, args.tests)
    if args.backend != "local":
        return bench_backend(args.backend, jobs, args.workers)
    n_cpp = sum(j["language"] == "cpp" for j in jobs)
    print(f"batch: {len(jobs)} programs ({n_cpp} C++, {len(jobs) - n_cpp} Python), "
          f"{sum(len(j['tests']) for j in jobs)} test runs, {args.workers} workers on {CORES} cores")

    langs = {"cpp": [j for j in jobs if j["language"] == "cpp"], "python": [j for j in jobs if j["language"] == "python"]}
    naive, t_naive, cpu_naive = {}, {}, {}
    for lang, batch in langs.items():
        t0, c0 = time.perf_counter(), machine_cpu_s()
        naive[lang] = [naive_judge(j) for j in batch]
        t_naive[lang], cpu_naive[lang] = time.perf_counter() - t0, machine_cpu_s() - c0

    from minirl.judge import Judge
    from minirl.judge.host import cache_dir
    from minirl.judge.sysroot import program_root
    cache = Path(tempfile.mkdtemp(prefix="bench-", dir=cache_dir()))  # an empty binary cache
    os.environ["MINIRL_JUDGE_CACHE"] = str(cache)
    results, t_minirl, cpu_minirl = {}, {}, {}
    with Judge(workers=args.workers) as judge:  # builds the PCH (not timed: once per machine and flag set)
        for uid in judge.uids if judge.isolation == "namespaces" else ():  # each worker's copy of the system
            program_root(uid)                                                # files (the same: once per machine)
        for lang, batch in langs.items():
            t0, c0 = time.perf_counter(), machine_cpu_s()
            results[lang] = judge.run_many(batch)
            t_minirl[lang], cpu_minirl[lang] = time.perf_counter() - t0, machine_cpu_s() - c0
        isolation = judge.isolation
    overhead = {label: per_test_overhead_ms(cgroups) for label, cgroups in (("cgroups", True), ("no cgroups", False))}
    shutil.rmtree(cache, ignore_errors=True)

    print(f"isolation: {isolation}")
    print("machine CPU-seconds (the speed-up a saturated host would see): " + ", ".join(
        f"{lang} naive {cpu_naive[lang]:.1f} minirl {cpu_minirl[lang]:.1f} ({cpu_naive[lang] / cpu_minirl[lang]:.1f}x)"
        for lang in langs))
    print(f"{'':8s} {'naive s':>8s} {'prog/s':>7s} {'minirl s':>9s} {'prog/s':>7s} {'ratio':>6s} {'% of limit':>10s} agree")
    for lang in list(langs) + ["all"]:
        keys = list(langs) if lang == "all" else [lang]
        n = sum(len(langs[k]) for k in keys)
        tn, tm = sum(t_naive[k] for k in keys), sum(t_minirl[k] for k in keys)
        res = [r for k in keys for r in results[k]]
        busy = sum(r.compile_s + sum(t["wall_s"] for t in r.tests) for r in res)
        agree = sum(a == (r.verdict, r.passed) for k in keys for a, r in zip(naive[k], results[k]))
        print(f"{lang:8s} {tn:8.2f} {n / tn:7.2f} {tm:9.2f} {n / tm:7.2f} {tn / tm:5.1f}x "
              f"{busy / (CORES * tm):10.0%} {agree}/{n}")
    cpp = results["cpp"]
    print(f"naive C++: {NAIVE_COMPILE_S[0]:.2f} s compiling, {t_naive['cpp'] - NAIVE_COMPILE_S[0]:.2f} s running tests")
    print(f"minirl C++: {sum(r.compile_s for r in cpp):.2f} s compiling with the PCH, "
          f"{sum(t['wall_s'] for r in cpp for t in r.tests):.2f} s running tests (core-seconds)")
    from collections import Counter
    print("minirl verdicts:", dict(Counter(r.verdict for k in langs for r in results[k])))
    print("% of limit = (sum of compile-with-PCH + test run times) / (cores x wall time)")
    print("sandbox overhead per test (empty C++ program, 1 worker): " +
          ", ".join(f"{label} {ms:.1f} ms" for label, ms in overhead.items()))


def per_test_overhead_ms(cgroups: bool, n: int = 100) -> float:
    from minirl.judge import Judge
    with Judge(workers=1, cgroups=cgroups) as judge:
        tests = [{"input": "", "output": ""}] * n
        judge.run("int main() {}\n", "cpp", tests)  # compile once
        t0 = time.perf_counter()
        res = judge.run("int main() {}\n", "cpp", tests)
        assert res.verdict == "AC", res
        return (time.perf_counter() - t0) / n * 1e3


# --- --backend remote | ray --------------------------------------------------------------------------------

def bench_backend(backend: str, jobs: list[dict], workers: int) -> None:
    """The batch, and a batch of trivial programs, on a local Judge and then on `backend`: s, programs/s,
    the ratio, the overhead per program and the agreement of the verdicts."""
    trivial = [dict(source=f"print({i})\n", language="python", tests=[{"input": "", "output": str(i)}])
               for i in range(4 * workers * 8)]
    from minirl.judge import Judge
    timed = {}
    with Judge(workers=workers) as judge:
        for name, batch in (("batch", jobs), ("trivial", trivial)):
            judge.run_many(batch)  # warm: compile caches, as in a long training run
            timed[name, "local"] = _timed(judge, batch)
    with _backend_judge(backend, workers) as judge:
        for name, batch in (("batch", jobs), ("trivial", trivial)):
            judge.run_many(batch)
            timed[name, backend] = _timed(judge, batch)
    print(f"{backend} against local, {workers} workers on {CORES} cores, warm caches")
    print(f"{'':8s} {'programs':>8s} {'local s':>8s} {'prog/s':>7s} {backend + ' s':>9s} {'prog/s':>7s} "
          f"{'ratio':>6s} {'overhead/program':>17s} agree")
    for name, batch in (("batch", jobs), ("trivial", trivial)):
        (tl, rl), (tb, rb) = timed[name, "local"], timed[name, backend]
        agree = sum((a.verdict, a.passed) == (b.verdict, b.passed) for a, b in zip(rl, rb))
        print(f"{name:8s} {len(batch):8d} {tl:8.2f} {len(batch) / tl:7.1f} {tb:9.2f} {len(batch) / tb:7.1f} "
              f"{tl / tb:5.2f}x {(tb - tl) / len(batch) * 1e3:14.1f} ms {agree}/{len(batch)}")
    from collections import Counter
    print("local verdicts on the batch:", dict(Counter(r.verdict for r in timed["batch", "local"][1])))


def _timed(judge, batch: list[dict]) -> tuple[float, list]:
    t0 = time.perf_counter()
    results = judge.run_many(batch)
    return time.perf_counter() - t0, results


class _backend_judge:
    """A RemoteJudge on a judge server started here, or a RayJudge on a one-node cluster started here."""

    def __init__(self, backend: str, workers: int):
        self.backend, self.workers, self.server = backend, workers, None

    def __enter__(self):
        if self.backend == "remote":
            from minirl.judge.remote import RemoteJudge
            self.server = subprocess.Popen([sys.executable, "-m", "minirl.judge.server",
                                            "--port", "0", "--workers", str(self.workers)],
                                           stdout=subprocess.PIPE, text=True)
            url = self.server.stdout.readline().split()[-1]
            self.judge = RemoteJudge([url], concurrency=2 * self.workers)
        else:
            # a throwaway one-node cluster: token auth with a token of its own (else Ray writes one to ~/.ray);
            # set before Ray is imported, which reads its config once
            os.environ.setdefault("RAY_AUTH_MODE", "token")
            os.environ.setdefault("RAY_AUTH_TOKEN", uuid.uuid4().hex)
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # on the loopback address only
            import ray
            from minirl.judge.ray_pool import RayJudge
            ray.init(num_cpus=self.workers, include_dashboard=False, logging_level="warning")
            self.judge = RayJudge()
        return self.judge

    def __exit__(self, *exc):
        self.judge.close()
        if self.server is not None:
            self.server.kill()
            self.server.wait()
        if self.backend == "ray":
            import ray
            ray.shutdown()


if __name__ == "__main__":
    main()

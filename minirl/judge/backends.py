"""The judge a run uses, from its config: this host's sandbox, judge servers over HTTP, or a Ray cluster.

    judge = build_judge(cfg)      # cfg.judge_backend: "local" | "remote" | "ray"; cfg.judge_urls; cfg.judge_workers
    judge.run_many(jobs); judge.close()

All three have `Judge`'s `run` / `run_many` and give its verdicts; docs/judge_backends.md says how to start
the servers or the cluster and when each pays off. Ray is imported only for the ray backend (an extra).
`JudgeFrontend` is what the two judges that send work elsewhere share: `run` as one job of `run_many`, the
check of the jobs' languages, and `with`.
"""
from __future__ import annotations

from minirl.judge import LANGUAGES, JudgeResult


def build_judge(cfg):
    """A judge for `cfg` (train.py's Config or eval.py's arguments: judge_backend, judge_urls, judge_workers,
    judge_isolation)."""
    backend = getattr(cfg, "judge_backend", "local")
    urls = [u.strip() for u in getattr(cfg, "judge_urls", "").split(",") if u.strip()]
    workers = getattr(cfg, "judge_workers", 0) or None
    if backend == "local":  # refused in a weak isolation mode unless the config accepts it
        from minirl.judge.pool import Judge, require_isolation
        return require_isolation(Judge(workers), getattr(cfg, "judge_isolation", "strict"))
    if backend == "remote":
        from minirl.judge.remote import RemoteJudge
        return RemoteJudge(urls)
    if backend == "ray":
        from minirl.judge.ray_pool import RayJudge  # Ray only here: pip install minirl[ray]
        return RayJudge(urls[0] if urls else None, workers_per_node=workers or 0)
    raise ValueError(f"judge_backend must be 'local', 'remote' or 'ray', got {backend!r}")


class JudgeFrontend:
    """`Judge`'s interface for a judge whose `run_many` sends the work elsewhere (RemoteJudge, RayJudge)."""

    def run(self, source: str, language: str, tests: list[dict], time_limit_s: float = 2.0,
            memory_limit_mb: int = 256, float_tolerance: float | None = None) -> JudgeResult:
        return self.run_many([dict(source=source, language=language, tests=tests, time_limit_s=time_limit_s,
                                   memory_limit_mb=memory_limit_mb, float_tolerance=float_tolerance)])[0]

    def run_many(self, jobs: list[dict]) -> list[JudgeResult]:
        raise NotImplementedError

    @staticmethod
    def check(jobs: list[dict]) -> None:
        """What a local Judge refuses, refused here before anything is sent."""
        for job in jobs:
            if job["language"] not in LANGUAGES:
                raise ValueError(f"unsupported language {job['language']!r}; use 'cpp' or 'python'")
            if job.get("checker"):
                raise ValueError("special checkers are judged by a local Judge only (judge_backend: local)")

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def judge_error(message: str, total: int) -> JudgeResult:
    """The verdict of a job that no judge could take (every server down, no node alive): RE, never raised."""
    return JudgeResult("RE", 0, total, message=f"judge error: {message}"[:2000])

"""What the two judges that send work elsewhere (RemoteJudge, RayJudge) share with the local `Judge`: `run` as
one job of `run_many`, the check of the jobs' languages, and `with`."""
from __future__ import annotations

from minirl.judge.verdict import LANGUAGES, JudgeResult, judge_error


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

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def unjudged(message: str, total: int) -> JudgeResult:
    """The result of a job that no judge could take (every server down, no node alive): JE, "judge error", with
    no test counted (verdict.judge_error); never raised, and never a verdict on the program."""
    return judge_error(message, total)

"""The judge a run uses, from its config: this host's sandbox, judge servers over HTTP, or a Ray cluster.

    judge = build_judge(cfg)      # cfg.judge_backend: "local" | "remote" | "ray"; cfg.judge_urls; cfg.judge_workers
    judge.run_many(jobs); judge.close()

All three have `Judge`'s `run` / `run_many` and give its verdicts; docs/judge_backends.md says how to start
the servers or the cluster and when each pays off. Ray is imported only for the ray backend (an extra).
"""
from __future__ import annotations


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
        return RayJudge(urls[0] if urls else None, workers_per_node=workers or 0,
                        isolation=getattr(cfg, "judge_isolation", "strict"))
    raise ValueError(f"judge_backend must be 'local', 'remote' or 'ray', got {backend!r}")

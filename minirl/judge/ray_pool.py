"""Judging across a Ray cluster: one `Judge` per alive node, batches sent as chunks of programs.

    ray start --head --port 6379                  # the head node (where train.py runs)
    ray start --address HEAD_IP:6379              # every other node (same minirl and Python installed)
    python train.py --judge_backend ray           # joins the cluster `ray start` made on this node

    judge = RayJudge()                            # or RayJudge("HEAD_IP:6379")
    judge.run_many([dict(source=..., language="cpp", tests=[...]), ...])   # Judge's interface and verdicts

How: an actor `NodeJudge` per alive node, pinned there (NodeAffinitySchedulingStrategy, soft=False), holding
a `Judge` with one worker per CPU of the node. `run_many` cuts the batch into chunks of whole programs (never
one test per task: a Ray round trip costs about one test run) and keeps at most `in_flight` chunks per node
(the actor runs that many at once, so a node never idles between chunks and never holds the whole batch).
Results come back in the order of `jobs`.

A node that dies: its chunks fail (ActorDiedError and friends, once Ray's health checks mark the node dead:
~13 s by default, ~3 s with `health_check_period_ms` / `health_check_failure_threshold` tuned) and are sent
to the survivors; judging is pure, so running a program twice is safe. Resubmitting here, and not with
Ray's `max_restarts` / `max_task_retries`, because those race when a node dies: a restarted actor may land
on a node that already has a judge, so two judges would share its cores. Our actors never restart
(max_restarts=0); a new one is made only for a node with none alive, when `run_many` finds nodes that
joined. A chunk that fails `max_attempts` times, or a batch with no node left, gets judge-error verdicts
(RE, "judge error: ..."), never an exception.

Ray is optional (`pip install minirl[ray]`); this file is the only one that imports it. Security: a Ray
cluster runs any code a connected client sends; Ray's token auth (RAY_AUTH_MODE=token and the same
RAY_AUTH_TOKEN on every node and on the driver) keeps other clients out (docs/judge_backends.md).
"""
from __future__ import annotations

import logging
import math
from collections import deque

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from minirl.judge import Judge, JudgeResult
from minirl.judge.frontend import JudgeFrontend, unjudged
from minirl.judge.pool import require_isolation

log = logging.getLogger(__name__)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class NodeJudge:
    """One node's judge. num_cpus=0: its programs run in the Judge's sandboxes on the node's cores, which
    its workers count; reserving a Ray CPU would only keep the node's other tasks out."""

    def __init__(self, workers: int, isolation: str):
        self.judge = require_isolation(Judge(workers=workers), isolation)  # a weak node refuses, as train.py

    def ready(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run_many(self, jobs: list[dict]) -> list[dict]:
        return [r.to_dict() for r in self.judge.run_many(jobs)]

    def close(self) -> None:
        self.judge.close()


class RayJudge(JudgeFrontend):
    """`Judge`'s interface on every alive node of a Ray cluster; one per training run."""

    def __init__(self, address: str | None = None, workers_per_node: int = 0, chunk_size: int = 0,
                 in_flight: int = 2, max_attempts: int = 3, poll_s: float = 1.0, isolation: str = "strict"):
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:  # no address: RAY_ADDRESS, else the cluster `ray start` made here, else a new one
            ray.init(address=address or None, include_dashboard=False, logging_level=logging.WARNING)
        self.workers_per_node, self.chunk_size = workers_per_node, chunk_size
        self.in_flight, self.max_attempts, self.poll_s, self.isolation = in_flight, max_attempts, poll_s, isolation
        self._actors: dict[str, ray.actor.ActorHandle] = {}  # node id -> its judge
        self._workers: dict[str, int] = {}                   # node id -> its judge's workers
        self._error = "the cluster has no alive node"
        if not self.sync_nodes():
            self.close()
            raise RuntimeError(f"no node of the Ray cluster could start a judge: {self._error}")
        self.workers = sum(self._workers.values())

    def sync_nodes(self) -> list[str]:
        """A judge on every alive node that has none; forget those of dead nodes. Returns the node ids."""
        alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        for node_id in list(self._actors):
            if node_id not in alive:
                del self._actors[node_id]
        new = {}
        for node_id, node in alive.items():
            if node_id not in self._actors:
                workers = self.workers_per_node or max(1, int(node["Resources"].get("CPU", 1)))
                new[node_id] = NodeJudge.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    max_concurrency=self.in_flight).remote(workers, self.isolation)
                self._workers[node_id] = workers
        for node_id, actor in new.items():
            try:
                ray.get(actor.ready.remote(), timeout=120)
                self._actors[node_id] = actor
            except RayError as e:  # the node went away while its judge started
                log.warning("no judge on node %s: %s", node_id[:8], e)
                self._error = str(e)[-500:]
                ray.kill(actor)
        self._workers = {k: v for k, v in self._workers.items() if k in self._actors}
        return list(self._actors)

    def run_many(self, jobs: list[dict]) -> list[JudgeResult]:
        """Judge many programs on the cluster's nodes; results in the order of `jobs`."""
        self.check(jobs)
        results: list[JudgeResult | None] = [None] * len(jobs)
        nodes = self.sync_nodes() if jobs else []
        size = self.chunk_size or max(1, math.ceil(len(jobs) / (4 * max(1, len(nodes)))))
        pending = deque((start, 0) for start in range(0, len(jobs), size))  # (first job, failed attempts)
        running: dict[ray.ObjectRef, tuple[str, int, int]] = {}             # ref -> (node, first job, attempts)
        while pending or running:
            self._dispatch(jobs, size, pending, running)
            if not running:  # no judge alive: maybe nodes joined since
                if self.sync_nodes():
                    continue
                for start, _ in pending:
                    for k in range(start, min(start + size, len(jobs))):
                        results[k] = unjudged("no Ray node with a judge is alive", len(jobs[k]["tests"]))
                break
            done, _ = ray.wait(list(running), num_returns=1, timeout=self.poll_s)
            for ref in done:
                node_id, start, attempts = running.pop(ref)
                chunk = jobs[start:start + size]
                try:
                    results[start:start + len(chunk)] = [JudgeResult(**d) for d in ray.get(ref)]
                except RayTaskError as e:  # Judge.run_many raised: a bug in the judge, not a lost node
                    log.error("a node's judge failed on a chunk", exc_info=e)
                    results[start:start + len(chunk)] = [unjudged(str(e)[:300], len(j["tests"])) for j in chunk]
                except RayError as e:  # the node or its judge is gone: the chunk goes to a survivor
                    log.warning("judge on node %s lost (%s); resending its chunk", node_id[:8], type(e).__name__)
                    self._actors.pop(node_id, None)
                    if attempts + 1 < self.max_attempts:
                        pending.appendleft((start, attempts + 1))
                    else:
                        results[start:start + len(chunk)] = [
                            unjudged(f"chunk lost {attempts + 1} times ({type(e).__name__})", len(j["tests"]))
                            for j in chunk]
        return results

    def _dispatch(self, jobs: list[dict], size: int, pending: deque, running: dict) -> None:
        """Send pending chunks to nodes with fewer than `in_flight` running, the least loaded first."""
        load = {node_id: 0 for node_id in self._actors}
        for node_id, _, _ in running.values():
            if node_id in load:
                load[node_id] += 1
        while pending and load:
            node_id = min(load, key=load.get)
            if load[node_id] >= self.in_flight:
                return
            start, attempts = pending.popleft()
            running[self._actors[node_id].run_many.remote(jobs[start:start + size])] = (node_id, start, attempts)
            load[node_id] += 1

    def close(self) -> None:
        """Close every node's judge (its sandboxes and uid leases), then leave the cluster if we joined it."""
        actors = list(self._actors.values())
        try:
            ray.get([a.close.remote() for a in actors], timeout=60)
        except RayError as e:
            log.warning("a node's judge did not close cleanly: %s", e)
        for a in actors:
            ray.kill(a)
        self._actors.clear()
        if self._owns_ray:
            ray.shutdown()

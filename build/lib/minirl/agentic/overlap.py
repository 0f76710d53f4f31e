"""Sampling ahead of the trainer, at most k policy versions ahead: rollout workers that keep sampling and
scoring groups while the trainer steps.

    pool = RolloutPool(run_group, groups_per_step=B, max_steps_off_policy=k, num_workers=N)
    group = pool.next_group()            # the trainer takes groups in the order they were started
    pool.discard(group, requeue=True)    # too stale: its problem is sampled again, and trained later
    pool.set_policy(version)             # after each optim_step: workers may start groups up to version + k

Each group remembers the policy version that sampled it (its first turn). The throttle: a worker starts a
group only while the groups started (less those discarded) are fewer than (version + k + 1) * B, so the groups
of step s come from weights at least s - k steps old; the trainer still checks each group (a requeued problem
shifts later groups one ticket back) and discards the ones more than k versions old.

Reproducibility: groups are numbered (tickets) in the order they are started, the trainer takes them in ticket
order, and a group's samples are seeded by its ticket (SamplingParams.seed), so which thread sampled it, and
when, does not change it. With k = 0 no group is ever stale, and N workers reproduce the synchronous loop
(N = 0: each group sampled in the trainer's thread when it is needed) exactly.

Why threads: the workers spend their time waiting, on the session's worker (the model) and on the judge's
sandboxed processes; the model itself still runs one operation at a time, in the session's call order.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Group:
    ticket: int                 # start order: the trainer takes groups in this order
    problem: dict
    episodes: list              # minirl.agentic.episodes.Episode
    policy_version: int         # of the weights that sampled the first turn (the oldest tokens in the group)


class RolloutPool:
    """`num_workers` threads running `run_group(problem, seed) -> (episodes, policy_version)` ahead of the
    trainer; `next_problem()` gives the problem stream. With num_workers 0 nothing runs ahead."""

    def __init__(self, run_group: Callable[[dict, int], tuple[list, int]], next_problem: Callable[[], dict],
                 groups_per_step: int, max_steps_off_policy: int = 0, num_workers: int = 0, seed: int = 0):
        self.run_group, self.next_problem, self.seed = run_group, next_problem, seed
        self.B, self.k = groups_per_step, max_steps_off_policy
        self.version = 0                       # trainer's optimizer steps so far
        self.started = self.discarded = 0     # tickets handed out; tickets discarded (requeued or dropped)
        self.requeued: deque[dict] = deque()   # problems to sample again, before new ones
        self.finished: dict[int, Group] = {}   # ticket -> group, waiting for the trainer
        self.next_ticket, self.errors, self.stopped = 0, [], False
        self.running = 0                      # groups being sampled now: after an error, their groups still count
        self._cv = threading.Condition()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"minirl-rollout-{i}")
                         for i in range(num_workers)]  # started by the first next_group

    # -- the workers
    def _may_start(self) -> bool:
        return self.started - self.discarded < (self.version + self.k + 1) * self.B

    def _take(self) -> tuple[int, dict]:
        ticket, self.started = self.started, self.started + 1
        return ticket, self.requeued.popleft() if self.requeued else self.next_problem()

    def _run(self, ticket: int, problem: dict) -> Group:
        episodes, version = self.run_group(problem, self.seed * 1_000_003 + ticket)
        return Group(ticket, problem, episodes, version)

    def _work(self) -> None:
        """Start groups while the throttle allows. Any exception (in the problem stream, in run_group) is kept
        for the trainer, whose next_group raises it, and stops every worker: nothing waits on a dead thread."""
        running = False
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self.stopped or self.errors or self._may_start())
                    if self.stopped or self.errors:
                        return
                    ticket, problem = self._take()
                    self.running, running = self.running + 1, True
                group = self._run(ticket, problem)
                with self._cv:
                    self.finished[ticket] = group
                    self.running, running = self.running - 1, False
                    self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001  (raised again in the trainer's thread by next_group)
            with self._cv:
                self.errors.append(e)
                self.running -= running
                self._cv.notify_all()

    # -- the trainer
    def next_group(self) -> Group:
        """The next group in ticket order (sampled now, in this thread, when there are no workers)."""
        if not self._threads:
            with self._cv:
                ticket, problem = self._take()
            return self._run(ticket, problem)
        with self._cv:
            if not self._threads[0].is_alive() and self.started == 0:
                for t in self._threads:
                    t.start()
            # after an error, groups still being sampled may finish: every group before the error is handed over
            self._cv.wait_for(lambda: self.next_ticket in self.finished or (self.errors and not self.running))
            if self.next_ticket not in self.finished:  # the run ends with a worker's own error and traceback
                raise self.errors[0]
            self.next_ticket += 1
            return self.finished.pop(self.next_ticket - 1)

    def fresh_groups(self, step: int, stale_policy: str = "requeue"):
        """Yield the B groups step `step` trains (trainer at policy version `step`), each as soon as it is ready
        (so its forward_backward can start while later groups are still sampled). A group more than k versions
        old is requeued or dropped instead. Counts go to self.stats."""
        self.stats = {"staleness": [], "requeued": 0, "dropped": 0}
        yielded = 0
        while yielded < self.B:
            group = self.next_group()
            staleness = step - group.policy_version
            if staleness > self.k:
                self.discard(group, requeue=stale_policy == "requeue")
                self.stats["requeued" if stale_policy == "requeue" else "dropped"] += 1
                continue
            self.stats["staleness"].append(staleness)
            yielded += 1
            yield group

    def discard(self, group: Group, requeue: bool) -> None:
        """A group too stale to train: drop it, or put its problem back to be sampled again (and trained later)."""
        with self._cv:
            self.discarded += 1
            if requeue:
                self.requeued.append(group.problem)
            self._cv.notify_all()

    def set_policy(self, version: int) -> None:
        with self._cv:
            self.version = version
            self._cv.notify_all()

    @property
    def queue_depth(self) -> int:
        """Groups finished and waiting for the trainer."""
        with self._cv:
            return len(self.finished)

    def close(self) -> None:
        with self._cv:
            self.stopped = True
            self._cv.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join()

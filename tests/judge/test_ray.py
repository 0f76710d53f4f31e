"""RayJudge on a 2-node Ray cluster on this host: a local Judge's verdicts, through the death of a node."""
import threading

import pytest

from judge_programs import AB, PROGRAMS, eval_verdicts, jobs, summary, train_verdicts
from judge_programs import local_eval, local_train, local_verdicts  # noqa: F401 -- fixtures

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from minirl.judge.ray_pool import RayJudge  # noqa: E402

# node death seen in ~1.5 s instead of Ray's default ~13 s (a missed check every 0.5 s, 3 in a row)
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 0, "health_check_timeout_ms": 500}


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node of 1 CPU each, shared by this file's tests (Ray starts slowly); the last
    test kills the worker."""
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False,
                                                           _system_config=HEALTH_CHECKS))
    worker = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, logging_level="warning")
    try:
        yield c, worker
    finally:
        ray.shutdown()
        c.shutdown()


def test_ray_judge_gives_the_local_judges_verdicts_from_both_nodes(cluster, local_verdicts):
    with RayJudge(chunk_size=2) as judge:
        assert len(judge.sync_nodes()) == 2 and judge.workers == 2  # a judge of 1 worker on each node
        nodes = {ray.get(a.ready.remote()) for a in judge._actors.values()}
        assert len(nodes) == 2  # pinned: one judge per node, never two on one
        assert summary(judge.run_many(jobs())) == local_verdicts
    assert [v for v, _, _ in local_verdicts] == [p[3] for p in PROGRAMS]


def test_train_py_with_the_ray_judge_gets_the_local_rewards(cluster, local_train, tmp_path, tiny_path, monkeypatch):
    assert train_verdicts(tmp_path, tiny_path, monkeypatch, "--judge_backend", "ray") == local_train


def test_eval_py_with_the_ray_judge_gets_the_local_scores(cluster, local_eval, tmp_path, tiny_path, monkeypatch):
    assert eval_verdicts(tmp_path, tiny_path, monkeypatch, "--judge_backend", "ray") == local_eval


def test_a_node_killed_mid_batch_leaves_its_chunks_to_the_survivor(cluster, caplog):
    c, worker = cluster
    slow = "import time\ntime.sleep(0.4)\na, b = map(int, input().split())\nprint(a + b)\n"
    batch = [dict(source=slow, language="python", tests=AB[:1], time_limit_s=2.0) for _ in range(16)]
    with RayJudge(chunk_size=2) as judge:
        assert len(judge.sync_nodes()) == 2
        killer = threading.Timer(1.5, c.remove_node, (worker,), {"allow_graceful": False})
        killer.start()
        results = judge.run_many(batch)
        killer.join()
        assert len(judge.sync_nodes()) == 1  # the worker's judge is gone, and no second one on the head
    assert summary(results) == [("AC", 1, 1)] * 16
    assert "resending its chunk" in caplog.text  # the node died with chunks in flight

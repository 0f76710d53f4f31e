"""Fixtures of the judge's backend tests (tests/judge/test_remote.py, test_ray.py)."""
import pytest

from judge_programs import eval_verdicts, jobs, summary, train_verdicts
from minirl.judge import Judge


@pytest.fixture(scope="session")
def local_train(tmp_path_factory, tiny_path):
    """train.py's verdicts and rewards with the local judge, computed once for the remote and Ray tests."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return train_verdicts(tmp_path_factory.mktemp("local"), tiny_path, monkeypatch)


@pytest.fixture(scope="session")
def local_verdicts():
    """A local Judge's (verdict, passed, total) on the fixed programs: what every backend must give."""
    with Judge(workers=2) as judge:
        return summary(judge.run_many(jobs()))


@pytest.fixture(scope="session")
def local_eval(tmp_path_factory, tiny_path):
    """eval.py's verdicts and summary with the local judge."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return eval_verdicts(tmp_path_factory.mktemp("local_eval"), tiny_path, monkeypatch)

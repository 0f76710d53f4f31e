"""A row's special checker (ground truth `checker`: {"source", "language"}) reaches the judge from every path:
the scorer's request, the local pool, minirl's judge server through RemoteJudge, and the preparation script keeps
the problems that carry one. The problem: print any divisor of n greater than 1 (several right answers)."""
import json
import sys

from conftest import ROOT
from minirl.judge import Judge
from minirl.rewards import Scorer, judge_request

CHECKER = {"language": "python", "source": (
    "import sys\nn = int(open(sys.argv[1]).read())\nout = open(sys.argv[3]).read().split()\n"
    "sys.exit(0 if len(out) == 1 and out[0].isdigit() and 1 < int(out[0]) <= n and n % int(out[0]) == 0 else 1)\n")}
TRUTH = {"language": "python", "tests": [{"input": "12\n", "output": "2"}], "checker": CHECKER}
ROW = {"data_source": "toy_code", "ability": "code", "reward_model": {"ground_truth": json.dumps(TRUTH)}}
# 12 % 3 == 0: right, though the expected output says 2; 5 does not divide 12
ANSWERS = ["```python\nprint(3)\n```", "```python\nprint(5)\n```"]


def test_the_rows_checker_is_in_the_judge_request_and_decides_the_local_verdict():
    assert judge_request("print(3)", TRUTH)["checker"] == CHECKER
    with Judge(workers=1) as judge:
        details = Scorer(judge).details(ANSWERS, [ROW, ROW])
    assert [d["verdict"] for d in details] == ["AC", "WA"]  # before: the checker was dropped, 3 was WA


def test_the_checker_reaches_minirls_judge_server_through_remote_judge():
    from test_remote import start_server, stop
    from minirl.judge.remote import RemoteJudge
    proc, url = start_server()
    try:
        with RemoteJudge([url]) as judge:
            details = Scorer(judge).details(ANSWERS, [ROW, ROW])
    finally:
        stop(proc)
    assert [d["verdict"] for d in details] == ["AC", "WA"]  # before: refused ("local Judge only")


def test_preparation_keeps_a_problem_that_carries_its_checker(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from prepare_codecontests import prepare
    statement = "Given n, print any divisor of n that is greater than 1. " * 2
    raw = {"name": "divisor", "statement": statement, "tests": TRUTH["tests"], "time_limit_seconds": 2,
           "validation": "custom", "checker": CHECKER}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(raw) + "\n" + json.dumps({**raw, "name": "no checker", "checker": None}) + "\n")
    rows, dropped = prepare(path, "python", "train", max_tests=5)
    assert dropped == {"needs a jury checker": 1} and len(rows) == 1
    assert json.loads(rows[0]["reward_model"]["ground_truth"])["checker"] == CHECKER

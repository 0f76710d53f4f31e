import json
import subprocess
import sys

from conftest import ROOT, shared_file

from prepare_codecontests import infer_tolerance, normalise, prepare, tier

STATEMENT = "Given two integers a and b, print their sum. Input is one line with a and b."


def hf_row(**over):
    row = {"name": "1A. Sum", "description": STATEMENT, "cf_rating": 1500,
           "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
           "private_tests": {"input": ["5 7\n", "0 0\n"], "output": ["12\n", "0\n"]},
           "generated_tests": {"input": [], "output": []},
           "time_limit": {"seconds": 1, "nanos": 500000000}, "memory_limit_bytes": 256 * 2**20,
           "solutions": {"language": [3], "solution": ["print(sum(map(int, input().split())))"]}}
    return {**row, **over}


def test_hugging_face_schema_rows_are_filtered_and_tiered(tmp_path):
    rows = [hf_row(), hf_row(cf_rating=700), hf_row(cf_rating=0), hf_row(cf_rating=2400),
            hf_row(private_tests=None, public_tests=None), hf_row(description="  "),
            hf_row(time_limit={"seconds": 0, "nanos": 0}), hf_row(cf_rating=900)]
    path = tmp_path / "cc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, dropped = prepare(path, "cpp", "train", max_tests=20)
    assert dropped == {"rated below 800": 1, "no tests": 1, "empty or malformed statement": 1, "invalid limits": 1}
    assert [r["extra_info"]["tier"] for r in out] == ["Hard", "unknown", "Expert", "Easy"]
    truth = json.loads(out[0]["reward_model"]["ground_truth"])
    assert truth["tests"] == [{"input": "5 7\n", "output": "12\n"}, {"input": "0 0\n", "output": "0\n"}]  # private
    assert truth["public_tests"] == [{"input": "1 2\n", "output": "3\n"}]  # CodeEnv's tool runs these
    assert truth["time_limit_s"] == 1.5 and truth["memory_limit_mb"] == 256 and truth["language"] == "cpp"
    assert "sum(map" not in json.dumps(out)  # never a solution
    assert out[0]["ability"] == "code" and "```cpp" in out[0]["prompt"][0]["content"]


def test_tiers():
    assert (tier(800), tier(1000), tier(1100), tier(2200), tier(2300), tier(None)) == \
        ("Easy", "Easy", "Hard", "Hard", "Expert", "unknown")


def test_real_icpc_rows_drop_checker_problems_and_keep_tolerances():
    rows, dropped = prepare(shared_file("code/icpc_kattis_problems.jsonl"), "python", "test", max_tests=5)
    assert dropped == {"needs a jury checker": 6} and len(rows) == 42
    qaly = next(r for r in rows if r["extra_info"]["name"] == "Quality-Adjusted Life-Year")
    assert json.loads(qaly["reward_model"]["ground_truth"])["float_tolerance"] == 1e-3
    assert all("solutions" not in r["reward_model"]["ground_truth"] for r in rows)


def test_script_runs_on_a_real_file(tmp_path):
    out = tmp_path / "cc.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_codecontests.py"), "--input",
                           str(shared_file("code/codeforces_2024_deepcoder408.jsonl")), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "kept 408" in proc.stdout and len(out.read_text().splitlines()) == 408
    assert out.stat().st_mode & 0o777 == 0o640  # the tests' answers: not world-readable
    assert normalise({"problem": "x" * 40, "tests": []})[1] == "no tests"


def test_float_tolerance_is_inferred_from_the_statement_and_the_outputs():
    st = "Print the area. Your answer is correct if its absolute or relative error does not exceed 10 - 4."
    decimal, integer = [{"input": "", "output": "1.5"}], [{"input": "", "output": "15"}]
    assert infer_tolerance(st, decimal) == 1e-4
    assert infer_tolerance(st.replace("10 - 4", "$10^{-9}$"), decimal) == 1e-9
    assert infer_tolerance("Answers with an absolute error of at most one millionth are accepted.", decimal) == 1e-6
    assert infer_tolerance(st, integer) is None       # integers: a relative error would accept wrong answers
    assert infer_tolerance("Print the sum of a and b.", decimal) is None


def test_verify_drops_problems_whose_known_solution_fails(tmp_path):
    from minirl.judge import Judge
    wrong_tests = {"input": ["5 7\n"], "output": ["13\n"]}     # tests that do not match the statement
    rows = [hf_row(), hf_row(private_tests=wrong_tests), hf_row(solutions={"language": [4], "solution": ["x"]})]
    path = tmp_path / "cc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Judge(workers=2) as judge:
        out, dropped = prepare(path, "cpp", "train", max_tests=20, judge=judge)
    assert dropped == {"known solution gets WA": 1, "no known solution to verify with": 1}
    assert len(out) == 1 and json.loads(out[0]["reward_model"]["ground_truth"])["tests"][0]["output"] == "12\n"

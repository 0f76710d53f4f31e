"""The built-in code task (minirl/toy/code_task.py and its families, code_families.py): its tests tell right
programs from near misses, its splits do not overlap, and its rows are the code rows the real reward path reads."""
import json

import pytest

from conftest import ROOT

from minirl.data import normalise_row
from minirl.rewards import Scorer
from minirl.toy.code_families import HELD_OUT_FAMILIES, TRAIN_FAMILIES
from minirl.toy.code_task import NEW_FAMILIES_SOURCE, code_task_rows, problems

FAMILIES = {**TRAIN_FAMILIES, **HELD_OUT_FAMILIES}


@pytest.fixture(scope="module")
def judge():
    from minirl.judge import Judge
    with Judge(2) as j:
        yield j


def fenced(code: str, language: str) -> str:
    return f"Here is my program.\n```{language}\n{code}```\n"


def test_reference_programs_pass_and_near_misses_fail_in_every_family(judge):
    """Each family's reference program (Python and C++) is accepted on its own tests, and its near miss (an
    off-by-one, a wrong operator, > for >=) is not: the edge cases among the tests catch it."""
    probs = [p for name, make in FAMILIES.items() for p in problems(3, 7, "test", {name: make})]
    jobs = [dict(source=code, language=lang, tests=p.tests(6))
            for p in probs for lang, code in (("python", p.python), ("cpp", p.cpp), ("python", p.slip))]
    results = judge.run_many(jobs)
    for i, p in enumerate(probs):
        py, cpp, slip = results[3 * i: 3 * i + 3]
        assert (py.verdict, cpp.verdict) == ("AC", "AC"), (p.key, py.message, cpp.message)
        assert slip.verdict == "WA", (p.key, slip.verdict)
        assert any(t["verdict"] != "AC" for t in slip.tests[:3]), p.key  # the 3 edge cases alone reject it


def test_held_out_problems_never_occur_in_training():
    """The test split holds new parameter tuples of the training families and whole families never trained
    on; no statement of the test split is a training statement."""
    train = problems(2000, 1, "train")
    test = problems(96, 2, "test")
    assert {p.family for p in train} == set(TRAIN_FAMILIES)
    assert {p.family for p in test} == set(FAMILIES)
    assert not {p.key for p in train} & {p.key for p in test}
    assert not {p.statement for p in train} & {p.statement for p in test}
    assert len({p.key for p in test}) == len(test)  # distinct problems


def test_rows_are_code_rows_that_the_scorer_judges(judge):
    """A row is a veRL code row in prepare_codecontests's format: the scorer extracts the fenced program of the
    asked language and the judge gives the hierarchical reward (1 right, a fraction for a near miss, -1 no
    code, -0.5 a syntax error)."""
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    from prepare_codecontests import INSTRUCTIONS, to_row
    rows = code_task_rows(4, 3, "train", "cpp") + code_task_rows(4, 3, "test", "python")
    reference = to_row({"statement": "s", "tests": [], "time_limit_s": 2.0, "memory_limit_mb": 256,
                        "float_tolerance": None, "name": "", "rating": None, "default_time_limit": False},
                       "python", "x", 0, "train")
    for row in rows:
        assert normalise_row(row, "rows", 0) is row and row.keys() == reference.keys()
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth.keys() == json.loads(reference["reward_model"]["ground_truth"]).keys()
        assert row["prompt"][-1]["content"].endswith(INSTRUCTIONS[truth["language"]])
    probs = problems(4, 3, "train") + problems(4, 3, "test")
    completions = [fenced(p.cpp if i < 4 else p.python, "cpp" if i < 4 else "python") for i, p in enumerate(probs)]
    assert Scorer(judge)(completions, rows) == [1.0] * 8
    py_rows = code_task_rows(4, 3, "test", "python")
    slips = Scorer(judge)([fenced(p.slip, "python") for p in probs[4:]], py_rows)
    assert all(r < 1 for r in slips)
    assert Scorer(judge)(["no code here", fenced("print(", "python")], py_rows[:2]) == [-1.0, -0.5]
    assert {r["data_source"] for r in code_task_rows(60, 2, "test")} == {"code_task", NEW_FAMILIES_SOURCE}


def test_yes_no_families_reject_programs_that_do_half_the_task():
    """A held-out YES/NO family composes two skills; its tests must reject a program that has only one: the
    condition on a alone or b alone or on another operation (compare), on another letter or on the length for
    the count (spelling), or another bound. Random inputs alone mostly answer the same and let such programs
    pass (a review found 15 of 49 held-out rows passing one); code_families._rejecting draws inputs against them."""
    from minirl.toy.code_families import COMPARISONS, PAIR_OPS
    for p in problems(40, 11, "test", {"compare": HELD_OUT_FAMILIES["compare"]}) + \
            problems(40, 11, "test", {"spelling": HELD_OUT_FAMILIES["spelling"]}):
        assert set(p.outputs[:6]) == {"YES", "NO"}, p.key
        if p.family == "compare":
            _, op, kind, t = p.key.replace("(", ",").rstrip(")").split(",")
            cmp, t = COMPARISONS[kind.strip(" '")], int(t)
            right = PAIR_OPS[op.strip(" '")][0]
            values = ["a", "b"] + [e for e, _ in PAIR_OPS.values() if e != right]
            wrong = [f"{v} {cmp} {t}" for v in values] + [f"{right} {cmp} {b}" for b in (t - 1, t + 1)]
            names = [dict(zip("ab", map(int, x.split()))) for x in p.inputs[:6]]
        else:
            c = p.statement.split("letter ")[1][0] if "letter " in p.statement else "a"
            t = int(p.statement.split("at least ")[1].split()[0])
            right = "len(s)" if "letters," in p.statement else f"s.count('{c}')"
            values = {"len(s)", f"s.count('{c}')", f"s.count('{chr(ord(c) + 1)}')"} - {right}
            wrong = [f"{v} >= {t}" for v in values] + [f"{right} >= {b}" for b in (t - 1, t + 1)]
            names = [{"s": x} for x in p.inputs[:6]]
        for w in wrong:
            assert any(("YES" if eval(w, {}, n) else "NO") != out for n, out in zip(names, p.outputs[:6])), (p.key, w)


def test_the_one_shot_is_a_right_answer_to_a_problem_of_no_family(judge):
    """The solved problem before each row's (code_task.SHOT) must be solved right, in both languages, and must
    not be one of the task's problems (it would hand out a held-out answer)."""
    from minirl.toy.code_task import SHOT, SHOT_ANSWERS
    for language in ("python", "cpp"):
        row = code_task_rows(1, 3, "test", language)[0]
        assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
        assert row["prompt"][0]["content"].startswith(SHOT) and row["prompt"][1]["content"] == SHOT_ANSWERS[language]
        shot_row = {**row, "reward_model": {"style": "rule", "ground_truth": json.dumps(
            {"tests": [{"input": "17 5\n", "output": "2\n"}, {"input": "9 3\n", "output": "0\n"}],
             "language": language, "time_limit_s": 2.0, "memory_limit_mb": 256, "float_tolerance": None})}}
        assert Scorer(judge)([SHOT_ANSWERS[language]], [shot_row]) == [1.0]
        assert [m["role"] for m in code_task_rows(1, 3, "test", language, shot=False)[0]["prompt"]] == ["user"]
    statements = {p.statement for p in problems(300, 1, "train") + problems(96, 2, "test")}
    assert SHOT.split("\n")[0] not in statements and not any("remainder" in s for s in statements)


def test_rows_are_a_function_of_the_seed():
    assert code_task_rows(20, 5, "train") == code_task_rows(20, 5, "train")
    assert code_task_rows(20, 5, "train") != code_task_rows(20, 6, "train")


def test_a_training_step_counts_the_verdicts_of_its_samples(judge, tiny_path):
    """sample_and_score reports `critic/verdict/<V>` for every sampled completion: here the generator's texts
    are replaced by known programs (right, near miss, syntax error, prose), so each count is known."""
    from dataclasses import replace

    from minirl.config import parse_config
    from minirl.judge import VERDICTS
    from minirl.models import load_model, load_tokenizer
    from minirl.rewards import CODE_VERDICTS
    from minirl.rollout import sample
    from minirl.sampling import sample_and_score
    assert CODE_VERDICTS == (*VERDICTS, "JE", "no code")
    rows = code_task_rows(2, 3, "test", "python", shot=False)  # short prompts: the tiny model's context is 512
    p = problems(2, 3, "test")
    texts = [fenced(p[0].python, "python"), fenced(p[0].slip, "python"), fenced("print(", "python"), "no code",
             fenced(p[1].python, "python"), fenced(p[1].python, "python"), "prose", "prose"]

    def generate(*args):  # the tiny model's rollout, with known texts: the scorer reads only those
        return replace(sample(*args), texts=texts)
    cfg = parse_config(["--prompts_per_step", "2", "--group_size", "4", "--max_new_tokens", "2", "--seed", "0"])
    tok, model = load_tokenizer(str(tiny_path)), load_model(str(tiny_path))
    _, _, rewards, _, m = sample_and_score(model, tok, rows, Scorer(judge), cfg, 0, 0, 1, {}, generate)
    counts = {k.removeprefix("critic/verdict/"): v for k, v in m.items() if k.startswith("critic/verdict/")}
    assert counts == {**dict.fromkeys(CODE_VERDICTS, 0), "AC": 3, "WA": 1, "CE": 1, "no code": 3}, counts
    assert rewards[0] == 1.0 and rewards[3] == -1.0


def test_tool_rows_teach_the_tool_call_that_code_env_reads_and_check_the_example(judge):
    """The multi-turn variant's rows (tool=True): the system message and the shot's call are what CodeEnv
    parses, the shot's reply is what the tool answers on the shot's example, and the tool checks the
    statement's example."""
    from minirl.agentic.env import CodeEnv, parse_tool_calls
    from minirl.toy.code_task import SHOT_TOOL_CALL, SHOT_TOOL_REPLY, TOOL_SYSTEM
    for language in ("python", "cpp"):
        row = code_task_rows(1, 3, "test", language, tool=True)[0]
        assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert row["prompt"][0]["content"] == TOOL_SYSTEM and row["prompt"][2]["content"] == SHOT_TOOL_CALL[language]
        [call] = parse_tool_calls(None, SHOT_TOOL_CALL[language])
        assert call["name"] == "check_solution"
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth["public_tests"] == [truth["tests"][-1]]  # the example the statement shows
        assert truth["tests"][-1]["input"].strip() in row["prompt"][-1]["content"]
        env = CodeEnv(judge, None, max_turns=2)
        messages = env.reset(row)
        checked = env.step(messages, SHOT_TOOL_CALL[language])  # the shot's program, on this row's example
        assert checked[0] is not None and checked[2]["turns"] == 1  # a tool turn, not the answer
        env.reset({**row, "reward_model": {"ground_truth": {**truth, "public_tests": [
            {"input": "17 5\n", "output": "2\n"}]}}})  # the shot's own example
        assert env.step(messages, SHOT_TOOL_CALL[language])[0][-1]["content"] == SHOT_TOOL_REPLY
    with pytest.raises(ValueError, match="example=True"):
        code_task_rows(1, 3, "test", "python", tool=True, example=False)
    plain = code_task_rows(1, 3, "test", "python")[0]
    assert "public_tests" not in json.loads(plain["reward_model"]["ground_truth"])

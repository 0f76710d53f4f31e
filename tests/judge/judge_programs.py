"""Fixed programs with known verdicts, and the local judge's results on them, shared by the tests of the judge's
server, RemoteJudge and RayJudge. The fixtures are imported by the test files (not a conftest.py here: tests
import the root one as `conftest`); each is computed once per session whichever file asks first."""
import pytest

from minirl.rewards import judge_completions

AB = [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12\n"}]
AB_CPP = '#include <bits/stdc++.h>\nint main(){long long a,b; std::cin>>a>>b; std::cout<<a+b<<"\\n";}\n'
AB_PY = "a, b = map(int, input().split())\nprint(a + b)\n"

# (name, language, source, minirl's verdict on AB with a 0.5 s / 128 MiB limit)
PROGRAMS = [
    ("ac_cpp", "cpp", AB_CPP, "AC"),
    ("ac_py", "python", AB_PY, "AC"),
    ("wa_cpp", "cpp", "#include <cstdio>\nint main(){ puts(\"3\"); }\n", "WA"),
    ("wa_py", "python", "print(3)\n", "WA"),
    ("ce_cpp", "cpp", "int main() { return 0 }\n", "CE"),
    ("ce_py", "python", "print(1\n", "CE"),
    ("tle_cpp", "cpp", "int main(){ volatile long s=0; for(;;) s++; }\n", "TLE"),
    ("tle_py", "python", "while True:\n    pass\n", "TLE"),
    ("re_cpp", "cpp", "int main(){ int *p = nullptr; return *p; }\n", "RE"),
    ("re_py", "python", "raise ValueError('boom')\n", "RE"),
    ("mle_cpp", "cpp", "#include <vector>\nint main(){ std::vector<char> v(1L<<33); return v[5]; }\n", "MLE"),
    ("mle_py", "python", "x = bytearray(2 * 1024**3)\n", "MLE"),
]
TIME_LIMIT_S, MEMORY_MB = 0.5, 128
JUDGE_COMPLETIONS = judge_completions  # the real one: train_verdicts wraps it


def jobs(programs=PROGRAMS) -> list[dict]:
    return [dict(source=src, language=lang, tests=AB, time_limit_s=TIME_LIMIT_S, memory_limit_mb=MEMORY_MB)
            for _, lang, src, _ in programs]


def summary(results) -> list[tuple[str, int, int]]:
    return [(r.verdict, r.passed, r.total) for r in results]


def code_rows(tmp_path):
    """A tiny code dataset: 4 Python problems whose two tests expect i % 3."""
    import json
    rows = [{"data_source": "toy_code", "ability": "code", "prompt": [{"role": "user", "content": f"Print {i % 3}."}],
             "reward_model": {"style": "rule", "ground_truth": json.dumps(
                 {"language": "python", "tests": [{"input": "", "output": str(i % 3)}] * 2, "time_limit_s": 2})},
             "extra_info": {"index": i}} for i in range(4)]
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def record_verdicts(monkeypatch) -> list:
    """Every verdict the judge gives from now on. The toy model writes no code block, so each completion's
    "program" is made from its text (it prints the sum of its characters mod 3): the judge's verdicts then
    decide the rewards."""
    from minirl import rewards
    seen = []

    def recording(completions, problems, judge):
        results = JUDGE_COMPLETIONS(completions, problems, judge)
        seen.extend((r.verdict, r.passed, r.total) for r in results)
        return results

    monkeypatch.setattr(rewards, "extract_code", lambda text, language: f"print({sum(map(ord, text)) % 3})")
    monkeypatch.setattr(rewards, "judge_completions", recording)
    return seen


def train_verdicts(tmp_path, tiny_path, monkeypatch, *args: str) -> tuple[list, list[float]]:
    """train.py on the tiny code dataset, 2 steps of the toy model: every verdict its judge gave, and the
    per-step mean rewards."""
    import json
    import train
    data, seen = code_rows(tmp_path), record_verdicts(monkeypatch)
    out = tmp_path / "run"
    train.main(["--model_name_or_path", str(tiny_path), "--train_files", str(data), "--val_files", "",
                "--max_steps", "2", "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "8",
                "--seed", "0", "--judge_workers", "1", "--output_dir", str(out), *args])
    means = [json.loads(line)["critic/reward/mean"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return seen, means


def eval_verdicts(tmp_path, tiny_path, monkeypatch, *args: str) -> tuple[list, dict]:
    """eval.py on the tiny code dataset (greedy): every verdict its judge gave, and its summary."""
    import eval as eval_script
    data, seen = code_rows(tmp_path), record_verdicts(monkeypatch)
    summary = eval_script.main(["--model", str(tiny_path), "--data", str(data), "--max_new_tokens", "8",
                                "--judge_workers", "1", "--output", str(tmp_path / "eval"), *args])
    timing = ("seconds_per_token", "tokens_per_second")
    return seen, {src: {k: v for k, v in m.items() if k not in timing} for src, m in summary.items()}


# --- what every backend must give: the local judge's results, computed once -----------------------------

_ONCE: dict = {}


def _once(key: str, make):
    if key not in _ONCE:
        _ONCE[key] = make()
    return _ONCE[key]


@pytest.fixture()
def local_verdicts():
    """A local Judge's (verdict, passed, total) on the fixed programs."""
    from minirl.judge import Judge

    def make():
        with Judge(workers=2) as judge:
            return summary(judge.run_many(jobs()))
    return _once("verdicts", make)


@pytest.fixture()
def local_train(tmp_path_factory, tiny_path):
    """train.py's verdicts and rewards with the local judge."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _once("train", lambda: train_verdicts(tmp_path_factory.mktemp("local"), tiny_path, monkeypatch))


@pytest.fixture()
def local_eval(tmp_path_factory, tiny_path):
    """eval.py's verdicts and summary with the local judge."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _once("eval", lambda: eval_verdicts(tmp_path_factory.mktemp("local_eval"), tiny_path, monkeypatch))

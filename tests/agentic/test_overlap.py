"""Sampling ahead of the trainer (minirl/agentic/overlap.py) and the code-RL recipe on it (recipes/code_rl.py)."""
import json

import pytest
import torch

from minirl.agentic.overlap import RolloutPool
from minirl.sessions import SamplingParams, ServiceClient



@pytest.fixture()
def one_thread():
    """Several Python threads share the model here; one intra-op thread avoids OpenMP spinning on a busy CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fake_pool(k, stale_policy_problem=3, workers=2, B=2):
    """A pool whose 'sampling' returns the problem itself, stamped with the trainer's current version, except
    the first attempt at `stale_policy_problem`, which claims to come from a policy 5 versions old."""
    attempts = {}
    stream = iter(range(10**6))

    def run_group(problem, seed):
        attempts[problem] = attempts.get(problem, 0) + 1
        old = problem == stale_policy_problem and attempts[problem] == 1
        return [problem], pool.version - 5 if old else pool.version

    pool = RolloutPool(run_group, lambda: next(stream), B, k, workers)
    return pool, attempts


@pytest.mark.parametrize("stale_policy", ["requeue", "drop"])
def test_staleness_never_exceeds_k_and_requeued_groups_are_trained_later(stale_policy):
    k, B = 1, 2
    pool, attempts = fake_pool(k, B=B)
    trained, discarded = [], 0
    for step in range(6):
        for group in pool.fresh_groups(step, stale_policy):
            assert step - group.policy_version <= k                    # never more than k versions old
            trained.append((step, group.problem, group.policy_version))
        assert len(pool.stats["staleness"]) == B and max(pool.stats["staleness"]) <= k
        discarded += pool.stats["requeued"] + pool.stats["dropped"]
        pool.set_policy(step + 1)
    pool.close()
    problems = [p for _, p, _ in trained]
    assert discarded == 1 and len(problems) == 6 * B
    if stale_policy == "requeue":
        assert attempts[3] == 2 and problems.count(3) == 1            # sampled again, trained once
        step, _, version = trained[problems.index(3)]  # its first attempt is a group of step 1 (tickets 2, 3)
        assert step >= 1 and version >= 1              # trained after the discard, sampled by a newer policy
    else:
        assert attempts[3] == 1 and 3 not in problems


def test_workers_never_run_more_than_k_steps_ahead():
    pool, _ = fake_pool(k=2, stale_policy_problem=-1, workers=3, B=2)
    for step in range(4):
        list(pool.fresh_groups(step))
        with pool._cv:  # what the workers may have started: at most the groups of steps up to step + k
            assert pool.started - pool.discarded <= (step + 2 + 1) * 2
        pool.set_policy(step + 1)
    pool.close()


def test_seeded_samples_do_not_depend_on_what_ran_before(tiny_path, one_thread):
    tc = ServiceClient().create_training_client(str(tiny_path))
    sc, tok = tc.create_sampling_client(), tc.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+5?"}], tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    params = SamplingParams(max_tokens=6, seed=11)
    first = [s.tokens for s in sc.sample(prompt, 4, params).result().sequences]
    sc.sample(prompt, 4, SamplingParams(max_tokens=6)).result()      # moves the global RNG
    torch.rand(100)
    assert [s.tokens for s in sc.sample(prompt, 4, params).result().sequences] == first
    tc.stop()


def test_k0_with_rollout_workers_reproduces_the_synchronous_loop_exactly(tiny_path, one_thread):
    import code_rl
    args = ["--env", "math", "--steps", "2", "--prompts_per_step", "3", "--group_size", "4", "--max_tokens", "6",
            "--lr", "1e-4", "--max_steps_off_policy", "0"]
    sync = code_rl.main(args + ["--num_rollout_workers", "0"])["history"]
    ahead = code_rl.main(args + ["--num_rollout_workers", "2"])["history"]
    drop = ("step_s", "async/queue_depth")
    assert [{k: v for k, v in h.items() if k not in drop} for h in ahead] == \
        [{k: v for k, v in h.items() if k not in drop} for h in sync]
    assert all(h["async/staleness/max"] == 0 and h["async/requeued"] == 0 for h in ahead)
    assert any(h["grad_norm"] > 0 for h in sync)                          # a real update, not a no-op


def test_code_rl_runs_the_code_task_end_to_end_with_overlap(tiny_path, tmp_path, one_thread):
    import code_rl
    truth = {"tests": [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12"}],
             "public_tests": [{"input": "1 2\n", "output": "3"}], "language": "python"}
    rows = [{"data_source": "code/toy", "ability": "code", "reward_model": {"ground_truth": json.dumps(truth)},
             "prompt": [{"role": "user", "content": f"Print a+b ({i}). Use check_solution, then ```python."}]}
            for i in range(4)]
    (tmp_path / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = code_rl.main(["--train_files", str(tmp_path / "code.jsonl"), "--steps", "3", "--prompts_per_step", "2",
                        "--group_size", "2", "--max_tokens", "12", "--max_steps_off_policy", "2",
                        "--num_rollout_workers", "2", "--judge_workers", "2"])["history"]
    assert len(out) == 3
    assert all(h["async/staleness/max"] <= 2 and h["turns"] >= 1 for h in out)
    assert all(-0.1 <= h["reward"] <= 1.0 for h in out)


def run_pool_until_it_fails(next_problem, run_group, workers: int) -> tuple[list, BaseException | None]:
    """Train steps of B=2 groups until the pool raises; in a thread with a timeout, so a hang fails the test."""
    import threading
    trained, raised = [], []

    def train():
        pool = RolloutPool(run_group, next_problem, groups_per_step=2, max_steps_off_policy=100, num_workers=workers)
        try:
            for step in range(100):
                for group in pool.fresh_groups(step):
                    trained.append(group.problem)
                pool.set_policy(step + 1)
        except BaseException as e:  # noqa: BLE001
            raised.append(e)
        finally:
            pool.close()
    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "the trainer hung on a dead rollout worker"
    return trained, raised[0] if raised else None


def caused_by(error: BaseException | None, kind: type) -> bool:
    while error is not None and not isinstance(error, kind):
        error = error.__cause__ or error.__context__
    return error is not None


@pytest.mark.parametrize("workers", [0, 2])
def test_a_finite_problem_stream_ends_the_run_with_its_error_instead_of_hanging(workers):
    """next_problem() raising in a worker (the stream ran out) reaches the trainer; the groups before it train."""
    stream = iter(range(5))
    trained, error = run_pool_until_it_fails(lambda: next(stream), lambda problem, seed: ([problem], 0), workers)
    assert caused_by(error, StopIteration)            # a generator turns StopIteration into a RuntimeError
    assert trained == [0, 1, 2, 3, 4]                  # every group before the end trains, in order


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("where", ["next_problem", "run_group"])
def test_a_bad_row_ends_the_run_with_the_original_error(workers, where):
    rows = iter([{"prompt": "a"}, {"prompt": "b"}, {"no prompt": 1}] + [{"prompt": "c"}] * 100)

    def next_problem():
        row = next(rows)
        return row["prompt"] if where == "next_problem" else row

    def run_group(problem, seed):
        return [problem if where == "next_problem" else problem["prompt"]], 0
    _, error = run_pool_until_it_fails(next_problem, run_group, workers)
    assert isinstance(error, KeyError) and "prompt" in str(error)

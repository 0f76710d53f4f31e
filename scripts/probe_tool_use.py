"""Does a model call CodeEnv's check_solution tool? Multi-turn episodes on the built-in code task, no training.

    HF_HUB_OFFLINE=1 python scripts/probe_tool_use.py --model smollm2-135m --problems 12 --samples 4

The rows are the code task's with `tool=True` (minirl/toy/code_task.py: a system message saying how to call
the tool, and a one-shot answer that checks its program before giving it); the episodes run as
recipes/code_rl.py runs them (minirl/agentic/episodes.py, CodeEnv with 2 turns: the tool in the first, the
answer judged on the private tests). Prints how many episodes called the tool, the final verdicts, and the
first few transcripts. RL can only reinforce a tool call the policy samples: with none, a multi-turn run is
the single-turn run with more tokens in the prompt.
"""
import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minirl.agentic.env import CodeEnv  # noqa: E402
from minirl.agentic.episodes import run_episodes  # noqa: E402
from minirl.judge import Judge  # noqa: E402
from minirl.sessions import SamplingParams, ServiceClient  # noqa: E402
from minirl.toy.code_task import code_task_rows  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--language", choices=["python", "cpp"], default="python")
    p.add_argument("--problems", type=int, default=12, help="held-out problems of the code task (<= 96)")
    p.add_argument("--samples", type=int, default=4, help="episodes per problem")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max_tokens", type=int, default=160, help="per turn")
    p.add_argument("--show", type=int, default=4, help="transcripts printed")
    args = p.parse_args()

    rows = code_task_rows(96, seed=2, split="test", language=args.language, tool=True)[:args.problems]
    tc = ServiceClient().create_training_client(args.model, seed=0).result()
    tok, sc = tc.get_tokenizer(), tc.create_sampling_client().result()
    judge = Judge(workers=2)
    try:
        groups = run_episodes(sc, tok, lambda: CodeEnv(judge, tok, max_turns=2), rows, args.samples,
                              SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature), seed=0)
    finally:
        judge.close()
        tc.stop()
    episodes = [ep for g in groups for ep in g]
    verdicts = collections.Counter(ep.info.get("verdict") for ep in episodes)
    called = sum(ep.turns > 1 for ep in episodes)
    print(f"{len(episodes)} episodes: {called} called check_solution; final verdicts {dict(verdicts)}; "
          f"reward 1 in {sum(ep.reward > 0 for ep in episodes)}")
    for ep in episodes[:args.show]:
        print(f"--- turns {ep.turns}, reward {ep.reward}\n{tok.decode(ep.completion_tokens)}")


if __name__ == "__main__":
    main()

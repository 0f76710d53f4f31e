"""Print a training step's best and worst groups from <output_dir>/samples.jsonl (train.py writes it; config key
`log_sample_groups`): each completion with its verdict or answer, reward and advantage.

    python scripts/read_samples.py runs/default                 # the last step
    python scripts/read_samples.py runs/default --step 10 --k 2 # step 10, its 2 best and 2 worst groups
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minirl.samples import best_and_worst, group_reward, read_samples  # noqa: E402


def show(title: str, group: list[dict], width: int) -> str:
    first = group[0]
    out = [f"=== {title}: group {first['group']} (prompt_index {first['prompt_index']}), mean reward "
           f"{group_reward(group):.3f}", first["prompt"][-width:].strip(), ""]
    for k, r in enumerate(group):
        outcome = f"verdict {r['verdict']}" if "verdict" in r else f"answer {r.get('answer')!r}"
        reward = "none (judge error)" if r["reward"] is None else f"{r['reward']:.3f}"
        out += [f"--- sample {k}: {outcome}, reward {reward}, advantage {r['advantage']:+.3f}",
                r["completion"][:width], ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run's output_dir, or its samples.jsonl")
    ap.add_argument("--step", type=int, default=None, help="default: the last step written")
    ap.add_argument("--k", type=int, default=1, help="groups shown at each end")
    ap.add_argument("--width", type=int, default=2000, help="characters of each text shown")
    args = ap.parse_args(argv)
    path = Path(args.run)
    path = path / "samples.jsonl" if path.is_dir() else path
    if not path.is_file():
        ap.error(f"{path} does not exist: train with log_sample_groups > 0")
    steps = read_samples(path)
    if not steps:
        ap.error(f"{path} holds no samples")
    step = max(steps) if args.step is None else args.step
    if step not in steps:
        ap.error(f"step {step} is not in {path}: it has steps {min(steps)}..{max(steps)}")
    best, worst = best_and_worst(steps[step], args.k)
    text = "\n".join([f"step {step}: {len(steps[step])} groups"] + [show("best", g, args.width) for g in best]
                     + [show("worst", g, args.width) for g in worst])
    print(text)
    return text


if __name__ == "__main__":
    main()

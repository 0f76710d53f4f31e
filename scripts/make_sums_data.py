"""Write the data of recipes/smollm2_cpu.yaml: two-number sums a real small model gets right ~40% of the time.

    python scripts/make_sums_data.py      # data/sums_train.jsonl (576 rows), data/sums_test.jsonl (100 rows)

"What is 17 + 29? Reply with only the number." with a, b in [5, 30]: SmolLM2-135M-Instruct answers ~40% of
them correctly when decoding greedily (GSM8K is ~0% for it), often right but followed by prose with more
numbers ("18 + 6 = 24\n\nThis is a classic example of ..."). The reward is `flexible` GSM8K extraction (the
last number): RL has to teach it to get the sum right *and* stop after it. The 676 ordered pairs are split
into disjoint train and test sets, so held-out problems are pairs never trained on.
"""
import json
import random
from pathlib import Path

DATA_SOURCE = "arithmetic"  # scored by rewards.gsm8k_reward (see reward_fn_for)
LO, HI, N_TEST, SEED = 5, 30, 100, 0


def row(a: int, b: int, split: str, index: int) -> dict:
    return {"data_source": DATA_SOURCE, "ability": "math",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b}}


if __name__ == "__main__":
    pairs = [(a, b) for a in range(LO, HI + 1) for b in range(LO, HI + 1)]
    random.Random(SEED).shuffle(pairs)
    out = Path(__file__).resolve().parents[1] / "data"
    for name, part in [("sums_test", pairs[:N_TEST]), ("sums_train", pairs[N_TEST:])]:
        split = name.split("_")[1]
        rows = [row(a, b, split, i) for i, (a, b) in enumerate(part)]
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {out / name}.jsonl")

"""What the recipes on the sessions API share: prompts as tokens, held-out accuracy,
their data options and their ending."""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import torch

from minirl.data import prompt_text
from minirl.distributed import global_sum
from minirl.rewards import gsm8k_reward
from minirl.sessions import ModelInput, SamplingClient, SamplingParams


def prompt_tokens(tokenizer, row: dict) -> list[int]:
    """The row's chat prompt (with the generation prompt), as token ids."""
    return tokenizer(prompt_text(row, tokenizer), add_special_tokens=False).input_ids


def answer_of(row: dict) -> str:
    return str(row["reward_model"]["ground_truth"])


def accuracy(sc: SamplingClient, tokenizer, rows: list[dict], max_tokens: int, rank: int = 0, world: int = 1) -> float:
    """Greedy accuracy (gsm8k_reward) on held-out rows, each process scoring rows[rank::world]."""
    mine = rows[rank::world]
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    futures = [sc.sample(ModelInput.from_ints(prompt_tokens(tokenizer, r)), 1, params)
               for r in mine]  # submitted together: one batched generate
    correct = sum(gsm8k_reward(tokenizer.decode(f.result().sequences[0].tokens, skip_special_tokens=True),
                               answer_of(r)) for f, r in zip(futures, mine))
    total = global_sum(torch.tensor([float(correct), float(len(mine))], device=sc.model.device))
    return float(total[0] / total[1].clamp(min=1))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every recipe has: the model and the toy arithmetic data (train and held-out)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--train_files", default=str(ROOT / "data" / "arith_train.jsonl"))
    p.add_argument("--val_files", default=str(ROOT / "data" / "arith_test.jsonl"))
    p.add_argument("--val_max_samples", type=int, default=100)
    return p


def finish(tc, tokenizer, val_rows: list[dict], max_tokens: int, before: float | None, rank: int, world: int,
           output_dir: str = "") -> float | None:
    """Held-out accuracy of the trained policy (printed beside `before`), the merged export if asked, and the
    session stopped. Returns the accuracy after training."""
    sc = tc.save_weights_and_get_sampling_client().result()
    after = accuracy(sc, tokenizer, val_rows, max_tokens, rank, world) if val_rows else None
    if rank == 0:
        print(f"held-out accuracy: before {before}, after {after}")
    if output_dir:
        tc.save_weights_for_sampler(str(Path(output_dir).resolve()), merge_weights=True).result()
    tc.stop()
    return after

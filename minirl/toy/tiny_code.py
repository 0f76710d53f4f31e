"""A tiny model that writes programs for the built-in code task, slips included: the code-RL smoke test's policy.

    path = tiny_code_model_path()        # built once (400 warm-up steps, ~1 min), then cached like the toy
    python train.py --model_name_or_path tiny-code --train_files rows.jsonl ...   # as tests/toy/test_code_rl.py

As minirl/toy/tiny.py does for arithmetic, built offline: the same byte-level BPE tokenizer (trained on the
task's prompts and programs) and 4-layer Qwen2 config, then a supervised warm-up on the reference Python
programs of five training families (minirl/toy/code_task.py), answered as a fenced block, with two kinds of slip
in a fraction of the targets, each something the judge sees and RL can unlearn:
- `slip_rate` of the programs are the family's near miss (an off-by-one, a wrong operator, > for >=): WA, the
  reward is the fraction of tests passed, less than 1;
- `no_fence_rate` of the answers leave out the code fence: extraction finds no program, the reward is -1.
The warm-up is long enough for the model to learn to copy the statement's parameters into its program (its
loss drops from a plateau of ~0.15 to ~0.06 around step 375 at 16 a batch, ~6k examples; at 32 a batch it drops
after ~8k): on held-out parameters it then samples the right program about a third of the time (T = 1,
`val/accepted` 23-33% over three builds), and the near miss or a bare program often enough that most groups of
samples carry a signal for GRPO through the judge.
Its rows are code_task_rows(..., families=FAMILIES, example=False, shot=False, instruction=False): it was warmed
up on the bare statement, without the example line, the solved problem before it and the instruction that the
shipped data files carry for real models (a third of the tokens, so a third of the warm-up's cost). It only
knows its families' templates: its held-out score is for new parameters (`val/test_score/code_task`), never for
the held-out families, which need a real model (recipes/code_cpu.yaml).
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from minirl.toy.cache import build_in_fixed_env, cached_model
from minirl.toy.code_families import TRAIN_FAMILIES, Problem
from minirl.toy.code_task import problems, to_row
from minirl.toy.tiny import build_model, build_tokenizer, save_built

NAME = "tiny-code"
# the families it is warmed up on (strings left out: a 4-layer model learns to copy a letter far slower)
FAMILIES = {name: TRAIN_FAMILIES[name] for name in ("arithmetic", "pair", "lists", "condition", "loop")}
BUILD_VERSION = "v2"  # bump when the recipe below changes, so stale caches are rebuilt


def answer(p: Problem, slip: bool = False, fence: bool = True) -> str:
    """The warm-up's target for a problem: its reference program (or the near miss) in a ```python block."""
    code = p.slip if slip else p.python
    return f"```python\n{code}```" if fence else code


def warmup_examples(n: int, seed: int, slip_rate: float, no_fence_rate: float) -> list[tuple[dict, str]]:
    """(row, target) pairs over the training families' train split, slips drawn at the given rates."""
    rng = random.Random(seed)
    out = []
    for i, p in enumerate(problems(n, seed, "train", FAMILIES)):
        u = rng.random()
        out.append((to_row(p, "python", "warmup", i, example=False, shot=False, instruction=False),
                    answer(p, slip=u < slip_rate, fence=not slip_rate <= u < slip_rate + no_fence_rate)))
    return out


def supervised_warmup(model, tokenizer, examples: list[tuple[dict, str]], steps: int, batch_size: int = 16,
                      lr: float = 2e-3, seed: int = 0) -> list[float]:
    """Next-token cross-entropy on the answer tokens only (prompt and padding masked with -100); the losses."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        batch = rng.sample(examples, batch_size)
        prompts = [tokenizer(tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True),
                             add_special_tokens=False).input_ids for r, _ in batch]
        targets = [tokenizer(t + tokenizer.eos_token, add_special_tokens=False).input_ids for _, t in batch]
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        labels = torch.full((batch_size, width), -100)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, (p, t) in enumerate(zip(prompts, targets)):  # left padding, as the rollout pads
            ids[i, width - len(p) - len(t):] = torch.tensor(p + t)
            labels[i, width - len(t):] = torch.tensor(t)
            mask[i, width - len(p) - len(t):] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def write_tiny_code(folder: Path, warmup_steps: int = 400, seed: int = 0, slip_rate: float = 0.4,
                    no_fence_rate: float = 0.1) -> None:
    """Tokenizer + model + warm-up, saved with save_pretrained into `folder`."""
    examples = warmup_examples(4000, seed=1234, slip_rate=slip_rate, no_fence_rate=no_fence_rate)
    texts = []
    for row, _ in examples[:1500]:
        p = row["prompt"][0]["content"]
        texts += [p, "user", "assistant"]
    texts += [answer(p, slip=s) for p in problems(1500, 99, "train", FAMILIES) for s in (False, True)]
    tokenizer = build_tokenizer(texts, vocab_size=768)
    model = build_model(len(tokenizer), seed, tokenizer.eos_token_id, tokenizer.pad_token_id)
    supervised_warmup(model, tokenizer, examples, steps=warmup_steps, seed=seed)
    save_built(model, tokenizer, folder)


def tiny_code_model_path() -> Path:
    """Where the tiny code model lives; built on first use. Override the folder with MINIRL_CACHE."""
    return cached_model(f"{NAME}-{BUILD_VERSION}", lambda folder: build_in_fixed_env("minirl.toy.tiny_code", folder),
                        "building the tiny code model (once, ~1 min)")


if __name__ == "__main__":  # python -m minirl.toy.tiny_code FOLDER: what build_in_fixed_env runs (cache.py)
    write_tiny_code(Path(sys.argv[1]))

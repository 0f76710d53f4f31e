"""The built-in default: a toy arithmetic task and a tiny model that can just about do it.

`python train.py` with no arguments must run on a laptop CPU in minutes with nothing downloaded, so minirl
builds its own model here, offline:

1. a byte-level BPE tokenizer (digits split one per token, as Qwen2's pre-tokenizer does) trained on the toy
   task's text, with a chat template, saved as a plain `PreTrainedTokenizerFast` so that `AutoTokenizer`
   loads it back exactly (`Qwen2Tokenizer` would rebuild its own pre-tokenizer and tokenise differently);
2. a 4-layer Qwen2-architecture model (~0.8M parameters) from a config;
3. a short supervised warm-up that teaches the answer format *and a systematic slip*: 60% of its examples
   answer a+b+1. The warmed model's most likely answer is then usually wrong, yet the right one keeps plenty
   of probability mass. That is the regime RL for reasoning lives in (the base model can solve the problem
   sometimes; RL makes it do so reliably), and it gives every group of samples a learning signal, so a CPU
   run shows the effect in minutes. Without the slip the warm-up alone would solve the task.

The result is saved with `save_pretrained` into a cache folder (built once, atomically: minirl/toy/cache.py)
and from then on is loaded like any hub model, with `from_pretrained(path)`.

The task: one-digit sums, "What is 7+8?" -> "#### 15" (100 distinct problems, so held-out rows are new draws
from the same table, not unseen pairs: this demo measures RL sharpening a policy, not generalisation).
Rewards are checked by `rewards.gsm8k_reward`, the same function that scores real GSM8K, so the toy run
exercises the real reward path.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from minirl.toy.cache import atomic_build, build_in_fixed_env, cached_model

TOY_DATA_SOURCE = "toy_arithmetic"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BUILD_VERSION = "v3"  # bump when the recipe below changes, so stale caches are rebuilt (v3: built in a fixed env)


def arithmetic_rows(n: int, seed: int, split: str, lo: int = 0, hi: int = 9) -> list[dict]:
    """`n` veRL-format rows of "a+b" with a, b drawn uniformly from [lo, hi]; `seed` fixes them."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        rows.append({
            "data_source": TOY_DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i, "a": a, "b": b},
        })
    return rows


def toy_completion(row: dict, slip: bool = False) -> str:
    """The warm-up's target: the right answer, or with `slip` the systematic mistake a+b+1."""
    answer = int(row["reward_model"]["ground_truth"]) + int(slip)
    return f"#### {answer}"


# Qwen2's own pre-tokenizer split (one digit per token). `AutoTokenizer` loads a `model_type=qwen2` folder as
# `Qwen2Tokenizer`, which rebuilds exactly this pipeline whatever tokenizer.json says; training with it means
# both classes tokenise identically (tests/test_tiny.py checks).
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def build_tokenizer(texts: list[str], vocab_size: int = 320):
    """Byte-level BPE with Qwen2's pre-tokenisation (digits split one per token)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        unk_token=None, chat_template=CHAT_TEMPLATE, padding_side="left", model_max_length=2048)


def build_model(vocab_size: int, seed: int, eos_id: int, pad_id: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    return Qwen2ForCausalLM(config)


def supervised_warmup(model, tokenizer, rows: list[dict], steps: int, batch_size: int = 64, lr: float = 1e-3,
                      slip_rate: float = 0.6, seed: int = 0) -> None:
    """Next-token cross-entropy on completion tokens only (prompt tokens are masked with -100); a fraction
    `slip_rate` of the targets carry the a+b+1 slip. (lr 3e-3 stalls this model at a loss of ~0.6.)"""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        batch = rng.sample(rows, batch_size)
        prompts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                   for r in batch]
        fulls = [p + toy_completion(r, slip=rng.random() < slip_rate) + tokenizer.eos_token
                 for p, r in zip(prompts, batch)]
        enc = tokenizer(fulls, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc.input_ids.clone()
        labels[enc.attention_mask == 0] = -100
        for i, p in enumerate(prompts):  # left padding: the prompt ends where the completion starts
            n_completion = len(tokenizer(fulls[i], add_special_tokens=False).input_ids) - \
                len(tokenizer(p, add_special_tokens=False).input_ids)
            labels[i, : labels.shape[1] - n_completion] = -100
        position_ids = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, position_ids=position_ids,
                     labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def build_tiny(out_dir: str | Path, warmup_steps: int = 200, seed: int = 0) -> Path:
    """Build tokenizer + model + warm-up and `save_pretrained` both into `out_dir` (atomically)."""
    return atomic_build(Path(out_dir), lambda folder: write_tiny(folder, warmup_steps, seed))


def write_tiny(folder: Path, warmup_steps: int = 200, seed: int = 0) -> None:
    train_rows = arithmetic_rows(20_000, seed=1234, split="warmup")
    texts = []
    for r in train_rows[:5000]:
        texts += [r["prompt"][0]["content"], toy_completion(r), "user", "assistant"]
    tokenizer = build_tokenizer(texts)
    model = build_model(len(tokenizer), seed, tokenizer.eos_token_id, tokenizer.pad_token_id)
    supervised_warmup(model, tokenizer, train_rows, steps=warmup_steps, seed=seed)
    save_built(model, tokenizer, folder)


def save_built(model, tokenizer, folder: Path) -> None:
    """A built model and its tokenizer as a `from_pretrained` folder, generation stopping at the tokenizer's EOS."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def tiny_model_path() -> Path:
    """Where the built-in model lives; built on first use, the same weights on any machine (cache.py:
    `build_in_fixed_env`). Override the folder with MINIRL_CACHE."""
    return cached_model(f"tiny-arith-{BUILD_VERSION}", lambda folder: build_in_fixed_env("minirl.toy.tiny", folder),
                        "building the built-in tiny model (once, ~40 s)")


if __name__ == "__main__":  # python -m minirl.toy.tiny FOLDER [WARMUP_STEPS]: what build_in_fixed_env runs
    write_tiny(Path(sys.argv[1]), *map(int, sys.argv[2:3]))

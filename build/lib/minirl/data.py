"""Datasets: load rows from local files with `datasets`, check them, turn them into prompts.

The row format is veRL's, so data prepared for veRL trains here and ours trains there:

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "... Let's think step by step ..."}],   # a chat list
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...}}

Raw rows in three other shapes are converted on load, so a user can point minirl at them directly:
GSM8K (`question`, `answer` ending in "#### N"), MATH (`problem`, `answer`) and SimpleRL custom data
(`instruction`, `expected_output`, optional `reasoning_steps`), which trains as a math task.
`scripts/prepare_math_data.py` writes the converted rows to files.

The prompt order is a pure function of (seed, position), so a run can resume from its data position alone.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

GSM8K_SOURCE = "openai/gsm8k"                       # veRL's data_source names (not models to download)
MATH_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


class DataError(ValueError):
    """A missing file or a malformed row; the message names the file, the line and the field."""


# --- converters from raw formats -----------------------------------------------------------------------------

def gsm8k_row(raw: dict, index: int, split: str) -> dict:
    gold = raw["answer"].split("####")[-1].strip().replace(",", "")
    return _row(GSM8K_SOURCE, f"{raw['question']} {GSM8K_INSTRUCTION}", gold, split, index,
                {"answer": raw["answer"], "question": raw["question"]})


def math_row(raw: dict, index: int, split: str, data_source: str = MATH_SOURCE) -> dict:
    extra = {k: raw[k] for k in ("level", "type", "subject", "unique_id") if k in raw}
    return _row(data_source, f"{raw['problem']} {MATH_INSTRUCTION}", str(raw["answer"]), split, index, extra)


def simplerl_row(raw: dict, index: int, split: str) -> dict:
    """SimpleRL-reason custom data: {"instruction", "expected_output", "reasoning_steps"?} -> a math task."""
    extra = {"reasoning_steps": raw.get("reasoning_steps")} if raw.get("reasoning_steps") else {}
    return _row("simplerl_custom", f"{raw['instruction']} {MATH_INSTRUCTION}", str(raw["expected_output"]),
                split, index, extra)


def _row(data_source: str, content: str, ground_truth: str, split: str, index: int, extra: dict) -> dict:
    return {"data_source": data_source, "prompt": [{"role": "user", "content": content}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": index, **extra}}


# --- loading and checking ------------------------------------------------------------------------------------

def _where(path: str, i: int) -> str:
    return f"{path}, line {i + 1}" if path.endswith((".jsonl", ".json")) else f"{path}, row {i}"


def normalise_row(raw: dict, path: str, i: int, split: str = "train") -> dict:
    """Return a veRL row, converting raw GSM8K/MATH/SimpleRL rows; raise DataError naming what is missing."""
    if raw.get("prompt") is None and raw.get("data_source") is None:
        if raw.get("instruction") is not None:
            required, convert = ("instruction", "expected_output"), simplerl_row
        elif raw.get("question") is not None and "####" in str(raw.get("answer", "")):
            required, convert = ("question", "answer"), gsm8k_row
        elif raw.get("problem") is not None:
            required, convert = ("problem", "answer"), math_row
        else:
            fields = sorted(k for k, v in raw.items() if v is not None)
            raise DataError(f"{_where(path, i)}: unrecognised row with fields {fields}; expected veRL fields "
                            "(data_source, prompt, reward_model) or raw GSM8K/MATH/SimpleRL fields")
        for field in required:
            if raw.get(field) is None:
                raise DataError(f"{_where(path, i)}: missing field '{field}'")
        return convert(raw, i, split)
    for field in ("data_source", "prompt", "reward_model"):
        if raw.get(field) is None:
            raise DataError(f"{_where(path, i)}: missing field '{field}' (veRL rows need data_source, prompt, "
                            "reward_model.ground_truth)")
    prompt = raw["prompt"]
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in prompt):
        raise DataError(f"{_where(path, i)}: field 'prompt' must be a non-empty list of "
                        "{'role': ..., 'content': ...} messages")
    if not isinstance(raw["reward_model"], dict) or raw["reward_model"].get("ground_truth") is None:
        raise DataError(f"{_where(path, i)}: missing field 'reward_model.ground_truth'")
    return raw


def _check_json_lines(path: Path) -> None:
    """datasets reports a broken JSON line without its number; find it first."""
    with path.open() as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}, line {i + 1}: not valid JSON ({e.msg})") from None


def load_rows(files: str, split: str = "train", limit: int = 0) -> list[dict]:
    """Load comma-separated .jsonl/.json/.parquet files with `datasets.load_dataset`; check every row."""
    import datasets

    rows: list[dict] = []
    for name in [f.strip() for f in files.split(",") if f.strip()]:
        path = Path(name)
        if not path.is_file():
            raise DataError(f"data file {path} does not exist (for GSM8K/MATH run scripts/prepare_math_data.py; "
                            "the toy task's files are in data/)")
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
        if kind is None:
            raise DataError(f"data file {path}: unsupported extension {path.suffix!r}; use .jsonl, .json or "
                            ".parquet")
        if path.suffix == ".jsonl":
            _check_json_lines(path)
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
        n = len(ds) if not limit else min(limit - len(rows), len(ds))
        rows += [normalise_row(ds[i], str(path), i, split) for i in range(max(n, 0))]
    if not rows:
        raise DataError(f"no rows in {files!r}")
    return rows


def prompt_text(row: dict, tokenizer) -> str:
    """The prompt string the model sees: the chat template when the tokenizer has one, else the plain text."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in row["prompt"]) + "\n"


def drop_long_prompts(rows: list[dict], tokenizer, max_prompt_length: int, log=print) -> list[dict]:
    """The rows whose prompt fits in max_prompt_length tokens; says how many were dropped, and raises the
    config error when none is left."""
    def length(row: dict) -> int:
        return len(tokenizer(prompt_text(row, tokenizer), add_special_tokens=False).input_ids)
    kept = [r for r in rows if length(r) <= max_prompt_length]
    if len(kept) < len(rows):
        log(f"dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than "
            f"max_prompt_length={max_prompt_length}")
    if not kept:
        from minirl.config import ConfigError
        raise ConfigError(f"config key 'max_prompt_length': no training prompt fits in {max_prompt_length} "
                          "tokens; raise it")
    return kept


def prompt_indices(position: int, count: int, num_rows: int, seed: int) -> list[int]:
    """Rows number `position .. position+count-1` of an endless stream of seeded per-epoch shuffles."""
    perms: dict[int, torch.Tensor] = {}
    out = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, num_rows)
        if epoch not in perms:
            generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
            perms[epoch] = torch.randperm(num_rows, generator=generator)
        out.append(int(perms[epoch][offset]))
    return out

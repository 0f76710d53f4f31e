"""The vLLM rollout engine (minirl/engines): a vLLM server in its own environment, fed the trainer's weights.

Runs only where vLLM's environment exists (`make vllm` builds .venv-vllm and runs this file; MINIRL_VLLM_PYTHON
names another interpreter); skipped elsewhere. One server serves the whole module (it takes ~45 s to start).
"""
import copy
import os
import subprocess

import pytest
import torch

from conftest import ROOT

PYTHON = os.environ.get("MINIRL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 8+7?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 2+9?<|im_end|>\n<|im_start|>assistant\n"]


def _has_vllm() -> bool:
    if not os.path.exists(PYTHON):
        return False
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([PYTHON, "-c", check], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _has_vllm(), reason=f"no vLLM environment at {PYTHON} (make vllm)")


@pytest.fixture(scope="module")
def engine(tiny_path):
    from minirl.engines.vllm_engine import VLLMEngine
    eng = VLLMEngine(str(tiny_path), python=PYTHON, max_model_len=512, seed=0)
    yield eng
    eng.close()


@pytest.fixture()
def tiny(tiny_path):
    from minirl.models import load_model
    return load_model(str(tiny_path))


def greedy(sampler, model, tokenizer, **kw):
    return sampler(model, tokenizer, PROMPTS, group_size=2, max_new_tokens=10, greedy=True, **kw)


def test_greedy_outputs_equal_hfs(engine, tiny, tiny_tokenizer):
    from minirl.rollout import sample
    engine.push_weights(tiny)
    ours, theirs = greedy(sample, tiny, tiny_tokenizer), greedy(engine.sample, tiny, tiny_tokenizer)
    assert theirs.texts == ours.texts and torch.equal(theirs.response_mask, ours.response_mask)
    assert torch.equal(theirs.response_ids, ours.response_ids) and torch.equal(theirs.input_ids, ours.input_ids)
    assert "####" in ours.texts[0]                               # the toy model's answer format


def test_after_a_weight_push_the_engine_follows_the_new_weights(engine, tiny, tiny_tokenizer, random_model):
    from minirl.models import add_lora
    from minirl.rollout import sample
    engine.push_weights(tiny)
    before = greedy(engine.sample, tiny, tiny_tokenizer).texts
    assert greedy(engine.sample, random_model, tiny_tokenizer).texts == greedy(sample, random_model,
                                                                               tiny_tokenizer).texts != before
    lora = add_lora(copy.deepcopy(tiny), rank=4, alpha=8)   # an adapter that changes the outputs, merged on push
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5, generator=torch.Generator().manual_seed(0))
    ours = greedy(sample, lora, tiny_tokenizer).texts
    assert greedy(engine.sample, lora, tiny_tokenizer).texts == ours and ours != before
    stop = greedy(engine.sample, tiny, tiny_tokenizer, stop=["####"])   # and weights pushed back on change
    assert all(t.endswith("####") for t in stop.texts) and not stop.truncated.any()


def test_seeds_never_repeat_across_calls_and_samples_vary(engine, tiny, tiny_tokenizer):
    engine.push_weights(tiny)
    start = engine.next_seed
    a = engine.sample(tiny, tiny_tokenizer, PROMPTS, 4, 10, temperature=1.5)
    assert engine.next_seed == start + len(PROMPTS) * 4           # each prompt's G children: seeds s..s+G-1
    b = engine.sample(tiny, tiny_tokenizer, PROMPTS, 4, 10, temperature=1.5)
    assert a.texts != b.texts and len(set(a.texts)) > 3
    pad = tiny_tokenizer.pad_token_id
    assert a.response_ids.shape[0] == 12 and (a.response_ids[a.response_mask == 0] == pad).all()


def test_grpo_learns_the_toy_task_with_the_vllm_engine(engine, tmp_path, tiny_path):
    import json

    import train
    result = train.main(["--max_steps", "40", "--output_dir", str(tmp_path), "--val_max_samples", "100",
                         "--rollout_engine", "vllm", "--vllm_url", engine.url])
    rows = [r for line in (tmp_path / "metrics.jsonl").open() if "critic/reward/mean" in (r := json.loads(line))]
    first = sum(r["critic/reward/mean"] for r in rows[:10]) / 10
    last = sum(r["critic/reward/mean"] for r in rows[-10:]) / 10
    assert last > first + 0.1, (first, last)
    src = "val/test_score/toy_arithmetic"
    assert result["after"][src] > result["before"][src] + 0.15
    # the trainer recomputes the old log-probs from the tokens: on-policy, the ratio is exactly 1
    assert all(abs(r["actor/ppo_kl"]) < 1e-6 and r["actor/pg_clipfrac"] == 0 for r in rows)


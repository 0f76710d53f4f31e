"""Generation in chunks (rollout.sample with a key/value budget): the groups decode a chunk at a time, each chunk
whole groups, and the result is one batch's: the same tokens, masks, texts and sampler log-probs, and the same
random state afterwards, in minirl's decode loop and in Hugging Face generate."""
import pytest
import torch

import minirl.rollout as rollout
from minirl.engines import decode, hf_generate

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\n9+9?<|im_end|>\n<|im_start|>assistant\n"]
G, NEW = 4, 12


def ends_often(model, eos_id: int, boost: float):
    """The model with its EOS logit raised, so that rows end at ragged lengths."""
    bias = torch.zeros(model.config.vocab_size)
    bias[eos_id] = boost
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: out + bias.to(out.dtype))
    return model


def one_group_budget_gb(model, tokenizer) -> float:
    """A budget that holds one group of these prompts, not two."""
    width = tokenizer(PROMPTS, padding=True, add_special_tokens=False).input_ids
    return 1.5 * rollout.kv_bytes_per_row(model, len(width[0]) + NEW) * G / 2**30


@pytest.mark.parametrize("engine", ["decode", "generate"])
@pytest.mark.parametrize("settings", [dict(), dict(temperature=1.3, top_k=40), dict(greedy=True)],
                         ids=["T1", "T1.3-topk", "greedy"])
def test_chunked_generation_equals_one_batch_with_the_same_seed(monkeypatch, random_model, tiny_tokenizer, engine,
                                                                 settings):
    model = ends_often(random_model, tiny_tokenizer.eos_token_id, 0.5 if settings.get("greedy") else 4.0)
    if engine == "generate":
        monkeypatch.setattr(rollout, "shares_prompts", lambda *args: False)
    calls = []                                 # the prompts (decode) or rows (generate) each engine call takes
    for module, name, at in [(decode, "decode", 1), (hf_generate, "generate", 2)]:
        inner = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, inner=inner, at=at, **k: calls.append(len(a[at])) or
                            inner(*a, **k))
    results = []
    for budget in (0.0, one_group_budget_gb(model, tiny_tokenizer)):
        calls.clear()
        torch.manual_seed(0)
        r = rollout.sample(model, tiny_tokenizer, PROMPTS, G, NEW, kv_budget_gb=budget, **settings)
        results.append((r, torch.rand(1), list(calls)))
    (one, after_one, calls_one), (chunked, after_chunked, calls_chunked) = results
    rows_per_call = 1 if engine == "decode" else G      # decode takes the B prompts, generate the N rows
    assert calls_one == [3 * rows_per_call] and calls_chunked == [rows_per_call] * 3   # one group a chunk
    assert torch.equal(one.response_ids, chunked.response_ids) and one.texts == chunked.texts
    assert torch.equal(one.response_mask, chunked.response_mask) and torch.equal(one.truncated, chunked.truncated)
    assert torch.equal(after_one, after_chunked)                       # the same random numbers were drawn
    torch.testing.assert_close(one.sampler_logp, chunked.sampler_logp, rtol=0, atol=1e-5)  # other batch shapes
    assert (chunked.sampler_logp[chunked.response_mask == 0] == 0).all()
    lengths = one.response_mask.sum(1)
    if not settings.get("greedy"):  # ragged ends: chunks end at different steps (a later one replays the steps
        # an earlier one drew, and draws afresh past them)
        assert len(set(lengths.tolist())) > 2 and not one.truncated.all()
        assert len({int(lengths[i * G:(i + 1) * G].max()) for i in range(3)}) > 1


@pytest.mark.device_branch("rollout/kv-budget")
def test_chunk_size_follows_the_kv_budget_and_the_gpus_free_memory(monkeypatch, random_model):
    c = random_model.config
    per_row = c.num_hidden_layers * c.num_key_value_heads * 2 * (c.hidden_size // c.num_attention_heads) * 4 * 100
    assert rollout.kv_bytes_per_row(random_model, 100) == per_row               # fp32: 4 bytes an element
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert rollout.kv_bytes_per_row(random_model, 100) == per_row // 2       # the cache in autocast's dtype
    chunks = lambda **kw: [len(r) for r in rollout.chunk_groups(random_model, 10, 4, 100, **kw)]  # noqa: E731
    assert chunks() == [10]                                                      # CPU: no limit
    assert chunks(kv_budget_gb=3.5 * 4 * per_row / 2**30) == [3, 3, 3, 1]        # whole groups that fit
    assert chunks(kv_budget_gb=1e-9) == [1] * 10                                 # at least one group a chunk
    monkeypatch.setattr(rollout, "free_memory_bytes", lambda device: 8 * 4 * per_row)  # a GPU's free memory
    assert chunks() == [int(8 * rollout.KV_SHARE_OF_FREE)] * 2 + [10 - 2 * int(8 * rollout.KV_SHARE_OF_FREE)]
    assert chunks(kv_budget_gb=2 * 4 * per_row / 2**30) == [2] * 5               # the config's budget wins


def test_free_memory_is_no_limit_on_cpu():
    assert rollout.free_memory_bytes(torch.device("cpu")) is None

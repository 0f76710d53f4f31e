"""rollout.sample's decode loop (minirl/engines/decode.py: each prompt prefilled once, finished rows out of the batch)
gives what `generate` over the repeated rows gives with the same seed: the same tokens, masks, texts and
log-probs, and the same random state afterwards."""
import copy
import threading

import pytest
import torch

import minirl.rollout as rollout
import minirl.sampler as sampler
from minirl.logprobs import token_logprobs

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\n9+9?<|im_end|>\n<|im_start|>assistant\n"]


def ends_often(model, eos_id: int, boost: float = 3.0):
    """The model with its EOS logit raised, so that rows end at ragged lengths."""
    bias = torch.zeros(model.config.vocab_size)
    bias[eos_id] = boost
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: out + bias.to(out.dtype))
    return model


def both_paths(monkeypatch, model, tokenizer, seed=0, prompts=PROMPTS, **kw):
    """(decode loop's rollout, generate's rollout), each with its random draw after the call."""
    results = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(rollout, "shares_prompts", lambda *args: False)
            torch.manual_seed(seed)
            r = rollout.sample(model, tokenizer, prompts, **kw)
            results.append((r, torch.rand(1)))
    return results


def assert_same(fast, plain, model=None):
    (a, after_a), (b, after_b) = fast, plain
    assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.truncated, b.truncated)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)
    assert torch.equal(after_a, after_b)                 # the same random numbers were drawn
    if model is not None:
        R = a.response_ids.shape[1]
        la, _ = token_logprobs(model, a.input_ids, a.attention_mask, R)
        lb, _ = token_logprobs(model, b.input_ids, b.attention_mask, R)
        m = a.response_mask.bool()
        assert torch.allclose(la[m], lb[m], atol=1e-6)


@pytest.mark.parametrize("settings", [dict(), dict(temperature=1.4, top_k=40), dict(top_p=0.95, temperature=1.2),
                                      dict(greedy=True)], ids=["T1", "T1.4-topk", "topp", "greedy"])
def test_decode_loop_samples_what_generate_samples_with_ragged_ends(monkeypatch, random_model, tiny_tokenizer,
                                                                     settings):
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    fast, plain = both_paths(monkeypatch, model, tiny_tokenizer, group_size=4, max_new_tokens=12, **settings)
    assert_same(fast, plain, model)
    lengths = fast[0].response_mask.sum(1)
    assert fast[0].prompt_mask.sum(1).min() < fast[0].prompt_mask.sum(1).max()          # left padding
    if not settings.get("greedy"):
        assert len(set(lengths.tolist())) > 2 and fast[0].truncated.any() and not fast[0].truncated.all()


def test_decode_loop_is_exact_under_lora(monkeypatch, random_model, tiny_tokenizer):
    from minirl.models import add_lora
    model = add_lora(copy.deepcopy(random_model), rank=4, alpha=8)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)           # an adapter that changes the outputs (peft starts B at zero)
    model = ends_often(model, tiny_tokenizer.eos_token_id)
    fast, plain = both_paths(monkeypatch, model, tiny_tokenizer, group_size=3, max_new_tokens=10)
    assert_same(fast, plain, model)
    torch.manual_seed(0)
    base = rollout.sample(ends_often(random_model, tiny_tokenizer.eos_token_id), tiny_tokenizer, PROMPTS, 3, 10)
    assert base.texts != fast[0].texts                   # the adapter mattered


def test_decode_loop_matches_generate_in_bf16_autocast(monkeypatch, random_model, tiny_tokenizer):
    """bf16 matmuls of other batch shapes round differently: the two paths agree token for token on nearly
    every row, and the log-probs of their common tokens stay close."""
    model = ends_often(random_model, tiny_tokenizer.eos_token_id, boost=2.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, plain = both_paths(monkeypatch, model, tiny_tokenizer, group_size=4, max_new_tokens=10)
    a, b = fast[0], plain[0]
    same_rows = [i for i in range(len(a.texts)) if a.texts[i] == b.texts[i]]
    assert len(same_rows) >= 0.75 * len(a.texts), (a.texts, b.texts)


def test_finished_rows_leave_the_batch_and_prompts_run_once(monkeypatch, random_model, tiny_tokenizer):
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    import minirl.engines.decode as decode
    assert decode.check_model(model) is None        # the once-a-model check runs the loop: before the count
    shapes = []
    hook = model.register_forward_pre_hook(lambda mod, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    torch.manual_seed(0)
    r = rollout.sample(model, tiny_tokenizer, PROMPTS, group_size=4, max_new_tokens=12)
    hook.remove()
    P = r.prompt_ids.shape[1]
    assert shapes[0] == (len(PROMPTS), P - 1)                     # the prompts once, all but their last token
    rows = [s[0] for s in shapes[1:]]
    assert all(s[1] == 1 for s in shapes[1:]) and rows[0] == len(r.texts)
    assert rows == sorted(rows, reverse=True) and rows[-1] < rows[0]   # the batch shrinks as rows end
    still_running = [(r.response_mask.sum(1) >= t + 1).sum().item() for t in range(len(rows))]
    assert rows == still_running                                  # exactly the rows not yet ended


def test_stop_strings_end_rows_as_generate_ends_them(monkeypatch, random_model, tiny_tokenizer):
    torch.manual_seed(0)
    free = rollout.sample(random_model, tiny_tokenizer, PROMPTS, group_size=3, max_new_tokens=12)
    pieces = [tiny_tokenizer.decode(t).strip() for t in free.response_ids[:, 3].tolist()]
    stop = [p for p in pieces if p and "\ufffd" not in p][:2]
    fast, plain = both_paths(monkeypatch, random_model, tiny_tokenizer, group_size=3, max_new_tokens=12, stop=stop)
    assert_same(fast, plain)
    assert (~fast[0].truncated).sum() >= 2


def test_context_cap_and_short_prompts_keep_generates_answer(monkeypatch, random_model, tiny_tokenizer):
    """max_position_embeddings caps the budget the same way; a one-token prompt goes to generate."""
    random_model.config.max_position_embeddings = 40
    with pytest.warns(UserWarning, match="context"):
        fast, plain = both_paths(monkeypatch, random_model, tiny_tokenizer, group_size=2, max_new_tokens=30)
    assert_same(fast, plain)
    r = fast[0]   # each row's own prompt and response fit the context: the shorter prompt gets the longer budget
    used = r.prompt_mask.sum(1) + r.response_mask.sum(1)
    assert (used <= 40).all() and used.max() == 40 and r.response_mask.sum(1).max() > 40 - r.prompt_ids.shape[1]
    assert not rollout.shares_prompts(random_model, 1) and rollout.shares_prompts(random_model, 2)


def test_models_the_loop_cannot_take_go_to_generate(monkeypatch, random_model, tiny_tokenizer):
    import minirl.engines.decode as decode
    calls = []
    generate = random_model.generate
    monkeypatch.setattr(random_model, "generate", lambda *a, **k: calls.append(1) or generate(*a, **k))
    torch.manual_seed(0)
    rollout.sample(random_model, tiny_tokenizer, PROMPTS, 2, 6)
    assert calls == []
    import transformers as T
    dynamic = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=16,
                                               rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                                    rope_theta=10000.0)))
    assert not rollout.shares_prompts(dynamic, 10) and rollout.shares_prompts(random_model, 10)
    with monkeypatch.context() as m:
        m.setattr(decode, "_plain_attention_cache", lambda cache: False)   # e.g. linear-attention states
        torch.manual_seed(0)
        a = rollout.sample(random_model, tiny_tokenizer, PROMPTS, 2, 6)
    assert calls == [1]
    torch.manual_seed(0)
    assert rollout.sample(random_model, tiny_tokenizer, PROMPTS, 2, 6).texts == a.texts


def test_decode_loop_is_exact_on_fsdps_gathered_model(tmp_path):
    """2 processes (torchrun, gloo): under FSDP's gathered weights the loop samples what generate samples."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    out = tmp_path / "rollouts.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "tests" / "core" / "dist_rollout_worker.py"), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(out)
    assert torch.equal(got["loop"], got["generate"]) and got["loop"].shape == (6, 10)


def test_rollout_engine_config_errors_name_the_key_and_the_fix(tmp_path):
    from minirl.config import ConfigError, parse_config
    with pytest.raises(ConfigError, match="rollout_engine.*not one of"):
        parse_config(["--rollout_engine", "sglang"])
    with pytest.raises(ConfigError, match="vllm_python.*make vllm"):
        parse_config(["--rollout_engine", "vllm", "--vllm_python", str(tmp_path / "none")])
    with pytest.raises(ConfigError, match="rollout_engine.*fsdp"):
        parse_config(["--rollout_engine", "vllm", "--vllm_url", "http://127.0.0.1:1", "--fsdp", "true"])
    assert parse_config(["--rollout_engine", "vllm", "--vllm_url", "http://127.0.0.1:1"]).rollout_engine == "vllm"



@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_decode_cache_is_written_in_place_and_the_prompt_kept_once(monkeypatch, random_model, tiny_tokenizer,
                                                                         attention):
    """Each layer's keys and values live in one buffer for the whole rollout (DynamicLayer's torch.cat copied
    the whole cache at every step), rows that leave compacted in place (no new buffer); with sdpa the prompt's keys and values
    are kept once per prompt (B rows, not B*G) and attended in two parts. Either way generate's samples."""
    from transformers.cache_utils import DynamicCache
    import minirl.engines.decode as decode
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    model.set_attn_implementation(attention)
    kind = decode._SharedPrefix if attention == "sdpa" else decode._Preallocated
    writes, caches, attended = [], [], []
    real_update, real_attend = kind.update, decode._SharedPrefix.attend

    def update(self, *args, **kwargs):
        writes.append((id(self), self._k.data_ptr(), self._k.shape[0]))
        return real_update(self, *args, **kwargs)

    def attend(self, *args, **kwargs):
        attended.append(self)
        return real_attend(self, *args, **kwargs)

    assert decode.check_model(model) is None        # the once-a-model check runs the loop: before the count
    monkeypatch.setattr(kind, "update", update)
    monkeypatch.setattr(decode._SharedPrefix, "attend", attend)
    hook = model.register_forward_pre_hook(
        lambda mod, args, kw: caches.append(kw.get("past_key_values")), with_kwargs=True)
    fast, plain = both_paths(monkeypatch, model, tiny_tokenizer, group_size=4, max_new_tokens=12)
    hook.remove()
    assert_same(fast, plain, model)
    cache = next(c for c in caches if isinstance(c, DynamicCache))
    assert all(type(layer) is kind for layer in cache.layers)
    assert bool(attended) == (attention == "sdpa")
    if attention == "sdpa":
        assert all(layer.prompt_k.shape[0] == len(PROMPTS) for layer in cache.layers)
    assert all(c._attn_implementation == attention for c in [model.config])   # restored after the call
    first = [w for w in writes if w[0] == id(cache.layers[0])]
    assert len(first) > 2
    assert len({ptr for _, ptr, _ in first}) == 1    # one buffer throughout, though rows left the batch
    assert fast[0].response_mask.sum(1).unique().numel() > 2


def test_two_part_attention_is_attention_over_the_whole_sequence():
    """_SharedPrefix.attend (group queries over the shared prompt, rows over their own tokens, merged by
    log-sum-exp) against SDPA over each row's concatenated keys, with GQA, left padding and rows dropped; and the
    fallback's rebuilt keys are that concatenation."""
    import torch.nn.functional as F
    from transformers.cache_utils import DynamicLayer
    from minirl.engines.decode import _SharedPrefix
    torch.manual_seed(0)
    B, G, kv_heads, rep, P1, D, t = 3, 4, 2, 3, 7, 16, 5
    layer = DynamicLayer()
    layer.update(torch.randn(B, kv_heads, P1, D), torch.randn(B, kv_heads, P1, D))
    prefix_mask = torch.ones(B, P1, dtype=torch.long)
    prefix_mask[1, :3] = 0                                                  # left padding
    shared = _SharedPrefix(layer, prefix_mask, G, capacity=t + 2)
    for _ in range(t):
        shared.update(torch.randn(B * G, kv_heads, 1, D), torch.randn(B * G, kv_heads, 1, D))
    shared.reorder_cache(torch.tensor([0, 2, 3, 5, 8, 11]))                # rows that are still running
    n = len(shared.rows)
    q = torch.randn(n, kv_heads * rep, 1, D)
    out = shared.attend(q, shared.keys, shared.values, scale=0.3)          # (n, 1, H, D)
    k, v, bias = shared.full(shared.keys, shared.values)                    # (n, Hkv, P1 + t, D)
    mask = torch.cat([prefix_mask[shared.rows // G], torch.ones(n, t, dtype=torch.long)], 1).bool()
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                          attn_mask=mask[:, None, None, :], scale=0.3)
    assert torch.allclose(out, want.transpose(1, 2), atol=1e-5)
    assert torch.equal(k[:, :, :P1], layer.keys[shared.rows // G])
    assert torch.equal(bias[:, 0, 0] == 0, mask)                             # the fallback's mask: the padding


def test_two_part_attention_falls_back_to_sdpa_over_the_whole_sequence_for_calls_it_does_not_cover():
    """A call with more than one query (or softcapping, a window, sinks) gets transformers' sdpa over the
    rebuilt keys and values, with the prompt's padding masked: the same numbers as the two-part path."""
    import minirl.engines.decode_cache as decode
    from transformers.cache_utils import DynamicLayer
    torch.manual_seed(1)
    B, G, kv_heads, rep, P1, D = 2, 2, 1, 2, 4, 8
    layer = DynamicLayer()
    layer.update(torch.randn(B, kv_heads, P1, D), torch.randn(B, kv_heads, P1, D))
    prefix_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    shared = decode._SharedPrefix(layer, prefix_mask, G, capacity=4)
    shared.update(torch.randn(B * G, kv_heads, 2, D), torch.randn(B * G, kv_heads, 2, D))

    class Module(torch.nn.Module):
        layer_idx, num_key_value_groups, is_causal = 0, rep, False

    class Cache:
        layers = [shared]

    q = torch.randn(B * G, kv_heads * rep, 1, D)
    decode._active.cache = Cache()
    try:
        one, _ = decode._shared_prefix_attention(Module(), q, shared.keys, shared.values, None, scaling=0.5)
        two, _ = decode._shared_prefix_attention(Module(), q.repeat(1, 1, 2, 1), shared.keys, shared.values,
                                                 None, scaling=0.5)      # 2 queries: the fallback
    finally:
        decode._active.cache = None
    assert torch.allclose(two[:, :1], one, atol=1e-5) and torch.allclose(two[:, 1:], one, atol=1e-5)


def test_packed_linears_serve_only_the_decoding_thread_and_are_removed_after(monkeypatch, random_model,
                                                                            tiny_tokenizer):
    """oneDNN-packed nn.Linear forwards run while this thread decodes (no grad); a call with grad enabled (a
    trainer) gets the module's own forward, and nothing of the swap is left afterwards."""
    import minirl.engines.decode as decode
    calls, own = [], []
    real, linear = decode._packed_linear, torch.nn.Linear.forward

    def counting(module, packed, bias, thread, x):
        calls.append(threading.get_ident() == thread)
        if len(calls) == 1:      # the first packed call: the same module with grad enabled runs its own forward
            with torch.enable_grad():
                real(module, packed, bias, thread, x)
            assert own == [module]
        return real(module, packed, bias, thread, x)

    def own_forward(module, x):
        own.append(module)
        return linear(module, x)

    assert decode.check_model(random_model) is None     # the once-a-model check runs the loop: before the count
    monkeypatch.setattr(decode, "_packed_linear", counting)
    monkeypatch.setattr(torch.nn.Linear, "forward", own_forward)
    fast, plain = both_paths(monkeypatch, random_model, tiny_tokenizer, group_size=2, max_new_tokens=6)
    assert_same(fast, plain)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch build: nothing is packed")
    assert calls and all(calls)
    assert not any("forward" in m.__dict__ for m in random_model.modules())


LONG_PROMPT = ("<|im_start|>user\nWhat is 12+45 and then a longer tail with many more words in it, and more, "
               "and more?<|im_end|>\n<|im_start|>assistant\n")


def small_model(tokenizer, kind: str, **config):
    """A tiny random causal LM of another family (2 layers, GQA 4:2), weights large enough to sample varied text."""
    import transformers
    cfg = getattr(transformers, kind + "Config")(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **config)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, kind + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for w in model.parameters():
            if w.dim() > 1:
                w.normal_(std=0.3)
    return ends_often(model, tokenizer.eos_token_id)


def test_sliding_window_layers_keep_the_prompts_padding_masked(monkeypatch, tiny_tokenizer):
    """A model with sliding-window layers (their cache stays transformers'): rows of a short, left-padded prompt
    must not attend to the padding (the two-part attention is off for such a model)."""
    model = small_model(tiny_tokenizer, "Mistral", sliding_window=24)
    results = both_paths(monkeypatch, model, tiny_tokenizer, prompts=[PROMPTS[0], LONG_PROMPT, PROMPTS[2]],
                         group_size=3, max_new_tokens=16)
    assert results[0][0].prompt_mask.sum(1).min() < 24 < results[0][0].prompt_mask.shape[1]   # padding in window
    assert_same(*results)


def test_a_one_token_prompt_beside_longer_ones_samples_what_generate_samples(monkeypatch, random_model,
                                                                            tiny_tokenizer):
    """A one-token prompt has no prefix before its last token: its part of the two-part attention weighs 0."""
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    long = tiny_tokenizer(LONG_PROMPT, add_special_tokens=False).input_ids
    results = both_paths(monkeypatch, model, tiny_tokenizer, prompts=[[long[3]], long], group_size=2,
                         max_new_tokens=8)
    assert_same(*results, model)


def test_decodes_in_two_threads_on_one_model_give_the_sequential_results(random_model, tiny_tokenizer):
    """Two rollouts of the same model at once (a session's sampler beside an evaluation): each gets what it
    gets alone, and nothing of either decode (configs, Linear forwards) is left behind."""
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    jobs = [(PROMPTS, 4, 24), ([LONG_PROMPT], 2, 6)] * 3
    alone = [rollout.sample(model, tiny_tokenizer, p, group_size=g, max_new_tokens=r, greedy=True).response_ids
             for p, g, r in jobs]
    together, errors = [None] * len(jobs), []

    def run(k):
        try:
            p, g, r = jobs[k]
            together[k] = rollout.sample(model, tiny_tokenizer, p, group_size=g, max_new_tokens=r,
                                         greedy=True).response_ids
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(torch.equal(a, b) for a, b in zip(alone, together))
    assert model.config._attn_implementation == "sdpa"
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_bf16_caches_take_the_one_buffer_path_not_the_two_part_attention(monkeypatch, random_model,
                                                                        tiny_tokenizer):
    """The two parts of the two-part attention are rounded apart; in bf16 that changes samples, so a bf16
    model's decode keeps each row's whole sequence in one buffer, as generate attends."""
    import minirl.engines.decode as decode
    model = ends_often(random_model.to(torch.bfloat16), tiny_tokenizer.eos_token_id)
    kinds = []
    real = decode._Preallocated.__init__

    def init(self, *args, **kwargs):
        kinds.append(type(self))
        real(self, *args, **kwargs)

    monkeypatch.setattr(decode._Preallocated, "__init__", init)
    monkeypatch.setattr(decode._SharedPrefix, "__init__", lambda *a, **k: kinds.append("shared") or None)
    torch.manual_seed(0)
    rollout.sample(model, tiny_tokenizer, PROMPTS, group_size=2, max_new_tokens=4)
    assert kinds and "shared" not in kinds


@pytest.mark.parametrize("settings", [dict(), dict(temperature=1.3, top_k=300)], ids=["T1", "topk"])
def test_a_large_vocabulary_takes_the_two_level_noise_in_both_paths(monkeypatch, tiny_tokenizer, settings):
    """Over sampler.GUMBEL_ONE_LEVEL entries both paths draw the noise in two levels (sampler.gumbel_argmax):
    the same tokens and random state, and tokens from many of the vocabulary's blocks."""
    from minirl.toy.tiny import build_model
    V = sampler.GUMBEL_ONE_LEVEL * 2 + 77                              # 33 blocks, the last one padded
    model = build_model(V, seed=1, eos_id=tiny_tokenizer.eos_token_id, pad_id=tiny_tokenizer.pad_token_id)
    fast, plain = both_paths(monkeypatch, ends_often(model, tiny_tokenizer.eos_token_id, boost=6.0),
                             tiny_tokenizer, group_size=4, max_new_tokens=12, **settings)
    assert_same(fast, plain, model)
    r = fast[0]
    drawn = r.response_ids[r.response_mask.bool()]
    assert len(set((drawn // sampler.GUMBEL_BLOCK).tolist())) > 10 and len(set(r.response_mask.sum(1).tolist())) > 2

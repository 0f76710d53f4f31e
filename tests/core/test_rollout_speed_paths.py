"""rollout.sample's decode loop (minirl/decode.py: each prompt prefilled once, finished rows out of the batch)
gives what `generate` over the repeated rows gives with the same seed: the same tokens, masks, texts and
log-probs, and the same random state afterwards."""
import copy

import pytest
import torch

import minirl.rollout as rollout
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


def both_paths(monkeypatch, model, tokenizer, seed=0, **kw):
    """(decode loop's rollout, generate's rollout), each with its random draw after the call."""
    results = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(rollout, "shares_prompts", lambda *args: False)
            torch.manual_seed(seed)
            r = rollout.sample(model, tokenizer, PROMPTS, **kw)
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
    assert fast[0].input_ids.shape[1] == 40
    assert not rollout.shares_prompts(random_model, 1) and rollout.shares_prompts(random_model, 2)


def test_models_the_loop_cannot_take_go_to_generate(monkeypatch, random_model, tiny_tokenizer):
    import minirl.decode as decode
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

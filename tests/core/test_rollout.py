import pytest
import torch

from minirl.logprobs import chunked_logprobs, token_logprobs
from minirl.rollout import response_mask_from_ids, sample
from conftest import assert_close_at_scale

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n"]


def test_response_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    mask, truncated = response_mask_from_ids(ids, eos_ids=[2])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_left_padded_prompt_gives_same_greedy_output_as_unpadded(random_model, tiny_tokenizer):
    batched = sample(random_model, tiny_tokenizer, PROMPTS, group_size=1, max_new_tokens=6, greedy=True)
    for i, p in enumerate(PROMPTS):
        alone = sample(random_model, tiny_tokenizer, [p], group_size=1, max_new_tokens=6, greedy=True)
        n = int(alone.response_mask.sum())
        assert batched.response_ids[i, :n].tolist() == alone.response_ids[0, :n].tolist()
        assert batched.texts[i] == alone.texts[0]
    assert batched.prompt_mask[0].sum() < batched.prompt_mask[1].sum()  # the first one really was padded


def test_generation_ends_at_the_token_that_completes_a_stop_string(random_model, tiny_tokenizer):
    torch.manual_seed(0)
    full = sample(random_model, tiny_tokenizer, PROMPTS[:1], group_size=1, max_new_tokens=12)
    ids, piece = full.response_ids[0].tolist(), tiny_tokenizer.decode
    k = next(k for k in range(2, len(ids)) if piece(ids[k]).strip() and "\ufffd" not in piece(ids[k])
             and piece(ids[k]).strip() not in piece(ids[:k]))
    stop = piece(ids[k]).strip()
    torch.manual_seed(0)
    cut = sample(random_model, tiny_tokenizer, PROMPTS[:1], group_size=1, max_new_tokens=12, stop=[stop])
    assert cut.response_mask[0].sum() == k + 1 and cut.response_ids[0, :k + 1].tolist() == ids[:k + 1]
    assert cut.response_ids.shape[1] == k + 1       # generation itself ended there, not a cut afterwards
    assert not cut.truncated[0] and cut.texts[0].endswith(stop)


def test_sample_shapes_groups_and_masks(random_model, tiny_tokenizer):
    torch.manual_seed(0)
    r = sample(random_model, tiny_tokenizer, PROMPTS, group_size=3, max_new_tokens=5)
    N = 6
    assert r.prompt_ids.shape[0] == N and r.response_ids.shape[0] == N and len(r.texts) == N
    assert r.response_ids.shape[1] <= 5 and r.truncated.shape == (N,)
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[2]) and not torch.equal(r.prompt_ids[2], r.prompt_ids[3])
    pad = tiny_tokenizer.pad_token_id
    assert (r.response_ids[r.response_mask == 0] == pad).all()
    lengths = r.response_mask.sum(1)
    assert ((lengths == r.response_ids.shape[1]) | ~r.truncated).all()  # truncated => used the whole budget


def test_model_generation_config_cannot_change_sampling(random_model, tiny_tokenizer):
    base = sample(random_model, tiny_tokenizer, PROMPTS, 1, 6, greedy=True).texts
    random_model.generation_config.repetition_penalty = 50.0
    random_model.generation_config.max_new_tokens = 1
    random_model.generation_config.no_repeat_ngram_size = 1
    # fields whose global default is None: generate would fill them from the model's config
    random_model.generation_config.min_new_tokens = 6
    random_model.generation_config.suppress_tokens = list(range(3, 200))
    random_model.generation_config.sequence_bias = {(5,): 50.0}
    assert sample(random_model, tiny_tokenizer, PROMPTS, 1, 6, greedy=True).texts == base
    torch.manual_seed(0)
    sampled = sample(random_model, tiny_tokenizer, PROMPTS, 2, 6).texts
    random_model.generation_config = type(random_model.generation_config)()
    torch.manual_seed(0)
    assert sample(random_model, tiny_tokenizer, PROMPTS, 2, 6).texts == sampled
    assert random_model.generation_config.suppress_tokens is None  # the model's own config is put back


def test_generation_uses_kv_cache_with_gradient_checkpointing_on(random_model, tiny_tokenizer):
    base = sample(random_model, tiny_tokenizer, PROMPTS, 1, 6, greedy=True).texts
    from minirl.models import enable_gradient_checkpointing
    enable_gradient_checkpointing(random_model)
    random_model.train()
    calls = []
    orig = random_model.forward

    def spy(*args, **kwargs):
        calls.append(kwargs.get("past_key_values") is not None and kwargs["input_ids"].shape[1] == 1)
        return orig(*args, **kwargs)

    random_model.forward = spy
    assert sample(random_model, tiny_tokenizer, PROMPTS, 1, 6, greedy=True).texts == base
    assert random_model.training  # training mode restored afterwards
    assert sum(calls) >= 1        # decoding steps fed one token against a cache


def test_token_logprobs_match_naive_log_softmax_and_ignore_padding(random_model, tiny_tokenizer):
    torch.manual_seed(0)
    r = sample(random_model, tiny_tokenizer, PROMPTS, group_size=2, max_new_tokens=5)
    R = r.response_ids.shape[1]
    ids, attn = r.input_ids, r.attention_mask
    logp, ent = token_logprobs(random_model, ids, attn, R, chunk_tokens=3, with_entropy=True)
    logp_grad_path, none = token_logprobs(random_model, ids, attn, R, chunk_tokens=5)
    assert none is None and torch.allclose(logp_grad_path, logp, atol=1e-6)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = random_model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    naive = torch.log_softmax(logits.float(), -1)[:, -R - 1:-1].gather(-1, ids[:, -R:, None]).squeeze(-1)
    m = r.response_mask.bool()
    assert torch.allclose(logp[m], naive[m], atol=1e-5)
    naive_ent = -(torch.softmax(logits.float(), -1) * torch.log_softmax(logits.float(), -1)).sum(-1)[:, -R - 1:-1]
    assert torch.allclose(ent[m], naive_ent[m], atol=1e-4)
    # row 2 alone (no left padding needed for it): same log-probs as inside the padded batch
    row = 0  # the shorter prompt, left-padded in the batch
    keep = attn[row].bool()
    alone, _ = token_logprobs(random_model, ids[row:row + 1, keep], attn[row:row + 1, keep], R)
    assert torch.allclose(alone[0][m[row]], logp[row][m[row]], atol=1e-5)


def test_logprobs_at_a_temperature_are_those_generate_sampled_from(random_model, tiny_tokenizer):
    """At T=0.6 the trainer's log-probs of the sampled tokens equal generate's own (processed) scores."""
    from transformers import GenerationConfig
    enc = tiny_tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = random_model.generate(**enc, generation_config=GenerationConfig(
        do_sample=True, temperature=0.6, top_k=0, top_p=1.0, max_new_tokens=6,
        pad_token_id=tiny_tokenizer.pad_token_id, output_scores=True, return_dict_in_generate=True))
    R = len(out.scores)
    response = out.sequences[:, -R:]
    expected = torch.stack([torch.log_softmax(s.float(), -1).gather(-1, response[:, t:t + 1]).squeeze(-1)
                            for t, s in enumerate(out.scores)], dim=1)                      # (N, R)
    mask, _ = response_mask_from_ids(response, [tiny_tokenizer.eos_token_id])
    attn = torch.cat([enc.attention_mask, mask], dim=1)
    logp, _ = token_logprobs(random_model, out.sequences, attn, R, temperature=0.6)
    assert mask.sum() > 4 and torch.allclose(logp[mask == 1], expected[mask == 1], atol=1e-4)
    at_one, _ = token_logprobs(random_model, out.sequences, attn, R)
    assert not torch.allclose(at_one[mask == 1], expected[mask == 1], atol=1e-2)  # T=1: another policy


def test_gumbel_sampling_draws_from_the_tempered_truncated_softmax():
    """argmax(processed scores + Gumbel noise) has the distribution generate's multinomial sampling would:
    softmax(logits / T) over the top-k, and never a filtered token."""
    from minirl.sampler import sampling_processors
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]]).repeat(40000, 1)         # (n, V)
    scores = logits.clone()
    for proc in sampling_processors(temperature=0.7, top_p=1.0, top_k=4):
        scores = proc(None, scores)
    counts = torch.bincount(scores.argmax(-1), minlength=6).float() / len(scores)
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.5, -float("inf"), -float("inf"), 3.0]) / 0.7, -1)
    assert counts[3] == 0 and counts[4] == 0                            # cut by top-k
    assert torch.allclose(counts, expected, atol=0.01), (counts, expected)   # 40k draws: std < 0.0025
    assert not torch.allclose(counts, torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0]), -1), atol=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("vocab", [600, 5000], ids=["one-level", "two-level"])
def test_gumbel_noise_never_picks_a_filtered_token_even_when_the_uniform_is_zero(monkeypatch, vocab, dtype):
    from minirl.sampler import GumbelNoise
    monkeypatch.setattr(torch, "rand", lambda *shape, dtype=None, **kw: torch.zeros(*shape, dtype=dtype))
    scores = torch.full((1, vocab), -float("inf"), dtype=dtype)
    scores[0, 300] = 5.0                                 # the only kept entry, in the second block
    assert GumbelNoise()(None, scores).argmax(-1).item() == 300


def test_the_two_level_gumbel_draw_samples_the_softmax_over_a_large_vocabulary():
    """Over GUMBEL_ONE_LEVEL entries gumbel_argmax draws a block, then an entry of it: 40k draws over 40 kept
    entries spread over all 17 blocks (the last one padded) match softmax(scores); the rest are never drawn."""
    from minirl.sampler import GUMBEL_BLOCK, GUMBEL_ONE_LEVEL, gumbel_argmax, gumbel_uniforms
    torch.manual_seed(0)
    V, n = GUMBEL_ONE_LEVEL + 100, 40000
    kept = torch.randperm(V)[:40]
    kept[0] = V - 1                                                  # one in the padded last block
    logits = torch.full((V,), -float("inf"))
    logits[kept] = torch.randn(40) * 1.5
    assert len(set((kept // GUMBEL_BLOCK).tolist())) > 12            # spread over the blocks
    tokens = torch.cat([gumbel_argmax(logits.repeat(n // 8, 1), gumbel_uniforms(n // 8, V)) for _ in range(8)])
    counts = torch.bincount(tokens, minlength=V).double() / n
    p = torch.softmax(logits.double(), -1)
    assert counts[p == 0].sum() == 0
    z = (counts - p)[kept].abs() / (p * (1 - p) / n).sqrt()[kept]
    assert z.max() < 4.5, z                                          # 40 entries: |z| > 4.5 has p ~ 3e-4 in all


def test_the_two_level_draw_of_bf16_scores_is_the_draw_of_the_same_scores_in_fp32():
    """The blocks' logsumexps are taken in fp32: rounded to bf16 they would move a block's odds by up to 6%."""
    from minirl.sampler import gumbel_argmax, gumbel_uniforms
    torch.manual_seed(0)
    scores = (torch.randn(2000, 5000) * 3 + 20).bfloat16()
    uniforms = gumbel_uniforms(*scores.shape)
    assert torch.equal(gumbel_argmax(scores, uniforms.clone()), gumbel_argmax(scores.float(), uniforms.clone()))


def test_the_sampling_noise_of_a_small_vocabulary_is_one_uniform_an_entry():
    """Up to GUMBEL_ONE_LEVEL entries the draw is argmax(scores + Gumbel(U)) with U = torch.rand(N, V)."""
    from minirl.sampler import GUMBEL_ONE_LEVEL, add_gumbel_noise, gumbel_argmax, gumbel_uniforms
    scores = torch.randn(64, GUMBEL_ONE_LEVEL)
    torch.manual_seed(3)
    tokens = gumbel_argmax(scores, gumbel_uniforms(*scores.shape))
    torch.manual_seed(3)
    assert torch.equal(tokens, add_gumbel_noise(scores, torch.rand(scores.shape)).argmax(-1))


def test_chunked_logprobs_gradients_are_the_same_with_and_without_recomputing(monkeypatch):
    """Below LOGITS_PER_CHUNK the chunks keep their logits for backward; above it they are recomputed. Both give
    the same log-probs, entropies and gradients."""
    from minirl import logprobs as policy
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    h0, y = torch.randn(3, 7, 8), torch.randint(0, 50, (3, 7))
    results = []
    for budget in (policy.LOGITS_PER_CHUNK, 16):       # 3*7*50 logits: kept, then recomputed (budget 16)
        monkeypatch.setattr(policy, "LOGITS_PER_CHUNK", budget)
        h = h0.clone().requires_grad_()
        head.zero_grad()
        lp, ent = policy.chunked_logprobs(h, y, head, temperature=0.7, chunk_tokens=4, with_entropy=True)
        (lp * torch.arange(21.0).view(3, 7)).sum().backward()
        results.append((lp.detach(), ent, h.grad, head.weight.grad.clone()))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-6)
    naive = torch.log_softmax(head(h0) / 0.7, -1).gather(-1, y[..., None]).squeeze(-1)
    assert torch.allclose(results[0][0], naive, atol=1e-5)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_prompt_shared_by_its_group_runs_once_with_the_same_logprobs_and_gradients(random_model, tiny_tokenizer,
                                                                                     lora):
    """Rows of a group share their prompt's KV cache instead of each running it: the same log-probs, entropies
    and gradients as one pass over every row, with prompts of different lengths (left padding)."""
    import copy

    from minirl.models import add_lora
    from minirl.logprobs import states_before_responses
    model = add_lora(copy.deepcopy(random_model), rank=4, alpha=8) if lora else copy.deepcopy(random_model)
    model.train()
    torch.manual_seed(0)
    r = sample(model, tiny_tokenizer, PROMPTS, group_size=3, max_new_tokens=5)
    ids, attn, R = r.input_ids, r.attention_mask, r.response_ids.shape[1]
    calls = []
    decoder = model.get_decoder()
    hook = decoder.register_forward_pre_hook(lambda mod, args, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
    results = []
    for share in (True, False):
        calls.clear()
        model.zero_grad(set_to_none=True)
        hidden = states_before_responses(model, ids, attn, R, share_prompts=share)
        logp, ent = chunked_logprobs(hidden, ids[:, -R:], model.get_output_embeddings(), with_entropy=True)
        (logp * r.response_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((hidden.detach(), logp.detach(), ent, grads, list(calls)))
    calls.clear()
    with torch.no_grad():
        token_logprobs(model, ids, attn, R)  # shares by default
    hook.remove()
    shared, plain = results
    assert [tuple(c) for c in shared[4]] == [(len(PROMPTS), ids.shape[1] - R), (len(ids), R)]  # prompts once
    assert [tuple(c) for c in calls] == [(len(PROMPTS), ids.shape[1] - R), (len(ids), R)]
    assert [tuple(c) for c in plain[4]] == [tuple(ids.shape)]
    m = r.response_mask.bool()
    assert torch.allclose(shared[0], plain[0], atol=1e-5)
    assert torch.allclose(shared[1][m], plain[1][m], atol=1e-5) and torch.allclose(shared[2][m], plain[2][m], atol=1e-4)
    assert shared[3].keys() == plain[3].keys() and len(shared[3]) > 0
    assert_close_at_scale(shared[3], plain[3])


def test_hybrid_linear_attention_models_fall_back_to_one_pass_per_row():
    """Qwen3-Next's linear-attention layers write their cache state in place: sharing the prompt would break
    backward, so their rows run the plain way (the same gradients, no error)."""
    import transformers as T

    from minirl.logprobs import states_before_responses
    config = T.Qwen3NextConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, head_dim=8,
                               linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                               linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                               shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    model = T.Qwen3NextForCausalLM(config).train()
    ids = torch.randint(5, 97, (6, 12))
    ids[1:3, :8], ids[4:, :8] = ids[0, :8], ids[3, :8]                    # two groups of 3 sharing 8 prompt tokens
    attn = torch.ones_like(ids)
    grads = []
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        states_before_responses(model, ids, attn, 4, share_prompts=share).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert_close_at_scale(grads[0], grads[1])

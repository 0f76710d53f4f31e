"""The architecture matrix: on tiny random models of the families users train, the trainer's log-probs (chunked
LM head, prompt sharing, left padding) are those of the model's own logits and of what `generate` sampled.

Each case: 2 prompts x 2 samples, one prompt left-padded, two responses cut short (as by an EOS); fp32.
"""
import pytest
import torch
import transformers as T
from transformers import GenerationConfig

from minirl import logprobs
from minirl.logprobs import _token_logprobs_unsharded, logprobs_by_definition, token_logprobs
from minirl.models import disable_dropout
from minirl.rollout import response_mask_from_ids

V, P, R, TEMP = 128, 7, 6, 0.7
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# the long-context RoPE cases: P <= original context < P + R, so the frequencies switch inside the batch
ORIGINAL = 10
LONGROPE = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 4, long_factor=[3.0, 5.0, 7.0, 9.0],
                original_max_position_embeddings=ORIGINAL)

ARCHITECTURES = {
    "qwen2": lambda: T.Qwen2Config(**COMMON),
    "qwen3": lambda: T.Qwen3Config(**COMMON, head_dim=8),
    "qwen2_moe": lambda: T.Qwen2MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                          shared_expert_intermediate_size=16),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(**COMMON, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=16),
    "llama": lambda: T.LlamaConfig(**COMMON),
    "llama_dynamic_rope": lambda: T.LlamaConfig(**{**COMMON, "max_position_embeddings": ORIGINAL},
                                                rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                                     rope_theta=10000.0)),
    "mistral": lambda: T.MistralConfig(**COMMON),
    "gemma": lambda: T.GemmaConfig(**COMMON, head_dim=8),
    "gemma2": lambda: T.Gemma2Config(**COMMON, head_dim=8, final_logit_softcapping=0.5, attn_logit_softcapping=5.0,
                                     query_pre_attn_scalar=8, sliding_window=4),
    "gemma3_text": lambda: T.Gemma3TextConfig(**COMMON, head_dim=8, final_logit_softcapping=0.5,
                                              query_pre_attn_scalar=8, sliding_window=4),
    "phi3_longrope": lambda: T.Phi3Config(**COMMON, original_max_position_embeddings=ORIGINAL,
                                          rope_parameters=LONGROPE),
    "phi": lambda: T.PhiConfig(**COMMON),
    "cohere": lambda: T.CohereConfig(**COMMON, logit_scale=0.25),
    "cohere2": lambda: T.Cohere2Config(**COMMON, logit_scale=0.25, sliding_window=4),
    "granite": lambda: T.GraniteConfig(**COMMON, logits_scaling=4.0),
    "granitemoe": lambda: T.GraniteMoeConfig(**COMMON, logits_scaling=4.0, num_local_experts=4,
                                             num_experts_per_tok=2),
    "gpt2": lambda: T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, **IDS),
    "opt": lambda: T.OPTConfig(vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                               word_embed_proj_dim=32, max_position_embeddings=64, **IDS),
    "olmo2": lambda: T.Olmo2Config(**COMMON),
    "stablelm": lambda: T.StableLmConfig(**COMMON),
    "starcoder2": lambda: T.Starcoder2Config(**COMMON),
    "gpt_neox": lambda: T.GPTNeoXConfig(**COMMON),
    # MLA: the cache holds a compressed latent and a rotary part, of other sizes than the keys and values it expands
    # to; the ranks and head sizes all differ (and a MoE with a dense first layer, as DeepSeek-V3 and Moonlight)
    "deepseek_v3": lambda: T.DeepseekV3Config(**{**COMMON, "num_key_value_heads": 4}, q_lora_rank=24, kv_lora_rank=12,
                                              qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=10,
                                              moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                                              n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1),
}
EAGER = {"gemma2", "gemma3_text", "cohere2"}             # soft-capped or windowed attention: eager kernels
FINAL_TRANSFORM = {"gemma2", "gemma3_text", "cohere", "cohere2", "granite", "granitemoe"}
LENGTH_DEPENDENT_ROPE = {"llama_dynamic_rope", "phi3_longrope"}
CACHE_IS_NOT_ATTENTIONS = {"deepseek_v3"}    # the decode loop reads each row's own cache (no two-part attention)


def build(name: str):
    torch.manual_seed(0)
    attn = "eager" if name in EAGER else "sdpa"
    return disable_dropout(T.AutoModelForCausalLM.from_config(ARCHITECTURES[name](), attn_implementation=attn)).eval()


def grpo_batch(model):
    """2 prompts x 2 samples from generate (prompt 2 left-padded), the scores it sampled from, ragged responses.
    -> ids (4, P+R), attention mask, response mask (4, R), generate's log-probs of the sampled tokens (4, R)"""
    torch.manual_seed(1)
    prompts, mask = torch.randint(3, V, (2, P)), torch.ones(2, P, dtype=torch.long)
    prompts[1, :3], mask[1, :3] = 0, 0
    out = model.generate(input_ids=prompts.repeat_interleave(2, 0), attention_mask=mask.repeat_interleave(2, 0),
                         generation_config=GenerationConfig(do_sample=True, temperature=TEMP, top_k=0, top_p=1.0,
                                                            max_new_tokens=R, pad_token_id=0, output_scores=True,
                                                            return_dict_in_generate=True))
    response = out.sequences[:, -R:]
    sampled = torch.stack([torch.log_softmax(s.float(), -1).gather(-1, response[:, t:t + 1]).squeeze(-1)
                           for t, s in enumerate(out.scores)], dim=1)
    response_mask = response_mask_from_ids(response, [2])[0]
    response_mask[1, 3:], response_mask[2, 4:] = 0, 0                   # ragged, as if they had ended there
    return out.sequences, torch.cat([mask.repeat_interleave(2, 0), response_mask], 1), response_mask, sampled


def generate_is_the_full_forward(name: str) -> torch.Tensor:
    """(R,) the response positions where generate's cached decoding computes what one forward over the whole
    sequence does. Phi-3 recomputes its cache with the long factors once the sequence passes the original
    context; before that it samples under the short ones. Dynamic NTK keeps keys rotated at the frequencies
    of the step that computed them. Everywhere else: all positions."""
    t = torch.arange(R)
    if name == "phi3_longrope":
        return P + t - 1 >= ORIGINAL                  # logits at column P+t-1 come from the long-factor pass
    if name == "llama_dynamic_rope":
        return torch.zeros(R, dtype=torch.bool)
    return torch.ones(R, dtype=torch.bool)


def max_relative_gradient_difference(model, ids, attn, response_mask) -> float:
    grads = []
    model.train()
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        logp, _ = _token_logprobs_unsharded(model, ids, attn, R, TEMP, share_prompts=share)
        (logp * response_mask * torch.arange(1.0, R + 1)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.eval()
    assert grads[0].keys() == grads[1].keys() and grads[1]
    scale = max(float(g.abs().max()) for g in grads[1].values())
    return max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[1]) / scale


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_trainer_logprobs_are_the_models_own_and_generates_on_every_architecture(name):
    model = build(name)
    ids, attn, response_mask, sampled = grpo_batch(model)
    m = response_mask.bool()
    with torch.no_grad():
        ours, entropy = token_logprobs(model, ids, attn, R, TEMP, with_entropy=True)
        reference = logprobs_by_definition(model, ids, attn, R, TEMP)
    assert m.sum() >= 12
    assert torch.allclose(ours[m], reference[m], atol=1e-5), (ours - reference)[m].abs().max()
    same = m & generate_is_the_full_forward(name)
    assert torch.allclose(ours[same], sampled[same], atol=1e-5), (ours - sampled)[same].abs().max()
    assert torch.isfinite(entropy[m]).all() and (entropy[m] > 0).all()
    assert max_relative_gradient_difference(model, ids, attn, response_mask) <= 1e-5
    logprobs.check_exact(model)                                          # the load-time check accepts it


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_rollouts_sample_what_generate_samples_on_every_architecture(name, monkeypatch, tiny_tokenizer):
    """rollout.sample's decode loop on each family (ids < V are the toy tokenizer's, pad 0 and EOS 2 as here):
    generate's tokens and random state for the same seed; the loop's check accepts every family, and declines
    the two-part attention, with a warning, where the cache is not what attention reads."""
    import warnings

    from minirl import rollout
    from minirl.engines import decode
    model = build(name)
    prompts = [[5, 9, 33, 17, 60, 7, 90], [44, 21, 3, 100]]                           # the second left-padded
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fast in (True, False):
            with monkeypatch.context() as m:
                if not fast:
                    m.setattr(rollout, "shares_prompts", lambda *args: False)
                torch.manual_seed(3)
                r = rollout.sample(model, tiny_tokenizer, prompts, group_size=2, max_new_tokens=R, temperature=TEMP)
                results.append((r, torch.rand(1)))
    (a, after_a), (b, after_b) = results
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(after_a, after_b)
    if name in LENGTH_DEPENDENT_ROPE:                    # generate serves them (rollout.shares_prompts)
        return
    declined = [str(w.message) for w in caught if "decode loop" in str(w.message)]
    assert decode.check_model(model) is None
    if name in CACHE_IS_NOT_ATTENTIONS:
        assert decode._PATHS[model] == "one-buffer" and any("other than those it cached" in w for w in declined)
    else:
        assert decode._PATHS[model] == "shared" and not declined, declined


@pytest.mark.parametrize("name", sorted(FINAL_TRANSFORM))
def test_the_lm_heads_output_alone_is_another_distribution_where_the_model_transforms_it(name, monkeypatch):
    """The matrix above tests something: without the model's final transform the log-probs are off, and the
    load-time check refuses the model."""
    model = build(name)
    ids, attn, response_mask, _ = grpo_batch(model)
    monkeypatch.setattr(logprobs, "final_logits_transform", lambda model: None)
    with torch.no_grad():
        head_only, _ = token_logprobs(model, ids, attn, R, TEMP)
        reference = logprobs_by_definition(model, ids, attn, R, TEMP)
    assert (head_only - reference)[response_mask.bool()].abs().max() > 1e-3
    with pytest.raises(logprobs.InexactModelError, match="cannot compute"):
        logprobs.check_exact(model)


@pytest.mark.parametrize("name", sorted(LENGTH_DEPENDENT_ROPE))
def test_prompt_sharing_is_off_where_rope_frequencies_depend_on_the_sequence_length(name, monkeypatch):
    """Sharing would run the prompt under the short frequencies and the responses under the long ones."""
    model = build(name)
    ids, attn, response_mask, _ = grpo_batch(model)
    assert logprobs.length_dependent_rope(model)
    monkeypatch.setattr(logprobs, "length_dependent_rope", lambda model: False)
    with torch.no_grad():
        shared, _ = token_logprobs(model, ids, attn, R, TEMP)
        reference = logprobs_by_definition(model, ids, attn, R, TEMP)
    assert (shared - reference)[response_mask.bool()].abs().max() > 1e-5


def test_a_model_whose_logits_minirl_cannot_reproduce_is_refused():
    """An architecture that transforms its logits in a way minirl does not know (here: a bias added after the
    head) fails the load-time check with a clear error instead of training another policy."""
    model = build("qwen2")
    forward = model.forward

    def shifted(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits + torch.linspace(0, 3, V)
        return out
    model.forward = shifted
    with pytest.raises(logprobs.InexactModelError, match="Qwen2ForCausalLM"):
        logprobs.check_exact(model)
    assert not logprobs.length_dependent_rope(model)

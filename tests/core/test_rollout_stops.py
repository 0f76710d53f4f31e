"""Where a row ends: at the token completing a stop string as generation saw it (special tokens, stops that start
in the prompt), at its own new-token budget whatever the batch's padded width, on both decode paths (minirl's
loop and Hugging Face generate); seeded sampling that draws from its own generator only; and generate's rows
run in groups that fit the context where the padded width plus a budget would not (GPT-2, dynamic RoPE).

The random tiny model is steered by a forward hook that adds to chosen logits (`steer`), so that a row emits a
given token after a given input token: the tests do not depend on what a random model happens to say."""
import pytest
import torch

import minirl.rollout as rollout
from minirl.rollout import sample

IM_START = 1          # the toy tokenizer's <|im_start|>: a special token, not an EOS (that is <|im_end|>, 2)


@pytest.fixture(params=["decode", "generate"])
def path(request, monkeypatch):
    """Both decode paths: minirl's decode loop (engines/decode.py), or generate (what rollout.sample uses when the loop cannot)."""
    if request.param == "generate":
        monkeypatch.setattr(rollout, "shares_prompts", lambda model, prompt_tokens: False)
    return request.param


def steer(model, rules: dict[int, int] | None = None, banned: tuple[int, ...] = ()):
    """Logits hook: after input token a the next token is rules[a]; `banned` tokens are never the argmax."""
    def hook(module, args, kwargs, out):
        ids = kwargs["input_ids"][:, -out.logits.shape[1]:]     # (n, t): the positions with logits (a prefill keeps 1)
        for after, token in (rules or {}).items():
            out.logits[..., token] += 1e4 * (ids == after)
        for token in banned:
            out.logits[..., token] -= 1e4
        return out
    return model.register_forward_hook(hook, with_kwargs=True)


def test_a_row_that_ends_on_a_special_token_stop_string_is_masked_after_it(random_model, tiny_tokenizer, path):
    """<|im_start|> as a stop string: generation stops on it (generate's StopStringCriteria sees token text), so
    the row ends there, not over the padding that follows (the text decoded without special tokens lacks it)."""
    steer(random_model, {30: IM_START}, banned=(2,))
    prompts = [[272, 270, 30], [272, 270, 31]]            # only the first prompt's last token triggers the stop
    r = sample(random_model, tiny_tokenizer, prompts, 1, 6, greedy=True, stop=["<|im_start|>"])
    assert r.response_ids[0, 0] == IM_START and r.response_ids.shape[1] == 6       # the other row ran on
    assert r.response_mask[0].tolist() == [1, 0, 0, 0, 0, 0] and not r.truncated[0]
    assert r.response_mask[1].sum() == 6 and r.truncated[1]


def test_a_stop_string_completed_across_the_prompt_boundary_ends_the_row_there(random_model, tiny_tokenizer, path):
    """The prompt ends in "a", the first response token is "b", stop "ab": generation stopped after that token,
    so the row holds that one token, though the response's own text does not contain the stop string."""
    a, b = 80, 85                                            # "n", "s"
    steer(random_model, {a: b}, banned=(2,))
    stop = tiny_tokenizer.decode([a]) + tiny_tokenizer.decode([b])
    r = sample(random_model, tiny_tokenizer, [[272, a], [272, 270, 31]], 1, 6, greedy=True, stop=[stop])
    assert r.response_ids[0, 0] == b and stop not in r.texts[0] and r.response_ids.shape[1] == 6
    assert r.response_mask[0].tolist() == [1, 0, 0, 0, 0, 0] and not r.truncated[0]


def test_a_rows_budget_is_its_own_prompts_room_not_the_batchs_padded_width(random_model, tiny_tokenizer, path):
    """Context 24: a 3-token prompt gets its 10 new tokens alone and next to a 20-token prompt (which gets 4)."""
    random_model.config.max_position_embeddings = 24
    steer(random_model, banned=(2,))                      # no EOS: every row runs to its budget
    short, long = [272, 270, 31], [272, 270] * 10
    with pytest.warns(UserWarning, match="context"):
        both = sample(random_model, tiny_tokenizer, [short, long], 1, 10, greedy=True)
    alone = sample(random_model, tiny_tokenizer, [short], 1, 10, greedy=True)
    assert alone.response_mask.sum() == 10
    assert both.response_mask.sum(1).tolist() == [10, 4] and both.truncated.all()
    assert both.response_ids[0].tolist() == alone.response_ids[0].tolist()
    assert (both.response_ids[1, 4:] == tiny_tokenizer.pad_token_id).all()


def test_seeded_sampling_draws_only_from_its_own_generator(random_model, tiny_tokenizer, path):
    """Another thread drawing from torch's global generator (here: a hook at every forward) changes nothing for
    a call given a generator; and a generator seeded s samples what torch.manual_seed(s) used to."""
    prompts = [[272, 270, 31], [272, 33]]
    torch.manual_seed(5)
    before = sample(random_model, tiny_tokenizer, prompts, 2, 8, temperature=1.5)
    noisy = random_model.register_forward_pre_hook(lambda module, args: [torch.rand(7)] and None)
    torch.manual_seed(123)
    own = sample(random_model, tiny_tokenizer, prompts, 2, 8, temperature=1.5,
                 generator=torch.Generator().manual_seed(5))
    noisy.remove()
    assert own.response_ids.tolist() == before.response_ids.tolist()
    assert own.response_mask.sum() > 8                    # not a few EOS at once: a real sample was compared


def test_falcon_with_alibi_samples_in_the_decode_loop_as_generate_does(tiny_tokenizer, monkeypatch):
    """Falcon's alibi attention picks its kernel by the attention implementation's name, so the loop's two-part
    attention (a registered function) is not for it: it crashed on a shape; now it decodes as generate does."""
    import transformers as T
    config = T.FalconConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, num_hidden_layers=2, alibi=True,
                            num_attention_heads=4, new_decoder_architecture=False, multi_query=True, pad_token_id=0,
                            eos_token_id=2)
    torch.manual_seed(0)
    model = T.FalconForCausalLM(config).eval()
    prompts = [[272, 270, 31], [272, 33]]
    looped = sample(model, tiny_tokenizer, prompts, 3, 5, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(rollout, "shares_prompts", lambda model, prompt_tokens: False)
    generated = sample(model, tiny_tokenizer, prompts, 3, 5, generator=torch.Generator().manual_seed(0))
    assert looped.response_ids.tolist() == generated.response_ids.tolist() and looped.response_mask.sum() > 6


def _rows_alone_and_batched(model, tokenizer, prompts, max_new_tokens):
    both = sample(model, tokenizer, prompts, 1, max_new_tokens, greedy=True)
    alone = [sample(model, tokenizer, [p], 1, max_new_tokens, greedy=True) for p in prompts]
    row = lambda r, i: r.response_ids[i, :int(r.response_mask[i].sum())].tolist()  # noqa: E731
    return [row(both, i) for i in range(len(prompts))], [row(a, 0) for a in alone]


@pytest.mark.filterwarnings("ignore:max_new_tokens")
def test_generate_past_the_context_learned_positions_each_row_as_alone(tiny_tokenizer, monkeypatch):
    """GPT-2 (learned positions, 24 of them) on the generate path: padded width 18 + the short row's budget 12
    passes the context; the rows run in groups that fit, not into an IndexError, each row as it does alone."""
    import transformers
    monkeypatch.setattr(rollout, "shares_prompts", lambda model, prompt_tokens: False)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=24, eos_token_id=2,
        pad_token_id=0, bos_token_id=1)).eval()
    steer(model, banned=(2,))
    batched, alone = _rows_alone_and_batched(model, tiny_tokenizer, [[272, 270, 31], [272, 270] * 9], 12)
    assert [len(r) for r in batched] == [12, 6] and batched == alone


@pytest.mark.filterwarnings("ignore:max_new_tokens")
def test_generate_past_the_context_dynamic_rope_short_row_as_alone(tiny_tokenizer):
    """A dynamic-RoPE Qwen2 (the generate path; context 24): the short row's tokens and logits do not depend on
    the long row next to it (finished rows fed past the context would rescale every row's frequencies)."""
    import transformers
    cfg = transformers.Qwen2Config(
        vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=24, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}, initializer_range=0.5)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    assert not rollout.shares_prompts(model, 18)
    steer(model, banned=(2,))
    seen = []  # row 0's last logits at each forward: the short row's, first (its group runs first, or it is row 0)
    model.register_forward_hook(lambda m, a, kw, out: seen.append(out.logits[0, -1].clone()), with_kwargs=True)
    batched, alone = _rows_alone_and_batched(model, tiny_tokenizer, [[272, 270, 31], [272, 270] * 9], 12)
    assert [len(r) for r in batched] == [12, 6] and batched == alone
    # a forward per new token: the batched call's first 12, then the short row alone (12), then the long (6)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(seen[:12], seen[-18:-6], strict=True))

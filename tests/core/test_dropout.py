"""Dropout is off in every module of the policy, the reference and the critic from load time: train mode then
computes the distribution generate samples from (eval mode), so old log-probs are the sampler's (ratio = 1)."""
import pytest
import torch
import transformers as T

from minirl.config import ConfigError, parse_config
from minirl.models import build_policy, disable_dropout, load_reference

V = 64
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# configs that ship dropout: GPT-2, OPT, Phi-2 carry *_pdrop / dropout = 0.1; Qwen2 an attention dropout rate
WITH_DROPOUT = {
    "gpt2": lambda: T.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.1,
                                 embd_pdrop=0.1, attn_pdrop=0.1, **IDS),
    "opt": lambda: T.OPTConfig(vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                               word_embed_proj_dim=32, max_position_embeddings=32, dropout=0.1, attention_dropout=0.1,
                               **IDS),
    "phi": lambda: T.PhiConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, resid_pdrop=0.1, embd_pdrop=0.1, attention_dropout=0.1, **IDS),
    "qwen2": lambda: T.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.5,
                                   attn_implementation="eager", **IDS),
}


def logits_in_train_and_eval_mode(model) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, V, (2, 10))
    with torch.no_grad():
        torch.manual_seed(0)
        train_mode = model.train()(input_ids=ids).logits
        eval_mode = model.eval()(input_ids=ids).logits
    return train_mode, eval_mode


@pytest.mark.parametrize("name", list(WITH_DROPOUT))
def test_after_disable_dropout_train_mode_computes_what_eval_mode_does(name):
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(WITH_DROPOUT[name]())
    before = logits_in_train_and_eval_mode(model)
    assert not torch.allclose(*before, atol=1e-4)                   # the model's own dropout is on in train mode
    after = logits_in_train_and_eval_mode(disable_dropout(model))
    assert torch.equal(*after)


@pytest.fixture(scope="module")
def gpt2_with_dropout(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2_dropout")
    torch.manual_seed(0)
    T.GPT2LMHeadModel(WITH_DROPOUT["gpt2"]()).save_pretrained(path)
    return str(path)


def test_the_policy_the_reference_and_the_critic_are_built_without_dropout(gpt2_with_dropout):
    from minirl.critic import load_critic
    cpu = torch.device("cpu")
    policy = build_policy(gpt2_with_dropout, cpu, torch.float32)
    assert policy.training and torch.equal(*logits_in_train_and_eval_mode(policy))
    lora = build_policy(gpt2_with_dropout, cpu, torch.float32, lora=dict(rank=4, alpha=8, dropout=0.1))
    assert torch.equal(*logits_in_train_and_eval_mode(lora))          # the adapter's dropout too
    kept = build_policy(gpt2_with_dropout, cpu, torch.float32, keep_dropout=True)
    assert not torch.allclose(*logits_in_train_and_eval_mode(kept), atol=1e-4)
    reference = load_reference(gpt2_with_dropout, torch.float32, "sdpa", cpu)
    assert all(m.p == 0 for m in reference.modules() if isinstance(m, torch.nn.Dropout))
    critic = load_critic(gpt2_with_dropout, torch.float32, "sdpa", False, cpu).train()
    ids, mask = torch.randint(3, V, (2, 10)), torch.ones(2, 10, dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(critic(ids, mask, 4), critic.eval()(ids, mask, 4))


@pytest.mark.parametrize("key", ["mini_batches", "ppo_epochs"])
def test_keep_dropout_is_refused_off_policy(key):
    parse_config(["--keep_dropout", "true"])                          # on-policy: allowed
    with pytest.raises(ConfigError, match="keep_dropout"):
        parse_config(["--keep_dropout", "true", f"--{key}", "2", "--prompts_per_step", "2"])

"""The decode loop's (minirl/engines/decode.py) device branches, the GPU's side forced on CPU: the two-part
attention's kernel, when finished rows leave the batch, the packed linears; and the host syncs a token costs.
(The inventory of device branches: tests/core/test_device_branches.py.)"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import minirl.engines.decode as decode
import minirl.engines.decode_cache as decode_cache
import minirl.rollout as rollout

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\n9+9?<|im_end|>\n<|im_start|>assistant\n"]


def ends_often(model, eos_id: int, boost: float = 3.0):
    """The model with its EOS logit raised, so that rows end at ragged lengths."""
    bias = torch.zeros(model.config.vocab_size)
    bias[eos_id] = boost
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: out + bias.to(out.dtype))
    return model


def sample(model, tokenizer, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return rollout.sample(model, tokenizer, PROMPTS, **kw)


@pytest.mark.device_branch("decode/attention-kernel")
def test_the_gpus_two_part_attention_kernel_runs_under_bf16_autocast_and_gives_the_plain_paths_tokens(
        monkeypatch, random_model, tiny_tokenizer):
    """Under autocast the cache's keys stay fp32 (rotary embeddings), so the two-part attention runs; on a GPU its
    kernel is `_attention_with_lse`, whose matmuls autocast would run in bf16 beside an fp32 log-sum-exp."""
    kernels = []
    monkeypatch.setattr(decode_cache, "attention_kernel",
                        lambda device: kernels.append(device.type) or decode_cache._attention_with_lse)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gpu = sample(random_model, tiny_tokenizer, group_size=3, max_new_tokens=8, greedy=True)
        assert kernels, "the two-part attention did not run"
        with monkeypatch.context() as m:                       # the one-buffer path: transformers' own sdpa
            m.setattr(decode, "_shares_prefix", lambda *args: False)
            plain = sample(random_model, tiny_tokenizer, group_size=3, max_new_tokens=8, greedy=True)
    assert torch.equal(gpu.response_ids, plain.response_ids) and gpu.texts == plain.texts


@pytest.mark.device_branch("decode/attention-kernel")
def test_the_gpus_attention_kernel_is_the_cpu_flash_op_up_to_rounding():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    bias = torch.zeros(2, 1, 1, 7).masked_fill(torch.arange(7) < 2, float("-inf"))    # left padding
    cpu = decode_cache.attention_kernel(torch.device("cpu"))(q, k, v, attn_mask=bias, scale=0.3)
    gpu = decode_cache.attention_kernel(torch.device("cuda"))(q, k, v, attn_mask=bias, scale=0.3)
    assert gpu[1].dtype == torch.float32
    for a, b in zip(cpu, gpu):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


# --- when ended rows leave the batch, and the host syncs a step costs -----------------------------------------

class HostSyncs(TorchDispatchMode):
    """Counts the ops that make a GPU's host wait for the device (a tensor read as a Python number, a data-dependent
    shape), outside the model's own forward calls: the decode loop's own syncs. (Tensor.tolist is not seen; the
    loop has none.)"""

    def __init__(self, model):
        super().__init__()
        self.count, self.in_model = 0, 0
        self.hooks = [model.register_forward_pre_hook(lambda *a: setattr(self, "in_model", self.in_model + 1)),
                      model.register_forward_hook(lambda *a: setattr(self, "in_model", self.in_model - 1))]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) or [])
        if not self.in_model and (name in ("_local_scalar_dense", "nonzero", "masked_select") or bool_index):
            self.count += 1
        return func(*args, **(kwargs or {}))

    def remove(self):
        for h in self.hooks:
            h.remove()


def decode_counting(monkeypatch, model, tokenizer, **kw):
    """rollout.sample through the decode loop -> (rollout, random draw after, host syncs, steps, compactions)."""
    assert decode.check_model(model) is None                    # the once-a-model check: before the count
    steps, compactions = [], []
    model.register_forward_pre_hook(lambda mod, args, kw: steps.append(kw["input_ids"].shape), with_kwargs=True)
    real = decode._SharedPrefix.reorder_cache
    monkeypatch.setattr(decode._SharedPrefix, "reorder_cache",
                        lambda self, idx: compactions.append(len(idx)) or real(self, idx))
    syncs, real_decode = HostSyncs(model), decode._decode

    def counted(*args, **kwargs):
        with syncs:
            return real_decode(*args, **kwargs)
    monkeypatch.setattr(decode, "_decode", counted)
    r = sample(model, tokenizer, **kw)
    syncs.remove()
    layers = model.config.num_hidden_layers
    return r, torch.rand(1), syncs.count - layers, len(steps) - 1, len(compactions) // layers   # - the setup's


def generate_path(monkeypatch, model, tokenizer, **kw):
    with monkeypatch.context() as m:
        m.setattr(rollout, "shares_prompts", lambda *args: False)
        return sample(model, tokenizer, **kw), torch.rand(1)


@pytest.mark.device_branch("decode/rows-leave")
def test_on_a_gpu_ended_rows_wait_to_leave_in_fewer_compactions_and_samples_stay_generates(
        monkeypatch, random_model, tiny_tokenizer):
    """A GPU's setting: ended rows stay (their tokens discarded) until a quarter of the batch has ended. The
    samples, the masks and the random state are still generate's; the cache is compacted fewer times than rows
    ended at distinct steps, and each step costs one host sync."""
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    monkeypatch.setattr(decode, "finished_rows_leave_at", lambda device: 0.25)
    kw = dict(group_size=4, max_new_tokens=12, temperature=1.2)
    r, after, syncs, steps, compactions = decode_counting(monkeypatch, model, tiny_tokenizer, **kw)
    plain, plain_after = generate_path(monkeypatch, model, tiny_tokenizer, **kw)
    assert torch.equal(r.response_ids, plain.response_ids) and torch.equal(r.response_mask, plain.response_mask)
    assert torch.equal(after, plain_after) and r.texts == plain.texts
    lengths = r.response_mask.sum(1)
    departures = len(set(lengths.tolist()) - {int(lengths.max())})      # steps at which some row ended
    assert departures >= 3 and 1 <= compactions < departures
    assert syncs <= steps + compactions, (syncs, steps, compactions)     # one a step, one a compaction


@pytest.mark.device_branch("decode/rows-leave")
def test_on_cpu_rows_leave_as_they_end_and_a_step_costs_one_host_sync(monkeypatch, random_model, tiny_tokenizer):
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    assert decode.finished_rows_leave_at(torch.device("cpu")) == 0.0
    assert decode.finished_rows_leave_at(torch.device("cuda")) > 0.0
    kw = dict(group_size=4, max_new_tokens=12, temperature=1.2)
    r, after, syncs, steps, compactions = decode_counting(monkeypatch, model, tiny_tokenizer, **kw)
    lengths = r.response_mask.sum(1)
    assert compactions == len(set(lengths.tolist()) - {int(lengths.max())})   # at each step where rows ended
    assert syncs <= steps + compactions, (syncs, steps, compactions)


# --- packed linears: the CPU's speed-up, and the GPU's side (none) ----------------------------------------------

@pytest.mark.device_branch("decode/packed-linears")
def test_without_packed_linears_the_decode_loop_samples_what_generate_samples(monkeypatch, random_model,
                                                                             tiny_tokenizer):
    """A GPU (or CPU autocast) packs nothing: the model's own Linear forwards, generate's samples."""
    model = ends_often(random_model, tiny_tokenizer.eos_token_id)
    assert decode.packs_linears(model) == torch.backends.mkldnn.is_available()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not decode.packs_linears(model)                    # autocast runs F.linear in bf16
    monkeypatch.setattr(decode, "packs_linears", lambda model: False)
    packed = []
    monkeypatch.setattr(decode, "_packed_linear", lambda *args: packed.append(1))
    fast = sample(model, tiny_tokenizer, group_size=3, max_new_tokens=10), torch.rand(1)
    plain = generate_path(monkeypatch, model, tiny_tokenizer, group_size=3, max_new_tokens=10)
    assert not packed and torch.equal(fast[0].response_ids, plain[0].response_ids) and torch.equal(fast[1], plain[1])

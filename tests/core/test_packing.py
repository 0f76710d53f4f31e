"""Padding-free training passes (minirl/packing.py): packed log-probs, entropies and gradients equal the padded
path's up to fp32 rounding; a group's prompt runs once in the packed pass, also under gradient checkpointing;
micro-batches by a token budget fit it, keep the rows in order and reach the count every process needs; a model
whose packed log-probs are not its padded ones is refused by name."""
import copy

import pytest
import torch

import minirl.packing as packing
from conftest import assert_close_at_scale
from minirl import logprobs
from minirl.config import ConfigError
from minirl.logprobs import token_logprobs
from minirl.update import LossSettings, forward_backward

P, R = 7, 9
SHARED = 7 * 2 + 5 * 1  # prompt tokens a packed pass does not repeat: group 0's 7 twice more, group 1's 5 once


def ragged_batch(vocab: int, pad_id: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """6 rows: a group of 3 sharing a prompt, a group of 2 left-padded by 2, a lone row left-padded by 4; ragged
    response lengths (one of no token, one of all R)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (6, P + R), generator=g)
    mask = torch.ones_like(ids)
    ids[1:3, :P] = ids[0, :P]
    ids[4, :P] = ids[3, :P]
    for r, pad in [(3, 2), (4, 2), (5, 4)]:
        mask[r, :pad], ids[r, :pad] = 0, pad_id
    for r, n in enumerate([9, 3, 5, 0, 7, 6]):   # row 3: no response (a dynamic-sampling filler row)
        mask[r, P + n:], ids[r, P + n:] = 0, pad_id
    return ids, mask


@pytest.fixture()
def batch(random_model, tiny_tokenizer):
    return ragged_batch(random_model.config.vocab_size, tiny_tokenizer.pad_token_id)


@pytest.fixture()
def layouts(monkeypatch):
    """Every Packed that packing.pack lays out, in order."""
    laid, real_pack = [], packing.pack
    monkeypatch.setattr(packing, "pack", lambda *a, **k: laid.append(real_pack(*a, **k)) or laid[-1])
    return laid


@pytest.mark.parametrize("route", ["sdpa", "eager", "sdpa-bins", "eager-bins", "sdpa-unshared", "position_ids"])
def test_packed_logprobs_and_entropy_equal_the_padded_ones(monkeypatch, random_model, batch, layouts, route):
    ids, mask = batch
    random_model.config._attn_implementation = "eager" if route.startswith("eager") else "sdpa"
    if route == "position_ids":   # the varlen kernels' route (flash-attn): one bin, positions restarting per row
        monkeypatch.setattr(packing, "MASKED_KERNELS", ())
    if route.endswith("bins"):    # bins as long as the longest unit (a larger model's choice), the others filled
        monkeypatch.setattr(packing, "bin_capacity", lambda sizes, hidden: packing._first_fit(sizes, max(sizes)))
    with torch.no_grad():
        want, want_ent = token_logprobs(random_model, ids, mask, R, 0.7, with_entropy=True)
        got, got_ent = logprobs.packed_logprobs(random_model, ids, mask, R, 0.7, with_entropy=True,
                                               share_prompts=route != "sdpa-unshared")
    real = mask[:, P:].bool()
    assert_close_at_scale(got[real], want[real])
    assert_close_at_scale(got_ent[real], want_ent[real])
    assert (got[~real] == 0).all() and (got_ent[~real] == 0).all()
    laid = layouts[0]
    shared = route not in ("sdpa-unshared", "position_ids")
    assert int(laid.laid.sum()) == int(mask.sum()) - (SHARED if shared else 0)     # no padding, prompts once
    assert int((laid.context != laid.segment).sum()) == (int(mask[:, P:].sum()) if shared else 0)  # responses
    if route.endswith("bins"):
        assert laid.ids.shape[0] > 1 and not bool(laid.laid.all())    # several bins, one with a filled tail
    if route == "position_ids":
        assert laid.ids.shape[0] == 1 and bool(laid.laid.all())    # one bin, no filler
        assert int((laid.positions[0] == 0).sum()) == 6            # each row restarts at position 0


def grads_of(model, batch_, micro, packed: bool, loss=LossSettings(temperature=0.7)):
    model = copy.deepcopy(model)
    metrics = forward_backward(model, batch_, loss, micro, num_tokens=float(batch_["response_mask"].sum()),
                               num_seqs=float(len(batch_["input_ids"])), packed=packed)
    return metrics, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def training_batch(ids, mask, model) -> dict[str, torch.Tensor]:
    b = {"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, P:].float(),
         "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, 0.5])}
    with torch.no_grad():   # off-policy (old_logp given), with a KL term: every input the loss takes
        b["old_logp"] = token_logprobs(model, ids, mask, R, 0.7)[0] + 0.05 * mask[:, P:]
        b["ref_logp"] = token_logprobs(model, ids, mask, R, 0.7)[0] - 0.1 * mask[:, P:]
    return b


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_gradients_equal_the_padded_ones_with_micro_batches_by_tokens(random_model, batch, layouts,
                                                                            checkpointing):
    ids, mask = batch
    b = training_batch(ids, mask, random_model)
    loss = LossSettings(temperature=0.7, kl_coef=0.1)
    m_want, want = grads_of(random_model, b, 4, packed=False, loss=loss)
    if checkpointing:  # transformers drops the KV cache there: the packed pass shares the prompt without one
        random_model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    micro = packing.split_rows(ids, mask, R, budget=30, rows=4)
    assert len(micro) > 1
    m_got, got = grads_of(random_model, b, micro, packed=True, loss=loss)
    assert_close_at_scale(got, want)
    for k in m_want:
        assert m_got[k] == pytest.approx(m_want[k], rel=1e-5, abs=1e-7), k
    assert any(bool((p.context != p.segment).any()) for p in layouts)   # a prompt was shared


def test_token_budget_micro_batches_fit_keep_order_and_reach_the_count(batch):
    ids, mask = batch
    real = mask.bool()
    tokens = lambda part: sum(int(real[r, P:].sum()) + (int(real[r, :P].sum()) if r == part.start or  # noqa: E731
                                                           not torch.equal(ids[r, :P], ids[r - 1, :P]) else 0)
                              for r in part)
    assert packing.split_rows(ids, mask, R, budget=0, rows=4) == [range(0, 4), range(4, 6)]
    for budget in (1, 12, 30, 1000):
        parts = packing.split_rows(ids, mask, R, budget=budget, rows=4)
        assert [r for p in parts for r in p] == list(range(6))                  # every row once, in order
        assert all(tokens(p) <= budget or len(p) == 1 for p in parts)           # the budget, or one row alone
        assert len(parts) == 1 if budget == 1000 else len(parts) > 1
        more = packing.split_rows(ids, mask, R, budget=budget, rows=4, count=5)
        assert len(more) == max(5, len(parts)) and [r for p in more for r in p] == list(range(6))
    assert tokens(range(0, 3)) == 7 + 9 + 3 + 5                                # a group's prompt counted once
    with pytest.raises(ValueError, match="micro-batches"):
        packing.split_rows(ids, mask, R, budget=0, rows=4, count=7)


def test_a_model_whose_rows_see_each_other_when_packed_is_refused_by_name(monkeypatch, random_model):
    logprobs.check_packing(random_model)                                        # plain causal attention: exact
    leaky = lambda packed, dtype=None: torch.ones(packed.ids.shape[1], packed.ids.shape[1]).tril().bool()[  # noqa
        None, None].expand(len(packed.ids), 1, -1, -1)                         # causal across the whole bin
    monkeypatch.setattr(packing, "attention_mask_4d", leaky)
    with pytest.raises(ConfigError, match="pack_sequences"):
        logprobs.check_packing(random_model)


def test_packed_rows_on_a_varlen_kernel_run_varlen_and_equal_the_padded_ones(random_model, batch, layouts):
    """The branch a GPU with flash-attn takes: no mask, one bin whose positions restart at each row, from which
    transformers cuts the varlen sequences (the CPU stand-in follows flash_attention_forward's packed case)."""
    import flash_stand_in
    ids, mask = batch
    random_model.config._attn_implementation = flash_stand_in.install()
    before = flash_stand_in.calls["varlen"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):    # flash-attn computes in bf16 only
        want, _ = token_logprobs(random_model, ids, mask, R)
        got, _ = logprobs.packed_logprobs(random_model, ids, mask, R)
    assert flash_stand_in.calls["varlen"] > before
    assert layouts[0].ids.shape[0] == 1 and int(layouts[0].laid.sum()) == int(mask.sum())  # one bin, not shared
    real = mask[:, P:].bool()
    assert float((got - want)[real].abs().max()) <= 8 * 2 ** -8 * float(want[real].abs().max())  # bf16 rounding


def test_a_group_whose_shared_attention_costs_more_than_it_saves_is_laid_row_by_row(monkeypatch, random_model,
                                                                                    tiny_tokenizer):
    """One group of 6 long responses on a 2-token prompt: laid as one unit (2 + 6 * 9 tokens) it saves 10 prompt
    tokens; where attention weighs much (a small hidden size) its 56^2 scores cost more than 6 rows of 11^2, so
    each row is laid whole; where it weighs little, the prompt is shared. Both give the padded numbers."""
    ids, _ = ragged_batch(random_model.config.vocab_size, tiny_tokenizer.pad_token_id, seed=1)
    ids[:, :P] = ids[0, :P]
    mask = torch.ones_like(ids)
    mask[:, :P - 2] = 0
    with torch.no_grad():
        want, _ = token_logprobs(random_model, ids, mask, R)
    real_pack = packing.pack
    for hidden, shared in [(1, False), (10 ** 6, True)]:
        monkeypatch.setattr(packing, "pack", lambda *a, _h=hidden, **k: real_pack(*a, **{**k, "hidden": _h}))
        with torch.no_grad():
            got, _ = logprobs.packed_logprobs(random_model, ids, mask, R)
        assert_close_at_scale(got, want)
        laid = packing.pack(ids, mask, R)
        assert bool((laid.context != laid.segment).any()) == shared
        assert int(laid.laid.sum()) == int(mask.sum()) - (10 if shared else 0)


def test_a_micro_batch_without_response_tokens_still_has_a_graph_through_every_weight(random_model, batch):
    """Dynamic sampling's filler rows (no response token): zeros, and a backward that reaches every weight (with
    zero gradients), as every other micro-batch's does: FSDP's collectives run on every process alike."""
    ids, mask = batch
    mask = mask.clone()
    mask[:, P:] = 0
    logp, ent = logprobs.packed_logprobs(random_model, ids, mask, R, with_entropy=True)
    assert (logp == 0).all() and (ent == 0).all() and logp.requires_grad
    logp.sum().backward()
    grads = [p.grad for p in random_model.parameters() if p.requires_grad]
    assert all(g is not None and (g == 0).all() for g in grads)

"""The gradient of one optimizer step does not depend on how the step's sequences are split: micro-batch
size, gradient accumulation (several forward_backward calls before one optim_step) or number of processes."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, assert_close_at_scale
from minirl.logprobs import token_logprobs
from minirl.update import LossSettings, forward_backward

AGGS = ["token-mean", "seq-mean-token-sum-norm"]  # GRPO/DAPO's token mean and Dr. GRPO's constant normaliser


def synthetic_batch(model, tokenizer, n=8, P=5, R=6, seed=0):
    """Left-padded prompts, right-padded responses of varied lengths, slightly off-policy old log-probs."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    ids = torch.randint(3, vocab, (n, P + R), generator=g)
    prompt_len = torch.randint(2, P + 1, (n,), generator=g)
    resp_len = torch.randint(1, R + 1, (n,), generator=g)
    attn = torch.zeros(n, P + R, dtype=torch.long)
    for i in range(n):
        attn[i, P - prompt_len[i]:P + resp_len[i]] = 1
    ids[attn == 0] = tokenizer.pad_token_id
    mask = attn[:, P:].clone()
    with torch.no_grad():
        logp = token_logprobs(model, ids, attn, R)[0]
    return {"input_ids": ids, "attention_mask": attn, "response_mask": mask,
            "old_logp": logp + 0.1 * torch.randn(logp.shape, generator=g),
            "advantages": torch.randn(n, generator=g)}


def step_grads(model, batch, agg, pieces=1, micro=8, max_len=6):
    """Gradient of one optimizer step, its batch fed as `pieces` forward_backward calls (accumulation)."""
    model.zero_grad(set_to_none=True)
    n = batch["input_ids"].shape[0]
    n_tok, n_seq = float(batch["response_mask"].sum()), float(n)
    for k in range(pieces):
        part = {key: v[k * n // pieces:(k + 1) * n // pieces] for key, v in batch.items()}
        forward_backward(model, part, LossSettings(loss_agg_mode=agg, max_new_tokens=max_len), micro, n_tok, n_seq)
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b):
    assert_close_at_scale(a, b)


@pytest.mark.parametrize("agg", AGGS)
def test_gradient_is_invariant_to_micro_batch_and_accumulation(random_model, tiny_tokenizer, agg):
    batch = synthetic_batch(random_model, tiny_tokenizer)
    ref = step_grads(random_model, batch, agg, pieces=1, micro=8)
    assert_same(ref, step_grads(random_model, batch, agg, pieces=1, micro=1))
    assert_same(ref, step_grads(random_model, batch, agg, pieces=4, micro=2))   # accumulation 4
    assert_same(ref, step_grads(random_model, batch, agg, pieces=4, micro=1))


@pytest.mark.parametrize("agg", AGGS)
def test_gradient_is_invariant_to_world_size(tmp_path, random_model, tiny_tokenizer, agg):
    batch = synthetic_batch(random_model, tiny_tokenizer)
    expected = step_grads(random_model, batch, agg, pieces=1, micro=4)
    data = tmp_path / "data.pt"
    torch.save({"batch": batch, "state": random_model.state_dict(), "vocab": len(tiny_tokenizer),
                "eos": tiny_tokenizer.eos_token_id, "pad": tiny_tokenizer.pad_token_id, "max_len": 6}, data)
    out = tmp_path / "grads.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "core" / "torchrun_grads.py"), str(data), str(out), agg, "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same(expected, torch.load(out))

"""Datums to the trainer's batch layout, and the loss pass of the sessions API (sessions/losses.py).

A Tinker datum is a sequence x (model_input, n tokens) and, per position i, the target y_i that the model's
prediction at i is scored on. minirl's trainer scores a (prompt, response) layout: the log-prob of each
response token given everything before it (logprobs.token_logprobs). The two agree from the first position s
after which every target is the next input token (y_i = x_{i+1} for i >= s): the prompt is x_0..x_s and the
response y_s..y_{n-1}. Positions before s (e.g. the zeros rl_loop puts under its prompt) are not scored, so they
must carry weight and advantage 0, and their output log-prob is 0.

The loss pass is the trainer's micro-batch loop (update.forward_backward) with Tinker's summed losses instead of
minirl's normalised ones: a sum needs no step-wide token count, so micro-batches simply add up.

Shapes: N datums, P prompt tokens (left-padded), R response tokens (right-padded).
"""
from __future__ import annotations

import torch

from minirl.logprobs import token_logprobs
from minirl.sessions.losses import TINKER_LOSSES, tinker_loss
from minirl.sessions.types import TensorData, tensor_of, tokens_of

RL_INPUTS = ("logprobs", "advantages")
CONFIG_KEYS = {"clip_low_threshold", "clip_high_threshold", "beta", "temperature"}  # temperature: minirl's


def needed_inputs(loss_fn: str) -> tuple[str, ...]:
    if loss_fn == "stable_reinforce":
        raise ValueError("loss_fn 'stable_reinforce' is not supported: its objective uses sampler-side stability "
                         "records that Tinker does not document; use importance_sampling or cispo")
    if loss_fn not in TINKER_LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; use one of {list(TINKER_LOSSES)} or forward_backward_custom")
    if loss_fn == "cross_entropy":
        return ("target_tokens", "weights")
    return ("target_tokens",) + RL_INPUTS + (("sequence_ratio_mask",) if loss_fn == "gspo" else ())


def collate(datums: list, loss_fn: str, pad_id: int, device: torch.device) -> dict:
    """The batch token_logprobs takes (rollout.py's layout) plus the loss's inputs, each (N, R), and what maps
    the outputs back to the datums' positions ("starts", "lengths")."""
    need = needed_inputs(loss_fn)
    rows = []
    for k, d in enumerate(datums):
        x, inputs = tokens_of(d.model_input), d.loss_fn_inputs
        missing = [name for name in need if name not in inputs and not (name == "weights" and loss_fn == "cross_entropy")]
        if missing:
            raise ValueError(f"datum {k}: loss_fn {loss_fn!r} needs loss_fn_inputs {missing} "
                             f"(it has {sorted(inputs)}); RL losses need the sampler's logprobs and advantages")
        cols = {name: tensor_of(inputs[name]).float() for name in need[1:] if name in inputs}
        y = tensor_of(inputs["target_tokens"]).long()
        n = len(x)
        if len(y) != n or any(len(v) != n for v in cols.values()):
            raise ValueError(f"datum {k}: every loss_fn_inputs tensor needs model_input's length {n}")
        s = n - 1
        while s > 0 and int(y[s - 1]) == x[s]:
            s -= 1
        scored = [v[:s] for name, v in cols.items() if name in ("weights", "advantages")]
        if any(bool((v != 0).any()) for v in scored):
            raise ValueError(f"datum {k}: target_tokens[i] must be model_input[i + 1] wherever the loss is not 0 "
                             f"(position {s - 1} is not); minirl scores next-token targets only")
        rows.append((x[:s + 1], y[s:].tolist(), {name: v[s:] for name, v in cols.items()}, s, n))
    N, P, R = len(rows), max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    ids, attn = torch.full((N, P + R), pad_id, dtype=torch.long), torch.zeros(N, P + R, dtype=torch.long)
    # float32 by name: a from_pretrained on another thread sets the default dtype process-wide while it loads
    mask = torch.zeros(N, R, dtype=torch.float32)
    cols = {name: torch.zeros(N, R, dtype=torch.float32)
            for name in ("weights",) + RL_INPUTS + ("sequence_ratio_mask",)}
    for i, (prompt, response, inputs, _, _) in enumerate(rows):
        p, r = len(prompt), len(response)
        ids[i, P - p:P + r] = torch.tensor(prompt + response, dtype=torch.long)
        attn[i, P - p:P + r] = 1
        mask[i, :r] = 1.0
        for name, v in inputs.items():
            cols[name][i, :r] = v
    weighted = [k for k, d in enumerate(datums) if "weights" in d.loss_fn_inputs]
    if "weights" in need and 0 < len(weighted) < N:  # the others would silently weigh 0
        raise ValueError(f"{len(weighted)} of {N} datums carry loss_fn_inputs 'weights', datum "
                         f"{min(set(range(N)) - set(weighted))} does not: give every datum weights, or none "
                         "(then every target token weighs 1)")
    if "weights" not in need or not weighted:
        cols["weights"] = mask.clone()
    batch = {"input_ids": ids, "attention_mask": attn, "mask": mask, **cols}
    batch = {k: v.to(device) for k, v in batch.items()}
    batch.update(starts=[r[3] for r in rows], lengths=[r[4] for r in rows])
    return batch


def trainer_batch(datums: list, pad_id: int, device) -> dict[str, torch.Tensor]:
    """The trainer's batch layout of datums (train.py's input_ids, attention_mask, response_mask), with the
    datums' weights as the response mask."""
    batch = collate(datums, "cross_entropy", pad_id, torch.device(device))
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "response_mask": batch["weights"]}


def loss_pass(model, batch: dict, loss_fn: str, config: dict, micro_batch_size: int, grad: bool,
              temperature: float = 1.0) -> tuple[float, torch.Tensor, dict[str, float]]:
    """Tinker's summed loss over the batch, backpropagated micro-batch by micro-batch when `grad`.
    Returns (loss sum, log-probs (N, R) without a graph, metrics)."""
    needed_inputs(loss_fn)
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise ValueError(f"unknown loss_fn_config keys {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
    N, R = batch["mask"].shape
    total, logps, kl_sum, kl_count = 0.0, [], 0.0, 0.0
    for s in range(0, N, micro_batch_size):
        mb = {k: v[s:s + micro_batch_size] for k, v in batch.items() if isinstance(v, torch.Tensor)}
        with torch.set_grad_enabled(grad):
            logp, _ = token_logprobs(model, mb["input_ids"], mb["attention_mask"], R, temperature)     # (n, R)
            loss = tinker_loss(loss_fn, logp, mb["logprobs"], mb["advantages"], mb["weights"], mb["mask"],
                               config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2),
                               config.get("beta"), mb["sequence_ratio_mask"])
            if grad:
                loss.backward()
        total += float(loss.detach())
        logps.append(logp.detach())
        sampled = mb["mask"] * (mb["logprobs"] != 0)  # the sampler's tokens: 0 marks positions it did not sample
        kl_sum, kl_count = kl_sum + float(((mb["logprobs"] - logp.detach()) * sampled).sum()), kl_count + float(sampled.sum())
    metrics = {"loss:sum": total}
    if loss_fn != "cross_entropy":  # the ratio's drift from the sampler (on-policy: 0)
        metrics["ppo_kl:mean"] = kl_sum / max(kl_count, 1.0)
    return total, torch.cat(logps), metrics


def outputs(batch: dict, logp: torch.Tensor) -> list[dict[str, TensorData]]:
    """Each datum's target log-probs at its own positions (0 before the first scored one)."""
    result = []
    for i, (s, n) in enumerate(zip(batch["starts"], batch["lengths"])):
        row = [0.0] * s + logp[i, :n - s].tolist()
        result.append({"logprobs": TensorData(row, "float32", [n])})
    return result

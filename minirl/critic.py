"""The critic for PPO (`algorithm: ppo`): a value model V(s_t) over the response tokens, and its update.

As in SimpleRL-reason / OpenRLHF / verl, the critic is a transformer body with a scalar head: by default a copy
of the policy's starting weights (`critic_model_path: ""`) whose LM head is replaced by a zero-initialised
linear layer, or a separate model folder. Its value at response position t is read from the hidden state
*before* token t, the same position whose logits give log pi(y_t), so values and log-probs line up (N, R).

With `fsdp: true` the critic is loaded and trained like the policy (load_critic's `place`): built on the meta
device, sharded (each decoder layer, then the ValueModel as the root: embeddings, final norm, value head),
filled from the files that process 0 reads, its AdamW state on the shards, gradients summed by FSDP's
reduce-scatter, and saved in the sharded checkpoint (checkpoint.CRITIC_SHARDED). Its forward is the root
module's own, so FSDP gathers the root's parameters around it with no registered method.

The PPO step: token rewards (outcome reward on the last token, optionally minus beta * KL per token) -> GAE
(loss.gae) -> whitened advantages -> clipped policy loss (loss.policy_loss) and clipped value loss
(loss.value_loss), several epochs over mini-batches with old log-probs and old values fixed at sampling time.
"""
from __future__ import annotations

import torch
from torch import nn

from minirl.config import ConfigError
from minirl.loss import value_loss
from minirl.models import disable_dropout, empty_model, enable_gradient_checkpointing, load_model
from minirl.logprobs import position_ids_from_mask


class ValueModel(nn.Module):
    """A causal-LM body plus a scalar value head. `body` is the model's decoder (embeddings + layers + norm)."""

    def __init__(self, causal_lm):
        super().__init__()
        self.body = causal_lm.get_decoder()
        self.config = causal_lm.config
        self.value_head = nn.Linear(causal_lm.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)  # start at V=0: no arbitrary values before the first update
        nn.init.zeros_(self.value_head.bias)
        self.value_head.to(next(self.body.parameters()).dtype)

    def get_decoder(self) -> nn.Module:
        """The transformer body: what distributed.shard shards layer by layer."""
        return self.body

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_response_tokens: int
                ) -> torch.Tensor:
        """Values of the states before each response token, (N, R) fp32."""
        R = num_response_tokens
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids_from_mask(attention_mask), use_cache=False).last_hidden_state
        return self.value_head(hidden[:, -R - 1:-1]).squeeze(-1).float()   # (N, R)


def load_critic(path: str, dtype: torch.dtype, attn_implementation: str, gradient_checkpointing: bool,
                device: torch.device, keep_dropout: bool = False, place=None) -> ValueModel:
    """The value model, with its body's dropout off (old values then equal the training pass's) unless kept.

    `place` (FSDP: distributed.shard_and_load with its device and compute dtype, as for the policy): the model is
    built on the meta device, sharded and filled from the files read by process 0 (the files' `model.*` is the
    critic's `body.*`, their LM head is not read), so no process holds the whole critic; the value head, which
    no file holds, is then zeroed on every process (the same start everywhere). Weights are fp32 (`dtype` is
    then unused: compute runs in the place's dtype)."""
    if place is None:
        body = load_model(path, dtype, attn_implementation, gradient_checkpointing)
        return ValueModel(body if keep_dropout else disable_dropout(body)).to(device)
    causal_lm = empty_model(path, attn_implementation)
    if gradient_checkpointing:
        enable_gradient_checkpointing(causal_lm)
    critic = ValueModel(causal_lm if keep_dropout else disable_dropout(causal_lm))
    prefix = causal_lm.base_model_prefix + "."  # the decoder's name in the files ("model." for Qwen2, Llama)
    if getattr(causal_lm, causal_lm.base_model_prefix, None) is not causal_lm.get_decoder():
        raise ConfigError(f"critic model {path!r}: its decoder is not its `{causal_lm.base_model_prefix}` module, "
                          "so its files cannot be read into a sharded critic; use fsdp: false for this model")
    place(critic, path, rename=lambda name: "body." + name[len(prefix):] if name.startswith(prefix) else None,
          fresh=("value_head.",))
    with torch.no_grad():
        for p in critic.value_head.parameters():
            p.zero_()
    return critic


@torch.no_grad()
def critic_values(critic: ValueModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  num_response_tokens: int, micro_batch_size: int) -> torch.Tensor:
    """Old values V_old (N, R), computed in micro-batches at sampling time."""
    return torch.cat([critic(input_ids[s:s + micro_batch_size], attention_mask[s:s + micro_batch_size],
                             num_response_tokens)
                      for s in range(0, input_ids.shape[0], micro_batch_size)])


def critic_forward_backward(critic: ValueModel, batch: dict[str, torch.Tensor], micro_batch_size: int,
                            num_tokens: float, clip: float = 0.5) -> dict[str, float]:
    """Accumulate the clipped value loss gradient of one optimizer step (token-mean over the step's tokens).

    batch: input_ids, attention_mask, response_mask, old_values (N, R), returns (N, R).
    """
    R = batch["response_mask"].shape[1]
    sums = {"vf_loss": 0.0, "vf_clipfrac": 0.0, "vpred_mean": 0.0}
    for s in range(0, batch["input_ids"].shape[0], micro_batch_size):
        mb = {k: v[s:s + micro_batch_size] for k, v in batch.items()}
        values = critic(mb["input_ids"], mb["attention_mask"], R)
        loss, metrics = value_loss(values, mb["old_values"], mb["returns"], mb["response_mask"], clip=clip,
                                   num_tokens=num_tokens)
        loss.backward()
        n_tok = float(mb["response_mask"].sum())
        sums["vf_loss"] += float(loss.detach())
        sums["vf_clipfrac"] += float(metrics["vf_clipfrac"]) * n_tok / num_tokens
        sums["vpred_mean"] += float((values.detach() * mb["response_mask"]).sum()) / num_tokens
    return sums

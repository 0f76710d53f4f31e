"""Helper for test_loss_convention.py: run as `python` (one process) or under `torchrun --nproc_per_node 2`
(gloo, CPU). Each process takes its share of a saved batch of sampled groups and computes the step's gradient
(summed over processes, as optim_step does) four ways: train.py's forward_backward with token-mean and with
Dr. GRPO's seq-mean-token-sum-norm, recipes/grpo_gsm8k.py's datums and recipes/code_rl.py's, both through the
sessions API. The first process saves them."""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes"))
import code_rl  # noqa: E402
import grpo_gsm8k  # noqa: E402
from minirl.distributed import global_counts, sum_gradients_across_processes  # noqa: E402
from minirl.logprobs import token_logprobs  # noqa: E402
from minirl.loss import group_advantages  # noqa: E402
from minirl.sessions import ModelInput, ServiceClient  # noqa: E402
from minirl.update import LossSettings, forward_backward  # noqa: E402

model_path, data_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
data = json.loads(Path(data_path).read_text())  # prompts (B), responses (B, G), rewards (B, G), max_tokens
svc = ServiceClient()
rank, world = svc.process_index, svc.num_processes
tc = svc.create_training_client(model_path, micro_batch_size=3).result()
model, pad = tc.model, tc.get_tokenizer().pad_token_id
B, G, budget = len(data["prompts"]), len(data["responses"][0]), data["max_tokens"]
mine = range(rank * B // world, (rank + 1) * B // world)
prompts = [data["prompts"][b] for b in mine]
responses = [data["responses"][b] for b in mine]
rewards = [data["rewards"][b] for b in mine]

# train.py's batch: prompts left-padded, responses right-padded (N, P+R); on-policy old log-probs
P, R = max(map(len, prompts)), budget
ids, attn = [], []
for p, group in zip(prompts, responses):
    for r in group:
        ids.append([pad] * (P - len(p)) + p + r + [pad] * (R - len(r)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (R - len(r)))
ids, attn = torch.tensor(ids), torch.tensor(attn)
with torch.no_grad():
    logp = token_logprobs(model, ids, attn, R)[0]                                              # (N, R)
batch = {"input_ids": ids, "attention_mask": attn, "response_mask": attn[:, P:], "old_logp": logp,
         "advantages": group_advantages(torch.tensor(rewards).view(-1), G, "dr_grpo")}
sampled = [[SimpleNamespace(tokens=r, logprobs=logp[i * G + j, :len(r)].tolist()) for j, r in enumerate(group)]
           for i, group in enumerate(responses)]


def grads() -> dict:
    sum_gradients_across_processes(model)
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


result = {}
num_tokens, num_seqs = global_counts(batch["response_mask"])
for agg in ("token-mean", "seq-mean-token-sum-norm"):
    forward_backward(model, batch, LossSettings(loss_agg_mode=agg, max_new_tokens=budget), 3, num_tokens, num_seqs)
    result[agg] = grads()
step_tokens = grpo_gsm8k.step_tokens(sampled)
datums = [d for p, group, r in zip(prompts, sampled, rewards)
          for d in grpo_gsm8k.group_datums(ModelInput.from_ints(p), group, r, step_tokens)]
tc.forward_backward(datums, "ppo").result()
result["grpo_gsm8k"] = grads()
scale = code_rl.advantage_scale(len(prompts), G, budget, world)
for p, group, r in zip(prompts, sampled, rewards):
    episodes = [SimpleNamespace(prompt_tokens=p, completion_tokens=s.tokens, logprobs=s.logprobs,
                                weights=[1.0] * len(s.tokens), reward=ri) for s, ri in zip(group, r)]
    tc.forward_backward(code_rl.group_datums(episodes, scale), "cispo").result()
result["code_rl"] = grads()
if rank == 0:
    torch.save(result, out_path)
tc.stop()
svc.shutdown()

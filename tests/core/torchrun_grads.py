"""Helper for test_distributed.py, launched with `torchrun --nproc_per_node 2` (gloo, CPU).

Each process takes its contiguous share of a saved batch, runs forward_backward with the step's global token
and sequence counts, sums gradients across processes as train.py does, and rank 0 saves them.
"""
import sys

import torch
import torch.distributed as dist

from minirl.distributed import global_counts, sum_gradients_across_processes
from minirl.toy.tiny import build_model
from minirl.update import LossSettings, forward_backward

data_path, out_path, agg, micro = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data = torch.load(data_path)
model = build_model(data["vocab"], seed=0, eos_id=data["eos"], pad_id=data["pad"])
model.load_state_dict(data["state"])
N = data["batch"]["input_ids"].shape[0]
share = {k: v[rank * N // world:(rank + 1) * N // world] for k, v in data["batch"].items()}
num_tokens, num_seqs = global_counts(share["response_mask"])
forward_backward(model, share, LossSettings(loss_agg_mode=agg, max_new_tokens=data["max_len"]), micro,
                 num_tokens=num_tokens, num_seqs=num_seqs)
sum_gradients_across_processes(model)
if rank == 0:
    torch.save({n: p.grad for n, p in model.named_parameters() if p.grad is not None}, out_path)
dist.barrier()
dist.destroy_process_group()

"""Helper for test_rollout_speed_paths.py, launched with `torchrun --nproc_per_node 2` (gloo, CPU).

Each process shards the tiny model with FSDP (as train.py does with fsdp: true), gathers its full weights
(distributed.gathered, as train.py does around sampling) and samples with rollout.sample's decode loop and with
its generate path from the same seed; rank 0 saves both rollouts' tokens.
"""
import sys

import torch
import torch.distributed as dist

import minirl.rollout as rollout
from minirl.distributed import gathered, shard
from minirl.models import load_tokenizer
from minirl.toy.tiny import build_model, tiny_model_path

PROMPTS = ["<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 12+45 and then a longer tail?<|im_end|>\n<|im_start|>assistant\n"]

out_path = sys.argv[1]
dist.init_process_group("gloo")
tokenizer = load_tokenizer(str(tiny_model_path()))
make = lambda: build_model(len(tokenizer), seed=0, eos_id=tokenizer.eos_token_id,  # noqa: E731
                           pad_id=tokenizer.pad_token_id)
results = {}
model = make()
shard(model)
with gathered(model):
    for name, fast in (("loop", True), ("generate", False)):
        if not fast:
            rollout.shares_prompts = lambda *args: False
        torch.manual_seed(0)
        results[name] = rollout.sample(model, tokenizer, PROMPTS, 3, 10, temperature=1.3).response_ids
if dist.get_rank() == 0:
    torch.save(results, out_path)
dist.barrier()
dist.destroy_process_group()

"""Helper for test_session.py, launched with `torchrun --nproc_per_node 2` (gloo, CPU): every process runs the
same session loop on its half of the datums (SPMD), saves its own gradients (before optim_step sums them across
processes), the loss and the gradient norm that optim_step reports."""
import json
import sys
from pathlib import Path

import torch

from minirl.sessions import AdamParams, Datum, ModelInput, ServiceClient, TensorData

model, data, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
svc = ServiceClient()
rank, world = svc.process_index, svc.num_processes
assert world == 2, "launch with torchrun --nproc_per_node 2"
datums = [Datum(ModelInput.from_ints(d["tokens"]),
                {k: TensorData(v, "int64" if k == "target_tokens" else "float32") for k, v in d["inputs"].items()})
          for d in json.loads(Path(data).read_text())]
share = datums[rank * len(datums) // world:(rank + 1) * len(datums) // world]
tc = svc.create_training_client(model, micro_batch_size=3).result()
loss = tc.forward_backward(share, "ppo").result().loss
grads = {n: p.grad.clone() for n, p in tc.model.named_parameters() if p.grad is not None}
grad_norm = tc.optim_step(AdamParams(learning_rate=0.0)).result().metrics["grad_norm"]
torch.save({"loss": loss, "grads": grads, "grad_norm": grad_norm}, out / f"rank{rank}.pt")
tc.stop()
svc.shutdown()

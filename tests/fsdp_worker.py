"""Helper for test_fsdp.py (launched by torchrun): train with FSDP, then check every process sees the same
full weights, and write the per-rank checksums for the test to compare."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402
from minirl.distributed import gathered, is_sharded  # noqa: E402

out = Path(sys.argv[1])
# train.main tears the process group down at its end; keep it for the cross-rank check below
train.shutdown = lambda: None
result = train.main(sys.argv[2:] + ["--output_dir", str(out)])
policy = result["policy"]
with gathered(policy), torch.no_grad():  # the full parameters, as this process sees them
    checksum = torch.tensor([float(sum(p.double().sum() * (i + 1) for i, p in enumerate(policy.parameters())))],
                            dtype=torch.float64)
sums = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
dist.all_gather(sums, checksum)
if dist.get_rank() == 0:
    (out / "ranks.json").write_text(json.dumps({"sharded": is_sharded(policy), "checksums": [float(s) for s in sums]}))
dist.barrier()
dist.destroy_process_group()

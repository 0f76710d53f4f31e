"""Helper for test_sharded.py: build a policy the FSDP way (meta device, sharded, weights read by process 0 and
broadcast) on each process, measure the memory it took, and check it against a plain load. Writes
OUT_DIR/load<rank>.json.

    torchrun --nproc_per_node 2 tests/core/torchrun_load.py MODEL_DIR OUT_DIR CHUNK_BYTES

Memory: the process's peak resident set since just before loading (VmHWM, reset then), taken once the weights
are in place (when build_policy calls check_exact), less its resident set before loading. `with_check_bytes` includes check_exact's three forward passes (on CPU, glibc keeps the freed
all-gather buffers of each layer; a GPU's allocator holds them on the device, not in host memory). Process 0
then loads the model plainly (from_pretrained) to compare.
"""
import functools
import json
import sys
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from minirl.distributed import full_state_dict, shard_and_load
from minirl import models
from minirl.models import build_policy, empty_model, load_model


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # Linux: the peak resident set starts again from here
        f.write("5")


def peak_bytes() -> int:
    """The peak resident set since reset_peak (VmHWM; not ru_maxrss, which carries the launcher's across exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main(model_dir: str, out: Path, chunk_bytes: int) -> None:
    dist.init_process_group("gloo")
    rank, cpu = dist.get_rank(), torch.device("cpu")
    empty_model(model_dir)  # imports the model's module: what it costs is no part of loading
    rss_before = psutil.Process().memory_info().rss
    reset_peak()
    loaded, real_check = {}, models.check_exact

    def check_exact(model, *args):  # build_policy's last step: the weights are in place when it is called
        loaded["peak"] = peak_bytes()
        real_check(model, *args)

    models.check_exact = check_exact
    place = functools.partial(shard_and_load, device=cpu, chunk_bytes=chunk_bytes)
    policy = build_policy(model_dir, cpu, torch.float32, place=place)
    policy.reshard()  # FSDP2 leaves the root's parameters gathered after a forward (check_exact's)
    info = {"sharded_load_bytes": loaded["peak"] - rss_before, "with_check_bytes": peak_bytes() - rss_before,
            "shard_bytes": sum(p.to_local().numel() * p.element_size() for p in policy.parameters()),
            "full_bytes": sum(p.numel() * p.element_size() for p in policy.parameters())}
    ids = torch.tensor([[5, 17, 42, 8, 99, 3, 250, 7]])
    with torch.no_grad():
        sharded_logits = policy.eval()(ids).logits  # collective: FSDP gathers each layer
    state = full_state_dict(policy)  # collective; the full weights on process 0 only
    if rank == 0:
        plain = load_model(model_dir).eval()
        reference = plain.state_dict()
        info["same_keys"] = sorted(state) == sorted(reference)
        info["same_weights"] = all(torch.equal(state[k], reference[k]) for k in reference)
        with torch.no_grad():
            info["same_logits"] = torch.equal(sharded_logits, plain(ids).logits)
    (out / f"load{rank}.json").write_text(json.dumps(info))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))

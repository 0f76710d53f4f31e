"""Everything that knows there are several processes: reductions, gradient sums and FSDP sharding.

train.py calls these at the edges of a step; the loss, rollout and reward code never see a process group.
One process is simply world size 1 (every function here is then a no-op or the identity).

Data parallel without FSDP: each process holds the whole model; after `forward_backward` the gradients are
summed across processes (`sum_gradients_across_processes`): each process's loss is already normalised by the
step's *global* token count, so the sum is the full batch's gradient.

FSDP (`fsdp: true`, FSDP2's `fully_shard`): each decoder layer is a unit, then the model itself (the root:
embeddings, final norm, LM head). The same code runs on GPUs (NCCL) and in the CI test on 2 CPU processes
(gloo); accelerate's FSDP plugin is not used because on CPU it silently falls back to DDP.
- Gradients: FSDP's reduce-scatter is set to *sum* them (its default averages), as plain data parallelism
  does, so the loss and `forward_backward` are the same with and without FSDP.
- Log-probs: `token_logprobs` calls the decoder and the LM head itself (to chunk the LM head), so it is
  registered as an FSDP forward method of the root: the root's parameters are gathered around it.
- Rollouts: generating through sharded layers would all-gather every layer at every token. `gathered` unshards
  every unit once (with resharding after forward turned off), generates, then reshards: a few all-gathers
  per rollout instead of one per layer per token.
- With peft, the inner base model is the root, not the PeftModel wrapper (generate fails otherwise).
"""
from __future__ import annotations

import contextlib
import functools
import types

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


# --- the step's numbers over all processes: what train.py's step reads as math ---------------------------------

def global_sum(t: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of a tensor over processes (in place, on its own device)."""
    if world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def global_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """sum(x * mask) / sum(mask) over every process's entries, as one process holding them all computes it
    (e.g. the entropy per response token); 0 where the mask is empty everywhere."""
    total = global_sum(torch.stack([(x * mask).sum(), mask.sum().to(x.dtype)]))
    return float(total[0] / total[1].clamp(min=1))


def global_counts(mask: torch.Tensor) -> tuple[float, float]:
    """(response tokens, sequences with at least one) of a mask (N, R) over all processes: the loss's
    normalisers, so that each process's share of the gradient sums to the whole batch's (loss.aggregate's
    num_tokens, num_seqs). Rows without a token (dynamic sampling's padding groups, masked truncations) are
    no sequence of the batch, as in verl's agg_loss: otherwise the seq-mean losses would depend on how many
    padding groups the processes happened to add."""
    counts = global_sum(torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum())], dtype=torch.float64,
                                     device=mask.device))
    return max(float(counts[0]), 1.0), float(counts[1])


def global_max(x: float) -> float:
    """The largest value of a number over all processes (e.g. so that all pick one micro-batch size)."""
    if world_size() == 1:
        return x
    return float(_all_reduce_cpu(torch.tensor([float(x)], dtype=torch.float64), dist.ReduceOp.MAX))


def global_min(x: float) -> float:
    """The smallest value of a number over all processes (e.g. the groups every process can train)."""
    return -global_max(-x)


all_reduce_max, all_reduce_min = global_max, global_min


def sum_over_processes(metrics: dict[str, float]) -> dict[str, float]:
    """Sum each metric over processes: for per-process shares of a step total (forward_backward's losses)."""
    if world_size() == 1 or not metrics:
        return metrics
    t = torch.tensor(list(metrics.values()), dtype=torch.float64)
    return dict(zip(metrics, _all_reduce_cpu(t, dist.ReduceOp.SUM).tolist()))


def gather_rows(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Every process's rows of each tensor, concatenated in process order (each process holds as many rows:
    dynamic sampling pads to the same number of groups everywhere)."""
    if world_size() == 1:
        return list(tensors)
    out = []
    for t in tensors:
        parts = [torch.empty_like(t, device=_device()) for _ in range(world_size())]
        dist.all_gather(parts, t.to(_device()))
        out.append(torch.cat(parts).to(t.device))
    return out


def _device() -> torch.device:
    """The device collectives run on: the current GPU under NCCL, the CPU under gloo."""
    if dist.get_backend() == "nccl":  # device-branch: distributed/nccl-device
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce_cpu(t: torch.Tensor, op) -> torch.Tensor:
    on_device = t.to(_device())
    dist.all_reduce(on_device, op=op)
    return on_device.cpu()


def broadcast_object(obj):
    """Process 0's value of a picklable object, on every process (e.g. the checkpoint it chose to resume)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_parameters(params) -> None:
    """Copy the first process's values into every process's parameters (e.g. a freshly initialised adapter)."""
    if world_size() > 1:
        for p in params:
            dist.broadcast(p.data, src=0)


def shutdown() -> None:
    """Tear the process group down on every process after a barrier. Leaving it to interpreter exit lets the
    backend's threads die in arbitrary order, which can abort a process after a run that finished well."""
    if world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()


def sum_gradients_across_processes(model) -> None:
    """The global gradient is the sum of the per-process gradients. Plain data parallelism sums them here;
    a sharded model's backward already did (its reduce-scatter sums, see `shard`)."""
    if world_size() > 1 and not is_sharded(model):
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


# --- FSDP ----------------------------------------------------------------------------------------------------

def _root(model):
    """The module FSDP shards as its root: the base model under a peft wrapper, else the model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(_root(model), FSDPModule)


def shard(model, compute_dtype: torch.dtype = torch.float32) -> None:
    """fully_shard each decoder layer, then the root; register the log-prob method as a forward method.

    Mixed precision: the sharded parameters and the optimizer state stay fp32; FSDP casts the gathered copy
    to `compute_dtype` for forward/backward and reduces gradients in fp32 (so small updates are not lost)."""
    from torch.distributed.fsdp import (FSDPModule, MixedPrecisionPolicy, fully_shard,
                                        register_fsdp_forward_method)

    from minirl.logprobs import _token_logprobs_unsharded
    root = _root(model)
    low = compute_dtype != torch.float32
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype if low else None,
                              reduce_dtype=torch.float32 if low else None)
    for layer in root.get_decoder().layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(root, mp_policy=mp)
    for unit in [m for m in root.modules() if isinstance(m, FSDPModule)]:
        # FSDP averages gradients over processes; each process's loss is already normalised by the step's
        # global counts, so the batch's gradient is their sum: divide by 1, with a plain sum on every backend
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    if not hasattr(root, "get_output_embeddings"):  # the PPO critic (critic.ValueModel): values, no log-probs
        return
    # one pass per layer and step: FSDP's hooks would gather a layer twice if the shared prompt ran separately
    unshared = functools.partial(_token_logprobs_unsharded, share_prompts=False)
    root.minirl_token_logprobs = types.MethodType(unshared, root)
    register_fsdp_forward_method(root, "minirl_token_logprobs")


@contextlib.contextmanager
def gathered(model):
    """Full parameters on every process for the duration (generation); a no-op without FSDP."""
    from torch.distributed.fsdp import FSDPModule
    units = [m for m in _root(model).modules() if isinstance(m, FSDPModule)] if is_sharded(model) else []
    for unit in units:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(unit is not _root(model))  # FSDP2's default: the root keeps them


def full_state_dict(model) -> dict | None:
    """Unsharded weights on CPU (collective: call on every process); None when the model is not sharded."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(_root(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# --- loading once, sharded checkpoints ---------------------------------------------------------------------

LOAD_CHUNK_BYTES = 1 << 30  # process 0 reads the model files at most this many bytes at a time


def shard_and_load(model, path: str, device: torch.device, compute_dtype: torch.dtype = torch.float32,
                   chunk_bytes: int = LOAD_CHUNK_BYTES, rename=None, fresh: tuple[str, ...] = ()) -> None:
    """Give a model built on the meta device (models.empty_model) its weights, never holding the whole model on
    any process: shard it (several processes), allocate each process's shard on `device`, then process 0 reads
    the files a chunk at a time and `set_model_state_dict(broadcast_from_rank0=True)` sends each tensor to
    every process, which keeps its shard. Peak memory: process 0 one chunk (host) plus its shard, the others
    their shard plus the tensor in flight. One process is the same path (sharded over a group of one where a
    launcher made a process group, e.g. torchrun on one GPU; without one, nothing to shard or broadcast). The
    files must be readable by process 0 only.

    The meta model's buffers (rotary frequencies, not in the files) were built for real and are put back after
    allocation; parameters are swapped in place so that tied weights (lm_head = embeddings) stay one tensor.

    A model whose names are not the files' (the PPO critic, critic.load_critic): `rename(file name) -> the
    model's name, or None` for a tensor not to load, and `fresh`, the name prefixes of tensors no file holds (its
    value head): allocated but not filled, for the caller to initialise."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from minirl.models.weights import file_chunks, read_chunk
    if dist.is_available() and dist.is_initialized():  # a launcher's group, of one process too (torchrun)
        shard(model, compute_dtype)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    aliases: dict[int, list[str]] = {}  # tied parameters: one tensor, several names
    for name, p in _root(model).named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    groups = list(aliases.values())
    groups += [[k] for k in _root(model).state_dict() if not any(k in g for g in groups)]  # persistent buffers
    groups = [g for g in groups if not any(n.startswith(fresh) for n in g)] if fresh else groups
    chunks = broadcast_object(file_chunks(path, groups, chunk_bytes, rename) if rank() == 0 else None)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=world_size() > 1, strict=False)
    for chunk in chunks:  # the same number of calls on every process
        state = read_chunk(path, chunk) if rank() == 0 else {}
        if rename is not None:
            state = {rename(k): v for k, v in state.items() if rename(k) is not None}
        set_model_state_dict(_root(model), state, options=options)


def save_sharded(model, optimizer, folder) -> None:
    """Every process writes its own shards of the weights and of AdamW's state into `folder`
    (torch.distributed.checkpoint: one file per process and a `.metadata` index; collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    _reshard(model)
    model_state, optimizer_state = get_state_dict(_root(model), optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_sharded(model, optimizer, folder) -> None:
    """Read back what save_sharded wrote, each process its own shards, whatever the number of processes now (or
    into an unsharded model on one process); collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    _reshard(model)
    model_state, optimizer_state = get_state_dict(_root(model), optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(_root(model), optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _reshard(model) -> None:
    """FSDP2 keeps the root's parameters gathered after a forward; the optimizer holds the sharded ones, and
    get_state_dict matches the two by the parameters the model has registered now."""
    if is_sharded(model):
        _root(model).reshard()


def load_full_state(model, optimizer, model_state: dict, optimizer_state: dict | None) -> None:
    """Scatter full (unsharded) weights and optimizer state into a sharded model (every process): for a
    checkpoint written without shards (plain data parallelism) resumed under FSDP."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(_root(model), model_state, options=options)
    if optimizer_state is not None:
        set_optimizer_state_dict(_root(model), optimizer, _keyed_by_name(model, optimizer, optimizer_state),
                                 options=options)


def _keyed_by_name(model, optimizer, optimizer_state: dict) -> dict:
    """A plain `optimizer.state_dict()` (parameters numbered in the optimizer's order) keyed by parameter name
    instead, the form set_optimizer_state_dict reads (it fails with KeyError 'state.0.step' on numbers). The
    optimizer being loaded was built over the same parameters in the same order as the one that saved."""
    names = {id(p): n for n, p in _root(model).named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    if not all(isinstance(i, int) for g in optimizer_state["param_groups"] for i in g["params"]):
        return optimizer_state  # already keyed by name
    return {"state": {order[i]: s for i, s in optimizer_state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                             for g in optimizer_state["param_groups"]]}

"""Checkpoints that survive crashes, and exact resumption.

A checkpoint is a folder `<output_dir>/checkpoints/step_000040/` holding everything the next step depends on:
the policy's weights (or only its LoRA adapter), the optimizer and LR-scheduler state, the critic and its
optimizer (PPO), every process's RNG states, the step and the position in the prompt stream. It is written into
`.tmp-step_000040/` and renamed into place when complete: a rename is atomic, so a crash mid-write leaves
only a `.tmp-*` folder, which `latest_checkpoint` ignores (and the next save removes). The last `keep_last`
checkpoints are kept.

With `fsdp: true` the weights and AdamW's state are sharded (`sharded/`, torch.distributed.checkpoint; PPO's
critic and its AdamW state in `critic_sharded/`): every process writes its own file and reads back its own
part, whatever the number of processes then; nobody gathers the whole model (a 7B checkpoint is ~91 GB).
`python -m torch.distributed.checkpoint.format_utils dcp_to_torch_save CKPT/sharded full.pt` turns one into a
single file. Otherwise process 0 writes `model/` (a `save_pretrained` folder) and `optimizer.pt`. The final
model is always a plain `save_pretrained` folder.

Resuming restores all of it, so a run killed after step k and resumed gives the same metrics and weights as
one that never stopped (tests/test_checkpoint.py checks this bit for bit). Process 0 chooses the checkpoint and
tells the others; a process that cannot read it stops the run with a message naming the folder (node-local
output folders would otherwise resume some processes and start others afresh).

`save`, `resume` and `save_final` are what train.py calls (with its accelerate Accelerator, for ranks and
barriers); the functions below them do one part each.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import torch

from minirl.distributed import (broadcast_object, full_state_dict, global_max, is_sharded, load_sharded,
                                save_sharded)
from minirl.models.weights import load_weights, save_merged, save_model

STEP_DIR = re.compile(r"^step_(\d{6,})$")
SHARDED = "sharded"  # the torch.distributed.checkpoint folder inside a checkpoint
CRITIC_SHARDED = "critic_sharded"  # the same for PPO's critic and its optimizer


def save(accelerator, cfg, step: int, position: int, policy, optimizer, scheduler, critic=None,
         critic_optimizer=None) -> None:
    """All processes save their RNG and, with fsdp, their shards of the weights and optimizer; the main process
    saves the rest and renames the folder into place once every file is there."""
    out_dir = Path(cfg.output_dir)
    if accelerator.is_main_process:
        shutil.rmtree(checkpoint_root(out_dir) / f".tmp-step_{step:06d}", ignore_errors=True)  # a crashed try
        begin_save(out_dir, step)
    accelerator.wait_for_everyone()
    tmp = begin_save(out_dir, step)
    save_process_state(tmp, accelerator.process_index)
    if cfg.fsdp:  # one process too (then one shard): the same format whatever the number of processes
        save_sharded(policy, optimizer, tmp / SHARDED)  # collective: each process writes its own file
        if critic is not None:
            save_sharded(critic, critic_optimizer, tmp / CRITIC_SHARDED)
    accelerator.wait_for_everyone()
    sharded = [SHARDED] + ([CRITIC_SHARDED] if critic is not None else []) if cfg.fsdp else []
    missing = broadcast_object([f for d in sharded for f in missing_shards(tmp / d)]
                               if accelerator.is_main_process else [])
    if missing:  # every process wrote into its own view of output_dir: not one folder
        raise SystemExit(f"checkpoint: process 0 does not see the files {missing[:3]} that other processes wrote "
                         f"into {tmp}: output_dir must be on a filesystem that every node mounts at the same path")
    if accelerator.is_main_process:
        save_shared_state(tmp, policy, optimizer, scheduler, step, position, vars(cfg), critic,
                          critic_optimizer, weights=not cfg.fsdp)
        finish_save(out_dir, tmp, step, cfg.keep_last)
    accelerator.wait_for_everyone()


def resume(accelerator, cfg, policy, optimizer, scheduler, critic=None, critic_optimizer=None
           ) -> tuple[int, int]:
    """(step, position) to start from: restored from a checkpoint when cfg.resume asks for one. Process 0 picks
    the checkpoint for every process; each checks that it reads the same one before anything is loaded."""
    if not cfg.resume:
        root = checkpoint_root(cfg.output_dir)
        if accelerator.is_main_process and root.is_dir() and any(root.iterdir()):
            # a later --resume auto must not pick up the earlier run's checkpoints; keep them, out of the way
            aside = root.with_name(f"checkpoints.before-{time.strftime('%Y%m%d-%H%M%S')}")
            root.rename(aside)
            accelerator.print(f"note: moved an earlier run's checkpoints to {aside} (use --resume auto to continue "
                              "a run instead)")
        accelerator.wait_for_everyone()
        return 0, 0
    choice = None  # (the checkpoint's name in output_dir, or its path; process 0's host; its trainer_state.json)
    if accelerator.is_main_process:
        folder = latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else Path(cfg.resume)
        state_file = folder / "trainer_state.json" if folder is not None else None
        choice = folder and (folder.name if cfg.resume == "auto" else str(folder), socket.gethostname(),
                             state_file.read_text() if state_file.exists() else None)
    choice = broadcast_object(choice)  # the same decision on every process, even with node-local folders
    if choice is None:
        accelerator.print(f"resume=auto: no checkpoint in {checkpoint_root(cfg.output_dir)}; starting fresh")
        return 0, 0
    name, host, state_text = choice
    folder = checkpoint_root(cfg.output_dir) / name if cfg.resume == "auto" else Path(name)
    if state_text is None:
        raise SystemExit(f"resume: {folder} is not a complete checkpoint (no trainer_state.json)")
    problem = unreadable(folder, state_text)
    if global_max(float(problem is not None)):  # every process stops, none starts afresh
        raise SystemExit(
            f"resume: process {accelerator.process_index} on {socket.gethostname()} cannot read the checkpoint "
            f"{folder} that process 0 on {host} chose to resume: {problem}. Every process must read the same "
            "checkpoint: put output_dir on a filesystem that every node mounts at the same path, or copy the "
            f"folder to the same path on each node (rsync -a {host}:{folder.resolve()}/ {folder.resolve()}/) and "
            "resume again." if problem else
            f"resume: another process cannot read the checkpoint {folder} (its message says why); stopping")
    state = load_checkpoint(folder, accelerator.process_index, policy, optimizer, scheduler, critic,
                            critic_optimizer, sharded=is_sharded(policy))
    if state["step"] >= cfg.max_steps:
        raise SystemExit(f"resume: the run in {cfg.output_dir} already finished step {state['step']} "
                         f"(max_steps={cfg.max_steps}); nothing to train. Raise --max_steps to continue it.")
    metrics_file = Path(cfg.output_dir) / "metrics.jsonl"
    if accelerator.is_main_process and metrics_file.exists():  # drop rows logged after the checkpoint
        rows = [line for line in metrics_file.read_text().splitlines()
                if line.strip() and json.loads(line)["training/global_step"] <= state["step"]]
        metrics_file.write_text("".join(r + "\n" for r in rows))
    accelerator.print(f"resumed from {folder} at step {state['step']}")
    return state["step"], state["position"]


def unreadable(folder: Path, state_text: str) -> str | None:
    """Why this process cannot resume from `folder` as process 0 sees it (None: it can)."""
    if not folder.is_dir():
        return "the folder does not exist here"
    state_file = folder / "trainer_state.json"
    if not state_file.exists():
        return "it has no trainer_state.json here"
    if state_file.read_text() != state_text:
        return "its trainer_state.json here differs from process 0's (another run's checkpoint)"
    if (folder / SHARDED).is_dir():
        missing = [f for d in (SHARDED, CRITIC_SHARDED) if (folder / d).is_dir() for f in missing_shards(folder / d)]
        return f"the shard files {missing[:3]} are missing here" if missing else None
    if not (folder / "optimizer.pt").exists():
        return "optimizer.pt is missing here"
    return None


def missing_shards(folder: Path) -> list[str]:
    """The files a torch.distributed.checkpoint folder's index names that are not there (all: no index)."""
    if not (folder / ".metadata").exists():
        return [".metadata"]
    from torch.distributed.checkpoint import FileSystemReader
    files = {item.relative_path for item in FileSystemReader(str(folder)).read_metadata().storage_data.values()}
    return sorted(f for f in files if not (folder / f).exists())


def save_final(accelerator, policy, tokenizer, base_path: str, out_dir: Path, dtype: torch.dtype, merged: bool,
               summary: dict) -> None:
    """The trained policy in `out_dir`: with LoRA the adapter (eval.py loads it), else the full model in `dtype`;
    with `merged`, also a plain merged model in out_dir/merged; and summary.json. Every process calls it."""
    accelerator.wait_for_everyone()
    model_state = full_state_dict(policy)  # FSDP: gathered on every process (collective), saved by the first
    if accelerator.is_main_process:
        save_model(policy, out_dir, dtype, model_state)
        tokenizer.save_pretrained(out_dir)
        if merged:  # a plain model that AutoModelForCausalLM loads
            save_merged(policy, base_path, out_dir / "merged", dtype)
            tokenizer.save_pretrained(out_dir / "merged")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"saved the policy and tokenizer to {out_dir}")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (its folder exists only once fully written), or None."""
    root = checkpoint_root(output_dir)
    steps = sorted((int(m.group(1)), p) for p in root.glob("step_*") if (m := STEP_DIR.match(p.name))
                   and (p / "trainer_state.json").exists()) if root.is_dir() else []
    return steps[-1][1] if steps else None


def rng_state() -> dict:
    # device-branch: checkpoint/cuda-rng
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():  # device-branch: checkpoint/cuda-rng
        torch.cuda.set_rng_state_all(state["cuda"])


def begin_save(output_dir: str | Path, step: int) -> Path:
    """The temporary folder every process writes into (call on all processes, after a barrier)."""
    tmp = checkpoint_root(output_dir) / f".tmp-step_{step:06d}"
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


def save_process_state(tmp: Path, rank: int) -> None:
    """What differs per process: its RNG states (each samples differently)."""
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")


def save_shared_state(tmp: Path, model, optimizer, scheduler, step: int, position: int, config: dict,
                      critic=None, critic_optimizer=None, model_state: dict | None = None,
                      weights: bool = True) -> None:
    """What all processes share (written by the main process): weights and optimizer, the critic's too (unless
    `weights` is False: distributed.save_sharded wrote them), scheduler, counters. `model_state`: the weights to save
    instead of the model's own state dict."""
    if weights:
        model.save_pretrained(tmp / "model", state_dict=model_state)  # a LoRA model saves its adapter only
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if scheduler is not None:  # the sessions API sets the rate at each optim_step instead
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    if critic is not None and weights:
        torch.save(critic.state_dict(), tmp / "critic.pt")
        torch.save(critic_optimizer.state_dict(), tmp / "critic_optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "position": position, "config": config},
                                                       indent=2))


def finish_save(output_dir: str | Path, tmp: Path, step: int, keep_last: int) -> Path:
    """Rename the finished folder into place (atomic), then drop old and half-written checkpoints."""
    final = checkpoint_root(output_dir) / f"step_{step:06d}"
    if final.exists():  # re-saving a step (e.g. the end of a run that was resumed at its last step)
        shutil.rmtree(final)
    os.replace(tmp, final)
    root = checkpoint_root(output_dir)
    complete = sorted(p for p in root.glob("step_*") if STEP_DIR.match(p.name))
    for old in complete[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step_*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def load_checkpoint(folder: Path, rank: int, model, optimizer, scheduler, critic=None,
                    critic_optimizer=None, sharded: bool = False) -> dict:
    """Restore everything saved in `folder`; returns trainer_state (step, position, config). A sharded checkpoint
    goes into any model, sharded or not (torch.distributed.checkpoint reshards); an unsharded one into a
    sharded model (`sharded`) is read whole by every process and scattered into its shards."""
    if (folder / SHARDED).is_dir():
        load_sharded(model, optimizer, folder / SHARDED)
    elif sharded:
        from safetensors.torch import load_file

        from minirl.distributed import load_full_state
        weights = {}
        for f in sorted((folder / "model").glob("*.safetensors")):
            weights.update(load_file(str(f)))
        load_full_state(model, optimizer, weights, torch.load(folder / "optimizer.pt", weights_only=False))
    else:
        load_weights(model, folder / "model")
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
    if critic is not None and (folder / CRITIC_SHARDED).is_dir():
        load_sharded(critic, critic_optimizer, folder / CRITIC_SHARDED)
    elif critic is not None and is_sharded(critic):  # a plain checkpoint's critic scattered into the shards
        from minirl.distributed import load_full_state
        load_full_state(critic, critic_optimizer, torch.load(folder / "critic.pt", weights_only=False),
                        torch.load(folder / "critic_optimizer.pt", weights_only=False))
    elif critic is not None:
        critic.load_state_dict(torch.load(folder / "critic.pt", weights_only=False))
        critic_optimizer.load_state_dict(torch.load(folder / "critic_optimizer.pt", weights_only=False))
    rng_file = folder / f"rng_rank{rank}.pt"
    if rng_file.exists():  # a different number of processes than before: keep fresh RNG on the new ones
        set_rng_state(torch.load(rng_file, weights_only=False))
    return json.loads((folder / "trainer_state.json").read_text())

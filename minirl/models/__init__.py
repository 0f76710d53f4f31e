"""The models room: build the models a run needs, the policy (with LoRA, a dtype, gradient checkpointing), its
tokenizer, and the frozen reference policy pi_ref for the KL penalty. Beside this file: lora.py (the adapter
and a frozen, possibly quantised base) and weights.py (a model's weights on disk). The RL core imports these;
they import from the core only its config error and logprobs.check_exact, the test every built model passes.

The reference is a second copy of the starting weights, in eval mode with gradients off, used only to score the
response tokens the policy sampled (`ref_logp`). With `kl_coef: 0` the trainer builds none. With LoRA the
reference is the policy with its adapter disabled (`adapter_disabled`): no second copy.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from minirl.config import ConfigError
from minirl.logprobs import check_exact
from minirl.models.lora import adapter_base, adapter_disabled, add_lora, init_adapter, quantization_config  # noqa: F401


class ModelNotFoundError(ConfigError, FileNotFoundError):
    """model_name_or_path names no folder (and no hub model can be fetched): a user error, not a bug."""


def resolve_model_path(name: str) -> str:
    """"tiny" -> the built-in toy model, "tiny-code" -> its sibling for the built-in code task, "smollm2-135m" ->
    SmolLM2-135M-Instruct converted from its PyPI wheel (each built once, cached); anything else is passed to
    from_pretrained."""
    if name == "tiny":
        from minirl.toy.tiny import tiny_model_path
        with BUILDING:  # the first call builds it (a from_pretrained elsewhere sets the default dtype meanwhile)
            return str(tiny_model_path())
    if name == "tiny-code":
        from minirl.toy.tiny_code import tiny_code_model_path
        with BUILDING:
            return str(tiny_code_model_path())
    if name == "smollm2-135m":
        from minirl.toy.smollm2 import smollm2_path
        try:
            with BUILDING:
                return str(smollm2_path())
        except FileNotFoundError as e:
            raise ModelNotFoundError(str(e)) from None
    path = Path(name).expanduser()
    # offline, a name that is no folder cannot be a hub model either: say so instead of a hub traceback
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if not path.exists() and (name.startswith((".", "/", "~")) or offline):
        raise ModelNotFoundError(f"model_name_or_path {name!r} does not exist; pass a folder written by "
                                 "save_pretrained, 'tiny' for the built-in toy model or 'smollm2-135m'")
    return str(path) if path.exists() else name


def cuda_indices(model) -> list[int]:
    """The GPUs holding `model`'s parameters: whose random streams a draw on the model's device advances."""
    return sorted({p.device.index or 0 for p in model.parameters()
                   if p.device.type == "cuda"})  # device-branch: models/rng-devices


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype: bf16 on a GPU for "auto", fp32 on a CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32  # device-branch: models/dtype-auto
    return getattr(torch, name)


def autocast(device: torch.device, dtype: torch.dtype):
    """Compute matmuls in `dtype` (bf16/fp16) over fp32 weights; nothing changes for float32."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)  # device-branch: models/autocast


def config_dtype(path: str) -> torch.dtype:
    """The dtype a model's own config declares (what its weights were published in): the dtype to save in."""
    from transformers import AutoConfig
    dtype = getattr(AutoConfig.from_pretrained(adapter_base(path) or path), "dtype", None)
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype or torch.float32


# device-branch: models/attn-pick
def flash_attention() -> str | None:
    """The flash-attn implementation this machine runs: "flash_attention_2" where the package is installed
    (requirements-gpu.txt) and a CUDA device is present, else None. The only place the choice reads the machine:
    a CPU test replaces it to select a stand-in kernel (tests/core/flash_stand_in.py) and run the GPU's branch."""
    import importlib.util
    # device-branch: models/attn-pick
    if importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available():
        return None
    return "flash_attention_2"


def pick_attn_implementation(name: str, dtype: torch.dtype | None = None) -> str:
    """"auto": flash-attn where `flash_attention()` finds it and the run computes in `dtype` fp16/bf16 (flash-attn
    takes no fp32: with `--dtype float32` every forward would fail), else sdpa. Any other name is used as given."""
    if name != "auto":
        return name
    flash = flash_attention()  # device-branch: models/attn-pick
    return flash if flash and dtype in (torch.float16, torch.bfloat16) else "sdpa"


def load_tokenizer(path: str):
    """AutoTokenizer with left padding (generation appends on the right) and a pad token. An adapter folder
    uses its base model's tokenizer (LoRA does not change it; AutoTokenizer needs the base's config)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(adapter_base(path) or path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # many base models ship none; eos is safe because masks exclude padding
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# Models are built one at a time in a process: from_pretrained builds on the meta device by patching torch
# process-wide for the length of the call, so a model built on another thread meanwhile (two sessions' clients
# created at once) got meta weights ("Cannot copy out of meta tensor"). Reentrant: build_policy holds it too.
BUILDING = threading.RLock()


def load_model(path: str, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa",
               gradient_checkpointing: bool = False, load_in_bits: int = 0):
    """A causal LM from a folder: a full model, a merged LoRA model, or a peft adapter on its base model."""
    with BUILDING:
        return _load_model(path, dtype, attn_implementation, gradient_checkpointing, load_in_bits)


def _load_model(path, dtype, attn_implementation, gradient_checkpointing, load_in_bits):
    from transformers import AutoModelForCausalLM

    if load_in_bits:  # device-branch: models/quantized
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation,
                                                     quantization_config=quantization_config(load_in_bits),
                                                     device_map={"": torch.cuda.current_device()})
    elif adapter_base(path) is not None:
        from peft import AutoPeftModelForCausalLM
        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def empty_model(path: str, attn_implementation: str = "sdpa"):
    """The model at `path` with its parameters on the meta device (no memory) and its buffers built for real (the
    rotary frequencies, which the files do not hold): for distributed.shard_and_load to shard and fill. Tied
    weights are tied here, before sharding, so that they stay one tensor."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    if adapter_base(path) is not None:
        raise ConfigError(f"model_name_or_path {path!r} is a LoRA adapter; fsdp trains full models: merge it first "
                          "(--save_merged true writes output_dir/merged) and pass that folder")
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32,
                                                 attn_implementation=attn_implementation)
    model.tie_weights()
    return model


def enable_gradient_checkpointing(model) -> None:
    """Recompute each layer's activations in backward. Non-reentrant checkpointing works with frozen inputs
    (LoRA) and with FSDP. (transformers 5 renamed the method; both names are tried.)"""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Every dropout in the model off, so that train mode computes what generate samples from (eval mode):
    with dropout, the old log-probs of a rollout already differ from the sampler's and ratio != 1. As TRL's
    `disable_dropout_in_model` (trl/trainer/utils.py) this zeroes each nn.Dropout's p; it also zeroes the
    rates that attention modules keep as floats and pass to their attention kernel (`attention_dropout`)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
    return model


def build_policy(path: str, device: torch.device, dtype: torch.dtype, attn_implementation: str = "sdpa",
                 lora: dict | None = None, gradient_checkpointing: bool = False, load_in_bits: int = 0,
                 seed: int = 0, keep_dropout: bool = False, place=None):
    """The policy to train, in train mode on `device`: the model at `path`, with a LoRA adapter when `lora`
    (keys rank, alpha, dropout, target_modules) is given. train.py and the sessions' TrainingClient both build
    theirs here. Its dropout is off unless `keep_dropout` (disable_dropout says why), and a model whose
    log-probs minirl does not compute exactly is refused (logprobs.check_exact).

    Precision: trained weights stay fp32 and compute runs in `dtype` (autocast or FSDP's mixed precision), since
    bf16 weights would round away most updates at lr 1e-6. A frozen base (LoRA, quantised) is held in `dtype`;
    peft keeps the adapter in fp32 over it. The adapter is drawn from a generator of its own seeded by `seed`
    (init_adapter), so every process, and every thread whatever the others draw meanwhile, builds the same one;
    peft's own draws run under fork_rng, so the caller's global random stream is left where it was.

    `place(model, path)` (FSDP: distributed.shard_and_load with its device and dtype): the model is built on the
    meta device and `place` shards it and fills in its weights, so no process ever holds the whole model."""
    frozen_base = bool(lora) or bool(load_in_bits)
    with BUILDING:
        if place is not None:  # full fine-tuning only: config.check refuses fsdp with LoRA or quantisation
            model = empty_model(path, attn_implementation)
            if gradient_checkpointing:
                enable_gradient_checkpointing(model)
            place(model, path)
        else:
            model = load_model(path, dtype if frozen_base else torch.float32, attn_implementation,
                               gradient_checkpointing, load_in_bits)
            model = model if load_in_bits else model.to(device)  # a quantised model is put on its GPU already
        check_exact(model, dtype)  # in fp32 where it can; else as the run computes, in `dtype`
        if hasattr(model, "reshard"):  # FSDP2 keeps its root gathered after a forward: the optimizer needs shards
            model.reshard()
        if lora:  # peft's own init draws from the global generator; init_adapter overwrites what it drew
            with torch.random.fork_rng(devices=cuda_indices(model)):  # so the caller's stream is where it was
                model = add_lora(model, lora["rank"], lora["alpha"], lora.get("dropout", 0.0),
                                 lora.get("target_modules", "all-linear"))
            init_adapter(model, seed)
    return (model if keep_dropout else disable_dropout(model)).train()


def load_reference(path: str, dtype: torch.dtype, attn_implementation: str, device: torch.device, place=None):
    """The frozen reference policy: eval mode (no dropout), no gradients, checked as the policy is. Held in
    `dtype`; with `place` (FSDP, see build_policy) built on the meta device and sharded like the policy (fp32
    shards, computed in `dtype`): a quarter of a replicated bf16 copy's memory per GPU on 8 GPUs."""
    if place is not None:
        model = empty_model(path, attn_implementation)
        place(model, path)
    else:
        model = load_model(path, dtype=dtype, attn_implementation=attn_implementation).to(device)
    disable_dropout(model)
    check_exact(model, dtype)
    if hasattr(model, "reshard"):  # FSDP2 keeps its root gathered after a forward
        model.reshard()
    model.eval()
    model.requires_grad_(False)
    return model

"""LoRA and a frozen base: the peft adapter the policy trains (add_lora, init_adapter), the base model it runs as
for the KL reference (adapter_disabled), an adapter folder's base (adapter_base), and bitsandbytes quantisation of
the frozen base (quantization_config, QLoRA). minirl/models/__init__.py builds the policy with them."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch


def add_lora(model, rank: int, alpha: int, dropout: float = 0.0, target_modules: str = "all-linear"):
    """Wrap the policy in a peft LoRA adapter; only the adapter's weights train. target_modules: peft's
    "all-linear" or comma-separated module names."""
    from peft import LoraConfig, get_peft_model
    targets = target_modules if target_modules == "all-linear" else \
        [t.strip() for t in target_modules.split(",") if t.strip()]
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                                            target_modules=targets, task_type="CAUSAL_LM"))


@torch.no_grad()
def init_adapter(model, seed: int) -> None:
    """peft's LoRA init, drawn from torch.Generator(seed) instead of torch's global generator (which other
    threads, unseeded samplers, draw from too). The draws replay peft's after torch.manual_seed(seed), so the
    adapter is the one a seed always gave: per layer, in creation order, nn.Linear's Kaiming-uniform init of A
    and of B when they are built, then A's own; B is zero."""
    from peft.tuners.lora import LoraLayer
    generator = torch.Generator().manual_seed(seed)
    kaiming = lambda w: torch.nn.init.kaiming_uniform_(torch.empty(w.shape), a=math.sqrt(5), generator=generator)  # noqa: E731
    for module in model.modules():
        if isinstance(module, LoraLayer):
            for name in module.lora_A:
                a, b = module.lora_A[name].weight, module.lora_B[name].weight
                kaiming(a), kaiming(b)
                a.copy_(kaiming(a))
                b.zero_()


def adapter_disabled(model):
    """Context in which a peft model runs as its base model (the LoRA reference); a no-op for plain models."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()


def adapter_base(path: str) -> str | None:
    """The base model of a peft adapter folder (adapter_config.json), else None."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        return None
    import json
    return json.loads(config.read_text())["base_model_name_or_path"]


def quantization_config(bits: int):
    """bitsandbytes 4-bit (NF4, bf16 compute) or 8-bit base weights; a clear error where they cannot work."""
    import importlib.util
    # device-branch: models/quantized
    if importlib.util.find_spec("bitsandbytes") is None or not torch.cuda.is_available():
        raise RuntimeError(f"load_in_bits={bits} needs a CUDA GPU and the bitsandbytes package "
                           "(pip install bitsandbytes); use load_in_bits: 0 on this machine")
    from transformers import BitsAndBytesConfig
    if bits == 4:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    return BitsAndBytesConfig(load_in_8bit=True)

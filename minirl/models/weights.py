"""A model's weights on disk: saved in the dtype to publish (save_model), a LoRA policy merged into one plain
model (save_merged), and saved weights loaded into a live model in place (load_weights). minirl/checkpoint.py
builds crash-safe checkpoints on them; the sessions' save_weights_for_sampler and load_state use them directly."""
from __future__ import annotations

from pathlib import Path

import torch

from minirl.models import BUILDING, load_model


def save_model(model, folder: str | Path, dtype: torch.dtype, state_dict: dict | None = None) -> None:
    """save_pretrained with floating-point weights cast to `dtype` (training keeps fp32 weights; a bf16 model is
    saved in bf16 again). A peft model saves its adapter, kept as trained (fp32). Checkpoints for resuming are
    saved unchanged (checkpoint.save_shared_state), so that resuming is exact."""
    if hasattr(model, "peft_config"):
        model.save_pretrained(folder, state_dict=state_dict)
        return
    state = state_dict if state_dict is not None else model.state_dict()
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    model.config.dtype = dtype  # config.json records what the files hold
    model.save_pretrained(folder, state_dict=state)


def save_merged(model, base_path: str, folder: str | Path, dtype: torch.dtype) -> None:
    """A LoRA policy as one plain model that AutoModelForCausalLM loads. The delta is merged into an fp32 copy of
    the base read from its own files: merged into the bf16 base used for compute, most of it would round away."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    with BUILDING:  # peft builds modules: not while another thread's from_pretrained patches torch (__init__.py)
        peft_model = get_peft_model(load_model(base_path, torch.float32), model.peft_config["default"])
    set_peft_model_state_dict(peft_model, get_peft_model_state_dict(model))
    save_model(peft_model.merge_and_unload(), folder, dtype)


def load_weights(model, folder: Path) -> None:
    """Load saved weights (full model or LoRA adapter) into an existing model, in place."""
    from safetensors.torch import load_file

    if (folder / "adapter_model.safetensors").exists():
        from peft import set_peft_model_state_dict
        set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
        return
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no weights in {folder}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied weights (lm_head = embeddings) are saved once; anything else missing is an error
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {folder} does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")

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


def file_chunks(folder: str | Path, groups: list[list[str]], max_bytes: int, rename=None
                ) -> list[list[tuple[str, str]] | None]:
    """The tensors of a model folder's safetensors files in reading order, grouped into chunks of at most
    `max_bytes` (a larger tensor goes alone): [(file, tensor name), ...] per chunk, for read_chunk. `groups`: the
    model's state-dict names, tied names together (lm_head = embeddings, saved once); each group needs one name
    in the files. When the files do not hold exactly those names (an architecture whose weights transformers
    renames or fuses while loading, or .bin files), one chunk `None`: read_chunk then runs from_pretrained.
    `rename(file name) -> model name, or None for a tensor not loaded` (the critic's body: `model.*` is `body.*`,
    the LM head is not read): the names compared with `groups`; the chunks keep the files' names."""
    import json
    import struct
    entries, names = [], set()
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:  # the header: 8 bytes of length, then JSON {name: {dtype, shape, data_offsets}}
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for name, info in header.items():
            target = name if rename is None or name == "__metadata__" else rename(name)
            if name != "__metadata__" and target is not None:
                start, end = info["data_offsets"]
                entries.append((f.name, name, end - start))
                names.add(target)
    known = {n for g in groups for n in g}
    if not entries or not names <= known or not all(names.intersection(g) for g in groups):
        return [None]
    chunks, size = [[]], 0
    for file, name, nbytes in entries:
        if chunks[-1] and size + nbytes > max_bytes:
            chunks, size = chunks + [[]], 0
        chunks[-1].append((file, name))
        size += nbytes
    return chunks


def read_chunk(folder: str | Path, chunk: list[tuple[str, str]] | None) -> dict[str, torch.Tensor]:
    """The tensors of one chunk of file_chunks, as stored (their dtype is cast on loading); `None`: the whole
    model's state dict through from_pretrained in fp32."""
    if chunk is None:
        return load_model(str(folder), torch.float32).state_dict()
    from safetensors import safe_open
    out, handles = {}, {}
    for file, name in chunk:
        if file not in handles:
            handles[file] = safe_open(str(Path(folder) / file), "pt")
        out[name] = handles[file].get_tensor(name)
    return out

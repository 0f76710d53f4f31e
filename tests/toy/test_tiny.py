import json

from tokenizers import Tokenizer

from conftest import shared_file


def test_auto_tokenizer_tokenises_exactly_like_the_trained_tokenizer(tiny_path, tiny_tokenizer):
    """AutoTokenizer picks Qwen2Tokenizer for model_type=qwen2 and rebuilds its pre-tokenizer; the toy
    tokenizer is trained with that same pipeline, so ids must be identical on arbitrary text."""
    raw = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    texts = ["What is 47+38?", "#### 85", "  spaces\tand\nnew lines 12,345.67 don't"]
    texts += [json.loads(line)["question"] for line in list(shared_file("gsm8k/test_200.jsonl").open())[:20]]
    for t in texts:
        assert tiny_tokenizer(t, add_special_tokens=False).input_ids == raw.encode(t, add_special_tokens=False).ids
        assert tiny_tokenizer.decode(raw.encode(t).ids) == t
    assert tiny_tokenizer.padding_side == "left" and tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id


def test_tiny_model_loads_with_plain_from_pretrained(tiny_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert model.config.model_type == "qwen2" and sum(p.numel() for p in model.parameters()) < 2_000_000


def test_the_build_writes_only_its_folder_and_the_same_weights_whatever_the_callers_threads(tmp_path):
    """minirl/toy/cache.py: build_in_fixed_env runs the build with one thread and fixed kernels (1 and 2 threads
    gave other weights, and other toy-run figures, before); nothing lands in $HOME or the working folder."""
    import hashlib
    import os
    import subprocess
    import sys
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    digests = []
    for threads in ("1", "2"):
        folder = tmp_path / f"built-with-{threads}"
        folder.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "XDG_CACHE_HOME")}
        code = ("import sys; from pathlib import Path; from minirl.toy.cache import build_in_fixed_env; "
                "build_in_fixed_env('minirl.toy.tiny', Path(sys.argv[1]), '4')")   # 4 warm-up steps: seconds
        subprocess.run([sys.executable, "-c", code, str(folder)], cwd=cwd, check=True, timeout=300,
                       env=dict(env, HOME=str(home), OMP_NUM_THREADS=threads))
        digests.append(hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    assert list(home.rglob("*")) == [] and list(cwd.rglob("*")) == []

"""Shared fixtures: everything offline, tiny models built from configs (nothing from a hub)."""
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"          # a hub call fails in 2 s instead of hanging for 48 s
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
# the tests' helper programs (torchrun workers) import train.py from the repository root
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """The built-in toy model (built once into ~/.cache/minirl or $MINIRL_CACHE)."""
    from minirl.toy.tiny import tiny_model_path
    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from minirl.models import load_tokenizer
    return load_tokenizer(str(tiny_path))


@pytest.fixture()
def random_model(tiny_tokenizer):
    """A freshly initialised 4-layer Qwen2 with the toy vocabulary (random weights, fp32)."""
    from minirl.toy.tiny import build_model
    return build_model(len(tiny_tokenizer), seed=0, eos_id=tiny_tokenizer.eos_token_id,
                       pad_id=tiny_tokenizer.pad_token_id)


def shared_file(rel: str) -> Path:
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"{path} not present (../shared/data is laid beside the checkout)")
    return path


# Gradients (and other sums) computed in two orders, by micro-batches or processes, differ by rounding whose
# size follows the largest values summed, not each entry: fp32 keeps ~7 digits of the largest term. So they are
# compared at the scale of the whole set, max|want| over every tensor, never with a fixed atol that a model
# with larger gradients (other weights, another CPU) exceeds. rel=1e-5 is ~100 fp32 ulps at that scale: rounding
# stays far below it (~3e-7 measured), a wrong normaliser or a dropped micro-batch is far above it.
def assert_close_at_scale(got, want, rel: float = 1e-5) -> None:
    """got and want: tensors, or dicts of tensors with the same keys (compared against one shared scale)."""
    if not isinstance(want, dict):
        got, want = {"": got}, {"": want}
    assert got.keys() == want.keys()
    scale = max(float(w.abs().max()) for w in want.values() if w.numel()) or 1.0
    for k in want:
        err = float((got[k] - want[k]).abs().max()) if want[k].numel() else 0.0
        assert err <= rel * scale, f"{k}: max |got - want| = {err:.3g} > {rel:g} * scale {scale:.3g}"


def pytest_configure(config):
    # tests that run, on CPU, a branch only a GPU or an optional kernel takes; tests/core/test_device_branches.py
    # checks every such branch in the source has one, and scripts/gpu_check.sh runs them on a GPU machine
    config.addinivalue_line("markers", "device_branch(*names): forces the named device branches "
                                       "(`# device-branch: NAME` in the source) on CPU")

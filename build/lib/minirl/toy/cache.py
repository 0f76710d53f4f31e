"""The cache of the built-in models: one folder each under ~/.cache/minirl (or $MINIRL_CACHE), built once.

    path = cached_model("tiny-arith-v3", write_tiny, "building the built-in tiny model (once, ~30 s)")
    build_in_fixed_env("minirl.toy.tiny", folder)    # python -m minirl.toy.tiny FOLDER, one thread, AVX2 kernels

A build writes into a fresh temporary folder beside its target, which is then renamed into place: a rename is
atomic, so a half-written model never sits at the target (a build killed midway leaves only a `.name-*`
folder), and when two processes build at once the first rename wins and the other's copy is removed.

A model that is trained while it is built (the tiny model's warm-up) comes out bit for bit the same only where
the float sums run in the same order. They do not across thread counts (measured: the tiny model built with 1
and with 2 threads had other weights, and so gave other held-out accuracies) nor across the vector widths of
the kernels that the CPU picks (AVX2, AVX-512). `build_in_fixed_env` therefore builds in a fresh interpreter
with one thread and, on x86, the AVX2 kernels of ATen, MKL and oneDNN, which every x86 CPU of the last ten
years runs.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("MINIRL_CACHE", Path.home() / ".cache" / "minirl"))


def atomic_build(path: Path, write: Callable[[Path], None]) -> Path:
    """write(folder) into a temporary folder, then rename it to `path` (kept as is if it appeared meanwhile)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model folder is for every user of the cache
    try:
        write(tmp)
        if not (tmp / "config.json").is_file():  # a build that wrote elsewhere must not leave an empty model
            raise RuntimeError(f"building {path.name} wrote no config.json into its build folder {tmp}")
        os.replace(tmp, path)
    except OSError:
        if not (path / "config.json").exists():  # not another process's finished build: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    return path


def cached_model(name: str, write: Callable[[Path], None], message: str) -> Path:
    """The folder cache_dir()/name, built with `write` on first use (a `from_pretrained` folder: config.json)."""
    path = cache_dir() / name
    if not (path / "config.json").exists():
        print(f"[minirl] {message}: {path}")
        atomic_build(path, write)
    return path


# One thread, and on x86 the AVX2 code paths (ATen's dispatch, MKL's conditional numerical reproducibility,
# oneDNN's ISA cap): each is read when the library starts, so they are set for a fresh interpreter.
FIXED_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
FIXED_X86_ISA = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def build_in_fixed_env(module: str, folder: Path, *args: str) -> None:
    """Run `python -m module folder *args` in a fresh interpreter whose float results depend neither on the
    machine's core count nor (on x86 CPUs with AVX2) on its vector width: every machine builds the same weights."""
    import minirl
    env = dict(os.environ, **FIXED_THREADS)
    if platform.machine().lower() in ("x86_64", "amd64"):
        env.update(FIXED_X86_ISA)
    package_root = str(Path(minirl.__file__).resolve().parents[1])   # importable from any working folder
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    subprocess.run([sys.executable, "-m", module, str(folder), *args], env=env, check=True)

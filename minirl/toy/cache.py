"""The cache of the built-in models: one folder each under ~/.cache/minirl (or $MINIRL_CACHE), built once.

    path = cached_model("tiny-arith-v2", write_tiny, "building the built-in tiny model (once, ~30 s)")

A build writes into a fresh temporary folder beside its target, which is then renamed into place: a rename is
atomic, so a half-written model never sits at the target (a build killed midway leaves only a `.name-*`
folder), and when two processes build at once the first rename wins and the other's copy is removed.
"""
from __future__ import annotations

import os
import shutil
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

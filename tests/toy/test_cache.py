"""minirl/toy/cache.py: a built-in model's folder appears whole or not at all."""
import pytest

from minirl.toy.cache import atomic_build, cached_model


def test_cached_model_builds_once_and_leaves_no_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRL_CACHE", str(tmp_path))
    calls = []

    def write(folder):
        calls.append(folder)
        (folder / "config.json").write_text("{}")

    path = cached_model("m-v1", write, "building")
    assert cached_model("m-v1", write, "building") == path == tmp_path / "m-v1"
    assert len(calls) == 1 and (path / "config.json").exists() and sorted(tmp_path.iterdir()) == [path]


def test_a_failed_build_leaves_nothing_and_a_finished_one_by_another_process_is_kept(tmp_path):
    def crash(folder):
        (folder / "half.bin").write_text("x")
        raise RuntimeError("killed midway")

    with pytest.raises(RuntimeError, match="midway"):
        atomic_build(tmp_path / "m", crash)
    assert list(tmp_path.iterdir()) == []

    def theirs_first(folder):  # another process renames its build into place while ours is being written
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("theirs")
        (folder / "config.json").write_text("ours")

    atomic_build(tmp_path / "m", theirs_first)
    assert (tmp_path / "m" / "config.json").read_text() == "theirs" and len(list(tmp_path.iterdir())) == 1

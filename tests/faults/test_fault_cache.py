"""Fault injection on the stage cache itself: every kind of bad entry is reported, set aside and
recomputed, never served; temporary folders of dead processes are removed when the cache opens."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.engine.cache import MANIFEST, UNOWNED_GRACE, CacheEntryError, StageCache, check_entry


def _entry(cache: StageCache, stage: str = "train", text: str = "weights") -> tuple[str, Path]:
    key = cache.key(stage, {"c2": 1.0}, {}, code="v1")

    def produce(folder: Path) -> None:
        (folder / "model.bin").write_text(text)
        (folder / "sub").mkdir()
        (folder / "sub" / "stage_metrics.json").write_text(json.dumps({"f1": 90.0}))

    return key, cache.build(stage, key, produce)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _tamper_content(path: Path) -> str:
    (path / "sub" / "stage_metrics.json").write_text(json.dumps({"f1": 99.0}))  # same size, other bytes
    return "sub/stage_metrics.json: content differs"


def _tamper_size(path: Path) -> str:
    (path / "model.bin").write_text("weights, truncated or grown")
    return "model.bin: 27 bytes, the manifest says 7"


def _missing_file(path: Path) -> str:
    (path / "model.bin").unlink()
    return "missing file(s): model.bin"


def _extra_file(path: Path) -> str:
    (path / "notes.txt").write_text("left here by hand")
    return "file(s) not in the manifest: notes.txt"


def _no_manifest(path: Path) -> str:
    (path / MANIFEST).unlink()
    return f"no {MANIFEST}"


def _broken_manifest(path: Path) -> str:
    (path / MANIFEST).write_text("{not json")
    return f"unreadable {MANIFEST}"


def _other_key(path: Path) -> str:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["key"] = "0" * 64
    (path / MANIFEST).write_text(json.dumps(manifest))
    return f"{MANIFEST} is for key"


def _dangling_link(path: Path) -> str:
    (path / "model.bin").unlink()
    (path / "model.bin").symlink_to(path / "gone.bin")
    return "model.bin cannot be read (No such file or directory)"


def _folder_for_file(path: Path) -> str:
    (path / "model.bin").unlink()
    (path / "model.bin").mkdir()
    (path / "model.bin" / "inside.txt").write_text("x")
    return "missing file(s): model.bin"


def _unreadable_manifest(path: Path) -> str:
    (path / MANIFEST).unlink()
    (path / MANIFEST).mkdir()  # a folder where the manifest was: not a file
    return f"no {MANIFEST}"


def _entry_is_a_dangling_link(path: Path) -> str:
    import shutil

    shutil.rmtree(path)
    path.symlink_to(path.parent / "nowhere")
    return f"no {MANIFEST}"


@pytest.mark.parametrize(
    "tamper",
    [
        _tamper_content,
        _tamper_size,
        _missing_file,
        _extra_file,
        _no_manifest,
        _broken_manifest,
        _other_key,
        _dangling_link,
        _folder_for_file,
        _unreadable_manifest,
        _entry_is_a_dangling_link,
    ],
)
def test_a_bad_entry_is_reported_set_aside_and_rebuilt(tmp_path, caplog, tamper):
    cache = StageCache(tmp_path)
    key, path = _entry(cache)
    assert cache.lookup("train", key) == path
    problem = tamper(path)
    with pytest.raises(CacheEntryError, match=re.escape(problem)):
        check_entry(path, "train", key)
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.cache"):
        assert cache.lookup("train", key) is None  # never served
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in warning and problem in warning and "moved aside to" in warning
    (aside,) = (tmp_path / "train").glob(f".bad-{key}-*")
    assert not os.path.lexists(path) and os.path.lexists(aside)  # kept for inspection, out of the way
    rebuilt = cache.build("train", key, lambda folder: (folder / "model.bin").write_text("weights"))
    assert cache.lookup("train", key) == rebuilt == path


def test_a_file_that_cannot_be_read_makes_the_entry_bad(tmp_path, monkeypatch, caplog):
    """No read permission (simulated: the tests may run as root, whom permissions do not stop):
    the entry is set aside and rebuilt, not an error that fails every later run."""
    import pipeline.engine.cache as cache_module

    cache = StageCache(tmp_path)
    key, path = _entry(cache)
    real = cache_module.file_sha256

    def denied(file: Path) -> str:
        if file.name == "model.bin" and file.parent == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real(file)

    monkeypatch.setattr(cache_module, "file_sha256", denied)
    with pytest.raises(CacheEntryError, match="model.bin cannot be read \\(Permission denied\\)"):
        check_entry(path, "train", key)
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.cache"):
        assert cache.lookup("train", key) is None
    assert "Permission denied" in caplog.text and len(list((tmp_path / "train").glob(".bad-*"))) == 1
    monkeypatch.setattr(cache_module, "file_sha256", real)
    assert cache.build("train", key, lambda folder: (folder / "model.bin").write_text("weights")) == path
    assert cache.lookup("train", key) == path


def test_an_entry_without_manifest_does_not_break_a_build(tmp_path):
    """The old failure: a folder at the key without its manifest made every later build fail with
    'Directory not empty'. Building straight away (no lookup first) now sets it aside."""
    cache = StageCache(tmp_path)
    key, path = _entry(cache)
    (path / MANIFEST).unlink()
    assert cache.build("train", key, lambda folder: (folder / "model.bin").write_text("new")) == path
    assert (path / "model.bin").read_text() == "new" and cache.lookup("train", key) == path
    assert len(list((tmp_path / "train").glob(".bad-*"))) == 1


def test_a_concurrent_twin_keeps_the_first_good_entry(tmp_path):
    cache = StageCache(tmp_path)
    key, path = _entry(cache, text="first")
    assert cache.build("train", key, lambda folder: (folder / "model.bin").write_text("second")) == path
    assert (path / "model.bin").read_text() == "first" and cache.lookup("train", key) == path
    assert [p.name for p in (tmp_path / "train").iterdir()] == [key]  # no temporary folder left


def test_temporary_folders_of_dead_processes_are_removed_at_open(tmp_path):
    cache = StageCache(tmp_path)
    key, path = _entry(cache)
    stage = tmp_path / "train"
    host = socket.gethostname()
    dead = stage / f".tmp-{key[:16]}-{_dead_pid()}@{host}-0123abcd"
    retired = stage / f".old-{key[:16]}-{_dead_pid()}@{host}-4567abcd"
    alive = stage / f".tmp-{key[:16]}-{os.getpid()}@{host}-89abcdef"  # a build running in this process
    elsewhere = stage / f".tmp-{key[:16]}-{_dead_pid()}@not-{host}-0123abcd"  # cannot tell: left alone
    unowned_old = stage / f".tmp-{key[:16]}-deadbeef"  # older versions named no owner
    unowned_new = stage / f".tmp-{key[:16]}-feedf00d"
    for folder in (dead, retired, alive, elsewhere, unowned_old, unowned_new):
        folder.mkdir()
        (folder / "half.npz").write_bytes(b"half")
    stale_file = stage / f".tmp-{key[:16]}-{_dead_pid()}@{host}-cafef00d"
    stale_file.write_bytes(b"half")
    past = time.time() - UNOWNED_GRACE - 60
    os.utime(unowned_old, (past, past))
    removed = StageCache(tmp_path, clean=False).remove_stale()
    assert set(removed) == {dead, retired, unowned_old, stale_file}
    assert {p.name for p in stage.iterdir()} == {key, alive.name, elsewhere.name, unowned_new.name}
    assert StageCache(tmp_path).lookup("train", key) == path


def test_an_interrupted_build_leaves_nothing_and_names_its_owner(tmp_path):
    cache = StageCache(tmp_path)
    seen = []

    def interrupted(folder: Path) -> None:
        seen.append(folder.name)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.build("train", "f" * 64, interrupted)
    assert seen[0].startswith(f".tmp-{'f' * 16}-{os.getpid()}@{socket.gethostname()}-")
    assert not list((tmp_path / "train").iterdir())


def test_output_hash_ignores_only_volatile_files(tmp_path):
    cache = StageCache(tmp_path)
    key, path = _entry(cache)
    before = cache.output_hash(path)
    other = StageCache(tmp_path / "elsewhere")
    _, moved = _entry(other)
    assert other.output_hash(moved) == before  # the folder does not enter the hash
    _tamper_content(path)  # a timing in the metrics file changes...
    files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {MANIFEST}
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"]["sub/stage_metrics.json"]["sha256"] = "0" * 64
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert files == set(manifest["files"])
    assert cache.output_hash(path) != before
    assert cache.output_hash(path, volatile=("*stage_metrics.json",)) == cache.output_hash(
        moved, volatile=("*stage_metrics.json",)
    )

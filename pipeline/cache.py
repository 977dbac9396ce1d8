"""Content-addressed cache of stage outputs.

A stage's output folder is keyed by a SHA-256 of (stage name, the config slice it depends on, the
hashes of its input artifacts, the code version). Values are compared as canonical JSON, so
``1`` and ``1.0`` and ``"1"`` are different configs but key order does not matter. An entry is
built in a temporary folder and renamed into place only when complete, so an interrupted run
never leaves a half-written entry. Each entry holds ``manifest.json`` listing its files and
their SHA-256; the hash of that manifest is the output's hash for downstream keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
CODE_PACKAGES = ("crf", "pipeline")


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@lru_cache(maxsize=1)
def code_version() -> str:
    """SHA-256 over the source of the ``crf`` and ``pipeline`` packages (uncommitted edits count)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


class StageCache:
    """Stage outputs under ``root/<stage>/<key>/``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).absolute()

    def key(self, stage: str, config: Mapping, inputs: Mapping[str, str], code: str | None = None) -> str:
        return digest({"stage": stage, "config": config, "inputs": dict(inputs), "code": code or code_version()})

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> Path | None:
        """The finished entry for ``key``, or None."""
        path = self.path(stage, key)
        return path if (path / MANIFEST).is_file() else None

    def build(self, stage: str, key: str, producer: Callable[[Path], None], replace: bool = False) -> Path:
        """Run ``producer(folder)`` in a temporary folder and publish it atomically; with
        ``replace`` an existing entry for the key is swapped out (``force=true``)."""
        final = self.path(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.parent / f".tmp-{key[:16]}-{uuid.uuid4().hex[:8]}"
        temporary.mkdir()
        try:
            producer(temporary)
            files = sorted(p for p in temporary.rglob("*") if p.is_file())
            manifest = {str(p.relative_to(temporary)): file_sha256(p) for p in files}
            (temporary / MANIFEST).write_text(json.dumps({"stage": stage, "key": key, "files": manifest}, indent=1))
            if replace and final.exists():
                retired = final.parent / f".old-{key[:16]}-{uuid.uuid4().hex[:8]}"
                os.rename(final, retired)
                shutil.rmtree(retired, ignore_errors=True)
            try:
                os.rename(temporary, final)
            except OSError:
                if not self.lookup(stage, key):  # not a concurrent twin: a real failure
                    raise
                shutil.rmtree(temporary, ignore_errors=True)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        return final

    @staticmethod
    def output_hash(path: Path) -> str:
        """Hash of an entry's manifest: what downstream stages key on."""
        return hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()

"""Content-addressed cache of stage outputs.

A stage's output folder is keyed by a SHA-256 of (stage name, the config slice it depends on, the
hashes of its input artifacts, the code it runs). Values are compared as canonical JSON after
normalising numbers: a float that is a whole number hashes as that integer (``c2=1`` and
``c2=1.0`` are the same setting), booleans stay booleans (``True`` is not ``1``), strings stay
strings, and key order does not matter. The code part hashes only the modules a stage actually
runs: its own module and the modules of the project's packages (``crf``, ``pipeline``) it imports,
transitively (found by reading their import statements), so editing one stage's code leaves the
other stages' entries valid. An entry is built in a temporary folder and renamed into place only
when complete, so an interrupted run never leaves a half-written entry. Each entry holds
``manifest.json`` listing its files and their SHA-256; the hash of that manifest is the output's
hash for downstream keys.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
CODE_PACKAGES = ("crf", "pipeline")


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def normalise(value: Any) -> Any:
    """``value`` with whole floats as ints (``1.0`` -> ``1``), recursively; bools, strings, NaN and
    infinities unchanged. Mappings come back as dicts, sequences as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v) for v in value]
    return value


def canonical(value: Any) -> str:
    return json.dumps(normalise(value), sort_keys=True, separators=(",", ":"), default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _module_file(name: str, root: Path) -> Path | None:
    """The source file of project module ``name`` under ``root`` (package ``__init__`` or module)."""
    parts = name.split(".")
    if parts[0] not in CODE_PACKAGES:
        return None
    base = root.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, name: str, root: Path) -> set[str]:
    """Project modules imported anywhere in ``path`` (module ``name``), with their parent packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return _parsed_imports(path.read_bytes(), str(path), name, package, str(root))


@lru_cache(maxsize=4096)
def _parsed_imports(source: bytes, filename: str, name: str, package: str, root: str) -> frozenset[str]:
    root = Path(root)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            if not module:
                continue
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # ``from pipeline import tracking``
    closed = set()
    for module in found:
        parts = module.split(".")
        closed.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # parents run their __init__
    return frozenset(m for m in closed if _module_file(m, root) is not None)


def module_closure(modules: Iterable[str], root: str | os.PathLike = PROJECT_ROOT) -> dict[str, Path]:
    """Project modules (of ``crf`` and ``pipeline``) that importing ``modules`` runs, transitively:
    {module name: source file}. A module outside the project (a test's adapter) counts itself."""
    root = Path(root)
    files: dict[str, Path] = {}
    pending = list(modules)
    while pending:
        name = pending.pop()
        if name in files:
            continue
        path = _module_file(name, root)
        if path is None:
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                raise ValueError(f"cannot find the source of module {name!r}")
            path = Path(spec.origin)
        files[name] = path
        parents = name.split(".")
        pending.extend(".".join(parents[:i]) for i in range(1, len(parents)) if _module_file(".".join(parents[:i]), root))
        pending.extend(_imports(path, name, root) - files.keys())
    return files


@lru_cache(maxsize=64)
def _code_digest(modules: tuple[str, ...], root: str) -> str:
    h = hashlib.sha256()
    for name, path in sorted(module_closure(modules, root).items()):
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def code_digest(modules: Iterable[str], root: str | os.PathLike = PROJECT_ROOT, cached: bool = True) -> str:
    """SHA-256 over the source of ``modules`` and every project module they import (uncommitted
    edits count). ``cached=False`` re-reads the files (tests that edit code)."""
    key = (tuple(sorted(set(modules))), str(Path(root)))
    return _code_digest(*key) if cached else _code_digest.__wrapped__(*key)


class StageCache:
    """Stage outputs under ``root/<stage>/<key>/``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).absolute()

    def key(self, stage: str, config: Mapping, inputs: Mapping[str, str], code: str) -> str:
        """The entry key of ``stage`` for its config slice, input hashes and code digest."""
        return digest({"stage": stage, "config": config, "inputs": dict(inputs), "code": code})

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

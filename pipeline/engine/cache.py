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
``manifest.json`` listing its files with their sizes and SHA-256; the hash of that manifest is the
output's hash for downstream keys.

A hit is verified before it is used: the entry must hold exactly the files of its manifest, with the
recorded sizes and hashes. A bad entry (edited or truncated file, missing or extra file, no or
unreadable manifest) is logged as a warning naming it and the problem, moved aside to
``<stage>/.bad-<key>-<UTC time>`` for inspection and recomputed, never served. Temporary folders
carry their owner (``.tmp-<key>-<pid>@<host>-<random>``); opening the cache removes those of
processes of this host that no longer run.

A cache may have a ``remote`` (:class:`RemoteStore`, an interface this module defines; the
pipeline's is ``pipeline.tracking.remote_cache.TrackingStore``: the MLflow tracking store shared by
several machines, given by whoever opens the cache). A local miss then asks the remote for the
entry; a fetched entry is verified against its manifest like a local one before it is published
locally (a bad one is dropped and the stage recomputed), and every entry built here is published
to the remote too. The local folder is then only a local copy.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

MANIFEST = "manifest.json"
CODE_PACKAGES = ("crf", "pipeline")
# code that runs stages, not code they run: the engine (contract, runner, caches) and tracking
# (MLflow) hand a stage its inputs and take its outputs, and are left out of its key
NOT_STAGE_CODE = ("pipeline.engine", "pipeline.tracking")
UNOWNED_GRACE = 24 * 3600.0  # seconds before a temporary folder without an owner counts as stale

log = logging.getLogger(__name__)


PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
    for node in _runtime_nodes(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            if not module:
                continue
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # ``from pipeline import tracking``
            exports = _lazy_exports(module, str(root))  # ``from crf import CRF``: the module that defines it
            found.update(f"{module}.{exports[alias.name]}" for alias in node.names if alias.name in exports)
    closed = set()
    for module in found:
        parts = module.split(".")
        closed.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # parents run their __init__
    return frozenset(m for m in closed if _module_file(m, root) is not None and not m.startswith(NOT_STAGE_CODE))


@lru_cache(maxsize=256)
def _lazy_exports(package: str, root: str) -> dict[str, str]:
    """{name: submodule} of a project package that imports its names on first use (a literal
    ``_EXPORTS`` dict in its ``__init__``, as ``crf`` has); empty for any other module."""
    path = _module_file(package, Path(root))
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_bytes(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return {str(k): str(v) for k, v in ast.literal_eval(node.value).items()}
    return {}


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = child.test if isinstance(child, ast.If) else None
            if (
                isinstance(test, ast.Name)
                and test.id == "TYPE_CHECKING"
                or isinstance(test, ast.Attribute)
                and test.attr == "TYPE_CHECKING"
            ):
                pending.extend(child.orelse)
                continue
            pending.append(child)


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


class CacheEntryError(Exception):
    """A cache entry that does not match its manifest (the message says what is wrong)."""


def _file_record(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


def _entry_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` except the manifest, sorted (paths relative to ``folder``)."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file() or p.is_symlink()) if folder.is_dir() else []


def check_entry(folder: Path, stage: str | None = None, key: str | None = None) -> None:
    """Raise :class:`CacheEntryError` unless ``folder`` holds exactly the files of its manifest with
    the recorded sizes and SHA-256 (and, when given, the manifest names this ``stage`` and ``key``).
    Sizes are compared first (one ``stat`` per file); every file is then hashed. A file that cannot
    be read (a dangling link, no permission, a folder where a file was) makes the entry bad too."""
    try:
        _check_entry(folder, stage, key)
    except OSError as error:
        name = Path(error.filename) if error.filename else None
        if name is not None and name.is_relative_to(folder):
            name = name.relative_to(folder)
        raise CacheEntryError(f"{name or 'a file'} cannot be read ({error.strerror or error})") from None


def _check_entry(folder: Path, stage: str | None, key: str | None) -> None:
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise CacheEntryError(f"no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        recorded = manifest["files"]
        if not isinstance(recorded, dict):
            raise TypeError("'files' is not a mapping")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise CacheEntryError(f"unreadable {MANIFEST} ({error})") from None
    for field, wanted in (("stage", stage), ("key", key)):
        if wanted is not None and manifest.get(field) != wanted:
            raise CacheEntryError(f"{MANIFEST} is for {field} {manifest.get(field)!r}, not {wanted!r}")
    present = {str(p) for p in _entry_files(folder)} - {MANIFEST}
    missing, extra = sorted(recorded.keys() - present), sorted(present - recorded.keys())
    if missing:
        raise CacheEntryError(f"missing file(s): {', '.join(missing)}")
    if extra:
        raise CacheEntryError(f"file(s) not in the manifest: {', '.join(extra)}")
    records = {name: ({"sha256": r} if isinstance(r, str) else r) for name, r in recorded.items()}  # older manifests: hash only
    for name, record in sorted(records.items()):
        size = (folder / name).stat().st_size
        if "size" in record and size != record["size"]:
            raise CacheEntryError(f"{name}: {size} bytes, the manifest says {record['size']}")
    for name, record in sorted(records.items()):
        if file_sha256(folder / name) != record.get("sha256"):
            raise CacheEntryError(f"{name}: content differs from its SHA-256 in the manifest")


def _owner_tag() -> str:
    """``<pid>@<host>``: who owns a temporary folder (hosts have no ``@``)."""
    return f"{os.getpid()}@{socket.gethostname()}"


_TEMPORARY = re.compile(r"^\.(?:tmp|old)-[0-9a-f]{1,16}-(?:(?P<pid>\d+)@(?P<host>.+)-)?[0-9a-f]{8}$")


def process_alive(pid: int) -> bool:
    """Whether a process with this PID runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _stale(path: Path, now: float) -> bool:
    """Whether ``path`` (a ``.tmp-*``/``.old-*`` name) belongs to a dead process: one of this host
    whose PID no longer runs; a name without an owner (older versions) counts as dead after
    :data:`UNOWNED_GRACE` seconds. Folders of other hosts are left alone."""
    match = _TEMPORARY.match(path.name)
    if match is None:
        return False
    if match["pid"] is None:
        try:
            return now - path.lstat().st_mtime > UNOWNED_GRACE
        except FileNotFoundError:
            return False
    return match["host"] == socket.gethostname() and not process_alive(int(match["pid"]))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class RemoteStore(Protocol):
    """Where entries are shared between machines (implemented by ``pipeline.tracking.remote_cache``)."""

    def fetch(self, stage: str, key: str, into: Path) -> Path | None:
        """Download the entry of ``stage``/``key`` under the empty folder ``into``; its folder, or None."""

    def accepted(self, stage: str, key: str) -> None:
        """The entry last fetched for ``stage``/``key`` passed verification and is in use."""

    def publish(self, stage: str, key: str, folder: Path) -> None:
        """Upload the verified local entry ``folder`` of ``stage``/``key``."""


class StageCache:
    """Stage outputs under ``root/<stage>/<key>/``.

    Parameters
    ----------
    root : str or os.PathLike
        The cache folder (created on first build).
    clean : bool, default True
        Remove the temporary folders of dead processes on opening (see :meth:`remove_stale`).
    remote : RemoteStore or None, default None
        Where a local miss is looked up and built entries are published (see the module
        docstring); None: this machine's folder only.
    """

    def __init__(self, root: str | os.PathLike, clean: bool = True, remote: RemoteStore | None = None) -> None:
        self.root = Path(root).absolute()
        self.remote = remote
        if clean:
            self.remove_stale()

    def key(self, stage: str, config: Mapping, inputs: Mapping[str, str], code: str) -> str:
        """The entry key of ``stage`` for its config slice, input hashes and code digest."""
        return digest({"stage": stage, "config": config, "inputs": dict(inputs), "code": code})

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def remove_stale(self) -> list[Path]:
        """Remove ``<stage>/.tmp-*`` and ``.old-*`` folders (or files) left by dead processes of this
        host (and unowned ones older than :data:`UNOWNED_GRACE`); returns what was removed."""
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        now = time.time()
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for path in sorted(folder.iterdir()):
                if _stale(path, now):
                    log.info("cache: removing %s, left by a process that no longer runs", path)
                    _remove(path)
                    removed.append(path)
        return removed

    def lookup(self, stage: str, key: str, remote: bool = True) -> Path | None:
        """The finished entry for ``key`` after checking it against its manifest, or None. A bad entry
        is logged, set aside (:meth:`set_aside`) and reported as a miss. ``remote``: on a local miss,
        ask the remote store (if any)."""
        fetch = self._fetch if remote else lambda stage, key: None
        path = self.path(stage, key)
        if not os.path.lexists(path):
            return fetch(stage, key)
        started = time.perf_counter()
        try:
            check_entry(path, stage, key)
        except CacheEntryError as error:
            if not os.path.lexists(path):  # removed by a concurrent ``force`` run while being read: a miss
                return fetch(stage, key)
            try:  # or replaced by one: the new entry is checked afresh
                check_entry(path, stage, key)
            except CacheEntryError:
                self.set_aside(stage, key, str(error))
                return fetch(stage, key)
        log.debug("cache: %s/%s verified in %.3f s", stage, key[:12], time.perf_counter() - started)
        return path

    def _fetch(self, stage: str, key: str) -> Path | None:
        """The entry from the remote, verified and published here; None when the remote has no good one."""
        if self.remote is None:
            return None
        final = self.path(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.parent / f".tmp-{key[:16]}-{_owner_tag()}-{uuid.uuid4().hex[:8]}"
        temporary.mkdir()
        try:
            fetched = self.remote.fetch(stage, key, temporary)
            if fetched is None:
                return None
            try:
                check_entry(fetched, stage, key)
            except (CacheEntryError, FileNotFoundError) as error:
                log.warning(
                    "cache: the remote entry %s/%s is bad (%s): not used, the stage is recomputed", stage, key[:12], error
                )
                return None
            try:
                os.rename(fetched, final)
            except OSError:
                if not os.path.lexists(final):
                    raise
                try:  # published meanwhile by a concurrent twin: theirs, if good
                    check_entry(final, stage, key)
                    return final
                except (CacheEntryError, FileNotFoundError):
                    return None
            log.info("cache: %s/%s fetched from the remote", stage, key[:12])
            self.remote.accepted(stage, key)
            return final
        finally:
            shutil.rmtree(temporary, ignore_errors=True)

    def set_aside(self, stage: str, key: str, problem: str) -> Path | None:
        """Move a bad entry to ``<stage>/.bad-<key>-<UTC time>`` (kept for inspection) with a warning
        naming it and ``problem``; returns the new place (None if it had gone already)."""
        path = self.path(stage, key)
        aside = path.parent / f".bad-{key}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            aside = None
        log.warning(
            "cache: bad entry %s (%s): %s; it will be recomputed",
            path,
            problem,
            f"moved aside to {aside}" if aside else "already gone",
        )
        return aside

    def build(self, stage: str, key: str, producer: Callable[[Path], None], replace: bool = False) -> Path:
        """Run ``producer(folder)`` in a temporary folder and publish it atomically; with
        ``replace`` an existing entry for the key is swapped out (``force=true``). A bad entry in
        the way is set aside; a good one published meanwhile by a concurrent twin is kept (ours is
        dropped)."""
        final = self.path(stage, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.parent / f".tmp-{key[:16]}-{_owner_tag()}-{uuid.uuid4().hex[:8]}"
        temporary.mkdir()
        try:
            producer(temporary)
            files = {str(p): _file_record(temporary / p) for p in _entry_files(temporary)}
            if MANIFEST in files:
                raise ValueError(f"stage {stage!r} wrote a file named {MANIFEST}, which the cache reserves")
            (temporary / MANIFEST).write_text(json.dumps({"stage": stage, "key": key, "files": files}, indent=1))
            if replace and os.path.lexists(final):
                retired = final.parent / f".old-{key[:16]}-{_owner_tag()}-{uuid.uuid4().hex[:8]}"
                os.rename(final, retired)
                _remove(retired)
            for attempt in range(2):
                try:
                    os.rename(temporary, final)
                    break
                except OSError:
                    # a concurrent twin published a good entry here (never fetch mid-build: ours is made)
                    if self.lookup(stage, key, remote=False) is not None:
                        shutil.rmtree(temporary, ignore_errors=True)
                        break
                    if attempt or os.path.lexists(final):  # lookup could not set the entry in the way aside
                        raise
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        if self.remote is not None:
            self.remote.publish(stage, key, final)
        return final

    @staticmethod
    def output_hash(path: Path, volatile: Iterable[str] = ()) -> str:
        """What downstream stages key on: a digest of the entry's manifest (stage, key, every file's
        size and SHA-256) leaving out the files matching the glob patterns ``volatile`` (measured
        times, logs: files that differ between identical runs and that no downstream stage reads)."""
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = {name: record for name, record in manifest["files"].items() if not any(fnmatch(name, p) for p in volatile)}
        return digest({"stage": manifest.get("stage"), "key": manifest.get("key"), "files": files})

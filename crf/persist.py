"""Save and load named arrays plus JSON metadata in one file, without pickle.

The file is a NumPy ``.npz`` archive. Metadata is stored as UTF-8 JSON bytes, each array's
SHA-256 is recorded in it, and the header itself (kind, format version, metadata such as class
names and parameters, and the array checksums) is covered by its own SHA-256, all checked on
load. Loading uses ``allow_pickle=False``, so a file can never run code, and a truncated or
edited file, or one of a format version this code does not read, is rejected with a clear error. Writes go
to a temporary file in the same folder that is renamed into place, so a crash never leaves a
half-written model; the file gets the permissions an ordinary write would give (see
:func:`atomic_write`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

_META = "__meta__"
FORMAT_VERSION = 2
# version 1 had no header checksum: its class names and parameters could be edited unnoticed, so
# it is refused (re-save such a model with the code that wrote it, or retrain)
READABLE_VERSIONS = (2,)


class ModelFileError(ValueError):
    """A model file that is missing, truncated, tampered with or of the wrong kind."""


def _digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    h = hashlib.sha256()
    h.update(str(array.dtype).encode())
    h.update(str(array.shape).encode())
    h.update(array.tobytes())
    return h.hexdigest()


def _header_digest(header: Mapping) -> str:
    """SHA-256 of the header's canonical JSON, without the digest field itself."""
    body = {k: v for k, v in header.items() if k != "header_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def strings_to_arrays(strings) -> tuple[np.ndarray, np.ndarray]:
    """Encode strings as (UTF-8 bytes (B,) uint8, offsets (n + 1,) int64)."""
    encoded = [s.encode("utf-8") for s in strings]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded], dtype=np.int64)]).astype(np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets


def arrays_to_strings(blob: np.ndarray, offsets: np.ndarray) -> list[str]:
    data = blob.tobytes()
    return [data[a:b].decode("utf-8") for a, b in zip(offsets[:-1], offsets[1:])]


def save_arrays(path: str | os.PathLike, kind: str, meta: Mapping, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` and ``meta`` (JSON-ready) to ``path`` atomically."""
    path = Path(path)
    arrays = {name: np.asarray(a) for name, a in arrays.items()}
    for name, a in arrays.items():
        if a.dtype == object:
            raise TypeError(f"array {name!r} holds Python objects; encode it first")
    header = {
        "kind": kind,
        "format_version": FORMAT_VERSION,
        "meta": dict(meta),
        "sha256": {n: _digest(a) for n, a in arrays.items()},
    }
    header["header_sha256"] = _header_digest(header)
    payload = dict(arrays)
    payload[_META] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    atomic_write(path, lambda out: np.savez(out, **payload))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(handle)`` on a temporary file beside ``path``, flush it to disk and rename it
    into place: readers see the old file or the complete new one, never a partial write.

    The file gets the permissions an ordinary ``open(path, "w")`` would give it: a new file
    ``0o666`` less the umask (applied by the system when the temporary file is created, so default
    ACLs apply too); a file that replaces an existing one keeps that file's permission bits
    (``0o777`` of them: set-user/group-ID and sticky bits are not carried over). Unlike an
    ordinary write, the replaced file's owner, group and hard links are not kept: the new file
    belongs to the writer."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = _create_temporary(path)
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                os.fchmod(out.fileno(), os.stat(path).st_mode & 0o777)
            except FileNotFoundError:
                pass  # a new file: the mode it was created with
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _create_temporary(path: Path) -> tuple[int, str]:
    """(descriptor, name) of a new hidden file beside ``path``, created exclusively with mode
    ``0o666`` less the umask (``tempfile.mkstemp`` would create it ``0o600``)."""
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary file name for {path.name}")


def load_arrays(path: str | os.PathLike, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a file written by :func:`save_arrays`; check kind and checksums. Returns (meta, arrays)."""
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a model file")
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    with open(path, "rb") as probe:
        if probe.read(4) != b"PK\x03\x04":  # a zip archive's first local header
            raise ModelFileError(f"{path}: not a model file of this project (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if _META not in archive.files:
                raise ModelFileError(f"{path}: not a model file of this project (no metadata)")
            header = json.loads(archive[_META].tobytes().decode("utf-8"))
            arrays = {name: archive[name] for name in archive.files if name != _META}
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{path}: unreadable or truncated model file ({type(err).__name__}: {err})") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: the metadata is not a JSON object")
    version = header.get("format_version")
    if version not in READABLE_VERSIONS:
        raise ModelFileError(
            f"{path}: format version {version!r} is not one this code reads (it reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; it writes {FORMAT_VERSION})"
        )
    if header.get("header_sha256") != _header_digest(header):
        raise ModelFileError(f"{path}: the header (kind, metadata or checksums) fails its checksum (file edited or corrupted)")
    if header.get("kind") != kind:
        raise ModelFileError(f"{path}: holds a {header.get('kind')!r}, expected a {kind!r}")
    expected = header.get("sha256", {})
    if set(expected) != set(arrays):
        raise ModelFileError(f"{path}: arrays {sorted(set(arrays) ^ set(expected))} are missing or unexpected")
    for name, array in arrays.items():
        if _digest(array) != expected[name]:
            raise ModelFileError(f"{path}: array {name!r} fails its checksum (file edited or corrupted)")
    return header["meta"], arrays

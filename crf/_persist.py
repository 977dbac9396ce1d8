"""Save and load named arrays plus JSON metadata in one file, without pickle.

The file is a NumPy ``.npz`` archive. Metadata is stored as UTF-8 JSON bytes, each array's
SHA-256 is recorded in it, and the header itself (kind, format version, metadata such as class
names and parameters, and the array checksums) is covered by its own SHA-256, all checked on
load. Loading uses ``allow_pickle=False``, so a file can never run code, and a truncated or
edited file, or one of a format version this code does not read, is rejected with a clear error. Writes go
to a temporary file in the same folder that is renamed into place, so a crash never leaves a
half-written model; the file gets the permissions an ordinary write would give (see
:func:`atomic_write`).

Files from elsewhere are read defensively: before anything is read, every archive member's
declared size must fit the file (a stored member is as large as its data; a deflated one may
inflate at most :data:`MAX_INFLATION` times), and its ``.npy`` header's shape and dtype must
account for exactly the member's bytes; the JSON header is at most :data:`MAX_HEADER_BYTES`.
So a small file can never make the loader inflate or allocate much more than its own size.
Loaders that build dense tables from counts a file declares check them with
:func:`check_table_size` first. Every refusal is a :class:`ModelFileError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .io import atomic_write

_META = "__meta__"
FORMAT_VERSION = 2
# version 1 had no header checksum: its class names and parameters could be edited unnoticed, so
# it is refused (re-save such a model with the code that wrote it, or retrain)
READABLE_VERSIONS = (2,)
MAX_HEADER_BYTES = 16 << 20  # the JSON header (kind, metadata, checksums): kilobytes in practice
MAX_INFLATION = 100  # a deflated member may hold at most this many times its compressed size
# dense tables a loader builds from counts a file declares (an (A, L) weight table from A
# attribute and L label names): at most this many bytes per byte read from the file, plus a
# fixed allowance. Generous for real models (sparse files of models with hundreds of labels),
# while a kilobyte file cannot ask for gigabytes.
TABLE_BYTES_PER_FILE_BYTE = 256
TABLE_ALLOWANCE = 256 << 20
MAX_THREADS = 1024  # a loaded model's n_threads above this is refused
_ARRAY_KINDS = "biufcSU"  # booleans, numbers and fixed-width strings: never objects or records


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
    """The strings of :func:`strings_to_arrays`; ValueError unless ``offsets`` run from 0 to the
    blob's end without going back (so the strings never add up to more than the blob)."""
    blob, offsets = np.asarray(blob), np.asarray(offsets)
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise ValueError(f"string bytes of dtype {blob.dtype} and shape {blob.shape}, expected 1-d uint8")
    if offsets.dtype.kind not in "iu" or offsets.ndim != 1 or offsets.size == 0:
        raise ValueError(f"string offsets of dtype {offsets.dtype} and shape {offsets.shape}, expected 1-d integers")
    if offsets[0] != 0 or offsets[-1] != blob.size or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise ValueError(f"string offsets do not run from 0 to {blob.size} in order")
    data = blob.tobytes()
    return [data[a:b].decode("utf-8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


# the largest weight magnitude a model file may hold: exp(1e6) is far beyond any score a trained
# CRF produces, and sums of larger weights lose every digit of the differences decoding needs (or
# overflow to infinity), so a file holding one is refused like a damaged one
MAX_ABS_WEIGHT = 1e6


def checked_array(
    path: str | os.PathLike,
    arrays: Mapping[str, np.ndarray],
    name: str,
    kinds: str,
    shape: tuple[int | None, ...] | None = None,
    finite: bool = False,
    minus_inf: bool = False,
    bounded: bool = False,
) -> np.ndarray:
    """``arrays[name]``, refused (ModelFileError naming ``path`` and the array) unless its dtype
    kind is one of ``kinds`` (``"f"`` floats, ``"iu"`` integers, ...), its shape matches
    ``shape`` (None entries match any size) and, with ``finite``, it holds no NaN or infinity
    (``minus_inf``: -inf allowed, as in log probabilities) and, with ``bounded``, no value beyond
    :data:`MAX_ABS_WEIGHT` in magnitude."""
    if name not in arrays:
        raise ModelFileError(f"{path}: array {name!r} is missing")
    array = arrays[name]
    if array.dtype.kind not in kinds:
        raise ModelFileError(f"{path}: array {name!r} has dtype {array.dtype}, expected kind {kinds!r}")
    if shape is not None and (
        array.ndim != len(shape) or any(want is not None and have != want for have, want in zip(array.shape, shape))
    ):
        expected = tuple("any" if n is None else n for n in shape)
        raise ModelFileError(f"{path}: array {name!r} has shape {array.shape}, expected {expected}")
    if finite:
        bad = np.isnan(array) | (array == np.inf) if minus_inf else ~np.isfinite(array)
        if np.any(bad):
            value = array.ravel()[int(np.argmax(bad.ravel()))]
            rule = "log probabilities must be finite or -inf" if minus_inf else "weights must be finite numbers"
            raise ModelFileError(f"{path}: array {name!r} holds the non-finite value {value} ({rule})")
    if bounded and array.size and float(np.max(np.abs(array))) > MAX_ABS_WEIGHT:
        raise ModelFileError(f"{path}: array {name!r} holds {weight_beyond_bound(array)}")
    return array


def weight_beyond_bound(weights: np.ndarray) -> str:
    """What to say of ``weights`` whose largest magnitude exceeds :data:`MAX_ABS_WEIGHT`."""
    value = weights.ravel()[int(np.argmax(np.abs(weights).ravel()))]
    return (
        f"the weight {value:g}, beyond +-{MAX_ABS_WEIGHT:g} (training refuses such weights; scores that large lose all precision)"
    )


def check_unique(path: str | os.PathLike, what: str, values, error: type[ModelFileError] | None = None) -> None:
    """Refuse (``error``, by default ModelFileError, naming ``path``) a list of names ``what``
    with a repeated entry."""
    seen: set = set()
    for value in values:
        if value in seen:
            raise (error or ModelFileError)(f"{path}: {what} {value!r} appears twice")
        seen.add(value)


def check_classes(path: str | os.PathLike, classes) -> list:
    """The class labels of a model file's metadata: a non-empty list of distinct strings or
    integers (as trained), else ModelFileError naming ``path``."""
    if not isinstance(classes, list) or not classes:
        raise ModelFileError(f"{path}: the class labels are not a non-empty list")
    if not all(isinstance(c, (str, int)) for c in classes):
        raise ModelFileError(f"{path}: class labels must be strings or integers")
    check_unique(path, "class label", [str(c) for c in classes])  # 1 and "1" would print alike
    return classes


def check_thread_count(path: str | os.PathLike, value) -> None:
    """A loaded model's ``n_threads``: None or 0 (all cores), or 1 .. :data:`MAX_THREADS` (the
    thread pool and the split of the work are sized by it before any work is done)."""
    if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_THREADS):
        raise ModelFileError(f"{path}: n_threads {value!r} is not None or a number of threads from 0 to {MAX_THREADS}")


def save_arrays(path: str | os.PathLike, kind: str, meta: Mapping, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` and ``meta`` (JSON-ready) to ``path`` atomically.

    The file is an ``.npz`` archive: the arrays, and a JSON header holding ``kind``, the format
    version, ``meta`` and a SHA-256 checksum of every array and of the header itself. No pickle.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write (replaced only once the new one is complete; see :func:`crf.io.atomic_write`).
    kind : str
        What the file holds (e.g. ``"crf.CRF"``); :func:`load_arrays` refuses another kind.
    meta : mapping
        JSON-serialisable settings.
    arrays : mapping of str to array_like
        Named arrays of booleans, numbers or strings.

    Raises
    ------
    TypeError
        An array of Python objects, or ``meta`` that JSON cannot encode; nothing is written.
    """
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


def check_table_size(
    path: str | os.PathLike,
    what: str,
    n_elements: int,
    stored_bytes: int,
    itemsize: int = 8,
    error: type[ModelFileError] | None = None,
) -> None:
    """Refuse (``error``, by default ModelFileError, naming ``path``) to build ``what``,
    ``n_elements`` items of ``itemsize`` bytes, from a file that gave ``stored_bytes``: more than
    :data:`TABLE_BYTES_PER_FILE_BYTE` bytes per byte read, plus :data:`TABLE_ALLOWANCE`."""
    needed = int(n_elements) * int(itemsize)
    limit = TABLE_ALLOWANCE + TABLE_BYTES_PER_FILE_BYTE * int(stored_bytes)
    if needed > limit:
        raise (error or ModelFileError)(
            f"{path}: {what} would take {needed:,} bytes of memory, more than {stored_bytes:,} bytes of model data "
            f"can describe (at most {limit:,}): the declared sizes do not fit the file"
        )


def _members(path: Path, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """{array name: member} of an ``.npz`` archive, each member's sizes checked against the file
    (nothing is read or inflated)."""
    file_size = path.stat().st_size
    members: dict[str, zipfile.ZipInfo] = {}
    stored = 0
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            raise ModelFileError(f"{path}: member {info.filename!r} is not a .npy array")
        name = info.filename[: -len(".npy")]
        if name in members:
            raise ModelFileError(f"{path}: array {name!r} appears twice")
        if info.flag_bits & 0x1:
            raise ModelFileError(f"{path}: array {name!r} is encrypted")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise ModelFileError(
                    f"{path}: array {name!r} is stored uncompressed but declares {info.file_size:,} bytes "
                    f"in {info.compress_size:,}"
                )
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            if info.file_size > MAX_INFLATION * max(info.compress_size, 1):
                raise ModelFileError(
                    f"{path}: array {name!r} declares {info.file_size:,} bytes compressed into {info.compress_size:,} "
                    f"(more than {MAX_INFLATION} times): refused without inflating it"
                )
        else:
            raise ModelFileError(f"{path}: array {name!r} uses compression method {info.compress_type} (only stored or deflated)")
        stored += info.compress_size
        if info.header_offset + info.compress_size > file_size or stored > file_size:
            raise ModelFileError(f"{path}: array {name!r} declares more bytes than the file's {file_size:,} (truncated?)")
        members[name] = info
    return members


def _read_member(path: Path, archive: zipfile.ZipFile, name: str, info: zipfile.ZipInfo) -> np.ndarray:
    """The array of one member, after checking that its ``.npy`` header's shape and dtype account
    for exactly the member's declared size (so nothing larger is ever allocated)."""
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            raise ModelFileError(f"{path}: array {name!r} has .npy format version {version}, not 1.0 or 2.0")
        data_offset = member.tell()
    if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ModelFileError(f"{path}: array {name!r} has dtype {dtype}, not booleans, numbers or strings")
    if any(n < 0 for n in shape):
        raise ModelFileError(f"{path}: array {name!r} declares the negative shape {shape}")
    count = math.prod(shape)
    if dtype.itemsize == 0 and count:
        raise ModelFileError(f"{path}: array {name!r} declares {count:,} items of zero size")
    if data_offset + count * dtype.itemsize != info.file_size:
        raise ModelFileError(
            f"{path}: array {name!r} declares shape {shape} of {dtype} ({count * dtype.itemsize:,} bytes), "
            f"but its member holds {info.file_size - data_offset:,} bytes of data"
        )
    with archive.open(info) as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def _read_header(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> dict:
    """The JSON header of the ``__meta__`` member (at most :data:`MAX_HEADER_BYTES`)."""
    if info.file_size > MAX_HEADER_BYTES:
        raise ModelFileError(f"{path}: the metadata declares {info.file_size:,} bytes (at most {MAX_HEADER_BYTES:,})")
    raw = _read_member(path, archive, _META, info)
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ModelFileError(f"{path}: the metadata is not a byte string")
    header = json.loads(raw.tobytes().decode("utf-8"))
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: the metadata is not a JSON object")
    return header


def load_arrays(path: str | os.PathLike, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a file written by :func:`save_arrays`; check sizes (before reading anything), kind and
    checksums.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save_arrays`.
    kind : str
        The kind the file must hold.

    Returns
    -------
    meta : dict
        The settings saved with the arrays.
    arrays : dict of str to ndarray
        The arrays, every one matching its checksum.

    Raises
    ------
    ModelFileError
        Naming the file: missing, a folder, not such an archive, of another kind or format
        version, truncated, with an array that is not booleans, numbers or strings, or that
        fails its checksum.
    """
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a model file")
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    with open(path, "rb") as probe:
        if probe.read(4) != b"PK\x03\x04":  # a zip archive's first local header
            raise ModelFileError(f"{path}: not a model file of this project (not an .npz archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.infolist() and min(info.header_offset for info in archive.infolist()) != 0:
                # bytes before the archive its directory describes (one file glued before another):
                # a reader from the start and one from the end would see two different models
                raise ModelFileError(f"{path}: holds bytes before its archive (not one model file)")
            members = _members(path, archive)
            if _META not in members:
                raise ModelFileError(f"{path}: not a model file of this project (no metadata)")
            header = _read_header(path, archive, members.pop(_META))
            _check_header(path, header, kind)
            expected = header.get("sha256")
            if not isinstance(expected, dict) or set(expected) != set(members):
                names = set(expected) if isinstance(expected, dict) else set()
                raise ModelFileError(f"{path}: arrays {sorted(names ^ set(members))} are missing or unexpected")
            arrays = {name: _read_member(path, archive, name, info) for name, info in members.items()}
    except ModelFileError:
        raise
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        OSError,
        ValueError,
        KeyError,
        UnicodeDecodeError,
        RecursionError,
        NotImplementedError,
    ) as err:  # json.JSONDecodeError is a ValueError
        raise ModelFileError(f"{path}: unreadable or truncated model file ({type(err).__name__}: {err})") from None
    for name, array in arrays.items():
        if _digest(array) != expected[name]:
            raise ModelFileError(f"{path}: array {name!r} fails its checksum (file edited or corrupted)")
    meta = header.get("meta")
    if not isinstance(meta, dict):
        raise ModelFileError(f"{path}: the metadata holds no JSON object of model settings")
    return meta, arrays


def _check_header(path: Path, header: dict, kind: str) -> None:
    """Format version, header checksum and kind of a model file's header."""
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

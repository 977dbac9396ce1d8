"""Read and write CRFsuite's first-order model files (python-crfsuite, sklearn-crfsuite).

Layout (little-endian uint32 unless said otherwise), as CRFsuite's ``crf1d_model.c`` writes it:

- header (48 bytes): ``b"lCRF"``, file size, ``b"FOMC"``, version 100, number of features
  (CRFsuite leaves it 0; the feature chunk holds the count), labels L, attributes A, and the
  offsets of the feature chunk, the label CQDB, the attribute CQDB, the label references and
  the attribute references;
- feature chunk: ``b"FEAT"``, chunk size, K, then K records of 20 bytes: type (0 state, 1
  transition), source (attribute or previous label), destination label, weight (float64);
- two CQDB chunks (below): label strings and attribute strings;
- reference chunks ``b"LFRF"`` / ``b"AFRF"``: chunk size, count, then one offset per label /
  attribute to a list (count, feature ids...) of its transition / state features.

CRFsuite's tagger scores attribute ``a`` with value ``v`` as ``v * weight`` for every feature
in ``a``'s reference list, and sets ``transitions[i, dst]`` for every feature in label ``i``'s
list. It has no start/end (BOS/EOS) weights: a model read from a file gets ``start = end = 0``,
and a model with non-zero start/end weights cannot be written.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from sklearn.exceptions import NotFittedError

from ._layout import positions_within
from ._persist import MAX_ABS_WEIGHT, ModelFileError, check_table_size, check_unique, weight_beyond_bound
from .attributes import AttributeIndex
from .io import atomic_write

# --- CQDB: CQDB, CRFsuite's constant string <-> id database, and the lookup3 hash it uses.
#
# A CQDB chunk (all integers little-endian uint32) is laid out as:
#
# - a 24-byte header: ``b"CQDB"``, chunk size, flags, byte-order check ``0x62445371``, the number
#   of entries of the backward array and its offset;
# - 256 table references (offset, number of buckets), offsets relative to the chunk start, 0 for
#   an empty table;
# - the records: id (int32), key size (with its NUL), key bytes ending in NUL;
# - the hash tables: buckets of (hash, record offset); a key goes to table ``hash % 256``, home
#   bucket ``(hash >> 8) % n_buckets``, linear probing; a table has twice as many buckets as keys
#   and an empty bucket has offset 0;
# - the backward array: the record offset of id 0, 1, ...
#
# The hash is Bob Jenkins' lookup3 ``hashlittle`` of the key with its NUL byte, seed 0, here
# vectorised over many keys at once with NumPy uint32 arithmetic.

CQDB_MAGIC = b"CQDB"
BYTEORDER = 0x62445371
N_TABLES = 256
CQDB_HEADER_SIZE = 24
DATA_OFFSET = CQDB_HEADER_SIZE + 8 * N_TABLES
# longest key read or written: lookup3 mixes a key's 12-byte blocks one after the other, a
# NumPy round each, so a key's length bounds the time its hash takes
MAX_KEY_BYTES = 64 << 10


class CQDBError(ValueError):
    """A CQDB chunk that is truncated or inconsistent (the caller adds the file name)."""


def _rot(x: np.ndarray, k: int) -> np.ndarray:
    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def _mix(a, b, c):
    a -= c
    a ^= _rot(c, 4)
    c += b
    b -= a
    b ^= _rot(a, 6)
    a += c
    c -= b
    c ^= _rot(b, 8)
    b += a
    a -= c
    a ^= _rot(c, 16)
    c += b
    b -= a
    b ^= _rot(a, 19)
    a += c
    c -= b
    c ^= _rot(b, 4)
    b += a
    return a, b, c


def _final(a, b, c):
    c ^= b
    c -= _rot(b, 14)
    a ^= c
    a -= _rot(c, 11)
    b ^= a
    b -= _rot(a, 25)
    c ^= b
    c -= _rot(b, 16)
    a ^= c
    a -= _rot(c, 4)
    b ^= a
    b -= _rot(a, 14)
    c ^= b
    c -= _rot(b, 24)
    return a, b, c


def hashlittle(keys: list[bytes]) -> np.ndarray:
    """lookup3 ``hashlittle(key, len(key), 0)`` of every key (N,) uint32; keys must be non-empty.

    Each key is zero-padded to whole 12-byte blocks (all keys' blocks in one array, so memory is
    linear in their total length); a key of n bytes is mixed over its first ``(n - 1) // 12``
    blocks and its last block is added before the final mix, which is what the byte-wise path of
    lookup3 computes. Keys are processed longest first, so those still mixing are a prefix.

    Parameters
    ----------
    keys : list of bytes
        N non-empty keys.

    Returns
    -------
    ndarray of shape (N,), uint32
        The hash of every key.
    """
    n = len(keys)
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=n)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    if lengths.min() < 1:
        raise ValueError("lookup3 keys here are never empty (they end with NUL)")
    blocks = (lengths + 11) // 12
    first = np.cumsum(blocks) - blocks  # (N,) index of each key's first block
    padded = b"".join(key.ljust(12 * n_blocks, b"\0") for key, n_blocks in zip(keys, blocks.tolist()))
    words = np.frombuffer(padded, dtype="<u4").reshape(-1, 3).astype(np.uint32)  # (total blocks, 3)
    order = np.argsort(-blocks, kind="stable")
    first, rounds = first[order], blocks[order] - 1
    live = n - np.cumsum(np.bincount(rounds))  # live[r]: keys with more than r rounds, a prefix
    with np.errstate(over="ignore"):
        a = np.uint32(0xDEADBEEF) + lengths[order].astype(np.uint32)
        b, c = a.copy(), a.copy()
        for r in range(int(rounds[0])):
            k, block = live[r], first[: live[r]] + r
            a[:k], b[:k], c[:k] = _mix(a[:k] + words[block, 0], b[:k] + words[block, 1], c[:k] + words[block, 2])
        last = first + rounds
        a += words[last, 0]
        b += words[last, 1]
        c += words[last, 2]
        _, _, c = _final(a, b, c)
    out = np.empty(n, dtype=np.uint32)
    out[order] = c
    return out


def first_overlap(starts: np.ndarray, ends: np.ndarray) -> int:
    """Index of a byte range ``[starts[i], ends[i])`` that overlaps another one, -1 if they are
    disjoint (ranges that only touch do not overlap).

    Parameters
    ----------
    starts, ends : array_like of shape (K,), int
        The ranges' first byte and the byte after their last.

    Returns
    -------
    int
        The index of a range that overlaps one starting before it, or -1.
    """
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    clash = np.flatnonzero(ends[order][:-1] > starts[order][1:])
    return -1 if clash.size == 0 else int(order[clash[0] + 1])


def _u32_at(buffer: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Little-endian uint32 at each byte position (positions already bounds-checked)."""
    gathered = buffer[positions[:, None] + np.arange(4)]
    return np.ascontiguousarray(gathered).view("<u4").ravel().astype(np.int64)


def read_cqdb(data: bytes, start: int, count: int) -> list[str]:
    """The strings of ids 0 .. count - 1 of the CQDB chunk at ``data[start:]``, via its
    backward array (what CRFsuite's id -> string look-up reads). Every offset is checked against
    the chunk, and the records, hash tables and backward array must not overlap (so the keys
    never add up to more than the chunk).

    Parameters
    ----------
    data : bytes
        The whole file.
    start : int
        The chunk's byte offset.
    count : int
        The number of ids.

    Returns
    -------
    list of str
        The string of every id (UTF-8, the final NUL removed).

    Raises
    ------
    CQDBError
        A truncated or inconsistent chunk (a ValueError; the caller adds the file name).
    """
    if start < 0 or start + DATA_OFFSET > len(data):
        raise CQDBError(f"CQDB chunk at offset {start} runs past the end of the file")
    if data[start : start + 4] != CQDB_MAGIC:
        raise CQDBError(f"no CQDB chunk at offset {start} (found {data[start : start + 4]!r})")
    size, _, byteorder, bwd_size, bwd_offset = np.frombuffer(data, "<u4", 5, start + 4).astype(np.int64)
    if byteorder != BYTEORDER:
        raise CQDBError(f"CQDB chunk at offset {start}: bad byte-order mark {byteorder:#x}")
    if size < DATA_OFFSET or start + size > len(data):
        raise CQDBError(f"CQDB chunk at offset {start}: size {size} exceeds the file ({len(data) - start} bytes left)")
    if count == 0:
        return []
    if bwd_size < count or bwd_offset < DATA_OFFSET or bwd_offset + 4 * count > size:
        raise CQDBError(f"CQDB chunk at offset {start}: backward array ({bwd_size} at {bwd_offset}) cannot hold {count} ids")
    chunk = np.frombuffer(data, np.uint8, int(size), start)
    refs = np.frombuffer(data, "<u4", 2 * N_TABLES, start + CQDB_HEADER_SIZE).reshape(N_TABLES, 2).astype(np.int64)
    used = (refs[:, 0] != 0) & (refs[:, 1] != 0)  # tables of no buckets take no bytes
    table_starts, table_ends = refs[used, 0], refs[used, 0] + 8 * refs[used, 1]
    if np.any(table_starts < DATA_OFFSET) or np.any(table_ends > size):
        raise CQDBError(f"CQDB chunk at offset {start}: a hash table lies outside its chunk")
    records = np.frombuffer(data, "<u4", count, start + int(bwd_offset)).astype(np.int64)
    if records.min() < DATA_OFFSET or records.max() + 9 > size:
        raise CQDBError(f"CQDB chunk at offset {start}: a record offset is out of range")
    ids = _u32_at(chunk, records)
    key_sizes = _u32_at(chunk, records + 4)
    if np.any(ids != np.arange(count)):
        bad = int(np.flatnonzero(ids != np.arange(count))[0])
        raise CQDBError(f"CQDB chunk at offset {start}: the record of id {bad} holds id {ids[bad]}")
    ends = records + 8 + key_sizes
    if key_sizes.min() < 1 or ends.max() > size or np.any(chunk[ends - 1] != 0):
        raise CQDBError(f"CQDB chunk at offset {start}: a key overruns its chunk or lacks its NUL terminator")
    if key_sizes.max() > MAX_KEY_BYTES:
        raise CQDBError(f"CQDB chunk at offset {start}: a key of {key_sizes.max():,} bytes (at most {MAX_KEY_BYTES:,})")
    starts = np.concatenate([records, table_starts, [bwd_offset]])
    if first_overlap(starts, np.concatenate([ends, table_ends, [bwd_offset + 4 * count]])) >= 0:
        raise CQDBError(f"CQDB chunk at offset {start}: its records, hash tables and backward array overlap (damaged or forged)")
    raw = chunk.tobytes()
    try:
        strings = [raw[a:b].decode("utf-8") for a, b in zip((records + 8).tolist(), (ends - 1).tolist())]
    except UnicodeDecodeError as err:
        raise CQDBError(f"CQDB chunk at offset {start}: a key is not UTF-8 ({err})") from None
    if any("\0" in s for s in strings):
        raise CQDBError(f"CQDB chunk at offset {start}: a key holds a NUL byte")
    keys = [raw[a:b] for a, b in zip((records + 8).tolist(), ends.tolist())]
    _check_tables(chunk, start, refs, keys, records)
    return strings


def _check_tables(chunk: np.ndarray, start: int, refs: np.ndarray, keys: list[bytes], records: np.ndarray) -> None:
    """Every key must sit in the hash table CRFsuite's string -> id look-up searches, and the
    tables (``refs`` (256, 2) offsets and sizes, already checked to lie in the chunk) must hold
    nothing else; otherwise CRFsuite would not find attributes we read."""
    offsets, n_buckets = refs[:, 0], refs[:, 1]
    used = offsets != 0
    hashes = hashlittle(keys).astype(np.int64)
    counts = np.bincount(hashes % N_TABLES, minlength=N_TABLES)
    if np.any(np.where(used, n_buckets, 0) != 2 * counts):
        raise CQDBError(f"CQDB chunk at offset {start}: hash table sizes do not match its keys")
    lengths = np.where(used, n_buckets, 0)
    table = np.repeat(np.arange(N_TABLES), lengths)
    positions = np.repeat(offsets, lengths) + 8 * positions_within(lengths)
    bucket_hash, bucket_record = _u32_at(chunk, positions), _u32_at(chunk, positions + 4)
    filled = bucket_record != 0
    found = np.sort((bucket_hash[filled].astype(np.uint64) << np.uint64(32)) | bucket_record[filled].astype(np.uint64))
    expected = np.sort((hashes.astype(np.uint64) << np.uint64(32)) | records.astype(np.uint64))
    if found.size != expected.size or np.any(found != expected) or np.any(bucket_hash[filled] % N_TABLES != table[filled]):
        raise CQDBError(f"CQDB chunk at offset {start}: its hash tables do not list its keys (damaged)")


def unstorable_name(name: object) -> str | None:
    """Why a CRFsuite model file cannot hold the label or attribute ``name`` (None if it can):
    not a string (the file holds text, so the integer label 1 would load as ``'1'``), a lone
    surrogate (UTF-8 cannot write it), a NUL character (its string tables end every name with
    one), or more than ``MAX_KEY_BYTES - 1`` bytes of UTF-8.

    Parameters
    ----------
    name : object
        A label or attribute name.

    Returns
    -------
    str or None
        The reason, or None when the file can hold it.
    """
    if not isinstance(name, str):
        return (
            f"is not a string ({type(name).__name__}): a CRFsuite model file holds names as text, "
            f"so it would load as {str(name)!r}; use string labels, or save with CRF.save (.npz), which keeps the type"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"holds {error.object[error.start : error.end]!a}, which UTF-8 cannot write (a lone surrogate)"
    if "\0" in name:
        return "holds a NUL character, which a CRFsuite model file cannot store"
    if len(name) >= MAX_KEY_BYTES // 4 and len(name.encode("utf-8")) >= MAX_KEY_BYTES:
        return f"is {len(name.encode('utf-8')):,} bytes long: a CRFsuite model file holds names of at most {MAX_KEY_BYTES - 1:,}"
    return None


def build_cqdb(strings: list[str]) -> bytes:
    """A CQDB chunk mapping ``strings[i]`` <-> i, as CRFsuite's reader expects.

    Parameters
    ----------
    strings : list of str
        The strings, in id order.

    Returns
    -------
    bytes
        The chunk.

    Raises
    ------
    ValueError
        A string the file cannot hold (:func:`unstorable_name`).
    """
    for s in strings:
        problem = unstorable_name(s)
        if problem is not None:
            raise ValueError(f"the string {s[:40]!r} {problem}")
    keys = [s.encode("utf-8") + b"\0" for s in strings]
    n = len(keys)
    key_sizes = np.fromiter((len(k) for k in keys), dtype=np.int64, count=n)
    record_sizes = 8 + key_sizes
    offsets = DATA_OFFSET + np.cumsum(record_sizes) - record_sizes  # (N,) record offsets in the chunk
    records = np.zeros(int(record_sizes.sum()), dtype=np.uint8)
    heads = np.stack([np.arange(n), key_sizes], axis=1).astype("<u4").view(np.uint8)  # (N, 8): id, key size
    starts = offsets - DATA_OFFSET
    records[(starts[:, None] + np.arange(8)).ravel()] = heads.ravel()
    records[np.repeat(starts + 8 - np.cumsum(key_sizes) + key_sizes, key_sizes) + np.arange(int(key_sizes.sum()))] = (
        np.frombuffer(b"".join(keys), np.uint8)
    )
    hashes = hashlittle(keys)
    table_of = hashes % N_TABLES
    counts = np.bincount(table_of, minlength=N_TABLES)
    n_buckets = 2 * counts
    first_bucket = np.concatenate([[0], np.cumsum(n_buckets)[:-1]])
    table_offsets = DATA_OFFSET + records.size + 8 * first_bucket
    # linear probing in key order; plain Python ints, the one loop over keys
    slot_record = [0] * int(n_buckets.sum())
    slot_hash = [0] * len(slot_record)
    firsts, sizes = first_bucket.tolist(), n_buckets.tolist()
    for h, t, record in zip(hashes.tolist(), table_of.tolist(), offsets.tolist()):
        base, size = firsts[t], sizes[t]
        k = (h >> 8) % size
        while slot_record[base + k]:
            k = (k + 1) % size
        slot_record[base + k], slot_hash[base + k] = record, h
    buckets = np.array([slot_hash, slot_record], dtype="<u4").T.copy()
    refs = np.zeros((N_TABLES, 2), dtype="<u4")
    refs[:, 0] = np.where(counts > 0, table_offsets, 0)
    refs[:, 1] = n_buckets
    backward_offset = DATA_OFFSET + records.size + buckets.nbytes
    size = backward_offset + 4 * n
    header = np.array([size, 0, BYTEORDER, n, backward_offset if n else 0], dtype="<u4")
    return b"".join(
        [CQDB_MAGIC, header.tobytes(), refs.tobytes(), records.tobytes(), buckets.tobytes(), offsets.astype("<u4").tobytes()]
    )


# --- the model file ---

MAGIC, MODEL_TYPE, VERSION = b"lCRF", b"FOMC", 100
HEADER_SIZE, CHUNK_SIZE, FEATURE_SIZE = 48, 12, 20
STATE, TRANSITION = 0, 1
_HEADER = struct.Struct("<4sI4s9I")  # magic, size, type, version, features, labels, attributes, 5 offsets
_FEATURE = np.dtype([("type", "<u4"), ("src", "<u4"), ("dst", "<u4"), ("weight", "<f8")])


class CRFsuiteFormatError(ModelFileError):
    """A CRFsuite model file that is truncated, damaged or not a CRFsuite first-order model."""


class StateFeatures(NamedTuple):
    """State features as parallel (K,) arrays: attribute index, label index, weight.

    Parameters
    ----------
    attribute : ndarray of shape (K,), int
        Attribute indices.
    label : ndarray of shape (K,), int
        Label indices.
    weight : ndarray of shape (K,), float64
        Weights.
    """

    attribute: np.ndarray
    label: np.ndarray
    weight: np.ndarray


@dataclass
class CRFsuiteModel:
    """The content of a CRFsuite first-order model.

    Parameters
    ----------
    labels : list of str
        The L label names, in the model's label order.
    attributes : list of str
        The A attribute names, in the model's attribute order.
    state_features : StateFeatures
        K state features as parallel (K,) arrays: attribute index (0 to A - 1), label index
        (0 to L - 1) and weight (float64).
    transitions : ndarray of shape (L, L), float64
        Transition weights indexed [previous, current] (0 where the file has no such feature).
    """

    labels: list[str]
    attributes: list[str]
    state_features: StateFeatures
    transitions: np.ndarray


def _u32(data: bytes, offset: int, count: int = 1) -> np.ndarray:
    return np.frombuffer(data, "<u4", count, offset).astype(np.int64)


def _chunk(data: bytes, path, offset: int, chunk_id: bytes, what: str) -> tuple[int, int]:
    """The byte range [start, end) of the chunk ``chunk_id`` (the ``what``) at ``offset``: its
    magic must be there and its declared size (the uint32 after the magic) must fit the file."""
    if offset < HEADER_SIZE or offset + CHUNK_SIZE > len(data) or data[offset : offset + 4] != chunk_id:
        raise CRFsuiteFormatError(f"{path}: no {chunk_id.decode()} chunk ({what}) at offset {offset}")
    size = int(_u32(data, offset + 4)[0])
    if size < CHUNK_SIZE or offset + size > len(data):
        raise CRFsuiteFormatError(
            f"{path}: the {what} chunk at offset {offset} declares {size} bytes, past the end of the file ({len(data)} bytes)"
        )
    return offset, offset + size


def _references(data: bytes, path, extent: tuple[int, int], count: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Feature-id lists of the ``count`` owners of the reference chunk at ``extent`` (checked by
    :func:`_chunk`): (owner (R,), feature id (R,)). The lists must lie in the chunk, after its
    offset table, without overlapping, so they never hold more ids than the chunk has room for."""
    offset, chunk_end = extent
    size = len(data)
    num = int(_u32(data, offset + 8)[0])
    table_end = offset + CHUNK_SIZE + 4 * num
    if num < count or table_end > chunk_end:
        raise CRFsuiteFormatError(f"{path}: the {what} reference chunk ({num} entries, {chunk_end - offset} bytes) is damaged")
    lists = _u32(data, offset + CHUNK_SIZE, count)
    if count and (lists.min() < 0 or lists.max() + 4 > size):
        raise CRFsuiteFormatError(f"{path}: a {what} reference list lies outside the file")
    if count and (lists.min() < table_end or lists.max() + 4 > chunk_end):
        raise CRFsuiteFormatError(f"{path}: a {what} reference list lies outside its chunk ({offset} .. {chunk_end})")
    buffer = np.frombuffer(data, np.uint8)
    lengths = np.ascontiguousarray(buffer[lists[:, None] + np.arange(4)]).view("<u4").ravel().astype(np.int64)
    ends = lists + 4 + 4 * lengths
    if count and np.any(ends > size):
        raise CRFsuiteFormatError(f"{path}: a {what} reference list runs past the end of the file")
    if count and np.any(ends > chunk_end):
        raise CRFsuiteFormatError(f"{path}: a {what} reference list runs past the end of its chunk")
    clash = first_overlap(lists, ends)
    if clash >= 0:
        raise CRFsuiteFormatError(
            f"{path}: the reference list of {what} {clash} overlaps another one (shared or looping references)"
        )
    owner = np.repeat(np.arange(count), lengths)
    first = np.cumsum(lengths) - lengths
    positions = np.repeat(lists + 4, lengths) + 4 * (np.arange(owner.size) - np.repeat(first, lengths))
    fids = np.ascontiguousarray(buffer[positions[:, None] + np.arange(4)]).view("<u4").ravel().astype(np.int64)
    return owner, fids


def read_crfsuite(path: str | os.PathLike) -> CRFsuiteModel:
    """Read a model file written by CRFsuite (``pycrfsuite.Trainer.train``); every size and offset
    is checked against the file before it is used, chunks and reference lists must not overlap,
    and the weight tables must fit what the file can describe (:func:`crf._persist.check_table_size`):
    a damaged or forged file raises :class:`CRFsuiteFormatError` naming the file and the problem.

    Parameters
    ----------
    path : str or os.PathLike
        A CRFsuite first-order model file (CRFsuite's ``FOMC`` type).

    Returns
    -------
    CRFsuiteModel
        Its labels, attributes, state features and transitions.

    Raises
    ------
    CRFsuiteFormatError
        A missing file, or one that is not a valid CRFsuite first-order model, naming the file
        and the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise CRFsuiteFormatError(f"{path}: no such model file")
    return parse_crfsuite(path.read_bytes(), path)


def parse_crfsuite(data: bytes, path: str | os.PathLike = "<memory>") -> CRFsuiteModel:
    """The model in ``data``, the bytes of a CRFsuite model file; checked as
    :func:`read_crfsuite` checks a file.

    Parameters
    ----------
    data : bytes
        The whole content of a CRFsuite first-order model file.
    path : str or os.PathLike, default="<memory>"
        Names the source in error messages.

    Returns
    -------
    CRFsuiteModel

    Raises
    ------
    CRFsuiteFormatError
        Not a valid CRFsuite first-order model, naming ``path`` and the problem.
    """
    if len(data) < HEADER_SIZE:
        raise CRFsuiteFormatError(f"{path}: {len(data)} bytes, shorter than a CRFsuite header")
    if data[:4] != MAGIC:
        raise CRFsuiteFormatError(f"{path}: not a CRFsuite model (magic {data[:4]!r}, expected {MAGIC!r})")
    if data[8:12] != MODEL_TYPE:
        raise CRFsuiteFormatError(f"{path}: model type {data[8:12]!r}, only first-order {MODEL_TYPE!r} models are supported")
    _, file_size, _, version, _, L, A, off_features, off_labels, off_attrs, off_labelrefs, off_attrrefs = _HEADER.unpack_from(
        data
    )
    if file_size != len(data):
        raise CRFsuiteFormatError(f"{path}: header says {file_size} bytes but the file has {len(data)} (truncated or padded)")
    if version != VERSION:
        raise CRFsuiteFormatError(f"{path}: format version {version}, expected {VERSION}")
    chunks = {
        "feature": _chunk(data, path, off_features, b"FEAT", "features"),
        "label string": _chunk(data, path, off_labels, CQDB_MAGIC, "label strings"),
        "attribute string": _chunk(data, path, off_attrs, CQDB_MAGIC, "attribute strings"),
        "label reference": _chunk(data, path, off_labelrefs, b"LFRF", "label references"),
        "attribute reference": _chunk(data, path, off_attrrefs, b"AFRF", "attribute references"),
    }
    names = list(chunks)
    clash = first_overlap([a for a, _ in chunks.values()], [b for _, b in chunks.values()])
    if clash >= 0:
        raise CRFsuiteFormatError(f"{path}: the {names[clash]} chunk at offset {chunks[names[clash]][0]} overlaps another chunk")
    chunk_size, K = _u32(data, off_features + 4, 2).tolist()
    if chunk_size != CHUNK_SIZE + FEATURE_SIZE * K:
        raise CRFsuiteFormatError(f"{path}: feature chunk of {K} features has size {chunk_size} (damaged or truncated)")
    check_table_size(path, f"the weights of {A:,} attributes x {L:,} labels", A * L + L * L, len(data), error=CRFsuiteFormatError)
    features = np.frombuffer(data, _FEATURE, K, off_features + CHUNK_SIZE)
    if not np.all(np.isfinite(features["weight"])):
        raise CRFsuiteFormatError(f"{path}: a feature weight is not finite")
    if K and float(np.max(np.abs(features["weight"]))) > MAX_ABS_WEIGHT:  # also keeps repeated features' sums finite
        raise CRFsuiteFormatError(f"{path}: a feature holds {weight_beyond_bound(features['weight'])}")
    try:
        labels = read_cqdb(data, off_labels, L)
        attributes = read_cqdb(data, off_attrs, A)
    except CQDBError as err:
        raise CRFsuiteFormatError(f"{path}: {err}") from None
    check_unique(path, "label", labels, CRFsuiteFormatError)
    check_unique(path, "attribute", attributes, CRFsuiteFormatError)
    kind, src, dst = (features[name].astype(np.int64) for name in ("type", "src", "dst"))
    if K and dst.max() >= L:
        raise CRFsuiteFormatError(f"{path}: feature #{int(np.argmax(dst >= L))} points to label {dst.max()} of {L}")
    tables = {}
    for name, count, expected in (("label", L, TRANSITION), ("attribute", A, STATE)):
        owner, fids = _references(data, path, chunks[f"{name} reference"], count, name)
        if fids.size and fids.max() >= K:
            raise CRFsuiteFormatError(f"{path}: a {name} reference names feature {fids.max()} of {K}")
        wrong = (kind[fids] != expected) | (src[fids] != owner)
        if np.any(wrong):
            i = int(np.argmax(wrong))
            raise CRFsuiteFormatError(f"{path}: {name} {owner[i]} references feature #{fids[i]} of another kind or owner")
        tables[name] = (owner, fids)
    transitions = np.zeros((L, L))
    owner, fids = tables["label"]
    transitions[owner, dst[fids]] = features["weight"][fids]  # CRFsuite writes each (previous, current) pair once
    owner, fids = tables["attribute"]
    state = StateFeatures(owner, dst[fids], features["weight"][fids].astype(np.float64))
    return CRFsuiteModel(labels, attributes, state, transitions)


def _chunk_refs(chunk_id: bytes, owners: np.ndarray, count: int, fids: np.ndarray, begin: int) -> bytes:
    """A reference chunk starting at file offset ``begin``; ``owners`` sorted, ``fids`` aligned."""
    lengths = np.bincount(owners, minlength=count).astype(np.int64)
    lists_start = begin + CHUNK_SIZE + 4 * count
    body = np.zeros(count + fids.size, dtype="<u4")
    first = np.cumsum(lengths) - lengths
    body[first + np.arange(count)] = lengths
    body[np.arange(fids.size) + owners + 1] = fids
    offsets = lists_start + 4 * (first + np.arange(count))
    head = np.array([CHUNK_SIZE + 4 * count + body.nbytes, count], dtype="<u4")
    return chunk_id + head.tobytes() + offsets.astype("<u4").tobytes() + body.tobytes()


def _pad4(parts: list[bytes]) -> None:
    size = sum(len(p) for p in parts)
    parts.append(b"\0" * (-size % 4))


def write_crfsuite(path: str | os.PathLike, model: CRFsuiteModel) -> None:
    """Write ``model`` as a CRFsuite first-order model file that python-crfsuite's ``Tagger``
    opens; atomic (temporary file renamed into place). Zero weights are left out.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write (replaced only once the new one is complete).
    model : CRFsuiteModel
        The model to write.

    Raises
    ------
    ValueError
        Duplicate label or attribute names, transitions not (L, L), state feature arrays not
        1-D of one length or indexing out of range, or a weight that is not finite or beyond
        :data:`crf._persist.MAX_ABS_WEIGHT` (no reader would accept it); nothing is written.
    """
    path = Path(path)
    L, A = len(model.labels), len(model.attributes)
    for name, strings in (("label", model.labels), ("attribute", model.attributes)):
        if len(set(strings)) != len(strings):
            raise ValueError(f"duplicate {name} names: CRFsuite needs unique strings")
    transitions = np.asarray(model.transitions, dtype=np.float64)
    if transitions.shape != (L, L):
        raise ValueError(f"transitions have shape {transitions.shape}, expected {(L, L)}")
    attr, label, weight = (np.asarray(a) for a in model.state_features)
    if not (attr.shape == label.shape == weight.shape) or attr.ndim != 1:
        raise ValueError("state feature arrays must be 1-d and of equal length")
    if attr.size and (attr.min() < 0 or attr.max() >= A or label.min() < 0 or label.max() >= L):
        raise ValueError("a state feature refers to an attribute or label out of range")
    if not (np.all(np.isfinite(weight)) and np.all(np.isfinite(transitions))):
        raise ValueError("weights must be finite")
    for weights in (weight, transitions):
        if weights.size and float(np.max(np.abs(weights))) > MAX_ABS_WEIGHT:
            raise ValueError(f"a weight no reader would accept: {weight_beyond_bound(weights)}")
    keep = weight != 0
    order = np.lexsort((label[keep], attr[keep]))
    s_attr, s_label, s_weight = attr[keep][order], label[keep][order], weight[keep][order]
    t_src, t_dst = np.nonzero(transitions)
    K_state = s_attr.size
    features = np.zeros(K_state + t_src.size, dtype=_FEATURE)
    features["type"] = np.r_[np.full(K_state, STATE), np.full(t_src.size, TRANSITION)]
    features["src"] = np.r_[s_attr, t_src]
    features["dst"] = np.r_[s_label, t_dst]
    features["weight"] = np.r_[s_weight, transitions[t_src, t_dst]]
    parts = [b"", b"FEAT" + np.array([CHUNK_SIZE + features.nbytes, features.size], dtype="<u4").tobytes() + features.tobytes()]
    offsets = {}
    offsets["labels"] = HEADER_SIZE + len(parts[1])
    parts.append(build_cqdb(list(model.labels)))
    offsets["attrs"] = offsets["labels"] + len(parts[2])
    parts.append(build_cqdb(list(model.attributes)))
    _pad4(parts)
    offsets["labelrefs"] = sum(len(p) for p in parts) + HEADER_SIZE
    parts.append(_chunk_refs(b"LFRF", t_src, L, K_state + np.arange(t_src.size), offsets["labelrefs"]))
    _pad4(parts)
    offsets["attrrefs"] = sum(len(p) for p in parts) + HEADER_SIZE
    parts.append(_chunk_refs(b"AFRF", s_attr, A, np.arange(K_state), offsets["attrrefs"]))
    total = HEADER_SIZE + sum(len(p) for p in parts)
    if total >= 2**32:
        raise ValueError(f"the model needs {total} bytes; CRFsuite files are limited to 4 GiB")
    parts[0] = _HEADER.pack(
        MAGIC,
        total,
        MODEL_TYPE,
        VERSION,
        features.size,
        L,
        A,
        HEADER_SIZE,
        *(offsets[k] for k in ("labels", "attrs", "labelrefs", "attrrefs")),
    )
    atomic_write(path, lambda out: out.write(b"".join(parts)))


def fitted_attributes(model: CRFsuiteModel) -> dict:
    """The fitted attributes of a :class:`crf.CRF` (by name) that tags python-crfsuite-style
    inputs (lists of attribute strings or dicts) exactly as CRFsuite's tagger tags with ``model``;
    start and end weights are 0. :meth:`crf.CRF.from_crfsuite` makes the estimator.

    Parameters
    ----------
    model : CRFsuiteModel
        A read CRFsuite model.

    Returns
    -------
    dict
        Fitted attribute name -> value (``classes_``, ``attributes_``, ``state_weights_`` (A, L),
        ``transitions_`` (L, L), ...).

    Raises
    ------
    ValueError
        A model without labels.
    """
    L, A = len(model.labels), len(model.attributes)
    if L == 0:  # what CRFsuite writes when it had nothing to train on: a file, but no tagger
        raise ValueError("the model has no labels (CRFsuite trained it on no data)")
    index = AttributeIndex()
    index.index_ = {name: i for i, name in enumerate(model.attributes)}
    attr, label, weight = model.state_features
    state = np.zeros((A, L))
    np.add.at(state, (attr, label), weight)  # repeated references add up, as in CRFsuite's tagger
    return {
        "classes_": list(model.labels),
        "n_attributes_": A,
        "attributes_": list(model.attributes),
        "attribute_index_": index,
        "state_weights_": state,
        "feature_index_": np.unique(np.asarray(attr, dtype=np.int64) * L + label),
        "transitions_": np.array(model.transitions, dtype=np.float64),
        "start_weights_": np.zeros(L),
        "end_weights_": np.zeros(L),
    }


def crfsuite_from_crf(crf) -> CRFsuiteModel:
    """The CRFsuite form of a fitted :class:`crf.CRF`.

    Parameters
    ----------
    crf : crf.CRF
        A fitted first-order CRF with attribute names and string labels.

    Returns
    -------
    CRFsuiteModel
        Its labels, attributes, nonzero state weights and transitions.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        An unfitted CRF.
    ValueError
        A CRF of order 2, with nonzero start or end weights (CRFsuite has no such weights, so the
        file could not tag like the model), without attribute names, or with a label or
        attribute name the file cannot hold.
    """
    if not crf.__sklearn_is_fitted__():
        raise NotFittedError("this CRF is not fitted yet; call fit() or CRF.load()")
    if crf.fitted_order != 1:
        raise ValueError(
            f"this CRF is of order {crf.fitted_order}: CRFsuite's model format holds first-order models only "
            "(label-pair transitions); save it with CRF.save (.npz) instead"
        )
    if np.any(crf.start_weights_ != 0) or np.any(crf.end_weights_ != 0):
        raise ValueError(
            "this CRF has non-zero start/end weights, which CRFsuite's model format cannot hold: "
            "a CRFsuite file would tag differently. Train without start/end weights or set them to 0."
        )
    if crf.attributes_ is None:
        raise ValueError("this CRF has no attribute names (fitted on a SequenceBatch without attribute_names)")
    L = len(crf.classes_)
    flat = crf.feature_index_ if crf.feature_index_ is not None else np.flatnonzero(crf.state_weights_)
    weight = crf.state_weights_.ravel()[flat]
    keep = weight != 0
    state = StateFeatures(flat[keep] // L, flat[keep] % L, weight[keep].astype(np.float64))
    for what, names in (("label", crf.classes_), ("attribute", crf.attributes_)):
        for name in names:
            if not isinstance(name, str):
                raise ValueError(f"the {what} {name!r} {unstorable_name(name)}")
    return CRFsuiteModel(list(crf.classes_), list(crf.attributes_), state, np.array(crf.transitions_))


def write_crfsuite_model(model, path) -> None:
    """Write ``model`` (no start/end weights) as a CRFsuite model file.

    Parameters
    ----------
    model : crf.CRF
        As :func:`crfsuite_from_crf` takes it.
    path : str or os.PathLike
        The file to write.

    Raises
    ------
    sklearn.exceptions.NotFittedError, ValueError
        As :func:`crfsuite_from_crf` and :func:`write_crfsuite`.
    """
    write_crfsuite(path, crfsuite_from_crf(model))

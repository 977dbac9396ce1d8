"""CQDB, CRFsuite's constant string <-> id database, and the lookup3 hash it uses.

A CQDB chunk (all integers little-endian uint32) is laid out as:

- a 24-byte header: ``b"CQDB"``, chunk size, flags, byte-order check ``0x62445371``, the number
  of entries of the backward array and its offset;
- 256 table references (offset, number of buckets), offsets relative to the chunk start, 0 for
  an empty table;
- the records: id (int32), key size (with its NUL), key bytes ending in NUL;
- the hash tables: buckets of (hash, record offset); a key goes to table ``hash % 256``, home
  bucket ``(hash >> 8) % n_buckets``, linear probing; a table has twice as many buckets as keys
  and an empty bucket has offset 0;
- the backward array: the record offset of id 0, 1, ...

The hash is Bob Jenkins' lookup3 ``hashlittle`` of the key with its NUL byte, seed 0, here
vectorised over many keys at once with NumPy uint32 arithmetic.
"""

from __future__ import annotations

import numpy as np

from .layout import positions_within

MAGIC = b"CQDB"
BYTEORDER = 0x62445371
N_TABLES = 256
HEADER_SIZE = 24
DATA_OFFSET = HEADER_SIZE + 8 * N_TABLES
# longest key read or written: lookup3 mixes a key's 12-byte blocks one after the other, a
# NumPy round each (about 0.3 ms), so a key's length bounds the time its hash takes
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
    lookup3 computes. Keys are processed longest first, so those still mixing are a prefix."""
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
    disjoint (ranges that only touch do not overlap)."""
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
    never add up to more than the chunk). Raises CQDBError."""
    if start < 0 or start + DATA_OFFSET > len(data):
        raise CQDBError(f"CQDB chunk at offset {start} runs past the end of the file")
    if data[start : start + 4] != MAGIC:
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
    refs = np.frombuffer(data, "<u4", 2 * N_TABLES, start + HEADER_SIZE).reshape(N_TABLES, 2).astype(np.int64)
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


def build_cqdb(strings: list[str]) -> bytes:
    """A CQDB chunk mapping ``strings[i]`` <-> i, as CRFsuite's reader expects."""
    keys = [s.encode("utf-8") + b"\0" for s in strings]
    if any(b"\0" in k[:-1] for k in keys):
        raise ValueError("CRFsuite strings cannot contain NUL characters")
    if any(len(k) > MAX_KEY_BYTES for k in keys):
        raise ValueError(f"a string of more than {MAX_KEY_BYTES:,} bytes: too long for a CRFsuite model file read here")
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
        [MAGIC, header.tobytes(), refs.tobytes(), records.tobytes(), buckets.tobytes(), offsets.astype("<u4").tobytes()]
    )

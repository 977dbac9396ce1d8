"""Read and write CRFsuite's first-order model files (python-crfsuite, sklearn-crfsuite).

Layout (little-endian uint32 unless said otherwise), as CRFsuite's ``crf1d_model.c`` writes it:

- header (48 bytes): ``b"lCRF"``, file size, ``b"FOMC"``, version 100, number of features
  (CRFsuite leaves it 0; the feature chunk holds the count), labels L, attributes A, and the
  offsets of the feature chunk, the label CQDB, the attribute CQDB, the label references and
  the attribute references;
- feature chunk: ``b"FEAT"``, chunk size, K, then K records of 20 bytes: type (0 state, 1
  transition), source (attribute or previous label), destination label, weight (float64);
- two CQDB chunks (:mod:`crf.cqdb`): label strings and attribute strings;
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

from .attributes import AttributeIndex
from .cqdb import MAGIC as CQDB_MAGIC
from .cqdb import CQDBError, build_cqdb, first_overlap, read_cqdb
from .model import CRF
from .persist import ModelFileError, atomic_write, check_table_size, check_unique

MAGIC, MODEL_TYPE, VERSION = b"lCRF", b"FOMC", 100
HEADER_SIZE, CHUNK_SIZE, FEATURE_SIZE = 48, 12, 20
STATE, TRANSITION = 0, 1
_HEADER = struct.Struct("<4sI4s9I")  # magic, size, type, version, features, labels, attributes, 5 offsets
_FEATURE = np.dtype([("type", "<u4"), ("src", "<u4"), ("dst", "<u4"), ("weight", "<f8")])


class CRFsuiteFormatError(ModelFileError):
    """A CRFsuite model file that is truncated, damaged or not a CRFsuite first-order model."""


class StateFeatures(NamedTuple):
    """State features as parallel (K,) arrays: attribute index, label index, weight."""

    attribute: np.ndarray
    label: np.ndarray
    weight: np.ndarray


@dataclass
class CRFsuiteModel:
    """The content of a CRFsuite first-order model.

    ``labels`` (L), ``attributes`` (A), ``state_features`` (K parallel arrays), ``transitions``
    (L, L) indexed [previous, current] (0 where the file has no such feature)."""

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
    and the weight tables must fit what the file can describe (:func:`crf.persist.check_table_size`):
    a damaged or forged file raises :class:`CRFsuiteFormatError` naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise CRFsuiteFormatError(f"{path}: no such model file")
    return parse_crfsuite(path.read_bytes(), path)


def parse_crfsuite(data: bytes, path: str | os.PathLike = "<memory>") -> CRFsuiteModel:
    """The model in ``data``, the bytes of a CRFsuite model file (``path`` names it in errors);
    checked as :func:`read_crfsuite` checks a file."""
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
    opens; atomic (temporary file renamed into place). Zero weights are left out."""
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


def crf_from_crfsuite(model: CRFsuiteModel) -> CRF:
    """A fitted :class:`~crf.CRF` that tags python-crfsuite-style inputs (lists of attribute
    strings or dicts) exactly as CRFsuite's tagger does; start and end weights are 0."""
    L, A = len(model.labels), len(model.attributes)
    if L == 0:  # what CRFsuite writes when it had nothing to train on: a file, but no tagger
        raise ValueError("the model has no labels (CRFsuite trained it on no data)")
    crf = CRF()
    crf.classes_ = list(model.labels)
    crf.n_attributes_ = A
    crf.attributes_ = list(model.attributes)
    crf.attribute_index_ = AttributeIndex()
    crf.attribute_index_.index_ = {name: i for i, name in enumerate(model.attributes)}
    attr, label, weight = model.state_features
    state = np.zeros((A, L))
    np.add.at(state, (attr, label), weight)  # repeated references add up, as in CRFsuite's tagger
    crf.state_weights_ = state
    crf.feature_index_ = np.unique(np.asarray(attr, dtype=np.int64) * L + label)
    crf.transitions_ = np.array(model.transitions, dtype=np.float64)
    crf.start_weights_ = np.zeros(L)
    crf.end_weights_ = np.zeros(L)
    return crf


def crfsuite_from_crf(crf: CRF) -> CRFsuiteModel:
    """The CRFsuite form of a fitted CRF. Raises ValueError if its start or end weights are not
    all zero (CRFsuite has no such weights, so the file could not tag like the model)."""
    crf._check_fitted()
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
    return CRFsuiteModel([str(c) for c in crf.classes_], [str(a) for a in crf.attributes_], state, np.array(crf.transitions_))

"""Token accuracy, conlleval chunk precision/recall/F1, per-type tables, confusion matrices.

Chunks follow conlleval's rules (a chunk starts and ends where conlleval's ``startOfChunk`` and
``endOfChunk`` say, from the tag before the first ``-`` and the type after it), extended for the
IOBES tags ``E`` and ``S`` as seqeval's default mode does. On IOB1 and IOB2 input this is exactly
conlleval; a chunk is correct when its start, end and type all match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd


def split_label(label: str) -> tuple[str, str]:
    """(tag, type) of a label, as conlleval/seqeval read it: ``B-NP`` -> ``("B", "NP")``."""
    return label[:1], label[1:].split("-", 1)[-1] or "_"


def _tag_arrays(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tag and type codes per token (strings), computed once per distinct label."""
    codes, uniques = pd.factorize(labels)
    parts = [split_label(str(u)) for u in uniques]
    tags = np.array([p[0] for p in parts], dtype=object)
    types = np.array([p[1] for p in parts], dtype=object)
    return tags[codes], types[codes]


def chunk_end(prev_tag, tag, prev_type, type_) -> np.ndarray:
    """Whether a chunk ends between two tokens (elementwise over arrays)."""
    prev_tag, tag = np.asarray(prev_tag), np.asarray(tag)
    ends = (prev_tag == "E") | (prev_tag == "S")
    ends |= np.isin(prev_tag, ["B", "I"]) & np.isin(tag, ["B", "S", "O"])
    ends |= (prev_tag != "O") & (prev_tag != ".") & (np.asarray(prev_type) != np.asarray(type_))
    return ends


def chunk_start(prev_tag, tag, prev_type, type_) -> np.ndarray:
    """Whether a chunk starts at the current token (elementwise over arrays)."""
    prev_tag, tag = np.asarray(prev_tag), np.asarray(tag)
    starts = (tag == "B") | (tag == "S")
    starts |= np.isin(prev_tag, ["E", "S", "O"]) & np.isin(tag, ["E", "I"])
    starts |= (tag != "O") & (tag != ".") & (np.asarray(prev_type) != np.asarray(type_))
    return starts


def _flatten(sequences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    flat = np.array([label for s in sequences for label in s], dtype=object)
    return flat, np.concatenate([[0], np.cumsum(lengths)])


def chunks(sequences: Sequence[Sequence[str]]) -> pd.DataFrame:
    """All chunks of all sequences: a frame with columns sequence, start, end (exclusive), type."""
    flat, offsets = _flatten(sequences)
    return _chunks_flat(flat, offsets)


def _chunks_flat(flat: np.ndarray, offsets: np.ndarray) -> pd.DataFrame:
    n = flat.size
    if n == 0:
        return pd.DataFrame({"sequence": [], "start": [], "end": [], "type": []})
    tags, types = _tag_arrays(flat)
    first = np.zeros(n, dtype=bool)
    first[offsets[:-1][offsets[:-1] < n]] = True
    prev_tags = np.where(first, "O", np.roll(tags, 1))
    prev_types = np.where(first, "_", np.roll(types, 1))
    starts = np.flatnonzero(chunk_start(prev_tags, tags, prev_types, types))
    closes = np.zeros(n + 1, dtype=bool)
    closes[:n] = chunk_end(prev_tags, tags, prev_types, types) | first
    closes[n] = True
    close_at = np.flatnonzero(closes)
    ends = close_at[np.searchsorted(close_at, starts, side="right")]
    sequence = np.searchsorted(offsets, starts, side="right") - 1
    return pd.DataFrame({
        "sequence": sequence,
        "start": starts - offsets[sequence],
        "end": ends - offsets[sequence],
        "type": types[starts].astype(str),
    })


@dataclass
class ChunkScores:
    """Overall chunk precision/recall/F1 (percent, as conlleval prints them) and counts."""

    precision: float
    recall: float
    f1: float
    n_gold: int
    n_predicted: int
    n_correct: int
    accuracy: float
    per_type: pd.DataFrame  # index type; columns precision, recall, f1, support, predicted, correct


def _prf(correct, predicted, gold):
    precision = 100.0 * correct / predicted if predicted else 0.0
    recall = 100.0 * correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def chunk_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> ChunkScores:
    """conlleval's chunk P/R/F1 overall and per type, and token accuracy."""
    _check_aligned(gold, predicted)
    gold_chunks = chunks(gold)
    pred_chunks = chunks(predicted)
    key = ["sequence", "start", "end", "type"]
    correct = gold_chunks.merge(pred_chunks, on=key, how="inner")
    types = sorted(set(gold_chunks["type"]) | set(pred_chunks["type"]))
    g = gold_chunks["type"].value_counts()
    p = pred_chunks["type"].value_counts()
    c = correct["type"].value_counts()
    rows = []
    for t in types:
        gt, pt, ct = int(g.get(t, 0)), int(p.get(t, 0)), int(c.get(t, 0))
        rows.append((t, *_prf(ct, pt, gt), gt, pt, ct))
    per_type = pd.DataFrame(rows, columns=["type", "precision", "recall", "f1", "support", "predicted", "correct"]).set_index("type")
    precision, recall, f1 = _prf(len(correct), len(pred_chunks), len(gold_chunks))
    return ChunkScores(precision, recall, f1, len(gold_chunks), len(pred_chunks), len(correct), token_accuracy(gold, predicted), per_type)


def _check_aligned(gold, predicted) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sequences but {len(predicted)} predicted")
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sequence {i}: {len(g)} gold labels but {len(p)} predicted")


def token_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """Fraction of tokens whose predicted label equals the gold label, in percent."""
    _check_aligned(gold, predicted)
    g, _ = _flatten(gold)
    p, _ = _flatten(predicted)
    return 100.0 * float(np.mean(g == p)) if g.size else 0.0


def label_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> pd.DataFrame:
    """Per-label token-level precision, recall, F1 (percent) and support."""
    g, _ = _flatten(gold)
    p, _ = _flatten(predicted)
    labels = sorted(set(g) | set(p))
    rows = []
    for label in labels:
        tp = int(np.sum((g == label) & (p == label)))
        rows.append((label, *_prf(tp, int(np.sum(p == label)), int(np.sum(g == label))), int(np.sum(g == label))))
    return pd.DataFrame(rows, columns=["label", "precision", "recall", "f1", "support"]).set_index("label")


def confusion_matrix(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Counts of (gold label, predicted label) pairs; rows gold, columns predicted."""
    g, _ = _flatten(gold)
    p, _ = _flatten(predicted)
    labels = list(labels) if labels is not None else sorted(set(g) | set(p))
    index = {label: i for i, label in enumerate(labels)}
    gi = np.array([index.get(x, -1) for x in pd.unique(g)])[pd.factorize(g)[0]]
    pi = np.array([index.get(x, -1) for x in pd.unique(p)])[pd.factorize(p)[0]]
    keep = (gi >= 0) & (pi >= 0)
    counts = np.bincount(gi[keep] * len(labels) + pi[keep], minlength=len(labels) ** 2)
    return pd.DataFrame(counts.reshape(len(labels), len(labels)), index=pd.Index(labels, name="gold"), columns=pd.Index(labels, name="predicted"))

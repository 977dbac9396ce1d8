"""Field-extraction figures for chunk-scheme datasets (AnyStyle's reference fields and any other).

- :func:`field_errors`: token error rate and sequence error rate on field types (the B-/I-/E-/S-
  prefix dropped, ``O`` its own field), AnyStyle's ``check`` figures: a token is wrong when its
  field is wrong, a sequence when any of its tokens is;
- :func:`per_type_metrics`: ``{split}_f1_<type>`` metrics from :func:`crf.metrics.chunk_scores`'
  per-type table, with MLflow-safe names;
- :func:`confidence_average_precision`: Culotta & McCallum's evaluation of field confidence: the
  predicted segments of one type ranked by constrained forward-backward confidence;
- :func:`seen_sequences`: which test sequences occur verbatim (words and labels) in training data;
- :func:`correction_propagation`: fix the first wrong token of every wrong sequence to its gold
  label, re-decode all of them at once under that constraint, count the other tokens' errors that
  disappear and appear.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score

from crf import metrics
from crf.bundle import ModelBundle

log = logging.getLogger(__name__)

# MLflow metric names: alphanumerics, underscores, dashes, periods, spaces and slashes
_UNSAFE = re.compile(r"[^0-9A-Za-z_\-. /]")


def metric_name(name: str) -> str:
    """``name`` with every character MLflow refuses in a metric name replaced by ``_``."""
    return _UNSAFE.sub("_", name)


def label_types(labels: np.ndarray) -> np.ndarray:
    """The field type of each label (T,): ``B-author`` -> ``author``, ``O`` -> ``_`` (as
    :func:`crf.metrics.split_label` reads it), computed once per distinct label."""
    codes, uniques = pd.factorize(np.asarray(labels, dtype=object))
    types = np.array([metrics.split_label(str(u))[1] for u in uniques], dtype=object)
    return types[codes]


def wrong_tokens(gold: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """(T,) bool: the predicted field type differs from the gold one (flat label arrays (T,))."""
    return label_types(gold) != label_types(predicted)


def field_errors(wrong: np.ndarray, offsets: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(token error %, sequence error %, wrong sequences (N,) bool) from per-token errors
    ``wrong`` (T,) over sequences at ``offsets`` (N + 1,)."""
    lengths = np.diff(offsets)
    per_sequence = np.add.reduceat(wrong.astype(np.int64), offsets[:-1]) if wrong.size else np.zeros(0, dtype=np.int64)
    per_sequence = np.where(lengths > 0, per_sequence, 0)
    wrong_sequences = per_sequence > 0
    token_error = 100.0 * float(wrong.mean()) if wrong.size else float("nan")
    sequence_error = 100.0 * float(wrong_sequences.mean()) if wrong_sequences.size else float("nan")
    return token_error, sequence_error, wrong_sequences


def per_type_metrics(split: str, per_type: pd.DataFrame, prefix: str = "") -> dict[str, float]:
    """``{split}_{prefix}f1_<type>`` for every row of a :class:`crf.metrics.ChunkScores` per-type table."""
    return {metric_name(f"{split}_{prefix}f1_{kind}"): float(row["f1"]) for kind, row in per_type.iterrows()}


def confidence_average_precision(segments: pd.DataFrame, field: str) -> float:
    """Average precision of ranking the predicted ``field`` segments by confidence.

    ``segments``: predicted chunks with columns ``type``, ``confidence`` and ``correct`` (the
    segment matches a gold chunk exactly: same sequence, start, end and type). The ranking holds
    the predicted segments only: gold segments the model never predicted are not in it, so this
    is the precision of the confidence ranking over what was extracted (Culotta & McCallum's
    evaluation), not a recall-aware figure. ``sklearn.metrics.average_precision_score`` of
    (correct, confidence); NaN when no segment of that type is predicted or none is correct.
    """
    chosen = segments[segments["type"] == field]
    correct = chosen["correct"].to_numpy(dtype=bool)
    if correct.size == 0 or not correct.any():
        return float("nan")
    confidence = chosen["confidence"].to_numpy(dtype=np.float64)
    if not np.isfinite(confidence).all():  # a sentence of probability 0 under the model has no confidences
        bad = int((~np.isfinite(confidence)).sum())
        raise ValueError(f"{bad} predicted {field!r} segments have no finite confidence (sentences of probability 0)")
    return float(average_precision_score(correct, confidence))


def seen_sequences(sequences: Sequence[Sequence[tuple]], known: Sequence[Sequence[tuple]]) -> np.ndarray:
    """(N,) bool: sequence i (a list of token rows) occurs verbatim (every column) in ``known``."""
    pool = {tuple(map(tuple, s)) for s in known}
    return np.fromiter((tuple(map(tuple, s)) in pool for s in sequences), dtype=bool, count=len(sequences))


def correction_propagation(
    bundle: ModelBundle,
    columns: Mapping[str, np.ndarray],
    offsets: np.ndarray,
    gold: np.ndarray,
    predicted: np.ndarray,
) -> pd.DataFrame:
    """Fix the first wrong token of each wrong sequence to its gold label and re-decode.

    ``columns``: the flat input columns (each (T,)) the bundle reads, over sequences at ``offsets``
    (N + 1,); ``gold``/``predicted`` (T,) label strings (``predicted`` is the bundle's own
    unconstrained decoding). A token is wrong when its field type is (:func:`wrong_tokens`); the
    fixed token is the first wrong one whose gold label the model knows (a sequence whose wrong
    tokens all have labels unseen in training is left out). All
    wrong sequences are decoded in one call under one (T', L) mask: the fixed token may take only
    its gold label, every other token any label.

    Returns one row per wrong sequence: ``sequence``, ``length``, ``fixed_token``, ``gold_label``,
    ``possible`` (the model gives some labelling with the fixed label nonzero probability),
    ``errors_before`` and ``errors_after`` (wrong tokens other than the fixed one),
    ``removed`` (of those wrong before, now right) and ``introduced`` (right before, now wrong).
    A fix the model deems impossible (an HMM that never saw the word with its gold label: every
    path through it has probability 0, and Viterbi's labels there are arbitrary) changes
    nothing: ``errors_after`` = ``errors_before``, ``removed`` = ``introduced`` = 0.
    """
    wrong = wrong_tokens(gold, predicted)
    lengths = np.diff(offsets)
    # a token can be fixed only to a label the model knows (a training subset may lack some)
    fixable = wrong & (pd.Index(bundle.labels).get_indexer(pd.Series(gold, dtype=object)) >= 0)
    _, _, wrong_sequences = field_errors(fixable, offsets)
    chosen = np.flatnonzero(wrong_sequences)
    columns_out = [
        "sequence",
        "length",
        "fixed_token",
        "gold_label",
        "possible",
        "errors_before",
        "errors_after",
        "removed",
        "introduced",
    ]
    if chosen.size == 0:
        kinds = {"gold_label": object, "possible": bool}
        return pd.DataFrame({c: pd.Series(dtype=kinds.get(c, np.int64)) for c in columns_out})
    sub_lengths = lengths[chosen]
    sub_offsets = np.concatenate([[0], np.cumsum(sub_lengths)])
    # flat token indices of the chosen sequences, in order
    tokens = np.repeat(offsets[chosen], sub_lengths) + np.arange(int(sub_offsets[-1])) - np.repeat(sub_offsets[:-1], sub_lengths)
    sub_wrong = wrong[tokens]
    # the first fixable wrong token of each chosen sequence (every chosen sequence has one)
    positions = np.flatnonzero(fixable[tokens])
    _, firsts = np.unique(np.searchsorted(sub_offsets, positions, side="right") - 1, return_index=True)
    first = positions[firsts]
    index = {label: i for i, label in enumerate(bundle.labels)}
    allowed = np.ones((tokens.size, len(bundle.labels)), dtype=bool)
    allowed[first] = False
    allowed[first, [index[label] for label in gold[tokens[first]]]] = True
    tagged = bundle.tag_arrays(
        {c: np.asarray(columns[c])[tokens] for c in bundle.input_columns}, sub_lengths, allowed, marginals=False
    )
    after = np.array(bundle.labels, dtype=object)[tagged.codes]
    possible = tagged.possible
    impossible = np.repeat(~possible, sub_lengths)
    if not possible.all():
        log.info(
            "correction propagation: %d of %d fixes have probability 0 under the model (left unchanged)",
            int((~possible).sum()), possible.size,
        )  # fmt: skip
    wrong_after = np.where(impossible, sub_wrong, wrong_tokens(gold[tokens], after))
    others = np.ones(tokens.size, dtype=bool)
    others[first] = False

    def per_sequence(flags: np.ndarray) -> np.ndarray:
        return np.add.reduceat((flags & others).astype(np.int64), sub_offsets[:-1])

    return pd.DataFrame(
        {
            "sequence": chosen,
            "length": sub_lengths,
            "fixed_token": first - sub_offsets[:-1],
            "gold_label": gold[tokens[first]],
            "possible": possible,
            "errors_before": per_sequence(sub_wrong),
            "errors_after": per_sequence(wrong_after),
            "removed": per_sequence(sub_wrong & ~wrong_after),
            "introduced": per_sequence(~sub_wrong & wrong_after),
        }
    )[columns_out]


def correction_summary(split: str, table: pd.DataFrame) -> dict[str, float]:
    """``{split}_correction_*`` metrics of a :func:`correction_propagation` table: corrections
    made (all rows) and of probability 0 under the model (``possible`` False: nothing changed),
    other errors before/after, errors removed and introduced, and removed per possible fix."""
    fixes = len(table)
    possible = int(table["possible"].sum()) if "possible" in table else fixes
    removed, introduced = int(table["removed"].sum()), int(table["introduced"].sum())
    return {
        f"{split}_correction_fixes": float(fixes),
        f"{split}_correction_impossible_fixes": float(fixes - possible),
        f"{split}_correction_other_errors_before": float(table["errors_before"].sum()),
        f"{split}_correction_other_errors_after": float(table["errors_after"].sum()),
        f"{split}_correction_errors_removed": float(removed),
        f"{split}_correction_errors_introduced": float(introduced),
        f"{split}_correction_errors_removed_per_fix": removed / possible if possible else float("nan"),
        f"{split}_correction_sequences_fully_fixed": float((table["errors_after"] == 0).sum()),
    }

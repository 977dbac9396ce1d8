"""Counting and smoothing for the HMM baseline (:mod:`crf.hmm`): n-gram transition counts,
add-k (Lidstone) and deleted-interpolation transition estimates, and TnT's suffix model for
unknown words.

Transition tables have one axis per context label plus one for the next label, each of size
L + 1: index L is the start symbol on a context axis and the end symbol on the last axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ._persist import arrays_to_strings, strings_to_arrays

# --- counting -----------------------------------------------------------------------------


def transition_indices(labels: np.ndarray, lengths: np.ndarray, n_labels: int, order: int) -> np.ndarray:
    """Flat indices into an (L + 1,) * (order + 1) table of every n-gram of the padded label
    sequences: one per token and one for the end symbol of each sequence. ``labels`` (T,) ints."""
    L = n_labels
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # each sequence becomes [<s>] * order + labels + [</s>] in a padded flat array
    padded_len = lengths + order + 1
    starts = np.concatenate([[0], np.cumsum(padded_len)])[:-1]
    padded = np.full(int(padded_len.sum()), L, dtype=np.int64)
    token_pos = np.repeat(starts + order - offsets[:-1], lengths) + np.arange(labels.size)
    padded[token_pos] = labels
    # targets: every token and every end symbol
    targets = np.concatenate([token_pos, starts + order + lengths])
    index = np.zeros(targets.size, dtype=np.int64)
    for back in range(order, -1, -1):
        index = index * (L + 1) + padded[targets - back]
    return index


def count_transitions(labels, lengths, n_labels: int, order: int, weights=None) -> np.ndarray:
    """n-gram counts of the padded label sequences, shape (L + 1,) * (order + 1)."""
    index = transition_indices(np.asarray(labels, dtype=np.int64), np.asarray(lengths, dtype=np.int64), n_labels, order)
    size = (n_labels + 1) ** (order + 1)
    return np.bincount(index, weights=weights, minlength=size).reshape((n_labels + 1,) * (order + 1)).astype(np.float64)


def valid_contexts(n_labels: int, order: int) -> np.ndarray:
    """Which contexts can occur, shape (L + 1,) * order: after a real label, never a start symbol."""
    L = n_labels
    if order == 1:
        return np.ones(L + 1, dtype=bool)
    valid = np.ones((L + 1, L + 1), dtype=bool)
    valid[:L, L] = False
    return valid


# --- smoothing ----------------------------------------------------------------------------


def add_k_log_probabilities(counts: np.ndarray, k: float, valid_rows: np.ndarray | None = None) -> np.ndarray:
    """log((counts + k) / (row total + k * width)) along the last axis; invalid rows -inf. A row
    with no counts at all (possible with k = 0) is uniform."""
    with np.errstate(divide="ignore", invalid="ignore"):
        total = counts.sum(axis=-1, keepdims=True) + k * counts.shape[-1]
        out = np.where(total > 0, np.log(counts + k) - np.log(total), -np.log(counts.shape[-1]))
    if valid_rows is not None:
        out[~valid_rows] = -np.inf
    return out


def interpolation_weights(counts: np.ndarray) -> np.ndarray:
    """Deleted interpolation (Brants 2000): each n-gram seen f times votes f for the order whose
    estimate, with that n-gram's own occurrence removed, is highest. Returns weights (order + 1,)
    from unigram up, summing to one. ``counts`` is an n-gram table from :func:`count_transitions`."""
    order = counts.ndim - 1
    seen = np.argwhere(counts > 0)
    f = counts[tuple(seen.T)]
    ratios = []
    for n in range(1, order + 2):  # unigram .. full order
        ngram = counts.sum(axis=tuple(range(order + 1 - n))) if n <= order else counts
        context = ngram.sum(axis=-1)
        idx = tuple(seen[:, order + 1 - n :].T)
        numerator = ngram[idx] - 1
        denominator = (context[idx[:-1]] if n > 1 else np.full(f.size, ngram.sum())) - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios.append(np.where(denominator > 0, numerator / denominator, 0.0))
    votes = np.argmax(np.stack(ratios, axis=1)[:, ::-1], axis=1)  # ties go to the higher order
    weights = np.bincount(order - votes, weights=f, minlength=order + 1)
    return weights / weights.sum()


def interpolated_log_probabilities(counts: np.ndarray, weights: np.ndarray, valid_rows: np.ndarray) -> np.ndarray:
    """log of sum_n weights[n] * P_ML(next | last n context labels), renormalised per context."""
    order = counts.ndim - 1
    mixed = np.zeros(counts.shape)
    for n in range(1, order + 2):
        ngram = counts.sum(axis=tuple(range(order + 1 - n))) if n <= order else counts
        context = ngram.sum(axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            estimate = np.where(context > 0, ngram / np.where(context > 0, context, 1.0), 0.0)
        mixed += weights[n - 1] * estimate.reshape((1,) * (order + 1 - n) + estimate.shape)
    total = mixed.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        # a context no order gives any mass (unseen, with zero weight on the orders that saw its
        # suffix: tiny, deterministic data) has probability 0 for every next label, not 0/0 = NaN
        out = np.where(total > 0, np.log(mixed / np.where(total > 0, total, 1.0)), -np.inf)
    out[~valid_rows] = -np.inf
    return out


@dataclass
class SuffixModel:
    """P(label | suffix) for unknown words, learnt from rare words (TnT).

    For a suffix s of length i, P(t | s) = (P_ML(t | s) + theta * P(t | s minus its first
    letter)) / (1 + theta), recursively, where theta is the standard deviation of the tag
    probabilities. Capitalised and other words have separate suffix sets; the empty suffix of
    each is the tag distribution of its rare words, smoothed the same way towards P(t).
    ``keys`` (U,) are ``"<case>|<suffix>"`` strings, ``log_probabilities`` (U, L); ``counts``
    (U, L) sparse suffix-label counts of the rare words and ``label_probabilities`` P(t) (L,)
    determine them (:meth:`from_counts`).
    """

    keys: list[str]
    log_probabilities: np.ndarray
    max_suffix: int
    theta: float
    counts: sp.csr_matrix | None = None
    label_probabilities: np.ndarray | None = None
    rows: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rows = {key: row for row, key in enumerate(self.keys)}

    @staticmethod
    def case(word: str) -> str:
        return "C" if word[:1].isupper() else "l"

    @classmethod
    def fit(
        cls, words: Sequence[str], tag_counts: np.ndarray, rare: np.ndarray, label_probabilities: np.ndarray, max_suffix: int
    ) -> SuffixModel:
        """``words`` (V,) vocabulary, ``tag_counts`` (V, L) word-label counts, ``rare`` (V,)
        which words teach the model, ``label_probabilities`` (L,) P(t) over all tokens."""
        theta = float(np.std(label_probabilities, ddof=1)) if label_probabilities.size > 1 else 1.0
        key_rows: dict[str, int] = {}
        pairs_key, pairs_word = [], []
        for w in np.flatnonzero(rare):
            word = words[w]
            case = cls.case(word)
            for i in range(min(max_suffix, len(word)) + 1):
                key = f"{case}|{word[len(word) - i :] if i else ''}"
                pairs_key.append(key_rows.setdefault(key, len(key_rows)))
                pairs_word.append(w)
        for case in ("C", "l"):  # both empty suffixes exist even without rare words of a case
            key_rows.setdefault(f"{case}|", len(key_rows))
        keys = list(key_rows)
        membership = sp.csr_matrix((np.ones(len(pairs_key)), (pairs_key, pairs_word)), shape=(len(keys), len(words)))
        return cls.from_counts(keys, np.asarray(membership @ tag_counts), label_probabilities, max_suffix, theta)

    @classmethod
    def from_counts(
        cls, keys: list[str], counts: np.ndarray, label_probabilities: np.ndarray, max_suffix: int, theta: float
    ) -> SuffixModel:
        """The model of the rare words' suffix-label counts ``counts`` (U, L) (what model files store)."""
        key_rows = {key: row for row, key in enumerate(keys)}
        totals = counts.sum(axis=1, keepdims=True)
        ml = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        lengths = np.array([len(k) - 2 for k in keys])
        parent = np.array([key_rows.get(k[:2] + k[3:], -1) if len(k) > 2 else -1 for k in keys])
        probabilities = np.zeros_like(ml)
        for length in range(0, min(max_suffix, int(lengths.max(initial=0))) + 1):  # no longer keys exist
            rows = np.flatnonzero(lengths == length)
            below = label_probabilities[None, :] if length == 0 else probabilities[parent[rows]]
            mixed = (ml[rows] + theta * below) / (1.0 + theta)
            probabilities[rows] = np.where(totals[rows] > 0, mixed, below)  # no rare words: the level below
        with np.errstate(divide="ignore"):
            return cls(keys, np.log(probabilities), max_suffix, theta, sp.csr_matrix(counts), label_probabilities)

    def lookup(self, words: Sequence[str]) -> np.ndarray:
        """log P(t | longest known suffix) for each word, shape (n, L)."""
        rows = np.empty(len(words), dtype=np.int64)
        for n, word in enumerate(words):  # once per distinct unknown word
            case = self.case(word)
            for i in range(min(self.max_suffix, len(word)), -1, -1):
                row = self.rows.get(f"{case}|{word[len(word) - i :] if i else ''}")
                if row is not None:
                    rows[n] = row
                    break
        return self.log_probabilities[rows]


def sparse_rows(table: np.ndarray, keep: np.ndarray, name: str) -> dict[str, np.ndarray]:
    """The entries of ``table`` (n, L) where ``keep`` (n, L), row by row, as arrays for a model
    file: ``<name>_values``, their columns and the number per row (smallest unsigned types)."""
    rows, columns = np.nonzero(keep)
    small = np.min_scalar_type(table.shape[1])
    return {
        f"{name}_values": table[rows, columns],
        f"{name}_columns": columns.astype(small),
        f"{name}_counts": np.bincount(rows, minlength=table.shape[0]).astype(small),
    }


def dense_rows(arrays: dict[str, np.ndarray], name: str, n_rows: int, n_columns: int, fill: float) -> np.ndarray:
    """The (``n_rows``, ``n_columns``) table of :func:`sparse_rows`' arrays, ``fill`` elsewhere;
    ValueError when the arrays do not describe such a table."""
    counts = arrays[f"{name}_counts"]
    columns, values = arrays[f"{name}_columns"], arrays[f"{name}_values"]
    if counts.dtype.kind not in "iu" or columns.dtype.kind not in "iu" or counts.ndim != 1 or columns.ndim != 1:
        raise ValueError(f"{name}: counts and columns must be 1-d integer arrays")
    counts, columns = counts.astype(np.int64), columns.astype(np.int64)
    if counts.size != n_rows or values.shape != columns.shape or counts.sum() != columns.size:
        raise ValueError(f"{name}: {counts.size} rows of {int(counts.sum())} entries, expected {n_rows} rows of {columns.size}")
    if columns.size and (columns.min() < 0 or columns.max() >= n_columns):
        raise ValueError(f"{name}: a column lies outside 0 .. {n_columns - 1}")
    out = np.full((n_rows, n_columns), fill)
    out[np.repeat(np.arange(n_rows), counts), columns] = values
    return out


def emission_arrays(log_emissions: np.ndarray, suffix_model: SuffixModel | None) -> dict[str, np.ndarray]:
    """An HMM's emission tables for a model file, sparse: the finite known-word entries of
    ``log_emissions`` (V + 1, L), its unknown-word row and the suffix model's keys and sparse
    counts (its probabilities are recomputed on loading, bit for bit)."""
    known = log_emissions[:-1]
    arrays = {"unknown_emissions": log_emissions[-1]} | sparse_rows(known, np.isfinite(known), "known_emissions")
    if suffix_model is not None:
        arrays["suffix_blob"], arrays["suffix_offsets"] = strings_to_arrays(suffix_model.keys)
        if suffix_model.counts is None:  # read from an older dense file: keep its probabilities as they are
            arrays["suffix_log_probabilities"] = suffix_model.log_probabilities
        else:
            counts = suffix_model.counts.toarray()
            arrays |= sparse_rows(counts, counts != 0, "suffix_counts")
            arrays["label_probabilities"] = suffix_model.label_probabilities
    return arrays


def emission_tables(arrays: dict, n_words: int, n_labels: int, max_suffix: int, theta) -> tuple[np.ndarray, SuffixModel | None]:
    """(log emissions (V + 1, L), suffix model or None) from :func:`emission_arrays`' arrays, or
    from the dense ``log_emissions`` and ``suffix_log_probabilities`` of files written before
    2026-11-22; ValueError when their sizes do not match ``n_words`` and ``n_labels``."""
    if "log_emissions" in arrays:
        log_emissions = arrays["log_emissions"].astype(np.float64)
    else:
        known = dense_rows(arrays, "known_emissions", n_words, n_labels, -np.inf)
        log_emissions = np.vstack([known, arrays["unknown_emissions"][None].astype(np.float64)])
    if "suffix_blob" not in arrays:
        return log_emissions, None
    keys = arrays_to_strings(arrays["suffix_blob"], arrays["suffix_offsets"])
    if "suffix_log_probabilities" in arrays:
        suffix_model = SuffixModel(keys, arrays["suffix_log_probabilities"].astype(np.float64), max_suffix, float(theta))
    else:
        counts = dense_rows(arrays, "suffix_counts", len(keys), n_labels, 0.0)
        probabilities = arrays["label_probabilities"]
        if probabilities.shape != (n_labels,):
            raise ValueError(f"label_probabilities has shape {probabilities.shape}, expected ({n_labels},)")
        suffix_model = SuffixModel.from_counts(keys, counts, probabilities.astype(np.float64), max_suffix, float(theta))
    if suffix_model.log_probabilities.shape != (len(keys), n_labels):
        raise ValueError(f"the suffix table's shape does not match {n_labels} labels")
    return log_emissions, suffix_model


def suffix_emissions(
    vocabulary: Sequence[str], emission_counts: np.ndarray, rare_threshold: int, max_suffix: int
) -> tuple[SuffixModel, np.ndarray, np.ndarray]:
    """TnT emissions: (suffix model, P(unknown | label) (L,), log P(word | label) (V + 1, L)).

    Known words get relative frequencies times P(known | label); the last row is the unknown-word
    row, to which :meth:`SuffixModel.lookup` is added per word. ``emission_counts`` (V, L); words
    seen at most ``rare_threshold`` times teach the suffix model.

    Unknown words: P(w | t) = P(unknown | t) P(t | suffix(w)) / P(t | unknown), the word given
    "unknown" counted as one event. P(unknown) is the share of tokens whose word was seen once
    (Good-Turing), P(t | unknown) the label distribution of rare words (smoothed towards P(t) like
    the suffixes), and P(unknown | t) = P(t | unknown) P(unknown) / P(t).
    """
    tag_totals = emission_counts.sum(axis=0)
    label_probabilities = tag_totals / tag_totals.sum()
    frequency = emission_counts.sum(axis=1)
    rare = frequency <= rare_threshold
    suffix_model = SuffixModel.fit(vocabulary, emission_counts, rare, label_probabilities, max_suffix)
    theta = suffix_model.theta
    rare_totals = emission_counts[rare].sum(axis=0)
    unknown_labels = (rare_totals / max(rare_totals.sum(), 1.0) + theta * label_probabilities) / (1.0 + theta)
    hapax = float(emission_counts[frequency == 1].sum()) / max(tag_totals.sum(), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(label_probabilities > 0, unknown_labels / label_probabilities, 0.0)  # 0: never seen
        unknown_given_label = np.clip(ratio * hapax, 1e-12, 0.5)
        known = np.log(emission_counts / np.maximum(tag_totals, 1.0)) + np.log1p(-unknown_given_label)
        unknown_row = np.where(ratio > 0, np.log(unknown_given_label) - np.log(unknown_labels), -np.inf)
    return suffix_model, unknown_given_label, np.vstack([known, unknown_row])


def expected_transition_table(
    chain_counts: np.ndarray, state_marginals: np.ndarray, node: np.ndarray, lengths: np.ndarray, order: int
) -> np.ndarray:
    """Expected n-gram counts (L + 1,) * (order + 1) of a block of sequences from its chain posterior: the
    chain's expected transition counts ((L, L), or (L + 1, L, L) triples for pair states), the
    per-state marginals (T, S) and per-label marginals ``node`` (T, L) of sequences ``lengths``."""
    L = node.shape[1]
    ends = np.cumsum(lengths)
    first_rows, last_rows = ends - lengths, ends - 1
    table = np.zeros((L + 1,) * (order + 1))
    if order == 1:
        table[:L, :L] = chain_counts
        table[L, :L] = node[first_rows].sum(axis=0)
        table[:L, L] = node[last_rows].sum(axis=0)
    else:
        table[:, :L, :L] = chain_counts
        table[L, L, :L] = node[first_rows].sum(axis=0)
        table[:, :L, L] = state_marginals[last_rows].sum(axis=0).reshape(L + 1, L)
    return table


def dirichlet_log_objective(
    log_transitions: np.ndarray,
    log_emissions: np.ndarray,
    labelled_transitions: np.ndarray,
    labelled_emissions: np.ndarray,
    k: float,
    order: int,
) -> float:
    """log Dirichlet(k + 1) prior of the tables plus the labelled data's log joint likelihood.
    ``log_emissions`` (V + 1, L) has the unknown-word row last (prior pseudo-counts only)."""
    total = 0.0
    valid = valid_contexts(log_emissions.shape[1], order)
    tables = [(log_transitions[valid], labelled_transitions[valid]), (log_emissions[:-1], labelled_emissions)]
    for log_p, counts in tables:
        weight = counts + k
        total += float(np.sum(np.where(weight > 0, weight * np.where(np.isfinite(log_p), log_p, 0.0), 0.0)))
    if k > 0:
        total += float(k * np.sum(log_emissions[-1]))
    return total


def check_possible(emissions: np.ndarray, words: Sequence[str], offsets: np.ndarray) -> None:
    """Raise ValueError naming the first token whose word has probability 0 under every label
    (an unseen word under add-k with k=0): no labelling of its sequence exists.
    ``emissions`` (T, H) log probabilities of the flat ``words``; ``offsets`` (N + 1,)."""
    impossible = np.flatnonzero(~np.isfinite(emissions).any(axis=1))
    if impossible.size:
        sequence = int(np.searchsorted(offsets, impossible[0], side="right")) - 1
        raise ValueError(
            f"sequence {sequence}, token {impossible[0] - offsets[sequence]}: the word {words[impossible[0]]!r} has "
            f"probability 0 under every label ({impossible.size} such tokens; an unseen word with add-k k=0): "
            "use k > 0 or emission_smoothing='suffix'"
        )

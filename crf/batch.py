"""The featurised corpus: a CSR attribute matrix plus sequence offsets."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ._layout import positions_within


@dataclass
class SequenceBatch:
    """Many sequences stacked token by token.

    ``X`` is a CSR matrix of shape (T, A): row t holds the attribute values of token t (1.0 for
    binary attributes). ``offsets`` has shape (N + 1,): sequence i owns rows
    ``offsets[i]:offsets[i + 1]``. Every sequence has at least one token.

    Parameters
    ----------
    X : sparse matrix or array_like of shape (T, A)
        The attribute values; stored as a float64 CSR matrix.
    offsets : array_like of shape (N + 1,), int
        Starts at 0, strictly increasing, ends at T; stored as int64. ``[0]`` is an empty batch.

    Raises
    ------
    ValueError
        ``offsets`` not 1-D, not starting at 0 or not ending at T, or a sequence without tokens.
    """

    X: sp.csr_matrix
    offsets: np.ndarray

    def __post_init__(self) -> None:
        self.X = sp.csr_matrix(self.X, dtype=np.float64)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        if self.offsets.ndim != 1 or self.offsets.size < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must be a 1-D array starting at 0")
        if self.offsets[-1] != self.X.shape[0]:
            raise ValueError(f"offsets end at {self.offsets[-1]} but X has {self.X.shape[0]} rows")
        if np.any(np.diff(self.offsets) <= 0):
            raise ValueError("every sequence needs at least one token")

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sequence, shape (N,)."""
        return np.diff(self.offsets)

    @property
    def n_sequences(self) -> int:
        """How many sequences (N)."""
        return self.offsets.size - 1

    @property
    def n_tokens(self) -> int:
        """How many tokens in all (T, the rows of ``X``)."""
        return int(self.X.shape[0])

    @property
    def n_attributes(self) -> int:
        """How many attribute columns (A, the columns of ``X``)."""
        return int(self.X.shape[1])

    def __len__(self) -> int:
        return self.n_sequences

    def subset(self, indices: np.ndarray) -> SequenceBatch:
        """The sequences at ``indices`` (in that order) as a new batch.

        Parameters
        ----------
        indices : array_like of shape (K,), int
            Sequence numbers, each 0 to N - 1 (others raise IndexError); repeats allowed.

        Returns
        -------
        SequenceBatch
            K sequences; the rows are copied.
        """
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_sequences):
            bad = indices[(indices < 0) | (indices >= self.n_sequences)][0]
            raise IndexError(f"sequence {bad} is not in this batch of {self.n_sequences} sequences (0 to {self.n_sequences - 1})")
        lengths = self.lengths[indices]
        rows = token_rows(self.offsets, indices)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return SequenceBatch(self.X[rows], offsets)


def token_rows(offsets: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Token row numbers of the sequences ``indices``, concatenated in that order.

    Parameters
    ----------
    offsets : ndarray of shape (N + 1,), int
        Sequence offsets.
    indices : ndarray of shape (K,), int
        Sequence numbers, each 0 to N - 1.

    Returns
    -------
    ndarray, int
        The rows of the K sequences, one after another.
    """
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    return np.repeat(starts, lengths) + positions_within(lengths)


def offsets_from_lengths(lengths) -> np.ndarray:
    """Offsets (N + 1,) for sequences of the given lengths.

    Parameters
    ----------
    lengths : array_like of shape (N,), int
        Tokens per sequence.

    Returns
    -------
    ndarray of shape (N + 1,), int64
        ``[0, cumsum(lengths)...]``.
    """
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])


def check_labels(flat: np.ndarray, unknown: bool = False) -> None:
    """Raise TypeError, naming the first offender and its position in ``flat`` (T,), unless every
    label is a string or an integer (or, with ``unknown``, None: a label not known). Booleans are
    refused: ``True == 1`` and ``False == 0``, so they would silently merge with the integer
    labels 1 and 0.

    Parameters
    ----------
    flat : ndarray of shape (T,), object
        Every token's label.
    unknown : bool, default=False
        Allow None.

    Raises
    ------
    TypeError
        The first label that is not a string or an integer.
    """
    if pd.api.types.infer_dtype(flat, skipna=False) not in ("string", "integer"):
        for position, label in enumerate(flat):  # the slow path only for mixed or unusual labels
            if label is None and unknown:
                continue
            boolean = isinstance(label, (bool, np.bool_))
            if boolean or not isinstance(label, (str, int, np.integer, np.str_)):
                raise TypeError(
                    f"labels must be strings or integers, got {label!r} ({type(label).__name__}) at label {position}"
                    + (" (a boolean equals the integer 1 or 0 and would merge with it)" if boolean else "")
                )


def label_classes(flat: np.ndarray, unknown: bool = False) -> list:
    """The distinct labels of ``flat`` (T,) in order of first appearance, checked by
    :func:`check_labels` (with ``unknown``, None marks a label that is not known and is no
    class). They keep their type (NumPy scalars become Python ones), so a model saved and loaded
    predicts the same values it was trained on.

    Parameters
    ----------
    flat : ndarray of shape (T,), object
        Every token's label.
    unknown : bool, default=False
        Allow None (not a class).

    Returns
    -------
    list
        The L classes (str or int).

    Raises
    ------
    TypeError
        As :func:`check_labels` and :func:`check_label_names`.
    """
    check_labels(flat, unknown)
    classes = [c.item() if isinstance(c, np.generic) else c for c in pd.unique(flat) if c is not None]
    check_label_names(classes)
    return classes


def check_label_names(classes, where: str = "") -> None:
    """Raise TypeError if two of the distinct labels ``classes`` print alike: ``'1'`` and ``1``
    (a model file names its classes, so they would load as one class twice), or one text in two
    Unicode forms (``'é'`` composed and decomposed: they look the same in every report).

    Parameters
    ----------
    classes : iterable
        Distinct labels.
    where : str, default=""
        The start of the message (which labels were compared).

    Raises
    ------
    TypeError
        Two labels with the same NFC-normalised ``str``.
    """
    named: dict[str, object] = {}
    for c in classes:
        first = named.setdefault(unicodedata.normalize("NFC", str(c)), c)
        if type(first) is not type(c) or first != c:
            if isinstance(c, str) and str(first) != c:
                alike, fix = "the same text in two Unicode forms (NFC and NFD)", "normalise them (unicodedata.normalize)"
            else:
                alike, fix = "different values with the same name", "use one type for labels"
            raise TypeError(f"{where + ': ' if where else ''}the labels {first!r} and {c!r} are {alike}; {fix}")

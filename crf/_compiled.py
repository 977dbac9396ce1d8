"""Compiled kernels for per-call work: first-order Viterbi and sparse emission scores.

One call tags one sentence or a whole batch, sequence after sequence, with no Python work per
token or per step: the regime (one sentence, one long sequence) where NumPy's per-call overhead
dominates. Each kernel is written once, as plain Python on arrays, and compiled with Numba on
first use (``import crf`` does not import Numba; the compiled code is cached on disk next to this
module, or in Numba's user cache directory, so later processes skip most of the warm-up). Without
Numba the same functions run as plain Python (correct, slow), with one warning.

The kernels release the GIL, so :mod:`crf._parallel`'s threads can run them side by side.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

log = logging.getLogger(__name__)

_lock = threading.Lock()
_compiled: dict[str, object] = {}


def _viterbi_first_order(emissions, transitions, start, end, offsets, labels, scores):  # pragma: no cover - compiled
    """Best path of every sequence of a first-order chain, into ``labels`` (T,) and ``scores`` (N,).

    ``emissions`` (T, L), ``transitions`` (L, L) indexed [previous, current], ``start``/``end``
    (L,), ``offsets`` (N + 1,). Log-space max-plus; ties go to the lowest label (as CRFsuite's);
    a sequence with no finite path scores -inf (labels 0 where nothing is better)."""
    n_labels = emissions.shape[1]
    longest = 0
    for n in range(offsets.size - 1):
        longest = max(longest, offsets[n + 1] - offsets[n])
    back = np.zeros((max(longest, 1), n_labels), dtype=np.int64)
    delta = np.empty(n_labels)
    following = np.empty(n_labels)
    for n in range(offsets.size - 1):
        first, stop = offsets[n], offsets[n + 1]
        if stop <= first:
            scores[n] = 0.0
            continue
        for j in range(n_labels):
            delta[j] = start[j] + emissions[first, j]
        for t in range(first + 1, stop):
            pointers = back[t - first]
            for j in range(n_labels):
                following[j] = delta[0] + transitions[0, j]
                pointers[j] = 0
            for i in range(1, n_labels):  # row by row: the inner loop over labels has no branch
                source = delta[i]
                for j in range(n_labels):
                    value = source + transitions[i, j]
                    better = value > following[j]
                    following[j] = value if better else following[j]
                    pointers[j] = i if better else pointers[j]
            for j in range(n_labels):
                delta[j] = following[j] + emissions[t, j]
        best = delta[0] + end[0]
        arg = 0
        for j in range(1, n_labels):
            value = delta[j] + end[j]
            if value > best:
                best = value
                arg = j
        scores[n] = best
        labels[stop - 1] = arg
        for t in range(stop - 1, first, -1):
            arg = back[t - first, arg]
            labels[t - 1] = arg


def _sparse_times_dense(indptr, indices, data, weights, out):  # pragma: no cover - compiled
    """``out`` (T, L) = the CSR rows (``indptr`` (T + 1,), ``indices``, ``data``) times ``weights``
    (A, L), each row's entries added in their stored order."""
    n_labels = weights.shape[1]
    for t in range(indptr.size - 1):
        for j in range(n_labels):
            out[t, j] = 0.0
        for k in range(indptr[t], indptr[t + 1]):
            column, value = indices[k], data[k]
            for j in range(n_labels):
                out[t, j] += value * weights[column, j]


def _sorted_rows_times_dense(ends, columns, values, weights, out):  # pragma: no cover - compiled
    """``out`` (T, L) = rows given as unsorted entries times ``weights`` (A, L), each row's
    entries added in increasing column order (the order of a CSR matrix with sorted indices);
    ``ends`` (T,) where each row's entries end. Returns False (``out`` incomplete) if a row
    repeats a column."""
    n_labels = weights.shape[1]
    longest = 0
    begin = 0
    for t in range(ends.size):
        longest = max(longest, ends[t] - begin)
        begin = ends[t]
    order = np.empty(longest, dtype=np.int64)
    begin = 0
    for t in range(ends.size):
        size = ends[t] - begin
        for k in range(size):  # insertion sort of the row's entries by column (rows are short)
            entry = begin + k
            column = columns[entry]
            at = k
            while at > 0 and columns[order[at - 1]] > column:
                order[at] = order[at - 1]
                at -= 1
            if at > 0 and columns[order[at - 1]] == column:
                return False
            order[at] = entry
        for j in range(n_labels):
            out[t, j] = 0.0
        for k in range(size):
            entry = order[k]
            column, value = columns[entry], values[entry]
            for j in range(n_labels):
                out[t, j] += value * weights[column, j]
        begin = ends[t]
    return True


def _kernel(name: str):
    """The compiled kernel ``name`` (compiled on first use; the plain function without Numba)."""
    kernel = _compiled.get(name)
    if kernel is not None:
        return kernel
    with _lock:
        if name not in _compiled:
            function = globals()[name]
            try:
                import numba
            except ImportError:  # pragma: no cover - numba is a dependency
                log.warning("numba is not installed: %s runs as plain Python (slow)", name)
                _compiled[name] = function
            else:
                _compiled[name] = numba.njit(cache=True, nogil=True)(function)
    return _compiled[name]


def viterbi(emissions: np.ndarray, transitions: np.ndarray, start, end, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best label sequence of every sequence of a first-order chain.

    Parameters
    ----------
    emissions : (T, L) float array, log scores of every token (sequences one after another).
    transitions : (L, L) float array, indexed [previous, current].
    start, end : (L,) float arrays, scores of the first and last label of a sequence.
    offsets : (N + 1,) int array, where each sequence starts in ``emissions`` and where the last ends.

    Returns
    -------
    labels : (T,) int64, the best path's labels; ties go to the lowest label id.
    scores : (N,) float64, the best path's score (-inf if no path has a finite score).
    """
    emissions, offsets = _floats(emissions), np.asarray(offsets, dtype=np.int64)
    labels = np.zeros(emissions.shape[0], dtype=np.int64)
    scores = np.empty(offsets.size - 1)
    _kernel("_viterbi_first_order")(emissions, _floats(transitions), _floats(start), _floats(end), offsets, labels, scores)
    return labels, scores


def _floats(array) -> np.ndarray:
    """``array`` as float64 (a copy only if it is not already)."""
    return array if type(array) is np.ndarray and array.dtype == np.float64 else np.asarray(array, dtype=np.float64)


def rows_times_dense(ends, columns, values, weights: np.ndarray) -> np.ndarray | None:
    """Rows given as entries (column, value) times dense ``weights`` (A, L): (T, L) float64, or
    None if a row names a column twice.

    ``ends`` (T,): where each row's entries end (cumulative counts); ``columns`` and ``values``
    (E,): the entries, in any order within a row. Each row's entries are added in increasing
    column order, starting from 0: the bits of a CSR product with sorted indices."""
    ends = np.asarray(ends, dtype=np.int64)
    out = np.empty((ends.size, weights.shape[1]))
    complete = _kernel("_sorted_rows_times_dense")(
        ends, np.asarray(columns, dtype=np.int64), np.asarray(values, dtype=np.float64), weights, out
    )
    return out if complete else None


def sparse_times_dense(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Rows of a CSR matrix (T, A) times dense ``weights`` (A, L): (T, L) float64.

    ``indptr`` (T + 1,), ``indices`` and ``data`` (nnz,) as in :class:`scipy.sparse.csr_matrix`;
    each row's entries are added in their stored order, starting from 0."""
    out = np.empty((indptr.size - 1, weights.shape[1]))
    _kernel("_sparse_times_dense")(
        np.ascontiguousarray(indptr, dtype=np.int64),
        np.ascontiguousarray(indices, dtype=np.int64),
        np.ascontiguousarray(data, dtype=np.float64),
        np.ascontiguousarray(weights, dtype=np.float64),
        out,
    )
    return out

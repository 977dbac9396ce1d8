"""Semirings for the chain recursions: algebra on message arrays, nothing about chains.

A semiring here (:class:`Semiring`) is a set of operations on NumPy arrays of *values*; each value
is one element of the semiring and has the trailing shape ``value_shape`` (``()`` for a number,
``(k,)`` for a k-best list). The recursions in :mod:`crf._chain` and the operators in
:mod:`crf._transitions` use only these operations and never ask which semiring they hold.
Selective semirings (max-product, k-best) also pick the best of a list (``argtop``): back
pointers are found with it after the forward pass, for the chosen entries only.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from scipy.special import logsumexp


class Semiring(Protocol):
    """The operations the recursions use (``a``, ``b`` arrays of values; a *weight* is the image
    of one real log score)."""

    value_shape: tuple[int, ...]
    zero: Any  # the additive identity as a weight (0 in probability space, -inf in log space)
    fallback: Any  # the semiring a failed sequence is recomputed in (None: the results stand)

    def from_log(self, scores: np.ndarray, inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(n, m) log scores as weights, with a per-row log offset (n,) taken out."""

    def weights(self, scores: np.ndarray) -> np.ndarray:
        """Log scores as weights, nothing taken out (transition tables)."""

    def to_log(self, values: np.ndarray) -> np.ndarray:
        """Back to log space."""

    def to_prob(self, values: np.ndarray) -> np.ndarray:
        """As probabilities (relative to the row's normaliser)."""

    def ones(self, shape: tuple[int, ...]) -> np.ndarray:
        """The multiplicative identity, an array of ``shape + value_shape``."""

    def times(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Elementwise product; ``b`` holds values or weights (broadcast)."""

    def plus(self, values: np.ndarray, axis: int) -> np.ndarray:
        """Sum (in the semiring) over an axis of the value array's leading axes."""

    def dot(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``plus_j a[n, j] * b[n, j]`` for (n, m) values, row by row (n,)."""

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``out[..., i, j] = plus_m a[..., i, m] * b[..., m, j]``; ``a`` values, ``b`` weights."""

    def normalize(self, values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each row (axis 0) divided by its sum, and the log of the sums (n,): keeps messages in
        range; the true log value is ``to_log(a) + cumulative log normaliser``."""

    def argtop(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Selective semirings: for (n, M) flat values, the kept values (n, V) and their flat
        indices (n, V), best first (V: 1, or k)."""


# elements of one temporary candidate array in the log-space and selective contractions (16 MB)
_BLOCK_ELEMENTS = 1 << 21


def _row_blocks(n: int, per_row: int):
    """Slices of at most ``_BLOCK_ELEMENTS // per_row`` rows covering range(n)."""
    step = max(1, _BLOCK_ELEMENTS // max(1, per_row))
    for first in range(0, n, step):
        yield slice(first, min(n, first + step))


def _candidates(a: np.ndarray, b: np.ndarray, rows: slice) -> np.ndarray:
    """``a[..., rows, i, m] + b[..., m, j]`` as (..., rows, j, m): the contracted axis last and
    contiguous (reducing over it is about twice as fast as over a middle axis)."""
    return a[..., rows, None, :] + np.swapaxes(b, -1, -2)[..., None, :, :]


class LogSemiring:
    """Sum-product in log space: exact for any finite scores, slower than the scaled one."""

    value_shape: tuple[int, ...] = ()
    zero = -np.inf
    fallback = None  # nothing more exact to recompute with

    @staticmethod
    def from_log(scores: np.ndarray, inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return scores, np.zeros(scores.shape[0])

    @staticmethod
    def weights(scores: np.ndarray) -> np.ndarray:
        return scores

    @staticmethod
    def to_log(values: np.ndarray) -> np.ndarray:
        return values

    @staticmethod
    def to_prob(values: np.ndarray) -> np.ndarray:
        return np.exp(values, out=values)

    @classmethod
    def ones(cls, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape + cls.value_shape)

    @staticmethod
    def times(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.add(a, b, out=out)

    @staticmethod
    def plus(values: np.ndarray, axis: int) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return logsumexp(values, axis=axis)

    @classmethod
    def dot(cls, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return cls.plus(cls.times(a, b), axis=1)

    @staticmethod
    def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]))
        with np.errstate(divide="ignore", invalid="ignore"):
            for rows in _row_blocks(a.shape[-2], out[..., :1, :].size * a.shape[-1]):
                out[..., rows, :] = logsumexp(_candidates(a, b, rows), axis=-1)
        return out

    @staticmethod
    def normalize(values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(divide="ignore", invalid="ignore"):
            total = logsumexp(values.reshape(values.shape[0], -1), axis=1)
        shift = np.where(np.isfinite(total), total, 0.0)
        shift = shift.reshape((-1,) + (1,) * (values.ndim - 1))
        return np.subtract(values, shift, out=values if out is None else out), total


class ScaledSemiring:
    """Sum-product in probability space, messages rescaled to sum 1 per row: matrix products.

    Values below ``FLUSH`` (after rescaling to a maximum or sum of 1) are set to exactly zero.
    Their share of any sum is below 1e-75, far under float64 precision, and it keeps every
    product of up to four factors a normal float: subnormal floats make matrix products about
    a hundred times slower, and trained weights produce them in large numbers. Sequences whose
    normalisers underflow anyway are recomputed in ``fallback`` (log space), and so are those
    where a value flushed in the forward or the backward pass carried paths that matter later
    (:mod:`crf._chain` checks that every token gives the same log Z). Not caught: a flush both
    passes share, of a lifted emission or edge weight (an emission more than 172 nats below its
    token's best state, an edge that far below the best edge into its state) whose paths still
    matter because the rest of the chain makes up more than that (the bounds the lift takes out
    do not know which states a mask leaves alive). Scores so far apart are outside what a
    regularised model gives: among random weights of scale 20 on three to five labels no case in
    hundreds showed it, of scale 30 about one in 400, of scale 60 up to one in six; and then the
    sum misses those paths.
    """

    value_shape: tuple[int, ...] = ()
    zero = 0.0
    fallback = LogSemiring
    FLUSH = 1e-75

    @classmethod
    def _flush(cls, values: np.ndarray) -> np.ndarray:
        values[values < cls.FLUSH] = 0.0
        return values

    @classmethod
    def from_log(cls, scores: np.ndarray, inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(exp(scores - row max), row max) for (n, m) log scores."""
        top = scores.max(axis=1)
        top = np.where(np.isfinite(top), top, 0.0)
        out = np.subtract(scores, top[:, None], out=scores if inplace else None)
        return cls._flush(np.exp(out, out=out)), top

    @classmethod
    def weights(cls, scores: np.ndarray) -> np.ndarray:
        return cls._flush(np.exp(scores))

    @staticmethod
    def to_log(values: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(values)

    @staticmethod
    def to_prob(values: np.ndarray) -> np.ndarray:
        return values

    @classmethod
    def ones(cls, shape: tuple[int, ...]) -> np.ndarray:
        return np.ones(shape + cls.value_shape)

    @staticmethod
    def times(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.multiply(a, b, out=out)

    @staticmethod
    def plus(values: np.ndarray, axis: int) -> np.ndarray:
        summed = np.moveaxis(values, axis, -1)
        return summed @ np.ones(summed.shape[-1])  # a BLAS product is faster than sum() over short rows

    @staticmethod
    def dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", a, b)  # no (n, m) temporary

    @staticmethod
    def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(a, b)

    @classmethod
    def normalize(cls, values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows of a (n, m) array divided by their sums (into ``out``, default in place), flushed;
        and the logs of the sums (n,). A row that underflowed to zero stays zero (log -inf)."""
        out = values if out is None else out
        total = values @ np.ones(values.shape[1])  # row sums; a BLAS product is faster than sum()
        safe = np.where(total > 0, total, 1.0)
        np.divide(values, safe[:, None], out=out)
        with np.errstate(divide="ignore"):
            return cls._flush(out), np.log(total)


class MaxSemiring(LogSemiring):
    """Max-product in log space (Viterbi); back pointers come from ``argtop``."""

    @staticmethod
    def plus(values: np.ndarray, axis: int) -> np.ndarray:
        return values.max(axis=axis)

    # terms are skipped for tables of at least this many entries (below, the running maximum costs
    # little more than finding the terms to skip). A block where more than this share of the
    # (row, term) pairs is left beside each row's best term takes the running maximum instead
    # (there skipping no longer pays: untrained or flat tables)
    SKIP_TABLE = 16 * 16
    SKIP_SHARE = 0.1
    # candidate arrays (n * m * p sums) up to this size are formed in one step: a few rows (the
    # long tail of a batch, one short sentence) then take one NumPy call instead of m or more
    ONE_STEP_CELLS = 1 << 15

    @staticmethod
    def spread(b: np.ndarray) -> np.ndarray | None:
        """(m, m) bounds ``[i, k] >= max_j b[i, j] - b[k, j]`` for an (m, p) table: how far term
        i can come out ahead of term k in any column. NaN where both rows are -inf in every
        column (term i never gives more than -inf there). The differences are rounded, so a few
        units in the last place of the table's largest finite entry are added: the bound holds
        for the exact differences (float64). None for a table with NaN or +inf entries, whose
        NaN sums skipping could not keep."""
        if np.isnan(b).any() or np.isposinf(b).any():
            return None
        m, p = b.shape
        out = np.empty((m, m))
        with np.errstate(invalid="ignore"):  # -inf - -inf: both terms give -inf there; fmax skips NaN
            for rows in _row_blocks(m, m * p):
                out[rows] = np.fmax.reduce(b[rows, None, :] - b[None, :, :], axis=2)
        finite = np.abs(b[np.isfinite(b)])
        return out + 2.0**-48 * (finite.max() if finite.size else 0.0)

    @classmethod
    def matmul(cls, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``out[..., n, j] = max_i a[..., n, i] + b[..., i, j]``. No arg max is kept: the back
        pointers of the few entries a best path goes through are found afterwards (``argtop``)."""
        if cls.skips_terms(a, b) and a.shape[0] >= b.shape[0]:  # the m * m * p bounds are paid once over
            return cls.bounded_matmul(a, b, cls.spread(b))
        if a.size * b.shape[-1] <= cls.ONE_STEP_CELLS:
            return (a[..., :, :, None] + b[..., None, :, :]).max(axis=-2)
        return cls._running_max(a, b)

    @classmethod
    def skips_terms(cls, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether the operands are of a kind term skipping applies to (:meth:`bounded_matmul`: 2-D float64,
        a table of at least ``SKIP_TABLE`` entries, more than ``ONE_STEP_CELLS`` sums).
        :meth:`matmul` also asks for at least as many rows as the table has, since it works the
        bounds out for each call."""
        return (
            a.ndim == 2
            and b.ndim == 2
            and a.dtype == b.dtype == np.float64
            and b.size >= cls.SKIP_TABLE
            and a.size * b.shape[1] > cls.ONE_STEP_CELLS
        )

    @classmethod
    def bounded_matmul(cls, a: np.ndarray, b: np.ndarray, spread: np.ndarray | None) -> np.ndarray:
        """:meth:`matmul` of (n, m) by (m, p) float64 arrays, skipping the terms that cannot matter.

        Each row starts from its best term k (largest ``a[n, k]``) and adds only the terms that
        can beat it somewhere: term i is skipped when ``a[n, i] + spread[i, k] < a[n, k]``
        (``spread``: :meth:`spread` of ``b``; a caller with many products by one table works it
        out once; None: nothing skipped). Then ``a[n, i] + b[i, j] < a[n, k] + b[k, j]`` holds exactly
        for every j, and rounding is monotone, so the result has the same values (only a zero's
        sign may differ, as the maximum of -0.0 and +0.0 depends on the order). In trained models
        most rows keep only their best term."""
        if spread is None:
            return cls._running_max(a, b)
        m, p = b.shape
        out = np.empty((a.shape[0], p))
        for rows in _row_blocks(a.shape[0], int(cls.SKIP_SHARE * m * p) + m + p):  # bounds the candidates
            cls._bounded_block(a[rows], b, spread, out[rows])
        return out

    @classmethod
    def _bounded_block(cls, a: np.ndarray, b: np.ndarray, spread: np.ndarray, out: np.ndarray) -> None:
        """:meth:`bounded_matmul` of one row block (n, m) into ``out`` (n, p)."""
        every_row = np.arange(a.shape[0])
        best = a.argmax(axis=1)
        reference = a[every_row, best]
        with np.errstate(invalid="ignore"):  # -inf + inf (a term that cannot reach some label): skipped
            others = a + spread.T[best] >= reference[:, None]
        others[every_row, best] = False
        others[~(reference > -np.inf)] = False  # nothing finite (or NaN): the best term's row is the answer
        if np.count_nonzero(others) > cls.SKIP_SHARE * others.size:  # an untrained or flat table: little to skip
            out[...] = cls._running_max(a, b)
            return
        np.add(reference[:, None], b[best], out=out)
        row, term = np.nonzero(others)  # row-major: grouped by row
        if row.size:
            first = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
            top = np.maximum.reduceat(a[row, term][:, None] + b[term], first, axis=0)
            target = row[first]
            out[target] = np.maximum(out[target], top, out=top)

    @staticmethod
    def _running_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The maximum by a loop of m vectorised steps on (..., n, p) blocks: about three times
        faster than a maximum over a short last axis of an (..., n, p, m) candidate array."""
        terms = np.ascontiguousarray(np.moveaxis(a, -1, 0))[..., None]  # (m, ..., n, 1)
        out = terms[0] + b[..., 0, None, :]
        candidate = np.empty_like(out)
        for i in range(1, a.shape[-1]):
            np.add(terms[i], b[..., i, None, :], out=candidate)
            np.maximum(out, candidate, out=out)
        return out

    @staticmethod
    def normalize(values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        top = values.reshape(values.shape[0], -1).max(axis=1)
        shift = np.where(np.isfinite(top), top, 0.0).reshape((-1,) + (1,) * (values.ndim - 1))
        return np.subtract(values, shift, out=values if out is None else out), top

    @staticmethod
    def argtop(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        best = values.argmax(axis=1)[:, None]
        return np.take_along_axis(values, best, axis=1), best


class KMaxSemiring(MaxSemiring):
    """k-best max-product in log space: a value is the k best scores (k,), best first (-inf
    where fewer exist). ``plus`` merges lists (top k of the union); ``times`` by a weight adds
    it to every entry. ``argtop`` of a flat (m, k) list gives flat indices ``i * k + r`` of
    (term i, rank r) pairs."""

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.k = int(k)
        self.value_shape = (self.k,)

    def ones(self, shape: tuple[int, ...]) -> np.ndarray:
        out = np.full(shape + self.value_shape, -np.inf)
        out[..., 0] = 0.0
        return out

    @staticmethod
    def times(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``a`` values (..., k), ``b`` weights broadcasting to ``a``'s leading axes."""
        return np.add(a, np.asarray(b)[..., None], out=out)

    def _top(self, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k largest along the last axis, best first: (values, indices) (..., k)."""
        k = self.k
        if candidates.shape[-1] > k:
            keep = np.argpartition(-candidates, k - 1, axis=-1)[..., :k]
        else:
            keep = np.broadcast_to(np.arange(candidates.shape[-1]), candidates.shape).copy()
        order = np.argsort(-np.take_along_axis(candidates, keep, axis=-1), axis=-1, kind="stable")
        index = np.take_along_axis(keep, order, axis=-1)
        top = np.take_along_axis(candidates, index, axis=-1)
        if top.shape[-1] < k:  # fewer candidates than k: pad with zeros of the semiring
            pad = [(0, 0)] * (top.ndim - 1) + [(0, k - top.shape[-1])]
            top, index = np.pad(top, pad, constant_values=-np.inf), np.pad(index, pad)
        return top, index

    def plus(self, values: np.ndarray, axis: int) -> np.ndarray:
        merged = np.moveaxis(values, axis, -2)
        return self._top(merged.reshape(merged.shape[:-2] + (-1,)))[0]

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a`` values (..., n, m, k), ``b`` weights (..., m, p): (..., n, p, k) values.

        Skipped: a term i whose best entry is not among the k best first entries (for that output)
        cannot contribute, since k pairs (i', 0) beat all its pairs; so the k best terms are chosen
        on first entries alone, and the top k taken over their k * k (term, rank) pairs."""
        k, m = self.k, a.shape[-2]
        kept = min(k, m)
        shape = np.broadcast_shapes(a.shape[:-3], b.shape[:-2]) + (a.shape[-3], b.shape[-1], k)
        out = np.empty(shape)
        b_by_target = np.swapaxes(b, -1, -2)[..., None, :, :]  # (..., 1, p, m)
        for rows in _row_blocks(a.shape[-3], out[..., :1, :, :].size * m):
            heads = a[..., rows, None, :, 0] + b_by_target  # (..., rows, p, m)
            terms = np.argpartition(-heads, kept - 1, axis=-1)[..., :kept] if m > kept else np.arange(m)
            terms = np.broadcast_to(terms, heads.shape[:-1] + (kept,))
            # [..., rows, j, q, r] = a[..., rows, terms[q], r] + b[..., terms[q], j]
            chosen = np.take_along_axis(a[..., rows, None, :, :], terms[..., None], axis=-2)
            weights = np.take_along_axis(np.broadcast_to(b_by_target, heads.shape), terms, axis=-1)
            candidates = chosen + weights[..., None]
            out[..., rows, :, :] = self._top(candidates.reshape(candidates.shape[:-2] + (-1,)))[0]
        return out

    def argtop(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._top(values)

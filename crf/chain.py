"""Linear-chain recursions: forward, backward, log Z, marginals, Viterbi, constrained spans.

Scores
------
For a sequence of length n with labels y, ``score(y) = start[y_0] + sum_t emissions[t, y_t]
+ sum_{t>0} transitions[y_{t-1}, y_t] + end[y_{n-1}]`` and ``p(y|x) = exp(score(y) - log Z)``.
Arrays: ``emissions`` (T, L) for all tokens of all sequences in token order, ``transitions``
(L, L) indexed [previous, current], ``start`` and ``end`` (L,).

Layout
------
All sequences run at once. Sequences are sorted by length (longest first) and tokens stored
time-major: the rows of step t are the t-th tokens of the sequences longer than t, and the first
rows of step t continue the first rows of step t-1. A recursion is then a Python loop over time
steps whose body works on contiguous blocks; there is no loop over sequences or tokens.

Semirings
---------
One forward and one backward recursion serve every query through a semiring:
``ScaledSemiring`` (sum-product in probability space with per-row rescaling: matrix products,
fast), ``LogSemiring`` (sum-product in log space: exact for any weights; used for sequences where
the scaled one underflows, and for constrained windows) and ``MaxSemiring`` (max-product: Viterbi).
Each keeps messages normalised per row and returns the log of the normaliser, so the true log
message is ``semiring.log(value) + cumulative log normaliser``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

# --- layout -------------------------------------------------------------------------------


@dataclass
class Layout:
    """Packed time-major order for sequences of the given lengths.

    ``order`` (N,): sequence indices by decreasing length (ties keep input order).
    ``n_active`` (S,): sequences longer than t, for each step t < S = max length.
    ``step_start`` (S + 1,): first packed row of each step.
    ``token_of_row`` (T,): token row (in input order) stored at each packed row.
    ``rank_of_row`` (T,): position in ``order`` of the sequence of each packed row.
    """

    lengths: np.ndarray
    order: np.ndarray
    n_active: np.ndarray
    step_start: np.ndarray
    token_of_row: np.ndarray
    rank_of_row: np.ndarray

    @classmethod
    def from_lengths(cls, lengths) -> Layout:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or lengths.size == 0 or np.any(lengths <= 0):
            raise ValueError("lengths must be a non-empty 1-D array of positive integers")
        order = np.argsort(-lengths, kind="stable")
        steps = int(lengths.max())
        at_most = np.cumsum(np.bincount(lengths, minlength=steps + 1))[:steps]
        n_active = lengths.size - at_most  # number of sequences with length > t
        step_start = np.concatenate([[0], np.cumsum(n_active)])
        total = int(step_start[-1])
        step_of_row = np.repeat(np.arange(steps), n_active)
        rank_of_row = np.arange(total) - step_start[step_of_row]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        token_of_row = offsets[order[rank_of_row]] + step_of_row
        return cls(lengths, order, n_active, step_start, token_of_row, rank_of_row)

    @property
    def n_steps(self) -> int:
        return int(self.n_active.size)

    def rows(self, t: int, count: int | None = None) -> slice:
        """Packed rows of step t (the first ``count`` of them)."""
        start = int(self.step_start[t])
        return slice(start, start + int(self.n_active[t] if count is None else count))

    def first_rows(self) -> slice:
        return self.rows(0)

    def last_rows(self) -> np.ndarray:
        """Packed row of the last token of each sequence, by rank (N,)."""
        ranks = np.arange(self.lengths.size)
        return self.step_start[self.lengths[self.order] - 1] + ranks


# --- semirings ----------------------------------------------------------------------------


class ScaledSemiring:
    """Sum-product in probability space; messages rescaled to sum 1 per row.

    Values below ``FLUSH`` times their row's (or column's) maximum are set to exactly zero. Their
    share of any sum is below 1e-75, far under float64 precision, and it keeps every product of
    up to four factors a normal float: subnormal floats make matrix products about a hundred
    times slower, and trained weights produce them in large numbers.
    """

    name = "scaled"
    FLUSH = 1e-75

    @classmethod
    def _flush(cls, values: np.ndarray) -> np.ndarray:
        values[values < cls.FLUSH] = 0.0
        return values

    @classmethod
    def lift(cls, scores: np.ndarray, inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(exp(scores - row max), row max) for a (n, L) array of log scores."""
        top = scores.max(axis=1)
        top = np.where(np.isfinite(top), top, 0.0)
        out = np.subtract(scores, top[:, None], out=scores if inplace else None)
        return cls._flush(np.exp(out, out=out)), top

    @classmethod
    def lift_matrix(cls, matrix: np.ndarray) -> np.ndarray:
        return cls._flush(np.exp(matrix))

    @staticmethod
    def log(values: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(values)

    @staticmethod
    def mul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.multiply(a, b, out=out)

    @staticmethod
    def dot(messages: np.ndarray, matrix: np.ndarray):
        return messages @ matrix, None

    @staticmethod
    def dot_t(messages: np.ndarray, matrix: np.ndarray) -> np.ndarray:
        return messages @ matrix.T

    @classmethod
    def normalize(cls, values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows divided by their sums (into ``out``, default in place) and the logs of the sums."""
        out = values if out is None else out
        total = values @ np.ones(values.shape[1])  # row sums; a BLAS product is faster than sum()
        # a row that underflowed to zero stays zero (log normaliser -inf) instead of turning NaN
        safe = np.where(total > 0, total, 1.0)
        np.divide(values, safe[:, None], out=out)
        with np.errstate(divide="ignore"):
            return cls._flush(out), np.log(total)

    @staticmethod
    def edge_counts(previous: np.ndarray, matrix: np.ndarray, following: np.ndarray) -> np.ndarray:
        """Sum over rows of p(y_prev=i, y=j) given alpha-side ``previous`` and beta-side
        ``following`` messages (n, L) and the lifted transition matrix (L, L)."""
        norm = np.einsum("ij,ij->i", previous @ matrix, following)
        return matrix * ((previous / norm[:, None]).T @ following)

    @staticmethod
    def edge_probabilities(previous, matrix, following) -> np.ndarray:
        joint = previous[:, :, None] * matrix[None] * following[:, None, :]
        return joint / joint.sum(axis=(1, 2), keepdims=True)


class LogSemiring:
    """Sum-product in log space; messages shifted to log-sum-exp 0 per row."""

    name = "log"

    @staticmethod
    def lift(scores: np.ndarray, inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return scores, np.zeros(scores.shape[0])

    @staticmethod
    def lift_matrix(matrix: np.ndarray) -> np.ndarray:
        return matrix

    @staticmethod
    def log(values: np.ndarray) -> np.ndarray:
        return values

    @staticmethod
    def mul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return np.add(a, b, out=out)

    @staticmethod
    def dot(messages: np.ndarray, matrix: np.ndarray):
        return logsumexp(messages[:, :, None] + matrix[None], axis=1), None

    @staticmethod
    def dot_t(messages: np.ndarray, matrix: np.ndarray) -> np.ndarray:
        return logsumexp(messages[:, None, :] + matrix[None], axis=2)

    @staticmethod
    def normalize(values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        total = logsumexp(values, axis=1)
        shift = np.where(np.isfinite(total), total, 0.0)
        return np.subtract(values, shift[:, None], out=values if out is None else out), total

    @classmethod
    def edge_probabilities(cls, previous, matrix, following) -> np.ndarray:
        joint = previous[:, :, None] + matrix[None] + following[:, None, :]
        if joint.shape[0] == 0:
            return joint
        return np.exp(joint - logsumexp(joint, axis=(1, 2), keepdims=True))

    @classmethod
    def edge_counts(cls, previous, matrix, following) -> np.ndarray:
        return cls.edge_probabilities(previous, matrix, following).sum(axis=0)


class MaxSemiring(LogSemiring):
    """Max-product in log space (Viterbi); ``dot`` also returns the arg max (back pointers)."""

    name = "max"

    @staticmethod
    def dot(messages: np.ndarray, matrix: np.ndarray):
        # candidates[n, j, i] = messages[n, i] + matrix[i, j]: reducing over the last, contiguous
        # axis is about twice as fast as over the middle one
        candidates = messages[:, None, :] + matrix.T[None]
        best = candidates.argmax(axis=2)
        return np.take_along_axis(candidates, best[:, :, None], axis=2)[:, :, 0], best

    @staticmethod
    def normalize(values: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        top = values.max(axis=1)
        shift = np.where(np.isfinite(top), top, 0.0)
        return np.subtract(values, shift[:, None], out=values if out is None else out), top


# --- second-order chains ------------------------------------------------------------------


class SecondOrderTransitions:
    """Transition scores of a second-order chain, run by the same recursions as a first-order
    chain whose states are label pairs.

    State ``s = a * L + b`` stands for (y_{t-1} = a, y_t = b), where ``a = L`` means "before the
    sequence": a sequence's first token is in a state (L, b), so there are S = (L + 1) * L states.
    ``scores`` (L + 1, L, L): ``scores[a, b, c]`` is the score of label c after labels a, b. The
    emissions (T, S), ``start`` and ``end`` (S,) given with these transitions are per state (see
    :meth:`state_emissions`). The (S, S) pair-to-pair matrix is never built: each step contracts
    the (n, L + 1, L) messages with ``scores``, O(n L^3) work instead of O(n S^2). Expected edge
    counts come back as (L + 1, L, L) triple counts.
    """

    def __init__(self, scores: np.ndarray) -> None:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim != 3 or scores.shape[0] != scores.shape[1] + 1 or scores.shape[1] != scores.shape[2]:
            raise ValueError(f"second-order scores must have shape (L + 1, L, L), got {scores.shape}")
        self.scores = scores
        self.n_labels = scores.shape[1]
        self.n_states = (self.n_labels + 1) * self.n_labels

    def state_emissions(self, emissions: np.ndarray) -> np.ndarray:
        """Per-label emissions (T, L) as per-state emissions (T, S): state (a, b) emits as b."""
        return np.tile(emissions, (1, self.n_labels + 1))

    def labels_of_states(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states) % self.n_labels

    def lift(self, semiring) -> tuple[np.ndarray, _LiftedSecondOrder]:
        """(column offsets (S,), lifted operator): as for a matrix, each target pair's best
        incoming score moves into the emissions so the lifted scores peak at 1 (0 in log space)."""
        L = self.n_labels
        top = self.scores.max(axis=0)
        top = np.where(np.isfinite(top), top, 0.0)
        column_top = np.zeros(self.n_states)
        column_top[: L * L] = top.ravel()
        return column_top, _LiftedSecondOrder(semiring.lift_matrix(self.scores - top[None]), semiring)


class _LiftedSecondOrder:
    """Lifted second-order transitions bound to a semiring: the ``dot``, ``dot_t`` and
    ``edge_counts`` of :class:`ScaledSemiring` and friends, for pair-state messages (n, S).
    Sum-product in probability space uses batched matrix products over the middle label; log
    and max-product work on (rows, L, L, L + 1) candidate blocks of bounded size."""

    BLOCK_ELEMENTS = 1 << 21

    def __init__(self, values: np.ndarray, semiring) -> None:
        self.values = values  # (L + 1, L, L), [a, b, c]
        self.semiring = semiring
        self.n_labels = values.shape[1]
        self.shape = values.shape
        self.block = max(1, self.BLOCK_ELEMENTS // values.size)
        self.by_middle = np.ascontiguousarray(values.transpose(1, 0, 2))  # [b, a, c]
        self.by_middle_last = np.ascontiguousarray(values.transpose(1, 2, 0))  # [b, c, a]

    def _pairs(self, messages: np.ndarray) -> np.ndarray:
        return messages.reshape(messages.shape[0], self.n_labels + 1, self.n_labels)

    def _padded(self, inner: np.ndarray, fill: float) -> np.ndarray:
        """(n, L, L) values of the states (b, c) as (n, S); the before-start states get ``fill``."""
        n, L = inner.shape[0], self.n_labels
        out = np.full((n, (L + 1) * L), fill, dtype=inner.dtype)
        out[:, : L * L] = inner.reshape(n, L * L)
        return out

    def _into_pairs(self, m: np.ndarray) -> np.ndarray:
        """Probability-space sum over a of m[n, a, b] * values[a, b, c], shape (n, L, L) [n, b, c]."""
        return np.matmul(m.transpose(2, 0, 1), self.by_middle).transpose(1, 0, 2)

    def _blocks(self, n: int):
        for first in range(0, n, self.block):
            yield slice(first, min(n, first + self.block))

    def dot(self, messages: np.ndarray, _matrix=None):
        """Messages into every state (b, c): combine over a of messages (a, b) and scores[a, b, c]."""
        m = self._pairs(messages)
        n = m.shape[0]
        if self.semiring is ScaledSemiring:
            return self._padded(self._into_pairs(m), 0.0), None
        by_a = m.transpose(0, 2, 1)  # [n, b, a]
        inner = np.empty((n, self.n_labels, self.n_labels))
        best = np.zeros((n, self.n_labels, self.n_labels), dtype=np.int64) if self.semiring is MaxSemiring else None
        with np.errstate(divide="ignore", invalid="ignore"):
            for rows in self._blocks(n):
                candidates = by_a[rows, :, None, :] + self.by_middle_last[None]  # [n, b, c, a]
                if best is None:
                    inner[rows] = logsumexp(candidates, axis=3)
                else:
                    best[rows] = candidates.argmax(axis=3)
                    inner[rows] = np.take_along_axis(candidates, best[rows, :, :, None], axis=3)[:, :, :, 0]
        pointers = None
        if best is not None:  # back pointers as previous states (a, b)
            L = self.n_labels
            pointers = self._padded(best * L + np.arange(L)[None, :, None], 0)
        return self._padded(inner, -np.inf), pointers

    def dot_t(self, weighted: np.ndarray, _matrix=None) -> np.ndarray:
        """Messages out of every state (a, b): combine over c of scores[a, b, c] and ``weighted``
        (the following token's (b, c) states)."""
        n, L = weighted.shape[0], self.n_labels
        w = weighted[:, : L * L].reshape(n, L, L)  # [n, b, c]
        if self.semiring is ScaledSemiring:
            out = np.matmul(w.transpose(1, 0, 2), self.by_middle_last)  # [b, n, a]
            return np.ascontiguousarray(out.transpose(1, 2, 0)).reshape(n, (L + 1) * L)
        out = np.empty((n, L + 1, L))
        with np.errstate(divide="ignore", invalid="ignore"):
            for rows in self._blocks(n):
                out[rows] = logsumexp(self.values[None] + w[rows, None, :, :], axis=3)
        return out.reshape(n, (L + 1) * L)

    def edge_counts(self, previous: np.ndarray, _matrix, following: np.ndarray) -> np.ndarray:
        """Expected counts (L + 1, L, L) of the label triples (a, b, c) over the rows' edges."""
        p, L = self._pairs(previous), self.n_labels
        f = following[:, : L * L].reshape(-1, L, L)  # [n, b, c]
        if self.semiring is ScaledSemiring:
            norm = np.einsum("nbc,nbc->n", self._into_pairs(p), f)
            weighted = p / norm[:, None, None]
            summed = np.matmul(weighted.transpose(2, 1, 0), f.transpose(1, 0, 2))  # [b, a, c]
            return self.values * summed.transpose(1, 0, 2)
        counts = np.zeros(self.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            for rows in self._blocks(p.shape[0]):
                joint = p[rows, :, :, None] + self.values[None] + f[rows, None, :, :]
                total = logsumexp(joint.reshape(joint.shape[0], -1), axis=1)
                counts += np.exp(joint - total[:, None, None, None]).sum(axis=0)
        return counts


# --- the recursions -----------------------------------------------------------------------


def _lifted_scores(packed: np.ndarray, transitions, start, layout: Layout, semiring, overwrite: bool = False):
    """Packed emissions with the incoming-transition offsets folded in, lifted.

    Column j of the lifted transition matrix is shifted by its maximum ``column_top[j]``, which
    is added to the emissions of every non-first token instead, so the transition matrix has a 1
    (or 0 in log space) in every column and products underflow only in extreme cases. The first
    token of each sequence takes ``start`` instead. ``packed`` (T, L) is in packed order; it is
    modified (and reused) only with ``overwrite``. Returns (lifted emissions (T, L), their log
    offsets (T,), lifted transitions (L, L)).
    """
    if isinstance(transitions, SecondOrderTransitions):
        column_top, matrix = transitions.lift(semiring)
    else:
        column_top = transitions.max(axis=0)
        column_top = np.where(np.isfinite(column_top), column_top, 0.0)  # a label nothing can reach
        matrix = semiring.lift_matrix(transitions - column_top)
    first = layout.first_rows()
    shifted = packed if overwrite else np.empty_like(packed)
    np.add(packed[first], start, out=shifted[first])
    np.add(packed[first.stop :], column_top, out=shifted[first.stop :])
    lifted, offset = semiring.lift(shifted, inplace=True)
    return lifted, offset, matrix


def _ops(semiring, matrix):
    """What applies the lifted transitions: the semiring itself for a matrix, or the structured
    second-order operator (which knows its semiring)."""
    return matrix if isinstance(matrix, _LiftedSecondOrder) else semiring


def _forward(lifted, offset, matrix, layout: Layout, semiring):
    """Normalised forward messages (T, L), cumulative log normalisers (T,), back pointers.

    The true log forward message of packed row r is ``semiring.log(alpha[r]) + log_scale[r]``.
    """
    alpha = np.empty_like(lifted)
    log_scale = np.empty(lifted.shape[0])
    pointers = []
    ops = _ops(semiring, matrix)
    rows = layout.rows(0)
    norm = semiring.normalize(lifted[rows], out=alpha[rows])[1]
    log_scale[rows] = norm + offset[rows]
    for t in range(1, layout.n_steps):
        rows, previous = layout.rows(t), layout.rows(t - 1, layout.n_active[t])
        incoming, pointer = ops.dot(alpha[previous], matrix)
        norm = semiring.normalize(semiring.mul(incoming, lifted[rows]), out=alpha[rows])[1]
        log_scale[rows] = log_scale[previous] + norm + offset[rows]
        pointers.append(pointer)
    return alpha, log_scale, pointers


def _backward(lifted, offset, matrix, end_lifted, end_norm, layout: Layout, semiring):
    """Normalised backward messages (T, L) and their cumulative log normalisers (T,).

    beta[r] covers everything after the token of row r (its own emission excluded), end
    transition included. The true log message is ``semiring.log(beta[r]) + log_scale[r]``.
    """
    beta = np.empty_like(lifted)
    beta[:] = end_lifted
    log_scale = np.full(lifted.shape[0], end_norm)
    ops = _ops(semiring, matrix)
    for t in range(layout.n_steps - 1, 0, -1):
        following = layout.rows(t)
        rows = layout.rows(t - 1, layout.n_active[t])
        weighted = semiring.mul(beta[following], lifted[following])
        norm = semiring.normalize(ops.dot_t(weighted, matrix), out=beta[rows])[1]
        log_scale[rows] = log_scale[following] + offset[following] + norm
    return beta, log_scale


def _edges(alpha, beta, lifted, matrix, layout: Layout, semiring, per_edge, healthy=None):
    """Edge posteriors step by step on contiguous blocks: for every step t > 0, the previous
    rows' alpha and the current rows' lifted emissions times beta. ``per_edge(rows, block)``
    receives the (n_t, L, L) edge marginals when given; otherwise the summed (L, L) expected
    transition counts are returned. ``healthy`` (N,) by rank leaves failed sequences out."""
    counts = np.zeros(matrix.shape)
    ops = _ops(semiring, matrix)
    for t in range(1, layout.n_steps):
        n = int(layout.n_active[t])
        keep = slice(None) if healthy is None else healthy[:n]
        previous = alpha[layout.rows(t - 1, n)][keep]
        following = semiring.mul(lifted[layout.rows(t)], beta[layout.rows(t)])[keep]
        if per_edge is not None:
            per_edge(layout.rows(t), ops.edge_probabilities(previous, matrix, following))
        else:
            counts += ops.edge_counts(previous, matrix, following)
    return counts


@dataclass
class Posterior:
    """Results of forward-backward (in input order, or packed order when asked for).

    ``log_z`` (N,), ``marginals`` (T, L) node marginals p(y_t | x), ``transition_counts`` (L, L)
    expected transition counts summed over all edges, ``log_alpha`` and ``log_beta`` (T, L) true
    log forward/backward messages (only when requested).
    """

    log_z: np.ndarray
    marginals: np.ndarray
    transition_counts: np.ndarray
    log_alpha: np.ndarray | None = None
    log_beta: np.ndarray | None = None


def _forward_backward_packed(
    packed, transitions, start, end, layout: Layout, semiring, keep_messages: bool, overwrite: bool = False
) -> Posterior:
    """Forward-backward in one semiring on packed emissions; results packed, ``log_z`` by rank.
    Sequences whose normalisers underflow get ``log_z = -inf`` or NaN marginals and contribute
    no transition counts; :func:`forward_backward` recomputes them in log space."""
    lifted, offset, matrix = _lifted_scores(packed, transitions, start, layout, semiring, overwrite)
    alpha, alpha_scale = _forward(lifted, offset, matrix, layout, semiring)[:2]
    end_lifted, end_offset = semiring.lift(end[None, :].copy(), inplace=True)
    end_lifted, end_norm = semiring.normalize(end_lifted)
    end_log = end_norm[0] + end_offset[0]
    beta, beta_scale = _backward(lifted, offset, matrix, end_lifted[0], end_log, layout, semiring)

    last = layout.last_rows()
    closing = semiring.normalize(semiring.mul(alpha[last], end_lifted))[1]
    log_z = alpha_scale[last] + closing + end_log
    failed = ~np.isfinite(log_z) | ~np.isfinite(beta_scale[layout.first_rows()])
    counts = _edges(alpha, beta, lifted, matrix, layout, semiring, None, ~failed if failed.any() else None)
    del lifted
    log_z[failed] = np.nan
    log_alpha = log_beta = None
    if keep_messages:
        with np.errstate(invalid="ignore"):
            log_alpha = semiring.log(alpha) + alpha_scale[:, None]
            log_beta = semiring.log(beta) + beta_scale[:, None]
    # node marginals, computed into the forward buffer (no longer needed)
    with np.errstate(invalid="ignore"):
        node = semiring.normalize(semiring.mul(alpha, beta, out=alpha))[0]
    marginals = np.exp(node, out=node) if semiring is LogSemiring else node
    return Posterior(log_z, marginals, counts, log_alpha, log_beta)


def _rows_of_ranks(layout: Layout, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed rows of the sequences at ``ranks``, each sequence's tokens in order; and lengths."""
    lengths = layout.lengths[layout.order[ranks]]
    steps = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return layout.step_start[steps] + np.repeat(ranks, lengths), lengths


def forward_backward(
    emissions: np.ndarray,
    transitions: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    lengths,
    keep_messages: bool = False,
    semiring=ScaledSemiring,
    packed: bool = False,
) -> Posterior:
    """log Z, node marginals and expected transition counts for every sequence.

    Runs in ``semiring`` (scaled probabilities by default) and recomputes in log space any
    sequence whose scaled normalisers underflow, so the result is finite for any finite scores.
    With ``packed=True`` the emissions are already in the layout's packed order (see
    :class:`Layout`) and the per-token results stay in that order; ``log_z`` is always by
    sequence in input order. ``emissions`` is never modified.
    """
    emissions = np.asarray(emissions, dtype=np.float64)
    layout = lengths if isinstance(lengths, Layout) else Layout.from_lengths(lengths)
    emissions_packed = emissions if packed else emissions[layout.token_of_row]
    # a gathered copy is ours to use as working memory; the caller's array is not
    result = _forward_backward_packed(emissions_packed, transitions, start, end, layout, semiring, keep_messages, not packed)
    failed = np.flatnonzero(np.isnan(result.log_z))
    if failed.size and semiring is not LogSemiring:
        if not packed:  # the working copy was consumed: gather the failed rows again
            emissions_packed = emissions[layout.token_of_row]
        rows, failed_lengths = _rows_of_ranks(layout, failed)
        redo = forward_backward(emissions_packed[rows], transitions, start, end, failed_lengths, keep_messages, LogSemiring)
        result.log_z[failed] = redo.log_z
        result.marginals[rows] = redo.marginals
        result.transition_counts = result.transition_counts + redo.transition_counts
        if keep_messages:
            result.log_alpha[rows] = redo.log_alpha
            result.log_beta[rows] = redo.log_beta
    log_z = np.empty_like(result.log_z)
    log_z[layout.order] = result.log_z
    result.log_z = log_z
    if not packed:
        for name in ("marginals", "log_alpha", "log_beta"):
            values = getattr(result, name)
            if values is not None:
                unpacked = np.empty_like(values)
                unpacked[layout.token_of_row] = values
                setattr(result, name, unpacked)
    return result


def log_partition(emissions, transitions, start, end, lengths) -> np.ndarray:
    """log Z(x) for every sequence, shape (N,)."""
    return forward_backward(emissions, transitions, start, end, lengths).log_z


def edge_marginals(emissions, transitions, start, end, lengths) -> np.ndarray:
    """p(y_{t-1}=i, y_t=j | x) for every token, shape (T, L, L); zeros for first tokens."""
    emissions = np.asarray(emissions, dtype=np.float64)
    layout = lengths if isinstance(lengths, Layout) else Layout.from_lengths(lengths)
    L = emissions.shape[1]
    packed = np.zeros((emissions.shape[0], L, L))
    semiring = LogSemiring  # exact for any weights; this query is for inspection, not training
    lifted, offset, matrix = _lifted_scores(emissions[layout.token_of_row], transitions, start, layout, semiring)
    alpha = _forward(lifted, offset, matrix, layout, semiring)[0]
    end_lifted, end_norm = semiring.normalize(end[None, :].copy())
    beta = _backward(lifted, offset, matrix, end_lifted[0], end_norm[0], layout, semiring)[0]

    def store(rows, block):
        packed[rows] = block

    _edges(alpha, beta, lifted, matrix, layout, semiring, store)
    out = np.empty_like(packed)
    out[layout.token_of_row] = packed
    return out


def viterbi(emissions, transitions, start, end, lengths) -> tuple[np.ndarray, np.ndarray]:
    """Best label sequence of every sequence: (labels (T,) in input order, scores (N,))."""
    emissions = np.asarray(emissions, dtype=np.float64)
    layout = lengths if isinstance(lengths, Layout) else Layout.from_lengths(lengths)
    semiring = MaxSemiring
    lifted, offset, matrix = _lifted_scores(emissions[layout.token_of_row], transitions, start, layout, semiring)
    alpha, log_scale, pointers = _forward(lifted, offset, matrix, layout, semiring)
    last = layout.last_rows()
    closing = alpha[last] + end
    best_last = closing.argmax(axis=1)
    scores_by_rank = log_scale[last] + closing[np.arange(last.size), best_last]

    packed = np.empty(lifted.shape[0], dtype=np.int64)
    ending = layout.lengths[layout.order] - 1  # last step of each rank
    current = np.zeros(layout.lengths.size, dtype=np.int64)
    for t in range(layout.n_steps - 1, -1, -1):
        n = int(layout.n_active[t])
        stops_here = ending[:n] == t
        current[:n][stops_here] = best_last[:n][stops_here]
        packed[layout.rows(t)] = current[:n]
        if t > 0:
            current[:n] = pointers[t - 1][np.arange(n), current[:n]]
    labels = np.empty_like(packed)
    labels[layout.token_of_row] = packed
    scores = np.empty(layout.lengths.size)
    scores[layout.order] = scores_by_rank
    return labels, scores


def sequence_scores(emissions, transitions, start, end, offsets, labels) -> np.ndarray:
    """score(y) of the given labelling of every sequence, shape (N,)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    n_tokens = labels.size
    token_scores = emissions[np.arange(n_tokens), labels]
    is_first = np.zeros(n_tokens, dtype=bool)
    is_first[offsets[:-1]] = True
    previous = np.roll(labels, 1)
    token_scores = token_scores + np.where(is_first, start[labels], transitions[previous, labels])
    totals = np.add.reduceat(token_scores, offsets[:-1])
    return totals + end[labels[offsets[1:] - 1]]


def constrained_log_probability(
    log_alpha: np.ndarray,
    log_beta: np.ndarray,
    log_z: np.ndarray,
    emissions: np.ndarray,
    transitions: np.ndarray,
    start: np.ndarray,
    offsets: np.ndarray,
    sequence: np.ndarray,
    first: np.ndarray,
    allowed: np.ndarray,
    window_offsets: np.ndarray,
) -> np.ndarray:
    """log p(y_t in allowed_t for every t in a window | x), for many windows at once.

    Constrained forward-backward (Culotta & McCallum 2004): the forward recursion is re-run only
    inside each window with the emissions of disallowed labels masked out, started from the
    unconstrained forward message of the token before the window (or ``start``) and closed with
    the unconstrained backward message of the window's last token.

    ``log_alpha``, ``log_beta`` (T, L) and ``log_z`` (N,) come from :func:`forward_backward`
    with ``keep_messages=True``. Window k lies in sequence ``sequence[k]`` from its token
    ``first[k]`` on; its allowed-label masks are ``allowed[window_offsets[k]:window_offsets[k+1]]``
    (a (W, L) boolean array over all windows). Returns (K,) log probabilities.
    """
    sequence = np.asarray(sequence, dtype=np.int64)
    first = np.asarray(first, dtype=np.int64)
    widths = np.diff(window_offsets)
    starts = offsets[sequence] + first
    if np.any(first < 0) or np.any(starts + widths > offsets[sequence + 1]):
        raise ValueError("a window runs outside its sequence")
    window_tokens = np.repeat(starts, widths) + (np.arange(widths.sum()) - np.repeat(window_offsets[:-1], widths))
    masked = np.where(allowed, emissions[window_tokens], -np.inf)
    # the incoming message of each window, folded into its first token's emissions
    incoming = np.tile(start, (sequence.size, 1))
    inner = first > 0
    incoming[inner] = logsumexp(log_alpha[starts[inner] - 1][:, :, None] + transitions[None], axis=1)
    masked[window_offsets[:-1]] += incoming
    layout = Layout.from_lengths(widths)
    semiring = LogSemiring
    # windows start from their own incoming message, so "start" is already in `masked`
    lifted, offset, matrix = _lifted_scores(masked[layout.token_of_row], transitions, np.zeros_like(start), layout, semiring)
    alpha, log_scale = _forward(lifted, offset, matrix, layout, semiring)[:2]
    last = layout.last_rows()
    window_last_token = window_tokens[window_offsets[1:] - 1][layout.order]
    closing = logsumexp(alpha[last] + log_beta[window_last_token], axis=1)
    by_rank = log_scale[last] + closing - log_z[sequence[layout.order]]
    out = np.empty(sequence.size)
    out[layout.order] = by_rank
    return out

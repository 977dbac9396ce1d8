"""Transition operators: how messages move from one token's states to the next token's.

The recursions of :mod:`crf._chain` see transitions only through :class:`TransitionOperator`
(and the :class:`LiftedOperator` it gives for a semiring), whatever the order of the chain: a
first-order matrix over labels, or a second-order structured operator over label pairs. Each
target state's best incoming score ``column_top`` is taken out of the table (so its lifted
entries peak at the semiring's one) and is added to the emissions by the caller instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
import scipy.sparse as sp

from ._semirings import LogSemiring, MaxSemiring, ScaledSemiring, Semiring


class LiftedOperator(Protocol):
    """Transition scores bound to a semiring. For messages (n, S, *V) (V: the semiring's value
    shape); ``values``: the lifted table (``shape``), ``count_shape``: the shape of the expected
    counts, ``total_shape``: the shape :meth:`counts` sums into (a per-lattice space that
    :meth:`expand` turns into ``count_shape``), ``edge_shape``: the shape of one row's edge
    marginals. The recursions
    apply it to the edges into the packed rows ``rows`` of one step through ``at(rows)``: a
    stationary operator is the same for every step (``at`` returns it); one with per-token data
    (:class:`CandidateSecondOrderTransitions`) gives the operator of those rows."""

    values: np.ndarray
    count_shape: tuple[int, ...]
    total_shape: tuple[int, ...]
    edge_shape: tuple[int, ...]

    def at(self, rows) -> LiftedOperator:
        """The operator of the edges into the packed rows ``rows`` (a slice or indices)."""

    def counts(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        """Expected counts (``total_shape``, probabilities) of the edges between the (n, S)
        normalised ``previous`` messages and the ``following`` ones (see ``pair_sum``)."""

    def expand(self, total: np.ndarray) -> np.ndarray:
        """A sum of :meth:`counts` (``total_shape``) as counts of the table (``count_shape``)."""

    def forward(self, messages: np.ndarray) -> np.ndarray:
        """(n, S, *V) messages into every state: ``plus_i m[i] * table[i -> j]``."""

    def pointers(self, messages: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        """For entries ``chosen`` (n, P) of ``forward(messages)`` (flat indices into (S, *V)), the
        flat index into the previous step's (S, *V) of the entry each came from (selective
        semirings, through their ``argtop``)."""

    def backward(self, weighted: np.ndarray) -> np.ndarray:
        """(n, S) messages out of every state: ``plus_j table[i -> j] * w[j]``."""

    def pair_sum(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        """(``shape``) ``plus_n p[n, source] * f[n, target]`` for every table entry."""

    def source(self, previous: np.ndarray) -> np.ndarray:
        """Messages broadcasting against ``values`` with a leading row axis (edge sources)."""

    def target(self, following: np.ndarray) -> np.ndarray:
        """Messages broadcasting against ``values`` with a leading row axis (edge targets), so
        that ``source(p) * values * target(f)`` is the joint of every edge."""


class TransitionOperator(Protocol):
    """What the recursions know of transitions: ``scores`` (the table of log scores, ``shape``),
    ``n_states`` (S)."""

    scores: np.ndarray
    n_states: int
    shape: tuple[int, ...]

    def state_emissions(self, emissions: np.ndarray) -> np.ndarray:
        """Per-label (T, L) arrays as per-state (T, S) arrays."""

    def labels_of_states(self, states: np.ndarray) -> np.ndarray:
        """The label each state carries."""

    def edge_scores(self, previous: np.ndarray, states: np.ndarray) -> np.ndarray:
        """The log score of every edge ``previous[i] -> states[i]`` (states, same shape)."""

    def take(self, index: np.ndarray) -> TransitionOperator:
        """The operator of the tokens ``index`` (as emissions are gathered): itself, unless it
        carries per-token data."""

    def labels_at(self, states: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        """The label of each token's state (T,) (the tokens ``tokens`` of the operator's, or all);
        -1 stays -1 (no path)."""

    def label_marginals(self, marginals: np.ndarray, n_labels: int, reduce=np.add) -> np.ndarray:
        """Per-state values (T, S) combined (``reduce``: sums, or np.maximum for max-marginals)
        per label (T, n_labels): a state carries the label of :meth:`labels_at`, modulo n_labels."""

    def label_mask(self, allowed: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        """Per-label masks (T, n_labels) as per-state masks (T, S): a state is allowed where its label is."""

    def edge_table(self) -> np.ndarray:
        """The log scores of the edges, broadcasting against edge marginals (T, ``edge_shape``)."""

    def lift(self, semiring: Semiring) -> tuple[np.ndarray, LiftedOperator]:
        """(``column_top`` (S,), the operator bound to ``semiring``)."""


def _pick(semiring, candidates: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """For candidates (n, P, m, *V) (the terms behind entry p of every row) and the rank (n, P) of
    each entry in its value, the flat index into (m, *V) of the term of that rank. These are
    the sums the forward contraction maximised, so the term has the entry's value. Among equal
    terms max-product takes the first, as the textbook recursion does; k-best may order equal
    terms differently from its forward contraction (another path of the same score)."""
    n, P = candidates.shape[:2]
    if candidates.ndim == 3:  # one number per value (max-product): rank 0, and argtop is the first arg max
        return candidates.argmax(axis=-1)
    index = semiring.argtop(candidates.reshape(n * P, -1))[1].reshape(n, P, -1)
    return np.take_along_axis(index, rank[..., None], axis=-1)[..., 0]


class _StationaryOperator:
    """What the operators without per-token data share: state s carries label ``s % n_labels``
    (an operator over L' hidden labels, L' a multiple of L, maps them to ``s % L``)."""

    scores: np.ndarray
    n_states: int

    def take(self, index: np.ndarray):
        return self

    def labels_at(self, states: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        states = np.asarray(states)
        return np.where(states >= 0, self.labels_of_states(np.maximum(states, 0)), -1)

    def label_marginals(self, marginals: np.ndarray, n_labels: int, reduce=np.add) -> np.ndarray:
        return reduce.reduce(marginals.reshape(marginals.shape[0], -1, n_labels), axis=1)

    def label_mask(self, allowed: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        allowed = np.asarray(allowed, dtype=bool)
        return np.tile(allowed, (1, self.n_states // allowed.shape[1]))

    def edge_table(self) -> np.ndarray:
        return self.scores


class FirstOrderTransitions(_StationaryOperator):
    """A first-order chain: ``scores`` (L, L) indexed [previous, current]; states are labels."""

    def __init__(self, scores: np.ndarray) -> None:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim != 2 or scores.shape[0] != scores.shape[1]:
            raise ValueError(f"transition scores must have shape (L, L), got {scores.shape}")
        self.scores = scores
        self.n_labels = self.n_states = scores.shape[0]
        self.shape = scores.shape

    @staticmethod
    def state_emissions(emissions: np.ndarray) -> np.ndarray:
        return emissions

    @staticmethod
    def labels_of_states(states: np.ndarray) -> np.ndarray:
        return np.asarray(states)

    def edge_scores(self, previous: np.ndarray, states: np.ndarray) -> np.ndarray:
        return self.scores[previous, states]

    @staticmethod
    def states_of_labels(labels: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The state path (T,) of the labelling ``labels`` (T,) (``first``: the token opens its sequence)."""
        return np.asarray(labels)

    def lift(self, semiring) -> tuple[np.ndarray, _LiftedFirstOrder]:
        column_top = self.scores.max(axis=0)
        column_top = np.where(np.isfinite(column_top), column_top, 0.0)  # a label nothing can reach
        return column_top, _LiftedFirstOrder(semiring.weights(self.scores - column_top), semiring)


class _Stationary:
    """What every stationary lifted operator shares: the same table for every step."""

    values: np.ndarray
    semiring: object

    @property
    def count_shape(self) -> tuple[int, ...]:
        return self.values.shape

    total_shape = count_shape

    @property
    def edge_shape(self) -> tuple[int, ...]:
        return self.values.shape

    def at(self, rows):
        return self

    def counts(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        return self.semiring.to_prob(self.semiring.times(self.values, self.pair_sum(previous, following)))

    @staticmethod
    def expand(total: np.ndarray) -> np.ndarray:
        return total


class _LiftedFirstOrder(_Stationary):
    def __init__(self, values: np.ndarray, semiring) -> None:
        self.values = values  # (L, L) [i, j]
        self.values_t = values.T
        self.semiring = semiring
        self._bounds_done = False
        self._bounds: np.ndarray | None = None  # None once done: a table whose terms cannot be skipped

    def forward(self, messages: np.ndarray) -> np.ndarray:
        if self.semiring is MaxSemiring and MaxSemiring.skips_terms(messages, self.values):
            spread = self._skip_bounds(messages.shape[0])
            if spread is not None:
                return MaxSemiring.bounded_matmul(messages, self.values, spread)
        return self.semiring.matmul(messages, self.values)

    def _skip_bounds(self, rows: int) -> np.ndarray | None:
        """The table's max-product bounds (``MaxSemiring.spread``, m * m * p work), worked out on
        the first step with at least m rows (a batch's first step has the most) and kept for the
        later steps of this pass; None before (one sentence: not worth it) or for a table whose
        terms cannot be skipped."""
        if not self._bounds_done and rows >= self.values.shape[0]:
            self._bounds, self._bounds_done = MaxSemiring.spread(self.values), True
        return self._bounds

    def pointers(self, messages: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        size = math.prod(messages.shape[2:])
        state, rank = np.divmod(chosen, size)
        # [n, p, i, *V] = messages[n, i] * table[i -> state[n, p]]
        candidates = self.semiring.times(messages[:, None], self.values_t[state])
        return _pick(self.semiring, candidates, rank)

    def backward(self, weighted: np.ndarray) -> np.ndarray:
        return self.semiring.matmul(weighted, self.values_t)

    def pair_sum(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        return self.semiring.matmul(previous.T, following)

    @staticmethod
    def source(previous: np.ndarray) -> np.ndarray:
        return previous[:, :, None]

    @staticmethod
    def target(following: np.ndarray) -> np.ndarray:
        return following[:, None, :]


class SecondOrderTransitions(_StationaryOperator):
    """Transition scores of a second-order chain, run by the same recursions as a first-order
    chain whose states are label pairs.

    State ``s = a * L + b`` stands for (y_{t-1} = a, y_t = b), where ``a = L`` means "before the
    sequence": a sequence's first token is in a state (L, b), so there are S = (L + 1) * L states.
    ``scores`` (L + 1, L, L): ``scores[a, b, c]`` is the score of label c after labels a, b. The
    emissions (T, S), ``start`` and ``end`` (S,) given with these transitions are per state (see
    :meth:`state_emissions`). The (S, S) pair-to-pair matrix is never built: each step contracts
    the (n, L + 1, L) messages with ``scores`` (a batched product over the middle label b),
    O(n L^3) work instead of O(n S^2). Expected edge counts come back as (L + 1, L, L) triples.
    """

    def __init__(self, scores: np.ndarray) -> None:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim != 3 or scores.shape[0] != scores.shape[1] + 1 or scores.shape[1] != scores.shape[2]:
            raise ValueError(f"second-order scores must have shape (L + 1, L, L), got {scores.shape}")
        self.scores = scores
        self.n_labels = scores.shape[1]
        self.n_states = (self.n_labels + 1) * self.n_labels
        self.shape = scores.shape

    def state_emissions(self, emissions: np.ndarray) -> np.ndarray:
        """Per-label emissions (T, L) as per-state emissions (T, S): state (a, b) emits as b."""
        return np.tile(emissions, (1, self.n_labels + 1))

    def labels_of_states(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states) % self.n_labels

    def states_of_labels(self, labels: np.ndarray, first: np.ndarray) -> np.ndarray:
        labels = np.asarray(labels)
        return np.where(first, self.n_labels, np.roll(labels, 1)) * self.n_labels + labels

    def edge_scores(self, previous: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Score of (a, b) -> (b', c): ``scores[a, b, c]`` when b' = b, else -inf (no such edge)."""
        a, b = np.divmod(np.asarray(previous), self.n_labels)
        middle, c = np.divmod(np.asarray(states), self.n_labels)
        inner = (middle == b) & (middle < self.n_labels)
        return np.where(inner, self.scores[np.where(inner, a, 0), b, c], -np.inf)

    def lift(self, semiring) -> tuple[np.ndarray, _LiftedSecondOrder]:
        L = self.n_labels
        top = self.scores.max(axis=0)
        top = np.where(np.isfinite(top), top, 0.0)
        column_top = np.zeros(self.n_states)
        column_top[: L * L] = top.ravel()  # states (b, c); the before-start states have no incoming edge
        return column_top, _LiftedSecondOrder(semiring.weights(self.scores - top[None]), semiring)


#: below this fraction of states with a nonzero message, the second-order contractions go by the
#: active entries (a candidate lattice: per-token candidate labels as -inf emissions) instead of O(L^3)
SPARSE_BELOW = 0.25


def _groups(keys: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For sorted ``keys`` (m,) in [0, n_groups): (the keys that occur (G,), each entry's group
    (m,), each entry's place within its group (m,))."""
    counts = np.bincount(keys, minlength=n_groups)
    present = np.flatnonzero(counts)
    sizes = counts[present]
    within = np.arange(keys.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return present, np.repeat(np.arange(present.size), sizes), within


def _max_by_run(values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ``keys`` (m,) whose equal entries are consecutive (m > 0): (the first position of
    each run (R,), the maximum of ``values`` over each run (R,), 0 where it is not finite)."""
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    top = np.maximum.reduceat(values, first)
    return first, np.where(np.isfinite(top), top, 0.0)


class _LiftedSecondOrder(_Stationary):
    """The second-order operator bound to a semiring. Dense contractions are batched products
    over the middle label (O(n L^3)); when few states carry a message (a candidate lattice) and the
    semiring's values are single numbers, forward and backward gather the active entries
    instead, grouped by (row, middle label) and reduced by the semiring's ``plus`` (O(active x
    L)), and the expected counts of the scaled semiring are one sparse product. Both give the
    same sums (up to rounding): only entries at the semiring's zero are skipped."""

    def __init__(self, values: np.ndarray, semiring) -> None:
        self.values = values  # (L + 1, L, L) [a, b, c]
        self.semiring = semiring
        self.n_labels = values.shape[1]
        self.by_middle = np.ascontiguousarray(values.transpose(1, 0, 2))  # [b, a, c]
        self.by_middle_last = np.ascontiguousarray(values.transpose(1, 2, 0))  # [b, c, a]

    def _padded(self, inner: np.ndarray, fill) -> np.ndarray:
        """(L, n, L, *V) [b, n, c] values of the states (b, c) as (n, S, *V); the before-start
        states (which nothing enters) get ``fill``."""
        L, n = self.n_labels, inner.shape[1]
        out = np.full((n, (L + 1) * L) + inner.shape[3:], fill, dtype=inner.dtype)
        out[:, : L * L] = np.moveaxis(inner, 0, 1).reshape((n, L * L) + inner.shape[3:])
        return out

    def _by_middle(self, messages: np.ndarray) -> np.ndarray:
        """(n, S, *V) messages of states (a, b) as (L, n, L + 1, *V) [b, n, a]."""
        n, L = messages.shape[0], self.n_labels
        return np.moveaxis(messages.reshape((n, L + 1, L) + messages.shape[2:]), 2, 0)

    def _inner(self, weighted: np.ndarray) -> np.ndarray:
        """(n, S) messages of the states (b, c) (the before-start states dropped) as (n, L, L)."""
        L = self.n_labels
        return weighted[:, : L * L].reshape(weighted.shape[0], L, L)

    def _sparse(self, messages: np.ndarray) -> bool:
        """Whether to contract by the active entries: single-number values, few nonzero."""
        if messages.ndim != 2 or not messages.size or getattr(self.semiring, "value_shape", ()) != ():
            return False
        # none active (no path reaches these rows, e.g. under fixed labels): the dense product
        return 0 < np.count_nonzero(messages != self.semiring.zero) < SPARSE_BELOW * messages.size

    def forward(self, messages: np.ndarray) -> np.ndarray:
        if self._sparse(messages):
            return self._sparse_forward(messages)
        return self._padded(self.semiring.matmul(self._by_middle(messages), self.by_middle), self.semiring.zero)

    def _sparse_forward(self, messages: np.ndarray) -> np.ndarray:
        """``forward`` by the active states (a, b) of every row: into (b, c) for all c."""
        semiring, L, n = self.semiring, self.n_labels, messages.shape[0]
        by_middle = messages.reshape(n, L + 1, L).transpose(0, 2, 1)  # [n, b, a]: nonzero comes sorted by (n, b)
        rows, b, a = np.nonzero(by_middle != semiring.zero)
        present, group, within = _groups(rows * L + b, n * L)
        candidates = np.full((present.size, int(within.max()) + 1, L), semiring.zero)
        candidates[group, within] = semiring.times(by_middle[rows, b, a][:, None], self.values[a, b])
        out = np.full((n, L + 1, L), semiring.zero)
        out[present // L, present % L] = semiring.plus(candidates, axis=1)  # states (b, c)
        return out.reshape(n, (L + 1) * L)

    def pointers(self, messages: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        L = self.n_labels
        size = math.prod(messages.shape[2:])
        state, rank = np.divmod(chosen, size)
        inner = state < L * L  # a before-start state has no predecessor (only on impossible paths)
        b, c = np.divmod(np.where(inner, state, 0), L)
        # state (b, c) is entered from the states (a, b), a = 0..L: [n, p, a, *V]
        sources = np.arange(L + 1) * L + b[..., None]
        previous = np.take_along_axis(messages[:, None], sources.reshape(sources.shape + (1,) * (messages.ndim - 2)), axis=2)
        candidates = self.semiring.times(previous, np.moveaxis(self.values[:, b, c], 0, -1))
        a, r = np.divmod(_pick(self.semiring, candidates, rank), size)
        return np.where(inner, (a * L + b) * size + r, 0)

    def backward(self, weighted: np.ndarray) -> np.ndarray:
        n, L = weighted.shape[0], self.n_labels
        if self._sparse(weighted):
            return self._sparse_backward(weighted)
        out = self.semiring.matmul(self._inner(weighted).transpose(1, 0, 2), self.by_middle_last)  # [b, n, a]
        return np.ascontiguousarray(out.transpose(1, 2, 0)).reshape(n, (L + 1) * L)

    def _sparse_backward(self, weighted: np.ndarray) -> np.ndarray:
        """``backward`` by the active states (b, c) of every row: out of (a, b) for all a."""
        semiring, L, n = self.semiring, self.n_labels, weighted.shape[0]
        inner = self._inner(weighted)  # [n, b, c]
        rows, b, c = np.nonzero(inner != semiring.zero)
        out = np.full((n, L + 1, L), semiring.zero)
        if not rows.size:  # only before-start states hold a message: nothing leads anywhere
            return out.reshape(n, (L + 1) * L)
        present, group, within = _groups(rows * L + b, n * L)
        candidates = np.full((present.size, int(within.max()) + 1, L + 1), semiring.zero)
        candidates[group, within] = semiring.times(inner[rows, b, c][:, None], self.by_middle_last[b, c])
        out[present // L, :, present % L] = semiring.plus(candidates, axis=1)  # states (a, b)
        return out.reshape(n, (L + 1) * L)

    def pair_sum(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        n, L = previous.shape[0], self.n_labels
        if self.semiring is ScaledSemiring and self._sparse(previous):
            # [a, (b, c)] = sum over rows (n, b) of previous[n, (a, b)] following[n, (b, c)], as one
            # product of sparse matrices: rows (n, b) by columns a, and rows (n, b) by columns (b, c)
            by_middle = sp.csr_matrix(previous.reshape(n, L + 1, L).transpose(0, 2, 1).reshape(n * L, L + 1))
            inner = self._inner(following).reshape(n * L, L)
            rows, c = np.nonzero(inner)
            spread = sp.csr_matrix((inner[rows, c], (rows, (rows % L) * L + c)), shape=(n * L, L * L))
            return (by_middle.T @ spread).toarray().reshape(L + 1, L, L)
        p = previous.reshape(n, L + 1, L).transpose(2, 1, 0)  # [b, a, n]
        summed = self.semiring.matmul(p, self._inner(following).transpose(1, 0, 2))  # [b, a, c]
        return summed.transpose(1, 0, 2)

    def source(self, previous: np.ndarray) -> np.ndarray:
        return previous.reshape(previous.shape[0], self.n_labels + 1, self.n_labels)[:, :, :, None]

    def target(self, following: np.ndarray) -> np.ndarray:
        return self._inner(following)[:, None]


def _filled_edges(previous: np.ndarray, middle: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, ...]:
    """The indices (t, i, j, k) of the true entries of the (T, K + 1, K, K) mask
    ``previous[t, i] & middle[t, j] & current[t, k]`` ((T, K + 1), (T, K), (T, K) bool), ordered by
    t, j, k, then i; made from the per-token slot lists, without the 4-d mask."""
    t, j, k = np.nonzero(middle[:, :, None] & current[:, None, :])  # ordered by t, j, k
    per_token = previous.sum(axis=1)
    first = np.zeros(per_token.size, dtype=np.int64)
    np.cumsum(per_token[:-1], out=first[1:])
    slots = np.nonzero(previous)[1]  # token by token, ascending
    counts = per_token[t]
    entry = np.repeat(np.arange(t.size), counts)
    rank = np.arange(entry.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return t[entry], slots[first[t[entry]] + rank], j[entry], k[entry]


class CandidateEdges:
    """The edges into every token of a candidate second-order lattice, scored by label triples.

    ``used`` (U,): the flat (L + 1, L, L) indices of the label triples the lattice's edges carry,
    ascending, with (L + 1) * L * L (one past the table) last where some slot is empty. The
    edges between filled slots are kept token by token: token t's are ``start[t]:start[t + 1]``
    (``start`` (T + 1,)), each with its source state ``i * K + j`` of token t - 1, its target
    state ``j * K + k`` of token t and its position in ``used`` (``source``, ``target``,
    ``triple`` (E,)), ordered by target, then i. A function of the lattice alone, made once for
    all the weights it is scored with. :attr:`listed` gives them as flat indices into (T, S)
    messages, for the recursions that visit those alone; :attr:`edges` (T, K + 1, K, K) [t, i, j,
    k], the position in ``used`` of every edge from state (i, j) into state (j, k) (the empty-slot
    entry where a slot is empty), is made only for the recursions that use padded tables.
    ``filled`` ((T, K + 1), (T, K), (T, K) bool): which slots of the token two back, the previous
    token and this one are filled (the edge [t, i, j, k] joins filled slots when all three of its
    slots are)."""

    def __init__(
        self,
        used: np.ndarray,
        empty: int,
        filled: tuple[np.ndarray, ...],
        start: np.ndarray,
        source: np.ndarray,
        target: np.ndarray,
        triple: np.ndarray,
    ) -> None:
        self.used = used
        self.empty = empty  # the position in ``used`` of the empty-slot index (-1: none)
        self.filled = filled
        self.start, self.source, self.target, self.triple = start, source, target, triple
        n_tokens, n_slots = filled[2].shape
        self.shape = (n_tokens, n_slots + 1, n_slots, n_slots)

    @classmethod
    def of(cls, labels: np.ndarray, before: np.ndarray, before2: np.ndarray, n_labels: int) -> CandidateEdges:
        """From the slot labels of :class:`CandidateSecondOrderTransitions`."""
        L, (T, K) = n_labels, labels.shape
        masks = (before2 >= 0, before >= 0, labels >= 0)
        t, i, j, k = _filled_edges(*masks)  # the filled edges only: the (T, K + 1, K, K) table is mostly empty slots
        flat = (before2[t, i].astype(np.int64) * L + before[t, j]) * L + labels[t, k]
        size = (L + 1) * L * L
        present = np.zeros(size + 1, dtype=bool)
        present[flat] = True
        present[size] = t.size < T * (K + 1) * K * K
        used = np.flatnonzero(present)
        index_type = np.int32 if used.size < np.iinfo(np.int32).max else np.int64
        position = np.cumsum(present, dtype=np.int64) - 1
        empty = used.size - 1 if present[size] else -1
        start = np.zeros(T + 1, dtype=np.int64)
        np.cumsum(np.bincount(t, minlength=T), out=start[1:])
        state_type = np.int32 if (K + 1) * K < np.iinfo(np.int32).max else np.int64
        source, target = (i * K + j).astype(state_type), (j * K + k).astype(state_type)
        return cls(used, empty, masks, start, source, target, position[flat].astype(index_type))

    def take(self, index) -> CandidateEdges:
        """The lattice of the tokens ``index`` (integers, in the order given; repeats allowed)."""
        index = np.arange(self.shape[0])[index]
        counts = np.diff(self.start)[index]
        start = np.zeros(index.size + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        picks = np.repeat(self.start[index] - start[:-1], counts) + np.arange(start[-1])
        filled = tuple(mask[index] for mask in self.filled)
        return CandidateEdges(self.used, self.empty, filled, start, self.source[picks], self.target[picks], self.triple[picks])

    def _tokens(self) -> np.ndarray:
        """The token of every listed edge (E,)."""
        return np.repeat(np.arange(self.shape[0]), np.diff(self.start))

    @functools.cached_property
    def listed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(start (T + 1,): token t's edges are ``start[t]:start[t + 1]``; then per edge (E,): its
        source ``t * S + i * K + j`` and target ``t * S + j * K + k`` as flat indices into
        (T, S) messages, and its position in ``used``), for the edges between filled slots,
        ordered by target so that the edges into one state are consecutive."""
        base = self._tokens() * (self.shape[1] * self.shape[2])
        return self.start, base + self.source, base + self.target, self.triple

    @functools.cached_property
    def edges(self) -> np.ndarray:
        """(T, K + 1, K, K) [t, i, j, k]: the position in ``used`` of the edge from state (i, j)
        of token t - 1 into state (j, k) of token t (the empty-slot entry where a slot is empty)."""
        K = self.shape[2]
        edges = np.full(self.shape, max(self.empty, 0), dtype=self.triple.dtype)
        i, j = np.divmod(self.source, K)
        edges[self._tokens(), i, j, self.target % K] = self.triple
        return edges


class CandidateSecondOrderTransitions:
    """A second-order chain over each token's candidate labels (a candidate lattice), run by the same
    recursions: the states of a token are pairs of *slots* (slot i of the previous token, slot j of
    this one), S = (K + 1) * K of them, slot K of the previous token meaning "before the sequence".

    Per token (in the order of the emissions; :meth:`take` gathers it as emissions are gathered):
    ``labels`` (T, K) the label in each slot (-1: an empty slot), ``before`` (T, K) the previous
    token's (all -1 at a first token) and ``before2`` (T, K + 1) the labels that can precede the
    previous token's slots: the slots of the token two back then -1 (from the third token on),
    -1 ... -1 then L (the second token: its previous state is (before the sequence, y_0)), all -1
    (a first token). ``scores`` (L + 1, L, L) as :class:`SecondOrderTransitions`'. The table of the
    edges into a token, (K + 1, K, K) gathered from ``scores``, differs from token to token, so the
    operator is bound to the rows of one step by ``at``; expected counts come back as (L + 1, L, L)
    triples of labels. Work per token is O(K^3) instead of O(L^3)."""

    def __init__(
        self,
        scores: np.ndarray,
        labels: np.ndarray,
        before: np.ndarray,
        before2: np.ndarray,
        index: CandidateEdges | Callable[[], CandidateEdges] | None = None,
    ) -> None:
        self.scores = np.asarray(scores, dtype=np.float64)
        self.labels, self.before, self.before2 = labels, before, before2
        self.n_labels = self.scores.shape[1]
        self.n_slots = K = labels.shape[1]
        if before.shape != labels.shape or before2.shape != (labels.shape[0], K + 1):
            raise ValueError(f"slot labels of shapes {labels.shape}, {before.shape}, {before2.shape} do not agree")
        self.n_states = (K + 1) * K
        self.shape = self.scores.shape
        self._index = index

    @functools.cached_property
    def index(self) -> CandidateEdges:
        """The lattice's edges (:class:`CandidateEdges`), made or taken from the given ``index`` (or its
        callable) when first needed: Viterbi runs over the slots without them."""
        if self._index is None:
            return CandidateEdges.of(self.labels, self.before, self.before2, self.n_labels)
        return self._index() if callable(self._index) else self._index

    def take(self, index: np.ndarray) -> CandidateSecondOrderTransitions:
        return CandidateSecondOrderTransitions(
            self.scores, self.labels[index], self.before[index], self.before2[index], self.index.take(index)
        )

    def state_emissions(self, emissions: np.ndarray) -> np.ndarray:
        """Per-slot (T, K) values as per-state (T, S): state (i, j) emits as slot j."""
        return np.tile(emissions, (1, self.n_slots + 1))

    def labels_of_states(self, states: np.ndarray) -> np.ndarray:
        """The slot each state carries (its label: ``labels[t, slot]``)."""
        return np.asarray(states) % self.n_slots

    def edge_scores(self, previous: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Score of (i, j) -> (j', k) into every token (previous, states (T,), one per token)."""
        K = self.n_slots
        i, j = np.divmod(np.asarray(previous), K)
        middle, k = np.divmod(np.asarray(states), K)
        inner = (middle == j) & (middle < K) & (np.asarray(previous) >= 0) & (np.asarray(states) >= 0)
        tokens = np.arange(self.labels.shape[0])
        table = np.append(self.scores.ravel(), -np.inf)[self.index.used]
        i, j, k = (np.where(inner, v, 0) for v in (i, j, k))
        return np.where(inner, table[self.index.edges[tokens, i, j, k]], -np.inf)

    def _tokens(self, tokens) -> np.ndarray:
        return np.arange(self.labels.shape[0]) if tokens is None else np.asarray(tokens)

    def labels_at(self, states: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        states = np.asarray(states)
        labels = self.labels[self._tokens(tokens), np.maximum(states, 0) % self.n_slots]
        return np.where(states >= 0, labels, -1)

    def label_marginals(self, marginals: np.ndarray, n_labels: int, reduce=np.add) -> np.ndarray:
        K = self.n_slots
        slots = reduce.reduce(marginals.reshape(marginals.shape[0], K + 1, K), axis=1)
        rows, j = np.nonzero(self.labels >= 0)
        out = np.zeros((marginals.shape[0], n_labels))
        out[rows, self.labels[rows, j] % n_labels] = slots[rows, j]
        return out

    def label_mask(self, allowed: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
        labels = self.labels[self._tokens(tokens)]
        slots = (labels >= 0) & np.take_along_axis(np.asarray(allowed, dtype=bool), np.maximum(labels, 0), axis=1)
        return np.tile(slots, (1, self.n_slots + 1))

    def states_of_labels(self, labels: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The state path (T,) of the labelling ``labels`` (T,) (``first`` (T,): the token opens
        its sequence); -1 at a token whose label, or its predecessor's, is not a candidate."""
        K = self.n_slots
        found = self.labels == np.asarray(labels)[:, None]
        slot = np.where(found.any(axis=1), found.argmax(axis=1), -1)
        previous = np.where(first, K, np.roll(slot, 1))
        return np.where((slot >= 0) & (previous >= 0), previous * K + slot, -1)

    def listed_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The edges between filled slots token by token: (start (T + 1,), source state (E,) of
        the previous token, target state (E,) of this one, log score (E,)), ordered by target,
        then source (see :class:`CandidateEdges`)."""
        index = self.index
        return index.start, index.source, index.target, np.append(self.scores.ravel(), -np.inf)[index.used][index.triple]

    def edge_table(self) -> np.ndarray:
        """Log scores (T, K + 1, K, K) of the edges into every token, -inf where a slot is empty."""
        return np.append(self.scores.ravel(), -np.inf)[self.index.used][self.index.edges]

    def lift(self, semiring) -> tuple[np.ndarray, _LiftedCandidates]:
        # each state takes out the best of the edges that actually enter it at its token: a bound
        # shared by all first labels a of a pair (b, c) could be set by an a that is no candidate
        # two tokens back and flush every edge that is there, in both passes alike
        T, K = self.labels.shape[0], self.n_slots
        scores = np.append(self.scores.ravel(), -np.inf)[self.index.used]  # (U,)
        _, _, target, triple = self.index.listed
        edge_scores = scores[triple]
        column_top = np.zeros(T * self.n_states)
        if edge_scores.size:
            first, top = _max_by_run(edge_scores, target)
            column_top[target[first]] = top
        column_top = column_top.reshape(T, self.n_states)
        top = column_top[:, : K * K].reshape(T, K, K)
        edge_weights = semiring.weights(edge_scores - column_top.ravel()[target])
        return column_top, _LiftedCandidates(scores, top, edge_weights, self.index, None, semiring, self.shape)


class _LiftedCandidates:
    """:class:`CandidateSecondOrderTransitions` bound to a semiring: ``scores`` (U,) the log scores of
    the lattice's used triples (see :class:`CandidateEdges`), ``top`` (T, K, K) [t, j, k] what the
    lift took out of the edges into state (j, k) of token t, ``edge_weights`` (E,) the lifted
    weights of the listed edges, ``rows`` the packed rows it holds (None: all; ``at`` picks a
    step's) and ``values`` (rows, K + 1, K, K, *V) [row, i, j, k] their lifted edge tables,
    made when first needed. Expected counts are summed per used triple (``total_shape`` (U,))
    and expanded to the (L + 1, L, L) table once (:meth:`expand`).

    In the scaled semiring (training), a step of consecutive rows runs forward, backward and
    counts over the listed edges between filled slots only: a token with c candidates after
    tokens with a and b has a * b * c edges, where the padded tables hold (K + 1) * K * K. In log
    space (the log-space fallback, entropy) forward does too; constrained windows and tagging
    without counts run in the compiled kernels of :mod:`crf._compiled`. (Viterbi over a candidate
    lattice runs in the compiled kernel of :func:`crf._compiled.viterbi`, over each token's slots.)"""

    def __init__(
        self,
        scores: np.ndarray,
        top: np.ndarray,
        edge_weights: np.ndarray,
        index: CandidateEdges,
        rows,
        semiring,
        count_shape: tuple[int, ...],
    ) -> None:
        self.scores, self.top, self.edge_weights = scores, top, edge_weights
        self.index, self.rows, self.semiring = index, rows, semiring
        self.count_shape = count_shape
        self.total_shape = (index.used.size,)
        self.edge_shape = index.shape[1:]
        self.n_slots = index.shape[2]
        self.listed = semiring is ScaledSemiring and isinstance(rows, slice)
        self.listed_forward = self.listed or (semiring is LogSemiring and isinstance(rows, slice))

    @functools.cached_property
    def values(self) -> np.ndarray:
        rows = slice(None) if self.rows is None else self.rows
        return self.semiring.weights(self.scores[self.index.edges[rows]] - self.top[rows][:, None])

    def at(self, rows) -> _LiftedCandidates:
        if self.rows is not None:
            raise ValueError("at() selects rows of the whole lattice's operator only")
        return _LiftedCandidates(self.scores, self.top, self.edge_weights, self.index, rows, self.semiring, self.count_shape)

    def expand(self, total: np.ndarray) -> np.ndarray:
        size = math.prod(self.count_shape)  # empty slots count into one place past the table, dropped
        out = np.zeros(size + 1)
        out[self.index.used] = total
        return out[:size].reshape(self.count_shape)

    def _step_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, target, weight) of this step's listed edges, sources and targets as flat
        indices into the step's (n, S) messages."""
        start, source, target, triple = self.index.listed
        first, stop = start[self.rows.start], start[self.rows.stop]
        base = self.rows.start * (self.n_slots + 1) * self.n_slots
        return source[first:stop] - base, target[first:stop] - base, self.edge_weights[first:stop]

    def _spread(self, index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
        """(n, S) sums of ``values`` by their flat index into (n, S) (scaled semiring)."""
        S = (self.n_slots + 1) * self.n_slots
        return np.bincount(index, weights=values, minlength=n * S).reshape(n, S)

    def _log_spread(self, target: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
        """(n, S) log-sum-exp of the log ``values`` by their flat target into (n, S); the edges
        into one state are consecutive (see :attr:`CandidateEdges.listed`)."""
        out = np.full(n * (self.n_slots + 1) * self.n_slots, -np.inf)
        if values.size:
            first, top = _max_by_run(values, target)
            sizes = np.diff(np.r_[first, values.size])
            with np.errstate(divide="ignore"):
                out[target[first]] = top + np.log(np.add.reduceat(np.exp(values - np.repeat(top, sizes)), first))
        return out.reshape(n, -1)

    def _padded(self, inner: np.ndarray) -> np.ndarray:
        """(n, K, K, *V) values of the states (j, k) as (n, S, *V); the before-start states get zero."""
        n, K = inner.shape[0], self.n_slots
        out = np.full((n, (K + 1) * K) + inner.shape[3:], self.semiring.zero, dtype=inner.dtype)
        out[:, : K * K] = inner.reshape((n, K * K) + inner.shape[3:])
        return out

    def _by_source(self, messages: np.ndarray) -> np.ndarray:
        n, K = messages.shape[0], self.n_slots
        return messages.reshape((n, K + 1, K) + messages.shape[2:])

    def forward(self, messages: np.ndarray) -> np.ndarray:
        if self.listed_forward:
            source, target, weight = self._step_edges()
            spread = self._spread if self.listed else self._log_spread
            return spread(target, self.semiring.times(messages.ravel()[source], weight), messages.shape[0])
        candidates = self.semiring.times(self._by_source(messages)[:, :, :, None], self.values)  # [n, i, j, k, *V]
        return self._padded(self.semiring.plus(candidates, axis=1))

    def backward(self, weighted: np.ndarray) -> np.ndarray:
        n, K = weighted.shape[0], self.n_slots
        if self.listed:
            source, target, weight = self._step_edges()
            return self._spread(source, weighted.ravel()[target] * weight, n)
        inner = weighted[:, : K * K].reshape(n, 1, K, K)
        return self.semiring.plus(self.semiring.times(self.values, inner), axis=3).reshape(n, (K + 1) * K)

    def pointers(self, messages: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        K, n = self.n_slots, messages.shape[0]
        size = math.prod(messages.shape[2:])
        state, rank = np.divmod(chosen, size)
        inner = state < K * K
        j, k = np.divmod(np.where(inner, state, 0), K)
        sources = np.arange(K + 1) * K + j[..., None]  # [n, p, i]: the states (i, j) entering (j, k)
        previous = np.take_along_axis(messages[:, None], sources.reshape(sources.shape + (1,) * (messages.ndim - 2)), axis=2)
        weights = self.values[np.arange(n)[:, None], :, j, k]  # [n, p, i]
        a, r = np.divmod(_pick(self.semiring, self.semiring.times(previous, weights), rank), size)
        return np.where(inner, (a * K + j) * size + r, 0)

    def counts(self, previous: np.ndarray, following: np.ndarray) -> np.ndarray:
        n, K = previous.shape[0], self.n_slots
        if self.listed:
            source, target, weight = self._step_edges()
            start, _, _, triple = self.index.listed
            joint = previous.ravel()[source] * weight * following.ravel()[target]
            return np.bincount(
                triple[start[self.rows.start] : start[self.rows.stop]], weights=joint, minlength=self.index.used.size
            )
        joint = self.semiring.times(
            self.semiring.times(self._by_source(previous)[:, :, :, None], self.values), following[:, : K * K].reshape(n, 1, K, K)
        )
        return np.bincount(
            self.index.edges[self.rows].ravel() if self.rows is not None else self.index.edges.ravel(),
            weights=self.semiring.to_prob(joint).ravel(),
            minlength=self.index.used.size,
        )

    def source(self, previous: np.ndarray) -> np.ndarray:
        return self._by_source(previous)[:, :, :, None]

    def target(self, following: np.ndarray) -> np.ndarray:
        n, K = following.shape[0], self.n_slots
        return following[:, : K * K].reshape(n, 1, K, K)

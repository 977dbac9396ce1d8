"""The CRF's label-dependent weights for each model order, and how they become chain scores.

A CRF's parameters are its state weights (A, L) followed by a *tail* of weights on label
n-grams. This module says, for each order, what the tail holds, how it turns into the scores the
recursions of :mod:`crf._chain` take (a transition operator, per-state start and end scores), how
per-label arrays become per-state arrays, and how the expected and observed counts of the tail's
weights are gathered. The objective, the optimisers and the estimator go through these methods
only, so they run either order without knowing which.

First order (:class:`FirstOrderChain`): states are labels; the tail is ``transitions`` (L, L)
[previous, current], ``start`` (L,) and ``end`` (L,).

Second order (:class:`SecondOrderChain`): states are label pairs (y_{t-1}, y_t) as in
:class:`crf._transitions.SecondOrderTransitions` (state ``a * L + b``; ``a = L`` means "before the
sequence", the state of every first token). The tail is the first-order tail followed by

- ``trigrams`` (L + 1, L, L): the weight of label c after labels a, b; ``trigrams[L, b, c]`` is the
  second-order start, the weight of a sequence opening with (b, c);
- ``pair_end`` (L + 1, L): the weight of a sequence closing with (a, b); ``pair_end[L, b]`` is the
  weight of a one-token sequence labelled b.

The chain's scores are then ``table[a, b, c] = transitions[b, c] + trigrams[a, b, c]``,
``start[(L, b)] = start[b]`` (-inf for the states a < L, which cannot open a sequence) and
``end[(a, b)] = end[b] + pair_end[a, b]``; a state emits as its current label. The expected counts
come back from the operator as (L + 1, L, L) triples: the trigram gradient as they are, the bigram
gradient summed over their first axis; start and end counts from the pair-state marginals of the
first and last tokens.
"""

from __future__ import annotations

import functools

import numpy as np

from ._layout import Layout, positions_within
from ._transitions import CandidateEdges, CandidateSecondOrderTransitions, SecondOrderTransitions

#: above this many labels, fitting exact second order (order 2 without ``candidate_threshold``) warns
#: of its cost first: measured per L-BFGS iteration on one thread (synthetic data, 6,000 tokens),
#: exact second order costs 4.6x first order's time at 10 labels, 12x at 22 and 19x at 49
EXACT_SECOND_ORDER_LABELS = 20
#: seconds per token and per L^3 of one exact second-order iteration (one thread; measured 6.3e-9
#: at 49 labels, more at fewer labels, where the L^3 work weighs less against the rest)
EXACT_SECOND_ORDER_SECONDS = 6e-9

# the fitted attribute of a crf.CRF that holds each block of the tail of label n-gram weights
TAIL_ATTRIBUTES = {
    "transitions": "transitions_",
    "start": "start_weights_",
    "end": "end_weights_",
    "trigrams": "trigram_weights_",
    "pair_end": "pair_end_weights_",
}


def exact_second_order_cost(n_labels: int, n_tokens: int) -> str | None:
    """A warning for an exact second-order fit over more than :data:`EXACT_SECOND_ORDER_LABELS`
    labels: its expected seconds per iteration on one thread (``n_tokens`` tokens, O(L^3) per
    token) and the alternative over candidate labels; None for fewer labels."""
    if n_labels <= EXACT_SECOND_ORDER_LABELS:
        return None
    seconds = EXACT_SECOND_ORDER_SECONDS * n_tokens * n_labels**3
    return (
        f"order=2 without candidate_threshold is exact second order over {n_labels} labels, O(L^3) per token: "
        f"expect about {seconds:,.0f} s per iteration on one thread for {n_tokens:,} tokens (10-20x first order's "
        "at 20-50 labels); candidate_threshold=0.01 trains over each token's likely labels only"
    )


def _boundaries(offsets: np.ndarray, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(first (T,) bool: the token opens its sequence, last token index of every sequence (N,))."""
    offsets = np.asarray(offsets, dtype=np.int64)
    first = np.zeros(n_tokens, dtype=bool)
    first[offsets[:-1][offsets[:-1] < n_tokens]] = True
    nonempty = offsets[1:] > offsets[:-1]
    return first, (offsets[1:] - 1)[nonempty]


class ChainStructure:
    """The tail structure of a model of any order: what the tail holds, how it becomes the
    chain's scores, and how its counts are gathered. This base is the first-order structure
    (transitions (L, L), start (L,), end (L,)); :class:`SecondOrderChain` extends it."""

    order = 1

    def __init__(self, n_labels: int) -> None:
        self.n_labels = L = int(n_labels)
        self.n_states = L
        self.blocks = {"transitions": (L, L), "start": (L,), "end": (L,)}
        self.tail_size = L * L + 2 * L

    def split(self, tail: np.ndarray) -> dict[str, np.ndarray]:
        """The tail's blocks by name (views of ``tail`` (tail_size,)), shaped as in ``blocks``."""
        out, position = {}, 0
        for name, shape in self.blocks.items():
            size = int(np.prod(shape))
            out[name] = tail[position : position + size].reshape(shape)
            position += size
        return out

    def scores(self, tail: np.ndarray) -> tuple:
        """(transitions or operator, start (S,), end (S,)): what :mod:`crf._chain` takes."""
        blocks = self.split(tail)
        return blocks["transitions"], blocks["start"], blocks["end"]

    @staticmethod
    def state_emissions(emissions: np.ndarray) -> np.ndarray:
        """Per-label (T, L) values as per-state (T, S) values (a state emits as its label)."""
        return emissions

    @staticmethod
    def label_marginals(marginals: np.ndarray) -> np.ndarray:
        """Per-state marginals (T, S) summed to per-label marginals (T, L)."""
        return marginals

    @staticmethod
    def label_max_marginals(marginals: np.ndarray) -> np.ndarray:
        """Per-state max-marginals (T, S) as per-label max-marginals (T, L) (max over states)."""
        return marginals

    def labels_of_states(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states)

    def states_of_labels(self, labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """The state path (T,) of the labelling ``labels`` (T,) of sequences at ``offsets``."""
        return np.asarray(labels)

    def tail_counts(self, transition_counts: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The tail's expected counts (tail_size,) from the operator's expected edge counts (its
        table shape) and the state marginals summed over first tokens (S,) and last tokens (S,)."""
        return np.concatenate([np.ravel(transition_counts), first, last])

    def observed_tail(self, offsets: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Counts (tail_size,) of every tail weight in the labelling ``labels`` (T,) (-1:
        unknown) of the sequences at ``offsets``; n-grams with an unknown label count nothing."""
        L = self.n_labels
        labels = np.asarray(labels, dtype=np.int64)
        first, last = _boundaries(offsets, labels.size)
        edges = np.flatnonzero(~first)
        edges = edges[(labels[edges - 1] >= 0) & (labels[edges] >= 0)]
        openers, closers = np.flatnonzero(first), last
        openers, closers = openers[labels[openers] >= 0], closers[labels[closers] >= 0]
        return np.concatenate(
            [
                np.bincount(labels[edges - 1] * L + labels[edges], minlength=L * L),
                np.bincount(labels[openers], minlength=L),
                np.bincount(labels[closers], minlength=L),
            ]
        ).astype(np.float64)

    def trainable(self, offsets, labels, min_freq: float, boundary: bool, all_transitions: bool) -> np.ndarray:
        """Which tail weights are features (tail_size,): as CRFsuite chooses transitions, the
        n-grams seen (or, with ``all_transitions``, every n-gram) that occur at least ``min_freq``
        times; the boundary weights (start, end and their second-order forms) when ``boundary``."""
        counts = self.split(self.observed_tail(offsets, labels))
        return np.concatenate(
            [
                ((np.ravel(counts[name]) >= 1) | all_transitions) & (np.ravel(counts[name]) >= min_freq)
                if name in ("transitions", "trigrams")
                else np.full(counts[name].size, bool(boundary))
                for name in self.blocks
            ]
        )

    def cells_per_token(self, slots: int | None = None) -> int:
        """Working values per token of the chain over :meth:`lattice` (block sizes follow it),
        for tokens of at most ``slots`` candidate labels (None: full)."""
        return self.n_states

    def lattice(self, layout: Layout, candidates: np.ndarray | None = None) -> Lattice:
        """The states a block of sequences (packed by ``layout``) runs over: all of this order's,
        the labels outside ``candidates`` (T, L) (packed, or None) at -inf."""
        return Lattice(self, layout, candidates)

    def lattice_in_order(self, offsets: np.ndarray, candidates: np.ndarray | None = None) -> Lattice:
        """The states sequences at ``offsets`` (tokens in input order) run over, for tagging."""
        return Lattice(self, None, candidates)

    def path_scores(self, tail: np.ndarray, offsets: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The tail's part of score(y) of every labelling (N,): counts per sequence dotted with
        the tail, without building per-sequence count vectors."""
        offsets = np.asarray(offsets, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.int64)
        transitions, start, end = self.scores(tail)
        from ._chain import sequence_scores

        zeros = np.zeros((labels.size, self.n_states))
        return sequence_scores(zeros, transitions, start, end, offsets, self.states_of_labels(labels, offsets))


class FirstOrderChain(ChainStructure):
    """The first-order tail: transitions (L, L), start (L,), end (L,) (the base structure as it is)."""


class SecondOrderChain(ChainStructure):
    """The second-order tail: the first-order one, then trigrams (L + 1, L, L) and pair_end (L + 1, L)."""

    order = 2

    def __init__(self, n_labels: int) -> None:
        super().__init__(n_labels)
        L = self.n_labels
        self.n_states = (L + 1) * L
        self.blocks.update({"trigrams": (L + 1, L, L), "pair_end": (L + 1, L)})
        self.tail_size += (L + 1) * L * L + (L + 1) * L

    def scores(self, tail: np.ndarray) -> tuple:
        L, blocks = self.n_labels, self.split(tail)
        operator = SecondOrderTransitions(blocks["transitions"][None] + blocks["trigrams"])
        start = np.full((L + 1, L), -np.inf)
        start[L] = blocks["start"]
        end = blocks["end"][None] + blocks["pair_end"]
        return operator, start.ravel(), end.ravel()

    def state_emissions(self, emissions: np.ndarray) -> np.ndarray:
        return np.tile(emissions, (1, self.n_labels + 1))

    def cells_per_token(self, slots: int | None = None) -> int:
        if slots is None:
            return self.n_states
        K = max(1, slots)
        # the (T, S) arrays of S = (K + 1) K states (emissions, messages, marginals), the
        # per-token tables ((K + 1) K^2 values) weighing about as much as those together
        return 2 * (K + 1) * K

    def lattice(self, layout: Layout, candidates: np.ndarray | None = None) -> Lattice:
        """All label pairs, or with ``candidates`` (T, L) a :class:`CandidateLattice` over them."""
        return Lattice(self, layout, None) if candidates is None else CandidateLattice.packed(self, layout, candidates)

    def lattice_in_order(self, offsets: np.ndarray, candidates: np.ndarray | None = None) -> Lattice:
        return Lattice(self, None, None) if candidates is None else CandidateLattice.in_order(self, offsets, candidates)

    def label_marginals(self, marginals: np.ndarray) -> np.ndarray:
        return marginals.reshape(marginals.shape[0], self.n_labels + 1, self.n_labels).sum(axis=1)

    def label_max_marginals(self, marginals: np.ndarray) -> np.ndarray:
        return marginals.reshape(marginals.shape[0], self.n_labels + 1, self.n_labels).max(axis=1)

    def labels_of_states(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states) % self.n_labels

    def states_of_labels(self, labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.int64)
        first, _ = _boundaries(offsets, labels.size)
        previous = np.where(first, self.n_labels, np.roll(labels, 1))
        return previous * self.n_labels + labels

    def tail_counts(self, transition_counts: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        L = self.n_labels
        first, last = first.reshape(L + 1, L), last.reshape(L + 1, L)
        bigram = transition_counts.sum(axis=0)
        return np.concatenate([bigram.ravel(), first.sum(axis=0), last.sum(axis=0), np.ravel(transition_counts), last.ravel()])

    def observed_tail(self, offsets: np.ndarray, labels: np.ndarray) -> np.ndarray:
        L = self.n_labels
        labels = np.asarray(labels, dtype=np.int64)
        first, last = _boundaries(offsets, labels.size)
        # the label before each token (L before a first token): trigrams (a, b, c) end at tokens t >= 1
        before = np.where(first, L, np.roll(labels, 1))
        edges = np.flatnonzero(~first)
        two_before = before[edges - 1]
        known = (two_before >= 0) & (labels[edges - 1] >= 0) & (labels[edges] >= 0)
        edges, two_before = edges[known], two_before[known]
        closers = last[(labels[last] >= 0) & (before[last] >= 0)]
        tail = [
            super().observed_tail(offsets, labels),
            np.bincount((two_before * L + labels[edges - 1]) * L + labels[edges], minlength=(L + 1) * L * L),
            np.bincount(before[closers] * L + labels[closers], minlength=(L + 1) * L),
        ]
        return np.concatenate(tail).astype(np.float64)


class Lattice:
    """The chain a block of packed sequences runs over, and how its results become the tail's:
    the structure's own states, with the labels outside ``candidates`` (T, L) at -inf."""

    def __init__(self, structure: ChainStructure, layout: Layout, candidates: np.ndarray | None) -> None:
        self.structure, self.layout, self.candidates = structure, layout, candidates

    def emissions(self, emissions: np.ndarray, tail: np.ndarray) -> np.ndarray:
        """Per-state emissions (T, S) of the per-label ones (T, L) (packed)."""
        masked = emissions if self.candidates is None else np.where(self.candidates, emissions, -np.inf)
        return self.structure.state_emissions(masked)

    def state_mask(self, allowed: np.ndarray) -> np.ndarray:
        """Per-label masks (T, L) as per-state masks (T, S)."""
        return self.structure.state_emissions(allowed)

    def scores(self, tail: np.ndarray) -> tuple:
        return self.structure.scores(tail)

    def label_marginals(self, marginals: np.ndarray) -> np.ndarray:
        return self.structure.label_marginals(marginals)

    def boundary_sums(self, marginals: np.ndarray) -> np.ndarray:
        """The state marginals (T, S) summed over the first and over the last tokens, in the
        structure's states (2, S_structure): what :meth:`ChainStructure.tail_counts` takes."""
        return np.stack([marginals[self.layout.first_rows()].sum(axis=0), marginals[self.layout.last_rows()].sum(axis=0)])


class CandidateLattice(Lattice):
    """A second-order chain over each token's candidate labels only (see
    :class:`crf._transitions.CandidateSecondOrderTransitions`): K slots per token (K: the most
    candidates a token has), O(K^3) per token. The start and end weights of every (previous,
    current) pair are folded into the emissions of first and last tokens. Tokens in packed order
    (:meth:`packed`, the objective's blocks) or in input order (:meth:`in_order`, tagging)."""

    def __init__(self, structure: SecondOrderChain, candidates: np.ndarray, previous: np.ndarray, last: np.ndarray) -> None:
        """``candidates`` (T, L); ``previous`` (T,) the token before each (-1: it opens its
        sequence); ``last`` the last token of every sequence."""
        super().__init__(structure, None, candidates)
        L, T = structure.n_labels, candidates.shape[0]
        counts = np.count_nonzero(candidates, axis=1)
        self.n_slots = K = max(1, int(counts.max())) if T else 1
        rows, columns = np.nonzero(candidates)  # candidate labels first, in label order, then -1
        labels = np.full((T, K), -1, dtype=np.int64)
        labels[rows, positions_within(counts)] = columns
        first = previous < 0
        before = np.where(first[:, None], -1, labels[np.maximum(previous, 0)])
        before2 = np.full((T, K + 1), -1, dtype=np.int64)
        second = ~first & first[np.maximum(previous, 0)]
        before2[second, K] = L
        later = ~first & ~second
        before2[later, :K] = before[previous[later]]
        self.labels, self.before, self.before2 = labels, before, before2
        # the labels before each slot of the previous token, "before the sequence" (L) last: the pair (a, b) a last token closes
        self.closing = np.concatenate([before, np.where(first, L, -1)[:, None]], axis=1)  # (T, K + 1)
        self.first, self.last = first, np.asarray(last, dtype=np.int64)

    @functools.cached_property
    def index(self) -> CandidateEdges:
        """The lattice's edges (made when a recursion first needs them: Viterbi runs over the slots)."""
        return CandidateEdges.of(self.labels, self.before, self.before2, self.structure.n_labels)

    @classmethod
    def packed(cls, structure: SecondOrderChain, layout: Layout, candidates: np.ndarray) -> CandidateLattice:
        """Over tokens in ``layout``'s packed order (``candidates`` packed too)."""
        step = np.repeat(np.arange(layout.n_steps), layout.n_active)
        previous = np.arange(step.size) - layout.step_start[step] + layout.step_start[np.maximum(step - 1, 0)]
        return cls(structure, candidates, np.where(step > 0, previous, -1), layout.last_rows())

    @classmethod
    def in_order(cls, structure: SecondOrderChain, offsets: np.ndarray, candidates: np.ndarray) -> CandidateLattice:
        """Over tokens in input order, sequences at ``offsets`` (N + 1,) (none empty)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        previous = np.arange(candidates.shape[0]) - 1
        previous[offsets[:-1][offsets[:-1] < candidates.shape[0]]] = -1
        return cls(structure, candidates, previous, offsets[1:] - 1)

    def emissions(self, emissions: np.ndarray, tail: np.ndarray) -> np.ndarray:
        blocks, K = self.structure.split(tail), self.n_slots
        valid = self.labels >= 0
        slots = np.where(valid, np.take_along_axis(emissions, np.maximum(self.labels, 0), axis=1), -np.inf)  # (T, K)
        slots[self.first] += np.where(valid[self.first], blocks["start"][np.maximum(self.labels[self.first], 0)], 0.0)
        states = np.tile(slots, (1, K + 1))  # state (i, j) emits as slot j
        a, b = self.closing[self.last][:, :, None], self.labels[self.last][:, None, :]  # (N, K + 1, 1), (N, 1, K)
        closing = blocks["end"][np.maximum(b, 0)] + blocks["pair_end"][np.maximum(a, 0), np.maximum(b, 0)]
        states[self.last] += np.where((a >= 0) & (b >= 0), closing, -np.inf).reshape(self.last.size, (K + 1) * K)
        return states

    def state_mask(self, allowed: np.ndarray) -> np.ndarray:
        slots = (self.labels >= 0) & np.take_along_axis(allowed, np.maximum(self.labels, 0), axis=1)
        return np.tile(slots, (1, self.n_slots + 1))

    def scores(self, tail: np.ndarray) -> tuple:
        blocks, K = self.structure.split(tail), self.n_slots
        operator = CandidateSecondOrderTransitions(
            blocks["transitions"][None] + blocks["trigrams"], self.labels, self.before, self.before2, lambda: self.index
        )
        start = np.full((K + 1, K), -np.inf)
        start[K] = 0.0  # the start weights are in the first tokens' emissions
        return operator, start.ravel(), np.zeros((K + 1) * K)

    def label_marginals(self, marginals: np.ndarray) -> np.ndarray:
        K = self.n_slots
        slots = marginals.reshape(-1, K + 1, K).sum(axis=1)
        rows, j = np.nonzero(self.labels >= 0)
        out = np.zeros((marginals.shape[0], self.structure.n_labels))
        out[rows, self.labels[rows, j]] = slots[rows, j]
        return out

    def boundary_sums(self, marginals: np.ndarray) -> np.ndarray:
        K, L = self.n_slots, self.structure.n_labels
        S = (L + 1) * L
        first = np.flatnonzero(self.first)
        opening = marginals[first].reshape(-1, K + 1, K)[:, K]  # states (before the sequence, j)
        b = self.labels[first]
        start = np.bincount((L * L + b)[b >= 0], weights=opening[b >= 0], minlength=S)
        closing = marginals[self.last].reshape(-1, K + 1, K)
        a, b = np.broadcast_arrays(self.closing[self.last][:, :, None], self.labels[self.last][:, None, :])
        valid = (a >= 0) & (b >= 0)
        end = np.bincount((a * L + b)[valid], weights=closing[valid], minlength=S)
        return np.stack([start, end])


def chain_structure(order: int, n_labels: int) -> ChainStructure:
    """The tail structure of a CRF of ``order`` (1 or 2) over ``n_labels`` labels."""
    if order == 1:
        return FirstOrderChain(n_labels)
    if order == 2:
        return SecondOrderChain(n_labels)
    raise ValueError(f"order must be 1 or 2, got {order!r}")

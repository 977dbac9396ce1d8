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

import numpy as np

from ._transitions import SecondOrderTransitions


def _boundaries(offsets: np.ndarray, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(first (T,) bool: the token opens its sequence, last token index of every sequence (N,))."""
    offsets = np.asarray(offsets, dtype=np.int64)
    first = np.zeros(n_tokens, dtype=bool)
    first[offsets[:-1][offsets[:-1] < n_tokens]] = True
    nonempty = offsets[1:] > offsets[:-1]
    return first, (offsets[1:] - 1)[nonempty]


class FirstOrderChain:
    """The first-order tail: transitions (L, L), start (L,), end (L,)."""

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
        """Which tail weights are features (tail_size,): the n-grams seen at least
        ``max(min_freq, 1)`` times (all of them with ``all_transitions``); the boundary weights
        (start, end and their second-order forms) when ``boundary``."""
        counts = self.split(self.observed_tail(offsets, labels))
        return np.concatenate(
            [
                (np.ravel(counts[name]) >= max(min_freq, 1)) | all_transitions
                if name in ("transitions", "trigrams")
                else np.full(counts[name].size, bool(boundary))
                for name in self.blocks
            ]
        )

    def path_scores(self, tail: np.ndarray, offsets: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The tail's part of score(y) of every labelling (N,): counts per sequence dotted with
        the tail, without building per-sequence count vectors."""
        offsets = np.asarray(offsets, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.int64)
        transitions, start, end = self.scores(tail)
        from ._chain import sequence_scores

        zeros = np.zeros((labels.size, self.n_states))
        return sequence_scores(zeros, transitions, start, end, offsets, self.states_of_labels(labels, offsets))


class SecondOrderChain(FirstOrderChain):
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


def chain_structure(order: int, n_labels: int) -> FirstOrderChain:
    """The tail structure of a CRF of ``order`` (1 or 2) over ``n_labels`` labels."""
    if order == 1:
        return FirstOrderChain(n_labels)
    if order == 2:
        return SecondOrderChain(n_labels)
    raise ValueError(f"order must be 1 or 2, got {order!r}")

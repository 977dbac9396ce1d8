"""CRFsuite's online trainers: averaged perceptron (``ap``), passive-aggressive (``pa``, types 0,
1 and 2) and adaptive regularisation of weights (``arow``).

Every epoch visits the training sequences in a new random order. For each sequence the current
weights label it by Viterbi (:func:`crf._chain.viterbi`); when some labels are wrong, the
difference of the feature vectors of the gold and the predicted labelling,
``delta = F(x, y) - F(x, y_hat)``, drives an update of the weights. ``delta`` is built with array
operations: state features from the attribute entries of the wrong tokens only (the others
cancel), transitions and start/end weights from label-pair counts; duplicates are summed with
one ``np.unique``. Only weights that are features of the model are updated (the pairs seen in
training, unless ``all_possible_states``/``all_possible_transitions``). The loop over sequences is
inherent to online learning; Viterbi runs on a block of sequences at a time (see
:func:`_visit_block`), which gives the same result as one call per sequence.

All weights live in one flat vector: the (A, L) state grid row-major, then transitions (L*L),
start (L) and end (L), so that an update is one fancy-indexed operation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import _chain as chain
from ._objective import ParameterLayout
from ._optimize import IterationInfo, StoppingRule, TrainingResult
from .batch import token_rows


@dataclass
class _Update:
    """One sequence's update: the features ``keys`` (flat indices) whose counts differ between
    gold and prediction, the differences ``delta``, ``margin`` = score(prediction) - score(gold)
    >= 0, ``errors`` (wrong labels) and ``length``."""

    keys: np.ndarray
    delta: np.ndarray
    margin: float
    errors: int
    length: int


class Perceptron:
    """Averaged perceptron: w += delta on every mistake; the average of w over all steps is
    returned. Loss: the fraction of wrong labels, summed over sequences."""

    def __init__(self) -> None:
        self.w = self.ws = None
        self.steps = 1

    def start(self, size: int) -> None:
        self.w, self.ws, self.steps = np.zeros(size), np.zeros(size), 1

    def update(self, u: _Update) -> float:
        self.w[u.keys] += u.delta
        self.ws[u.keys] += self.steps * u.delta
        return u.errors / u.length

    def tick(self) -> None:
        self.steps += 1

    def result(self) -> np.ndarray:
        return self.w - self.ws / self.steps


class PassiveAggressive(Perceptron):
    """Passive-aggressive (Crammer et al. 2006): w += tau * delta with ``cost = margin +
    sqrt(errors)`` (``error_sensitive``) or ``margin + 1``, and tau = cost / ||delta||^2 (type 0),
    min(c, that) (type 1) or cost / (||delta||^2 + 1 / (2c)) (type 2). Averaged like the
    perceptron when ``averaging``. Loss: the summed cost."""

    def __init__(self, pa_type: int = 1, c: float = 1.0, error_sensitive: bool = True, averaging: bool = True) -> None:
        super().__init__()
        self.pa_type, self.c, self.error_sensitive, self.averaging = pa_type, c, error_sensitive, averaging

    def update(self, u: _Update) -> float:
        cost = u.margin + (np.sqrt(u.errors) if self.error_sensitive else 1.0)
        norm2 = float(u.delta @ u.delta)
        if norm2 == 0.0:  # no feature of the model tells gold and prediction apart
            return cost
        if self.pa_type == 0:
            tau = cost / norm2
        elif self.pa_type == 1:
            tau = min(self.c, cost / norm2)
        else:
            tau = cost / (norm2 + 0.5 / self.c)
        self.w[u.keys] += tau * u.delta
        self.ws[u.keys] += tau * self.steps * u.delta
        return cost

    def result(self) -> np.ndarray:
        return super().result() if self.averaging else self.w.copy()


class AROW:
    """Adaptive regularisation of weights (Crammer et al. 2009) with a diagonal covariance:
    ``cost = margin + errors``, alpha = cost / (gamma + sum(delta^2 cov)),
    mean += alpha cov delta, 1/cov += delta^2 / gamma. Loss: the summed cost."""

    def __init__(self, variance: float = 1.0, gamma: float = 1.0) -> None:
        self.variance, self.gamma = variance, gamma
        self.mean = self.cov = None

    def start(self, size: int) -> None:
        self.mean, self.cov = np.zeros(size), np.full(size, float(self.variance))

    def update(self, u: _Update) -> float:
        cost = u.margin + u.errors
        cov = self.cov[u.keys]
        squared = u.delta * u.delta
        alpha = cost / (self.gamma + float(squared @ cov))
        self.mean[u.keys] += alpha * cov * u.delta
        self.cov[u.keys] = 1.0 / (1.0 / cov + squared / self.gamma)
        return cost

    def tick(self) -> None:
        pass

    def result(self) -> np.ndarray:
        return self.mean.copy()


def update_rule(algorithm: str, pa_type=1, c=1.0, error_sensitive=True, averaging=True, variance=1.0, gamma=1.0):
    """The update rule of ``algorithm`` (``ap``, ``pa`` or ``arow``) with its parameters."""
    if algorithm == "ap":
        return Perceptron()
    if algorithm == "pa":
        return PassiveAggressive(pa_type, c, error_sensitive, averaging)
    if algorithm == "arow":
        return AROW(variance, gamma)
    raise ValueError(f"no online algorithm {algorithm!r}: use 'ap', 'pa' or 'arow'")


class _Features:
    """The model's features as a boolean mask over the flat weight vector, and the difference
    ``F(x, y) - F(x, y_hat)`` of one sequence."""

    def __init__(self, params: ParameterLayout, frozen: np.ndarray | None) -> None:
        A, L = params.n_attributes, params.n_labels
        self.A, self.L = A, L
        self.size = A * L + L * L + 2 * L
        self.is_feature = np.ones(self.size, dtype=bool)
        if params.feature_index is not None:
            self.is_feature[: A * L] = False
            self.is_feature[params.feature_index] = True
        if frozen is not None:
            self.is_feature[A * L - params.n_state + np.asarray(frozen, dtype=np.int64)] = False

    def views(self, w: np.ndarray):
        """(state (A, L), transitions (L, L), start (L,), end (L,)) views of the flat weights."""
        A, L = self.A, self.L
        n = A * L
        return w[:n].reshape(A, L), w[n : n + L * L].reshape(L, L), w[n + L * L : n + L * L + L], w[n + L * L + L :]

    def difference(self, X: sp.csr_matrix, gold: np.ndarray, predicted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, delta) of ``F(x, gold) - F(x, predicted)`` for one sequence, features only."""
        A, L = self.A, self.L
        token = np.repeat(np.arange(gold.size), np.diff(X.indptr))
        entries = np.flatnonzero(gold[token] != predicted[token])  # tokens labelled right cancel out
        token = token[entries]
        attributes = X.indices[entries].astype(np.int64) * L
        values = X.data[entries]
        base = A * L
        keys = np.concatenate(
            [
                attributes + gold[token],
                attributes + predicted[token],
                base + gold[:-1] * L + gold[1:],
                base + predicted[:-1] * L + predicted[1:],
                base + L * L + np.array([gold[0], predicted[0]]),
                base + L * L + L + np.array([gold[-1], predicted[-1]]),
            ]
        )
        n_edges = gold.size - 1
        signs = np.concatenate([values, -values, np.ones(n_edges), -np.ones(n_edges), [1.0, -1.0, 1.0, -1.0]])
        unique, inverse = np.unique(keys, return_inverse=True)
        delta = np.bincount(inverse, weights=signs, minlength=unique.size)
        keep = self.is_feature[unique] & (delta != 0.0)
        return unique[keep], delta[keep]


def train(
    X: sp.csr_matrix,
    offsets: np.ndarray,
    labels: np.ndarray,
    params: ParameterLayout,
    frozen: np.ndarray | None,
    rule,
    stopping: StoppingRule,
    seed: int | None = 0,
    callback: Callable[[IterationInfo], None] | None = None,
) -> TrainingResult:
    """Train with the online ``rule`` (see :func:`update_rule`) for ``stopping.max_iterations``
    epochs, or until an epoch's loss divided by the number of sequences is below
    ``stopping.epsilon``. ``frozen``: positions in ``params``' theta of weights that are not
    features (they stay 0)."""
    X = sp.csr_matrix(X, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    features = _Features(params, frozen)
    rule.start(features.size)
    n_sequences = offsets.size - 1
    rng = np.random.default_rng(seed)
    history: list[IterationInfo] = []
    began = time.perf_counter()
    reason = "max_iterations"
    block = 8
    while True:
        loss, order, position = 0.0, rng.permutation(n_sequences), 0
        while position < n_sequences:
            visited, sequence_loss = _visit_block(X, offsets, labels, order[position : position + block], rule, features)
            loss += sequence_loss
            position += visited
            block = min(2 * block, 256) if visited == block else visited  # about the run of right ones
        weights = rule.result()
        state, transitions, start, end = features.views(weights)
        theta = params.join(state, transitions, start, end)
        norm = float(np.linalg.norm(theta))
        info = IterationInfo(
            len(history) + 1, loss, float("nan"), int(np.count_nonzero(theta)), time.perf_counter() - began, theta, norm
        )
        history.append(info)
        if callback is not None:
            callback(info)
        info.theta = None  # seen by the callback; keeping every epoch's weights would cost memory
        if loss / n_sequences < stopping.epsilon:
            reason = "epsilon"
            break
        if stopping.max_iterations is not None and len(history) >= stopping.max_iterations:
            break
    return TrainingResult(theta, len(history), len(history) * n_sequences, reason, history)


def _current(rule) -> np.ndarray:
    return rule.mean if isinstance(rule, AROW) else rule.w


def _visit_block(X, offsets, labels, chosen: np.ndarray, rule, features: _Features) -> tuple[int, float]:
    """Label the sequences ``chosen`` with the current weights (one Viterbi call), then visit
    them in order up to the first wrong one, which updates the weights: the labellings after it
    are stale and are redone in the next block. Same result as one Viterbi call per sequence, at
    a fraction of the cost once most sequences come out right. Returns (visited, loss)."""
    state, transitions, start, end = features.views(_current(rule))
    rows = token_rows(offsets, chosen)
    lengths = offsets[chosen + 1] - offsets[chosen]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    emissions = np.asarray(X[rows] @ state)
    predicted, scores = chain.viterbi(emissions, transitions, start, end, lengths)
    gold_all = labels[rows]
    wrong = np.flatnonzero(np.add.reduceat(predicted != gold_all, bounds[:-1]))
    if not wrong.size:
        for _ in chosen:
            rule.tick()
        return chosen.size, 0.0
    j = int(wrong[0])
    for _ in range(j):
        rule.tick()
    a, b = bounds[j], bounds[j + 1]
    gold, guess, local = gold_all[a:b], predicted[a:b], emissions[a:b]
    gold_score = local[np.arange(gold.size), gold].sum() + transitions[gold[:-1], gold[1:]].sum() + start[gold[0]] + end[gold[-1]]
    first = offsets[chosen[j]]
    keys, delta = features.difference(X[first : first + gold.size], gold, guess)
    errors = int(np.count_nonzero(guess != gold))
    loss = rule.update(_Update(keys, delta, float(scores[j] - gold_score), errors, gold.size))
    rule.tick()
    return j + 1, loss

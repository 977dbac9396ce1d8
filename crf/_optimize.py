"""Trainers: L-BFGS (L2), OWL-QN (L1 and elastic net) and SGD with L2 (CRFsuite's ``l2sgd``,
with its learning-rate calibration). The online algorithms are in :mod:`crf._online`.

All minimise ``NLL(theta) + c1 * |theta|_1 + c2 * ||theta||^2`` (CRFsuite's c1, c2) and stop
like CRFsuite: after ``max_iterations``, when the relative improvement of the loss over the last
``period`` iterations falls below ``delta``, or when ``||g|| / max(1, ||theta||) < epsilon``.
Each iteration is reported to ``callback(IterationInfo)``.

L1 (c1 > 0) is trained orthant-wise, as CRFsuite does: the stopping rules then see the whole
objective (L1 term included) and the norm of OWL-QN's pseudo-gradient.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import _compiled
from . import _quasi_newton as quasi_newton
from ._objective import Objective, ParameterLayout
from .batch import token_rows


@dataclass
class IterationInfo:
    """One optimiser iteration (an epoch for SGD). ``theta`` is the optimiser's own buffer, valid
    during the callback only (later iterations write over it): copy it to keep it.

    What ``crf.CRF``'s ``callback`` receives. With dev data, every ``dev_every``-th one also
    carries ``dev_accuracy`` (percent) and ``dev_predictions`` (the dev label sequences).

    Parameters
    ----------
    iteration : int
        1-based number of the iteration (or epoch).
    loss : float
        The training objective after it: for lbfgs and l2sgd the negative log-likelihood plus
        ``c1 |w|_1 + c2 ||w||^2``; for ap, pa and arow the epoch's summed per-sequence loss
        (ap: each sequence's fraction of wrong labels; pa, arow: the cost of each update).
    gradient_norm : float
        Norm of the gradient (of the pseudo-gradient with L1); NaN for SGD and the online algorithms.
    active_features : int
        Nonzero weights.
    elapsed : float
        Seconds since training began (wall clock).
    theta : ndarray of shape (n_weights,), float64, optional
        The flat weights (see above); None once the callback has seen them, for the online algorithms.
    feature_norm : float, default=nan
        Euclidean norm of the weights.
    evaluations : int, default=0
        Objective evaluations so far, the first one included (L-BFGS; 0 elsewhere).
    """

    iteration: int
    loss: float
    gradient_norm: float
    active_features: int
    elapsed: float
    theta: np.ndarray | None = field(default=None, repr=False, compare=False)
    feature_norm: float = float("nan")
    evaluations: int = 0  # objective evaluations so far, the first one included (L-BFGS; 0 elsewhere)


@dataclass
class TrainingResult:
    theta: np.ndarray
    iterations: int
    evaluations: int
    stop_reason: str
    history: list[IterationInfo] = field(default_factory=list)


@dataclass
class StoppingRule:
    """CRFsuite's stopping rules; ``max_iterations=None`` means no limit but the others."""

    max_iterations: int | None = None
    epsilon: float = 1e-5
    period: int = 10
    delta: float = 1e-5

    def reason(self, history: list[IterationInfo], theta_norm: float) -> str | None:
        latest = history[-1]
        if self.max_iterations is not None and latest.iteration >= self.max_iterations:
            return "max_iterations"
        if latest.gradient_norm / max(1.0, theta_norm) < self.epsilon:
            return "epsilon"
        if self.period and len(history) > self.period:
            before = history[-1 - self.period].loss
            if abs(latest.loss) > 0 and (before - latest.loss) / abs(latest.loss) < self.delta:
                return "delta"
        return None


def _regularised(objective: Callable, c2: float) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = objective(theta)
        if c2 > 0:
            loss += c2 * float(theta @ theta)
            grad += 2.0 * c2 * theta  # the objective's gradient is a fresh array
        return loss, grad

    return fun


def _freeze(objective: Callable, frozen: np.ndarray | None) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    if frozen is None or not len(frozen):
        return objective

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = objective(theta)
        grad[frozen] = 0.0
        return loss, grad

    return fun


class _Progress:
    """The iteration log, the callback and CRFsuite's stopping rules, for either L-BFGS path."""

    def __init__(self, stopping: StoppingRule, callback: Callable[[IterationInfo], None] | None) -> None:
        self.stopping, self.callback = stopping, callback
        self.history: list[IterationInfo] = []
        self.began = time.perf_counter()

    def record(self, loss: float, gradient_norm: float, theta: np.ndarray, evaluations: int = 0) -> str | None:
        """Log one iteration (``evaluations``: of the objective so far); the reason to stop, or None."""
        feature_norm = float(np.linalg.norm(theta))
        info = IterationInfo(
            iteration=len(self.history) + 1,
            loss=float(loss),
            gradient_norm=float(gradient_norm),
            active_features=int(np.count_nonzero(theta)),
            elapsed=time.perf_counter() - self.began,
            theta=theta,
            feature_norm=feature_norm,
            evaluations=evaluations,
        )
        self.history.append(info)
        if self.callback is not None:
            self.callback(info)
        info.theta = None  # seen by the callback; keeping every iteration's weights would cost memory
        return self.stopping.reason(self.history, feature_norm)


def lbfgs(
    objective: Callable[[np.ndarray], tuple[float, np.ndarray]],
    theta0: np.ndarray,
    c1: float = 0.0,
    c2: float = 1.0,
    stopping: StoppingRule | None = None,
    num_memories: int = 6,
    callback: Callable[[IterationInfo], None] | None = None,
    frozen: np.ndarray | None = None,
    max_linesearch: int = 20,
    scale: np.ndarray | None = None,
) -> TrainingResult:
    """Minimise the regularised objective by L-BFGS, or with ``c1 > 0`` by OWL-QN (both in
    :mod:`crf._quasi_newton`), which gives L1 weights that are exactly zero. The L2 term is part
    of the smooth objective in both; the loss reported and tested by the stopping rules is the
    whole objective, and the gradient norm is that of OWL-QN's pseudo-gradient under L1.

    ``objective(theta)`` returns (loss, gradient) with a new gradient array on every call: the
    regularisation and the frozen positions are applied to it in place. The weights at
    positions ``frozen`` (not features of the model) keep their starting value.
    ``max_linesearch``: line-search trials per iteration. An objective that is not finite at
    ``theta0`` raises ValueError.

    ``scale`` (n,) > 0, or None: the solver works on ``u = scale * theta``, the same objective in
    other units. Quasi-Newton steps are not invariant to the units of each weight: an attribute
    whose values are large (a constant 1e4 on every token) leaves the objective so badly scaled
    that L-BFGS stops far from the optimum; with ``scale`` its attribute's typical magnitude,
    every attribute is about 1 in the solver's units. The minimum, the reported losses,
    gradient norms and weights are those of ``theta``.
    """
    progress = _Progress(stopping or StoppingRule(), callback)
    evaluations = 0
    smooth = _freeze(_regularised(objective, c2), frozen)
    if scale is not None:
        theta0, c1 = theta0 * scale, (c1 / scale if c1 > 0 else c1)
    to_theta = (lambda u: u) if scale is None else (lambda u: u / scale)

    def counted(u: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evaluations
        evaluations += 1
        loss, grad = smooth(to_theta(u))
        if scale is not None:
            grad /= scale  # d/du f(u / scale)
        return loss, grad

    if np.any(c1 > 0):
        fixed = frozen if frozen is not None and len(frozen) else None
        iterations = quasi_newton.orthant_wise_minimise(counted, theta0, c1, num_memories, max_linesearch, fixed=fixed)
    else:
        iterations = quasi_newton.minimise(counted, theta0, num_memories, max_linesearch)
    theta, reason = to_theta(np.array(theta0, dtype=np.float64)), "converged"
    try:
        for u, loss, stationarity in iterations:
            theta = to_theta(u) if scale is not None else u
            gradient = stationarity if scale is None else stationarity * scale  # in theta's units
            reason = progress.record(loss, float(np.linalg.norm(gradient)), theta, evaluations)
            if reason:
                break
        else:
            reason = "converged"
    except quasi_newton.LineSearchError as error:
        reason = f"line search: {error}"
    return TrainingResult(theta, len(progress.history), evaluations, reason, progress.history)


@dataclass
class Calibration:
    """CRFsuite's search for SGD's initial learning rate: starting at ``eta``, multiply by ``rate``
    while one epoch over ``samples`` sequences lowers the loss, then divide from ``eta / rate``,
    until ``candidates`` rates have lowered it or ``max_trials`` were tried; keep the best."""

    eta: float = 0.1
    rate: float = 2.0
    samples: int = 1000
    candidates: int = 10
    max_trials: int = 20


class _Minibatch:
    """Some sequences with their objective over the attributes (``columns``) they contain."""

    def __init__(
        self, X, offsets: np.ndarray, labels: np.ndarray, params: ParameterLayout, chosen: np.ndarray, candidates=None
    ) -> None:
        rows = token_rows(offsets, chosen)
        sub = X[rows]
        self.columns = np.unique(sub.indices)
        lengths = offsets[chosen + 1] - offsets[chosen]
        self.local = local = ParameterLayout(self.columns.size, params.n_labels, order=params.order)
        self.size = chosen.size
        sub_offsets, sub_labels = np.concatenate([[0], np.cumsum(lengths)]), labels[rows]
        sub_candidates = None if candidates is None else candidates[rows]
        self._general = None
        self._arguments = (sub[:, self.columns], sub_offsets, sub_labels, local, sub_candidates)

    def objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """(NLL, gradient) of the minibatch at the local weights ``theta``
        (:class:`crf._objective.Objective`, built on first use)."""
        if self._general is None:
            X, offsets, labels, local, candidates = self._arguments
            self._general = Objective(X, offsets, labels, local, n_threads=1, candidates=candidates)
        return self._general(theta)


def _feature_mask(params: ParameterLayout) -> np.ndarray | None:
    """(A, L) bool: which state weights are features of the model (None: all of them)."""
    if params.feature_index is None:
        return None
    mask = np.zeros(params.n_attributes * params.n_labels, dtype=bool)
    mask[params.feature_index] = True
    return mask.reshape(params.n_attributes, params.n_labels)


class _Minibatches:
    """Minibatches of ``batch_size`` sequences taken in the order of ``sequences``, each with
    its own objective (:class:`_Minibatch`): the general path (any order, candidate lattices,
    unknown labels)."""

    def __init__(self, X, offsets, labels, params, sequences: np.ndarray, batch_size: int, candidates=None) -> None:
        self.batches = [
            _Minibatch(X, offsets, labels, params, np.sort(sequences[b : b + batch_size]), candidates)
            for b in range(0, len(sequences), batch_size)
        ]

    def __len__(self) -> int:
        return len(self.batches)

    def loss(self, weights: _SGDWeights, i: int) -> float:
        return weights.loss(self.batches[i])

    def step(self, weights: _SGDWeights, i: int, eta: float, lam: float) -> float:
        return weights.step(self.batches[i], eta, lam)


class _Sequences:
    """Every training sequence prepared once for CRFsuite's SGD (one fully labelled first-order
    sequence per update): each sequence's attribute columns (sorted), its entries' positions
    among them and its observed tail counts, found for all sequences with a few array
    operations, so that an update slices arrays and calls the compiled kernels of
    :mod:`crf._compiled`, with no sparse matrix built per sequence.

    Parameters
    ----------
    X : (T, A) sparse matrix of attribute values, the sequences' tokens one after another.
    offsets : (N + 1,) int array, where each sequence starts and where the last ends (no empty one).
    labels : (T,) int array of gold label ids (all known).
    params : the model's first-order :class:`crf._objective.ParameterLayout`.
    """

    def __init__(self, X, offsets: np.ndarray, labels: np.ndarray, params: ParameterLayout) -> None:
        self.X, self.params = X, params
        X = sp.csr_matrix(X, dtype=np.float64)
        if not X.has_canonical_format:  # entries of a row in column order, repeats summed
            X = X.copy()
            X.sum_duplicates()
        A, L = params.n_attributes, params.n_labels
        self.n_labels = L
        self.offsets = offsets = np.asarray(offsets, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.indptr, self.data, self.attributes = X.indptr.astype(np.int64), X.data, X.indices.astype(np.int64)
        N = offsets.size - 1
        lengths = np.diff(offsets)
        entry_bounds = self.indptr[offsets]
        owner = np.repeat(np.arange(N, dtype=np.int64), np.diff(entry_bounds))
        keys, position = np.unique(owner * A + X.indices, return_inverse=True)
        self.column_bounds = np.searchsorted(keys, np.arange(N + 1, dtype=np.int64) * A)
        self._column_bounds = self.column_bounds.tolist()
        self.columns = keys % A  # sequence n's attributes: columns[column_bounds[n]:column_bounds[n + 1]]
        self.positions = position.ravel() - self.column_bounds[owner]  # each entry's place among its sequence's columns
        # observed tail counts (transitions, start, end) of every sequence, as (index, count) lists
        size = params.chain.tail_size
        gold = self.labels
        token_owner = np.repeat(np.arange(N, dtype=np.int64), lengths)
        inner = np.ones(gold.size, dtype=bool)
        inner[offsets[:-1]] = False
        edges = np.flatnonzero(inner)
        tail_keys = np.concatenate(
            [
                token_owner[edges] * size + gold[edges - 1] * L + gold[edges],
                np.arange(N) * size + L * L + gold[offsets[:-1]],
                np.arange(N) * size + L * L + L + gold[offsets[1:] - 1],
            ]
        )
        tail_keys, counts = np.unique(tail_keys, return_counts=True)
        self.tail_bounds = np.searchsorted(tail_keys, np.arange(N + 1, dtype=np.int64) * size)
        self.tail_index, self.tail_counts = tail_keys % size, counts.astype(np.float64)
        self.lengths = lengths
        # (first token, end token, first and end observed tail entry) of every sequence, as Python ints
        self._bounds = np.stack([offsets[:-1], offsets[1:], self.tail_bounds[:-1], self.tail_bounds[1:]], axis=1).tolist()
        self.steps = np.arange(int(lengths.max(initial=0)), dtype=np.int64)
        # working arrays of one call of :meth:`objective` (emissions, then marginals; log Z; pair counts)
        self._emissions, self._log_z, self._pairs = np.empty((self.steps.size, L)), np.empty(1), np.empty((L, L))
        self._product = _compiled._kernel("_sparse_times_dense")
        self._forward_backward = _compiled._kernel("_forward_backward_first_order")
        self._gradient = _compiled._kernel("_sequence_gradient")
        self._no_messages = np.empty((0, 0))

    @staticmethod
    def applies(params: ParameterLayout, offsets: np.ndarray, labels: np.ndarray, batch_size: int, candidates) -> bool:
        """Whether the sequences suit this path: one sequence per update, first order, no
        candidate lattice, every label known and no empty sequence."""
        labels = np.asarray(labels)
        return (
            batch_size == 1
            and params.order == 1
            and candidates is None
            and bool(labels.size)
            and int(labels.min()) >= 0
            and bool(np.all(np.diff(offsets) > 0))
        )

    def column_slice(self, n: int) -> np.ndarray:
        """Sequence ``n``'s attribute columns (sorted)."""
        return self.columns[self._column_bounds[n] : self._column_bounds[n + 1]]

    def objective(self, n: int, state: np.ndarray, scale: float, tail: np.ndarray) -> tuple[float, np.ndarray, np.ndarray] | None:
        """(NLL, state gradient (C, L) over its C columns (:meth:`column_slice`), tail gradient
        (tail_size,)) of sequence ``n`` at the weights ``scale * state`` (state (A, L)) and
        ``tail``, as :class:`crf._objective.Objective` gives them; None when the scaled
        forward-backward fails (extreme scores): the caller then takes the general objective (log space)."""
        L = self.n_labels
        a, b, k, m = self._bounds[n]
        T = b - a
        indptr = self.indptr[a : b + 1]  # into the entries of all sequences: positions and data whole
        gold = self.labels[a:b]
        emissions = self._emissions[:T]
        self._product(indptr, self.attributes, self.data, state, emissions)
        emissions *= scale
        observed_index, observed = self.tail_index[k:m], self.tail_counts[k:m]
        score = emissions[self.steps[:T], gold].sum() + tail[observed_index] @ observed
        log_z, pairs, no = self._log_z, self._pairs, self._no_messages
        pairs.fill(0.0)
        # the marginals are written over the emissions (each token's scores are read first)
        self._forward_backward(
            emissions, tail[: L * L].reshape(L, L), tail[L * L : L * L + L], tail[L * L + L :], self.steps[:T],
            self.lengths[n : n + 1], emissions, log_z, pairs, True, no, no, False,
        )  # fmt: skip
        if not math.isfinite(log_z[0]):
            return None
        gradient = np.zeros((self._column_bounds[n + 1] - self._column_bounds[n], L))
        self._gradient(indptr, self.positions, self.data, gold, emissions, gradient)
        tail_gradient = np.concatenate([pairs.ravel(), emissions[0], emissions[T - 1]])
        tail_gradient[observed_index] -= observed
        return float(log_z[0] - score), gradient, tail_gradient

    def minibatch(self, n: int) -> _Minibatch:
        """Sequence ``n`` as a :class:`_Minibatch` (the general objective, in log space)."""
        return _Minibatch(self.X, self.offsets, self.labels, self.params, np.array([n]))


class _SequenceVisits:
    """CRFsuite's SGD: one update per sequence, the i-th update on sequence ``sequences[i]``
    of the prepared :class:`_Sequences`."""

    def __init__(self, prepared: _Sequences, sequences: np.ndarray) -> None:
        self.prepared, self.sequences = prepared, np.asarray(sequences, dtype=np.int64)

    def __len__(self) -> int:
        return self.sequences.size

    def loss(self, weights: _SGDWeights, i: int) -> float:
        n = int(self.sequences[i])
        parts = self.prepared.objective(n, weights.state, weights.scale, weights.tail)
        return weights.loss(self.prepared.minibatch(n)) if parts is None else parts[0]

    def step(self, weights: _SGDWeights, i: int, eta: float, lam: float) -> float:
        """One update on sequence ``sequences[i]``, as :meth:`_SGDWeights.step` makes it."""
        n = int(self.sequences[i])
        parts = self.prepared.objective(n, weights.state, weights.scale, weights.tail)
        if parts is None:
            return weights.step(self.prepared.minibatch(n), eta, lam)
        loss, gradient, tail_gradient = parts
        weights.update(self.prepared.column_slice(n), gradient, tail_gradient, eta, lam)
        return loss


def _minibatches(
    X, offsets, labels, params: ParameterLayout, sequences: np.ndarray, batch_size: int, candidates=None, prepared=None
) -> _Minibatches | _SequenceVisits:
    """The updates of one pass over ``sequences`` (in this order), ``batch_size`` sequences
    each: with ``prepared`` (:class:`_Sequences`, for one first-order sequence per update),
    CRFsuite's per-sequence path; else one :class:`_Minibatch` per update."""
    if prepared is not None:
        return _SequenceVisits(prepared, sequences)
    return _Minibatches(X, offsets, labels, params, sequences, batch_size, candidates)


class _SGDWeights:
    """Weights under SGD with L2 decay: state weights (A, L) stored as ``scale * state`` so that
    the decay of all of them costs one multiplication; the rest (transitions, start, end) plain."""

    def __init__(self, params: ParameterLayout, theta0: np.ndarray, trainable_tail: np.ndarray) -> None:
        self.params = params
        state = params.split(theta0)[0]
        self.state = np.array(state, dtype=np.float64)
        self.tail = np.array(theta0[params.n_state :], dtype=np.float64)
        self.trainable_tail = trainable_tail
        self.mask = _feature_mask(params)
        self._mask = np.ones((1, 1), dtype=bool) if self.mask is None else self.mask
        self._rows_step = _compiled._kernel("_masked_rows_step")
        self.scale = 1.0

    def _local(self, batch: _Minibatch) -> np.ndarray:
        return np.concatenate([(self.scale * self.state[batch.columns]).ravel(), self.tail])

    def loss(self, batch: _Minibatch) -> float:
        """The NLL of ``batch`` at the current weights."""
        return batch.objective(self._local(batch))[0]

    def step(self, batch: _Minibatch, eta: float, lam: float) -> float:
        """One update on ``batch``: w <- (1 - eta lam) w - eta * mean gradient. Returns its NLL."""
        L = self.params.n_labels
        n = batch.columns.size * L
        loss, grad = batch.objective(self._local(batch))
        grad /= batch.size
        self.update(batch.columns, grad[:n].reshape(-1, L), grad[n:], eta, lam)
        return loss

    def update(self, columns: np.ndarray, gradient: np.ndarray, tail_gradient: np.ndarray, eta: float, lam: float) -> None:
        """w <- (1 - eta lam) w - eta * gradient, with ``gradient`` (C, L) over the state weights
        of the attributes ``columns`` (C,) and ``tail_gradient`` over the tail (overwritten);
        only weights that are features move."""
        shrink = 1.0 - eta * lam
        self.scale *= shrink
        self._rows_step(columns, self.state, gradient, self._mask, self.mask is not None, eta / self.scale)
        self.tail *= shrink
        tail_gradient *= eta
        tail_gradient *= self.trainable_tail
        self.tail -= tail_gradient
        if self.scale < 1e-9:
            self.state *= self.scale
            self.scale = 1.0

    def theta(self) -> np.ndarray:
        return self.params.join(self.scale * self.state, self.tail)


def _epoch(weights: _SGDWeights, batches, order, t0: float, t: int, lam: float) -> tuple[float, int]:
    """One pass over ``batches`` (:func:`_minibatches`) in ``order`` with eta = 1 / (lam (t0 + t));
    (summed NLL, new t)."""
    total = 0.0
    for i in order:
        total += batches.step(weights, i, 1.0 / (lam * (t0 + t)), lam)
        t += 1
    return total, t


def _prepared(X, offsets, labels, params, batch_size: int, candidates) -> _Sequences | None:
    """:class:`_Sequences` when CRFsuite's per-sequence path applies (see :meth:`_Sequences.applies`)."""
    return _Sequences(X, offsets, labels, params) if _Sequences.applies(params, offsets, labels, batch_size, candidates) else None


def calibrate(
    X,
    offsets,
    labels,
    params,
    theta0,
    trainable_tail,
    lam,
    batch_size,
    rng,
    calibration: Calibration,
    candidates=None,
    prepared: _Sequences | None = None,
) -> float:
    """CRFsuite's learning-rate calibration (see :class:`Calibration`); returns the chosen eta.
    ``prepared``: the sequences made ready for the per-sequence path, if already (else made here
    when that path applies)."""
    n_sequences = offsets.size - 1
    sample = rng.permutation(n_sequences)[: min(n_sequences, calibration.samples)]
    if prepared is None:
        prepared = _prepared(X, offsets, labels, params, batch_size, candidates)
    batches = _minibatches(X, offsets, labels, params, sample, batch_size, candidates, prepared)
    initial = _SGDWeights(params, theta0, trainable_tail)
    penalty = 0.5 * lam * sample.size  # times ||w||^2: the L2 term of the sample's share of the loss
    initial_loss = sum(batches.loss(initial, i) for i in range(len(batches))) + penalty * float(theta0 @ theta0)
    eta, best_eta, best_loss = calibration.eta, calibration.eta, np.inf
    left, decreasing, trials = calibration.candidates, False, 1
    while (left > 0 or not decreasing) and trials <= calibration.max_trials:
        weights = _SGDWeights(params, theta0, trainable_tail)
        loss, _ = _epoch(weights, batches, range(len(batches)), 1.0 / (lam * eta), 0, lam)
        theta = weights.theta()
        loss += penalty * float(theta @ theta)
        improved = bool(np.isfinite(loss)) and loss < initial_loss
        if improved:
            left -= 1
            if loss < best_loss:
                best_loss, best_eta = loss, eta
        if decreasing:
            eta /= calibration.rate
        elif improved and left > 0:
            eta *= calibration.rate
        else:
            decreasing, left, eta = True, calibration.candidates, calibration.eta / calibration.rate
        trials += 1
    return best_eta


def sgd(
    X,
    offsets: np.ndarray,
    labels: np.ndarray,
    params: ParameterLayout,
    theta0: np.ndarray,
    c2: float = 1.0,
    stopping: StoppingRule | None = None,
    learning_rate: float | None = None,
    batch_size: int = 1,
    seed: int | None = 0,
    callback: Callable[[IterationInfo], None] | None = None,
    frozen: np.ndarray | None = None,
    calibration: Calibration | None = None,
    candidates: np.ndarray | None = None,
) -> TrainingResult:
    """CRFsuite's ``l2sgd``: SGD on ``NLL + c2 ||theta||^2`` with the step
    ``eta_t = 1 / (lambda (t0 + t))``, ``lambda = 2 c2 / N``, ``t0 = 1 / (lambda eta0)``, one
    update per minibatch of ``batch_size`` sequences (1: CRFsuite) on its mean gradient.

    ``eta0`` is ``learning_rate`` when given, else found by :func:`calibrate`. The minibatches
    are visited in a new random order every epoch (one iteration). An epoch's loss is the sum of
    the minibatch losses seen during it plus the penalty at its end; training stops after
    ``max_iterations`` epochs or when the loss improved by less than ``delta`` over ``period``
    epochs, and returns the weights of the epoch with the lowest loss (as CRFsuite does).
    Weights at positions ``frozen`` (transition/start/end weights that are not features) stay 0.
    ``candidates`` (T, L): the candidate lattice of every token (see :class:`crf._objective.Objective`).
    """
    if c2 <= 0:
        raise ValueError("l2sgd needs c2 > 0 (its step size is 1 / (lambda t) with lambda = 2 c2 / N)")
    stopping = stopping or StoppingRule(max_iterations=1000, delta=1e-6)
    rng = np.random.default_rng(seed)
    n_sequences = offsets.size - 1
    lam = 2.0 * c2 / n_sequences
    trainable = np.ones(theta0.size, dtype=bool)
    if frozen is not None:
        trainable[frozen] = False
    trainable_tail = trainable[params.n_state :]
    prepared = _prepared(X, offsets, labels, params, batch_size, candidates)
    if learning_rate is None:
        learning_rate = calibrate(
            X, offsets, labels, params, theta0, trainable_tail, lam, batch_size, rng, calibration or Calibration(), candidates,
            prepared,
        )  # fmt: skip
    batches = _minibatches(X, offsets, labels, params, rng.permutation(n_sequences), batch_size, candidates, prepared)
    weights = _SGDWeights(params, theta0, trainable_tail)
    t0, t = 1.0 / (lam * learning_rate), 0
    history: list[IterationInfo] = []
    best_loss, best_theta = np.inf, theta0
    began = time.perf_counter()
    while True:
        loss, t = _epoch(weights, batches, rng.permutation(len(batches)), t0, t, lam)
        theta = weights.theta()
        norm2 = float(theta @ theta)
        loss += c2 * norm2
        history.append(
            IterationInfo(
                len(history) + 1,
                loss,
                float("nan"),
                int(np.count_nonzero(theta)),
                time.perf_counter() - began,
                theta,
                np.sqrt(norm2),
            )
        )
        if loss < best_loss:
            best_loss, best_theta = loss, theta
        if callback is not None:
            callback(history[-1])
        history[-1].theta = None  # seen by the callback; keeping every epoch's weights would cost memory
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"l2sgd: the loss overflowed at epoch {len(history)} (learning rate {learning_rate:g} too large)"
            )
        reason = stopping.reason(history, np.sqrt(norm2))  # no full gradient: the epsilon rule never fires
        if reason:
            break
    return TrainingResult(best_theta, len(history), t, reason, history)

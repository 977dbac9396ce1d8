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
    that L-BFGS stops far from the optimum; with ``scale`` its attribute's largest magnitude,
    every attribute is at most 1 in the solver's units. The minimum, the reported losses,
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
        self, X, offsets: np.ndarray, labels: np.ndarray, params: ParameterLayout, chosen: np.ndarray, mask, candidates=None
    ) -> None:
        rows = token_rows(offsets, chosen)
        sub = X[rows]
        self.columns = np.unique(sub.indices)
        lengths = offsets[chosen + 1] - offsets[chosen]
        self.local = local = ParameterLayout(self.columns.size, params.n_labels, order=params.order)
        self.mask = None if mask is None else mask[self.columns]  # (columns, L): which weights are features
        self.size = chosen.size
        sub_offsets, sub_labels = np.concatenate([[0], np.cumsum(lengths)]), labels[rows]
        sub_candidates = None if candidates is None else candidates[rows]
        self._general = None
        self._arguments = (sub[:, self.columns], sub_offsets, sub_labels, local, sub_candidates)
        # one fully labelled first-order sequence (CRFsuite's SGD): the compiled kernels directly
        self.single = None
        if chosen.size == 1 and params.order == 1 and candidates is None and sub_labels.size and sub_labels.min() >= 0:
            local_X = sp.csr_matrix(sub[:, self.columns], dtype=np.float64)
            local_X.sum_duplicates()
            gold = sub_labels.astype(np.int64)
            observed_tail = local.chain.observed_tail(np.array([0, gold.size]), gold)
            self.single = (local_X.indptr.astype(np.int64), local_X.indices.astype(np.int64), local_X.data, gold, observed_tail)
            self._arguments = (local_X, *self._arguments[1:])  # the same rows, held once

    def objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """(NLL, gradient) of the minibatch at the local weights ``theta``."""
        return self.general(theta) if self.single is None else self._single_objective(theta)

    def general(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """:class:`crf._objective.Objective` of the minibatch (built on first use)."""
        if self._general is None:
            X, offsets, labels, local, candidates = self._arguments
            self._general = Objective(X, offsets, labels, local, n_threads=1, candidates=candidates)
        return self._general(theta)

    def _single_objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """(NLL, gradient) of the one sequence, as :class:`crf._objective.Objective` gives them."""
        indptr, indices, data, gold, observed_tail = self.single
        L, n = self.local.n_labels, self.local.n_state
        transitions, start, end = self.local.chain.scores(theta[n:])
        emissions = _compiled.sparse_times_dense(indptr, indices, data, theta[:n].reshape(-1, L))
        T = gold.size
        score = emissions[np.arange(T), gold].sum() + theta[n:] @ observed_tail
        log_z, marginals, pairs, _, _ = _compiled.forward_backward(
            emissions, transitions, start, end, np.arange(T), np.array([T]), True, True
        )
        if not np.isfinite(log_z[0]):  # scaled numbers failed: the general objective redoes it in log space
            return self.general(theta)
        gradient = np.empty(theta.size)
        gradient[:n] = _compiled.sequence_gradient(indptr, indices, data, gold, marginals, n // L).ravel()
        gradient[n:] = self.local.chain.tail_counts(pairs, marginals[0], marginals[T - 1]) - observed_tail
        return float(log_z[0] - score), gradient


def _minibatches(
    X, offsets, labels, params: ParameterLayout, sequences: np.ndarray, batch_size: int, candidates=None
) -> list[_Minibatch]:
    mask = None
    if params.feature_index is not None:
        mask = np.zeros(params.n_attributes * params.n_labels, dtype=bool)
        mask[params.feature_index] = True
        mask = mask.reshape(params.n_attributes, params.n_labels)
    return [
        _Minibatch(X, offsets, labels, params, np.sort(sequences[b : b + batch_size]), mask, candidates)
        for b in range(0, len(sequences), batch_size)
    ]


class _SGDWeights:
    """Weights under SGD with L2 decay: state weights (A, L) stored as ``scale * state`` so that
    the decay of all of them costs one multiplication; the rest (transitions, start, end) plain."""

    def __init__(self, params: ParameterLayout, theta0: np.ndarray, trainable_tail: np.ndarray) -> None:
        self.params = params
        state = params.split(theta0)[0]
        self.state = np.array(state, dtype=np.float64)
        self.tail = np.array(theta0[params.n_state :], dtype=np.float64)
        self.trainable_tail = trainable_tail
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
        grad_state = grad[:n].reshape(-1, L)
        if batch.mask is not None:
            grad_state *= batch.mask
        shrink = 1.0 - eta * lam
        self.scale *= shrink
        self.state[batch.columns] -= (eta / self.scale) * grad_state
        self.tail = shrink * self.tail - eta * grad[n:] * self.trainable_tail
        if self.scale < 1e-9:
            self.state *= self.scale
            self.scale = 1.0
        return loss

    def theta(self) -> np.ndarray:
        return self.params.join(self.scale * self.state, self.tail)


def _epoch(weights: _SGDWeights, batches: list[_Minibatch], order, t0: float, t: int, lam: float) -> tuple[float, int]:
    """One pass over ``batches`` in ``order`` with eta = 1 / (lam (t0 + t)); (summed NLL, new t)."""
    total = 0.0
    for i in order:
        total += weights.step(batches[i], 1.0 / (lam * (t0 + t)), lam)
        t += 1
    return total, t


def calibrate(
    X, offsets, labels, params, theta0, trainable_tail, lam, batch_size, rng, calibration: Calibration, candidates=None
) -> float:
    """CRFsuite's learning-rate calibration (see :class:`Calibration`); returns the chosen eta."""
    n_sequences = offsets.size - 1
    sample = rng.permutation(n_sequences)[: min(n_sequences, calibration.samples)]
    batches = _minibatches(X, offsets, labels, params, sample, batch_size, candidates)
    initial = _SGDWeights(params, theta0, trainable_tail)
    penalty = 0.5 * lam * sample.size  # times ||w||^2: the L2 term of the sample's share of the loss
    initial_loss = sum(initial.loss(b) for b in batches) + penalty * float(theta0 @ theta0)
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
    ``candidates`` (T, L): the pruned lattice of every token (see :class:`crf._objective.Objective`).
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
    if learning_rate is None:
        learning_rate = calibrate(
            X, offsets, labels, params, theta0, trainable_tail, lam, batch_size, rng, calibration or Calibration(), candidates
        )
    batches = _minibatches(X, offsets, labels, params, rng.permutation(n_sequences), batch_size, candidates)
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

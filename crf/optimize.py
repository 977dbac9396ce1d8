"""Trainers: L-BFGS (L2), bound-split L-BFGS-B for L1 / elastic net, and SGD with L2.

All minimise ``NLL(theta) + c1 * |theta|_1 + c2 * ||theta||^2`` (CRFsuite's c1, c2) and stop
like CRFsuite: after ``max_iterations``, when the relative improvement of the loss over the last
``period`` iterations falls below ``delta``, or when ``||g|| / max(1, ||theta||) < epsilon``.
Each iteration is reported to ``callback(IterationInfo)``.

L1 (c1 > 0) is handled by writing ``theta = u - v`` with ``u, v >= 0``, so the penalty
``c1 * sum(u + v)`` is smooth and L-BFGS-B's projection onto the bounds gives weights that are
exactly zero; OWL-QN (CRFsuite's method) reaches the same optimum of the same convex objective.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.optimize

from .batch import token_rows
from .objective import Objective, ParameterLayout


@dataclass
class IterationInfo:
    """One optimiser iteration (an epoch for SGD)."""

    iteration: int
    loss: float
    gradient_norm: float
    active_features: int
    elapsed: float
    theta: np.ndarray | None = field(default=None, repr=False, compare=False)


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


class _Tracker:
    """Counts evaluations and remembers the gradient at the latest point."""

    def __init__(self, fun: Callable[[np.ndarray], tuple[float, np.ndarray]]) -> None:
        self.fun = fun
        self.evaluations = 0
        self.last_x: np.ndarray | None = None
        self.last_g: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        self.evaluations += 1
        value, grad = self.fun(x)
        self.last_x, self.last_g = x.copy(), grad
        return value, grad


def _regularised(objective: Callable, c2: float) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = objective(theta)
        if c2 > 0:
            loss += c2 * float(theta @ theta)
            grad = grad + 2.0 * c2 * theta
        return loss, grad

    return fun


def lbfgs(
    objective: Callable[[np.ndarray], tuple[float, np.ndarray]],
    theta0: np.ndarray,
    c1: float = 0.0,
    c2: float = 1.0,
    stopping: StoppingRule | None = None,
    num_memories: int = 6,
    callback: Callable[[IterationInfo], None] | None = None,
) -> TrainingResult:
    """Minimise the regularised objective with scipy's L-BFGS-B.

    With ``c1 > 0`` the variables are split (``theta = u - v``, both non-negative) so that L1
    weights reach exact zeros.
    """
    stopping = stopping or StoppingRule()
    smooth = _regularised(objective, c2)
    n = theta0.size
    if c1 > 0:

        def split_fun(z: np.ndarray) -> tuple[float, np.ndarray]:
            loss, grad = smooth(z[:n] - z[n:])
            return loss + c1 * float(z.sum()), np.concatenate([grad + c1, c1 - grad])

        fun = _Tracker(split_fun)
        x0 = np.concatenate([np.maximum(theta0, 0), np.maximum(-theta0, 0)])
        bounds = [(0.0, None)] * (2 * n)
        to_theta = lambda z: z[:n] - z[n:]  # noqa: E731

        def reported_gradient(z, g):  # OWL-QN's pseudo-gradient norm, in theta's coordinates
            theta = to_theta(z)
            smooth_g = g[:n] - c1
            pseudo = np.where(
                theta > 0,
                smooth_g + c1,
                np.where(theta < 0, smooth_g - c1, np.sign(smooth_g) * np.maximum(np.abs(smooth_g) - c1, 0)),
            )
            return pseudo
    else:
        fun = _Tracker(smooth)
        x0 = theta0.copy()
        bounds = None
        to_theta = lambda z: z  # noqa: E731
        reported_gradient = lambda z, g: g  # noqa: E731

    history: list[IterationInfo] = []
    state = {"reason": "converged"}
    began = time.perf_counter()

    def on_iteration(intermediate_result) -> None:
        z = intermediate_result.x
        if fun.last_x is not None and np.array_equal(fun.last_x, z):
            grad = fun.last_g
        else:  # the accepted point is not the latest evaluation: evaluate it
            grad = fun.fun(z)[1]
        theta = to_theta(z)
        info = IterationInfo(
            iteration=len(history) + 1,
            loss=float(intermediate_result.fun),
            gradient_norm=float(np.linalg.norm(reported_gradient(z, grad))),
            active_features=int(np.count_nonzero(theta)),
            elapsed=time.perf_counter() - began,
            theta=theta,
        )
        history.append(info)
        if callback is not None:
            callback(info)
        reason = stopping.reason(history, float(np.linalg.norm(theta)))
        if reason:
            state["reason"] = reason
            raise StopIteration

    result = scipy.optimize.minimize(
        fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        callback=on_iteration,
        options={"maxcor": num_memories, "maxiter": 10**9, "maxfun": 10**9, "ftol": 0.0, "gtol": 0.0},
    )
    if state["reason"] == "converged" and not result.success:
        state["reason"] = f"line search: {result.message}"
    return TrainingResult(to_theta(result.x), len(history), fun.evaluations, state["reason"], history)


def sgd(
    X,
    offsets: np.ndarray,
    labels: np.ndarray,
    params: ParameterLayout,
    theta0: np.ndarray,
    c2: float = 1.0,
    stopping: StoppingRule | None = None,
    learning_rate: float = 0.1,
    batch_size: int = 32,
    seed: int = 0,
    callback: Callable[[IterationInfo], None] | None = None,
) -> TrainingResult:
    """Minibatch SGD on ``(NLL + c2 * ||theta||^2) / N`` with the decaying step
    ``eta_k = learning_rate / (1 + lambda * learning_rate * k)``, ``lambda = 2 * c2 / N``.

    Each minibatch only touches the weight rows of the attributes it contains; the L2 shrinkage of
    all other weights is applied lazily through one global scale factor. One iteration is one epoch;
    its loss is the sum of the minibatch losses seen during the epoch plus the penalty.
    """
    stopping = stopping or StoppingRule()
    rng = np.random.default_rng(seed)
    n_sequences = offsets.size - 1
    order = rng.permutation(n_sequences)
    L = params.n_labels
    mask = None
    if params.feature_index is not None:
        mask = np.zeros(params.n_attributes * L, dtype=bool)
        mask[params.feature_index] = True
        mask = mask.reshape(params.n_attributes, L)
    minibatches = []
    for begin in range(0, n_sequences, batch_size):
        chosen = np.sort(order[begin : begin + batch_size])
        rows = token_rows(offsets, chosen)
        sub = X[rows]
        columns = np.unique(sub.indices)
        lengths = offsets[chosen + 1] - offsets[chosen]
        local = ParameterLayout(columns.size, L)
        objective = Objective(sub[:, columns], np.concatenate([[0], np.cumsum(lengths)]), labels[rows], local, n_threads=1)
        minibatches.append((objective, columns, None if mask is None else mask[columns], chosen.size))

    state, transitions, start, end = (np.array(a, dtype=np.float64) for a in params.split(theta0))
    state = np.array(state)
    scale = 1.0
    decay = 2.0 * c2 / n_sequences
    history: list[IterationInfo] = []
    began = time.perf_counter()
    step = 0
    evaluations = 0
    reason = "max_iterations"
    while True:
        epoch_loss = 0.0
        for index in rng.permutation(len(minibatches)):
            objective, columns, local_mask, size = minibatches[index]
            eta = learning_rate / (1.0 + decay * learning_rate * step)
            theta_local = np.concatenate([(scale * state[columns]).ravel(), transitions.ravel(), start, end])
            loss, grad = objective(theta_local)
            evaluations += 1
            epoch_loss += loss
            grad /= size
            grad_state, grad_trans, grad_start, grad_end = objective.params.split(grad)
            if local_mask is not None:
                grad_state = grad_state * local_mask
            shrink = 1.0 - eta * decay
            scale *= shrink
            state[columns] -= (eta / scale) * grad_state
            transitions = shrink * transitions - eta * grad_trans
            start = shrink * start - eta * grad_start
            end = shrink * end - eta * grad_end
            if scale < 1e-9:
                state *= scale
                scale = 1.0
            step += 1
        weights = scale * state
        theta = params.join(weights, transitions, start, end)
        epoch_loss += c2 * float(theta @ theta)
        info = IterationInfo(
            len(history) + 1, epoch_loss, float("nan"), int(np.count_nonzero(theta)), time.perf_counter() - began, theta
        )
        history.append(info)
        if callback is not None:
            callback(info)
        stop = stopping.reason(history, float(np.linalg.norm(theta)))
        if stop and stop != "epsilon":  # no full gradient in SGD: the epsilon rule does not apply
            reason = stop
            break
    return TrainingResult(theta, len(history), evaluations, reason, history)

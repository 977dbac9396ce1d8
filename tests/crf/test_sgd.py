"""CRFsuite's per-sequence SGD (``l2sgd``, ``batch_size=1``): the prepared path of
:class:`crf._optimize._Sequences` gives the same updates as the general minibatch objective
(:class:`crf._objective.Objective`, the path every other batch size takes)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from crf import _optimize as optimize
from crf._objective import ParameterLayout

A, L = 9, 3


def problem(seed: int, n: int = 12):
    """Sparse attributes (T, A) with some attributes repeated within a token (entries not in
    column order, as a CSR matrix without canonical format), offsets and labels."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, size=n)
    T = int(lengths.sum())
    rows, columns, values = [], [], []
    for t in range(T):
        chosen = rng.choice(A, size=int(rng.integers(1, 5)), replace=True)  # repeats: summed
        rows += [t] * chosen.size
        columns += list(chosen)
        values += list(rng.normal(size=chosen.size))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=T))])
    X = sp.csr_matrix((np.array(values), np.array(columns), indptr), shape=(T, A))
    labels = rng.integers(0, L, size=T)
    return X, np.concatenate([[0], np.cumsum(lengths)]), labels


def layouts():
    """Dense state features, and sparse ones (a subset of the (attribute, label) pairs)."""
    rng = np.random.default_rng(5)
    return [ParameterLayout(A, L), ParameterLayout(A, L, np.sort(rng.choice(A * L, size=15, replace=False)))]


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("learning_rate", [0.3, None])
def test_per_sequence_path_trains_as_the_general_path(monkeypatch, sparse, learning_rate):
    """Same epoch losses and weights with the prepared per-sequence path as with one general
    minibatch objective per sequence, with sparse state features, frozen transitions, repeated
    attributes and the learning-rate calibration."""
    X, offsets, labels = problem(1)
    params = layouts()[sparse]
    frozen = params.n_state + np.array([1, 5, L * L + 2])  # a transition, another, a start weight
    theta0 = np.zeros(params.size)
    calibration = optimize.Calibration(samples=8, candidates=2, max_trials=5)

    def fit():
        return optimize.sgd(
            X, offsets, labels, params, theta0, 0.2, optimize.StoppingRule(4), learning_rate, 1, 3, None, frozen, calibration
        )

    assert optimize._Sequences.applies(params, offsets, labels, 1, None)
    prepared = fit()
    monkeypatch.setattr(optimize._Sequences, "applies", staticmethod(lambda *args: False))
    general = fit()
    assert [i.loss for i in prepared.history] == pytest.approx([i.loss for i in general.history], rel=1e-12)
    np.testing.assert_allclose(prepared.theta, general.theta, rtol=1e-12, atol=1e-14)
    assert not np.any(prepared.theta[frozen])
    assert np.any(prepared.theta)


def test_scaled_failure_falls_back_to_the_log_space_objective():
    """Where the scaled forward-backward fails (a path of vanishing probability through every
    label), the prepared objective says so (None) and the update takes the general objective."""
    X = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 1.0]]))
    offsets, labels = np.array([0, 2]), np.array([0, 1])
    params = ParameterLayout(2, 2)
    prepared = optimize._Sequences(X, offsets, labels, params)
    state = np.array([[0.0, -2000.0], [0.0, 0.0]])
    tail = np.concatenate([[-2000.0, -2000.0, 0.0, 0.0], np.zeros(4)])  # from label 0 nothing is likely
    assert prepared.objective(0, state, 1.0, tail) is None
    visits = optimize._SequenceVisits(prepared, np.array([0]))
    theta0 = np.concatenate([state.ravel(), tail])
    ours = optimize._SGDWeights(params, theta0, np.ones(tail.size, bool))
    reference = optimize._SGDWeights(params, theta0, np.ones(tail.size, bool))
    loss = visits.step(ours, 0, 0.1, 0.01)
    expected = reference.step(optimize._Minibatch(X, offsets, labels, params, np.array([0])), 0.1, 0.01)
    assert np.isfinite(loss) and loss == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(ours.theta(), reference.theta(), rtol=1e-12)


def test_prepared_path_applies_to_one_labelled_first_order_sequence_per_update():
    X, offsets, labels = problem(2)
    params = ParameterLayout(A, L)
    assert optimize._Sequences.applies(params, offsets, labels, 1, None)
    assert not optimize._Sequences.applies(params, offsets, labels, 2, None)
    assert not optimize._Sequences.applies(ParameterLayout(A, L, order=2), offsets, labels, 1, None)
    assert not optimize._Sequences.applies(params, offsets, labels, 1, np.ones((labels.size, L), bool))
    unknown = labels.copy()
    unknown[3] = -1
    assert not optimize._Sequences.applies(params, offsets, unknown, 1, None)
    assert not optimize._Sequences.applies(params, np.concatenate([[0], offsets]), labels, 1, None)  # an empty sequence


@pytest.mark.parametrize("prepared", [True, False])
def test_only_feature_weights_move(prepared):
    """With sparse state features, an epoch leaves every other (attribute, label) weight at 0."""
    X, offsets, labels = problem(3)
    params = layouts()[1]
    weights = optimize._SGDWeights(params, np.zeros(params.size), np.ones(params.chain.tail_size, bool))
    ready = optimize._Sequences(X, offsets, labels, params) if prepared else None
    visits = optimize._minibatches(X, offsets, labels, params, np.arange(offsets.size - 1), 1, None, ready)
    optimize._epoch(weights, visits, range(len(visits)), 10.0, 0, 0.05)
    assert not np.any(weights.state[~weights.mask]) and np.any(weights.state[weights.mask])

"""The objective's gradient against central finite differences, dense and sparse layouts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from numeric_helpers import finite_difference

from crf._objective import Objective, ParameterLayout
from crf._optimize import _regularised
from crf._params import feature_index


def _random_problem(seed: int, n_labels: int = 3, n_attributes: int = 7):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, size=5)
    total = int(lengths.sum())
    dense = (rng.random((total, n_attributes)) < 0.4) * rng.choice([1.0, 0.5, -2.0], size=(total, n_attributes))
    X = sp.csr_matrix(dense)
    labels = rng.integers(0, n_labels, size=total)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return X, offsets, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sparse", [False, True, "min_freq"])
@pytest.mark.parametrize("c2", [0.0, 0.7])
def test_gradient_matches_finite_differences(seed, sparse, c2):
    X, offsets, labels = _random_problem(seed)
    L = 3
    # "min_freq": min_freq drops observed pairs, so the data has (attribute, label) entries outside the layout
    index = feature_index(X, labels, L, min_freq=1.5 if sparse == "min_freq" else 0) if sparse else None
    if sparse == "min_freq":
        assert index.size < feature_index(X, labels, L).size
    params = ParameterLayout(X.shape[1], L, index)
    fun = _regularised(Objective(X, offsets, labels, params), c2)
    theta = np.random.default_rng(seed + 10).normal(size=params.size)
    loss, grad = fun(theta)
    assert np.isfinite(loss) and loss > 0 or c2 == 0
    np.testing.assert_allclose(grad, finite_difference(fun, theta), rtol=1e-5, atol=1e-6)


def test_loss_is_negative_log_likelihood():
    """At theta = 0 every labelling is equally likely: the loss is sum_i n_i * log L."""
    X, offsets, labels = _random_problem(5)
    params = ParameterLayout(X.shape[1], 4)
    loss, _ = Objective(X, offsets, labels, params)(np.zeros(params.size))
    assert loss == pytest.approx(labels.size * np.log(4))


def test_sparse_layout_keeps_only_observed_pairs():
    X = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    labels = np.array([0, 1, 1])
    index = feature_index(X, labels, 2)
    # attribute 0 seen with labels 0 and 1, attribute 1 only with label 1
    np.testing.assert_array_equal(index, [0 * 2 + 0, 0 * 2 + 1, 1 * 2 + 1])
    params = ParameterLayout(2, 2, index)
    theta = np.arange(params.size, dtype=float)
    state, *_ = params.split(theta)
    assert state[1, 0] == 0.0 and state[1, 1] == 2.0
    np.testing.assert_array_equal(params.join(*params.split(theta)), theta)


def test_state_features_match_the_dense_product():
    """Shared (frequent) attributes and the per-label incidences together equal X @ W exactly."""
    from crf._objective import FeaturePartition, StateFeatures

    rng = np.random.default_rng(3)
    X = sp.csr_matrix((rng.random((60, 30)) < 0.2) * 1.0)
    labels = rng.integers(0, 10, size=60)
    index = feature_index(X, labels, 10)
    params = ParameterLayout(30, 10, index)
    states = StateFeatures(X, FeaturePartition(params))
    assert states.partition.shared_positions.size and states.local.nnz  # both paths are exercised
    theta = rng.normal(size=index.size)
    W = np.zeros(300)
    W[index] = theta
    np.testing.assert_allclose(states.emissions(theta), X @ W.reshape(30, 10), atol=1e-12)
    P = rng.random((60, 10))
    np.testing.assert_allclose(states.gradient(P), (X.T @ P).ravel()[index], atol=1e-12)


@pytest.mark.parametrize("n_attributes", [40, 2_000_000])  # marks per cell; the sort when marks would be larger
def test_feature_index_marks_the_pairs_a_sort_finds(monkeypatch, n_attributes):
    """The (attribute, label) pairs, marked a block of tokens at a time, are np.unique of the keys."""
    import crf._params

    monkeypatch.setattr(crf._params, "_BLOCK_TOKENS", 7)  # many blocks, the last one short
    rng = np.random.default_rng(5)
    columns = np.sort(rng.choice(n_attributes, size=(100, 4)), axis=1)  # repeats within a token are summed
    X = sp.csr_matrix((np.ones(400), columns.ravel(), np.arange(0, 401, 4)), shape=(100, n_attributes))
    X.sum_duplicates()
    labels = rng.integers(0, 6, size=100)
    keys = X.indices.astype(np.int64) * 6 + np.repeat(labels, np.diff(X.indptr))
    index = feature_index(X, labels, 6)
    assert index.dtype == np.int64
    np.testing.assert_array_equal(index, np.unique(keys))


def test_local_incidences_are_the_per_label_copies_of_columns():
    """Column j of ``local`` holds row t * L + label_j for every token t with attribute_j, value kept."""
    from crf._objective import FeaturePartition, StateFeatures

    rng = np.random.default_rng(4)
    X = sp.csr_matrix((rng.random((50, 25)) < 0.15) * rng.choice([1.0, 2.5], size=(50, 25)))
    labels = rng.integers(0, 9, size=50)
    part = FeaturePartition(ParameterLayout(25, 9, feature_index(X, labels, 9)))
    local = StateFeatures(X, part).local
    assert local.has_canonical_format and part.n_local > 0
    # the same attribute listed twice in a token (a SequenceBatch built by hand) counts once, summed
    doubled = sp.csr_matrix((np.repeat(X.data / 2, 2), np.repeat(X.indices, 2), X.indptr * 2), shape=X.shape)
    assert not doubled.has_canonical_format
    again = StateFeatures(doubled, part).local
    assert again.has_canonical_format
    np.testing.assert_array_equal(again.indices, local.indices)
    np.testing.assert_array_equal(again.data, local.data)
    expected = np.zeros((50 * 9, part.n_local))
    dense = X.toarray()
    for j, (attribute, label) in enumerate(zip(part.local_attributes, part.local_labels)):
        expected[np.arange(50) * 9 + label, j] = dense[:, attribute]
    np.testing.assert_array_equal(local.toarray(), expected)


def test_sequences_redone_in_log_space_take_their_emissions_anew(monkeypatch):
    """Weights in the hundreds make the scaled recursion give up on some sequences; the objective
    then computes their emissions again (its working copy was consumed) and the loss and state
    gradient equal a log-space computation."""
    from crf import _chain as chain
    from crf._objective import StateFeatures

    X, offsets, labels = _random_problem(8, n_labels=4)
    index = feature_index(X, labels, 4)
    params = ParameterLayout(X.shape[1], 4, index)
    theta = np.random.default_rng(8).normal(scale=300.0, size=params.size)
    calls = []
    original = StateFeatures.emissions
    monkeypatch.setattr(StateFeatures, "emissions", lambda self, *a: calls.append(1) or original(self, *a))
    loss, gradient = Objective(X, offsets, labels, params)(theta)
    assert len(calls) == 2  # one chunk: its emissions, then again for the fallback
    W = np.zeros(X.shape[1] * 4)
    W[index] = theta[: index.size]
    emissions = X @ W.reshape(-1, 4)
    _, transitions, start, end = params.split(theta)
    lengths = np.diff(offsets)
    exact = chain.forward_backward(emissions, transitions, start, end, lengths, semiring=chain.LogSemiring)
    first, last = offsets[:-1], offsets[1:] - 1
    inner = np.setdiff1d(np.arange(labels.size), first)
    gold = emissions[np.arange(labels.size), labels].sum() + transitions[labels[inner - 1], labels[inner]].sum()
    gold += start[labels[first]].sum() + end[labels[last]].sum()
    assert loss == pytest.approx(exact.log_z.sum() - gold, rel=1e-12)
    expected = (X.T @ (exact.marginals - np.eye(4)[labels])).ravel()[index]
    np.testing.assert_allclose(gradient[: index.size], expected, atol=1e-9)

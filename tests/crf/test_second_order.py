"""Second-order chains through the shared recursions, against brute-force enumeration."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import enumerate_second_order, random_second_order
from conftest import second_order_states as as_states
from scipy.special import logsumexp

from crf._chain import LogSemiring, ScaledSemiring, SecondOrderTransitions, edge_marginals, forward_backward, viterbi

CASES = [(0, 2, [1, 4, 3]), (1, 3, [5, 2, 1, 4]), (2, 4, [3, 3]), (3, 3, [6])]


@pytest.mark.parametrize("semiring", [ScaledSemiring, LogSemiring])
@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_second_order_log_z_marginals_and_triple_counts(seed, n_labels, lengths, semiring):
    emissions, triples, first, closing = random_second_order(seed, n_labels, lengths)
    transitions = SecondOrderTransitions(triples)
    start, end = as_states(triples, first, closing)
    result = forward_backward(transitions.state_emissions(emissions), transitions, start, end, lengths, semiring=semiring)
    L = n_labels
    expected_counts = np.zeros((L + 1, L, L))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for k, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, scores = enumerate_second_order(emissions[a:b], triples, first, closing)
        log_z = logsumexp(scores)
        assert result.log_z[k] == pytest.approx(log_z, abs=1e-9)
        p = np.exp(scores - log_z)
        node = result.marginals[a:b].reshape(b - a, L + 1, L).sum(axis=1)
        for t in range(b - a):
            np.testing.assert_allclose(node[t], np.bincount(paths[:, t], weights=p, minlength=L), atol=1e-9)
        for t in range(1, b - a):
            before = paths[:, t - 2] if t >= 2 else np.full(len(paths), L)
            np.add.at(expected_counts, (before, paths[:, t - 1], paths[:, t]), p)
    np.testing.assert_allclose(result.transition_counts, expected_counts, atol=1e-9)


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_second_order_viterbi(seed, n_labels, lengths):
    emissions, triples, first, closing = random_second_order(seed, n_labels, lengths, scale=2.0)
    transitions = SecondOrderTransitions(triples)
    start, end = as_states(triples, first, closing)
    states, scores = viterbi(transitions.state_emissions(emissions), transitions, start, end, lengths)
    labels = transitions.labels_of_states(states)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for k, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, path_scores = enumerate_second_order(emissions[a:b], triples, first, closing)
        best = int(np.argmax(path_scores))
        np.testing.assert_array_equal(labels[a:b], paths[best])
        assert scores[k] == pytest.approx(path_scores[best], abs=1e-9)
        # the pair states are consistent: state t is (label t-1, label t)
        before = np.concatenate([[n_labels], paths[best][:-1]])
        np.testing.assert_array_equal(states[a:b], before * n_labels + paths[best])


def test_second_order_with_impossible_triples():
    """Zero-probability triples (-inf scores) are excluded, not NaN."""
    emissions, triples, first, closing = random_second_order(7, 3, [4, 2])
    triples[:, 0, 1] = -np.inf
    triples[0, :, :] = -np.inf
    transitions = SecondOrderTransitions(triples)
    start, end = as_states(triples, first, closing)
    for semiring in (ScaledSemiring, LogSemiring):
        result = forward_backward(transitions.state_emissions(emissions), transitions, start, end, [4, 2], semiring=semiring)
        assert np.all(np.isfinite(result.log_z))
        paths, scores = enumerate_second_order(emissions[:4], triples, first, closing)
        assert result.log_z[0] == pytest.approx(logsumexp(scores), abs=1e-9)


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_second_order_edge_marginals(seed, n_labels, lengths):
    """The generic per-edge marginals serve the pair-state operator: (T, L + 1, L, L) triples."""
    emissions, triples, first, closing = random_second_order(seed + 40, n_labels, lengths)
    transitions = SecondOrderTransitions(triples)
    start, end = as_states(triples, first, closing)
    edges = edge_marginals(transitions.state_emissions(emissions), transitions, start, end, lengths)
    L = n_labels
    assert edges.shape == (int(np.sum(lengths)), L + 1, L, L)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for a, b in zip(offsets[:-1], offsets[1:]):
        paths, scores = enumerate_second_order(emissions[a:b], triples, first, closing)
        p = np.exp(scores - logsumexp(scores))
        assert np.all(edges[a] == 0)
        for t in range(1, b - a):
            before = paths[:, t - 2] if t >= 2 else np.full(len(paths), L)
            expected = np.zeros((L + 1, L, L))
            np.add.at(expected, (before, paths[:, t - 1], paths[:, t]), p)
            np.testing.assert_allclose(edges[a + t], expected, atol=1e-10)


@pytest.mark.parametrize("semiring", [ScaledSemiring, LogSemiring])
def test_a_step_whose_messages_sit_in_before_start_states_only_contracts_to_nothing(semiring, monkeypatch):
    """Backward through a step where only before-start states (which no edge enters) carry a
    message, few enough for the contraction by active entries: nothing flows back, as in the
    dense product (it used to fail on the empty set of active entries)."""
    from crf import _transitions

    L = 3
    scores = np.random.default_rng(0).normal(size=(L + 1, L, L))
    lifted = SecondOrderTransitions(scores).lift(semiring)[1]
    weighted = np.full((2, (L + 1) * L), semiring.zero)
    weighted[0, L * L + 1] = semiring.weights(np.array([-0.3]))[0]
    sparse = lifted.backward(weighted)
    monkeypatch.setattr(_transitions, "SPARSE_BELOW", 0.0)
    np.testing.assert_array_equal(sparse, lifted.backward(weighted))
    assert np.all(sparse == semiring.zero)

"""Second-order chains through the shared recursions, against brute-force enumeration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import logsumexp

from crf.chain import LogSemiring, ScaledSemiring, SecondOrderTransitions, forward_backward, viterbi

CASES = [(0, 2, [1, 4, 3]), (1, 3, [5, 2, 1, 4]), (2, 4, [3, 3]), (3, 3, [6])]


def random_second_order(seed: int, n_labels: int, lengths, scale: float = 1.0):
    """Per-label emissions (T, L), triple scores (L + 1, L, L), first-label and closing scores."""
    rng = np.random.default_rng(seed)
    L = n_labels
    emissions = scale * rng.normal(size=(int(np.sum(lengths)), L))
    triples = scale * rng.normal(size=(L + 1, L, L))
    first = scale * rng.normal(size=L)  # score of y_0 (after two start symbols)
    closing = scale * rng.normal(size=(L + 1, L))  # score of ending after (y_{n-2}, y_{n-1})
    return emissions, triples, first, closing


def as_states(triples, first, closing):
    """Start and end per pair state (S,) for the pair-state chain."""
    L = triples.shape[1]
    start = np.full((L + 1, L), -np.inf)
    start[L] = first
    return start.ravel(), closing.ravel()


def enumerate_second_order(emissions, triples, first, closing):
    """(paths (K, n), scores (K,)) of one sequence under the second-order model."""
    n, L = emissions.shape
    paths = np.array(list(itertools.product(range(L), repeat=n)), dtype=np.int64)
    scores = first[paths[:, 0]] + emissions[np.arange(n), paths].sum(axis=1)
    for t in range(1, n):
        before = paths[:, t - 2] if t >= 2 else np.full(len(paths), L)
        scores = scores + triples[before, paths[:, t - 1], paths[:, t]]
    before_last = paths[:, -2] if n >= 2 else np.full(len(paths), L)
    return paths, scores + closing[before_last, paths[:, -1]]


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

"""k-best Viterbi against the top k of brute-force enumeration of every label sequence."""

from __future__ import annotations

import conftest as oracle  # brute-force enumeration and random chains
import numpy as np
import pytest

from crf import _chain as chain

# seeds x label counts 2..4 x sequence lengths 1..6 (several sequences of different lengths at once)
CASES = [
    (seed, L, lengths)
    for seed, (L, lengths) in enumerate(
        [
            (2, [1]),
            (2, [3, 1, 2, 6]),
            (3, [4, 2, 6, 1]),
            (3, [5, 5, 3]),
            (4, [1, 2, 3, 4]),
            (4, [6, 1, 4, 2]),
            (2, [6, 6, 5]),
            (3, [6]),
        ]
    )
]


def check_kbest(labels, scores, k, lengths, enumerate_one, label_of=lambda states: states):
    """Every sequence's k best paths and scores equal the top k of its enumerated paths; places
    beyond the number of paths have score -inf and labels -1."""
    assert labels.shape == (k, int(np.sum(lengths))) and scores.shape == (len(lengths), k)
    for i, (a, b) in enumerate(oracle.sequence_slices(lengths)):
        paths, all_scores = enumerate_one(a, b)
        finite = np.isfinite(all_scores)
        paths, all_scores = paths[finite], all_scores[finite]
        order = np.argsort(-all_scores, kind="stable")
        found = min(k, order.size)
        np.testing.assert_allclose(scores[i, :found], all_scores[order[:found]], rtol=1e-12, atol=1e-10)
        assert np.all(np.diff(scores[i, :found]) <= 0)
        for j in range(found):
            np.testing.assert_array_equal(label_of(labels[j, a:b]), paths[order[j]])
        assert np.all(scores[i, found:] == -np.inf)
        assert np.all(labels[found:, a:b] == -1)


@pytest.mark.parametrize("k", [1, 3, 7, 100])
@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_kbest_matches_enumeration(seed, n_labels, lengths, k):
    emissions, transitions, start, end = oracle.random_chain(seed + 500, n_labels, lengths, scale=2.0)
    labels, scores = chain.kbest_viterbi(emissions, transitions, start, end, lengths, k)
    check_kbest(labels, scores, k, lengths, lambda a, b: oracle.enumerate_paths(emissions[a:b], transitions, start, end))


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_one_best_is_viterbi(seed, n_labels, lengths):
    emissions, transitions, start, end = oracle.random_chain(seed + 600, n_labels, lengths, scale=2.0)
    labels, scores = chain.kbest_viterbi(emissions, transitions, start, end, lengths, 1)
    best, best_scores = chain.viterbi(emissions, transitions, start, end, lengths)
    np.testing.assert_array_equal(labels[0], best)
    np.testing.assert_allclose(scores[:, 0], best_scores, rtol=1e-12)


@pytest.mark.parametrize("seed,n_labels,lengths", CASES[1:6])
def test_kbest_with_impossible_transitions_and_constraints(seed, n_labels, lengths):
    """-inf transitions and disallowed labels remove paths: fewer than k may remain."""
    emissions, transitions, start, end = oracle.random_chain(seed + 700, n_labels, lengths, scale=1.5)
    transitions[0, 1] = -np.inf
    allowed = oracle.random_allowed(np.random.default_rng(seed), emissions.shape[0], n_labels)
    k = 40
    labels, scores = chain.kbest_viterbi(emissions, transitions, start, end, lengths, k, allowed=allowed)

    def allowed_paths(a, b):
        paths, path_scores = oracle.enumerate_paths(emissions[a:b], transitions, start, end)
        keep = allowed[np.arange(a, b), paths].all(axis=1)
        return paths[keep], path_scores[keep]

    check_kbest(labels, scores, k, lengths, allowed_paths)


@pytest.mark.parametrize("k", [1, 4, 50])
@pytest.mark.parametrize("seed,n_labels,lengths", [(0, 2, [1, 4, 3]), (1, 3, [5, 2, 1, 4]), (2, 4, [3, 3]), (3, 3, [6])])
def test_second_order_kbest(seed, n_labels, lengths, k):
    emissions, triples, first, closing = oracle.random_second_order(seed + 800, n_labels, lengths, scale=2.0)
    transitions = chain.SecondOrderTransitions(triples)
    start, end = oracle.second_order_states(triples, first, closing)
    states, scores = chain.kbest_viterbi(transitions.state_emissions(emissions), transitions, start, end, lengths, k)

    def label_of(path_states):
        assert np.all(path_states >= 0)
        return transitions.labels_of_states(path_states)

    check_kbest(
        states, scores, k, lengths, lambda a, b: oracle.enumerate_second_order(emissions[a:b], triples, first, closing), label_of
    )
    # every kept path's pair states are consistent: state t is (label t-1, label t)
    for a, b in oracle.sequence_slices(lengths):
        for j in range(min(k, n_labels ** (b - a))):
            path = transitions.labels_of_states(states[j, a:b])
            np.testing.assert_array_equal(states[j, a:b], np.concatenate([[n_labels], path[:-1]]) * n_labels + path)


def test_bad_k():
    emissions, transitions, start, end = oracle.random_chain(0, 2, [3])
    with pytest.raises(ValueError, match="k must be a positive integer"):
        chain.kbest_viterbi(emissions, transitions, start, end, [3], 0)

"""Constrained decoding and marginals (``allowed`` masks) against enumeration of the allowed paths."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import (
    enumerate_paths,
    enumerate_second_order,
    random_allowed,
    random_chain,
    random_second_order,
    second_order_states,
    sequence_slices,
)
from scipy.special import logsumexp

from crf import _chain as chain

CASES = [
    (seed, L, lengths)
    for seed, (L, lengths) in enumerate(
        [(2, [1]), (2, [3, 1, 2]), (3, [4, 2, 6, 1]), (4, [5, 5, 3]), (4, [6, 1, 4, 2]), (3, [6])]
    )
]


def allowed_paths(emissions, transitions, start, end, allowed, a, b):
    paths, scores = enumerate_paths(emissions[a:b], transitions, start, end)
    keep = allowed[np.arange(a, b), paths].all(axis=1)
    return paths[keep], scores[keep]


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_constrained_viterbi(seed, n_labels, lengths):
    emissions, transitions, start, end = random_chain(seed + 900, n_labels, lengths, scale=2.0)
    allowed = random_allowed(np.random.default_rng(seed), emissions.shape[0], n_labels)
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths, allowed=allowed)
    assert np.all(allowed[np.arange(labels.size), labels])
    for i, (a, b) in enumerate(sequence_slices(lengths)):
        paths, path_scores = allowed_paths(emissions, transitions, start, end, allowed, a, b)
        best = int(np.argmax(path_scores))
        np.testing.assert_array_equal(labels[a:b], paths[best])
        assert scores[i] == pytest.approx(path_scores[best], abs=1e-10)


@pytest.mark.parametrize("semiring", [chain.ScaledSemiring, chain.LogSemiring])
@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_constrained_marginals(seed, n_labels, lengths, semiring):
    emissions, transitions, start, end = random_chain(seed + 1000, n_labels, lengths, scale=1.5)
    allowed = random_allowed(np.random.default_rng(seed), emissions.shape[0], n_labels)
    before = emissions.copy()
    posterior = chain.forward_backward(emissions, transitions, start, end, lengths, semiring=semiring, allowed=allowed)
    np.testing.assert_array_equal(emissions, before)  # the caller's array is not touched
    log_z = chain.log_partition(emissions, transitions, start, end, lengths, allowed=allowed)
    counts = np.zeros((n_labels, n_labels))
    for i, (a, b) in enumerate(sequence_slices(lengths)):
        paths, scores = allowed_paths(emissions, transitions, start, end, allowed, a, b)
        assert posterior.log_z[i] == pytest.approx(logsumexp(scores), abs=1e-10)
        assert log_z[i] == pytest.approx(logsumexp(scores), abs=1e-10)
        p = np.exp(scores - logsumexp(scores))
        for t in range(b - a):
            np.testing.assert_allclose(posterior.marginals[a + t], np.bincount(paths[:, t], p, n_labels), atol=1e-10)
            if t > 0:
                np.add.at(counts, (paths[:, t - 1], paths[:, t]), p)
    np.testing.assert_allclose(posterior.transition_counts, counts, atol=1e-9)
    assert np.all(posterior.marginals[~allowed] == 0)


def test_fixing_one_token_propagates():
    """Correction propagation: fixing one token's label re-decodes its neighbours."""
    L, lengths = 3, [5]
    emissions, transitions, start, end = random_chain(42, L, lengths, scale=2.0)
    free, _ = chain.viterbi(emissions, transitions, start, end, lengths)
    fixed_label = (free[2] + 1) % L
    allowed = np.ones((5, L), dtype=bool)
    allowed[2] = False
    allowed[2, fixed_label] = True
    labels, score = chain.viterbi(emissions, transitions, start, end, lengths, allowed=allowed)
    assert labels[2] == fixed_label
    paths, scores = enumerate_paths(emissions, transitions, start, end)
    on_fixed = paths[:, 2] == fixed_label
    np.testing.assert_array_equal(labels, paths[on_fixed][np.argmax(scores[on_fixed])])
    marginals = chain.forward_backward(emissions, transitions, start, end, lengths, allowed=allowed).marginals
    np.testing.assert_allclose(marginals[2], np.eye(L)[fixed_label], atol=1e-12)


def test_large_weights_with_constraints_fall_back_exactly():
    """Weights of hundreds underflow the scaled recursion; the log-space redo keeps the mask."""
    lengths = [6, 3, 5]
    emissions, transitions, start, end = random_chain(11, 4, lengths, scale=400.0)
    allowed = random_allowed(np.random.default_rng(11), emissions.shape[0], 4)
    for packed in (False, True):
        layout = chain.Layout.from_lengths(lengths)
        em, mask = (emissions[layout.token_of_row], allowed[layout.token_of_row]) if packed else (emissions, allowed)
        scaled = chain.forward_backward(em, transitions, start, end, layout, packed=packed, allowed=mask)
        exact = chain.forward_backward(
            em, transitions, start, end, layout, packed=packed, allowed=mask, semiring=chain.LogSemiring
        )
        np.testing.assert_allclose(scaled.log_z, exact.log_z, rtol=1e-12)
        np.testing.assert_allclose(scaled.marginals, exact.marginals, atol=1e-9)
        for i, (a, b) in enumerate(sequence_slices(lengths)):
            _, scores = allowed_paths(emissions, transitions, start, end, allowed, a, b)
            assert scaled.log_z[i] == pytest.approx(logsumexp(scores), rel=1e-12)


@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_windows_of_a_first_order_chain_match_enumeration_at_any_scale(scale):
    """The compiled log-space forward over all windows at once (whole sequences, first and last
    tokens, an impossible window; a window of a sequence of probability 0) against enumeration,
    with weights of hundreds of nats (windows of probability e^-1000 keep their log); per-label and per-state masks
    of a chain over hidden labels (states 2L, state s carrying label s % L) give the same."""
    lengths, L = [1, 4, 5, 3], 3
    emissions, transitions, start, end = random_chain(21, L, lengths, scale=scale)
    emissions[2, :] = -np.inf  # sequence 1 has no path
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # messages in log space: the scaled recursion's are -inf below 1e-308 of a step's largest
    exact = {"keep_messages": True, "semiring": chain.LogSemiring}
    posterior = chain.forward_backward(emissions, transitions, start, end, lengths, **exact)
    rng = np.random.default_rng(int(scale))
    sequence, first, masks, expected = [], [], [], []
    for i, (a, b) in enumerate(sequence_slices(lengths)):
        paths, scores = enumerate_paths(emissions[a:b], transitions, start, end)
        for s, width in {(0, b - a), (0, 1), (b - a - 1, 1), (int(rng.integers(0, b - a)), 1)}:
            for impossible in (False, True):
                allowed = rng.random((width, L)) < 0.6
                allowed[np.arange(width), rng.integers(0, L, width)] = True
                allowed[0] &= not impossible
                keep = allowed[np.arange(width), paths[:, s : s + width]].all(axis=1)
                total = logsumexp(scores)
                expected.append(logsumexp(scores[keep]) - total if keep.any() and np.isfinite(total) else -np.inf)
                sequence.append(i)
                first.append(s)
                masks.append(allowed)
    window_offsets = np.concatenate([[0], np.cumsum([len(m) for m in masks])])
    windows = (offsets, np.array(sequence), np.array(first), np.concatenate(masks), window_offsets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" from -inf - -inf
        got = chain.constrained_log_probability(
            posterior.log_alpha, posterior.log_beta, posterior.log_z, emissions, transitions, start, *windows
        )
    expected = np.array(expected)
    impossible = np.isneginf(expected) | np.isin(np.array(sequence), [1])
    assert impossible.any() and (~impossible).any()
    assert np.all(np.isneginf(got[np.isneginf(expected) & ~np.isin(np.array(sequence), [1])]))
    assert np.all(np.isneginf(got[np.array(sequence) == 1]))  # the sequence itself has probability 0: so has each window
    np.testing.assert_allclose(got[~impossible], expected[~impossible], rtol=1e-10, atol=1e-10)
    # the same chain over 2L hidden labels (two copies of every label), per-state masks
    hidden = np.tile(transitions, (2, 2)) - np.log(2.0)
    hidden_emissions, hidden_start, hidden_end = np.tile(emissions, 2), np.tile(start, 2), np.tile(end, 2)
    doubled = chain.forward_backward(hidden_emissions, hidden, hidden_start, hidden_end, lengths, **exact)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = chain.constrained_log_probability(
            doubled.log_alpha, doubled.log_beta, doubled.log_z, hidden_emissions, hidden, hidden_start,
            *windows[:3], np.tile(windows[3], 2), windows[4],
        )  # fmt: skip
    np.testing.assert_allclose(again[~impossible], got[~impossible], rtol=1e-10, atol=1e-10)
    assert np.all(np.isneginf(again[np.array(sequence) == 1]))


def test_impossible_constraint():
    emissions, transitions, start, end = random_chain(5, 3, [4, 2])
    allowed = np.ones((6, 3), dtype=bool)
    allowed[1] = False  # no label allowed at token 1 of the first sequence
    labels, scores = chain.viterbi(emissions, transitions, start, end, [4, 2], allowed=allowed)
    assert scores[0] == -np.inf and np.isfinite(scores[1])
    posterior = chain.forward_backward(emissions, transitions, start, end, [4, 2], allowed=allowed)
    assert posterior.log_z[0] == -np.inf and np.isfinite(posterior.log_z[1])
    np.testing.assert_allclose(posterior.marginals[4:].sum(axis=1), 1.0)


def test_bad_mask_shape():
    emissions, transitions, start, end = random_chain(5, 3, [4])
    with pytest.raises(ValueError, match="allowed must have shape"):
        chain.viterbi(emissions, transitions, start, end, [4], allowed=np.ones((4, 2), dtype=bool))


@pytest.mark.parametrize("seed,n_labels,lengths", [(0, 2, [1, 4, 3]), (1, 3, [5, 2, 1, 4]), (2, 4, [3, 3])])
def test_second_order_constraints_per_label(seed, n_labels, lengths):
    """A per-label (T, L) mask on a pair-state chain constrains the states' second label."""
    emissions, triples, first, closing = random_second_order(seed + 1100, n_labels, lengths, scale=1.5)
    transitions = chain.SecondOrderTransitions(triples)
    start, end = second_order_states(triples, first, closing)
    allowed = random_allowed(np.random.default_rng(seed), emissions.shape[0], n_labels)
    state_emissions = transitions.state_emissions(emissions)
    states, scores = chain.viterbi(state_emissions, transitions, start, end, lengths, allowed=allowed)
    posterior = chain.forward_backward(state_emissions, transitions, start, end, lengths, allowed=allowed)
    labels = transitions.labels_of_states(states)
    node = posterior.marginals.reshape(-1, n_labels + 1, n_labels).sum(axis=1)
    for i, (a, b) in enumerate(sequence_slices(lengths)):
        paths, path_scores = enumerate_second_order(emissions[a:b], triples, first, closing)
        keep = allowed[np.arange(a, b), paths].all(axis=1)
        paths, path_scores = paths[keep], path_scores[keep]
        np.testing.assert_array_equal(labels[a:b], paths[np.argmax(path_scores)])
        assert scores[i] == pytest.approx(path_scores.max(), abs=1e-9)
        assert posterior.log_z[i] == pytest.approx(logsumexp(path_scores), abs=1e-9)
        p = np.exp(path_scores - logsumexp(path_scores))
        for t in range(b - a):
            np.testing.assert_allclose(node[a + t], np.bincount(paths[:, t], p, n_labels), atol=1e-9)


@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_entropy(seed, n_labels, lengths, constrained):
    emissions, transitions, start, end = random_chain(seed + 1200, n_labels, lengths, scale=1.5)
    transitions[0, 1] = -np.inf  # impossible transitions contribute nothing, not NaN
    allowed = random_allowed(np.random.default_rng(seed), emissions.shape[0], n_labels) if constrained else None
    got = chain.entropy(emissions, transitions, start, end, lengths, allowed=allowed)
    mask = np.ones(emissions.shape, dtype=bool) if allowed is None else allowed
    for i, (a, b) in enumerate(sequence_slices(lengths)):
        _, scores = allowed_paths(emissions, transitions, start, end, mask, a, b)
        p = np.exp(scores - logsumexp(scores))
        p = p[p > 0]
        assert got[i] == pytest.approx(-np.sum(p * np.log(p)), abs=1e-9)


def test_second_order_entropy():
    lengths = [1, 4, 3]
    emissions, triples, first, closing = random_second_order(5, 3, lengths)
    transitions = chain.SecondOrderTransitions(triples)
    start, end = second_order_states(triples, first, closing)
    got = chain.entropy(transitions.state_emissions(emissions), transitions, start, end, lengths)
    for i, (a, b) in enumerate(sequence_slices(lengths)):
        _, scores = enumerate_second_order(emissions[a:b], triples, first, closing)
        p = np.exp(scores - logsumexp(scores))
        assert got[i] == pytest.approx(-np.sum(p * np.log(p)), abs=1e-9)

"""Chain recursions against brute-force enumeration of every label sequence."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from conftest import enumerate_paths, random_chain
from scipy.special import logsumexp

from crf import _chain as chain
from crf._transitions import _pick

CASES = [
    (seed, L, lengths)
    for seed, (L, lengths) in enumerate(
        [
            (2, [1]),
            (2, [3, 1, 2]),
            (3, [4, 2, 6, 1]),
            (4, [5, 5, 3]),
            (4, [6, 1, 4, 2]),
            (3, [6]),
        ]
    )
]


def _per_sequence(lengths):
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return list(zip(offsets[:-1], offsets[1:]))


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
@pytest.mark.parametrize("semiring", [chain.ScaledSemiring, chain.LogSemiring])
def test_log_z_and_marginals_match_enumeration(seed, n_labels, lengths, semiring):
    emissions, transitions, start, end = random_chain(seed, n_labels, lengths, scale=1.5)
    posterior = chain.forward_backward(emissions, transitions, start, end, lengths, semiring=semiring)
    edges = chain.edge_marginals(emissions, transitions, start, end, lengths)
    expected_counts = np.zeros((n_labels, n_labels))
    for i, (a, b) in enumerate(_per_sequence(lengths)):
        paths, scores = enumerate_paths(emissions[a:b], transitions, start, end)
        log_z = logsumexp(scores)
        assert posterior.log_z[i] == pytest.approx(log_z, abs=1e-10)
        probs = np.exp(scores - log_z)
        for t in range(b - a):
            node = np.bincount(paths[:, t], weights=probs, minlength=n_labels)
            np.testing.assert_allclose(posterior.marginals[a + t], node, atol=1e-10)
            if t > 0:
                pair = np.bincount(paths[:, t - 1] * n_labels + paths[:, t], weights=probs, minlength=n_labels**2)
                np.testing.assert_allclose(edges[a + t], pair.reshape(n_labels, n_labels), atol=1e-10)
                expected_counts += pair.reshape(n_labels, n_labels)
        assert np.all(edges[a] == 0)
    np.testing.assert_allclose(posterior.transition_counts, expected_counts, atol=1e-9)


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_viterbi_matches_enumeration(seed, n_labels, lengths):
    emissions, transitions, start, end = random_chain(seed + 100, n_labels, lengths, scale=2.0)
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths)
    for i, (a, b) in enumerate(_per_sequence(lengths)):
        paths, all_scores = enumerate_paths(emissions[a:b], transitions, start, end)
        best = int(np.argmax(all_scores))
        np.testing.assert_array_equal(labels[a:b], paths[best])
        assert scores[i] == pytest.approx(all_scores[best], abs=1e-10)


def _reference_viterbi(emissions, transitions, start, end):
    """One sequence's best path by the textbook recursion with stored back pointers (ties: the
    first label), independent of crf._chain: (labels (n,), score)."""
    score, back = start + emissions[0], []
    for t in range(1, emissions.shape[0]):
        candidates = score[:, None] + transitions
        back.append(candidates.argmax(axis=0))
        score = candidates.max(axis=0) + emissions[t]
    path = [int(np.argmax(score + end))]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return np.array(path[::-1]), float(np.max(score + end))


@pytest.mark.parametrize("integers", [False, True])
def test_viterbi_with_many_labels_matches_the_textbook_recursion(integers):
    """40 labels: the max-product step skips the terms that cannot win (peaked emissions, as in a
    trained model), and back pointers are found after the forward pass. Integer scores make
    exact ties, which must go to the first label as in the textbook recursion."""
    rng = np.random.default_rng(7)
    L, lengths = 40, [1, 2, 9, 30, 5, 17, 3]
    emissions = 8.0 * rng.normal(size=(sum(lengths), L))
    transitions, start, end = rng.normal(size=(L, L)), rng.normal(size=L), rng.normal(size=L)
    if integers:
        emissions, transitions, start, end = (np.round(x / 2) for x in (emissions, transitions, start, end))
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths)
    for i, (a, b) in enumerate(_per_sequence(lengths)):
        path, score = _reference_viterbi(emissions[a:b], transitions, start, end)
        np.testing.assert_array_equal(labels[a:b], path)
        assert scores[i] == pytest.approx(score, abs=1e-9)


@pytest.mark.filterwarnings("error")
def test_bounded_max_product_is_the_full_maximum_to_the_bit(monkeypatch):
    """The bounded (n, m) x (m, p) max-product equals the running maximum over every term, also
    with -inf entries, ties and rows where nothing is finite; it really is the bounded path, and
    -inf + inf while skipping raises no warning."""
    rng = np.random.default_rng(3)
    a = np.round(20.0 * rng.normal(size=(500, 36)))
    b = np.round(rng.normal(size=(36, 36)))
    b -= b.max(axis=0)  # lifted: every column peaks at 0
    b[:2, rng.random(36) < 0.3] = -np.inf  # terms that cannot reach some labels
    b[5] = -np.inf  # and one that reaches none
    a[rng.random(a.shape) < 0.1] = -np.inf
    a[7] = -np.inf
    a[8, 5] = a[8].max() + 1.0  # the best term of a row reaches nothing
    full = chain.MaxSemiring._running_max(a, b)
    monkeypatch.setattr(chain.MaxSemiring, "_running_max", staticmethod(lambda *args: pytest.fail("no term skipped")))
    assert chain.MaxSemiring.skips_terms(a, b)
    bounded = chain.MaxSemiring.matmul(a, b)
    np.testing.assert_array_equal(bounded, full)
    assert np.all(bounded[7] == -np.inf)
    # the bound is tight enough to skip most terms, and every entry still comes from a kept one
    spread = chain.MaxSemiring.spread(b)
    best = a.argmax(axis=1)
    with np.errstate(invalid="ignore"):
        kept = a + spread.T[best] >= a[np.arange(a.shape[0]), best][:, None]
    assert kept.mean() < 0.12


def test_max_product_falls_back_to_every_term_when_little_can_be_skipped(monkeypatch):
    """A table where most terms can beat the best one somewhere (many -inf entries, so spreads
    are infinite) takes the running maximum: the same bits either way."""
    rng = np.random.default_rng(4)
    a = np.round(5.0 * rng.normal(size=(400, 40)))
    b = np.round(rng.normal(size=(40, 40)))
    b[rng.random(b.shape) < 0.05] = -np.inf
    full = chain.MaxSemiring._running_max(a, b)
    calls = []
    monkeypatch.setattr(chain.MaxSemiring, "_running_max", staticmethod(lambda *args: calls.append(1) or full))
    assert chain.MaxSemiring.skips_terms(a, b)
    np.testing.assert_array_equal(chain.MaxSemiring.matmul(a, b), full)
    assert calls


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_max_product_with_nan_or_infinite_weights_skips_no_term(bad):
    """NaN (or +inf meeting -inf) in a table must come out as NaN, as the full maximum gives it:
    no term of such a table is skipped."""
    rng = np.random.default_rng(6)
    a = np.round(20.0 * rng.normal(size=(300, 30)))
    b = np.round(rng.normal(size=(30, 30)))
    b[3, 7] = bad
    a[:, 3] = -np.inf
    a[:5, 3] = 0.0 if np.isnan(bad) else -np.inf
    assert chain.MaxSemiring.spread(b) is None
    with np.errstate(invalid="ignore"):
        full = chain.MaxSemiring._running_max(a, b)
        np.testing.assert_array_equal(chain.MaxSemiring.matmul(a, b), full)
    assert np.isnan(full).any()


def test_max_product_bounds_hold_for_the_exact_differences():
    """``spread`` is an upper bound of every difference of two rows, never below it after
    rounding: for entries of very different size the rounded difference can come out low."""
    rng = np.random.default_rng(5)
    b = rng.normal(size=(30, 30)) * 10.0 ** rng.integers(-8, 3, size=(30, 30))
    spread = chain.MaxSemiring.spread(b)
    exact = np.array([[max(Fraction(x) - Fraction(y) for x, y in zip(b[i], b[k])) for k in range(30)] for i in range(30)])
    assert all(Fraction(spread[i, k]) >= exact[i, k] for i in range(30) for k in range(30))


def test_skip_bounds_are_worked_out_once_per_batch_and_not_for_one_sentence(monkeypatch):
    """The m * m * p bounds are paid for once in a Viterbi pass whose first step has at least m
    rows, and never for one sentence (with 200 labels they would cost more than the pass); the
    shared max-product recursion on a first-order table (chain.viterbi runs the compiled kernel)."""
    rng = np.random.default_rng(8)
    L = 200
    transitions, start, end = rng.normal(size=(L, L)), rng.normal(size=L), rng.normal(size=L)
    calls = []
    spread = chain.MaxSemiring.spread
    monkeypatch.setattr(chain.MaxSemiring, "spread", staticmethod(lambda b: calls.append(1) or spread(b)))
    one = 5.0 * rng.normal(size=(12, L))
    labels = chain._best_paths(one, transitions, start, end, [12], None, chain.MaxSemiring)[0][:, 0]
    np.testing.assert_array_equal(labels, _reference_viterbi(one, transitions, start, end)[0])
    assert calls == []
    lengths = rng.integers(4, 7, size=L + 20)  # three steps with all L + 20 rows: one working-out
    batch = 5.0 * rng.normal(size=(int(lengths.sum()), L))
    labels = chain._best_paths(batch, transitions, start, end, lengths, None, chain.MaxSemiring)[0][:, 0]
    assert calls == [1]
    for a, b in list(_per_sequence(lengths))[:20]:
        np.testing.assert_array_equal(labels[a:b], _reference_viterbi(batch[a:b], transitions, start, end)[0])


@pytest.mark.parametrize("rows", [1, 3, 60])
def test_max_product_of_a_few_rows_in_one_step_is_the_running_maximum(monkeypatch, rows):
    """Few rows (a short sentence, the tail of a batch) take one broadcast maximum: the same bits
    as the loop over terms, with -inf entries and ties."""
    rng = np.random.default_rng(rows)
    a, b = np.round(3.0 * rng.normal(size=(rows, 22))), np.round(rng.normal(size=(22, 22)))
    a[rng.random(a.shape) < 0.1], b[rng.random(b.shape) < 0.05] = -np.inf, -np.inf
    assert a.size * b.shape[1] <= chain.MaxSemiring.ONE_STEP_CELLS
    full = chain.MaxSemiring._running_max(a, b)
    monkeypatch.setattr(chain.MaxSemiring, "_running_max", staticmethod(lambda *args: pytest.fail("not one step")))
    np.testing.assert_array_equal(chain.MaxSemiring.matmul(a, b), full)


def test_back_pointer_of_scalar_values_is_the_semirings_first_arg_max():
    """The backtrack's shortcut for one number per value takes what ``MaxSemiring.argtop`` takes:
    the first of equal terms, and the first term of a row that is all -inf."""
    candidates = np.array([[[1.0, 3.0, 3.0], [-np.inf, -np.inf, -np.inf]], [[2.0, 2.0, -np.inf], [0.0, -1.0, 5.0]]])
    expected = chain.MaxSemiring.argtop(candidates.reshape(4, 3))[1].reshape(2, 2)
    picked = _pick(chain.MaxSemiring, candidates, np.zeros((2, 2), dtype=np.int64))
    np.testing.assert_array_equal(picked, expected)
    np.testing.assert_array_equal(picked, [[1, 0], [0, 2]])


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_sequence_scores_and_probabilities(seed, n_labels, lengths):
    emissions, transitions, start, end = random_chain(seed + 200, n_labels, lengths)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_labels, size=int(np.sum(lengths)))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    scores = chain.sequence_scores(emissions, transitions, start, end, offsets, labels)
    log_z = chain.log_partition(emissions, transitions, start, end, lengths)
    for i, (a, b) in enumerate(_per_sequence(lengths)):
        paths, all_scores = enumerate_paths(emissions[a:b], transitions, start, end)
        match = np.flatnonzero((paths == labels[a:b]).all(axis=1))[0]
        assert scores[i] == pytest.approx(all_scores[match], abs=1e-12)
        assert np.exp(scores[i] - log_z[i]) == pytest.approx(np.exp(all_scores[match] - logsumexp(all_scores)), rel=1e-9)


@pytest.mark.parametrize("seed,n_labels,lengths", CASES)
def test_constrained_windows_match_enumeration(seed, n_labels, lengths):
    emissions, transitions, start, end = random_chain(seed + 300, n_labels, lengths, scale=1.5)
    posterior = chain.forward_backward(emissions, transitions, start, end, lengths, keep_messages=True)
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    sequence, first, masks, expected = [], [], [], []
    for i, n in enumerate(lengths):
        for _ in range(4):
            s = int(rng.integers(0, n))
            width = int(rng.integers(1, n - s + 1))
            allowed = rng.random((width, n_labels)) < 0.5
            allowed[np.arange(width), rng.integers(0, n_labels, size=width)] = True
            paths, scores = enumerate_paths(emissions[offsets[i] : offsets[i + 1]], transitions, start, end)
            keep = allowed[np.arange(width), paths[:, s : s + width]].all(axis=1)
            expected.append(np.exp(logsumexp(scores[keep]) - logsumexp(scores)))
            sequence.append(i)
            first.append(s)
            masks.append(allowed)
    window_offsets = np.concatenate([[0], np.cumsum([len(m) for m in masks])])
    got = chain.constrained_log_probability(
        posterior.log_alpha,
        posterior.log_beta,
        posterior.log_z,
        emissions,
        transitions,
        start,
        offsets,
        np.array(sequence),
        np.array(first),
        np.concatenate(masks),
        window_offsets,
    )
    np.testing.assert_allclose(np.exp(got), expected, rtol=1e-9, atol=1e-12)


def test_impossible_constraint_has_probability_zero():
    emissions, transitions, start, end = random_chain(7, 3, [4])
    posterior = chain.forward_backward(emissions, transitions, start, end, [4], keep_messages=True)
    none_allowed = np.zeros((1, 3), dtype=bool)
    got = chain.constrained_log_probability(
        posterior.log_alpha,
        posterior.log_beta,
        posterior.log_z,
        emissions,
        transitions,
        start,
        np.array([0, 4]),
        np.array([0]),
        np.array([2]),
        none_allowed,
        np.array([0, 1]),
    )
    assert got[0] == -np.inf


@pytest.mark.parametrize("n_tokens", [4, 5])
def test_results_where_flushed_values_matter_later_are_exact(n_tokens):
    """Scores ~115 and ~1000 nats apart: the scaled recursion flushes to zero forward and backward
    values that later carry the best paths (with 5 tokens the forward log Z alone would be -300
    against the true -230; with 4 the flushed alpha and beta barely overlap). Such sequences are
    found (a flush in one pass breaks alpha . beta = Z at some token) and recomputed: log Z,
    marginals and counts equal the log-space recursion's."""
    emissions = np.array([[0.0, 0.0], [0.0, -115.0]] + [[-100.0, 0.0]] * (n_tokens - 2))
    transitions = np.array([[0.0, -1000.0], [-1000.0, 0.0]])
    start, end = np.array([0.0, -115.0]), np.zeros(2)
    scaled = chain.forward_backward(emissions, transitions, start, end, [n_tokens])
    exact = chain.forward_backward(emissions, transitions, start, end, [n_tokens], semiring=chain.LogSemiring)
    np.testing.assert_allclose(scaled.log_z, exact.log_z, rtol=1e-12)
    np.testing.assert_allclose(scaled.marginals, exact.marginals, atol=1e-12)
    np.testing.assert_allclose(scaled.transition_counts, exact.transition_counts, rtol=1e-9, atol=1e-9)


class _SharedRecursion(chain.FirstOrderTransitions):
    """A first-order table run by the shared semiring recursion (the one second-order and candidate-lattice
    chains take): chain.forward_backward runs a plain (L, L) table in the compiled kernel."""


def test_counts_of_the_healthy_sequences_beside_failed_ones_are_exact(monkeypatch):
    """The backward pass counts the edges of every sequence as it goes; when some sequences fail
    (here those of test_results_where_flushed_values_matter_later_are_exact) the others' edges
    are counted again in a second backward pass and the failed ones are redone in log space.
    Everything equals the log-space recursion, kept log messages included."""
    rng = np.random.default_rng(5)
    flushed = [[0.0, 0.0], [0.0, -115.0], [-100.0, 0.0], [-100.0, 0.0]]
    emissions = np.array(
        flushed + [[-100.0, 0.0]] + rng.normal(size=(4, 2)).tolist() + flushed + rng.normal(size=(6, 2)).tolist()
    )
    lengths = [5, 4, 4, 6]
    transitions = np.array([[0.0, -1000.0], [-1000.0, 0.0]])
    start, end = np.array([0.0, -115.0]), np.zeros(2)
    layout = chain.Layout.from_lengths(lengths)
    first = chain._forward_backward_packed(
        emissions[layout.token_of_row], chain._operator(transitions), start, end, layout, chain.ScaledSemiring, False
    )
    assert 0 < np.isnan(first.log_z).sum() < len(lengths)  # some fail in the scaled pass, some do not
    visitors = []
    backward = chain._backward

    def spy(*args):
        visitors.append(args[-1].__name__)
        return backward(*args)

    monkeypatch.setattr(chain, "_backward", spy)
    scaled = chain.forward_backward(emissions, _SharedRecursion(transitions), start, end, lengths, keep_messages=True)
    assert visitors.count("recount") == 1
    exact = chain.forward_backward(emissions, transitions, start, end, lengths, keep_messages=True, semiring=chain.LogSemiring)
    np.testing.assert_allclose(scaled.log_z, exact.log_z, rtol=1e-12)
    np.testing.assert_allclose(scaled.marginals, exact.marginals, atol=1e-12)
    np.testing.assert_allclose(scaled.transition_counts, exact.transition_counts, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(scaled.log_alpha, exact.log_alpha, rtol=1e-12)
    np.testing.assert_allclose(scaled.log_beta, exact.log_beta, rtol=1e-12)


def test_large_weights_stay_finite_and_exact():
    """Weights of hundreds overflow a naive exp; the scaled recursion must fall back to log space."""
    lengths = [6, 3, 5]
    emissions, transitions, start, end = random_chain(11, 4, lengths, scale=400.0)
    transitions[0, :] -= 2000.0  # a label that almost never leads anywhere
    scaled = chain.forward_backward(emissions, transitions, start, end, lengths, keep_messages=True)
    exact = chain.forward_backward(emissions, transitions, start, end, lengths, keep_messages=True, semiring=chain.LogSemiring)
    assert np.all(np.isfinite(scaled.log_z)) and np.all(np.isfinite(scaled.marginals))
    np.testing.assert_allclose(scaled.log_z, exact.log_z, rtol=1e-12)
    np.testing.assert_allclose(scaled.marginals, exact.marginals, atol=1e-9)
    np.testing.assert_allclose(scaled.transition_counts, exact.transition_counts, atol=1e-9)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        _, scores = enumerate_paths(emissions[a:b], transitions, start, end)
        assert scaled.log_z[i] == pytest.approx(logsumexp(scores), rel=1e-12)
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths)
    assert np.all(np.isfinite(scores))


def test_long_sequences_are_stable():
    lengths = [3000, 1200, 1]
    emissions, transitions, start, end = random_chain(3, 5, lengths, scale=3.0)
    scaled = chain.forward_backward(emissions, transitions, start, end, lengths)
    exact = chain.forward_backward(emissions, transitions, start, end, lengths, semiring=chain.LogSemiring)
    assert np.all(np.isfinite(scaled.log_z))
    np.testing.assert_allclose(scaled.log_z, exact.log_z, rtol=1e-10)
    np.testing.assert_allclose(scaled.marginals, exact.marginals, atol=1e-8)
    np.testing.assert_allclose(scaled.marginals.sum(axis=1), 1.0, atol=1e-10)
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    np.testing.assert_allclose(scores, chain.sequence_scores(emissions, transitions, start, end, offsets, labels), rtol=1e-12)


def test_layout_round_trip():
    layout = chain.Layout.from_lengths([2, 5, 1, 5, 3])
    assert sorted(layout.token_of_row.tolist()) == list(range(16))
    np.testing.assert_array_equal(layout.n_active, [5, 4, 3, 2, 2])
    np.testing.assert_array_equal(layout.order, [1, 3, 4, 0, 2])
    with pytest.raises(ValueError):
        chain.Layout.from_lengths([3, 0])


def test_marginals_without_transition_counts_are_the_same():
    emissions, transitions, start, end = random_chain(11, 4, [5, 1, 7])
    full = chain.forward_backward(emissions, transitions, start, end, [5, 1, 7], keep_messages=True)
    lean = chain.forward_backward(emissions, transitions, start, end, [5, 1, 7], keep_messages=True, counts=False)
    assert lean.transition_counts is None and full.transition_counts.shape == (4, 4)
    np.testing.assert_array_equal(lean.marginals, full.marginals)
    np.testing.assert_array_equal(lean.log_z, full.log_z)
    np.testing.assert_array_equal(lean.log_alpha, full.log_alpha)


def test_positions_within_groups_including_empty_ones():
    from crf._layout import positions_within

    assert positions_within([2, 0, 3, 1]).tolist() == [0, 1, 0, 1, 2, 0]
    assert positions_within(np.array([], dtype=np.int32)).tolist() == []
    counts = np.random.default_rng(0).integers(0, 5, size=40)
    expected = [i for c in counts for i in range(c)]
    assert positions_within(counts.astype(np.uint32)).tolist() == expected


@pytest.mark.parametrize("flushed", [False, True])
def test_emissions_used_as_working_memory_give_the_same_bits(flushed):
    """With ``emissions_again`` the recursion overwrites the caller's packed emissions instead of
    copying them, and asks for them anew only when sequences must be redone in log space."""
    if flushed:  # scores whose scaled products underflow to zero (redone in log space), and a plain one
        emissions = np.array([[0.0, -800.0], [-800.0, 0.0], [-100.0, 0.0], [-100.0, 0.0], [0.5, 0.1], [0.0, 0.2]])
        transitions, start, end = np.array([[0.0, -1000.0], [-1000.0, 0.0]]), np.array([0.0, -115.0]), np.zeros(2)
        lengths = [5, 1]
    else:
        lengths = [6, 3, 5]
        emissions, transitions, start, end = random_chain(4, 3, lengths)
    layout = chain.Layout.from_lengths(np.array(lengths))
    packed = emissions[layout.token_of_row]
    copied = chain.forward_backward(packed, transitions, start, end, layout, packed=True)
    calls = []

    def again():
        calls.append(1)
        return emissions[layout.token_of_row]

    working = packed.copy()
    reused = chain.forward_backward(working, transitions, start, end, layout, packed=True, emissions_again=again)
    assert len(calls) == int(flushed)
    assert not np.array_equal(working, packed)  # the caller's array was the working memory
    for name in ("log_z", "marginals", "transition_counts"):
        np.testing.assert_array_equal(getattr(reused, name), getattr(copied, name))
    if flushed:
        exact = chain.forward_backward(emissions, transitions, start, end, lengths, semiring=chain.LogSemiring)
        np.testing.assert_allclose(reused.log_z, exact.log_z, rtol=1e-12)
    with pytest.raises(ValueError, match="emissions_again needs packed"):
        chain.forward_backward(emissions, transitions, start, end, lengths, emissions_again=again)

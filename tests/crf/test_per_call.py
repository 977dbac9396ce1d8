"""Per-call paths (one sentence, one long sequence): the compiled kernels of crf._compiled and the
lean readers against brute force and against the batch path, result for result."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import enumerate_paths, random_chain

import crf.pycrfsuite as ours
from crf import CRF, _compiled
from crf import _chain as chain
from crf.attributes import AttributeIndex, pair_table, sequence_entries


def _offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


@pytest.mark.parametrize("integers", [False, True])
@pytest.mark.parametrize("n_labels", [1, 2, 4])
def test_compiled_viterbi_is_the_best_enumerated_path(n_labels, integers):
    """Every sequence's path is a best one of all enumerated paths, with its score; with integer
    scores (exact ties) it is the textbook recursion's (ties to the lowest previous label)."""
    lengths = [1, 2, 3, 5, 1, 4]
    emissions, transitions, start, end = random_chain(n_labels, n_labels, lengths, scale=2.0)
    if integers:
        emissions, transitions, start, end = (np.round(x) for x in (emissions, transitions, start, end))
    labels, scores = _compiled.viterbi(emissions, transitions, start, end, _offsets(lengths))
    for n, (a, b) in enumerate(zip(_offsets(lengths)[:-1], _offsets(lengths)[1:])):
        paths, path_scores = enumerate_paths(emissions[a:b], transitions, start, end)
        ours_score = path_scores[np.flatnonzero((paths == labels[a:b]).all(axis=1))[0]]
        assert ours_score == pytest.approx(path_scores.max(), abs=1e-12)
        assert scores[n] == pytest.approx(path_scores.max(), abs=1e-12)
        np.testing.assert_array_equal(labels[a:b], _textbook_viterbi(emissions[a:b], transitions, start, end))


def _textbook_viterbi(emissions, transitions, start, end) -> np.ndarray:
    """Back pointers stored at every step, ties to the first label (np.argmax)."""
    score, back = start + emissions[0], []
    for t in range(1, emissions.shape[0]):
        candidates = score[:, None] + transitions
        back.append(candidates.argmax(axis=0))
        score = candidates.max(axis=0) + emissions[t]
    path = [int(np.argmax(score + end))]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return np.array(path[::-1])


def test_compiled_viterbi_with_impossible_labels_and_sequences():
    """-inf transitions and masked labels are never chosen; a sequence with no allowed label at a
    token scores -inf."""
    lengths = [4, 3, 2]
    emissions, transitions, start, end = random_chain(3, 3, lengths)
    transitions[0, 1] = transitions[2, 2] = -np.inf
    allowed = np.ones(emissions.shape, dtype=bool)
    allowed[1, 0] = False
    allowed[5] = False  # token 1 of sequence 1: nothing allowed
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths, allowed=allowed)
    masked = np.where(allowed, emissions, -np.inf)
    for n, (a, b) in enumerate(zip(_offsets(lengths)[:-1], _offsets(lengths)[1:])):
        paths, path_scores = enumerate_paths(masked[a:b], transitions, start, end)
        if n == 1:
            assert scores[n] == -np.inf
            continue
        np.testing.assert_array_equal(labels[a:b], paths[np.argmax(path_scores)])
        assert scores[n] == pytest.approx(path_scores.max())


def test_compiled_viterbi_agrees_with_the_shared_max_product_recursion():
    """The same labels as the semiring recursion (which runs second-order and candidate-lattice chains) on
    a batch of many labels and a long sequence; scores to rounding."""
    lengths = [1, 7, 30, 400, 12]
    emissions, transitions, start, end = random_chain(5, 30, lengths, scale=3.0)
    labels, scores = chain.viterbi(emissions, transitions, start, end, lengths)
    states, shared = chain._best_paths(emissions, transitions, start, end, lengths, None, chain.MaxSemiring)
    np.testing.assert_array_equal(labels, states[:, 0])
    np.testing.assert_allclose(scores, shared[:, 0], rtol=1e-12, atol=1e-9)


def test_the_kernels_run_the_same_as_plain_python():
    """One implementation: the functions Numba compiles give the same results uncompiled."""
    lengths = [3, 1, 6]
    emissions, transitions, start, end = random_chain(9, 4, lengths)
    labels, scores = _compiled.viterbi(emissions, transitions, start, end, _offsets(lengths))
    plain_labels, plain_scores = np.zeros_like(labels), np.empty_like(scores)
    _compiled._viterbi(emissions, transitions, start, end, _offsets(lengths), None, plain_labels, plain_scores)
    np.testing.assert_array_equal(labels, plain_labels)
    np.testing.assert_array_equal(scores, plain_scores)
    # the same kernel over a candidate second-order lattice
    states, operator, start, end, _ = _candidate_lattice(np.random.default_rng(4), 5, lengths)
    slots = (operator.labels, operator.before, operator.before2)
    compiled_states, compiled_scores = _compiled.viterbi(states, operator.scores, start, end, _offsets(lengths), slots)
    plain_states, plain_scores = np.zeros_like(compiled_states), np.empty_like(compiled_scores)
    _compiled._viterbi(states, operator.scores, start, end, _offsets(lengths), slots, plain_states, plain_scores)
    np.testing.assert_array_equal(compiled_states, plain_states)
    np.testing.assert_array_equal(compiled_scores, plain_scores)


def test_rows_times_dense_gives_the_bits_of_the_sparse_product():
    """Entries in any order within a row give the bits of scipy's CSR product (sorted indices);
    a row that names a column twice gives None."""
    rng = np.random.default_rng(3)
    weights = rng.normal(size=(50, 7))
    counts = rng.integers(0, 12, size=20)
    columns = np.concatenate([rng.choice(50, size=c, replace=False) for c in counts]).astype(np.int64)
    values = rng.normal(size=columns.size)
    ends = np.cumsum(counts)
    matrix = sp.csr_matrix((values.copy(), columns.copy(), np.concatenate([[0], ends])), shape=(counts.size, 50))
    matrix.sort_indices()
    np.testing.assert_array_equal(_compiled.rows_times_dense(ends, columns, values, weights), matrix @ weights)
    columns[ends[2] - 1] = columns[ends[2] - 2]
    assert _compiled.rows_times_dense(ends, columns, values, weights) is None


def _token_sets(ends, columns, weights):
    starts = np.concatenate([[0], ends[:-1]])
    return [sorted(zip(columns[a:b].tolist(), weights[a:b].tolist())) for a, b in zip(starts, ends)]


def test_sequence_entries_read_tokens_as_the_attribute_index_does():
    """Dict and list tokens give the known attributes and weights the batch reader gives (unknown
    names and zero weights left out); rare shapes and bad weights go to the general path (None)."""
    vocabulary = [[{"w": "a", "n": 2.5, "up": True}, {"w": "b", "n": 1, "up": False}], [["x=1", "y=2"], ["x=2"]]]
    index = AttributeIndex()
    index.fit(vocabulary)
    sequence = [{"w": "a", "n": 0.5, "up": True, "new": "z"}, {"w": "c", "up": False}, {}, {"n": -3}]
    ends, columns, weights = sequence_entries(sequence, index.index_.get, pair_table(index.index_))
    X = index.transform([sequence]).X
    expected = [sorted(zip(X[t].indices.tolist(), X[t].data.tolist())) for t in range(X.shape[0])]
    assert _token_sets(ends, columns, weights) == expected
    lists = [["x=1", "y=2", "q"], ("x=2",)]
    ends, columns, weights = sequence_entries(lists, index.index_.get, pair_table(index.index_))
    X = index.transform([lists]).X
    assert _token_sets(ends, columns, weights) == [sorted(zip(X[t].indices.tolist(), X[t].data.tolist())) for t in range(2)]
    for rare in ([{"w": b"a"}], [{"w": {"x": "y"}}], [{"n": float("nan")}], [{1: "a"}], [[b"x=1"]], ["x=1"], []):
        assert sequence_entries(rare, index.index_.get, pair_table(index.index_)) is None


@pytest.fixture(scope="module")
def fitted():
    """A small model fitted on dict tokens, and test sentences with unseen words."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]

    def sentence(n):
        tokens = [words[i] for i in rng.integers(0, 30, size=n)]
        X = [{"bias": 1.0, "w": w, "suffix": w[-1:], "even": int(w[1:]) % 2 == 0} for w in tokens]
        return X, ["A" if int(w[1:]) < 10 else "B" if int(w[1:]) < 20 else "C" for w in tokens]

    train = [sentence(int(n)) for n in rng.integers(1, 9, size=80)]
    model = CRF(c2=0.1, max_iterations=30).fit([x for x, _ in train], [y for _, y in train])
    test = [sentence(int(n))[0] for n in rng.integers(1, 12, size=30)]
    test[0][0]["unseen"] = "word"
    return model, test


def test_predict_single_is_predict_and_its_emissions_are_the_batch_bits(fitted):
    model, test = fitted
    assert [model.predict_single(x) for x in test] == [list(labels) for labels in model.predict(test)]
    for x in test:
        np.testing.assert_array_equal(model._sequence_emissions(x), model.emissions([x])[0])
    assert model.predict_single([]) == []


def test_tagger_tags_as_the_estimator_on_the_same_model_file(fitted, tmp_path):
    model, test = fitted
    path = tmp_path / "model.crfsuite"
    CRF(c2=0.1, max_iterations=30, model_filename=str(path)).fit(
        [x for x in test for _ in range(2)], [model.predict_single(x) for x in test for _ in range(2)]
    )
    tagger = ours.Tagger()
    tagger.open(str(path))
    reloaded = CRF(model_filename=str(path))
    assert [tagger.tag(x) for x in test] == [reloaded.predict_single(x) for x in test]
    assert [tagger.tag(ours.ItemSequence(x)) for x in test] == [list(labels) for labels in reloaded.predict(test)]


@pytest.mark.parametrize("n_labels", [1, 3])
def test_compiled_forward_backward_is_the_enumeration(n_labels):
    """log Z, node marginals and expected transition counts of the compiled kernel (a first-order
    table in scaled space) against every enumerated path."""
    lengths = [1, 4, 2, 5]
    emissions, transitions, start, end = random_chain(2, n_labels, lengths)
    posterior = chain.forward_backward(emissions, transitions, start, end, lengths)
    counts = np.zeros((n_labels, n_labels))
    for n, (a, b) in enumerate(zip(_offsets(lengths)[:-1], _offsets(lengths)[1:])):
        paths, scores = enumerate_paths(emissions[a:b], transitions, start, end)
        log_z = np.logaddexp.reduce(scores)
        p = np.exp(scores - log_z)
        assert posterior.log_z[n] == pytest.approx(log_z, rel=1e-12)
        for t in range(b - a):
            np.testing.assert_allclose(posterior.marginals[a + t], np.bincount(paths[:, t], p, n_labels), atol=1e-12)
            if t:
                np.add.at(counts, (paths[:, t - 1], paths[:, t]), p)
    np.testing.assert_allclose(posterior.transition_counts, counts, atol=1e-12)


def test_compiled_forward_backward_redoes_what_it_cannot_scale_in_log_space():
    """Scores whose scaled products underflow (a forced switch across a -1000 transition) and a
    4,000-token sequence: everything, kept log messages included, equals the log-space recursion."""
    rng = np.random.default_rng(4)
    forced = [[0.0, -800.0], [-800.0, 0.0], [0.3, 0.0]]
    emissions = np.array(forced + rng.normal(size=(4000, 2)).tolist() + forced)
    lengths = [3, 4000, 3]
    transitions, start, end = np.array([[0.0, -1000.0], [-1000.0, 0.5]]), np.array([0.0, -2.0]), np.zeros(2)
    scaled = chain.forward_backward(emissions, transitions, start, end, lengths, keep_messages=True)
    exact = chain.forward_backward(emissions, transitions, start, end, lengths, keep_messages=True, semiring=chain.LogSemiring)
    np.testing.assert_allclose(scaled.log_z, exact.log_z, rtol=1e-12)
    np.testing.assert_allclose(scaled.marginals, exact.marginals, atol=1e-10)
    np.testing.assert_allclose(scaled.transition_counts, exact.transition_counts, rtol=1e-9, atol=1e-9)
    # kept messages: exact where scaled numbers hold them (a message below exp(-745) of its
    # step's largest is 0 in scaled space, as in the shared recursion's scaled semiring)
    held = np.isfinite(scaled.log_alpha) & np.isfinite(scaled.log_beta)
    assert held[:3].all() and held[-3:].all() and held.mean() > 0.5
    np.testing.assert_allclose(scaled.log_alpha[held], exact.log_alpha[held], rtol=1e-10)
    np.testing.assert_allclose(scaled.log_beta[held], exact.log_beta[held], rtol=1e-10)


def test_one_sequence_sgd_step_is_the_general_objective():
    """CRFsuite's SGD takes one sequence per update: its loss and gradient from the compiled
    kernels equal the general objective's, at random weights, with repeated attributes."""
    from crf import _optimize
    from crf._objective import ParameterLayout

    rng = np.random.default_rng(6)
    lengths = np.array([3, 1, 7])
    offsets = _offsets(lengths)
    X = sp.random(int(lengths.sum()), 12, density=0.4, random_state=7, format="csr")
    X.data[:] = rng.normal(size=X.data.size)
    labels = rng.integers(0, 4, size=int(lengths.sum()))
    params = ParameterLayout(12, 4)
    prepared = _optimize._Sequences(X, offsets, labels, params)
    for sequence in range(lengths.size):
        batch = _optimize._Minibatch(X, offsets, labels, params, np.array([sequence]), None)
        theta = rng.normal(size=batch.local.size)
        n, state = batch.columns.size * 4, np.zeros((12, 4))
        state[batch.columns] = theta[:n].reshape(-1, 4) / 2.0
        loss, gradient, tail_gradient = prepared.objective(sequence, state, 2.0, theta[n:])
        expected_loss, expected_gradient = batch.objective(theta)
        assert loss == pytest.approx(expected_loss, rel=1e-12)
        np.testing.assert_allclose(np.concatenate([gradient.ravel(), tail_gradient]), expected_gradient, rtol=1e-10, atol=1e-12)


def _candidate_lattice(rng, n_labels: int, lengths, integers: bool = True):
    """(state emissions (T, S), operator, start, end, candidates (T, L)) of a random candidate
    second-order lattice in input order; with ``integers``, integer scores (exact ties)."""
    from crf._order import SecondOrderChain

    structure = SecondOrderChain(n_labels)
    rounding = np.round if integers else (lambda x: x)
    tail = rounding(2 * rng.normal(size=structure.tail_size))
    emissions = rounding(2 * rng.normal(size=(sum(lengths), n_labels)))
    candidates = rng.random(emissions.shape) < 0.5
    candidates[np.arange(sum(lengths)), rng.integers(0, n_labels, sum(lengths))] = True
    lattice = structure.lattice_in_order(_offsets(lengths), candidates)
    operator, start, end = lattice.scores(tail)
    return lattice.emissions(emissions, tail), operator, start, end, candidates


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_candidate_lattice_viterbi_is_the_shared_max_product_recursion(seed):
    """Viterbi over a candidate second-order lattice (the compiled kernel over its slots) gives the
    shared max-product recursion's paths and scores, with exact ties (integer scores: the lowest
    slot two back wins, then the lowest last state) and disallowed labels, down to a sequence
    with no allowed path (score -inf, the recursion's pointers)."""
    from crf._semirings import MaxSemiring

    rng = np.random.default_rng(seed)
    lengths = [6, 2, 4, 1, 5, 3]
    states, operator, start, end, candidates = _candidate_lattice(rng, 5, lengths)
    allowed = rng.random(candidates.shape) < 0.8
    allowed[6:8] = False  # the second sequence has no allowed path
    for mask in (None, allowed):
        ours, ours_scores = chain.viterbi(states, operator, start, end, lengths, allowed=mask)
        shared, shared_scores = chain._best_paths(states, operator, start, end, lengths, mask, MaxSemiring)
        np.testing.assert_array_equal(ours, shared[:, 0])
        np.testing.assert_allclose(ours_scores, shared_scores[:, 0], rtol=0, atol=1e-12)
    assert np.isneginf(ours_scores[1]) and np.isfinite(ours_scores[0])


def _listed_edge_viterbi(emissions, start, end, offsets, edges):
    """The candidate lattice's Viterbi as the former kernel ran it, over the operator's listed edges
    (``listed_edges()``: ordered by target, then source; the first listed edge wins a tie)."""
    edge_start, source, target, weights = edges
    states, scores = np.zeros(emissions.shape[0], dtype=np.int64), np.empty(offsets.size - 1)
    for n, (first, stop) in enumerate(zip(offsets[:-1], offsets[1:])):
        delta = start + emissions[first]
        back = np.zeros((stop - first, emissions.shape[1]), dtype=np.int64)
        for t in range(first + 1, stop):
            following = np.full(emissions.shape[1], -np.inf)
            for e in range(edge_start[t], edge_start[t + 1]):
                value = delta[source[e]] + weights[e]
                if value > following[target[e]]:
                    following[target[e]], back[t - first, target[e]] = value, source[e]
            delta = following + emissions[t]
        arg = int(np.argmax(delta + end))
        scores[n], states[stop - 1] = (delta + end)[arg], arg
        for t in range(stop - 1, first, -1):
            arg = back[t - first, arg]
            states[t - 1] = arg
    return states, scores


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_one_viterbi_kernel_gives_the_former_listed_edge_kernels_bits(seed):
    """The one Viterbi kernel over a candidate lattice's slots gives the bits (states and scores)
    of the former kernel over its listed edges, with ties (integer scores), real scores, and
    disallowed labels."""
    rng = np.random.default_rng(seed)
    lengths = [7, 1, 3, 5, 2, 9]
    offsets = _offsets(lengths)
    for integers in (True, False):
        states, operator, start, end, candidates = _candidate_lattice(rng, 6, lengths, integers)
        allowed = rng.random(candidates.shape) < 0.85
        for mask in (None, allowed):
            masked = chain._masked(states, mask, operator)
            ours, ours_scores = chain.viterbi(states, operator, start, end, lengths, allowed=mask)
            former, former_scores = _listed_edge_viterbi(masked, start, end, offsets, operator.listed_edges())
            np.testing.assert_array_equal(ours, former)
            np.testing.assert_array_equal(ours_scores, former_scores)


def test_candidate_lattice_second_order_viterbi_is_the_best_path_of_the_lattice():
    """The candidate lattice's Viterbi path is a best one among the enumerated label sequences
    through candidate labels only, scored term by term from the second-order blocks."""
    from itertools import product

    from crf._order import SecondOrderChain

    rng = np.random.default_rng(7)
    L, lengths = 4, [4, 1, 3, 2]
    structure = SecondOrderChain(L)
    tail = rng.normal(size=structure.tail_size)
    blocks = structure.split(tail)
    emissions = rng.normal(size=(sum(lengths), L))
    candidates = rng.random(emissions.shape) < 0.6
    candidates[np.arange(sum(lengths)), rng.integers(0, L, sum(lengths))] = True
    offsets = _offsets(lengths)
    lattice = structure.lattice_in_order(offsets, candidates)
    operator, start, end = lattice.scores(tail)
    best, scores = chain.viterbi(lattice.emissions(emissions, tail), operator, start, end, lengths)
    labels = chain.operator_of(operator).labels_at(best)

    def score(path, e):
        total = blocks["start"][path[0]] + blocks["end"][path[-1]] + sum(e[t, y] for t, y in enumerate(path))
        for t in range(1, len(path)):
            before = path[t - 2] if t >= 2 else L
            total += blocks["transitions"][path[t - 1], path[t]] + blocks["trigrams"][before, path[t - 1], path[t]]
        return total + blocks["pair_end"][path[-2] if len(path) >= 2 else L, path[-1]]

    for n, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        by_path = {path: score(path, emissions[a:b]) for path in product(*(np.flatnonzero(c) for c in candidates[a:b]))}
        top = max(by_path.values())
        assert scores[n] == pytest.approx(top, abs=1e-9)
        assert by_path[tuple(labels[a:b].tolist())] == pytest.approx(top, abs=1e-9)

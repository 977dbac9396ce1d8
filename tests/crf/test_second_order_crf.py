"""The second-order CRF (``crf.CRF(order=2)``): its chain scores, objective and queries against
enumeration of every labelling of tiny models, the gradient against finite differences (trigram,
pair-end, start/end weights, partial labels, a candidate lattice), L1, SGD, warm start, save/load,
the CRFsuite refusal, the tagger bundle and the sklearn contract."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import scipy.sparse as sp
from numeric_helpers import finite_difference
from pipeline_helpers import make_sentence
from scipy.special import logsumexp

from crf import CRF, FeatureExtractor, ModelBundle, load_bundle
from crf import _chain as chain
from crf._objective import Objective, ParameterLayout
from crf._optimize import _regularised
from crf._order import SecondOrderChain
from crf._params import feature_index
from crf.model import BundledCRF


def _enumerate(emissions, blocks, allowed=None):
    """(paths (K, n), scores (K,)) of one sequence under the named second-order blocks, written
    out term by term (independently of crf._order); paths through a disallowed label dropped."""
    n, L = emissions.shape
    paths = np.array(list(itertools.product(range(L), repeat=n)), dtype=np.int64)
    if allowed is not None:
        paths = paths[allowed[np.arange(n), paths].all(axis=1)]
    scores = emissions[np.arange(n), paths].sum(axis=1) + blocks["start"][paths[:, 0]] + blocks["end"][paths[:, -1]]
    for t in range(1, n):
        before = paths[:, t - 2] if t >= 2 else np.full(len(paths), L)
        middle, last = paths[:, t - 1], paths[:, t]
        scores = scores + blocks["transitions"][middle, last] + blocks["trigrams"][before, middle, last]
    before_last = paths[:, -2] if n >= 2 else np.full(len(paths), L)
    return paths, scores + blocks["pair_end"][before_last, paths[:, -1]]


def _random_tail(seed: int, L: int, scale: float = 1.0):
    structure = SecondOrderChain(L)
    tail = scale * np.random.default_rng(seed).normal(size=structure.tail_size)
    return structure, tail, structure.split(tail)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("lengths", [[1, 2, 4], [3, 1]])
def test_chain_scores_of_the_tail_match_enumeration(seed, lengths):
    """log Z, token marginals, Viterbi, k-best, sequence scores and constrained windows."""
    L = 3
    structure, tail, blocks = _random_tail(seed, L)
    emissions = np.random.default_rng(seed + 5).normal(size=(sum(lengths), L))
    operator, start, end = structure.scores(tail)
    states = structure.state_emissions(emissions)
    posterior = chain.forward_backward(states, operator, start, end, lengths, keep_messages=True)
    labels, best = chain.viterbi(states, operator, start, end, lengths)
    kbest, kscores = chain.kbest_viterbi(states, operator, start, end, lengths, k=4)
    marginals = structure.label_marginals(posterior.marginals)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, scores = _enumerate(emissions[a:b], blocks)
        assert posterior.log_z[i] == pytest.approx(logsumexp(scores), abs=1e-9)
        p = np.exp(scores - logsumexp(scores))
        expected = np.stack([np.bincount(paths[:, t], weights=p, minlength=L) for t in range(b - a)])
        np.testing.assert_allclose(marginals[a:b], expected, atol=1e-10)
        np.testing.assert_array_equal(structure.labels_of_states(labels[a:b]), paths[np.argmax(scores)])
        assert best[i] == pytest.approx(scores.max())
        top = np.sort(scores)[::-1][:4]
        np.testing.assert_allclose(kscores[i, : top.size], top, atol=1e-9)
        # sequence scores of every labelling through the operator's edges
        path_states = np.concatenate([structure.states_of_labels(path, [0, b - a]) for path in paths])
        many = np.tile(states[a:b], (len(paths), 1))
        path_offsets = np.arange(len(paths) + 1) * (b - a)
        np.testing.assert_allclose(chain.sequence_scores(many, operator, start, end, path_offsets, path_states), scores)
    # a constrained window: the first two tokens of the last sequence restricted to labels {0, 1}
    a, b = offsets[-2], offsets[-1]
    width = min(2, b - a)
    masks = np.zeros((width, L), dtype=bool)
    masks[:, :2] = True
    log_p = chain.constrained_log_probability(
        posterior.log_alpha, posterior.log_beta, posterior.log_z, states, operator, start,
        offsets, np.array([len(lengths) - 1]), np.array([0]), masks, np.array([0, width]),
    )  # fmt: skip
    paths, scores = _enumerate(emissions[a:b], blocks)
    inside = (paths[:, :width] < 2).all(axis=1)
    assert log_p[0] == pytest.approx(logsumexp(scores[inside]) - logsumexp(scores), abs=1e-9)


def _problem(seed: int, L: int = 3, A: int = 5, partial: bool = False):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=4)
    total = int(lengths.sum())
    X = sp.csr_matrix((rng.random((total, A)) < 0.5) * rng.choice([1.0, 0.5, -2.0], size=(total, A)))
    labels = rng.integers(0, L, size=total)
    if partial:
        labels[rng.random(total) < 0.3] = -1
    return X, np.concatenate([[0], np.cumsum(lengths)]), labels


def _enumerated_loss(X, offsets, labels, params, theta, candidates=None):
    """sum_i log Z(x_i) - log Z(x_i | known labels), over the (candidate) lattice, by enumeration."""
    state = params.split(theta)[0]
    blocks = params.tail_blocks(theta)
    emissions = np.asarray(X @ state)
    total = 0.0
    for a, b in zip(offsets[:-1], offsets[1:]):
        allowed = None if candidates is None else candidates[a:b]
        paths, scores = _enumerate(emissions[a:b], blocks, allowed)
        known = labels[a:b] >= 0
        if not known.any():
            continue
        agrees = (paths[:, known] == labels[a:b][known]).all(axis=1)
        total += logsumexp(scores) - logsumexp(scores[agrees])
    return total


@pytest.mark.parametrize(
    "seed,case",
    [
        *itertools.product([0, 1], ["dense", "sparse", "partial", "candidates", "partial candidates"]),
        *itertools.product(range(6), ["candidates large"]),
    ],
)
def test_objective_matches_enumeration_and_finite_differences(seed, case):
    """Candidates: the chain runs over each token's candidate labels (the compact pair-of-slots lattice).
    Large: weights of a scale where lifted values are tiny, or flushed and the sequence redone in
    log space (within what the scaled semiring guarantees: see ScaledSemiring)."""
    L = 3
    X, offsets, labels = _problem(seed, L, partial="partial" in case)
    index = feature_index(X, labels, L) if case == "sparse" else None
    params = ParameterLayout(X.shape[1], L, index, order=2)
    candidates = None
    if "candidates" in case:
        rng = np.random.default_rng(seed + 3)
        candidates = rng.random((labels.size, L)) < 0.5
        known = labels >= 0
        candidates[np.flatnonzero(known), labels[known]] = True
        candidates[np.arange(labels.size), rng.integers(0, L, labels.size)] = True
    objective = Objective(X, offsets, labels, params, candidates=candidates, block_cells=30)
    assert len(objective.blocks) > 1  # the sums over blocks are part of what is checked
    theta = np.random.default_rng(seed + 10).normal(size=params.size) * (30.0 if "large" in case else 1.0)
    loss, grad = objective(theta)
    assert loss == pytest.approx(_enumerated_loss(X, offsets, labels, params, theta, candidates), abs=1e-9, rel=1e-12)
    if "large" in case:
        theta = theta / 30.0  # finite differences need a smooth region; the loss above is the point
    fun = _regularised(objective, 0.3)
    np.testing.assert_allclose(fun(theta)[1], finite_difference(fun, theta), rtol=1e-5, atol=1e-6)
    # every block of the tail takes part (trigrams with the before-sequence row, pair_end, start, end)
    tail = params.tail_blocks(grad)
    assert all(np.any(block != 0) for block in tail.values())


def test_a_trigram_far_above_the_rest_through_a_label_left_out_hides_no_path():
    """The lift takes out of each state's edges the best edge that enters it at its token. A
    trigram (2, 1, 2) 173.5 nats above (0, 1, 2), whose first label is no candidate at token 0,
    must not set that bound: the edge (0, 1, 2) that is there would be flushed in both passes
    alike (while label 1's own state keeps the token's normaliser up), and the paths through it
    would be missing from log Z without any check noticing."""
    L = 3
    X = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]))
    offsets = np.array([0, 3, 5])
    labels = np.array([0, 1, 1, 0, -1])
    candidates = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 1], [1, 0, 1], [0, 1, 1]], dtype=bool)
    params = ParameterLayout(X.shape[1], L, order=2)
    theta = np.random.default_rng(0).normal(size=params.size) * 0.1
    state, blocks = params.split(theta)[0], params.tail_blocks(theta)
    theta[: params.n_state] = (state + np.array([[0.0, 1.0, -1.0], [0.0, 1.0, -1.0]])).ravel()
    blocks["trigrams"][2, 1, 2] = blocks["trigrams"][0, 1, 2] + 173.5
    objective = Objective(X, offsets, labels, params, candidates=candidates)
    loss, grad = objective(theta)
    expected = _enumerated_loss(X, offsets, labels, params, theta, candidates)
    assert expected > 0.1  # the path 0, 1, 2 carries a fair share of the first sequence
    assert loss == pytest.approx(expected, abs=1e-9, rel=1e-12)
    np.testing.assert_allclose(grad, finite_difference(objective, theta), rtol=1e-5, atol=1e-6)


def test_objective_is_bit_identical_for_any_thread_count():
    X, offsets, labels = _problem(4)
    params = ParameterLayout(X.shape[1], 3, order=2)
    theta = np.random.default_rng(0).normal(size=params.size)
    one = Objective(X, offsets, labels, params, n_threads=1, block_cells=30)(theta)
    two = Objective(X, offsets, labels, params, n_threads=3, block_cells=30)(theta)
    assert one[0] == two[0] and np.array_equal(one[1], two[1])


def _corpus(n: int, seed: int):
    rng = np.random.default_rng(seed)
    sentences = [make_sentence(rng) for _ in range(n)]
    return [[{"w": w} for w, _, _ in s] for s in sentences], [[c for _, _, c in s] for s in sentences], sentences


@pytest.fixture(scope="module")
def data():
    return _corpus(80, 0), _corpus(20, 1)


@pytest.fixture(scope="module")
def second(data):
    (X, y, _), _ = data
    return CRF(order=2, c2=0.1, max_iterations=60).fit(X, y)


def test_fitted_second_order_model_matches_enumeration(second, data):
    """The estimator's queries (predict, marginals, probabilities, log Z, entropy, N-best) are
    those of the model's scores, enumerated."""
    _, (X, _, _) = data
    X = [x[:5] for x in X[:4]]
    emissions, _ = second.emissions(X)
    L = len(second.classes_)
    blocks = {
        "transitions": second.transitions_, "start": second.start_weights_, "end": second.end_weights_,
        "trigrams": second.trigram_weights_, "pair_end": second.pair_end_weights_,
    }  # fmt: skip
    assert second.trigram_weights_.shape == (L + 1, L, L) and second.pair_end_weights_.shape == (L + 1, L)
    predicted = second.predict(X)
    marginals, _ = second.marginals(X)
    log_z = second.log_partition(X)
    entropy = second.sequence_entropy(X)
    nbest = second.nbest_entropy(X, n_best=3)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in X])])
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, scores = _enumerate(emissions[a:b], blocks)
        p = np.exp(scores - logsumexp(scores))
        assert log_z[i] == pytest.approx(logsumexp(scores))
        assert entropy[i] == pytest.approx(-(p * np.log(p)).sum(), abs=1e-8)
        best = paths[np.argmax(scores)]
        assert list(predicted[i]) == [second.classes_[c] for c in best]
        assert second.sequence_probability([X[i]], [list(predicted[i])])[0] == pytest.approx(p.max())
        expected = np.stack([np.bincount(paths[:, t], weights=p, minlength=L) for t in range(b - a)])
        np.testing.assert_allclose(marginals[a:b], expected, atol=1e-10)
        q = np.sort(p)[::-1][:3]
        q = q / q.sum()
        assert nbest[i] == pytest.approx(-(q * np.log(q)).sum(), abs=1e-8)
        top = np.sort(p)[::-1]
        assert second.best_path_margin([X[i]])[0] == pytest.approx(top[0] - top[1], abs=1e-10)


@pytest.fixture(scope="module")
def restricted(data):
    (X, y, _), _ = data
    return CRF(order=2, candidate_threshold=0.05, c2=0.1, max_iterations=40).fit(X, y)


@pytest.mark.parametrize("kind", ["exact", "candidates"])
def test_segment_confidence_is_the_window_probability(second, restricted, data, kind):
    """Each chunk's confidence is its window's probability over every labelling (over the
    candidate labels of a candidate-lattice model: the compiled log-space recursions)."""
    _, (X, _, _) = data
    X = [x[:6] for x in X[:3]]
    model = second if kind == "exact" else restricted
    segments = model.predict_segments(X)
    emissions, batch = model.emissions(X)
    if kind == "candidates":
        keep = model.candidate_model_.candidates(batch.X, batch.lengths, model.candidate_threshold)
        assert not keep.all()  # the candidate choice matters here
        emissions = np.where(keep, emissions, -np.inf)
    second = model
    blocks = {name: getattr(second, attr) for name, attr in {
        "transitions": "transitions_", "start": "start_weights_", "end": "end_weights_",
        "trigrams": "trigram_weights_", "pair_end": "pair_end_weights_",
    }.items()}  # fmt: skip
    classes = list(second.classes_)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in X])])
    predicted = second.predict(X)
    assert len(segments)
    from crf import metrics

    for sequence, rows in segments.groupby("sequence"):
        a, b = offsets[sequence], offsets[sequence + 1]
        paths, scores = _enumerate(emissions[a:b], blocks)
        labels = np.array([classes.index(c) for c in predicted[sequence]])
        # the chunks of every path at once (each path a sequence of its own)
        chunks = metrics._chunks_flat(np.array(classes, dtype=object)[paths.ravel()], np.arange(len(paths) + 1) * (b - a))
        for row in rows.itertuples():
            inside = (paths[:, row.start : row.end] == labels[row.start : row.end]).all(axis=1)
            # the token before must not extend the chunk, the one after must not continue it
            same = chunks["sequence"][(chunks["start"] == row.start) & (chunks["end"] == row.end)].to_numpy()
            keep = inside & np.isin(np.arange(len(paths)), same)
            assert row.confidence == pytest.approx(np.exp(logsumexp(scores[keep]) - logsumexp(scores)), abs=1e-9)
    assert (segments["confidence"] < 1 - 1e-6).any()  # not every window is certain


@pytest.mark.parametrize("seed,scale", [(0, 1.5), (1, 1.5), (2, 1.5), (3, 200.0)])
def test_compiled_candidate_lattice_recursions_match_enumeration_and_the_numpy_recursion(seed, scale):
    """Tagging over a candidate lattice runs the compiled log-space forward and backward
    (:func:`crf._compiled.log_forward`, :func:`crf._compiled.log_backward`): log Z, messages and
    marginals equal the shared NumPy recursion's (in log space) and the enumeration of the
    candidate paths; constrained windows (the compiled forward over all windows at once) equal
    enumeration and the NumPy recursion's windows of the exact second-order chain over the
    candidate-masked emissions. An impossible window and an impossible sequence included; weights
    of hundreds of nats (``scale``) too."""
    rng = np.random.default_rng(seed)
    L, lengths = 4, [1, 2, 5, 4, 3, 6]
    structure, tail, blocks = _random_tail(seed + 40, L, scale=scale)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    T = int(offsets[-1])
    emissions = rng.normal(scale=scale, size=(T, L))
    candidates = rng.random((T, L)) < 0.5
    candidates[np.arange(T), rng.integers(0, L, T)] = True
    emissions[offsets[3] + 1] = -np.inf  # sequence 3 has no path
    lattice = structure.lattice_in_order(offsets, candidates)
    states = lattice.emissions(emissions, tail)
    operator, start, end = lattice.scores(tail)
    assert candidates.sum() < 0.75 * candidates.size  # most tokens lose labels
    compiled = chain.forward_backward(states, operator, start, end, lengths, keep_messages=True, counts=False)
    in_numpy = chain.forward_backward(
        states, operator, start, end, lengths, keep_messages=True, counts=False, semiring=chain.LogSemiring
    )
    assert compiled.log_z[3] == -np.inf and not compiled.marginals[offsets[3] : offsets[4]].any()
    np.testing.assert_allclose(compiled.log_z, in_numpy.log_z, rtol=1e-12)
    for name in ("marginals", "log_alpha", "log_beta"):
        np.testing.assert_allclose(getattr(compiled, name), getattr(in_numpy, name), rtol=1e-11, atol=1e-12, err_msg=name)
    node = lattice.label_marginals(compiled.marginals)
    sequence, first, masks, expected = [], [], [], []
    for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, scores = _enumerate(emissions[a:b], blocks, allowed=candidates[a:b])
        assert compiled.log_z[i] == pytest.approx(logsumexp(scores), rel=1e-12)
        if i == 3:
            continue
        p = np.exp(scores - logsumexp(scores))
        expected_node = np.stack([np.bincount(paths[:, t], weights=p, minlength=L) for t in range(b - a)])
        np.testing.assert_allclose(node[a:b], expected_node, atol=1e-12)
        for w in range(4):
            s = int(rng.integers(0, b - a))
            width = int(rng.integers(1, b - a - s + 1))
            allowed = rng.random((width, L)) < 0.6
            if w == 3 and i == 2:
                allowed[:] = False  # no allowed path
            keep = allowed[np.arange(width), paths[:, s : s + width]].all(axis=1)
            expected.append(logsumexp(scores[keep]) - logsumexp(scores) if keep.any() else -np.inf)
            sequence.append(i)
            first.append(s)
            masks.append(allowed)
    window_offsets = np.concatenate([[0], np.cumsum([len(m) for m in masks])])
    windows = (offsets, np.array(sequence), np.array(first), np.concatenate(masks), window_offsets)
    got = chain.constrained_log_probability(
        compiled.log_alpha, compiled.log_beta, compiled.log_z, states, operator, start, *windows
    )
    exact_operator, exact_start, exact_end = structure.scores(tail)
    exact_states = structure.state_emissions(np.where(candidates, emissions, -np.inf))
    exact = chain.forward_backward(
        exact_states, exact_operator, exact_start, exact_end, lengths, keep_messages=True, semiring=chain.LogSemiring
    )
    reference = chain.constrained_log_probability(
        exact.log_alpha, exact.log_beta, exact.log_z, exact_states, exact_operator, exact_start, *windows
    )
    assert np.any(np.isneginf(got)) and np.all(np.isneginf(got) == np.isneginf(reference))
    np.testing.assert_allclose(got, reference, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_second_order_learns_and_round_trips(second, data, tmp_path):
    (X, y, _), (X_test, y_test, _) = data
    assert second.score(X_test, y_test) > 0.9
    path = tmp_path / "second.npz"
    second.save(path)
    loaded = CRF.load(path)
    assert loaded.order == 2
    np.testing.assert_array_equal(loaded.trigram_weights_, second.trigram_weights_)
    np.testing.assert_array_equal(loaded.pair_end_weights_, second.pair_end_weights_)
    assert [list(p) for p in loaded.predict(X_test)] == [list(p) for p in second.predict(X_test)]
    np.testing.assert_allclose(loaded.marginals(X_test)[0], second.marginals(X_test)[0])
    assert loaded.n_active_features_ == second.n_active_features_ > np.count_nonzero(second.state_weights_)
    assert loaded.tagger_.tag(X_test[0]) == list(second.predict(X_test[:1])[0])


def test_candidate_lattice_model_keeps_gold_and_round_trips(data, tmp_path):
    (X, y, _), (X_test, y_test, _) = data
    model = CRF(order=2, candidate_threshold=0.01, c2=0.1, max_iterations=60).fit(X, y)
    assert model.candidate_model_.order == 1 and model.excluded_mass_ >= 0
    assert model.score(X_test, y_test) > 0.9
    keep = model.candidate_model_.candidates(model.emissions(X_test)[1].X, model.emissions(X_test)[1].lengths, 0.01)
    marginals, _ = model.marginals(X_test)
    assert np.all(marginals[~keep] == 0)  # queries run over the candidates only
    path = tmp_path / "candidates.npz"
    model.save(path)
    loaded = CRF.load(path)
    assert loaded.candidate_model_ is not None and loaded.candidate_threshold == 0.01
    assert [list(p) for p in loaded.predict(X_test)] == [list(p) for p in model.predict(X_test)]


@pytest.mark.parametrize(
    "settings", [{"c1": 0.5, "c2": 0.0}, {"algorithm": "l2sgd", "c2": 0.1, "max_iterations": 5, "learning_rate": 0.1}]
)
def test_l1_and_sgd_train_second_order_models(data, settings):
    (X, y, _), (X_test, y_test, _) = data
    model = CRF(order=2, **{"max_iterations": 60, **settings}).fit(X, y)
    assert model.score(X_test, y_test) > 0.85
    if settings.get("c1"):  # OWL-QN zeroes weights, trigram ones among them
        assert np.any(model.trigram_weights_ == 0) and np.any(model.trigram_weights_ != 0)


def test_warm_start_from_first_order_keeps_its_weights_in_place(data):
    """A first-order fit's weights start a second-order fit: the before-sequence row moves to the
    new label count's last index."""
    (X, y, _), _ = data
    from crf._warm import PreviousFit

    first = CRF(c2=0.1, max_iterations=30).fit(X, y)
    previous = PreviousFit.of(first)
    L = len(first.classes_)
    params = ParameterLayout(first.n_attributes_, L + 1, None, order=2)
    blocks = params.tail_blocks(previous.theta(params))
    np.testing.assert_array_equal(blocks["transitions"][:L, :L], first.transitions_)
    assert not np.any(blocks["trigrams"])
    second = CRF(order=2, c2=0.1, max_iterations=30).fit(X, y)
    again = PreviousFit.of(second)
    blocks = params.tail_blocks(again.theta(params))
    np.testing.assert_array_equal(blocks["trigrams"][L + 1, :L, :L], second.trigram_weights_[L])  # before-sequence row
    np.testing.assert_array_equal(blocks["trigrams"][:L, :L, :L], second.trigram_weights_[:L])
    np.testing.assert_array_equal(blocks["pair_end"][L + 1, :L], second.pair_end_weights_[L])
    second.set_params(warm_start=True, max_iterations=5)
    second.fit(X[:40], y[:40])
    assert second.trigram_weights_.shape == (L + 1, L, L)


def test_invalid_settings_are_refused(data, tmp_path):
    (X, y, _), _ = data
    for settings, message in (
        ({"order": 3}, "order must be 1 or 2"),
        ({"order": 2, "algorithm": "ap"}, "order=2 is trained by"),
        ({"candidate_threshold": 0.1}, "needs order=2"),
        ({"order": 2, "candidate_threshold": 1.5}, "must lie in"),
        ({"order": 2, "model_filename": str(tmp_path / "m.crfsuite")}, "first-order models only"),
        ({"algorithm": "l2sgd", "random_state": -1}, "random_state must be an integer >= 0"),  # NumPy's bare error
    ):
        with pytest.raises(ValueError, match=message):
            CRF(**settings).fit(X, y)


def test_crfsuite_file_refuses_a_second_order_model(second, tmp_path):
    from crf.crfsuite import write_crfsuite_model

    second_named = second
    with pytest.raises(ValueError, match="order 2"):
        write_crfsuite_model(second_named, tmp_path / "model.crfsuite")


def test_sklearn_clone_and_grid_search(data):
    from sklearn.base import clone
    from sklearn.model_selection import GridSearchCV

    (X, y, _), _ = data
    model = CRF(order=2, max_iterations=20)
    assert clone(model).get_params()["order"] == 2
    search = GridSearchCV(model, {"c2": [0.1, 1.0]}, cv=2).fit(X[:40], y[:40])
    assert search.best_estimator_.order == 2


def test_a_model_file_of_an_earlier_version_loads_its_candidate_model(data, tmp_path):
    """Files written before the rename name the threshold ``pruning_threshold`` and the first-order
    model ``pruner``: they load as the same model, never as an exact second-order one."""
    from crf._model_file import KIND
    from crf._persist import load_arrays, save_arrays

    (X, y, _), (X_test, _, _) = data
    model = CRF(order=2, candidate_threshold=0.01, c2=0.1, max_iterations=30).fit(X, y)
    model.save(tmp_path / "current.npz")
    meta, arrays = load_arrays(tmp_path / "current.npz", KIND)
    meta["params"]["pruning_threshold"] = meta["params"].pop("candidate_threshold")
    meta["pruner"] = meta.pop("candidate_model")
    arrays = {k.replace("candidate_model/", "pruner/", 1): v for k, v in arrays.items()}
    save_arrays(tmp_path / "earlier.npz", KIND, meta, arrays)
    loaded = CRF.load(tmp_path / "earlier.npz")
    assert loaded.candidate_threshold == loaded.candidate_threshold_ == 0.01 and loaded.candidate_model_ is not None
    np.testing.assert_array_equal(loaded.marginals(X_test)[0], model.marginals(X_test)[0])
    del meta["pruner"]  # the threshold without its model is refused, whatever the names
    save_arrays(tmp_path / "broken.npz", KIND, meta, arrays)
    with pytest.raises(ValueError, match="without its candidate model"):
        CRF.load(tmp_path / "broken.npz")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m, a: m["params"].update(pruning_threshold=0.01), "holds both 'pruning_threshold' and 'candidate_threshold'"),
        (lambda m, a: m.update(pruner=m["candidate_model"]), "holds both 'pruner' and 'candidate_model'"),
        (lambda m, a: a.update({"pruner/start": a["candidate_model/start"]}), "holds both 'pruner/' and 'candidate_model/'"),
        (lambda m, a: m["params"].update(candidate_threshold=None), "a candidate model without a candidate_threshold"),
        (lambda m, a: m.pop("candidate_model"), "without its candidate model"),
        (lambda m, a: m["params"].update(candidate_threshold=1.5), "candidate_threshold 1.5 is not a number in (0, 1)"),
        (lambda m, a: m["params"].update(candidate_threshold=True), "candidate_threshold True is not a number in (0, 1)"),
        (lambda m, a: m["params"].update(candidate_threshold=-0.5), "is not a number in (0, 1)"),
        (
            lambda m, a: m["candidate_model"]["params"].update(candidate_threshold=0.01),
            "candidate_threshold in a model of order 1",
        ),
    ],
)
def test_a_model_file_whose_candidate_settings_contradict_each_other_is_refused(data, tmp_path, edit, message):
    """A file (its checksums rewritten, as anyone can) whose names or candidate settings disagree
    loaded as an exact second-order model, or with a threshold ``fit`` refuses (round 31)."""
    from crf._model_file import KIND
    from crf._persist import ModelFileError, load_arrays, save_arrays

    (X, y, _), _ = data
    model = CRF(order=2, candidate_threshold=0.01, c2=0.1, max_iterations=10).fit(X[:40], y[:40])
    model.save(tmp_path / "model.npz")
    meta, arrays = load_arrays(tmp_path / "model.npz", KIND)
    edit(meta, arrays)
    save_arrays(tmp_path / "edited.npz", KIND, meta, arrays)
    with pytest.raises(ModelFileError, match=re.escape(message)):
        CRF.load(tmp_path / "edited.npz")


@pytest.mark.parametrize(
    "edit",
    [
        lambda m, a: m["params"].update(order=1),  # the trigram weights would be dropped: another model
        lambda m, a: a.update({f"candidate_model/{k}": v for k, v in list(a.items())}),
        lambda m, a: a.update({"pruner/start": a["start"]}),
    ],
)
def test_a_model_file_with_arrays_its_model_does_not_read_is_refused(second, tmp_path, edit):
    """An exact second-order file relabelled order 1 loaded as a first-order model, and a candidate
    model's arrays beside a model without one were dropped without a word (round 32)."""
    from crf._model_file import KIND
    from crf._persist import ModelFileError, load_arrays, save_arrays

    second.save(tmp_path / "model.npz")
    meta, arrays = load_arrays(tmp_path / "model.npz", KIND)
    edit(meta, arrays)
    save_arrays(tmp_path / "edited.npz", KIND, meta, arrays)
    with pytest.raises(ModelFileError, match="arrays this model does not use"):
        CRF.load(tmp_path / "edited.npz")


def test_a_model_pickled_by_an_earlier_version_keeps_its_candidate_model(data):
    """A pickle of an earlier version holds ``pruning_threshold``, ``pruner_`` and ``pruned_mass_``
    (and, older still, no fitted threshold): it tags over the same candidates, never as an exact
    second-order model."""
    import pickle

    (X, y, _), (X_test, _, _) = data
    model = CRF(order=2, candidate_threshold=0.01, c2=0.1, max_iterations=30).fit(X, y)
    earlier = {"candidate_threshold": "pruning_threshold", "candidate_model_": "pruner_", "excluded_mass_": "pruned_mass_"}
    state = {earlier.get(k, k): v for k, v in model.__getstate__().items() if k != "candidate_threshold_"}
    old = CRF.__new__(CRF)
    old.__setstate__(state)
    assert old.candidate_threshold == old.candidate_threshold_ == 0.01 and old.excluded_mass_ == model.excluded_mass_
    np.testing.assert_array_equal(old.marginals(X_test)[0], model.marginals(X_test)[0])
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.marginals(X_test)[0], model.marginals(X_test)[0])


@pytest.mark.parametrize("threshold", [None, 0.01])
def test_bundle_of_a_second_order_model_tags_like_the_model(data, tmp_path, threshold):
    (_, _, train), (_, _, test) = data
    extractor = FeatureExtractor(columns=["w", "pos", "chunk"], templates=["w[0]", "w[-1]", "pos[0]"])
    batch = extractor.fit_transform(train)
    model = CRF(order=2, c2=0.1, max_iterations=40, candidate_threshold=threshold).fit(batch, [[r[2] for r in s] for s in train])
    bundle = ModelBundle(BundledCRF(extractor, model), scheme="IOB2", input_columns=["w", "pos"])
    path = tmp_path / "bundle.npz"
    bundle.save(path)
    loaded = load_bundle(path)
    assert loaded.part.n_states == (len(model.classes_) + 1) * len(model.classes_)
    tagged = loaded.tag([[{"w": w, "pos": p} for w, p, _ in s] for s in test])
    X_test = extractor.transform(test)
    predicted = model.predict(X_test)
    marginals, _ = model.marginals(X_test)
    segments = model.segments_of(
        np.concatenate([[model.classes_.index(c) for c in p] for p in predicted]),
        *model.posterior(X_test, True)[1:],
    )
    offset = 0
    for sentence, labels, result in zip(test, predicted, tagged):
        assert result["labels"] == list(labels)
        rows = np.arange(offset, offset + len(sentence))
        codes = [model.classes_.index(c) for c in labels]
        np.testing.assert_allclose(result["marginals"], marginals[rows, codes], atol=1e-9)
        offset += len(sentence)
    confidences = np.concatenate([[c["confidence"] for c in r["segments"]] for r in tagged])
    np.testing.assert_allclose(confidences, segments["confidence"].to_numpy(), atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_contractions_of_a_candidate_lattice_equal_the_dense_ones(seed, monkeypatch):
    """With candidate labels (the rest at -inf) the operator contracts by the active states; the
    results (log Z, marginals, counts, Viterbi, in every semiring used) equal the dense products."""
    from crf import _transitions

    rng = np.random.default_rng(seed)
    L, lengths = 6, [5, 3, 7, 1, 2]
    structure, tail, _ = _random_tail(seed, L)
    operator, start, end = structure.scores(tail)
    emissions = rng.normal(size=(sum(lengths), L))
    allowed = rng.random(emissions.shape) < 0.3
    allowed[np.arange(len(emissions)), rng.integers(0, L, len(emissions))] = True
    states = structure.state_emissions(np.where(allowed, emissions, -np.inf))
    results = {}
    for name, below in (("dense", 0.0), ("sparse", 1.1)):
        monkeypatch.setattr(_transitions, "SPARSE_BELOW", below)
        scaled = chain.forward_backward(states, operator, start, end, lengths)
        logged = chain.forward_backward(states, operator, start, end, lengths, semiring=chain.LogSemiring)
        best = chain.viterbi(states, operator, start, end, lengths)
        results[name] = (scaled.log_z, scaled.marginals, scaled.transition_counts, logged.log_z, logged.transition_counts, *best)
    for dense, sparse in zip(results["dense"], results["sparse"]):
        np.testing.assert_allclose(sparse, dense, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_listed_edges_of_a_candidate_lattice_step_equal_its_padded_tables(seed):
    """In the scaled semiring a step of a candidate lattice runs over its listed edges between
    filled slots; forward, backward and the expected counts equal those of the padded (K + 1, K, K)
    tables, and so does the log-space forward. (The objective's own check would not see a
    difference: a step that disagreed would fail the alpha-beta identity and be recomputed in log
    space.)"""
    from crf._layout import Layout

    rng = np.random.default_rng(seed)
    L, lengths = 5, [6, 2, 4, 1, 5]
    structure, tail, _ = _random_tail(seed, L)
    layout = Layout.from_lengths(lengths)
    candidates = rng.random((sum(lengths), L)) < 0.45
    candidates[np.arange(sum(lengths)), rng.integers(0, L, sum(lengths))] = True
    operator = structure.lattice(layout, candidates[layout.token_of_row]).scores(tail)[0]
    lifted = operator.lift(chain.ScaledSemiring)[1]
    in_log = operator.lift(chain.LogSemiring)[1]
    S = operator.n_states
    checked = 0
    for t in range(1, layout.n_steps):
        rows = layout.rows(t)
        listed, padded = lifted.at(rows), lifted.at(np.arange(rows.start, rows.stop))
        assert listed.listed and not padded.listed
        previous, following = rng.random((2, rows.stop - rows.start, S))
        # log space (constrained windows): forward over the listed edges too, some sources impossible
        logged = np.where(rng.random(previous.shape) < 0.3, -np.inf, np.log(previous))
        listed_log, padded_log = in_log.at(rows), in_log.at(np.arange(rows.start, rows.stop))
        assert listed_log.listed_forward and not padded_log.listed_forward
        np.testing.assert_allclose(listed_log.forward(logged), padded_log.forward(logged), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(listed.forward(previous), padded.forward(previous), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(listed.backward(following), padded.backward(following), rtol=1e-12, atol=1e-15)
        counts = listed.counts(previous, following)
        np.testing.assert_allclose(counts, padded.counts(previous, following), rtol=1e-12, atol=1e-15)
        checked += np.count_nonzero(counts)
    assert checked > 10


def test_exact_second_order_over_many_labels_warns_of_its_cost(caplog):
    """Above EXACT_SECOND_ORDER_LABELS labels an exact second-order fit says what it will cost and
    how to restrict it; with candidate_threshold, or at that many labels or fewer, it says nothing."""
    import warnings

    from crf._order import EXACT_SECOND_ORDER_LABELS

    def data(n_labels):
        labels = [f"L{i}" for i in range(n_labels)]
        return [[[f"w={y}"] for y in labels]], [labels]

    with pytest.warns(RuntimeWarning, match=rf"exact second order over {EXACT_SECOND_ORDER_LABELS + 1} labels.*threshold=0\.01"):
        CRF(order=2, max_iterations=1).fit(*data(EXACT_SECOND_ORDER_LABELS + 1))
    assert "O(L^3) per token" in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        CRF(order=2, max_iterations=1).fit(*data(EXACT_SECOND_ORDER_LABELS))
        CRF(order=2, candidate_threshold=0.01, max_iterations=1).fit(*data(EXACT_SECOND_ORDER_LABELS + 1))


@pytest.mark.parametrize("seed", range(4))
def test_filled_edges_of_a_candidate_lattice_are_the_nonzero_entries_of_the_mask(seed):
    """The edges between filled slots, listed from the per-slot masks, are np.nonzero's of the
    4-d mask in (t, j, k, i) order; the lattice's tables and edge lists are the mask's."""
    from crf._transitions import CandidateEdges, _filled_edges

    rng = np.random.default_rng(seed)
    T, K, L = 9, 3, 4
    labels, before = (np.where(rng.random((T, K)) < 0.6, rng.integers(0, L, (T, K)), -1) for _ in range(2))
    before2 = np.where(rng.random((T, K + 1)) < 0.6, rng.integers(0, L + 1, (T, K + 1)), -1)
    previous, middle, current = before2 >= 0, before >= 0, labels >= 0
    mask = previous[:, :, None, None] & middle[:, None, :, None] & current[:, None, None, :]
    t, j, k, i = np.nonzero(mask.transpose(0, 2, 3, 1))
    for got, expected in zip(_filled_edges(previous, middle, current), (t, i, j, k)):
        np.testing.assert_array_equal(got, expected)
    edges = CandidateEdges.of(labels, before, before2, L)
    np.testing.assert_array_equal(edges.edges != edges.empty, mask)
    taken = edges.take(np.array([4, 0, 7]))
    start, source, target, triple = taken.listed
    t, j, k, i = np.nonzero(taken.edges.transpose(0, 2, 3, 1) != taken.empty)
    S = (K + 1) * K
    np.testing.assert_array_equal(source, t * S + i * K + j)
    np.testing.assert_array_equal(target, t * S + j * K + k)
    np.testing.assert_array_equal(triple, taken.edges[t, i, j, k])
    np.testing.assert_array_equal(start, np.concatenate([[0], np.cumsum(np.bincount(t, minlength=3))]))


@pytest.mark.parametrize("seed", [0, 1])
def test_candidate_lattice_slots_list_candidates_in_label_order_and_make_their_index_when_needed(seed):
    """Each token's slots hold its candidate labels in label order, then -1 (K = the most
    candidates of a token); the lattice's edge index is made only when a recursion asks for it,
    and the operator shares the lattice's."""
    from crf._order import SecondOrderChain

    rng = np.random.default_rng(seed)
    L, lengths = 5, [4, 1, 6]
    candidates = rng.random((sum(lengths), L)) < 0.4
    candidates[np.arange(sum(lengths)), rng.integers(0, L, sum(lengths))] = True
    structure = SecondOrderChain(L)
    lattice = structure.lattice_in_order(np.concatenate([[0], np.cumsum(lengths)]), candidates)
    K = candidates.sum(axis=1).max()
    expected = np.array([np.concatenate([np.flatnonzero(row), np.full(K - row.sum(), -1)]) for row in candidates])
    np.testing.assert_array_equal(lattice.labels, expected)
    operator, _, _ = lattice.scores(rng.normal(size=structure.tail_size))
    assert "index" not in lattice.__dict__ and "index" not in operator.__dict__
    assert operator.index is lattice.index

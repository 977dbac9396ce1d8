"""Partial labels, warm starts and the uncertainty queries of crf.CRF: the partial-label
likelihood and its gradient against brute-force enumeration and finite differences, unknown
gold labels in scoring, warm starts that bring new attributes and labels, and the sequence-level
figures against enumeration."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import enumerate_paths, word_class_corpus
from scipy.special import logsumexp

from crf import CRF, SequenceBatch, metrics
from crf._objective import Objective, ParameterLayout

A, L = 6, 3


def partial_problem(seed: int, n: int = 12):
    """Random attributes, labels with about a third unknown (-1), one sequence wholly unknown
    and one wholly known, and random weights."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=n)
    T = int(lengths.sum())
    X = sp.csr_matrix(rng.random((T, A)) * (rng.random((T, A)) < 0.5))
    labels = rng.integers(0, L, size=T)
    labels[rng.random(T) < 0.35] = -1
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    labels[offsets[0] : offsets[1]] = -1  # no known label at all
    labels[offsets[1] : offsets[2]] = rng.integers(0, L, size=lengths[1])  # every label known
    params = ParameterLayout(A, L)
    theta = rng.normal(scale=0.7, size=params.size)
    return X, offsets, labels, params, theta


def brute_force_loss(X, offsets, labels, params, theta) -> float:
    """sum over sequences of log Z(x) - log Z(x | known labels), by enumerating every path."""
    state, transitions, start, end = params.split(theta)
    emissions = np.asarray(X @ state)
    total = 0.0
    for a, b in zip(offsets[:-1], offsets[1:]):
        paths, scores = enumerate_paths(emissions[a:b], transitions, start, end)
        known = labels[a:b]
        agrees = np.all((known < 0) | (paths == known), axis=1)
        total += logsumexp(scores) - logsumexp(scores[agrees])
    return total


@pytest.mark.parametrize("seed", range(4))
def test_partial_label_loss_and_gradient_match_enumeration(seed):
    X, offsets, labels, params, theta = partial_problem(seed)
    objective = Objective(X, offsets, labels, params, n_threads=1)
    loss, gradient = objective(theta)
    assert loss == pytest.approx(brute_force_loss(X, offsets, labels, params, theta), rel=1e-10)
    step = 1e-6
    numeric = np.array(
        [
            (
                brute_force_loss(X, offsets, labels, params, theta + step * e)
                - brute_force_loss(X, offsets, labels, params, theta - step * e)
            )
            / (2 * step)
            for e in np.eye(params.size)
        ]
    )
    np.testing.assert_allclose(gradient, numeric, atol=1e-6)


def test_a_sequence_without_known_labels_contributes_nothing_and_known_ones_are_the_usual_likelihood():
    X, offsets, labels, params, theta = partial_problem(7)
    lengths = np.diff(offsets)
    keep = np.arange(1, lengths.size)  # drop sequence 0, which has no known label
    rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in keep])
    kept_offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
    with_it = Objective(X, offsets, labels, params, n_threads=1)(theta)
    without = Objective(X[rows], kept_offsets, labels[rows], params, n_threads=1)(theta)
    assert with_it[0] == pytest.approx(without[0], rel=1e-13)
    np.testing.assert_allclose(with_it[1], without[1], atol=1e-12)
    # every label known: exactly the fully labelled objective (observed minus expected counts)
    full = np.random.default_rng(8).integers(0, L, size=labels.size)
    value, _ = Objective(X, offsets, full, params, n_threads=1)(theta)
    assert value == pytest.approx(brute_force_loss(X, offsets, full, params, theta), rel=1e-10)
    with pytest.raises(ValueError, match="or be -1"):
        Objective(X, offsets, np.full(labels.size, -2), params)


def test_fit_with_unknown_labels_learns_from_the_known_ones():
    X, y = word_class_corpus(0, 300, n_words=12, lengths=(2, 9), inside_below=8, a_below=10)
    test_X, test_y = word_class_corpus(1, 100, n_words=12, lengths=(2, 9), inside_below=8, a_below=10)
    rng = np.random.default_rng(0)
    hidden = [[label if rng.random() < 0.4 else None for label in sequence] for sequence in y]
    hidden[0] = [None] * len(hidden[0])
    model = CRF(max_iterations=100, all_possible_transitions=True).fit(X, hidden)
    assert None not in model.classes_ and set(model.classes_) == {label for s in y for label in s}
    assert model.score(test_X, test_y) > 0.95
    # scoring: unknown gold labels are left out by score, refused by the metrics
    model_score = model.score(X[:5], hidden[:5])
    known = [(g, p) for gs, ps in zip(hidden[:5], model.predict(X[:5])) for g, p in zip(gs, ps) if g is not None]
    assert model_score == pytest.approx(np.mean([g == p for g, p in known]))
    with pytest.raises(ValueError, match="sequence 0, token 0: the gold label is None"):
        metrics.flat_accuracy_score(hidden[:5], list(model.predict(X[:5])))
    with pytest.raises(ValueError, match="gold label is None"):
        metrics.chunk_scores(hidden[:5], list(model.predict(X[:5])))
    with pytest.raises(ValueError, match="at least one known label"):
        CRF().fit(X[:3], [[None] * len(s) for s in y[:3]])
    with pytest.raises(ValueError, match="need algorithm='lbfgs' or 'l2sgd'"):
        CRF(algorithm="ap").fit(X, hidden)
    sgd = CRF(algorithm="l2sgd", max_iterations=5, learning_rate=0.1, batch_size=8).fit(X, hidden)
    assert sgd.score(test_X, test_y) > 0.9


def test_warm_start_brings_new_attributes_and_labels_and_needs_fewer_iterations():
    X, y = word_class_corpus(3, 600, n_words=20, lengths=(2, 10), inside_below=8, a_below=19)
    # most of the data first (as in a round of active learning), but none of its sentences has the
    # word w19, the only B-B: the attribute and the label arrive with the rest
    first = [i for i, x in enumerate(X) if all(t["w"] != "w19" for t in x)]
    assert 0.7 < len(first) / len(X) < 0.9
    warm = CRF(warm_start=True, c2=0.1).fit([X[i] for i in first], [y[i] for i in first])
    old_attributes, old_classes = list(warm.attributes_), list(warm.classes_)
    old_state = warm.state_weights_.copy()
    captured = []
    warm.set_params(callback=lambda info: captured.append(info.theta.copy()) if info.iteration == 1 else None)
    warm.fit(X, y)
    assert warm.classes_[: len(old_classes)] == old_classes and "B-B" in warm.classes_[len(old_classes) :]
    cold = CRF(c2=0.1).fit(X, y)
    assert set(old_attributes) < set(warm.attributes_) and warm.attributes_ == cold.attributes_  # the new data's own
    # the same optimum: the loss within the stopping tolerance, the same predictions
    assert warm.training_log_[-1]["loss"] == pytest.approx(cold.training_log_[-1]["loss"], rel=1e-4)
    assert list(map(list, warm.predict(X))) == list(map(list, cold.predict(X)))
    assert warm.n_iter_ <= 0.75 * cold.n_iter_, (warm.n_iter_, cold.n_iter_)  # 36 against 52
    assert old_state.shape[0] == len(old_attributes) and captured


def test_warm_start_on_a_batch_matches_columns_by_name_and_a_cold_estimator_ignores_it():
    X, y = word_class_corpus(4, 200, n_words=10, lengths=(2, 8), inside_below=7, a_below=9)
    from crf import AttributeIndex

    index = AttributeIndex()
    batch = index.fit_transform(X)
    names = list(index.names())
    model = CRF(warm_start=True, max_iterations=50).fit(batch.subset(np.arange(50)), y[:50], attribute_names=names)
    model.fit(batch, y, attribute_names=names)
    assert model.n_attributes_ == batch.n_attributes and model.score(batch, y) > 0.95
    narrow = SequenceBatch(batch.X[:, :3], batch.offsets)  # by name: the other attributes are gone
    assert model.fit(narrow, y, attribute_names=names[:3]).attributes_ == names[:3]
    model.fit(batch, y, attribute_names=names)
    unnamed_first = CRF(warm_start=True, max_iterations=20).fit(batch, y)
    with pytest.raises(ValueError, match="fewer than"):  # without names, by position: the old columns come first
        unnamed_first.fit(narrow, y)
    with pytest.raises(ValueError, match="attributes have names, but this SequenceBatch comes without"):
        model.fit(batch, y)
    # a failed fit leaves the fitted model as it was; a warm start at the optimum is no failure
    classes = list(model.classes_)
    with pytest.raises(ValueError, match="sequences in X_dev"):
        model.fit(batch, y, X_dev=batch, y_dev=y[:3], attribute_names=names)
    assert model.classes_ == classes and model.score(batch, y) > 0.95
    converged = CRF(warm_start=True, c1=0.5, c2=0.0, epsilon=1e-9, delta=0.0).fit(batch, y)
    weights = converged.state_weights_.copy()
    converged.fit(batch, y)  # begins where it ended: a line search with nothing to gain
    assert converged.n_iter_ <= 1 and np.allclose(converged.state_weights_, weights)
    unnamed = CRF(warm_start=True, max_iterations=20).fit(batch, y)
    with pytest.raises(ValueError, match="attributes have no names"):
        unnamed.fit(X, y)
    with pytest.raises(ValueError, match="warm_start=True does not apply to algorithm='ap'"):
        CRF(algorithm="ap", warm_start=True).fit(X, y)


def test_uncertainty_figures_match_enumeration():
    X, y = word_class_corpus(5, 60, n_words=10, lengths=(1, 5), inside_below=7, a_below=9)
    model = CRF(max_iterations=15, c2=1.0).fit(X, y)
    probe, _ = word_class_corpus(6, 12, n_words=10, lengths=(1, 5), inside_below=7, a_below=9)
    figures = model.uncertainty(probe, n_best=3)
    emissions, batch = model.emissions(probe)
    for i, (a, b) in enumerate(zip(batch.offsets[:-1], batch.offsets[1:])):
        paths, scores = enumerate_paths(emissions[a:b], *model._weights())
        p = np.exp(scores - logsumexp(scores))
        order = np.sort(p)[::-1]
        assert figures.best_probability[i] == pytest.approx(order[0], rel=1e-9)
        assert figures.margin[i] == pytest.approx(order[0] - (order[1] if order.size > 1 else 0.0), abs=1e-12)
        marginals = np.array([[p[paths[:, t] == label].sum() for label in range(len(model.classes_))] for t in range(b - a)])
        token_entropy = -(marginals * np.log(np.where(marginals > 0, marginals, 1))).sum(axis=1)
        np.testing.assert_allclose(figures.token_entropy[a:b], token_entropy, atol=1e-10)
        assert figures.total_token_entropy[i] == pytest.approx(token_entropy.sum(), abs=1e-10)
        top = order[:3] / order[:3].sum()
        assert figures.nbest_entropy[i] == pytest.approx(-(top * np.log(top)).sum(), abs=1e-10)
        assert model.sequence_entropy([probe[i]])[0] == pytest.approx(-(p * np.log(p)).sum(), abs=1e-9)
    frame = figures.frame()
    assert list(frame.columns) == ["best_probability", "margin", "total_token_entropy", "nbest_entropy", "tokens"]
    assert list(model.uncertainty(probe, figures=("margin",)).frame().columns) == ["best_probability", "margin", "tokens"]
    with pytest.raises(ValueError, match="unknown uncertainty figures"):
        model.uncertainty(probe, figures=("entropy",))
    np.testing.assert_array_equal(model.best_path_probability(probe), figures.best_probability)
    assert [len(e) for e in model.token_entropies(probe)] == [len(s) for s in probe]

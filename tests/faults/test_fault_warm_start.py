"""Warm starts across changed settings, and inputs checked before the first iteration.

A refit with ``warm_start=True`` after the order, the labels, ``boundary_transitions`` or the
attribute set changed either reuses what is compatible and reaches the cold fit's optimum, or is
refused before any iteration with one line naming the setting. Every input of ``fit`` and of
python-crfsuite's ``Trainer.append`` is checked before training starts.
"""

from __future__ import annotations

import logging
import unicodedata
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import crf.crfsuite as crfsuite
import crf.pycrfsuite as pycrfsuite
from crf import CRF

RNG = np.random.default_rng(7)
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "it"]


def _data(n: int = 40, labels=("A", "B", "C"), seed: int = 0, extra: bool = False):
    """Dict-feature sequences whose labels depend on the word and its predecessor."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for _ in range(n):
        length = int(rng.integers(2, 7))
        words = rng.choice(WORDS, size=length)
        X.append([{"w": w, "prev": words[t - 1] if t else "<s>", **({"new": 1.0} if extra else {})} for t, w in enumerate(words)])
        y.append([labels[(WORDS.index(w) + (t % 2)) % len(labels)] for t, w in enumerate(words)])
    return X, y


class Counting:
    """A callback counting the iterations it sees."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, info) -> None:
        self.calls += 1


def _loss(model: CRF) -> float:
    return model.training_log_.last_iteration["loss"]


def _same_optimum(warm: CRF, cold: CRF) -> None:
    """Two fits of one convex objective: the same final loss and predictions."""
    assert _loss(warm) == pytest.approx(_loss(cold), rel=1e-5)
    assert warm.classes_ == cold.classes_


@pytest.mark.parametrize("first, second", [(1, 2), (2, 1)])
def test_a_warm_refit_after_the_order_changed_reaches_the_cold_fits_optimum(first, second):
    X, y = _data()
    model = CRF(order=first, c2=0.5).fit(X, y)
    model.set_params(order=second, warm_start=True)
    model.fit(X, y)
    cold = CRF(order=second, c2=0.5).fit(X, y)
    _same_optimum(model, cold)
    assert model.fitted_order == second
    assert model.predict(X[:5]).tolist() == cold.predict(X[:5]).tolist()


def test_a_candidate_lattice_second_order_warm_refit_from_a_first_order_model_trains():
    X, y = _data()
    model = CRF(c2=0.5).fit(X, y)
    model.set_params(order=2, candidate_threshold=0.01, warm_start=True)
    model.fit(X, y)
    assert model.fitted_order == 2 and model.candidate_model_ is not None
    cold = CRF(c2=0.5, order=2, candidate_threshold=0.01).fit(X, y)
    assert model.score(X, y) == pytest.approx(cold.score(X, y), abs=0.02)


@pytest.mark.parametrize(
    ("fitted", "changed"),
    [
        ({}, {"order": 2, "candidate_threshold": 0.01}),  # first order, then second order over candidate labels
        ({"order": 2}, {"candidate_threshold": 0.01}),  # exact second order, then over candidate labels
        ({"order": 2, "candidate_threshold": 0.01}, {"candidate_threshold": None}),  # over candidate labels, then exact
        ({"order": 2, "candidate_threshold": 0.01}, {"order": 1, "candidate_threshold": None}),
        ({"order": 2, "candidate_threshold": 0.01}, {"candidate_threshold": 0.3}),
    ],
)
def test_settings_changed_after_a_fit_change_neither_its_predictions_nor_its_file(fitted, changed, tmp_path):
    """``set_params(order=2, candidate_threshold=0.01)`` on a fitted first-order model saved a file
    ``CRF.load`` refused ("a second-order model over candidate labels without its candidate model"), and a
    candidate-lattice model set to ``candidate_threshold=None`` failed in ``predict`` with a TypeError, with no refit or
    after a refused one: until the next fit, the fitted model is what it was fitted as."""
    X, y = _data()
    model = CRF(c2=0.5, **fitted).fit(X, y)
    before = model.predict_marginals(X)

    def same(marginals) -> bool:
        return len(marginals) == len(before) and all(np.array_equal(a, b) for a, b in zip(marginals, before))

    model.set_params(**changed)
    assert same(model.predict_marginals(X))
    with pytest.raises(ValueError):  # a refit refused before its first iteration changes nothing either
        model.fit([[{"w": float("nan")}]], [["A"]])
    assert same(model.predict_marginals(X))
    model.save(tmp_path / "m.npz")
    loaded = CRF.load(tmp_path / "m.npz")
    assert same(loaded.predict_marginals(X))
    assert (loaded.order, loaded.candidate_threshold) == (model.fitted_order, model.candidate_threshold_)


@pytest.mark.parametrize("previous_order", [1, 2])
def test_a_candidate_lattice_warm_refit_whose_data_lists_the_labels_in_another_order_matches_the_cold_fit(
    previous_order, tmp_path
):
    """The candidate model was fitted cold in the new data's label order while the model kept the old order
    first: its candidate columns then named the wrong labels (a silently wrong model that saved but
    could not be loaded). Now the candidate model takes the model's label order."""
    labels = ("A", "B", "C", "D")
    X, y = _data(labels=labels)
    first = [{"w": w} for w in ("the", "cat", "sat", "on")]
    old = CRF(c2=0.5, order=previous_order).fit([first, *X], [list(labels), *y])
    new_X, new_y = [first, *X[::-1]], [list(labels[::-1]), *y[::-1]]  # first appearance D, C, B, A
    old.set_params(order=2, candidate_threshold=0.05, warm_start=True)
    warm = old.fit(new_X, new_y)
    cold = CRF(c2=0.5, order=2, candidate_threshold=0.05).fit(new_X, new_y)
    assert warm.classes_ == list(labels) and cold.classes_ == list(labels[::-1])
    assert warm.candidate_model_.classes_ == warm.classes_
    assert _loss(warm) == pytest.approx(_loss(cold), rel=1e-4)
    assert warm.predict(X).tolist() == cold.predict(X).tolist()
    warm.save(tmp_path / "warm.npz")
    assert CRF.load(tmp_path / "warm.npz").predict(X).tolist() == cold.predict(X).tolist()


def test_a_cold_candidate_lattice_fit_does_not_warn_about_a_warm_start(caplog):
    """A cold second-order fit over candidate labels starts from its candidate model's weights; when zero weights fit better
    it warned "warm start: the previous weights ..." though no warm start was asked for (K18)."""
    rng, labels = np.random.default_rng(0), [f"L{i}" for i in range(8)]
    y = [[labels[int(i)] for i in rng.integers(0, 8, 6)] for _ in range(80)]
    X = [[{f"h={label if rng.random() < 0.5 else 'x'}": 1.0} for label in sequence] for sequence in y]
    caplog.set_level(logging.INFO, logger="crf")
    CRF(order=2, candidate_threshold=0.05, max_iterations=5).fit(X, y)
    assert "the candidate model's start: its weights fit this data worse than zero weights" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "worse than zero" in r.getMessage()]


def test_labels_that_print_like_the_fitted_ones_are_refused_before_training(tmp_path):
    X, y = _data(labels=("1", "2", "3"))
    model = CRF(c2=0.5).fit(X, y)
    before = list(model.classes_)
    counting = Counting()
    model.set_params(warm_start=True, callback=counting)
    numeric = [[int(label) for label in labels] for labels in y]
    with pytest.raises(TypeError, match=r"^warm_start: the labels '1' and 1 are different values with the same name"):
        model.fit(X, numeric)
    assert counting.calls == 0
    assert model.classes_ == before  # untouched
    model.save(tmp_path / "m.npz")
    assert CRF.load(tmp_path / "m.npz").classes_ == before


def test_new_labels_on_a_warm_refit_are_added_after_the_old_ones():
    X, y = _data(labels=("A", "B"))
    X2, y2 = _data(labels=("A", "B", "C"), seed=1)
    every = {"all_possible_states": True, "all_possible_transitions": True}  # one feature set for both fits
    model = CRF(c2=0.5, **every).fit(X, y)
    model.set_params(warm_start=True)
    model.fit(X2, y2)
    cold = CRF(c2=0.5, **every).fit(X2, y2)
    assert model.classes_ == ["A", "B", "C"]
    assert _loss(model) == pytest.approx(_loss(cold), rel=1e-5)


@pytest.mark.parametrize("order", [1, 2])
def test_old_labels_the_new_data_lacks_are_dropped_and_the_cold_optimum_is_reached(order):
    """An old label that the new data lacks would stay a class with probability mass: dropped."""
    X, y = _data(labels=("A", "B", "C"))
    renamed = [["D" if label == "B" else label for label in labels] for labels in y]
    model = CRF(c2=0.5, order=order).fit(X, y)
    model.set_params(warm_start=True)
    model.fit(X, renamed)
    cold = CRF(c2=0.5, order=order).fit(X, renamed)
    assert model.classes_ == ["A", "C", "D"] and sorted(cold.classes_) == ["A", "C", "D"]
    assert _loss(model) == pytest.approx(_loss(cold), rel=1e-5)
    assert model.predict(X).tolist() == cold.predict(X).tolist()


def test_a_warm_refit_on_a_batch_needs_the_columns_names_when_the_model_has_them():
    X, y = _data()
    model = CRF(c2=0.5).fit(X, y)
    batch, names = model.attribute_index_.transform(X), list(model.attributes_)
    model.set_params(warm_start=True)
    model.fit(batch, y, attribute_names=names)
    assert model.predict(X).tolist() == model.predict(batch).tolist()
    unnamed = CRF(c2=0.5).fit(X, y).set_params(warm_start=True)
    before = unnamed.state_weights_.copy()
    permuted = batch.X[:, np.r_[1, 0, 2 : batch.X.shape[1]]]  # columns without names could come in any order
    for columns in (batch, type(batch)(permuted.tocsr(), batch.offsets)):
        with pytest.raises(ValueError, match="warm_start: the fitted model's attributes have names, but this SequenceBatch"):
            unnamed.fit(columns, y)  # refused before training: no refit model that can no longer read dicts
    np.testing.assert_array_equal(unnamed.state_weights_, before)
    assert unnamed.predict(X).tolist() == unnamed.predict(batch).tolist()


def test_a_warm_refit_without_boundary_weights_drops_them_and_writes_a_crfsuite_file(tmp_path):
    X, y = _data()
    model = CRF(c2=0.5, boundary_transitions=True).fit(X, y)
    assert np.any(model.start_weights_ != 0)
    path = tmp_path / "model.crfsuite"
    model.set_params(warm_start=True, boundary_transitions=False, model_filename=str(path))
    model.fit(X, y)
    assert not np.any(model.start_weights_) and not np.any(model.end_weights_)
    cold = CRF(c2=0.5, boundary_transitions=False).fit(X, y)
    _same_optimum(model, cold)
    assert CRF.from_crfsuite(path).predict(X[:5]).tolist() == cold.predict(X[:5]).tolist()


def test_a_warm_refit_with_new_attributes_reaches_the_cold_fits_optimum():
    X, y = _data()
    X2, _ = _data(extra=True)  # the same tokens with one more attribute each
    model = CRF(c2=0.5).fit(X, y)
    model.set_params(warm_start=True)
    model.fit(X2, y)
    cold = CRF(c2=0.5).fit(X2, y)
    assert set(model.attributes_) == set(cold.attributes_)
    _same_optimum(model, cold)


@pytest.mark.parametrize("all_possible_states", [False, True])
def test_an_attribute_the_new_data_lacks_leaves_no_feature_and_no_weight(all_possible_states):
    """A warm refit kept the old attributes in its vocabulary: with ``all_possible_states`` every
    (old attribute, label) stayed a feature no data term touches, at its old weight (without a
    prior: exactly, changing predictions on any input that has the attribute)."""
    X, y = _data(extra=True)  # attributes w, prev, new
    X2, y2 = _data(seed=1)  # no "new"
    model = CRF(c1=0, c2=0, max_iterations=40, all_possible_states=all_possible_states).fit(X, y)
    assert any(attribute == "new" for attribute, _ in model.state_features_)
    model.set_params(warm_start=True).fit(X2, y2)
    cold = CRF(c1=0, c2=0, max_iterations=40, all_possible_states=all_possible_states).fit(X2, y2)
    assert "new" not in model.attributes_ and model.attributes_ == cold.attributes_
    assert not any(attribute == "new" for attribute, _ in model.state_features_)
    with_new = [[{**token, "new": 1.0} for token in sentence] for sentence in X2]
    assert model.predict(with_new).tolist() == model.predict(X2).tolist()  # "new" is read by nothing
    assert model.n_attributes_ == cold.n_attributes_


def test_a_named_batch_warm_refit_matches_the_old_columns_by_name():
    """Named columns in another order, and one column fewer, reach the cold fit's optimum."""
    X, y = _data(extra=True)
    model = CRF(c2=0.5).fit(X, y)
    fresh = CRF(c2=0.5).fit(X, y)
    names = list(fresh.attributes_)
    order = np.r_[len(names) - 1 : 0 : -1]  # reversed, without the first attribute
    kept = [names[i] for i in order]
    batch = fresh.attribute_index_.transform(X)
    shuffled = type(batch)(batch.X[:, order].tocsr(), batch.offsets)
    model.set_params(warm_start=True).fit(shuffled, y, attribute_names=kept)
    cold = CRF(c2=0.5).fit(shuffled, y, attribute_names=kept)
    _same_optimum(model, cold)
    assert model.attributes_ == kept and model.predict(shuffled).tolist() == cold.predict(shuffled).tolist()


def test_dev_labels_none_of_which_was_trained_on_are_refused_and_some_are_named():
    """``y_dev`` coded another way (integers for string labels, lower case) trained without a word
    and logged dev accuracy 0 at every iteration (round 20's note)."""
    X, y = _data()
    counting = Counting()
    for coded in ([[0] * len(s) for s in y[:5]], [[label.lower() for label in s] for s in y[:5]]):
        with pytest.raises(ValueError, match=r"^y_dev: none of its labels \(.*\) is a label of y \('A', '"):
            CRF(callback=counting).fit(X, y, X[:5], coded)
    assert counting.calls == 0
    with pytest.warns(RuntimeWarning, match=r"y_dev has 1 label\(s\) that y lacks \('Z'\)"):
        CRF(max_iterations=2).fit(X, y, X[:5], [[*s[:-1], "Z"] for s in y[:5]])


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda X, y: (X, y, X[:3], y[:2]), r"3 sequences in X_dev but 2 in y_dev"),
        (lambda X, y: (X, y, X[:2], [y[0], y[1][:-1]]), r"sequence 1: \d+ tokens in X_dev but \d+ labels in y_dev"),
        (lambda X, y: (X, y, [[{"w": float("nan")}]], [["A"]]), r"X_dev: sequence 0, token 0: attribute 'w' has the non-finite"),
        (lambda X, y: (X, y, X[:1], [[1] * len(y[0])]), r"y_dev: the labels '1' and 1 are"),
        (lambda X, y: (X, y, X[:1], None), r"pass both X_dev and y_dev"),
    ],
)
def test_bad_dev_data_is_refused_before_the_first_iteration(change, error):
    X, y = _data(labels=("1", "2", "3"))
    counting = Counting()
    with pytest.raises((ValueError, TypeError), match=error):
        CRF(c2=0.5, callback=counting).fit(*change(X, y))
    assert counting.calls == 0


@pytest.mark.parametrize("value", [Fraction(1, 3), Decimal("1.5"), np.float32(2.0), np.int64(3), True, 7])
def test_feature_values_of_any_real_type_are_accepted(value):
    X = [[{"a": 1, "b": value}], [{"a": 1}]]
    model = CRF(max_iterations=5).fit(X, [["A"], ["B"]])
    weights = dict(zip(model.attributes_, range(len(model.attributes_))))
    assert "b" in weights
    batch = model.attribute_index_.transform(X)
    assert batch.X[0, weights["b"]] == pytest.approx(float(value))


@pytest.mark.parametrize("value", [10**400, -(10**309)])
def test_an_integer_too_large_for_a_float_is_refused_with_its_position(value):
    X = [[{"a": 1}], [{"a": 1}, {"b": value}]]
    with pytest.raises(ValueError, match=r"sequence 1, token 1: attribute 'b' has an integer of [\d,]+ bits, too large"):
        CRF(max_iterations=5).fit(X, [["A"], ["B", "A"]])
    trainer = pycrfsuite.Trainer(verbose=False)
    trainer.append([{"a": 1}], ["A"])
    with pytest.raises(ValueError, match=r"sequence 1, item 1: attribute 'b' has an integer of [\d,]+ bits, too large"):
        trainer.append([{"a": 1}, {"b": value}], ["B", "A"])


@pytest.mark.parametrize("value", [1 + 2j, None, object()])
def test_a_feature_value_that_is_no_real_number_is_refused(value):
    with pytest.raises(TypeError, match=r"sequence 0, token 0: attribute 'b' has a value of type"):
        CRF(max_iterations=5).fit([[{"b": value}], [{"a": 1}]], [["A"], ["B"]])


@pytest.mark.parametrize("label", [1, np.int64(1)], ids=["int", "numpy-int"])
def test_labels_a_crfsuite_file_would_turn_into_text_are_refused_before_training(tmp_path, label):
    """A CRFsuite file holds labels as text: the integer label 1 would load as '1', so a model
    written with integer labels is refused before training, and the .npz format keeps them."""
    counting = Counting()
    X, y = [[{"a": 1}], [{"b": 1}]], [[label], [2]]
    with pytest.raises(
        ValueError, match=r"^model_filename: sequence 0, token 0: label 0 \(1\) is not a string \(int\): .* would load as '1'"
    ):
        CRF(max_iterations=5, model_filename=str(tmp_path / "m.crfsuite"), callback=counting).fit(X, y)
    assert counting.calls == 0 and not (tmp_path / "m.crfsuite").exists()
    fitted = CRF(max_iterations=5, boundary_transitions=False).fit(X, y)
    with pytest.raises(ValueError, match=r"the label 1 is not a string"):
        crfsuite.write_crfsuite_model(fitted, tmp_path / "m.crfsuite")
    fitted.save(tmp_path / "m.npz")
    assert CRF.load(tmp_path / "m.npz").predict(X).tolist() == [[1], [2]]


@pytest.mark.parametrize("name, problem", [("a\0b", "NUL character"), ("x" * (70 << 10), "bytes long")], ids=["nul", "long"])
def test_names_a_crfsuite_file_cannot_hold_are_refused_before_training(tmp_path, name, problem):
    counting = Counting()
    X, y = [[{"a": 1}], [{name: 1}]], [["A"], ["B"]]
    with pytest.raises(ValueError, match=f"model_filename: sequence 1, token 0: attribute .*{problem}"):  # round 41
        CRF(max_iterations=5, model_filename=str(tmp_path / "m.crfsuite"), callback=counting).fit(X, y)
    with pytest.raises(ValueError, match=f"model_filename: sequence 0, token 0: label .*{problem}"):
        CRF(max_iterations=5, model_filename=str(tmp_path / "m.crfsuite"), callback=counting).fit(X[:1], [[name]])
    assert counting.calls == 0 and not (tmp_path / "m.crfsuite").exists()
    CRF(max_iterations=5).fit(X, y)  # without a CRFsuite file to write, any name is fine
    # python-crfsuite's Trainer always writes a file: refused at append, naming sequence and item
    trainer = pycrfsuite.Trainer(verbose=False)
    trainer.append([["a"]], ["A"])
    with pytest.raises(ValueError, match=f"sequence 1, item 1: the attribute .*{problem}"):
        trainer.append([["a"], [name]], ["B", "A"])
    with pytest.raises(ValueError, match=f"sequence 1, item 0: the attribute .*{problem}"):
        trainer.append([{name: "v"}], ["B"])
    with pytest.raises(ValueError, match=f"sequence 1, item 0: the label .*{problem}"):
        trainer.append([["a"]], [name])


def test_a_failed_fit_leaves_the_fitted_model_as_it_was():
    X, y = _data()
    model = CRF(c2=0.5).fit(X, y)
    weights = model.state_weights_.copy()

    def stop(info):
        if info.iteration == 3:
            raise KeyboardInterrupt

    model.set_params(callback=stop, c2=0.1)
    with pytest.raises(KeyboardInterrupt):
        model.fit(X, y)
    np.testing.assert_array_equal(model.state_weights_, weights)
    assert model.predict(X[:3]).tolist() == CRF(c2=0.5).fit(X, y).predict(X[:3]).tolist()


@pytest.mark.parametrize(
    "first, second",
    [
        ({"min_freq": 0}, {"min_freq": 3}),
        ({"all_possible_states": True}, {"all_possible_states": False}),
        ({"all_possible_transitions": True}, {"all_possible_transitions": False}),
        ({"order": 2, "candidate_threshold": 0.01}, {"order": 2, "candidate_threshold": 0.01}),
        ({"order": 2, "candidate_threshold": 0.01}, {"order": 2, "candidate_threshold": 0.05, "c2": 0.3}),
    ],
)
def test_a_warm_refit_has_the_features_a_cold_fit_has(first, second):
    X, y = _data()
    model = CRF(c2=0.5, **first).fit(X, y)
    model.set_params(warm_start=True, **second)
    model.fit(X, y)
    cold = CRF(**{"c2": 0.5, **second}).fit(X, y)
    _same_optimum(model, cold)
    assert model.n_active_features_ <= cold.n_active_features_ + 0  # nothing the new settings switch off
    assert (model.feature_index_ is None) == (cold.feature_index_ is None)
    if cold.feature_index_ is not None:
        np.testing.assert_array_equal(model.feature_index_, cold.feature_index_)


def test_a_warm_refit_on_partly_unknown_labels_keeps_only_the_features_of_the_known_ones():
    X, y = _data()
    model = CRF(c2=0.5).fit(X, y)
    partial = [[label if t % 2 else None for t, label in enumerate(labels)] for labels in y]
    model.set_params(warm_start=True)
    model.fit(X, partial)
    cold = CRF(c2=0.5).fit(X, partial)
    assert _loss(model) == pytest.approx(_loss(cold), rel=1e-5)  # the classes' order is the old model's
    assert model.predict(X[:5]).tolist() == cold.predict(X[:5]).tolist()


@pytest.mark.parametrize("value", [np.bool_(True), np.bool_(False)])
def test_numpy_booleans_are_values_as_python_ones_are(value):
    X = [[{"a": 1, "b": value}], [{"a": 1}]]
    model = CRF(max_iterations=5).fit(X, [["A"], ["B"]])
    trainer = pycrfsuite.Trainer(verbose=False)
    trainer.append(X[0], ["A"])
    assert model.attribute_index_.transform(X).X[0].sum() == pytest.approx(1 + float(value))


@pytest.mark.parametrize(
    "value, error",
    [
        (np.timedelta64(3, "s"), r"attribute 'odd' has the value .*not a real number"),
        ([1, 2], r"attribute 'odd': attribute names must be str or bytes, not int"),
        (1e300, r"attribute 'odd' has the value 1e\+300, too large to train on"),
        (-(10**300), r"attribute 'odd' has the value -1e\+300, too large to train on"),
    ],
)
def test_a_value_no_training_can_use_is_refused_with_its_attribute(value, error):
    counting = Counting()
    with pytest.raises((TypeError, ValueError), match="sequence 1, token 0: " + error):
        CRF(max_iterations=5, callback=counting).fit([[{"a": 1}], [{"odd": value}]], [["A"], ["B"]])
    assert counting.calls == 0
    trainer = pycrfsuite.Trainer(verbose=False)
    trainer.append([{"a": 1}], ["A"])
    with pytest.raises((TypeError, ValueError), match="sequence 1, item 0: " + error):
        trainer.append([{"odd": value}], ["B"])


def test_sequences_may_come_from_any_iterable():
    X, y = _data()
    model = CRF(c2=0.5).fit((x for x in X), iter(y), (x for x in X[:5]), iter(y[:5]))
    expected = CRF(c2=0.5).fit(X, y).predict(X[:3]).tolist()
    assert model.predict(X[:3]).tolist() == expected
    # each sequence an iterator too, as sklearn-crfsuite and Trainer.append take them (K2: a bare "has no len()")
    inner = CRF(c2=0.5).fit([iter(x) for x in X], [iter(labels) for labels in y], [iter(x) for x in X[:5]], map(iter, y[:5]))
    assert inner.predict([iter(x) for x in X[:3]]).tolist() == expected
    assert inner.score((iter(x) for x in X), [iter(labels) for labels in y]) == inner.score(X, y)
    assert len(inner.predict_marginals([iter(x) for x in X[:3]])) == 3
    assert inner.predict_segments([iter(x) for x in X[:3]]).equals(inner.predict_segments(X[:3]))
    assert inner.uncertainty([iter(x) for x in X[:3]]).frame().equals(inner.uncertainty(X[:3]).frame())


def test_attribute_names_must_name_every_column_of_a_batch():
    from crf.attributes import AttributeIndex

    X, y = _data()
    index = AttributeIndex()
    batch = index.fit_transform(X)
    names = [str(n) for n in index.names()]
    with pytest.raises(ValueError, match=r"^1 attribute_names for a batch of \d+ attribute columns"):
        CRF(max_iterations=3).fit(batch, y, attribute_names=names[:1])
    model = CRF(max_iterations=3).fit(batch, y, attribute_names=names)
    assert model.attributes_ == names and len(model.attributes_) == model.n_attributes_


# ---- the second hostile pass: inputs ------------------------------------------------------------------------------


def test_labels_in_two_unicode_forms_are_refused():
    composed, decomposed = unicodedata.normalize("NFC", "é"), unicodedata.normalize("NFD", "é")
    X = [[{"a": 1}], [{"b": 1}]]
    with pytest.raises(TypeError, match=r"^the labels .* are the same text in two Unicode forms"):
        CRF(max_iterations=5).fit(X, [[composed], [decomposed]])
    model = CRF(max_iterations=5).fit(X, [[composed], ["x"]]).set_params(warm_start=True, callback=Counting())
    with pytest.raises(TypeError, match=r"^warm_start: the labels .* two Unicode forms"):
        model.fit(X, [[decomposed], ["x"]])
    assert model.callback.calls == 0


@pytest.mark.parametrize("where", ["attribute", "value", "label"])
def test_a_lone_surrogate_is_refused_before_training_everywhere(tmp_path, where):
    """No model file can hold a lone surrogate: refused by fit (with or without a CRFsuite file)
    and by python-crfsuite's append, never after training."""
    odd = "x\ud800"
    token = {odd: 1} if where == "attribute" else {"w": odd} if where == "value" else {"w": "a"}
    X, y = [[{"a": 1}], [token]], [["A"], [odd if where == "label" else "B"]]
    for filename in (None, str(tmp_path / "m.crfsuite")):
        counting = Counting()
        with pytest.raises(ValueError, match=r"lone surrogate"):
            CRF(max_iterations=5, callback=counting, model_filename=filename).fit(X, y)
        assert counting.calls == 0
    trainer = pycrfsuite.Trainer(verbose=False)
    with pytest.raises(ValueError, match=r"^sequence 0, item 0: the (attribute|label) .*lone surrogate"):
        trainer.append(X[1], y[1])


def test_model_files_that_cannot_be_written_are_refused_before_training(tmp_path):
    X, y = [[{"a": 1}], [{"b": 1}]], [["A"], ["B"]]
    for path, problem in ((tmp_path, "is a folder"), (tmp_path / "no" / "m.crfsuite", "there is no folder")):
        counting = Counting()
        with pytest.raises(OSError, match=f"^model_filename: .*{problem}"):
            CRF(max_iterations=5, callback=counting, model_filename=str(path)).fit(X, y)
        assert counting.calls == 0
        trainer = pycrfsuite.Trainer(verbose=False)
        trainer.append(X[0], y[0])
        with pytest.raises(OSError, match=f"^model: .*{problem}"):
            trainer.train(str(path))


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda X, y: dict(X=X, y=["AB", "B"]), r"^y: sequence 0 is a string \('AB'\), not a list of labels"),
        (lambda X, y: dict(X=X, y=y, X_dev=[X[0]], y_dev=["A"]), r"^y_dev: sequence 0 is a string"),
        (lambda X, y: dict(X=X, y=y, X_dev=[], y_dev=[]), r"^X_dev and y_dev hold no sequence"),
    ],
    ids=["y-string", "y_dev-string", "empty-dev"],
)
def test_label_strings_and_an_empty_dev_set_are_refused(change, error):
    X, y = [[{"a": 1}, {"b": 1}], [{"b": 1}]], [["A", "B"], ["B"]]
    counting = Counting()
    with pytest.raises((TypeError, ValueError), match=error):
        CRF(max_iterations=5, callback=counting).fit(**change(X, y))
    assert counting.calls == 0


def test_duplicate_attribute_names_of_a_batch_are_refused():
    model = CRF(max_iterations=5).fit([[{"a": 1}], [{"b": 1}]], [["A"], ["B"]])
    batch = model.attribute_index_.transform([[{"a": 1}], [{"b": 1}]])
    with pytest.raises(ValueError, match=r"^attribute_names: 'same' appears more than once"):
        CRF(max_iterations=5).fit(batch, [["A"], ["B"]], attribute_names=["same", "same"])


@pytest.mark.parametrize("value", [1e12, -1e20])
def test_a_value_too_large_to_train_well_is_refused(value):
    """From about 1e12 next to 0/1 indicators L-BFGS stops early, far from the optimum: refused."""
    with pytest.raises(ValueError, match=r"sequence 1, token 0: attribute 'odd' has the value .*too large to train on"):
        CRF(max_iterations=5).fit([[{"a": 1}], [{"odd": value}]], [["A"], ["B"]])
    with pytest.raises(ValueError, match=r"sequence 0, item 0: attribute 'odd' has the value .*too large to train on"):
        pycrfsuite.Trainer(verbose=False).append([{"odd": value}], ["A"])


def test_values_and_settings_too_big_to_print_are_named():
    huge = Fraction(10**5000, 1)  # its repr is beyond Python's 4,300-digit limit
    with pytest.raises(ValueError, match=r"sequence 1, token 0: attribute 'odd' has the value <a Fraction too long to print>"):
        CRF(max_iterations=5).fit([[{"a": 1}], [{"odd": huge}]], [["A"], ["B"]])
    with pytest.raises(ValueError, match=r"^parameter max_iterations: an integer of [\d,]+ bits"):
        pycrfsuite.Trainer(verbose=False).set_params({"max_iterations": 10**400})

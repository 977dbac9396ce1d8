"""crf.CRF as a scikit-learn estimator and a drop-in for sklearn_crfsuite.CRF: parameters,
cloning, pickling, model selection, sklearn-crfsuite's contract (fitted attributes, return
types, tagger, CRFsuite model files) and hyperparameter validation."""

from __future__ import annotations

import pickle

import joblib
import numpy as np
import pytest
from conftest import word_class_corpus
from scipy.stats import loguniform
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import make_scorer
from sklearn.model_selection import GridSearchCV, RandomizedSearchCV, cross_val_score
from sklearn.utils import get_tags
from sklearn.utils.validation import check_is_fitted

from crf import CRF, metrics

ALGORITHMS = ["lbfgs", "l2sgd", "ap", "pa", "arow"]
LABELS = ["O", "B-A", "I-A", "B-B"]


def weather():
    """One small sequence of dict tokens (numbers, strings, a bytes value) and its labels."""
    x = [
        {"walk": 1, "shop": 0.5},
        {"walk": 1},
        {"walk": 1, "clean": 0.5},
        {"shop": 0.5, "clean": 0.5},
        {"walk": 0.5, "clean": 1},
        {"clean": 1, "shop": 0.1},
        {"walk": 1, "shop": 0.5},
        {},
        {"clean": 1},
        {"sky": b"grey", "clean": 1},
    ]
    y = ["sunny"] * 3 + ["rainy"] * 3 + ["sunny"] * 2 + ["rainy"] * 2
    return x, y


def corpus(seed: int, n: int = 60):
    """Sentences whose labels follow from the words and the previous label."""
    return word_class_corpus(seed, n, n_words=10, lengths=(2, 8), inside_below=7, a_below=9)


@pytest.fixture(scope="module")
def fitted():
    X, y = corpus(0)
    return CRF(c2=0.1, max_iterations=50).fit(X, y), X, y


def test_params_round_trip_and_clone(fitted):
    model, X, _ = fitted
    params = model.get_params(deep=True)
    assert params == CRF().set_params(**params).get_params()
    twin = clone(model)
    assert twin.get_params() == params and twin.classes_ is None and twin.tagger_ is None
    assert CRF().set_params(algorithm="pa", c=0.5).get_params()["c"] == 0.5
    assert repr(CRF(c2=0.5)) == "CRF(c2=0.5)"  # sklearn's repr: only the non-default parameters
    tags = get_tags(CRF())
    assert not tags.input_tags.two_d_array and tags.input_tags.dict and tags.target_tags.required


def test_fitted_attributes_are_none_before_fit_and_sklearn_sees_fitting(fitted):
    empty = CRF()
    for name in ("classes_", "attributes_", "num_attributes_", "state_features_", "transition_features_", "size_"):
        assert getattr(empty, name) is None, name
    assert empty.training_log_ is None and empty.tagger_ is None
    with pytest.raises(NotFittedError):
        check_is_fitted(empty)
    with pytest.raises(NotFittedError, match="not fitted"):
        empty.predict([[{"a": 1}]])
    model, _, _ = fitted
    check_is_fitted(model)


def test_pickling_keeps_predictions(fitted):
    model, X, _ = fitted
    tagger = model.tagger_
    tagger.set(X[0])
    again = pickle.loads(pickle.dumps(model))
    assert [list(p) for p in again.predict(X)] == [list(p) for p in model.predict(X)]
    assert again.get_params() == model.get_params()
    assert pickle.loads(pickle.dumps(CRF(algorithm="ap"))).algorithm == "ap"


# joblib's worker processes are forked from the test process ("multiprocessing" backend): the estimator and
# the fitted models still travel by pickle between processes, which is what n_jobs needs of an estimator,
# without the ~13 s that loky's fresh interpreters spend importing SciPy, scikit-learn and the compiled kernels
# (the command-line tests use the library from fresh interpreters)
IN_OTHER_PROCESSES = {"backend": "multiprocessing"}


def test_cross_val_score_in_parallel():
    X, y = corpus(1)
    with joblib.parallel_config(**IN_OTHER_PROCESSES):
        scores = cross_val_score(CRF(max_iterations=30), X, y, cv=3, n_jobs=2)
    assert scores.shape == (3,) and scores.min() > 0.9


def test_randomized_and_grid_search_with_a_flat_f1_scorer():
    X, y = corpus(2, n=45)
    scorer = make_scorer(metrics.flat_f1_score, average="weighted", labels=["B-A", "I-A", "B-B"])
    with joblib.parallel_config(**IN_OTHER_PROCESSES):
        search = RandomizedSearchCV(
            CRF(max_iterations=20),
            {"c1": loguniform(1e-3, 1.0), "c2": loguniform(1e-3, 1.0)},
            n_iter=3,
            cv=3,
            scoring=scorer,
            n_jobs=2,
            random_state=0,
        ).fit(X, y)
    assert 0.8 < search.best_score_ <= 1.0 and set(search.best_params_) == {"c1", "c2"}
    grid = GridSearchCV(
        CRF(max_iterations=10), {"algorithm": ["lbfgs", "ap"]}, cv=2, scoring=metrics.flat_scorer(average="micro")
    )
    grid.fit(X, y)
    assert grid.best_estimator_.classes_ is not None


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_algorithm_fits_one_sequence(algorithm):
    # sklearn-crfsuite's own estimator checks, restated: fit, predict, marginals, score, pickle
    x, y = weather()
    model = CRF(algorithm).fit([x], [y])
    predicted = model.predict([x])
    assert isinstance(predicted, np.ndarray) and predicted.dtype == object
    if algorithm != "ap":  # the averaged perceptron is too regularised to fit this exactly
        assert (predicted == y).all() and model.score([x], [y]) == 1.0
    else:
        assert model.score([x], [y]) > 0.8
    marginals = model.predict_marginals([x])
    assert len(marginals) == 1 and len(marginals[0]) == len(y)
    for token in marginals[0]:
        assert set(token) == set(model.tagger_.labels()) and abs(sum(token.values()) - 1.0) < 1e-6
    again = pickle.loads(pickle.dumps(model))
    assert again.score([x], [y]) == model.score([x], [y]) and again.algorithm == algorithm


@pytest.mark.parametrize("use_dev", [True, False])
def test_verbose_training_with_and_without_dev(use_dev, caplog):
    x, y = weather()
    dev = ([x], [y]) if use_dev else (None, None)
    with caplog.at_level("INFO", logger="crf.model"):
        model = CRF(verbose=True, dev_every=1, max_iterations=20).fit([x, x], [y, y], *dev)
    assert "iter" in caplog.text and ("dev_acc" in caplog.text) == use_dev
    assert (model.predict([x]) == [y]).all()


def test_dev_arguments_are_checked_before_training():
    X, y = corpus(3, n=5)
    seen = []
    with pytest.raises(ValueError, match="both X_dev and y_dev"):
        CRF(callback=seen.append).fit(X, y, X)
    with pytest.raises(ValueError, match="both X_dev and y_dev"):
        CRF(callback=seen.append).fit(X, y, None, y)
    assert seen == []


def test_fitted_attributes_mean_what_sklearn_crfsuite_says():
    x, y = weather()
    model = CRF().fit([x] * 20, [y] * 20)
    assert set(model.classes_) == {"sunny", "rainy"} and model.size_ > 1000
    assert (
        model.num_attributes_ == len(model.attributes_) > 0 and "clean" in model.attributes_ and "sky:grey" in model.attributes_
    )
    assert model.state_features_ and all(isinstance(w, float) and w != 0 for w in model.state_features_.values())
    assert all(a in model.attributes_ and label in model.classes_ for a, label in model.state_features_)
    assert model.transition_features_ and all(isinstance(w, float) for w in model.transition_features_.values())
    log = model.training_log_
    assert len(log.iterations) == model.n_iter_ and log.last_iteration is log[-1]
    assert {"num", "loss", "feature_norm", "error_norm", "active_features", "time"} <= set(log[0])
    info = model.tagger_.info()
    assert info.state_features == model.state_features_ and info.labels == {"sunny": 0, "rainy": 1}


def test_return_types_match_sklearn_crfsuite(fitted):
    sklearn_crfsuite = pytest.importorskip("sklearn_crfsuite")
    model, X, y = fitted
    reference = sklearn_crfsuite.CRF(c2=0.1, max_iterations=50).fit(X, y)
    for batch in (X[:4], [X[0]], [X[0], X[0]]):  # ragged, one sequence, equal lengths (2-D arrays)
        ours, theirs = model.predict(batch), reference.predict(batch)
        assert type(ours) is type(theirs) and ours.dtype == theirs.dtype and ours.shape == theirs.shape
        ours, theirs = model.predict_marginals(batch), reference.predict_marginals(batch)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert type(model.predict_single(X[0])) is type(reference.predict_single(X[0])) is list
    assert model.score(X, y) == pytest.approx(reference.score(X, y), abs=0.02)
    assert model.predict([]).shape == reference.predict([]).shape == (0,)


def test_empty_input():
    assert CRF().fit(*corpus(4, n=5)).predict([]).size == 0
    with pytest.raises(ValueError, match="at least one training sequence"):
        CRF().fit([], [])


def test_model_filename_writes_and_loads_a_crfsuite_model(tmp_path):
    pycrfsuite = pytest.importorskip("pycrfsuite")
    x, y = weather()
    X, Y = corpus(5)
    path = tmp_path / "model.crfsuite"
    model = CRF(model_filename=str(path)).fit(X, Y)
    assert path.exists() and not np.any(model.start_weights_) and not np.any(model.end_weights_)
    loaded = CRF(model_filename=str(path))  # loads lazily, as sklearn-crfsuite does
    assert [list(p) for p in loaded.predict(X)] == [list(p) for p in model.predict(X)]
    assert pickle.loads(pickle.dumps(loaded)).score(X, Y) == model.score(X, Y)
    reference = pycrfsuite.Tagger()
    reference.open(str(path))
    ours = model.tagger_
    for sequence in X[:5]:
        assert ours.tag(sequence) == reference.tag(sequence)
        guess = reference.tag(sequence)
        assert ours.probability(guess) == pytest.approx(reference.probability(guess), rel=1e-6)
        for label in ours.labels():
            assert ours.marginal(label, 0) == pytest.approx(reference.marginal(label, 0), abs=1e-6)
    with pytest.raises(ValueError, match="no start/end weights"):
        CRF(model_filename=str(tmp_path / "other.crfsuite"), boundary_transitions=True).fit(X, Y)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"c1": -1.0}, "c1 must be a finite number >= 0"),
        ({"c2": float("nan")}, "c2 must be a finite number"),
        ({"c2": "1"}, "c2 must be a number"),
        ({"max_iterations": 0}, "max_iterations must be a finite number >= 1"),
        ({"max_iterations": 2.5}, "max_iterations must be an integer"),
        ({"num_memories": 0}, "num_memories"),
        ({"algorithm": "sgd"}, "unknown algorithm 'sgd'"),
        ({"linesearch": "Backtracking"}, "not available"),
        ({"linesearch": "nope"}, "unknown linesearch"),
        ({"trainer_cls": object}, "trainer_cls"),
        ({"algorithm": "pa", "pa_type": 3}, "pa_type must be 0, 1 or 2"),
        ({"algorithm": "ap", "c1": 0.1}, "c1=0.1 does not apply to algorithm='ap'"),
        ({"algorithm": "lbfgs", "variance": 2.0}, "variance=2.0 does not apply"),
        ({"algorithm": "l2sgd", "c2": 0.0}, "needs c2 > 0"),
        ({"calibration_rate": 1.0, "algorithm": "l2sgd"}, "calibration_rate must be a finite number > 1"),
        ({"all_possible_states": "yes"}, "all_possible_states must be True or False"),
        ({"min_freq": -1}, "min_freq"),
    ],
)
def test_bad_hyperparameters_fail_before_any_work(params, message):
    with pytest.raises(ValueError, match=message):
        CRF(**params).fit(None, None)  # would fail on the data if validation came later


def test_feature_sets_follow_crfsuite_options():
    X, y = corpus(6)
    L = 4
    plain = CRF(max_iterations=30, boundary_transitions=False).fit(X, y)
    assert not np.any(plain.start_weights_) and not np.any(plain.end_weights_)
    codes = {label: i for i, label in enumerate(plain.classes_)}
    seen = np.zeros((L, L), dtype=bool)
    for labels in y:
        for a, b in zip(labels, labels[1:]):
            seen[codes[a], codes[b]] = True
    assert not np.any(plain.transitions_[~seen]) and np.all(plain.transitions_[seen] != 0)
    dense = CRF(max_iterations=30, all_possible_transitions=True).fit(X, y)
    assert np.all(dense.transitions_ != 0) and np.all(dense.start_weights_ != 0)
    rare = CRF(max_iterations=30, min_freq=3).fit(X, y)
    assert 0 < rare.feature_index_.size < plain.feature_index_.size


def test_the_tagger_view_takes_an_empty_sequence():
    model = CRF(max_iterations=5).fit([[{"a": 1}, {"b": 1}], [{"b": 1}]], [["A", "B"], ["B"]])
    tagger = model.tagger_
    assert tagger.tag([]) == [] and tagger.probability([]) == 1.0
    assert tagger.tag([{"a": 1}]) == model.predict_single([{"a": 1}])


def test_parameter_applies_agrees_with_what_fit_refuses():
    """What ``parameter_applies`` says of a parameter is what ``fit`` does with a non-default value."""
    from crf import parameter_applies
    from crf.model import _DEFAULTS

    X, y = [[{"a": 1.0}], [{"b": 1.0}]], [["A"], ["B"]]
    changed = {"c1": 0.1, "c2": 0.5, "num_memories": 3, "learning_rate": 0.1, "pa_type": 2, "variance": 2.0}
    for algorithm in ("lbfgs", "l2sgd", "ap", "pa", "arow"):
        for name, value in changed.items():
            assert value != _DEFAULTS[name]
            model = CRF(algorithm=algorithm, max_iterations=2, **{name: value})
            if parameter_applies(name, algorithm):
                model.fit(X, y)
            else:
                with pytest.raises(ValueError, match=f"{name}=.* does not apply to algorithm='{algorithm}'"):
                    model.fit(X, y)


def test_none_means_the_default_for_every_parameter_as_in_sklearn_crfsuite():
    """sklearn-crfsuite's signature defaults every parameter to None ("not set"): ``c2=None`` was
    refused as "must be a number", and switching a fitted model to ``ap`` asked to unset c2 with no
    way to do it but the default's value (K4)."""
    import inspect

    import sklearn_crfsuite

    X, y = [[{"w": "a"}, {"w": "b"}], [{"w": "c"}, {"w": "b"}]] * 3, [["A", "B"]] * 6
    from crf._params import SKLEARN_CRFSUITE_PARAMETERS

    theirs = list(inspect.signature(sklearn_crfsuite.CRF).parameters)
    assert sorted(SKLEARN_CRFSUITE_PARAMETERS) == sorted(theirs)
    shared = [name for name in theirs if name in inspect.signature(CRF).parameters]
    everything_none = CRF(**dict.fromkeys(shared)).fit(X, y)
    defaults = CRF().fit(X, y)
    np.testing.assert_array_equal(everything_none.state_weights_, defaults.state_weights_)
    assert everything_none.get_params()["c2"] is None  # kept as given, as scikit-learn's clone needs
    model = CRF(c2=0.5, max_iterations=5).fit(X, y)
    with pytest.raises(ValueError, match=r"^c2=0.5 does not apply to algorithm='ap' \(only lbfgs, l2sgd\): set c2=None"):
        model.set_params(algorithm="ap").fit(X, y)
    assert model.set_params(algorithm="ap", c2=None).fit(X, y).predict(X[:1]).tolist() == [["A", "B"]]
    # this project's own parameters keep their None: random_state=None shuffles afresh on every fit
    data = [[{"w": w, "n": w[0]} for w in s.split()] for s in ("a b c d", "b c a", "c a b d", "d a c")] * 5
    labels = [[w.upper() for w in s.split()] for s in ("a b c d", "b c a", "c a b d", "d a c")] * 5
    fits = [CRF(algorithm="ap", random_state=None, max_iterations=2).fit(data, labels).state_weights_ for _ in range(4)]
    assert any(not np.array_equal(fits[0], other) for other in fits[1:])
    with pytest.raises(ValueError, match="dev_every"):
        CRF(dev_every=None).fit(X, y)


def test_size_is_the_saved_files_size_and_follows_a_refit(tmp_path):
    """``size_`` is measured once per fit (it writes the file): a refit on other data measures again."""
    X, y = corpus(1, 20)
    model = CRF(max_iterations=5).fit(X, y)
    model.save(tmp_path / "small.npz")
    assert model.size_ == (tmp_path / "small.npz").stat().st_size == model.size_
    X, y = corpus(2, 60)
    model.fit(X + [[{f"new{i}": 1.0 for i in range(40)}]], y + [[y[0][0]]])
    model.save(tmp_path / "large.npz")
    assert model.size_ == (tmp_path / "large.npz").stat().st_size > (tmp_path / "small.npz").stat().st_size

"""crf.pycrfsuite: python-crfsuite's Trainer, Tagger and ItemSequence over crf.CRF.

On small generated data: the item rules, the parameters, training with every algorithm, the
training log and its parser, holdout evaluation, the tagger's queries, its errors and damaged
model files. Where python-crfsuite is installed, against it: the same items, parameters, log
figures, dumps and info; the same tags, probabilities and marginals from the same model file,
and models trained by each tagged the same by the other. (Its own test suite runs against this
module in test_upstream_suites.py.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import word_class_corpus

import crf.pycrfsuite as ours
from crf import CRF

ALGORITHMS = ["lbfgs", "l2sgd", "ap", "pa", "arow"]


def mixed_corpus(seed: int, n: int):
    """Sentences whose items take every shape python-crfsuite accepts: lists of names, dicts of
    strings and numbers, bytes values, nested dicts, lists and sets."""
    X, y = word_class_corpus(seed, n, n_words=10, lengths=(2, 8), inside_below=7, a_below=9)
    shaped = []
    for sentence in X:
        items = []
        for t, token in enumerate(sentence):
            k = int(token["w"][1:])
            if t % 3 == 0:
                items.append([f"w={token['w']}", f"prev={token['prev']}"])
            elif t % 3 == 1:
                items.append(
                    {"w": token["w"], "prev": token["prev"].encode(), "size": k / 10, **({"small": True} if k < 4 else {})}
                )
            else:
                items.append({"w": token["w"], "ctx": {"prev": token["prev"], "tags": [f"odd{k % 2}"], "set": {"s"}}})
        shaped.append(items)
    return shaped, y


@pytest.fixture(scope="module")
def corpus():
    X, y = mixed_corpus(0, 80)
    return X[:60], y[:60], X[60:], y[60:]


def train(module, X, y, path, algorithm="lbfgs", params=None, groups=None, holdout=-1, cls=None):
    """A trainer of ``module`` (ours or python-crfsuite) fed and trained; returns it."""
    trainer = (cls or module.Trainer)(algorithm, params=params or {}, verbose=False)
    for i, (x, labels) in enumerate(zip(X, y)):
        trainer.append(x, labels, 0 if groups is None else groups[i])
    trainer.train(str(path), holdout=holdout)
    return trainer


@pytest.fixture(scope="module")
def our_model(corpus, tmp_path_factory):
    X, y, _, _ = corpus
    path = tmp_path_factory.mktemp("ours") / "model.crfsuite"
    train(ours, X, y, path, params={"c2": 0.1, "max_iterations": 60})
    return path


# --- items ------------------------------------------------------------------------------

ITEM_CASES = [
    ([["a", "b"], []], [{"a": 1.0, "b": 1.0}, {}]),
    ([{"a": 2, "b": 0.5, "c": True, "d": False}], [{"a": 2.0, "b": 0.5, "c": 1.0, "d": 0.0}]),
    ([{"w": "x", "u": "ключ"}, {"k": b"bytes"}], [{"w:x": 1.0, "u:ключ": 1.0}, {"k:bytes": 1.0}]),
    (
        [{"n": {"a": "b", "c": -1, "d": ["x", "y"], "e": {"p": 0.25}}}],
        [{"n:a:b": 1.0, "n:c": -1.0, "n:d:x": 1.0, "n:d:y": 1.0, "n:e:p": 0.25}],
    ),
    ([{"s": {"x"}}, ("t", "u"), {"a": "x"}.keys()], [{"s:x": 1.0}, {"t": 1.0, "u": 1.0}, {"a": 1.0}]),
    ([[b"raw", "name"], {b"key": 1}], [{"raw": 1.0, "name": 1.0}, {"key": 1.0}]),
    ([{"i": np.float32(0.5), "j": np.int64(3)}], [{"i": 0.5, "j": 3.0}]),
]  # fmt: skip


@pytest.mark.parametrize(("xseq", "expected"), ITEM_CASES)
def test_item_sequence_reads_items_as_python_crfsuite(xseq, expected):
    sequence = ours.ItemSequence(xseq)
    assert len(sequence) == len(expected) and repr(sequence) == f"<ItemSequence of size {len(expected)}>"
    assert sequence.items() == expected
    assert ours.ItemSequence(sequence).items() == expected == ours.ItemSequence(sequence.items()).items()
    pycrfsuite = pytest.importorskip("pycrfsuite")
    if not any(isinstance(item, tuple) for item in xseq):  # python-crfsuite's items() fails on tuples
        assert pycrfsuite.ItemSequence(xseq).items() == expected


def test_items_are_copied_and_bad_items_are_refused():
    item = ["a"]
    sequence = ours.ItemSequence([item, {"b": 1.0}])
    item.append("changed")
    assert sequence.items() == [{"a": 1.0}, {"b": 1.0}]
    with pytest.raises(TypeError, match="item 1 is the string"):
        ours.ItemSequence([["a"], "abc"])
    with pytest.raises(TypeError, match="item 0"):
        ours.ItemSequence([{"a": None}])
    with pytest.raises(TypeError, match="item 0"):
        ours.ItemSequence([[1, 2]])
    with pytest.raises(ValueError, match="item 1: attribute 'x' has the non-finite value nan"):
        ours.ItemSequence([{"x": 1.0}, {"x": math.nan}])
    with pytest.raises(TypeError, match="not a str"):
        ours.ItemSequence("abc")
    with pytest.raises(TypeError):
        ours.ItemSequence(5)


# --- parameters ---------------------------------------------------------------------------

LBFGS_PARAMETERS = {
    "feature.minfreq": 0.0, "feature.possible_states": False, "feature.possible_transitions": False, "c1": 0.0, "c2": 1.0,
    "max_iterations": 2147483647, "num_memories": 6, "epsilon": 1e-05, "period": 10, "delta": 1e-05,
    "linesearch": "MoreThuente", "max_linesearch": 20,
}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["lbfgs", "l2sgd", "ap", "averaged-perceptron", "pa", "passive-aggressive", "arow"])
def test_parameters_are_crfsuites(algorithm):
    trainer = ours.Trainer(algorithm)
    params = trainer.get_params()
    assert list(params) == trainer.params()
    assert all(trainer.help(name) for name in params)
    if algorithm == "lbfgs":
        assert params == LBFGS_PARAMETERS
    pycrfsuite = pytest.importorskip("pycrfsuite")
    theirs = pycrfsuite.Trainer(algorithm).get_params()
    assert list(params) == list(theirs)
    assert params == theirs and [type(v) for v in params.values()] == [type(v) for v in theirs.values()]


def test_select_resets_parameters_and_set_reads_crfsuite_values():
    trainer = ours.Trainer("lbfgs", params={"c2": 0.5, "c1": "0.25"})
    assert (trainer.get("c2"), trainer.get("c1")) == (0.5, 0.25)
    trainer.select("LBFGS")
    assert trainer.get("c2") == 1.0  # a new selection starts from the defaults, as in CRFsuite
    trainer.set("max_iterations", "12")
    trainer.set("feature.possible_states", 1)
    trainer.set("feature.possible_transitions", True)
    trainer.set("linesearch", "Backtracking")
    assert trainer.get_params()["max_iterations"] == 12 and trainer.get("feature.possible_states") is True
    trainer.select("l2sgd")
    trainer.set("calibration.samples", 500.0)
    assert trainer.get("calibration.samples") == 500.0 and "c1" not in trainer.params()
    assert "L1" in ours.Trainer("lbfgs").help("c1") and "L2" in trainer.help("c2")
    trainer.select("pa")
    trainer.set_params({"type": 2, "c": 0.5, "averaging": False})
    assert trainer.get_params()["type"] == 2 and trainer.get("averaging") is False


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("foo", 1, "parameter not found: 'foo'"),
        ("c2", -1, "c2 must be >= 0"),
        ("c2", "abc", "not a number"),
        ("c2", math.inf, "must be finite"),
        ("max_iterations", 1.5, "must be an integer"),
        ("max_iterations", 0, "must be >= 1"),
        ("feature.possible_states", 2, "must be 0 or 1"),
        ("linesearch", "Fast", "must be one of MoreThuente"),
        ("num_memories", None, "not a number"),
    ],
)
def test_bad_parameters_raise_value_error(name, value, message):
    trainer = ours.Trainer()
    with pytest.raises(ValueError, match=message):
        trainer.set(name, value)
    with pytest.raises(ValueError, match=message):
        trainer.set_params({"c2": 0.5, name: value})
    assert trainer.get("c2") == 1.0  # set_params checks every value before setting any


def test_unknown_algorithms_parameters_and_help_raise_value_error():
    trainer = ours.Trainer()
    with pytest.raises(ValueError, match="bad arguments: algorithm='foo'"):
        trainer.select("foo")
    with pytest.raises(ValueError, match="type='crf2d'"):
        trainer.select("lbfgs", type="crf2d")
    assert trainer.params() == list(LBFGS_PARAMETERS)  # a failed select keeps the algorithm
    trainer.select("l2sgd")
    for call in (lambda: trainer.help("c1"), lambda: trainer.get("c1"), lambda: trainer.set("c1", 1)):
        with pytest.raises(ValueError, match="parameter not found: 'c1'"):
            call()


# --- training -------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_a_model_that_tags_its_data(corpus, algorithm, tmp_path):
    X, y, X_test, y_test = corpus
    params = {"lbfgs": {"c2": 0.1}, "l2sgd": {"max_iterations": 10, "calibration.max_trials": 6}}.get(
        algorithm, {"max_iterations": 30}
    )
    train(ours, X, y, tmp_path / "model.crfsuite", algorithm, params)
    with ours.Tagger().open(str(tmp_path / "model.crfsuite")) as tagger:
        predicted = [tagger.tag(x) for x in X_test]
        assert set(tagger.labels()) == {label for labels in y for label in labels}
    correct = sum(p == g for P, G in zip(predicted, y_test) for p, g in zip(P, G))
    assert correct / sum(map(len, y_test)) > 0.9


def test_the_trainer_is_crf_fit_and_the_tagger_scores_as_crf(corpus, our_model):
    """The same model as crf.CRF(boundary_transitions=False) with the same parameters: the same
    tags, and the tagger's probabilities and marginals are the estimator's."""
    X, y, X_test, _ = corpus
    items = [ours.ItemSequence(x)._items for x in X]  # the estimator reads these as python-crfsuite does
    estimator = CRF(c2=0.1, max_iterations=60, boundary_transitions=False).fit(items, y)
    test_items = [ours.ItemSequence(x)._items for x in X_test]
    marginals = estimator.predict_marginals(test_items)
    with ours.Tagger().open(str(our_model)) as tagger:
        for x, expected, expected_marginals in zip(test_items, estimator.predict(test_items), marginals):
            assert tagger.tag(x) == list(expected)
            assert tagger.probability(list(expected)) == pytest.approx(
                estimator.sequence_probability([x], [expected])[0], rel=1e-9
            )
            for t, per_label in enumerate(expected_marginals):
                for label, p in per_label.items():
                    assert tagger.marginal(label, t) == pytest.approx(p, abs=1e-9)


def test_training_log_has_crfsuites_events_and_figures(corpus, tmp_path):
    X, y, _, _ = corpus
    trainer = train(ours, X, y, tmp_path / "m.crfsuite", params={"max_iterations": 5})
    parser = trainer.logparser
    events = [event for event, _, _ in parser.events if event != "featgen_progress"]
    assert events == ["start", "featgen_end", "prepared"] + ["iteration"] * 5 + ["optimization_end", "end"]
    assert parser.featgen_percent == 100 and parser.featgen_num_features > 0
    assert [i["num"] for i in parser.iterations] == [1, 2, 3, 4, 5] and parser.last_iteration is parser.iterations[-1]
    for fields in parser.iterations:
        assert {"loss", "feature_norm", "error_norm", "active_features", "linesearch_trials", "time"} <= set(fields)
    assert parser.iterations[-1]["loss"] < parser.iterations[0]["loss"]
    assert parser.training_seconds is not None and parser.storing_seconds is not None
    assert "L-BFGS terminated with the maximum number of iterations\n" in parser.log


def test_log_figures_match_python_crfsuite(corpus, tmp_path):
    """The same model trained the same way: the same number of features and, iteration by
    iteration, the same loss, norms, active features and line-search trials; with a holdout
    group, the same evaluation."""
    pycrfsuite = pytest.importorskip("pycrfsuite")
    X, y, X_test, y_test = corpus
    groups = [0] * len(X) + [1] * len(X_test)
    logs = []
    for module in (ours, pycrfsuite):
        trainer = train(
            module, X + X_test, y + y_test, tmp_path / "m.crfsuite", params={"max_iterations": 8}, groups=groups, holdout=1
        )
        logs.append(trainer.logparser)
    mine, theirs = logs
    assert mine.featgen_num_features == theirs.featgen_num_features
    assert [e for e, _, _ in mine.events] == [e for e, _, _ in theirs.events]
    assert len(mine.iterations) == len(theirs.iterations) == 8
    for a, b in zip(mine.iterations, theirs.iterations):
        for key in ("loss", "feature_norm", "error_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=2e-6), key
        for key in ("num", "active_features", "linesearch_trials"):
            assert a[key] == b[key], key
        if a["num"] > 1:  # after the first step, whose weights leave many labels (nearly) tied
            for key in ("item_accuracy", "instance_accuracy", "scores", "avg_f1"):
                assert a[key] == b[key], key


def _features_of_both(X, y, folder, settings: dict | None = None) -> list[tuple[dict, dict]]:
    """(state features (attribute, label) -> weight, transitions (label, label) -> weight) of the
    models ours and python-crfsuite train on ``X``, ``y`` with the same settings."""
    pycrfsuite = pytest.importorskip("pycrfsuite")
    features = []
    for module in (ours, pycrfsuite):
        path = folder / f"{module.__name__}.crfsuite"
        train(module, X, y, path, params={"c2": 1.0, "max_iterations": 100, "epsilon": 1e-8, **(settings or {})})
        tagger = module.Tagger()
        tagger.open(str(path))
        info = tagger.info()
        features.append((info.state_features, info.transitions))
    return features


def _state_features_of_both(X, y, folder) -> list[dict]:
    """The state features of :func:`_features_of_both` with CRFsuite's default settings."""
    return [states for states, _ in _features_of_both(X, y, folder)]


def test_an_attribute_of_value_0_makes_a_feature_as_in_python_crfsuite(tmp_path):
    """``a`` is 0 on every ``Y`` token and 1 on every ``X`` one: CRFsuite makes the pair (a, Y) a
    feature and trains it below 0; it was no feature here, so the models differed (round 28)."""
    X = [[{"a": 1.0, "b": 1.0}, {"a": 0.0, "c": 1.0}], [{"a": False, "c": 1.0}, {"a": True, "b": 1.0}]]
    mine, theirs = _state_features_of_both(X, [["X", "Y"], ["Y", "X"]], tmp_path)
    assert set(mine) == set(theirs) == {("a", "X"), ("a", "Y"), ("b", "X"), ("c", "Y")}
    assert mine[("a", "Y")] < 0
    for pair, weight in theirs.items():
        assert mine[pair] == pytest.approx(weight, abs=1e-5), pair


def test_a_pair_whose_values_sum_below_0_is_no_feature_as_in_python_crfsuite(tmp_path):
    """CRFsuite keeps an attribute/label pair whose values sum to at least ``minfreq`` (0): a pair
    summing below 0 is no feature. Here every pair seen was one, and the models differed (round 29)."""
    X = [[{"n": 1.0, "b": 1.0}, {"n": -0.5, "c": 1.0}], [{"n": -1.0, "c": 1.0}, {"n": 2.0, "b": 1.0}]]
    mine, theirs = _state_features_of_both(X, [["X", "Y"], ["Y", "X"]], tmp_path)
    assert ("n", "Y") not in theirs and set(mine) == set(theirs)
    for pair, weight in theirs.items():
        assert mine[pair] == pytest.approx(weight, abs=1e-5), pair


@pytest.mark.parametrize(
    "settings",
    [
        {"feature.possible_states": True},  # a pair seen summing below 0 is no feature, the unseen ones are (round 30)
        {"feature.possible_states": True, "feature.minfreq": 0.7},  # the pairs it adds have frequency 0: none stays
        {"feature.possible_transitions": True, "feature.minfreq": 1.0},  # likewise the label pairs
        {"feature.possible_states": True, "feature.possible_transitions": True, "feature.minfreq": 2.0},
        {"feature.minfreq": 2.0},  # a label pair seen once is no transition feature
    ],
)
def test_all_possible_features_and_min_freq_choose_the_features_python_crfsuite_chooses(settings, tmp_path):
    """CRFsuite adds the pairs of ``possible_states`` and ``possible_transitions`` with frequency
    0, then keeps a pair whose frequency reaches ``minfreq``: the same state features and
    transitions, and the same weights, here (round 30: both kinds were kept whatever their sums)."""
    X = [
        [{"a": -1.0, "b": 1.0}, {"a": 1.0, "c": 0.5}, {"b": 1.0, "c": 1.0}],
        [{"b": 1.0}, {"a": -0.5, "c": 1.0}, {"a": 2.0}],
        [{"a": 1.0, "b": 1.0}, {"c": -1.0}, {"b": 1.0}],
    ]
    y = [["X", "Y", "Z"], ["X", "Y", "Y"], ["Z", "Y", "X"]]
    (my_states, my_transitions), (states, transitions) = _features_of_both(X, y, tmp_path, settings)
    assert set(my_states) == set(states) and set(my_transitions) == set(transitions)
    for mine, theirs in ((my_states, states), (my_transitions, transitions)):
        for pair, weight in theirs.items():
            assert mine[pair] == pytest.approx(weight, abs=1e-5), pair


def test_holdout_group_is_evaluated_not_trained(corpus, tmp_path):
    X, y, X_test, y_test = corpus
    groups = [0] * len(X) + [3] * len(X_test)
    trainer = train(
        ours,
        X + X_test,
        y + y_test,
        tmp_path / "held.crfsuite",
        params={"c2": 0.1, "max_iterations": 60},
        groups=groups,
        holdout=3,
    )
    alone = train(ours, X, y, tmp_path / "alone.crfsuite", params={"c2": 0.1, "max_iterations": 60})
    assert (tmp_path / "held.crfsuite").read_bytes() == (tmp_path / "alone.crfsuite").read_bytes()
    assert trainer.logparser.log[0] == "Holdout group: 4\n"  # CRFsuite counts groups from 1 there
    last = trainer.logparser.last_iteration
    assert last["item_accuracy"].denominator and last["item_accuracy"] == last["item_accuracy_float"]
    assert last["instance_accuracy"].denominator <= len(X_test) and set(last["scores"]) >= {"O", "B-A"}
    assert 0 <= last["avg_f1"] <= 1 and "item_accuracy" not in alone.logparser.last_iteration


def test_verbose_trainer_prints_the_log_and_calls_the_event_methods(corpus, tmp_path, capsys):
    X, y, _, _ = corpus

    class Recording(ours.Trainer):
        def on_iteration(self, log, info):
            self.seen.append(info["num"])
            super().on_iteration(log, info)

    trainer = Recording("ap", params={"max_iterations": 3})
    trainer.seen = []
    for x, labels in zip(X, y):
        trainer.append(x, labels)
    trainer.train(str(tmp_path / "m.crfsuite"))
    printed = capsys.readouterr().out
    assert trainer.seen == [1, 2, 3]
    assert printed == "".join(trainer.logparser.log)
    assert printed.startswith("Feature generation\ntype: CRF1d\n") and "Averaged perceptron\nmax_iterations: 3\n" in printed
    base = ours.BaseTrainer(verbose=True)
    base.append(X[0], y[0])
    base.train("")
    assert capsys.readouterr().out.startswith("Feature generation\n")


def test_message_receives_lines_and_its_exception_stops_training(corpus, tmp_path):
    X, y, _, _ = corpus

    class Capturing(ours.Trainer):
        def __init__(self):  # no call to Trainer.__init__, as python-crfsuite allows
            self.messages = []

        def message(self, message):
            self.messages.append(message)
            if message.startswith("***** Iteration #2"):
                raise KeyError("stop")

    trainer = Capturing()
    trainer.append(X[0], y[0])
    with pytest.raises(KeyError, match="stop"):
        trainer.train(str(tmp_path / "m.crfsuite"))
    assert "type: CRF1d\n" in trainer.messages and not (tmp_path / "m.crfsuite").exists()
    assert all(m.endswith("\n") or m in "0123456789." or m == "10" for m in trainer.messages)


def test_appending_checks_the_instance(corpus):
    X, y, _, _ = corpus
    trainer = ours.Trainer(verbose=False)
    with pytest.raises(ValueError, match="numbers of items and labels differ: 2 items, 1 labels"):
        trainer.append([["a"], ["b"]], ["x"])
    with pytest.raises(ValueError, match="empty item sequence"):
        trainer.append([], [])
    with pytest.raises(TypeError, match="group must be an integer"):
        trainer.append(X[0], y[0], group="a")
    with pytest.raises(TypeError, match="labels must be strings"):
        trainer.append([["a"]], [1])
    with pytest.raises(TypeError, match="yseq must be a list of label strings"):
        trainer.append([["a"]], "x")
    trainer.append([["a"]], [b"x"])
    trainer.clear()
    trainer.append(X[0], y[0])
    assert len(trainer._xseqs) == 1


def test_training_checks_parameters_and_the_folder_before_any_work(corpus, tmp_path):
    X, y, _, _ = corpus
    messages = []

    class Quiet(ours.Trainer):
        def message(self, message):
            messages.append(message)

    trainer = Quiet("lbfgs")
    trainer.append(X[0], y[0])
    with pytest.raises(FileNotFoundError, match="no folder"):
        trainer.train(str(tmp_path / "missing" / "m.crfsuite"))
    trainer.set("linesearch", "Backtracking")  # CRFsuite's, not available here with c1 = 0
    with pytest.raises(ValueError, match="linesearch"):
        trainer.train(str(tmp_path / "m.crfsuite"))
    with pytest.raises(TypeError, match="holdout"):
        trainer.train(str(tmp_path / "m.crfsuite"), holdout="1")
    assert messages == []


def test_no_training_instances_give_an_empty_model(tmp_path):
    trainer = ours.Trainer(verbose=False)
    trainer.train(str(tmp_path / "empty.crfsuite"))
    assert [e for e, _, _ in trainer.logparser.events if e != "featgen_progress"] == [
        "start", "featgen_end", "prepare_error", "optimization_end", "end",
    ]  # fmt: skip
    with ours.Tagger().open(str(tmp_path / "empty.crfsuite")) as tagger:
        assert tagger.labels() == [] and tagger.tag([]) == []
        with pytest.raises(ValueError, match="no labels"):
            tagger.tag([["a"]])
    ap = ours.Trainer("ap", verbose=False)
    ap.append([["a"]], ["x"], group=1)
    ap.train("", holdout=1)  # every instance held out: nothing to train on, no file asked for
    assert "prepare_error" in [e for e, _, _ in ap.logparser.events]


# --- tagging ---------------------------------------------------------------------------------


def test_tagger_queries_and_their_errors(corpus, our_model):
    _, _, X_test, _ = corpus
    tagger = ours.Tagger()
    for call in (tagger.labels, lambda: tagger.set(X_test[0]), lambda: tagger.tag(X_test[0]), lambda: tagger.probability(["O"])):
        with pytest.raises(ValueError, match="not opened"):
            call()
    for call in (tagger.info, tagger.dump):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    with tagger.open(str(our_model)) as opened:
        assert opened is tagger and tagger.tag() == [] and tagger.probability(["O"]) == 0.0 and tagger.marginal("O", 3) == 0.0
        labels = tagger.tag(X_test[0])
        assert tagger.tag() == labels == tagger.tag(ours.ItemSequence(X_test[0]))
        total = sum(tagger.marginal(label, 0) for label in tagger.labels())
        assert total == pytest.approx(1.0) and 0 < tagger.probability(labels) <= 1
        with pytest.raises(RuntimeError, match="unknown label 'Z'"):
            tagger.probability(["Z"] * len(labels))
        with pytest.raises(RuntimeError, match="unknown label 'Z'"):
            tagger.marginal("Z", 0)
        with pytest.raises(ValueError, match="numbers of items and labels differ"):
            tagger.probability(labels + ["O"])
        with pytest.raises(ValueError, match="out of range"):
            tagger.marginal("O", len(labels))
        assert tagger.tag([["nothing", "known"], {}]) in [[a, b] for a in tagger.labels() for b in tagger.labels()]
    with pytest.raises(ValueError, match="not opened"):
        tagger.labels()


def test_open_checks_the_file(tmp_path, our_model):
    tagger = ours.Tagger()
    with pytest.raises(FileNotFoundError):
        tagger.open(str(tmp_path / "missing.crfsuite"))
    (tmp_path / "text.txt").write_text("not a model at all, but long enough to hold a header " * 3)
    (tmp_path / "short").write_bytes(b"lCRFshort")
    for name in ("text.txt", "short"):
        with pytest.raises(ValueError, match="header|not a CRFsuite model"):
            tagger.open(str(tmp_path / name))
    for data in (b"", b"lCRF", b"lCRF" + b"\0" * 60):
        with pytest.raises(ValueError):
            tagger.open_inmemory(data)
    with pytest.raises(TypeError):
        tagger.open_inmemory(str(our_model))
    with ours.Tagger().open_inmemory(our_model.read_bytes()) as tagger:
        assert tagger.labels()


def test_damaged_models_raise_value_error(our_model):
    data = our_model.read_bytes()
    rng = np.random.default_rng(0)
    tagger = ours.Tagger()
    for cut in [49, 100, len(data) // 2, len(data) - 1]:
        with pytest.raises(ValueError):
            tagger.open_inmemory(data[:cut])
    for _ in range(150):
        damaged = bytearray(data)
        for position in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
            damaged[position] = int(rng.integers(0, 256))
        try:
            tagger.open_inmemory(bytes(damaged))
        except ValueError:
            continue
        tagger.tag([["w=w1"], {"w": "w2"}])  # a file that still reads is a model that tags


# --- against python-crfsuite --------------------------------------------------------------


@pytest.fixture(scope="module")
def their_model(corpus, tmp_path_factory):
    pycrfsuite = pytest.importorskip("pycrfsuite")
    X, y, _, _ = corpus
    path = tmp_path_factory.mktemp("theirs") / "model.crfsuite"
    train(pycrfsuite, X, y, path, params={"c2": 0.1, "max_iterations": 60})
    return path


@pytest.mark.parametrize("model", ["our_model", "their_model"])
def test_same_tags_probabilities_and_marginals_as_python_crfsuite(corpus, model, request):
    pycrfsuite = pytest.importorskip("pycrfsuite")
    _, _, X_test, _ = corpus
    path = str(request.getfixturevalue(model))
    mine, theirs = ours.Tagger(), pycrfsuite.Tagger()
    mine.open(path)
    theirs.open(path)
    assert mine.labels() == theirs.labels()
    repeated_and_unknown = [
        ["w=w1", "w=w1", "unknown"],
        {"w": "w2", "size": 2.5, "prev": b"w1"},
        {"size": -1, "ctx": {"set": ["s"]}},
    ]
    for x in [*X_test, repeated_and_unknown]:
        labels = theirs.tag(x)
        assert mine.tag(ours.ItemSequence(x)) == labels
        assert mine.probability(labels) == pytest.approx(theirs.probability(labels), rel=1e-9)
        other = [mine.labels()[0]] * len(x)
        assert mine.probability(other) == pytest.approx(theirs.probability(other), rel=1e-9, abs=1e-300)
        for t in range(len(x)):
            for label in mine.labels():
                assert mine.marginal(label, t) == pytest.approx(theirs.marginal(label, t), abs=1e-9)


def test_models_trained_by_each_tag_the_same(corpus, our_model, their_model):
    pycrfsuite = pytest.importorskip("pycrfsuite")
    _, _, X_test, _ = corpus
    with ours.Tagger().open(str(our_model)) as mine, ours.Tagger().open(str(their_model)) as theirs:
        assert [mine.tag(x) for x in X_test] == [theirs.tag(x) for x in X_test]
    tagger = pycrfsuite.Tagger()
    tagger.open(str(our_model))
    with ours.Tagger().open(str(our_model)) as mine:
        assert [tagger.tag(x) for x in X_test] == [mine.tag(x) for x in X_test]


@pytest.mark.parametrize("model", ["our_model", "their_model"])
def test_info_and_dump_are_python_crfsuites(model, request, tmp_path):
    pycrfsuite = pytest.importorskip("pycrfsuite")
    path = str(request.getfixturevalue(model))
    mine, theirs = ours.Tagger(), pycrfsuite.Tagger()
    mine.open(path)
    theirs.open(path)
    for name in ("header", "labels", "attributes", "transitions", "state_features"):
        assert getattr(mine.info(), name) == getattr(theirs.info(), name), name
    mine.dump(str(tmp_path / "ours.txt"))
    theirs.dump(str(tmp_path / "theirs.txt"))
    assert (tmp_path / "ours.txt").read_bytes() == (tmp_path / "theirs.txt").read_bytes()


def errors(module, tmp_path, model) -> list:
    """(call, the exception python-crfsuite raises) for calls of ``module``'s classes."""
    tagger = module.Tagger()
    tagger.open(str(model))
    tagger.set([["w=w1"], ["w=w2"]])
    return [
        (lambda: module.Trainer().select("foo"), ValueError),
        (lambda: module.Trainer().set("foo", 1), ValueError),
        (lambda: module.Trainer().help("foo"), ValueError),
        (lambda: module.Trainer().append([["a"]], ["x", "y"]), ValueError),
        (lambda: module.Trainer().append([{"a": None}], ["x"]), TypeError),
        (lambda: module.Tagger().labels(), ValueError),
        (lambda: module.Tagger().info(), RuntimeError),
        (lambda: module.Tagger().open(str(tmp_path / "missing")), OSError),
        (lambda: module.Tagger().open_inmemory(b"lCRF"), ValueError),
        (lambda: tagger.probability(["Z", "Z"]), RuntimeError),
        (lambda: tagger.probability(["O"]), ValueError),
        (lambda: tagger.marginal("Z", 0), RuntimeError),
        (lambda: tagger.marginal("O", 2), ValueError),
    ]


@pytest.mark.parametrize("module", ["ours", "pycrfsuite"])
def test_the_same_errors_as_python_crfsuite(module, tmp_path, our_model):
    for call, error in errors(ours if module == "ours" else pytest.importorskip("pycrfsuite"), tmp_path, our_model):
        with pytest.raises(error):
            call()

"""Fault injection on inputs: bad data files of each kind read through the dataset loader, random
bytes as a model file, non-finite feature values and empty input given to the estimators. Each
must fail with a message that names the file (and line) or the sequence, token and attribute."""

from __future__ import annotations

import gzip
import os
import re
import warnings

import numpy as np
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, make_sentence, write_corpus  # noqa: E402

from crf import CRF, HMM  # noqa: E402
from crf._persist import ModelFileError  # noqa: E402
from crf.io import DataFormatError  # noqa: E402
from pipeline.stages.data import load_dataset  # noqa: E402


@pytest.fixture
def corpus(tmp_path):
    """(data root, the dataset config as a dict with no checksums, the training file)."""
    root = write_corpus(tmp_path / "data", n_train=300, n_test=20)
    dataset = OmegaConf.to_container(compose_config([]).dataset, resolve=True)
    for spec in dataset["files"].values():
        spec["sha256"] = None
    return root, dataset, root / "conll2000" / "train.txt.gz"


def _rows(n: int, separator: str = " ", end: str = "", seed: int = 1) -> str:
    rng = np.random.default_rng(seed)
    return "".join("".join(separator.join(row) + end + "\n" for row in make_sentence(rng)) + "\n" for _ in range(n))


def test_bom_is_stripped_from_the_first_token(corpus):
    root, dataset, train = corpus
    clean = load_dataset(dataset, root, download=False)
    train.write_bytes(gzip.compress(b"\xef\xbb\xbf" + gzip.decompress(train.read_bytes())))
    with_bom = load_dataset(dataset, root, download=False)
    assert with_bom.splits == clean.splits and not with_bom.splits["train"][0][0][0].startswith("\ufeff")


def test_trailing_tab_is_not_a_column(corpus):
    root, dataset, train = corpus
    dataset["separator"] = "\t"
    train.write_bytes(gzip.compress(_rows(50, "\t", end="\t").encode()))
    (root / "conll2000" / "test.txt.gz").write_bytes(gzip.compress(_rows(5, "\t", seed=2).encode()))  # not training sentences
    data = load_dataset(dataset, root, download=False)
    assert {len(row) for s in data.splits["train"] for row in s} == {3}


def test_truncated_gzip_names_the_file_and_line(corpus):
    root, dataset, train = corpus
    data = gzip.compress(_rows(3000).encode())
    train.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match=rf"{train}:[0-9]+: cannot read file: truncated or corrupt gzip stream"):
        load_dataset(dataset, root, download=False)


def test_truncated_gzip_with_a_checksum_names_the_file(corpus):
    root, dataset, train = corpus
    data = gzip.compress(_rows(3000).encode())
    train.write_bytes(data[: len(data) // 2])
    dataset["files"]["train"]["sha256"] = "0" * 64
    with pytest.raises(DataFormatError, match=rf"{train}:[0-9]+: cannot read file: truncated"):
        load_dataset(dataset, root, download=False)


def test_a_directory_instead_of_a_file_says_so(corpus):
    root, dataset, train = corpus
    train.unlink()
    train.mkdir()
    with pytest.raises(IsADirectoryError, match=f"{train}: is a directory"):
        load_dataset(dataset, root, download=False)


def test_random_bytes_and_empty_data_files(corpus):
    root, dataset, train = corpus
    train.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(DataFormatError, match=rf"{train}:[0-9]+: not valid UTF-8"):
        load_dataset(dataset, root, download=False)
    train.write_bytes(gzip.compress(b""))
    with pytest.raises(DataFormatError, match=rf"{train}:1: file is empty"):
        load_dataset(dataset, root, download=False)
    train.write_bytes(b"\n\n\n")
    with pytest.raises(DataFormatError, match=rf"{train}:1: file holds no token lines"):
        load_dataset(dataset, root, download=False)


@pytest.mark.parametrize("model", [CRF, HMM])
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"PK\x03\x04" + bytes(200), id="zip-header"),
        pytest.param(b"", id="empty"),
        pytest.param(np.random.default_rng(0).bytes(4096), id="random"),
    ],
)
def test_a_file_that_is_not_a_model(tmp_path, model, content):
    path = tmp_path / "model.npz"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=str(path)) as caught:
        model.load(path)
    assert "pickle" not in str(caught.value)


def test_a_truncated_model_file(tmp_path):
    words = [["the", "dog"], ["a", "cat", "runs"]]
    tags = [["DT", "NN"], ["DT", "NN", "VB"]]
    path = tmp_path / "model.npz"
    HMM(order=1).fit(words, tags).save(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelFileError, match=str(path)):
        HMM.load(path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_feature_values_name_sequence_token_and_attribute(bad):
    X = [[{"w": 1.0}, {"w": 1.0, "len": 2.0}], [{"w": 1.0}, {"len": bad}, {"w": 0.5}]]
    y = [["A", "B"], ["A", "B", "A"]]
    with pytest.raises(ValueError, match=rf"sequence 1, token 1: attribute 'len' has the non-finite weight {bad}"):
        CRF(max_iterations=5).fit(X, y)


def test_empty_training_input():
    with pytest.raises(ValueError, match="at least one training sequence"):
        CRF().fit([], [])
    with pytest.raises(ValueError, match="non-empty"):
        HMM().fit([], [])


@pytest.mark.parametrize(
    "labels",
    [[[True, 1]], [[1, True]], [[0, False, 1]], [[1, np.True_]], [["B", 1.5]]],
)
def test_labels_that_compare_equal_across_types_are_refused_not_merged(labels):
    X = [[{"a": 1.0}] * len(labels[0])] * 5
    y = labels * 5
    with pytest.raises(TypeError, match="labels must be strings or integers") as caught:
        CRF(max_iterations=5).fit(X, y)
    if any(isinstance(v, (bool, np.bool_)) for v in labels[0]):
        assert "would merge" in str(caught.value)
    with pytest.raises(TypeError, match="labels must be strings or integers"):
        HMM().fit([["w"] * len(labels[0])] * 5, y)
    # strings and integers that only look alike would be one name in every file and output: refused
    with pytest.raises(TypeError, match="the labels '1' and 1 are different values with the same name"):
        CRF(max_iterations=5).fit([[{"a": 1.0}, {"b": 1.0}]] * 5, [["1", 1]] * 5)
    assert CRF(max_iterations=5).fit([[{"a": 1.0}, {"b": 1.0}]] * 5, [[2, 1]] * 5).classes_ == [2, 1]  # one type: fine


def test_a_value_too_large_to_train_on_is_reported_with_its_position_not_turned_into_a_zero_model():
    X = [[{"a": 1e30}, {"b": 1.0}], [{"b": 2.0}, {"a": 1.0}]] * 10
    y = [["A", "B"], ["B", "A"]] * 10
    for c1 in (0.0, 0.1):  # L-BFGS and OWL-QN
        model = CRF(max_iterations=50, c1=c1)
        with pytest.raises(ValueError, match=r"^sequence 0, token 0: attribute 'a' has the value 1e\+30, too large to train on"):
            model.fit(X, y)
        assert model.training_log_ is None  # nothing fitted: no model that looks trained
    # moderate values train as before, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = CRF(max_iterations=50).fit([[{"a": 1e3}, {"b": 1.0}], [{"b": 2.0}, {"a": 1.0}]] * 10, y)
    assert model.n_iter_ > 0 and model.score([[{"a": 1e3}, {"b": 1.0}]], [["A", "B"]]) == 1.0


def test_a_dict_is_refused_where_a_list_of_sequences_or_labels_is_needed():
    """A dict as a label sequence was read as its keys (labels 't0', 't1'), and a dict of
    sequences failed with a bare TypeError: refused in one line, as a set is, by CRF.fit (y and
    y_dev), predict and python-crfsuite's Trainer (H14); a label that is bytes but not UTF-8 is
    named with its sequence and item (H15)."""
    from crf import pycrfsuite

    X = [[{"w": "a"}, {"w": "b"}], [{"w": "b"}]]
    y = [["A", "B"], ["B"]]
    with pytest.raises(TypeError, match="^y: sequence 0 is a dict, not a list of labels"):
        CRF(max_iterations=5).fit(X, [{"t0": "A", "t1": "B"}, ["B"]])
    with pytest.raises(TypeError, match="^y_dev: sequence 0 is a dict, not a list of labels"):
        CRF(max_iterations=5).fit(X, y, X_dev=X[:1], y_dev=[{"a": "A", "b": "B"}])
    with pytest.raises(TypeError, match="^y must be a list of sequences, not a dict"):
        CRF(max_iterations=5).fit(X, dict(enumerate(y)))
    model = CRF(max_iterations=5).fit(X, y)
    with pytest.raises(TypeError, match="X must be a list of sequences.*, not a dict"):
        model.predict(dict(enumerate(X)))
    trainer = pycrfsuite.Trainer(verbose=False)
    with pytest.raises(TypeError, match="yseq must be a list of label strings, not a dict"):
        trainer.append(X[0], {"t0": "A", "t1": "B"})
    trainer.append(X[1], ["B"])
    with pytest.raises(ValueError, match=r"^sequence 1: yseq\[0\]: the label b'\\xff' is not valid UTF-8$"):
        trainer.append(X[0], [b"\xff", b"B"])


def test_a_set_is_refused_wherever_an_order_is_needed():
    """A set of sequences, of tokens or of labels has no order: its items would be matched to
    labels and results in hash order. A token's attributes may be a set (they are a bag)."""
    from crf import pycrfsuite

    X = [[{"w": "a"}, {"w": "b"}], [{"w": "b"}]]
    y = [["A", "B"], ["B"]]
    model = CRF(max_iterations=5).fit(X, y)
    with pytest.raises(TypeError, match="X must be a list of sequences.*, not a set"):
        model.predict({(("w=a",), ("w=b",))})
    with pytest.raises(TypeError, match="sequence 0 is a frozenset, not a list of tokens"):
        model.predict([frozenset({("w=a",), ("w=b",)})])
    with pytest.raises(TypeError, match="y: sequence 1 is a set, not a list of labels"):
        CRF(max_iterations=5).fit(X, [["A", "B"], {"B"}])
    assert model.predict([[{"w=a", "w=b"}]]) == model.predict([[["w=b", "w=a"]]])  # a token's attributes: a bag
    trainer = pycrfsuite.Trainer(verbose=False)
    with pytest.raises(TypeError, match="not a set"):
        trainer.append({("w=a",), ("w=b",)}, ["A", "B"])
    with pytest.raises(TypeError, match="yseq must be a list of label strings, not a set"):
        trainer.append([{"w": "a"}, {"w": "b"}], {"A", "B"})
    for scoring in (model.score, model.sequence_probability):  # labels in hash order would score at random
        with pytest.raises(TypeError, match="y: sequence 0 is a set"):
            scoring(X, [{"A", "B"}, ["B"]])
        with pytest.raises(TypeError, match="y must be a list of sequences, not a set"):  # the sequences in hash order
            scoring(X, {("A", "B"), ("B",)})
    with pytest.raises(TypeError, match="y must be a list of sequences, not a frozenset"):
        CRF(max_iterations=5).fit(X, frozenset({("A", "B"), ("B",)}))
    hmm = HMM().fit([["a", "b"], ["b"]], y)
    for bad in ({("a", "b")}, [{"a", "b"}]):
        with pytest.raises(TypeError, match="not sets"):
            hmm.predict(bad)
    with pytest.raises(TypeError, match="y must be a list of token sequences.*not sets"):
        HMM().fit([["a", "b"]], [{"A", "B"}])
    with pytest.raises(TypeError, match="y must be a list of token sequences.*not sets"):
        hmm.score([["a", "b"], ["b"]], [{"A", "B"}, ["B"]])


def test_a_set_of_attributes_is_read_in_sorted_order_so_no_fit_depends_on_the_hash_seed(tmp_path):
    """A token's attributes given as a set, or a dict value given as one, were read in hash order:
    the attribute numbering, the model file's bytes and the last digits of the marginals changed
    with PYTHONHASHSEED (L1). Their members are now read sorted, as if listed so."""
    candidates = ([f"v{i}", f"u{j}", f"t{i + j}"] for i in range(50) for j in range(50))
    members = next(m for m in candidates if list(set(m)) != sorted(m))  # a set whose own order is not the sorted one
    X_set = [[{"w": "a", "d": set(members)}, {"w": "b"}], [frozenset(f"x={m}" for m in members), {"w": "b"}]]
    X_sorted = [[{"w": "a", "d": sorted(members)}, {"w": "b"}], [sorted(f"x={m}" for m in members), {"w": "b"}]]
    y = [["A", "B"], ["A", "B"]]
    files = []
    for name, X in (("set", X_set), ("sorted", X_sorted)):
        model = CRF(max_iterations=5, c2=0.1).fit(X, y)
        model.save(tmp_path / f"{name}.npz")
        files.append((tmp_path / f"{name}.npz").read_bytes())
        assert list(model.attributes_[:4]) == ["w:a", *sorted(f"d:{m}" for m in members)]
    assert files[0] == files[1]


def test_a_pandas_row_as_a_token_is_refused_not_read_as_a_list_of_its_values():
    """``row[["w", "pos"]]`` (a Series) was read as the list of its values: ``w:the`` became ``the``
    and two columns with one value merged, silently (L16)."""
    import pandas as pd

    from crf import pycrfsuite

    frame = pd.DataFrame({"w": ["the", "dog"], "pos": ["DT", "NN"]})
    rows = [row for _, row in frame.iterrows()]
    with pytest.raises(TypeError, match=r"sequence 0, token 0 is a Series: a token must be a dict .*row.to_dict\(\)"):
        CRF(max_iterations=5).fit([rows], [["A", "B"]])
    with pytest.raises(TypeError, match=r"is a Series: a token must be a dict"):
        pycrfsuite.ItemSequence(rows)
    model = CRF(max_iterations=5).fit([[row.to_dict() for row in rows]], [["A", "B"]])
    assert sorted(model.attributes_) == ["pos:DT", "pos:NN", "w:dog", "w:the"]


@pytest.mark.parametrize("c1", [0.0, 0.05])
def test_large_attribute_values_train_as_well_as_small_ones(c1):
    """A constant on every token is a bias in other units: whatever its size, L-BFGS and OWL-QN
    reach a loss at least as low as without it (a larger model), never stalling at the start."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 6, size=(40, 7))
    X = [[{f"w={w}": 1.0, "prev": float(p)} for w, p in zip(row, np.r_[0, row[:-1]] > 2)] for row in words]
    y = [["A" if w < 2 else "B" if w < 4 else "C" for w in row] for row in words]
    base = CRF(c1=c1, c2=0.1, max_iterations=300, epsilon=1e-7).fit(X, y).training_log_[-1]["loss"]
    for value in (1e2, 1e6, 3e9):
        big = [[{**token, "big": value} for token in sequence] for sequence in X]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # lbfgs rescales: no warning that it may stall
            model = CRF(c1=c1, c2=0.1, max_iterations=300, epsilon=1e-7).fit(big, y)
        assert model.training_log_[-1]["loss"] <= base + 1e-3, value
        assert model.score(big, y) == 1.0
    # SGD steps in the attributes' own units: warned before training, its weights blow up, and the fit says so (not a
    # model that cannot be saved)
    from crf._training import TrainingError

    with pytest.warns(RuntimeWarning, match="algorithm='l2sgd' steps in the attributes' own units"):
        with pytest.raises(TrainingError, match=r"training drove a weight to .*, beyond the \+-1e\+06 a model file holds"):
            CRF(algorithm="l2sgd", max_iterations=2).fit(big, y)


@pytest.mark.parametrize("algorithm", ["ap", "l2sgd"])
def test_a_weight_no_file_holds_stops_training_at_its_first_epoch(algorithm, tmp_path):
    """The perceptron and SGD step in the attributes' units: an attribute value of 5e9 shows in the
    first epoch's weights, and training stops there (not after every epoch), in ``CRF.fit`` and in
    python-crfsuite's ``Trainer.train`` alike; nothing is written."""
    from crf import pycrfsuite
    from crf._training import TrainingError

    X = [[{"w": "the", "v": 5e9}, {"w": "dog", "v": -5e9}], [{"w": "a", "v": 3e9}, {"w": "cat"}]] * 3
    y = [["D", "N"], ["N", "D"]] * 3
    seen = []
    with pytest.warns(RuntimeWarning, match="steps in the attributes' own units"):
        with pytest.raises(TrainingError, match=r"^training drove a weight to [\d.e+]+ at epoch 1, beyond the \+-1e\+06"):
            CRF(algorithm=algorithm, max_iterations=30, callback=seen.append).fit(X, y)
    assert seen == []
    trainer = pycrfsuite.Trainer(verbose=False, algorithm="ap" if algorithm == "ap" else "l2sgd")
    trainer.set_params({"max_iterations": 30})
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    with pytest.warns(RuntimeWarning), pytest.raises(TrainingError, match="at epoch 1, beyond"):
        trainer.train(str(tmp_path / "m.crfsuite"))
    assert list(tmp_path.iterdir()) == []


def test_the_solver_reaches_the_same_minimum_in_rescaled_units():
    from crf import _optimize as optimize

    rng = np.random.default_rng(1)
    A = rng.normal(size=(30, 6)) * np.array([1, 10, 100, 1e3, 1e4, 1])
    b = rng.normal(size=30)

    def least_squares(theta):
        residual = A @ theta - b
        return float(residual @ residual), 2.0 * A.T @ residual

    scale = np.abs(A).max(axis=0)
    stopping = optimize.StoppingRule(max_iterations=500, epsilon=1e-12, period=10, delta=1e-14)
    for c1 in (0.0, 0.3):
        plain = optimize.lbfgs(least_squares, np.zeros(6), c1=c1, c2=0.01, stopping=stopping)
        scaled = optimize.lbfgs(least_squares, np.zeros(6), c1=c1, c2=0.01, stopping=stopping, scale=scale)
        np.testing.assert_allclose(scaled.theta, plain.theta, rtol=1e-4, atol=1e-8)
        assert scaled.history[-1].loss == pytest.approx(plain.history[-1].loss, rel=1e-9)


def test_a_warm_start_from_weights_of_another_scale_reaches_the_cold_optimum(caplog):
    """An attribute whose values grew by orders of magnitude makes the old weights a start far
    worse than zero: training starts from zero weights (and says so) instead of stopping far off."""
    rng = np.random.default_rng(2)
    words = rng.integers(0, 6, size=(40, 7))
    y = [["A" if w < 2 else "B" if w < 4 else "C" for w in row] for row in words]

    def data(value):
        return [[{f"w={w}": 1.0, "big": value} for w in row] for row in words]

    settings = dict(c2=0.1, max_iterations=300, epsilon=1e-7)
    cold = CRF(**settings).fit(data(3e9), y)
    warm = CRF(**settings).fit(data(1.0), y).set_params(warm_start=True)
    warm.fit(data(3e9), y)
    assert warm.training_log_[-1]["loss"] == pytest.approx(cold.training_log_[-1]["loss"], rel=1e-6)
    assert "training starts from zero weights" in caplog.text
    caplog.clear()
    again = CRF(**settings).fit(data(3e9), y).set_params(warm_start=True)
    again.fit(data(3e9), y)  # the same data: the old weights are the better start, and are kept
    assert "zero weights" not in caplog.text and again.n_iter_ < cold.n_iter_


def test_a_rare_large_value_among_ones_trains_as_without_rescaling():
    """The solver's unit is an attribute's typical (median) magnitude: one outlier does not shrink
    every other value of its attribute to nothing."""
    from crf import _training

    X = [[{"w": "a", "x": 1.0}, {"w": "b", "x": 1.0}], [{"w": "b", "x": 1.0}, {"w": "a", "x": 1.0}]] * 20
    X[0][0]["x"] = 1e6
    y = [["A", "B"], ["B", "A"]] * 20
    problem = _training.training_problem(X, y, None, None, None, CRF().get_params(), CRF().get_params(), None)
    assert _training.weight_scale(problem) is None
    typical = [[{**token, "x": 5e3} for token in sequence] for sequence in X]
    typical[0][0]["x"] = 1.0
    problem = _training.training_problem(typical, y, None, None, None, CRF().get_params(), CRF().get_params(), None)
    assert sorted(set(_training.weight_scale(problem).tolist())) == [1.0, 5e3]  # x's weights in units of 5e3


def test_a_warm_refit_with_too_few_attribute_names_is_one_line():
    X = [[{"w": "a", "v": "x"}, {"w": "b"}], [{"w": "b"}]] * 5
    y = [["A", "B"], ["B"]] * 5
    model = CRF(max_iterations=5).fit(X, y)
    batch, names = model.attribute_index_.transform(X), list(model.attributes_)
    model.set_params(warm_start=True)
    for given in (names[:-1], []):
        with pytest.raises(ValueError, match=rf"^{len(given)} attribute_names for a batch of 3 attribute columns$"):
            model.fit(batch, y, attribute_names=given)
    model.fit(batch, y, attribute_names=(name for name in names))  # a generator is read once
    with pytest.raises(TypeError, match="attribute_names must be a list of names"):
        model.fit(batch, y, attribute_names="wv")


def test_an_unknown_dev_label_is_refused_before_the_first_iteration():
    # None (unknown) is a partial label in y; y_dev is scored, so it failed at the first dev evaluation (G1)
    X = [[{"w": "the"}, {"w": "dog"}], [{"w": "a"}, {"w": "cat"}]] * 3
    y = [["D", "N"], ["D", "N"]] * 3
    iterations = []
    for y_dev, where in (([[None, "N"], ["D", "N"]], "sequence 0, token 0"), ([["D", "N"], ["D", None]], "sequence 1, token 1")):
        with pytest.raises(ValueError, match=rf"^y_dev: {where} is None \(unknown\): dev labels are scored"):
            CRF(max_iterations=5, dev_every=1, callback=iterations.append).fit(X, y, X[:2], y_dev)
    assert iterations == []
    partial = [[None, "N"], ["D", "N"]] + y[2:]
    assert CRF(max_iterations=5, dev_every=1).fit(X, partial, X[:2], y[:2]).n_iter_ >= 1  # None in y stays allowed


def test_a_model_file_path_a_write_would_refuse_is_refused_before_training(tmp_path):
    # a dangling link or a loop was refused after the last iteration, and the fit thrown away (G2)
    X = [[{"w": "the"}, {"w": "dog"}]] * 3
    y = [["D", "N"]] * 3
    (tmp_path / "dangling.crfsuite").symlink_to(tmp_path / "absent.crfsuite")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for name in ("dangling.crfsuite", "loop1"):
        iterations = []
        with pytest.raises(FileNotFoundError, match=rf"^model_filename: .*{name}: a symbolic link to .*, which does not exist"):
            CRF(max_iterations=5, model_filename=str(tmp_path / name), callback=iterations.append).fit(X, y)
        assert iterations == []
    assert not (tmp_path / "absent.crfsuite").exists()
    (tmp_path / "real.crfsuite").write_bytes(b"")
    (tmp_path / "live.crfsuite").symlink_to(tmp_path / "real.crfsuite")
    CRF(max_iterations=3, model_filename=str(tmp_path / "live.crfsuite")).fit(X, y)  # a link to a file is written through
    assert (tmp_path / "live.crfsuite").is_symlink() and (tmp_path / "real.crfsuite").stat().st_size > 0


@pytest.mark.parametrize("value", [1e10, -1e12, 1e300])
def test_a_value_too_large_to_train_on_is_too_large_to_tag_on_every_path(tmp_path, value):
    # one such score drowned the rest of its sentence: tagged without a word, exit 0 (G8)
    from crf import pycrfsuite
    from crf.batch import SequenceBatch
    from crf.features import FeatureExtractor

    X = [[{"a": 1.0, "n": 2.0}, {"b": 1.0}]] * 4
    y = [["D", "N"]] * 4
    model = CRF(max_iterations=5, model_filename=str(tmp_path / "m.crfsuite")).fit(X, y)
    bad = [{"a": 1.0}, {"b": 1.0, "n": value}]
    message = re.escape(f"sequence 0, token 1: attribute 'n' has the value {value:g}, too large to tag (the limit is 1e+10)")
    for call in (model.predict, model.predict_marginals, model.predict_segments):
        with pytest.raises(ValueError, match=message):
            call([bad])
    for call in (model.predict_single, model.predict_marginals_single, model.tagger_.tag):  # the per-call paths
        with pytest.raises(ValueError, match=message):
            call(bad)
    batch = model.attribute_index_.transform([bad[:1] + [{"b": 1.0, "n": 1.0}]])
    matrix = batch.X.copy()
    matrix.data[matrix.indices == model.attributes_.index("n")] = value
    with pytest.raises(ValueError, match=message):
        model.predict(SequenceBatch(matrix, batch.offsets))
    # an attribute the model never saw adds nothing
    assert list(model.predict([[{"a": 1.0}, {"b": 1.0, "zz": value}]])[0]) == ["D", "N"]
    tagger = pycrfsuite.Tagger()
    tagger.open(str(tmp_path / "m.crfsuite"))
    with pytest.raises(ValueError, match=r"item 1: attribute 'n' has the value .*too large to .*tag \(the limit is 1e\+10\)"):
        tagger.tag(bad)
    assert tagger.tag([{"a": 1.0}, {"b": 1.0}]) == ["D", "N"]
    extractor = FeatureExtractor(columns=["w", "score"], templates=["w[0]"], numeric=["score"], bos_eos=False)
    extractor.fit_transform([[("a", "0.5"), ("b", "-2")]])
    with pytest.raises(ValueError, match=r"numeric column 'score': sentence 1, token 0 has the value .*too large \(the limit"):
        extractor.transform([[("a", "1")], [("b", repr(value))]])


def test_a_fit_never_ends_in_weights_no_model_file_may_hold(tmp_path):
    # unregularised on separable data of tiny values: a weight of 3.95e6 that save then refused (G10)
    from crf._training import TrainingError

    X = [[{"v": 1e-7}], [{"v": -1e-7}]] * 5
    y = [["A"], ["B"]] * 5
    with pytest.raises(
        TrainingError, match=r"^training drove a weight to [\d.e+]+, beyond the \+-1e\+06 a model file holds: with c1=c2=0"
    ):
        CRF(c2=0.0, max_iterations=200).fit(X, y)
    model = CRF(c2=1e-12, max_iterations=200).fit(X, y)  # a little regularisation: a model that saves and loads
    model.save(tmp_path / "m.npz")
    assert [list(p) for p in CRF.load(tmp_path / "m.npz").predict(X)] == [list(p) for p in model.predict(X)]
    # the perceptron steps in the attributes' own units: large values are the cause it names (c2 does not apply to it)
    rng = np.random.default_rng(0)
    X = [[{"w": str(rng.integers(3)), "big": float(v)} for v in 1e8 * (rng.random(6) - 0.5)] for _ in range(40)]
    y = [["A" if token["w"] == "0" else "B" for token in sequence] for sequence in X]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the warning before training says the same
        with pytest.raises(TrainingError, match=r"attribute 'big' has the value .*, and algorithm='ap' steps in the attributes'"):
            CRF(algorithm="ap", max_iterations=10).fit(X, y)


def test_a_strength_too_large_to_move_is_named_as_the_cause():
    X = [[{"w": "a"}, {"w": "b"}], [{"w": "b"}]] * 5
    y = [["A", "B"], ["B"]] * 5
    with pytest.raises(ValueError, match=r"c2=1e\+300 is above 1e\+12: a prior this strong keeps every weight at"):
        CRF(c2=1e300).fit(X, y)

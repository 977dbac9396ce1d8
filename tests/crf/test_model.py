"""The CRF estimator: training, inference queries, L1 sparsity, SGD, persistence."""

from __future__ import annotations

import itertools
import zipfile

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from crf import CRF, ModelFileError, SequenceBatch, metrics
from crf._persist import load_arrays, save_arrays


def _toy_corpus(seed: int, n: int = 150):
    """A learnable tagging task: the label is the word's class, shifted by the previous label."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(12)]
    X, y = [], []
    for _ in range(n):
        length = int(rng.integers(1, 9))
        tokens = list(rng.choice(words, size=length))
        labels = []
        for _i, w in enumerate(tokens):
            k = int(w[1:])
            if k < 4:
                labels.append("O")
            elif labels and labels[-1] != "O" and k < 8:
                labels.append("I-A")
            else:
                labels.append("B-A" if k < 10 else "B-B")
        X.append([{"w": w, "prev": tokens[i - 1] if i else "<s>", "len": len(w) / 3.0} for i, w in enumerate(tokens)])
        y.append(labels)
    return X, y


def _pair(previous: str, current: str):
    """(prev tag, tag, prev type, type) for metrics.chunk_start / chunk_end."""
    (prev_tag, prev_type), (tag, type_) = metrics.split_label(previous), metrics.split_label(current)
    return prev_tag, tag, prev_type, type_


@pytest.fixture(scope="module")
def fitted():
    X, y = _toy_corpus(0)
    return CRF(c2=0.1, max_iterations=80).fit(X, y), X, y


def test_fit_predict_and_score(fitted):
    model, X, y = fitted
    assert model.score(X, y) > 0.95
    assert model.n_iter_ <= 80 and len(model.training_log_) == model.n_iter_
    assert model.predict_single(X[0]) == list(model.predict([X[0]])[0])
    assert set(model.classes_) == {"O", "I-A", "B-A", "B-B"}


def test_marginals_and_sequence_probabilities_are_distributions(fitted):
    model, X, _ = fitted
    marginals = model.predict_marginals(X[:5])
    for sequence in marginals:
        for token in sequence:
            assert sum(token.values()) == pytest.approx(1.0)
    x = [t for t in X if len(t) == 3][0]
    every = [list(p) for p in itertools.product(model.classes_, repeat=3)]
    total = model.sequence_probability([x] * len(every), every).sum()
    assert total == pytest.approx(1.0)
    best = model.predict_single(x)
    probs = model.sequence_probability([x] * len(every), every)
    assert every[int(np.argmax(probs))] == best


def test_segment_confidence_matches_enumeration(fitted):
    model, X, _ = fitted
    x = [t for t in X if len(t) == 5][0]
    segments = model.predict_segments([x])
    assert len(segments) > 0
    every = [list(p) for p in itertools.product(model.classes_, repeat=5)]
    probs = model.sequence_probability([x] * len(every), every)
    predicted = model.predict_single(x)
    for _, seg in segments.iterrows():
        s, e = int(seg["start"]), int(seg["end"])
        expected = 0.0
        for labels, p in zip(every, probs):
            inside = labels[s:e] == predicted[s:e]
            before = s == 0 or metrics.chunk_start(*_pair(labels[s - 1], labels[s]))
            after = e == 5 or metrics.chunk_end(*_pair(labels[e - 1], labels[e]))
            expected += p * bool(inside and before and after)
        assert seg["confidence"] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_segments_from_one_posterior_are_predict_segments(fitted):
    """The pipeline's tagger runs forward-backward once per split and reuses it for the chunks'
    confidence: the same frame as predict_segments, which runs its own."""
    model, X, _ = fitted
    codes = np.concatenate(model.predict_codes(X[:40])[0])
    posterior, emissions, batch = model.posterior(X[:40], keep_messages=True)
    reused = model.segments_of(codes, emissions, batch, posterior)
    expected = model.predict_segments(X[:40])
    assert len(expected) > 10
    pd.testing.assert_frame_equal(reused, expected)
    marginals, _ = model.marginals(X[:40])
    np.testing.assert_array_equal(posterior.marginals, marginals)


def test_l1_gives_exact_zeros_and_fewer_features_as_c1_grows():
    X, y = _toy_corpus(1)
    active = []
    for c1 in [0.0, 0.5, 5.0]:
        model = CRF(c1=c1, c2=0.01, max_iterations=150, all_possible_states=True).fit(X, y)
        active.append(model.n_active_features_)
        if c1 > 0:
            assert np.sum(model.state_weights_ == 0.0) > 0
    assert active[0] > active[1] > active[2]


def test_sgd_learns_the_task():
    X, y = _toy_corpus(2)
    log = []
    model = CRF(algorithm="l2sgd", c2=0.1, max_iterations=15, batch_size=16, learning_rate=0.2, callback=log.append).fit(X, y)
    assert len(log) == model.n_iter_ == 15
    assert log[-1].loss < log[0].loss
    assert model.score(X, y) > 0.9


def test_dev_evaluation_and_callback():
    X, y = _toy_corpus(3)
    seen = []
    CRF(max_iterations=6, dev_every=3, callback=seen.append).fit(X[:100], y[:100], X[100:], y[100:])
    assert [i.iteration for i in seen] == list(range(1, 7))
    assert [hasattr(i, "dev_accuracy") for i in seen] == [False, False, True, False, False, True]
    assert all(i.elapsed >= 0 and np.isfinite(i.loss) for i in seen)


def test_stopping_by_delta():
    X, y = _toy_corpus(4)
    model = CRF(c2=1.0, delta=1e-2, period=3).fit(X, y)
    assert model.stop_reason_ == "delta"


def test_top_features_and_feature_dicts(fitted):
    model, _, _ = fitted
    state, transitions = model.top_features(5)
    assert len(state) == 10 and state["weight"].iloc[0] >= state["weight"].iloc[4]
    assert len(transitions) == len(model.classes_) ** 2
    assert ("w:w11", "B-B") in model.state_features_


def test_save_load_round_trip(fitted, tmp_path):
    model, X, _ = fitted
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = CRF.load(path)
    assert [list(p) for p in loaded.predict(X)] == [list(p) for p in model.predict(X)]
    np.testing.assert_array_equal(loaded.state_weights_, model.state_weights_)
    assert loaded.get_params() == {**model.get_params()}
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind


def test_batch_input_round_trip(tmp_path):
    X, y = _toy_corpus(5)
    from crf.features import AttributeIndex

    batch = AttributeIndex().fit(X).transform(X)
    assert isinstance(batch, SequenceBatch)
    model = CRF(max_iterations=30, all_possible_states=True).fit(batch, y)
    model.save(tmp_path / "m.npz")
    loaded = CRF.load(tmp_path / "m.npz")
    assert [list(p) for p in loaded.predict(batch)] == [list(p) for p in model.predict(batch)]
    with pytest.raises(ValueError, match="pass a SequenceBatch"):
        loaded.predict(X)


def test_corrupted_files_are_rejected(fitted, tmp_path):
    model, _, _ = fitted
    path = tmp_path / "model.npz"
    model.save(path)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="unreadable or truncated"):
        CRF.load(truncated)
    # change one weight inside the archive: the checksum catches it
    meta, arrays = load_arrays(path, "crf.CRF")
    arrays["transitions"] = arrays["transitions"].copy()
    arrays["transitions"][0, 0] += 1.0
    tampered = tmp_path / "tampered.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.namelist():
            if item == "transitions.npy":
                import io

                buffer = io.BytesIO()
                np.save(buffer, arrays["transitions"])
                dst.writestr(item, buffer.getvalue())
            else:
                dst.writestr(item, src.read(item))
    with pytest.raises(ModelFileError, match="'transitions' fails its checksum"):
        CRF.load(tampered)
    other = tmp_path / "other.npz"
    save_arrays(other, "something.else", {}, {"a": np.zeros(2)})
    with pytest.raises(ModelFileError, match="expected a 'crf.CRF'"):
        CRF.load(other)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, __meta__=np.array([{"kind": "crf.CRF"}], dtype=object))
    with pytest.raises(ModelFileError):
        CRF.load(pickled)


def test_bad_training_input():
    X, y = _toy_corpus(6, n=5)
    with pytest.raises(ValueError, match="sequence 0: .* tokens in X but .* labels in y"):
        CRF().fit(X, [labels + ["O"] for labels in y])
    with pytest.raises(ValueError, match="unknown algorithm"):
        CRF(algorithm="nope").fit(X, y)
    with pytest.raises(RuntimeError, match="not fitted"):
        CRF().predict(X)


def test_integer_labels_keep_their_type_through_save_and_load(tmp_path):
    X = [[{"a": 1.0}, {"b": 1.0}], [{"a": 1.0}]] * 5
    y = [[1, 2], [1]] * 5
    model = CRF(max_iterations=20).fit(X, y)
    assert model.classes_ == [1, 2] and all(type(c) is int for c in model.classes_)
    model.save(tmp_path / "m.npz")
    loaded = CRF.load(tmp_path / "m.npz")
    assert loaded.classes_ == [1, 2]
    assert [list(p) for p in loaded.predict(X[:2])] == [[1, 2], [1]]
    assert loaded.score(X, y) == model.score(X, y) == 1.0
    with pytest.raises(TypeError, match="labels must be strings or integers, got 1.5"):
        CRF().fit(X, [[1.5, 2], [1]] * 5)


def test_non_finite_values_in_a_batch_are_refused_with_their_position():
    X = sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 1.0], [np.nan, 0.0]]))
    batch = SequenceBatch(X, np.array([0, 2, 3]))
    with pytest.raises(ValueError, match="sequence 1, token 0: attribute column 0 has the non-finite value nan"):
        CRF().fit(batch, [["x", "y"], ["x"]])


def test_a_batch_subset_refuses_sequence_numbers_it_does_not_have():
    from crf import AttributeIndex

    batch = AttributeIndex().fit_transform([[{"a": 1.0}], [{"b": 1.0}, {"a": 1.0}]])
    assert batch.subset([1, 0, 1]).lengths.tolist() == [2, 1, 2]
    for bad in ([-1], [2]):
        with pytest.raises(IndexError, match=f"sequence {bad[0]} is not in this batch of 2 sequences"):
            batch.subset(bad)

"""python-crfsuite-style input (dict or string-list tokens): value rules against python-crfsuite,
against a direct loop implementation on random nested input, and the input errors."""

from __future__ import annotations

import pickle
import random
from collections.abc import Mapping

import numpy as np
import pytest

from crf.attributes import AttributeIndex
from crf.batch import SequenceBatch

pycrfsuite = pytest.importorskip("pycrfsuite")

# one token of every value type python-crfsuite accepts
TYPED = [
    [
        {"s": "x", "b": b"caf\xc3\xa9", "t": True, "f": False, "i": 3, "r": 0.25},
        {"n": {"j": "v", "k": 2.0, "m": {"z": True}}, "l": ["a", b"b"], "set": {"p"}},
        ["w=He", "pos=PRP", b"raw"],
    ],
    [{"s": "y", "i": -1, "e": "", "colon": "a:b", "np": np.float32(1.5), "ni": np.int64(2)}, ["w=x"]],
]
LABELS = [["A", "B", "A"], ["B", "A"]]


def _rows(index: AttributeIndex, batch: SequenceBatch) -> list[dict[str, float]]:
    """Each token's non-zero attributes as {name: weight}."""
    names, X = index.names(), batch.X
    return [
        {names[c]: v for c, v in zip(X.indices[X.indptr[t] : X.indptr[t + 1]], X.data[X.indptr[t] : X.indptr[t + 1]]) if v != 0}
        for t in range(X.shape[0])
    ]


def _crfsuite_model(tmp_path, X, y) -> pycrfsuite.Tagger:
    trainer = pycrfsuite.Trainer(verbose=False)
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    trainer.set_params({"c2": 1e-3, "max_iterations": 20, "feature.possible_states": True})
    trainer.train(str(tmp_path / "m.crfsuite"))
    tagger = pycrfsuite.Tagger()
    tagger.open(str(tmp_path / "m.crfsuite"))
    return tagger


def test_every_value_type_reads_as_python_crfsuite_reads_it(tmp_path):
    index = AttributeIndex().fit(TYPED)
    ours = _rows(index, index.transform(TYPED))
    # the attributes and weights CRFsuite receives, token by token (weight-0 attributes dropped)
    theirs = [{k: v for k, v in item.items() if v != 0} for xseq in TYPED for item in pycrfsuite.ItemSequence(xseq).items()]
    assert ours == theirs
    assert ours[0]["b:café"] == 1.0 and ours[0]["t"] == 1.0 and "f" not in ours[0] and ours[0]["i"] == 3.0
    assert ours[1]["n:j:v"] == 1.0 and ours[1]["n:k"] == 2.0 and ours[1]["n:m:z"] == 1.0 and ours[1]["l:b"] == 1.0
    # the trained model knows exactly the attributes with a non-zero weight somewhere
    model = _crfsuite_model(tmp_path, TYPED, LABELS).info()
    assert set(model.attributes) == set().union(*ours)
    # False registers its attribute in the vocabulary (as in CRFsuite's dictionary) but weighs 0
    assert "f" in index.index_ and "f" not in model.attributes


def test_repeated_attributes_add_up_like_crfsuite(tmp_path):
    repeated, weighted = [[["a", "a"], ["b"]]], [[{"a": 2.0}, {"b": 1.0}]]
    a, b = AttributeIndex().fit(repeated), AttributeIndex().fit(weighted)
    assert _rows(a, a.transform(repeated)) == _rows(b, b.transform(weighted)) == [{"a": 2.0}, {"b": 1.0}]
    first = _crfsuite_model(tmp_path, repeated, [["A", "B"]]).info().state_features
    second = _crfsuite_model(tmp_path, weighted, [["A", "B"]]).info().state_features
    assert first == pytest.approx(second)


# --- a direct loop implementation of the same rules, for random nested input --------------------


def _reference_items(token, prefix=""):
    if isinstance(token, Mapping):
        for key, value in token.items():
            name = prefix + (key.decode() if isinstance(key, bytes) else key)
            if isinstance(value, bytes):
                value = value.decode()
            if isinstance(value, str):
                yield f"{name}:{value}", 1.0
            elif isinstance(value, Mapping):
                yield from _reference_items(value, name + ":")
            elif isinstance(value, (list, tuple, set)):
                for item in value:
                    yield f"{name}:{item.decode() if isinstance(item, bytes) else item}", 1.0
            else:
                yield name, float(value)
    else:
        for name in token:
            yield (name.decode() if isinstance(name, bytes) else name), 1.0


def _reference_rows(sequences, vocabulary) -> list[dict[str, float]]:
    rows = []
    for sequence in sequences:
        for token in sequence:
            row: dict[str, float] = {}
            for name, value in _reference_items(token):
                if name in vocabulary:
                    row[name] = row.get(name, 0.0) + value
            rows.append({k: v for k, v in row.items() if v != 0})
    return rows


def _random_value(rng: random.Random, depth: int):
    word = rng.choice(["a", "b", "c:d", "é", ""])
    makers = [
        lambda: word,
        lambda: word.encode(),
        lambda: rng.random() < 0.5,
        lambda: rng.randrange(-2, 3),
        lambda: round(rng.uniform(-2, 2), 2),
        lambda: np.float64(0.5),
        lambda: [rng.choice(["p", "q", b"r"]) for _ in range(rng.randrange(3))],
        lambda: (rng.choice("pq"),),
        lambda: {rng.choice("jk"): _random_value(rng, depth + 1) for _ in range(rng.randrange(3))},
    ]
    return makers[rng.randrange(len(makers) if depth < 2 else len(makers) - 1)]()


def _random_token(rng: random.Random):
    if rng.random() < 0.3:
        return [rng.choice(["u", "v", "w", b"x", "u:1"]) for _ in range(rng.randrange(4))]
    return {rng.choice(["k", "m", "u", "w", b"y"]): _random_value(rng, 0) for _ in range(rng.randrange(5))}


@pytest.mark.parametrize("seed", range(20))
def test_random_nested_input_matches_the_loop_reference(seed):
    rng = random.Random(seed)
    train = [[_random_token(rng) for _ in range(rng.randrange(1, 5))] for _ in range(rng.randrange(1, 6))]
    test = [[_random_token(rng) for _ in range(rng.randrange(1, 5))] for _ in range(rng.randrange(1, 6))]
    index = AttributeIndex().fit(train)
    vocabulary = {name for sequence in train for token in sequence for name, _ in _reference_items(token)}
    assert set(index.index_) == vocabulary
    assert sorted(index.index_.values()) == list(range(len(vocabulary)))
    for data in (train, test):
        batch = index.transform(data)
        assert batch.n_attributes == len(vocabulary)
        np.testing.assert_array_equal(batch.lengths, [len(s) for s in data])
        assert _rows(index, batch) == _reference_rows(data, vocabulary)


def test_common_shapes_number_attributes_in_order_of_appearance():
    X = [[["b", "a"], ["c", "b"]], [["d"]]]
    assert list(AttributeIndex().fit(X).names()) == ["b", "a", "c", "d"]
    D = [[{"w": "x", "bias": 1.0, "up": False}, {"w": "y", "bias": 1.0}]]
    assert list(AttributeIndex().fit(D).names()) == ["w:x", "bias", "up", "w:y"]


@pytest.mark.parametrize("block_tokens", [1, 2, 3, 7])
def test_reading_in_blocks_gives_the_same_index_matrix_and_positions(monkeypatch, block_tokens):
    rng = random.Random(block_tokens)
    train = [[_random_token(rng) for _ in range(rng.randrange(1, 5))] for _ in range(12)]
    whole = AttributeIndex()
    whole_batch = whole.fit_transform(train, min_freq=1)
    every = AttributeIndex().fit(train).index_
    monkeypatch.setattr(AttributeIndex, "block_tokens", block_tokens)
    blocks = AttributeIndex()
    batch = blocks.fit_transform(train, min_freq=1)
    assert blocks.index_ == whole.index_  # numbered in order of first appearance across blocks
    assert (batch.X != whole_batch.X).nnz == 0 and np.array_equal(batch.offsets, whole_batch.offsets)
    assert list(AttributeIndex().fit(train).index_.items()) == list(every.items())
    late = [*train, [{"a": 1.0}, {"a": float("nan")}]]  # the bad token is in the last block
    with pytest.raises(ValueError, match=r"sequence 12, token 1: attribute 'a'"):
        blocks.transform(late)
    before = dict(blocks.index_)
    with pytest.raises(ValueError, match=r"sequence 12, token 1"):
        blocks.fit(late)
    assert blocks.index_ == before  # a failed fit leaves the fitted vocabulary as it was


# --- errors and edge cases -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -np.inf, np.float32("nan")])
def test_non_finite_weights_name_their_position(bad):
    X = [[{"a": 1.0}], [{"a": 1.0}, {"a": 1.0, "score": bad}]]
    with pytest.raises(ValueError, match=r"sequence 1, token 1: attribute 'score' has the non-finite weight"):
        AttributeIndex().fit(X)
    index = AttributeIndex().fit(X[:1])
    with pytest.raises(ValueError, match=r"sequence 1, token 1: attribute 'score'"):
        index.transform(X)
    with pytest.raises(ValueError, match=r"sequence 0, token 0: attribute 'n:j'"):
        index.transform([[{"n": {"j": bad}}]])


def test_strings_where_token_lists_are_expected_are_type_errors():
    index = AttributeIndex().fit([[["a"]]])
    with pytest.raises(TypeError, match="X must be a list of sequences of tokens, not a str"):
        index.transform("abc")
    with pytest.raises(TypeError, match="sequence 1 is a str, not a list of tokens"):
        index.transform([[["a"]], "ab"])
    with pytest.raises(TypeError, match="sequence 0 is a dict"):
        index.transform([{"a": 1.0}, {"b": 1.0}])  # one sequence passed where a list of them belongs
    with pytest.raises(TypeError, match=r"sequence 0, token 0 is the string 'a'"):
        index.transform([["a", "b"]])  # one sequence of attribute strings instead of tokens


def test_values_and_names_of_unsupported_types_are_reported():
    with pytest.raises(TypeError, match=r"sequence 0, token 1: attribute 'x' has a value of type NoneType"):
        AttributeIndex().fit([[{"x": 1}, {"x": None}]])
    with pytest.raises(TypeError, match=r"sequence 0, token 0: attribute names must be str or bytes, not int"):
        AttributeIndex().fit([[{1: "a"}]])
    with pytest.raises(TypeError, match=r"sequence 0, token 0: attribute 'x': attribute names must be str or bytes, not int"):
        AttributeIndex().fit([[{"x": ["a", 1]}]])
    with pytest.raises(TypeError, match=r"sequence 1, token 0: attribute names must be str or bytes, not int"):
        AttributeIndex().fit([[["a"]], [["a", 2]]])
    with pytest.raises(ValueError, match="not valid UTF-8"):
        AttributeIndex().fit([[[b"\xff"]]])


def test_dict_keys_that_are_not_strings_are_reported_or_read():
    """Keys are sorted out once per distinct key: None and NaN (which hash tables often set apart)
    are reported like any other non-name; bytes keys are read as UTF-8, with text and with numbers."""
    with pytest.raises(TypeError, match=r"sequence 0, token 1: attribute names must be str or bytes, not NoneType"):
        AttributeIndex().fit([[{"a": "x"}, {None: "v"}]])
    with pytest.raises(TypeError, match=r"sequence 1, token 0: attribute names must be str or bytes, not float"):
        AttributeIndex().fit([[{"a": "x"}], [{float("nan"): 1.0}]])
    index = AttributeIndex()
    X = index.fit_transform([[{"a": "x", b"k": "v", "n": 2.0}, {b"k": 1.5, "a": "x", "b": "x"}]]).X.toarray()
    assert list(index.index_) == ["a:x", "n", "k:v", "b:x", "k"]  # a token's rare shapes come last
    np.testing.assert_array_equal(X, [[1, 2, 1, 0, 0], [1, 0, 0, 1, 1.5]])


def test_list_token_names_are_checked_where_the_lookup_misses(monkeypatch):
    """List tokens' names go to the hash table unchecked; the ones it does not find are checked
    then, in every block: bytes are read as UTF-8, anything else is reported with its place."""
    monkeypatch.setattr(AttributeIndex, "block_tokens", 2)
    index = AttributeIndex().fit([[["a", b"b"], ["c"]], [["a"], [b"d", "c"]], [["e"]]])
    assert index.index_ == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    X = index.transform([[["zz", b"e"]], [["a"]], [["zz"], [b"b", "a", "e"]]]).X.toarray()
    np.testing.assert_array_equal(X, [[0, 0, 0, 0, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 1]])
    with pytest.raises(TypeError, match=r"sequence 2, token 1: attribute names must be str or bytes, not list"):
        index.transform([[["a"]], [["a"], ["b"]], [["a"], ["c", ["a"]]]])  # unhashable, in the second block
    with pytest.raises(TypeError, match=r"sequence 2, token 0: attribute names must be str or bytes, not float"):
        AttributeIndex().fit([[["a"]], [["a"], ["b"]], [[1.5]]])


def test_empty_inputs():
    index = AttributeIndex().fit([[["a"], ["b"]]])
    batch = index.transform([])
    assert batch.n_sequences == 0 and batch.n_attributes == 2 and batch.n_tokens == 0
    with pytest.raises(ValueError, match="no sequences"):
        AttributeIndex().fit([])
    with pytest.raises(ValueError, match="sequence 1 has no tokens"):
        index.transform([[["a"]], []])
    # tokens without attributes are rows of zeros
    empty = index.transform([[[], {}]])
    assert empty.n_tokens == 2 and empty.X.nnz == 0


def test_unknown_attributes_at_transform_are_ignored():
    index = AttributeIndex().fit([[{"w": "a", "x": 1.0}]])
    batch = index.transform([[{"w": "zzz", "x": 2.0, "new": 5.0}, ["w:a", "other"]]])
    assert batch.X.shape == (2, 2)
    assert _rows(index, batch) == [{"x": 2.0}, {"w:a": 1.0}]


def test_min_freq_keeps_attributes_whose_weights_add_up_to_it():
    X = [[["a", "b"], ["a", "c"]], [{"a": 1.0, "c": 0.5, "z": 0.0}, {"b": True}]]
    assert list(AttributeIndex().fit(X).names()) == ["a", "b", "c", "z"]
    assert list(AttributeIndex().fit(X, min_freq=1).names()) == ["a", "b", "c"]  # "z" only ever weighs 0
    assert list(AttributeIndex().fit(X, min_freq=2).names()) == ["a", "b"]  # "c" adds up to 1.5
    index = AttributeIndex().fit(X, min_freq=3)
    assert list(index.names()) == ["a"]
    assert _rows(index, index.transform(X)) == [{"a": 1.0}, {"a": 1.0}, {"a": 1.0}, {}]


@pytest.mark.parametrize("min_freq", [1, 2, 3])
def test_min_freq_never_drops_an_attribute_crfsuite_keeps(tmp_path, min_freq):
    X = [[["a", "c"], ["a"], ["a", "b"], ["c"]], [{"h": 0.5}, {"h": 0.5}, {"h": 0.5}, {"c": 1}]]
    y = [["A", "A", "B", "B"], ["A", "A", "A", "B"]]
    trainer = pycrfsuite.Trainer(verbose=False)
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    trainer.set_params({"c2": 0.01, "max_iterations": 10, "feature.minfreq": min_freq})
    trainer.train(str(tmp_path / "m"))
    tagger = pycrfsuite.Tagger()
    tagger.open(str(tmp_path / "m"))
    kept_by_crfsuite = {attribute for attribute, _ in tagger.info().state_features}
    assert kept_by_crfsuite <= set(AttributeIndex().fit(X, min_freq=min_freq).index_)


def test_index_can_be_set_from_saved_names():
    index = AttributeIndex()
    index.index_ = {"b": 1, "a": 0}  # as CRF.load rebuilds it from the saved attribute names
    assert list(index.names()) == ["a", "b"]
    assert _rows(index, index.transform([[["a", "b"]]])) == [{"a": 1.0, "b": 1.0}]
    index.index_ = {"a": 1, "c": 0}  # replacing the vocabulary after use: lookups follow the new one
    assert _rows(index, index.transform([[["a", "b", "c"]]])) == [{"a": 1.0, "c": 1.0}]
    restored = pickle.loads(pickle.dumps(index))  # the lookup table is rebuilt, not pickled
    assert restored.index_ == {"a": 1, "c": 0} and _rows(restored, restored.transform([[["c"]]])) == [{"c": 1.0}]
    index.index_["z"] = 2  # grown in place: the table follows the new size
    assert _rows(index, index.transform([[["z", "a"]]])) == [{"a": 1.0, "z": 1.0}]
    older = AttributeIndex.__new__(AttributeIndex)  # state pickled before index_ was a property
    older.__setstate__({"index_": {"q": 0}})
    assert _rows(older, older.transform([[["q"]]])) == [{"q": 1.0}]


def test_reexported_from_features():
    from crf.features import AttributeIndex as Reexported

    assert Reexported is AttributeIndex


def test_iterables_of_sequences_are_accepted():
    X = [[["a"], {"b": 1.0}], [("c",)]]
    index = AttributeIndex().fit(iter(X))
    assert _rows(index, index.transform(s for s in X)) == [{"a": 1.0}, {"b": 1.0}, {"c": 1.0}]


def test_feature_extractor_attribute_lists_round_trip():
    from crf.features import crfsuite_chunking_extractor

    sentences = [[("He", "PRP", "B-NP"), ("reckons", "VBZ", "B-VP"), ("the", "DT", "B-NP")], [("New", "NNP", "B-NP")]]
    extractor = crfsuite_chunking_extractor().fit(sentences)
    batch = extractor.transform(sentences)
    index = AttributeIndex().fit(extractor.attribute_lists(batch))
    ours = index.transform(extractor.attribute_lists(batch))
    columns = [index.index_[name] for name in extractor.attribute_names() if name in index.index_]
    assert len(columns) == index.names().size == extractor.attribute_names().size
    assert (ours.X[:, columns] != batch.X).nnz == 0


# --- the per-entry reader of dict tokens at transform (crf.attributes.sequence_entries) --------


def _common_token(rng: random.Random):
    """A dict token of the shapes the per-entry reader takes: str keys (some with colons, some
    repeating another item's ``k:v`` name) with str, bool, int and float values."""
    keys = ["w", "w:a", "k", "u", "n", "w:a:b", "é"]
    values = [lambda: rng.choice(["a", "b", "a:b", "", "é", "zz"]), lambda: rng.random() < 0.5]
    values += [lambda: rng.randrange(-2, 3), lambda: round(rng.uniform(-2, 2), 2), lambda: 1.0]
    return {rng.choice(keys): rng.choice(values)() for _ in range(rng.randrange(6))}


@pytest.mark.parametrize("block_tokens", [1, 3, 1 << 14])
@pytest.mark.parametrize("seed", range(6))
def test_transform_reads_dicts_entry_by_entry_exactly_as_the_batch_reader(monkeypatch, seed, block_tokens):
    """Dict tokens read one entry at a time give the batch reader's matrix bit for bit (same
    columns and weights: repeated names, colons, unknown names, zero weights), and blocks with
    rare shapes (bytes, nested dicts, lists, NumPy numbers, list tokens, odd keys) still go to
    the batch reader, which reads them as before."""
    import crf.attributes as attributes

    rng = random.Random(seed)
    train = [[_common_token(rng) for _ in range(rng.randrange(1, 5))] for _ in range(8)]
    train += [[_random_token(rng) for _ in range(rng.randrange(1, 5))] for _ in range(4)]
    index = AttributeIndex().fit(train)
    common = [[_common_token(rng) for _ in range(rng.randrange(1, 6))] for _ in range(10)]
    mixed = common[:5] + [[_random_token(rng) for _ in range(3)] for _ in range(3)] + common[5:]
    monkeypatch.setattr(AttributeIndex, "block_tokens", block_tokens)
    calls = []
    reader = attributes.sequence_entries
    monkeypatch.setattr(attributes, "sequence_entries", lambda *a: calls.append(reader(*a)) or calls[-1])
    for data in (common, mixed, train):
        calls.clear()
        new = index.transform(data).X
        if data is common or block_tokens == 1:  # the per-entry reader read some blocks
            assert any(found is not None for found in calls)
        with monkeypatch.context() as patch:
            patch.setattr(attributes, "sequence_entries", lambda *a: None)
            old = index.transform(data).X
        for name in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(new, name), getattr(old, name))
        assert new.shape == old.shape
    assert _rows(index, index.transform(common)) == _reference_rows(common, set(index.index_))


def test_transform_of_bad_dict_values_still_names_their_position():
    """Where the per-entry reader gives up (non-finite weights, integers beyond a float, keys that
    are not names), the batch reader reports the position as it did."""
    index = AttributeIndex().fit([[{"a": 1.0, "w": "x"}]])
    with pytest.raises(ValueError, match=r"sequence 1, token 0: attribute 'a' has the non-finite weight"):
        index.transform([[{"w": "x"}], [{"a": float("inf")}]])
    with pytest.raises(ValueError, match=r"sequence 0, token 1: attribute 'a' has an integer of"):
        index.transform([[{"w": "x"}, {"a": 10**400}]])
    with pytest.raises(TypeError, match=r"sequence 0, token 1: attribute names must be str or bytes, not int"):
        index.transform([[{"w": "x"}, {1: "x"}]])
    np.testing.assert_array_equal(index.transform([[{b"w": "x", "a": 2}]]).X.toarray(), [[2, 1]])

"""CRFsuite model files both ways, checked against python-crfsuite's own tagger."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pipeline_helpers import _WORDS as TOY_WORDS

from crf import CRF
from crf._persist import ModelFileError
from crf.crfsuite import (
    CRFsuiteFormatError,
    CRFsuiteModel,
    StateFeatures,
    crfsuite_from_crf,
    hashlittle,
    read_crfsuite,
    write_crfsuite,
)

pycrfsuite = pytest.importorskip("pycrfsuite")

_WORDS = {tag: words for tag, words in TOY_WORDS.items() if tag != "."}  # the toy grammar's words


def _sentence(rng) -> tuple[list[str], list[str], list[str]]:
    """A toy chunking sentence: (words, POS tags, BIO chunk labels)."""
    rows = []
    for head in ("NP", "VP", "NP", "PP", "NP")[: 5 if rng.random() < 0.5 else 3]:
        tags = {"NP": ["DT"] + ["JJ"] * int(rng.integers(0, 3)) + ["NN"], "VP": ["VB"], "PP": ["IN"]}[head]
        rows += [(str(rng.choice(_WORDS[t])), t, ("B-" if i == 0 else "I-") + head) for i, t in enumerate(tags)]
    if rng.random() < 0.3:  # some noise so that the model is not certain
        i = int(rng.integers(len(rows)))
        rows[i] = (rows[i][0], rows[i][1], "O")
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _lists(words, tags) -> list[list[str]]:
    """Attribute strings, some longer than lookup3's 12-byte blocks."""
    n = len(words)
    out = []
    for t in range(n):
        prev = words[t - 1] if t else "__BOS__"
        nxt = words[t + 1] if t + 1 < n else "__EOS__"
        out.append([f"w={words[t]}", f"pos={tags[t]}", f"w[-1]|w[0]={prev}|{words[t]}", f"pos[0]|w[+1]={tags[t]}|{nxt}", "bias"])
    return out


def _dicts(words, tags) -> list[dict]:
    """dict tokens: string values, float values and a nested dict."""
    return [
        {"w": w, "pos": p, "len": float(len(w)) / 3.0, "suffix": {w[-2:]: 0.5}, "upper": w[0].isupper()}
        for w, p in zip(words, tags)
    ]


def _corpus(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return [_sentence(rng) for _ in range(n)]


def _train_crfsuite(path, X, y, **params) -> None:
    trainer = pycrfsuite.Trainer(verbose=False)
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    trainer.set_params({"c2": 0.1, "max_iterations": 50, **params})
    trainer.train(str(path))


@pytest.fixture(scope="module", params=["lists", "dicts"])
def crfsuite_file(request, tmp_path_factory):
    """(path, test inputs, test labels) of a python-crfsuite model trained on ~400 tokens."""
    make = _lists if request.param == "lists" else _dicts
    train, test = _corpus(0, 60), _corpus(1, 25)
    path = tmp_path_factory.mktemp("crfsuite") / f"{request.param}.crfsuite"
    _train_crfsuite(path, [make(w, p) for w, p, _ in train], [y for _, _, y in train])
    return path, [make(w, p) for w, p, _ in test], [y for _, _, y in test]


def _tagger(path):
    tagger = pycrfsuite.Tagger()
    tagger.open(str(path))
    return tagger


def test_lookup3_matches_the_published_test_vector():
    assert hashlittle([b"Four score and seven years ago"])[0] == 0x17770551
    assert hashlittle([b"a", b"Four score and seven years ago"])[1] == 0x17770551


def test_read_matches_tagger_info(crfsuite_file):
    path, _, _ = crfsuite_file
    model = read_crfsuite(path)
    info = _tagger(path).info()
    assert model.labels == sorted(info.labels, key=lambda k: int(info.labels[k]))
    assert model.attributes == sorted(info.attributes, key=lambda k: int(info.attributes[k]))
    attr, label, weight = model.state_features
    ours = {(model.attributes[a], model.labels[b]): w for a, b, w in zip(attr.tolist(), label.tolist(), weight.tolist())}
    assert ours.keys() == info.state_features.keys()
    for key, w in info.state_features.items():  # the dump prints 6 decimals
        assert ours[key] == pytest.approx(w, abs=6e-7)
    L = len(model.labels)
    expected = np.zeros((L, L))
    for (a, b), w in info.transitions.items():
        expected[model.labels.index(a), model.labels.index(b)] = w
    np.testing.assert_allclose(model.transitions, expected, atol=6e-7)


def _check_same_as_tagger(crf: CRF, tagger, X, y) -> None:
    """Tags, p(y | x) of the gold and predicted labellings, and every marginal agree."""
    predicted = list(crf.predict(X))
    marginals = crf.predict_marginals(X)
    p_gold = crf.sequence_probability(X, y)
    for i, xseq in enumerate(X):
        tags = tagger.tag(xseq)
        assert predicted[i] == tags, f"sequence {i}"
        assert p_gold[i] == pytest.approx(tagger.probability(y[i]), abs=1e-9)
        assert crf.sequence_probability([xseq], [tags])[0] == pytest.approx(tagger.probability(tags), abs=1e-9)
        for t, row in enumerate(marginals[i]):
            for label, p in row.items():
                assert p == pytest.approx(tagger.marginal(label, t), abs=1e-9)


def test_crf_from_crfsuite_tags_like_crfsuite(crfsuite_file):
    path, X, y = crfsuite_file
    crf = CRF.from_crfsuite(read_crfsuite(path))
    assert not crf.start_weights_.any() and not crf.end_weights_.any()
    _check_same_as_tagger(crf, _tagger(path), X, y)


def test_written_file_opens_in_crfsuite_and_tags_identically(crfsuite_file, tmp_path):
    path, X, y = crfsuite_file
    model = read_crfsuite(path)
    written = tmp_path / "ours.crfsuite"
    write_crfsuite(written, crfsuite_from_crf(CRF.from_crfsuite(model)))
    again = read_crfsuite(written)
    assert again.labels == model.labels and again.attributes == model.attributes
    np.testing.assert_array_equal(again.transitions, model.transitions)
    for ours, theirs in zip(again.state_features, model.state_features):
        np.testing.assert_array_equal(ours, theirs)
    tagger = _tagger(written)
    assert tagger.info().state_features == _tagger(path).info().state_features
    _check_same_as_tagger(CRF.from_crfsuite(model), tagger, X, y)
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


def test_our_trained_model_written_for_crfsuite(tmp_path):
    train, test = _corpus(2, 60), _corpus(3, 25)
    X = [_dicts(w, p) for w, p, _ in train]
    crf = CRF(c2=0.1).fit(X, [y for _, _, y in train])
    with pytest.raises(ValueError, match="start/end"):
        crfsuite_from_crf(crf)
    crf.start_weights_[:] = 0.0  # what CRFsuite can hold: no start/end weights
    crf.end_weights_[:] = 0.0
    path = tmp_path / "ours.crfsuite"
    write_crfsuite(path, crfsuite_from_crf(crf))
    X_test = [_dicts(w, p) for w, p, _ in test]
    _check_same_as_tagger(crf, _tagger(path), X_test, [y for _, _, y in test])


def test_model_trained_without_boundary_weights_is_written_exactly(tmp_path):
    train, test = _corpus(5, 60), _corpus(6, 25)
    crf = CRF(c2=0.1, boundary_transitions=False).fit([_lists(w, p) for w, p, _ in train], [y for _, _, y in train])
    path = tmp_path / "ours.crfsuite"
    write_crfsuite(path, crfsuite_from_crf(crf))
    X_test = [_lists(w, p) for w, p, _ in test]
    _check_same_as_tagger(crf, _tagger(path), X_test, [y for _, _, y in test])


def test_crf_model_filename_reads_a_crfsuite_file(crfsuite_file):
    """sklearn-crfsuite's way: ``CRF(model_filename=...)`` on an existing file tags with it."""
    path, X, y = crfsuite_file
    _check_same_as_tagger(CRF(model_filename=str(path)), _tagger(path), X, y)


def test_every_attribute_name_is_found_through_the_hash_tables(tmp_path):
    """CRFsuite looks attribute strings up by lookup3 hash: keys of every length 1..40 (and
    non-ASCII ones) each select their own label."""
    names = ["x" * n for n in range(1, 41)] + ["ünïcödé-ключ", "名前=値", "a b\tc"]
    L = 3
    attr = np.arange(len(names))
    state = StateFeatures(attr, attr % L, np.full(len(names), 5.0))
    path = tmp_path / "hash.crfsuite"
    write_crfsuite(path, CRFsuiteModel(["A", "B", "C"], names, state, np.zeros((L, L))))
    tagger = _tagger(path)
    tags = [tagger.tag([[name]])[0] for name in names]
    assert tags == [["A", "B", "C"][i % L] for i in range(len(names))]


# --- damaged files ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory):
    train = _corpus(4, 20)
    path = tmp_path_factory.mktemp("damage") / "good.crfsuite"
    _train_crfsuite(path, [_lists(w, p) for w, p, _ in train], [y for _, _, y in train])
    return path.read_bytes()


def _damaged(tmp_path, data: bytes):
    path = tmp_path / "damaged.crfsuite"
    path.write_bytes(data)
    return path


def _offsets(data: bytes) -> dict[str, int]:
    names = ("features", "labels", "attrs", "labelrefs", "attrrefs")
    return dict(zip(names, struct.unpack_from("<5I", data, 28)))


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.3, 0.6, 0.99])
def test_truncated_file_raises_a_clear_error(good_bytes, tmp_path, fraction):
    path = _damaged(tmp_path, good_bytes[: int(len(good_bytes) * fraction)])
    with pytest.raises(CRFsuiteFormatError, match="damaged.crfsuite") as err:
        read_crfsuite(path)
    assert isinstance(err.value, ModelFileError)


def test_truncated_file_with_patched_size_is_still_caught(good_bytes, tmp_path):
    """Even if the header's size is fixed up, cut chunks are found by their own bounds."""
    offsets = _offsets(good_bytes)
    for cut in (offsets["attrs"] + 100, offsets["labelrefs"] + 8, offsets["attrrefs"] + 20, len(good_bytes) - 4):
        data = bytearray(good_bytes[:cut])
        struct.pack_into("<I", data, 4, cut)
        with pytest.raises(CRFsuiteFormatError, match="damaged.crfsuite"):
            read_crfsuite(_damaged(tmp_path, bytes(data)))


def test_wrong_magic_and_type(good_bytes, tmp_path):
    with pytest.raises(CRFsuiteFormatError, match="not a CRFsuite model"):
        read_crfsuite(_damaged(tmp_path, b"XCRF" + good_bytes[4:]))
    with pytest.raises(CRFsuiteFormatError, match="first-order"):
        read_crfsuite(_damaged(tmp_path, good_bytes[:8] + b"SOMC" + good_bytes[12:]))
    with pytest.raises(CRFsuiteFormatError, match="no such model file"):
        read_crfsuite(tmp_path / "missing.crfsuite")


@pytest.mark.parametrize("field", ["features", "labels", "attrs", "labelrefs", "attrrefs"])
@pytest.mark.parametrize("delta", [1, 4, 1 << 30])
def test_flipped_offset_raises_a_clear_error(good_bytes, tmp_path, field, delta):
    data = bytearray(good_bytes)
    index = ["features", "labels", "attrs", "labelrefs", "attrrefs"].index(field)
    struct.pack_into("<I", data, 28 + 4 * index, _offsets(good_bytes)[field] ^ delta)
    with pytest.raises(CRFsuiteFormatError, match="damaged.crfsuite"):
        read_crfsuite(_damaged(tmp_path, bytes(data)))


def test_damaged_feature_records_raise(good_bytes, tmp_path):
    start = _offsets(good_bytes)["features"] + 12
    for field, value in ((0, 7), (1, 10**6), (2, 10**6)):  # type, source, destination of feature 0
        data = bytearray(good_bytes)
        struct.pack_into("<I", data, start + 4 * field, value)
        with pytest.raises(CRFsuiteFormatError, match="damaged.crfsuite"):
            read_crfsuite(_damaged(tmp_path, bytes(data)))
    data = bytearray(good_bytes)
    struct.pack_into("<d", data, start + 12, float("nan"))
    with pytest.raises(CRFsuiteFormatError, match="not finite"):
        read_crfsuite(_damaged(tmp_path, bytes(data)))
    data = bytearray(good_bytes)  # a reference list pointing past the end of the file
    struct.pack_into("<I", data, _offsets(good_bytes)["attrrefs"] + 12, len(good_bytes) + 8)
    with pytest.raises(CRFsuiteFormatError, match="outside the file"):
        read_crfsuite(_damaged(tmp_path, bytes(data)))


def test_write_refuses_what_crfsuite_cannot_hold(tmp_path):
    state = StateFeatures(np.array([0]), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match="duplicate"):
        write_crfsuite(tmp_path / "m", CRFsuiteModel(["A", "A"], ["x"], state, np.zeros((2, 2))))
    with pytest.raises(ValueError, match="NUL"):
        write_crfsuite(tmp_path / "m", CRFsuiteModel(["A"], ["x\0y"], state, np.zeros((1, 1))))
    with pytest.raises(ValueError, match="out of range"):
        write_crfsuite(tmp_path / "m", CRFsuiteModel(["A"], ["x"], state._replace(label=np.array([3])), np.zeros((1, 1))))
    assert not list(tmp_path.iterdir())


# --- CoNLL-2000, both directions (slow) ------------------------------------------------

# the first 2,000 training sentences (of 8,936): 47,589 tokens and 119,512 attributes (the whole set: 335,624), a
# model of real attributes written and read both ways at a quarter of the training time; both sides tag every
# test sentence
TRAIN_SENTENCES = 2000


@pytest.fixture(scope="module")
def conll(request):
    """CoNLL-2000 with the CRFsuite chunking attributes: (extractor, train batch, train labels,
    test batch, test attribute lists, test labels)."""
    from crf import crfsuite_chunking_extractor, read_conll
    from crf.io import column

    data = request.getfixturevalue("shared_data")
    train = read_conll(data / "conll2000" / "train.txt.gz")[:TRAIN_SENTENCES]
    test = read_conll(data / "conll2000" / "test.txt.gz")
    extractor = crfsuite_chunking_extractor().fit(train)
    X_train, X_test = extractor.transform(train), extractor.transform(test)
    return extractor, X_train, column(train, 2), X_test, extractor.attribute_lists(X_test), column(test, 2)


@pytest.mark.slow
def test_conll2000_crfsuite_model_tagged_by_our_crf(conll, tmp_path):
    extractor, X_train, y_train, _, lists_test, y_test = conll
    path = tmp_path / "conll.crfsuite"
    _train_crfsuite(path, extractor.attribute_lists(X_train), y_train, c2=1.0, max_iterations=30)
    crf = CRF.from_crfsuite(read_crfsuite(path))
    tagger = _tagger(path)
    assert list(crf.predict(lists_test)) == [tagger.tag(xseq) for xseq in lists_test]
    _check_same_as_tagger(crf, tagger, lists_test[:100], y_test[:100])


@pytest.mark.slow
def test_conll2000_our_model_tagged_by_crfsuite(conll, tmp_path):
    """Our CRF trained with c2=1 without start/end weights (CRFsuite has none), written and
    tagged by python-crfsuite: the same tags as our own predictions on the whole test set."""
    extractor, X_train, y_train, X_test, lists_test, y_test = conll
    crf = CRF(c2=1.0, max_iterations=30, boundary_transitions=False)
    crf.fit(X_train, y_train, attribute_names=extractor.attribute_names())
    path = tmp_path / "ours.crfsuite"
    write_crfsuite(path, crfsuite_from_crf(crf))
    tagger = _tagger(path)
    assert list(crf.predict(X_test)) == [tagger.tag(xseq) for xseq in lists_test]
    _check_same_as_tagger(CRF.from_crfsuite(read_crfsuite(path)), tagger, lists_test[:100], y_test[:100])

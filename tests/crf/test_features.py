"""Feature extraction: templates, padding, token functions, lexicons, numbers, persistence."""

from __future__ import annotations

import numpy as np
import pytest

from crf.features import FeatureExtractor, crfsuite_chunking_extractor

SENTENCES = [
    [("He", "PRP", "B-NP"), ("reckons", "VBZ", "B-VP"), ("the", "DT", "B-NP")],
    [("New", "NNP", "B-NP"), ("York", "NNP", "I-NP")],
]


def _token_attributes(extractor, sentences):
    batch = extractor.transform(sentences)
    names = extractor.attribute_names()
    return [
        [sorted(names[batch.X.indices[batch.X.indptr[r] : batch.X.indptr[r + 1]]]) for r in range(a, b)]
        for a, b in zip(batch.offsets[:-1], batch.offsets[1:])
    ]


def test_crfsuite_chunking_names_and_no_padding():
    extractor = crfsuite_chunking_extractor().fit(SENTENCES)
    tokens = _token_attributes(extractor, SENTENCES)
    first = tokens[0][0]
    assert "w[0]=He" in first and "w[1]=reckons" in first and "w[0]|w[1]=He|reckons" in first
    assert "pos[0]|pos[1]|pos[2]=PRP|VBZ|DT" in first and "__BOS__" in first
    assert not any(name.startswith("w[-1]") for name in first)  # outside the sentence: dropped
    last = tokens[0][2]
    assert "__EOS__" in last and "pos[-2]|pos[-1]|pos[0]=PRP|VBZ|DT" in last
    assert len(tokens[1][0]) == len(["w[0]", "w[1]", "w[0]|w[1]", "pos[0]", "pos[1]", "pos[0]|pos[1]", "__BOS__"])


def test_padding_gives_bos_eos_values():
    extractor = FeatureExtractor(
        columns=["w", "pos", "chunk"], templates=["w[-1]", "w[1]|pos[0]"], bos_eos=False, padding=True
    ).fit(SENTENCES)
    tokens = _token_attributes(extractor, SENTENCES)
    assert tokens[1][0] == ["w[-1]=__BOS__", "w[1]|pos[0]=York|NNP"]
    assert tokens[1][1] == ["w[-1]=New", "w[1]|pos[0]=__EOS__|NNP"]


def test_unseen_attributes_are_ignored_and_min_count_drops():
    extractor = FeatureExtractor(columns=["w", "pos", "chunk"], templates=["w[0]", "pos[0]"], min_count=2, bos_eos=False).fit(
        SENTENCES
    )
    assert list(extractor.attribute_names()) == ["pos[0]=NNP"]  # the only value seen twice
    batch = extractor.transform([[("Unknown", "NNP", "O"), ("He", "XX", "O")]])
    assert batch.X.toarray().tolist() == [[1.0], [0.0]]


def test_token_functions_and_views():
    extractor = FeatureExtractor(
        columns=["w", "pos", "chunk"],
        templates=["low[0]", "shape[0]", "suf2[0]", "pre3[0]", "title[0]", "digit[0]", "hyphen[0]", "upper[0]"],
        views={
            "low": {"column": "w", "fn": "lower"},
            "shape": {"column": "w", "fn": "short_shape"},
            "suf2": {"column": "w", "fn": "suffix", "n": 2},
            "pre3": {"column": "w", "fn": "prefix", "n": 3},
            "title": {"column": "w", "fn": "is_title"},
            "digit": {"column": "w", "fn": "has_digit"},
            "hyphen": {"column": "w", "fn": "has_hyphen"},
            "upper": {"column": "w", "fn": "is_upper"},
        },
        bos_eos=False,
    )
    train = [[("Mid-2020", "NN", "O"), ("is", "VBZ", "O")]]
    extractor.fit(train)
    tokens = _token_attributes(extractor, [[("Mid-1999", "NN", "O"), ("IS", "VBZ", "O")]])
    assert tokens[0][0] == sorted(["shape[0]=Xx-d", "title[0]=1", "digit[0]=1", "hyphen[0]=1", "pre3[0]=Mid"])
    # "IS": lower form seen in training, is_upper never true in training -> not an attribute
    assert tokens[0][1] == ["low[0]=is"]


def test_lexicon_marks_longest_multi_token_match(tmp_path):
    lexicon = tmp_path / "places.txt"
    lexicon.write_text("new york\tLOC\nyork\tLOC\nnew york city\tLOC\nparis\n", encoding="utf-8")
    extractor = FeatureExtractor(
        columns=["w"],
        templates=["gaz[0]"],
        views={"gaz": {"column": "w", "fn": "lexicon", "path": str(lexicon), "lowercase": True}},
        bos_eos=False,
    )
    sentences = [[("In",), ("New",), ("York",), ("City",), ("and",), ("Paris",), ("York",)]]
    extractor.fit(sentences)
    tokens = _token_attributes(extractor, sentences)
    assert [t[0] if t else None for t in tokens[0]] == [
        None,
        "gaz[0]=B-LOC",
        "gaz[0]=I-LOC",
        "gaz[0]=I-LOC",
        None,
        "gaz[0]=B",
        "gaz[0]=B-LOC",
    ]


def test_numeric_columns_are_real_valued():
    extractor = FeatureExtractor(columns=["w", "score"], templates=["w[0]"], numeric=["score"], bos_eos=False)
    batch = extractor.fit_transform([[("a", "0.5"), ("b", "-2")]])
    names = list(extractor.attribute_names())
    col = names.index("score")
    np.testing.assert_allclose(batch.X.toarray()[:, col], [0.5, -2.0])
    with pytest.raises(ValueError, match="token 0 has the non-numeric value 'x'"):
        extractor.transform([[("a", "x")]])


def test_state_round_trip_gives_identical_batches(tmp_path):
    extractor = crfsuite_chunking_extractor().fit(SENTENCES)
    restored = FeatureExtractor.from_state(extractor.config(), extractor.state_arrays())
    a, b = extractor.transform(SENTENCES), restored.transform(SENTENCES)
    assert (a.X != b.X).nnz == 0
    np.testing.assert_array_equal(extractor.attribute_names(), restored.attribute_names())


def test_bad_configuration_is_reported():
    with pytest.raises(ValueError, match="unknown view 'x'"):
        FeatureExtractor(columns=["w"], templates=["x[0]"])
    with pytest.raises(ValueError, match="not of the form"):
        FeatureExtractor(columns=["w"], templates=["w(0)"])
    with pytest.raises(ValueError, match="unknown function 'nope'"):
        FeatureExtractor(columns=["w"], views={"v": {"column": "w", "fn": "nope"}})


def test_numeric_weights_sit_beside_template_and_bos_eos_attributes():
    extractor = FeatureExtractor(columns=["w", "score"], templates=["w[0]", "w[-1]"], numeric=["score"], bos_eos=True)
    batch = extractor.fit_transform([[("a", "0.5"), ("b", "0"), ("c", "-2")]])
    names = list(extractor.attribute_names())
    dense = batch.X.toarray()
    expected = [
        {"w[0]=a": 1, "score": 0.5, "__BOS__": 1},
        {"w[0]=b": 1, "w[-1]=a": 1},
        {"w[0]=c": 1, "w[-1]=b": 1, "score": -2.0, "__EOS__": 1},
    ]
    for row, want in zip(dense, expected):
        assert {names[c]: row[c] for c in np.flatnonzero(row)} == want
    assert batch.X.has_sorted_indices


def test_short_token_rows_are_reported():
    extractor = FeatureExtractor(columns=["w", "pos"], templates=["w[0]"]).fit(SENTENCES)
    with pytest.raises(ValueError, match=r"sentence 1, token 1: 1 columns, the extractor expects 2"):
        extractor.transform([[("a", "b")], [("c", "d"), ("e",)]])


@pytest.mark.parametrize("second", ["w[0]", " w[ 0 ] ", "w[0]|w[0]"])
def test_two_templates_reading_the_same_cells_are_refused_at_fit(second):
    """They would make every feature twice under two names, its evidence counted twice against the
    prior; a conjunction in another order reads the same cells too."""
    sentences = [[("a",), ("b",)]]
    with pytest.raises(ValueError, match=r"^templates 'w\[0\]' and .* read the same cells: keep one"):
        FeatureExtractor(columns=["w"], templates=["w[0]", "w[-1]", second]).fit(sentences)
    with pytest.raises(ValueError, match="read the same cells"):
        FeatureExtractor(columns=["w"], templates=["w[-1]|w[0]", "w[0]|w[-1]"]).fit(sentences)
    FeatureExtractor(columns=["w"], templates=["w[0]", "w[-1]", "w[-1]|w[0]", "w[0]|w[1]"]).fit(sentences)

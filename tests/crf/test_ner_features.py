"""The biomedical NER token functions of crf.features (greek, is_roman, is_formula, punct_pattern,
digit_norm, stem, digit_count): hand-checked values, and the views they make in an extractor."""

from __future__ import annotations

import numpy as np
import pytest

from crf.features import TOKEN_FUNCTIONS, FeatureExtractor, abbreviation_heads


def apply(fn: str, words: list[str], n: int = 0) -> list[str | None]:
    return [TOKEN_FUNCTIONS[fn](w, n) for w in words]


def test_greek_finds_letter_names_and_characters_as_words_or_word_parts():
    words = ["alpha", "TNF-alpha", "beta2", "IFN-Gamma", "\u03b1-synuclein", "Alphabet", "betamethasone", "kappaB", "ETA"]
    assert apply("greek", words) == ["alpha", "alpha", "beta", "gamma", "\u03b1", None, None, None, "eta"]


def test_is_roman_accepts_upper_case_numerals_only():
    yes = ["I", "II", "III", "IV", "V", "IX", "XII", "XIV", "XL", "XC", "CCCXCIX"]
    no = ["", "IIII", "VV", "IC", "ii", "MIX", "IL", "Iv", "VX", "DNA"]
    assert apply("is_roman", yes) == ["1"] * len(yes)
    assert apply("is_roman", no) == [None] * len(no)


def test_is_formula_marks_element_symbols_with_counts_or_charges():
    yes = ["H2O", "NaCl", "CaCO3", "Ca2+", "Cl-", "(NH4)2SO4", "CO2", "Fe3O4"]
    no = ["The", "Na", "CO", "DNA", "HIV", "water", "2", "H-2", "IL-2", "Aspirin"]
    assert apply("is_formula", yes) == ["1"] * len(yes)
    assert apply("is_formula", no) == [None] * len(no)


def test_punct_pattern_keeps_the_inner_marks_of_words_with_letters_or_digits():
    words = ["1,2-diol", "(+)-cocaine", "IL-12", "word", ",", "--", "5'-AMP"]
    assert apply("punct_pattern", words) == [",-", "(+)-", "-", None, None, None, "'-"]


def test_digit_norm_lowercases_and_collapses_digit_runs():
    assert apply("digit_norm", ["IL-12", "CD4+", "1,25-(OH)2D3", "Word"]) == ["il-0", "cd0+", "0,0-(oh)0d0", "word"]


def test_stem_strips_the_longest_listed_suffix_keeping_three_characters():
    words = ["tumours", "induced", "inducing", "toxicities", "patients", "therapies", "nephrotoxic", "as", "cells", "IL-12s"]
    assert apply("stem", words) == ["tumour", "induc", "induc", "toxic", "patient", "therapy", "nephrotox", "as", "cell", "il-0s"]
    # the stem of every inflection of one word is one value
    for forms in (["seizure", "seizures"], ["disease", "diseases"], ["induce", "induced", "inducing", "induces"]):
        assert len(set(apply("stem", forms))) == 1, forms


def test_digit_count_caps_at_n_and_is_absent_without_digits():
    assert apply("digit_count", ["abc", "a1", "12", "1,2,3,4,5"], n=4) == [None, "1", "2", "4"]
    assert apply("digit_count", ["1,2,3,4,5"], n=0) == ["5"]


@pytest.mark.parametrize("fn", ["greek", "is_roman", "is_formula", "punct_pattern", "digit_norm", "stem", "digit_count"])
def test_views_in_an_extractor_match_the_function_token_by_token(fn):
    words = ["TNF-alpha", "H2O", "II", "induced", "1,2-diol", "IL-12", "the", "H2O", "alpha"]
    sentences = [[(w, "O") for w in words[:4]], [(w, "O") for w in words[4:]]]
    views = {"v": {"column": "w", "fn": fn, "n": 3}}
    extractor = FeatureExtractor(columns=["w", "y"], templates=["v[0]"], views=views).fit(sentences)
    batch = extractor.transform(sentences)
    names = extractor.attribute_names()
    got = []
    for t in range(batch.X.shape[0]):
        row = [names[j] for j in batch.X.indices[batch.X.indptr[t] : batch.X.indptr[t + 1]] if names[j].startswith("v[0]=")]
        got.append(row[0].removeprefix("v[0]=") if row else None)
    assert got == apply(fn, words, n=3)
    assert np.all(np.diff(batch.offsets) == [4, 5])


def corpus_arrays(sentences: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    words = np.array([w for s in sentences for w in s], dtype=object)
    position = np.concatenate([np.arange(len(s)) for s in sentences])
    length = np.concatenate([np.full(len(s), len(s)) for s in sentences])
    return words, position, length


def test_abbreviation_heads_mark_the_definition_and_later_uses_within_the_window():
    sentences = [
        ["AF", "first", "."],  # a use before the definition: no head
        ["Atrial", "fibrillation", "(", "AF", ")", "and", "heart", "failure", "(", "HF", ")", "."],
        ["AF", "and", "HF", "and", "BP", "."],
        ["Stroke", "(", "5", ")", "in", "day", "(", "D1", ")", "x", "(", "AF", ")"],  # no capital / head "x" too short
    ]
    words, position, length = corpus_arrays(sentences)
    heads = abbreviation_heads(words, position, length, window=400)
    by_token = list(zip(words, heads))
    assert by_token[0] == ("AF", None)
    assert by_token[6] == ("AF", "fibrillation") and by_token[12] == ("HF", "failure")
    assert by_token[15:20] == [("AF", "fibrillation"), ("and", None), ("HF", "failure"), ("and", None), ("BP", None)]
    assert [h for w, h in by_token[21:]] == [None] * 7 + ["day", None, None, None, "fibrillation", None]
    # a use further than `window` tokens after the definition gets nothing
    assert abbreviation_heads(words, position, length, window=5)[15] is None
    # the suffix view through an extractor
    rows = [[(w, "O") for w in s] for s in sentences]
    views = {"a": {"column": "w", "fn": "abbreviation"}, "s": {"column": "w", "fn": "abbreviation_suffix"}}
    extractor = FeatureExtractor(columns=["w", "y"], templates=["a[0]", "s[0]"], views=views).fit(rows)
    names = set(extractor.attribute_names())
    assert {"a[0]=fibrillation", "a[0]=failure", "a[0]=day", "s[0]=tion", "s[0]=lure", "s[0]=day"} <= names


def test_abbreviation_heads_agree_with_a_loop_on_random_corpora():
    rng = np.random.default_rng(0)
    vocab = np.array(["(", ")", "AB", "CD", "Xy2", "alpha", "beta", "gamma", "of", "7"], dtype=object)
    for _ in range(30):
        sentences = [list(rng.choice(vocab, size=rng.integers(1, 9))) for _ in range(rng.integers(1, 12))]
        words, position, length = corpus_arrays(sentences)
        window = int(rng.integers(1, 30))
        expected = [None] * words.size
        last: dict[str, int] = {}
        for t in range(words.size):
            if 2 <= position[t] and position[t] + 1 < length[t] and words[t - 1] == "(" and words[t + 1] == ")":
                if words[t] in ("AB", "CD", "Xy2") and words[t - 2] in ("alpha", "beta", "gamma"):
                    last[words[t]] = t
            if words[t] in last and t - last[words[t]] <= window:
                expected[t] = words[last[words[t]] - 2]
        assert list(abbreviation_heads(words, position, length, window)) == expected


def test_bio_ner_extractor_round_trips_through_its_saved_state():
    from pathlib import Path

    from omegaconf import OmegaConf

    from pipeline.stages.featurize import build_extractor

    features = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/features/bio_ner.yaml"))
    sentences = [
        [("Atrial", "B-Disease"), ("fibrillation", "I-Disease"), ("(", "O"), ("AF", "B-Disease"), (")", "O"), ("after", "O")],
        [("H2O", "B-Chemical"), ("and", "O"), ("TNF-alpha", "O"), ("in", "O"), ("AF", "B-Disease"), (".", "O")],
    ]
    extractor = build_extractor(features, ["w", "ner"]).fit(sentences)
    again = FeatureExtractor.from_state(extractor.config(), extractor.state_arrays())
    first, second = extractor.transform(sentences), again.transform(sentences)
    assert (first.X != second.X).nnz == 0 and np.array_equal(first.offsets, second.offsets)
    names = set(extractor.attribute_names())
    assert {"abbr[0]=fibrillation", "formula[0]=1", "greek[0]=alpha", "stem[0]=fibrill"} <= names


def test_loose_abbreviation_heads_take_other_closers_and_skip_type_words():
    sentences = [
        ["The", "Schwartz", "-", "Jampel", "syndrome", "(", "SJS", ";", "myotonia", ")", "."],
        ["osteopetrosis", "type", "2", "(", "AO2", "/", "ADO2", ")", "and", "SJS", "or", "AO2", "."],
        ["disease", "type", "III", "(", "DT3", ")", "."],
    ]
    words, position, length = corpus_arrays(sentences)
    strict = abbreviation_heads(words, position, length)
    loose = abbreviation_heads(words, position, length, loose=True)
    assert [h for h in strict if h is not None] == ["iii"]  # only "( SF )", headed by the word before the "("
    by_token = dict(zip(range(words.size), loose))
    assert by_token[6] == "syndrome" and by_token[15] == "osteopetrosis"
    assert by_token[20] == "syndrome" and by_token[22] == "osteopetrosis"
    assert by_token[28] == "disease"  # "III" and "type" are skipped
    views = {"a": {"column": "w", "fn": "abbreviation_loose"}, "s": {"column": "w", "fn": "abbreviation_loose_suffix"}}
    rows = [[(w, "O") for w in s] for s in sentences]
    names = set(FeatureExtractor(columns=["w", "y"], templates=["a[0]", "s[0]"], views=views).fit(rows).attribute_names())
    assert {"a[0]=syndrome", "a[0]=osteopetrosis", "s[0]=rome", "s[0]=osis"} <= names


def test_loose_abbreviation_heads_agree_with_a_loop_on_random_corpora():
    rng = np.random.default_rng(1)
    vocab = np.array(["(", ")", ";", "/", "AB", "CD", "alpha", "beta", "type", "III", "of", "7"], dtype=object)
    heads_ok = ("alpha", "beta")  # of the vocabulary: head words that are not skipped
    for _ in range(40):
        sentences = [list(rng.choice(vocab, size=rng.integers(1, 10))) for _ in range(rng.integers(1, 12))]
        words, position, length = corpus_arrays(sentences)
        window = int(rng.integers(1, 30))
        expected = [None] * words.size
        last: dict[str, str] = {}
        at: dict[str, int] = {}
        for t in range(words.size):
            if 2 <= position[t] and position[t] + 1 < length[t] and words[t - 1] == "(" and words[t + 1] in (")", ";", ",", "/"):
                head = next((words[t - b] for b in (2, 3, 4) if position[t] >= b and words[t - b] in heads_ok), None)
                if words[t] in ("AB", "CD") and head is not None:
                    last[words[t]], at[words[t]] = head, t
            if words[t] in at and t - at[words[t]] <= window:
                expected[t] = last[words[t]]
        assert list(abbreviation_heads(words, position, length, window, loose=True)) == expected


def test_bio_ner_disease_is_bio_ner_with_wider_windows_and_loose_abbreviations():
    from pathlib import Path

    from omegaconf import OmegaConf

    from pipeline.stages.featurize import build_extractor

    conf = Path(__file__).resolve().parents[2] / "conf/features"
    base = OmegaConf.to_container(OmegaConf.load(conf / "bio_ner.yaml"))
    disease = OmegaConf.to_container(OmegaConf.load(conf / "bio_ner_disease.yaml"))
    assert set(base["templates"]) < set(disease["templates"])
    assert disease["views"]["abbr"]["fn"] == "abbreviation_loose" and base["views"]["abbr"]["fn"] == "abbreviation"
    sentences = [[("Schwartz", "B-Disease"), ("syndrome", "I-Disease"), ("(", "O"), ("SJS", "B-Disease"), (";", "O")]]
    names = set(build_extractor(disease, ["w", "ner"]).fit(sentences).attribute_names())
    assert {"abbr[0]=syndrome", "low[-3]=schwartz", "abbr[2]=syndrome"} <= names

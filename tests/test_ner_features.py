"""The biomedical NER token functions of crf.features (greek, is_roman, is_formula, punct_pattern,
digit_norm, stem, digit_count): hand-checked values, and the views they make in an extractor."""

from __future__ import annotations

import numpy as np
import pytest

from crf.features import TOKEN_FUNCTIONS, FeatureExtractor


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

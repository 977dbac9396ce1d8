"""The training-data lexicon of crf.features (``fn: mentions``): mention spans of IOB labels, the
lexicon they make, out-of-fold marks on the fitting data against a brute-force loop, the whole
lexicon on other data, labels never read when transforming, and the saved state."""

from __future__ import annotations

import numpy as np
import pytest

from crf.features import FeatureExtractor, abbreviation_heads, lexicon_marks, mention_lexicon, mention_spans, out_of_fold_marks

VIEW = {"lex": {"column": "w", "fn": "mentions", "label": "y", "n": 2, "lowercase": True}}


def flat(sentences):
    words = np.array([row[0] for s in sentences for row in s], dtype=object)
    labels = np.array([row[1] for s in sentences for row in s], dtype=object)
    lengths = np.array([len(s) for s in sentences])
    position = np.concatenate([np.arange(n) for n in lengths])
    return words, labels, position, np.repeat(lengths, lengths), lengths


def test_mention_spans_start_at_b_or_at_an_i_that_continues_nothing():
    labels = np.array(["B-A", "I-A", "I-B", "O", "I-A", "B-A", "I-A", "I-A"], dtype=object)
    position = np.array([0, 1, 2, 3, 0, 1, 0, 1])  # a sentence starts at 0, 4 and 6
    starts, ends, types = mention_spans(labels, position)
    assert starts.tolist() == [0, 2, 4, 5, 6]
    assert ends.tolist() == [2, 3, 5, 6, 8]
    assert types.tolist() == ["A", "B", "A", "A", "A"]


def test_mention_lexicon_keeps_each_entry_with_its_most_frequent_type():
    words = np.array(["flu", "flu", "x", "flu", "acute", "flu"], dtype=object)
    labels = np.array(["B-D", "B-C", "O", "B-D", "B-D", "I-D"], dtype=object)
    position = np.arange(6)
    assert mention_lexicon(words, labels, position) == {("flu",): "D", ("acute", "flu"): "D"}


def brute_out_of_fold(words, labels, position, length, lengths, folds):
    """Fold by fold: the lexicon of the mentions in the other sentences' blocks, matched on the block."""
    n = len(lengths)
    sentence_of_token = np.repeat(np.arange(n), lengths)
    out = np.full(words.size, None, dtype=object)
    for k in range(folds):
        in_fold = np.array([i * folds // n == k for i in range(n)])[sentence_of_token]
        entries: dict[tuple[str, ...], dict[str, int]] = {}
        t = 0
        while t < words.size:  # collect mentions outside the fold, token by token
            if not in_fold[t] and labels[t] != "O":
                kind, end = labels[t][2:], t + 1
                while end < words.size and position[end] > 0 and labels[end] == "I-" + kind:
                    end += 1
                counts = entries.setdefault(tuple(words[t:end]), {})
                counts[kind] = counts.get(kind, 0) + 1
                t = end
            else:
                t += 1
        lexicon = {e: max(c, key=c.get) for e, c in entries.items()}
        rows = np.flatnonzero(in_fold)
        if lexicon:
            out[rows] = lexicon_marks(words[rows], position[rows], length[rows], lexicon)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_out_of_fold_marks_agree_with_a_loop_on_random_corpora(seed):
    rng = np.random.default_rng(seed)
    vocabulary = np.array(["a", "b", "c", "d", "e"], dtype=object)
    sentences = []
    for _ in range(rng.integers(3, 12)):
        words = rng.choice(vocabulary, size=rng.integers(1, 7))
        labels, inside = [], False
        for _ in words:  # IOB2 with two types; an I- only after a B-/I- of its type
            choice = rng.integers(0, 3)
            if choice == 0:
                labels.append("O")
                inside = False
            elif choice == 1 or not inside:
                labels.append(str(rng.choice(["B-X", "B-Y"])))
                inside = True
            else:
                labels.append("I-" + labels[-1][2:])
        sentences.append(list(zip(words, labels)))
    words, labels, position, length, lengths = flat(sentences)
    for folds in (2, 3):
        got = out_of_fold_marks(words, labels, position, length, lengths, folds)
        assert got.tolist() == brute_out_of_fold(words, labels, position, length, lengths, folds).tolist()


TRAIN = [
    [("Atrial", "B-D"), ("fibrillation", "I-D"), ("is", "O")],
    [("fibrillation", "B-D"), ("and", "O"), ("Cancer", "B-D")],
    [("cancer", "B-D"), ("x", "O")],
    [("atrial", "B-D"), ("fibrillation", "I-D")],
]


def test_fitting_data_gets_out_of_fold_marks_and_other_data_the_whole_lexicon():
    extractor = FeatureExtractor(columns=["w", "y"], templates=["lex[0]"], views=VIEW, bos_eos=False)
    seen = extractor.attribute_lists(extractor.fit_transform(TRAIN))
    # two folds: sentences 0-1 against the mentions of 2-3, and back; the lone "fibrillation" of
    # sentence 1 is a mention nowhere else, so it goes unmarked on the training data
    b, i = ["lex[0]=B-D"], ["lex[0]=I-D"]
    assert seen == [[b, i, []], [[], [], b], [b, []], [b, i]]
    assert extractor.attribute_lists(extractor.transform([[("fibrillation", "O"), ("and", "O")]])) == [[["lex[0]=B-D"], []]]


def test_labels_are_not_read_when_transforming():
    extractor = FeatureExtractor(columns=["w", "y"], templates=["lex[0]", "w[0]"], views=VIEW).fit(TRAIN)
    text = [[("cancer", "O"), ("and", "O")], [("Atrial", "O"), ("fibrillation", "O")]]
    gold = [[("cancer", "B-D"), ("and", "O")], [("Atrial", "B-D"), ("fibrillation", "I-D")]]
    assert (extractor.transform(text).X != extractor.transform(gold).X).nnz == 0
    assert extractor.input_columns() == ["w"]


def test_mentions_lexicon_round_trips_through_the_saved_state():
    extractor = FeatureExtractor(
        columns=["w", "y"], templates=["lex[-1]|lex[0]", "lex[0]"], views=VIEW, padding=True, bos_eos=False
    ).fit(TRAIN)
    copy = FeatureExtractor.from_state(extractor.config(), extractor.state_arrays())
    other = [[("Atrial", "O"), ("fibrillation", "O"), ("or", "O"), ("cancer", "O")]]
    assert (copy.transform(other).X != extractor.transform(other).X).nnz == 0
    tokens = copy.attribute_lists(copy.transform(other))[0]
    assert tokens[0] == ["lex[-1]|lex[0]=__BOS__|B-D", "lex[0]=B-D"]
    assert tokens[1] == ["lex[-1]|lex[0]=B-D|I-D", "lex[0]=I-D"]
    assert tokens[3] == ["lex[0]=B-D"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"column": "w", "fn": "mentions"}, "needs a 'label' column"),
        ({"column": "w", "fn": "mentions", "label": "z"}, "needs a 'label' column"),
        ({"column": "w", "fn": "mentions", "label": "y", "n": 1}, "number of folds"),
    ],
)
def test_bad_mentions_views_are_refused_naming_the_view(spec, message):
    with pytest.raises(ValueError, match=message):
        FeatureExtractor(columns=["w", "y"], templates=["lex[0]"], views={"lex": spec})


def test_abbreviation_heads_carry_the_value_at_the_head_instead_of_the_word():
    words = np.array(["complement", "C7", "deficiency", "(", "C7D", ")", "and", "C7D", "again", "C7D"], dtype=object)
    position = np.arange(10)
    length = np.full(10, 10)
    plain = abbreviation_heads(words, position, length, loose=True)
    assert plain.tolist() == [None] * 4 + ["deficiency", None, None, "deficiency", None, "deficiency"]
    carry = np.array([None, None, "D", None, None, None, None, None, None, None], dtype=object)
    carried = abbreviation_heads(words, position, length, loose=True, carry=carry)
    assert carried.tolist() == [None] * 4 + ["D", None, None, "D", None, "D"]
    assert abbreviation_heads(words, position, length, loose=True, carry=np.full(10, None)).tolist() == [None] * 10


def test_abbreviation_mentions_carry_the_long_forms_lexicon_type_out_of_fold():
    train = [
        [("Complement", "B-D"), ("C7", "I-D"), ("deficiency", "I-D"), ("(", "O"), ("C7D", "B-D"), (")", "O")],
        [("C7D", "B-D"), ("is", "O")],
        [("C7", "B-D"), ("deficiency", "I-D"), ("x", "O")],
    ]
    view = {"a": {"column": "w", "fn": "abbreviation_mentions", "label": "y", "n": 2, "lowercase": True}}
    extractor = FeatureExtractor(columns=["w", "y"], templates=["a[0]"], views=view, bos_eos=False)
    # sentences 0-1 form one fold: "c7 deficiency" of sentence 2 marks the long form's last word there
    assert extractor.attribute_lists(extractor.fit_transform(train)) == [
        [[], [], [], [], ["a[0]=D"], []],
        [["a[0]=D"], []],
        [[], [], []],
    ]
    other = [[("A", "O"), ("deficiency", "O"), ("(", "O"), ("AD", "O"), (")", "O")], [("AD", "O")]]
    assert extractor.attribute_lists(extractor.transform(other)) == [[[], [], [], [], []], [[]]]


def test_bio_ner_disease_mentions_is_bio_ner_disease_with_the_training_lexicon():
    from pathlib import Path

    from omegaconf import OmegaConf

    from pipeline.stages.featurize import build_extractor

    conf = Path(__file__).resolve().parents[2] / "conf/features"
    base = OmegaConf.to_container(OmegaConf.load(conf / "bio_ner_disease.yaml"))
    lexicon = OmegaConf.to_container(OmegaConf.load(conf / "bio_ner_disease_mentions.yaml"))
    assert lexicon["templates"][: len(base["templates"])] == base["templates"]
    assert {k: v for k, v in lexicon["views"].items() if k not in ("lex", "alex")} == base["views"]
    assert {lexicon["views"]["lex"]["label"], lexicon["views"]["alex"]["label"]} == {"ner"}
    train = [
        [("Complement", "B-Disease"), ("C7", "I-Disease"), ("deficiency", "I-Disease")]
        + [("(", "O"), ("C7D", "B-Disease"), (")", "O")],
        [("C7", "B-Disease"), ("deficiency", "I-Disease")],
    ] * 3
    extractor = build_extractor(lexicon, ["w", "ner"]).fit(train)
    assert extractor.input_columns() == ["w"]
    names = set(extractor.attribute_names())
    assert {"lex[0]=B-Disease", "lex[-1]|lex[0]=B-Disease|I-Disease", "alex[0]=Disease"} <= names

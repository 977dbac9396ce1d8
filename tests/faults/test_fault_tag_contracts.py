"""The tag command's input contracts (issue 42, items 3 and 6), one test or more per category:

- plain text is split as the model's training tokens were made (the bundle records it; older
  bundles: known from their dataset name; else refused naming ``tokenize=``);
- CoNLL columns are named by a header or by the training data's column layout, never guessed, and
  gold labels come only from the label column;
- one token check for the tag command, ``ModelBundle.tag``/``tag_frame`` and the MLflow Model;
- a JSONL key given twice, a dangling symbolic link as output, an HMM chunker on its own dataset's
  CoNLL file, a missing data file without a download URL.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from pathlib import Path

import forkserver
import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import compose_config, make_sentence, seed_store, tiny_overrides, write_corpus

from crf import HMM, ModelBundle, load_bundle
from crf.bundle import TokenError, check_tokens
from crf.hmm import BundledHMM
from crf.io import DataFormatError, atomic_write, read_conll
from pipeline.apps.formats import tokenize
from pipeline.apps.tag import TagError, run_tag
from pipeline.engine.validate import SettingsError
from pipeline.stages.data import MissingDataError, resolve_files, tokenisation
from pipeline.tracking import mlflow_model

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ["w", "pos", "chunk"]


def _corpus(n: int, seed: int) -> list[list[tuple[str, str, str]]]:
    rng = np.random.default_rng(seed)
    return [make_sentence(rng) for _ in range(n)]


def _settings(model, source, target, **extra) -> dict:
    return {"models": str(model), "input": str(source), "output": str(target), "format": "auto", "conllu_pos": "xpos",
            "output_format": "auto", "marginals": False, "column_aliases": {"xpos": "pos"}, **extra}  # fmt: skip


def _save(bundle: ModelBundle, path: Path) -> Path:
    bundle.save(path)
    return path


@pytest.fixture(scope="module")
def train():
    return _corpus(40, 0)


@pytest.fixture(scope="module")
def chunker(train, tmp_path_factory) -> Path:
    """An HMM chunker over the POS column, with its training data's layout, as the pipeline records it."""
    model = HMM(order=1).fit([[r[1] for r in s] for s in train], [[r[2] for r in s] for s in train])
    source = {"dataset": {"name": "toy", "columns": LAYOUT, "label": "chunk", "scheme": "IOB2", "tokenisation": "punct"}}
    return _save(ModelBundle(BundledHMM(model, "pos"), scheme="iob2", source=source), tmp_path_factory.mktemp("b") / "hmm.npz")


@pytest.fixture(scope="module")
def word_tagger(train):
    """A word -> chunk HMM; its bundles differ only in what their source records."""
    model = HMM(order=1).fit([[r[0] for r in s] for s in train], [[r[2] for r in s] for s in train])

    def make(path: Path, dataset: dict) -> Path:
        return _save(ModelBundle(BundledHMM(model, "w"), scheme="iob2", source={"dataset": dataset}), path)

    return make


def _write_conll(path: Path, sentences, header: str | None = None) -> Path:
    text = "\n\n".join("\n".join(" ".join(row) for row in s) for s in sentences) + "\n"
    path.write_text((header + "\n" if header else "") + text)
    return path


# ---- (a) plain text is split as the training tokens were made --------------------------------------------------------

REFERENCE = "Trinkoff, A. M. (2010). Work schedules, nurses' health. Nursing Outlook, 58(2), 1-10."


def _tokens_written(target: Path) -> list[list[str]]:
    return [json.loads(line)["tokens"] for line in target.read_text().splitlines()]


@pytest.mark.parametrize(
    "dataset, expected",
    [
        ({"name": "mine", "label": "chunk", "tokenisation": "whitespace"}, "whitespace"),  # recorded
        ({"name": "anystyle", "label": "field"}, "whitespace"),  # an older bundle: known from its dataset
        ({"name": "mine", "label": "chunk", "tokenisation": "punct"}, "punct"),
        ({"name": "conll2000", "label": "chunk"}, "punct"),
    ],
)
def test_text_is_split_as_the_model_was_trained(word_tagger, tmp_path, dataset, expected):
    bundle = word_tagger(tmp_path / "b.npz", dataset)
    text = tmp_path / "refs.txt"
    text.write_text(REFERENCE + "\n")
    summary = run_tag(_settings(bundle, text, tmp_path / "out.jsonl", format="text"))
    tokens = REFERENCE.split() if expected == "whitespace" else tokenize(REFERENCE)
    assert _tokens_written(tmp_path / "out.jsonl") == [tokens] and summary["tokens"] == len(tokens)
    assert ("Trinkoff," in tokens) == (expected == "whitespace")


@pytest.mark.parametrize("end", ["\r", "\r\n", "\u2028", "\u2029", "\x85"])
def test_plain_text_lines_end_at_any_line_end(word_tagger, tmp_path, end):
    """A file with CR line ends (or Unicode line separators) was read as one sentence (K6)."""
    bundle = word_tagger(tmp_path / "b.npz", {"name": "mine", "label": "chunk", "tokenisation": "whitespace"})
    text = tmp_path / "lines.txt"
    text.write_bytes(end.join(["He saw it", "", "The dog ran", "It is"]).encode() + end.encode())
    summary = run_tag(_settings(bundle, text, tmp_path / "out.jsonl", format="text"))
    assert _tokens_written(tmp_path / "out.jsonl") == [["He", "saw", "it"], ["The", "dog", "ran"], ["It", "is"]]
    assert summary["tokens"] == 8


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("Mr. Smith of AT&T Corp. said the 30-year bonds rose 3.5% to $1,000 in Sept. at 10 a.m. today.",
         "Mr. Smith of AT&T Corp. said the 30-year bonds rose 3.5 % to $ 1,000 in Sept. at 10 a.m. today ."),
        ("I don't think it's Dr. Jones's car, etc. and so on... Really?!",
         "I do n't think it 's Dr. Jones 's car , etc. and so on ... Really ?!"),
        ("J. P. Morgan & Co. Inc. rose in the U.S. and the S&P fell.",
         "J. P. Morgan & Co. Inc. rose in the U.S. and the S&P fell ."),
        ("They can't, we're sure, sell Calif.-based U.S.-made 1/2 shares for US$5 in the '80s.",
         "They ca n't , we 're sure , sell Calif.-based U.S.-made 1/2 shares for US$ 5 in the '80s ."),
        ("Mail carol.st.clair@enron.com or call 713-853-3989 :)", "Mail carol.st.clair@enron.com or call 713-853-3989 :)"),
        ("It was sold to Acme Corp.", "It was sold to Acme Corp ."),  # a period at the end of the line is split off
        ("(D., Okla.) said so. Then he left.", "( D. , Okla. ) said so . Then he left ."),
    ],
)  # fmt: skip
def test_punct_tokens_are_made_as_the_training_tokens_were(text, tokens):
    """Penn Treebank style as in CoNLL-2000 and EWT: abbreviations keep their period, ``&`` names,
    hyphenated words and numbers stay whole, clitics are split (the tokens were split unlike any
    training token before: Mr . / AT & T / 30 - year)."""
    assert tokenize(text) == tokens.split()
    assert tokenize(tokens) == tokens.split()  # training tokens joined by spaces come back unchanged


def test_a_model_that_does_not_record_its_tokenisation_needs_the_setting(word_tagger, tmp_path):
    bundle = word_tagger(tmp_path / "b.npz", {"name": "mine", "label": "chunk"})
    text = tmp_path / "refs.txt"
    text.write_text(REFERENCE + "\n")
    with pytest.raises(TagError, match=r"does not record how its training text was tokenised: set tokenize=whitespace"):
        run_tag(_settings(bundle, text, tmp_path / "out.jsonl", format="text"))
    assert not (tmp_path / "out.jsonl").exists()
    run_tag(_settings(bundle, text, tmp_path / "out.jsonl", format="text", tokenize="whitespace"))
    assert _tokens_written(tmp_path / "out.jsonl") == [REFERENCE.split()]


def test_a_tokenisation_the_model_never_saw_is_refused(word_tagger, tmp_path):
    bundle = word_tagger(tmp_path / "b.npz", {"name": "anystyle", "label": "field"})
    text = tmp_path / "refs.txt"
    text.write_text(REFERENCE + "\n")
    with pytest.raises(TagError, match=r"tokenize=punct: .* trained on whitespace tokens.*set tokenize=whitespace"):
        run_tag(_settings(bundle, text, tmp_path / "out.jsonl", format="text", tokenize="punct"))
    with pytest.raises(TagError, match=r"tokenize='nltk'; one of auto, whitespace, punct"):
        run_tag(_settings(bundle, text, tmp_path / "out.jsonl", format="text", tokenize="nltk"))
    words = tmp_path / "words.conll"
    words.write_text("Trinkoff,\n\n")
    with pytest.raises(TagError, match=r"tokenize='nltk'"):  # a bad setting is refused whatever the format
        run_tag(_settings(bundle, words, tmp_path / "out.jsonl", tokenize="nltk"))
    assert not (tmp_path / "out.jsonl").exists()


def test_datasets_say_how_their_tokens_were_made():
    assert tokenisation({"name": "anystyle", "format": "xml_sequences"}) == "whitespace"
    assert tokenisation({"name": "conll2000", "format": "conll"}) == "punct"
    assert tokenisation({"name": "ewt", "format": "conllu"}) == "punct"
    assert tokenisation({"name": "x", "format": "conll", "tokenisation": "whitespace"}) == "whitespace"
    with pytest.raises(SettingsError, match="tokenisation='spacy'"):
        tokenisation({"name": "x", "format": "conll", "tokenisation": "spacy"})


# ---- (b) CoNLL columns by name, gold only from the label column -----------------------------------------------------


def test_a_words_and_pos_file_is_read_by_the_training_layout_and_not_scored(chunker, tmp_path):
    sentences = _corpus(8, 3)
    source = _write_conll(tmp_path / "in.conll", [[(w, p) for w, p, _ in s] for s in sentences])
    summary = run_tag(_settings(chunker, source, tmp_path / "out.conll"))
    assert "accuracy" not in summary  # the POS column is not the label: never scored against
    rows = read_conll(tmp_path / "out.conll")
    expected = load_bundle(chunker).tag([[p for _, p, _ in s] for s in sentences])
    assert [[r[2] for r in s] for s in rows] == [o["labels"] for o in expected]  # read as w, pos: the POS observed
    assert [[r[:2] for r in s] for s in rows] == [[(w, p) for w, p, _ in s] for s in sentences]


def test_a_file_whose_columns_are_in_another_order_is_not_scored_against_a_wrong_column(chunker, tmp_path):
    sentences = _corpus(8, 5)
    source = _write_conll(tmp_path / "in.conll", [[(p, c, w) for w, p, c in s] for s in sentences])  # pos chunk w
    with pytest.raises(TagError, match=r"the column read as .* holds \d+% .* the model .*global.columns"):
        run_tag(_settings(chunker, source, tmp_path / "out.conll"))
    assert not (tmp_path / "out.conll").exists()
    named = _write_conll(
        tmp_path / "named.conll", [[(p, c, w) for w, p, c in s] for s in sentences], "# global.columns = pos chunk w"
    )
    assert run_tag(_settings(chunker, named, tmp_path / "out.conll"))["accuracy"] > 50  # named: read and scored right


def test_a_file_with_a_header_is_read_by_its_names(word_tagger, tmp_path):
    bundle = word_tagger(tmp_path / "b.npz", {"label": "chunk"})  # no layout recorded
    sentences = _corpus(6, 4)
    reordered = [[(c, w) for w, _, c in s] for s in sentences]
    plain = _write_conll(tmp_path / "plain.conll", reordered)
    with pytest.raises(DataFormatError, match=r"does not record its training data's column layout: .*# global.columns ="):
        run_tag(_settings(bundle, plain, tmp_path / "out.conll"))
    named = _write_conll(tmp_path / "named.conll", reordered, "# global.columns = chunk w")
    summary = run_tag(_settings(bundle, named, tmp_path / "out.conll"))
    rows = [r for s in read_conll(tmp_path / "out.conll") for r in s]  # w gold predicted
    assert [r[0] for r in rows] == [w for s in sentences for w, _, _ in s]
    assert summary["accuracy"] == pytest.approx(100.0 * sum(r[1] == r[2] for r in rows) / len(rows))
    with pytest.raises(DataFormatError, match=r"the header names 3 columns"):
        run_tag(
            _settings(
                bundle, _write_conll(tmp_path / "bad.conll", reordered, "# global.columns = chunk w pos"), tmp_path / "o.conll"
            )
        )


def test_columns_a_layout_cannot_name_are_refused(chunker, tmp_path):
    sentences = _corpus(3, 5)
    wide = _write_conll(tmp_path / "wide.conll", [[(w, p, c, "x") for w, p, c in s] for s in sentences])
    with pytest.raises(DataFormatError, match=r"4 columns, but the model's training data has 3"):
        run_tag(_settings(chunker, wide, tmp_path / "out.conll"))
    words = _write_conll(tmp_path / "words.conll", [[(w,) for w, _, _ in s] for s in sentences])
    with pytest.raises(DataFormatError, match=r"read as \['w'\] .* needs the columns \['pos'\]"):
        run_tag(_settings(chunker, words, tmp_path / "out.conll"))
    assert not (tmp_path / "out.conll").exists()


def test_bare_words_are_never_read_as_another_column(chunker, word_tagger, tmp_path):
    """Plain text, JSONL strings and a one-column CoNLL file give words (``w``): refused for a
    model that reads POS tags, accepted for one that reads words whatever its training layout."""
    words = [["the", "dog", "runs", "."]]
    text = tmp_path / "in.txt"
    text.write_text("the dog runs .\n")
    with pytest.raises(ValueError, match=r"plain text gives words only \(column 'w'\), but the model needs .*\['pos'\]"):
        run_tag(_settings(chunker, text, tmp_path / "out.jsonl", format="text"))
    strings = tmp_path / "in.jsonl"
    strings.write_text(json.dumps({"tokens": words[0]}) + "\n")
    with pytest.raises(DataFormatError, match=r"in.jsonl:1: tokens given as strings are words .*\['pos'\]"):
        run_tag(_settings(chunker, strings, tmp_path / "out.jsonl"))
    one = _write_conll(tmp_path / "in.conll", [[(w,) for w in words[0]]])
    with pytest.raises(DataFormatError, match=r"read as \['w'\]"):
        run_tag(_settings(chunker, one, tmp_path / "out.jsonl"))
    assert not (tmp_path / "out.jsonl").exists()
    ud = word_tagger(
        tmp_path / "ud.npz", {"name": "ud", "columns": ["id", "w", "upos"], "label": "upos", "tokenisation": "punct"}
    )
    for source in (text, strings, one):
        assert run_tag(_settings(ud, source, tmp_path / "out.jsonl", format="text" if source == text else "auto"))["tokens"] == 4
    # two columns for a CoNLL-U-shaped layout: read as (id, w), which the words column is not
    two = _write_conll(tmp_path / "two.conll", [[(w, "X") for w in words[0]]])
    with pytest.raises(DataFormatError, match=r"the column 'id' holds 'the' \(token 1 of the file\): give CoNLL-U"):
        run_tag(_settings(ud, two, tmp_path / "two.jsonl"))
    numbered = _write_conll(tmp_path / "numbered.conll", [[(str(i), w) for i, w in enumerate(words[0], start=1)]])
    assert run_tag(_settings(ud, numbered, tmp_path / "two.jsonl"))["tokens"] == 4


UD = ["id", "w", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc"]  # a CoNLL-U dataset's layout
MWT = """# sent_id = 1
1-2\tdidn't\t_\t_\t_\t_\t_\t_\t_\t_
1\tdid\tdo\tAUX\tVBD\t_\t0\troot\t_\t_
2\tn't\tnot\tPART\tRB\t_\t1\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\t_\t1\txcomp\t_\t_
3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t1:conj\t_
4\t.\t.\tPUNCT\t.\t_\t1\tpunct\t_\t_

1\tToday\ttoday\tNOUN\tNN\t_\t0\troot\t_\t_
2-3\tit's\t_\t_\t_\t_\t_\t_\t_\t_
2\tit\tit\tPRON\tPRP\t_\t1\tnsubj\t_\t_
3\t's\tbe\tAUX\tVBZ\t_\t1\tcop\t_\t_
"""


@pytest.mark.parametrize("comments", [False, True])
def test_conllu_lines_in_a_conll_file_are_read_as_in_training(tmp_path, comments):
    """Multiword-token ranges (``1-2``) and empty nodes (``3.1``) are skipped, as the CoNLL-U reader
    skips them in training; they were read as extra tokens scored against a gold ``_``."""
    words = [["did", "n't", "go", "."], ["Today", "it", "'s"]]
    tags = [["VBD", "RB", "VB", "."], ["NN", "PRP", "VBZ"]]
    model = HMM(order=1).fit(words, tags)
    source = {"dataset": {"name": "ud", "columns": UD, "label": "xpos", "scheme": "none", "tokenisation": "punct"}}
    bundle = _save(ModelBundle(BundledHMM(model, "w"), scheme="none", source=source), tmp_path / "b.npz")
    conllu, conll = tmp_path / "in.conllu", tmp_path / "in.conll"
    conllu.write_text(MWT)
    conll.write_text(MWT if comments else "".join(line + "\n" for line in MWT.splitlines() if not line.startswith("#")))
    extra = {"comment_prefix": "#"} if comments else {}
    reference = run_tag(_settings(bundle, conllu, tmp_path / "a.jsonl"))
    summary = run_tag(_settings(bundle, conll, tmp_path / "b.jsonl", **extra))
    for target in ("a.jsonl", "b.jsonl"):
        assert [[t if isinstance(t, str) else t["w"] for t in s] for s in _tokens_written(tmp_path / target)] == words
    assert summary["tokens"] == reference["tokens"] == 7 and summary["accuracy"] == reference["accuracy"]


# ---- (c) one token check for the command, the bundle and the MLflow Model ------------------------------------------

BAD_TOKENS = {
    "none": None, "nan": math.nan, "empty": "", "int": 5, "space": "a b", "tab": "a\tb", "list": ["x"], "surrogate": "re\ud800ad",
    "byte-order mark": "\ufeffthe",  # a CoNLL file starting with it would not read back as written (K16)
}  # fmt: skip


def test_check_tokens_names_sentence_token_and_column():
    good = np.array(["a", "b", "c", "d"], dtype=object)
    check_tokens({"w": good}, np.array([0, 2, 4]))
    for value in BAD_TOKENS.values():
        bad = good.copy()
        bad[3] = value
        with pytest.raises(TokenError, match=r"^sentence 1, token 1, column 'pos': a token must") as info:
            check_tokens({"w": good, "pos": bad}, np.array([0, 2, 4]))
        assert (info.value.index, info.value.column) == (3, "pos")
        with pytest.raises(TokenError, match=r"^sentence 2, token 2, column 'pos'"):
            check_tokens({"pos": bad}, np.array([0, 2, 4]), base=1)


@pytest.mark.parametrize("name", list(BAD_TOKENS))
def test_bad_tokens_are_refused_alike_everywhere(chunker, tmp_path, name):
    value = BAD_TOKENS[name]
    bundle = load_bundle(chunker)
    sentences = [["DT", "NN", "."], ["DT", "NN", "VB", "."]]
    sentences[1][2] = value
    with pytest.raises(TokenError, match=r"sentence 1, token 2, column 'pos': a token must"):
        bundle.tag(sentences)
    with pytest.raises(TokenError, match=r"sentence 1, token 2, column 'pos': a token must"):
        bundle.tag([[{"pos": t} for t in s] for s in sentences])
    frame = pd.DataFrame({"sentence": [0, 0, 0, 1, 1, 1, 1], "pos": pd.Series([t for s in sentences for t in s], dtype=object)})
    with pytest.raises(TokenError, match=r"sentence 1, token 2, column 'pos': a token must"):
        bundle.tag_frame(frame)
    with pytest.raises(mlflow_model.ModelInputError, match=r"row 5 \(sentence 1\), column 'pos': a token must.*token 2"):
        mlflow_model.tag(bundle, frame)
    # the served model's other inputs: a list of sentences of token dicts, token records, a dict of
    # columns (a lone surrogate was a 500 from pandas' text column before the check; M1)
    records = frame.to_dict("records")
    columns = {"sentence": frame["sentence"].tolist(), "pos": frame["pos"].tolist()}
    for request in ([[{"pos": t} for t in s] for s in sentences], records, columns):
        with pytest.raises(mlflow_model.ModelInputError, match=r"row 5 \(sentence 1\), column 'pos': a token must.*token 2"):
            mlflow_model.tag(bundle, request)
    if name in ("space", "tab"):  # the only bad tokens JSON and the JSONL reader let through
        source = tmp_path / "in.jsonl"
        source.write_text("".join(json.dumps({"tokens": [{"pos": t} for t in s]}) + "\n" for s in sentences))
        with pytest.raises(TagError, match=r"sentence 2, token 3, column 'pos': a token must not hold whitespace"):
            run_tag(_settings(chunker, source, tmp_path / "out.jsonl"))
        assert not (tmp_path / "out.jsonl").exists()


def test_numbers_in_a_frame_are_refused_not_read_as_text(chunker):
    with pytest.raises(TokenError, match=r"sentence 0, token 0, column 'pos': .* got int 5"):
        load_bundle(chunker).tag_frame(pd.DataFrame({"sentence": [0, 0], "pos": [5, 6]}))


def test_a_served_answer_echoes_a_missing_value_in_an_unread_column_as_null(chunker):
    """A request's extra column is echoed back; its missing values must be JSON null, never NaN."""
    frame = pd.DataFrame({"sentence": [0, 0, 0], "pos": ["DT", "NN", "."], "chunk": ["B-NP", None, np.nan]})
    answer = mlflow_model.tag(load_bundle(chunker), frame)
    assert answer["chunk"].tolist() == ["B-NP", None, None]
    json.loads(answer.to_json(orient="records"), parse_constant=lambda name: pytest.fail(f"not strict JSON: {name}"))


@pytest.mark.parametrize(
    "sentences, match",
    [
        ("DT", r"sentences must be a list of sentences.*got str 'DT'"),  # tag("DT"): two one-character sentences before
        (["NNP"], r"sentence 0 must be a list of tokens, got str 'NNP'"),  # N, N, P before
        ([["DT", "NN"], "NNP"], r"sentence 1 must be a list of tokens, got str"),
        ([{"pos": "DT"}], r"sentence 0 must be a list of tokens, got one token dict"),  # its key 'pos' tagged before
        ({"pos": "DT"}, r"sentences must be a list of sentences"),
        ([{"DT", "NN"}], r"sentence 0 must be a list of tokens, got set"),  # tokens in hash order before
        ([frozenset({"DT"})], r"sentence 0 must be a list of tokens, got frozenset"),
        ({("DT", "NN")}, r"sentences must be a list of sentences.*got set"),
    ],
)
def test_a_sentence_given_as_a_string_or_one_token_dict_is_refused(chunker, sentences, match):
    bundle = load_bundle(chunker)
    with pytest.raises(ValueError, match=match):
        bundle.tag(sentences)
    if isinstance(sentences, list) and any(isinstance(s, list) for s in sentences):  # the served model's list of sentences
        tokens = [[{"pos": t} for t in s] if isinstance(s, list) else s for s in sentences]
        with pytest.raises(mlflow_model.ModelInputError, match=r"sentence 1 must be a list of tokens"):
            mlflow_model.tag(bundle, tokens)
    assert [len(r["labels"]) for r in bundle.tag([("DT", "NN"), ["DT"]])] == [2, 1]  # tuples and lists are sentences


@pytest.mark.parametrize("position", [1.7, 1.0, "1", True, np.float64(1.0), -1, 3])
def test_fixed_positions_must_be_integers_in_range(chunker, position):
    bundle = load_bundle(chunker)
    label = bundle.tag([["DT", "NN", "."]])[0]["labels"][1]  # a label the token can take
    with pytest.raises(ValueError, match=r"fixed: sentence 0(: a token position must be an integer| has no token)"):
        bundle.tag([["DT", "NN", "."]], fixed=[{position: label}])
    for good in (1, np.int64(1)):
        assert bundle.tag([["DT", "NN", "."]], fixed=[{good: label}])[0]["labels"][1] == label
    other = next(c for c in bundle.labels if c != label)
    mask = bundle._allowed([{np.int64(1): other}], np.array([0, 3]))
    assert mask[[0, 2]].all() and mask[1].tolist() == [c == other for c in bundle.labels]  # token 1, not a rounded or truthy 1


@pytest.mark.parametrize("fixed", [{0: "B-NP"}, "B-NP", [{1}], [[(1, "B-NP")]], 5])
def test_fixed_must_be_a_list_of_one_dict_per_sentence(chunker, fixed):
    # a dict for the list was read as its keys: sentence 0 got the "constraint" 0, and the label was silently not fixed (G3)
    bundle = load_bundle(chunker)
    with pytest.raises(ValueError, match=r"^fixed(: sentence 0: a dict of \{token position: label\}| must be a list)"):
        bundle.tag([["DT", "NN", "."]], fixed=fixed)
    label = bundle.labels[0]
    assert bundle.tag([["DT", "NN", "."]], fixed=({0: label},))[0]["labels"][0] == label  # a tuple is a list
    assert bundle.tag([["DT", "NN", "."]], fixed=[None])[0]["labels"] == bundle.tag([["DT", "NN", "."]])[0]["labels"]


def test_a_column_that_appears_twice_is_refused_with_the_served_models_message(chunker):
    bundle = load_bundle(chunker)
    frame = pd.DataFrame([[0, "DT", "DT"], [0, "NN", "NN"]], columns=["sentence", "pos", "pos"])
    with pytest.raises(ValueError, match=r"^the column\(s\) \['pos'\] appear more than once$"):
        bundle.tag_frame(frame)
    with pytest.raises(mlflow_model.ModelInputError, match=r"^the column\(s\) \['pos'\] appear more than once$"):
        mlflow_model.tag(bundle, frame)


class _NoCredentials(Exception):
    """What an S3 client raises without credentials (botocore's NoCredentialsError is no OSError)."""


@pytest.mark.parametrize("error", [_NoCredentials("Unable to locate credentials"), ImportError("no module google.cloud")])
def test_a_model_uri_the_command_cannot_reach_is_one_line(chunker, tmp_path, monkeypatch, error):
    """Whatever a store's client raises becomes the command's TagError (one line, exit 2 in ``main``)."""
    import mlflow

    def unreachable(artifact_uri, **kwargs):
        raise error

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", unreachable)
    words = tmp_path / "in.conll"
    words.write_text("DT\nNN\n")
    with pytest.raises(
        TagError, match=rf"^model 's3://bucket/x': cannot download its artifacts \({type(error).__name__}: "
    ) as info:
        run_tag(_settings("s3://bucket/x", words, tmp_path / "out.jsonl"))
    assert "\n" not in str(info.value) and not (tmp_path / "out.jsonl").exists()


def test_a_model_uri_of_an_unknown_scheme_is_one_line(tmp_path):
    words = tmp_path / "in.conll"
    words.write_text("DT\nNN\n")
    with pytest.raises(TagError, match=r"^model 'nosuch://x/y': cannot download its artifacts") as info:
        run_tag(_settings("nosuch://x/y", words, tmp_path / "out.jsonl"))
    assert "\n" not in str(info.value)


# ---- item 6 --------------------------------------------------------------------------------------------------------


def test_a_jsonl_key_given_twice_is_refused(chunker, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"tokens": [{"pos": "DT"}]}\n{"tokens": [{"pos": "DT"}], "tokens": [{"pos": "NN"}]}\n')
    with pytest.raises(DataFormatError, match=r"in.jsonl:2: the key 'tokens' appears more than once"):
        run_tag(_settings(chunker, source, tmp_path / "out.jsonl"))
    source.write_text('{"tokens": [{"pos": "DT", "pos": "NN"}]}\n')
    with pytest.raises(DataFormatError, match=r"in.jsonl:1: the key 'pos' appears more than once"):
        run_tag(_settings(chunker, source, tmp_path / "out.jsonl"))
    assert not (tmp_path / "out.jsonl").exists()


def test_a_jsonl_line_python_cannot_decode_is_named_or_read(chunker, tmp_path):
    source = tmp_path / "in.jsonl"
    # nesting deeper than the decoder recurses: one line naming the file and line, not a RecursionError
    source.write_text('{"tokens": [{"pos": "DT"}]}\n{"tokens": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    with pytest.raises(DataFormatError, match=r"in.jsonl:2: not valid JSON here \(arrays or objects nested too deeply\)"):
        run_tag(_settings(chunker, source, tmp_path / "out.jsonl"))
    # an integer of more digits than Python converts, in a key the reader does not use: read
    source.write_text('{"tokens": [{"pos": "DT"}, {"pos": "NN"}], "n": ' + "9" * 5000 + "}\n")
    assert run_tag(_settings(chunker, source, tmp_path / "out.jsonl"))["tokens"] == 2
    # as a token's value it is no string: refused with its position, as any number is
    source.write_text('{"tokens": [{"pos": ' + "9" * 5000 + "}]}\n")
    with pytest.raises(DataFormatError, match=r"in.jsonl:1: token 1"):
        run_tag(_settings(chunker, source, tmp_path / "out2.jsonl"))


def test_a_dangling_symbolic_link_is_not_replaced(chunker, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"tokens": [{"pos": "DT"}, {"pos": "NN"}, {"pos": "."}]}\n')
    link = tmp_path / "out.jsonl"
    link.symlink_to(tmp_path / "elsewhere" / "missing.jsonl")
    with pytest.raises(TagError, match=r"a symbolic link to .*missing.jsonl, which does not exist"):
        run_tag(_settings(chunker, source, link))
    with pytest.raises(FileNotFoundError, match="which does not exist"):
        atomic_write(link, lambda out: out.write(b"x"))
    assert link.is_symlink() and not (tmp_path / "elsewhere").exists()
    # a link to a file is written through: the link stays, its target gets the output
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    live = tmp_path / "live.jsonl"
    live.symlink_to(target)
    run_tag(_settings(chunker, source, live))
    assert live.is_symlink() and json.loads(target.read_text())["tokens"] == ["DT", "NN", "."]  # one column: strings


def test_the_output_may_not_be_a_model_file_of_the_command(chunker, tmp_path, monkeypatch):
    # the model was overwritten by the tagged text, exit 0 (G5); a folder holding it, or ~, named it too
    source = tmp_path / "in.jsonl"
    source.write_text('{"tokens": [{"pos": "DT"}, {"pos": "NN"}]}\n')
    model = tmp_path / "run" / "bundle.npz"
    model.parent.mkdir()
    model.write_bytes(chunker.read_bytes())
    link = tmp_path / "link.npz"
    link.symlink_to(model)
    monkeypatch.setenv("HOME", str(tmp_path))
    cases = [(model, str(model)), (link, str(model)), (model, [str(chunker), str(link)]), (model, str(model.parent))]
    for output, models in [*cases, (model, "~/run/bundle.npz"), (model, "~/run")]:
        with pytest.raises(TagError, match=r"is the model file \(model=.*\.npz\); name another file"):
            run_tag({**_settings(chunker, source, output), "models": models})
    assert model.read_bytes() == chunker.read_bytes()


def test_the_output_may_not_be_a_file_of_the_store_the_model_is_read_from(chunker, tmp_path):
    """``output=<the store's mlflow.db>`` replaced the tracking database with the tagged text, exit 0 (K17)."""
    from pipeline.apps.tag import check_not_a_model

    store = tmp_path / "mlflow.db"
    for name in ("mlflow.db", "mlflow.db-wal"):
        (tmp_path / name).write_bytes(b"SQLite format 3\x00")
        with pytest.raises(TagError, match=r"is a file of the tracking store sqlite:///.*mlflow.db; name another file"):
            check_not_a_model(tmp_path / name, [chunker], [None, f"sqlite:///{store}"])
    (tmp_path / "link.db").symlink_to(store)
    with pytest.raises(TagError, match="is a file of the tracking store"):
        check_not_a_model(tmp_path / "link.db", [chunker], [f"sqlite:///{store}"])
    check_not_a_model(tmp_path / "other.conll", [chunker], [f"sqlite:///{store}"])  # a new file: fine
    assert store.read_bytes() == b"SQLite format 3\x00"


def test_the_output_may_not_be_a_study_or_a_file_of_the_stores_artifacts_or_cache(chunker, tmp_path):
    """The Optuna storage beside the store (``optuna.db``), a registered model's ``MLmodel`` file
    and a cached bundle were replaced by the tagged text, exit 0 (L8)."""
    import optuna

    from pipeline.apps.tag import check_not_a_model

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="s")
    study.enqueue_trial({"x": 1.0})
    before = (tmp_path / "optuna.db").read_bytes()
    with pytest.raises(TagError, match=r"optuna.db: is an SQLite database \(an Optuna study's storage or a tracking store"):
        check_not_a_model(tmp_path / "optuna.db", [chunker], [None])  # any SQLite file, whatever the store
    inside = tmp_path / "mlartifacts" / "1" / "models" / "m-1" / "artifacts" / "MLmodel"  # the default layout
    inside.parent.mkdir(parents=True)
    inside.write_text("artifact_path: model\n")
    with pytest.raises(TagError, match=rf"is a file in the artifact store of the tracking store {re.escape(store)} "):
        check_not_a_model(inside, [chunker], [store])
    cached = tmp_path / "out" / "cache" / "train" / "k" / "bundle.npz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK")
    with pytest.raises(TagError, match=r"is a file in the stage cache \(.*paths.cache_dir\); name another file$"):
        check_not_a_model(cached, [chunker], [store], tmp_path / "out" / "cache")
    check_not_a_model(cached, [chunker], [store])  # another run's cache folder: not this command's
    source = _write_conll(tmp_path / "in.conll", _corpus(2, 5))
    with pytest.raises(TagError, match="is an SQLite database"):
        run_tag(_settings(chunker, source, tmp_path / "optuna.db"))
    assert (tmp_path / "optuna.db").read_bytes() == before
    check_not_a_model(tmp_path / "tagged.conll", [chunker], [store])  # a new file beside the store: fine


def test_the_output_may_not_be_a_file_of_the_data_root(chunker, tmp_path):
    """``output=<data.root>/conll2000/test.txt.gz`` replaced the test set with the tagged text,
    exit 0; the next run read other data (or failed on its column count)."""
    from pipeline.apps.tag import check_not_a_model

    root = tmp_path / "data"
    dataset = root / "conll2000" / "test.txt.gz"
    dataset.parent.mkdir(parents=True)
    dataset.write_bytes(b"gold")
    (tmp_path / "to-data").symlink_to(root)
    for output in (dataset, root / "conll2000" / "new.conll", tmp_path / "to-data" / "conll2000" / "test.txt.gz"):
        with pytest.raises(TagError, match=r"is a file in the data root \(.*data, data.root\), where the datasets are"):
            check_not_a_model(output, [chunker], [None], None, str(root))
    source = _write_conll(tmp_path / "in.conll", _corpus(2, 5))
    with pytest.raises(TagError, match="is a file in the data root"):
        run_tag({**_settings(chunker, source, dataset), "data": {"root": str(root)}})
    assert dataset.read_bytes() == b"gold"
    check_not_a_model(tmp_path / "tagged.conll", [chunker], [None], None, str(root))  # beside it: fine


def test_the_output_may_not_be_in_an_experiments_artifact_folder_wherever_it_is(chunker, tmp_path):
    """The artifact and cache folders were taken to be beside the database, which holds for the
    default layout only: a store elsewhere left its experiments' real artifact folder unguarded
    (review 3). The store's own artifact locations are guarded, wherever they are."""
    import mlflow

    from pipeline.apps.tag import check_not_a_model

    (tmp_path / "db").mkdir()
    store = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    mlflow.MlflowClient(tracking_uri=store).create_experiment("e", artifact_location=(tmp_path / "elsewhere").as_uri())
    logged = tmp_path / "elsewhere" / "run" / "artifacts" / "MLmodel"
    logged.parent.mkdir(parents=True)
    logged.write_text("artifact_path: model\n")
    with pytest.raises(TagError, match=rf"is a file in the artifact store of the tracking store .* \({tmp_path / 'elsewhere'}\)"):
        check_not_a_model(logged, [chunker], [store])
    beside = tmp_path / "db" / "cache" / "notes.txt"  # a folder named cache beside the database: nobody's cache
    beside.parent.mkdir()
    beside.write_text("x")
    check_not_a_model(beside, [chunker], [store])


def test_a_chain_that_feeds_a_model_another_tag_set_is_refused(chunker, train, tmp_path):
    # UPOS predictions aliased to pos were chunked silently, while the same values in a file are refused (G13)
    upos = {"DT": "DET", "NN": "NOUN", "NNS": "NOUN", "JJ": "ADJ", "VBD": "VERB", "VBZ": "VERB", "IN": "ADP", ".": "PUNCT"}
    words = [[w for w, _, _ in s] for s in train]

    def tagger(name: str, tags: list[list[str]]) -> Path:
        model = HMM(order=1).fit(words, tags)
        source = {"dataset": {"name": "toy", "label": name, "tokenisation": "punct"}}
        return _save(ModelBundle(BundledHMM(model, "w"), scheme="none", source=source), tmp_path / f"{name}.npz")

    upos_tagger = tagger("upos", [[upos.get(p, "X") for _, p, _ in s] for s in train])
    xpos_tagger = tagger("xpos", [[p for _, p, _ in s] for s in train])
    source = tmp_path / "in.txt"
    source.write_text(" ".join(words[0]) + "\n")
    settings = {**_settings(f"[{upos_tagger},{chunker}]", source, tmp_path / "out.conll"), "format": "text"}
    settings["models"] = [str(upos_tagger), str(chunker)]
    refusal = r"model 2 of the chain \(.*hmm.npz\) reads 'pos' from model 1 \(.*upos.npz\), its 'upos' "
    with pytest.raises(TagError, match=refusal + r"\(column_aliases upos=pos\), but 0%"):
        run_tag({**settings, "column_aliases": {"upos": "pos"}})
    assert not (tmp_path / "out.conll").exists()
    # the model's own tag set, through the default xpos -> pos alias: chained and tagged
    assert run_tag({**settings, "models": [str(xpos_tagger), str(chunker)]})["tokens"] == len(words[0])


@pytest.mark.parametrize("value", ["no", "false", 0, None])
def test_the_marginals_switch_is_true_or_false(chunker, tmp_path, value):
    # marginals=no wrote a marginal column after every label, where a script reads the label (G9)
    source = tmp_path / "in.jsonl"
    source.write_text('{"tokens": [{"pos": "DT"}, {"pos": "NN"}]}\n')
    with pytest.raises(TagError, match=rf"^marginals={value!r}: true or false$"):
        run_tag({**_settings(chunker, source, tmp_path / "out.conll"), "marginals": value})
    assert not (tmp_path / "out.conll").exists()


def test_a_named_column_holding_another_kind_of_value_is_refused(chunker, train, tmp_path, caplog):
    # named columns were trusted: UPOS given as pos, or CoNLL-U's "_" for a missing XPOS, was chunked silently (G6)
    sentences = _corpus(4, 7)
    upos = {"DT": "DET", "NN": "NOUN", "NNS": "NOUN", "JJ": "ADJ", "VBD": "VERB", "VBZ": "VERB", "IN": "ADP", ".": "PUNCT"}
    tokens = [[{"w": w, "pos": upos.get(p, "X")} for w, p, _ in s] for s in sentences]
    jsonl = tmp_path / "upos.jsonl"
    jsonl.write_text("".join(json.dumps({"tokens": t}) + "\n" for t in tokens))
    header = _write_conll(
        tmp_path / "upos.conll", [[(w, upos.get(p, "X")) for w, p, _ in s] for s in sentences], "# global.columns = w pos"
    )
    missing = tmp_path / "noxpos.conllu"
    missing.write_text(
        "\n".join(
            "\n".join(f"{i + 1}\t{w}\t_\t{upos.get(p, 'X')}\t_\t_\t0\t_\t_\t_" for i, (w, p, _) in enumerate(s)) + "\n"
            for s in sentences
        )
    )
    for source in (jsonl, header, missing):
        with pytest.raises(
            TagError, match=r"the column read as 'pos' holds 0% values the model saw there .*is not the kind of value"
        ):
            run_tag(_settings(chunker, source, tmp_path / "out.jsonl"))
    assert not (tmp_path / "out.jsonl").exists()
    right = tmp_path / "xpos.jsonl"  # the same file with the model's own tag set is tagged
    right.write_text("".join(json.dumps({"tokens": [{"w": w, "pos": p} for w, p, _ in s]}) + "\n" for s in sentences))
    assert run_tag(_settings(chunker, right, tmp_path / "out.jsonl"))["tokens"] == sum(len(s) for s in sentences)
    # a fifth of the tags unknown ('_'): tagged, with a warning that names the share and the values
    tokens = [[{"w": w, "pos": "_" if i % 5 == 0 else p} for i, (w, p, _) in enumerate(s)] for s in sentences]
    partly = tmp_path / "partly.jsonl"
    partly.write_text("".join(json.dumps({"tokens": t}) + "\n" for t in tokens))
    with caplog.at_level(logging.WARNING, logger="pipeline.apps.tag"):
        run_tag(_settings(chunker, partly, tmp_path / "out.jsonl"))
    assert re.search(
        r"partly.jsonl: \d+% of the column 'pos' are values the model never saw there in training \('_'", caplog.text
    )


def test_an_hmm_chunker_tags_its_own_datasets_conll_file(tmp_path):
    from pipeline.__main__ import run_pipeline

    data = write_corpus(tmp_path / "data", n_train=40, n_test=10)
    out = tmp_path / "out"
    seed_store(out)
    run_pipeline(compose_config(tiny_overrides(data, out) + ["stages=[train]", "model=hmm", "data.train_fraction=0.5"]))
    (path,) = [p for p in (out / "cache").rglob("bundle.npz")]
    bundle = load_bundle(path)
    assert bundle.input_columns == ["pos"] and bundle.source["dataset"]["columns"] == LAYOUT
    assert bundle.source["dataset"]["tokenisation"] == "punct"
    test_file = data / "conll2000" / "test.txt.gz"
    summary = run_tag(_settings(path, test_file, tmp_path / "tagged.conll"))
    rows = [r for s in read_conll(tmp_path / "tagged.conll") for r in s]  # w pos gold predicted
    assert summary["tokens"] == len(rows) and "f1" in summary
    assert [r[:3] for r in rows] == [tuple(r) for s in read_conll(test_file) for r in s]
    assert summary["accuracy"] == pytest.approx(100.0 * sum(r[2] == r[3] for r in rows) / len(rows))


def test_a_missing_data_file_without_url_is_a_settings_error(tmp_path):
    dataset = {"name": "toy", "files": {"train": {"path": "toy/train.txt"}}}
    with pytest.raises(SettingsError, match=r"toy/train.txt \(no download configured\)") as info:
        resolve_files(dataset, tmp_path, download=True)
    assert isinstance(info.value, MissingDataError) and "\n" not in str(info.value)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_") or k == "MLFLOW_DISABLE_TELEMETRY"}
    env["PYTHONPATH"] = str(ROOT)
    done = forkserver.run(  # a real `python -m pipeline` process, forked with its imports done (tests/forkserver.py)
        [sys.executable, "-m", "pipeline", f"data.root={tmp_path / 'empty'}", "dataset.files.train.url=null",
         "dataset.files.test.url=null", f"paths.output_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'hydra'}",
         f"tracking.uri=sqlite:///{tmp_path / 'runs.db'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in text, text
    errors = [line for line in text.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "no download configured" in errors[0], text
    assert not (tmp_path / "runs.db").exists()  # refused before a run opened: no FAILED run left in the store


def test_a_data_file_that_is_a_named_pipe_is_refused_before_a_run_opens(tmp_path):
    """A FIFO (or device) where a data file should be was reported as "missing"; now the refusal says
    what it is, and the command line is refused before any run or download starts."""
    from pipeline.__main__ import composition_refusal

    (tmp_path / "conll2000").mkdir()
    os.mkfifo(tmp_path / "conll2000" / "test.txt.gz")
    (tmp_path / "conll2000" / "train.txt.gz").write_bytes(b"")
    expected = f"{tmp_path / 'conll2000' / 'test.txt.gz'}: is a named pipe (FIFO), not a regular file: expected the test file"
    assert composition_refusal([f"data.root={tmp_path}"]).startswith(expected)
    dataset = {"name": "conll2000", "files": {"test": {"path": "conll2000/test.txt.gz", "url": "https://example.invalid/t"}}}
    with pytest.raises(SettingsError, match="^" + re.escape(expected)):
        resolve_files(dataset, tmp_path, download=True)
    with pytest.raises(OSError, match="is a named pipe \\(FIFO\\), not a regular file"):
        read_conll(tmp_path / "conll2000" / "test.txt.gz")
    missing = composition_refusal([f"data.root={tmp_path / 'empty'}", "dataset.files.train.url=null"])
    assert "train.txt.gz (no download configured)" in missing and "test.txt.gz" not in missing  # the test file downloads


def test_an_input_that_is_a_pipe_or_a_dangling_link_is_named_as_such(chunker, tmp_path):
    """Both were "no such file" (the pipe exists); a dangling link as a data file was "missing (no
    download configured)"; an output name ending in '/' was "is a directory" (K11)."""
    from pipeline.stages.data import unavailable_files

    os.mkfifo(tmp_path / "pipe.conll")
    (tmp_path / "link.conll").symlink_to(tmp_path / "nowhere.conll")
    with pytest.raises(OSError, match=r"^input .*pipe.conll: is a named pipe \(FIFO\), not a regular file"):
        run_tag(_settings(chunker, tmp_path / "pipe.conll", tmp_path / "out.conll"))
    with pytest.raises(FileNotFoundError, match=r"^input .*link.conll: a symbolic link to .*nowhere.conll, which does not exist"):
        run_tag(_settings(chunker, tmp_path / "link.conll", tmp_path / "out.conll"))
    source = _write_conll(tmp_path / "in.conll", _corpus(2, 5))
    with pytest.raises(TagError, match=r"names a folder \(it ends with '/'\); name a file"):
        run_tag(_settings(chunker, source, f"{tmp_path}/newdir/"))
    dataset = {"name": "toy", "files": {"train": {"path": "link.conll", "url": "https://example.invalid/t"}}}
    assert "link.conll: a symbolic link to" in str(unavailable_files(dataset, tmp_path))
    (tmp_path / "afile").write_text("")
    with pytest.raises(TagError, match=r"the folder .*afile is a file, not a folder"):
        run_tag(_settings(chunker, source, tmp_path / "afile" / "x.conll"))
    with pytest.raises(TagError, match=r"^model '.*pipe.conll': is a named pipe \(FIFO\), not a model file"):
        run_tag(_settings(tmp_path / "pipe.conll", source, tmp_path / "out.conll"))


def test_a_data_file_that_is_a_directory_is_a_settings_error(tmp_path):
    """It was an IsADirectoryError with a traceback; now the settings line (exit 2), still an IsADirectoryError."""
    (tmp_path / "toy" / "train.txt").mkdir(parents=True)
    dataset = {"name": "toy", "files": {"train": {"path": "toy/train.txt", "url": "https://example.invalid/train.txt"}}}
    expected = "^" + re.escape(f"{tmp_path / 'toy' / 'train.txt'}: is a directory, expected the train file")
    with pytest.raises(SettingsError, match=expected) as info:
        resolve_files(dataset, tmp_path, download=True)
    assert isinstance(info.value, IsADirectoryError) and "\n" not in str(info.value)


@pytest.fixture(scope="module")
def crf_chunker(train, tmp_path_factory) -> Path:
    """A CRF chunker over words and POS tags (its columns keep no counts: none is a closed set)."""
    from crf import CRF
    from crf.features import FeatureExtractor
    from crf.model import BundledCRF

    extractor = FeatureExtractor(columns=LAYOUT, templates=["w[0]", "pos[0]", "pos[-1]|pos[0]"]).fit(train)
    model = CRF(max_iterations=20).fit(extractor.transform(train), [[r[2] for r in s] for s in train],
                                       attribute_names=extractor.attribute_names())  # fmt: skip
    source = {"dataset": {"name": "toy", "columns": LAYOUT, "label": "chunk", "scheme": "IOB2", "tokenisation": "punct"}}
    bundle = ModelBundle(BundledCRF(extractor, model), scheme="iob2", source=source)
    return _save(bundle, tmp_path_factory.mktemp("c") / "crf.npz")


def test_swapped_columns_without_gold_are_refused_for_a_model_that_reads_a_tag_set(chunker, crf_chunker, train, tmp_path):
    """A header-less ``pos w`` file taken by the layout as ``w pos``: no gold column shows it, but
    the column read as ``pos`` holds few of the tags the model saw there (HMM and CRF alike)."""
    source = {"dataset": {"name": "toy", "columns": LAYOUT, "label": "chunk", "scheme": "IOB2", "tokenisation": "punct"}}
    crf_bundle = crf_chunker
    assert load_bundle(chunker).known_values()["pos"][1]  # the HMM's observed tag set: closed
    sentences = _corpus(8, 6)
    swapped = _write_conll(tmp_path / "in.conll", [[(p, w) for w, p, _ in s] for s in sentences])
    named = _write_conll(tmp_path / "named.conll", [[(p, w) for w, p, _ in s] for s in sentences], "# global.columns = pos w")
    for number, bundle in enumerate((chunker, crf_bundle)):
        target = tmp_path / f"out{number}.conll"
        with pytest.raises(TagError, match=r"the column read as '(w|pos)' holds \d+% values the model saw there.*global.columns"):
            run_tag(_settings(bundle, swapped, target))
        assert not target.exists()
        assert run_tag(_settings(bundle, named, target))["tokens"] == sum(map(len, sentences))
    # the POS column dropped (``w chunk``: the model's labels read as POS tags), or a tag set the model
    # never saw in its place (UD's UPOS for Penn tags): refused by the CRF too, whose columns keep no counts
    for name, tags in (("chunks", [r[2] for s in sentences for r in s]), ("upos", ["DET", "NOUN", "VERB", "ADP"])):
        wrong = [[(w, tags[(i + t) % len(tags)]) for t, (w, _, _) in enumerate(s)] for i, s in enumerate(sentences)]
        target = tmp_path / f"{name}.conll"
        with pytest.raises(TagError, match=r"the column read as 'pos' holds 0% values the model saw there"):
            run_tag(_settings(crf_bundle, _write_conll(tmp_path / f"{name}_in.conll", wrong), target))
        assert not target.exists()
    # text of another domain, in the right order: new words are no sign of a wrong order
    unseen = [[(f"novel{i}x{t}", p) for t, (_, p, _) in enumerate(s)] for i, s in enumerate(sentences)]
    other_domain = _write_conll(tmp_path / "other.conll", unseen)
    assert run_tag(_settings(crf_bundle, other_domain, tmp_path / "crf_other.conll"))["tokens"] == sum(map(len, sentences))
    # new words that repeat (a small vocabulary, like a tag set's): the word column is never taken for a tag set
    repeated = [[(f"novel{t % 3}", p) for t, (_, p, _) in enumerate(s)] for s in sentences]
    again = _write_conll(tmp_path / "again.conll", repeated)
    assert run_tag(_settings(crf_bundle, again, tmp_path / "crf_again.conll"))["tokens"] == sum(map(len, sentences))
    rng = np.random.default_rng(7)
    words = [[f"w{rng.integers(0, 300)}" for _ in s] for s in train]  # a word model: few uses per word
    word_hmm = HMM(order=1).fit(words, [[r[2] for r in s] for s in train])
    word_bundle = _save(ModelBundle(BundledHMM(word_hmm, "w"), scheme="iob2", source=source), tmp_path / "words.npz")
    assert not load_bundle(word_bundle).known_values()["w"][1]
    assert run_tag(_settings(word_bundle, other_domain, tmp_path / "hmm_other.conll"))["tokens"] == sum(map(len, sentences))


UPOS_SENTENCE = [("He", "PRON"), ("reckons", "VERB"), ("the", "DET"), ("current", "ADJ"), ("account", "NOUN"),
                 ("deficit", "NOUN"), ("will", "AUX"), ("narrow", "VERB"), (".", "PUNCT")]  # fmt: skip


def test_one_short_sentence_of_another_tag_set_is_refused_by_every_way_in(chunker, crf_chunker, train, tmp_path):
    """UPOS tags as ``pos`` in one short sentence (too short to look like a tag set by its repeats)
    are refused by the tag command (named columns), ``ModelBundle.tag``, ``tag_frame`` and the served
    model's input check alike, for the CRF (no closed sets recorded) and the HMM; the same sentence
    with the model's own tag set is tagged everywhere (H4, H5)."""
    from crf.bundle import ColumnValueError

    served_tag, ModelInputError = mlflow_model.tag, mlflow_model.ModelInputError
    tags = [r[1] for r in train[0]]
    penn = [(w, tags[t % len(tags)]) for t, (w, _) in enumerate(UPOS_SENTENCE)]  # tags the models saw in 'pos'
    for number, path in enumerate((crf_chunker, chunker)):
        bundle = load_bundle(path)
        for tokens, refused in ((UPOS_SENTENCE, True), (penn, False)):
            target = tmp_path / f"out{number}{refused}.conll"
            named = tmp_path / f"in{number}{refused}.jsonl"
            named.write_text(json.dumps({"tokens": [{"w": w, "pos": p} for w, p in tokens]}) + "\n")
            sentence = [{"w": w, "pos": p} for w, p in tokens]
            frame = pd.DataFrame({"sentence": 0, "w": [w for w, _ in tokens], "pos": [p for _, p in tokens]})
            if not refused:
                assert run_tag(_settings(path, named, target))["tokens"] == len(tokens)
                assert len(bundle.tag([sentence])[0]["labels"]) == len(tokens)
                assert len(bundle.tag_frame(frame)) == len(served_tag(bundle, frame)) == len(tokens)
                continue
            with pytest.raises(TagError, match=r"the column read as 'pos' holds 0% values the model saw there.*'PRON'"):
                run_tag(_settings(path, named, target))
            assert not target.exists()
            message = r"^the column 'pos' holds 0% values the model saw there in training \(of a set of \d+; not 'PRON'"
            with pytest.raises(ColumnValueError, match=message):
                bundle.tag([sentence])
            with pytest.raises(ColumnValueError, match=message):
                bundle.tag_frame(frame)
            with pytest.raises(ModelInputError, match=message[1:]):
                served_tag(bundle, frame)


def test_a_gold_column_of_another_tasks_labels_is_not_scored(chunker, crf_chunker, tmp_path):
    """A header-less ``w pos ner`` file: its third column, read as the chunk labels, is mostly
    ``O`` (a label of both tag sets) and B-ORG/I-ORG elsewhere, so most of its cells are labels
    the chunker knows; none of those outside ``O`` is. Refused, not scored (H3)."""
    sentences = _corpus(8, 11)
    ner = [[(w, p, "B-ORG" if t == 1 else "I-ORG" if t == 2 else "O") for t, (w, p, _) in enumerate(s)] for s in sentences]
    source = _write_conll(tmp_path / "ner.conll", ner)
    for number, path in enumerate((chunker, crf_chunker)):
        target = tmp_path / f"out{number}.conll"
        with pytest.raises(TagError, match=r"gold labels holds of its cells outside 'O' 0% labels the model knows \(not 'B-ORG'"):
            run_tag(_settings(path, source, target))
        assert not target.exists()
        chunks = _write_conll(tmp_path / f"chunks{number}.conll", sentences)  # the chunk column itself: scored
        assert run_tag(_settings(path, chunks, target))["accuracy"] > 0


def test_a_placeholder_gold_column_is_tagged_and_not_scored(chunker, tmp_path, caplog):
    """The dummy label column of CRF++/CRFsuite-style input (every cell ``O``, or CoNLL's ``_``) is
    no gold: tagged and written, not scored (all ``O`` was "accuracy 13.38, f1 0.00"; all ``_``
    a refusal that blamed the column order) (H11)."""
    caplog.set_level(logging.INFO, logger="pipeline")
    sentences = _corpus(8, 12)
    for dummy in ("O", "_"):
        source = _write_conll(tmp_path / f"dummy{dummy}.conll", [[(w, p, dummy) for w, p, _ in s] for s in sentences])
        target = tmp_path / f"out{dummy}.conll"
        summary = run_tag(_settings(chunker, source, target))
        assert "accuracy" not in summary and summary["tokens"] == sum(map(len, sentences))
        assert f"every cell of the gold column is {dummy!r}: taken as a placeholder, not scored" in caplog.text
        assert [[r[2] for r in s] for s in read_conll(target)] == [[dummy] * len(s) for s in sentences]  # written as given
    mostly = [[(w, p, "O" if (i, t) != (0, 0) else c) for t, (w, p, c) in enumerate(s)] for i, s in enumerate(sentences)]
    assert "accuracy" in run_tag(_settings(chunker, _write_conll(tmp_path / "one.conll", mostly), tmp_path / "o.conll"))


def test_a_gold_column_in_iob1_is_refused_for_an_iob2_model(chunker, tmp_path):
    """IOB1 gold (a chunk begins with ``I-`` unless it follows one of its type) holds only labels the
    model knows, so it passed the known-label rule and was scored: chunk F1 alike, token accuracy 42
    points low. Now refused, naming the scheme (K5); the same chunks in IOB2 are scored."""
    from crf.metrics import chunks, scheme_violations

    sentences = _corpus(8, 12)
    iob2 = [[c for _, _, c in s] for s in sentences]
    iob1 = [[("B" if t and c[2:] == s[t - 1][2:] and s[t - 1] != "O" and c[0] == "B" else "I") + c[1:] if c != "O" else c
             for t, c in enumerate(s)] for s in iob2]  # fmt: skip
    assert chunks(iob1).equals(chunks(iob2))
    bad, total = scheme_violations(iob1, "iob2")
    assert bad > total / 2 and scheme_violations(iob2, "iob2") == (0, total) and scheme_violations(iob1, "iob1") == (0, total)
    source = _write_conll(tmp_path / "iob1.conll", [[(w, p, c) for (w, p, _), c in zip(s, l)] for s, l in zip(sentences, iob1)])
    with pytest.raises(TagError, match=r"chunks of the gold column are not written as IOB2 writes them .*convert the column"):
        run_tag(_settings(chunker, source, tmp_path / "out1.conll"))
    assert not (tmp_path / "out1.conll").exists()
    assert "accuracy" in run_tag(_settings(chunker, _write_conll(tmp_path / "iob2.conll", sentences), tmp_path / "out2.conll"))


def test_sentence_ids_follow_one_rule_in_tag_frame_and_the_served_model(chunker):
    """Descending ids were tagged by tag_frame and refused by the served model, and interleaved ids
    were refused by both in different words (K14): one rule, each sentence's rows together."""
    bundle = load_bundle(chunker)
    tokens = ["DT", "NN", "VBD", "DT", "NN", "."]
    descending = pd.DataFrame({"sentence": [1, 1, 1, 0, 0, 0], "pos": tokens})
    ascending = pd.DataFrame({"sentence": [0, 0, 0, 1, 1, 1], "pos": tokens})
    expected = bundle.tag_frame(ascending)["label"].tolist()
    assert bundle.tag_frame(descending)["label"].tolist() == expected
    assert mlflow_model.tag(bundle, descending)["label"].tolist() == expected
    interleaved = pd.DataFrame({"sentence": [0, 0, 1, 1, 0, 0], "pos": tokens})
    message = r"^row 4: 'sentence' 0 reappears after 1: the rows of each sentence must be contiguous$"
    with pytest.raises(ValueError, match=message):
        bundle.tag_frame(interleaved)
    with pytest.raises(mlflow_model.ModelInputError, match=message):
        mlflow_model.tag(bundle, interleaved)


def test_an_input_column_named_as_an_output_is_refused_not_overwritten(crf_chunker):
    """A frame carrying gold labels as ``label`` got the predictions back under that name, the gold
    gone (and ``marginal``, ``segment_confidence`` alike): refused by tag_frame and the served model (H10)."""
    bundle = load_bundle(crf_chunker)
    words = [("He", "PRP"), ("reckons", "VBZ"), ("the", "DT"), ("deficit", "NN")]
    for name in ("label", "marginal", "segment_confidence"):
        frame = pd.DataFrame({"sentence": 0, "w": [w for w, _ in words], "pos": [p for _, p in words], name: "GOLD"})
        with pytest.raises(ValueError, match=rf"^the input has a column '{name}', which tag_frame writes .*: rename it$"):
            bundle.tag_frame(frame)
        with pytest.raises(mlflow_model.ModelInputError, match=rf"a column '{name}', which tag_frame writes"):
            mlflow_model.tag(bundle, frame)
    frame = pd.DataFrame({"sentence": 0, "w": [w for w, _ in words], "pos": [p for _, p in words], "chunk": "GOLD"})
    assert bundle.tag_frame(frame)["chunk"].tolist() == ["GOLD"] * len(words)  # other extra columns pass through


def test_a_few_tags_the_model_never_saw_are_tagged_with_a_warning_not_refused(crf_chunker, train, caplog):
    """One to four cells of values a small model never saw in 'pos' (real PTB tags it lacks, or one
    word that is also a label) are no evidence of another kind of value: tagged, with a warning;
    five such cells are (H12)."""
    from crf.bundle import MIN_EVIDENCE, ColumnValueError

    bundle = load_bundle(crf_chunker)
    seen = bundle.known_values()["pos"][0]
    unseen = [f"T{k}" for k in range(MIN_EVIDENCE)]
    assert not set(unseen) & seen
    for count in range(1, MIN_EVIDENCE):
        caplog.clear()
        sentence = [{"w": "up", "pos": tag} for tag in unseen[:count]]
        assert len(bundle.tag([sentence])[0]["labels"]) == count
        assert "of the column 'pos' are values the model never saw there in training" in caplog.text
    with pytest.raises(ColumnValueError, match="the column 'pos' holds 0% values"):
        bundle.tag([[{"w": "up", "pos": tag} for tag in unseen]])
    # a few cells that another column's values match are evidence: words and tags swapped, 4 tokens
    swapped = [{"w": r[1], "pos": r[0]} for r in train[0][:4]]
    with pytest.raises(ColumnValueError, match=r"values it saw in column"):
        bundle.tag([swapped])
    # a bundle that names no word column (built by hand, words in 'word'): new words are words, never refused
    from crf import CRF
    from crf.features import FeatureExtractor
    from crf.model import BundledCRF

    rows = [[(r[0], r[2]) for r in s] for s in train]
    extractor = FeatureExtractor(columns=["word", "chunk"], templates=["word[0]"]).fit(rows)
    model = CRF(max_iterations=5).fit(extractor.transform(rows), [[r[1] for r in s] for s in rows],
                                      attribute_names=extractor.attribute_names())  # fmt: skip
    assert len(extractor.vocabulary_["word"]) <= 100  # a small vocabulary, as a tag set's
    plain = ModelBundle(BundledCRF(extractor, model), scheme="iob2")
    assert len(plain.tag([["novel", "words", "of", "another", "domain", "entirely", "here"]])[0]["labels"]) == 7


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([0, 0, 0, 0, 1, np.nan], r"^row 5: the 'sentence' id is null \(a missing value\)$"),  # was a sentence of its own
        ([0, 0, 0, np.nan, 0, 0], r"^row 3: the 'sentence' id is null \(a missing value\)$"),  # was "0.0 reappears after nan"
        ([False, False, False, True, True, True], r"^row 0: the 'sentence' id bool False is not an integer$"),
        ([0.5, 0.5, 0.5, 0.7, 0.7, 0.7], r"^row 0: the 'sentence' id float 0.5 is not an integer$"),
        ([0, 0, 0, "0", "0", "0"], r"^row 3: the 'sentence' id str '0' is not an integer, as the first id is: give every"),
        (["0", "0", "0", 0, 0, 0], r"^row 3: the 'sentence' id int 0 is not a string, as the first id is: give every"),
        ([2**70] * 6, r"^row 0: the 'sentence' id int 1180591620717411303424 is beyond the range of a signed 64-bit integer$"),
    ],
)
def test_tag_frame_and_the_served_model_take_the_same_sentence_ids(chunker, ids, message):
    """tag_frame tagged a token whose sentence id is missing as a sentence of its own, and took text,
    boolean, fractional and 70-bit ids that the served model refused (L4): one check of ids for both,
    which takes integers (1.0 included) or strings, and refuses a mix of the two."""
    bundle = load_bundle(chunker)
    frame = pd.DataFrame({"sentence": pd.Series(ids, dtype=object), "pos": ["DT", "NN", "VBD", "DT", "NN", "."]})
    with pytest.raises(ValueError, match=message):
        bundle.tag_frame(frame)
    with pytest.raises(mlflow_model.ModelInputError, match=message):
        mlflow_model.tag(bundle, frame)
    expected = bundle.tag_frame(pd.DataFrame({"sentence": [0, 0, 0, 1, 1, 1], "pos": frame["pos"]}))["label"].tolist()
    categories = (pd.Categorical(["s3", "s3", "s3", "s1", "s1", "s1"]), pd.Categorical([3, 3, 3, 1, 1, 1]))  # L4's residual
    for good in ([3.0, 3.0, 3.0, 1, 1, 1], ["s3", "s3", "s3", "s1", "s1", "s1"], *categories):
        whole = pd.DataFrame(
            {"sentence": good if isinstance(good, pd.Categorical) else pd.Series(good, dtype=object), "pos": frame["pos"]}
        )
        assert bundle.tag_frame(whole)["label"].tolist() == mlflow_model.tag(bundle, whole)["label"].tolist() == expected
    bad_token = pd.DataFrame({"sentence": ["s1", "s1"], "pos": ["DT", ""]})  # a string id in the bad token's message
    with pytest.raises(mlflow_model.ModelInputError, match=r"^row 1 \(sentence s1\), column 'pos': "):
        mlflow_model.tag(bundle, bad_token)


def test_a_gold_column_with_blank_cells_is_refused_and_unknown_labels_are_counted(chunker, tmp_path, caplog):
    """A gold column with some '_' cells, or labels the model never saw, was scored silently, each
    such cell a wrong answer (accuracy 84 and 67 where the labelled cells scored 95; L2)."""
    sentences = _corpus(6, 21)
    blank = [[(w, p, "_" if (i, t) in {(1, 2), (4, 0)} else c) for t, (w, p, c) in enumerate(s)] for i, s in enumerate(sentences)]
    source = _write_conll(tmp_path / "blank.conll", blank)
    with pytest.raises(TagError, match=r"2 of the \d+ cells of the gold column are '_' \(no label\), the first at sentence 2, "
                       r"token 3: a gold column is scored only when every cell holds a label"):  # fmt: skip
        run_tag(_settings(chunker, source, tmp_path / "blank.out"))
    assert not (tmp_path / "blank.out").exists()
    summary = run_tag(_settings(chunker, source, tmp_path / "blank.out", score=False))  # a partly annotated file, tagged
    assert "accuracy" not in summary and (tmp_path / "blank.out").exists()
    with pytest.raises(TagError, match=r"^score='no': true or false"):
        run_tag(_settings(chunker, source, tmp_path / "blank.out", score="no"))
    swapped = [[(p, c, w) for w, p, c in s] for s in blank]  # columns out of order: named as such, not as blank cells
    with pytest.raises(TagError, match=r"its columns are not in the order the model expects"):
        run_tag(_settings(chunker, _write_conll(tmp_path / "swapped.conll", swapped), tmp_path / "swapped.out"))
    unknown = [[(w, p, "B-FOO" if t == 0 else c) for t, (w, p, c) in enumerate(s)] for s in sentences]
    with caplog.at_level(logging.WARNING):
        summary = run_tag(_settings(chunker, _write_conll(tmp_path / "foo.conll", unknown), tmp_path / "foo.out"))
    tokens = sum(map(len, sentences))
    (line,) = [r.getMessage() for r in caplog.records if "labels the model does not know" in r.getMessage()]
    share = f"({100 * 6 / tokens:.1f}%)"
    assert f"6 of the {tokens} cells of the gold column {share} are labels the model does not know ('B-FOO')" in line
    assert "accuracy" in summary and summary["tokens"] == tokens


def test_jsonl_tokens_that_give_the_label_column_are_scored_and_keep_it(chunker, tmp_path):
    """Token objects carrying the label column (``{"pos": ..., "chunk": ...}``) were tagged without
    scoring and the gold key dropped from the output (L3): JSONL names its columns, so the label
    column's key is the gold, scored as the same sentences given as CoNLL are, and written back."""
    sentences = _corpus(6, 22)
    conll = run_tag(_settings(chunker, _write_conll(tmp_path / "s.conll", sentences), tmp_path / "s.out.conll"))
    lines = [json.dumps({"tokens": [{"w": w, "pos": p, "chunk": c} for w, p, c in s]}) for s in sentences]
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    summary = run_tag(_settings(chunker, tmp_path / "s.jsonl", tmp_path / "s.out.jsonl"))
    assert summary["accuracy"] == conll["accuracy"] and summary["f1"] == conll["f1"]
    records = [json.loads(line) for line in (tmp_path / "s.out.jsonl").read_text().splitlines()]
    assert [r["gold"] for r in records] == [[c for _, _, c in s] for s in sentences]
    half = lines[:1] + [json.dumps({"tokens": [{"w": w, "pos": p} for w, p, _ in sentences[1]]})]
    (tmp_path / "half.jsonl").write_text("\n".join(half) + "\n")
    with pytest.raises(DataFormatError, match=r"half.jsonl:2: token 1 lacks the label column 'chunk', which the first token"):
        run_tag(_settings(chunker, tmp_path / "half.jsonl", tmp_path / "half.out.jsonl"))
    plain = [json.dumps({"tokens": [{"w": w, "pos": p} for w, p, _ in s]}) for s in sentences]
    (tmp_path / "plain.jsonl").write_text("\n".join(plain) + "\n")
    assert "accuracy" not in run_tag(_settings(chunker, tmp_path / "plain.jsonl", tmp_path / "plain.out.jsonl"))


def test_jsonl_token_keys_nothing_reads_are_named_in_a_warning(chunker, tmp_path, caplog):
    """Gold labels under ``label`` (an output's name, not the model's label column ``chunk``) were
    dropped from the output and left unscored without a word."""
    sentences = _corpus(2, 5)
    lines = [json.dumps({"tokens": [{"w": w, "pos": p, "label": c} for w, p, c in s]}) for s in sentences]
    (tmp_path / "l.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="pipeline.apps.formats"):
        summary = run_tag(_settings(chunker, tmp_path / "l.jsonl", tmp_path / "l.out.jsonl"))
    assert "accuracy" not in summary
    assert "l.jsonl:1: token keys ['label', 'w'] are not read and not written back (the model reads ['pos']" in caplog.text
    assert "gold labels are read from 'chunk'" in caplog.text
    caplog.clear()
    plain = [json.dumps({"tokens": [{"pos": p, "chunk": c} for _, p, c in s]}) for s in sentences]
    (tmp_path / "p.jsonl").write_text("\n".join(plain) + "\n")
    with caplog.at_level(logging.WARNING, logger="pipeline.apps.formats"):
        run_tag(_settings(chunker, tmp_path / "p.jsonl", tmp_path / "p.out.jsonl"))
    assert "not read" not in caplog.text


def test_the_commands_own_jsonl_output_is_read_with_its_gold(chunker, tmp_path):
    """The command wrote the gold it read as a sentence-level "gold" list, where it did not read
    it: tagging its own output again dropped the gold and printed no scores (review 11). A
    "gold" list of one label per token is read, and the gold given twice is refused."""
    sentences = _corpus(6, 23)
    first = run_tag(_settings(chunker, _write_conll(tmp_path / "s.conll", sentences), tmp_path / "once.jsonl"))
    again = run_tag(_settings(chunker, tmp_path / "once.jsonl", tmp_path / "twice.jsonl"))
    assert again["accuracy"] == first["accuracy"] and again["f1"] == first["f1"]
    once, twice = ([json.loads(line) for line in (tmp_path / n).read_text().splitlines()] for n in ("once.jsonl", "twice.jsonl"))
    assert [(r["gold"], r["labels"]) for r in twice] == [(r["gold"], r["labels"]) for r in once]
    record = json.loads((tmp_path / "once.jsonl").read_text().splitlines()[0])
    for bad, match in (
        ({"gold": record["gold"][:-1]}, r'"gold" must be a list of one label per token \(6\), got a list of 5$'),
        ({"gold": "B-NP"}, r'"gold" must be a list of one label per token \(6\), got string "B-NP"$'),
        ({"tokens": [{**t, "chunk": "O"} for t in record["tokens"]]}, r'the gold labels are given twice: in "gold" and in'),
    ):
        (tmp_path / "bad.jsonl").write_text(json.dumps({**record, **bad}) + "\n")
        with pytest.raises(DataFormatError, match=r"bad.jsonl:1: " + match):
            run_tag(_settings(chunker, tmp_path / "bad.jsonl", tmp_path / "bad.out.jsonl"))


def test_an_output_named_gz_is_compressed(chunker, tmp_path):
    """``output=out.conll.gz`` was plain text under a .gz name, which zcat refuses (L18)."""
    import gzip

    source = _write_conll(tmp_path / "in.conll", _corpus(3, 7))
    for name in ("out.conll", "out.jsonl"):
        run_tag(_settings(chunker, source, tmp_path / name))
        run_tag(_settings(chunker, source, tmp_path / f"{name}.gz"))
        packed = (tmp_path / f"{name}.gz").read_bytes()
        assert packed[:2] == b"\x1f\x8b" and gzip.decompress(packed) == (tmp_path / name).read_bytes()
    assert [s for s in read_conll(tmp_path / "out.conll.gz")] == [s for s in read_conll(tmp_path / "out.conll")]


def test_mlflows_instances_and_inputs_requests_are_read_as_sent(chunker):
    """MLflow reads ``instances`` and ``inputs`` requests through NumPy, wrapping values as 0-d
    arrays: a valid ``inputs`` list of records was refused ("id ndarray array(0) is not an
    integer") and a null token was blamed on another row and value (M4)."""
    from mlflow.utils.proto_json_utils import parse_tf_serving_input

    bundle = load_bundle(chunker)
    rows = [{"sentence": 0, "pos": "DT"}, {"sentence": 0, "pos": "NN"}, {"sentence": 1, "pos": "VBZ"}]
    expected = bundle.tag_frame(pd.DataFrame(rows))["label"].tolist()
    for request in ({"inputs": rows}, {"instances": rows}):
        assert mlflow_model.tag(bundle, parse_tf_serving_input(request))["label"].tolist() == expected
    with_null = [*rows[:2], {"sentence": 1, "pos": None}]
    for request in ({"inputs": with_null}, {"instances": with_null}):
        message = r"^row 2 \(sentence 1\), column 'pos': a token must be a non-empty string, got null \(a missing value\)"
        with pytest.raises(mlflow_model.ModelInputError, match=message):
            mlflow_model.tag(bundle, parse_tf_serving_input(request))


def test_the_output_may_not_be_in_the_stage_cache_a_model_is_read_from(chunker, tmp_path):
    """Given a bundle from a stage cache (the path each run prints), the command overwrote another
    cached bundle or a stage's manifest of that cache (M6), and the registry's lock file beside the
    store: the cache a model is read from is guarded as ``paths.cache_dir`` is."""
    import shutil

    from pipeline.apps.tag import check_not_a_model
    from pipeline.engine.cache import MANIFEST

    cache = tmp_path / "elsewhere" / "cache"
    ours, other = cache / "train" / "k1", cache / "train" / "k2"
    for entry in (ours, other):
        entry.mkdir(parents=True)
        (entry / MANIFEST).write_text("{}")
    shutil.copy(chunker, ours / "bundle.npz")
    (other / "bundle.npz").write_bytes(b"PK")
    for output in (other / "bundle.npz", other / MANIFEST, cache / "prepare.json"):
        output.touch()
        with pytest.raises(TagError, match=rf"is a file in the stage cache {re.escape(str(cache))} that the model .* is read"):
            check_not_a_model(output, [ours / "bundle.npz"], [None])
    (other / MANIFEST).write_text('{"stage": "train", "key": "k2", "files": {}}')  # the manifest a cache writes
    with pytest.raises(TagError, match=rf"is a file of the stage cache entry {re.escape(str(other))}; name another file$"):
        check_not_a_model(other / "bundle.npz", [chunker], [None])  # whatever model is read: any cache entry (M6's residual)
    (other / MANIFEST).write_text("{}")
    check_not_a_model(other / "bundle.npz", [chunker], [None])  # a folder that is no cache entry, a model from elsewhere
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for lock in ("mlflow.db.lock", "mlflow.db.registry.lock"):
        (tmp_path / lock).touch()
        with pytest.raises(TagError, match=r"is a file of the tracking store"):
            check_not_a_model(tmp_path / lock, [chunker], [store])


def test_a_sentence_of_probability_zero_gets_no_label_or_a_warning_by_every_way_in(word_tagger, tmp_path, caplog):
    """The toy corpus never has a verb chunk before the final '.', and its interpolation weights are
    (0, 1): under this HMM "the dog runs ." has probability 0, so any labelling is arbitrary. `tag`
    gave None; `tag_frame` (the served model's way) and the tag command wrote the arbitrary path,
    with a debug line only."""
    bundle = load_bundle(word_tagger(tmp_path / "b.npz", {"name": "mine", "label": "chunk", "tokenisation": "punct"}))
    impossible, fine = ["the", "dog", "runs", "."], ["the", "dog", "."]
    assert bundle.tag([fine])[0]["labels"] == ["B-NP", "I-NP", "O"]
    with caplog.at_level(logging.WARNING):
        tagged = bundle.tag([fine, impossible])[1]
    assert tagged["labels"] == [None] * 4 and tagged["segments"] == []  # no labelling, so no chunks either
    assert "1 of 2 sentences have no labelling of nonzero probability under the model (first: sentence 1)" in caplog.text
    frame = pd.DataFrame({"sentence": [0] * 3 + [1] * 4, "w": fine + impossible})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        labels = bundle.tag_frame(frame)["label"]
    assert labels[:3].tolist() == ["B-NP", "I-NP", "O"] and labels[3:].isna().all()
    assert "(first: sentence 1): their rows' labels are None" in caplog.text
    text = tmp_path / "in.txt"
    text.write_text(" ".join(fine) + "\n" + " ".join(impossible) + "\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_tag(_settings(tmp_path / "b.npz", text, tmp_path / "out.jsonl", format="text"))
    assert "1 of 2 sentences have no labelling of nonzero probability under the model (first: sentence 2): hmm's" in caplog.text


def test_a_bad_numeric_cell_is_named_alike_by_every_way_in(tmp_path):
    """The tag command named a bad numeric cell from the featuriser, counted from 0 and without the
    file ("sentence 1, token 1" for the file's sentence 2, token 2: in its own counting, a good
    cell), while its token check counts from 1 and names the file."""
    from crf import CRF
    from crf.features import FeatureExtractor, NumericValueError
    from crf.model import BundledCRF

    train = [[("He", "0.2", "B-NP"), ("says", "0.4", "B-VP")], [("She", "0.3", "B-NP"), ("nods", "1", "B-VP")]] * 5
    extractor = FeatureExtractor(columns=["w", "num", "chunk"], templates=["w[0]"], numeric=["num"]).fit(train)
    model = CRF(max_iterations=10).fit(extractor.transform(train), [[r[2] for r in s] for s in train])
    source = {"dataset": {"name": "toy", "columns": ["w", "num", "chunk"], "label": "chunk", "tokenisation": "punct"}}
    bundle = _save(ModelBundle(BundledCRF(extractor, model), scheme="iob2", source=source), tmp_path / "num.npz")
    loaded = load_bundle(bundle)
    sentences = [
        [{"w": "He", "num": "0.2"}, {"w": "says", "num": "0.4"}],
        [{"w": "She", "num": "0.3"}, {"w": "nods", "num": "nan"}],
    ]
    message = "sentence 1, token 1, numeric column 'num' has the non-numeric value 'nan'"
    with pytest.raises(NumericValueError, match=re.escape(message)):
        loaded.tag(sentences)
    frame = pd.DataFrame([{"sentence": i, **token} for i, s in enumerate(sentences) for token in s])
    with pytest.raises(NumericValueError, match=re.escape(message)):
        loaded.tag_frame(frame)
    with pytest.raises(mlflow_model.ModelInputError, match=re.escape(message)):
        mlflow_model.tag(loaded, frame)
    source_file = _write_conll(tmp_path / "in.conll", [[("He", "0.2"), ("says", "0.4")], [("She", "0.3"), ("nods", "nan")]])
    with pytest.raises(TagError, match=re.escape(f"input {source_file}: sentence 2, token 2, numeric column 'num' has the")):
        run_tag(_settings(bundle, source_file, tmp_path / "out.jsonl"))
    assert not (tmp_path / "out.jsonl").exists()


def test_a_new_output_file_inside_a_cache_entry_an_artifact_folder_or_beside_the_store_is_refused(chunker, tmp_path):
    """Only existing files were checked: a new file written into the model's cache entry made the
    next pipeline run find that entry damaged (a file its manifest does not list), move it aside and
    train again; a new ``mlflow.db-journal`` or a new file in the artifact folders went in as well."""
    from pipeline.apps.tag import check_not_a_model
    from pipeline.engine.cache import MANIFEST

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    entry = tmp_path / "elsewhere" / "cache" / "train" / "0123abcd"
    entry.mkdir(parents=True)
    (entry / MANIFEST).write_text(json.dumps({"stage": "train", "key": "0123abcd", "files": {}}))
    cases = {
        entry / "tagged.jsonl": "is a file of the stage cache entry",
        tmp_path / "out" / "cache" / "train" / "new.jsonl": r"is a file in the stage cache \(",
        tmp_path / "mlflow.db-journal": "is a file of the tracking store",
        tmp_path / "mlartifacts" / "1" / "new.jsonl": "is a file in the artifact store of the tracking store",
        entry.parent / "new.jsonl": r"is a file in a stage cache \(.*/cache/train holds cache entries\)",  # another one's
        entry.parent.parent / "new.jsonl": r"is a file in a stage cache \(.*/elsewhere/cache holds cache entries\)",
    }
    for path, message in cases.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with pytest.raises(TagError, match=message):
            check_not_a_model(path, [chunker], [store], tmp_path / "out" / "cache")
        assert not path.exists()
    source = _write_conll(tmp_path / "in.conll", _corpus(2, 5))
    with pytest.raises(TagError, match="is a file of the stage cache entry"):
        run_tag(_settings(chunker, source, entry / "tagged.jsonl"))
    assert sorted(p.name for p in entry.iterdir()) == [MANIFEST]

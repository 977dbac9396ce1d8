"""The tag command (``python -m pipeline.tag``): bundles from the pipeline, every input and output
format, chaining a word->POS tagger into a POS->chunk chunker, and clear errors; its scores in
percent against an independent count; ``models:/`` and ``runs:/`` URIs resolved in the pipeline's
store (never a stray ``mlflow.db``), and the closing lines of a pipeline run naming what loads."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import forkserver
import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import CONF_DIR, compose_config, make_sentence, tiny_overrides, write_corpus  # noqa: E402
from seqeval.metrics import f1_score, precision_score, recall_score  # noqa: E402

from crf import load_bundle  # noqa: E402
from crf.io import DataFormatError, read_conll  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.apps.formats import tokenize  # noqa: E402
from pipeline.apps.tag import TagError, renamed, resolve_model, run_tag  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A word->POS HMM and a (word, POS)->chunk CRF trained by the pipeline on the toy corpus:
    (path of the POS bundle, runs:/ URI of the chunker's train run, tracking URI, output folder)."""
    for name in ("MLFLOW_TRACKING_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    root = tmp_path_factory.mktemp("tag")
    corpus = write_corpus(root / "data", n_train=80, n_test=20)
    out = root / "out"
    base = tiny_overrides(corpus, out) + ["stages=[train]"]
    run_pipeline(compose_config(base + ["model=hmm", "dataset.label=pos", "dataset.scheme=none", "dataset.hmm.observation=w"]))
    run_pipeline(compose_config(base))
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crf")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")
    by_model = {}
    for run in runs:
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        by_model[parent.data.tags["model"]] = run
    assert {a.path for a in client.list_artifacts(by_model["hmm"].info.run_id, "train")} >= {"train/bundle.npz"}
    assert "train/bundle.npz" in {a.path for a in client.list_artifacts(by_model["crf"].info.run_id, "train")}
    (pos_bundle,) = [p for p in (out / "cache").rglob("bundle.npz") if load_bundle(p).kind == "hmm"]
    return pos_bundle, f"runs:/{by_model['crf'].info.run_id}/train", uri, out


def _settings(models, source, target, uri, **extra):
    return {
        "models": models,
        "input": str(source),
        "output": str(target),
        "format": "auto",
        "conllu_pos": "xpos",
        "output_format": "auto",
        "marginals": False,
        "column_aliases": {"xpos": "pos"},
        "tracking_uri": uri,
        **extra,
    }


def _toy(n: int, seed: int) -> list[list[tuple[str, str, str]]]:
    rng = np.random.default_rng(seed)
    return [make_sentence(rng) for _ in range(n)]


def test_pipeline_bundles_record_where_they_came_from(trained):
    pos_bundle, chunker, uri, _ = trained
    pos = load_bundle(pos_bundle)
    assert pos.input_columns == ["w"] and pos.scheme == "none" and pos.source["dataset"]["label"] == "pos"
    assert pos.source["model"]["observation"] == "w"
    from pipeline.apps.tag import resolve_model

    chunk = load_bundle(resolve_model(chunker, uri))
    assert chunk.kind == "crf" and chunk.input_columns == ["w", "pos"] and chunk.scheme == "iob2"
    assert chunk.source["dataset"]["label"] == "chunk" and "templates" in chunk.source["features"]
    # the MLflow Model logged for the run holds the bundle as an artifact: found in its folder
    run = MlflowClient(uri).get_run(chunker.split("/")[1])
    model_uri = run.data.tags.get("model_uri")
    assert model_uri, "the runner tags the train run with its MLflow Model's URI"
    assert load_bundle(resolve_model(model_uri, uri)).labels == chunk.labels


def test_chained_text_to_chunks_in_jsonl(trained, tmp_path):
    pos_bundle, chunker, uri, _ = trained
    sentences = _toy(5, 7)
    text = tmp_path / "raw.txt"
    text.write_text("\n".join(" ".join(w for w, _, _ in s) for s in sentences) + "\n\n")
    target = tmp_path / "chunks.jsonl"
    summary = run_tag(_settings([str(pos_bundle), chunker], text, target, uri, format="text"))
    assert summary == {"sentences": 5, "tokens": sum(map(len, sentences))}
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["tokens"] for r in records] == [[w for w, _, _ in s] for s in sentences]
    # the chain equals running the POS tagger, then the chunker on its tags
    pos = load_bundle(pos_bundle).tag([[w for w, _, _ in s] for s in sentences])
    from pipeline.apps.tag import resolve_model

    chunk = load_bundle(resolve_model(chunker, uri)).tag(
        [[{"w": w, "pos": p} for (w, _, _), p in zip(s, o["labels"])] for s, o in zip(sentences, pos)]
    )
    for record, p, c in zip(records, pos, chunk):
        assert record["columns"]["pos"] == p["labels"] and record["labels"] == c["labels"]
        assert record["segments"] == [{**s, "confidence": round(s["confidence"], 6)} for s in c["segments"]]
        assert np.allclose(record["marginals"], c["marginals"], atol=1e-6)
    # the toy grammar is easy: the chain gets nearly every chunk label right
    gold = [label for s in sentences for _, _, label in s]
    predicted = [label for r in records for label in r["labels"]]
    assert np.mean(np.array(gold) == np.array(predicted)) > 0.9


def test_conll_with_gold_is_scored_and_written_with_marginals(trained, tmp_path):
    _, chunker, uri, _ = trained
    sentences = _toy(12, 3)
    source = tmp_path / "test.conll.gz"
    with gzip.open(source, "wt") as out:
        out.write("\n\n".join("\n".join(" ".join(row) for row in s) for s in sentences) + "\n")
    target = tmp_path / "tagged.conll"
    summary = run_tag(_settings(chunker, source, target, uri, marginals=True))
    assert summary["accuracy"] > 90 and summary["f1"] > 80 and {"precision", "recall"} <= set(summary)
    rows = read_conll(target)
    assert [len(s) for s in rows] == [len(s) for s in sentences]
    flat = [r for s in rows for r in s]
    assert all(len(r) == 5 for r in flat)  # w pos gold predicted marginal
    assert [r[:3] for r in flat] == [tuple(row) for s in sentences for row in s]
    assert all(0.0 < float(r[4]) <= 1.0 for r in flat)


def test_conllu_input_feeds_xpos_as_pos(trained, tmp_path):
    _, chunker, uri, _ = trained
    sentences = _toy(4, 5)
    lines = []
    for s in sentences:
        lines += ["# sent_id = x"] + [f"{i + 1}\t{w}\t_\tX\t{p}\t_\t0\t_\t_\t_" for i, (w, p, _) in enumerate(s)] + [""]
    source = tmp_path / "in.conllu"
    source.write_text("\n".join(lines) + "\n")
    target = tmp_path / "out.jsonl"
    run_tag(_settings(chunker, source, target, uri))
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert [[t["pos"] for t in r["tokens"]] for r in records] == [[p for _, p, _ in s] for s in sentences]
    assert np.mean([a == b for r, s in zip(records, sentences) for a, (_, _, b) in zip(r["labels"], s)]) > 0.9
    # the POS tagger scores itself against the XPOS column (its label column `pos` reads XPOS)
    pos_bundle = trained[0]
    summary = run_tag(_settings(str(pos_bundle), source, tmp_path / "pos.conll", uri))
    assert summary["accuracy"] > 90 and "f1" not in summary


def test_jsonl_token_objects_and_strings(trained, tmp_path):
    pos_bundle, chunker, uri, _ = trained
    sentences = _toy(3, 9)
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps({"tokens": [{"w": w, "pos": p} for w, p, _ in s]}) for s in sentences) + "\n")
    target = tmp_path / "out.conll"
    run_tag(_settings(chunker, source, target, uri))
    assert [len(s) for s in read_conll(target)] == [len(s) for s in sentences]
    words = tmp_path / "words.jsonl"
    words.write_text("\n".join(json.dumps({"tokens": [w for w, _, _ in s]}) for s in sentences) + "\n")
    run_tag(_settings(str(pos_bundle), words, tmp_path / "pos.jsonl", uri))
    records = [json.loads(line) for line in (tmp_path / "pos.jsonl").read_text().splitlines()]
    assert all("segments" not in r for r in records) and len(records) == 3


def test_bad_inputs_give_clear_errors(trained, tmp_path):
    pos_bundle, chunker, uri, _ = trained
    one_column = tmp_path / "words.conll"
    one_column.write_text("the\ndog\n\n")
    with pytest.raises(DataFormatError, match=r"needs the columns \['w', 'pos'\]"):
        run_tag(_settings(chunker, one_column, tmp_path / "o.conll", uri))
    empty = tmp_path / "empty.conll"
    empty.write_text("")
    with pytest.raises(DataFormatError, match="empty"):
        run_tag(_settings(chunker, empty, tmp_path / "o.conll", uri))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    with pytest.raises(DataFormatError, match="no text"):
        run_tag(_settings(str(pos_bundle), blank, tmp_path / "o.conll", uri, format="text"))
    with pytest.raises(ValueError, match=r"plain text gives words only.*\['w', 'pos'\]"):
        run_tag(_settings(chunker, blank, tmp_path / "o.conll", uri, format="text"))
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"tokens": [{"w": "the"}]}) + "\n")
    with pytest.raises(DataFormatError, match=r"missing.jsonl:1: .*lacks the columns \['pos'\]"):
        run_tag(_settings(chunker, missing, tmp_path / "o.conll", uri))
    with pytest.raises(TagError, match="no such file or folder, and not an MLflow URI"):
        run_tag(_settings(str(tmp_path / "nothing.npz"), one_column, tmp_path / "o.conll", uri))
    with pytest.raises(TagError, match="cannot download"):
        run_tag(_settings("runs:/0123456789abcdef0123456789abcdef/train", one_column, tmp_path / "o.conll", uri))
    with pytest.raises(FileNotFoundError, match="no such file"):
        run_tag(_settings(str(pos_bundle), tmp_path / "absent.txt", tmp_path / "o.conll", uri))
    assert not (tmp_path / "o.conll").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["models=x", "marginal=true"], "bad setting: Could not override 'marginal': the config has no such key"),
        (["models=x", "++marginal=true"], "bad setting: ++marginal=true: the config has no such key"),
        (["models=x", "format=text("], "bad setting: "),
    ],
)
def test_a_command_line_the_config_cannot_take_is_one_line_before_hydra(argv, message, caplog):
    """A key the config lacks, given without '+', got Hydra's several lines and exit 1 (round 28)."""
    from pipeline.apps import exit_if_uncomposable

    with pytest.raises(SystemExit) as ended:
        exit_if_uncomposable("tag", argv)
    assert ended.value.code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(message) and "\n" not in errors[0], errors
    exit_if_uncomposable("tag", ["models=x", "++marginals=true"])  # an existing key: taken


def test_a_setting_added_on_the_command_line_or_out_of_range_is_refused(trained, tmp_path):
    """``+marginal=true`` (for ``marginals``) was ignored: CoNLL written without the column, exit 0;
    ``conllu_pos=lemma`` was refused only for CoNLL-U input (round 27)."""
    from hydra import compose, initialize_config_dir

    from pipeline.apps import added_setting

    _, chunker, uri, _ = trained
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose(config_name="tag", overrides=["+marginal=true"], return_hydra_config=True)
    assert added_setting(cfg, "the tag command") == (
        "bad setting +marginal: the tag command has no such setting; did you mean marginals?"
    )
    source = tmp_path / "in.conll"
    _write_conll(source, _toy(2, 1))
    with pytest.raises(TagError, match="conllu_pos='lemma'; upos or xpos"):
        run_tag(_settings(chunker, source, tmp_path / "o.conll", uri, conllu_pos="lemma"))


def test_a_combining_mark_stays_in_its_word():
    """An accent written apart (NFD text, as macOS writes it) and a Devanagari vowel sign are no
    word characters to the pattern: "café" became "cafe" and a bare accent, tagged as a word, and
    Hindi was cut into letters (round 36)."""
    assert tokenize(unicodedata.normalize("NFD", "Le café est bon.")) == [
        "Le", unicodedata.normalize("NFD", "café"), "est", "bon", ".",
    ]  # fmt: skip
    assert tokenize("हिन्दी भाषा है।") == ["हिन्दी", "भाषा", "है", "।"]
    assert "".join(tokenize(unicodedata.normalize("NFD", "résumé, déjà"))) == unicodedata.normalize("NFD", "résumé,déjà")


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("my 👨\u200d👩\u200d👧 family", ["my", "👨\u200d👩\u200d👧", "family"]),  # an emoji joined by ZWJ is one
        ("ok 👍🏽 thanks", ["ok", "👍🏽", "thanks"]),  # a skin tone stays on its emoji
        ("go 🇫🇷🇩🇪 now", ["go", "🇫🇷", "🇩🇪", "now"]),  # a flag is a pair of indicators
        ("می\u200cخواهم x", ["می\u200cخواهم", "x"]),  # ZWNJ is Persian spelling inside a word
        ("abc\u200f def", ["abc\u200f", "def"]),  # a direction mark belongs to the character before it
        ("a \u200f\u200e b", ["a", "b"]),  # standing alone, invisible characters are space
        ("\u200fabc", ["abc"]),  # with nothing before them, space: a token never starts with one
        ("The cat \ufeffsat .", ["The", "cat", "sat", "."]),  # a byte-order mark where files were joined (round 38)
        ("a \ufe0f \u034f \u3164 \u115f\u1160 b", ["a", "b"]),  # variation selector, CGJ, Hangul fillers alone
        ("a \u0600 b", ["a", "\u0600", "b"]),  # a visible format character (Arabic number sign) alone is one
        ("co\u00adop", ["co\u00adop"]),  # a soft hyphen does not cut its word
        ("foo\u200bbar", ["foo", "bar"]),  # a zero-width space is space
        ("(\u0301yes)", ["(\u0301", "yes", ")"]),  # a mark on punctuation stays on it
        ("a \u0301b", ["a", "\u0301b"]),  # a mark with nothing before it joins the next word
        ("\u0301 a", ["\u0301", "a"]),  # or, standing alone, is a character of its own
        ("1\ufe0f\u20e3 now", ["1\ufe0f\u20e3", "now"]),  # a keycap
        ("résumés. and éx. foo", ["résumés", ".", "and", "éx", ".", "foo"]),  # [A-Za-z] abbreviations only
        ("Le café-au-lait", ["Le", "café-au-lait"]),
        ("x \u0d4e< (\uff9e)", ["x", "\u0d4e<", "(\uff9e", ")"]),  # a prepended letter, a halfwidth voiced mark (round 39)
    ],
)  # fmt: skip
def test_tokens_are_whole_grapheme_clusters_in_nfc_and_nfd_alike(text, tokens):
    """Tokens are made of what a reader sees as characters (Unicode's grapheme clusters) and are
    the same for NFC and NFD text: a ZWJ, a skin tone or a flag's second half became a token of
    its own, invisible joiners and direction marks were tagged, and an NFD "résumés." kept its
    period where the NFC one lost it (round 37)."""
    assert tokenize(text) == tokens
    for form in ("NFC", "NFD"):
        written = unicodedata.normalize(form, text)
        assert tokenize(written) == [unicodedata.normalize(form, token) for token in tokens]
    assert all(token in text for token in tokenize(text))  # tokens are the text as written


def test_random_text_gives_the_same_tokens_in_nfc_and_nfd_and_loses_no_visible_character():
    """Seeded random lines of letters, accents written apart, emoji, joiners, direction marks,
    flags, punctuation and spaces: the tokens are the line's visible characters in order, none is
    made of invisible characters only, and NFC and NFD lines give the same tokens."""
    import regex

    from crf.bundle import check_tokens
    from pipeline.apps.formats import _clusters

    invisible = regex.compile(r"\p{Default_Ignorable_Code_Point}")

    pieces = ["a", "e", "s", "S", "x", "é", "e\u0301", "\u0301", "\u200d", "\u200c", "\u200f", "\u00ad", "👍", "🏽",
              "🇫", "🇷", "क", "ि", ".", ",", "(", "'", "-", "3", " ", " ", "\u200b", "\ufe0f", "Mr", "\ufeff", "\u3164",
              "\u0600", "\u034f", "\u0d4e", "\uff9e", "<"]  # fmt: skip
    rng = np.random.default_rng(7)
    for _ in range(400):
        line = "".join(rng.choice(pieces, size=int(rng.integers(1, 12))))
        tokens = tokenize(line)
        check_tokens({"w": np.array(tokens, dtype=object)}, np.array([0, len(tokens)]))  # what the model takes
        assert not any(invisible.match(token) for token in tokens), repr(line)  # none starts with an invisible one
        visible = [c for c in line if not c.isspace() and not invisible.match(c)]
        assert [c for c in "".join(tokens) if not invisible.match(c)] == visible, repr(line)
        nfd = tokenize(unicodedata.normalize("NFD", line))
        assert [unicodedata.normalize("NFC", t) for t in nfd] == [unicodedata.normalize("NFC", t) for t in tokens], repr(line)
    for line in ["Mr. Smith of AT&T Corp. said 3.5% in Sept.", "I don't think it's Dr. Jones's car, etc. ..."]:
        assert _clusters(line) == (list(range(len(line) + 1)), line)  # lines that need no clusters stand as themselves


def test_tokenizer_splits_like_the_penn_treebank():
    assert tokenize("Cannot wait, I'm gonna go; wanna gotta gimme lemme. Canon gonnad") == [
        "Can", "not", "wait", ",", "I", "'m", "gon", "na", "go", ";", "wan", "na", "got", "ta", "gim", "me", "lem", "me", ".",
        "Canon", "gonnad",
    ]  # fmt: skip
    assert tokenize("I don't think John's U.S. car costs $1,000.50 -- or 5%...") == [
        "I", "do", "n't", "think", "John", "'s", "U.S.", "car", "costs", "$", "1,000.50", "--", "or", "5", "%", "...",
    ]  # fmt: skip
    assert tokenize("We're well-known (ca. 3:30), 3rd.") == [
        "We",
        "'re",
        "well-known",
        "(",
        "ca",
        ".",
        "3:30",
        ")",
        ",",
        "3rd",
        ".",
    ]


def test_command_line(trained, tmp_path):
    pos_bundle, chunker, _, out = trained
    text = tmp_path / "raw.txt"
    text.write_text("the old dog sees a cat .\na man buys the red house in the big house .\n")
    target = tmp_path / "out.conll"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    common = [f"paths.output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}", "format=text"]
    done = forkserver.run(
        [sys.executable, "-m", "pipeline.tag", f"model=[{pos_bundle},{chunker}]", f"input={text}", f"output={target}", *common],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    rows = read_conll(target)
    assert [r[0] for r in rows[0]] == "the old dog sees a cat .".split()
    assert [r[2] for r in rows[0]] == ["B-NP", "I-NP", "I-NP", "B-VP", "B-NP", "I-NP", "O"]
    failed = forkserver.run(
        [sys.executable, "-m", "pipeline.tag", f"model={tmp_path / 'nothing'}", f"input={text}", f"output={target}", *common],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert failed.returncode == 2 and "no such file or folder" in failed.stdout + failed.stderr


def test_model_override_is_renamed_for_hydra():
    assert renamed(["tag.py", "model=[a,b]", "input=x", "models=c"]) == ["tag.py", "models=[a,b]", "input=x", "models=c"]


# ---- scores: percentages, checked against an independent count ----------------------------------------------------


def _write_conll(path: Path, sentences) -> None:
    path.write_text("\n\n".join("\n".join(" ".join(row) for row in s) for s in sentences) + "\n")


def _cli(args: list[str], cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """``python -m pipeline.tag`` in ``cwd`` with no MLflow variables from the test process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_") or k == "MLFLOW_DISABLE_TELEMETRY"}
    env.update(PYTHONPATH=str(ROOT), **extra_env)
    hydra = f"hydra.run.dir={cwd / '.hydra-tag'}"
    return forkserver.run(
        [sys.executable, "-m", "pipeline.tag", *args, hydra], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_scores_are_percentages_matching_an_independent_count(trained, tmp_path):
    """Found: ``accuracy 10000.00`` (a percentage multiplied by 100 again). Every score is in percent
    and equals a count made here from the written file (accuracy) and by seqeval (chunks)."""
    _, chunker, uri, _ = trained
    sentences = _toy(60, 21)
    labels = ["B-NP", "I-NP", "B-VP", "B-PP", "O"]
    corrupted = [[(w, p, labels[(labels.index(c) + 1) % 5] if (i * 7 + j) % 11 == 0 else c) for j, (w, p, c) in enumerate(s)]
                 for i, s in enumerate(sentences)]  # fmt: skip
    source, target = tmp_path / "gold.conll", tmp_path / "tagged.conll"
    _write_conll(source, corrupted)
    summary = run_tag(_settings(chunker, source, target, uri))
    rows = [r for s in read_conll(target) for r in s]  # w pos gold predicted
    gold = [[r[2] for r in s] for s in read_conll(target)]
    predicted = [[r[3] for r in s] for s in read_conll(target)]
    matches = sum(r[2] == r[3] for r in rows)
    assert summary["tokens"] == len(rows) and 0 < matches < len(rows)
    assert summary["accuracy"] == pytest.approx(100.0 * matches / len(rows), abs=1e-9)
    assert summary["precision"] == pytest.approx(100.0 * precision_score(gold, predicted), abs=1e-9)
    assert summary["recall"] == pytest.approx(100.0 * recall_score(gold, predicted), abs=1e-9)
    assert summary["f1"] == pytest.approx(100.0 * f1_score(gold, predicted), abs=1e-9)
    assert all(0.0 <= summary[k] <= 100.0 for k in ("accuracy", "precision", "recall", "f1"))
    # the command prints the same percentages
    done = _cli([f"model={resolve_model(chunker, uri)}", f"input={source}", f"output={tmp_path / 'cli.conll'}"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = re.search(r"accuracy ([0-9.]+), precision ([0-9.]+), recall ([0-9.]+), f1 ([0-9.]+)", done.stdout + done.stderr)
    assert printed, done.stdout + done.stderr
    assert [float(v) for v in printed.groups()] == [round(summary[k], 2) for k in ("accuracy", "precision", "recall", "f1")]


def test_pos_accuracy_is_a_percentage(trained, tmp_path):
    pos_bundle = trained[0]
    sentences = _toy(10, 4)
    source = tmp_path / "pos.conll"
    wrong = [[(w, p if j else "XX") for j, (w, p, _) in enumerate(s)] for s in sentences]  # every first tag wrong
    _write_conll(source, wrong)
    summary = run_tag(_settings(str(pos_bundle), source, tmp_path / "out.conll", None))
    rows = [r for s in read_conll(tmp_path / "out.conll") for r in s]
    assert summary["accuracy"] == pytest.approx(100.0 * sum(r[1] == r[2] for r in rows) / len(rows)) and summary["accuracy"] < 100


# ---- models:/ and runs:/ URIs: the pipeline's store, no stray mlflow.db; the closing lines -------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _closing(messages: list[str]) -> dict[str, str]:
    """The handoff lines of a run's closing message: {"model": ..., "train run": ..., "bundle": ..., "tag": ...}."""
    (done,) = [m for m in messages if m.startswith("done: run ")]
    lines = dict(line.strip().split(": ", 1) for line in done.splitlines()[1:])
    return lines


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A project folder where ``python -m pipeline ... registry.register=true`` ran with the default
    store (``./outputs/mlflow.db``), twice (the second time from the cache), training and
    evaluating (a version without a dev score never takes the alias): (project folder, store URI,
    closing lines of both runs, pipeline run ids)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    project = tmp_path_factory.mktemp("project")
    corpus = write_corpus(project / "data", n_train=80, n_test=20)
    overrides = tiny_overrides(corpus, project / "outputs") + ["stages=[train,evaluate]", "registry.register=true"]
    handler, runner_log = _Lines(), logging.getLogger("pipeline.engine.runner")
    level = runner_log.level
    runner_log.addHandler(handler)
    runner_log.setLevel(logging.INFO)
    try:
        closings = []
        for _ in range(2):
            handler.messages.clear()
            run_pipeline(compose_config(overrides))
            closings.append(_closing(handler.messages))
    finally:
        runner_log.removeHandler(handler)
        runner_log.setLevel(level)
    uri = f"sqlite:///{project / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crf").experiment_id
    parents = client.search_runs([experiment], "tags.stage = 'pipeline'", order_by=["attributes.start_time ASC"])
    return project, uri, closings, [r.info.run_id for r in parents]


def _labels(bundle_path: Path) -> list[str]:
    return load_bundle(bundle_path).labels


def test_closing_lines_name_what_loads(registered, tmp_path, monkeypatch):
    """Found: ``runs:/<the printed run id>/train`` failed. The closing lines now name the model's
    URI, the run holding the train stage's files (the first run's, when the train stage came from
    the cache), the bundle and a tag command that works from any folder."""
    project, uri, (first, second), parents = registered
    monkeypatch.chdir(tmp_path)
    client = MlflowClient(uri)
    for closing in (first, second):
        assert {"open", "outputs", "model", "train run", "bundle", "tag"} <= set(closing), closing
        assert closing["model"].startswith("models:/m-") and "(registered as models:/conll2000-crf/" in closing["model"]
        train_run = closing["train run"]
        assert re.fullmatch(r"runs:/[0-9a-f]{32}/model", train_run)
        assert client.list_artifacts(train_run.split("/")[1], "train"), "the printed run holds the files"
        bundle = Path(closing["bundle"])
        assert bundle.is_file() and bundle.name == "bundle.npz"
        model_uri = closing["model"].split()[0]
        for reference in (model_uri, train_run):
            assert _labels(resolve_model(reference, uri)) == _labels(bundle)
        assert closing["tag"] == f"python -m pipeline.tag model={model_uri} input=<file> output=<file> tracking.uri={uri}"
    assert second["train run"] == first["train run"]  # the cached run's files are the first run's
    assert not (tmp_path / "mlflow.db").exists()
    # the printed command, copied into another folder, tags
    source = tmp_path / "in.conll"
    _write_conll(source, _toy(3, 1))
    command = shlex.split(second["tag"].replace("<file> output=<file>", f"{source} output={tmp_path / 'out.conll'}"))
    done = _cli(command[3:], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_conll(tmp_path / "out.conll")) == 3 and not (tmp_path / "mlflow.db").exists()


def test_models_and_runs_uris_resolve_in_the_pipeline_store(registered, tmp_path, monkeypatch):
    """Found: ``models:/conll2000-crf@champion`` failed ("Registered Model ... not found") and left
    ``./mlflow.db``: MLflow's registry URI fell back to the current folder. Registry and runs now
    resolve in the tag command's store; ``runs:/<pipeline run id>/train`` follows the run to its
    train stage; MLflow's URIs and variables are as before afterwards."""
    project, uri, (first, _), parents = registered
    monkeypatch.chdir(tmp_path)
    before = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    source = tmp_path / "in.conll"
    _write_conll(source, _toy(4, 2))
    expected = _labels(Path(first["bundle"]))
    references = ["models:/conll2000-crf@champion", "models:/conll2000-crf/1", first["model"].split()[0], first["train run"]]
    references += [f"runs:/{parent}/train" for parent in parents]  # the ids a run prints first: its pipeline run
    for reference in references:
        summary = run_tag(_settings(reference, source, tmp_path / "out.conll", uri))
        assert summary["tokens"] == sum(map(len, _toy(4, 2))), reference
        assert _labels(resolve_model(reference, uri)) == expected
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.rglob("*.db"))
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ
    assert (mlflow.get_tracking_uri(), mlflow.get_registry_uri()) == before
    # a path the pipeline run does not have: the message names the run that does
    with pytest.raises(TagError, match=rf"run {parents[0]} is a pipeline run, its train stage ran as run [0-9a-f]{{32}}"):
        run_tag(_settings(f"runs:/{parents[0]}/nothing", source, tmp_path / "out.conll", uri))


def test_command_resolves_a_registered_model_where_the_pipeline_ran(registered, tmp_path):
    project, uri, _, _ = registered
    source = tmp_path / "in.conll"
    _write_conll(source, _toy(3, 3))
    args = ["model=models:/conll2000-crf@champion", f"input={source}", f"output={tmp_path / 'out.conll'}"]
    done = _cli(args, project)  # the folder `python -m pipeline` ran in: its default store ./outputs/mlflow.db
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(read_conll(tmp_path / "out.conll")) == 3 and not (project / "mlflow.db").exists()
    # from a folder without a store: one line naming the store it looked for; no database created
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    failed = _cli([*args[:2], f"output={elsewhere / 'out.conll'}"], elsewhere)
    assert failed.returncode == 2 and "Traceback" not in failed.stdout + failed.stderr
    assert f"no MLflow store at {elsewhere / 'outputs' / 'mlflow.db'}" in failed.stdout
    assert not list(elsewhere.rglob("*.db")) and not (elsewhere / "out.conll").exists()
    # naming the store works from anywhere
    named = _cli([*args[:2], f"output={elsewhere / 'out.conll'}", f"tracking.uri={uri}"], elsewhere)
    assert named.returncode == 0, named.stdout + named.stderr
    assert not list(elsewhere.rglob("*.db"))


def test_readme_lines_for_a_plain_python_session(registered, tmp_path):
    """What a plain Python session sets to load ``models:/conll2000-crf@champion`` (the README's lines)."""
    _, uri, (first, _), _ = registered
    code = f"""
import mlflow, pandas as pd
mlflow.set_tracking_uri("{uri}")
mlflow.set_registry_uri("{uri}")
model = mlflow.pyfunc.load_model("models:/conll2000-crf@champion")
frame = pd.DataFrame({{"sentence": [0, 0, 0], "w": ["the", "dog", "runs"], "pos": ["DT", "NN", "VB"]}})
print(model.predict(frame)["label"].tolist())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_") or k == "MLFLOW_DISABLE_TELEMETRY"}
    done = forkserver.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    frame = pd.DataFrame({"sentence": [0, 0, 0], "w": ["the", "dog", "runs"], "pos": ["DT", "NN", "VB"]})
    assert done.stdout.strip() == str(load_bundle(first["bundle"]).tag_frame(frame)["label"].tolist())
    assert not list(tmp_path.rglob("*.db"))


def test_an_output_named_gz_in_capitals_is_compressed(tmp_path):
    """``x.JSONL.GZ`` was taken for JSONL, by a check that ignores case, and written uncompressed
    (round 45)."""
    from pipeline.apps.formats import _write_text

    _write_text(tmp_path / "x.JSONL.GZ", "{}\n")
    assert gzip.decompress((tmp_path / "x.JSONL.GZ").read_bytes()) == b"{}\n"

"""Fault injection off the beaten path: hostile inputs to the tag command and the served model, and
the files other programs read. Each test builds the hostile input, runs the real code (the command
in a subprocess for exit codes and its one-line error, ``run_tag`` or the scoring server's own
request handler for the rest) and checks the exact outcome and that nothing else changed: no
partial output, no stray ``mlflow.db``, no ``NaN`` in JSON, no word lost between stages."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import forkserver
import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.pyfunc import scoring_server  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from pipeline_helpers import compose_config, make_sentence, tiny_overrides, write_corpus  # noqa: E402

from crf.io import DataFormatError, read_conll  # noqa: E402
from pipeline import report as strict_json  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.apps import tag as tag_command  # noqa: E402
from pipeline.apps.formats import Corpus, Prediction, read_input, write_jsonl  # noqa: E402
from pipeline.apps.tag import TagError, run_tag  # noqa: E402
from pipeline.stages.data import load_dataset  # noqa: E402
from pipeline.stages.prepare import read_prepared, write_split  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _refuse_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def strict_loads(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity (as JavaScript's JSON.parse does)."""
    return json.loads(text, parse_constant=_refuse_constant)


@pytest.fixture(scope="module")
def run(tiny_pipeline):
    """The session's tiny pipeline run, every stage (conftest): (output folder, store URI, bundle path,
    MLflow Model URI, results)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    out, uri, results = tiny_pipeline.out, tiny_pipeline.uri, tiny_pipeline.results
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crf").experiment_id
    (train,) = client.search_runs([experiment], f"tags.stage = 'train' and tags.mlflow.parentRunId = '{tiny_pipeline.parent_id}'")
    bundle = Path(train.data.tags["cache_path"]) / "bundle.npz"
    return out, uri, bundle, train.data.tags["model_uri"], results


def _settings(model, source, target, **extra):
    return {"models": str(model), "input": str(source), "output": str(target), "format": "auto", "conllu_pos": "xpos",
            "output_format": "auto", "marginals": False, "column_aliases": {"xpos": "pos"}, **extra}  # fmt: skip


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_") or k == "MLFLOW_DISABLE_TELEMETRY"}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pipeline.tag", *args, f"hydra.run.dir={cwd / '.hydra-tag'}"]
    return forkserver.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    """The command failed with status 2 and one ERROR line, no traceback; that line."""
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, text
    return errors[0]


def _jsonl(path: Path, sentences) -> Path:
    path.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in sentences))
    return path


def _words(n: int, seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    return [[{"w": w, "pos": p} for w, p, _ in make_sentence(rng)] for _ in range(n)]


@pytest.fixture
def no_tagging(monkeypatch):
    """Fail the test if tagging starts (every refusal must come before it)."""

    def refuse(*args, **kwargs):
        raise AssertionError("tagging started")

    monkeypatch.setattr(tag_command, "tag_corpus", refuse)


# ---- output other programs read: strict JSON ----------------------------------------------------------------------


def test_strict_json_writes_non_finite_numbers_as_null(tmp_path):
    value = {"a": float("nan"), "b": [float("inf"), -np.inf, np.float32("nan"), np.int64(3)], "c": np.array([1.5, np.nan])}
    text = strict_json.dumps(value)
    assert strict_loads(text) == {"a": None, "b": [None, None, None, 3], "c": [1.5, None]}
    strict_json.write_json(tmp_path / "x.json", value)
    assert strict_loads((tmp_path / "x.json").read_text()) == strict_loads(text)


def test_the_stages_json_files_are_strict(run):
    """Every JSON file the stages write parses strictly; the toy test split has no unknown words, so
    its unknown-word accuracy is left out rather than written as NaN."""
    out, _, _, _, results = run
    files = sorted((out / "cache").rglob("*.json"))
    names = {p.name for p in files}
    assert {"stats.json", "dataset.json", "features.json", "metrics.json", "stage_metrics.json"} <= names
    for path in files:
        strict_loads(path.read_text())  # no NaN / Infinity anywhere
    (metrics,) = [p for p in files if p.name == "metrics.json"]
    # no unknown word in test: the figure is left out (never NaN)
    assert "test_unknown_accuracy" not in strict_loads(metrics.read_text())
    assert "evaluate.test_unknown_accuracy" not in results and results["evaluate.test_f1"] >= 0


def test_jsonl_output_is_strict_and_one_line_per_sentence(tmp_path):
    """NaN marginals and confidences (a sentence the model gives probability 0) are null; tokens with
    the separators that splitlines() and some JSONL readers break lines on stay on their line."""
    tokens = np.array(["a\u2028b", "c\x85d", "tab\there", 'q"uote', "x", "line\nbreak", "e\u2029f"], dtype=object)
    corpus = Corpus({"w": tokens}, np.array([3, 4]), None, ["w"])
    segments = pd.DataFrame(
        {"sequence": [0, 1], "start": [0, 1], "end": [2, 3], "type": ["NP", "NP"], "confidence": [np.nan, 0.5]}
    )
    labels = np.array(["B-NP", "I-NP", "O", "O", "B-NP", "I-NP", "O"], dtype=object)
    marginals = np.array([np.nan, 0.5, np.inf, 0.25, np.nan, 1.0, 0.75])
    write_jsonl(tmp_path / "out.jsonl", corpus, [Prediction("chunk", labels, marginals, segments)])
    text = (tmp_path / "out.jsonl").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) == 2 and len(text.split("\n")) == 3
    records = [strict_loads(line) for line in lines]
    assert [t for r in records for t in r["tokens"]] == tokens.tolist()
    assert records[0]["marginals"] == [None, 0.5, None] and records[0]["segments"][0]["confidence"] is None


def test_the_served_answer_is_strict_json(run):
    """Outside any chunk segment_confidence is no number: the model answers None, MLflow's serialiser null."""
    _, uri, _, model_uri, _ = run
    mlflow.set_tracking_uri(uri)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    model = mlflow.pyfunc.load_model(model_uri)
    frame = pd.DataFrame({"sentence": [0, 0, 0, 0], "w": ["the", "dog", "runs", "."], "pos": ["DT", "NN", "VB", "."]})
    answer = scoring_server.invocations(json.dumps({"dataframe_split": frame.to_dict(orient="split", index=False)}),
                                        "application/json", model, model.metadata.get_input_schema())  # fmt: skip
    assert answer.status == 200
    rows = strict_loads(answer.response)["predictions"]
    assert rows[-1]["label"] == "O" and rows[-1]["segment_confidence"] is None
    assert all(isinstance(r["marginal"], float) for r in rows)


# ---- CoNLL output: a token the format cannot hold is refused before tagging ---------------------------------------


@pytest.mark.parametrize(
    "token",
    ["New York", "tab\there", "line\nbreak", "cr\rx", "nbsp\u00a0x", "sep\u2028x", "unit\x1fx"],
    ids=["space", "tab", "newline", "cr", "nbsp", "u2028", "unit-separator"],
)
def test_a_token_with_whitespace_is_refused_before_tagging(run, tmp_path, token, monkeypatch):
    """No training reader makes such a token (they split on whitespace): refused for every output,
    by the check ModelBundle.tag and the MLflow Model make (crf.bundle.check_tokens)."""
    _, _, bundle, _, _ = run
    sentences = _words(3)
    sentences[1][2]["w"] = token
    source = _jsonl(tmp_path / "in.jsonl", sentences)
    for name in ("out.conll", "out.jsonl"):
        with monkeypatch.context() as patch:
            patch.setattr(tag_command, "tag_corpus", lambda *a, **k: pytest.fail("tagging started"))
            with pytest.raises(TagError, match=r"sentence 2, token 3, column 'w': a token must not hold whitespace"):
                run_tag(_settings(bundle, source, tmp_path / name))
        assert not (tmp_path / name).exists()


def test_the_command_refuses_a_conll_cell_in_one_line(run, tmp_path):
    _, _, bundle, _, _ = run
    sentences = _words(2)
    sentences[0][0]["w"] = "New York"
    source = _jsonl(tmp_path / "in.jsonl", sentences)
    line = _one_line_error(_cli([f"model={bundle}", f"input={source}", f"output={tmp_path / 'out.conll'}"], tmp_path))
    assert "sentence 1, token 1, column 'w': a token must not hold whitespace" in line
    assert not (tmp_path / "out.conll").exists()


# ---- words that look like directives ------------------------------------------------------------------------------


def _conll_with_directive_words(path: Path, n: int, seed: int = 5) -> int:
    """CoNLL-2000-shaped sentences where ``#`` opens some sentences and ``-DOCSTART-`` stands inside
    others, as ordinary words; returns the number of token lines."""
    rng = np.random.default_rng(seed)
    lines, tokens = [], 0
    for i in range(n):
        rows = [" ".join(r) for r in make_sentence(rng)]
        if i % 3 == 0:
            rows.insert(0, "# # O")
        if i % 4 == 1:
            rows.insert(2, "-DOCSTART- NNP B-NP")
        if i % 5 == 2:
            rows = ["-DOCSTART- NNP B-NP"] + rows
        lines.append("\n".join(rows))
        tokens += len(rows)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write("\n\n".join(lines) + "\n")
    return tokens


def test_directive_words_keep_their_place_through_the_stages(tmp_path):
    """CoNLL-2000 has no comments and no document markers: ``#`` and ``-DOCSTART-`` lines are words.
    The dataset reader, the prepare stage's statistics and the prepared files all count them."""
    root = write_corpus(tmp_path / "data", n_train=10, n_test=5)
    train_tokens = _conll_with_directive_words(root / "conll2000" / "train.txt.gz", 60)
    test_tokens = _conll_with_directive_words(root / "conll2000" / "test.txt.gz", 12, seed=6)  # not the training sentences
    cfg = compose_config(tiny_overrides(root, tmp_path / "out") + ["stages=[prepare]"])
    results = run_pipeline(cfg)
    assert results["prepare.train_tokens"] + results["prepare.dev_tokens"] == train_tokens
    assert results["prepare.test_tokens"] == test_tokens
    assert results["prepare.train_sentences"] + results["prepare.dev_sentences"] == 60
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    loaded = load_dataset(dataset, root, download=False)
    (prepared,) = (tmp_path / "out" / "cache" / "prepare").iterdir()
    assert read_prepared(prepared).splits == loaded.splits
    words = [row[0] for s in loaded.splits["test"] for row in s]
    assert words.count("#") == 4 and words.count("-DOCSTART-") == 3 + 2  # i % 3 == 0; i % 4 == 1, i % 5 == 2 of 12


def test_comments_and_document_markers_only_where_the_dataset_says(tmp_path):
    """A corpus whose sentences open with ``# ...`` header lines and that has CoNLL-2003 document
    lines names them; a word ``#`` inside a sentence is still a token."""
    root = write_corpus(tmp_path / "data", n_train=5, n_test=5)
    text = (
        "-DOCSTART- -X- O\n\n"
        "# sent_id = 1\n# text = the # dog\nthe DT B-NP\n# SYM O\ndog NN I-NP\n\n"
        "# sent_id = 2\na DT B-NP\ncat NN I-NP\n\n"
        "-DOCSTART- -X- O\n\n"
        "# sent_id = 3\n# SYM O\nruns VB B-VP\n"
    )
    (root / "conll2000" / "train.txt.gz").write_bytes(gzip.compress(text.encode()))
    dataset = OmegaConf.to_container(compose_config([]).dataset, resolve=True)
    for spec in dataset["files"].values():
        spec["sha256"] = None
    dataset.update(comment_prefix="#", document_marker="-DOCSTART-", dev_split={"fraction": 0.01, "seed": 0})
    data = load_dataset(dataset, root, download=False, carve_dev=False)
    assert data.splits["train"] == [
        [("the", "DT", "B-NP"), ("#", "SYM", "O"), ("dog", "NN", "I-NP")],
        [("a", "DT", "B-NP"), ("cat", "NN", "I-NP")],
        [("runs", "VB", "B-VP")],  # a sentence-opening "# SYM O" is a header line here: the documented rule
    ]
    # unset (the default), every one of those lines is a token line, and the header lines do not fit
    dataset.update(comment_prefix=None, document_marker=None)
    with pytest.raises(DataFormatError, match=r"train.txt.gz:3: expected 3 columns, found 4: '# sent_id = 1'"):
        load_dataset(dataset, root, download=False, carve_dev=False)


def test_prepared_splits_keep_directive_words_of_every_format(tmp_path):
    """The prepared files are the pipeline's own format: CoNLL-U words ``#`` and ``-DOCSTART-`` and an
    AnyStyle field starting with ``-DOCSTART-`` come back from them as they went in."""
    conllu = tmp_path / "x.conllu"
    conllu.write_text(
        "# sent_id = 1\n# text = # -DOCSTART-\n"
        "1\t#\t#\tSYM\tNFP\t_\t0\troot\t_\t_\n2\t-DOCSTART-\t-DOCSTART-\tX\tNN\t_\t1\tdep\t_\t_\n\n"
    )
    xml = tmp_path / "x.xml"
    xml.write_text("<dataset><sequence><title>-DOCSTART- # of things</title><date>2001</date></sequence></dataset>")
    dataset = OmegaConf.to_container(compose_config(["dataset=ud_english_ewt_upos"]).dataset, resolve=True)
    from pipeline.stages.data import read_split

    sentences = {
        "conllu": read_split(conllu, dataset),
        "xml": read_split(xml, {**dataset, "format": "xml_sequences"}),
    }
    assert [row[1] for row in sentences["conllu"][0]] == ["#", "-DOCSTART-"]
    assert [row[0] for row in sentences["xml"][0]] == ["-DOCSTART-", "#", "of", "things", "2001"]
    for name, split in sentences.items():
        folder = tmp_path / name
        folder.mkdir()
        columns = list(dataset["columns"]) if name == "conllu" else ["w", "field"]
        (folder / "dataset.json").write_text(json.dumps({"name": name, "columns": columns, "label": columns[-1]}))
        for part in ("train", "dev", "test"):
            write_split(folder / f"{part}.conll.gz", split)
        assert read_prepared(folder).splits["train"] == split


@pytest.mark.parametrize(
    "cell,problem",
    [("", "empty"), ("a\tb", "tab"), ("a\nb", "line break"), ("a\rb", "line break")],
    ids=["empty", "tab", "newline", "cr"],
)
def test_prepare_refuses_a_cell_it_could_not_read_back(tmp_path, cell, problem):
    sentences = [[("a", "DT", "B-NP")], [("b", "NN", "B-NP"), (cell, "NN", "I-NP")]]
    with pytest.raises(ValueError, match=rf"train.conll.gz: sentence 2, token 2, column 1: .*{problem}"):
        write_split(tmp_path / "train.conll.gz", sentences)


def test_tag_command_reads_directive_words_as_tokens(run, tmp_path):
    """The tag command's CoNLL reader follows the pipeline's: no comments, no document markers unless named."""
    _, _, bundle, _, _ = run
    source = tmp_path / "in.conll"
    source.write_text("# #\nthe DT\ndog NN\n\n-DOCSTART- NNP\n\na DT\n# #\ncat NN\n")
    summary = run_tag(_settings(bundle, source, tmp_path / "out.conll"))
    assert summary["sentences"] == 3 and summary["tokens"] == 7
    assert [[r[0] for r in s] for s in read_conll(tmp_path / "out.conll", document_marker=None)] == [
        ["#", "the", "dog"], ["-DOCSTART-"], ["a", "#", "cat"],
    ]  # fmt: skip
    source.write_text("# sent 1\nthe DT\ndog NN\n\n-DOCSTART- -X-\n\na DT\n# #\ncat NN\n")
    summary = run_tag(_settings(bundle, source, tmp_path / "out.jsonl", comment_prefix="#", document_marker="-DOCSTART-"))
    records = [strict_loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [[t["w"] for t in r["tokens"]] for r in records] == [["the", "dog"], ["a", "#", "cat"]]


# ---- the output place: checked before anything, one line, exit 2 --------------------------------------------------


@pytest.mark.parametrize("place", ["folder", "read-only folder"])
def test_output_to_a_folder_or_read_only_place_is_one_line_and_exit_2(run, tmp_path, place):
    _, _, bundle, _, _ = run
    source = _jsonl(tmp_path / "in.jsonl", _words(2))
    folder = tmp_path / "place"
    folder.mkdir()
    target = folder if place == "folder" else folder / "out.conll"
    if place == "read-only folder":
        folder.chmod(0o555)
    try:
        done = _cli([f"model={bundle}", f"input={source}", f"output={target}"], tmp_path)
        line = _one_line_error(done)
    finally:
        folder.chmod(0o755)
    assert ("is a directory" if place == "folder" else f"the folder {folder} is read-only") in line
    assert "tagged into" not in done.stdout + done.stderr  # refused before tagging
    assert list(folder.iterdir()) == []


def test_output_places_refused_before_the_model_is_even_loaded(run, tmp_path, monkeypatch, no_tagging):
    _, _, bundle, _, _ = run
    source = _jsonl(tmp_path / "in.jsonl", _words(2))
    monkeypatch.setattr(tag_command, "resolve_model", lambda *a, **k: pytest.fail("the model was resolved"))
    with pytest.raises(TagError, match="does not exist"):
        run_tag(_settings(bundle, source, tmp_path / "missing" / "out.conll"))
    locked = tmp_path / "locked.conll"
    locked.write_text("keep me\n")
    locked.chmod(0o444)
    with pytest.raises(TagError, match="the file is read-only"):
        run_tag(_settings(bundle, source, locked))
    assert locked.read_text() == "keep me\n"
    with pytest.raises(TagError, match="is /dev/null, a stream or device, not a file"):
        run_tag(_settings(bundle, source, "/dev/null", output_format="jsonl"))  # atomic_write would replace the device
    assert Path("/dev/null").is_char_device()
    # /dev/stdout of a shell's `>> log.txt` leads to log.txt, which was replaced whole by the output
    (tmp_path / "stdout").symlink_to("/dev/stdout")
    for stream in ("/dev/stdout", "/proc/self/fd/1", tmp_path / "stdout"):
        with pytest.raises(TagError, match=r"is (/dev/stdout|/proc/self/fd/1), a stream or device, not a file; name a file"):
            run_tag(_settings(bundle, source, stream, output_format="jsonl"))
    (tmp_path / "stdout").unlink()
    with pytest.raises(TagError, match=r"names a folder \(it ends with '/'\); name a file"):
        run_tag(_settings(bundle, source, f"{tmp_path / 'new'}/"))
    with pytest.raises(TagError, match="is the input file"):
        run_tag(_settings(bundle, source, source, output_format="jsonl"))
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        run_tag(_settings(bundle, source, tmp_path / "o.conll", output_format="xml"))
    with pytest.raises(IsADirectoryError, match="is a directory"):
        run_tag(_settings(bundle, tmp_path, tmp_path / "o.conll"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "locked.conll"]
    assert strict_loads(source.read_text().splitlines()[0])


# ---- JSONL input values that are not strings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,shown",
    [("null", "null"), ("true", "boolean true"), ("3", "number 3"), ("1.5", "number 1.5"), ('["a"]', 'array \\["a"\\]'),
     ('{"x": 1}', 'object \\{"x": 1\\}'), ('""', "an empty string"), ("NaN", "number NaN")],
    ids=["null", "bool", "int", "float", "list", "object", "empty", "nan"],
)  # fmt: skip
def test_a_jsonl_value_that_is_not_a_string_is_refused_with_its_position(run, tmp_path, value, shown, no_tagging):
    _, _, bundle, _, _ = run
    source = tmp_path / "in.jsonl"
    good = json.dumps({"tokens": [{"w": "the", "pos": "DT"}]})
    source.write_text(good + "\n" + '{"tokens": [{"w": "a", "pos": "DT"}, {"w": ' + value + ', "pos": "NN"}]}\n')
    with pytest.raises(DataFormatError, match=rf"in.jsonl:2: token 2, column 'w': expected a non-empty string, got {shown}"):
        run_tag(_settings(bundle, source, tmp_path / "out.jsonl"))
    words = tmp_path / "words.jsonl"  # for a one-column model tokens may be bare values: the same check
    words.write_text('{"tokens": ["a", ' + value + "]}\n")
    with pytest.raises(DataFormatError, match=r"words.jsonl:1: token 2"):
        read_input(words, "jsonl", ["w"])
    assert not (tmp_path / "out.jsonl").exists()


def test_the_command_refuses_a_null_token_in_one_line(run, tmp_path):
    _, _, bundle, _, _ = run
    source = tmp_path / "in.jsonl"
    source.write_text('{"tokens": [{"w": null, "pos": "DT"}]}\n')
    line = _one_line_error(_cli([f"model={bundle}", f"input={source}", f"output={tmp_path / 'out.jsonl'}"], tmp_path))
    assert f"{source}:1: token 1, column 'w': expected a non-empty string, got null" in line
    assert not (tmp_path / "out.jsonl").exists()


# ---- the served model: a request it cannot use is a 400 with a one-line reason -------------------------------------


@pytest.fixture(scope="module")
def model(run):
    _, uri, _, model_uri, _ = run
    mlflow.set_tracking_uri(uri)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return mlflow.pyfunc.load_model(model_uri)


def _invoke(model, body: str | bytes, content_type: str = "application/json") -> tuple[int, str]:
    """What ``mlflow models serve`` answers: its own request handler, its own error serialisation."""
    try:
        answer = scoring_server.invocations(body, content_type, model, model.metadata.get_input_schema())
    except MlflowException as err:
        return err.get_http_status_code(), err.serialize_as_json()
    return answer.status, answer.response


def _split(columns, rows) -> str:
    return json.dumps({"dataframe_split": {"columns": columns, "data": rows}})


def _rows(*rows) -> str:
    """A ``dataframe_split`` request with the model's columns (sentence, w, pos)."""
    return _split(["sentence", "w", "pos"], [list(r) for r in rows])


BAD_REQUESTS = {
    "missing-column": (_split(["sentence", "w"], [[0, "the"]]), r"missing column\(s\) \['pos'\]"),
    "missing-sentence": (_split(["w", "pos"], [["the", "DT"]]), r"missing column\(s\) \['sentence'\]"),
    "empty": (_split(["sentence", "w", "pos"], []), "no rows"),
    "int-token": (_rows([0, "a", "DT"], [0, 7, "NN"]), r"row 1 \(sentence 0\), column 'w': .* int 7"),
    "bool-token": (_split(["sentence", "w", "pos"], [[0, True, "DT"]]), "column 'w': .* bool True"),
    "list-token": (_split(["sentence", "w", "pos"], [[0, "a", ["NN"]]]), r"column 'pos': .* list \['NN'\]"),
    "null-token": (_split(["sentence", "w", "pos"], [[0, None, "DT"]]), "column 'w': .* null"),
    "nan-token": ('{"dataframe_split": {"columns": ["sentence", "w", "pos"], "data": [[0, NaN, "DT"]]}}', "column 'w': .* null"),
    "empty-token": (_split(["sentence", "w", "pos"], [[0, "", "DT"]]), "column 'w': .* non-empty string"),
    "reappearing-id": (_rows([0, "a", "DT"], [1, "b", "NN"], [0, "c", "NN"]), "row 2: 'sentence' 0 reappears after 1"),
    "null-id": (_split(["sentence", "w", "pos"], [[0, "a", "DT"], [None, "b", "NN"]]), "row 1: the 'sentence' id is null"),
    "mixed-id": (_rows([0, "a", "DT"], ["0", "b", "NN"]), "row 1: the 'sentence' id str '0' is not an integer, as the first"),
    "fraction-id": (_split(["sentence", "w", "pos"], [[0.5, "a", "DT"]]), "id float 0.5 is not an integer"),
    "bool-id": (_split(["sentence", "w", "pos"], [[True, "a", "DT"]]), "is not an integer"),
    "huge-id": (_rows([2**70, "a", "DT"]), "is beyond the range of a signed 64-bit integer"),
    "huge-float-id": (_rows([1e30, "a", "DT"]), "is not an integer"),
    "repeated-column": (_split(["sentence", "w", "w", "pos"], [[0, "a", "b", "DT"]]), r"\['w'\] appear more than once"),
    "records-missing": (json.dumps({"dataframe_records": [{"sentence": 0, "w": "a"}]}), r"missing column\(s\) \['pos'\]"),
    "sentences-missing": (json.dumps({"inputs": [[{"w": "a"}]]}), r"sentence 0, token 0: lacks the column\(s\) \['pos'\]"),
    # ragged: MLflow's own parser refuses it (BAD_REQUEST, one line) before the model sees it
    "empty-sentence": (json.dumps({"inputs": [[{"w": "a", "pos": "DT"}], []]}), "Invalid input"),
    "scalar": (json.dumps({"inputs": 5}), "expected a table"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_a_request_the_model_cannot_use_is_a_400_with_a_one_line_reason(model, name):
    body, reason = BAD_REQUESTS[name]
    status, text = _invoke(model, body)
    assert status == 400, text
    answer = strict_loads(text)
    assert answer["error_code"] == ("BAD_REQUEST" if name == "empty-sentence" else "INVALID_PARAMETER_VALUE")
    assert "stack_trace" not in answer
    message = answer["message"]
    assert "\n" not in message and "Traceback" not in message and "Failed to predict data" not in message
    assert re.search(reason, message), message


def test_extra_columns_are_echoed_in_strict_json(model):
    """Columns the model does not read come back as sent, but a NaN among them is null, not NaN."""
    columns = '"columns": ["sentence", "w", "pos", "score"]'
    body = '{"dataframe_split": {' + columns + ', "data": [[0, "the", "DT", NaN], [0, "dog", "NN", 1.5]]}}'
    status, text = _invoke(model, body)
    assert status == 200, text
    assert [r["score"] for r in strict_loads(text)["predictions"]] == [None, 1.5]


def test_python_callers_get_the_same_reasons(model):
    """``mlflow.pyfunc.load_model(...).predict`` raises the same one-line errors (MlflowException and ValueError)."""
    with pytest.raises(ValueError, match="sentence 1 has no tokens"):
        model.predict([[{"w": "a", "pos": "DT"}], []])
    with pytest.raises(MlflowException, match=r"row 0 \(sentence 0\), column 'w': a token must be a non-empty string, got null"):
        model.predict(pd.DataFrame({"sentence": [0], "w": [np.nan], "pos": ["DT"]}))
    with pytest.raises(MlflowException, match="no rows"):
        model.predict(pd.DataFrame({"sentence": pd.Series([], dtype="int64"), "w": [], "pos": []}))


def test_an_unexpected_failure_is_a_500_with_one_line_and_no_stack_trace(model, monkeypatch):
    bundle = model.unwrap_python_model().bundle

    def broken(*args, **kwargs):
        raise RuntimeError("simulated fault\nwith a second line")

    monkeypatch.setattr(bundle, "tag_frame", broken)
    status, text = _invoke(model, _split(["sentence", "w", "pos"], [[0, "the", "DT"]]))
    answer = strict_loads(text)
    assert status == 500 and "stack_trace" not in answer and "Traceback" not in text
    assert answer["message"] == "tagging failed: RuntimeError: simulated fault"


def test_a_good_request_after_bad_ones_is_answered(model):
    for body, _ in BAD_REQUESTS.values():
        _invoke(model, body)
    status, text = _invoke(model, _split(["sentence", "w", "pos"], [[0, "the", "DT"], [0, "dog", "NN"], [1, "runs", "VB"]]))
    assert status == 200 and [r["sentence"] for r in strict_loads(text)["predictions"]] == [0, 0, 1]


def test_no_stray_files_in_the_working_folder(run, tiny_pipeline, tmp_path, monkeypatch):
    """Resolving every kind of model reference from a folder with no store leaves that folder as it was."""
    out, uri, bundle, model_uri, _ = run
    monkeypatch.chdir(tmp_path)
    source = _jsonl(tmp_path / "in.jsonl", _words(2))
    parent = MlflowClient(uri).get_run(tiny_pipeline.parent_id)
    for reference in (model_uri, f"runs:/{parent.info.run_id}/train"):
        run_tag(_settings(reference, source, tmp_path / "out.jsonl", tracking_uri=uri))
    with pytest.raises(TagError, match="no MLflow store at"):
        run_tag(_settings(model_uri, source, tmp_path / "out.jsonl", tracking_uri=f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


@pytest.mark.parametrize(
    ("plugins", "message"),
    [("os.path", "a list of module names"), (["no_such_module_here"], "cannot import 'no_such_module_here'"), ([3], "3 is not")],
)
def test_bad_plugins_are_one_line_before_anything_is_read(tmp_path, plugins, message):
    (tmp_path / "in.conll").write_text("He\n")
    settings = {"models": str(tmp_path / "nothing.npz"), "input": str(tmp_path / "in.conll"),
                "output": str(tmp_path / "out.conll"), "plugins": plugins}  # fmt: skip
    with pytest.raises(tag_command.TagError, match=re.escape(message)):
        tag_command.run_tag(settings)
    assert not (tmp_path / "out.conll").exists()

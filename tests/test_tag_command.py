"""The tag command (``python -m pipeline.tag``): bundles from the pipeline, every input and output
format, chaining a word->POS tagger into a POS->chunk chunker, and clear errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, make_sentence, tiny_overrides, write_corpus  # noqa: E402

from crf import load_tagger  # noqa: E402
from crf.io import DataFormatError, read_conll  # noqa: E402
from pipeline.formats import tokenize  # noqa: E402
from pipeline.runner import run_pipeline  # noqa: E402
from pipeline.tag import TagError, _renamed, run_tag  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


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
    (pos_bundle,) = [p for p in (out / "cache").rglob("bundle.npz") if load_tagger(p).kind == "hmm"]
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
    pos = load_tagger(pos_bundle)
    assert pos.input_columns == ["w"] and pos.scheme == "none" and pos.source["dataset"]["label"] == "pos"
    assert pos.source["model"]["observation"] == "w"
    from pipeline.tag import resolve_model

    chunk = load_tagger(resolve_model(chunker, uri))
    assert chunk.kind == "crf" and chunk.input_columns == ["w", "pos"] and chunk.scheme == "iob2"
    assert chunk.source["dataset"]["label"] == "chunk" and "templates" in chunk.source["features"]
    # the MLflow Model logged for the run holds the bundle as an artifact: found in its folder
    run = MlflowClient(uri).get_run(chunker.split("/")[1])
    model_uri = run.data.tags.get("model_uri")
    assert model_uri, "the runner tags the train run with its MLflow Model's URI"
    assert load_tagger(resolve_model(model_uri, uri)).labels == chunk.labels


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
    pos = load_tagger(pos_bundle).tag([[w for w, _, _ in s] for s in sentences])
    from pipeline.tag import resolve_model

    chunk = load_tagger(resolve_model(chunker, uri)).tag(
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


def test_tokenizer_splits_like_the_penn_treebank():
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
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.tag", f"model=[{pos_bundle},{chunker}]", f"input={text}", f"output={target}", *common],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    rows = read_conll(target)
    assert [r[0] for r in rows[0]] == "the old dog sees a cat .".split()
    assert [r[2] for r in rows[0]] == ["B-NP", "I-NP", "I-NP", "B-VP", "B-NP", "I-NP", "O"]
    failed = subprocess.run(
        [sys.executable, "-m", "pipeline.tag", f"model={tmp_path / 'nothing'}", f"input={text}", f"output={target}", *common],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert failed.returncode == 2 and "no such file or folder" in failed.stdout + failed.stderr


def test_model_override_is_renamed_for_hydra():
    assert _renamed(["tag.py", "model=[a,b]", "input=x", "models=c"]) == ["tag.py", "models=[a,b]", "input=x", "models=c"]

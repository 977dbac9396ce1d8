"""The pipeline's tagger as an MLflow Model: logged by a pipeline run, loaded by URI, same answers
as the bundle, the evaluate stage's test F1 reproduced; the run's dataset input and cache links."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import forkserver
import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import tiny_overrides  # noqa: E402

from crf import metrics  # noqa: E402
from crf.bundle import load_bundle  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.stages.prepare import read_prepared  # noqa: E402
from pipeline.tracking.mlflow_model import sentences_frame  # noqa: E402


def _runs(client: MlflowClient, parent_id: str) -> dict:
    experiment = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    return {r.data.tags["stage"]: r for r in runs}


def _latest_pipeline(client: MlflowClient):
    experiment = client.get_experiment_by_name("crf").experiment_id
    return client.search_runs([experiment], filter_string="tags.stage = 'pipeline'", order_by=["start_time DESC"])[0]


@pytest.fixture(scope="module")
def logged(tiny_pipeline):
    """The session's tiny pipeline run (conftest): (results, client, parent run, its stage runs, config)."""
    cfg, results = tiny_pipeline.cfg, tiny_pipeline.results
    client = MlflowClient(tiny_pipeline.uri)  # its store, whatever the environment says now
    mlflow.set_tracking_uri(tiny_pipeline.uri)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    parent = client.get_run(tiny_pipeline.parent_id)
    return results, client, parent, _runs(client, parent.info.run_id), cfg


def _test_frame(stages) -> tuple[pd.DataFrame, list[list[str]]]:
    """The prepared test split in long form (sentence, w, pos) and its gold labels."""
    data = read_prepared(Path(stages["prepare"].data.tags["cache_path"]))
    tokens = [[dict(zip(data.columns, row)) for row in sentence] for sentence in data.splits["test"]]
    return sentences_frame(tokens, ["w", "pos"]), data.labels("test")


def test_pipeline_logs_the_tagger_as_an_mlflow_model(logged):
    results, client, parent, stages, cfg = logged
    uri = parent.data.tags["model_uri"]
    assert uri.startswith("models:/") and stages["train"].data.tags["model_uri"] == uri
    model = mlflow.pyfunc.load_model(uri)
    # no MLflow input schema (the model checks its input itself, with one-line reasons): the columns are in its metadata
    assert model.metadata.get_input_schema() is None
    assert model.metadata.metadata == {"sentence_column": "sentence", "input_columns": ["w", "pos"]}
    assert model.metadata.get_output_schema().input_names() == ["label", "marginal", "segment_confidence"]
    assert list(model.input_example.columns) == ["sentence", "w", "pos"] and model.input_example["sentence"].nunique() == 2
    # the logged model belongs to the train stage's run, inside the pipeline run
    logged_model = mlflow.get_logged_model(uri.removeprefix("models:/"))
    assert logged_model.source_run_id == stages["train"].info.run_id

    frame, gold = _test_frame(stages)
    predicted = model.predict(frame)
    bundle = load_bundle(os.path.join(stages["train"].data.tags["cache_path"], "bundle.npz"))
    direct = bundle.tag_frame(frame)
    # the same answer, with None where the bundle says NaN (outside chunks): strict JSON when served
    direct["marginal"] = direct["marginal"].astype(object)
    direct["segment_confidence"] = direct["segment_confidence"].astype(object).where(direct["segment_confidence"].notna(), None)
    pd.testing.assert_frame_equal(predicted, direct)
    assert predicted["segment_confidence"].isna().any() and not any(
        isinstance(v, float) and v != v for v in predicted["segment_confidence"]
    )
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in gold])])
    labels = predicted["label"].tolist()
    f1 = metrics.chunk_scores(gold, [labels[a:b] for a, b in zip(offsets[:-1], offsets[1:])]).f1
    assert f1 == results["evaluate.test_f1"] == parent.data.metrics["test_f1"]
    assert predicted["marginal"].between(0, 1).all() and predicted["segment_confidence"].notna().any()


def test_lists_of_token_dicts_and_records(logged):
    _, _, parent, stages, _ = logged
    model = mlflow.pyfunc.load_model(parent.data.tags["model_uri"])
    sentences = [
        [dict(w=w, pos=p) for w, p in [("the", "DT"), ("dog", "NN"), ("sees", "VB"), ("a", "DT"), ("cat", "NN"), (".", ".")]],
        [{"w": "a", "pos": "DT"}, {"w": "man", "pos": "NN"}, {"w": "runs", "pos": "VB"}, {"w": ".", "pos": "."}],
    ]
    frame = sentences_frame(sentences, ["w", "pos"])
    expected = model.predict(frame)
    assert expected["label"].tolist()[:6] == ["B-NP", "I-NP", "B-VP", "B-NP", "I-NP", "O"]
    # the python model takes sentences of token dicts; pyfunc takes token records with their sentence
    pd.testing.assert_frame_equal(model.unwrap_python_model().predict(None, sentences), expected)
    records = model.predict(frame.to_dict(orient="records"))
    pd.testing.assert_frame_equal(records[expected.columns], expected, check_dtype=False)


def test_bad_input_and_unknown_uri_give_clear_errors(logged):
    _, _, parent, _, _ = logged
    model = mlflow.pyfunc.load_model(parent.data.tags["model_uri"])
    frame = pd.DataFrame({"sentence": [0, 0], "w": ["the", "dog"]})
    with pytest.raises(MlflowException, match=r"missing column\(s\) \['pos'\]"):
        model.predict(frame)
    with pytest.raises(ValueError, match=r"sentence 0, token 0: lacks the column\(s\) \['pos'\]"):
        model.unwrap_python_model().predict(None, [[{"w": "the"}]])
    with pytest.raises(MlflowException, match="no-such-model"):
        mlflow.pyfunc.load_model("models:/no-such-model@champion")
    with pytest.raises(MlflowException, match="0123456789abcdef"):
        mlflow.pyfunc.load_model("runs:/0123456789abcdef/model")


def test_run_name_dataset_input_and_headline_metrics(logged):
    _, client, parent, _, cfg = logged
    assert parent.info.run_name == "conll2000-crf-lbfgs"
    (dataset,) = client.get_run(parent.info.run_id).inputs.dataset_inputs
    assert dataset.dataset.name == "conll2000" and len(dataset.dataset.digest) == 36
    sha = {t.key: t.value for t in dataset.tags}["sha256"]
    assert len(sha) == 64 and sha.startswith(dataset.dataset.digest)
    assert "conll2000" in dataset.dataset.source
    assert {"dev_f1", "test_f1"} <= set(parent.data.metrics)


def test_cached_stage_runs_point_at_the_run_that_computed_them(logged):
    results, client, first, first_stages, cfg = logged
    again = run_pipeline(cfg)
    assert again["evaluate.test_f1"] == results["evaluate.test_f1"]
    latest = _latest_pipeline(client)
    assert latest.info.run_id != first.info.run_id and latest.data.tags["cache_hits"] == "prepare,featurize,train,evaluate"
    stages = _runs(client, latest.info.run_id)
    for name, run in stages.items():
        assert run.data.tags["cache_source_run_id"] == first_stages[name].info.run_id, name
        assert not client.list_artifacts(run.info.run_id), name  # nothing uploaded twice
    # the model is not logged again: the cached run links the first run's model
    assert latest.data.tags["model_uri"] == stages["train"].data.tags["model_uri"] == first.data.tags["model_uri"]


@pytest.mark.slow  # starts `mlflow models serve`
def test_model_benchmark_measures_the_logged_model_and_reproduces_its_score(logged):
    _, client, parent, _, cfg = logged
    root = Path(__file__).resolve().parents[3]
    overrides = tiny_overrides(Path(cfg.data.root), Path(cfg.paths.output_dir))
    overrides = [o for o in overrides if not o.startswith(("trainer.", "train."))]  # the benchmark trains nothing
    command = [sys.executable, "-m", "pipeline.model_benchmark", *overrides, "model_benchmark.repetitions=2"]
    command.append("model_benchmark.served=true")
    command.append(f"model_benchmark.model={parent.data.tags['model_uri']}")
    command.append(f"hydra.run.dir={Path(cfg.paths.output_dir) / 'hydra-model-benchmark'}")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = forkserver.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    experiment = client.get_experiment_by_name("crf").experiment_id
    (run,) = client.search_runs([experiment], filter_string="tags.stage = 'model_benchmark'")
    assert run.data.metrics["pyfunc_score"] == run.data.metrics["served_score"] == parent.data.metrics["test_f1"]
    assert run.data.tags["same_as_logged"] == "true"
    assert run.data.metrics["pyfunc_tokens_per_second"] > 0
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"model_benchmark.csv", "model_benchmark.md"}

    missing = forkserver.run(command[:-2], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "say which model to measure" in missing.stdout + missing.stderr
    # scored against other gold labels than the model's run saw: the benchmark must refuse the figures
    test_file = Path(cfg.data.root) / cfg.dataset.files.test.path
    relabelled = test_file.with_name("relabelled.txt.gz")
    lines = gzip.open(test_file, "rt").read().splitlines()
    text = "\n".join(" ".join(line.split()[:-1] + ["O"]) if line.strip() else "" for line in lines) + "\n"
    with gzip.open(relabelled, "wt") as stream:
        stream.write(text)
    other = [*command[:-1], f"dataset.files.test.path={relabelled.relative_to(cfg.data.root)}", "model_benchmark.served=false"]
    mismatched = forkserver.run(other, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert mismatched.returncode != 0 and "do not reproduce the score" in mismatched.stderr

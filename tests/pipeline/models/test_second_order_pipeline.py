"""The second-order CRF through the pipeline: ``model.order`` and the candidate threshold reach the
estimator (and the cache key), a ``model.order=2`` run trains, evaluates and writes a bundle that
the tag command and the MLflow Model tag with, and the HMM-versus-CRF comparison has order as an
axis (arms and the pairs it tests)."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, make_sentence, tiny_overrides, write_corpus  # noqa: E402

from crf import CRF, load_bundle  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.apps.tag import run_tag  # noqa: E402
from pipeline.models.crf import CRFAdapter, build_model  # noqa: E402
from pipeline.sweeps.compare import arm_name, compared_pairs  # noqa: E402


def test_order_and_candidate_threshold_reach_the_estimator_and_the_cache_key():
    first = compose_config([])
    assert first.model.order == 1 and first.model.candidate_threshold is None
    second = compose_config(["model.order=2", "model.candidate_threshold=0.01"])
    estimator = build_model(second.model, second.trainer, seed=0, dev_every=0, threads=1)
    assert estimator.order == 2 and estimator.candidate_threshold == 0.01
    adapter = CRFAdapter()
    adapter.validate(second)
    # at order 1 a configured threshold (a dataset's, for order 2) is not passed, nor hashed
    restricted_first = compose_config(["model.candidate_threshold=0.01"])
    assert (
        build_model(restricted_first.model, restricted_first.trainer, seed=0, dev_every=0, threads=1).candidate_threshold is None
    )
    assert adapter.config_slice(restricted_first) == adapter.config_slice(first)
    assert adapter.config_slice(second) != adapter.config_slice(first)
    # the many-label dataset restricts its second-order CRF to candidate labels
    xpos = compose_config(["dataset=ud_english_ewt_xpos", "features=pos", "model.order=2"])
    assert 0 < xpos.model.candidate_threshold < 1
    with pytest.raises(Exception, match="order must be 1 or 2"):
        adapter.validate(compose_config(["model.order=3"]))


def test_comparison_sweeps_order_and_names_its_arms():
    from pathlib import Path

    from omegaconf import OmegaConf

    experiment = OmegaConf.load(Path(__file__).resolve().parents[3] / "conf" / "experiment" / "hmm_vs_crf.yaml")
    params = experiment.hydra.sweeper.params
    assert params["model"] == "crf,hmm" and str(params["model.order"]) == "1,2"
    assert [arm_name("hmm", "2"), arm_name("crf", 1.0), arm_name("crf", None), arm_name("hmm", None)] == [
        "hmm2",
        "crf1",
        "crf1",
        "hmm2",
    ]
    assert compared_pairs(["hmm1", "hmm2", "crf1", "crf2"]) == [
        ("hmm1", "crf1"),
        ("hmm2", "crf2"),
        ("hmm1", "hmm2"),
        ("crf1", "crf2"),
    ]
    assert compared_pairs(["hmm2", "crf1"]) == [("hmm2", "crf1")]  # a sweep without the order axis


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model.order=2 pipeline run on the toy corpus: (bundle path, model path, output folder, config)."""
    for name in ("MLFLOW_TRACKING_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    root = tmp_path_factory.mktemp("second")
    corpus = write_corpus(root / "data", n_train=80, n_test=20)
    out = root / "out"
    cfg = compose_config(tiny_overrides(corpus, out) + ["stages=[evaluate]", "model.order=2"])
    run_pipeline(cfg)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    (bundle,) = list((out / "cache").rglob("bundle.npz"))
    (model,) = list((out / "cache").rglob("model.npz"))
    return bundle, model, out, cfg


def test_a_second_order_run_trains_evaluates_and_its_bundle_tags(trained, tmp_path):
    bundle_path, model_path, out, _ = trained
    model = CRF.load(model_path)
    assert model.order == 2 and model.trigram_weights_.shape[0] == len(model.classes_) + 1
    bundle = load_bundle(bundle_path)
    L = len(bundle.labels)
    assert bundle.part.n_states == (L + 1) * L
    (metrics_file,) = list((out / "cache" / "evaluate").rglob("stage_metrics.json"))
    assert json.loads(metrics_file.read_text())["test_accuracy"] > 90
    # the tag command on the order-2 bundle, scored against the gold column, equals the model
    rng = np.random.default_rng(7)
    sentences = [make_sentence(rng) for _ in range(8)]
    source = tmp_path / "in.conll.gz"
    with gzip.open(source, "wt") as handle:
        handle.write("\n\n".join("\n".join(" ".join(row) for row in s) for s in sentences) + "\n")
    target = tmp_path / "out.jsonl"
    summary = run_tag(
        {
            "models": str(bundle_path),
            "input": str(source),
            "output": str(target),
            "format": "auto",
            "conllu_pos": "xpos",
            "output_format": "auto",
            "marginals": True,
            "column_aliases": {},
        }
    )
    assert summary["sentences"] == 8 and summary["accuracy"] > 90
    records = [json.loads(line) for line in target.read_text().splitlines()]
    expected = bundle.tag([[{"w": w, "pos": p} for w, p, _ in s] for s in sentences])
    assert [r["labels"] for r in records] == [e["labels"] for e in expected]


def test_the_mlflow_model_of_a_second_order_run_tags_like_its_bundle(trained):
    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from pipeline.tracking import tracking_uri

    bundle_path, _, _, cfg = trained
    client = MlflowClient(tracking_uri(cfg))
    experiment = client.get_experiment_by_name("crf").experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.stage = 'pipeline'")
    mlflow.set_tracking_uri(tracking_uri(cfg))
    model = mlflow.pyfunc.load_model(parent.data.tags["model_uri"])
    rng = np.random.default_rng(3)
    sentences = [make_sentence(rng) for _ in range(3)]
    frame = pd.DataFrame(
        [{"sentence": i, "w": w, "pos": p} for i, s in enumerate(sentences) for w, p, _ in s], columns=["sentence", "w", "pos"]
    )
    predicted = model.predict(frame)
    expected = load_bundle(bundle_path).tag([[{"w": w, "pos": p} for w, p, _ in s] for s in sentences])
    assert predicted["label"].tolist() == [label for e in expected for label in e["labels"]]

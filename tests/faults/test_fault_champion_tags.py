"""A holder of ``@champion`` whose standing tags were removed (by a user tidying tags, say) was
read as a version registered without a dev score and lost the alias to a worse version (86.31
against its 88.48; M3). Its standing is read back from its run, and the rule applies as usual."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
import pytest  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, seed_store, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.tracking import register_model, tracking_uri  # noqa: E402
from pipeline.tracking.champion import DECISION_TAG, EVALUATION_RUN_TAG, Standing  # noqa: E402


@pytest.fixture
def registry(tmp_path, monkeypatch):
    uri = f"sqlite:///{seed_store(tmp_path / 'store')}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("flavors: {}\n")
    yield MlflowClient(uri), model
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)


def _holder_without_standing_tags(client, model, dev_f1: float | None, evaluation: str | None = "e1") -> None:
    """Version 1 of ``m``, holding ``champion``: its run logged ``dev_f1`` (None: no such metric)
    on evaluation data ``evaluation``, and its version keeps only a decision and a dev accuracy."""
    with mlflow.start_run() as run:
        if dev_f1 is not None:
            mlflow.log_metric("dev_f1", dev_f1)
        if evaluation:
            mlflow.set_tag(EVALUATION_RUN_TAG, evaluation)
    client.create_registered_model("m")
    tags = {DECISION_TAG: "moved: no version held the alias", "dev_accuracy": "95.1"}
    client.create_model_version("m", model.as_uri(), run_id=run.info.run_id, tags=tags)
    client.set_registered_model_alias("m", "champion", "1")


def _register(model, value: float, evaluation: str = "e1") -> str:
    version, _ = register_model(
        model.as_uri(), "m", "champion", {"dev_f1": str(value)}, Standing("dev_f1", value, "maximize", evaluation)
    )
    return str(version.version)


def test_a_holder_whose_standing_tags_were_removed_is_compared_by_its_run(registry):
    client, model = registry
    _holder_without_standing_tags(client, model, 88.48)
    assert _register(model, 86.31) == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert (
        client.get_model_version("m", "2").tags[DECISION_TAG] == "kept: dev_f1 86.31 is worse than the holder's 88.48 (version 1)"
    )
    assert _register(model, 86.31, evaluation="e2") == "3"  # other evaluation data: not comparable, kept
    assert (
        client.get_model_version("m", "3").tags[DECISION_TAG].startswith("kept: the holder was scored on other evaluation data")
    )
    assert _register(model, 90.0) == "4"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "4"


@pytest.mark.parametrize("dev_f1, evaluation", [(None, "e1"), (88.48, None)])
def test_a_holder_whose_run_has_no_score_to_read_back_is_replaced_as_before(registry, dev_f1, evaluation):
    """A holder that took the alias under an earlier rule with no score (nothing in its run either)
    still has nothing to defend: a scored version takes the alias."""
    client, model = registry
    _holder_without_standing_tags(client, model, dev_f1, evaluation)
    assert _register(model, 60.0) == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "2"
    assert client.get_model_version("m", "2").tags[DECISION_TAG].startswith("moved: the holder records no standing to defend")


def test_a_pipeline_version_whose_tags_were_tidied_keeps_the_alias_against_a_worse_run(tmp_path):
    """M3's case through the pipeline: the standing tags and ``dev_f1`` removed from version 1."""
    data_root = write_corpus(tmp_path / "data", n_train=80, n_test=20)
    base = [*tiny_overrides(data_root, tmp_path / "out"), "registry.register=true", "registry.name=tiny"]
    cfg = compose_config(base)
    run_pipeline(cfg)
    client = MlflowClient(tracking_uri(cfg))
    first = client.get_model_version("tiny", "1")
    for key in [k for k in first.tags if k.startswith("standing.") or k == "dev_f1"]:
        client.delete_model_version_tag("tiny", "1", key)
    run_pipeline(compose_config([*base, "data.train_fraction=0.1", "trainer.c2=300"]))  # a quick, worse model
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    assert client.get_model_version("tiny", "2").tags[DECISION_TAG].startswith("kept: dev_f1 ")

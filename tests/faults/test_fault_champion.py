"""The registry's ``@champion`` only moves forward: a worse model (here one trained on a tenth of
the data with heavy smoothing), or one scored on other evaluation data, is registered as a new
version while the alias stays, and the version's tags say why; ``registry.force_alias`` moves it."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, seed_store, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.tracking import champion, register_model, tracking_uri  # noqa: E402
from pipeline.tracking.champion import DECISION_TAG, EVALUATION_TAG, Standing  # noqa: E402


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        monkeypatch.delenv(name, raising=False)


def test_the_champion_alias_only_moves_to_a_model_at_least_as_good_on_the_same_data(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=80, n_test=20)
    base = tiny_overrides(data_root, tmp_path / "out") + ["registry.register=true", "registry.name=tiny"]

    def run(*extra: str):
        cfg = compose_config(base + list(extra))
        run_pipeline(cfg)
        return MlflowClient(tracking_uri(cfg))

    client = run()
    first = client.get_model_version_by_alias("tiny", "champion")
    assert str(first.version) == "1" and first.tags[DECISION_TAG].startswith("moved: no version held")
    standing = Standing.from_tags(first.tags)
    assert standing.metric == "dev_f1" and first.tags["data.train_fraction"] == "1.0" and first.tags["dataset"] == "conll2000"

    run("data.train_fraction=0.1", "trainer.c2=300")  # a quick, worse model on the same dev and test data
    worse = client.get_model_version("tiny", "2")
    assert Standing.from_tags(worse.tags).value < standing.value
    assert worse.tags[DECISION_TAG].startswith("kept:") and "worse than the holder" in worse.tags[DECISION_TAG]
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"

    run("dataset.dev_split.seed=99")  # other dev sentences: not comparable, whatever the score
    other = client.get_model_version("tiny", "3")
    assert "other evaluation data" in other.tags[DECISION_TAG]
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"

    # the dev split is carved from the train file: training on the test file (dev carved from it,
    # scores far higher) is other evaluation data, as is another column layout under the same label
    for version, extra in (("4", "dataset.files.train.path=conll2000/test.txt.gz"), ("5", "dataset.columns=[w,chunk,pos]")):
        run(extra)
        other = client.get_model_version("tiny", version)
        assert "other evaluation data" in other.tags[DECISION_TAG], extra
        assert other.tags[EVALUATION_TAG] != first.tags[EVALUATION_TAG]
        assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"

    run("data.train_fraction=0.1", "trainer.c2=300", "registry.force_alias=true")
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "6"
    assert client.get_model_version("tiny", "6").tags[DECISION_TAG].startswith("moved: forced")

    run()  # as good as the first on the same data: moves (ties move forward)
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "7"


# --- registrations finishing together (N20): deciding and moving the alias is one step


def _register(value: float, source: Path):
    """Register ``source`` as a version of ``race`` of dev_f1 ``value`` (all on one evaluation key)."""
    standing = Standing("dev_f1", value, "maximize", "e1")
    version, _ = register_model(source.as_uri(), "race", "champion", {"dev_f1": str(value)}, standing)
    return str(version.version)


@pytest.fixture
def local_registry(tmp_path, monkeypatch):
    database = seed_store(tmp_path / "store")
    uri = f"sqlite:///{database}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)  # MLflow's setter exports it: restored (removed) after the test
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("flavors: {}\n")
    yield MlflowClient(uri), model
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)


def test_two_registrations_at_once_on_a_local_store_are_decided_one_after_the_other(local_registry, monkeypatch):
    client, model = local_registry
    assert _register(70.0, model) == "1"
    # the 80 registration has read the holder (70) and decided to move; the 90 one starts now and
    # reaches the lock; without one it would set 90 before the 80 one sets 80 (the alias going back)
    original_decision, original_lock = champion.alias_decision, champion.registry_lock
    at_lock, results, worker = threading.Event(), {}, []

    def lock(uri):
        if threading.current_thread() is not threading.main_thread():
            at_lock.set()
        return original_lock(uri)

    def decision(new, current, has_holder, force):
        if new.value == 80.0 and not worker:
            worker.append(threading.Thread(target=lambda: results.setdefault("90", _register(90.0, model))))
            worker[0].start()
            assert at_lock.wait(60)
            worker[0].join(0.5)  # without a lock it finishes here; with one it waits for this registration
        return original_decision(new, current, has_holder, force)

    monkeypatch.setattr(champion, "registry_lock", lock)
    monkeypatch.setattr(champion, "alias_decision", decision)
    assert _register(80.0, model) == "2"
    worker[0].join()
    assert results["90"] == "3"
    assert str(client.get_model_version_by_alias("race", "champion").version) == "3"
    assert client.get_model_version("race", "3").tags[DECISION_TAG] == "moved: dev_f1 90 is at least the holder's 80 (version 2)"


def test_without_a_lock_a_registration_that_finds_a_worse_version_set_meanwhile_sets_its_own_again(local_registry, monkeypatch):
    """What a tracking server gets (no lock): the 80 registration read the holder before the 90
    one set the alias, and sets 80 after it; the 90 one reads again after setting and repairs."""
    client, model = local_registry
    assert _register(70.0, model) == "1"
    monkeypatch.setattr(champion, "registry_lock", lambda uri: contextlib.nullcontext(False))
    original_holder, original_set = champion._holder, client.__class__.set_registered_model_alias
    stale = {}

    def holder(client_, name, alias):
        if stale.pop("once", False):
            return client_.get_model_version("race", "1")  # what it read before the 90 was set
        return original_holder(client_, name, alias)

    def set_alias(self, name, alias, version):
        original_set(self, name, alias, version)
        if str(version) == "2" and "80" not in stale:
            stale["once"] = True
            stale["80"] = _register(80.0, model)

    monkeypatch.setattr(champion, "_holder", holder)
    monkeypatch.setattr(client.__class__, "set_registered_model_alias", set_alias)
    assert _register(90.0, model) == "2"
    assert stale["80"] == "3"
    assert str(client.get_model_version_by_alias("race", "champion").version) == "2"
    assert client.get_model_version("race", "2").tags[DECISION_TAG] == "moved: dev_f1 90 is at least the holder's 80 (version 3)"

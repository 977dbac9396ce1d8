"""The registry's ``@champion`` only moves forward: a worse model (here one trained on a tenth of
the data with heavy smoothing), or one scored on other evaluation data, is registered as a new
version while the alias stays, and the version's tags say why; ``registry.force_alias`` moves it."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
import pandas as pd  # noqa: E402
from mlflow.entities import Param  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from pipeline_helpers import compose_config, seed_store, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.sweeps import summary  # noqa: E402
from pipeline.tracking import champion, register_model, tracking_uri  # noqa: E402
from pipeline.tracking.champion import (  # noqa: E402
    DECISION_TAG,
    EVALUATION_RUN_TAG,
    EVALUATION_TAG,
    UNSCORED_TAG,
    Standing,
)


def _registering_runs(tmp_path):
    """``run(*overrides)``: one tiny pipeline run that registers its model as ``tiny``; the
    registry's client after it."""
    data_root = write_corpus(tmp_path / "data", n_train=80, n_test=20)
    base = tiny_overrides(data_root, tmp_path / "out") + ["registry.register=true", "registry.name=tiny"]

    def run(*extra: str):
        cfg = compose_config(base + list(extra))
        run_pipeline(cfg)
        return MlflowClient(tracking_uri(cfg))

    return run


def test_the_champion_alias_only_moves_to_a_model_at_least_as_good_on_the_same_data(tmp_path):
    run = _registering_runs(tmp_path)

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

    # the dev split is carved from the train file: another training file (another dev carved from it)
    # is other evaluation data, as is another column layout under the same label
    other_train = write_corpus(tmp_path / "other", n_train=80, n_test=1, seed=5) / "conll2000" / "train.txt.gz"
    shutil.copy(other_train, tmp_path / "data" / "conll2000" / "other.txt.gz")
    for version, extra in (("4", "dataset.files.train.path=conll2000/other.txt.gz"), ("5", "dataset.columns=[w,chunk,pos]")):
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


def _register(value: float, source: Path, evaluation: str = "e1", name: str = "race"):
    """Register ``source`` as a version of ``name`` of dev_f1 ``value`` on the evaluation key ``evaluation``."""
    standing = Standing("dev_f1", value, "maximize", evaluation)
    version, _ = register_model(source.as_uri(), name, "champion", {"dev_f1": str(value)}, standing)
    return str(version.version)


@pytest.fixture
def local_registry(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # experiments made here keep their artifacts (sweep summaries) in ./mlruns: not the checkout's
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

    def decision(new, *others):
        if new.value == 80.0 and not worker:
            worker.append(threading.Thread(target=lambda: results.setdefault("90", _register(90.0, model))))
            worker[0].start()
            assert at_lock.wait(60)
            worker[0].join(0.5)  # without a lock it finishes here; with one it waits for this registration
        return original_decision(new, *others)

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


# --- data.final_fit=train+dev (H7, H8): a version without a dev score is registered, with its tags,
# and never takes the alias by itself


def test_a_train_dev_version_is_registered_with_its_tags_and_takes_the_alias_only_when_forced(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    run = _registering_runs(tmp_path)

    client = run("data.final_fit=train+dev")  # an empty registry: the version stays out of the alias
    first = client.get_model_version("tiny", "1")
    assert first.tags["data.final_fit"] == "train+dev" and "test_f1" in first.tags and "dev_f1" not in first.tags
    assert first.tags["dataset"] == "conll2000" and first.tags["data.train_fraction"] == "1.0" and first.tags["crf.evaluation"]
    assert Standing.from_tags(first.tags) is None and "train+dev" in first.tags[UNSCORED_TAG]
    assert first.tags[DECISION_TAG].startswith("kept free: this version has no score to compare (data.final_fit=train+dev")
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("tiny", "champion")
    assert "tiny version 1, alias champion: kept free" in caplog.text

    run()  # trained on train alone, scored on dev: takes the free alias
    second = client.get_model_version("tiny", "2")
    assert second.tags["data.final_fit"] == "train" and UNSCORED_TAG not in second.tags
    assert second.tags[DECISION_TAG] == "moved: no version held the alias"
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "2"

    run("data.final_fit=train+dev")  # against a scored holder: kept
    assert client.get_model_version("tiny", "3").tags[DECISION_TAG].startswith("kept: this version has no score to compare")

    run("data.final_fit=train+dev", "registry.force_alias=true")  # the final model, chosen by hand
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "4"
    assert client.get_model_version("tiny", "4").tags[DECISION_TAG].startswith("moved: forced")

    run("trainer.c2=0.5")  # a scored version cannot be compared with it: kept, and the reason names the holder
    reason = client.get_model_version("tiny", "5").tags[DECISION_TAG]
    assert reason.startswith("kept: the holder records no standing to compare with (a data.final_fit=train+dev fit")
    assert "put there by registry.force_alias=true" in reason and "older version" not in reason
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "4"


def test_a_scoreless_holder_that_took_the_alias_without_force_is_replaced_by_a_scored_version(local_registry):
    """A store where an earlier rule let a train+dev version take the free alias (its tags: a test
    score, an alias decision, no standing): the next scored version takes the alias from it."""
    client, model = local_registry
    mlflow.register_model(model.as_uri(), "race", tags={"test_f1": "89.06", DECISION_TAG: "moved: no version held the alias"})
    client.set_registered_model_alias("race", "champion", "1")
    assert _register(67.04, model) == "2"
    assert str(client.get_model_version_by_alias("race", "champion").version) == "2"
    reason = client.get_model_version("race", "2").tags[DECISION_TAG]
    assert reason == "moved: the holder records no standing to defend (registered without a dev score) (version 1)"
    # a holder registered before versions recorded standings (no alias decision) may be good: kept
    mlflow.register_model(model.as_uri(), "legacy", tags={"dev_f1": "85.91"})
    client.set_registered_model_alias("legacy", "champion", "1")
    standing = Standing("dev_f1", 90.0, "maximize", "e1")
    register_model(model.as_uri(), "legacy", "champion", {}, standing)
    assert str(client.get_model_version_by_alias("legacy", "champion").version) == "1"
    assert "registered by an older version of the pipeline" in client.get_model_version("legacy", "2").tags[DECISION_TAG]


def _sweep_job(client, experiment, model, sweep, c2, final_fit="train", dev=None, status="FINISHED", name="sweep", seed=13):
    """A finished (or ``status``) pipeline run of sweep ``sweep`` whose model is ``model`` (scored on
    the dev split of ``seed``: its evaluation key)."""
    tags = {"sweep_id": sweep, "stage": "pipeline", "trainer": "lbfgs", "model_uri": model.as_uri()}
    tags[EVALUATION_RUN_TAG] = "e1" if seed == 13 else f"e{seed}"
    run = client.create_run(experiment, tags=tags)
    params = {"trainer.c1": "0.0", "trainer.c2": str(c2), "registry.name": name, "dataset.name": "conll2000"}
    params["dataset.dev_split.seed"] = str(seed)
    params |= {"data.train_fraction": "1.0", "data.final_fit": final_fit}
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
    if status == "FINISHED":
        client.log_metric(run.info.run_id, "test_f1", 80.0 + c2)
        client.log_metric(run.info.run_id, "nonzero_weights", 100)
        if dev is not None:
            client.log_metric(run.info.run_id, "dev_f1", dev)
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


def _summarize(client, experiment, sweep, force=False, metric=None):
    parent = client.create_run(experiment, tags={"stage": "sweep"}).info.run_id
    registry = OmegaConf.create({"sweep": True, "alias": "champion", "force_alias": force})
    summary.summarize(sweep, parent, "crf", registry, metric=metric)
    return client.get_run(parent).data.tags


def _versions(client, name):
    found = client.search_model_versions(f"name = '{name}'")
    return {str(v.version): v.tags for v in found}


def test_a_sweep_registers_its_train_dev_jobs_each_without_the_alias(local_registry, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    client, model = local_registry
    experiment = client.create_experiment("crf")
    # H7: every job trained on train+dev: no best job, each registered, the alias stays free
    for c2 in (0.1, 1.0):
        _sweep_job(client, experiment, model, "all", c2, "train+dev", name="all")
    tags = _summarize(client, experiment, "all")
    versions = _versions(client, "all")
    assert sorted(versions) == ["1", "2"]
    for version in versions.values():
        assert version["data.final_fit"] == "train+dev" and version["test_f1"] != "none" and version["dev_f1"] == "none"
        assert "train+dev" in version[UNSCORED_TAG] and version[DECISION_TAG].startswith("kept free: this version has no score")
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("all", "champion")
    assert tags["registered_final_fits"] == "models:/all/1, models:/all/2" and "best_run_id" not in tags
    assert (
        "no finished job has a dev score (dev_f1): no best job; 2 data.final_fit=train+dev job(s) registered without a score"
        in caplog.text
    )

    # train and train+dev jobs: the best train job takes the alias, the train+dev job is registered beside it
    best = _sweep_job(client, experiment, model, "mixed", 0.1, dev=85.0, name="mixed")
    _sweep_job(client, experiment, model, "mixed", 1.0, dev=80.0, name="mixed")
    final = _sweep_job(client, experiment, model, "mixed", 0.1, "train+dev", name="mixed")
    _summarize(client, experiment, "mixed")
    holder = client.get_model_version_by_alias("mixed", "champion")
    assert holder.tags["run_id"] == best and holder.tags["data.final_fit"] == "train"
    (other,) = [v for v in _versions(client, "mixed").values() if v["run_id"] == final]
    assert other[DECISION_TAG].startswith("kept: this version has no score to compare (data.final_fit=train+dev")

    # force: onto the only train+dev job of a sweep without a best job, never onto one of several
    _sweep_job(client, experiment, model, "one", 0.1, "train+dev", name="one")
    _summarize(client, experiment, "one", force=True)
    assert client.get_model_version_by_alias("one", "champion").tags[DECISION_TAG].startswith("moved: forced")
    for c2 in (0.1, 1.0):
        _sweep_job(client, experiment, model, "two", c2, "train+dev", name="two")
    _summarize(client, experiment, "two", force=True)
    assert len(_versions(client, "two")) == 2
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("two", "champion")
    assert "registry.force_alias=true: it moves the alias to the sweep's best job, or to its only train+dev job" in caplog.text
    for version in _versions(client, "two").values():  # R6-7: each version says the force was set and why not applied
        reason = version[DECISION_TAG]
        assert "force the move" not in reason, reason
        assert "registry.force_alias=true was set but not applied: " in reason and "2 train+dev jobs" in reason, reason


def test_a_sweep_whose_jobs_lack_its_metric_registers_its_best_scored_job_or_says_why_nothing(local_registry, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    client, model = local_registry
    experiment = client.create_experiment("crf")
    # an Optuna-like sweep: a failed trial, a finished one without the metric, two scored ones
    _sweep_job(client, experiment, model, "some", 0.01, status="FAILED", name="some")
    _sweep_job(client, experiment, model, "some", 0.1, name="some")
    best = _sweep_job(client, experiment, model, "some", 1.0, dev=75.0, name="some")
    _sweep_job(client, experiment, model, "some", 10.0, dev=70.0, name="some")
    _summarize(client, experiment, "some", metric="evaluate.dev_f1")
    assert list(_versions(client, "some")) == ["1"]
    holder = client.get_model_version_by_alias("some", "champion")
    # judged by the name a single run or grid gives the same figure (G4): a later grid's better dev F1 takes the alias
    assert holder.tags["run_id"] == best and Standing.from_tags(holder.tags).metric == "dev_f1"
    grid_best = _sweep_job(client, experiment, model, "grid", 0.1, dev=80.0, name="some")
    _summarize(client, experiment, "grid")
    assert client.get_model_version_by_alias("some", "champion").tags["run_id"] == grid_best
    # no finished job has the metric and none was trained on train+dev: nothing registered, and the log says so
    _sweep_job(client, experiment, model, "none", 0.1, name="none")
    _sweep_job(client, experiment, model, "none", 1.0, status="FAILED", name="none")
    _summarize(client, experiment, "none", metric="evaluate.dev_f1")
    assert client.search_model_versions("name = 'none'") == []
    assert "no finished job has the sweep's metric evaluate.dev_f1: no best job: nothing registered" in caplog.text


def test_a_holder_registered_under_a_stage_metric_name_compares_with_the_summary_name():
    # versions registered by earlier sweeps recorded evaluate.dev_f1; new ones record dev_f1 (G4): one figure
    from pipeline.tracking.champion import alias_decision

    legacy = Standing("evaluate.dev_f1", 85.0, "maximize", "e1")
    assert alias_decision(Standing("dev_f1", 86.0, "maximize", "e1"), legacy, True, False)[0]
    kept, why = alias_decision(Standing("dev_f1", 84.0, "maximize", "e1"), legacy, True, False)
    assert not kept and why.startswith("kept: dev_f1 84 is worse"), why
    kept, why = alias_decision(Standing("dev_accuracy", 99.0, "maximize", "e1"), legacy, True, False)
    assert not kept and "chosen by evaluate.dev_f1" in why, why


def test_tied_jobs_name_the_one_started_first_as_optuna_names_its_best_trial():
    # two trials tied on dev: the summary's best (and so the registered job) is the earlier one,
    # as Optuna's best_trial is, whatever order the table sorts them in (by trainer and strength)
    started = pd.to_datetime(["2026-01-01 10:00:02", "2026-01-01 10:00:00", "2026-01-01 10:00:01"])
    jobs = pd.DataFrame({"run_id": ["late", "early", "worse"], "dev_score": [68.9685, 68.9685, 60.0], "started": started})
    assert summary.best_job(jobs, "dev_score")["run_id"] == "early"
    assert summary.best_job(jobs.iloc[::-1], "dev_score")["run_id"] == "early"
    assert summary.best_job(jobs, "dev_score", "minimize")["run_id"] == "worse"
    # Optuna's trials: the lowest trial number, even when a later trial's run started first (parallel jobs)
    trials = jobs.assign(trial=[0.0, 1.0, 2.0])
    assert summary.best_job(trials, "dev_score")["run_id"] == "late"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # a switch written as a word would be a non-empty string, true to Python: "no" forced the alias (F1)
        ("registry.force_alias=no", "bad setting registry.force_alias='no': true or false"),
        ("registry.register=maybe", "bad setting registry.register='maybe': true or false"),
        ("registry.sweep=1", "bad setting registry.sweep=1: true or false"),
        ("force=no", "bad setting force='no': true or false"),
        ("data.download=off", "bad setting data.download='off': true or false"),
        # what the registry refuses or reads otherwise, found before any stage instead of after training (F2)
        ("registry.alias=v2", "bad setting registry.alias='v2': the registry reserves 'latest' and v<N>"),
        ("registry.alias=Latest", "bad setting registry.alias='Latest': the registry reserves"),
        ("registry.alias=''", "bad setting registry.alias='': letters, digits"),
        ("registry.alias='a b'", "bad setting registry.alias='a b': letters, digits"),
        ("registry.name=''", "bad setting registry.name='': a registered model's name"),
        ("registry.name=a/b", "bad setting registry.name='a/b': a registered model's name"),
        ("registry.name=..", "bad setting registry.name='..': a registered model's name"),
    ],
)
def test_registry_settings_and_switches_are_checked_before_any_stage(override, message):
    from pipeline.engine.validate import SettingsError, validate_settings

    with pytest.raises(SettingsError) as caught:
        validate_settings(compose_config(["registry.register=true", override]))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), caught.value
    if override.startswith(("registry.alias", "registry.name")):  # a run that registers nothing is not refused by them
        validate_settings(compose_config([override]))


def test_good_registry_settings_pass():
    # (checked once: they were checked again, the same, in each case of the test above)
    from pipeline.engine.validate import validate_settings

    for good in ("registry.force_alias=true", "registry.alias=null", "registry.alias=best-2", "registry.name=my_model"):
        validate_settings(compose_config([good, "registry.register=true"]))


def test_a_sweep_whose_jobs_were_scored_on_different_dev_sets_names_no_best_and_registers_nothing(local_registry, caplog):
    """A grid over ``dataset.dev_split.seed``: its dev scores do not compare, so no job is the best
    and none is registered; the log names the setting that differs (H9)."""
    caplog.set_level(logging.INFO, logger="pipeline")
    client, model = local_registry
    experiment = client.create_experiment("crf")
    _sweep_job(client, experiment, model, "seeds", 1.0, dev=81.0, name="seeds", seed=13)
    _sweep_job(client, experiment, model, "seeds", 1.0, dev=80.0, name="seeds", seed=14)
    _sweep_job(client, experiment, model, "seeds", 0.1, "train+dev", name="seeds", seed=14)  # nor its train+dev job
    tags = _summarize(client, experiment, "seeds", force=True)
    assert client.search_model_versions("name = 'seeds'") == [] and "best_run_id" not in tags
    assert "finished jobs were scored on 2 different evaluation data" in caplog.text
    assert "dataset.dev_split.seed=13/14" in caplog.text and "none is registered" in caplog.text
    _sweep_job(client, experiment, model, "same", 1.0, dev=80.0, name="same", seed=14)  # one dev set: ranked as ever
    _sweep_job(client, experiment, model, "same", 0.1, dev=82.0, name="same", seed=14)
    assert "best_run_id" in _summarize(client, experiment, "same")


# A holder of ``@champion`` whose standing tags were removed (by a user tidying tags, say) was read as
# a version registered without a dev score and lost the alias to a worse version (86.31 against its
# 88.48; M3). Its standing is read back from its run, and the rule applies as usual.


def _holder_without_standing_tags(client, model, dev_f1: float | None, evaluation: str | None = "e1") -> None:
    """Version 1 of ``m``, holding ``champion``: its run logged ``dev_f1`` (None: no such metric)
    on evaluation data ``evaluation``, and its version keeps only a decision and a dev accuracy."""
    run_id = client.create_run(client.create_experiment("holders")).info.run_id
    if dev_f1 is not None:
        client.log_metric(run_id, "dev_f1", dev_f1)
    if evaluation:
        client.set_tag(run_id, EVALUATION_RUN_TAG, evaluation)
    client.set_terminated(run_id)
    client.create_registered_model("m")
    tags = {DECISION_TAG: "moved: no version held the alias", "dev_accuracy": "95.1"}
    client.create_model_version("m", model.as_uri(), run_id=run_id, tags=tags)
    client.set_registered_model_alias("m", "champion", "1")


def test_a_holder_whose_standing_tags_were_removed_is_compared_by_its_run(local_registry):
    client, model = local_registry
    _holder_without_standing_tags(client, model, 88.48)
    assert _register(86.31, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert (
        client.get_model_version("m", "2").tags[DECISION_TAG] == "kept: dev_f1 86.31 is worse than the holder's 88.48 (version 1)"
    )
    assert _register(86.31, model, evaluation="e2", name="m") == "3"  # other evaluation data: not comparable, kept
    assert (
        client.get_model_version("m", "3").tags[DECISION_TAG].startswith("kept: the holder was scored on other evaluation data")
    )
    assert _register(90.0, model, name="m") == "4"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "4"


def test_a_holder_whose_run_has_no_score_to_read_back_is_replaced_as_before(local_registry):
    """A holder that took the alias under an earlier rule with no score (nothing in its run either)
    still has nothing to defend: a scored version takes the alias."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, None, "e1")
    assert _register(60.0, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "2"
    assert client.get_model_version("m", "2").tags[DECISION_TAG].startswith("moved: the holder records no standing to defend")


def test_a_holder_whose_run_has_a_score_but_no_evaluation_key_keeps_the_alias(local_registry):
    """Its run's dev F1 (88.48) without the tag of the data it was scored on: filed as scoreless, it
    lost the alias to a worse version (60.0). Its score compares with nothing, so it is kept."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 88.48, None)
    assert _register(60.0, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert (
        client.get_model_version("m", "2")
        .tags[DECISION_TAG]
        .startswith(
            "kept: the holder records no standing to compare with (its standing tags were removed and its run's tag of the data"
        )
    )


def test_a_pipeline_version_whose_tags_were_tidied_keeps_the_alias_against_a_worse_run(tmp_path):
    """M3's case through the pipeline: the standing tags and ``dev_f1`` removed from version 1."""
    run = _registering_runs(tmp_path)
    client = run()
    first = client.get_model_version("tiny", "1")
    for key in [k for k in first.tags if k.startswith("standing.") or k == "dev_f1"]:
        client.delete_model_version_tag("tiny", "1", key)
    run("data.train_fraction=0.1", "trainer.c2=300")  # a quick, worse model
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    assert client.get_model_version("tiny", "2").tags[DECISION_TAG].startswith("kept: dev_f1 ")


def test_a_holder_whose_run_id_tag_names_another_run_keeps_the_alias(tmp_path):
    """``standing.value`` edited, the ``dev_f1`` tag deleted and the ``run_id`` tag pointed at a run
    that exists but logged no dev score (the pipeline's own featurize run), or every tag pointed at
    a real, worse pipeline run: a worse model took the alias (R22-1). The run must name the
    version's model (its source, which no client can edit)."""
    run = _registering_runs(tmp_path)
    client = run()
    first = client.get_model_version("tiny", "1")
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 2: worse, kept
    worse = client.get_model_version("tiny", "2")
    featurize = client.search_runs(
        [client.get_run(first.tags["run_id"]).info.experiment_id],
        filter_string=f"tags.stage = 'featurize' and tags.mlflow.parentRunId = '{first.tags['run_id']}'",
    )[0]
    client.delete_model_version_tag("tiny", "1", "dev_f1")
    client.set_model_version_tag("tiny", "1", champion.VALUE_TAG, "50.0")
    client.set_model_version_tag("tiny", "1", "run_id", featurize.info.run_id)
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 3
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    assert (
        f"the run it names ({featurize.info.run_id}) names no model, not its own models:/"
        in (client.get_model_version("tiny", "3").tags[DECISION_TAG])
    )
    for key in (champion.VALUE_TAG, "dev_f1", "run_id"):  # a consistent lie: every tag of version 2
        client.set_model_version_tag("tiny", "1", key, worse.tags[key])
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 4: as good as the tags now say
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    decision = client.get_model_version("tiny", "4").tags[DECISION_TAG]
    assert f"names the model {worse.source}, not its own {first.source}" in decision


def test_a_holder_whose_run_id_tag_names_a_later_run_of_its_model_keeps_the_alias(tmp_path):
    """A later run that reused the holder's model (a cache hit) names the same model but logged its
    dev score after the registration: with ``standing.value`` edited and the ``dev_f1`` tag deleted,
    the ``run_id`` tag pointed there let a worse model take the alias (R23-1). The pipeline run that
    logged the model (found from MLflow's own run id of the version) still says what it scored."""
    run = _registering_runs(tmp_path)
    client = run()
    first = client.get_model_version("tiny", "1")
    run("registry.register=false")  # the same settings: every stage a cache hit, the same model
    experiment = client.get_run(first.tags["run_id"]).info.experiment_id
    later = client.search_runs([experiment], "tags.stage = 'pipeline'", order_by=["attributes.start_time DESC"])[0]
    assert later.info.run_id != first.tags["run_id"] and later.data.tags["model_uri"] == first.source
    client.delete_model_version_tag("tiny", "1", "dev_f1")
    client.set_model_version_tag("tiny", "1", champion.VALUE_TAG, "50.0")
    client.set_model_version_tag("tiny", "1", "run_id", later.info.run_id)
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 2: worse
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    decision = client.get_model_version("tiny", "2").tags[DECISION_TAG]
    assert "its tags say dev_f1 50, but the run that logged its model had logged" in decision, decision


@pytest.mark.parametrize("edit", ["standing.value deleted", "standing.value nan", "standing.direction minimize"])
def test_a_holder_whose_standing_tags_were_spoiled_keeps_the_alias_when_its_score_shows_elsewhere(tmp_path, edit):
    """Its standing tags made unreadable and its ``run_id`` tag pointed at a later run of its model
    (which logged its score after the registration): filed as "registered without a dev score", it
    lost the alias to a worse version, though its ``dev_f1`` tag still said 85.09 (R24-1)."""
    run = _registering_runs(tmp_path)
    client = run()
    first = client.get_model_version("tiny", "1")
    run("registry.register=false")  # a later run of the same model
    experiment = client.get_run(first.tags["run_id"]).info.experiment_id
    later = client.search_runs([experiment], "tags.stage = 'pipeline'", order_by=["attributes.start_time DESC"])[0]
    if edit == "standing.value deleted":
        client.delete_model_version_tag("tiny", "1", champion.VALUE_TAG)
    elif edit == "standing.value nan":
        client.set_model_version_tag("tiny", "1", champion.VALUE_TAG, "nan")
    else:
        client.set_model_version_tag("tiny", "1", champion.DIRECTION_TAG, "minimize")
    client.set_model_version_tag("tiny", "1", "run_id", later.info.run_id)
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 2: worse
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    decision = client.get_model_version("tiny", "2").tags[DECISION_TAG]
    assert decision.startswith("kept: the holder records no standing to compare with"), decision
    client.delete_model_version_tag("tiny", "1", "dev_f1")  # the run that logged its model still shows it
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 3
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    assert "the run that logged its model had logged dev_f1" in client.get_model_version("tiny", "3").tags[DECISION_TAG]


@pytest.mark.parametrize(
    "value, direction, metric",
    [("nan", "maximize", "dev_f1"), ("inf", "maximize", "dev_f1"), ("88.48", "sideways", "dev_f1"),
     ("88.48", "minimize", "dev_f1"), ("88.48", "maximize", "test_f1"), ("88.48", "minimize", "evaluate.dev_f1")],
)  # fmt: skip
def test_a_holder_whose_standing_tags_were_edited_into_no_score_is_compared_by_its_run(local_registry, value, direction, metric):
    """A holder's ``standing.value`` set to ``nan`` compared as neither better nor worse: every later
    version was kept ("worse than the holder's nan"), so only force could move the alias."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 88.48)  # version 1, its run's dev_f1 88.48 on e1
    tampered = {champion.METRIC_TAG: metric, champion.VALUE_TAG: value, champion.DIRECTION_TAG: direction}
    for key, text in {**tampered, champion.EVALUATION_TAG: "e1"}.items():
        client.set_model_version_tag("m", "1", key, text)
    assert champion.Standing.from_tags(client.get_model_version("m", "1").tags) is None
    assert _register(86.31, model, name="m") == "2"  # read back from the run: its dev_f1 is still 88.48
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert _register(90.0, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"


def _finished_sweep(client, model):
    """The callback of sweep ``late`` whose one job (dev F1 75) finished: it registers as ``late``."""
    from pipeline.sweeps.callback import SweepTracking

    experiment = client.create_experiment("crf")
    _sweep_job(client, experiment, model, "late", 1.0, dev=75.0, name="late")
    callback = SweepTracking()
    callback.sweep_id, callback.experiment = "late", "crf"
    callback.parent_run_id = client.create_run(experiment, tags={"stage": "sweep"}).info.run_id
    callback.registry = OmegaConf.create({"sweep": True, "alias": "champion", "force_alias": False})
    return callback


def test_a_sigterm_during_the_sweeps_summary_registers_nothing_and_ends_it_stopped(local_registry, monkeypatch, caplog):
    """The signal came after the last job, while the summary ran: the sweep's end had already been
    decided a success, so it registered the best job, moved ``@champion`` and exited 0."""
    import signal

    from pipeline.sweeps.sigterm import SWEEP_STOPPING
    from pipeline.tracking.lifecycle import END_REASON_TAG

    client, model = local_registry
    callback = _finished_sweep(client, model)
    chosen = summary.best_job

    def signalled_meanwhile(*args, **kwargs):
        SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
        return chosen(*args, **kwargs)

    monkeypatch.setattr(summary, "best_job", signalled_meanwhile)
    try:
        with pytest.raises(SystemExit) as ended:
            callback.on_multirun_end(config=None)
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == 128 + signal.SIGTERM
    assert client.search_model_versions("name = 'late'") == []
    assert "stopped by SIGTERM during its summary: nothing is registered" in caplog.text
    parent = client.get_run(callback.parent_run_id)
    assert parent.info.status == "FAILED" and parent.data.tags[END_REASON_TAG] == "stopped by SIGTERM"


def test_a_holder_judged_by_its_run_is_judged_by_the_score_it_was_registered_with(local_registry):
    """The holder's standing tags removed and its run's dev F1 logged again as NaN: it was filed as
    "registered without a dev score" and a worse version (66.29 against 85.09) took the alias. A
    value logged after the registration is not what the holder was chosen by, either way."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 85.09)
    holder = client.get_model_version("m", "1")
    time.sleep(0.01)  # the edits come after the registration
    run_id = holder.run_id
    client.log_metric(run_id, "dev_f1", float("nan"), timestamp=holder.creation_timestamp + 5)
    assert math.isnan(client.get_run(run_id).data.metrics["dev_f1"])
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert (
        client.get_model_version("m", "2").tags[DECISION_TAG] == "kept: dev_f1 66.29 is worse than the holder's 85.09 (version 1)"
    )
    client.log_metric(run_id, "dev_f1", 10.0, timestamp=holder.creation_timestamp + 10)  # nor a worse value logged later
    assert _register(66.29, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"


def test_a_forced_holder_whose_standing_tags_were_removed_is_judged_by_its_runs_score(local_registry):
    """A holder put there by registry.force_alias=true with a dev score (66.29), its standing tags
    then removed, kept the alias against a better version (85.09) for good, "registered without a
    dev score", which was false."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 66.29)
    client.set_model_version_tag("m", "1", DECISION_TAG, f"{champion.FORCED} (registry.force_alias=true)")
    assert _register(60.0, model, name="m") == "2"  # worse: kept
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert _register(85.09, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"
    assert (
        client.get_model_version("m", "3").tags[DECISION_TAG] == "moved: dev_f1 85.09 is at least the holder's 66.29 (version 1)"
    )


def test_a_score_logged_later_with_an_earlier_time_leaves_the_holder_in_place(local_registry):
    """Its run's dev_f1 logged again as 1.0, dated 1 ms before the registration: a worse version
    (66.29 against 85.09) took the alias, "at least the holder's 1"."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 85.09)
    holder = client.get_model_version("m", "1")
    client.log_metric(holder.run_id, "dev_f1", 1.0, timestamp=holder.creation_timestamp - 1)
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    decision = client.get_model_version("m", "2").tags[DECISION_TAG]
    assert decision.startswith("kept: the holder records no standing to compare with (its standing tags were removed and")
    assert "its run logged dev_f1 2 times before it was registered (85.09, 1)" in decision


def test_a_holder_whose_standing_value_was_edited_keeps_the_alias(local_registry):
    """One tag edit, the holder's ``standing.value`` 85.09 -> 1.0 (its run still says 85.09), let a
    worse version take the alias: "at least the holder's 1" (R18-3)."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 85.09)
    for key, value in Standing("dev_f1", 1.0, "maximize", "e1").tags().items():
        client.set_model_version_tag("m", "1", key, value)
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    decision = client.get_model_version("m", "2").tags[DECISION_TAG]
    assert decision.startswith("kept: the holder's recorded standing cannot be trusted (its tags say dev_f1 1, but its run")
    assert "had logged 85.09 when it was registered)" in decision
    client.set_model_version_tag("m", "1", champion.VALUE_TAG, repr(85.09))  # the tags agree with the run again
    assert _register(90.0, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"


def _holder_with_edited_standing(client, model, edit: str) -> None:
    """Version 1 of ``m``, holding ``champion`` with dev_f1 85.09 (its run, its ``dev_f1`` tag and
    its standing tags), then its ``standing.value`` edited to 50 and one more edit: ``edit``."""
    _holder_without_standing_tags(client, model, 85.09)
    holder = client.get_model_version("m", "1")
    client.set_model_version_tag("m", "1", "run_id", holder.run_id)
    client.set_model_version_tag("m", "1", "dev_f1", "85.0900")
    for key, value in Standing("dev_f1", 50.0, "maximize", "e1").tags().items():
        client.set_model_version_tag("m", "1", key, value)
    if edit in ("backdated", "backdated and dev_f1 tag"):  # a second value, dated before the registration
        client.log_metric(holder.run_id, "dev_f1", 50.0, timestamp=holder.creation_timestamp - 60_000)
    if edit == "run_id tag deleted":
        client.delete_model_version_tag("m", "1", "run_id")
    if edit == "run_id tag of a missing run":
        client.set_model_version_tag("m", "1", "run_id", "0" * 32)
    if edit == "backdated and dev_f1 tag":
        client.set_model_version_tag("m", "1", "dev_f1", "50.0000")
    if edit == "dev_f1 tag deleted and run_id tag of a missing run":
        client.delete_model_version_tag("m", "1", "dev_f1")
        client.set_model_version_tag("m", "1", "run_id", "0" * 32)


@pytest.mark.parametrize(
    "edit",
    [
        "backdated",
        "run_id tag deleted",
        "run_id tag of a missing run",
        "backdated and dev_f1 tag",
        "dev_f1 tag deleted and run_id tag of a missing run",
        "none",
    ],
)
def test_a_holder_whose_standing_value_was_edited_along_with_another_tag_keeps_the_alias(local_registry, edit):
    """``standing.value`` edited down (85.09 -> 50) plus one more edit (a back-dated score in its run,
    its ``run_id`` tag deleted or pointed at a missing run) let a worse version (66.29) take the alias,
    "at least the holder's 50", while the holder's own ``dev_f1`` tag still said 85.09 (R20-1)."""
    client, model = local_registry
    _holder_with_edited_standing(client, model, edit)
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1", edit
    decision = client.get_model_version("m", "2").tags[DECISION_TAG]
    assert decision.startswith("kept: the holder's recorded standing cannot be trusted ("), decision
    if edit == "backdated and dev_f1 tag":
        assert "its run logged dev_f1 2 times before it was registered" in decision
    elif edit == "dev_f1 tag deleted and run_id tag of a missing run":  # round 21
        assert f"the run it names ({'0' * 32}) is gone and no tag of its dev_f1 confirms its standing" in decision
    elif edit != "none":
        assert "its tags say dev_f1 50, but its tag dev_f1 says 85.09" in decision


def test_a_holder_whose_run_is_gone_is_judged_by_tags_that_agree(local_registry):
    """The run purged (``mlflow gc``) with the version's tags intact: they still speak for it."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 85.09)
    client.set_model_version_tag("m", "1", "run_id", "0" * 32)
    client.set_model_version_tag("m", "1", "dev_f1", "85.0900")
    for key, value in Standing("dev_f1", 85.09, "maximize", "e1").tags().items():
        client.set_model_version_tag("m", "1", key, value)
    assert _register(66.29, model, name="m") == "2"
    decision = client.get_model_version("m", "2").tags[DECISION_TAG]
    assert decision == "kept: dev_f1 66.29 is worse than the holder's 85.09 (version 1)"
    assert _register(90.0, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"


def test_a_holder_whose_run_logged_its_score_as_nan_keeps_the_alias(local_registry):
    """A run that logged its score as NaN has no score to compare: the holder is kept, as when its
    run is gone."""
    client, model = local_registry
    standing = Standing("dev_f1", 60.0, "maximize", "e1")
    _holder_without_standing_tags(client, model, float("nan"))
    reason = champion.holder_unreadable(client, client.get_model_version("m", "1"), standing)
    assert reason == "its run's dev_f1 reads nan as it was registered, so its score cannot be compared"
    assert _register(60.0, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"


def test_a_holder_whose_standing_tags_were_removed_and_whose_run_is_gone_keeps_the_alias(local_registry):
    """With the run purged too (``mlflow gc``), the holder was filed as "registered without a dev
    score" and a worse version took the alias; a holder that nothing says was scoreless is kept."""
    client, model = local_registry
    _holder_without_standing_tags(client, model, 88.48)
    client.set_model_version_tag("m", "1", "run_id", "0" * 32)  # the pipeline run it names: no longer in the store
    standing = Standing("dev_f1", 60.0, "maximize", "e1")
    assert "its run is gone" in champion.holder_unreadable(client, client.get_model_version("m", "1"), standing)
    assert _register(60.0, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert (
        client.get_model_version("m", "2")
        .tags[DECISION_TAG]
        .startswith("kept: the holder records no standing to compare with (its standing tags were removed and its run is gone")
    )
    standing = Standing("dev_f1", 50.0, "maximize", "e1")
    version, _ = register_model(model.as_uri(), "m", "champion", {}, standing, True)  # forcing still moves it
    assert str(client.get_model_version_by_alias("m", "champion").version) == str(version.version) == "3"


def test_a_sigterm_that_comes_as_the_sweep_registers_is_named_with_what_was_registered(local_registry, monkeypatch, caplog):
    """A signal during the registration itself let it finish (a version and the alias), and the
    sweep's last line then said "nothing was registered"."""
    from pipeline.sweeps.sigterm import SWEEP_STOPPING

    client, model = local_registry
    callback = _finished_sweep(client, model)
    registering = summary.register_best

    def signalled_meanwhile(*args, **kwargs):
        uri = registering(*args, **kwargs)
        SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
        return uri

    monkeypatch.setattr(summary, "register_best", signalled_meanwhile)
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
            callback.on_multirun_end(config=None)
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == 143 and [str(v.version) for v in client.search_model_versions("name = 'late'")] == ["1"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert (
        line == "[sweep late] stopped by SIGTERM as it ended: its parent run is FAILED and models:/late@champion had been "
        "registered as the signal came"
    )

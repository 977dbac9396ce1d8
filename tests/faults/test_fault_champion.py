"""The registry's ``@champion`` only moves forward: a worse model (here one trained on a tenth of
the data with heavy smoothing), or one scored on other evaluation data, is registered as a new
version while the alias stays, and the version's tags say why; ``registry.force_alias`` moves it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
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
    assert first.tags[champion.METRIC_TAG] == "dev_f1" and first.tags["data.train_fraction"] == "1.0"
    assert first.tags["dataset"] == "conll2000"

    run("data.train_fraction=0.1", "trainer.c2=300")  # a quick, worse model on the same dev and test data
    worse = client.get_model_version("tiny", "2")
    assert float(worse.tags[champion.VALUE_TAG]) < float(first.tags[champion.VALUE_TAG])
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
    """Register ``source`` as a version of ``name`` of dev_f1 ``value`` on the evaluation key
    ``evaluation``, logged by a run of its own (as a pipeline run logs its model and score)."""
    client = MlflowClient()
    with contextlib.suppress(MlflowException):  # registrations in two threads: one creates it
        client.create_experiment("registering")
    run_id = client.create_run(client.get_experiment_by_name("registering").experiment_id).info.run_id
    client.log_metric(run_id, "dev_f1", value)
    client.set_tag(run_id, EVALUATION_RUN_TAG, evaluation)
    client.log_artifacts(run_id, str(source), "model")
    client.set_terminated(run_id)
    standing = Standing("dev_f1", value, "maximize", evaluation)
    tags = {"dev_f1": str(value), "run_id": run_id}
    version, _ = register_model(f"runs:/{run_id}/model", name, "champion", tags, standing)
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
    assert champion.VALUE_TAG not in first.tags and "train+dev" in first.tags[UNSCORED_TAG]
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

    run("trainer.c2=0.5")  # a scored version cannot be compared with it: kept, and the reason says why
    reason = client.get_model_version("tiny", "5").tags[DECISION_TAG]
    assert reason.startswith("kept: the holder's dev_f1 on this evaluation data is not known (no run of its model")
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "4"


def test_a_holder_registered_without_a_score_is_not_replaced_unless_forced(local_registry):
    """A store where an earlier rule let a train+dev version take the free alias, or one registered
    before versions recorded standings: nothing shows the new version is at least as good."""
    client, model = local_registry
    mlflow.register_model(model.as_uri(), "race", tags={"test_f1": "89.06", DECISION_TAG: "moved: no version held the alias"})
    client.set_registered_model_alias("race", "champion", "1")
    assert _register(67.04, model) == "2"
    assert str(client.get_model_version_by_alias("race", "champion").version) == "1"
    reason = client.get_model_version("race", "2").tags[DECISION_TAG]
    assert reason.startswith("kept: the holder's dev_f1 on this evaluation data is not known (no run names its model")
    version, _ = register_model(model.as_uri(), "race", "champion", {}, Standing("dev_f1", 50.0, "maximize", "e1"), True)
    assert str(client.get_model_version_by_alias("race", "champion").version) == str(version.version) == "3"


def _sweep_job(client, experiment, model, sweep, c2, final_fit="train", dev=None, status="FINISHED", name="sweep", seed=13):
    """A finished (or ``status``) pipeline run of sweep ``sweep`` whose model is ``model`` (scored on
    the dev split of ``seed``: its evaluation key)."""
    tags = {"sweep_id": sweep, "stage": "pipeline", "trainer": "lbfgs"}
    tags[EVALUATION_RUN_TAG] = "e1" if seed == 13 else f"e{seed}"
    run = client.create_run(experiment, tags=tags)
    client.log_artifacts(run.info.run_id, str(model), "model")  # its model, as a version of it names its run
    client.set_tag(run.info.run_id, "model_uri", f"runs:/{run.info.run_id}/model")
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
    assert holder.tags["run_id"] == best and holder.tags[champion.METRIC_TAG] == "dev_f1"
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


# The holder of ``@champion`` is judged by the pipeline run that logged its model, found from what
# MLflow recorded as it was registered, never by its version tags: every earlier rule that read
# them was beaten by some edit of them (a user tidying tags, or a hostile one), and a worse
# version took the alias (M3, R18-3, R20-1 to R24-1).


def _holder_with_a_run(client, model, dev_f1: float | None, evaluation: str | None = "e1") -> None:
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


STANDING_TAGS = (champion.METRIC_TAG, champion.VALUE_TAG, champion.DIRECTION_TAG, EVALUATION_TAG)
TAG_EDITS = {  # version tags of the holder (85.09 on e1): a value, or None to delete the tag
    "standing tags and dev_f1 removed": dict.fromkeys((*STANDING_TAGS, "dev_f1")),
    "standing.value and dev_f1 down": {champion.VALUE_TAG: "50.0", "dev_f1": "50.0"},
    "standing.value nan": {champion.VALUE_TAG: "nan"},
    "standing.value inf": {champion.VALUE_TAG: "inf"},
    "direction flipped": {champion.DIRECTION_TAG: "minimize"},
    "a test score": {champion.METRIC_TAG: "test_f1"},
    "another evaluation": {EVALUATION_TAG: "e2"},
    "run_id tag of a missing run": {"run_id": "0" * 32, champion.VALUE_TAG: "50.0"},
    "run_id tag deleted": {"run_id": None, champion.VALUE_TAG: "50.0"},
    "forced and scoreless": {DECISION_TAG: f"{champion.FORCED} (registry.force_alias=true)", champion.VALUE_TAG: None},
    "registered without a score": {UNSCORED_TAG: "no score", DECISION_TAG: "moved: no version held the alias"},
}


@pytest.mark.parametrize("edit", list(TAG_EDITS))
def test_the_holder_is_judged_by_its_run_whatever_its_version_tags_say(local_registry, edit):
    client, model = local_registry
    assert _register(85.09, model, name="m") == "1"
    for key, value in TAG_EDITS[edit].items():
        if value is None:
            client.delete_model_version_tag("m", "1", key)
        else:
            client.set_model_version_tag("m", "1", key, value)
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    decision = client.get_model_version("m", "2").tags[DECISION_TAG]
    assert decision == "kept: dev_f1 66.29 is worse than the holder's 85.09 (version 1)", decision
    assert _register(85.09, model, name="m") == "3"  # as good: the alias moves forward
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"


RUN_EDITS = {  # what the holder's run (dev_f1 85.09 on e1) says, and why its score cannot be read
    "a second value, back-dated": (
        lambda client, run_id, registered: client.log_metric(run_id, "dev_f1", 1.0, timestamp=registered - 1),
        "the runs of its model had logged 2 different values of dev_f1 by then (85.09, 1)",
    ),
    "its evaluation tag removed": (
        lambda client, run_id, registered: client.delete_tag(run_id, EVALUATION_RUN_TAG),
        "no run of its model logged dev_f1 on evaluation data it names",
    ),
}


@pytest.mark.parametrize("edit", list(RUN_EDITS))
def test_a_holder_whose_run_cannot_say_what_it_scored_keeps_the_alias_until_a_move_is_forced(local_registry, edit):
    client, model = local_registry
    _holder_with_a_run(client, model, 85.09)
    holder = client.get_model_version("m", "1")
    change, why = RUN_EDITS[edit]
    change(client, holder.run_id, holder.creation_timestamp)
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    decision = client.get_model_version("m", "2").tags[DECISION_TAG]
    assert decision == (
        f"kept: the holder's dev_f1 on this evaluation data is not known ({why}); "
        "force the move with registry.force_alias=true (version 1)"
    )
    version, _ = register_model(model.as_uri(), "m", "champion", {}, Standing("dev_f1", 50.0, "maximize", "e1"), True)
    assert str(client.get_model_version_by_alias("m", "champion").version) == str(version.version) == "3"


@pytest.mark.parametrize(
    "holder, why",
    [
        (
            "no score",
            "no run of its model logged dev_f1 on evaluation data it names",
        ),  # a train+dev fit, forced there, or a score by another metric
        ("nan", "its runs' dev_f1 reads nan"),
        ("no run", "no run names its model (gone, or it was registered by hand)"),  # registered by hand from a file
        ("run gone", "no run names its model (gone, or it was registered by hand)"),  # purged (mlflow gc)
    ],
)
def test_a_holder_without_a_readable_score_keeps_the_alias(local_registry, holder, why):
    client, model = local_registry
    client.create_registered_model("m")
    if holder in ("no score", "nan"):
        client.delete_registered_model("m")
        _holder_with_a_run(client, model, None if holder == "no score" else float("nan"))
    else:
        client.create_model_version("m", model.as_uri(), run_id="0" * 32 if holder == "run gone" else None)
        client.set_registered_model_alias("m", "champion", "1")
    assert _register(90.0, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert f"on this evaluation data is not known ({why})" in client.get_model_version("m", "2").tags[DECISION_TAG]


def test_a_score_logged_just_after_the_registration_by_a_client_clock_ahead_still_counts(local_registry):
    """A tracking server whose clock is behind the client's: the score, logged just before the
    registration, reads as later by the version's time; it was taken for none, and the alias stuck."""
    client, model = local_registry
    run_id = client.create_run(client.create_experiment("ahead")).info.run_id
    client.set_tag(run_id, EVALUATION_RUN_TAG, "e1")
    client.create_registered_model("m")
    version = client.create_model_version("m", model.as_uri(), run_id=run_id)
    client.log_metric(run_id, "dev_f1", 85.09, timestamp=version.creation_timestamp + 2_000)  # a client 2 s ahead
    client.set_registered_model_alias("m", "champion", "1")
    assert _register(66.29, model, name="m") == "2"
    assert client.get_model_version("m", "2").tags[DECISION_TAG].startswith("kept: dev_f1 66.29 is worse than the holder's 85.09")
    assert _register(85.09, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"


def test_a_holder_is_judged_by_the_score_its_run_had_when_it_was_registered(local_registry):
    """Its run's dev F1 logged again after the registration (NaN, or worse): not what it was chosen
    by; a worse version (66.29 against 85.09) took the alias."""
    client, model = local_registry
    _holder_with_a_run(client, model, 85.09)
    holder = client.get_model_version("m", "1")
    later = holder.creation_timestamp + champion.CLOCK_SKEW_MS
    client.log_metric(holder.run_id, "dev_f1", float("nan"), timestamp=later + 5)
    client.log_metric(holder.run_id, "dev_f1", 10.0, timestamp=later + 10)
    assert _register(66.29, model, name="m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert (
        client.get_model_version("m", "2").tags[DECISION_TAG] == "kept: dev_f1 66.29 is worse than the holder's 85.09 (version 1)"
    )
    assert _register(85.09, model, name="m") == "3"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"


def test_a_pipeline_holder_keeps_the_alias_whatever_its_version_tags_are_edited_to(tmp_path):
    """Through the pipeline, whose versions are of logged models (``models:/m-...``): the tags
    tidied away, ``standing.value`` edited and the ``run_id`` tag pointed at the pipeline's own
    featurize run or at a later run of the same model (a cache hit), or every tag copied from a
    real, worse version (R22-1, R23-1, R24-1)."""
    run = _registering_runs(tmp_path)
    client = run()
    first = client.get_model_version("tiny", "1")
    score = float(first.tags[champion.VALUE_TAG])
    run("registry.register=false")  # the same settings: every stage a cache hit, the same model
    experiment = client.get_run(first.tags["run_id"]).info.experiment_id
    later = client.search_runs([experiment], "tags.stage = 'pipeline'", order_by=["attributes.start_time DESC"])[0]
    assert later.info.run_id != first.tags["run_id"] and later.data.tags["model_uri"] == first.source
    featurize = client.search_runs(
        [experiment], filter_string=f"tags.stage = 'featurize' and tags.mlflow.parentRunId = '{first.tags['run_id']}'"
    )[0]
    worse_run = ("data.train_fraction=0.1", "trainer.c2=300")
    run(*worse_run)  # version 2: worse, kept
    worse = client.get_model_version("tiny", "2")
    edits = [
        dict.fromkeys((*STANDING_TAGS, "dev_f1")),  # tidied away
        {"dev_f1": None, champion.VALUE_TAG: "50.0", "run_id": featurize.info.run_id},
        {champion.VALUE_TAG: None, "run_id": later.info.run_id},
        {key: worse.tags[key] for key in (*STANDING_TAGS, "dev_f1", "run_id")},  # a consistent lie
    ]
    for number, edit in enumerate(edits, start=3):
        tags = client.get_model_version("tiny", "1").tags
        for key, value in edit.items():
            if value is not None:
                client.set_model_version_tag("tiny", "1", key, value)
            elif key in tags:
                client.delete_model_version_tag("tiny", "1", key)
        run(*worse_run)
        assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1", edit
        decision = client.get_model_version("tiny", str(number)).tags[DECISION_TAG]
        assert decision.startswith("kept: dev_f1 ") and f"worse than the holder's {score:.6g}" in decision, decision
    run()  # as good as the holder: moves
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "7"


def test_a_model_first_logged_by_a_train_only_run_is_judged_by_the_run_that_scored_it(tmp_path):
    """A ``stages=[train]`` run logged the model; a full run (a cache hit) scored and registered it.
    MLflow's run of the version is then the train-only run, which logged no dev score: with the
    version's ``standing.value`` and ``dev_f1`` tags deleted and its ``run_id`` tag pointed there,
    a worse version took the alias (R25-1)."""
    run = _registering_runs(tmp_path)
    run("stages=[train]", "registry.register=false")
    client = run()  # version 1: the same model, scored
    first = client.get_model_version("tiny", "1")
    train_only = client.get_run(client.get_run(first.run_id).data.tags["mlflow.parentRunId"])
    assert train_only.info.run_id != first.tags["run_id"] and "dev_f1" not in train_only.data.metrics
    client.delete_model_version_tag("tiny", "1", champion.VALUE_TAG)
    client.delete_model_version_tag("tiny", "1", "dev_f1")
    client.set_model_version_tag("tiny", "1", "run_id", train_only.info.run_id)
    run("data.train_fraction=0.1", "trainer.c2=300")  # version 2: worse
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"
    assert "worse than the holder's" in client.get_model_version("tiny", "2").tags[DECISION_TAG]
    run()  # as good: moves
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "3"


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


def test_a_sweeps_best_job_is_named_by_its_run_and_only_a_crf_by_its_strengths(local_registry, caplog):
    """An HMM sweep's best line read ``trainer=counting c1=0 c2=1`` (settings the HMM does not read)
    and left out the swept ``model.order`` (round 46): the best job is named by its run name, which
    holds its swept settings, and only a CRF's by its c1 and c2 as well."""
    caplog.set_level(logging.INFO, logger="pipeline")
    client, model = local_registry
    experiment = client.create_experiment("crf")
    for order, dev in ((1, 80.0), (2, 82.5)):
        run_id = _sweep_job(client, experiment, model, "orders", 1.0, dev=dev, name="orders")
        client.set_tag(run_id, "model", "hmm")
        client.set_tag(run_id, "trainer", "counting")
        client.set_tag(run_id, "mlflow.runName", f"conll2000-hmm-counting-order={order}")
    _summarize(client, experiment, "orders")
    assert "best on dev: conll2000-hmm-counting-order=2, dev f1 82.50, test 81.00" in caplog.text, caplog.text
    assert "c2=" not in caplog.text.split("best on dev:")[1].splitlines()[0]
    table = summary.gather("orders", "crf")  # nor does its table show strengths for the HMM's jobs (R47-B3)
    assert len(table) == 2 and table[["c1", "c2", "strength"]].isna().all().all(), table
    for c2, dev in ((0.1, 80.0), (1.0, 79.0)):
        run_id = _sweep_job(client, experiment, model, "crfs", c2, dev=dev, name="crfs")
        client.set_tag(run_id, "model", "crf")
        client.set_tag(run_id, "mlflow.runName", f"conll2000-crf-lbfgs-c2={c2}")
    _summarize(client, experiment, "crfs")
    assert "best on dev: conll2000-crf-lbfgs-c2=0.1 (c1=0 c2=0.1), dev f1 80.00, test 80.10" in caplog.text, caplog.text
    assert sorted(summary.gather("crfs", "crf")["c2"]) == [0.1, 1.0]

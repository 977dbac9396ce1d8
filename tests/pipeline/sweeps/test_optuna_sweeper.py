"""hydra/sweeper=optuna: the search space in Hydra's grammar, the sweeper's settings, the job-side
pruning callback and a real multirun on the tiny corpus with one trial pruned."""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import forkserver
import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import optuna  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from pipeline_helpers import CONF_DIR, seed_store, tiny_overrides, write_corpus  # noqa: E402

from pipeline.engine.runner import objective_value  # noqa: E402
from pipeline.sweeps import search  # noqa: E402
from pipeline.sweeps import trial_stopping as pruning  # noqa: E402
from pipeline.sweeps.search import SweeperSettingError  # noqa: E402

PROJECT = Path(__file__).resolve().parents[3]


def test_search_space_in_hydras_sweep_grammar():
    params = {
        "trainer": "choice(lbfgs, l1, elasticnet)",
        "trainer.strength": "tag(log, interval(0.01, 10))",
        "trainer.period": "range(5, 25, 5)",
        "trainer.num_memories": "tag(int, interval(3, 9))",
        "trainer.threads": "1",
    }
    space = search.parse_space(params, ["trainer.l2_ratio=interval(0.1, 0.9)", "trainer.strength=0.1,0.3", "seed=3"])
    distributions = space.distributions
    assert distributions["trainer"] == CategoricalDistribution(["lbfgs", "l1", "elasticnet"])
    assert distributions["trainer.strength"] == CategoricalDistribution([0.1, 0.3])  # the command line replaced it
    assert distributions["trainer.period"] == IntDistribution(5, 20, step=5)  # Python's range: stop excluded
    assert distributions["trainer.num_memories"] == IntDistribution(3, 9)
    assert distributions["trainer.l2_ratio"] == FloatDistribution(0.1, 0.9)
    assert space.fixed == ["trainer.threads=1", "seed=3"]
    logged = search.parse_space({"trainer.c2": "tag(log, interval(0.001, 10))"}, []).distributions["trainer.c2"]
    assert logged == FloatDistribution(0.001, 10.0, log=True)
    assert search.parse_space({}, ["x=range(0.25, 1, 0.25)"]).distributions["x"] == CategoricalDistribution([0.25, 0.5, 0.75])
    hydras = search.parse_space({}, ["x=int(interval(2, 4))", "y=tag(log, int(interval(2, 40)))", "z=float(interval(2, 4))"])
    assert hydras.distributions == {  # Hydra's own cast of an interval: integer ends make an integer search
        "x": IntDistribution(2, 4), "y": IntDistribution(2, 40, log=True), "z": FloatDistribution(2.0, 4.0)
    }  # fmt: skip


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"trainer.c2": "tag(log, interval(0, 10))"}, "log-scale interval needs a positive low end"),
        ({"trainer.c2": "interval(3, 1)"}, "is empty"),
        ({"trainer.c2": "tag(loga, interval(1, 3))"}, "unknown tag"),
        ({"trainer.c2": "tag(log, choice(1, 3))"}, "applies to interval"),
        ({"trainer.c2": "shuffle(1, 3)"}, "means nothing to a sampler"),
        ({"trainer.c2": "1"}, "nothing to search"),
        ({"trainer.c2": "choice(1, 1)"}, "repeated"),
        ({"trainer.c2": "interval(1,"}, "bad search space"),
        ({"trainer.c2": "tag(int, interval(0.5, 3))"}, "whole-number ends"),
    ],
)
def test_search_space_errors_are_one_line(params, message):
    with pytest.raises(SweeperSettingError, match=message) as info:
        search.parse_space(params, [])
    assert "\n" not in str(info.value)


def test_trial_values_become_overrides_hydra_reads_back():
    values = {"trainer": "l1", "trainer.strength": 0.1 + 0.2, "flag": True, "x": None, "n": 3, "name": "two words", "q": "it's"}
    overrides = search.trial_overrides(values)
    assert overrides[:5] == ["trainer=l1", "trainer.strength=0.30000000000000004", "flag=true", "x=null", "n=3"]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    assert [o.value() for o in parsed] == list(values.values())  # exactly the sampled values


def test_enqueued_settings_are_checked_against_the_space():
    space = search.parse_space({"trainer": "choice(lbfgs, l1)", "trainer.strength": "tag(log, interval(0.01, 10))"}, [])
    assert search.check_enqueued([{"trainer": "l1", "trainer.strength": 1}], space) == [{"trainer": "l1", "trainer.strength": 1}]
    with pytest.raises(SweeperSettingError, match="trainer.c2 is not searched"):
        search.check_enqueued([{"trainer.c2": 1.0}], space)
    with pytest.raises(SweeperSettingError, match="outside its search space"):
        search.check_enqueued([{"trainer.strength": 30}], space)
    with pytest.raises(SweeperSettingError, match="outside its search space"):
        search.check_enqueued([{"trainer": "sgd"}], space)


def _sweeper_config(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["hydra/sweeper=optuna", *overrides], return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.sweeper, resolve=True)


@pytest.mark.parametrize("pruner", sorted(p.stem for p in (Path(CONF_DIR) / "hydra" / "sweeper" / "pruner").glob("*.yaml")))
def test_every_shipped_pruner_builds(pruner):
    given = ["hydra.sweeper.pruner.lower=90"] if pruner == "threshold" else []  # a threshold has no default
    settings = _sweeper_config([f"hydra/sweeper/pruner={pruner}", *given])["pruner"]
    assert settings["kind"] == pruner
    assert isinstance(search.build_pruner(settings), search.PRUNERS[pruner])


def test_kind_none_over_another_pruners_settings_builds_no_pruner():
    """``hydra.sweeper.pruner.kind=none`` (what the objective check's message said to set) kept the
    median's settings beside it and was refused: "NopPruner() takes no arguments" (R18-4)."""
    settings = _sweeper_config(["hydra.sweeper.pruner.kind=none"])["pruner"]
    assert set(settings) > {"kind"} and not search.prunes(settings)
    assert isinstance(search.build_pruner(settings), search.optuna.pruners.NopPruner)
    with pytest.raises(
        search.SweeperSettingError, match=r"choose hydra/sweeper/pruner=none \(or set hydra.sweeper.pruner.kind=none\)"
    ):
        search.check_objective("train.train_seconds", "minimize", _sweeper_config([])["pruner"], 10)
    search.check_objective("train.train_seconds", "minimize", settings, 10)


def test_every_shipped_sampler_builds_and_the_default_space_is_the_grids():
    for sampler in ("tpe", "random"):
        settings = _sweeper_config([f"hydra/sweeper/sampler={sampler}"])["sampler"]
        assert isinstance(search.build_sampler(settings, seed=0), search.SAMPLERS[sampler])
    # the default space parses and is the reg_sweep grid's, continuous
    default = _sweeper_config([])
    space = search.parse_space(default["params"], [])
    assert set(space.distributions) == {"trainer", "trainer.strength"} and default["pruner"]["kind"] == "median"
    assert default["n_trials"] == 20 and default["direction"] == "maximize" and default["metric"] is None


def test_sweeper_settings_fail_in_one_line():
    with pytest.raises(SweeperSettingError, match=r"pruner.kind='medium': one of none, median"):
        search.build_pruner({"kind": "medium"})
    with pytest.raises(SweeperSettingError, match=r"hydra.sweeper.pruner \(median\)"):
        search.build_pruner({"kind": "median", "n_warmup_step": 3})
    with pytest.raises(SweeperSettingError, match="compares the dev score"):
        search.check_objective("train.nonzero_weights", "minimize", {"kind": "median"}, 10)
    search.check_objective("train.nonzero_weights", "minimize", {"kind": "none"}, 10)
    with pytest.raises(SweeperSettingError, match="train.dev_every > 0"):
        search.check_objective(None, "maximize", {"kind": "median"}, 0)
    with pytest.raises(SweeperSettingError, match="is maximised"):
        search.check_objective("evaluate.dev_f1", "minimize", {"kind": "none"}, 10)
    with pytest.raises(SweeperSettingError, match="<stage>.<name>"):
        search.check_objective("dev_f1", "maximize", {"kind": "none"}, 10)


def test_a_bad_sweeper_setting_ends_the_sweep_in_one_line(caplog):
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    sweeper = OptunaSweeper(params={"trainer.c2": "tag(log, interval(0, 1))"})
    sweeper.config, sweeper.launcher = OmegaConf.create({}), object()  # as after setup; nothing is launched
    with pytest.raises(SystemExit) as ended:
        sweeper.sweep([])
    assert ended.value.code == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "trainer.c2: a log-scale interval needs a positive low end, not 0"
    ]


def test_storage_defaults_beside_the_mlflow_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert search.storage_url(None, "outputs") == f"sqlite:///{tmp_path / 'outputs' / 'optuna.db'}"
    with pytest.raises(SweeperSettingError, match=r"studies does not exist; create it or name another"):
        search.storage_url("sqlite:///studies/a.db", "outputs")  # a given storage's folder is not made
    assert search.storage_url("sqlite:///outputs/s.db", "outputs") == f"sqlite:///{tmp_path / 'outputs' / 's.db'}"  # run-made
    (tmp_path / "studies").mkdir()
    assert search.storage_url("sqlite:///studies/a.db", "outputs") == f"sqlite:///{tmp_path / 'studies' / 'a.db'}"
    assert search.storage_url("postgresql+psycopg://u:secret@db:5432/optuna", "x").endswith("@db:5432/optuna")
    assert search.shown_url("postgresql+psycopg://u:secret@db:5432/optuna") == "postgresql+psycopg://***@db:5432/optuna"
    with pytest.raises(SweeperSettingError, match="database URL"):
        search.storage_url("optuna.db", "outputs")
    with pytest.raises(SweeperSettingError, match="in-memory"):
        search.storage_url("sqlite:///:memory:", "outputs")
    for storage in ("sqlite://u:s3cret@localhost/x.db", "postgresql:u:s3cret@db/x", "sqlite://s3cret@/:memory:"):
        with pytest.raises(SweeperSettingError) as refused:  # each refusal quoted the URL as typed (round 35)
            search.storage_url(storage, "outputs")
        assert "s3cret" not in str(refused.value) and "***" in str(refused.value)


def _study_with_a_trial(tmp_path: Path, pruner: dict, metric: str | None = None):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=search.open_storage(url), study_name="s", direction="maximize")
    study.set_user_attr("pruner", pruner)
    study.set_user_attr("metric", metric)
    trial = study.ask({"trainer.c2": FloatDistribution(0.01, 1, log=True)})
    return url, study, trial


def test_the_pruning_callback_reports_and_prunes_through_the_shared_study(tmp_path, monkeypatch):
    url, study, trial = _study_with_a_trial(tmp_path, {"kind": "threshold", "lower": 90.0, "n_warmup_steps": 20})
    assert pruning.reporter_from_environment() is None  # not a trial's job
    monkeypatch.setenv(pruning.STORAGE_VARIABLE, url)
    monkeypatch.setenv(pruning.STUDY_VARIABLE, "s")
    monkeypatch.setenv(pruning.TRIAL_VARIABLE, str(trial.number))
    report = pruning.reporter_from_environment()  # what a job (another process) builds from its environment
    assert pruning.trial_tags() == {"optuna.trial": "0", "optuna.study": "s"}
    report(10, {"dev_accuracy": 70.0, "dev_f1": 60.0})  # below the threshold, but still warming up
    report(20, {"dev_accuracy": 95.0, "dev_f1": 91.0})
    with pytest.raises(pruning.TrialPruned, match="trial 0 pruned .* at iteration 30 \\(dev_f1 85.00\\)") as info:
        report(30, {"dev_accuracy": 96.0, "dev_f1": 85.0})
    assert (info.value.iteration, info.value.metric, info.value.value) == (30, "dev_f1", 85.0)
    (stored,) = optuna.load_study(study_name="s", storage=url).get_trials()
    assert stored.state == TrialState.PRUNED and stored.intermediate_values == {10: 60.0, 20: 91.0, 30: 85.0}


def test_the_pruning_callback_reports_the_studys_metric(tmp_path, monkeypatch):
    url, study, trial = _study_with_a_trial(tmp_path, {"kind": "none"}, metric="evaluate.dev_accuracy")
    report = pruning.TrialReporter(url, "s", trial.number)
    report(10, {"dev_accuracy": 70.0, "dev_f1": 60.0})
    report(20, {"dev_f1": 61.0})  # no accuracy: nothing to report
    assert study.get_trials()[0].intermediate_values == {10: 70.0}
    assert pruning.reported_score(None, {"dev_accuracy": 1.0}) == ("dev_accuracy", 1.0)


def test_progress_hands_dev_scores_to_the_reporter_and_a_prune_stops_training():
    from conftest import word_class_corpus

    from crf import CRF
    from pipeline.models.crf import Progress

    X, y = word_class_corpus(0, 60, 12, (3, 8), inside_below=7, a_below=9)
    logged, seen = [], []

    def report(iteration, scores):
        seen.append((iteration, dict(scores), len(logged)))
        if iteration >= 6:
            raise pruning.TrialPruned(0, iteration, "dev_f1", scores["dev_f1"])

    model = CRF(dev_every=3, max_iterations=50, c2=0.1)
    model.callback = Progress(model, y[40:], "IOB2", lambda batch: logged.extend(batch), report_dev=report)
    with pytest.raises(pruning.TrialPruned):
        model.fit(X[:40], y[:40], X[40:], y[40:])
    assert [iteration for iteration, _, _ in seen] == [3, 6]
    assert set(seen[0][1]) == {"dev_accuracy", "dev_f1"}
    assert seen[-1][2] == 6  # every iteration's step metrics were logged before the pruner was asked


def test_objective_value_names_the_metric_and_has_none_for_a_pruned_trial():
    results = {"train.iterations": 40, "evaluate.dev_f1": 91.0, "evaluate.dev_accuracy": 95.0}
    assert objective_value(results) == 91.0
    assert objective_value(results, "evaluate.dev_accuracy") == 95.0
    assert objective_value(results, "train.iterations") == 40.0
    with pytest.raises(ValueError, match="not one of this job's metrics"):
        objective_value(results, "evaluate.dev_f2")
    assert objective_value({"pipeline.pruned_at_iteration": 20, "pipeline.pruned_dev_f1": 80.0}) is None


def _run_pipeline(arguments: list[str], data_root: Path, out: Path) -> subprocess.CompletedProcess:
    """``python -m pipeline <arguments>`` on the tiny corpus at ``data_root``, writing under ``out``
    (the overrides among ``arguments`` override the tiny corpus's settings)."""
    flags = [a for a in arguments if a.startswith("-")]
    overrides = [a for a in arguments if not a.startswith("-")]
    command = [sys.executable, "-m", "pipeline", *flags, *tiny_overrides(data_root, out), *overrides]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return forkserver.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)


def _tiny_multirun(tmp_path: Path, sweep: list[str]) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """A multirun of ``sweep`` on a new tiny corpus and store: (output folder, data folder, the
    finished process), which succeeded."""
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    out = tmp_path / "out"
    seed_store(out)
    done = _run_pipeline(["-m", *sweep], data_root, out)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return out, data_root, done


@pytest.mark.slow
def test_optuna_sweep_end_to_end_with_a_pruned_trial(tmp_path):
    """A real multirun (joblib, two jobs at a time) of three trials on the tiny corpus: a good
    setting and a hopeless one enqueued first (L1 so strong that dev F1 stays at 80), then one
    sampled; a threshold pruner at dev F1 90 prunes the hopeless one at its first report."""
    sweep = [
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.study_name=tiny",
        "hydra.sweeper.enqueue=[{trainer:lbfgs,trainer.strength:0.01},{trainer:l1,trainer.strength:30}]",
        "trainer.strength=tag(log, interval(0.01, 100))",  # replaces the default space's range
        "hydra/sweeper/pruner=threshold",
        "hydra.sweeper.pruner.lower=90",
    ]
    out, _, done = _tiny_multirun(tmp_path, sweep)

    # the study: in the default storage beside the MLflow store, one trial pruned by its job
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'optuna.db'}")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE]
    assert trials[1].params == {"trainer": "l1", "trainer.strength": 30.0} and trials[1].intermediate_values == {5: 80.0}
    assert trials[0].intermediate_values and trials[0].value == 100.0
    assert study.user_attrs["pruner"]["kind"] == "threshold"
    (results_file,) = (out / "hydra" / "multirun").glob("*/optuna_results.yaml")
    results = OmegaConf.load(results_file)
    assert dict(results.trials) == {"complete": 2, "pruned": 1, "fail": 0} and results.best.trial in (0, 2)

    # MLflow: the sweep's parent run, the trials as its children, the pruned one KILLED and tagged
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'sweep'")
    jobs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    assert len(jobs) == 3 and all(j.data.tags["mlflow.parentRunId"] == parent.info.run_id for j in jobs)
    by_trial = {int(j.data.tags["optuna.trial"]): j for j in jobs}
    assert {j.data.tags["optuna.study"] for j in jobs} == {"tiny"}
    pruned = by_trial[1]
    assert pruned.info.status == "KILLED" and pruned.data.tags["crf.trial_state"] == "PRUNED"
    assert "pruned by the study's pruner at iteration 5" in pruned.data.tags["crf.end_reason"]
    assert pruned.data.metrics["pruned_at_iteration"] == 5 and pruned.data.metrics["pruned_dev_f1"] == 80.0
    stage_runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{pruned.info.run_id}'")
    train = next(r for r in stage_runs if r.data.tags["stage"] == "train")
    assert train.info.status == "KILLED" and train.data.tags["crf.trial_state"] == "PRUNED"
    assert "evaluate" not in {r.data.tags["stage"] for r in stage_runs}
    assert all(by_trial[n].info.status == "FINISHED" and "crf.trial_state" not in by_trial[n].data.tags for n in (0, 2))
    assert not list((out / "cache" / "train").glob(f"{train.data.tags['cache_key']}*"))  # a pruned fit is not cached

    # the grid's summary: pruned jobs counted apart (not failures), the best among finished ones, registered
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["optuna.study"] == "tiny" and parent.data.tags["optuna.storage"] == f"sqlite:///{out / 'optuna.db'}"
    counts = [parent.data.metrics[f"jobs_{state}"] for state in ("finished", "pruned", "failed")]
    assert counts == [2, 1, 0]
    assert parent.data.tags["best_run_id"] in {by_trial[0].info.run_id, by_trial[2].info.run_id}
    assert parent.data.tags["registered_model"] == "models:/conll2000-crf@champion"
    logged = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"sweep_summary.csv", "sweep_summary.md", "sweep.png", "optuna_results.yaml"} <= logged
    summary = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep_summary.csv", str(tmp_path)))
    assert sorted(summary["state"]) == ["FINISHED", "FINISHED", "PRUNED"]
    assert math.isnan(summary.loc[summary.state == "PRUNED", "dev_score"].iloc[0])
    assert "trial 1 (trainer=l1 trainer.strength=30): PRUNED" in done.stdout + done.stderr


class _Launcher:
    """A launcher that runs each job in the calling thread: 'slow' jobs wait until three 'fast'
    ones have ended (or ``wait`` seconds have passed), so the order in which jobs end shows whether
    the sweeper kept a slot busy while a slower trial ran."""

    def __init__(self, wait: float) -> None:
        import threading

        self.lock, self.fast_done, self.ended, self.waited = threading.Lock(), threading.Event(), [], []
        self.fast, self.wait = 0, wait

    def launch(self, batch, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus

        results = []
        for overrides in batch:
            kind = next(o.split("=", 1)[1] for o in overrides if o.startswith("x=")).rstrip("0123456789")
            if kind == "boom":
                raise RuntimeError("the launcher lost its workers")
            if kind == "bad":  # a job that raised (as one whose metric is not among its results)
                error = ValueError("the sweep's metric 'evaluate.dev_f2' is not one of this job's metrics")
                results.append(JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=error))
                continue
            if kind == "slow":
                self.waited.append(self.fast_done.wait(timeout=self.wait))
            with self.lock:
                self.ended.append(kind)
                if kind == "fast":
                    self.fast += 1
                    if self.fast == 3:
                        self.fast_done.set()
            results.append(JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=float(len(kind))))
        return results


def _fake_sweep(tmp_path: Path, dispatch: str, order: list[str], wait: float = 1.0):
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    kinds = "choice(slow, fast1, fast2, fast3, boom, bad1, bad2, a1)"
    sweeper = OptunaSweeper(params={"x": kinds}, n_trials=len(order), n_jobs=2, seed=0,
                            study_name="fake", pruner={"kind": "none"}, enqueue=[{"x": k} for k in order],
                            dispatch=dispatch)  # fmt: skip
    sweeper.config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"name": "fake"}, "overrides": {"hydra": []}},
            "paths": {"output_dir": str(tmp_path)},
            "train": {"dev_every": 10},
        }  # fmt: skip
    )
    sweeper.launcher = _Launcher(wait)
    sweeper.validate_batch_is_legal = lambda batch: None  # no Hydra context here to compose the jobs
    return sweeper


def test_async_dispatch_starts_the_next_trial_when_one_ends(tmp_path):
    # the slow job waits for the three fast ones as long as it takes (a loaded machine may take
    # seconds for their study updates): only a sweeper that leaves the second slot idle fails
    sweeper = _fake_sweep(tmp_path, "async", ["slow", "fast1", "fast2", "fast3"], wait=120.0)
    returns = sweeper.sweep([])
    # three fast trials ran one after another beside the slow one, which saw them end
    assert sweeper.launcher.ended == ["fast", "fast", "fast", "slow"] and sweeper.launcher.waited == [True]
    assert [len(batch) for batch in returns] == [1, 1, 1, 1]
    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [(t.params["x"], t.state, t.value) for t in study.get_trials()] == [
        ("slow", TrialState.COMPLETE, 4.0),
        *[(f"fast{k}", TrialState.COMPLETE, 4.0) for k in (1, 2, 3)],
    ]
    results = OmegaConf.load(tmp_path / "sweep" / "optuna_results.yaml")
    assert dict(results.trials) == {"complete": 4, "pruned": 0, "fail": 0}


def test_batch_dispatch_waits_for_the_slowest_trial_of_each_batch(tmp_path):
    sweeper = _fake_sweep(tmp_path, "batch", ["slow", "fast1", "fast2", "fast3"])
    returns = sweeper.sweep([])
    assert sweeper.launcher.ended == ["slow", "fast", "fast", "fast"] and sweeper.launcher.waited == [False]
    assert [len(batch) for batch in returns] == [2, 2]


def test_a_launcher_failure_fails_the_running_trials_and_ends_the_sweep(tmp_path):
    # the slow job runs until the sweep has ended (no fast job will set the event), so it cannot
    # end first however slowly the failure is handled; then it is let go
    sweeper = _fake_sweep(tmp_path, "async", ["slow", "boom"], wait=120.0)
    try:
        with pytest.raises(RuntimeError, match="lost its workers"):
            sweeper.sweep([])
    finally:
        sweeper.launcher.fast_done.set()
    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.FAIL]  # the slow one's job will not tell


def test_dispatch_follows_the_launcher():
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    sweeper = OptunaSweeper()
    for launcher, expected in ((JoblibLauncher(), "async"), (BasicLauncher(), "batch")):
        sweeper.launcher = launcher
        assert sweeper._dispatch() == expected
    sweeper.dispatch = "batch"
    sweeper.launcher = JoblibLauncher()
    assert sweeper._dispatch() == "batch"
    sweeper.dispatch = "sometimes"
    with pytest.raises(SweeperSettingError, match="dispatch='sometimes': auto, async or batch"):
        sweeper._dispatch()


def _finished(number: int, params: dict, distributions: dict, recorded: bool = True):
    train = {"key": f"key{number}", "hash": f"hash{number}"}
    attrs = {pruning.TRAIN_OUTPUT_ATTR: train, pruning.FEATURES_ATTR: "features"} if recorded else {}
    trial = optuna.trial.create_trial(params=params, distributions=distributions, value=90.0, user_attrs=attrs)
    trial.number = number
    return trial


def test_a_trial_starts_from_the_nearest_finished_trial_of_its_kind():
    """Every key equal but the strengths (here trainer.strength), the nearest strength on the log
    scale, the latest on a tie; a trial whose job recorded no train output is never a source."""
    space = {"trainer": CategoricalDistribution(["lbfgs", "l1"]), "trainer.strength": FloatDistribution(0.01, 10, log=True),
             "model.window": IntDistribution(1, 3), "trainer.min_freq": FloatDistribution(0.0, 5.0)}  # fmt: skip
    done = [
        _finished(0, {"trainer": "l1", "trainer.strength": 0.01, "model.window": 1, "trainer.min_freq": 0.0}, space),
        _finished(1, {"trainer": "lbfgs", "trainer.strength": 1.0, "model.window": 1, "trainer.min_freq": 0.0}, space),
        _finished(2, {"trainer": "l1", "trainer.strength": 5.0, "model.window": 1, "trainer.min_freq": 0.0}, space),
        _finished(
            3, {"trainer": "l1", "trainer.strength": 1.0, "model.window": 1, "trainer.min_freq": 0.0}, space, recorded=False
        ),
        _finished(4, {"trainer": "l1", "trainer.strength": 0.2, "model.window": 2, "trainer.min_freq": 0.0}, space),
        _finished(5, {"trainer": "l1", "trainer.strength": 0.05, "model.window": 1, "trainer.min_freq": 0.0}, space),
        _finished(6, {"trainer": "l1", "trainer.strength": 0.2, "model.window": 1, "trainer.min_freq": 0.5}, space),
    ]

    def source(strength, trainer="l1", window=1, min_freq=0.0, trials=done):
        params = {"trainer": trainer, "trainer.strength": strength, "model.window": window, "trainer.min_freq": min_freq}
        return search.warm_start_source(trials, params, space, ["trainer.strength", "trainer.c2"])

    # log distance from 0.2: to 0.05 is log 4, to 5.0 is log 25 (to 1.0, trial 3, not recorded;
    # trial 4 has another window, trial 6 another min_freq: a float, but not a strength)
    assert source(0.2) == 5
    assert source(2.0) == 2
    assert source(0.1) == 5  # log 2 against log 10
    assert source(0.01, trainer="lbfgs") == 1
    assert source(1.0, trainer="lbfgs", window=2) is None
    assert source(0.3, min_freq=0.5) == 6
    assert source(0.3, min_freq=0.4) is None
    tie = [*done, _finished(7, {"trainer": "l1", "trainer.strength": 0.05, "model.window": 1, "trainer.min_freq": 0.0}, space)]
    assert source(0.04, trials=tie) == 7
    assert source(0.2, trials=[]) is None
    linear = {"trainer.c2": FloatDistribution(0.0, 10.0)}  # off the log scale: distance as a fraction of the range
    both = [_finished(0, {"trainer.c2": 1.0}, linear), _finished(1, {"trainer.c2": 4.0}, linear)]
    assert [search.warm_start_source(both, {"trainer.c2": c2}, linear, ["trainer.c2"]) for c2 in (2.4, 2.5, 2.6)] == [0, 1, 1]
    assert search.warm_start_source(both, {"trainer.c2": 2.4}, linear, []) is None


def test_a_trainer_among_the_near_keys_prefers_its_own_kind_then_takes_another():
    """With the trainer among the near keys, a trial starts from a finished trial of its own trainer
    however far its strength, else from the nearest of another trainer; keys outside the near
    keys must still be equal."""
    space = {"trainer": CategoricalDistribution(["lbfgs", "l1", "elasticnet"]),
             "trainer.strength": FloatDistribution(0.01, 10, log=True), "model.window": IntDistribution(1, 3)}  # fmt: skip
    done = [
        _finished(0, {"trainer": "lbfgs", "trainer.strength": 1.0, "model.window": 1}, space),
        _finished(1, {"trainer": "l1", "trainer.strength": 0.01, "model.window": 1}, space),
        _finished(2, {"trainer": "lbfgs", "trainer.strength": 0.1, "model.window": 2}, space),
        _finished(3, {"trainer": "elasticnet", "trainer.strength": 5.0, "model.window": 1}, space),
    ]
    near = ["trainer", "trainer.strength"]

    def source(trainer, strength, window=1):
        params = {"trainer": trainer, "trainer.strength": strength, "model.window": window}
        return search.warm_start_source(done, params, space, near)

    assert source("l1", 1.0) == 1  # its own trainer, two decades away, before lbfgs at the same strength
    assert source("lbfgs", 0.1) == 0  # trial 2 has another window
    assert source("lbfgs", 0.1, window=2) == 2
    assert source("elasticnet", 0.02) == 3
    assert source("l1", 1.0, window=3) is None
    assert search.warm_start_source(done, {"trainer": "elasticnet", "trainer.strength": 0.02, "model.window": 1}, space,
                                    ["trainer.strength"]) == 3  # fmt: skip
    no_elasticnet = [t for t in done if t.params["trainer"] != "elasticnet"]
    params = {"trainer": "elasticnet", "trainer.strength": 0.02, "model.window": 1}
    assert search.warm_start_source(no_elasticnet, params, space, near) == 1  # strength 0.01 is nearest
    assert search.warm_start_source(no_elasticnet, params, space, ["trainer.strength"]) is None


def test_a_choice_of_numbers_among_the_near_keys_is_matched_by_nearness():
    """``trainer.strength=0.01,0.1,1,10`` is a choice, but of numbers: its nearest value wins (log
    scale when all are positive); an integer near key must still be equal."""
    space = {"trainer": CategoricalDistribution(["lbfgs", "l1"]),
             "trainer.strength": CategoricalDistribution([0.01, 0.1, 1.0, 10.0]),
             "trainer.c2": CategoricalDistribution([-1.0, 0.0, 3.0]), "model.window": IntDistribution(1, 3)}  # fmt: skip
    done = [
        _finished(0, {"trainer": "l1", "trainer.strength": 0.01, "trainer.c2": 0.0, "model.window": 1}, space),
        _finished(1, {"trainer": "lbfgs", "trainer.strength": 10.0, "trainer.c2": 0.0, "model.window": 1}, space),
        _finished(2, {"trainer": "l1", "trainer.strength": 1.0, "trainer.c2": 3.0, "model.window": 1}, space),
        _finished(3, {"trainer": "l1", "trainer.strength": 0.1, "trainer.c2": -1.0, "model.window": 1}, space),
    ]
    near = ["trainer", "trainer.strength", "trainer.c2", "model.window"]

    def source(trainer, strength, c2=0.0, window=1, keys=near):
        params = {"trainer": trainer, "trainer.strength": strength, "trainer.c2": c2, "model.window": window}
        return search.warm_start_source(done, params, space, keys)

    assert source("l1", 10.0, c2=3.0) == 2  # its trainer, the nearest strength (log 10) and c2
    # summed: to trial 3 log 2 + 1/4 of c2's range, to trial 0 log 5 (as plain choices trial 0,
    # which differs in one of them, would win)
    assert source("l1", 0.05) == 3
    assert source("lbfgs", 0.01) == 1  # another trainer only if its own has no finished trial
    assert source("l1", 10.0, keys=["trainer.c2"]) is None  # not a near key: the strength must be equal
    assert source("l1", 0.01, c2=1.0, keys=["trainer.c2"]) == 0
    # numbers of both signs: distance as a fraction of the range (to -1: 1/4, to 3: 3/4); as a
    # plain choice both would be "other" and the latest (3.0) would win
    signs = {"trainer.c2": space["trainer.c2"]}
    both = [_finished(0, {"trainer.c2": -1.0}, signs), _finished(1, {"trainer.c2": 3.0}, signs)]
    assert search.warm_start_source(both, {"trainer.c2": 0.0}, signs, ["trainer.c2"]) == 0
    assert source("l1", 1.0, window=2) is None


def test_a_job_refuses_a_source_of_another_algorithm_or_model_layout(tmp_path):
    """Weights from another algorithm (SGD would report L-BFGS's optimum as its own) or with
    another model layout (a warm start would merge the two) are no starting point; other
    strengths and another L-BFGS trainer are."""
    from crf import CRF
    from pipeline.models.crf import CRFAdapter

    X = [[{"w": "a"}, {"w": "b"}], [{"w": "b"}, {"w": "c"}, {"w": "a"}]]
    y = [["A", "B"], ["B", "C", "A"]]

    def saved(name, capped=0.0, **settings):
        folder = tmp_path / name
        folder.mkdir()
        CRF(max_iterations=5, **settings).fit(X, y).save(folder / "model.npz")
        (folder / "stage_metrics.json").write_text(f'{{"iterations": 5, "stopped_at_max_iterations": {capped}}}')
        return folder

    def cfg(trainer, **model):
        base = {"algorithm": "lbfgs", "c1": 0.0, "c2": 1.0, "max_iterations": 5}
        return OmegaConf.create({"model": {"order": 1, **model}, "trainer": {**base, **trainer}, "train": {"dev_every": 0}})

    adapter = CRFAdapter()
    l2 = saved("l2", c2=0.1)
    assert adapter.warm_start_problem(cfg({"c1": 1.0, "c2": 0.0}), l2) is None  # L1 from L2: the same model
    assert adapter.warm_start_problem(cfg({"algorithm": "l2sgd", "c1": None, "num_memories": None}), l2) == (
        "algorithm 'lbfgs' there, 'l2sgd' here"
    )
    dense = saved("dense", all_possible_states=True)
    assert adapter.warm_start_problem(cfg({}), dense) == "all_possible_states True there, False here"
    assert adapter.warm_start_problem(cfg({}, all_possible_states=True), dense) is None
    assert adapter.warm_start_problem(cfg({"min_freq": 1.0}), l2) == "min_freq 0.0 there, 1.0 here"
    # boundary_transitions compared as it resolves: unset (start/end weights) is the same as true
    assert adapter.warm_start_problem(cfg({}, boundary_transitions=True), l2) is None
    assert adapter.warm_start_problem(cfg({}, boundary_transitions=False), l2) == "boundary_transitions True there, False here"
    # a CRFsuite file beside the model means no start/end weights, for the source (whose file does
    # not keep the path) as for the job
    crfsuite = saved("crfsuite", model_filename=str(tmp_path / "source.crfsuite"))
    assert CRF.load(crfsuite / "model.npz").validate_params().boundary is False
    assert adapter.warm_start_problem(cfg({}, model_filename=str(tmp_path / "job.crfsuite")), crfsuite) is None
    assert adapter.warm_start_problem(cfg({}), crfsuite) == "boundary_transitions False there, True here"
    # a damaged cached model is no start (the trial trains from zero), not an error
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.npz").write_bytes(b"not a model")
    assert adapter.warm_start_problem(cfg({}), broken).startswith("its model cannot be read: ")
    # a fit cut short by its iteration cap: the next fit would carry its training on
    capped = saved("capped", capped=1.0)
    assert (
        adapter.warm_start_problem(cfg({}), capped)
        == "it stopped at its iteration cap (trainer.max_iterations), short of its optimum"
    )
    (l2 / "stage_metrics.json").write_text('{"iterations": 5}')
    assert (
        adapter.warm_start_problem(cfg({}), l2)
        == "its training record does not say whether it converged (no stopped_at_max_iterations)"
    )


def test_the_sweeper_offers_a_trial_the_nearest_finished_trial_of_this_sweep(tmp_path):
    """The job is told the source through its environment; trials of an earlier sweep of a resumed
    study are not offered (their fixed settings may have been others); another trainer's trial is
    offered when the trainer is a warm-start key (the default); warm_start=false offers none."""
    sweeper = _fake_sweep(tmp_path, "async", [])
    space = search.parse_space({"trainer": "choice(lbfgs, l1)", "trainer.strength": "tag(log, interval(0.01, 10))"}, [])
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    earlier = _finished(0, {"trainer": "l1", "trainer.strength": 1.0}, space.distributions)
    study.add_trial(earlier)
    study.enqueue_trial({"trainer": "l1", "trainer.strength": 0.5})
    first, _, overrides = sweeper._ask(study, space)
    assert not any(search.WARM_START_VARIABLE in o for o in overrides)  # trial 0 is another sweep's
    first.set_user_attr(pruning.TRAIN_OUTPUT_ATTR, {"key": "k", "hash": "h"})
    study.tell(first, 94.0)
    study.enqueue_trial({"trainer": "l1", "trainer.strength": 0.3})
    second, _, overrides = sweeper._ask(study, space)
    assert f"++hydra.job.env_set.{search.WARM_START_VARIABLE}='{first.number}'" in overrides
    assert pruning.WARM_START_ATTR not in second.user_attrs  # set by the job, if it does start there
    study.enqueue_trial({"trainer": "lbfgs", "trainer.strength": 0.3})
    _, _, overrides = sweeper._ask(study, space)  # no finished L2 trial: the L1 one (the trainer is a near key)
    assert f"++hydra.job.env_set.{search.WARM_START_VARIABLE}='{first.number}'" in overrides
    sweeper.warm_start_keys = ["trainer.strength"]
    study.enqueue_trial({"trainer": "lbfgs", "trainer.strength": 0.3})
    _, _, overrides = sweeper._ask(study, space)
    assert not any(search.WARM_START_VARIABLE in o for o in overrides)  # the same trainer only: none
    sweeper.warm_start = False
    study.enqueue_trial({"trainer": "l1", "trainer.strength": 0.3})
    _, _, overrides = sweeper._ask(study, space)
    assert not any(search.WARM_START_VARIABLE in o for o in overrides)


def test_only_trainers_that_start_from_given_weights_are_warm_started():
    from pipeline.models.crf import CRFAdapter
    from pipeline.models.hmm import HMMAdapter

    def cfg(algorithm):
        return OmegaConf.create({"trainer": {"algorithm": algorithm}})

    assert [CRFAdapter().can_warm_start(cfg(a)) for a in ("lbfgs", "l2sgd", "ap", "pa", "arow")] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert not HMMAdapter().can_warm_start(cfg("lbfgs"))


def test_a_job_takes_a_finished_trials_weights_only_when_its_features_are_the_same(tmp_path, caplog):
    url, study, first = _study_with_a_trial(tmp_path, {"kind": "none"})
    reporter = pruning.TrialReporter(url, "s", first.number)
    reporter.record_outputs(SimpleNamespace(key="trainkey", hash="trainhash"), "featurekey")
    study.tell(first, 94.0)
    second = study.ask({"trainer.c2": FloatDistribution(0.01, 1, log=True)})
    job = pruning.TrialReporter(url, "s", second.number)
    assert job.warm_start_output(first.number, "featurekey") == ("trainkey", "trainhash")
    with caplog.at_level("WARNING"):
        assert job.warm_start_output(first.number, "otherfeatures") is None
    assert "trial 1: trial 0's weights do not fit (other features): training from zero" in caplog.text
    third = study.ask({"trainer.c2": FloatDistribution(0.01, 1, log=True)})  # running: nothing recorded yet
    assert job.warm_start_output(third.number, "featurekey") is None


@pytest.mark.slow
def test_optuna_sweep_warm_starts_a_trial_from_the_finished_one_nearest_to_it(tmp_path):
    """One trial at a time: L2 at c2 = 1, then L2 at 0.1 (starts from the first one's weights),
    then L1 at c1 = 1 (the first of its kind: from the nearest other trainer's weights, L2 at
    c2 = 1). A warm-started fit is told its start through the stage cache, tagged with it, and stops
    in fewer iterations than the same fit from zero."""
    sweep = [
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=1",
        # the jobs in the sweep's own process, one after another (Hydra's basic launcher): the warm start goes through
        # the study and the stage cache, whatever runs the jobs; a joblib worker pool (two fresh interpreters importing
        # the pipeline, about 12 CPU-s) is tested by the pruned sweep above
        "hydra/launcher=basic",
        "hydra.sweeper.study_name=warm",
        "hydra.sweeper.enqueue=[{trainer:lbfgs,trainer.strength:1.0},{trainer:lbfgs,trainer.strength:0.1},{trainer:l1,trainer.strength:1.0}]",
        "hydra/sweeper/pruner=none",
        "trainer.max_iterations=300",  # to convergence
    ]
    out, data_root, done = _tiny_multirun(tmp_path, sweep)

    trials = optuna.load_study(study_name="warm", storage=f"sqlite:///{out / 'optuna.db'}").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert [t.user_attrs.get(pruning.WARM_START_ATTR) for t in trials] == [None, 0, 0]
    assert all(pruning.TRAIN_OUTPUT_ATTR in t.user_attrs for t in trials)
    assert "trial 1 is offered the weights of trial 0" in done.stdout + done.stderr
    assert "trial 2 is offered the weights of trial 0" in done.stdout + done.stderr

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    jobs = {int(j.data.tags["optuna.trial"]): j
            for j in client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")}  # fmt: skip
    train = {}
    for number, job in jobs.items():
        stages = client.search_runs([experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{job.info.run_id}'")
        train[number] = next(r for r in stages if r.data.tags["stage"] == "train")
    for number in (1, 2):
        source = out / "cache" / "train" / trials[0].user_attrs[pruning.TRAIN_OUTPUT_ATTR]["key"]
        assert train[number].data.tags["warm_start_from"] == str(source)
        assert train[number].data.tags["cache_key"] == trials[number].user_attrs[pruning.TRAIN_OUTPUT_ATTR]["key"]
    assert "warm_start_from" not in train[0].data.tags

    # the same fits from zero, outside the sweep (their own cache entries): the same optimum; L2
    # from L2 in fewer iterations (across trainers the saving is measured on real data, not here)
    for number, trainer, strength in ((1, "lbfgs", 0.1), (2, "l1", 1.0)):
        cold = _run_pipeline([f"trainer={trainer}", f"trainer.strength={strength}", "trainer.max_iterations=300"], data_root, out)
        assert cold.returncode == 0, cold.stderr[-3000:]
        (cold_train,) = [r for r in client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")
                         if r.info.run_id not in {t.info.run_id for t in train.values()}]  # fmt: skip
        train[f"cold {trainer}"] = cold_train
        warm = train[number].data.metrics
        assert cold_train.data.tags["cache_key"] != train[number].data.tags["cache_key"]
        assert warm["iterations"] < 300 and cold_train.data.metrics["iterations"] < 300  # both converged
        assert warm["final_loss"] == pytest.approx(cold_train.data.metrics["final_loss"], rel=1e-4), trainer
    assert train[1].data.metrics["iterations"] < train["cold lbfgs"].data.metrics["iterations"]


def test_the_start_up_trials_are_tpes_own_draws_strongest_first(caplog):
    """TPE's random start-up trials, the same seeded draws, reordered strongest regularisation
    first (log scale); only for a new study with warm starts and the TPE sampler."""
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    searched = {"trainer": "choice(lbfgs, l1, elasticnet)", "trainer.strength": "tag(log, interval(0.01, 10))"}
    space = search.parse_space(searched, [])
    keys = ["trainer", "trainer.strength", "trainer.c1", "trainer.c2"]
    for seed in range(3):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            ordered = search.strongest_first_startup(space, keys, 4, seed)
        assert "study created" not in caplog.text  # the scratch study that draws them is not announced
        tpe = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True))
        drawn = [tpe.ask(space.distributions).params for _ in range(4)]
        assert sorted(map(str, ordered)) == sorted(map(str, drawn))
        strengths = [p["trainer.strength"] for p in ordered]
        assert strengths == sorted(strengths, reverse=True)
    assert search.strongest_first_startup(space, keys, 0, 0) == []
    no_strength = search.parse_space({"trainer": "choice(lbfgs, l1)", "trainer.min_freq": "choice(0, 1, 2)"}, [])
    assert search.strongest_first_startup(no_strength, keys, 4, 0) == []  # nothing to order by

    def study():
        return optuna.create_study(sampler=search.build_sampler(settings, 1), direction="maximize")

    settings = {"kind": "tpe", "n_startup_trials": 4}
    sweeper = OptunaSweeper(params={}, n_trials=6, seed=1, sampler=settings)
    assert sweeper._startup(study(), space, 1, 0) == search.strongest_first_startup(space, keys, 3, 1)  # one enqueued
    assert sweeper._startup(study(), space, 0, 5) == []  # a resumed study: TPE has its trials already
    short = OptunaSweeper(n_trials=2, seed=1, sampler=settings)
    assert short._startup(study(), space, 0, 0) == search.strongest_first_startup(space, keys, 2, 1)
    for off in ({"warm_start": False}, {"strong_first": False}, {"sampler": {"kind": "random"}}):
        assert OptunaSweeper(n_trials=6, seed=1, **{"sampler": settings, **off})._startup(study(), space, 0, 0) == []

    # TPE's own random draws, asked before the start-up trials finish, do not replay them
    swept = study()
    ordered = sweeper._startup(swept, space, 0, 0)
    for params in ordered:
        swept.enqueue_trial(params)
    asked = [swept.ask(space.distributions).params for _ in range(len(ordered) + 4)]
    assert asked[: len(ordered)] == ordered
    assert len({str(sorted(p.items())) for p in asked}) == len(asked)


class _Recorder:
    """A launcher that records each job's overrides and reports 1.0 for it."""

    def __init__(self) -> None:
        self.jobs: list[list[str]] = []

    def launch(self, batch, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus

        self.jobs += [list(o) for o in batch]
        return [JobReturn(overrides=list(o), status=JobStatus.COMPLETED, _return_value=1.0) for o in batch]


def test_a_sweep_runs_the_users_settings_then_the_start_up_draws_strongest_first_on_the_log_scale(tmp_path):
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    params = {"trainer.c1": "tag(log, interval(0.001, 10))", "trainer.c2": "tag(log, interval(0.001, 10))"}
    sweeper = OptunaSweeper(params=params, n_trials=8, n_jobs=1, seed=3, study_name="order", pruner={"kind": "none"},
                            sampler={"kind": "tpe", "n_startup_trials": 8}, enqueue=[{"trainer.c1": 0.5, "trainer.c2": 0.5}],
                            dispatch="batch")  # fmt: skip
    sweeper.config, sweeper.validate_batch_is_legal = _fake_sweep(tmp_path, "batch", []).config, lambda batch: None
    sweeper.launcher = _Recorder()
    sweeper.sweep([])
    ran = [{o.split("=")[0]: float(o.split("=")[1]) for o in job if o.startswith("trainer.")} for job in sweeper.launcher.jobs]
    assert ran[0] == {"trainer.c1": 0.5, "trainer.c2": 0.5}
    strength = [math.log(r["trainer.c1"]) + math.log(r["trainer.c2"]) for r in ran[1:]]
    assert len(ran) == 8 and strength == sorted(strength, reverse=True)
    linear = [r["trainer.c1"] + r["trainer.c2"] for r in ran[1:]]
    assert linear != sorted(linear, reverse=True)  # the draws tell the two scales apart


@pytest.mark.parametrize("value", [None, "x", -1, True])
def test_a_bad_number_of_start_up_trials_is_one_setting_error(value):
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    with pytest.raises(search.SweeperSettingError, match="n_startup_trials"):
        OptunaSweeper(sampler={"kind": "tpe", "n_startup_trials": value})._check_counts()


@pytest.mark.parametrize("sampler", [{"kind": "tpe", "n_startup_trials": 8}, {"kind": "random"}])
def test_a_resumed_study_does_not_replay_its_first_sweeps_random_draws(tmp_path, sampler):
    """The same study name and seed again: the sampler continues with other draws (seeded by the
    trials already there) instead of asking for the first sweep's settings once more."""
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper

    config = _fake_sweep(tmp_path, "batch", []).config
    ran = []
    for _ in range(2):
        sweeper = OptunaSweeper(params={"trainer.c2": "tag(log, interval(0.001, 10))"}, n_trials=3, n_jobs=1, seed=3,
                                study_name="again", pruner={"kind": "none"}, sampler=sampler, strong_first=False,
                                dispatch="batch")  # fmt: skip
        sweeper.config, sweeper.validate_batch_is_legal, sweeper.launcher = config, lambda batch: None, _Recorder()
        sweeper.sweep([])
        ran.append([o for job in sweeper.launcher.jobs for o in job if o.startswith("trainer.c2=")])
    assert len(ran[0]) == len(ran[1]) == 3 and not set(ran[0]) & set(ran[1]), ran


def test_failing_a_trial_that_another_thread_just_failed_is_not_an_error():
    """On an interruption the sweep's loop and the trial's launch both tell the study FAIL;
    Optuna checks, then updates, so the second tell can raise even with skip_if_finished."""
    from hydra_plugins.crf_optuna_sweeper import optuna_sweeper

    study = optuna.create_study()
    trial = study.ask()
    told = []

    def tell(*args, **kwargs):  # the other thread's tell landed between Optuna's check and update
        told.append(kwargs["state"])
        raise optuna.exceptions.UpdateFinishedTrialError("Trial#0 has already finished")

    study.tell = tell
    optuna_sweeper._fail(study, trial)
    assert told == [optuna.trial.TrialState.FAIL]


def test_the_summary_and_champion_follow_the_sweepers_metric_and_direction(tmp_path, monkeypatch):
    """A sweep that minimises the dev calibration error ranks its jobs by it, not by dev F1."""
    import mlflow

    from pipeline.sweeps import summary as grid

    uri = f"sqlite:///{seed_store(tmp_path)}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # the experiment's artifacts go to ./mlruns: not the checkout's
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("crf")
    jobs = {}
    for c2, f1, error in ((0.01, 90.0, 0.05), (0.1, 80.0, 0.01), (1.0, 85.0, 0.03)):
        run = client.create_run(experiment, tags={"sweep_id": "s", "stage": "pipeline", "trainer": "lbfgs"})
        client.log_batch(
            run.info.run_id, params=[mlflow.entities.Param("trainer.c1", "0.0"), mlflow.entities.Param("trainer.c2", str(c2))]
        )
        for key, value in (("dev_f1", f1), ("test_f1", f1 - 1), ("dev_calibration_error", error), ("nonzero_weights", 100)):
            client.log_metric(run.info.run_id, key, value)
        client.set_terminated(run.info.run_id, "FINISHED")
        jobs[c2] = run.info.run_id

    def best(**objective) -> str | None:
        parent = client.create_run(experiment, tags={"stage": "sweep"}).info.run_id
        grid.summarize("s", parent, "crf", **objective)
        return client.get_run(parent).data.tags.get("best_run_id")

    assert best() == jobs[0.01]  # a grid's rule: the largest dev score
    assert best(metric="evaluate.dev_calibration_error", direction="minimize") == jobs[0.1]
    assert best(metric="evaluate.dev_calibration_error", direction="maximize") == jobs[0.01]
    assert best(metric="evaluate.dev_f2", direction="maximize") is None  # no job has it: no best, nothing registered
    table = grid.gather("s", "crf", metric="evaluate.dev_calibration_error")
    assert sorted(table["objective"]) == [0.01, 0.03, 0.05]
    # jobs that stop before evaluate (stages=[train]) have no dev score: ranked by a train metric all the same
    losses = {}
    for c2, loss in ((0.1, 30.0), (1.0, 20.0)):
        run = client.create_run(experiment, tags={"sweep_id": "t", "stage": "pipeline", "trainer": "lbfgs"})
        client.log_batch(
            run.info.run_id, params=[mlflow.entities.Param("trainer.c1", "0.0"), mlflow.entities.Param("trainer.c2", str(c2))]
        )
        client.log_metric(run.info.run_id, "final_loss", loss)
        client.log_metric(run.info.run_id, "nonzero_weights", 10)
        client.set_terminated(run.info.run_id, "FINISHED")
        losses[c2] = run.info.run_id
    parent = client.create_run(experiment, tags={"stage": "sweep"}).info.run_id
    grid.summarize("t", parent, "crf", metric="train.final_loss", direction="minimize")
    ended = client.get_run(parent).data
    assert ended.tags["best_run_id"] == losses[1.0] and ended.metrics["best_objective"] == 20.0
    assert "best_dev_score" not in ended.metrics and ended.metrics["jobs_finished"] == 2


def test_the_metric_must_be_one_the_jobs_pipeline_runs_show():
    search.check_objective("prepare.train_tokens", "maximize", {"kind": "none"}, 10)
    with pytest.raises(SweeperSettingError, match="one of the stages prepare, train, evaluate"):
        search.check_objective("featurize.features", "maximize", {"kind": "none"}, 10)
    with pytest.raises(SweeperSettingError, match="one of the stages"):
        search.check_objective("evaluation.dev_f1", "maximize", {"kind": "none"}, 10)


def test_a_fixed_c1_or_c2_beside_a_searched_strength_is_refused():
    searched = {"trainer.strength": "tag(log, interval(0.01, 10))"}
    with pytest.raises(
        SweeperSettingError, match=r"bad setting trainer.c2=0.1 with trainer.strength=<searched>.*~hydra.sweeper.params"
    ):
        search.check_strength(search.parse_space(searched, ["trainer.c2=0.1"]))
    with pytest.raises(SweeperSettingError, match="trainer.c1=<searched> with trainer.strength=<searched>"):
        search.check_strength(search.parse_space(searched, ["trainer.c1=tag(log, interval(0.01, 1))"]))
    search.check_strength(search.parse_space(searched, ["trainer.threads=1", "trainer=l1"]))
    search.check_strength(search.parse_space({"trainer.c2": "tag(log, interval(0.01, 10))"}, ["trainer.c1=0.1"]))


def test_a_resumed_study_keeps_its_metric_and_its_search_space(tmp_path, caplog):
    _fake_sweep(tmp_path, "batch", ["fast1", "fast2"]).sweep([])
    other_metric = _fake_sweep(tmp_path, "batch", ["fast1"])
    other_metric.metric = "evaluate.dev_accuracy"
    other_choices = _fake_sweep(tmp_path, "batch", ["fast1"])
    other_choices.params = {"x": "choice(fast1, fast2)"}
    for sweeper, message in (
        (other_metric, "study 'fake' in sqlite:///.* optimises the dev score, not evaluate.dev_accuracy: choose another"),
        (other_choices, "study 'fake' in .* searched x as CategoricalDistribution.* which cannot become"),
    ):
        caplog.clear()
        with pytest.raises(SystemExit) as ended:
            sweeper.sweep([])
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert ended.value.code == 2 and len(errors) == 1 and re.match(message, errors[0]), errors
    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2  # nothing asked, nothing left running
    assert study.user_attrs["metric"] is None


def test_a_storage_that_cannot_be_opened_is_one_setting_error(tmp_path, caplog):
    for url, what in (("foo://bar", "NoSuchModuleError"), (f"sqlite:///{tmp_path}/file/optuna.db", "")):
        (tmp_path / "file").write_text("a file where the folder should be")
        sweeper = _fake_sweep(tmp_path, "batch", ["fast1"])
        sweeper.storage = url
        caplog.clear()
        with pytest.raises(SystemExit) as ended:
            sweeper.sweep([])
        (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert (
            ended.value.code == 2 and error.startswith(f"hydra.sweeper.storage: cannot open {url} ({what}") and "\n" not in error
        )


def test_a_sweep_whose_trials_all_fail_ends_in_one_line_naming_the_first_failure(tmp_path, caplog):
    sweeper = _fake_sweep(tmp_path, "batch", ["bad1", "bad2", "fast1"])
    with pytest.raises(SystemExit) as ended:
        sweeper.sweep([])
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert ended.value.code == 1 and len(errors) == 1
    assert errors[0].startswith("every trial so far failed (2), the first with: ValueError: the sweep's metric")
    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    # the third is never asked (an enqueued setting waits for the study's next sweep)
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.FAIL, TrialState.WAITING]


def test_the_summarys_strength_is_c1_with_an_l1_term_else_c2():
    from pipeline.sweeps import summary as grid

    runs = pd.DataFrame({"params.trainer.c1": ["0.5", "0.0", "0.1"], "params.trainer.c2": ["1.0", "0.3", "0.0"]})
    assert list(grid.strength(runs)) == [0.5, 0.3, 0.1]  # elastic net at l2_ratio 2, L2, L1


def test_a_resumed_sweeps_results_give_its_own_best_and_the_studys_when_that_was_better(tmp_path):
    _fake_sweep(tmp_path, "batch", ["fast1"]).sweep([])  # 4.0
    _fake_sweep(tmp_path, "batch", ["a1"]).sweep([])  # 1.0, resuming the study
    results = OmegaConf.load(tmp_path / "sweep" / "optuna_results.yaml")
    assert dict(results.trials) == {"complete": 1, "pruned": 0, "fail": 0}
    assert (results.best.trial, results.best.value) == (1, 1.0)
    assert (results.study_best.trial, results.study_best.value) == (0, 4.0)

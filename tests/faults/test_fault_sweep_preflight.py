"""Fault injection on sweeps: every setting a single run refuses is refused for every job of a grid
and every trial of an Optuna sweep before the first one runs, as is a sweep that cannot be expanded
(a range with step 0, an end that is not finite, no value), a config group option that does not
exist, and an Optuna objective that no trial can have (a dev score under ``data.final_fit=train+dev``):
one line, exit code 2, no sweep parent run, no Optuna study."""

from __future__ import annotations

import copy
import fnmatch
import logging
import os
import re
import sys
from pathlib import Path

import forkserver
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from mlflow.entities import ViewType  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf, open_dict  # noqa: E402
from pipeline_helpers import CONF_DIR, refused_line, tiny_overrides, write_corpus  # noqa: E402

from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper  # noqa: E402
from pipeline.engine.stage import load_stages  # noqa: E402
from pipeline.engine.validate import SettingsError  # noqa: E402
from pipeline.sweeps import search  # noqa: E402
from pipeline.sweeps.grid_preflight import BASIC_SWEEPER, check_grid_jobs, composition_problem  # noqa: E402


@pytest.fixture(scope="module")
def grid_base(tmp_path_factory):
    """The config of ``python -m pipeline -m`` on the tiny overrides before its task is set, composed once:
    the grid's jobs are composed from the task (``hydra.overrides.task``), which each test sets on a copy."""
    root = tmp_path_factory.mktemp("grid")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=tiny_overrides(root / "data", root / "out"), return_hydra_config=True)


def _grid(task: list[str], base):
    """The config Hydra hands to ``on_multirun_start`` for ``python -m pipeline -m <task>``."""
    config = copy.deepcopy(base)
    with open_dict(config):
        config.hydra.overrides.task = task
        config.hydra.sweeper = {"_target_": BASIC_SWEEPER, "max_batch_size": None, "params": {}}
    return config


@pytest.mark.parametrize(
    ("task", "message"),
    [
        # a config group option that does not exist (H4), in any job
        (["trainer=lbfgs,nosuch"], "sweep job #1 (trainer=nosuch): cannot compose the job: In 'config': Could not find "
         "'trainer/nosuch' (options of trainer: base, elasticnet, l1, lbfgs, sgd); no job was run"),
        (["dataset=nosuch,conll2000"], "sweep job #0 (dataset=nosuch): cannot compose the job: In 'config': "
         "Could not find 'dataset/nosuch'"),
        (["trainer=l2sgd", "trainer.c2=0.1,1"], "sweep job #0 (trainer=l2sgd trainer.c2=0.1): cannot compose the job"),
        (["trainer.nosuch=1,2"], "sweep job #0 (trainer.nosuch=1): cannot compose the job: Could not override 'trainer.nosuch': "
         "the config has no such key (a misspelling?); +trainer.nosuch=1 adds it only where new keys are taken"),
        # a stage's own setting (H5): the stages the job will run are checked
        (["data.final_fit=train,nosuch"], "sweep job #1 (data.final_fit=nosuch): data.final_fit='nosuch': one of train, "
         "train+dev"),
        (["evaluate.calibration_bins=10,0"], "sweep job #1 (evaluate.calibration_bins=0): bad setting "
         "evaluate.calibration_bins=0"),
        (["stages=[evaluate],[nosuch]"], "sweep job #1 (stages=[nosuch]): bad setting: unknown stage 'nosuch'"),
        # a regularisation path's own checks
        (["+experiment=reg_path", "path.strengths=[1,0.1],[1,-1]"], "sweep job #1 (+experiment=reg_path path.strengths=[1,-1]): "
         "bad setting path.strengths=[1, -1]: -1 is not a positive number"),
        # a sweep over what no stage of its jobs reads: they would be one fit (R45-4, R46-1)
        (["model=hmm", "trainer=lbfgs,l1", "trainer.strength=0.1,1"], "the sweep over trainer, trainer.strength: jobs that "
         "differ only there would be the same fit, as no stage they run (prepare, train, evaluate, with model=hmm) reads "
         "them; no job was run"),
        (["model=hmm", "model.order=1,2", "trainer.c2=0.1,1"], "the sweep over trainer.c2: jobs that differ only there"),
        (["model=hmm", "features=chunking,pos"], "the sweep over features: jobs that differ only there would be the same fit"),
        (["model=hmm", "featurize.log_matrices=true,false"], "the sweep over featurize.log_matrices: jobs that differ"),
        (["dataset.hmm.observation=w,pos"], "the sweep over dataset.hmm.observation: jobs that differ only there would "
         "be the same fit, as no stage they run (prepare, featurize, train, evaluate, with model=crf) reads it"),  # R48-1
        (["model=hmm", "seed=0,1"], "the sweep over seed: jobs that differ"),  # it draws no fraction of 1 (R49-1)
        (["+experiment=reg_path", "path.strengths=[1,0.1]", "trainer.strength=5,50"], "the sweep over trainer.strength: "
         "jobs that differ only there would be the same fit, as no stage they run (prepare, featurize, train, evaluate, "
         "with model=crf, at each point of path.strengths) reads it"),  # the path sets it (R47-1)
        # a sweep that cannot be expanded (H13)
        (["trainer.c2=range(0,1,0)"], "bad sweep trainer.c2=range(0, 1, 0): the step must not be 0; no job was run"),
        (["trainer.c2=range(0,1,0.0)"], "bad sweep trainer.c2=range(0, 1, 0.0): the step must not be 0"),
        (["trainer.c2=range(0,inf,1)"], "bad sweep trainer.c2=range(0, inf, 1): start, stop and step must be finite numbers"),
        (["trainer.c2=range(0,nan,1)"], "bad sweep trainer.c2=range(0, nan, 1): start, stop and step must be finite numbers"),
        (["trainer.c2=range(1,0)"], "bad sweep trainer.c2=range(1, 0, 1): it has no values"),
        (["trainer.c2=range(0,1e300,1e-300)"], "values, more than the 100,000 a sweep lists"),
        (["trainer.c2=interval(0,1)"], "bad sweep trainer.c2=interval(0, 1): a grid (Hydra's basic sweeper) runs listed values"),
    ],
)  # fmt: skip
def test_a_grid_job_a_single_run_would_refuse_ends_the_sweep_before_any_job(grid_base, caplog, task, message):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        line = refused_line(lambda: check_grid_jobs(_grid(task, grid_base)), caplog)
    assert message in line


def test_a_grid_of_good_jobs_passes(grid_base, caplog):
    """Nothing a grid can run is refused: a glob of a group's options, train+dev jobs (a grid may
    refit: nothing needs their dev score), a float range, a path."""
    tasks = [
        ["trainer=glob(l*)"],
        ["data.final_fit=train,train+dev"],
        ["trainer.c2=range(0.1,1,0.3)"],
        ["+experiment=reg_path", "trainer=lbfgs,l1"],
        ["model=crf,hmm", "trainer.c2=0.1,1", "features=chunking,pos"],  # the CRF's jobs read trainer.c2 and features
        ["model=hmm", "model.order=1,2", "data.train_fraction=0.5,1", "seed=0,1", "registry.name=a,b"],
        ["model=hmm", "dataset.hmm.observation=w,pos", "dataset.hmm.capitalization=true,false"],  # the HMM reads them
        ["model=hmm", "model.transition_smoothing=add-k", "model.k=0.1,0.5", "model.rare_threshold=5,10"],
        ["model=hmm", "model.k=0.1,0.5"],  # unused by the counting, but kept in the model: baum_welch's prior
        ["trainer.threads=1,2"],  # the same fit in other time: a speed comparison
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None), caplog.at_level(logging.WARNING):
        for task in tasks:
            check_grid_jobs(_grid(task, grid_base))
    assert not caplog.records


def test_hydra_composition_errors_become_one_line():
    error = ValueError(
        "In 'config': Could not find 'trainer/x'\n\nAvailable options in 'trainer':\n\tbase\n\tlbfgs\nConfig search path:\n"
        "\tprovider=hydra, path=pkg://hydra.conf\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    )
    assert composition_problem(error) == "In 'config': Could not find 'trainer/x' (options of trainer: base, lbfgs)"
    assert composition_problem(ValueError("one\ntwo")) == "one"
    missing_key = ValueError("Could not override 'trainer.x'.\nTo append to your config use +trainer.x=1")
    assert composition_problem(missing_key) == (  # Hydra's advice alone contradicted the refusal of most '+' keys (L14)
        "Could not override 'trainer.x': the config has no such key (a misspelling?); +trainer.x=1 adds it only where new "
        "keys are taken (a model's own parameters, feature views and lexicons, a dataset's optional keys)"
    )
    renamed = ValueError("Could not override 'model.pruning_threshold'.\nTo append to your config use +model.pruning_threshold=1")
    assert composition_problem(renamed) == (  # a setting of earlier versions names its new name
        "Could not override 'model.pruning_threshold': the config has no such key; pruning_threshold is now called "
        "candidate_threshold"
    )


def _arguments(tmp_path: Path, task: list[str]) -> list[str]:
    """The command line's overrides, as Hydra hands them to the sweeper's ``sweep``."""
    return [*tiny_overrides(tmp_path / "data", tmp_path / "out"), *task]


def _optuna(tmp_path: Path, params: dict, task: list[str] = (), **settings) -> OptunaSweeper:
    """The Optuna sweeper on the tiny corpus as after Hydra's setup (its config loader composes
    the trials' jobs), with a launcher that must not be called."""
    overrides = ["hydra/sweeper=optuna", *_arguments(tmp_path, task)]
    config = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    sweeper = OptunaSweeper(params=params, n_trials=2, n_jobs=1, pruner={"kind": "none"}, dispatch="batch", **settings)
    sweeper.config, sweeper.config_loader = config, GlobalHydra.instance().config_loader()
    sweeper.launcher = object()  # no launch(): launching a trial would fail the test
    return sweeper


@pytest.mark.parametrize(
    ("params", "task", "message"),
    [
        # values a trial cannot pass as an override (H3)
        ({"trainer.c2": "choice(0.1, nan)"}, [], "trainer.c2: choice value nan is not a finite number"),
        ({"trainer.c2": "choice(0.1, -inf)"}, [], "trainer.c2: choice value -inf is not a finite number"),
        ({"trainer.c2": "interval(0.1, inf)"}, [], "trainer.c2: interval(0.1, inf) needs finite ends"),
        ({"trainer.c2": "range(0, 1, 0)"}, [], "bad sweep trainer.c2=range(0, 1, 0): the step must not be 0"),
        ({"trainer.c2": "range(0.5, 0.1)"}, [], "bad sweep trainer.c2=range(0.5, 0.1, 1): it has no values"),
        # a value a run refuses, searched or fixed
        ({"trainer.c2": "choice(0.1, -1)"}, [], "the trials with trainer.c2=-1: bad setting trainer.c2=-1"),
        ({"trainer.c2": "interval(-1, 1)"}, [], "the trials with trainer.c2=-1.0: bad setting trainer.c2=-1.0"),
        ({"trainer.c2": "tag(log, interval(0.01, 1e300))"}, [], "the trials with trainer.c2=1e+300: bad setting "
         "trainer.c2=1e+300: c2=1e+300 is above 1e+12"),
        ({"evaluate.calibration_bins": "range(0, 20, 10)"}, [], "the trials with evaluate.calibration_bins=0: bad setting"),
        ({"trainer.c2": "interval(0.1, 1)", "data.final_fit": "nosuch"}, [], "data.final_fit='nosuch': one of train, train+dev"),
        ({"trainer.c2": "interval(0.1, 1)"}, ["evaluate.calibration_bins=0"], "bad setting evaluate.calibration_bins=0"),
        # an objective no trial can have (H6)
        ({"trainer.c2": "interval(0.1, 1)"}, ["data.final_fit=train+dev"], "data.final_fit=train+dev: such a run has no "
         "dev split"),
        ({"trainer.c2": "interval(0.1, 1)", "data.final_fit": "choice(train, train+dev)"}, [], "such a run has no dev split"),
        ({"trainer.c2": "interval(0.1, 1)", "stages": "[train]"}, ["metric=evaluate.dev_f1"],
         "hydra.sweeper.metric=evaluate.dev_f1: the trials with "
         "trainer.c2=0.1 do not run stage evaluate"),
        # a search tuned on the test set (K9), whatever the refit
        ({"trainer.c2": "interval(0.1, 1)"}, ["metric=evaluate.test_f1"], "hydra.sweeper.metric=evaluate.test_f1: a score "
         "on the test set, which a search must not see"),
        ({"trainer.c2": "interval(0.1, 1)"}, ["data.final_fit=train+dev", "metric=evaluate.test_accuracy"],
         "hydra.sweeper.metric=evaluate.test_accuracy: a score on the test set"),
        ({"trainer.c2": "interval(0.1, 1)"}, ["dataset=ud_english_ewt_upos", "features=pos", "metric=evaluate.dev_f1"],
         "hydra.sweeper.metric=evaluate.dev_f1: dataset "
         "ud_english_ewt_upos has no chunks (dataset.scheme=none), so its runs score accuracy, not F1: optimise "
         "evaluate.dev_accuracy"),
        # a metric the stage does not log (F4), with the pruner off: the pruner's own check does not see it
        ({"trainer.c2": "interval(0.1, 1)"}, ["metric=evaluate.nosuch"], "hydra.sweeper.metric=evaluate.nosuch: "
         "stage evaluate logs no metric nosuch in the trials with trainer.c2=0.1 (its metrics: dev_tag_tokens_per_second"),
        ({"trainer.c2": "interval(0.1, 1)"}, ["metric=train.dev_f1"], "stage train logs no metric dev_f1"),
        ({"model.order": "choice(1, 2)"}, ["model=hmm", "metric=train.iterations"], "stage train logs no metric "
         "iterations in the trials with model.order=1 (its metrics: train_seconds, model_bytes, labels"),
        ({"trainer.c2": "interval(0.1, 1)"}, ["metric=prepare.dev_f1"], "stage prepare logs no metric dev_f1"),
        ({"trainer.c2": "interval(0.1, 1)"}, ["metric=evaluate.dev_correction_fixes"],
         "stage evaluate logs no metric dev_correction_fixes"),
        # a space no stage of the trials reads: they would be one fit (R45-4, R46-1)
        ({"trainer": "choice(lbfgs, l1)", "trainer.strength": "interval(0.1, 1)"}, ["model=hmm"], "the search over "
         "trainer, trainer.strength: trials that differ only there would be the same fit, as no stage they run (prepare, "
         "train, evaluate, with model=hmm) reads them"),
        ({"trainer.c2": "interval(0.1, 1)", "model.order": "choice(1, 2)"}, ["model=hmm"], "the search over trainer.c2: "
         "trials that differ only there"),
        ({"features": "choice(chunking, pos)"}, ["model=hmm"], "the search over features: trials that differ only there"),
        # trials scored on other data: their scores do not compare (H9)
        ({"trainer.c2": "interval(0.1, 1)", "dataset.dev_split.seed": "choice(13, 14)"}, [], "the trials with trainer.c2=0.1 "
         "dataset.dev_split.seed=13 and those with trainer.c2=0.1 dataset.dev_split.seed=14 are scored on different data"),
    ],
)  # fmt: skip
def test_an_optuna_trial_a_single_run_would_refuse_ends_the_sweep_before_any_trial(tmp_path, caplog, params, task, message):
    metric = next((t.removeprefix("metric=") for t in task if t.startswith("metric=")), None)  # the sweeper's, not the jobs'
    task = [t for t in task if not t.startswith("metric=")]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        sweeper = _optuna(tmp_path, params, task, metric=metric)
        line = refused_line(lambda: sweeper.sweep(_arguments(tmp_path, task)), caplog)
    assert message in line
    assert not list(tmp_path.rglob("optuna.db"))  # no study


def test_warm_start_keys_the_config_lacks_are_refused(tmp_path, caplog):
    # a key no config has: every trial would differ from every finished one in it, so none would warm-start (F7)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        params = {"trainer.c2": "interval(0.1, 1)"}
        sweeper = _optuna(tmp_path, params, warm_start_keys=["trainer.c2", "nosuch", "trainer.nosuch"])
        line = refused_line(lambda: sweeper.sweep(_arguments(tmp_path, [])), caplog)
        assert line.endswith("hydra.sweeper.warm_start_keys: nosuch, trainer.nosuch is not a key of the config"), line
        assert not list(tmp_path.rglob("optuna.db"))
        good = _optuna(tmp_path, params, warm_start_keys=["trainer.c2", "trainer.max_iterations", "model.order"])
        good._checked(_arguments(tmp_path, []))


def test_a_study_resumed_on_other_evaluation_data_is_refused(tmp_path, caplog):
    # the sampler learnt from scores that do not compare, and the study's best trial was of other data (G7)
    params = {"trainer.c2": "interval(0.1, 1)"}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        first = _optuna(tmp_path, params, study_name="s")
        space, _, _, url, storage = first._checked(_arguments(tmp_path, []))
        first._open_study(space, url, storage)
        for task, changed in (
            (["dataset.dev_split.seed=14"], "its files, columns or dev split"),
            (["dataset.name=other"], "another dataset"),
        ):
            other = _optuna(tmp_path, params, task, study_name="s")
            line = refused_line(lambda other=other, task=task: other.sweep(_arguments(tmp_path, task)), caplog)
            assert "study 's' in sqlite:///" in line and "measured its trials on dataset conll2000 (" in line, line
            assert f"{changed}), so their scores do not compare: choose another hydra.sweeper.study_name" in line, line
        # another model's trials (R45-4), and a space that searches the model, neither compare with the study's
        for task, params_, model in (
            (["model=hmm"], {"model.order": "choice(1, 2)"}, "hmm"),
            ([], {**params, "model": "choice(crf, hmm)"}, "choice(...)"),
        ):
            other = _optuna(tmp_path, params_, task, study_name="s")
            line = refused_line(lambda other=other, task=task: other.sweep(_arguments(tmp_path, task)), caplog)
            assert f"study 's' in sqlite:///{tmp_path}" in line, line
            assert line.endswith(
                f"has trials of model=crf, this sweep's would be of model={model}, so their scores are not of one search "
                "space: choose another hydra.sweeper.study_name"
            ), line
        # another search space, or other fixed settings on the same data and model: fits that do not compare (R46-3)
        for task, params_, ending in (
            ([], {"model.order": "choice(1, 2)"}, "searched trainer.c2, this sweep model.order: a study's trials are points "
             "of one search space: choose another hydra.sweeper.study_name"),
            (["features=pos"], params, "ran its trials with other fixed settings (the sections a stage reads differ: "
             "featurize.features), so their scores do not compare: choose another hydra.sweeper.study_name"),
            (["data.train_fraction=0.5", "trainer.max_iterations=7"], params, "(the sections a stage reads differ: "
             "prepare.seed, prepare.train_fraction, train.trainer), so"),
        ):  # fmt: skip
            other = _optuna(tmp_path, params_, task, study_name="s")
            line = refused_line(lambda other=other, task=task: other.sweep(_arguments(tmp_path, task)), caplog)
            assert f"study 's' in sqlite:///{tmp_path}" in line and ending in line, line
        # what does not change a fit (threads, the data's folder, the trial count) resumes the study
        task = ["trainer.threads=1", f"data.root={tmp_path / 'data'}/."]
        again = _optuna(tmp_path, params, task, study_name="s")
        again.n_trials = 3
        again._checked(_arguments(tmp_path, task))


def test_a_multi_objective_study_resumed_by_name_is_refused_before_anything_is_written(tmp_path, caplog):
    # another program's study of two objectives: the sweep made its parent run, then Optuna's
    # "A single direction cannot be retrieved from a multi-objective study" failed it (R17)
    import optuna

    params = {"trainer.c2": "interval(0.1, 1)"}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        _, _, _, url, storage = _optuna(tmp_path, params, study_name="fresh")._checked(_arguments(tmp_path, []))
        optuna.create_study(storage=storage, study_name="multi", directions=["maximize", "minimize"])
        sweeper = _optuna(tmp_path, params, study_name="multi")
        line = refused_line(lambda: sweeper.sweep(_arguments(tmp_path, [])), caplog)
    assert "study 'multi' in sqlite:///" in line and "optimises 2 objectives (maximize, minimize), not one metric" in line, line
    assert not (tmp_path / "out" / "mlflow.db").exists()


def test_a_study_storage_that_is_the_mlflow_store_is_refused_before_anything_is_written(tmp_path, caplog, monkeypatch):
    # Optuna's tables and schema version in MLflow's database left the store unusable for good (G11)
    params = {"trainer.c2": "interval(0.1, 1)"}
    store = tmp_path / "out" / "mlflow.db"  # the local tracking store of tiny_overrides' output folder
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for storage in (f"sqlite:///{store}", f"sqlite:///{tmp_path}/out/../out/mlflow.db"):
            sweeper = _optuna(tmp_path, params, storage=storage)
            line = refused_line(lambda sweeper=sweeper: sweeper.sweep(_arguments(tmp_path, [])), caplog)
            assert line.endswith(
                "is the database of MLflow's tracking store, which Optuna's tables would break; name another "
                "database (by default the study lives in optuna.db beside the store)"
            ), line
        assert not store.exists()
        monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{tmp_path / 'registry.db'}")
        sweeper = _optuna(tmp_path, params, storage=f"sqlite:///{tmp_path / 'registry.db'}")
        assert "MLflow's registry store" in refused_line(lambda: sweeper.sweep(_arguments(tmp_path, [])), caplog)
        assert not (tmp_path / "registry.db").exists()
        _optuna(tmp_path, params, storage=f"sqlite:///{tmp_path / 'study.db'}")._checked(_arguments(tmp_path, []))
        # the trials' jobs open the storage named in their environment, which a quote cannot reach
        sweeper = _optuna(tmp_path, params, storage=f"sqlite:///{tmp_path}/it's.db")
        line = refused_line(lambda: sweeper.sweep(_arguments(tmp_path, [])), caplog)
        assert "hydra.sweeper.storage=" in line and "the trials' jobs are given it in their environment" in line, line
        assert not (tmp_path / "it's.db").exists()
    assert search._same_database("postgresql+psycopg://u:p@db:5432/mlflow", "postgresql://u@db:5432/mlflow")
    assert not search._same_database("postgresql+psycopg://u@db:5432/optuna", "postgresql://u@db:5432/mlflow")
    assert not search._same_database("sqlite:////x/optuna.db", "http://127.0.0.1:5000")
    (tmp_path / "mlflow.db").write_bytes(b"")  # a hard link to the store's file is that file (round 36)
    os.link(tmp_path / "mlflow.db", tmp_path / "link.db")
    assert search._same_database(f"sqlite:///{tmp_path / 'link.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert not search._same_database(f"sqlite:///{tmp_path / 'study.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_the_optuna_trials_checked_cover_every_choice_and_range_end():
    params = {"trainer": "choice(lbfgs, l1)", "trainer.strength": "interval(0.1, 1)"}
    params["trainer.max_iterations"] = "range(10, 35, 10)"
    space = search.parse_space(params, [])
    checked = search.checked_trials(space)  # 2 x 2 x 2: every combination (values bad only together)
    assert len(checked) == 8 and {tuple(t.values()) for t in checked} == {
        (trainer, strength, iterations) for trainer in ("lbfgs", "l1") for strength in (0.1, 1.0) for iterations in (10, 30)
    }
    params["trainer.c2"] = "choice(0.1, 1, 10)"  # 24 combinations: each value once, the others at their first
    wide = search.checked_trials(search.parse_space(params, []))
    assert len(wide) == 1 + 1 + 1 + 1 + 2 and wide[0] == {
        "trainer": "lbfgs",
        "trainer.strength": 0.1,
        "trainer.max_iterations": 10,
        "trainer.c2": 0.1,
    }


def test_optuna_values_that_are_bad_only_together_are_refused(tmp_path, caplog):
    params = {"model.transition_smoothing": "choice(interpolation, add-k)", "model.k": "choice(0.1, 0)"}
    task = ["model=hmm"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        sweeper = _optuna(tmp_path, params, task)
        line = refused_line(lambda: sweeper.sweep(_arguments(tmp_path, task)), caplog)
    assert "model.transition_smoothing=add-k" in line and "model.k=0" in line
    assert not list(tmp_path.rglob("optuna.db"))


def test_the_default_optuna_space_and_other_objectives_pass(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        space = {"trainer": "choice(lbfgs, l1, elasticnet)", "trainer.strength": "tag(log, interval(0.01, 10))"}
        default = _optuna(tmp_path, space)
        default._checked(_arguments(tmp_path, []))
        # a cost to minimise, of train+dev refits (no dev score is needed)
        refit = _optuna(
            tmp_path, {"trainer.c2": "interval(0.1, 1)"}, ["data.final_fit=train+dev"], metric="train.train_seconds",
            direction="minimize",
        )  # fmt: skip
        refit._checked(_arguments(tmp_path, ["data.final_fit=train+dev"]))
        # a chunk type's F1 and a correction figure are metrics the evaluate stage declares
        _optuna(tmp_path, {"trainer.c2": "interval(0.1, 1)"}, metric="evaluate.dev_f1_NP")._checked(_arguments(tmp_path, []))
        task = ["+dataset.evaluate.correction_propagation=true"]
        corrections = _optuna(tmp_path, {"trainer.c2": "interval(0.1, 1)"}, task, metric="evaluate.dev_correction_fixes")
        corrections._checked(_arguments(tmp_path, task))


@pytest.mark.parametrize(
    "task",
    [
        ["+dataset.evaluate.correction_propagation=true", "+dataset.evaluate.confidence_field=NP", "model.order=2"]
        + ["model.candidate_threshold=0.001"],
        ["model=hmm"],
        ["dataset.scheme=none"],
    ],
)
def test_every_metric_a_stage_returns_is_one_it_declares(tmp_path, task):
    # the sweep preflight refuses an objective by the stages' declarations: a metric they leave out would be refused wrongly
    from pipeline_helpers import compose_config, seed_store, write_corpus

    from pipeline.__main__ import run_pipeline
    from pipeline.models import load_adapter

    out = tmp_path / "out"
    seed_store(out)
    data = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    cfg = compose_config(tiny_overrides(data, out) + task + ["trainer.max_iterations=5"])
    results = run_pipeline(cfg)
    adapter = load_adapter(cfg.model)
    stages = load_stages()
    names: dict[str, list[str]] = {}
    for key in results:
        stage, _, name = key.partition(".")
        if stage in stages:
            names.setdefault(stage, []).append(name)
    assert {"prepare", "train", "evaluate"} <= set(names)
    for stage, logged in names.items():
        declared = stages[stage].metric_names(cfg, adapter)
        if declared is None:
            continue
        undeclared = [name for name in logged if not any(fnmatch.fnmatchcase(name, pattern) for pattern in declared)]
        assert not undeclared, (stage, undeclared)
    if "model.candidate_threshold=0.001" in task:  # the optional figures were made, so the check above saw them
        assert {"train.excluded_mass_per_token", "evaluate.dev_correction_fixes", "evaluate.test_NP_confidence_ap"} <= set(
            results
        )


LACKING = "bad setting: Could not override 'trainer.c22': the config has no such key (a misspelling?); +trainer.c22=1 adds it"


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (
            ["-m", "trainer.c2=0.1,1", "trainer.c22=1"],
            LACKING,
        ),
        (["trainer.c22=1"], LACKING),
        (["trainer=nosuch"], "bad setting: In 'config': Could not find 'trainer/nosuch' (options of trainer: base, "),
        (["+experiment=nosuch"], "bad setting: In 'config': Could not find 'experiment/nosuch' (options of experiment: "),
        (["+experiment=semi_supervised", "semi.clusters.nosuch=1"], "bad setting: Could not override 'semi.clusters.nosuch':"),
        # a forced alias move with nothing registered did nothing, silently (L20)
        (
            ["registry.force_alias=true"],
            "bad setting registry.force_alias=true: it moves the alias to the model this command "
            "registers; set registry.register=true",
        ),
        (
            ["-m", "trainer.c2=0.1,1", "registry.force_alias=true", "registry.sweep=false"],
            "bad setting registry.force_alias=true",
        ),
        (["registry.force_alias=true", "registry.register=true", "registry.name=x"], None),
        # a path on its own registers its best point as a sweep does, by registry.sweep (R46-2)
        (["+experiment=reg_path", "registry.force_alias=true"], None),
        (
            ["+experiment=reg_path", "registry.force_alias=true", "registry.sweep=false"],
            "bad setting registry.force_alias=true: it moves the alias to the model this command registers; set "
            "registry.sweep=true (the path registers its best point)",
        ),
        # composable: left to the run's and the sweeper's checks
        (["-m", "trainer.c2=0.1,1", "trainer.c1=0"], None),
        (["-m", "trainer.c22=0.1,1"], None),  # swept: the grid preflight names its job
        (["+experiment=semi_supervised", "semi.clusters.prefixes=[4,6]", "semi.clusters.offsets=[0]"], None),  # R6b-6
        (["--cfg", "job", "trainer.c22=1"], None),  # Hydra's own flags: Hydra reports
        # the grid sweeper's params may be given on the command line (Hydra's basic sweeper refused a mapping there)
        (["-m", "hydra.sweeper.params={trainer.c2: '0.1,1'}"], None),
    ],
)
def test_the_command_line_is_composed_before_hydra_runs(argv, refusal):
    from pipeline.__main__ import composition_refusal

    found = composition_refusal(argv)
    if refusal is None:
        assert found is None
    else:
        assert found is not None and found.startswith(refusal) and "\n" not in found, found


def test_an_output_folder_that_cannot_be_made_is_refused_before_hydra_runs(tmp_path, monkeypatch):
    # a dangling link as the output folder ended in Hydra's 26-line FileExistsError, or in FAILED runs for the cache (G12)
    from pipeline.__main__ import composition_refusal

    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    (tmp_path / "out2").mkdir()
    (tmp_path / "out2" / "cache").symlink_to(tmp_path / "nocache")
    (tmp_path / "file").write_text("")
    cases = {
        "out": f"bad setting paths.output_dir={tmp_path}/out: a symbolic link to {tmp_path}/nowhere, which does not exist; "
        "name a folder",
        "out2": f"bad setting paths.cache_dir={tmp_path}/out2/cache: a symbolic link to {tmp_path}/nocache, which does not",
        "out/sub": f"bad setting paths.output_dir={tmp_path}/out/sub: {tmp_path}/out in it is a symbolic link to",
        "file": f"bad setting paths.output_dir={tmp_path}/file: {tmp_path}/file is a file, not a folder",
    }
    for folder, refusal in cases.items():
        for argv in (
            [f"paths.output_dir={tmp_path / folder}"],
            ["-m", f"paths.output_dir={tmp_path / folder}", "trainer.c2=1,2"],
        ):
            found = composition_refusal(argv)
            assert found is not None and found.startswith(refusal), found
    monkeypatch.setenv("CRF_OUTPUT_DIR", str(tmp_path / "out"))  # the default output folder reads it
    assert composition_refusal([]).startswith(cases["out"])
    monkeypatch.setenv("CRF_OUTPUT_DIR", str(tmp_path / "new" / "folder"))  # folders yet to be made are fine
    assert composition_refusal([]) is None and not (tmp_path / "new").exists()


def test_a_tracking_store_named_twice_differently_is_refused(tmp_path, monkeypatch, caplog):
    # tracking.uri=B on the command line lost silently to MLFLOW_TRACKING_URI=A: a models:/ lookup read A's champion (G15)
    from pipeline_helpers import compose_config

    from pipeline.__main__ import composition_refusal
    from pipeline.tracking import registry_uri, tracking_uri

    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", a)
    line = f"MLFLOW_TRACKING_URI={a} and tracking.uri={b} name two stores: unset the variable or drop the setting"
    assert composition_refusal([f"tracking.uri={b}"]) == line
    assert composition_refusal(["-m", f"tracking.uri={b}", "trainer.c2=1,2"]) == line
    assert (
        composition_refusal([f"tracking.uri={a}"]) is None and composition_refusal([]) is None
    )  # one store, or the variable alone
    with pytest.raises(SettingsError, match="name two stores"):
        tracking_uri(compose_config(["tracking=server"]))  # a config's own uri counts too
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        sweeper = _optuna(tmp_path, {"trainer.c2": "interval(0.1, 1)"}, [f"tracking.uri={b}"])
        assert refused_line(lambda: sweeper.sweep(_arguments(tmp_path, [f"tracking.uri={b}"])), caplog) == line
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(compose_config([f"tracking.uri={b}"])) == b
    # the same through MLFLOW_REGISTRY_URI: a models:/ lookup read the variable's registry, not tracking.uri's (H1)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", a)
    line = f"MLFLOW_REGISTRY_URI={a} and tracking.uri={b} name two stores for the Model Registry: "
    line += "unset the variable or drop the setting"
    with pytest.raises(SettingsError) as info:
        registry_uri(compose_config([f"tracking.uri={b}"]))
    assert str(info.value) == line
    assert composition_refusal([f"tracking.uri={b}", "registry.register=true"]) == line
    assert composition_refusal([f"tracking.uri={b}"]) is None  # a run that registers nothing reads no registry
    assert composition_refusal(["-m", f"tracking.uri={b}", "trainer.c2=1,2"]) == line  # a sweep registers its best job
    assert composition_refusal(["-m", f"tracking.uri={b}", "trainer.c2=1,2", "registry.sweep=false"]) is None
    assert registry_uri(compose_config([])) == a  # the variable alone: a registry apart, as MLflow has it
    assert registry_uri(compose_config([f"tracking.uri={a}"])) == a


def test_a_tracking_store_that_sqlite_cannot_open_is_a_settings_line(tmp_path, monkeypatch):
    """A store file that is a dangling link (its folder missing) or a folder: one line naming it,
    before Hydra runs, not 100 s of MLflow's retries and a message naming another store (H7)."""
    from pipeline.__main__ import composition_refusal, unwritable

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "dang.db").symlink_to(tmp_path / "nowhere" / "x.db")
    (tmp_path / "folder.db").mkdir()
    for name, problem in (("dang.db", "a symbolic link to .*nowhere/x.db, which does not exist; name a file"),
                          ("folder.db", "a folder; name a file")):  # fmt: skip
        uri = f"sqlite:///{tmp_path / name}"
        found = composition_refusal([f"tracking.uri={uri}", f"paths.output_dir={tmp_path / 'out'}"])
        assert found is not None and re.match(rf"bad setting: the tracking store {re.escape(uri)}: .*{problem}$", found), found
    assert composition_refusal([f"tracking.uri=sqlite:///{tmp_path / 'new' / 'x.db'}"]) is None  # its folder is made
    store_error = RuntimeError("(sqlite3.OperationalError) unable to open database file")
    expected = "cannot write the tracking store sqlite:///mine.db (unable to open database file)"
    assert unwritable(store_error, "sqlite:///mine.db") == expected


def _multirun(tmp_path: Path, *overrides: str):
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return forkserver.run(
        [sys.executable, "-m", "pipeline", "-m", *tiny_overrides(tmp_path / "data", tmp_path / "out"), *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["trainer=lbfgs,nosuch"], "Could not find 'trainer/nosuch' (options of trainer:"),
        (["hydra/sweeper=optuna", "~hydra.sweeper.params", "trainer.c2=choice(0.1,nan)"], "choice value nan is not a finite"),
        # a fixed key the config lacks: Hydra would refuse it before the sweeper, in six lines (R6b-5)
        (["trainer.c2=0.1,1", "trainer.c22=1"], "bad setting: Could not override 'trainer.c22': the config has no such key"),
    ],
)
def test_the_command_refuses_a_bad_sweep_in_one_line_with_no_parent_run(tmp_path, overrides, line):
    write_corpus(tmp_path / "data", n_train=10, n_test=5)  # the data is there: the sweep's settings are what is refused
    done = _multirun(tmp_path, *overrides)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and [text for text in output.splitlines() if text.strip()] == [
        next(t for t in output.splitlines() if line in t)
    ]
    store = tmp_path / "out" / "mlflow.db"
    if store.exists():
        client = MlflowClient(f"sqlite:///{store}")
        experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
        assert client.search_runs(experiments, run_view_type=ViewType.ALL) == []
    assert not list(tmp_path.rglob("optuna.db"))


def test_a_runs_name_leaves_out_the_settings_its_stages_do_not_read(tmp_path):
    """An HMM job of a ``model=crf,hmm`` grid was named ``...-hmm-counting-model=hmm-strength=0.1``
    (round 48): settings the job's stages do not read are left out of its name, those they read stay."""
    from pipeline.engine.logs import named_overrides
    from pipeline.engine.runner import setting_reader, stage_reads, validated_plan

    overrides = ["model=hmm", "trainer.strength=0.1", "model.k=0.5", "model.order=1", "data.train_fraction=0.5"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        base = tiny_overrides(tmp_path / "data", tmp_path / "out")
        hmm = compose(config_name="config", overrides=[*base, *overrides])
        crf = compose(config_name="config", overrides=[*base, "trainer.strength=0.1", "trainer.threads=2", "model.order=2"])
    keys = {o.partition("=")[0] for o in overrides}
    reads = setting_reader(stage_reads(hmm, *validated_plan(hmm)))
    assert named_overrides(overrides, keys, reads) == ["model=hmm", "k=0.5", "order=1", "train_fraction=0.5"]
    no_trainer = OmegaConf.merge(hmm, {"stages": ["train"]})
    assert not setting_reader(stage_reads(no_trainer, *validated_plan(no_trainer)))("trainer")
    reads = setting_reader(stage_reads(crf, *validated_plan(crf)))
    assert all(map(reads, ["trainer.strength", "trainer.threads", "model.order", "trainer", "features.window"]))

"""Optuna studies after kills and bad settings (``hydra/sweeper=optuna``):

- a trial left RUNNING by a sweep that was killed (SIGKILL) is marked FAIL by the next sweep of
  the study, but only when its owner (the sweeping process, recorded on the trial) ran on this
  host and is gone: a trial of a live sweep, or of another host's, is left as it is;
- a search space that names a config group option Hydra does not know (or a config key that does
  not exist) is refused before the first trial, in one line, exit code 2;
- a refused sweeper setting ends the multirun before the sweep's MLflow parent run is created.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import dying_job
import forkserver
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import optuna  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from hydra.core.utils import JobReturn, JobStatus  # noqa: E402
from mlflow.entities import ViewType  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from optuna.distributions import CategoricalDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from pipeline_helpers import CONF_DIR, seed_store, tiny_overrides, write_corpus  # noqa: E402

from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import SWEEPER_ATTR, OptunaSweeper  # noqa: E402
from pipeline.sweeps import search  # noqa: E402
from pipeline.tracking.lifecycle import OWNER_TAG, PROCESS_START_TAG, owner_tags, process_start  # noqa: E402

PROJECT = Path(__file__).resolve().parents[2]
SPACE = {"x": "choice(a, b)"}


class _Launcher:
    """Runs no job: each returns 1.0 at once, and the overrides it was given are kept."""

    def __init__(self) -> None:
        self.jobs: list[list[str]] = []

    def launch(self, batch, initial_job_idx):
        self.jobs.extend(list(job) for job in batch)
        return [JobReturn(overrides=list(job), status=JobStatus.COMPLETED, _return_value=1.0) for job in batch]


def _sweeper(tmp_path: Path, n_trials: int = 1, **settings) -> OptunaSweeper:
    """The sweeper on study ``kills`` in ``tmp_path/optuna.db``, as after Hydra's setup, with a launcher that runs nothing."""
    sweeper = OptunaSweeper(**{"params": SPACE, "n_trials": n_trials, "n_jobs": 1, "study_name": "kills",
                               "pruner": {"kind": "none"}, "dispatch": "batch", **settings})  # fmt: skip
    sweeper.config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"name": "kills"}, "overrides": {"hydra": []}},
            "paths": {"output_dir": str(tmp_path)},
            "train": {"dev_every": 10},
        }
    )
    sweeper.launcher = _Launcher()
    sweeper.validate_batch_is_legal = lambda batch: None  # no Hydra context here to compose the jobs
    return sweeper


def _study(tmp_path: Path) -> optuna.Study:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    return optuna.create_study(storage=search.open_storage(url), study_name="kills", direction="maximize", load_if_exists=True)


def _dead_process() -> tuple[int, str]:
    """(PID, start time) of a process that ran on this host and is gone (reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = process_start(child.pid)
    child.kill()
    child.wait()
    return child.pid, started


def test_a_trial_left_running_by_a_killed_sweep_is_failed_by_the_next_sweep(tmp_path, caplog):
    """A real sweeping process asks a trial (recording itself as its owner) and is SIGKILLed."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(PROJECT / "tests" / "faults")!r})
        from test_fault_optuna_study import _sweeper
        from pathlib import Path
        sweeper = _sweeper(Path({str(tmp_path)!r}))
        space, _, _, url, storage = sweeper._checked([])
        study = sweeper._open_study(space, url, storage)
        sweeper._ask(study, space)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), str(PROJECT / "tests"), os.environ.get("PYTHONPATH", "")])}
    killed = forkserver.run([sys.executable, "-c", script], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (orphan,) = _study(tmp_path).get_trials()
    assert orphan.state == TrialState.RUNNING
    pid, host = orphan.user_attrs[OWNER_TAG].split("@")
    assert host == socket.gethostname() and int(pid) != os.getpid() and "." in orphan.user_attrs[PROCESS_START_TAG]

    caplog.set_level(logging.INFO)
    _sweeper(tmp_path).sweep([])  # the next sweep of the study
    trials = _study(tmp_path).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].user_attrs["error"] == f"process {pid}@{host} died"
    assert f"trial 0 was left RUNNING: process {pid}@{host} died; marked FAIL" in caplog.text
    assert trials[1].user_attrs[OWNER_TAG] == owner_tags()[OWNER_TAG]  # the new trial records its owner too


def test_only_trials_whose_owner_is_provably_gone_are_failed(tmp_path, caplog):
    """A shared study: RUNNING trials of this (live) process, of another host's sweep and with no
    owner stay RUNNING; those of a dead process of this host, or of a PID now another process's
    (same PID, another start time), become FAIL."""
    study = _study(tmp_path)
    host = socket.gethostname()
    dead_pid, dead_start = _dead_process()
    owners = {
        "live": owner_tags(),
        "dead": {OWNER_TAG: f"{dead_pid}@{host}", PROCESS_START_TAG: dead_start},
        "reused pid": {OWNER_TAG: f"{os.getpid()}@{host}", PROCESS_START_TAG: "1000000000.00"},
        "other host": {OWNER_TAG: f"{dead_pid}@{host}-elsewhere", PROCESS_START_TAG: dead_start},
        "no owner": {},
    }
    for attributes in owners.values():
        trial = study.ask({"x": CategoricalDistribution(["a", "b"])})
        for key, value in attributes.items():
            trial.set_user_attr(key, value)
    caplog.set_level(logging.INFO)
    _sweeper(tmp_path).sweep([])
    states = [t.state for t in _study(tmp_path).get_trials()]
    assert dict(zip(owners, states)) == {
        "live": TrialState.RUNNING,
        "dead": TrialState.FAIL,
        "reused pid": TrialState.FAIL,
        "other host": TrialState.RUNNING,
        "no owner": TrialState.RUNNING,
    }
    assert states[5:] == [TrialState.COMPLETE]  # the sweep ran its own trial
    assert f"0 ({os.getpid()}@{host}), 3 ({dead_pid}@{host}-elsewhere), 4 (no owner recorded)" in caplog.text


def test_a_trial_asked_by_a_sweep_killed_before_it_recorded_the_owner_is_failed(tmp_path, caplog):
    """A SIGKILL between asking a trial and recording its owner left it RUNNING with no owner,
    forever (H13): a sweep records itself on the study first, so the next sweep fails a trial
    without an owner when every sweep that had the study open when it began is gone; a live one
    (this process) may still record it, so then it is left."""
    import time

    host = socket.gethostname()
    dead_pid, dead_start = _dead_process()
    dead = {OWNER_TAG: f"{dead_pid}@{host}", PROCESS_START_TAG: dead_start}
    for name, sweepers, expected in (
        ("dead", [dead], TrialState.FAIL),
        ("dead and live", [dead, owner_tags()], TrialState.RUNNING),
        ("other host", [{**dead, OWNER_TAG: f"{dead_pid}@{host}-elsewhere"}], TrialState.RUNNING),
    ):
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        study = _study(folder)
        for record in sweepers:
            study.set_user_attr(SWEEPER_ATTR + record[OWNER_TAG], {**record, "since": time.time() - 1})
        study.ask({"x": CategoricalDistribution(["a", "b"])})  # killed before the owner was recorded
        caplog.clear()
        caplog.set_level(logging.INFO)
        _sweeper(folder).sweep([])
        trials = _study(folder).get_trials()
        assert [t.state for t in trials] == [expected, TrialState.COMPLETE], name
        if expected == TrialState.FAIL:
            reason = f"no owner recorded, and the sweeps that had the study open then ({dead_pid}@{host}) died"
            assert trials[0].user_attrs["error"] == reason
        else:
            assert "0 (no owner recorded)" in caplog.text, name
    recorded = _study(tmp_path / "dead").user_attrs[SWEEPER_ATTR + owner_tags()[OWNER_TAG]]  # the sweep that just ran
    assert recorded[OWNER_TAG] == owner_tags()[OWNER_TAG] and recorded["since"] <= recorded["closed"] <= time.time()
    # a sweep that ended before a trial began is not one of those that may have asked it
    study = _study(tmp_path / "dead")
    study.set_user_attr(SWEEPER_ATTR + "ended", {**owner_tags(), "since": time.time() - 10, "closed": time.time() - 5})
    study.ask({"x": CategoricalDistribution(["a", "b"])})
    caplog.clear()
    _sweeper(tmp_path / "dead").sweep([])
    last = _study(tmp_path / "dead").get_trials()[-2]
    assert last.state == TrialState.FAIL and last.user_attrs["error"].endswith(f"({dead_pid}@{host}) died")


class _WorkerLauncher(_Launcher):
    """Runs each job in a joblib worker process (the loky backend the joblib launcher uses); trial 0's job
    kills its worker, as the out-of-memory killer would (tests/dying_job.py: a module light to import)."""

    def launch(self, batch, initial_job_idx):
        from joblib import Parallel, delayed

        self.jobs.extend(list(job) for job in batch)
        trial_0 = f"++hydra.job.env_set.{search.TRIAL_VARIABLE}='0'"
        values = Parallel(n_jobs=2, backend="loky")(delayed(dying_job.job)(list(job), trial_0) for job in batch)
        return [JobReturn(overrides=list(job), status=JobStatus.COMPLETED, _return_value=v) for job, v in zip(batch, values)]


@pytest.mark.parametrize("dispatch", ["batch", "async"])
def test_a_trial_whose_worker_process_is_killed_fails_and_the_sweep_goes_on(tmp_path, caplog, dispatch):
    caplog.set_level(logging.INFO)
    sweeper = _sweeper(tmp_path, n_trials=3, dispatch=dispatch)
    sweeper.launcher = _WorkerLauncher()
    sweeper.sweep([])  # returns: no TerminatedWorkerError escapes
    trials = _study(tmp_path).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert len(sweeper.launcher.jobs) == 3  # the trials after the killed one ran, in a new worker
    assert trials[0].user_attrs["error"].startswith("WorkerDied: its worker process died before the job reported (exit codes")
    assert "SIGKILL" in trials[0].user_attrs["error"]
    assert "trial(s) 0: its worker process died" in caplog.text and "Traceback" not in caplog.text


class _DyingLauncher(_Launcher):
    """Every job's worker dies (as when each trial runs out of memory)."""

    def launch(self, batch, initial_job_idx):
        from concurrent.futures.process import BrokenProcessPool

        self.jobs.extend(list(job) for job in batch)
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")


def test_a_sweep_whose_workers_keep_dying_stops_with_one_line(tmp_path, caplog):
    sweeper = _sweeper(tmp_path, n_trials=6)
    sweeper.launcher = _DyingLauncher()
    with pytest.raises(SystemExit) as ended:
        sweeper.sweep([])
    assert ended.value.code == 1 and len(sweeper.launcher.jobs) == 3
    assert [t.state for t in _study(tmp_path).get_trials()] == [TrialState.FAIL] * 3
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error.startswith("the worker processes of the last 3 trials died (trial 2: its worker process died")
    assert "\n" not in error


class _SignalledLauncher(_Launcher):
    """A SIGTERM reaches the sweep while its trial runs: the worker dies of it (K10)."""

    def launch(self, batch, initial_job_idx):
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        from pipeline.sweeps.sigterm import SWEEP_STOPPING

        self.jobs.extend(list(job) for job in batch)
        SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
        raise TerminatedWorkerError(
            "A worker process managed by the executor was unexpectedly terminated. This could be caused by a "
            "segmentation fault ... The exit codes of the workers are {SIGTERM(-15)}"
        )


def test_a_sweep_stopped_by_sigterm_while_a_trial_runs_ends_in_one_line(tmp_path, caplog):
    """It printed joblib's 40-line TerminatedWorkerError with its advice about segmentation faults."""
    from pipeline.sweeps.sigterm import SWEEP_STOPPING

    sweeper = _sweeper(tmp_path, n_trials=3)
    sweeper.launcher = _SignalledLauncher()
    try:
        with pytest.raises(SystemExit) as ended:
            sweeper.sweep([])
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == 128 + signal.SIGTERM and len(sweeper.launcher.jobs) == 1  # no further trial
    assert [t.state for t in _study(tmp_path).get_trials()] == [TrialState.FAIL]
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error == (
        "stopped by SIGTERM: the worker process of trial(s) 0 ended with it (exit codes {SIGTERM(-15)}); "
        "the trials are marked FAIL"
    )


def _composed(overrides: list[str], tmp_path: Path):
    """The multirun's config (the optuna sweeper, the tiny corpus) as the sweep callback gets it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(
            config_name="config",
            overrides=["hydra/sweeper=optuna", *tiny_overrides(tmp_path / "data", tmp_path / "out"), *overrides],
            return_hydra_config=True,
        )


def _refused(call, caplog) -> str:
    """The one ERROR line ``call()`` logs as it exits with code 2."""
    caplog.clear()
    with pytest.raises(SystemExit) as ended:
        call()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert ended.value.code == 2 and len(errors) == 1 and "\n" not in errors[0], errors
    return errors[0]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"trainer": "choice(nosuch, lbfgs)"}, "trainer=nosuch: config group trainer has no option 'nosuch' (its options: base,"),
        ({"trainer": "nosuch", "trainer.strength": "interval(0.1, 1)"}, "trainer=nosuch: config group trainer has no option"),
        ({"model": "choice(crf, hmm, nosuch)"}, "model=nosuch: config group model has no option"),
        ({"trainer": "interval(0, 1)"}, "trainer: a config group is searched with choice(...)"),
        ({"trainer.nosuch": "choice(1, 2)"}, "trainer.nosuch: no such config key (to add one, write +trainer.nosuch=...)"),
        ({"trainer": "choice(lbfgs, l1)", "trainer.nosuch": "choice(1, 2)"}, "trainer.nosuch: no such config key with trainer="),
    ],
)
def test_a_search_space_naming_a_missing_config_option_is_refused_before_the_first_trial(tmp_path, caplog, params, message):
    config = _composed([], tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):  # Hydra's config loader lists the options
        sweeper = _sweeper(tmp_path, n_trials=2, params=params, study_name=None)
        sweeper.config, sweeper.config_loader = config, GlobalHydra.instance().config_loader()
        assert _refused(lambda: sweeper.sweep([]), caplog).startswith(message)
    assert sweeper.launcher.jobs == [] and not list(tmp_path.rglob("optuna.db"))  # no trial, no study


def test_a_search_space_of_known_options_and_keys_passes(tmp_path):
    """The check refuses nothing that Hydra would compose: the default space, a choice of every
    trainer, a key that only some of the searched trainers set beside them, keys added with +."""
    config = _composed([], tmp_path)
    spaces = [
        {"trainer": "choice(lbfgs, l1, elasticnet)", "trainer.strength": "tag(log, interval(0.01, 10))"},
        {"trainer": "choice(base, elasticnet, l1, lbfgs, sgd)", "trainer.max_iterations": "range(10, 30, 10)", "seed": "1"},
        {"model": "choice(crf, hmm)", "+extra.key": "choice(1, 2)", "data.train_fraction": "choice(0.5, 1.0)"},
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        for params in spaces:
            search.check_config_keys(search.parse_space(params, []), config, loader)
        l2_ratio = search.parse_space({"trainer": "choice(elasticnet)", "trainer.l2_ratio": "interval(0.1, 0.9)"}, [])
        search.check_config_keys(l2_ratio, config, loader)  # composed with trainer=elasticnet, which has it


def test_a_storage_that_is_another_programs_database_is_refused_and_left_unchanged(tmp_path, caplog):
    """A study storage naming another MLflow store (not the run's own) was refused only after
    Optuna had added its 12 tables to it, and in words about Optuna versions (round 42)."""
    from pipeline.sweeps.callback import SweepTracking

    write_corpus(tmp_path / "data", n_train=10, n_test=5)
    seed_store(tmp_path / "out")
    other = seed_store(tmp_path / "other")  # another MLflow store
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    for database, message in ((other, "is another program's database (tables "), (text, "is not an SQLite database")):
        before = database.read_bytes()
        config = _composed([f"hydra.sweeper.storage=sqlite:///{database}"], tmp_path)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            line = _refused(lambda config=config: SweepTracking().on_multirun_start(config), caplog)
        assert line.startswith("hydra.sweeper.storage: ") and message in line and "\n" not in line, line
        assert database.read_bytes() == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0: a whole number, at least 1"),
        (["hydra.sweeper.storage=foo://bar"], "hydra.sweeper.storage: cannot open foo://bar (NoSuchModuleError"),
        (["hydra.sweeper.storage=sqlite:///{tmp}/file/optuna.db"], "hydra.sweeper.storage: cannot open sqlite:///"),
        (["hydra.sweeper.storage=sqlite:///{tmp}/nosuch/optuna.db"], "hydra.sweeper.storage='sqlite:///"),
        (["+hydra.sweeper.params.model='choice(crf, nosuch)'"], "model=nosuch: config group model has no option 'nosuch'"),
        (["hydra.sweeper.dispatch=sometimes"], "hydra.sweeper.dispatch='sometimes': auto, async or batch"),
        (["+hydra.sweeper.nosuch=1"], "hydra.sweeper: the sweeper hydra_plugins.crf_optuna_sweeper.optuna_sweeper.OptunaSweeper"),
        (["hydra.sweeper._target_=nosuch.Sweeper"], "hydra.sweeper._target_=nosuch.Sweeper: no such sweeper class"),
    ],
)
def test_a_refused_sweeper_setting_leaves_no_parent_run(tmp_path, caplog, overrides, message):
    """Hydra calls the sweep callback's ``on_multirun_start`` before it makes the sweeper: the
    callback has the sweeper check its settings first, and a refused one creates no parent run."""
    from pipeline.sweeps.callback import SweepTracking

    (tmp_path / "file").write_text("a file where a folder should be")
    write_corpus(tmp_path / "data", n_train=10, n_test=5)  # the data is there: the sweeper's settings are what is refused
    store = seed_store(tmp_path / "out")
    config = _composed([o.replace("{tmp}", str(tmp_path)) for o in overrides], tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        assert _refused(lambda: SweepTracking().on_multirun_start(config), caplog).startswith(message)
    client = MlflowClient(f"sqlite:///{store}")
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    assert client.search_runs(experiments, run_view_type=ViewType.ALL) == []
    assert "CRF_SWEEP_PARENT_RUN_ID" not in os.environ

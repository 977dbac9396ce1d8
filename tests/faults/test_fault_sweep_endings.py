"""How a sweep ends when it does not run to its end: the default grid sweeper ends in one line when
a job's worker process dies (a SIGTERM that came as the workers started, or a kill by the
out-of-memory killer), where Hydra printed joblib's 40-line TerminatedWorkerError traceback; and a
SIGTERM that comes after the last job ends the command with a failure, not a success."""

from __future__ import annotations

import logging
import signal

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext
from joblib.externals.loky.process_executor import TerminatedWorkerError
from omegaconf import OmegaConf
from pipeline_helpers import CONF_DIR

from hydra_plugins.crf_grid_sweeper.grid_sweeper import GridSweeper, StopAwareLauncher
from pipeline.sweeps.sigterm import SWEEP_STOPPING

WORKER_DIED = (
    "A worker process managed by the executor was unexpectedly terminated. This could be caused by a segmentation fault "
    "while calling the function or by an excessive memory usage causing the Operating System to kill the worker.\n\n"
    "The exit codes of the workers are {SIGTERM(-15), SIGKILL(-9)}"
)


class _Launcher:
    """Keeps the jobs it is given; its workers die (``error``) or each job returns 1.0."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.jobs = error, []

    def launch(self, batch, initial_job_idx):
        self.jobs.extend(list(job) for job in batch)
        if self.error is not None:
            raise self.error
        return [JobReturn(overrides=list(job), status=JobStatus.COMPLETED, _return_value=1.0) for job in batch]


class _Loader:
    """What the sweeper's override parser asks of Hydra's config loader: nothing, for plain values."""


def _sweeper(tmp_path, launcher: _Launcher) -> GridSweeper:
    """The sweeper as after Hydra's setup, with ``launcher``."""
    sweeper = GridSweeper(max_batch_size=None, params=None)
    grid = sweeper.grid  # Hydra's basic sweeper, which does the work
    grid.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    grid.launcher = launcher
    grid.hydra_context = HydraContext(config_loader=_Loader(), callbacks=None)
    grid.validate_batch_is_legal = lambda batch: None  # composing needs Hydra's loader; the jobs are not what is tested
    return sweeper


def _error_line(caplog) -> str:
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    return line


@pytest.mark.parametrize(
    ("stopping", "expected"),
    [
        (True, "stopped by SIGTERM: the jobs' worker processes ended with it (exit codes {SIGTERM(-15), SIGKILL(-9)})"),
        (False, "a job's worker process died (exit codes {SIGTERM(-15), SIGKILL(-9)}; a kill, e.g. by the out-of-memory "
         "killer, or a crash): the sweep stops; if it is memory, lower hydra.launcher.n_jobs or the training data"),
    ],
)  # fmt: skip
def test_a_dead_worker_ends_the_grid_in_one_line(tmp_path, caplog, stopping, expected):
    sweeper = _sweeper(tmp_path, _Launcher(TerminatedWorkerError(WORKER_DIED)))
    if stopping:
        SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
            sweeper.sweep(["trainer.c2=0.1,1"])
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == (128 + signal.SIGTERM if stopping else 1) and _error_line(caplog) == expected


def test_the_grid_sweeper_runs_every_combination_and_other_errors_go_on(tmp_path):
    import importlib

    import hydra._internal.core_plugins.basic_sweeper as basic

    importlib.reload(basic)  # as Hydra's plugin discovery may do: a second BasicSweeper class
    launcher = _Launcher()
    returns = _sweeper(tmp_path, launcher).sweep(["trainer.c2=0.1,1", "data.train_fraction=0.5"])
    assert launcher.jobs == [["trainer.c2=0.1", "data.train_fraction=0.5"], ["trainer.c2=1", "data.train_fraction=0.5"]]
    assert [r.return_value for batch in returns for r in batch] == [1.0, 1.0]
    with pytest.raises(ValueError, match="not a worker's death"):
        _sweeper(tmp_path, _Launcher(ValueError("not a worker's death"))).sweep(["trainer.c2=0.1"])


def test_the_pipeline_sweeps_with_the_grid_sweeper_by_default():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        config = compose(config_name="config", return_hydra_config=True)
    assert config.hydra.sweeper._target_ == "hydra_plugins.crf_grid_sweeper.grid_sweeper.GridSweeper"


def test_a_jobs_one_line_error_ends_the_grid_as_it_ends_a_single_run(tmp_path, caplog):
    """A grid job whose data file failed its checksum ended the sweep in Hydra's 25-line traceback
    (exit 1), where a single run says it in one line (exit 2; L10)."""
    from pipeline.stages.data import ChecksumError

    error = ChecksumError("data/train.txt: SHA-256 of its text is 8f82..., expected 91a4... (corrupt or a different version)")

    class _Failing(_Launcher):
        def launch(self, batch, initial_job_idx):
            self.jobs.extend(list(job) for job in batch)
            return [JobReturn(overrides=list(job), status=JobStatus.FAILED, _return_value=error) for job in batch]

    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
        _sweeper(tmp_path, _Failing()).sweep(["trainer.c2=0.1,1"])
    assert ended.value.code == 2 and _error_line(caplog) == str(error)


def test_a_sigterm_as_the_sweep_ends_is_no_success(tmp_path, monkeypatch, caplog):
    """A SIGTERM that came after the last job, before the sweep's end (its summary, its registration),
    ended the command with exit status 0 and "best on dev: ..." as its last line, though nothing was
    registered and the parent run was FAILED (L9): it ends in one line, with a stopped sweep's exit status (143)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipeline.sweeps.callback import SweepTracking
    from pipeline.tracking.lifecycle import END_REASON_TAG

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # the experiment's artifacts go to ./mlruns: not the checkout's
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.set_experiment("sweeps")
    client = MlflowClient()
    parent = client.create_run(experiment.experiment_id, tags={"stage": "sweep"})
    callback = SweepTracking()
    callback.parent_run_id, callback.sweep_id, callback.experiment = parent.info.run_id, "s1", "sweeps"
    callback.summarize_at_end = False
    SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
            callback.on_multirun_end(config=None)
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == 128 + signal.SIGTERM
    assert _error_line(caplog) == "[sweep s1] stopped by SIGTERM as it ended: its parent run is FAILED and nothing was registered"
    run = client.get_run(parent.info.run_id)
    assert run.info.status == "FAILED" and run.data.tags[END_REASON_TAG] == "stopped by SIGTERM"


def test_an_optuna_sweep_in_which_no_trial_completed_is_no_success(tmp_path, caplog):
    """Two trials whose worker processes were killed (as by the out-of-memory killer: fewer than the
    three in a row that stop a sweep): "no trial completed" was a warning and the exit status 0 (L12)."""
    from test_fault_optuna_study import _DyingLauncher, _study, _sweeper

    sweeper = _sweeper(tmp_path, n_trials=2)
    sweeper.launcher = _DyingLauncher()
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
        sweeper.sweep([])
    assert ended.value.code == 1 and len(_study(tmp_path).get_trials()) == 2
    assert _error_line(caplog) == "no trial completed (0 complete, 0 pruned, 2 fail): the sweep has no result"


def test_every_error_a_job_can_raise_crosses_to_the_sweeps_process():
    """A job's DataFormatError could not be unpickled in the sweep's process: joblib broke its worker
    pool, the sibling job was killed with it (FAILED), and the sweep blamed "a worker process died".
    The project's exceptions are pickled with their own arguments and come back the same."""
    import pickle
    import signal

    from crf.bundle import TokenError
    from crf.features import NumericValueError
    from crf.io import DataFormatError
    from crf.model import TrainingError
    from pipeline.engine.stage import TrainingStopped
    from pipeline.engine.validate import SettingsError
    from pipeline.stages.clusters import PoolFileError
    from pipeline.stages.data import ChecksumError, DataPathIsADirectory, MissingDataError
    from pipeline.sweeps.trial_stopping import TrialPruned
    from pipeline.tracking.lifecycle import Terminated

    errors = [
        DataFormatError("data/x.conll", 7, "2 columns, expected 3"),
        TokenError(4, 1, 2, "w", None, "a token must be a non-empty string"),
        TrainingStopped("pruned", 12, "dev_f1", 81.5),
        TrialPruned(3, 12, "dev_f1", 81.5),
        Terminated(signal.SIGTERM),
        *(cls("one line") for cls in (SettingsError, MissingDataError, ChecksumError, DataPathIsADirectory, PoolFileError,
                                      TrainingError, NumericValueError)),
    ]  # fmt: skip
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error), error


def test_no_job_is_launched_once_the_sweep_is_being_stopped(tmp_path, caplog):
    """A SIGTERM that came after a grid's or an Optuna trial's jobs were decided on but before they
    started: the jobs were launched after the signal, unsignalled (M8). Both sweepers check just
    before a launch."""
    from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import NotLaunched, OptunaSweeper

    launcher = _Launcher()
    sweeper = _sweeper(tmp_path, launcher)
    sweeper.grid.launcher = StopAwareLauncher(launcher)  # as GridSweeper.setup wraps Hydra's launcher
    optuna = OptunaSweeper()
    optuna.launcher, optuna.validate_batch_is_legal = launcher, lambda batch: None
    SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
            sweeper.sweep(["trainer.c2=0.1,1"])
        (result,) = optuna._launch(None, [None], [["trainer.c2=0.5"]], 3)
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == 128 + signal.SIGTERM
    assert _error_line(caplog) == "stopped by SIGTERM before jobs #0 to #1 started: they were not launched"
    assert result.status == JobStatus.FAILED and isinstance(result._return_value, NotLaunched)
    assert launcher.jobs == []
    going_on = _sweeper(tmp_path, launcher)
    going_on.grid.launcher = StopAwareLauncher(launcher)
    going_on.sweep(["trainer.c2=0.1,1"])  # not stopping: launched
    assert launcher.jobs == [["trainer.c2=0.1"], ["trainer.c2=1"]]


def test_a_launcher_error_while_the_sweep_is_stopped_is_one_line(tmp_path, caplog):
    """joblib's own errors as its workers go (its executor shut down) ended a signalled sweep with two
    chained tracebacks and exit status 1."""
    error = RuntimeError("The executor underlying Parallel has been shutdown. This is likely due to\nmore")
    sweeper = _sweeper(tmp_path, _Launcher(error))
    SWEEP_STOPPING.set()  # as the sweep's SIGTERM handler does
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as ended:
            sweeper.sweep(["trainer.c2=0.1,1"])
    finally:
        SWEEP_STOPPING.clear()
    assert ended.value.code == 128 + signal.SIGTERM
    assert _error_line(caplog) == (
        "stopped by SIGTERM: the launcher ended with it (RuntimeError: The executor underlying Parallel has been shutdown. "
        "This is likely due to)"
    )
    with pytest.raises(RuntimeError, match="The executor underlying"):  # not being stopped: the error as it is
        _sweeper(tmp_path, _Launcher(error)).sweep(["trainer.c2=0.1,1"])

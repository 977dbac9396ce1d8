"""The Hydra callback of every sweep (``hydra.callbacks.sweep_tracking``): one MLflow parent run per
multirun, and its summary at the end.

``SweepTracking``, in the launching process, before any job starts, lets the sweeper check its
settings (a refused one ends the multirun with nothing in the store), creates the tracking database
and the sweep's parent run, and exports the parent run id and a sweep id to the jobs (joblib worker
processes, Ray or SLURM jobs) through environment variables. When the jobs are done it ends the
runs of jobs whose process is gone and writes the summary that ``sweep.summary`` chooses
(``pipeline.sweeps.summary`` for a grid, an Optuna sweep or a path). Hydra skips
``on_multirun_end`` when a job fails, so the same summary also runs from an exit handler: one
failing job does not lose the others' results. SIGTERM to the launching process is handled by
``pipeline.sweeps.sigterm``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
import uuid

import pandas as pd
from hydra.experimental.callback import Callback
from mlflow.entities import Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from pipeline import tracking
from pipeline.report import shown_override
from pipeline.sweeps.cluster import job_environment, pass_to_jobs
from pipeline.sweeps.grid_preflight import check_grid_jobs
from pipeline.sweeps.sigterm import STOPPED_EXIT, SWEEP_STOPPING, SweepSigterm
from pipeline.sweeps.summary import summarize
from pipeline.tracking import SWEEP_ID_VARIABLE, SWEEP_PARENT_VARIABLE, lifecycle
from pipeline.tracking.lifecycle import END_REASON_TAG

log = logging.getLogger(__name__)


def swept(config: DictConfig) -> list[str]:
    """The keys (and config groups) a multirun varies: its sweep overrides and the sweeper's params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides(list(OmegaConf.select(config, "hydra.overrides.task") or []))
    keys = [o.key_or_group.lstrip("+~") for o in overrides if o.is_sweep_override()]
    return keys + [k for k in (OmegaConf.select(config, "hydra.sweeper.params") or {}) if k not in keys]


def sweep_run_name(config: DictConfig) -> str:
    """``conll2000-crf-sweep-c2``: the dataset, the model unless swept, and the swept keys' last parts."""
    keys = swept(config)
    model = [] if "model" in keys else [str(config.model.name)]
    return "-".join([str(config.dataset.name), *model, "sweep", ",".join(k.rsplit(".", 1)[-1] for k in keys)])


def fixed_params(config: DictConfig) -> dict[str, str]:
    """The sweep's settings that every job shares: the composed config (without ``hydra``), flat,
    less the keys (and config groups) that the multirun varies."""
    keys = swept(config)
    body = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    flat = tracking.flatten(OmegaConf.to_container(body, resolve=True))
    return {k: v for k, v in flat.items() if not any(k == key or k.startswith(key + ".") for key in keys)}


def check_sweeper_settings(config: DictConfig) -> None:
    """Let the configured sweeper check its settings before the sweep's parent run exists: a sweeper
    class (``hydra.sweeper._target_``) with a ``preflight(config)`` class method, as the project's
    Optuna sweeper has, ends the multirun there (one line, exit code 2) when a setting cannot work.
    Hydra calls ``on_multirun_start`` before it makes the sweeper, so without this a refused
    setting would leave a FAILED parent run in the store. For Hydra's basic sweeper (a grid), every
    job's settings are checked (:func:`pipeline.sweeps.grid_preflight.check_grid_jobs`). Other
    sweepers are left to themselves."""
    from hydra._internal.utils import _locate

    check_comparison_settings(config)
    target = OmegaConf.select(config, "hydra.sweeper._target_", default=None)
    if not target:
        return
    jobs = check_grid_jobs(config)  # the basic sweeper's grid: every job's settings
    check_sweep_data(config, jobs)  # before the sweeper's own check, which may create a study's storage file
    try:
        sweeper = _locate(str(target))  # hydra.utils.get_class would log its own multi-line error first
    except Exception as error:
        log.error("hydra.sweeper._target_=%s: no such sweeper class (%s)", target, _one_line(error))
        sys.exit(2)
    check_sweeper_instantiates(config, str(target))
    check = getattr(sweeper, "preflight", None)
    if callable(check):
        try:
            check(config)  # exits (code 2) on a refused setting
        except Exception as error:  # a fault of the check itself: the sweeper checks again as it starts
            log.warning("could not check the sweeper's settings before the sweep: %s: %s", type(error).__name__, error)


def check_comparison_settings(config: DictConfig) -> None:
    """Exit (code 2, one line) when the summary's comparison settings (``comparison``, as
    ``+experiment=hmm_vs_crf`` sets them) cannot work: the summary reads them only after every job ran."""
    least_of = {"bootstrap_samples": 1, "seed": 0, "top_labels": 1}
    settings = OmegaConf.select(config, "comparison", default=None)
    unknown = sorted(set(settings) - set(least_of)) if isinstance(settings, DictConfig) else []
    if unknown:  # a misspelt key would be ignored, its default used
        log.error("bad setting comparison.%s: no such setting (comparison has %s)", unknown[0], ", ".join(least_of))
        sys.exit(2)
    for key, least in least_of.items():
        value = OmegaConf.select(config, f"comparison.{key}", default=None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            log.error("bad setting comparison.%s=%r: a whole number >= %d", key, value, least)
            sys.exit(2)


DATA_KEYS = ("dataset", "data.root", "data.download")  # swept keys (or their parents) that choose a job's data files


def check_sweep_data(config: DictConfig, jobs: list[tuple[list[str], DictConfig]] | None) -> None:
    """Exit (code 2, one line naming the job) if a job of the sweep names dataset files that no
    download can provide (:func:`pipeline.stages.data.config_data_problem`), so that the sweep is
    refused before its parent run exists, not by each job in turn. ``jobs``: the grid's jobs
    (:func:`pipeline.sweeps.grid_preflight.check_grid_jobs`), each checked; None for another sweeper,
    whose jobs share the multirun's data unless it sweeps a key of :data:`DATA_KEYS` (then each job
    checks its own as it starts)."""
    from pipeline.stages.data import config_data_problem

    if jobs is None:
        if any(key == k or key.startswith(k + ".") for key in swept(config) for k in DATA_KEYS):
            return
        jobs = [([], config)]
    for number, (overrides, job) in enumerate(jobs):
        problem = config_data_problem(job)
        if problem is None:
            continue
        where = f"sweep job #{number} ({' '.join(map(shown_override, overrides))}): " if overrides else ""
        log.error("%s%s; no job was run", where, problem.rstrip("."))
        sys.exit(2)


def _one_line(error: BaseException) -> str:
    """The innermost cause of ``error`` (Hydra wraps the sweeper's own error in its message) as one line."""
    while error.__cause__ is not None:
        error = error.__cause__
    return " ".join(f"{type(error).__name__}: {error}".split())


def check_sweeper_instantiates(config: DictConfig, target: str) -> None:
    """Make the sweeper from ``hydra.sweeper`` as Hydra will, to refuse (one line, exit code 2)
    a setting it does not take (``+hydra.sweeper.nosuch=1``) or a value of the wrong kind before
    anything of the multirun exists; Hydra itself would say so only after the parent run was made.
    The sweeper made here is dropped (sweepers do their work in ``setup`` and ``sweep``)."""
    from hydra.core.plugins import Plugins

    try:
        Plugins.instance()._instantiate(config.hydra.sweeper)  # as Hydra makes it (its own sweepers are trusted there)
    except Exception as error:
        log.error("hydra.sweeper: the sweeper %s cannot be made from its settings: %s", target, _one_line(error))
        sys.exit(2)


class SweepTracking(Callback):
    """Creates a sweep's parent run before the jobs and summarises the sweep after them.

    SIGTERM to the launching process is passed on to the jobs (:class:`pipeline.sweeps.sigterm.SweepSigterm`):
    they end their runs on it and exit, so the launcher fails and the exit handler
    ends the parent run FAILED with the summary of the jobs that finished. A sweep so stopped
    registers nothing. Before the summary, runs whose process is gone (a worker that joblib killed
    all the same) are ended FAILED."""

    def __init__(self) -> None:
        self.parent_run_id: str | None = None
        self.sweep_id: str | None = None
        self.experiment: str | None = None
        self.summarize_at_end = True
        self.comparison = None
        self.summary = "grid"
        self.registry = None
        self.objective: tuple[str | None, str] = (None, "maximize")
        self.closed = False
        self.sigterm: SweepSigterm | None = None  # from the sweep's start to its end, in the launching process

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        check_sweeper_settings(config)  # a refused setting ends the multirun here (exit code 2): no parent run
        tracking.setup(config)  # creates the database once, before parallel jobs race for it
        SWEEP_STOPPING.clear()
        self.sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.experiment = config.tracking.experiment
        self.summarize_at_end = bool(config.sweep.summarize)
        self.comparison = OmegaConf.select(config, "comparison")  # set by experiment=hmm_vs_crf
        self.summary = str(OmegaConf.select(config, "sweep.summary", default="grid"))
        self.registry = OmegaConf.select(config, "registry")
        # what a sweeper that optimises (hydra/sweeper=optuna) ranks the jobs by; a grid: the dev score
        metric = OmegaConf.select(config, "hydra.sweeper.metric", default=None)
        self.objective = (metric or None, str(OmegaConf.select(config, "hydra.sweeper.direction", default="maximize")))
        client = MlflowClient()
        experiment = client.get_experiment_by_name(self.experiment)
        run = client.create_run(
            experiment.experiment_id,
            run_name=sweep_run_name(config),
            tags={
                "sweep_id": self.sweep_id,
                "stage": "sweep",
                "dataset": str(config.dataset.name),
                **tracking.source_tags(),
            },
        )
        self.parent_run_id = run.info.run_id
        params = [Param(k, v) for k, v in tracking.shown_params(fixed_params(config)).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(self.parent_run_id, params=params[start : start + 100])
        os.environ[SWEEP_PARENT_VARIABLE] = self.parent_run_id
        os.environ[SWEEP_ID_VARIABLE] = self.sweep_id
        pass_to_jobs(config, job_environment(config, self.parent_run_id, self.sweep_id))  # Ray, SLURM jobs too
        atexit.register(self._close, "FAILED")
        self.sigterm = SweepSigterm(self.sweep_id)
        self.sigterm.install()
        log.info("[sweep %s] parent run %s", self.sweep_id, self.parent_run_id)

    def _summarize(self, register: bool = True) -> pd.DataFrame:
        """The summary the sweep asks for (``sweep.summary``); ``register``: the grid's registers
        its best job (not for a sweep that was stopped or crashed)."""
        if self.summary == "comparison":
            from pipeline.sweeps import compare

            return compare.summarize(self.sweep_id, self.parent_run_id, self.experiment, self.comparison)
        if self.summary == "active_learning":
            from pipeline.sweeps import learning_curves

            return learning_curves.summarize(self.sweep_id, self.parent_run_id, self.experiment)
        if self.summary == "semi_supervised":
            from pipeline.sweeps import semi_supervised

            return semi_supervised.summarize(self.sweep_id, self.parent_run_id, self.experiment, self.comparison)
        metric, direction = self.objective
        registry = self.registry if register else None
        return summarize(
            self.sweep_id, self.parent_run_id, self.experiment, registry, metric=metric, direction=direction,
            stopping=SWEEP_STOPPING.is_set,
        )  # fmt: skip

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self._close("FINISHED") == "stopped":  # the sweeper ran to its end, but a SIGTERM came first: no success
            registered = self._registered()  # the signal came as the registration ran: it is not undone
            what = f"{registered} had been registered as the signal came" if registered else "nothing was registered"
            log.error("[sweep %s] stopped by SIGTERM as it ended: its parent run is FAILED and %s", self.sweep_id, what)
            sys.exit(STOPPED_EXIT)

    def _registered(self) -> str | None:
        """The model the sweep registered (its parent run's ``registered_model`` tag), if any."""
        try:
            return MlflowClient().get_run(self.parent_run_id).data.tags.get("registered_model")
        except Exception as error:  # the store failed: the summary's own lines say what it did
            log.warning("[sweep %s] could not read the parent run: %s", self.sweep_id, error)
            return None

    def __getstate__(self) -> dict:
        # Hydra hands the callbacks to the jobs: the signal handling (its timer, the previous handler) stays here
        return {k: v for k, v in self.__dict__.items() if k != "sigterm"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, sigterm=None)

    def _close(self, status: str) -> str | None:
        """End the sweep (:meth:`_end`) with ``status``, or FAILED if a SIGTERM stopped it ("stopped" is returned then)."""
        if self.closed or self.parent_run_id is None:
            return None
        self.closed = True
        stopped = None
        if self.sigterm is not None:  # a SIGTERM during the summary gets a grace period of its own
            self.sigterm.pause()
        if SWEEP_STOPPING.is_set():  # the sweeper launched no further job: the sweep did not run to its end
            SWEEP_STOPPING.clear()
            status, stopped = "FAILED", "stopped"
            try:
                MlflowClient().set_tag(self.parent_run_id, END_REASON_TAG, "stopped by SIGTERM")
            except Exception as error:
                log.warning("[sweep %s] could not tag the parent run: %s", self.sweep_id, error)
        try:
            self._end(status)
        finally:
            if self.sigterm is not None:
                self.sigterm.release()
        if SWEEP_STOPPING.is_set():  # the signal came during the summary
            SWEEP_STOPPING.clear()
            stopped = "stopped"
        return stopped

    def _end(self, status: str) -> None:
        """Summarise the sweep (registering its best job only when it ran to its end) and end the parent run."""
        try:  # runs of jobs whose process is gone (killed by their launcher as the sweep stopped)
            lifecycle.mark_stranded(MlflowClient())
        except Exception as error:  # the next start on this host does it
            log.warning("[sweep %s] could not end the runs of gone processes: %s", self.sweep_id, error)
        try:
            ended = MlflowClient().get_run(self.parent_run_id).info.status
        except Exception as error:  # the summary below says what the store does
            log.warning("[sweep %s] could not read the parent run: %s", self.sweep_id, error)
            ended = "RUNNING"
        if ended != "RUNNING":  # a job of this process (Hydra's basic launcher) ended it on a signal
            log.warning("[sweep %s] the parent run was ended %s: no summary", self.sweep_id, ended)
            os.environ.pop(SWEEP_PARENT_VARIABLE, None)
            os.environ.pop(SWEEP_ID_VARIABLE, None)
            return
        try:
            table = pd.DataFrame()
            if self.summarize_at_end:
                table = self._summarize(register=status == "FINISHED")
            if status == "FINISHED" and not table.empty and (table.status == "FAILED").any():
                status = "FAILED"
        except Exception as error:  # the jobs' runs stand, but the sweep's summary is missing: say so on the run
            status = "FAILED"
            log.error("[sweep %s] the sweep's summary failed: %s", self.sweep_id, error)
            try:  # the store may be what failed: never let this hide the summary's own error
                MlflowClient().set_tag(
                    self.parent_run_id, END_REASON_TAG, f"summary failed: {type(error).__name__}: {error}"[:5000]
                )
            except Exception as tagging:
                log.error("[sweep %s] could not tag the parent run: %s", self.sweep_id, tagging)
            raise
        except BaseException:  # interrupted (a further SIGTERM, Ctrl-C): half a summary is no finished sweep
            status = "FAILED"
            raise
        finally:
            if SWEEP_STOPPING.is_set() and status == "FINISHED":  # a SIGTERM during the summary: no finished sweep
                status = "FAILED"
                with contextlib.suppress(Exception):
                    MlflowClient().set_tag(self.parent_run_id, END_REASON_TAG, "stopped by SIGTERM")
            MlflowClient().set_terminated(self.parent_run_id, status)
            os.environ.pop(SWEEP_PARENT_VARIABLE, None)
            os.environ.pop(SWEEP_ID_VARIABLE, None)

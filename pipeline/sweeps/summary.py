"""Regularisation sweeps: one MLflow parent run per Hydra multirun, and its summary.

``SweepTracking`` is a Hydra callback. In the launching process, before any job starts, it
creates the tracking database and the sweep's parent run, and exports the parent run id and a
sweep id to the jobs (which run in joblib worker processes) through environment variables. When
the jobs are done it gathers them with ``mlflow.search_runs`` into a table (CSV artifact), plots
dev score and non-zero weights against the regularisation strength, picks the best setting on dev
and reports its test score. Hydra skips ``on_multirun_end`` when a job fails, so the same summary
also runs from an exit handler: one failing job does not lose the others' results.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import psutil
from hydra.experimental.callback import Callback
from mlflow.entities import Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from pipeline import tracking
from pipeline.engine.runner import summary_key
from pipeline.engine.stage import TRIAL_STATE_TAG
from pipeline.report import figure, markdown_table, save_figure
from pipeline.sweeps.cluster import job_environment, pass_to_jobs
from pipeline.tracking import SWEEP_ID_VARIABLE, SWEEP_PARENT_VARIABLE, lifecycle
from pipeline.tracking.lifecycle import END_REASON_TAG

log = logging.getLogger(__name__)

SIGTERM_GRACE_SECONDS = 10.0  # how long a signalled sweep waits for its jobs before it interrupts them
SWEEP_STOPPING = threading.Event()  # set on SIGTERM: a sweeper launches no further job


def strength(frame: pd.DataFrame) -> pd.Series:
    """The regularisation strength of each run: c1 when it has an L1 term (l1; elasticnet, whose
    c2 is c1 times ``l2_ratio``), else c2 (lbfgs, sgd)."""
    c1 = pd.to_numeric(frame.get("params.trainer.c1"), errors="coerce").fillna(0.0)
    c2 = pd.to_numeric(frame.get("params.trainer.c2"), errors="coerce").fillna(0.0)
    return c1.where(c1 > 0, c2)


def _shown(value, spec: str = ".2f") -> str:
    """``value`` formatted by ``spec``, or ``none`` when it is missing (None or NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "none"
    return "none" if np.isnan(number) else format(number, spec)


def _numbers(runs: pd.DataFrame, column: str) -> pd.Series:
    """``runs[column]`` as numbers (NaN where absent, and everywhere when no run has it)."""
    return pd.to_numeric(runs[column], errors="coerce") if column in runs else pd.Series(np.nan, index=runs.index)


def gather(sweep_id: str, experiment: str, tag: str = "sweep_id", metric: str | None = None) -> pd.DataFrame:
    """One row per pipeline run whose ``tag`` is ``sweep_id`` (the jobs of a sweep; the points of a
    regularisation path with ``tag="path_id"``), with its settings, scores and status; ``state``
    is the status but PRUNED for a pruned Optuna trial (its run is KILLED). With ``metric`` (a
    sweeper's objective, ``<stage>.<name>``) a column ``objective`` holds each run's value of it."""
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.`{tag}` = '{sweep_id}' and tags.stage = 'pipeline'"
    )
    if runs.empty:
        return pd.DataFrame()
    score = "metrics.dev_f1" if "metrics.dev_f1" in runs else "metrics.dev_accuracy"
    test = "metrics.test_f1" if "metrics.test_f1" in runs else "metrics.test_accuracy"
    table = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "status": runs["status"],
            "state": runs.get(f"tags.{TRIAL_STATE_TAG}", pd.Series(index=runs.index, dtype=object)).fillna(runs["status"]),
            "trainer": runs.get("tags.trainer"),
            "c1": pd.to_numeric(runs.get("params.trainer.c1"), errors="coerce"),
            "c2": pd.to_numeric(runs.get("params.trainer.c2"), errors="coerce"),
            "strength": strength(runs),
            "dev_score": runs.get(score),
            "test_score": runs.get(test),
            "nonzero_weights": runs.get("metrics.nonzero_weights"),
            "iterations": _numbers(runs, "metrics.iterations").fillna(_numbers(runs, "metrics.pruned_at_iteration")),
            "train_seconds": runs.get("metrics.train_seconds"),
            "model_uri": runs.get(f"tags.{tracking.MODEL_URI_TAG}"),
            "registry_name": runs.get("params.registry.name"),
        }
    )
    if metric:
        key = summary_key(metric)
        table.insert(table.columns.get_loc("dev_score"), "objective", _numbers(runs, f"metrics.{key}") if key else np.nan)
    table.attrs["score"] = score.split(".", 1)[1].removeprefix("dev_")  # "f1" or "accuracy"
    return table.sort_values(["trainer", "strength"], ignore_index=True)


def plot(table: pd.DataFrame, path: Path, score_name: str) -> None:
    fig, (left, right) = figure(11, 4, 2)
    finished = table[table.status == "FINISHED"]
    for trainer, part in finished.groupby("trainer"):
        left.plot(part["strength"], part["dev_score"], "o-", label=trainer)
        right.plot(part["strength"], part["nonzero_weights"], "o-", label=trainer)
    for ax, label in ((left, f"dev {score_name}"), (right, "non-zero weights")):
        ax.set_xscale("log")
        ax.set_xlabel("regularisation strength (c1 or c2)")
        ax.set_ylabel(label)
        ax.legend()
    right.set_yscale("log")
    save_figure(fig, path)


def register_best(best: pd.Series, score_name: str, sweep_id: str, alias: str | None, metric: str | None = None) -> str | None:
    """Register the best job's MLflow Model as a new version of its ``registry.name`` and move
    ``alias`` to it, with its dev and test scores (and the sweep's objective ``metric``) as
    version tags; ``models:/<name>@<alias>``."""
    if not isinstance(best.get("model_uri"), str) or not isinstance(best.get("registry_name"), str):
        log.warning("[sweep %s] best job %s logged no model (or registry name): nothing registered", sweep_id, best["run_id"])
        return None
    tags = {
        f"dev_{score_name}": _shown(best["dev_score"], ".4f"),
        f"test_{score_name}": _shown(best["test_score"], ".4f"),
        "run_id": best["run_id"],
        "sweep_id": sweep_id,
    }
    if metric:
        tags[metric] = f"{best['objective']:.6g}"
    version = tracking.register_model(best["model_uri"], best["registry_name"], alias, tags)
    where = f"models:/{best['registry_name']}@{alias}" if alias else f"models:/{best['registry_name']}/{version.version}"
    log.info("[sweep %s] registered the best job as %s version %s: %s", sweep_id, best["registry_name"], version.version, where)
    return where


def summarize(
    sweep_id: str,
    parent_run_id: str | None,
    experiment: str,
    registry: DictConfig | None = None,
    tag: str = "sweep_id",
    metric: str | None = None,
    direction: str = "maximize",
) -> pd.DataFrame:
    """Build the sweep table and plot, log them to the parent run and the best setting to the console;
    with ``registry.sweep``, register the best job's model (see :func:`register_best`). The best is
    chosen among finished jobs only (not failed, nor pruned trials): the largest dev score, or the
    sweeper's objective ``metric`` in its ``direction`` (``maximize`` or ``minimize``).
    ``tag``: see :func:`gather`."""
    table = gather(sweep_id, experiment, tag, metric)
    if table.empty:
        log.info("[sweep %s] no finished jobs to summarise", sweep_id)
        return table
    score_name = table.attrs.get("score", "dev_score")
    rank = "objective" if metric else "dev_score"
    finished = table[table.status == "FINISHED"].dropna(subset=[rank])
    if metric and finished.empty and (table.status == "FINISHED").any():
        log.warning("[sweep %s] no finished job has the sweep's metric %s: no best job", sweep_id, metric)
    client = MlflowClient()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        table.to_csv(folder / "sweep_summary.csv", index=False)
        text = markdown_table(table.drop(columns=["run_id", "model_uri", "registry_name"]))
        if not finished.empty:
            best = finished.loc[finished[rank].idxmin() if direction == "minimize" else finished[rank].idxmax()]
            by = f"by {metric} ({direction}, {best['objective']:.4g})" if metric else "on dev"
            text += (
                f"\n\nbest {by}: trainer={best['trainer']} c1={best['c1']:g} c2={best['c2']:g} "
                f"dev {score_name} {_shown(best['dev_score'])}, test {_shown(best['test_score'])}"
            )
            if parent_run_id:
                for name in ("dev_score", "test_score"):  # absent when the stages run stop before evaluate
                    if _shown(best[name]) != "none":
                        client.log_metric(parent_run_id, f"best_{name}", float(best[name]))
                client.set_tag(parent_run_id, "best_run_id", best["run_id"])
                if metric:
                    client.log_metric(parent_run_id, "best_objective", float(best["objective"]))
            if registry is not None and registry.sweep:
                registered = register_best(best, score_name, sweep_id, registry.alias, metric)
                if registered and parent_run_id:
                    client.set_tag(parent_run_id, "registered_model", registered)
                    text += f"\nregistered: {registered}"
            plot(table, folder / "sweep.png", score_name)
        (folder / "sweep_summary.md").write_text(text + "\n")
        if parent_run_id:
            client.log_metric(parent_run_id, "jobs_finished", float((table.status == "FINISHED").sum()))
            client.log_metric(parent_run_id, "jobs_failed", float((table.status == "FAILED").sum()))
            client.log_metric(parent_run_id, "jobs_pruned", float((table.state == "PRUNED").sum()))
            for name in ("sweep_summary.csv", "sweep_summary.md", "sweep.png"):
                if (folder / name).exists():
                    client.log_artifact(parent_run_id, str(folder / name))
    log.info("[sweep %s]\n%s", sweep_id, text)
    return table


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


def _descendants(pid: int) -> list[int]:
    """The processes started by ``pid``, their children and so on: the sweep's joblib workers,
    which a signal to this process alone missed."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


class SweepTracking(Callback):
    """Creates a sweep's parent run before the jobs and summarises the sweep after them.

    SIGTERM to the launching process (with the whole process group: ``kill -TERM -- -<pgid>``)
    does not stop it at once, which would have joblib kill its workers while they end their runs:
    it waits for the jobs, which end their runs on the same signal and exit, so the launcher fails
    and the exit handler ends the parent run FAILED with the summary of the jobs that finished.
    Jobs still there :data:`SIGTERM_GRACE_SECONDS` after the signal (the launching process was
    signalled alone) get it from this process (:meth:`_pass_on`), which stops as on Ctrl-C when
    they are still there another grace period later; a second SIGTERM stops it at once. The
    sweeper launches no further job once signalled (:data:`SWEEP_STOPPING`), and a sweep so
    stopped registers nothing.
    Before the summary, runs whose process is gone (a worker that joblib killed all the same) are
    ended FAILED."""

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
        self.previous_sigterm = None
        self.interrupt: threading.Timer | None = None
        self.released = False  # the sweep's end gave SIGTERM back: timers that fire do nothing

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
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
        params = [Param(k, v) for k, v in fixed_params(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(self.parent_run_id, params=params[start : start + 100])
        os.environ[SWEEP_PARENT_VARIABLE] = self.parent_run_id
        os.environ[SWEEP_ID_VARIABLE] = self.sweep_id
        pass_to_jobs(config, job_environment(config, self.parent_run_id, self.sweep_id))  # Ray, SLURM jobs too
        atexit.register(self._close, "FAILED")
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.previous_sigterm = signal.SIG_DFL if previous is None else previous  # None: not set from Python
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
        metric, direction = self.objective
        registry = self.registry if register else None
        return summarize(self.sweep_id, self.parent_run_id, self.experiment, registry, metric=metric, direction=direction)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._close("FINISHED")

    def __getstate__(self) -> dict:
        # Hydra hands the callbacks to the jobs: the timer and the previous handler stay here
        return {k: v for k, v in self.__dict__.items() if k not in ("interrupt", "previous_sigterm")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, interrupt=None, previous_sigterm=None)

    def _on_sigterm(self, signum: int, frame) -> None:
        if self.interrupt is None:  # the first: the jobs, signalled too, end their runs and exit
            log.warning(
                "[sweep %s] SIGTERM: waiting up to %g s for the jobs to end their runs", self.sweep_id, SIGTERM_GRACE_SECONDS
            )
            SWEEP_STOPPING.set()
            self._later(self._pass_on, signum)
            return
        # a second SIGTERM, or the jobs did not end in time (see _pass_on): stop as Ctrl-C does
        raise KeyboardInterrupt("terminated by SIGTERM")

    def _later(self, action, signum: int) -> None:
        self.interrupt = threading.Timer(SIGTERM_GRACE_SECONDS, action, (signum,))
        self.interrupt.daemon = True
        self.interrupt.start()

    def _pass_on(self, signum: int) -> None:
        """The grace period is over and jobs still run (this process was signalled alone): the
        signal to this process's descendants (its joblib workers end their runs and exit), then,
        after another grace period, to its main thread, which stops as on Ctrl-C."""
        if self.released:
            return
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, signum)
            except OSError:
                pass  # gone meanwhile
        self._later(self._stop, signum)

    def _stop(self, signum: int) -> None:
        if not self.released:
            signal.pthread_kill(threading.main_thread().ident, signum)

    def _release_signal(self) -> None:
        """Cancel a pending interruption and give SIGTERM its handler from before the sweep."""
        self.released = True
        if self.interrupt is not None:
            self.interrupt.cancel()
        if self.previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.previous_sigterm)
            self.previous_sigterm = None

    def _close(self, status: str) -> None:
        if self.closed or self.parent_run_id is None:
            return
        self.closed = True
        if self.interrupt is not None:  # a SIGTERM during the summary waits for it (a grace period of its own)
            self.interrupt.cancel()
            self.interrupt = None
        if SWEEP_STOPPING.is_set():  # the sweeper launched no further job: the sweep did not run to its end
            SWEEP_STOPPING.clear()
            status = "FAILED"
            try:
                MlflowClient().set_tag(self.parent_run_id, END_REASON_TAG, "stopped by SIGTERM")
            except Exception as error:
                log.warning("[sweep %s] could not tag the parent run: %s", self.sweep_id, error)
        try:
            self._end(status)
        finally:
            self._release_signal()

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
            MlflowClient().set_terminated(self.parent_run_id, status)
            os.environ.pop(SWEEP_PARENT_VARIABLE, None)
            os.environ.pop(SWEEP_ID_VARIABLE, None)

"""``python -m pipeline``: the Hydra app that runs the configured stages (conf/config.yaml), or with
``path.strengths`` set (``+experiment=reg_path``) a warm-started regularisation path in one job.
It returns the objective a sweeper optimises (``objective_value``: the dev score, or the metric a
sweeper names in the job's environment; None for a pruned Optuna trial).

This is the composition module: the engine (``pipeline.engine``) defines the interfaces it needs and
imports no store and no sweeper; here they are plugged in. :func:`run_pipeline` hands the runner the
MLflow run store (``pipeline.tracking.run_store``, which also gives the stage cache its remote when
the tracking store is shared) and, in an Optuna trial's job, the trial
(``pipeline.sweeps.trial_stopping``) as its ``TrialHooks``.

SIGTERM/SIGINT end the open runs as KILLED (``pipeline.tracking.lifecycle``); an output folder or store that
cannot be written (read-only, full disk, permissions) ends the run with one line naming the path
(exit code 1); a bad setting or data file, or data a model cannot be trained on, with one line
naming it and why (exit code 2).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
import mlflow
from omegaconf import DictConfig, OmegaConf

from pipeline.engine import runner
from pipeline.engine.runner import TrialHooks, objective_value
from pipeline.engine.validate import ONE_LINE_ERRORS, SettingsError
from pipeline.report import redacted
from pipeline.sweeps.trial_environment import METRIC_VARIABLE
from pipeline.sweeps.trial_stopping import trial_from_environment
from pipeline.tracking.lifecycle import ending_runs_on_signal, error_chain
from pipeline.tracking.run_store import MlflowRunStore

log = logging.getLogger("pipeline")

# what SQLite (through SQLAlchemy and MLflow) says when its file or folder cannot be written
_STORE_WRITE_ERRORS = (
    "readonly database",
    "disk i/o error",
    "unable to open database file",
    "database or disk is full",
    "read-only file system",
)


def unwritable(error: BaseException, store: str | None = None) -> str | None:
    """One line describing ``error`` when it (or an error it was raised from) means the output
    folder or the store (``store``, default MLflow's current tracking URI) cannot be written;
    None for any other error."""
    for link in error_chain(error):
        if isinstance(link, OSError) and (
            isinstance(link, PermissionError) or link.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES)
        ):
            where = f": {link.filename}" if link.filename else ""
            return f"cannot write{where} ({link.strerror or link})"
        lines = [line for line in str(link).splitlines() if any(m in line.lower() for m in _STORE_WRITE_ERRORS)]
        if lines:
            what = lines[0].split(") ", 1)[-1] if lines[0].startswith("(") else lines[0]  # "(sqlite3.OperationalError) ..."
            return f"cannot write the tracking store {store or mlflow.get_tracking_uri()} ({what.strip()[:200]})"
    return None


def run_pipeline(cfg: DictConfig, trial: TrialHooks | None = None) -> dict[str, Any]:
    """Run the configured stages, recorded in MLflow (what ``python -m pipeline`` does in one job).

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config (``hydra.compose`` gives one in a test or notebook).
    trial : TrialHooks, optional
        The sweep trial this job is (None: not a trial's job).

    Returns
    -------
    dict
        Every stage's metrics, namespaced ``stage.metric`` (:func:`pipeline.engine.runner.run_pipeline`).
    """
    return runner.run_pipeline(cfg, MlflowRunStore(), trial)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


class _ReportedOnce(logging.Filter):
    """Drops MLflow's logged traceback of a store write error: ``main`` reports it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[1] is not None and unwritable(record.exc_info[1]))


def tracking_store(cfg: DictConfig) -> str | None:
    """The run's tracking URI, or None when its settings name none that can be used."""
    from pipeline.tracking import tracking_uri

    try:
        return tracking_uri(cfg)
    except Exception:  # noqa: BLE001 - only for a message: the run's own checks report the settings
        return None


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    logging.getLogger("mlflow.store.db.utils").addFilter(_ReportedOnce())
    with ending_runs_on_signal():
        try:
            trial = trial_from_environment()  # None unless an Optuna sweeper launched this job
            from pipeline.sweeps.path import path_job, run_path

            if path_job(cfg):  # +experiment=reg_path: one job, a warm-started path
                results = run_path(cfg, trial_tags=trial.tags() if trial is not None else None, store=MlflowRunStore())
            else:
                results = run_pipeline(cfg, trial)
            return objective_value(results, os.environ.get(METRIC_VARIABLE) or None)
        except ONE_LINE_ERRORS as error:
            if _in_multirun():
                raise  # Hydra records the job as failed and the sweep goes on
            log.error("%s", redacted(str(error)))  # the one line says what and where: a traceback adds nothing
            sys.exit(2)
        except Exception as error:
            problem = unwritable(error, tracking_store(cfg))
            if problem is None:
                raise
            log.error(
                "%s; output folder %s: make it writable or free space, or set paths.output_dir", problem, cfg.paths.output_dir
            )
            sys.exit(1)


CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def composition_refusal(argv: list[str]) -> str | None:
    """One line when the command line's fixed overrides (``argv`` without the program name) cannot
    be composed with the config (a key the config lacks, a missing config group option), else None.

    Hydra reports these in several lines with exit code 1, and in a multirun before the sweeper
    (whose preflight checks the swept values) is reached; here they are found first, so that every
    bad setting ends the same way: one line, exit code 2; an override that does not parse
    (``trainer.c2=choice()``) is named in one line too. Swept values are left to the sweeper's
    preflight; a command line with a flag other than ``-m``/``--multirun`` (``--cfg``, ``--help``,
    another config) is left to Hydra.
    """
    if any(arg.startswith("-") and arg not in ("-m", "--multirun") for arg in argv):
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pipeline.sweeps.grid_preflight import composition_problem, flag_order_problem, sweep_override_problem

    misplaced = flag_order_problem(argv)
    if misplaced:
        return misplaced
    arguments = [arg for arg in argv if not arg.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(arguments)
    except Exception:
        return _parse_problem(arguments)
    for override in overrides:
        if override.is_sweep_override() and override.is_hydra_override():  # Hydra refuses it only as the sweep starts
            return (
                f"bad setting {override.input_line}: a sweep over one of Hydra's own settings; a search space key is "
                f"swept as a plain override ({override.key_or_group.removeprefix('hydra.sweeper.params.')}=...) or "
                "listed in hydra.sweeper.params={...}"
            )
    fixed = [override.input_line for override in overrides if not override.is_sweep_override()]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose("config", overrides=fixed)
            problem = sweep_override_problem("config", argv, overrides, fixed)
    except Exception as error:
        return f"bad setting: {composition_problem(error)}"
    finally:
        GlobalHydra.instance().clear()
    if problem:
        return problem
    from pipeline.tracking import registry_uri, stores_problem, tracking_uri

    try:
        store = tracking_uri(cfg)  # the variable and the setting name one store
        multirun = any(arg in ("-m", "--multirun") for arg in argv)
        registers, sweep_registers = (OmegaConf.select(cfg, f"registry.{k}", default=False) for k in ("register", "sweep"))
        if multirun and registers is True and sweep_registers is not True:
            return (
                "bad setting registry.register=true: in a multirun the sweep registers its best job on dev "
                "(registry.sweep=true), and its jobs register nothing themselves; set registry.sweep=true, or run the "
                "chosen settings as a single run with registry.register=true"
            )
        from pipeline.sweeps.path import path_job

        path = not multirun and path_job(cfg)  # a path on its own registers its best point as a sweep does
        registering = OmegaConf.select(cfg, "registry.sweep" if multirun or path else "registry.register", default=False) is True
        if OmegaConf.select(cfg, "registry.force_alias", default=False) is True and not registering:
            which = (
                "registry.sweep=true (the sweep registers its best job)"
                if multirun
                else "registry.sweep=true (the path registers its best point)"
                if path
                else "registry.register=true"
            )
            return f"bad setting registry.force_alias=true: it moves the alias to the model this command registers; set {which}"
        registry = registry_uri(cfg) if registering else None  # and MLFLOW_REGISTRY_URI, where the model is registered
    except SettingsError as error:
        return str(error)
    problem = stores_problem(store, registry)
    if problem:
        return problem
    from pipeline.stages.data import config_data_problem

    problem = None if multirun else config_data_problem(cfg)  # a sweep checks its jobs' data after their settings
    if problem:
        return problem
    if multirun:
        from pipeline.sweeps.cluster import UNPASSABLE, unpassable

        for key in ("paths.output_dir", "data.root"):  # a sweep hands them to its jobs as absolute paths
            try:
                folder = OmegaConf.select(cfg, key, default=None)
            except Exception:  # an interpolation only Hydra's run resolves: left to the sweep's own checks
                continue
            if folder is not None and unpassable(Path(str(folder)).absolute()):
                return (
                    f"bad setting {key}={folder}: a sweep gives its jobs this folder in their environment, which "
                    f"cannot carry {UNPASSABLE}; choose a folder without"
                )
    for key in ("paths.output_dir", "paths.cache_dir"):  # Hydra makes its run folder in the first
        try:
            folder = OmegaConf.select(cfg, key, default=None)
        except Exception:  # an interpolation only Hydra's run resolves: left to the run's own checks
            continue
        problem = None if folder is None else folder_problem(Path(str(folder)))
        if problem:
            return f"bad setting {key}={folder}: {problem}"
    return None


def _parse_problem(arguments: list[str]) -> str | None:
    """One line naming the first of ``arguments`` that Hydra's override grammar refuses, and why."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for argument in arguments:
        try:
            parser.parse_overrides([argument])
        except Exception as error:  # noqa: BLE001 - Hydra's parse errors come as several types
            why = [line for line in str(error).splitlines() if line and not line.startswith(("See https:", "Error parsing"))]
            return f"bad setting {argument}: {'; '.join(why) or type(error).__name__} (see Hydra's override grammar)"
    return None


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` (or a folder above it) cannot hold the run's outputs: a dangling symbolic link
    (making the folder would fail, or write where the link points), or a file; None if it can."""
    for path in (folder, *folder.parents):
        if path.is_symlink() and not path.exists():
            which = "a symbolic link" if path == folder else f"{path} in it is a symbolic link"
            return f"{which} to {os.readlink(path)}, which does not exist; name a folder"
        if path.exists() and not path.is_dir():
            return f"{path} is a file, not a folder"
    return None


if __name__ == "__main__":
    refusal = composition_refusal(sys.argv[1:])
    if refusal:
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("%s", redacted(refusal))  # a store's URL may hold a password
        sys.exit(2)
    main()

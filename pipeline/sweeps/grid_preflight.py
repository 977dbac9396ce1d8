"""Check every job of a grid sweep (Hydra's basic sweeper) before the first one runs.

Hydra's basic sweeper composes the jobs of a batch and launches them; a job whose setting cannot
work (``trainer.c2=nan`` among ``trainer.c2=0.1,nan``) would fail only when its turn comes, after
the jobs before it trained, and Hydra would end the sweep with a traceback. Here the sweep's jobs
are expanded and composed as the sweeper will do it, and each one's settings are checked with
:func:`pipeline.engine.validate.validate_settings` (nothing is read, written or logged): a
refused setting ends the multirun before the sweep's parent run exists, with one line naming
the job and the setting (exit code 2), as a bad setting ends a single run.
"""

from __future__ import annotations

import logging
import sys

from omegaconf import DictConfig, OmegaConf

from pipeline.engine.validate import SettingsError, validate_settings

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def grid_jobs(config: DictConfig) -> list[list[str]]:
    """The overrides of each job the basic sweeper will launch for ``config`` (the multirun's
    config, with ``hydra``): its ``hydra.sweeper.params`` and the command line's overrides,
    expanded as :meth:`BasicSweeper.split_arguments` does."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += list(OmegaConf.select(config, "hydra.overrides.task", default=None) or [])
    overrides = OverridesParser.create().parse_overrides(arguments)
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def check_grid_jobs(config: DictConfig) -> None:
    """Exit (code 2, one line) if a job of the basic sweeper's grid has a setting that cannot work;
    do nothing for other sweepers, or outside a Hydra app (no config loader to compose jobs)."""
    from hydra.core.global_hydra import GlobalHydra

    if OmegaConf.select(config, "hydra.sweeper._target_", default=None) != BASIC_SWEEPER:
        return
    hydra = GlobalHydra.instance()
    if not hydra.is_initialized():
        return
    loader = hydra.config_loader()
    for number, job in enumerate(grid_jobs(config)):
        try:
            job_config = loader.load_sweep_config(config, list(job))
            validate_settings(job_config)
        except SettingsError as error:
            log.error("sweep job #%d (%s): %s; no job was run", number, " ".join(job), error)
            sys.exit(2)
        except Exception as error:  # a job Hydra cannot compose: Hydra says so as it launches it
            log.debug("sweep job #%d (%s) not checked: %s: %s", number, " ".join(job), type(error).__name__, error)

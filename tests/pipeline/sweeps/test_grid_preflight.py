"""A grid sweep's jobs are checked before the first one runs: a bad setting in any job ends the
multirun with one line naming the job and the setting (exit code 2), and no job runs."""

from __future__ import annotations

import logging

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict
from pipeline_helpers import CONF_DIR

from pipeline.sweeps.grid_preflight import BASIC_SWEEPER, check_grid_jobs, grid_jobs


def _multirun_config(task: list[str], params: dict | None = None):
    """The config Hydra hands to ``on_multirun_start``: composed with ``hydra``, the command
    line's overrides (sweeps included) in ``hydra.overrides.task``."""
    config = compose(config_name="config", overrides=[], return_hydra_config=True)
    with open_dict(config):
        config.hydra.overrides.task = task
        config.hydra.sweeper = {"_target_": BASIC_SWEEPER, "max_batch_size": None, "params": params or {}}
    return config


def test_the_jobs_are_expanded_as_the_basic_sweeper_does():
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        config = _multirun_config(["trainer.c2=0.1,1", "data.train_fraction=0.5"], {"trainer.c1": "0,0.2"})
        assert grid_jobs(config) == [
            ["trainer.c1=0", "trainer.c2=0.1", "data.train_fraction=0.5"],
            ["trainer.c1=0", "trainer.c2=1", "data.train_fraction=0.5"],
            ["trainer.c1=0.2", "trainer.c2=0.1", "data.train_fraction=0.5"],
            ["trainer.c1=0.2", "trainer.c2=1", "data.train_fraction=0.5"],
        ]


@pytest.mark.parametrize(
    "task, job, setting",
    [
        (["trainer.c2=0.1,nan"], 1, "trainer.c2=nan"),
        (["trainer.c2=-5,0.1"], 0, "trainer.c2=-5"),
        (["data.train_fraction=0.5,1.5"], 1, "data.train_fraction=1.5"),
    ],
)
def test_a_bad_setting_in_any_job_ends_the_sweep_before_any_job(caplog, task, job, setting):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        config = _multirun_config(task)
        with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stopped:
            check_grid_jobs(config)
    assert stopped.value.code == 2
    [record] = caplog.records
    assert record.getMessage().startswith(f"sweep job #{job} (") and f"bad setting {setting}" in record.getMessage()


def test_good_jobs_and_other_sweepers_pass():
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        check_grid_jobs(_multirun_config(["trainer.c2=0.1,1"]))
        config = _multirun_config(["trainer.c2=0.1,nan"])
        with open_dict(config):
            config.hydra.sweeper._target_ = "hydra_plugins.crf_optuna_sweeper.optuna_sweeper.OptunaSweeper"
        check_grid_jobs(config)  # not a grid: that sweeper checks its own settings

"""A blank or unusable Optuna study name or seed is a settings error, found before the sweep begins."""

from __future__ import annotations

import pytest

from hydra_plugins.crf_optuna_sweeper.optuna_sweeper import OptunaSweeper
from pipeline.sweeps.search import SweeperSettingError


@pytest.mark.parametrize("name", ["", "   ", " study", "study\n", "x" * 513])
def test_a_blank_or_overlong_study_name_is_refused(name):
    """``""`` used to fall back silently to a new study named after the sweep, and ``"  "`` made a
    study no one can name on a command line."""
    sweeper = OptunaSweeper(params={"trainer.strength": "interval(0.1, 1)"}, study_name=name)
    with pytest.raises(SweeperSettingError, match=r"^hydra\.sweeper\.study_name=.*: a name of 1 to 512 characters"):
        sweeper._check_counts()


@pytest.mark.parametrize("name", ["it's", "a\\b", "a$b", "a${x}"])
def test_a_study_name_the_jobs_cannot_be_given_is_refused_before_the_sweep(name):
    """The trials' jobs learn the study's name from their environment, through a quoted Hydra
    override: ``it's`` was refused only as the first trial was handed out, with a traceback, a
    FAILED parent run and the study already made."""
    sweeper = OptunaSweeper(params={"trainer.strength": "interval(0.1, 1)"}, study_name=name)
    with pytest.raises(SweeperSettingError, match=r"^hydra\.sweeper\.study_name=.*: the trials' jobs are given it"):
        sweeper._check_counts()


@pytest.mark.parametrize("name", [None, "pos-sweep", "x" * 512, 7, "an études sweep, 2nd (v2.1)"])
def test_usable_study_names_pass(name):
    OptunaSweeper(params={"trainer.strength": "interval(0.1, 1)"}, study_name=name)._check_counts()


@pytest.mark.parametrize("seed", [1.5, -1, 2**32, True, "3"])
def test_a_seed_the_sampler_cannot_take_is_refused_by_its_name(seed):
    """``seed=1.5`` was refused by the sampler as "Cannot cast scalar from dtype('float64')", under
    hydra.sweeper.sampler (K11)."""
    sweeper = OptunaSweeper(params={"trainer.strength": "interval(0.1, 1)"}, seed=seed)
    with pytest.raises(SweeperSettingError, match=r"^hydra\.sweeper\.seed=.*: a whole number from 0 to 2\*\*32 - 1, or null"):
        sweeper._check_counts()
    for good in (None, 0, 2**32 - 1):
        OptunaSweeper(params={"trainer.strength": "interval(0.1, 1)"}, seed=good)._check_counts()

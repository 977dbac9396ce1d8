"""A blank or unusable Optuna study name is a settings error, found before the sweep begins."""

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


@pytest.mark.parametrize("name", [None, "pos-sweep", "x" * 512, 7])
def test_usable_study_names_pass(name):
    OptunaSweeper(params={"trainer.strength": "interval(0.1, 1)"}, study_name=name)._check_counts()

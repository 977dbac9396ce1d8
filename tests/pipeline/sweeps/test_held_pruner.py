"""The sweeper's median/percentile pruner: finished trials keep their final score after they stop."""

from __future__ import annotations

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState, create_trial  # noqa: E402

from pipeline.sweeps import search  # noqa: E402
from pipeline.sweeps.optuna_pruners import HeldMedianPruner, HeldPercentilePruner, held_score  # noqa: E402


def _finished(curve: dict[int, float], final: float):
    return create_trial(state=TrialState.COMPLETE, value=final, intermediate_values=curve)


def _study(pruner, finished) -> optuna.study.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for trial in finished:
        study.add_trial(trial)
    return study


def _decisions(study, curve: dict[int, float]) -> list[bool]:
    trial = study.ask()
    said = []
    for step, value in curve.items():
        trial.report(value, step)
        said.append(trial.should_prune())
    return said


# three settings that converged by iteration 200, at dev F1 94.5, 94.0 and 93.0
CONVERGED = [
    _finished({100: 94.0, 150: 94.3, 200: 94.4}, 94.5),
    _finished({100: 93.8, 150: 94.0}, 94.0),
    _finished({100: 92.5, 150: 93.0}, 93.0),
]


def test_a_slow_trial_behind_the_converged_ones_is_pruned_after_they_stopped():
    slow = {100: 93.9, 150: 93.95, 200: 93.96, 250: 93.97, 300: 93.98}  # weak regularisation: still going
    # the others' scores at 100: 94.0, 93.8, 92.5 (median 93.8); at 150: 94.3, 94.0, 93.0; from 200
    # on two of them have stopped and hold 94.0 and 93.0: the median stays 94.0
    ours = _decisions(_study(HeldMedianPruner(n_startup_trials=2, n_warmup_steps=100), CONVERGED), slow)
    assert ours == [False, True, True, True, True]
    same_step = _decisions(_study(optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=100), CONVERGED), slow)
    assert same_step == [False, True, True, False, False]  # Optuna's: no finished trial has a score at 250 or 300


def test_a_slow_trial_ahead_of_the_median_goes_on():
    slow = {100: 93.9, 150: 94.1, 200: 94.2, 300: 94.3}
    assert _decisions(_study(HeldMedianPruner(n_startup_trials=2, n_warmup_steps=100), CONVERGED), slow) == [False] * 4


def test_a_slow_trial_is_compared_with_the_finished_trials_held_scores_at_each_step():
    # at 250 the finished trials' held scores are 94.5, 94.0 and 93.0: the median is 94.0
    trial = {100: 93.95, 250: 93.99}
    assert _decisions(_study(HeldMedianPruner(n_startup_trials=1), CONVERGED), trial) == [False, True]
    trial = {100: 93.95, 250: 94.0}
    assert _decisions(_study(HeldMedianPruner(n_startup_trials=1), CONVERGED), trial) == [False, False]
    # keep the best quarter: the bar at 250 is the 75th percentile of (93.0, 94.0, 94.5), 94.25
    quarter = _study(HeldPercentilePruner(25.0, n_startup_trials=1), CONVERGED)
    assert _decisions(quarter, {250: 94.2}) == [True]
    assert _decisions(quarter, {250: 94.3}) == [False]


def test_held_score_is_the_last_report_then_the_final_value():
    trial = _finished({100: 94.0, 150: 94.3, 200: 94.4}, 94.5)
    assert held_score(trial, 90) is None  # before its first report it takes no part
    assert [held_score(trial, s) for s in (100, 149, 150, 200, 201, 10_000)] == [94.0, 94.0, 94.3, 94.4, 94.5, 94.5]
    cached = _finished({}, 93.0)  # its fit came from the stage cache: it reported nothing
    assert [held_score(cached, s) for s in (0, 100, 10_000)] == [93.0, 93.0, 93.0]


@pytest.mark.parametrize("seed", range(6))
def test_while_every_finished_trial_has_a_score_at_the_step_it_agrees_with_optunas(seed):
    """With finished trials that reported at every step the held pruner is Optuna's percentile
    pruner: the same decisions for random curves, percentiles, warm-ups, intervals and counts."""
    rng = np.random.default_rng(seed)
    steps = list(range(0, 300, 10))
    finished = [_finished({s: float(v) for s, v in zip(steps, rng.normal(90, 2, len(steps)))}, float(rng.normal(90, 2)))
                for _ in range(int(rng.integers(1, 7)))]  # fmt: skip
    percentile = float(rng.choice([10.0, 25.0, 50.0, 75.0, 90.0]))
    settings = {"n_startup_trials": int(rng.integers(0, 4)), "n_warmup_steps": int(rng.choice([0, 50, 100])),
                "interval_steps": int(rng.choice([1, 10, 30])), "n_min_trials": int(rng.integers(1, 4))}  # fmt: skip
    for _ in range(5):
        curve = {s: float(v) for s, v in zip(steps, rng.normal(90, 2, len(steps)))}
        ours = _decisions(_study(HeldPercentilePruner(percentile, **settings), finished), curve)
        theirs = _decisions(_study(optuna.pruners.PercentilePruner(percentile, **settings), finished), curve)
        assert ours == theirs


def test_the_shipped_median_and_percentile_kinds_hold_finished_scores():
    assert isinstance(search.build_pruner({"kind": "median", "n_warmup_steps": 100}), HeldMedianPruner)
    assert isinstance(search.build_pruner({"kind": "percentile", "percentile": 25.0}), HeldPercentilePruner)
    with pytest.raises(search.SweeperSettingError, match=r"pruner \(percentile\): percentile=120"):
        search.build_pruner({"kind": "percentile", "percentile": 120.0})
    with pytest.raises(search.SweeperSettingError, match=r"pruner \(median\): interval_steps=0"):
        search.build_pruner({"kind": "median", "interval_steps": 0})

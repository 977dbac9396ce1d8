"""A percentile pruner for training runs that stop when they converge.

Optuna's median and percentile pruners compare a trial's dev score at iteration ``s`` with the
finished trials' scores *at the same iteration*. An L-BFGS trial stops when it converges, so a
setting that converges after 200 iterations has no score at iteration 600: a slow trial (weak
regularisation, often 1,500 iterations) is compared with the few other slow ones, or with none,
and is never pruned, however far behind it is. Here a finished trial keeps its last score after
its last iteration (its final dev score, what the sweep will rank it by), so every finished trial
takes part in the comparison at every iteration. Before a finished trial's first report it takes
no part, as in Optuna; a finished trial that reported nothing (its fit came from the stage cache)
takes part with its final score throughout.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


def held_score(trial: FrozenTrial, step: int) -> float | None:
    """A finished trial's dev score at iteration ``step``: its report at the last iteration up to
    ``step``; after its last report, its final value (the score of the model it ended with);
    None before its first report; its final value throughout if it reported nothing."""
    steps = sorted(trial.intermediate_values)
    if not steps:  # a fit from the cache: no training, so no reports
        return None if trial.value is None else float(trial.value)
    if step < steps[0]:
        return None
    if step > steps[-1] and trial.value is not None:
        return float(trial.value)
    return float(trial.intermediate_values[steps[bisect.bisect_right(steps, step) - 1]])


class HeldPercentilePruner(BasePruner):
    """Keep the trials in the best ``percentile`` percent (50: the better half, 25: the best
    quarter): prune a trial whose best dev score so far falls below that share of the finished
    trials' scores at its iteration, each finished trial held at its final score after it stopped
    (see the module docstring). The other arguments mean what they mean for :class:`optuna.pruners.PercentilePruner`:
    no pruning before ``n_startup_trials`` trials finished, before iteration ``n_warmup_steps``,
    more often than every ``interval_steps`` iterations, or with fewer than ``n_min_trials``
    finished trials to compare."""

    def __init__(
        self,
        percentile: float = 50.0,
        n_startup_trials: int = 5,
        n_warmup_steps: int = 0,
        interval_steps: int = 1,
        *,
        n_min_trials: int = 1,
    ) -> None:
        if not 0.0 <= percentile <= 100.0:
            raise ValueError(f"percentile={percentile!r}: between 0 and 100")
        for name, value, least in (("n_startup_trials", n_startup_trials, 0), ("n_warmup_steps", n_warmup_steps, 0),
                                   ("interval_steps", interval_steps, 1), ("n_min_trials", n_min_trials, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r}: a whole number, at least {least}")
        self.percentile = float(percentile)
        self.n_startup_trials, self.n_warmup_steps = n_startup_trials, n_warmup_steps
        self.interval_steps, self.n_min_trials = interval_steps, n_min_trials

    def _due(self, trial: FrozenTrial, step: int) -> bool:
        """Whether ``step`` is the first report in a new pruning interval (after the warm-up)."""
        if step < self.n_warmup_steps:
            return False
        earlier = [s for s in trial.intermediate_values if s < step]
        if not earlier or max(earlier) < self.n_warmup_steps:
            return True
        interval = (step - self.n_warmup_steps) // self.interval_steps
        return (max(earlier) - self.n_warmup_steps) // self.interval_steps < interval

    def prune(self, study: optuna.study.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if step is None or not finished or len(finished) < self.n_startup_trials or not self._due(trial, step):
            return False
        maximize = study.direction == StudyDirection.MAXIMIZE
        own = np.asarray(list(trial.intermediate_values.values()), dtype=float)
        if np.all(np.isnan(own)):
            return True
        best = float(np.nanmax(own) if maximize else np.nanmin(own))
        others = [v for v in (held_score(t, step) for t in finished) if v is not None and not math.isnan(v)]
        if len(others) < self.n_min_trials:
            return False
        bar = float(np.percentile(others, 100.0 - self.percentile if maximize else self.percentile))
        return best < bar if maximize else best > bar


class HeldMedianPruner(HeldPercentilePruner):
    """:class:`HeldPercentilePruner` at the median: prune a trial in the worse half."""

    def __init__(
        self, n_startup_trials: int = 5, n_warmup_steps: int = 0, interval_steps: int = 1, *, n_min_trials: int = 1
    ) -> None:
        super().__init__(50.0, n_startup_trials, n_warmup_steps, interval_steps, n_min_trials=n_min_trials)

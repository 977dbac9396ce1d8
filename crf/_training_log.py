"""The per-iteration log of a fit, with python-crfsuite's names (``CRF.training_log_``)."""

from __future__ import annotations

import numpy as np


class TrainingLog(list):
    """Per-iteration records (dicts), with CRFsuite's fields where the algorithm reports them:
    ``num``, ``loss``, ``feature_norm``, ``error_norm`` (gradient norm, lbfgs), ``active_features``,
    ``time`` (seconds of this iteration); plus ``iteration``, ``gradient_norm`` and ``elapsed``
    (seconds since the start). ``iterations`` and ``last_iteration`` are python-crfsuite's
    ``TrainLogParser`` names."""

    @property
    def iterations(self) -> list[dict]:
        return list(self)

    @property
    def last_iteration(self) -> dict | None:
        return self[-1] if self else None


def training_log(history) -> TrainingLog:
    """A :class:`TrainingLog` from a list of :class:`crf.IterationInfo`."""
    log, previous = TrainingLog(), 0.0
    for info in history:
        row = {
            "num": info.iteration,
            "iteration": info.iteration,
            "loss": info.loss,
            "feature_norm": info.feature_norm,
            "active_features": info.active_features,
            "time": info.elapsed - previous,
            "elapsed": info.elapsed,
            "gradient_norm": info.gradient_norm,
        }
        if np.isfinite(info.gradient_norm):
            row["error_norm"] = info.gradient_norm
        log.append(row)
        previous = info.elapsed
    return log

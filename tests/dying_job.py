"""A sweep job for a joblib (loky) worker process that imports nothing heavy.

A loky worker is a fresh interpreter that imports the module of the function it runs: a job defined in a
test module would make every worker (and each one started again after a death) import that module's
MLflow, Hydra and Optuna first, seconds per worker, for a job that only returns or dies.
"""

from __future__ import annotations

import os
import signal


def job(overrides: list[str], killed_if: str) -> float:
    """A trial's job: 1.0, except that the job whose overrides hold ``killed_if`` kills its worker process
    (SIGKILL, as the out-of-memory killer would)."""
    if killed_if in overrides:
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0

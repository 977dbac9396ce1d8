"""``hydra/sweeper=grid`` (the default): Hydra's basic sweeper (every combination of the listed
values, in batches), except for how a broken worker pool ends the sweep.

When a job's worker process dies (killed by SIGTERM as it started, before its job could end its
run; the out-of-memory killer; a crash), the launcher (joblib's) raises ``TerminatedWorkerError``
and Hydra printed its 40-line traceback, with advice about segmentation faults. Here the sweep ends
in one line saying what happened (exit code 1); the sweep callback's exit handler then ends the
runs of jobs whose process is gone and the sweep's parent run, with the summary of the jobs that
finished.
"""

from __future__ import annotations

import logging
import sys
from concurrent.futures import BrokenExecutor
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

log = logging.getLogger(__name__)


class GridSweeper(BasicSweeper):
    """Hydra's :class:`BasicSweeper` (same settings: ``max_batch_size``, ``params``); see the module docstring."""

    def sweep(self, arguments: list[str]) -> Any:
        from pipeline.sweeps.sigterm import SWEEP_STOPPING, worker_exit

        try:
            return super().sweep(arguments)
        except BrokenExecutor as error:
            if SWEEP_STOPPING.is_set():  # the sweep is being stopped: its workers go with it, as asked
                log.error("stopped by SIGTERM: the jobs' worker processes ended with it (%s)", worker_exit(error))
            else:
                log.error(
                    "a job's worker process died (%s; a kill, e.g. by the out-of-memory killer, or a crash): the sweep stops; "
                    "if it is memory, lower hydra.launcher.n_jobs or the training data",
                    worker_exit(error),
                )
            sys.exit(1)

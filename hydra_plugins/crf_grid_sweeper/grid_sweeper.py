"""``hydra/sweeper=grid`` (the default): Hydra's basic sweeper (every combination of the listed
values, in batches), except for how a broken worker pool ends the sweep.

When a job's worker process dies (killed by SIGTERM as it started, before its job could end its
run; the out-of-memory killer; a crash), the launcher (joblib's) raises ``TerminatedWorkerError``
and Hydra printed its 40-line traceback, with advice about segmentation faults. Here the sweep ends
in one line saying what happened (exit code 1); the sweep callback's exit handler then ends the
runs of jobs whose process is gone and the sweep's parent run, with the summary of the jobs that
finished. A job that fails with one of the errors a single run reports in one line (a data
file's checksum or a bad line in it) ends the sweep with that line and exit status 2, as it ends a
single run, after the other jobs of its batch (Hydra names the job's overrides first).

The basic sweeper does the work: it is wrapped, not subclassed, because Hydra's plugin discovery
may execute its module again, and a subclass of the first class object would then fail in the
second one's ``__init__``.
"""

from __future__ import annotations

import logging
import sys
from concurrent.futures import BrokenExecutor
from typing import Any

from hydra.plugins.sweeper import Sweeper

log = logging.getLogger(__name__)


class SweepStopped(Exception):
    """The sweep was signalled (SIGTERM) before a batch of its jobs started: none of them is launched."""


class StopAwareLauncher:
    """A launcher that starts no batch once the sweep is being stopped (raises :class:`SweepStopped`,
    whose line :meth:`GridSweeper.sweep` writes); everything else is the wrapped launcher's."""

    def __init__(self, launcher: Any) -> None:
        self.launcher = launcher

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        from pipeline.sweeps.sigterm import SWEEP_STOPPING

        if SWEEP_STOPPING.is_set():
            raise SweepStopped(f"jobs #{initial_job_idx} to #{initial_job_idx + len(job_overrides) - 1}")
        return self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.launcher, name)


class GridSweeper(Sweeper):
    """Hydra's ``BasicSweeper`` with the same settings (see the module docstring).

    Parameters
    ----------
    max_batch_size : int or None
        Jobs launched at a time (None: all of them).
    params : dict of str to str, or None
        Swept values by key, as on the command line.
    """

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the class the module now holds

        self.grid = BasicSweeper(max_batch_size=max_batch_size, params=params)

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.grid.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.grid.launcher = StopAwareLauncher(self.grid.launcher)

    def sweep(self, arguments: list[str]) -> Any:
        from pipeline.engine.validate import ONE_LINE_ERRORS
        from pipeline.sweeps.sigterm import STOPPED_EXIT, SWEEP_STOPPING, worker_exit

        try:
            return self.grid.sweep(arguments)
        except SweepStopped as stopped:
            log.error("stopped by SIGTERM before %s started: they were not launched", stopped)
            sys.exit(STOPPED_EXIT)
        except ONE_LINE_ERRORS as error:  # a job's own one-line error (a data file's checksum, a bad line): as a single run ends
            log.error("%s", error)
            sys.exit(2)
        except BrokenExecutor as error:
            if SWEEP_STOPPING.is_set():  # the sweep is being stopped: its workers go with it, as asked
                log.error("stopped by SIGTERM: the jobs' worker processes ended with it (%s)", worker_exit(error))
                sys.exit(STOPPED_EXIT)
            log.error(
                "a job's worker process died (%s; a kill, e.g. by the out-of-memory killer, or a crash): the sweep stops; "
                "if it is memory, lower hydra.launcher.n_jobs or the training data",
                worker_exit(error),
            )
            sys.exit(1)
        except Exception as error:
            if SWEEP_STOPPING.is_set():  # joblib's own errors as its workers go (its executor shut down): no traceback
                first = str(error).splitlines()[0] if str(error) else ""
                log.error("stopped by SIGTERM: the launcher ended with it (%s: %s)", type(error).__name__, first[:200])
                sys.exit(STOPPED_EXIT)
            raise

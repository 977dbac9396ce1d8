"""SIGTERM to a sweep's launching process: wait for the jobs, then pass the signal on, then stop.

Stopping the launching process at once would have joblib kill its workers while they end their
runs. So, from :meth:`SweepSigterm.install` (the sweep's start) to :meth:`SweepSigterm.release`
(its end):

1. the first SIGTERM sets :data:`SWEEP_STOPPING` (a sweeper launches no further job) and waits
   :data:`SIGTERM_GRACE_SECONDS`: signalled with the process group (``kill -TERM -- -<pgid>``),
   the jobs end their runs and exit meanwhile, and the launcher fails as they do;
2. if the sweep is still there (this process was signalled alone), the signal goes to this
   process's descendants (the joblib workers end their runs and exit) and another grace period
   starts;
3. if it is still there after that, the signal goes to the main thread (``pthread_kill``: a
   signal to the process may reach another thread, and a main thread blocked in a system call
   would not see it), where it stops the sweep as Ctrl-C does (``KeyboardInterrupt``).

A second SIGTERM stops it at once (step 3). Nothing happens after :meth:`SweepSigterm.release`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

import psutil

log = logging.getLogger(__name__)

SIGTERM_GRACE_SECONDS = 10.0  # how long a signalled sweep waits for its jobs before each next step
SWEEP_STOPPING = threading.Event()  # set on SIGTERM: a sweeper launches no further job


def descendants(pid: int) -> list[int]:
    """The processes started by ``pid``, their children and so on (the sweep's joblib workers)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


class SweepSigterm:
    """The SIGTERM handler of a sweep's launching process (see the module docstring).

    Parameters
    ----------
    sweep_id : str
        The sweep's id, for the log.
    """

    def __init__(self, sweep_id: str) -> None:
        self.sweep_id = sweep_id
        self.previous: Callable | int | None = None  # the handler before install(), put back by release()
        self.timer: threading.Timer | None = None  # the next step, once signalled
        self.released = False  # after release(): a timer that fires does nothing

    def install(self) -> None:
        """Handle SIGTERM from now on (in the main thread only: elsewhere handlers cannot be set)."""
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.previous = signal.SIG_DFL if previous is None else previous  # None: not set from Python

    def _on_sigterm(self, signum: int, frame) -> None:
        if self.timer is None:  # the first: the jobs, signalled too, end their runs and exit
            log.warning(
                "[sweep %s] SIGTERM: waiting up to %g s for the jobs to end their runs", self.sweep_id, SIGTERM_GRACE_SECONDS
            )
            SWEEP_STOPPING.set()
            self._later(self._pass_on, signum)
            return
        # a second SIGTERM, or the jobs did not end in time (see _pass_on): stop as Ctrl-C does
        raise KeyboardInterrupt("terminated by SIGTERM")

    def _later(self, action: Callable[[int], None], signum: int) -> None:
        self.timer = threading.Timer(SIGTERM_GRACE_SECONDS, action, (signum,))
        self.timer.daemon = True
        self.timer.start()

    def _pass_on(self, signum: int) -> None:
        """Step 2: the signal to this process's descendants, then step 3 after another grace period."""
        if self.released:
            return
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signum)
            except OSError:
                pass  # gone meanwhile
        self._later(self._stop, signum)

    def _stop(self, signum: int) -> None:
        """Step 3: the signal to the main thread, whose handler stops the sweep."""
        if not self.released:
            signal.pthread_kill(threading.main_thread().ident, signum)

    def pause(self) -> None:
        """Cancel a pending step: the sweep is ending on its own (a SIGTERM from now on starts at step 1)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def release(self) -> None:
        """Cancel a pending step and give SIGTERM back its handler from before :meth:`install`."""
        self.released = True
        if self.timer is not None:
            self.timer.cancel()
        if self.previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

"""SIGTERM to a sweep's launching process: pass it on to the jobs, then stop.

Stopping the launching process at once would have joblib kill its workers while they end their
runs. So, from :meth:`SweepSigterm.install` (the sweep's start) to :meth:`SweepSigterm.release`
(its end), the first SIGTERM

1. sets :data:`SWEEP_STOPPING` (a sweeper launches no further job: each checks it just before a
   launch) and sends the signal on to this process's descendants (the joblib workers end their runs
   and exit; signalled with the process group, ``kill -TERM -- -<pgid>``, they already had it: a
   worker acts on its first signal only), and, until step 2, to any descendant that starts later (a
   job whose launch was under way as the signal came); the launcher fails as its jobs do;
2. if the sweep is still there :data:`SIGTERM_GRACE_SECONDS` later, a
   :class:`pipeline.tracking.lifecycle.Stopper` sends SIGTERM again to the main thread, which stops
   the sweep as Ctrl-C does (``KeyboardInterrupt``).

A second SIGTERM stops it at once (step 2). Nothing happens after :meth:`SweepSigterm.release`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable

import psutil

from pipeline.tracking.lifecycle import Stopper

log = logging.getLogger(__name__)

SIGTERM_GRACE_SECONDS = 10.0  # how long a signalled sweep waits for its jobs before it stops
STOPPED_EXIT = 128 + signal.SIGTERM  # the exit status of a sweep stopped by SIGTERM, whichever way it ends (as a single run's)
SWEEP_STOPPING = threading.Event()  # set on SIGTERM: a sweeper launches no further job


def descendants(pid: int) -> list[int]:
    """The processes started by ``pid``, their children and so on (the sweep's joblib workers)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def worker_exit(error: BaseException) -> str:
    """How a launcher's worker process ended, from joblib's ``TerminatedWorkerError`` (which names
    the exit codes: ``exit codes {SIGTERM(-15)}``), in one line; else the error's own first words."""
    codes = re.search(r"exit codes of the workers are (\{[^}]*\})", str(error))
    return f"exit codes {codes.group(1)}" if codes else " ".join(str(error).split())[:200] or type(error).__name__


PASS_ON_SECONDS = 0.2  # how often a signalled sweep looks for descendants that started after the signal


def _pass_on(signum: int, signalled: set[int]) -> set[int]:
    """Send ``signum`` to this process's descendants not in ``signalled``; ``signalled`` with them."""
    for pid in descendants(os.getpid()):
        if pid in signalled:
            continue
        signalled.add(pid)
        try:
            os.kill(pid, signum)
        except OSError:
            pass  # gone meanwhile
    return signalled


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
        self.stopper: Stopper | None = None  # step 2, once signalled

    def install(self) -> None:
        """Handle SIGTERM from now on (in the main thread only: elsewhere handlers cannot be set)."""
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.previous = signal.SIG_DFL if previous is None else previous  # None: not set from Python

    def _on_sigterm(self, signum: int, frame) -> None:
        if self.stopper is not None:  # a second SIGTERM, or the stopper's: stop as Ctrl-C does
            raise KeyboardInterrupt("terminated by SIGTERM")
        log.warning("[sweep %s] SIGTERM: passed on to the jobs; stopping in %g s", self.sweep_id, SIGTERM_GRACE_SECONDS)
        SWEEP_STOPPING.set()
        self.stopper = Stopper(signum, SIGTERM_GRACE_SECONDS)  # then sends SIGTERM again
        signalled = _pass_on(signum, set())
        stopper = self.stopper
        later = threading.Thread(target=self._pass_on_later, args=(signum, signalled, stopper), name="pass-on", daemon=True)
        later.start()

    def _pass_on_later(self, signum: int, signalled: set[int], stopper: Stopper) -> None:
        """Step 1 for the descendants that start after the signal, until step 2 or a pause."""
        while self.stopper is stopper and stopper.is_alive():  # the stopper ends at step 2
            time.sleep(PASS_ON_SECONDS)
            if self.stopper is stopper:
                _pass_on(signum, signalled)

    def pause(self) -> None:
        """Cancel step 2: the sweep is ending on its own (a SIGTERM from now on starts at step 1)."""
        if self.stopper is not None:
            self.stopper.cancel()
            self.stopper = None

    def release(self) -> None:
        """Cancel step 2 and give SIGTERM back its handler from before :meth:`install`."""
        self.pause()
        if self.previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

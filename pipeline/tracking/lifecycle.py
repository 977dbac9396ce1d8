"""Tracking never loses or strands a run: the store's schema under a lock, signals, dead owners.

- :func:`prepare_store`: a SQLite store's schema is created under an exclusive lock
  (``filelock`` on ``<db>.lock`` beside the database), so runs started together on a fresh
  store do not both try to create its tables;
- :func:`owner_tags`: every run records its process (``crf.owner = <pid>@<host>``) and that
  process's start time (``crf.process_start``, to tell a reused PID from the original process);
- :func:`mark_stranded`: runs left RUNNING by a process that is gone (same host; PID not running,
  or running with another start time) are ended FAILED with ``crf.end_reason = process <pid>@<host>
  died``; called on every start of a pipeline (``tracking.setup``);
- :func:`ending_runs_on_signal`: SIGTERM/SIGINT end this process's open runs as KILLED with
  ``crf.end_reason = terminated by SIGTERM`` (or SIGINT), then the process exits with 128 + signal;
  a signal that lands in a local store's call waits until the call returns, and a process that has
  not ended 30 s after it (or 5 s after its runs were ended, where a worker caught the exit) exits
  at once.

SIGKILL cannot be caught: its runs stay RUNNING until the next start marks them.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import mlflow
import psutil
from filelock import FileLock
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from pipeline.engine.cache import process_alive

log = logging.getLogger(__name__)

OWNER_TAG = "crf.owner"
PROCESS_START_TAG = "crf.process_start"
END_REASON_TAG = "crf.end_reason"
UNKNOWN = "unknown"


_SQLITE_URI = re.compile(r"^sqlite(\+[a-z0-9_]+)?:///(?:file:)?([^?]+)")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite URI, however SQLAlchemy may spell it (``sqlite:///``, a driver
    as in ``sqlite+pysqlite:///``, a ``file:`` filename, a query such as ``?timeout=20``); None for
    other stores and for an in-memory database."""
    found = _SQLITE_URI.match(uri)
    return Path(found.group(2)) if found and found.group(2) != ":memory:" else None


@contextmanager
def store_lock(database: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<database>.lock`` (created beside the database; an ``flock`` on Unix)."""
    with FileLock(database.with_name(database.name + ".lock")):
        yield


def prepare_store(uri: str) -> None:
    """For a SQLite store, create its schema (MLflow does on first use) under :func:`store_lock`;
    other stores are left to their server or database."""
    database = sqlite_path(uri)
    if database is None:
        return
    with store_lock(database):
        MlflowClient(uri).search_experiments(max_results=1)  # opening the store creates its tables


START_TOLERANCE = 2.0  # seconds between two readings of one process's start time (see owner_gone)


def process_start(pid: int) -> str:
    """When process ``pid`` started, in seconds since the epoch to 1/100 s (the resolution the
    system keeps; the same text in every process that asks); ``unknown`` where that cannot be read."""
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except (psutil.Error, OSError):
        return UNKNOWN


def owner_tags() -> dict[str, str]:
    """The tags that tie a run to this process: ``crf.owner`` and ``crf.process_start``."""
    return {OWNER_TAG: f"{os.getpid()}@{socket.gethostname()}", PROCESS_START_TAG: process_start(os.getpid())}


def owner_gone(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's owner tags is known to be gone: it ran on this host and
    its PID no longer runs, or now belongs to a process started at another time."""
    owner = tags.get(OWNER_TAG, "")
    pid, _, host = owner.partition("@")
    if not pid.isdigit() or host != socket.gethostname():
        return False  # no owner recorded, or another host's process: cannot tell
    if not process_alive(int(pid)):
        return True
    recorded, current = tags.get(PROCESS_START_TAG, UNKNOWN), process_start(int(pid))
    if "." not in recorded or current == UNKNOWN:  # unknown, or clock ticks after boot (earlier versions): cannot tell
        return False
    return not same_start(recorded, current)


def same_start(first: str, second: str) -> bool:
    """Whether two readings of :func:`process_start` are of one process. The system derives a start
    time from its boot time, which moves when the clock is adjusted, so one process can read a
    second apart; a PID reused within :data:`START_TOLERANCE` seconds is far less likely."""
    try:
        return abs(float(first) - float(second)) <= START_TOLERANCE
    except ValueError:  # unknown
        return first == second


def mark_stranded(client: MlflowClient) -> list[str]:
    """End FAILED every RUNNING run (of any experiment) whose owner process is gone, tagging
    ``crf.end_reason = process <pid>@<host> died``; the run IDs so ended."""
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    host = socket.gethostname()
    running = client.search_runs(
        experiments,
        filter_string=f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` LIKE '%@{host}'",
        run_view_type=ViewType.ALL,
        max_results=10000,
    )
    ended = []
    for run in running:
        if owner_gone(run.data.tags):
            if client.get_run(run.info.run_id).info.status != "RUNNING":
                continue  # its process ended it (FINISHED, KILLED) after the search, then exited: not stranded
            reason = f"process {run.data.tags[OWNER_TAG]} died"
            client.set_tag(run.info.run_id, END_REASON_TAG, reason)
            client.set_terminated(run.info.run_id, "FAILED")
            ended.append(run.info.run_id)
            log.warning("run %s (%s) was left RUNNING: %s; marked FAILED", run.info.run_id, run.info.run_name, reason)
    return ended


def _own_running_runs(client: MlflowClient) -> list[str]:
    """This process's RUNNING runs in the store (by their owner tags)."""
    tags = owner_tags()
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    if not experiments:
        return []
    runs = client.search_runs(
        experiments,
        filter_string=f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` = '{tags[OWNER_TAG]}'",
        run_view_type=ViewType.ALL,
        max_results=10000,
    )
    return [r.info.run_id for r in runs if same_start(r.data.tags.get(PROCESS_START_TAG, UNKNOWN), tags[PROCESS_START_TAG])]


def _active_run_ids() -> list[str]:
    """The fluent API's open runs of this thread, innermost last (MLflow keeps them in a private
    stack; only the innermost one when that is not there)."""
    stack = getattr(mlflow.tracking.fluent, "_active_run_stack", None)
    runs = stack.get() if stack is not None and hasattr(stack, "get") else [mlflow.active_run()]
    return [r.info.run_id for r in runs if r is not None]


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM or SIGINT arrives, so that open ``with`` blocks
    unwind (temporary cache folders go) before the runs are marked KILLED."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum

    def __reduce__(self) -> tuple:  # pickled with its own argument (a job's error crosses to the sweep's process)
        return type(self), (self.signum,)


def _mark_killed(run_ids: list[str], reason: str) -> None:
    """End ``run_ids`` and this process's other RUNNING runs as KILLED with ``reason``."""
    try:
        client = MlflowClient()
        for run_id in dict.fromkeys(run_ids + _own_running_runs(client)):
            client.set_tag(run_id, END_REASON_TAG, reason)
            client.set_terminated(run_id, "KILLED")
            log.warning("run %s ended KILLED: %s", run_id, reason)
    except Exception as error:  # the store itself may be what failed; the next start marks them
        log.error("could not mark the runs of this process KILLED (%s); the next run will mark them FAILED", error)


def error_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from or during, each once."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _terminated_in(error: BaseException | None) -> Terminated | None:
    """The :class:`Terminated` that ``error`` is, or that it was raised while handling."""
    return next((e for e in error_chain(error) if isinstance(e, Terminated)), None)


# A signal is never raised inside a local store's code: there it could leave an SQLite transaction
# half done, whose lock then makes the writes that end the runs wait out the store's busy timeout
# and fail. Remote stores (MLflow's REST client, artifact uploads) hold no such lock.
STORE_MODULES = ("sqlalchemy.", "sqlite3", "mlflow.store.", "optuna.storages.")
REMOTE_STORE_MODULES = ("mlflow.store.tracking.rest_store", "mlflow.store.model_registry.rest_store", "mlflow.store.artifact.")
# the import system: a signal raised there is ignored when it runs as a weakref callback (a module
# lock's), or leaves a module half imported; the handler waits for the stopper's resend instead
IMPORT_MODULES = ("importlib._bootstrap", "_frozen_importlib")
RESEND_SECONDS = 0.05  # how often a signal that waits is sent again to the main thread
# a process still running this long after the first signal exits at once (a store call that does not
# return, code that catches the exception): its runs stay RUNNING until the next start marks them
EXIT_GRACE_SECONDS = 30.0
# once the runs are ended, the exit (SystemExit) may be caught as well: a joblib (loky) worker
# reports it as the job's result and waits for the next job; the process gets this long to end
EXIT_AFTER_ENDING_SECONDS = 5.0

_stopped_by: list[int] = []  # the signal a block of this process ended on


def exit_now(signum: int, message: str) -> NoReturn:
    """Log ``message`` and exit with ``128 + signum`` at once (no unwinding, no exit handlers)."""
    log.error("%s", message)
    logging.shutdown()
    os._exit(128 + signum)


class Stopper(threading.Thread):
    """The helper thread of a signalled process (the sweep's launcher uses it too).

    Every :data:`RESEND_SECONDS` it sends ``signum`` again to the main thread while ``waiting()``
    is true (a signal sent to the process may land on another thread, and a main thread blocked in
    a system call would not see it), and once ``seconds`` have passed it calls ``at_deadline()``
    (by default: sends the signal once more) and ends. After :meth:`cancel` returns it sends and
    calls nothing.

    Parameters
    ----------
    signum : int
        The signal to send again.
    seconds : float
        Seconds from now to the deadline.
    at_deadline : callable, optional
        Called (in this thread) at the deadline, unless cancelled; by default :meth:`resend`.
    waiting : callable, optional
        Whether the signal still waits to be acted on; never, by default.
    """

    def __init__(
        self,
        signum: int,
        seconds: float,
        at_deadline: Callable[[], None] | None = None,
        waiting: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(name=f"stopper-{signal.Signals(signum).name}", daemon=True)
        self.signum, self.at_deadline, self.waiting = signum, at_deadline or self.resend, waiting
        self.deadline = time.monotonic() + seconds
        self.cancelled = False
        self._lock = threading.Lock()
        self.start()

    def resend(self) -> None:
        """Send the signal to the main thread."""
        signal.pthread_kill(threading.main_thread().ident, self.signum)

    def run(self) -> None:
        while True:
            time.sleep(RESEND_SECONDS)
            with self._lock:
                if self.cancelled:
                    return
                if time.monotonic() >= self.deadline:
                    self.at_deadline()
                    return
                if self.waiting():
                    self.resend()

    def cancel(self) -> None:
        """Stop: once this returns, nothing more is sent or called."""
        with self._lock:
            self.cancelled = True


def _exit_later(signum: int, seconds: float, after: str, waiting: Callable[[], bool] = lambda: False) -> Stopper:
    """A :class:`Stopper` that exits the process ``seconds`` from now (``after`` says since what)."""
    message = f"still running {seconds:.0f} s after {after}: exiting now"
    return Stopper(signum, seconds, lambda: exit_now(signum, message), waiting)


def _inside_store_call(frame: FrameType | None, quiet: tuple = ()) -> bool:
    """Whether ``frame`` (the main thread's, where a signal arrived) or a caller of it runs code of
    a local store (SQLAlchemy, sqlite3, MLflow's database and file stores, Optuna's storages), of
    the import system (:data:`IMPORT_MODULES`), or one of the code objects ``quiet``."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code in quiet or name.startswith(IMPORT_MODULES):
            return True
        if name.startswith(STORE_MODULES) and not name.startswith(REMOTE_STORE_MODULES):
            return True
        frame = frame.f_back
    return False


class _EndingRunsOnSignal:
    """The context manager of :func:`ending_runs_on_signal`.

    State: ``signum``, the first signal that arrived (it decides how the process ends; later ones,
    and the stopper's resends, only make the handler decide again); ``armed``, true while the body
    runs, the only time the handler raises."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.signals = signals
        self.active = threading.current_thread() is threading.main_thread()  # else handlers cannot be set
        self.previous: dict[int, Any] = {}
        self.signum: int | None = None
        self.armed = False
        self.stopper: Stopper | None = None
        self.open_runs: list[str] = []
        self.quiet = (type(self).__enter__.__code__, type(self).__exit__.__code__)  # they act on a signal themselves

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            self.stopper = _exit_later(signum, EXIT_GRACE_SECONDS, signal.Signals(signum).name, waiting=lambda: self.armed)
        if self.armed and not _inside_store_call(frame, self.quiet):
            self.armed = False
            self.open_runs = _active_run_ids()  # before the unwinding ends them FAILED
            raise Terminated(self.signum)
        # else it waits: the stopper sends it again while the body runs; __exit__ acts on it

    def __enter__(self) -> None:
        if not self.active:
            return
        if _stopped_by:  # a worker whose last job ended on a signal is given another (joblib's do)
            name = signal.Signals(_stopped_by[0]).name
            exit_now(_stopped_by[0], f"this process was stopped by {name}: it runs no further jobs")
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self._handle)
        self.armed = True  # one that came meanwhile is sent again by the stopper

    def __exit__(self, kind: type | None, error: BaseException | None, trace: Any) -> bool:
        self.armed = False  # from here a signal is only recorded: this method acts on it
        if not self.active:
            return False
        try:
            stop = _terminated_in(error)
            if stop is None and self.signum is not None and error is not None:
                log.error("%s: %s (while %s waited)", type(error).__name__, error, signal.Signals(self.signum).name)
            if stop is not None or self.signum is not None:
                self._end(stop.signum if stop is not None else self.signum)
        finally:
            for sig, old in self.previous.items():
                signal.signal(sig, old)
        if self.signum is not None:  # came as the handlers were being put back: theirs to handle
            if self.stopper is not None:
                self.stopper.cancel()
            signal.raise_signal(self.signum)
        return False  # the block's own outcome

    def _end(self, signum: int) -> NoReturn:
        """End this process's runs KILLED and exit with ``128 + signum``."""
        name = signal.Signals(signum).name
        _stopped_by.append(signum)
        _mark_killed(self.open_runs + _active_run_ids(), f"terminated by {name}")
        if self.stopper is not None:
            self.stopper.cancel()
        self.stopper = _exit_later(signum, EXIT_AFTER_ENDING_SECONDS, f"its runs were ended on {name} (the exit was caught)")
        raise SystemExit(128 + signum) from None


def ending_runs_on_signal(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> _EndingRunsOnSignal:
    """A context manager: within the block, SIGTERM/SIGINT unwind the block (``Terminated``), then
    every open run of this process (stage and parent) ends KILLED with ``crf.end_reason`` and the
    process exits with ``128 + signum``.

    A signal that arrives while a local store's code runs waits until that call returns (the
    :class:`Stopper` sends it again every 50 ms); one still waiting when the block ends, or arriving
    as it starts or ends, ends the process there. A process still there :data:`EXIT_GRACE_SECONDS`
    after the signal, or :data:`EXIT_AFTER_ENDING_SECONDS` after its runs were ended (a joblib worker
    catches the SystemExit and waits for its next job), exits at once; a process whose job ended on
    a signal exits as it starts another. Outside the main thread (where handlers cannot be set) it
    does nothing."""
    return _EndingRunsOnSignal(signals)

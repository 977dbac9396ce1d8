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
  a signal waits (up to 10 s) for the local store call it lands in, and a process that has not
  ended 30 s after it (or 5 s after its runs were ended, where a worker caught the exit) exits
  at once.

SIGKILL cannot be caught: its runs stay RUNNING until the next start marks them.
"""

from __future__ import annotations

import gc
import logging
import os
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


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


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
    if "." not in recorded:  # unknown, or clock ticks after boot (recorded by earlier versions): cannot tell
        return False
    return current != UNKNOWN and recorded != current


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
    return [r.info.run_id for r in runs if r.data.tags.get(PROCESS_START_TAG) == tags[PROCESS_START_TAG]]


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


def _terminated_in(error: BaseException) -> Terminated | None:
    """The :class:`Terminated` that ``error`` is, or that it was raised while handling."""
    return next((e for e in error_chain(error) if isinstance(e, Terminated)), None)


# a signal that lands inside the tracking store's code is delivered again a moment later: raised
# there it can leave an SQLite transaction half done, whose lock then makes every write that ends
# the runs wait out the store's 20 s busy timeout and fail. Remote stores (MLflow's REST client,
# artifact uploads) hold no such lock: a signal interrupts them at once.
STORE_MODULES = ("sqlalchemy.", "sqlite3", "mlflow.store.", "optuna.storages.")
REMOTE_STORE_MODULES = ("mlflow.store.tracking.rest_store", "mlflow.store.model_registry.rest_store", "mlflow.store.artifact.")
DEFER_SECONDS = 0.05
MAX_DEFER_SECONDS = 10.0  # after the first arrival: a store call that takes longer is interrupted after all
# ...and then the interruption may be caught by the store's own retries and the process would go on
# with the signals ignored: it gets this long to end its runs and exit, then exits at once
EXIT_GRACE_SECONDS = 30.0
# once the runs are ended, the exit (SystemExit) may be caught as well: a joblib (loky) worker
# reports it as the job's result and waits for the next job; the process gets this long to end
EXIT_AFTER_ENDING_SECONDS = 5.0


_signalled: list[int] = []  # the signal that stopped a job of this process


def _exit_unless_gone(signum: int, seconds: float, what: str, then: str) -> None:
    """Exit with ``128 + signum`` now, from a watchdog thread: the process did not end within
    ``seconds`` of ``what``; ``then`` says what becomes of its runs."""
    log.error("still running %.0f s after %s: exiting now%s", seconds, what, then)
    logging.shutdown()
    os._exit(128 + signum)


def _watchdog(signum: int, seconds: float, what: str, then: str = "") -> threading.Timer:
    """A started daemon timer that calls :func:`_exit_unless_gone` after ``seconds``."""
    timer = threading.Timer(seconds, _exit_unless_gone, (signum, seconds, what, then))
    timer.daemon = True
    timer.start()
    return timer


def _store_module(name: str) -> bool:
    return name.startswith(STORE_MODULES) and not name.startswith(REMOTE_STORE_MODULES)


def _inside_store_call(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the main thread's, where a signal arrived) or a caller of it runs code
    of a local tracking store (SQLAlchemy, sqlite3, MLflow's database and file stores, Optuna's
    storages)."""
    while frame is not None:
        if _store_module(frame.f_globals.get("__name__", "")):
            return True
        frame = frame.f_back
    return False


def _drop_frames(error: BaseException) -> None:
    for link in error_chain(error):
        link.__traceback__ = None


class _Deferral:
    """At most one signal waiting to be delivered again to the main thread.

    The re-delivery goes to the main thread itself (``pthread_kill``): sent to the process, the
    kernel may hand it to another thread, and a main thread blocked in a system call would not
    see it. ``close`` cancels a re-delivery not yet sent and says which signal is still waiting
    (one sent but not yet handled counts as waiting)."""

    def __init__(self) -> None:
        self.waiting: int | None = None  # deferred, and not handled since
        self.sent = False  # the re-delivery of ``waiting`` has been sent
        self.closed = False
        self._lock = threading.Lock()  # between the timer's send and close()
        self._timer: threading.Timer | None = None
        self._main = threading.get_ident()

    def arrived(self, signum: int) -> int | None:
        """The signal a handler call stands for (the first one of a deferral decides), or None
        when a re-delivery is already on its way (the call is merged into it)."""
        if self.waiting is not None and not self.sent and not self.closed:
            return None
        first = self.waiting or signum
        self.waiting, self.sent = None, False
        return first

    def defer(self, signum: int) -> None:
        self.waiting, self.sent = signum, False
        self._timer = threading.Timer(DEFER_SECONDS, self._deliver)
        self._timer.daemon = True
        self._timer.start()

    def _deliver(self) -> None:
        with self._lock:
            if not self.closed and self.waiting is not None:
                self.sent = True
                signal.pthread_kill(self._main, self.waiting)

    def close(self) -> int | None:
        with self._lock:
            self.closed = True
            if self._timer is not None:
                self._timer.cancel()
        return self.waiting


class _Handler:
    """The signal handler of :func:`ending_runs_on_signal`.

    A signal that arrives inside a local store's code is deferred (:class:`_Deferral`) for up to
    :data:`MAX_DEFER_SECONDS` after its first arrival; one that arrives while a frame of
    ``quiet`` code runs (the block's own entry and exit) or after the deferral was closed is only
    recorded (``deferral.waiting``: the caller acts on it); otherwise ``act(signum)`` runs (it
    ends the process). The first signal decides: one arriving while the handler decides is
    dropped. ``on_first(signum)`` runs at the first arrival, deferred or not."""

    def __init__(self, act: Callable[[int], None], quiet: tuple, on_first: Callable[[int], None]) -> None:
        self.deferral = _Deferral()
        self.act, self.quiet, self.on_first = act, quiet, on_first
        self.first_arrival: float | None = None
        self.handling = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.handling:  # nested in the handling of the first signal, which decides
            return
        self.handling = True
        try:
            first = self._decide(signum, frame)
        except BaseException:
            self.handling = False
            raise
        if first is None:
            self.handling = False
            return
        self.act(first)  # ends the process: the handler stays busy

    def _decide(self, signum: int, frame: FrameType | None) -> int | None:
        """The signal to act on now, or None (merged, recorded or deferred)."""
        first = self.deferral.arrived(signum)
        if first is None:
            return None
        if self.first_arrival is None:
            self.first_arrival = time.monotonic()
            self.on_first(first)
        if self.deferral.closed or _runs_code(frame, self.quiet):
            self.deferral.waiting = first
            return None
        if time.monotonic() - self.first_arrival < MAX_DEFER_SECONDS and _inside_store_call(frame):
            self.deferral.defer(first)
            return None
        return first


def _runs_code(frame: FrameType | None, codes: tuple) -> bool:
    """Whether ``frame`` or a caller of it runs one of ``codes`` (code objects)."""
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


class _EndingRunsOnSignal:
    """The context manager of :func:`ending_runs_on_signal`."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.signals = signals
        self.active = threading.current_thread() is threading.main_thread()  # else handlers cannot be set
        self.open_runs: list[str] = []
        self.watchdogs: list[threading.Timer] = []
        self.previous: dict[int, Any] = {}
        quiet = (type(self).__enter__.__code__, type(self).__exit__.__code__)
        self.handler = _Handler(self._act, quiet, self._watch)

    def _watch(self, signum: int) -> None:
        then = "; the next run will mark this process's runs FAILED"
        self.watchdogs.append(_watchdog(signum, EXIT_GRACE_SECONDS, signal.Signals(signum).name, then))

    def _stopping(self, signum: int) -> None:
        _signalled.append(signum)
        for sig in self.signals:  # a second signal while cleaning up must not interrupt it
            signal.signal(sig, signal.SIG_IGN)
        self.open_runs.extend(_active_run_ids())

    def _act(self, signum: int) -> NoReturn:
        self._stopping(signum)
        raise Terminated(signum)

    def _end(self, signum: int, error: BaseException | None = None) -> NoReturn:
        """End this process's runs KILLED and exit with ``128 + signum``."""
        self.handler.deferral.waiting = None  # handled here
        if error is not None:
            # a signal that landed inside a store write can make the unwinding fail too (SQLite's
            # lock is held until the interrupted session is collected): drop the interrupted
            # frames before ending the runs, whatever error the unwinding ended with
            _drop_frames(error)
        del error
        gc.collect()
        name = signal.Signals(signum).name
        _mark_killed(self.open_runs, f"terminated by {name}")
        for watchdog in self.watchdogs:
            watchdog.cancel()
        _watchdog(signum, EXIT_AFTER_ENDING_SECONDS, f"its runs were ended on {name} (the exit was caught)")
        raise SystemExit(128 + signum) from None

    def __enter__(self) -> None:
        if not self.active:
            return
        if _signalled:  # a worker whose last job ended on a signal is given another (joblib's do)
            log.error("this process was stopped by %s: it runs no further jobs", signal.Signals(_signalled[0]).name)
            logging.shutdown()
            os._exit(128 + _signalled[0])
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self.handler)
        waiting = self.handler.deferral.waiting  # arrived while the handlers were being set
        if waiting is not None:
            try:
                self._stopping(waiting)
                self._end(waiting)
            finally:
                self._restore()

    def __exit__(self, kind: type | None, error: BaseException | None, trace: Any) -> bool:
        if not self.active:
            return False
        try:
            stop = None if error is None else _terminated_in(error)
            waiting = self.handler.deferral.close()
            if stop is None and waiting is None:
                return False  # the block's own outcome
            if stop is None:  # ended (or failed) while a signal waited: the signal decides how it ends
                if error is not None:
                    log.error("%s: %s (while %s waited)", type(error).__name__, error, signal.Signals(waiting).name)
                self._stopping(waiting)
            self._end(waiting if stop is None else stop.signum, error)
        finally:
            self._restore()

    def _restore(self) -> None:
        self.handler.deferral.close()
        for sig, old in self.previous.items():
            signal.signal(sig, old)
        self.previous = {}
        if self.handler.deferral.waiting is not None:  # came as the handlers were being put back: theirs to handle
            signal.pthread_kill(threading.get_ident(), self.handler.deferral.waiting)


def ending_runs_on_signal(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> _EndingRunsOnSignal:
    """A context manager: within the block, SIGTERM/SIGINT unwind the block (``Terminated``), then
    every open run of this process (stage and parent) ends KILLED with ``crf.end_reason`` and the
    process exits with ``128 + signum``. A signal that arrives while a local store's code runs is
    delivered again 50 ms later (for up to 10 s), so that no store transaction is left half done;
    one still waiting when the block ends (or arriving as it starts or ends) ends the process
    there. A process still there :data:`EXIT_GRACE_SECONDS` after the signal, or
    :data:`EXIT_AFTER_ENDING_SECONDS` after its runs were ended (a joblib worker catches the
    SystemExit and waits for its next job), exits at once; a process whose job ended on a signal
    exits as it starts another. Outside the main thread (where handlers cannot be set) it does
    nothing."""
    return _EndingRunsOnSignal(signals)

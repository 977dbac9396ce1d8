"""Fault injection on tracking, with real ``python -m pipeline`` processes on the tiny corpus: runs are
never lost or left RUNNING (two first runs on a fresh SQLite store, SIGTERM and SIGKILL during
training), and an output folder that cannot be written ends the run with one clear line."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import forkserver  # noqa: E402
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402
from pipeline_helpers import tiny_overrides, write_corpus  # noqa: E402

from pipeline.tracking import lifecycle  # noqa: E402
from pipeline.tracking.lifecycle import END_REASON_TAG, OWNER_TAG, owner_gone, owner_tags, prepare_store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # seconds for one pipeline process
# training that lasts long enough to be killed: SGD epochs whose stopping rule never fires (the
# loss-improvement rule looks back `period` epochs; delta=0 alone still stops once SGD's loss wobbles up)
ENDLESS = ["trainer=sgd", "trainer.max_iterations=1000000", "trainer.period=1000000", "train.dev_every=0"]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("tracking") / "data", n_train=40, n_test=10)


def _command(data_root: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipeline",
        *tiny_overrides(data_root, out),
        f"hydra.run.dir={out.parent / ('hydra-' + out.name)}-{time.monotonic_ns()}",
        *extra,
    ]


def _environment() -> dict[str, str]:
    # what earlier tests of the session may have left in the environment (an experiment ID of
    # another store, a sweep's parent) must not reach these processes
    left = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID")
    env = {k: v for k, v in os.environ.items() if k not in left}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack (see _output)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _start(data_root: Path, out: Path, *extra: str) -> subprocess.Popen:
    return forkserver.popen(
        _command(data_root, out, *extra),
        cwd=ROOT,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _output(process: subprocess.Popen, timeout: float = 60) -> str:
    """What ``process`` printed once it has exited; if it has not within ``timeout`` seconds, the
    test fails with that output and every thread's stack (SIGABRT: Python's fault handler)."""
    try:
        return process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            text = process.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            text = process.communicate()[0]
        pytest.fail(f"the process did not exit within {timeout} s; its output and stacks:\n{text[-20000:]}")


def _python(folder: Path, script: str, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``python -c script args`` in ``folder``, its default tracking store ``folder/mlflow.db``. The timeout only
    guards against a hang (it includes the imports); time limits count from ``_since_ready``."""
    env = {**_environment(), "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}", "TEST_READY_FILE": str(folder / "ready")}
    prepare_store(env["MLFLOW_TRACKING_URI"])  # made here (quickly): a child's time goes to what the test is about
    command = [sys.executable, "-c", script, *args]
    return forkserver.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


def _since_ready(folder: Path) -> float:
    """Seconds since a script run by ``_python`` in ``folder`` wrote its ready file (once its imports were done,
    just before it signalled itself): time limits count from there, not from the interpreter's start
    (importing MLflow alone takes seconds under load). One monotonic clock for all processes."""
    return time.monotonic() - float((folder / "ready").read_text())


def _run(data_root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return forkserver.run(
        _command(data_root, out, *extra), cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=TIMEOUT
    )


def _runs(out: Path) -> pd.DataFrame:
    """Every run in the output folder's SQLite store (all experiments)."""
    uri = f"sqlite:///{out / 'mlflow.db'}"
    prepare_store(uri)  # under the store's lock: never read a schema that is being created
    before, variable = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.search_runs(search_all_experiments=True)
    finally:
        mlflow.set_tracking_uri(before)
        if variable is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)


def _wait_for_training(process: subprocess.Popen, out: Path, timeout: float = TIMEOUT) -> None:
    """Return once the train stage's run is RUNNING in the store and its cache entry is being
    built (its temporary folder exists), then give it a moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        if (out / "mlflow.db").exists():
            runs = _runs(out)
            if (
                not runs.empty
                and "tags.stage" in runs
                and ((runs["tags.stage"] == "train") & (runs["status"] == "RUNNING")).any()
                and _temporary_folders(out)
            ):
                time.sleep(1.0)
                return
        time.sleep(0.5)
    process.kill()
    raise AssertionError("the train stage did not start in time")


def _by_stage(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {stage: group for stage, group in runs.groupby("tags.stage")}


def _temporary_folders(out: Path) -> list[Path]:
    return [p for p in (out / "cache").glob("*/.*") if p.name.startswith((".tmp-", ".old-"))]


def test_owner_tags_recognise_a_dead_process():
    tags = owner_tags()
    assert not owner_gone(tags)  # this process runs
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert owner_gone({OWNER_TAG: f"{child.pid}@{socket.gethostname()}"})
    assert owner_gone({**tags, "crf.process_start": "1.00"})  # the PID now belongs to another process
    assert not owner_gone({OWNER_TAG: f"{child.pid}@another-host"})  # another host's: cannot tell
    assert not owner_gone({})


# one process of the test below: a run that logs the shared dataset once all `n` processes are ready
LOG_DATASET_TOGETHER = """
import os, sys, time
from pathlib import Path
import mlflow
from pipeline import tracking
store, data, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
mlflow.set_tracking_uri(store)
mlflow.set_experiment("crf")
with mlflow.start_run():
    tracking.log_dataset(f"warm-{os.getpid()}", {"train": data}, {"train": "cd" * 32})  # every lazy import done
    (data.parent / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(ready := list(data.parent.glob("ready-*"))) < n:
        if time.monotonic() > deadline:
            sys.exit("the other processes never got ready")
    start = max(p.stat().st_mtime for p in ready) + 0.3  # the same moment for every process
    while time.time() < start:
        pass
    tracking.log_dataset("tiny", {"train": data}, {"train": "ab" * 32})
"""


def test_jobs_logging_the_same_dataset_at_once_are_all_recorded(tmp_path):
    # MLflow checks for the dataset, then inserts it: processes logging the same new dataset together
    # all insert and all but one failed on the store's unique key (a sweep job lost this way in CI)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(store)
    mlflow.MlflowClient(store).create_experiment("crf")
    data = tmp_path / "train.txt"
    data.write_text("A a\n")
    command = [sys.executable, "-c", LOG_DATASET_TOGETHER, store, str(data), "3"]
    processes = [
        forkserver.popen(command, cwd=ROOT, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    try:
        errors = [p.communicate(timeout=TIMEOUT)[1] for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert [p.returncode for p in processes] == [0, 0, 0], errors
    client = mlflow.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("crf").experiment_id])
    shared = [[i.dataset for i in r.inputs.dataset_inputs if i.dataset.name == "tiny"] for r in runs]
    assert len(runs) == 3 and all(len(d) == 1 for d in shared)
    assert len({d[0].digest for d in shared}) == 1


@pytest.mark.slow
def test_two_first_runs_on_a_fresh_store_are_both_recorded(data_root, tmp_path):
    out = tmp_path / "out"
    processes = [_start(data_root, out, "stages=[prepare]") for _ in range(2)]
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert not any("already exists" in text for text in outputs)
    runs = _runs(out)
    parents = runs[runs["tags.stage"] == "pipeline"]
    assert len(parents) == 2 and set(runs["status"]) == {"FINISHED"}
    assert len(runs[runs["tags.stage"] == "prepare"]) == 2


@pytest.mark.slow
def test_sigterm_during_training_ends_the_runs_killed(data_root, tmp_path):
    out = tmp_path / "out"
    process = _start(data_root, out, *ENDLESS)
    _wait_for_training(process, out)
    process.send_signal(signal.SIGTERM)
    text = _output(process)
    assert process.returncode == 128 + signal.SIGTERM, text
    runs = _by_stage(_runs(out))
    for stage in ("pipeline", "train"):
        (status,) = runs[stage]["status"]
        assert status == "KILLED", (stage, status)
        assert runs[stage][f"tags.{END_REASON_TAG}"].iloc[0] == "terminated by SIGTERM"
    assert set(runs["prepare"]["status"]) == set(runs["featurize"]["status"]) == {"FINISHED"}
    assert not _temporary_folders(out)  # the interrupted build removed its temporary folder


@pytest.mark.slow
def test_sigkill_during_training_is_marked_by_the_next_start_which_reuses_finished_stages(data_root, tmp_path):
    out = tmp_path / "out"
    process = _start(data_root, out, *ENDLESS)
    _wait_for_training(process, out)
    process.kill()
    process.communicate(timeout=60)
    stranded = _runs(out)
    stranded = stranded[stranded["status"] == "RUNNING"]
    assert set(stranded["tags.stage"]) == {"pipeline", "train"}
    assert _temporary_folders(out)  # the killed build left its temporary folder

    rerun = _run(data_root, out, "trainer=sgd", "trainer.max_iterations=3")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    runs = _runs(out).set_index("run_id")
    marked = runs.loc[stranded["run_id"]]
    assert set(marked["status"]) == {"FAILED"}
    assert set(marked[f"tags.{END_REASON_TAG}"]) == {f"process {process.pid}@{socket.gethostname()} died"}
    assert "RUNNING" not in set(runs["status"])
    assert not _temporary_folders(out)  # removed when the rerun opened the cache
    finished = runs[runs["tags.stage"].isin(["prepare", "featurize"])].sort_values("start_time")
    earlier, latest = finished.head(2), finished.tail(2)
    assert list(latest["tags.cache_key"]) == list(earlier["tags.cache_key"]), "keys changed: was the code edited meanwhile?"
    assert set(latest["tags.cache"]) == {"hit"}  # the stages finished before the kill
    assert (runs[runs["tags.stage"] == "train"]["status"] == "FINISHED").sum() == 1


def _make_unwritable(folder: Path) -> list[str]:
    """Make ``folder`` unwritable (also for root: the immutable attribute); the command undoing it."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return ["chmod", "755", str(folder)]
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root without a working chattr: cannot make a folder unwritable")
    return [chattr, "-i", str(folder)]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["folder", "store"])
def test_an_unwritable_output_folder_or_store_gives_one_clear_line(data_root, tmp_path, what):
    out = tmp_path / "out"
    out.mkdir()
    if what == "store":  # a store from an earlier run, now read-only
        assert _run(data_root, out, "stages=[prepare]").returncode == 0
    target = out if what == "folder" else out / "mlflow.db"
    undo = _make_unwritable(target)
    try:
        result = _run(data_root, out, "stages=[prepare]")
    finally:
        subprocess.run(undo, check=True)
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "Traceback" not in text and "sqlalchemy" not in text.lower(), text
    (line,) = text.strip().splitlines()
    assert "cannot write" in line and str(target) in line, text


def test_an_error_while_unwinding_a_signal_still_ends_the_runs_killed(monkeypatch):
    """A signal landing inside a store write can make the unwinding fail as well (CI once saw
    "database is locked" from the stage run's end_run): the process still ends the runs KILLED
    and exits 128 + signum instead of 1."""
    marked, armed = [], []
    monkeypatch.setattr(lifecycle, "_mark_killed", lambda runs, reason: marked.append(reason))
    monkeypatch.setattr(lifecycle, "_exit_later", lambda signum, seconds, *what: armed.append(seconds))  # not in pytest
    monkeypatch.setattr(lifecycle, "_stopped_by", [])  # this process goes on
    with pytest.raises(SystemExit) as ended:
        with lifecycle.ending_runs_on_signal():
            try:
                raise lifecycle.Terminated(signal.SIGTERM)
            finally:
                raise RuntimeError("database is locked")
    assert ended.value.code == 128 + signal.SIGTERM
    assert marked == ["terminated by SIGTERM"]
    assert armed == [lifecycle.EXIT_AFTER_ENDING_SECONDS]  # in case whatever called the block catches the exit


_SIGNAL_IN_A_STORE_CALL = """
import os, signal, sys, time
import mlflow
from pipeline.tracking.lifecycle import ending_runs_on_signal, owner_tags

mlflow.set_tracking_uri(sys.argv[1])
# a function that runs as the store's code does (its module name), and is signalled midway
store = {"__name__": "mlflow.store.tracking.fake", "os": os, "signal": signal, "time": time}
exec(
    "def call():\\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\\n"
    "    end = time.monotonic() + 0.3\\n"
    "    while time.monotonic() < end:\\n"
    "        pass\\n"
    "    print('store call finished', flush=True)\\n",
    store,
)
with ending_runs_on_signal():
    with mlflow.start_run(tags=owner_tags()) as run:
        print('run', run.info.run_id, flush=True)
        store['call']()
        time.sleep(30)
        print('not interrupted', flush=True)
"""


def test_a_signal_inside_a_store_call_ends_the_process_once_the_call_has_finished(tmp_path):
    """Raised inside the store's code, the signal's exception can leave an SQLite transaction
    half done, and its lock made the writes that end the runs wait out the busy timeout and fail
    (about one SIGTERM in fifteen during a loop of writes); so it is delivered again after the call."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(uri)
    done = _python(tmp_path, _SIGNAL_IN_A_STORE_CALL, uri, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[1:] == ["store call finished"], done.stdout + done.stderr
    run = mlflow.tracking.MlflowClient(uri).get_run(lines[0].split()[1])
    assert run.info.status == "KILLED" and run.data.tags[END_REASON_TAG] == "terminated by SIGTERM"


_SIGNAL_CAUGHT_AND_IGNORED = """
import os, signal, sys, time
import mlflow
from pipeline.tracking import lifecycle

lifecycle.EXIT_GRACE_SECONDS = 1.0
mlflow.MlflowClient().search_experiments(max_results=1)  # the store opened (its modules imported) before the clock starts
open(os.environ['TEST_READY_FILE'], 'w').write(repr(time.monotonic()))  # ready: time limits count from here
with lifecycle.ending_runs_on_signal():
    end, signalled = time.monotonic() + 30, False
    while time.monotonic() < end:
        try:  # code that catches everything, as a store's retry loop may
            if not signalled:
                signalled = True
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        except BaseException:
            pass
    print('went on', flush=True)
"""


def test_a_process_that_swallows_the_signal_still_exits_after_the_grace_period(tmp_path):
    done = _python(tmp_path, _SIGNAL_CAUGHT_AND_IGNORED)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert "went on" not in done.stdout and _since_ready(tmp_path) < 25
    assert "still running 1 s after SIGTERM: exiting now" in done.stderr


_SIGNALS_WHILE_BLOCKED_IN_A_STORE_CALL = """
import os, signal, threading, time
import mlflow
from pipeline.tracking import lifecycle

lifecycle.EXIT_GRACE_SECONDS = 1.0
store = {"__name__": "sqlalchemy.pool.fake", "signal": signal, "time": time}
exec(  # a call blocked in the kernel (as on a lock), then in C where no signal reaches it (SQLite's busy wait)
    "def call():\\n"
    "    time.sleep(0.5)\\n"
    "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})\\n"
    "    time.sleep(30)\\n",
    store,
)
mlflow.MlflowClient().search_experiments(max_results=1)  # the store opened (its modules imported) before the clock starts
open(os.environ['TEST_READY_FILE'], 'w').write(repr(time.monotonic()))  # ready: time limits count from here
with lifecycle.ending_runs_on_signal():  # the signals come once its handlers are set, under any load
    for delay, signum in [(0.1, signal.SIGTERM), (0.15, signal.SIGINT), (0.2, signal.SIGTERM), (0.25, signal.SIGINT)]:
        threading.Timer(delay, os.kill, (os.getpid(), signum)).start()
    store["call"]()
print('went on', flush=True)
"""


def test_signals_while_the_main_thread_is_blocked_in_a_store_call_end_it_after_the_grace_period(tmp_path):
    """The signals wait for the store call (each one sent again to the main thread, which wakes
    from its system call and goes back to it); the call does not return, the last part of it where
    no signal reaches the main thread: the grace period counts from the first signal's arrival,
    and the first signal decides the exit status."""
    done = _python(tmp_path, _SIGNALS_WHILE_BLOCKED_IN_A_STORE_CALL)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert "went on" not in done.stdout and _since_ready(tmp_path) < 20, done.stderr
    assert "still running 1 s after SIGTERM: exiting now" in done.stderr


_SIGNAL_IN_THE_BLOCKS_LAST_STORE_CALL = """
import os, signal, sys, time
import mlflow
from pipeline.tracking.lifecycle import ending_runs_on_signal, owner_tags

mlflow.set_tracking_uri(sys.argv[1])
store = {"__name__": "mlflow.store.tracking.fake", "os": os, "signal": signal, "time": time}
exec("def call():\\n    os.kill(os.getpid(), signal.SIGINT)\\n    time.sleep(0.01)\\n", store)
sweep = mlflow.tracking.MlflowClient().create_run("0", tags=owner_tags())  # as a sweep's parent run
print(sweep.info.run_id, flush=True)
with ending_runs_on_signal():  # a job of the sweep
    with mlflow.start_run(tags=owner_tags()) as run:
        print(run.info.run_id, flush=True)
        store['call']()  # the signal is deferred, and the block ends before it is delivered again
print('went on after the block', flush=True)
time.sleep(1)
"""


def test_a_signal_deferred_in_the_blocks_last_store_call_ends_the_process_as_the_block_ends(tmp_path):
    """Not after it, where the handlers are the caller's again (SIGINT became a KeyboardInterrupt
    in whatever the caller did next, as the sweeper's next store write; SIGTERM's default action
    killed the process mid-write); the process's runs still open end KILLED."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(uri)
    done = _python(tmp_path, _SIGNAL_IN_THE_BLOCKS_LAST_STORE_CALL, uri, timeout=120)
    assert done.returncode == 128 + signal.SIGINT, done.stdout + done.stderr
    assert "went on" not in done.stdout and "KeyboardInterrupt" not in done.stderr, done.stdout + done.stderr
    sweep, job = (mlflow.tracking.MlflowClient(uri).get_run(run_id) for run_id in done.stdout.split())
    assert job.info.status == "FINISHED"  # its work was done when the signal came
    assert sweep.info.status == "KILLED" and sweep.data.tags[END_REASON_TAG] == "terminated by SIGINT"


def _own_frame():
    return sys._getframe()


def _frame_of_a_call_made_by(module: str):
    """The frame of a function of this file called from a function of ``module`` (as the
    store's code calls a library's)."""
    caller = {"__name__": module, "callee": _own_frame}
    exec("def call():\n    return callee()\n", caller)
    return caller["call"]()


@pytest.mark.parametrize(
    "module, deferred",
    [
        ("sqlalchemy.engine.base", True),
        ("sqlite3.dbapi2", True),
        ("mlflow.store.tracking.sqlalchemy_store", True),
        ("mlflow.store.model_registry.sqlalchemy_store", True),
        ("optuna.storages._rdb.storage", True),
        # the import system: raised in a module lock's weakref callback, the signal was ignored, and the
        # job ran on until the 30 s deadline (seen once in CI)
        ("importlib._bootstrap", True),
        ("_frozen_importlib", True),
        ("mlflow.store.tracking.rest_store", False),  # a request to a server leaves no lock behind
        ("mlflow.store.artifact.local_artifact_repo", False),
        ("mlflow.tracking.fluent", False),
        ("crf.model", False),
    ],
)
def test_which_calls_a_signal_waits_for(module, deferred):
    frame = _frame_of_a_call_made_by(module)
    assert frame.f_globals["__name__"] != module  # the signal lands in a callee; its caller counts
    assert lifecycle._inside_store_call(frame) is deferred


def test_a_stopper_resends_while_the_signal_waits_and_acts_at_its_deadline():
    """The one helper thread of the signal handling, in this process with a harmless signal."""
    received, called = [], []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        resending = lifecycle.Stopper(signal.SIGUSR1, 600, lambda: called.append("early"), waiting=lambda: len(received) < 3)
        while len(received) < 3:  # each resend reaches this (main) thread
            time.sleep(0.01)
        resending.cancel()
        resending.join()  # its deadline is 10 minutes away: cancel() ended it
        assert called == [] and set(received) == {signal.SIGUSR1}
        sent = len(received)

        lifecycle.Stopper(signal.SIGUSR1, 0, lambda: called.append("deadline")).join()
        assert called == ["deadline"] and len(received) == sent  # it never waits: nothing is sent
    finally:
        signal.signal(signal.SIGUSR1, previous)


_EXIT_CAUGHT_BY_THE_WORKER = """
import os, signal, sys, time
import mlflow
from pipeline.tracking import lifecycle

lifecycle.EXIT_AFTER_ENDING_SECONDS = 1.0
mlflow.set_tracking_uri(sys.argv[1])
try:  # as a joblib (loky) worker runs a job: whatever the job raises is its result
    with lifecycle.ending_runs_on_signal():
        with mlflow.start_run(tags=lifecycle.owner_tags()) as run:
            print(run.info.run_id, flush=True)
            open(os.environ['TEST_READY_FILE'], 'w').write(repr(time.monotonic()))  # ready: time limits count from here
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
except BaseException as error:
    print('caught', type(error).__name__, flush=True)
time.sleep(30)  # waiting for the next job
print('went on', flush=True)
"""


def test_a_worker_that_catches_the_exit_still_ends_once_its_runs_are_ended(tmp_path):
    """A joblib worker reports a job's SystemExit as its result and waits for the next job: the
    SIGTERMed worker went on for the whole grace period; now it exits soon after its runs end."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(uri)
    done = _python(tmp_path, _EXIT_CAUGHT_BY_THE_WORKER, uri)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    run_id, caught = done.stdout.splitlines()
    assert caught == "caught SystemExit" and _since_ready(tmp_path) < 20, done.stdout + done.stderr
    assert "still running 1 s after its runs were ended on SIGTERM (the exit was caught): exiting now" in done.stderr
    assert mlflow.tracking.MlflowClient(uri).get_run(run_id).info.status == "KILLED"


_A_WORKER_GIVEN_ANOTHER_JOB = """
import os, signal, time
from pipeline.tracking import lifecycle

def job(n):
    with lifecycle.ending_runs_on_signal():
        print('job', n, flush=True)
        if n == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)

for n in (1, 2):  # as a joblib worker runs the jobs it is given
    try:
        job(n)
    except BaseException as error:
        print('caught', type(error).__name__, flush=True)
print('went on', flush=True)
"""


def test_a_worker_whose_job_ended_on_a_signal_runs_no_further_job(tmp_path):
    """joblib hands a worker the next job when the last one reports its SystemExit: that job
    would start runs the watchdog then cut short; the worker exits before starting it."""
    done = _python(tmp_path, _A_WORKER_GIVEN_ANOTHER_JOB)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["job 1", "caught SystemExit"], done.stdout + done.stderr
    assert "this process was stopped by SIGTERM: it runs no further jobs" in done.stderr


@pytest.mark.slow
def test_sigterm_during_a_job_of_an_in_process_sweep_ends_the_sweep_killed_and_unsummarised(data_root, tmp_path):
    """With Hydra's basic launcher the job runs in the sweep's process: the job ended the parent
    run KILLED, then the sweep's exit handler summarised the killed sweep, registered its best
    job and overwrote the parent's status with FAILED."""
    out = tmp_path / "out"
    sweep = [f"hydra.sweep.dir={tmp_path / 'multirun'}", "hydra/launcher=basic", "trainer.c2=0.1,1"]
    command = _command(data_root, out, *sweep, *ENDLESS)
    command.insert(command.index("pipeline") + 1, "-m")
    process = forkserver.popen(command, cwd=ROOT, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for_training(process, out)
    process.send_signal(signal.SIGTERM)
    text = _output(process)
    assert process.returncode == 128 + signal.SIGTERM, text
    assert "the parent run was ended KILLED: no summary" in text, text
    runs = _runs(out)
    assert "RUNNING" not in set(runs["status"]), runs[["tags.stage", "status"]]
    parent = runs[runs["tags.stage"] == "sweep"]
    assert list(parent["status"]) == ["KILLED"] and list(parent[f"tags.{END_REASON_TAG}"]) == ["terminated by SIGTERM"]
    assert not mlflow.tracking.MlflowClient(f"sqlite:///{out / 'mlflow.db'}").search_registered_models()


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweeps_process_group_ends_every_run_and_summarises_the_sweep(data_root, tmp_path):
    """``kill -TERM -- -<pgid>``, as Ctrl-C: the jobs end their runs, and the launching process
    (which had no handler, so SIGTERM ended it at once) takes it as an interrupt and ends the
    sweep's parent run FAILED through its exit handler, with the summary; nothing stays RUNNING."""
    out = tmp_path / "out"
    sweep = [f"hydra.sweep.dir={tmp_path / 'multirun'}", "trainer.c2=0.1,1", "registry.sweep=false"]
    command = _command(data_root, out, *sweep, *ENDLESS)
    command.insert(command.index("pipeline") + 1, "-m")
    process = forkserver.popen(
        command, cwd=ROOT, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    _wait_for_training(process, out)
    os.killpg(process.pid, signal.SIGTERM)
    text = _output(process, timeout=120)
    assert process.returncode != 0, text
    runs = _runs(out)
    assert "RUNNING" not in set(runs["status"]), (runs[["tags.stage", "status"]], text[-5000:])
    parent = runs[runs["tags.stage"] == "sweep"]
    assert list(parent["status"]) == ["FAILED"], (parent["status"], text[-5000:])
    assert "sweep_summary.csv" in {
        a.path for a in mlflow.tracking.MlflowClient(f"sqlite:///{out / 'mlflow.db'}").list_artifacts(parent["run_id"].iloc[0])
    }
    jobs = runs[runs["tags.stage"] == "pipeline"]
    assert len(jobs) >= 1 and set(jobs["status"]) <= {"KILLED", "FAILED"}, jobs["status"]


_A_SIGNAL_AS_THE_BLOCK_ENDS = """
import os, signal, sys, time
from pipeline.tracking import lifecycle

lifecycle._mark_killed = lambda runs, reason: print('killed', reason, flush=True)
exit_code = lifecycle._EndingRunsOnSignal.__exit__.__code__

def hold(frame, event, arg):  # the signal comes as the block's __exit__ starts, before its first line
    if event == "call" and frame.f_code is exit_code:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # handled here, and sent again by the stopper meanwhile

with lifecycle.ending_runs_on_signal():
    sys.setprofile(hold)
    raise ValueError("the block failed")
print('went on', flush=True)
"""


def test_a_signal_that_comes_as_the_block_ends_still_ends_the_process_there(tmp_path):
    """Handled after the body but before the block knew it was ending, the signal raised
    Terminated outside the block: exit status 1 and the runs left RUNNING. The block's outcome
    (here an error) is logged; the signal decides how the process ends."""
    done = _python(tmp_path, _A_SIGNAL_AS_THE_BLOCK_ENDS)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["killed terminated by SIGTERM"], done.stdout + done.stderr
    assert "ValueError: the block failed (while SIGTERM waited)" in done.stderr


_A_SECOND_SIGNAL_WHILE_THE_FIRST_IS_HANDLED = """
import os, signal, sys
from pipeline.tracking import lifecycle

lifecycle._mark_killed = lambda runs, reason: print('killed', reason, flush=True)
first_check = lifecycle._inside_store_call

def check(frame, quiet=()):  # Ctrl-C lands while SIGTERM's handler decides
    lifecycle._inside_store_call = first_check
    os.kill(os.getpid(), signal.SIGINT)
    return first_check(frame, quiet)

lifecycle._inside_store_call = check
with lifecycle.ending_runs_on_signal():
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10**7):
        pass
"""


def test_the_first_of_two_signals_decides_how_the_process_ends(tmp_path):
    done = _python(tmp_path, _A_SECOND_SIGNAL_WHILE_THE_FIRST_IS_HANDLED)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["killed terminated by SIGTERM"], done.stdout + done.stderr


_SIGTERM_TO_A_SWEEPS_LAUNCHER_ALONE = """
import os, signal, subprocess, sys, time
from pipeline.sweeps import sigterm

job = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print(1, flush=True); time.sleep(60)"
for grace, times in [(0.5, 1), (60.0, 2)]:
    sigterm.SIGTERM_GRACE_SECONDS = grace
    worker = subprocess.Popen([sys.executable, "-S", "-c", job], stdout=subprocess.PIPE)  # as a joblib worker
    worker.stdout.readline()  # its handler is set
    launcher = sigterm.SweepSigterm("test")
    launcher.install()
    open(os.environ['TEST_READY_FILE'], 'w').write(repr(time.monotonic()))  # ready: time limits count from here
    try:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGTERM)
        print("worker", worker.wait(timeout=30), sigterm.SWEEP_STOPPING.is_set(), flush=True)
        time.sleep(30)  # the launcher waits for its jobs
    except KeyboardInterrupt as stop:
        print("stopped:", stop, "after", grace if times == 1 else "a second SIGTERM", flush=True)
    launcher.release()
    sigterm.SWEEP_STOPPING.clear()
"""


_A_JOB_STARTED_AFTER_THE_SIGTERM = """
import os, signal, subprocess, sys, time
from pipeline.sweeps import sigterm

job = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print(1, flush=True); time.sleep(60)"
sigterm.SIGTERM_GRACE_SECONDS = 20.0
launcher = sigterm.SweepSigterm("test")
launcher.install()
os.kill(os.getpid(), signal.SIGTERM)  # step 1: nothing to pass on yet
late = subprocess.Popen([sys.executable, "-S", "-c", job], stdout=subprocess.PIPE)  # a job whose launch was under way
late.stdout.readline()  # its handler is set
print("late job", late.wait(timeout=15), flush=True)
launcher.release()
sigterm.SWEEP_STOPPING.clear()
"""


def test_a_job_that_starts_after_the_sigterm_gets_it_too(tmp_path):
    """A job whose launch was under way as the signal came started unsignalled and ran to its end,
    its runs FINISHED, in a sweep being stopped (M8): the launcher passes the signal on to the
    processes that start during the grace period too."""
    done = _python(tmp_path, _A_JOB_STARTED_AFTER_THE_SIGTERM)
    assert done.stdout.splitlines() == ["late job 7"], done.stdout + done.stderr


def test_sigterm_to_a_sweeps_launching_process_alone_passes_it_on_then_stops_as_ctrl_c_does(tmp_path):
    """The launcher (a :class:`SweepSigterm`, without Hydra) sends the signal on to its child
    processes at once and launches no further job; it stops as Ctrl-C does (KeyboardInterrupt) when
    still there after the grace period, or at once on a second SIGTERM."""
    done = _python(tmp_path, _SIGTERM_TO_A_SWEEPS_LAUNCHER_ALONE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "worker 7 True",
        "stopped: terminated by SIGTERM after 0.5",
        "stopped: terminated by SIGTERM after a second SIGTERM",
    ], done.stdout + done.stderr
    assert _since_ready(tmp_path) < 20, done.stdout + done.stderr  # the second did not wait out its 60 s

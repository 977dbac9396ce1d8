"""Real child processes without paying the imports each time: ``python -c ...`` and ``python -m ...``
children forked from a server process that imported MLflow and the project once, and loaded the
compiled (Numba) kernels of a CRF fit once (about 0.7 s of CPU in every child that trains or tags).

A test about a process (its exit status, a signal, its output, the files it leaves) needs a real
process; it does not need the 5-20 s a fresh interpreter spends importing MLflow, pandas and the
pipeline. :func:`run` and :func:`popen` take the arguments of :func:`subprocess.run` and
:class:`subprocess.Popen` that the tests use; the child is forked from the server, then does what a
fresh ``python`` does before and after the code: working folder, environment, ``sys.path`` from
``PYTHONPATH``, ``sys.argv``, standard streams to files, ``PYTHONFAULTHANDLER``; the exit status of an
uncaught exception, ``SystemExit`` or ``KeyboardInterrupt`` (death by SIGINT); non-daemon threads joined
and ``atexit`` handlers run at the end. Signals reach it as any process's do.

A plain subprocess is used instead when the command is not ``sys.executable -c|-m``, when the
child would not import the project from this checkout (its ``PYTHONPATH`` must hold the checkout or,
when the checkout is pip-installed in editable mode, no other copy of the project), when output is
not captured, or when ``CRF_TEST_FORKSERVER=0``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = (
    "pandas",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "hydra",
    "pipeline",
    "pipeline.tracking",
    "pipeline.tracking.lifecycle",
    "pipeline.apps.tag",
    # what every pipeline run, sweep job and benchmark worker imports next (scikit-learn and SciPy through
    # crf, the runner and the default stages, Optuna for sweeps): about 1.5 s of CPU per child on a quiet machine
    "crf.model",
    "pipeline.engine.runner",
    "pipeline.stages.prepare",
    "pipeline.stages.featurize",
    "pipeline.stages.train",
    "pipeline.stages.evaluate",
    "optuna",
    "pipeline.report",  # and pyplot (about 0.5 s of CPU in every child that trains or plots)
)

_SERVER = r"""
import atexit, faulthandler, importlib, json, os, runpy, select, sys, threading, traceback, types

for name in sys.argv[1:]:
    __import__(name)
if "crf.model" in sys.argv[1:]:  # load the compiled kernels of a fit, predict and marginals once (numba's disk cache)
    from crf import CRF

    words = [[{"w": str(k % 3)} for k in range(n, n + 4)] for n in range(6)]
    labels = [["A" if token["w"] == "0" else "B" for token in sentence] for sentence in words]
    warm = CRF(max_iterations=5, n_threads=1).fit(words, labels)
    warm.predict(words), warm.predict_marginals(words)
    del CRF, words, labels, warm
if "pipeline.report" in sys.argv[1:]:  # pyplot on the headless backend, as pipeline.report.figure sets it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
own = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
BASE_PATH = [p for p in sys.path[1:] if p not in own]


def exit_status(error):
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def child(request):
    if request["new_session"]:
        os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(1 if request["stderr"] == request["stdout"] else os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.closerange(3, 1024)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    option, target, args = request["argv"][0], request["argv"][1], request["argv"][2:]
    sys.path[:] = ["" if option == "-c" else os.getcwd(), *paths, *BASE_PATH]
    importlib.invalidate_caches()
    status, interrupted = 0, False
    try:
        if option == "-c":
            sys.argv[:] = ["-c", *args]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.argv[:] = ["-m", *args]
            runpy._run_module_as_main(target, alter_argv=True)
    except SystemExit as error:
        status = exit_status(error)
    except KeyboardInterrupt:
        traceback.print_exc()
        status, interrupted = 1, True
    except BaseException:
        traceback.print_exc()
        status = 1
    try:  # what the interpreter does on its way out
        threading._shutdown()
    except BaseException:
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if interrupted:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


if threading.active_count() != 1:
    os.write(1, b"threads\n")
    sys.exit(1)
os.write(1, b"ready\n")
pending, children = b"", set()
while True:  # requests in, "pid <pid>" and "exit <pid> <wait status>" out
    if select.select([0], [], [], 0.02 if children else None)[0]:
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)
        pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(request)
            finally:
                os._exit(70)
        children.add(pid)
        os.write(1, f"pid {pid}\n".encode())
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            os.write(1, f"exit {pid} {status}\n".encode())
"""


class _Server:
    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CRF_"))}
        env.update(MLFLOW_DISABLE_TELEMETRY="true", PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, *PRELOAD], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.pending = b""
        self.exits: dict[int, int] = {}  # wait status of each child that ended
        self.ok = self._line(600) == "ready"

    def _line(self, timeout: float | None) -> str | None:
        """One line from the server, or None if none came within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the fork server ended")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def start(self, request: dict) -> int:
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        while True:
            kind, pid, *status = self._line(None).split()
            if kind == "pid":
                return int(pid)
            self.exits[int(pid)] = int(status[0])

    def status(self, pid: int, timeout: float | None) -> int | None:
        """The wait status of child ``pid`` once it ended, or None if it did not within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exits:
            line = self._line(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if line is None:
                return None
            kind, other, *status = line.split()
            self.exits[int(other)] = int(status[0])
        return self.exits.pop(pid)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


_servers: list[_Server] = []


def _server() -> _Server | None:
    if os.environ.get("CRF_TEST_FORKSERVER", "1") == "0":
        return None
    if not _servers:
        _servers.append(_Server())
        atexit.register(_servers[0].close)
    server = _servers[0]
    return server if server.ok and server.process.poll() is None else None


class Forked:
    """The part of :class:`subprocess.Popen` the tests use, for a child of the fork server."""

    def __init__(self, server: _Server, args: list[str], pid: int, folder: Path, merged: bool, text: bool) -> None:
        self.server, self.args, self.pid, self.folder, self.merged, self.text = server, args, pid, folder, merged, text
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._wait(0)
        return self.returncode

    def _wait(self, timeout: float | None) -> None:
        status = self.server.status(self.pid, timeout)
        if status is not None:
            self.returncode = os.waitstatus_to_exitcode(status)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._wait(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _read(self, name: str):
        data = (self.folder / name).read_bytes()
        return data.decode() if self.text else data

    def communicate(self, timeout: float | None = None):
        self.wait(timeout)
        return self._read("stdout"), (None if self.merged else self._read("stderr"))


def _installed_from_root() -> bool:
    """Whether this checkout is pip-installed in editable mode (``pip install -e .``, as CI does):
    then a fresh interpreter imports the project from the same files as the server."""
    from importlib import metadata

    for distribution in metadata.distributions(name="crf-experiments"):  # the checkout's own egg-info is one
        info = json.loads(distribution.read_text("direct_url.json") or "{}")
        if info.get("dir_info", {}).get("editable") and info.get("url") == ROOT.as_uri():
            return True
    return False


_EDITABLE = _installed_from_root()


def _forkable(args, env) -> bool:
    """A ``python -c|-m`` child whose project imports would be the server's: its ``PYTHONPATH``
    holds this checkout, or holds no other copy of the project while this checkout is installed."""
    paths = [os.path.abspath(p) for p in (env or os.environ).get("PYTHONPATH", "").split(os.pathsep) if p]
    same = str(ROOT) in paths or (_EDITABLE and not any((Path(p) / "crf").is_dir() for p in paths))
    return len(args) >= 2 and args[0] == sys.executable and args[1] in ("-c", "-m") and same


def forks(args, env=None) -> bool:
    """Whether :func:`popen` (with ``stdout=PIPE``) forks ``args`` from the server rather than starting a fresh interpreter."""
    return _forkable(args, env) and _server() is not None


def popen(args, *, cwd=None, env=None, stdout=None, stderr=None, text=False, start_new_session=False, **rest):
    """:class:`subprocess.Popen` (output captured to files: ``stdout=PIPE``, ``stderr=PIPE`` or ``STDOUT``)."""
    server = _server() if _forkable(args, env) and stdout == subprocess.PIPE and not rest else None
    if server is None or stderr not in (subprocess.PIPE, subprocess.STDOUT):
        return subprocess.Popen(
            args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, start_new_session=start_new_session, **rest
        )
    folder = Path(tempfile.mkdtemp(prefix="forked-"))
    merged = stderr == subprocess.STDOUT
    request = {
        "argv": list(map(str, args[1:])),
        "cwd": str(cwd or os.getcwd()),
        "env": dict(env if env is not None else os.environ),
        "stdout": str(folder / "stdout"),
        "stderr": str(folder / ("stdout" if merged else "stderr")),
        "new_session": bool(start_new_session),
    }
    return Forked(server, list(args), server.start(request), folder, merged, text)


def run(args, *, cwd=None, env=None, capture_output=False, text=False, timeout=None, check=False, **rest):
    """:func:`subprocess.run` with ``capture_output=True``."""
    if not capture_output or rest:
        return subprocess.run(
            args, cwd=cwd, env=env, capture_output=capture_output, text=text, timeout=timeout, check=check, **rest
        )
    process = popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    done = subprocess.CompletedProcess(args, process.returncode, out, err)
    if check:
        done.check_returncode()
    return done

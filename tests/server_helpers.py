"""A real ``mlflow server`` on 127.0.0.1 for tests (any backend store), stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import forkserver

from pipeline.apps.model_benchmark import free_port


@contextlib.contextmanager
def background_server(command: list[str], url: str, probe: str, log_path: Path, env: dict, timeout: float = 120) -> Iterator[str]:
    """Run ``command`` in its own process session, yield ``url`` once ``url + probe`` answers 200,
    and stop the whole session (SIGTERM, then SIGKILL) at the end; its output goes to ``log_path``.
    A ``python -m`` command is forked from the test fork server (:mod:`forkserver`: the command
    line's imports made once, about 3 CPU-s for ``mlflow server``); what it starts (uvicorn, the
    scoring server) are fresh interpreters as ever."""
    if forkserver.forks(command, env):
        process = forkserver.popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        output = process.folder / "stdout"
    else:
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        output = None

    def log_text() -> str:
        if output is not None:
            shutil.copyfile(output, log_path)
        return log_path.read_text()

    deadline = time.time() + timeout
    try:
        while True:
            try:
                with urllib.request.urlopen(url + probe, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{' '.join(command[2:5])} did not start:\n{log_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)
        log_text()


@contextlib.contextmanager
def mlflow_server(
    backend_store_uri: str, artifacts: Path, log_path: Path, workers: int = 1, timeout: float = 120
) -> Iterator[str]:
    """Start ``mlflow server`` with ``backend_store_uri`` and the proxied artifact root
    ``artifacts``; yield its URL once ``/health`` answers; stop it at the end."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    command += ["--backend-store-uri", backend_store_uri, "--artifacts-destination", str(artifacts)]
    with background_server(command, f"http://127.0.0.1:{port}", "/health", log_path, env, timeout) as url:
        yield url

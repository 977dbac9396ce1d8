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
import psutil

from pipeline.apps.model_benchmark import free_port


def _tree_cpu_seconds(pid: int) -> float:
    """CPU-seconds used by ``pid`` and its descendants, living or waited for."""
    try:
        processes = [psutil.Process(pid)]
        processes += processes[0].children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


@contextlib.contextmanager
def background_server(
    command: list[str], url: str, probe: str, log_path: Path, env: dict, stall_seconds: float = 60
) -> Iterator[str]:
    """Run ``command`` in its own process session, yield ``url`` once ``url + probe`` answers 200,
    and stop the whole session (SIGTERM, then SIGKILL) at the end; its output goes to ``log_path``.
    It fails when the process ends first, or when its process tree has used no CPU for
    ``stall_seconds`` without answering (a hang): no wall-clock limit counts its start and imports,
    which take minutes on a loaded machine.
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

    progress = (_tree_cpu_seconds(process.pid), time.monotonic())  # CPU-s used, and when that last grew
    try:
        while True:
            try:
                with urllib.request.urlopen(url + probe, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            used = _tree_cpu_seconds(process.pid)
            if used > progress[0] + 0.05:
                progress = (used, time.monotonic())
            if process.poll() is not None or time.monotonic() - progress[1] > stall_seconds:
                how = "ended" if process.poll() is not None else f"used no CPU for {stall_seconds:g} s"
                raise RuntimeError(f"{' '.join(command[2:5])} did not start ({how}):\n{log_text()[-3000:]}")
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
def mlflow_server(backend_store_uri: str, artifacts: Path, log_path: Path, workers: int = 1) -> Iterator[str]:
    """Start ``mlflow server`` with ``backend_store_uri`` and the proxied artifact root
    ``artifacts``; yield its URL once ``/health`` answers; stop it at the end."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    command += ["--backend-store-uri", backend_store_uri, "--artifacts-destination", str(artifacts)]
    with background_server(command, f"http://127.0.0.1:{port}", "/health", log_path, env) as url:
        yield url

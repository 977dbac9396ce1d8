"""A production-like tracking server: ``mlflow server`` on a PostgreSQL backend store and a shared
artifact root, written to by a sweep of six parallel jobs at once; nothing may be lost.

The test makes a throwaway PostgreSQL cluster (``initdb``/``pg_ctl`` as the unprivileged
``postgres`` user when run as root, on a free 127.0.0.1 port, under a temporary folder) and removes
it afterwards. Without PostgreSQL (``apt-get install -y postgresql``) or psycopg it skips, saying so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import forkserver
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import tiny_overrides, write_corpus  # noqa: E402
from server_helpers import free_port, mlflow_server  # noqa: E402

from pipeline.tracking import remote_cache  # noqa: E402

PROJECT = Path(__file__).resolve().parents[3]
JOBS = 3  # more writers than the server has workers (2), each on its own process


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or ([shutil.which("initdb")] if shutil.which("initdb") else [])
    return Path(found[-1]).parent if found else None


def _as_owner(command: list[str]) -> list[str]:
    """``command`` as the ``postgres`` user when we are root (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def postgres_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL cluster with database ``mlflow``; yields its SQLAlchemy URI."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install -y postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e .[cluster])")
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
        pytest.skip("running as root and there is no unprivileged 'postgres' user to run PostgreSQL")
    folder = Path(tempfile.mkdtemp(prefix="crf-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data, port = folder / "data", free_port()
    run = {"check": True, "capture_output": True, "text": True, "timeout": 120}
    try:
        subprocess.run(_as_owner([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "mlflow", "-E", "UTF8"]), **run)
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections=100"
        subprocess.run(
            _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start"]), **run
        )
        try:
            subprocess.run(
                _as_owner([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow", "mlflow"]), **run
            )
            yield f"postgresql+psycopg://mlflow@127.0.0.1:{port}/mlflow"
        finally:
            subprocess.run(
                _as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True, timeout=60
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_parallel_jobs_against_a_postgres_backed_server(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=40, n_test=20)
    strengths = [0.01, 0.03, 0.1, 0.3, 1, 3][:JOBS]
    with postgres_cluster() as database:
        with mlflow_server(database, tmp_path / "artifacts", tmp_path / "server.log", workers=2) as url:
            command = [sys.executable, "-m", "pipeline", "-m", "trainer.c2=" + ",".join(map(str, strengths))]
            command += tiny_overrides(data_root, tmp_path / "out") + ["tracking=server", f"tracking.uri={url}"]
            command += ["trainer.max_iterations=15", f"hydra.launcher.n_jobs={JOBS}"]
            env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
            env.pop("MLFLOW_TRACKING_URI", None)
            # the sweep's process forked from the test's server (its imports made once); its jobs are joblib's workers
            done = forkserver.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=1200)
            assert done.returncode == 0, done.stderr[-4000:]
            client = MlflowClient(url)
            experiment = client.get_experiment_by_name("crf").experiment_id
            (sweep,) = client.search_runs([experiment], filter_string="tags.stage = 'sweep'")
            jobs = client.search_runs([experiment], filter_string="tags.stage = 'pipeline'")
            stages = client.search_runs([experiment], filter_string="tags.stage != 'pipeline' and tags.stage != 'sweep'")
            assert sweep.info.status == "FINISHED" and sweep.data.metrics["jobs_finished"] == JOBS
            assert {float(j.data.params["trainer.c2"]) for j in jobs} == set(map(float, strengths))
            # the jobs overlapped in time: they wrote concurrently
            starts, ends = [j.info.start_time for j in jobs], [j.info.end_time for j in jobs]
            assert max(starts) < min(ends)
            for job in jobs:
                assert job.info.status == "FINISHED" and job.data.tags["mlflow.parentRunId"] == sweep.info.run_id
                assert {"dev_f1", "test_f1"} <= job.data.metrics.keys()
                children = [r for r in stages if r.data.tags.get("mlflow.parentRunId") == job.info.run_id]
                assert sorted(r.data.tags["stage"] for r in children) == ["evaluate", "featurize", "prepare", "train"]
                assert all(r.info.status == "FINISHED" for r in children)
                (train,) = [r for r in children if r.data.tags["stage"] == "train"]
                assert len(client.get_metric_history(train.info.run_id, "loss")) == int(train.data.metrics["iterations"])
                # every training computed its own entry (its c2) and uploaded it whole, through the server
                uploaded = {a.path for a in client.list_artifacts(train.info.run_id, remote_cache.ARTIFACT_PATH)}
                assert "cache/manifest.json" in uploaded and train.data.tags["cache"] == "miss"
                assert train.data.tags.get("model_uri")
            assert {"sweep_summary.csv", "sweep.png"} <= {a.path for a in client.list_artifacts(sweep.info.run_id)}
            assert list((tmp_path / "artifacts").rglob("bundle.npz"))

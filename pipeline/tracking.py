"""MLflow set-up shared by every entry point: where the store is, and what a run records.

Store resolution: ``MLFLOW_TRACKING_URI`` when set wins; else ``tracking.uri`` from the config
(``tracking=server`` points at a tracking server); else a SQLite store at an absolute path under
the output folder, ``sqlite:///<outputs>/mlflow.db`` with artifacts beside it. An HTTP store is
checked before any work starts, so an unreachable server fails at once.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from pipeline.models import SWEEP_ID_VARIABLE  # noqa: E402

# how a sweep's launching process tells its jobs (in other processes) where to attach their runs
SWEEP_PARENT_VARIABLE = "CRF_SWEEP_PARENT_RUN_ID"
__all__ = ["SWEEP_ID_VARIABLE", "SWEEP_PARENT_VARIABLE"]
# MLflow's own tag for the source commit; its automatic value needs the entry script inside the
# checkout (not so under pytest, nor for runs created with MlflowClient), so we set it ourselves
GIT_COMMIT_TAG = "mlflow.source.git.commit"


class TrackingUnavailable(RuntimeError):
    """The configured tracking server cannot be reached."""


def output_root(cfg: Mapping) -> Path:
    return Path(cfg["paths"]["output_dir"]).absolute()


def tracking_uri(cfg: Mapping) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    configured = cfg["tracking"].get("uri")
    if configured:
        return str(configured)
    return f"sqlite:///{output_root(cfg) / 'mlflow.db'}"


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """For an HTTP store, GET /health; raise TrackingUnavailable with a clear message if it fails."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            if response.status != 200:
                raise TrackingUnavailable(f"MLflow tracking server {uri} answered {response.status} on /health")
    except (urllib.error.URLError, OSError) as err:
        raise TrackingUnavailable(
            f"MLflow tracking server {uri} is not reachable ({getattr(err, 'reason', err)}). Start it "
            f"(see README: mlflow server ...), fix tracking.uri, or unset MLFLOW_TRACKING_URI to use the local store."
        ) from None


def setup(cfg: Mapping) -> str:
    """Point MLflow at the configured store and experiment; return the tracking URI."""
    uri = tracking_uri(cfg)
    check_reachable(uri)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    name = cfg["tracking"]["experiment"]
    client = MlflowClient(uri)
    if client.get_experiment_by_name(name) is None:
        location = None
        if uri.startswith("sqlite:///"):
            location = (output_root(cfg) / "mlartifacts").as_uri()
        try:
            client.create_experiment(name, artifact_location=location)
        except mlflow.exceptions.MlflowException:
            pass  # created meanwhile by a parallel job
    mlflow.set_experiment(name)
    return uri


def flatten(config: Mapping, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b.c": "value"} with string values (as MLflow stores params)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            text = str(value)
            flat[name] = text if len(text) <= 6000 else text[:5997] + "..."
    return flat


def git_commit() -> str:
    """The project's current git commit (``unknown`` outside a checkout)."""
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def source_tags() -> dict[str, str]:
    """MLflow's standard source-commit tag, when the project is a git checkout."""
    commit = git_commit()
    return {GIT_COMMIT_TAG: commit} if commit != "unknown" else {}


def log_params(params: Mapping[str, Any]) -> None:
    """Log params (``log_batch`` splits them into MLflow's per-call limits itself)."""
    mlflow.log_params(dict(params))


def store_hint(uri: str, run_id: str, experiment_id: str) -> str:
    """How a user opens ``run_id``: the ``mlflow ui`` command for a local store, else its URL."""
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"mlflow ui --backend-store-uri {uri}"

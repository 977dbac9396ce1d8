"""``mlflow models serve --env-manager local`` answers /invocations as ``predict`` does."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
import server_helpers  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.runner import run_pipeline  # noqa: E402
from pipeline.tracking import tracking_uri  # noqa: E402


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_served_model_answers_like_predict(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        monkeypatch.delenv(name, raising=False)
    cfg = compose_config(tiny_overrides(write_corpus(tmp_path / "data", n_train=60, n_test=20), tmp_path / "out"))
    run_pipeline(cfg)
    uri = tracking_uri(cfg)
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("crf").experiment_id], filter_string="tags.stage = 'pipeline'")
    model_uri = parent.data.tags["model_uri"]
    mlflow.set_tracking_uri(uri)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    frame = pd.DataFrame(
        {
            "sentence": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
            "w": ["the", "old", "dog", "sees", "a", "cat", "this", "man", "runs", "."],
            "pos": ["DT", "JJ", "NN", "VB", "DT", "NN", "DT", "NN", "VB", "."],
        }
    )
    expected = mlflow.pyfunc.load_model(model_uri).predict(frame)

    port = server_helpers.free_port()
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with server_helpers.background_server(command, f"http://127.0.0.1:{port}", "/ping", tmp_path / "serve.log", env) as url:
        answer = _post(f"{url}/invocations", {"dataframe_split": frame.to_dict(orient="split", index=False)})
    served = pd.DataFrame(answer["predictions"])
    pd.testing.assert_frame_equal(served[expected.columns], expected, check_dtype=False)

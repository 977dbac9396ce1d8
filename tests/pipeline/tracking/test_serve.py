"""``mlflow models serve --env-manager local`` answers /invocations as ``predict`` does, in strict
JSON, and a request the model cannot use gets a 400 with a one-line reason and no stack trace."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
import server_helpers  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.tracking import tracking_uri  # noqa: E402

FRAME = pd.DataFrame(
    {
        "sentence": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        "w": ["the", "old", "dog", "sees", "a", "cat", "this", "man", "runs", "."],
        "pos": ["DT", "JJ", "NN", "VB", "DT", "NN", "DT", "NN", "VB", "."],
    }
)


def _refuse_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def _post(url: str, body: dict | bytes) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny pipeline's model served on 127.0.0.1: (URL, the answer predict gives for FRAME)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    tmp_path = tmp_path_factory.mktemp("serve")
    cfg = compose_config(tiny_overrides(write_corpus(tmp_path / "data", n_train=60, n_test=20), tmp_path / "out"))
    run_pipeline(cfg)
    uri = tracking_uri(cfg)
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("crf").experiment_id], filter_string="tags.stage = 'pipeline'")
    model_uri = parent.data.tags["model_uri"]
    mlflow.set_tracking_uri(uri)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    expected = mlflow.pyfunc.load_model(model_uri).predict(FRAME)

    port = server_helpers.free_port()
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with server_helpers.background_server(command, f"http://127.0.0.1:{port}", "/ping", tmp_path / "serve.log", env) as url:
        yield url, expected


@pytest.mark.slow
def test_served_model_answers_like_predict_in_strict_json(served):
    url, expected = served
    status, text = _post(f"{url}/invocations", {"dataframe_split": FRAME.to_dict(orient="split", index=False)})
    assert status == 200, text
    answer = json.loads(text, parse_constant=_refuse_constant)  # no NaN: segment_confidence is null outside chunks
    served_frame = pd.DataFrame(answer["predictions"])
    numbers = {"marginal": float, "segment_confidence": float}  # None (predict) and null (served) both read as NaN
    pd.testing.assert_frame_equal(served_frame[expected.columns].astype(numbers), expected.astype(numbers), check_dtype=False)
    assert any(row["segment_confidence"] is None for row in answer["predictions"])


def _split(rows: list[list], columns: tuple[str, ...] = ("sentence", "w", "pos")) -> dict:
    return {"dataframe_split": {"columns": list(columns), "data": rows}}


BAD = {
    "missing column": (_split([[0, "the"]], ("sentence", "w")), "missing column(s) ['pos']"),
    "missing sentence": (_split([["the", "DT"]], ("w", "pos")), "missing column(s) ['sentence']"),
    "empty frame": (_split([]), "no rows"),
    "number token": (_split([[0, 12, "CD"]]), "row 0 (sentence 0), column 'w': a token must be a non-empty string, got int 12"),
    "null token": (_split([[0, "the", None]]), "column 'pos': a token must be a non-empty string, got null"),
    "NaN token": (b'{"dataframe_split": {"columns": ["sentence", "w", "pos"], "data": [[0, NaN, "DT"]]}}', "got null"),
    "interleaved ids": (_split([[0, "the", "DT"], [1, "dog", "NN"], [0, "ran", "VBD"]]), "row 2: 'sentence' 0 reappears after 1"),
    "mixed ids": (_split([["one", "the", "DT"], [2, "dog", "NN"]]), "row 1: the 'sentence' id int 2 is not a string"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_request_is_a_400_with_a_one_line_reason(served, case):
    url, _ = served
    body, reason = BAD[case]
    status, text = _post(f"{url}/invocations", body)
    assert status == 400, text
    answer = json.loads(text, parse_constant=_refuse_constant)
    assert set(answer) <= {"error_code", "message", "sqlstate", "error_class"}, answer  # no stack_trace
    assert "Traceback" not in text and "\n" not in answer["message"] and reason in answer["message"]

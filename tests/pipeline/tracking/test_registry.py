"""The MLflow Model Registry: a sweep registers its best job on dev and moves the alias; a single
run registers only when asked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import forkserver
import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.tracking import tracking_uri  # noqa: E402

PROJECT = Path(__file__).resolve().parents[3]
EXAMPLE = pd.DataFrame({"sentence": [0, 0, 0, 0], "w": ["the", "dog", "sees", "."], "pos": ["DT", "NN", "VB", "."]})


@pytest.mark.slow
def test_a_sweep_registers_its_best_job_as_champion(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    command = [sys.executable, "-m", "pipeline", "-m", "trainer.c2=0.01,300", *tiny_overrides(data_root, tmp_path / "out")]
    # the jobs one after another in the sweep's process (Hydra's basic launcher): what is registered is decided by the
    # sweep's callback from the jobs' runs, whatever ran them; a joblib pool (two fresh interpreters importing the
    # pipeline, about 12 CPU-s) is tested by tests/pipeline/tracking/test_tracking_live.py
    command += ["trainer.threads=1", "hydra/launcher=basic"]
    done = forkserver.run(command, cwd=PROJECT, env={**env, "MLFLOW_DISABLE_TELEMETRY": "true"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crf").experiment_id
    (sweep,) = client.search_runs([experiment], filter_string="tags.stage = 'sweep'")
    jobs = client.search_runs([experiment], filter_string="tags.stage = 'pipeline'")
    assert sorted(j.info.run_name for j in jobs) == ["conll2000-crf-lbfgs-c2=0.01", "conll2000-crf-lbfgs-c2=300"]
    best, worst = sorted(jobs, key=lambda j: -j.data.metrics["dev_f1"])
    assert best.data.metrics["dev_f1"] > worst.data.metrics["dev_f1"]  # c2=300 over-smooths the tiny model
    # the sweep's parent run is named after what it varies and shows what every job shared
    assert sweep.info.run_name == "conll2000-crf-sweep-c2"
    assert sweep.data.params["trainer.max_iterations"] == "30" and "trainer.c2" not in sweep.data.params

    version = client.get_model_version_by_alias("conll2000-crf", "champion")
    assert version.tags["run_id"] == best.info.run_id and version.tags["sweep_id"] == sweep.data.tags["sweep_id"]
    assert float(version.tags["dev_f1"]) == pytest.approx(best.data.metrics["dev_f1"], abs=1e-4)
    assert float(version.tags["test_f1"]) == pytest.approx(best.data.metrics["test_f1"], abs=1e-4)
    assert sweep.data.tags["registered_model"] == "models:/conll2000-crf@champion"
    champion = mlflow.pyfunc.load_model("models:/conll2000-crf@champion")
    direct = mlflow.pyfunc.load_model(best.data.tags["model_uri"])
    pd.testing.assert_frame_equal(champion.predict(EXAMPLE), direct.predict(EXAMPLE))
    assert "registered the best job as conll2000-crf version 1" in done.stdout + done.stderr


@pytest.mark.slow
def test_a_single_run_registers_only_when_asked(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    cfg = compose_config(tiny_overrides(data_root, tmp_path / "out"))
    run_pipeline(cfg)
    client = MlflowClient(tracking_uri(cfg))
    assert client.search_registered_models() == []
    run_pipeline(compose_config(tiny_overrides(data_root, tmp_path / "out") + ["registry.register=true", "registry.name=tiny"]))
    (model,) = client.search_registered_models()
    assert model.name == "tiny" and {k: str(v) for k, v in model.aliases.items()} == {"champion": "1"}
    version = client.get_model_version("tiny", "1")
    latest = client.search_runs(
        [client.get_experiment_by_name("crf").experiment_id],
        filter_string="tags.stage = 'pipeline'",
        order_by=["start_time DESC"],
    )[0]
    assert version.tags["run_id"] == latest.info.run_id and float(version.tags["test_f1"]) > 50
    mlflow.set_tracking_uri(tracking_uri(cfg))
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    assert len(mlflow.pyfunc.load_model("models:/tiny@champion").predict(EXAMPLE)) == 4

"""Against real processes: an MLflow tracking server over HTTP, and Hydra multirun sweeps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
import server_helpers  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.sweeps import compare  # noqa: E402
from pipeline.tracking import CACHE_SOURCE_TAG  # noqa: E402

PROJECT = Path(__file__).resolve().parents[3]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 with a SQLite backend; stopped after the test."""
    with server_helpers.mlflow_server(
        f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts", tmp_path / "server.log"
    ) as url:
        yield url


@pytest.mark.slow
def test_pipeline_against_a_live_tracking_server(tmp_path, mlflow_server, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    cfg = compose_config(tiny_overrides(data_root, tmp_path / "out") + ["tracking=server", f"tracking.uri={mlflow_server}"])
    results = run_pipeline(cfg)
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("crf")
    runs = client.search_runs([experiment.experiment_id])
    parent = [r for r in runs if r.data.tags.get("stage") == "pipeline"]
    assert len(parent) == 1 and len(runs) == 5
    assert parent[0].data.metrics["test_f1"] == pytest.approx(results["evaluate.test_f1"])
    train = [r for r in runs if r.data.tags.get("stage") == "train"][0]
    assert train.data.tags["mlflow.parentRunId"] == parent[0].info.run_id
    assert len(client.get_metric_history(train.info.run_id, "loss")) == int(train.data.metrics["iterations"])
    names = {a.path for a in client.list_artifacts(train.info.run_id, "train")}
    assert "train/model.npz" in names
    # the artifact went through the server into its artifact store
    assert list((tmp_path / "artifacts").rglob("model.npz"))


JOBLIB_TWO_AT_A_TIME = ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")


def _multirun(tmp_path: Path, data_root: Path, sweep: list[str], launcher=JOBLIB_TWO_AT_A_TIME) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "-m",
        *sweep,
        *tiny_overrides(data_root, tmp_path / "out"),
        "trainer.threads=1",
        *launcher,
    ]
    return forkserver.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)


def _sweep_runs(tmp_path: Path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    (sweep,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'sweep'")
    jobs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    return client, sweep, jobs


@pytest.mark.slow
def test_sweep_of_two_jobs_in_parallel(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    done = _multirun(tmp_path, data_root, ["trainer.c2=0.1,3"])
    assert done.returncode == 0, done.stderr[-3000:]
    client, sweep, jobs = _sweep_runs(tmp_path)
    assert len(jobs) == 2 and {float(j.data.params["trainer.c2"]) for j in jobs} == {0.1, 3.0}
    assert all(j.data.tags["sweep_id"] == sweep.data.tags["sweep_id"] for j in jobs)
    assert all(j.data.tags["mlflow.parentRunId"] == sweep.info.run_id for j in jobs)
    # the two jobs ran at the same time, in different processes (joblib)
    first, second = sorted(jobs, key=lambda j: j.info.start_time)
    assert second.info.start_time < first.info.end_time
    assert sweep.info.status == "FINISHED"
    assert sweep.data.metrics["jobs_finished"] == 2 and "best_test_score" in sweep.data.metrics
    assert {"sweep_summary.csv", "sweep_summary.md", "sweep.png"} <= {a.path for a in client.list_artifacts(sweep.info.run_id)}
    assert "best on dev" in done.stdout
    # each job's lines carry its number and swept value, on the console and in the job's own log file
    assert "[#0 trainer.c2=0.1] iter" in done.stdout and "[#1 trainer.c2=3] done: run" in done.stdout
    (job_log,) = (tmp_path / "out" / "hydra" / "multirun").glob("*/0/pipeline.log")
    assert "[#0 trainer.c2=0.1] iter" in job_log.read_text() and "trainer.c2=3" not in job_log.read_text()


@pytest.mark.slow
def test_a_failing_job_does_not_lose_the_others(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    # the second job's test file is cut off: it fails once its run has started, as the file is read (a
    # bad setting or a missing file would stop the whole sweep before any job: tests/faults/test_fault_sweep_data.py)
    test_file = data_root / "conll2000" / "test.txt.gz"
    (data_root / "conll2000" / "cut.txt.gz").write_bytes(test_file.read_bytes()[:-40])
    done = _multirun(tmp_path, data_root, ["dataset.files.test.path=conll2000/test.txt.gz,conll2000/cut.txt.gz"])
    assert done.returncode != 0  # Hydra reports the failure ...
    client, sweep, jobs = _sweep_runs(tmp_path)
    statuses = sorted(j.info.status for j in jobs)
    assert statuses == ["FAILED", "FINISHED"]  # ... but the good job's run and results survive
    assert sweep.info.status == "FAILED"
    assert sweep.data.metrics["jobs_finished"] == 1 and sweep.data.metrics["jobs_failed"] == 1
    assert "sweep_summary.csv" in {a.path for a in client.list_artifacts(sweep.info.run_id)}
    assert "registered_model" not in sweep.data.tags and not client.search_registered_models()  # a failed sweep moves no alias


@pytest.mark.slow
def test_hmm_versus_crf_comparison_end_to_end(tmp_path):
    """experiment=hmm_vs_crf on a small sample: both families at both orders on the same data, and
    the comparison (table, significance for each pair that changes one factor, per-label F1,
    learning curve) on the parent run. The jobs run one after another in the sweep's process
    (Hydra's basic launcher): the comparison reads the jobs' runs, whatever ran them, and a joblib
    pool (two fresh interpreters importing the pipeline, about 12 CPU-s) is tested above."""
    data_root = write_corpus(tmp_path / "data", n_train=80, n_test=30)
    sweep = ["+experiment=hmm_vs_crf", "data.train_fraction=1.0"]
    done = _multirun(tmp_path, data_root, sweep, launcher=["hydra/launcher=basic"])
    assert done.returncode == 0, done.stderr[-3000:]
    client, sweep, jobs = _sweep_runs(tmp_path)
    arms = {(j.data.tags["model"], int(j.data.params["model.order"])): j for j in jobs}
    assert sorted(arms) == [("crf", 1), ("crf", 2), ("hmm", 1), ("hmm", 2)]
    assert all(j.info.status == "FINISHED" for j in jobs)
    # identical splits: every arm saw the same training tokens
    assert len({j.data.metrics["data.train_tokens"] for j in jobs}) == 1
    assert "featurize" not in {
        r.data.tags.get("stage")
        for r in client.search_runs(
            [sweep.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{arms[('hmm', 1)].info.run_id}'"
        )
    }
    metrics = sweep.data.metrics
    for (family, order), job in arms.items():
        arm = f"{family}{order}"
        assert metrics[f"{arm}_accuracy"] == pytest.approx(job.data.metrics["test_accuracy"])
        assert metrics[f"{arm}_model_bytes"] > 0 and metrics[f"{arm}_tag_tokens_per_second"] > 0
    for second, first in (("crf1", "hmm1"), ("crf2", "hmm2"), ("hmm2", "hmm1"), ("crf2", "crf1")):
        assert 0.0 <= metrics[f"p_mcnemar_{second}_vs_{first}"] <= 1.0
        assert 0.0 <= metrics[f"p_bootstrap_f1_{second}_vs_{first}"] <= 1.0
    artifacts = {a.path for a in client.list_artifacts(sweep.info.run_id)}
    assert {
        "comparison.csv",
        "comparison.md",
        "per_label_f1.csv",
        "learning_curve.csv",
        "learning_curve.png",
        "bootstrap.csv",
    } <= artifacts
    assert "HMM versus CRF" in done.stdout and sweep.info.status == "FINISHED"


def test_comparison_reads_a_cached_evaluate_stage_from_the_run_that_computed_it(tmp_path, monkeypatch):
    """A job whose evaluate stage came from the cache logs no files of its own; the comparison must
    fetch its test predictions from the run named by its cache-source tag (it failed on AnyStyle)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("compare", (tmp_path / "artifacts").as_uri()))
    predictions = tmp_path / "predictions_test.tsv.gz"
    pd.DataFrame({"sentence": [0, 0], "token": [0, 1], "gold": ["B-NP", "O"], "predicted": ["B-NP", "O"]}).to_csv(
        predictions, sep="\t", index=False
    )
    with mlflow.start_run() as first:
        with mlflow.start_run(nested=True, tags={"stage": "evaluate"}) as computed:
            mlflow.log_artifact(str(predictions), artifact_path="evaluate")
    with mlflow.start_run() as second:
        with mlflow.start_run(nested=True, tags={"stage": "evaluate", CACHE_SOURCE_TAG: computed.info.run_id}):
            pass
    for run in (first, second):
        frame = compare.test_predictions(run.info.run_id, "compare")
        assert frame["predicted"].tolist() == ["B-NP", "O"]


def test_a_sweep_whose_summary_fails_ends_failed_with_the_reason(tmp_path, monkeypatch):
    """The jobs' runs stand, but a sweep parent run without its summary must not read FINISHED."""
    from pipeline.sweeps.callback import SweepTracking
    from pipeline.tracking.lifecycle import END_REASON_TAG

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.set_experiment("sweeps")
    client = MlflowClient()
    parent = client.create_run(experiment.experiment_id, tags={"stage": "sweep"})

    def broken_summary(*args):
        raise RuntimeError("no predictions to compare")

    monkeypatch.setattr(compare, "summarize", broken_summary)
    callback = SweepTracking()
    callback.parent_run_id, callback.sweep_id, callback.experiment = parent.info.run_id, "s1", "sweeps"
    callback.comparison, callback.summary = {"bootstrap_samples": 10}, "comparison"
    with pytest.raises(RuntimeError, match="no predictions"):
        callback.on_multirun_end(config=None)
    run = client.get_run(parent.info.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[END_REASON_TAG] == "summary failed: RuntimeError: no predictions to compare"

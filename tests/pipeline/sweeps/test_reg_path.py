"""+experiment=reg_path: a warm-started regularisation path in one job, its child runs, summary and cache."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from pipeline_helpers import compose_config, seed_store, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.validate import SettingsError  # noqa: E402
from pipeline.models.crf import build_model  # noqa: E402
from pipeline.stages.featurize import load_batch  # noqa: E402
from pipeline.stages.prepare import read_prepared  # noqa: E402
from pipeline.sweeps.path import path_strengths, run_path  # noqa: E402


def test_path_settings_are_checked_before_any_work(tmp_path):
    base = ["+experiment=reg_path", f"paths.output_dir={tmp_path}"]
    assert path_strengths(compose_config(base + ["path.strengths=[0.1,10,1]"])) == [10.0, 1.0, 0.1]  # strongest first
    assert path_strengths(compose_config(base + ["trainer=elasticnet"])) == [10.0, 1.0, 0.1, 0.01]
    for bad, message in (
        ("path.strengths=[1,-1]", "-1 is not a positive number"),
        ("path.strengths=[1,1]", "a strength is repeated"),
        ("path.strengths=[]", "a list of regularisation strengths"),
        ("trainer.c2=0.5", "does not set c1 or c2 of trainer=lbfgs"),
    ):
        with pytest.raises(SettingsError, match=message):
            path_strengths(compose_config(base + [bad]))
    with pytest.raises(SettingsError, match="needs a model that warm-starts"):
        run_path(compose_config(base + ["model=hmm"]))
    with pytest.raises(SettingsError, match="trainer.algorithm=pa: a regularisation path needs a trainer that warm-starts"):
        run_path(compose_config(base + ["trainer.algorithm=pa"]))
    with pytest.raises(SettingsError, match=r"path.strengths: at strength 1e\+300, .*c2=1e\+300 is above 1e\+12"):
        run_path(compose_config(base + ["path.strengths=[1e300,1]"]))  # each point as a run's c2 is checked
    assert not (tmp_path / "cache").exists()


def _cold_iterations(cfg, tags: dict[str, dict[str, str]]) -> int:
    """The iterations of ``cfg``'s fit from zero weights, on the prepared data and features that a
    path point's stage runs (``tags``: their tags by stage) read from the cache."""
    data = read_prepared(Path(tags["prepare"]["cache_path"]))
    features = Path(tags["featurize"]["cache_path"])
    model = build_model(*(OmegaConf.to_container(cfg[s], resolve=True) for s in ("model", "trainer")), int(cfg.seed), 0, 1)
    model.fit(load_batch(features, "train"), data.labels("train"))
    return int(model.n_iter_)


def test_path_of_three_points_warm_starts_and_summarises_like_a_grid(tmp_path):
    data_root = write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    seed_store(out)
    common = tiny_overrides(data_root, out) + ["trainer.max_iterations=200"]  # no point stops at the cap
    results = run_path(compose_config(common + ["+experiment=reg_path", "path.strengths=[3,1,0.3]"]))
    assert results["path.best_strength"] in (3.0, 1.0, 0.3) and results["evaluate.dev_f1"] > 80

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf").experiment_id
    (path_run,) = client.search_runs([experiment], filter_string="tags.stage = 'path'")
    points = client.search_runs([experiment], filter_string="tags.stage = 'pipeline'")
    assert len(points) == 3 and path_run.info.status == "FINISHED"
    assert all(p.data.tags["mlflow.parentRunId"] == path_run.info.run_id for p in points)
    assert {p.data.tags["path_id"] for p in points} == {path_run.data.tags["path_id"]}
    by_strength = {float(p.data.params["trainer.strength"]): p for p in points}
    assert sorted(by_strength) == [0.3, 1.0, 3.0]
    assert [by_strength[s].data.tags["path_point"] for s in (3.0, 1.0, 0.3)] == ["0", "1", "2"]
    assert by_strength[1.0].info.run_name == "conll2000-crf-lbfgs-strength=1"
    # each point: a normal run's stage runs, evaluation and artifacts, its MLflow Model
    stage_tags = {}
    for point in points:
        assert point.info.status == "FINISHED" and "dev_f1" in point.data.metrics and "model_uri" in point.data.tags
        stages = {
            r.data.tags["stage"]: r
            for r in client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{point.info.run_id}'")
        }
        assert set(stages) == {"prepare", "featurize", "train", "evaluate"}
        assert "evaluate/metrics.json" in {a.path for a in client.list_artifacts(stages["evaluate"].info.run_id, "evaluate")}
        assert "train/model.npz" in {a.path for a in client.list_artifacts(stages["train"].info.run_id, "train")}
        stage_tags[float(point.data.params["trainer.strength"])] = {name: run.data.tags for name, run in stages.items()}
    trains = {strength: tags["train"] for strength, tags in stage_tags.items()}
    assert "warm_start_from" not in trains[3.0]  # the strongest point starts from zero, each next one from the last
    assert trains[1.0]["warm_start_from"] == trains[3.0]["cache_path"]
    assert trains[0.3]["warm_start_from"] == trains[1.0]["cache_path"]
    # the grid's summary on the path's run; the best point registered (a path on its own)
    assert path_run.data.metrics["jobs_finished"] == 3 and "best_dev_score" in path_run.data.metrics
    assert path_run.data.tags["registered_model"] == "models:/conll2000-crf@champion"
    assert {"sweep_summary.csv", "sweep_summary.md", "sweep.png"} <= {a.path for a in client.list_artifacts(path_run.info.run_id)}
    summary = pd.read_csv(client.download_artifacts(path_run.info.run_id, "sweep_summary.csv", str(tmp_path)))
    assert sorted(summary["strength"]) == [0.3, 1.0, 3.0]
    # the same strengths fitted from zero, on the points' own prepared data and features, need more iterations
    for strength in (1.0, 0.3):
        warm = int(by_strength[strength].data.metrics["iterations"])
        cold = _cold_iterations(compose_config(common + [f"trainer.strength={strength}"]), stage_tags[strength])
        assert cold > warm, (strength, cold, warm)
    # the first (cold) point shares its cache entry with an ordinary run of that strength
    run_pipeline(compose_config(common + ["trainer.strength=3.0", "stages=[train]"]))
    latest = client.search_runs([experiment], filter_string="tags.stage = 'pipeline'", order_by=["start_time DESC"])[0]
    assert latest.data.tags["cache_hits"] == "prepare,featurize,train"

    # the path again: every point's train and evaluate come from the cache (warm-start keys included)
    run_path(compose_config(common + ["+experiment=reg_path", "path.strengths=[3,1,0.3]", "sweep.summarize=false"]))
    again = client.search_runs([experiment], filter_string="tags.stage = 'path'", order_by=["start_time DESC"])[0]
    points = client.search_runs(
        [experiment], filter_string=f"tags.path_id = '{again.data.tags['path_id']}' and tags.stage = 'pipeline'"
    )
    assert len(points) == 3 and {p.data.tags["cache_hits"] for p in points} == {"prepare,featurize,train,evaluate"}


def test_a_point_that_stopped_at_its_iteration_cap_is_no_starting_point(tmp_path, caplog):
    """From a fit cut short by trainer.max_iterations the next fit would carry its training on (to
    a model that neither strength gives from zero): the next point starts from zero."""
    data_root = write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    seed_store(out)
    overrides = tiny_overrides(data_root, out) + ["trainer.max_iterations=3", "+experiment=reg_path", "path.strengths=[3,1]"]
    run_path(compose_config(overrides))
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf").experiment_id
    trains = client.search_runs([experiment], filter_string="tags.stage = 'train'")
    assert len(trains) == 2 and all(t.data.metrics["stopped_at_max_iterations"] == 1 for t in trains)
    assert not any("warm_start_from" in t.data.tags for t in trains)
    assert (
        "point 1 it stopped at its iteration cap (trainer.max_iterations), short of its optimum: the next point starts from zero"
        in caplog.text
    )

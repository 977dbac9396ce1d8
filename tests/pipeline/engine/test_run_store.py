"""The runner records runs only through the engine's ``RunStore`` interface: an in-memory store that
implements it receives everything the MLflow store would (the same runs, names, tags, params,
metrics and cache keys), and the MLflow store implements every method of the interface."""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from omegaconf import open_dict

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.engine import runner  # noqa: E402
from pipeline.engine.stage import TRIAL_STATE_TAG, LoggedModel, TrainingStopped  # noqa: E402
from pipeline.engine.store import (  # noqa: E402
    CACHE_SOURCE_TAG,
    MODEL_URI_TAG,
    SWEEP_PARENT_VARIABLE,
    CachedRun,
    RunRef,
    RunStore,
    Standing,
)
from pipeline.engine.validate import SettingsError  # noqa: E402

STAGES = ["prepare", "featurize", "train", "evaluate"]
TIMING = ("seconds", "per_second", "elapsed")  # metrics that measure time: differ between identical runs


class MemoryStore:
    """A :class:`RunStore` that keeps every run in a list (no MLflow)."""

    def __init__(self) -> None:
        self.runs: list[dict] = []
        self.open_runs: list[dict] = []
        self.opened: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.registered: list[dict] = []
        self.failed: list[dict] = []
        self._ids = itertools.count()

    def open(self, cfg) -> None:
        self.opened.append(str(cfg.tracking.experiment))

    def remote_cache(self):
        return None

    def source_tags(self) -> dict[str, str]:
        return {"source": "memory"}

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, str], parent: str | None = None, nested: bool = False):
        record = {
            "id": f"run{next(self._ids)}",
            "name": name,
            "parent": self.open_runs[-1]["id"] if nested else parent,
            "tags": dict(tags),
            "params": {},
            "metrics": [],
            "steps": [],
            "artifacts": [],
            "models": [],
            "dataset": None,
            "status": "RUNNING",
        }
        self.runs.append(record)
        self.open_runs.append(record)
        try:
            yield RunRef(record["id"], "memory")
        except BaseException:
            if record in self.open_runs:
                self.end_run("FAILED")
            raise
        if record in self.open_runs:
            self.end_run("FINISHED")

    def end_run(self, status: str, reason: str | None = None) -> None:
        record = self.open_runs.pop()
        if reason is not None:
            record["tags"]["end_reason"] = reason
        record["status"] = status

    def _open(self) -> dict:
        return self.open_runs[-1]

    def log_params(self, params: Mapping[str, str]) -> None:
        assert all(isinstance(v, str) for v in params.values())
        self._open()["params"].update(params)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        self._open()["metrics"].extend((k, float(v)) for k, v in metrics.items())

    def log_steps(self, batch: list[tuple[int, dict[str, float]]]) -> None:
        if self.open_runs:
            self._open()["steps"].extend((step, k, v) for step, values in batch for k, v in values.items())

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._open()["tags"].update(tags)

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        assert Path(path).is_file()
        self._open()["artifacts"].append(f"{folder}/{Path(path).name}" if folder else Path(path).name)

    def log_dataset(self, name: str, files: Mapping[str, Path], file_hashes: Mapping[str, str]) -> None:
        self._open()["dataset"] = (name, sorted(files), dict(file_hashes))

    def tag_evaluation(self, dataset: Mapping, file_hashes: Mapping[str, str]) -> str:
        key = f"{dataset['name']}:{sorted(file_hashes.items())}"
        self._open()["tags"]["evaluation"] = key
        return key

    def cache_source(self, stage: str, key: str) -> CachedRun | None:
        for record in reversed(self.runs):
            tags = record["tags"]
            if record["status"] == "FINISHED" and (tags.get("stage"), tags.get("cache_key"), tags.get("cache")) == (
                stage,
                key,
                "miss",
            ):
                return CachedRun(record["id"], tags.get(MODEL_URI_TAG))
        return None

    def log_model(self, model: LoggedModel) -> str:
        assert model.bundle.is_file()
        record = self._open()
        record["models"].append(model.bundle)
        return f"memory:/{record['id']}/model"

    def link_model(self, run_id: str, model_uri: str) -> None:
        self.links.append((run_id, model_uri))

    def register_model(self, model_uri, name, alias, tags, standing: Standing | None, force_alias) -> str:
        self.registered.append({"uri": model_uri, "name": name, "alias": alias, "tags": dict(tags), "standing": standing})
        return str(len(self.registered))

    def rename_run(self, run_id: str, name: str) -> None:
        next(r for r in self.runs if r["id"] == run_id)["name"] = name

    def handoff_lines(self, run_id: str, stage: str, bundle: Path) -> list[str]:
        return [f"{stage} run of {run_id}", f"bundle: {bundle}"]

    def write_note(self, scores: Mapping[str, float], handoff: Sequence[str], cached: int, stages: int) -> None:
        self._open()["note"] = (dict(scores), list(handoff), cached, stages)

    def run_link(self, run: RunRef) -> str:
        return f"memory:{run.run_id}"

    def record_failed_run(self, name: str, tags: Mapping[str, str], params: Mapping[str, str], parent: str, reason: str) -> None:
        self.failed.append({"name": name, "tags": dict(tags), "params": dict(params), "parent": parent, "reason": reason})

    # what the tests read
    def by_stage(self, stage: str) -> list[dict]:
        return [r for r in self.runs if r["tags"].get("stage") == stage]

    def metrics(self, record: dict) -> dict[str, float]:
        """A run's metrics as MLflow shows them: each one's value at its last step (plain ones at step 0)."""
        latest: dict[str, tuple[int, float]] = {}
        for step, key, value in [(0, k, v) for k, v in record["metrics"]] + record["steps"]:
            if key not in latest or step >= latest[key][0]:
                latest[key] = (step, value)
        return _untimed({k: v for k, (_, v) in latest.items()})


def _untimed(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not any(t in k for t in TIMING)}


def _interface() -> set[str]:
    return {name for name in vars(RunStore) if not name.startswith("_")}


def test_the_memory_store_and_the_mlflow_store_implement_every_method_of_the_interface():
    from pipeline.tracking.run_store import MlflowRunStore

    methods = _interface()
    assert {"run", "end_run", "log_params", "log_metrics", "log_steps", "cache_source", "log_model"} <= methods
    assert methods <= set(vars(MemoryStore))
    assert methods <= set(vars(MlflowRunStore)), methods - set(vars(MlflowRunStore))  # none left to the Protocol's "..."


@pytest.fixture(autouse=True)
def _no_sweep(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", SWEEP_PARENT_VARIABLE, "CRF_SWEEP_ID"):
        monkeypatch.delenv(name, raising=False)


def _mlflow_runs(tiny) -> dict:
    """The fixture's pipeline run and its stage runs, as MLflow recorded them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tiny.uri)
    parent = client.get_run(tiny.parent_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{tiny.parent_id}'")
    return {"pipeline": parent, **{run.data.tags["stage"]: run for run in children}}


def test_a_run_through_the_memory_store_records_what_mlflow_recorded(tiny_pipeline, tmp_path):
    """The fixture's config again (its stage cache: every stage a hit), recorded in memory: the same
    results, run names, stage tags, params, metrics and cache keys as the MLflow store's."""
    cfg = copy.deepcopy(tiny_pipeline.cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.cache_dir = str(tiny_pipeline.out / "cache")
    store = MemoryStore()
    results = runner.run_pipeline(cfg, store)
    assert results == tiny_pipeline.results  # every stage from the cache: its metrics files
    assert store.opened == ["crf"] and not store.open_runs
    recorded = _mlflow_runs(tiny_pipeline)
    (pipeline,) = store.by_stage("pipeline")
    assert pipeline["name"] == recorded["pipeline"].info.run_name + "-cached"  # the fixture's run computed its stages
    assert pipeline["status"] == "FINISHED" and pipeline["parent"] is None
    assert pipeline["tags"]["cache_hits"] == ",".join(STAGES) and pipeline["tags"]["cache_only"] == "true"
    assert pipeline["artifacts"] == ["config.yaml"]
    assert [r["name"] for r in store.runs[1:]] == STAGES
    assert all(r["parent"] == pipeline["id"] and r["status"] == "FINISHED" for r in store.runs[1:])
    mlflow_params = recorded["pipeline"].data.params
    assert {k: v for k, v in pipeline["params"].items() if not k.startswith("paths.")} == {
        k: v for k, v in mlflow_params.items() if not k.startswith("paths.")
    }
    assert store.metrics(pipeline) == _untimed(recorded["pipeline"].data.metrics)
    for stage in STAGES:
        (memory,) = store.by_stage(stage)
        mlflow_run = recorded[stage]
        for tag in ("stage", "cache_key", "dataset", "model", "trainer", "features"):
            assert memory["tags"][tag] == mlflow_run.data.tags[tag], (stage, tag)
        assert memory["tags"]["cache"] == "hit" and mlflow_run.data.tags["cache"] == "miss"
        assert memory["params"] == mlflow_run.data.params
        assert store.metrics(memory) == _untimed(mlflow_run.data.metrics), stage
        assert CACHE_SOURCE_TAG not in memory["tags"]  # the run that computed the entry is in another store
    # with no source run in this store, the files and the model are logged here
    (train,) = store.by_stage("train")
    assert train["models"] and train["tags"][MODEL_URI_TAG] == f"memory:/{train['id']}/model"
    assert train["artifacts"] and all(a.startswith("train/") for a in train["artifacts"])
    assert {step for step, _, _ in train["steps"]}  # the cached training history, re-logged as steps
    assert pipeline["tags"][MODEL_URI_TAG] == train["tags"][MODEL_URI_TAG]
    assert store.links == [(pipeline["id"], train["tags"][MODEL_URI_TAG])]
    assert pipeline["dataset"][0] == "conll2000" and pipeline["dataset"][1] == ["file:test", "file:train"]
    scores, handoff, cached, stages = pipeline["note"]
    assert scores and cached == stages == 4 and handoff[0] == f"train run of {pipeline['id']}"
    assert not store.registered and not store.failed


def test_cache_hits_point_at_the_run_that_computed_them_and_a_stopped_training_ends_killed(tmp_path):
    """Misses, then hits that name their source run (no files or model logged again); then a trial
    whose dev reporter stops the training: train and pipeline runs end KILLED, tagged PRUNED."""
    data_root = write_corpus(tmp_path / "data", n_train=40, n_test=10)
    cfg = compose_config(tiny_overrides(data_root, tmp_path / "out"))
    store = MemoryStore()
    first = runner.run_pipeline(cfg, store)
    computed = {r["name"]: r for r in store.runs[1:]}
    assert [r["tags"]["cache"] for r in computed.values()] == ["miss"] * 4
    assert all(r["tags"]["source"] == "memory" for r in store.runs)  # the store's source tags on every run
    runs_before = len(store.runs)
    second = runner.run_pipeline(cfg, store)
    assert second == first
    hits = store.runs[runs_before + 1 :]
    assert [r["name"] for r in hits] == STAGES
    for hit in hits:
        source = computed[hit["name"]]
        assert hit["tags"][CACHE_SOURCE_TAG] == source["id"] and hit["tags"]["cache_key"] == source["tags"]["cache_key"]
        assert not hit["artifacts"] and not hit["models"]
    assert hits[2]["tags"][MODEL_URI_TAG] == computed["train"]["tags"][MODEL_URI_TAG]
    assert store.runs[runs_before]["name"].endswith("-cached")

    class StopAtOnce:
        """A trial whose pruner stops the training at the first dev score."""

        def tags(self) -> dict[str, str]:
            return {"trial": "7"}

        def begin(self, cfg, job):
            assert job.store is store

            def report(iteration, scores):
                raise TrainingStopped("pruned by the test", iteration, "dev_f1", float(scores["dev_f1"]))

            return report, {}

        def end(self, cfg, job, results, outputs):
            self.results = results

    trial = StopAtOnce()
    changed = compose_config(tiny_overrides(data_root, tmp_path / "out") + ["trainer.c2=0.5"])
    runs_before = len(store.runs)
    results = runner.run_pipeline(changed, store, trial)
    assert results == trial.results and results["pipeline.pruned_at_iteration"] == 5  # train.dev_every=5
    pipeline, *stages = store.runs[runs_before:]
    assert [r["name"] for r in stages] == ["prepare", "featurize", "train"]
    for record in (pipeline, stages[-1]):
        assert record["status"] == "KILLED" and record["tags"][TRIAL_STATE_TAG] == "PRUNED"
        assert record["tags"]["end_reason"] == "pruned by the test" and record["tags"]["trial"] == "7"
        assert dict(record["metrics"])["pruned_at_iteration"] == 5.0
    assert not store.open_runs
    assert not (tmp_path / "out" / "cache" / "train" / stages[-1]["tags"]["cache_key"]).exists()  # nothing cached


def test_a_sweep_job_with_bad_settings_is_recorded_as_a_failed_run(tmp_path, monkeypatch):
    monkeypatch.setenv(SWEEP_PARENT_VARIABLE, "sweep-run")
    data_root = write_corpus(tmp_path / "data", n_train=10, n_test=5)
    cfg = compose_config(tiny_overrides(data_root, tmp_path / "out") + ["trainer.c2=-1"])
    store = MemoryStore()
    with pytest.raises(SettingsError, match="trainer.c2"):
        runner.run_pipeline(cfg, store)
    (failed,) = store.failed
    assert failed["parent"] == "sweep-run" and "trainer.c2" in failed["reason"]
    assert failed["tags"]["stage"] == "pipeline" and failed["name"] == "conll2000-crf-lbfgs"
    assert failed["params"]["trainer.c2"] == "-1" and not store.runs

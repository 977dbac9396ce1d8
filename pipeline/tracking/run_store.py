"""The engine's run store (:class:`pipeline.engine.store.RunStore`) in MLflow.

Runs are MLflow runs opened with its fluent API (a stage run nested in its pipeline run), in the
store and experiment :func:`pipeline.tracking.setup` chooses from the config; the stage cache's
remote is the tracking store itself when other machines share it
(:mod:`pipeline.tracking.remote_cache`). ``pipeline.__main__`` builds one and hands it to the runner.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from pipeline import tracking
from pipeline.engine.cache import RemoteStore
from pipeline.engine.stage import LoggedModel
from pipeline.engine.store import CachedRun, RunRef, RunStore, Standing
from pipeline.tracking import champion
from pipeline.tracking.lifecycle import END_REASON_TAG
from pipeline.tracking.remote_cache import remote_for

__all__ = ["END_REASON_TAG", "MlflowRunStore"]

log = logging.getLogger(__name__)


class MlflowRunStore(RunStore):
    """The MLflow tracking store as the runner's :class:`~pipeline.engine.store.RunStore`.

    The store's location and experiment come from the config given to :meth:`open`
    (:func:`pipeline.tracking.setup`); :attr:`uri` is the tracking URI after that. The methods do
    what :class:`~pipeline.engine.store.RunStore` says (their docstrings are its).
    """

    def __init__(self) -> None:
        self.uri: str | None = None
        self.experiment: str | None = None

    def open(self, cfg: DictConfig) -> None:
        self.uri = tracking.setup(cfg)
        self.experiment = str(cfg.tracking.experiment)

    def client(self) -> MlflowClient:
        """A client of the opened store."""
        return MlflowClient(self.uri)

    def remote_cache(self) -> RemoteStore | None:
        return remote_for(self.uri) if self.uri is not None else None

    def source_tags(self) -> dict[str, str]:
        return tracking.source_tags()

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, str], parent: str | None = None, nested: bool = False) -> Iterator[RunRef]:
        with mlflow.start_run(run_name=name, tags=dict(tags), nested=nested, parent_run_id=parent or None) as active:
            yield RunRef(active.info.run_id, active.info.experiment_id)

    def end_run(self, status: str, reason: str | None = None) -> None:
        if reason is not None:
            mlflow.set_tag(END_REASON_TAG, reason)
        mlflow.end_run(status)

    def log_params(self, params: Mapping[str, str]) -> None:
        tracking.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        mlflow.log_metrics(dict(metrics))

    def log_steps(self, batch: list[tuple[int, dict[str, float]]]) -> None:
        run = mlflow.active_run()
        if run is not None and batch:  # one log_batch: MLflow splits it into the sizes it allows
            now = int(time.time() * 1000)
            metrics = [Metric(key, float(value), now, int(step)) for step, values in batch for key, value in values.items()]
            MlflowClient().log_batch(run.info.run_id, metrics=metrics)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        mlflow.set_tags(dict(tags))

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        mlflow.log_artifact(str(path), artifact_path=folder)

    def log_dataset(self, name: str, files: Mapping[str, Path], file_hashes: Mapping[str, str]) -> None:
        tracking.log_dataset(name, files, file_hashes)

    def tag_evaluation(self, dataset: Mapping[str, Any], file_hashes: Mapping[str, str]) -> str:
        evaluation = champion.evaluation_key(dataset, file_hashes)
        mlflow.set_tag(champion.EVALUATION_RUN_TAG, evaluation)
        return evaluation

    def cache_source(self, stage: str, key: str) -> CachedRun | None:
        source = tracking.cache_source_run(stage, key)
        if source is None:
            return None
        return CachedRun(source.info.run_id, source.data.tags.get(tracking.MODEL_URI_TAG))

    def log_model(self, model: LoggedModel) -> str:
        return tracking.log_bundle_model(model.bundle, model.example)

    def link_model(self, run_id: str, model_uri: str) -> None:
        tracking.link_model(self.client(), run_id, model_uri)

    def register_model(
        self, model_uri: str, name: str, alias: str | None, tags: Mapping[str, str], standing: Standing | None, force_alias: bool
    ) -> str:
        judged = None
        if standing is not None:
            judged = champion.Standing(standing.metric, standing.value, "maximize", standing.evaluation)
        version, _ = tracking.register_model(model_uri, name, alias, tags, judged, force_alias)
        return str(version.version)

    def rename_run(self, run_id: str, name: str) -> None:
        self.client().update_run(run_id, name=name)

    def handoff_lines(self, run_id: str, stage: str, bundle: Path) -> list[str]:
        return tracking.handoff_lines(self.client(), self.uri, run_id, stage, bundle)

    def write_note(self, scores: Mapping[str, float], handoff: Sequence[str], cached: int, stages: int) -> None:
        mlflow.set_tag(tracking.NOTE_TAG, tracking.run_note(scores, handoff, cached, stages))

    def run_link(self, run: RunRef) -> str:
        return tracking.store_hint(self.uri, run.run_id, run.experiment_id)

    def record_failed_run(self, name: str, tags: Mapping[str, str], params: Mapping[str, str], parent: str, reason: str) -> None:
        client = mlflow.tracking.MlflowClient()
        experiment = client.get_experiment_by_name(self.experiment)
        all_tags = {**tags, "mlflow.parentRunId": parent, END_REASON_TAG: reason}
        run = client.create_run(experiment.experiment_id, run_name=name, tags=all_tags)
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in tracking.shown_params(params).items()])
        client.set_terminated(run.info.run_id, "FAILED")

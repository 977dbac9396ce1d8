"""The MLflow tracking store as the stage cache shared by machines.

When the tracking store is shared (a tracking server, or a PostgreSQL/MySQL database), every stage
run that computes an entry uploads the whole entry (its files and ``manifest.json``) to its
artifacts under ``cache/`` and tags itself ``cache_artifacts=cache``. A job on any machine that
misses its local cache searches the experiment for a FINISHED run with the same ``cache_key`` tag
and that upload, downloads it and, once the cache has verified it against its manifest, uses it
as a local copy; its own stage run is tagged ``cache_fetched_from=<run id>`` (and, as for any hit,
``cache_source_run_id``). A local SQLite store is one machine's: no upload, no remote lookup.
"""

from __future__ import annotations

import logging
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from pipeline import tracking
from pipeline.engine.cache import MANIFEST, RemoteStore

ARTIFACT_PATH = "cache"  # where a stage run holds its cache entry
UPLOAD_TAG = "cache_artifacts"
FETCHED_TAG = "cache_fetched_from"
SHARED_SCHEMES = ("http://", "https://", "postgresql", "mysql", "mssql", "databricks")

log = logging.getLogger(__name__)


def is_shared(uri: str) -> bool:
    """Whether the tracking store ``uri`` can be reached from other machines (not SQLite or files)."""
    return uri.startswith(SHARED_SCHEMES)


class TrackingStore(RemoteStore):
    """The :class:`pipeline.engine.cache.RemoteStore` in the active MLflow run's experiment."""

    def __init__(self) -> None:
        self._fetched: dict[tuple[str, str], str] = {}  # (stage, key) -> run id of the last download

    def find(self, stage: str, key: str):
        """The latest FINISHED run of ``stage`` that uploaded the entry ``key``, or None."""
        return tracking.latest_stage_run(stage, key, f"tags.{UPLOAD_TAG} = '{ARTIFACT_PATH}'")

    def fetch(self, stage: str, key: str, into: Path) -> Path | None:
        """A tracking store that cannot be searched or read is a miss (logged): the stage is computed."""
        try:
            source = self.find(stage, key)
            if source is None:
                return None
            local = MlflowClient().download_artifacts(source.info.run_id, ARTIFACT_PATH, dst_path=str(into))
        except (MlflowException, OSError) as error:
            log.warning("cache: could not fetch %s/%s from the tracking store: %s", stage, key[:12], error)
            return None
        self._fetched[stage, key] = source.info.run_id
        log.info("cache: %s/%s downloaded from run %s", stage, key[:12], source.info.run_id)
        return Path(local)

    def accepted(self, stage: str, key: str) -> None:
        source = self._fetched.pop((stage, key), None)
        if source is not None and mlflow.active_run() is not None:
            mlflow.set_tag(FETCHED_TAG, source)

    def publish(self, stage: str, key: str, folder: Path) -> None:
        if mlflow.active_run() is None or not (folder / MANIFEST).is_file():
            return
        try:
            mlflow.log_artifacts(str(folder), artifact_path=ARTIFACT_PATH)
        except (MlflowException, OSError) as error:  # the entry stays local; other machines will compute it
            log.warning("cache: could not upload %s/%s to the tracking store: %s", stage, key[:12], error)
            return
        mlflow.set_tag(UPLOAD_TAG, ARTIFACT_PATH)


def remote_for(uri: str) -> TrackingStore | None:
    """The remote of the stage cache for the tracking store ``uri``.

    Parameters
    ----------
    uri : str
        The MLflow tracking URI in use.

    Returns
    -------
    TrackingStore or None
        The store itself when other machines can reach it (:func:`is_shared`), else None.
    """
    return TrackingStore() if is_shared(uri) else None

"""The run store: what the runner records its runs in, as an interface the engine defines.

The runner (``pipeline.engine.runner``) records one parent run per pipeline run and one child run
per stage: params, metrics (also per training step), tags, artifacts, the dataset it read, the
tagger it trained as a logged model, and the runs that computed a cached entry. It knows the store
only through :class:`RunStore`; the pipeline's store is MLflow's
(``pipeline.tracking.run_store.MlflowRunStore``), built and handed to the runner by the composition
module, ``pipeline.__main__``. A test can hand it a store that keeps everything in memory.

Tag names the engine writes itself are defined here (the tracking package re-exports them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig

from pipeline.engine.cache import RemoteStore
from pipeline.engine.stage import LoggedModel

# how a sweep's launching process tells its jobs (in other processes) under which run to record theirs
SWEEP_PARENT_VARIABLE = "CRF_SWEEP_PARENT_RUN_ID"
MODEL_URI_TAG = "model_uri"  # the logged model of a stage run (the last one of a pipeline run)
CACHE_SOURCE_TAG = "cache_source_run_id"  # on a stage run whose output came from the cache: the run that computed it


@dataclass(frozen=True)
class RunRef:
    """A run of the store: its id and the id of the experiment it is in."""

    run_id: str
    experiment_id: str


@dataclass(frozen=True)
class CachedRun:
    """The finished stage run that computed a cache entry: its id, and the logged model it holds (or None)."""

    run_id: str
    model_uri: str | None


@dataclass(frozen=True)
class Standing:
    """What a registered version is judged by when the registry alias may move to it: ``metric``
    (maximised) and its ``value``, on the evaluation data whose key is ``evaluation``
    (:meth:`RunStore.tag_evaluation`)."""

    metric: str
    value: float
    evaluation: str


class RunStore(Protocol):
    """Where the runner records runs (see the module docstring).

    Calls other than :meth:`open`, :meth:`source_tags`, :meth:`remote_cache` and
    :meth:`record_failed_run` act on the innermost run opened by :meth:`run` and not yet ended.
    """

    def open(self, cfg: DictConfig) -> None:
        """Get the store ready for ``cfg``'s runs (its location and experiment) before any run starts.

        Parameters
        ----------
        cfg : DictConfig
            The job's composed config (``tracking``, ``paths``).
        """
        ...

    def remote_cache(self) -> RemoteStore | None:
        """The stage cache's remote in this store, once opened: None when no other machine shares it."""
        ...

    def source_tags(self) -> dict[str, str]:
        """Tags every run of this process gets (the source version, the process that runs it)."""
        ...

    def run(
        self, name: str, tags: Mapping[str, str], parent: str | None = None, nested: bool = False
    ) -> AbstractContextManager[RunRef]:
        """A run, open inside the ``with`` block.

        Parameters
        ----------
        name : str
            The run's name.
        tags : mapping of str to str
            Its tags.
        parent : str, optional
            The id of the run to record it under (a sweep's or a path's run).
        nested : bool, default False
            Record it under the innermost open run (a stage run under its pipeline run).

        Returns
        -------
        context manager of RunRef
            Ends the run FINISHED when the block ends, FAILED when it raises (unless
            :meth:`end_run` ended it first).
        """
        ...

    def end_run(self, status: str, reason: str | None = None) -> None:
        """End the innermost open run now with ``status`` (``KILLED``: stopped on purpose), and the
        end ``reason`` as a tag when given."""
        ...

    def log_params(self, params: Mapping[str, str]) -> None:
        """Params of the run (values as strings: the store keeps strings)."""
        ...

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Metrics of the run (no step), in the order given."""
        ...

    def log_steps(self, batch: list[tuple[int, dict[str, float]]]) -> None:
        """Per-step metrics of the run, ``(step, {metric: value})`` rows (a stage's
        :data:`~pipeline.engine.stage.StepLogger`); nothing without an open run."""
        ...

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags of the run."""
        ...

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        """The file ``path`` as an artifact of the run, under ``folder`` (None: at the top)."""
        ...

    def log_dataset(self, name: str, files: Mapping[str, Path], file_hashes: Mapping[str, str]) -> None:
        """The dataset ``name`` (its ``{split: file}`` and ``{file key: SHA-256}``) as the run's input."""
        ...

    def tag_evaluation(self, dataset: Mapping[str, Any], file_hashes: Mapping[str, str]) -> str:
        """Tag the run with the key of the data its dev and test scores are measured on, and return it.

        Parameters
        ----------
        dataset : mapping
            The resolved ``dataset`` config (the files and the settings that read them).
        file_hashes : mapping of str to str
            ``{file key: SHA-256}`` of the files the run read (the prepare stage's digests).

        Returns
        -------
        str
            The key: two runs are compared for the registry alias only when their keys are equal.
        """
        ...

    def cache_source(self, stage: str, key: str) -> CachedRun | None:
        """The finished run of ``stage`` that computed the cache entry ``key``, or None."""
        ...

    def log_model(self, model: LoggedModel) -> str:
        """Log the tagger bundle of ``model`` as a model of the run; the URI that loads it."""
        ...

    def link_model(self, run_id: str, model_uri: str) -> None:
        """List ``model_uri`` (logged in another run) as an output of the run ``run_id``."""
        ...

    def register_model(
        self, model_uri: str, name: str, alias: str | None, tags: Mapping[str, str], standing: Standing | None, force_alias: bool
    ) -> str:
        """Register ``model_uri`` as a new version of the registered model ``name``.

        Parameters
        ----------
        model_uri : str
            The logged model.
        name : str
            The registered model (created when new).
        alias : str or None
            Moved to the new version when it stands at least as well as the holder (or with ``force_alias``).
        tags : mapping of str to str
            Version tags.
        standing : Standing or None
            What the version is judged by (None: nothing to compare).
        force_alias : bool
            Move the alias regardless.

        Returns
        -------
        str
            The new version (``models:/<name>/<version>`` loads it).
        """
        ...

    def rename_run(self, run_id: str, name: str) -> None:
        """Give the run ``run_id`` the name ``name``."""
        ...

    def handoff_lines(self, run_id: str, stage: str, bundle: Path) -> list[str]:
        """``name: value`` lines saying how to use the tagger of the pipeline run ``run_id``
        (logged by its ``stage`` run; ``bundle`` is its file in the stage cache)."""
        ...

    def write_note(self, scores: Mapping[str, float], handoff: Sequence[str], cached: int, stages: int) -> None:
        """The run's description: its headline ``scores``, the ``handoff`` lines and how many of
        its ``stages`` came from the cache (``cached``)."""
        ...

    def run_link(self, run: RunRef) -> str:
        """How a user opens the page of ``run``."""
        ...

    def record_failed_run(self, name: str, tags: Mapping[str, str], params: Mapping[str, str], parent: str, reason: str) -> None:
        """Record a FAILED run that ran nothing (a sweep job refused for its settings) under the run
        ``parent``, with its ``tags``, ``params`` and the end ``reason``."""
        ...


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as a run's params, ``{"a.b.c": "value"}`` with string values (as a store keeps params).

    Parameters
    ----------
    config : mapping
        The nested config (a plain container: ``OmegaConf.to_container``).
    prefix : str, default ""
        Put before every name.

    Returns
    -------
    dict of str to str
        One entry per leaf; a value longer than 6000 characters is cut to 5997 and ``...``.
    """
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            text = str(value)
            flat[name] = text if len(text) <= 6000 else text[:5997] + "..."
    return flat

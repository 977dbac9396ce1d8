"""The stage contract: what a stage declares, and the only things it is given when it runs.

A stage (:class:`Stage`; :class:`BaseStage` gives the defaults) is an object with a ``name`` and:

- ``config_slice(cfg, adapter)``: the part of the composed config its output depends on; it is
  hashed into the cache key, and at run time the stage sees *only* this slice (read-only: reading
  any other key raises), so it cannot depend on what its key does not hash;
- ``settings(cfg, adapter)``: run-time settings that cannot change its output (threads, how often
  dev is scored, where the data files are); given to the stage, never hashed;
- ``upstream(adapter)``: the stages whose output folders it reads;
- ``external_inputs(config, settings)``: hashes of files from outside the pipeline (the dataset);
  ``input_files(config, settings)``: those files by the same keys, for the run's record of its
  dataset (what it can name without downloading);
- ``code_modules(adapter)``: the modules whose source (with the project modules they import, but
  not the engine's or tracking's) is hashed into its key;
- ``artifacts(settings, adapter)``: glob patterns of its files logged to MLflow (the rest stay in
  the cache folder);
- ``volatile(adapter)``: glob patterns of its files that differ between identical runs (measured
  times): left out of the hash that downstream keys use;
- ``step_metrics``: a CSV with an ``iteration`` column re-logged as step metrics when the entry
  comes from the cache; ``summary_prefix``: the pipeline run repeats the stage's metrics under
  this prefix (None: it does not);
- ``logged_model(inputs, folder)``: a tagger bundle in its output to log as an MLflow Model, with
  a few input rows as its example (:class:`LoggedModel`), or None;
- ``validate(cfg)``: refuse its settings when they cannot work, before any stage runs
  (``pipeline.engine.validate.SettingsError``, one line naming the setting);
- ``metric_names(cfg, adapter)``: glob patterns (:func:`fnmatch.fnmatchcase`) that every metric
  its run returns under ``cfg`` matches, so that a sweep's objective is checked before any job
  runs; None: not declared (any name);
- ``run(context) -> metrics``.

The stages are listed once, in ``pipeline.stages.STAGE_MODULES`` (each module holds a ``STAGE``);
the engine knows only that package (:data:`STAGE_PACKAGE`), and the runner iterates over the
stages and knows none by name: what it needs of a stage is in the contract above (a
caller that warm-starts a stage, a regularisation path or a sweep trial, names it).
A dev reporter (an Optuna trial's, given by ``pipeline.__main__``) may stop a training early by
raising :class:`TrainingStopped`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from pipeline.models import ModelAdapter

STAGE_PACKAGE = "pipeline.stages"  # its STAGE_MODULES: the stage modules, in running order

StepLogger = Callable[[list[tuple[int, dict[str, float]]]], None]
# dev scores during training, (iteration, {"dev_f1": ..., "dev_accuracy": ...}): in an Optuna trial's
# job the trial's reporter, which may stop the training by raising TrainingStopped
DevReporter = Callable[[int, Mapping[str, float]], None]
TRIAL_STATE_TAG = "crf.trial_state"  # PRUNED on the runs of a job whose training a dev reporter stopped


class TrainingStopped(Exception):
    """Raised by a :data:`DevReporter` to stop the training on purpose (not a failure): an Optuna
    pruner's decision. The runner caches nothing of the stage, ends its runs KILLED, tagged
    ``crf.trial_state=PRUNED``, and returns ``pipeline.pruned_at_iteration`` and the last dev score.

    Parameters
    ----------
    message : str
        Why (the end reason recorded on the runs).
    iteration : int
        The training iteration at which it stopped.
    metric : str
        The dev score reported last (``dev_f1`` or ``dev_accuracy``).
    value : float
        Its value.
    """

    def __init__(self, message: str, iteration: int, metric: str, value: float) -> None:
        super().__init__(message)
        self.iteration, self.metric, self.value = iteration, metric, value

    def __reduce__(self) -> tuple:  # pickled with its own arguments (a job's error crosses to the sweep's process)
        return type(self), (str(self), self.iteration, self.metric, self.value)


def frozen(mapping: Mapping[str, Any]) -> DictConfig:
    """A read-only, closed DictConfig of ``mapping``: reading or writing another key raises."""
    node = OmegaConf.create(dict(mapping))
    OmegaConf.set_struct(node, True)
    OmegaConf.set_readonly(node, True)
    return node


@dataclass
class StageContext:
    """Everything a stage's ``run`` is given."""

    config: DictConfig  # the stage's config slice (hashed into its key), read-only
    settings: DictConfig  # run-time settings (not hashed), read-only
    inputs: Mapping[str, Path]  # upstream stage name -> its output folder
    out: Path  # the (temporary) folder to write the outputs into
    adapter: ModelAdapter
    log_steps: StepLogger = field(default=lambda batch: None)  # (step, {metric: value}) rows -> tracking
    key: str = ""  # the cache key of the output being built (e.g. to name state kept across a kill)
    report_dev: DevReporter | None = None  # None: nobody listens (outside an Optuna trial)


@dataclass
class LoggedModel:
    """A tagger bundle of a stage's output, logged as an MLflow Model: its file, and a function
    giving a few long-form input rows (a DataFrame of ``sentence`` and the columns asked) as its
    example (or None)."""

    bundle: Path
    example: Callable[[list[str]], Any]


class Stage(Protocol):
    """The contract (see the module docstring)."""

    name: str
    step_metrics: str | None
    summary_prefix: str | None

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]: ...

    def config_slice(self, cfg: DictConfig, adapter: ModelAdapter) -> dict: ...

    def settings(self, cfg: DictConfig, adapter: ModelAdapter) -> dict: ...

    def external_inputs(self, config: DictConfig, settings: DictConfig) -> dict[str, str]: ...

    def input_files(self, config: DictConfig, settings: DictConfig) -> dict[str, Path]: ...

    def code_modules(self, adapter: ModelAdapter) -> tuple[str, ...]: ...

    def artifacts(self, settings: DictConfig, adapter: ModelAdapter) -> tuple[str, ...]: ...

    def volatile(self, adapter: ModelAdapter) -> tuple[str, ...]: ...

    def logged_model(self, inputs: Mapping[str, Path], folder: Path) -> LoggedModel | None: ...

    def validate(self, cfg: DictConfig) -> None: ...

    def metric_names(self, cfg: DictConfig, adapter: ModelAdapter) -> tuple[str, ...] | None: ...

    def run(self, context: StageContext) -> dict: ...


class BaseStage:
    """The defaults of the contract: no upstream, no settings, no external inputs, its own module as
    its code, nothing logged but its metrics, nothing volatile, no model, summarised without prefix."""

    name: str = ""
    step_metrics: str | None = None
    summary_prefix: str | None = ""

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ()

    def config_slice(self, cfg: DictConfig, adapter: ModelAdapter) -> dict:
        raise NotImplementedError

    def settings(self, cfg: DictConfig, adapter: ModelAdapter) -> dict:
        return {}

    def external_inputs(self, config: DictConfig, settings: DictConfig) -> dict[str, str]:
        return {}

    def input_files(self, config: DictConfig, settings: DictConfig) -> dict[str, Path]:
        return {}

    def code_modules(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return (type(self).__module__,)

    def artifacts(self, settings: DictConfig, adapter: ModelAdapter) -> tuple[str, ...]:
        return ()

    def volatile(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ()

    def logged_model(self, inputs: Mapping[str, Path], folder: Path) -> LoggedModel | None:
        return None

    def validate(self, cfg: DictConfig) -> None:
        return None

    def metric_names(self, cfg: DictConfig, adapter: ModelAdapter) -> tuple[str, ...] | None:
        return None

    def run(self, context: StageContext) -> dict:
        raise NotImplementedError


def load_stages() -> dict[str, Stage]:
    """Every stage of the pipeline.

    Returns
    -------
    dict of str to Stage
        {name: stage} of the stages of :data:`STAGE_PACKAGE`, in running order.
    """
    modules = importlib.import_module(STAGE_PACKAGE).STAGE_MODULES
    stages = [importlib.import_module(module).STAGE for module in modules]
    return {stage.name: stage for stage in stages}

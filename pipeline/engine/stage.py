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

BUNDLE_FILE = "bundle.npz"  # a model adapter's bundle in the train stage's output
WARM_START_INPUT = "warm_start"  # the train stage's optional input: an earlier train output to start from
METRICS_FILE = "stage_metrics.json"  # in every stage's output folder: its metrics, with its measured times (volatile)

# set by pipeline.sweeps in a multirun's jobs: they already run in parallel, one per core
SWEEP_ID_VARIABLE = "CRF_SWEEP_ID"

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


class ModelAdapter(Protocol):
    """The contract of a model adapter: everything the pipeline knows about one kind of model.

    The adapter is chosen once, from ``cfg.model.adapter`` (a dotted path ``module.Class`` in
    ``conf/model/<name>.yaml``). Adding a model kind is one new adapter module and one YAML file; the
    runner and the stages do not change. An adapter (:class:`ModelAdapter`; :class:`BaseAdapter` gives
    the defaults) declares:

    - ``validate(cfg)``: refuse settings that cannot work, before any stage runs
      (``pipeline.engine.validate.SettingsError``, one line naming the setting); ``known_keys(section)``:
      the keys it reads from a config section (``model``, ``trainer``), which the command line may
      add with ``+`` though the section's file does not list them;
    - ``config_slice(cfg)``: what training depends on (hashed into the train stage's key);
    - ``settings(cfg)``: run-time settings that cannot change the model (threads, dev cadence);
    - ``upstream``: the stages training reads (``prepare``, and ``featurize`` for the CRF);
    - ``artifacts``: which of the training stage's files are logged to MLflow; ``volatile``: which of
      them differ between identical runs (measured times);
    - ``trainer_tag(cfg)``: the ``trainer`` tag of the pipeline run;
    - ``metrics``: glob patterns that every metric name ``fit`` returns matches (None: not declared),
      so that a sweep's objective ``train.<name>`` is checked before any job runs;
    - ``fit(context, data) -> metrics``: train on the prepared data and write, into ``context.out``,
      the self-contained tagger as :data:`BUNDLE_FILE` (a :class:`crf.ModelBundle` whose part is the
      kind's :class:`crf.bundle.BundledModel`, registered with :func:`crf.bundle.register_kind`):
      evaluation, ``python -m pipeline.tag`` and the MLflow Model all tag with it;
    - ``warm_starts``: whether ``fit`` can start from an earlier fit's output, and
      ``can_warm_start(cfg)`` whether it can with ``cfg``'s settings (some trainers cannot). A
      regularisation path (``pipeline.sweeps.path``) gives the train stage the previous point's train
      folder as the input :data:`WARM_START_INPUT` (its hash joins the cache key), as does an Optuna
      trial started from a finished one; ``fit`` starts from the weights there;
      ``warm_start_problem(cfg, folder)`` says why such a folder is no starting point for a fit with
      ``cfg``'s settings (None if it is), for an Optuna trial offered another trial's weights;
    - ``context.report_dev``, when set, is called with the dev scores during training (Optuna pruning).

    Adapters import no MLflow: step metrics go through ``context.log_steps``.
    """

    name: str
    upstream: tuple[str, ...]
    artifacts: tuple[str, ...]
    volatile: tuple[str, ...]
    warm_starts: bool
    metrics: tuple[str, ...] | None  # glob patterns of fit's metrics (the train stage's); None: not declared

    def validate(self, cfg: Mapping) -> None: ...

    def known_keys(self, section: str) -> frozenset[str]: ...

    def config_slice(self, cfg: Mapping) -> dict: ...

    def settings(self, cfg: Mapping) -> dict: ...

    def trainer_tag(self, cfg: Mapping) -> str: ...

    def can_warm_start(self, cfg: Mapping) -> bool: ...

    def warm_start_problem(self, cfg: Mapping, folder: Path) -> str | None: ...

    def fit(self, context: StageContext, data: Any) -> dict: ...


class BaseAdapter:
    """The defaults of the contract: reads the prepared data, logs its bundle, no settings."""

    name: str = ""
    upstream: tuple[str, ...] = ("prepare",)
    artifacts: tuple[str, ...] = (BUNDLE_FILE,)
    volatile: tuple[str, ...] = ()
    warm_starts: bool = False
    metrics: tuple[str, ...] | None = None

    def validate(self, cfg: Mapping) -> None:
        return None

    def known_keys(self, section: str) -> frozenset[str]:
        return frozenset()

    def config_slice(self, cfg: Mapping) -> dict:
        raise NotImplementedError

    def settings(self, cfg: Mapping) -> dict:
        return {}

    def trainer_tag(self, cfg: Mapping) -> str:
        return self.name

    def can_warm_start(self, cfg: Mapping) -> bool:
        return self.warm_starts

    def warm_start_problem(self, cfg: Mapping, folder: Path) -> str | None:
        return None

    def fit(self, context: StageContext, data: Any) -> dict:
        """Train on ``data`` (the prepared data set, a ``pipeline.stages.data.Dataset``) and write
        the bundle into ``context.out``; the metrics."""
        raise NotImplementedError


def load_adapter(model: Mapping[str, Any]) -> ModelAdapter:
    """The adapter named by ``model.adapter`` (``package.module.Class``)."""
    path = model.get("adapter")
    if not path or "." not in str(path):
        raise ValueError(
            f"model {model.get('name')!r}: set model.adapter to the adapter class, e.g. pipeline.models.crf.CRFAdapter"
        )
    module, _, name = str(path).rpartition(".")
    try:
        adapter = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"model {model.get('name')!r}: cannot load adapter {path!r} ({err})") from None
    if not (isinstance(adapter, type) and issubclass(adapter, BaseAdapter)):
        raise ValueError(f"model {model.get('name')!r}: {path!r} is not a model adapter (a BaseAdapter subclass)")
    return adapter()


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

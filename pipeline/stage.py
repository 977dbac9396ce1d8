"""The stage contract: what a stage declares, and the only things it is given when it runs.

A stage is an object with a ``name`` and:

- ``config_slice(cfg, adapter)``: the part of the composed config its output depends on; it is
  hashed into the cache key, and at run time the stage sees *only* this slice (read-only: reading
  any other key raises), so it cannot depend on what its key does not hash;
- ``settings(cfg, adapter)``: run-time settings that cannot change its output (threads, how often
  dev is scored, where the data files are); given to the stage, never hashed;
- ``upstream(adapter)``: the stages whose output folders it reads;
- ``external_inputs(config, settings)``: hashes of files from outside the pipeline (the dataset);
- ``artifacts(settings, adapter)``: glob patterns of its files logged to MLflow (the rest stay in
  the cache folder); ``step_metrics``: a CSV with an ``iteration`` column re-logged as step
  metrics when the entry comes from the cache; ``summarize``: whether the pipeline run repeats its
  metrics, under ``summary_prefix`` (``data.`` for data statistics); ``bundle``: the file of its
  output that is a tagger bundle (``crf.load_tagger``), logged as an MLflow Model, with
  ``bundle_example(inputs, columns)`` a few long-form input rows for it;
- ``code_modules(adapter)``: the modules whose source (with the project modules they import) is
  hashed into its key;
- ``run(context) -> metrics``.

The runner iterates over :data:`STAGE_MODULES` (each module holds a ``STAGE``) and knows no stage by
name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.models import ModelAdapter

# the stages in the order they run; a stage's upstream stages come before it
STAGE_MODULES = ("pipeline.prepare", "pipeline.featurize", "pipeline.train", "pipeline.evaluate", "pipeline.active_learning")

StepLogger = Callable[[list[tuple[int, dict[str, float]]]], None]


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


class Stage:
    """Base class with the defaults of the contract (see the module docstring)."""

    name: str = ""
    uses_adapter: bool = False  # True: the model adapter's module is part of this stage's code
    step_metrics: str | None = None
    summarize: bool = True
    summary_prefix: str = ""  # the pipeline run repeats the stage's metrics under this prefix
    logged: tuple[str, ...] = ()
    bundle: str | None = None  # a file of the output folder that is a tagger bundle: logged as an MLflow Model

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ()

    def config_slice(self, cfg: DictConfig, adapter: ModelAdapter) -> dict:
        raise NotImplementedError

    def settings(self, cfg: DictConfig, adapter: ModelAdapter) -> dict:
        return {}

    def external_inputs(self, config: DictConfig, settings: DictConfig) -> dict[str, str]:
        return {}

    def artifacts(self, settings: DictConfig, adapter: ModelAdapter) -> tuple[str, ...]:
        return self.logged

    def bundle_example(self, inputs: Mapping[str, Path], columns: list[str]) -> Any:
        """A few input rows for the bundle's MLflow Model: a DataFrame (``sentence`` + ``columns``) or None."""
        return None

    def code_modules(self, adapter: ModelAdapter) -> tuple[str, ...]:
        modules = (type(self).__module__,)
        return modules + (type(adapter).__module__,) if self.uses_adapter else modules

    def run(self, context: StageContext) -> dict:
        raise NotImplementedError


def load_stages() -> dict[str, Stage]:
    """Every stage of the pipeline, in running order: {name: stage}."""
    stages = [importlib.import_module(module).STAGE for module in STAGE_MODULES]
    return {stage.name: stage for stage in stages}

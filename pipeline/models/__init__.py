"""Model adapters: everything the pipeline knows about one kind of model, behind one interface.

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

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeline.engine.stage import StageContext
    from pipeline.stages.data import Dataset

BUNDLE_FILE = "bundle.npz"
WARM_START_INPUT = "warm_start"  # the train stage's optional input: an earlier train output to start from
METRICS_FILE = "stage_metrics.json"  # in every stage's output folder: its metrics, with its measured times (volatile)

# set by pipeline.sweeps in a multirun's jobs: they already run in parallel, one per core
SWEEP_ID_VARIABLE = "CRF_SWEEP_ID"


class ModelAdapter(Protocol):
    """The contract (see the module docstring)."""

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

    def fit(self, context: StageContext, data: Dataset) -> dict: ...


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

    def fit(self, context: StageContext, data: Dataset) -> dict:
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


def bundle_source(data: Dataset, config: Mapping, **extra: Any) -> dict:
    """What a bundle records of its origin: the prepared dataset's name, columns, label column
    (the column the model predicts), scheme and (when known) tokenisation and word column, the
    stage's config slice, and ``extra``."""
    dataset = {"name": data.name, "columns": list(data.columns), "label": data.label, "scheme": data.scheme}
    if getattr(data, "tokenisation", None):  # how its word tokens were made: the tag command splits text alike
        dataset["tokenisation"] = data.tokenisation
    if getattr(data, "word_column", None):  # its words: never taken for a tag set, however few the model saw
        dataset["word_column"] = data.word_column
    return {"dataset": dataset, **{k: v for k, v in dict(config).items()}, **extra}


def default_threads(threads: int | None) -> int | None:
    """``threads`` as configured; unset in a sweep job: one (the jobs already fill the cores)."""
    if threads is None and os.environ.get(SWEEP_ID_VARIABLE):
        return 1
    return None if threads is None else int(threads)

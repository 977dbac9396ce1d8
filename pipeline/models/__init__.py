"""Model adapters: everything the pipeline knows about one kind of model, behind one interface.

The adapter is chosen once, from ``cfg.model.adapter`` (a dotted path ``module.Class`` in
``conf/model/<name>.yaml``). Adding a model kind is one new adapter module and one YAML file; the
runner and the stages do not change. An adapter declares:

- ``config_slice(cfg)``: what training depends on (hashed into the train and evaluate keys);
- ``settings(cfg)``: run-time settings that cannot change the model (threads, dev cadence);
- ``upstream``: the stages training and tagging read (``prepare``, and ``featurize`` for the CRF);
- ``artifacts``: which of the training stage's files are logged to MLflow;
- ``trainer_tag(cfg)``: the ``trainer`` tag of the pipeline run;
- ``fit(context, data) -> metrics``: train on the prepared data, write the model into
  ``context.out``, and the self-contained tagger (:class:`crf.TaggerBundle`) as
  :data:`BUNDLE_FILE` (logged: ``python -m pipeline.tag`` and the MLflow Model read it);
- ``tagger(config, inputs, data) -> Tagger``: what evaluation uses.

Adapters import no MLflow: step metrics go through ``context.log_steps``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from pipeline.data import Dataset
    from pipeline.stage import StageContext

BUNDLE_FILE = "bundle.npz"

# set by pipeline.sweep in a multirun's jobs: they already run in parallel, one per core
SWEEP_ID_VARIABLE = "CRF_SWEEP_ID"


class Tagger(Protocol):
    """A fitted model as evaluation sees it."""

    classes: list[str]

    def tag(self, split: str) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(label codes (T,), confidence (T,): marginal probability of the predicted label,
        decoding seconds, seconds including feature extraction) over the split's T tokens."""
        ...

    def segments(self, split: str) -> pd.DataFrame | None:
        """Predicted chunks with a confidence (columns sequence, start, end, type, confidence), or None."""
        ...


class ModelAdapter:
    """Base class of the adapters; see the module docstring for the contract."""

    name: str = ""
    upstream: tuple[str, ...] = ("prepare",)
    artifacts: tuple[str, ...] = ("model.npz",)

    def config_slice(self, cfg: Mapping) -> dict:
        raise NotImplementedError

    def settings(self, cfg: Mapping) -> dict:
        return {}

    def trainer_tag(self, cfg: Mapping) -> str:
        return self.name

    def fit(self, context: StageContext, data: Dataset) -> dict:
        raise NotImplementedError

    def tagger(self, config: Mapping, inputs: Mapping[str, Path], data: Dataset) -> Tagger:
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
    if not (isinstance(adapter, type) and issubclass(adapter, ModelAdapter)):
        raise ValueError(f"model {model.get('name')!r}: {path!r} is not a ModelAdapter subclass")
    return adapter()


def bundle_source(data: Dataset, config: Mapping, **extra: Any) -> dict:
    """What a bundle records of its origin: the prepared dataset's name, columns, label column
    (the column the model predicts) and scheme, the stage's config slice, and ``extra``."""
    dataset = {"name": data.name, "columns": list(data.columns), "label": data.label, "scheme": data.scheme}
    return {"dataset": dataset, **{k: v for k, v in dict(config).items()}, **extra}


def default_threads(threads: int | None) -> int | None:
    """``threads`` as configured; unset in a sweep job: one (the jobs already fill the cores)."""
    if threads is None and os.environ.get(SWEEP_ID_VARIABLE):
        return 1
    return None if threads is None else int(threads)

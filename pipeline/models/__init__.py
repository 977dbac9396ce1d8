"""Model adapters: the kinds of model the pipeline trains (``crf``, ``hmm``), one module each.

The adapter is chosen once, from ``cfg.model.adapter`` (a dotted path ``module.Class`` in
``conf/model/<name>.yaml``). Adding a model kind is one new adapter module and one YAML file; the
runner and the stages do not change. The contract an adapter fulfils is
:class:`pipeline.engine.stage.ModelAdapter` (:class:`BaseAdapter` gives the defaults); its names are
also importable from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipeline.engine.stage import (
    BUNDLE_FILE,
    METRICS_FILE,
    SWEEP_ID_VARIABLE,
    WARM_START_INPUT,
    BaseAdapter,
    ModelAdapter,
    load_adapter,
)

if TYPE_CHECKING:
    from pipeline.stages.data import Dataset

__all__ = [
    "BUNDLE_FILE",
    "METRICS_FILE",
    "SWEEP_ID_VARIABLE",
    "WARM_START_INPUT",
    "BaseAdapter",
    "ModelAdapter",
    "bundle_source",
    "default_threads",
    "load_adapter",
]


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

"""Stage 3, train: fit the configured model through its adapter (``pipeline.models``).

Config slice: the adapter's (``adapter.config_slice``); settings: the adapter's run-time settings.
Inputs: the adapter's upstream stages (the prepare folder, and featurize for the CRF). Output
folder: what the adapter writes (``model.npz`` and its logs); the adapter's ``artifacts`` are
logged. ``history.csv``, when the adapter writes one, becomes step metrics again when the entry
comes from the cache. ``bundle.npz`` (the adapter's tagger bundle) is declared as the stage's model
bundle: the runner logs it as an MLflow Model, with the first test sentences as input example.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.engine.stage import BaseStage, LoggedModel, StageContext
from pipeline.models import BUNDLE_FILE, ModelAdapter
from pipeline.stages.prepare import read_prepared


class Train(BaseStage):
    name = "train"
    step_metrics = "history.csv"

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return tuple(adapter.upstream)

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        return adapter.config_slice(cfg)

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        return adapter.settings(cfg)

    def code_modules(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return (type(self).__module__, type(adapter).__module__)

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        return tuple(adapter.artifacts)

    def volatile(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return tuple(adapter.volatile)

    def metric_names(self, cfg, adapter: ModelAdapter) -> tuple[str, ...] | None:
        return None if adapter.metrics is None else tuple(adapter.metrics)

    def logged_model(self, inputs: Mapping[str, Path], folder: Path) -> LoggedModel | None:
        """The adapter's bundle, with the first test sentences as the example."""
        path = folder / BUNDLE_FILE
        return LoggedModel(path, lambda columns: self.bundle_example(inputs, columns)) if path.is_file() else None

    def bundle_example(self, inputs: Mapping[str, Path], columns: list[str], n_sentences: int = 2) -> pd.DataFrame:
        """The first ``n_sentences`` test sentences in long form: ``sentence`` id and ``columns``."""
        data = read_prepared(inputs["prepare"])
        values = {c: [v for sentence in data.column("test", c)[:n_sentences] for v in sentence] for c in columns}
        lengths = [len(sentence) for sentence in data.splits["test"][:n_sentences]]
        return pd.DataFrame({"sentence": np.repeat(np.arange(len(lengths)), lengths), **values})

    def run(self, context: StageContext) -> dict:
        return context.adapter.fit(context, read_prepared(context.inputs["prepare"]))


STAGE = Train()

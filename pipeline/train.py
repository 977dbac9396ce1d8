"""Stage 3, train: fit the configured model through its adapter (``pipeline.models``).

Config slice: the adapter's (``adapter.config_slice``); settings: the adapter's run-time settings.
Inputs: the adapter's upstream stages (the prepare folder, and featurize for the CRF). Output
folder: what the adapter writes (``model.npz`` and its logs); the adapter's ``artifacts`` are
logged. ``history.csv``, when the adapter writes one, becomes step metrics again when the entry
comes from the cache.
"""

from __future__ import annotations

from pipeline.models import ModelAdapter
from pipeline.prepare import read_prepared
from pipeline.stage import Stage, StageContext


class Train(Stage):
    name = "train"
    uses_adapter = True
    step_metrics = "history.csv"

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return tuple(adapter.upstream)

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        return adapter.config_slice(cfg)

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        return adapter.settings(cfg)

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        return tuple(adapter.artifacts)

    def run(self, context: StageContext) -> dict:
        return context.adapter.fit(context, read_prepared(context.inputs["prepare"]))


STAGE = Train()

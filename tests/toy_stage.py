"""A stage added from outside the pipeline (the README's "Extend it: a stage"): the label
distribution of each prepared split. One module; running it needs its name in
``pipeline.stages.STAGE_MODULES`` (tests/pipeline/models/test_adapters.py patches that tuple)."""

from __future__ import annotations

import collections

from pipeline.engine.stage import BaseStage, StageContext
from pipeline.report import write_json
from pipeline.stages.prepare import SPLITS, read_prepared


class LabelCounts(BaseStage):
    """How often each label occurs in each split; metrics ``<split>_labels`` (distinct labels)
    and ``<split>_majority_share`` (percent of the split's tokens with its most frequent label)."""

    name = "label_counts"

    def upstream(self, adapter) -> tuple[str, ...]:
        return ("prepare",)

    def config_slice(self, cfg, adapter) -> dict:
        return {}  # the output depends only on prepare's output, which the key hashes

    def artifacts(self, settings, adapter) -> tuple[str, ...]:
        return ("label_counts.json",)

    def run(self, context: StageContext) -> dict:
        data = read_prepared(context.inputs["prepare"])
        counts, metrics = {}, {}
        for split in SPLITS:
            tally = collections.Counter(label for sentence in data.labels(split) for label in sentence)
            counts[split] = dict(tally.most_common())
            metrics[f"{split}_labels"] = len(tally)
            metrics[f"{split}_majority_share"] = 100.0 * tally.most_common(1)[0][1] / sum(tally.values())
        write_json(context.out / "label_counts.json", counts)
        return metrics


STAGE = LabelCounts()

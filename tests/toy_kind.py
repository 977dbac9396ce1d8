"""A toy model kind, as a user would add one: one adapter module (this file) and one config file
(``tests/conf/model/majority.yaml``). Every token gets the label most frequent in training; the
part it keeps in a tagger bundle scores that label 0 and the others ``-penalty``."""

from __future__ import annotations

from collections import Counter

import numpy as np

from crf import ModelBundle
from crf._persist import ModelFileError
from crf.bundle import register_kind
from crf.io import atomic_write
from pipeline.models import BUNDLE_FILE, BaseAdapter, bundle_source


@register_kind
class BundledMajority:
    kind = "majority"

    def __init__(self, labels: list[str], best: int, penalty: float = 5.0) -> None:
        self.labels, self.best, self.penalty = list(labels), int(best), float(penalty)
        self.n_states, self.columns = len(self.labels), ["w"]

    def scores(self, columns, lengths):
        L = len(self.labels)
        emissions = np.full((int(lengths.sum()), L), -self.penalty)
        emissions[:, self.best] = 0.0
        return emissions, np.zeros((L, L)), np.zeros(L), np.zeros(L)

    def parts(self):
        return {"majority": {"labels": self.labels, "best": self.best, "penalty": self.penalty}}, {}

    @classmethod
    def from_parts(cls, meta, arrays, path):
        spec = meta["majority"]
        if not (isinstance(spec.get("labels"), list) and 0 <= int(spec.get("best", -1)) < len(spec["labels"])):
            raise ModelFileError(f"{path}: a majority model needs its labels and the index of the majority label")
        return cls(spec["labels"], spec["best"], spec["penalty"])


class MajorityAdapter(BaseAdapter):
    name = "majority"
    artifacts = (BUNDLE_FILE, "counts.json")

    def config_slice(self, cfg) -> dict:
        return {"model": {"name": str(cfg.model.name), "penalty": float(cfg.model.penalty)}}

    def fit(self, context, data) -> dict:
        counts = Counter(label for sentence in data.labels("train") for label in sentence)
        labels = sorted(counts)
        best = labels.index(counts.most_common(1)[0][0])
        part = BundledMajority(labels, best, context.config.model.penalty)
        ModelBundle(part, scheme=data.scheme, source=bundle_source(data, {"model": dict(context.config.model)})).save(
            context.out / BUNDLE_FILE
        )
        text = "{" + ", ".join(f'"{k}": {v}' for k, v in sorted(counts.items())) + "}"
        atomic_write(context.out / "counts.json", lambda out: out.write(text.encode()))
        context.log_steps([(1, {"majority_share": counts[labels[best]] / sum(counts.values())})])
        return {"labels": len(labels)}

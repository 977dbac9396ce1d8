"""Model adapters: the CRF and the HMM behind one interface, and a third model added without
touching the runner or the stages (a majority-label tagger defined here)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.models import ModelAdapter, load_adapter  # noqa: E402
from pipeline.models.crf import CRFAdapter  # noqa: E402
from pipeline.models.hmm import HMMAdapter  # noqa: E402
from pipeline.runner import run_pipeline  # noqa: E402


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        monkeypatch.delenv(name, raising=False)


class MajorityTagger:
    """Every token gets the most frequent training label, with its training frequency as confidence."""

    def __init__(self, label: str, frequency: float, data) -> None:
        self.classes = [label]
        self.frequency = frequency
        self.data = data

    def tag(self, split: str):
        n = sum(len(s) for s in self.data.labels(split))
        began = time.perf_counter()
        codes = np.zeros(n, dtype=np.int64)
        seconds = max(time.perf_counter() - began, 1e-9)
        return codes, np.full(n, self.frequency), seconds, seconds

    def segments(self, split: str):
        return None


class MajorityAdapter(ModelAdapter):
    """A third model kind, known to the pipeline only through ``model.adapter``."""

    name = "majority"
    upstream = ("prepare",)
    artifacts = ("majority.json",)

    def config_slice(self, cfg) -> dict:
        return {"model": {"name": str(cfg.model.name)}}

    def fit(self, context, data) -> dict:
        counts = Counter(label for sentence in data.labels("train") for label in sentence)
        label, count = counts.most_common(1)[0]
        total = sum(counts.values())
        (context.out / "majority.json").write_text(json.dumps({"label": label, "frequency": count / total}))
        context.log_steps([(1, {"loss": 1.0 - count / total})])
        return {"train_seconds": 0.0, "labels": len(counts)}

    def tagger(self, config, inputs, data) -> MajorityTagger:
        spec = json.loads((inputs["train"] / "majority.json").read_text())
        return MajorityTagger(spec["label"], spec["frequency"], data)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("adapters") / "data", n_train=60, n_test=20)


def test_the_adapter_is_chosen_once_from_the_model_config():
    crf = load_adapter(compose_config([]).model)
    hmm = load_adapter(compose_config(["model=hmm"]).model)
    assert isinstance(crf, CRFAdapter) and isinstance(hmm, HMMAdapter)
    assert crf.upstream == ("prepare", "featurize") and hmm.upstream == ("prepare",)
    cfg = compose_config(["trainer=l1", "trainer.threads=2"])
    assert crf.trainer_tag(cfg) == "l1" and hmm.trainer_tag(cfg) == "counting"
    sliced = crf.config_slice(cfg)
    assert set(sliced) == {"model", "trainer", "seed"} and "threads" not in sliced["trainer"]
    assert sliced["model"]["all_possible_states"] is False
    assert crf.settings(cfg)["threads"] == 2
    assert set(hmm.config_slice(compose_config(["model=hmm"]))) == {"model"}
    with pytest.raises(ValueError, match="model.adapter"):
        load_adapter({"name": "x"})
    with pytest.raises(ValueError, match="cannot load adapter"):
        load_adapter({"name": "x", "adapter": "pipeline.models.nothing.Here"})


@pytest.mark.parametrize("model", ["crf", "hmm"])
def test_both_adapters_run_through_the_same_stages(corpus, tmp_path, model):
    results = run_pipeline(compose_config(tiny_overrides(corpus, tmp_path / "out") + [f"model={model}", "stages=[evaluate]"]))
    assert results["evaluate.test_accuracy"] > 80.0
    assert ("featurize.attributes" in results) == (model == "crf")
    assert results["train.model_bytes"] > 0


def test_a_third_model_needs_no_runner_change(corpus, tmp_path):
    out = tmp_path / "out"
    overrides = tiny_overrides(corpus, out) + [
        "model.name=majority",
        f"model.adapter={__name__}.MajorityAdapter",
        "stages=[evaluate]",
    ]
    results = run_pipeline(compose_config(overrides))
    assert "featurize.attributes" not in results  # the adapter's upstream: prepare only
    # the toy corpus's most frequent chunk label is I-NP
    assert 20.0 < results["evaluate.test_accuracy"] < 60.0 and results["train.labels"] >= 4
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    assert parent.data.tags["model"] == "majority" and parent.data.tags["trainer"] == "majority"
    (train,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.stage = 'train'"
    )
    assert {a.path for a in client.list_artifacts(train.info.run_id, "train")} == {"train/majority.json"}
    assert client.get_metric_history(train.info.run_id, "loss")
    again = run_pipeline(compose_config(overrides))  # and its entries are cached like any other
    assert again == results

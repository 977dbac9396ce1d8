"""The registry's ``@champion`` only moves forward: a worse model (here one trained on a tenth of
the data with heavy smoothing), or one scored on other evaluation data, is registered as a new
version while the alias stays, and the version's tags say why; ``registry.force_alias`` moves it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.engine.runner import run_pipeline  # noqa: E402
from pipeline.tracking import tracking_uri  # noqa: E402
from pipeline.tracking.champion import DECISION_TAG, EVALUATION_TAG, Standing  # noqa: E402


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        monkeypatch.delenv(name, raising=False)


def test_the_champion_alias_only_moves_to_a_model_at_least_as_good_on_the_same_data(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=80, n_test=20)
    base = tiny_overrides(data_root, tmp_path / "out") + ["registry.register=true", "registry.name=tiny"]

    def run(*extra: str):
        cfg = compose_config(base + list(extra))
        run_pipeline(cfg)
        return MlflowClient(tracking_uri(cfg))

    client = run()
    first = client.get_model_version_by_alias("tiny", "champion")
    assert str(first.version) == "1" and first.tags[DECISION_TAG].startswith("moved: no version held")
    standing = Standing.from_tags(first.tags)
    assert standing.metric == "dev_f1" and first.tags["data.train_fraction"] == "1.0" and first.tags["dataset"] == "conll2000"

    run("data.train_fraction=0.1", "trainer.c2=300")  # a quick, worse model on the same dev and test data
    worse = client.get_model_version("tiny", "2")
    assert Standing.from_tags(worse.tags).value < standing.value
    assert worse.tags[DECISION_TAG].startswith("kept:") and "worse than the holder" in worse.tags[DECISION_TAG]
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"

    run("dataset.dev_split.seed=99")  # other dev sentences: not comparable, whatever the score
    other = client.get_model_version("tiny", "3")
    assert "other evaluation data" in other.tags[DECISION_TAG]
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"

    # the dev split is carved from the train file: training on the test file (dev carved from it,
    # scores far higher) is other evaluation data, as is another column layout under the same label
    for version, extra in (("4", "dataset.files.train.path=conll2000/test.txt.gz"), ("5", "dataset.columns=[w,chunk,pos]")):
        run(extra)
        other = client.get_model_version("tiny", version)
        assert "other evaluation data" in other.tags[DECISION_TAG], extra
        assert other.tags[EVALUATION_TAG] != first.tags[EVALUATION_TAG]
        assert str(client.get_model_version_by_alias("tiny", "champion").version) == "1"

    run("data.train_fraction=0.1", "trainer.c2=300", "registry.force_alias=true")
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "6"
    assert client.get_model_version("tiny", "6").tags[DECISION_TAG].startswith("moved: forced")

    run()  # as good as the first on the same data: moves (ties move forward)
    assert str(client.get_model_version_by_alias("tiny", "champion").version) == "7"

"""``data.final_fit``: the model scored on test trained on train (default) or on train + dev (the
field's protocol for a final model). With ``train+dev`` the dev split is empty, so no stage scores,
reports or stops on sentences the model was trained on; the refit model is the CRF a direct fit on
train + dev gives; the setting is part of the prepare stage's key, its params and its run's name."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from crf import CRF  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.logs import named_overrides  # noqa: E402
from pipeline.engine.validate import SettingsError  # noqa: E402
from pipeline.models import load_adapter  # noqa: E402
from pipeline.models.crf import build_model  # noqa: E402
from pipeline.stages.data import final_fit_splits  # noqa: E402
from pipeline.stages.featurize import build_extractor  # noqa: E402
from pipeline.stages.prepare import STAGE as PREPARE  # noqa: E402
from pipeline.stages.prepare import read_prepared  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("final_fit") / "data", n_train=50, n_test=15)


def _prepared(out: Path):
    (entry,) = [p for p in (out / "cache" / "prepare").iterdir() if not p.name.startswith(".")]
    return read_prepared(entry), entry


def test_final_fit_splits_joins_dev_to_train_and_empties_dev():
    splits = {"train": [["a"], ["b"]], "dev": [["c"]], "test": [["d"]]}
    assert final_fit_splits(splits, "train") == splits
    joined = final_fit_splits(splits, "train+dev")
    assert joined == {"train": [["a"], ["b"], ["c"]], "dev": [], "test": [["d"]]}
    assert splits["dev"] == [["c"]]  # the given splits are not changed
    with pytest.raises(SettingsError, match=r"data\.final_fit='dev'.*train, train\+dev"):
        final_fit_splits(splits, "dev")


def test_final_fit_is_in_the_prepare_key_only_when_not_the_default():
    adapter = load_adapter(compose_config([]).model)
    default = PREPARE.config_slice(compose_config([]), adapter)
    assert "final_fit" not in default  # the keys of earlier runs hold
    assert PREPARE.config_slice(compose_config(["data.final_fit=train"]), adapter) == default
    joined = PREPARE.config_slice(compose_config(["data.final_fit=train+dev"]), adapter)
    assert joined == {**default, "final_fit": "train+dev"}
    with pytest.raises(SettingsError, match=r"data\.final_fit"):
        PREPARE.validate(compose_config(["data.final_fit=all"]))
    assert named_overrides(["data.final_fit=train+dev", "trainer.threads=1"]) == ["final_fit=train+dev"]


def test_a_train_plus_dev_run_trains_on_both_and_scores_test_only(corpus, tmp_path):
    base = tiny_overrides(corpus, tmp_path / "plain")
    plain = run_pipeline(compose_config(base))
    assert "evaluate.dev_f1" in plain and "evaluate.test_f1" in plain
    data_plain, _ = _prepared(tmp_path / "plain")

    out = tmp_path / "joined"
    overrides = tiny_overrides(corpus, out) + ["data.final_fit=train+dev"]
    cfg = compose_config(overrides)
    joined = run_pipeline(cfg)
    data, entry = _prepared(out)
    # the training split is train then dev of the plain run; no dev split is left to score
    assert data.splits["train"] == data_plain.splits["train"] + data_plain.splits["dev"]
    assert data.splits["dev"] == [] and data.splits["test"] == data_plain.splits["test"]
    assert joined["prepare.dev_sentences"] == 0
    assert joined["prepare.train_sentences"] == len(data_plain.splits["train"]) + len(data_plain.splits["dev"])
    assert "evaluate.test_f1" in joined
    dev_figures = sorted(k for k in joined if ".dev_" in k)  # the empty split's counts only
    assert dev_figures == ["prepare.dev_sentences", "prepare.dev_tokens", "prepare.dev_unseen_labels"]
    (train_entry,) = [p for p in (out / "cache" / "train").iterdir() if not p.name.startswith(".")]
    history = (train_entry / "history.csv").read_text().splitlines()[0]
    assert "dev_" not in history  # no dev score during training either (train.dev_every is set)

    # the refit model is the CRF fitted directly on train + dev with the run's settings
    extractor = build_extractor(OmegaConf.to_container(cfg.features, resolve=True), data.columns)
    X = extractor.fit_transform(data.splits["train"])
    reference = build_model(
        OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.trainer, resolve=True), int(cfg.seed), 0, 1
    )
    reference.fit(X, data.labels("train"), attribute_names=extractor.attribute_names())
    fitted = CRF.load(train_entry / "model.npz")
    assert list(fitted.classes_) == list(reference.classes_)
    np.testing.assert_allclose(fitted.state_weights_, reference.state_weights_, rtol=1e-6, atol=1e-9)

    # the setting is a param of the pipeline run
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.stage = 'pipeline'")
    assert [r.data.params.get("data.final_fit") for r in runs] == ["train+dev"]


def test_the_hmm_trains_on_train_plus_dev_too(corpus, tmp_path):
    results = run_pipeline(compose_config(tiny_overrides(corpus, tmp_path / "out") + ["model=hmm", "data.final_fit=train+dev"]))
    assert results["evaluate.test_accuracy"] > 80.0 and not any(k.startswith("evaluate.dev") for k in results)

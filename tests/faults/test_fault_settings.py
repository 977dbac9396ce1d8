"""Fault injection on settings: bad values from the command line fail at once, with one line naming
the setting, before any stage runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import CONF_DIR, compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.validate import SettingsError, validate_settings  # noqa: E402


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.c2=abc"], "bad setting trainer.c2='abc': c2 must be a number"),
        (["trainer.c2=-1"], "bad setting trainer.c2=-1: c2 must be a finite number >= 0"),
        (["trainer.c2=nan"], "bad setting trainer.c2=nan: c2 must be a finite number"),
        (["trainer=l1", "trainer.strength=-0.5"], "bad setting trainer.c1=-0.5"),
        (["trainer.max_iterations=-1"], "bad setting trainer.max_iterations=-1: max_iterations must be a finite number >= 1"),
        (["trainer.max_iterations=2.5"], "max_iterations must be an integer"),
        (["trainer.num_memories=0"], "bad setting trainer.num_memories=0"),
        (["trainer.threads=0"], "bad setting trainer.threads=0"),
        (["trainer.algorithm=newton"], "unknown algorithm 'newton'"),
        (["trainer=sgd", "trainer.c2=0"], "needs c2 > 0"),
        (["trainer=elasticnet", "trainer.strength=abc"], "bad setting in trainer"),
        (["model.all_possible_states=maybe"], "bad setting model.all_possible_states='maybe'"),
        (["model=hmm", "model.transition_smoothing=add-k", "model.k=0"], "bad setting model.k=0: add-k smoothing needs k > 0"),
        (["model=hmm", "model.k=abc"], "bad setting model.k='abc': must be a number"),
        (["model=hmm", "model.order=3"], "bad setting model.order=3: order must be 1 or 2"),
        (["model=hmm", "model.emission_smoothing=kneser-ney"], "bad setting model.emission_smoothing='kneser-ney'"),
        (["model=hmm", "model.rare_threshold=-1"], "bad setting model.rare_threshold=-1"),
        (["model.adapter=pipeline.models.nothing.Adapter"], "bad setting model.adapter"),
        (["data.train_fraction=0"], "bad setting data.train_fraction=0: must be a number in (0, 1]"),
        (["data.train_fraction=1.5"], "bad setting data.train_fraction=1.5"),
        (["seed=x"], "bad setting seed='x': must be an integer"),
        (["train.dev_every=-2"], "bad setting train.dev_every=-2"),
    ],
)
def test_bad_settings_fail_with_one_line_naming_them(overrides, message):
    with pytest.raises(SettingsError) as caught:
        validate_settings(compose_config(overrides))
    text = str(caught.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize("group", ["model", "trainer"])
def test_every_shipped_model_and_trainer_passes(group):
    for option in sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml")):
        validate_settings(compose_config([f"{group}={option}"]))
    validate_settings(compose_config(["model=hmm", "model.transition_smoothing=add-k", "model.k=0.5"]))
    validate_settings(compose_config(["trainer.c2=1", "trainer.max_iterations=5", "train.dev_every=0"]))  # int for float


@pytest.mark.parametrize("bad", ["trainer.c2=abc", "trainer.max_iterations=-1"])
def test_the_pipeline_fails_before_prepare(tmp_path, bad):
    from pipeline.runner import run_pipeline

    data_root = write_corpus(tmp_path / "data", n_train=10, n_test=5)
    with pytest.raises(SettingsError, match="bad setting"):
        run_pipeline(compose_config(tiny_overrides(data_root, tmp_path / "out") + [bad]))
    assert not (tmp_path / "out" / "cache" / "prepare").exists()  # nothing was prepared

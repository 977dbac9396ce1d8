"""Stage cache keys: what they hash (config slice, inputs, the code a stage runs) and what they do not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from omegaconf.errors import ConfigAttributeError, ReadonlyConfigError

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.cache import PROJECT_ROOT, StageCache, canonical, code_digest, module_closure  # noqa: E402
from pipeline.engine.runner import stage_key  # noqa: E402
from pipeline.engine.stage import BaseStage, frozen, load_stages  # noqa: E402
from pipeline.models import load_adapter  # noqa: E402

INPUTS = {"prepare": "p" * 64, "featurize": "f" * 64, "train": "t" * 64}


def _keys(overrides: list[str], tmp_path: Path) -> dict[str, str]:
    """The key of every stage but prepare (whose key reads the dataset files) under ``overrides``."""
    cfg = compose_config(overrides)
    adapter = load_adapter(cfg.model)
    cache = StageCache(tmp_path)
    keys = {}
    for name, stage in load_stages().items():
        if name != "prepare":
            keys[name] = stage_key(stage, cfg, adapter, {k: INPUTS[k] for k in stage.upstream(adapter)}, cache)[2]
    return keys


def test_canonical_numbers():
    assert canonical({"c2": 1}) == canonical({"c2": 1.0}) == canonical({"c2": 1.0e0})
    assert canonical({"c2": True}) != canonical({"c2": 1}) and canonical({"c2": False}) != canonical({"c2": 0.0})
    assert canonical({"c2": "1"}) != canonical({"c2": 1})
    assert canonical({"c2": 0.5}) != canonical({"c2": 1})
    assert canonical({"x": [1.0, {"y": 2.0}]}) == canonical({"x": [1, {"y": 2}]})
    assert canonical({"a": 1, "b": 2}) == canonical({"b": 2, "a": 1})
    assert canonical({"x": float("nan")}) == canonical({"x": float("nan")})


def test_key_ignores_threads_and_dev_cadence(tmp_path):
    base = _keys([], tmp_path)
    assert _keys(["trainer.threads=1"], tmp_path) == base
    assert _keys(["train.dev_every=0"], tmp_path) == base
    assert _keys(["featurize.log_matrices=true", "data.root=/elsewhere"], tmp_path) == base
    changed = _keys(["trainer.strength=0.5"], tmp_path)
    assert changed["featurize"] == base["featurize"]
    # evaluate's key follows the trained model through the train stage's output hash (fixed here)
    assert changed["train"] != base["train"] and changed["evaluate"] == base["evaluate"]
    assert _keys(["model.all_possible_states=true"], tmp_path)["train"] != base["train"]


def test_int_and_float_settings_share_a_key_but_booleans_do_not(tmp_path):
    base = _keys([], tmp_path)  # c2 = 1.0 (float)
    assert _keys(["trainer.c2=1"], tmp_path) == base
    assert _keys(["trainer.c2=1.0"], tmp_path) == base
    assert _keys(["trainer.c2=true"], tmp_path)["train"] != base["train"]
    assert _keys(["trainer.c2=2"], tmp_path)["train"] != base["train"]


def test_editing_a_module_changes_only_the_keys_of_stages_that_import_it(tmp_path):
    root = tmp_path / "project"
    for package in ("crf", "pipeline"):
        shutil.copytree(PROJECT_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    stages = load_stages()
    adapters = {name: load_adapter(compose_config([f"model={name}"]).model) for name in ("crf", "hmm")}

    def digests() -> dict[tuple[str, str], str]:
        return {
            (model, name): code_digest(stage.code_modules(adapter), root, cached=False)
            for model, adapter in adapters.items()
            for name, stage in stages.items()
        }

    def changed_after_editing(relative: str) -> set[tuple[str, str]]:
        before = digests()
        with open(root / relative, "a") as handle:
            handle.write("\n# edited\n")
        after = digests()
        return {k for k in before if before[k] != after[k]}

    assert changed_after_editing("pipeline/stages/evaluate.py") == {("crf", "evaluate"), ("hmm", "evaluate")}
    assert changed_after_editing("pipeline/models/hmm.py") == {("hmm", "train"), ("hmm", "evaluate")}
    # (the active-learning stage trains CRFs through the CRF adapter's builder, whatever the model)
    crf_users = {("crf", "train"), ("crf", "evaluate"), ("crf", "active_learning"), ("hmm", "active_learning")}
    semi = {("crf", "semi_supervised"), ("hmm", "semi_supervised")}  # trains HMMs and CRFs whatever the model
    crf_users |= semi
    assert changed_after_editing("pipeline/models/crf.py") == crf_users
    # the CRF adapter reads the featurize stage's files (its loaders live there)
    assert changed_after_editing("pipeline/stages/featurize.py") == crf_users | {("crf", "featurize"), ("hmm", "featurize")}
    # a model kind's library code counts only for the stages that run it: editing the HMM leaves
    # data preparation, features and the CRF's training as they were (cache hits)
    assert changed_after_editing("crf/hmm.py") == {("hmm", "train"), ("hmm", "evaluate")} | semi
    assert changed_after_editing("crf/model.py") == crf_users
    # nothing outside the stages' imports counts: the engine, tracking, the sweeps, the apps
    for relative in ("pipeline/engine/runner.py", "pipeline/engine/cache.py", "pipeline/engine/stage.py",
                     "pipeline/tracking/__init__.py", "pipeline/sweeps/summary.py", "pipeline/apps/benchmark.py",
                     "pipeline/sweeps/trial_stopping.py", "pipeline/sweeps/path.py", "pipeline/sweeps/search.py"):  # fmt: skip
        assert not changed_after_editing(relative), relative
    # every stage reads prepared data or the dataset through the library
    assert changed_after_editing("crf/io.py") == set(digests())


def test_editing_the_hmm_keeps_the_crf_pipelines_cache(tmp_path, monkeypatch):
    """The README's promise, on a real run: after an edit of crf/hmm.py the CRF pipeline's
    prepare, featurize, train and evaluate stages all come from the cache."""
    import pipeline.engine.cache as cache_module

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "project"
    for package in ("crf", "pipeline"):
        shutil.copytree(PROJECT_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_module, "PROJECT_ROOT", root)
    real = cache_module.code_digest
    monkeypatch.setattr(cache_module, "code_digest", lambda modules, root=root, cached=True: real(modules, root, cached=False))
    monkeypatch.setattr("pipeline.engine.runner.code_digest", cache_module.code_digest)
    data_root = write_corpus(tmp_path / "data", n_train=40, n_test=10)
    overrides = tiny_overrides(data_root, tmp_path / "out")
    run_pipeline(compose_config(overrides))
    with open(root / "crf" / "hmm.py", "a") as handle:
        handle.write("\n# edited\n")
    again = run_pipeline(compose_config(overrides))
    import mlflow

    runs = mlflow.search_runs(experiment_names=["crf"], filter_string="tags.stage != 'pipeline'", order_by=["start_time DESC"])
    latest = runs.head(4)
    assert set(latest["tags.stage"]) == {"prepare", "featurize", "train", "evaluate"}
    assert (latest["tags.cache"] == "hit").all()
    assert again["evaluate.test_f1"] > 0
    with open(root / "crf" / "model.py", "a") as handle:  # the CRF's own code: train and evaluate recompute
        handle.write("\n# edited\n")
    run_pipeline(compose_config(overrides))
    runs = mlflow.search_runs(experiment_names=["crf"], filter_string="tags.stage != 'pipeline'", order_by=["start_time DESC"])
    hits = dict(zip(runs.head(4)["tags.stage"], runs.head(4)["tags.cache"]))
    assert hits == {"prepare": "hit", "featurize": "hit", "train": "miss", "evaluate": "miss"}


def test_module_closure_follows_project_imports_only():
    closure = module_closure(["pipeline.stages.prepare"])
    assert {"pipeline", "pipeline.stages.prepare", "pipeline.stages.data", "crf", "crf.io"} <= set(closure)
    assert not any(name.startswith(("numpy", "omegaconf", "mlflow", "pipeline.engine", "pipeline.tracking")) for name in closure)
    assert "pipeline.stages.evaluate" not in closure and "crf.model" not in closure
    # ``from crf import CRF`` (a name the package imports on first use) counts its defining module
    assert "crf.model" in module_closure(["pipeline.models.crf"]) and "crf.hmm" not in module_closure(["pipeline.models.crf"])


def test_frozen_slice_refuses_other_keys():
    config = frozen({"evaluate": {"calibration_bins": 10}})
    assert config.evaluate.calibration_bins == 10
    with pytest.raises(ConfigAttributeError):
        config.trainer  # noqa: B018
    with pytest.raises(ReadonlyConfigError):
        config.evaluate.calibration_bins = 3


class _Greedy(BaseStage):
    """A stage that reads a key outside the slice it declared."""

    name = "evaluate"

    def upstream(self, adapter):
        return ("prepare",)

    def config_slice(self, cfg, adapter):
        return {"evaluate": {"calibration_bins": int(cfg.evaluate.calibration_bins)}}

    def run(self, context):
        return {"c2": float(context.config.trainer.c2)}  # not in its slice, so not in its key


def test_a_stage_reading_outside_its_slice_fails(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data_root = write_corpus(tmp_path / "data", n_train=20, n_test=5)
    stages = load_stages()
    monkeypatch.setattr("pipeline.engine.runner.load_stages", lambda: {"prepare": stages["prepare"], "evaluate": _Greedy()})
    cfg = compose_config(tiny_overrides(data_root, tmp_path / "out") + ["stages=[evaluate]"])
    with pytest.raises(ConfigAttributeError, match="trainer"):
        run_pipeline(cfg)
    assert not list((tmp_path / "out" / "cache" / "evaluate").glob("*/manifest.json"))  # nothing cached

"""Chain the stages under one MLflow parent run, reusing cached stage outputs.

``run_pipeline(cfg)`` is what ``python -m pipeline`` calls; tests call it with a config composed by
``hydra.compose``. Each stage is a module with ``config_slice(cfg)`` (what its output depends on)
and ``run(cfg, inputs, out) -> metrics``; inputs are the folders of earlier stages.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from omegaconf import DictConfig, OmegaConf

from pipeline import evaluate, featurize, prepare, tracking, train
from pipeline.cache import StageCache
from pipeline.tracking import SWEEP_ID_VARIABLE, SWEEP_PARENT_VARIABLE

STAGES = {"prepare": prepare, "featurize": featurize, "train": train, "evaluate": evaluate}
UPSTREAM = {
    "prepare": [],
    "featurize": ["prepare"],
    "train": ["prepare", "featurize"],
    "evaluate": ["prepare", "featurize", "train"],
}
SUMMARY_STAGES = ("prepare.", "train.", "evaluate.")  # whose metrics the pipeline run repeats


def upstream(stage: str, cfg: DictConfig) -> list[str]:
    """The stages whose outputs ``stage`` reads: the HMM reads the prepared words, not features."""
    stages = UPSTREAM[stage]
    if cfg.model.name == "hmm" and stage in ("train", "evaluate"):
        stages = [s for s in stages if s != "featurize"]
    return stages


METRICS_FILE = "stage_metrics.json"
ARTIFACT_SUFFIXES = (".json", ".csv", ".png", ".gz", ".npz", ".md")


@dataclass
class StageOutput:
    folder: Path
    hash: str
    cached: bool
    metrics: dict


def run_tags(cfg: DictConfig) -> dict[str, str]:
    trainer = str(cfg.trainer.name) if cfg.model.name == "crf" else "counting"
    tags = {
        "dataset": str(cfg.dataset.name),
        "model": str(cfg.model.name),
        "trainer": trainer,
        "features": str(cfg.features.name),
        "git_commit": tracking.git_commit(),
    }
    sweep = os.environ.get(SWEEP_ID_VARIABLE)
    if sweep:
        tags["sweep_id"] = sweep
    return tags


def _loggable(folder: Path, cfg: DictConfig, stage: str) -> list[Path]:
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name.endswith(ARTIFACT_SUFFIXES)]
    if stage == "featurize" and not cfg.featurize.log_matrices:
        files = [p for p in files if not p.name.startswith(("X_", "offsets_"))]
    return files


def run_stage(name: str, cfg: DictConfig, inputs: dict[str, StageOutput], cache: StageCache, tags: dict) -> StageOutput:
    """Run (or reuse) one stage inside a nested MLflow run."""
    module = STAGES[name]
    config = module.config_slice(cfg)
    input_hashes = {k: v.hash for k, v in inputs.items()}
    if hasattr(module, "input_hashes"):  # files from outside the pipeline (the dataset)
        input_hashes.update(module.input_hashes(cfg))
    key = cache.key(name, config, input_hashes)
    with mlflow.start_run(run_name=name, nested=True, tags={**tags, "stage": name, "cache_key": key}):
        tracking.log_params(tracking.flatten(config))
        found = None if cfg.force else cache.lookup(name, key)
        if found is not None:
            print(f"[{name}] cache hit {key[:12]}: reusing {found}", flush=True)
            folder = found
        else:
            print(f"[{name}] {'forced' if cfg.force else 'cache miss'} {key[:12]}: computing", flush=True)

            def produce(out: Path) -> None:
                stage_metrics = module.run(cfg, {k: v.folder for k, v in inputs.items()}, out)
                (out / METRICS_FILE).write_text(json.dumps(stage_metrics, indent=1))

            folder = cache.build(name, key, produce, replace=bool(cfg.force))
        stage_metrics = json.loads((folder / METRICS_FILE).read_text())
        mlflow.set_tag("cache", "hit" if found is not None else "miss")
        mlflow.set_tag("cache_path", str(folder))
        if found is not None and name == "train" and (folder / "history.csv").is_file():
            _relog_history(folder)
        mlflow.log_metrics({k: float(v) for k, v in stage_metrics.items() if isinstance(v, (int, float))})
        for path in _loggable(folder, cfg, name):
            mlflow.log_artifact(str(path), artifact_path=name)
        return StageOutput(folder, cache.output_hash(folder), found is not None, stage_metrics)


def _relog_history(folder: Path) -> None:
    """A cached training run gets its learning curve as step metrics too."""
    import pandas as pd
    from mlflow.entities import Metric

    history = pd.read_csv(folder / "history.csv")
    run_id = mlflow.active_run().info.run_id
    batch = [
        Metric(column, float(value), 0, int(row["iteration"]))
        for _, row in history.iterrows()
        for column, value in row.items()
        if column not in ("iteration",) and pd.notna(value)
    ]
    client = mlflow.tracking.MlflowClient()
    for i in range(0, len(batch), 1000):
        client.log_batch(run_id, metrics=batch[i : i + 1000])


def run_pipeline(cfg: DictConfig) -> dict[str, Any]:
    """Run the configured stages; returns every stage's metrics, namespaced ``stage.metric``."""
    stages = list(cfg.stages)
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {list(STAGES)}")
    tracking.setup(cfg)
    cache = StageCache(cfg.paths.cache_dir)
    tags = run_tags(cfg)
    parent = os.environ.get(SWEEP_PARENT_VARIABLE)
    run_name = f"{cfg.dataset.name}-{tags['model']}-{tags['trainer']}"
    outputs: dict[str, StageOutput] = {}
    results: dict[str, Any] = {}
    with mlflow.start_run(run_name=run_name, tags={**tags, "stage": "pipeline"}, parent_run_id=parent or None):
        tracking.log_params(tracking.flatten(OmegaConf.to_container(cfg, resolve=True)))
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "config.yaml"
            path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
            mlflow.log_artifact(str(path))
        needed = set(stages)
        for stage in stages:
            needed.update(upstream(stage, cfg))
        for stage in STAGES:  # upstream stages run (or come from the cache) first
            if stage not in needed:
                continue
            inputs = {}
            for name in upstream(stage, cfg):
                inputs[name] = outputs[name]
            outputs[stage] = run_stage(stage, cfg, inputs, cache, tags)
            results.update({f"{stage}.{k}": v for k, v in outputs[stage].metrics.items()})
        summary = {k.split(".", 1)[1]: v for k, v in results.items() if k.startswith(SUMMARY_STAGES)}
        mlflow.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (int, float))})
        mlflow.set_tag("cache_hits", ",".join(s for s, o in outputs.items() if o.cached) or "none")
    return results


def objective_value(results: dict[str, Any]) -> float | None:
    """What a sweep optimises: dev F1 for chunk/entity tasks, else dev accuracy."""
    for key in ("evaluate.dev_f1", "evaluate.dev_accuracy"):
        if key in results:
            return float(results[key])
    return None

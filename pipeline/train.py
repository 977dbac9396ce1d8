"""Stage 3, train: fit the configured model: the CRF with its trainer, or the HMM baseline.

CRF input: the prepare and featurize folders. Output folder: ``model.npz`` (see ``CRF.save``),
``history.csv`` (one row per iteration: loss, gradient norm, active features, elapsed seconds,
and dev accuracy/F1 every ``train.dev_every`` iterations) and ``learning_curve.png``.
While training, each iteration goes to the console (with an estimate of the time left) and to
the active MLflow run as step metrics.

HMM input: the prepare folder only (the HMM reads the observation column ``model.observation``).
Output folder: ``model.npz`` (see ``HMMTagger.save``) and ``hmm.json`` (sizes, interpolation
weights).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from crf import CRF, HMMTagger, metrics
from crf.optimize import IterationInfo
from pipeline.featurize import load_batch, load_extractor
from pipeline.prepare import read_prepared
from pipeline.report import figure, save_figure
from pipeline.tracking import SWEEP_ID_VARIABLE


def config_slice(cfg) -> dict:
    if cfg.model.name == "hmm":
        return {"model": OmegaConf.to_container(cfg.model, resolve=True)}
    return {
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "trainer": OmegaConf.to_container(cfg.trainer, resolve=True),
        "dev_every": cfg.train.dev_every,
        "seed": cfg.seed,
    }


def build_model(trainer: Mapping, seed: int, dev_every: int) -> CRF:
    params = {k: trainer[k] for k in CRF().get_params() if k in trainer and trainer[k] is not None}
    threads = trainer.get("threads")
    if threads is None and os.environ.get(SWEEP_ID_VARIABLE):
        threads = 1  # sweep jobs already run in parallel, one per core
    return CRF(random_state=seed, dev_every=dev_every, n_threads=threads, **params)


def remaining_seconds(history: list[dict], max_iterations: int | None, period: int, delta: float) -> float | None:
    """Estimated seconds left: by the iteration cap when set, else by extrapolating the decay of
    the relative improvement over ``period`` down to ``delta`` (CRFsuite's stopping rule)."""
    if not history:
        return None
    per_iteration = history[-1]["elapsed"] / len(history)
    left = None
    if len(history) > period + 3 and delta > 0:
        losses = np.array([h["loss"] for h in history])
        improvement = (losses[:-period] - losses[period:]) / np.abs(losses[period:])
        recent = improvement[-min(len(improvement), 20) :]
        if np.all(recent > 0):
            slope, intercept = np.polyfit(np.arange(recent.size), np.log(recent), 1)
            if slope < 0:
                left = max(0.0, (math.log(delta) - (intercept + slope * (recent.size - 1))) / slope)
    if max_iterations:
        cap = max_iterations - len(history)
        left = cap if left is None else min(left, cap)
    return None if left is None else left * per_iteration


class Progress:
    """Per-iteration console line and MLflow step metrics (flushed in batches)."""

    def __init__(self, model: CRF, gold_dev, scheme: str, log_every: int = 10) -> None:
        self.model = model
        self.gold_dev = gold_dev
        self.scheme = scheme
        self.history: list[dict] = []
        self.pending: list[tuple[int, dict]] = []
        self.log_every = log_every

    def __call__(self, info: IterationInfo) -> None:
        row = {
            "iteration": info.iteration,
            "loss": info.loss,
            "gradient_norm": info.gradient_norm,
            "active_features": info.active_features,
            "elapsed": info.elapsed,
        }
        if hasattr(info, "dev_predictions"):
            row["dev_accuracy"] = metrics.token_accuracy(self.gold_dev, info.dev_predictions)
            if self.scheme != "none":
                row["dev_f1"] = metrics.chunk_scores(self.gold_dev, info.dev_predictions).f1
        self.history.append(row)
        self.pending.append((info.iteration, {k: v for k, v in row.items() if k != "iteration" and np.isfinite(v)}))
        if len(self.pending) >= self.log_every:
            self.flush()
        left = remaining_seconds(self.history, self.model.max_iterations, self.model.period, self.model.delta)
        eta = "?" if left is None else f"~{left:.0f}s"
        dev = "".join(f" {k}={row[k]:.2f}" for k in ("dev_accuracy", "dev_f1") if k in row)
        print(
            f"[train] iter {info.iteration:4d}  loss {info.loss:14.4f}  |g| {info.gradient_norm:10.4g}  "
            f"active {info.active_features:8d}  {info.elapsed:7.1f}s  left {eta}{dev}",
            flush=True,
        )

    def flush(self) -> None:
        import mlflow

        if self.pending and mlflow.active_run() is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            batch = [Metric(key, float(value), now, step) for step, values in self.pending for key, value in values.items()]
            for i in range(0, len(batch), 1000):
                mlflow.tracking.MlflowClient().log_batch(mlflow.active_run().info.run_id, metrics=batch[i : i + 1000])
        self.pending = []


def plot_learning_curve(history: pd.DataFrame, path: Path) -> None:
    fig, (ax,) = figure(6.5, 4)
    ax.plot(history["iteration"], history["loss"], color="tab:blue")
    ax.set_xlabel("iteration")
    ax.set_ylabel("regularised loss", color="tab:blue")
    ax.set_yscale("log")
    dev_columns = [c for c in ("dev_f1", "dev_accuracy") if c in history]
    if dev_columns:
        other = ax.twinx()
        column = dev_columns[0]
        points = history.dropna(subset=[column])
        other.plot(points["iteration"], points[column], "o-", color="tab:orange")
        other.set_ylabel(column, color="tab:orange")
    save_figure(fig, path)


def build_hmm(model: Mapping) -> HMMTagger:
    threads = 1 if os.environ.get(SWEEP_ID_VARIABLE) else None  # sweep jobs already run one per core
    params = {k: model[k] for k in HMMTagger().get_params() if k in model and model[k] is not None}
    return HMMTagger(n_threads=threads, **params)


def run_hmm(cfg, inputs: Mapping[str, Path], out: Path) -> dict:
    import json

    data = read_prepared(inputs["prepare"], OmegaConf.to_container(cfg.dataset, resolve=True))
    spec = OmegaConf.to_container(cfg.model, resolve=True)
    model = build_hmm(spec)
    began = time.perf_counter()
    model.fit(data.column("train", spec["observation"]), data.labels("train"))
    seconds = time.perf_counter() - began
    model.save(out / "model.npz")
    info = {
        "train_seconds": seconds,
        "model_bytes": (out / "model.npz").stat().st_size,
        "labels": len(model.classes_),
        "hidden_labels": model.n_hidden_,
        "vocabulary": len(model.vocabulary_),
        "suffixes": 0 if model.suffix_model_ is None else len(model.suffix_model_.keys),
    }
    weights = model.interpolation_weights_
    if weights is not None:
        info.update({f"lambda_{n + 1}": float(w) for n, w in enumerate(weights)})
    (out / "hmm.json").write_text(json.dumps(info, indent=1))
    print(f"[train] HMM order {model.order} on {spec['observation']!r}: {seconds:.2f}s, {info['vocabulary']:,} words", flush=True)
    return info


def run(cfg, inputs: Mapping[str, Path], out: Path) -> dict:
    if cfg.model.name == "hmm":
        return run_hmm(cfg, inputs, out)
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    data = read_prepared(inputs["prepare"], dataset)
    extractor = load_extractor(inputs["featurize"] / "extractor.npz")
    X_train = load_batch(inputs["featurize"], "train")
    X_dev = load_batch(inputs["featurize"], "dev")
    model = build_model(OmegaConf.to_container(cfg.trainer, resolve=True), int(cfg.seed), int(cfg.train.dev_every))
    progress = Progress(model, data.labels("dev"), data.scheme)
    model.callback = progress
    began = time.perf_counter()
    model.fit(X_train, data.labels("train"), X_dev, data.labels("dev"), attribute_names=extractor.attribute_names())
    seconds = time.perf_counter() - began
    progress.flush()
    model.callback = None
    model.save(out / "model.npz")
    history = pd.DataFrame(progress.history)
    history.to_csv(out / "history.csv", index=False)
    plot_learning_curve(history, out / "learning_curve.png")
    print(f"[train] {model.n_iter_} iterations in {seconds:.1f}s, stopped by {model.stop_reason_}", flush=True)
    return {
        "train_seconds": seconds,
        "model_bytes": (out / "model.npz").stat().st_size,
        "iterations": model.n_iter_,
        "evaluations": model.n_evaluations_,
        "nonzero_weights": model.size_,
        "final_loss": float(history["loss"].iloc[-1]) if len(history) else float("nan"),
    }

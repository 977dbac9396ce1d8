"""Stage 4, evaluate: scores on dev and test, tables, plots and predictions with confidence.

Input: the prepare, featurize and train folders. Output folder: ``metrics.json``;
``{split}_per_label.csv`` (token-level P/R/F1 per label) and, for chunk/entity tasks,
``{split}_per_type.csv`` (conlleval per type); ``confusion_test.csv`` and ``confusion_test.png``;
``predictions_{split}.tsv.gz`` (sentence, token, word, gold, predicted, marginal probability of
the predicted label); ``segments_{split}.csv.gz`` (each predicted chunk with its constrained
forward-backward confidence and whether it is correct); ``calibration_test.png`` (confidence
against observed correctness).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from crf import CRF, metrics
from pipeline.featurize import load_batch
from pipeline.prepare import read_prepared
from pipeline.report import figure, save_figure

SPLITS = ("dev", "test")


def config_slice(cfg) -> dict:
    return {"evaluate": OmegaConf.to_container(cfg.evaluate, resolve=True)}


def calibration_table(confidence: np.ndarray, correct: np.ndarray, bins: int) -> pd.DataFrame:
    """Per confidence bin: mean confidence, observed accuracy, count."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1]), 0, bins - 1)
    frame = pd.DataFrame({"bin": which, "confidence": confidence, "correct": correct.astype(float)})
    table = frame.groupby("bin").agg(confidence=("confidence", "mean"), accuracy=("correct", "mean"), count=("correct", "size"))
    table["low"], table["high"] = edges[table.index], edges[table.index + 1]
    return table.reset_index(drop=True)


def expected_calibration_error(table: pd.DataFrame) -> float:
    weights = table["count"] / table["count"].sum()
    return float((weights * (table["confidence"] - table["accuracy"]).abs()).sum())


def plot_calibration(table: pd.DataFrame, path: Path, what: str) -> None:
    fig, (ax,) = figure(5, 5)
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect calibration")
    ax.plot(table["confidence"], table["accuracy"], "o-", label=what)
    for _, row in table.iterrows():
        ax.annotate(f"{int(row['count'])}", (row["confidence"], row["accuracy"]), fontsize=7, xytext=(3, -9), textcoords="offset points")
    ax.set_xlabel("model confidence")
    ax.set_ylabel("observed fraction correct")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left")
    ax.set_title(f"calibration: {what}")
    save_figure(fig, path)


def plot_confusion(confusion: pd.DataFrame, path: Path) -> None:
    counts = confusion.to_numpy().astype(float)
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = max(5.0, 0.28 * len(confusion))
    fig, (ax,) = figure(size + 1, size)
    image = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(confusion.columns)), confusion.columns, rotation=90, fontsize=7)
    ax.set_yticks(range(len(confusion.index)), confusion.index, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    fig.colorbar(image, ax=ax, fraction=0.046, label="row-normalised rate")
    save_figure(fig, path)


def run(cfg, inputs: Mapping[str, Path], out: Path) -> dict:
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    data = read_prepared(inputs["prepare"], dataset)
    model = CRF.load(inputs["train"] / "model.npz")
    bins = int(cfg.evaluate.calibration_bins)
    chunked = data.scheme != "none"
    results: dict = {}
    for split in SPLITS:
        batch = load_batch(inputs["featurize"], split)
        gold = data.labels(split)
        began = time.perf_counter()
        codes, _ = model.predict_codes(batch)
        results[f"{split}_tag_tokens_per_second"] = batch.n_tokens / (time.perf_counter() - began)
        classes = np.array(model.classes_, dtype=object)
        predicted = [list(classes[c]) for c in codes]
        flat_pred = np.concatenate(codes)
        marginals, _ = model.marginals(batch)
        confidence = marginals[np.arange(flat_pred.size), flat_pred]
        words = data.column(split, "w") if "w" in data.columns else [[""] * len(g) for g in gold]
        sentence = np.repeat(np.arange(len(gold)), [len(g) for g in gold])
        position = np.concatenate([np.arange(len(g)) for g in gold])
        flat_gold = [label for seq in gold for label in seq]
        predictions = pd.DataFrame({"sentence": sentence, "token": position, "word": [w for seq in words for w in seq],
                                    "gold": flat_gold, "predicted": [p for seq in predicted for p in seq], "marginal": confidence})
        predictions.to_csv(out / f"predictions_{split}.tsv.gz", sep="\t", index=False)

        results[f"{split}_accuracy"] = metrics.token_accuracy(gold, predicted)
        metrics.label_scores(gold, predicted).to_csv(out / f"{split}_per_label.csv")
        if chunked:
            scores = metrics.chunk_scores(gold, predicted)
            results.update({f"{split}_precision": scores.precision, f"{split}_recall": scores.recall, f"{split}_f1": scores.f1})
            scores.per_type.to_csv(out / f"{split}_per_type.csv")
            segments = model.predict_segments(batch)
            truth = metrics.chunks(gold)
            merged = segments.merge(truth, on=["sequence", "start", "end", "type"], how="left", indicator=True)
            segments["correct"] = (merged["_merge"] == "both").to_numpy()
            segments.to_csv(out / f"segments_{split}.csv.gz", index=False)
            calibrated, correct, what = segments["confidence"].to_numpy(), segments["correct"].to_numpy(), "predicted chunks"
        else:
            calibrated, correct, what = confidence, predictions["gold"].to_numpy() == predictions["predicted"].to_numpy(), "predicted tokens"
        table = calibration_table(calibrated, correct, bins)
        results[f"{split}_calibration_error"] = expected_calibration_error(table)
        if split == "test":
            table.to_csv(out / "calibration_test.csv", index=False)
            plot_calibration(table, out / "calibration_test.png", what)
            confusion = metrics.confusion_matrix(gold, predicted, model.classes_)
            confusion.to_csv(out / "confusion_test.csv")
            plot_confusion(confusion, out / "confusion_test.png")
    (out / "metrics.json").write_text(json.dumps(results, indent=1))
    summary = ", ".join(f"{k} {v:.2f}" for k, v in results.items() if k.endswith(("_f1", "_accuracy")))
    print(f"[evaluate] {summary}", flush=True)
    return results

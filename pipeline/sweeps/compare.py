"""HMM versus CRF: the summary of a ``+experiment=hmm_vs_crf`` multirun.

The multirun trains both models on the same seeded subsets of the training sentences (each job
an ordinary cached pipeline run: prepare, then featurize/train/evaluate for the CRF or
train/evaluate for the HMM). When the jobs are done this module gathers them from MLflow and
logs to the sweep's parent run:

- ``comparison.csv`` / ``comparison.md``: the two models side by side on the full training set
  (accuracy, chunk/entity F1, accuracy on known and unknown words, training seconds, tagging
  tokens per second, model size), the difference, and its significance: an exact McNemar test
  on tokens and a paired bootstrap over sentences (p-values and 95% intervals);
- ``per_label_f1.csv``: token F1 per label (and conlleval F1 per chunk type) of both models and
  the labels where they differ most (also in ``comparison.md``);
- ``learning_curve.csv`` / ``learning_curve.png``: test accuracy (and F1) against the number of
  training tokens for both models.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from crf import metrics
from pipeline import tracking
from pipeline.report import figure, markdown_table, save_figure

log = logging.getLogger(__name__)

MODELS = ("hmm", "crf")
COLUMNS = {  # table column -> MLflow metric of a pipeline run
    "train_sentences": "data.train_sentences",
    "train_tokens": "data.train_tokens",
    "accuracy": "test_accuracy",
    "f1": "test_f1",
    "known_accuracy": "test_known_accuracy",
    "unknown_accuracy": "test_unknown_accuracy",
    "unknown_rate": "test_unknown_rate",
    "train_seconds": "train_seconds",
    "tag_tokens_per_second": "test_tag_tokens_per_second",
    "model_bytes": "model_bytes",
}


def gather(sweep_id: str, experiment: str) -> pd.DataFrame:
    """One row per pipeline job of the sweep: model, training fraction, status and scores."""
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.stage = 'pipeline'"
    )
    if runs.empty:
        return pd.DataFrame()
    table = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "status": runs["status"],
            "model": runs.get("tags.model"),
            "fraction": pd.to_numeric(runs.get("params.data.train_fraction"), errors="coerce"),
        }
    )
    for column, metric in COLUMNS.items():
        table[column] = runs.get(f"metrics.{metric}", pd.Series(np.nan, index=runs.index))
    return table.sort_values(["model", "fraction"], ignore_index=True)


def test_predictions(run_id: str, experiment: str) -> pd.DataFrame:
    """The test predictions of a pipeline run, from its evaluate stage's artifacts."""
    stages = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.mlflow.parentRunId = '{run_id}' and tags.stage = 'evaluate'"
    )
    if stages.empty:
        raise RuntimeError(f"pipeline run {run_id} has no evaluate stage run")
    stage = stages.iloc[0]
    # a stage run served from the cache holds no files of its own: they are on the run that computed them
    source = stage.get(f"tags.{tracking.CACHE_SOURCE_TAG}")
    holder = source if isinstance(source, str) and source else stage["run_id"]
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as folder:
        path = mlflow.artifacts.download_artifacts(
            run_id=holder, artifact_path="evaluate/predictions_test.tsv.gz", dst_path=folder
        )
        return pd.read_csv(path, sep="\t", keep_default_na=False, na_values=[])


def sequences(frame: pd.DataFrame, column: str) -> list[list[str]]:
    offsets = np.flatnonzero(np.diff(frame["sentence"].to_numpy(), prepend=-1) != 0).tolist() + [len(frame)]
    values = frame[column].astype(str).tolist()
    return [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def significance(hmm: pd.DataFrame, crf: pd.DataFrame, chunked: bool, samples: int, seed: int) -> tuple[dict, pd.DataFrame]:
    """McNemar on tokens and paired bootstrap over sentences of the CRF against the HMM."""
    if not (hmm[["sentence", "token", "gold"]].to_numpy() == crf[["sentence", "token", "gold"]].to_numpy()).all():
        raise RuntimeError("the two models' test predictions are not on the same tokens")
    gold, first, second = sequences(hmm, "gold"), sequences(hmm, "predicted"), sequences(crf, "predicted")
    test = metrics.mcnemar(gold, first, second)
    bootstrap = metrics.paired_bootstrap(gold, first, second, chunked, samples=samples, seed=seed)
    return test, bootstrap


def per_label(hmm: pd.DataFrame, crf: pd.DataFrame, chunked: bool) -> pd.DataFrame:
    """F1 per label (token level) and, for chunk tasks, per chunk type (conlleval), both models."""
    gold = sequences(hmm, "gold")
    frames = []
    for kind, scorer in (("label", metrics.label_scores), ("chunk type", lambda g, p: metrics.chunk_scores(g, p).per_type)):
        if kind == "chunk type" and not chunked:
            continue
        a, b = scorer(gold, sequences(hmm, "predicted")), scorer(gold, sequences(crf, "predicted"))
        frame = pd.DataFrame(
            {
                "kind": kind,
                "name": a.index.astype(str),
                "support": a["support"].to_numpy(),
                "hmm_f1": a["f1"].to_numpy(),
                "crf_f1": b["f1"].reindex(a.index).to_numpy(),
            }
        )
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    table["difference"] = table["crf_f1"] - table["hmm_f1"]
    return table.sort_values("difference", key=np.abs, ascending=False, ignore_index=True)


def plot_learning_curve(table: pd.DataFrame, path: Path, chunked: bool) -> None:
    scores = ["accuracy", "f1"] if chunked else ["accuracy"]
    fig, axes = figure(5.5 * len(scores), 4, len(scores))
    for ax, score in zip(axes, scores):
        for model, part in table.groupby("model"):
            part = part.sort_values("train_tokens")
            ax.plot(part["train_tokens"], part[score], "o-", label=model.upper())
        ax.set_xscale("log")
        ax.set_xlabel("training tokens (seeded subsets of the training sentences)")
        ax.set_ylabel(f"test {'chunk F1' if score == 'f1' else 'token accuracy'} (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, path)


def summarize(sweep_id: str, parent_run_id: str | None, experiment: str, settings) -> pd.DataFrame:
    """Build the comparison from the sweep's jobs and log it to the parent run."""
    table = gather(sweep_id, experiment)
    finished = table[table.status == "FINISHED"] if not table.empty else table
    if finished.empty or set(finished["model"]) != set(MODELS):
        log.warning("[compare %s] need finished runs of both models; have %s", sweep_id, sorted(set(finished.get("model", []))))
        return table
    chunked = finished["f1"].notna().all()
    largest = finished.groupby("model")["fraction"].max()
    if largest["hmm"] != largest["crf"]:
        log.warning("[compare %s] the two models' largest training fractions differ: %s", sweep_id, dict(largest))
        return table
    full = finished[finished["fraction"] == largest["hmm"]].drop_duplicates("model", keep="last").set_index("model")
    predictions = {model: test_predictions(full.loc[model, "run_id"], experiment) for model in MODELS}
    test, bootstrap = significance(
        predictions["hmm"], predictions["crf"], chunked, int(settings.bootstrap_samples), int(settings.seed)
    )
    labels = per_label(predictions["hmm"], predictions["crf"], chunked)

    side = full.loc[list(MODELS), list(COLUMNS)].reset_index()
    if not chunked:
        side = side.drop(columns=["f1"])
    difference = {"model": "crf - hmm"}
    for column in side.columns[1:]:
        difference[column] = (
            side[column].iloc[1] - side[column].iloc[0] if column not in ("train_sentences", "train_tokens") else None
        )
    side = pd.concat([side, pd.DataFrame([difference])], ignore_index=True)
    side["p_mcnemar"] = [None, None, test["p_value"]]
    for _, row in bootstrap.iterrows():
        side[f"p_bootstrap_{row['metric']}"] = [None, None, row["p_value"]]

    top = int(settings.top_labels)
    lines = [
        f"# HMM versus CRF on {full.loc['crf', 'train_sentences']:,.0f} training sentences",
        "",
        markdown_table(side),
        "",
        f"McNemar (tokens): {test['only_first_correct']:,} tokens right only by the HMM, "
        f"{test['only_second_correct']:,} only by the CRF; exact p = {test['p_value']:.3g}.",
        "",
        f"Paired bootstrap over test sentences ({int(settings.bootstrap_samples)} resamples, seed {int(settings.seed)}), "
        "CRF minus HMM:",
        "",
        markdown_table(bootstrap.rename(columns={"first": "hmm", "second": "crf"})),
        "",
        f"## Labels where the two differ most (top {top})",
        "",
        markdown_table(labels.head(top)),
        "",
        "## Learning curve (test scores against training size)",
        "",
        markdown_table(finished.drop(columns=["run_id", "status"]).dropna(axis=1, how="all").sort_values(["fraction", "model"])),
    ]
    text = "\n".join(lines) + "\n"
    client = MlflowClient()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        side.to_csv(folder / "comparison.csv", index=False)
        bootstrap.to_csv(folder / "bootstrap.csv", index=False)
        labels.to_csv(folder / "per_label_f1.csv", index=False)
        finished.drop(columns=["status"]).to_csv(folder / "learning_curve.csv", index=False)
        (folder / "comparison.md").write_text(text)
        plot_learning_curve(finished, folder / "learning_curve.png", chunked)
        if parent_run_id:
            for model in MODELS:
                for column in (
                    "accuracy",
                    "f1",
                    "known_accuracy",
                    "unknown_accuracy",
                    "train_seconds",
                    "tag_tokens_per_second",
                    "model_bytes",
                ):
                    value = full.loc[model, column]
                    if pd.notna(value):
                        client.log_metric(parent_run_id, f"{model}_{column}", float(value))
            client.log_metric(parent_run_id, "p_mcnemar", float(test["p_value"]))
            for _, row in bootstrap.iterrows():
                client.log_metric(parent_run_id, f"p_bootstrap_{row['metric']}", float(row["p_value"]))
            for path in sorted(folder.iterdir()):
                client.log_artifact(parent_run_id, str(path))
    log.info("[compare %s]\n%s", sweep_id, text)
    return table

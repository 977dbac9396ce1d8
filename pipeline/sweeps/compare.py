"""HMM versus CRF, order for order: the summary of a ``+experiment=hmm_vs_crf`` multirun.

The multirun trains both model families at both orders (``model: crf,hmm`` x ``model.order: 1,2``)
on the same seeded subsets of the training sentences (each job an ordinary cached pipeline run:
prepare, then featurize/train/evaluate for the CRF or train/evaluate for the HMM). An *arm* is a
family and an order (``hmm1``, ``hmm2``, ``crf1``, ``crf2``). When the jobs are done this module
gathers them from MLflow and logs to the sweep's parent run:

- ``comparison.csv`` / ``comparison.md``: every arm side by side on the full training set
  (accuracy, chunk/entity F1, accuracy on known and unknown words, training seconds, tagging
  tokens per second, model size) and, for each compared pair, the difference and its
  significance: an exact McNemar test on tokens and a paired bootstrap over sentences (p-values
  and 95% intervals). The pairs change one factor: the family at the same order (``crf1 - hmm1``,
  ``crf2 - hmm2``) and the order in the same family (``hmm2 - hmm1``, ``crf2 - crf1``); a sweep
  without the order axis compares its CRF with its HMM;
- ``per_label_f1.csv``: token F1 per label (and conlleval F1 per chunk type) of every arm and
  the labels where they differ most (also in ``comparison.md``);
- ``learning_curve.csv`` / ``learning_curve.png``: test accuracy (and F1) against the number of
  training tokens for every arm.
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
from pipeline.report import figure, log_scale, markdown_table, save_figure

log = logging.getLogger(__name__)

FAMILIES = ("hmm", "crf")
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


def arm_name(family: str, order) -> str:
    """``hmm2``, ``crf1``: the family and its order (a CRF config without ``order`` is first order)."""
    if order is None or (isinstance(order, float) and np.isnan(order)) or order == "":
        order = 1 if family == "crf" else 2
    return f"{family}{int(float(order))}"


def compared_pairs(arms) -> list[tuple[str, str]]:
    """(first, second) pairs to test, second minus first: the family at the same order, then the
    order within a family; without such pairs (a sweep without the order axis), every CRF arm
    against every HMM arm."""
    arms = set(arms)
    pairs = [(f"hmm{o}", f"crf{o}") for o in (1, 2)] + [(f"{f}1", f"{f}2") for f in FAMILIES]
    pairs = [(a, b) for a, b in pairs if a in arms and b in arms]
    if not pairs:
        pairs = [(a, b) for a in sorted(arms) if a.startswith("hmm") for b in sorted(arms) if b.startswith("crf")]
    return pairs


def gather(sweep_id: str, experiment: str) -> pd.DataFrame:
    """One row per pipeline job of the sweep: model, training fraction, status and scores."""
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.stage = 'pipeline'"
    )
    if runs.empty:
        return pd.DataFrame()
    orders = runs.get("params.model.order", pd.Series(None, index=runs.index))
    table = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "status": runs["status"],
            "model": [arm_name(family, order) for family, order in zip(runs.get("tags.model"), orders)],
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


def significance(first: pd.DataFrame, second: pd.DataFrame, chunked: bool, samples: int, seed: int) -> tuple[dict, pd.DataFrame]:
    """McNemar on tokens and paired bootstrap over sentences of ``second`` against ``first``."""
    if not (first[["sentence", "token", "gold"]].to_numpy() == second[["sentence", "token", "gold"]].to_numpy()).all():
        raise RuntimeError("the two models' test predictions are not on the same tokens")
    gold, a, b = sequences(first, "gold"), sequences(first, "predicted"), sequences(second, "predicted")
    test = metrics.mcnemar(gold, a, b)
    bootstrap = metrics.paired_bootstrap(gold, a, b, chunked, samples=samples, seed=seed)
    return test, bootstrap


def per_label(predictions: dict[str, pd.DataFrame], chunked: bool) -> pd.DataFrame:
    """F1 per label (token level) and, for chunk tasks, per chunk type (conlleval), every arm;
    ``spread`` is the largest minus the smallest F1 of the arms."""
    arms = list(predictions)
    gold = sequences(predictions[arms[0]], "gold")
    frames = []
    for kind, scorer in (("label", metrics.label_scores), ("chunk type", lambda g, p: metrics.chunk_scores(g, p).per_type)):
        if kind == "chunk type" and not chunked:
            continue
        scores = {arm: scorer(gold, sequences(frame, "predicted")) for arm, frame in predictions.items()}
        index = scores[arms[0]].index
        frame = pd.DataFrame({"kind": kind, "name": index.astype(str), "support": scores[arms[0]]["support"].to_numpy()})
        for arm in arms:
            frame[f"{arm}_f1"] = scores[arm]["f1"].reindex(index).to_numpy()
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    f1 = table[[f"{arm}_f1" for arm in arms]]
    table["spread"] = f1.max(axis=1) - f1.min(axis=1)
    return table.sort_values("spread", ascending=False, ignore_index=True)


def plot_learning_curve(table: pd.DataFrame, path: Path, chunked: bool) -> None:
    scores = ["accuracy", "f1"] if chunked else ["accuracy"]
    fig, axes = figure(5.5 * len(scores), 4, len(scores))
    for ax, score in zip(axes, scores):
        for model, part in table.groupby("model"):
            part = part.sort_values("train_tokens")
            ax.plot(part["train_tokens"], part[score], "o-", label=f"{model[:-1].upper()} order {model[-1]}")
        log_scale(ax, "x")
        ax.set_xlabel("training tokens (seeded subsets of the training sentences)")
        ax.set_ylabel(f"test {'chunk F1' if score == 'f1' else 'token accuracy'} (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, path)


def summarize(sweep_id: str, parent_run_id: str | None, experiment: str, settings) -> pd.DataFrame:
    """Build the comparison from the sweep's jobs and log it to the parent run."""
    table = gather(sweep_id, experiment)
    finished = table[table.status == "FINISHED"] if not table.empty else table
    arms = sorted(set(finished.get("model", [])))
    if finished.empty or {arm[:-1] for arm in arms} != set(FAMILIES):
        log.warning("[compare %s] need finished runs of both model families; have %s", sweep_id, arms)
        return table
    chunked = finished["f1"].notna().all()
    largest = finished.groupby("model")["fraction"].max()
    if largest.nunique() != 1:
        log.warning("[compare %s] the arms' largest training fractions differ: %s", sweep_id, dict(largest))
        return table
    full = finished[finished["fraction"] == largest.iloc[0]].drop_duplicates("model", keep="last").set_index("model")
    predictions = {arm: test_predictions(full.loc[arm, "run_id"], experiment) for arm in arms}
    samples, seed = int(settings.bootstrap_samples), int(settings.seed)
    pairs = compared_pairs(arms)
    tests = {pair: significance(predictions[pair[0]], predictions[pair[1]], chunked, samples, seed) for pair in pairs}
    labels = per_label(predictions, chunked)

    side = full.loc[arms, list(COLUMNS)].reset_index()
    if not chunked:
        side = side.drop(columns=["f1"])
    rows = []
    for (first, second), (test, bootstrap) in tests.items():
        row = {"model": f"{second} - {first}"}
        for column in side.columns[1:]:
            if column not in ("train_sentences", "train_tokens"):
                row[column] = full.loc[second, column] - full.loc[first, column]
        row["p_mcnemar"] = test["p_value"]
        for _, b in bootstrap.iterrows():
            row[f"p_bootstrap_{b['metric']}"] = b["p_value"]
        rows.append(row)
    side = pd.concat([side, pd.DataFrame(rows)], ignore_index=True)
    bootstraps = pd.concat(
        [
            b.rename(columns={"first": "first_value", "second": "second_value"}).assign(pair=f"{s} - {f}")
            for (f, s), (_, b) in tests.items()
        ],
        ignore_index=True,
    )

    top = int(settings.top_labels)
    lines = [
        f"# HMM versus CRF, order for order, on {full['train_sentences'].iloc[0]:,.0f} training sentences",
        "",
        markdown_table(side),
        "",
    ]
    for (first, second), (test, _) in tests.items():
        lines.append(
            f"McNemar (tokens), {second} against {first}: {test['only_first_correct']:,} tokens right only by {first}, "
            f"{test['only_second_correct']:,} only by {second}; exact p = {test['p_value']:.3g}."
        )
    lines += [
        "",
        f"Paired bootstrap over test sentences ({samples} resamples, seed {seed}), second minus first:",
        "",
        markdown_table(bootstraps),
        "",
        f"## Labels where the arms differ most (top {top})",
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
        bootstraps.to_csv(folder / "bootstrap.csv", index=False)
        labels.to_csv(folder / "per_label_f1.csv", index=False)
        finished.drop(columns=["status"]).to_csv(folder / "learning_curve.csv", index=False)
        (folder / "comparison.md").write_text(text)
        plot_learning_curve(finished, folder / "learning_curve.png", chunked)
        if parent_run_id:
            for arm in arms:
                for column in (
                    "accuracy",
                    "f1",
                    "known_accuracy",
                    "unknown_accuracy",
                    "train_seconds",
                    "tag_tokens_per_second",
                    "model_bytes",
                ):
                    value = full.loc[arm, column]
                    if pd.notna(value):
                        client.log_metric(parent_run_id, f"{arm}_{column}", float(value))
            for (first, second), (test, bootstrap) in tests.items():
                client.log_metric(parent_run_id, f"p_mcnemar_{second}_vs_{first}", float(test["p_value"]))
                for _, row in bootstrap.iterrows():
                    client.log_metric(parent_run_id, f"p_bootstrap_{row['metric']}_{second}_vs_{first}", float(row["p_value"]))
            for path in sorted(folder.iterdir()):
                client.log_artifact(parent_run_id, str(path))
    log.info("[compare %s]\n%s", sweep_id, text)
    return table

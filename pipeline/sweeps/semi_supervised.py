"""The summary of a semi-supervised sweep (``+experiment=semi_supervised``): every arm's test score
against the labelled fraction (mean and range over the seeds), and paired tests of each
semi-supervised arm against its supervised counterpart at each fraction, logged to the sweep's
parent run.

Metrics on the parent run: ``test_<score>_<arm>_<fraction>`` (the mean over the seeds; ``score``
is ``f1`` for chunk and entity tasks, else ``accuracy``), and per compared pair and fraction
``p_mcnemar_<arm>_vs_<baseline>_<fraction>`` and ``p_bootstrap_<metric>_<arm>_vs_<baseline>_<fraction>``.
The paired tests pool the seeds: each seed's test predictions count as further test sentences
(every seed's pair of arms was trained on the same labelled sentences), an exact McNemar test on
the tokens and a paired bootstrap over the sentences. Artifacts: ``semi_supervised.md`` / ``.csv``
(the table), ``tests.csv``, ``jobs.csv`` (one row per job and arm) and ``learning_curves.png``.
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
from pipeline.stages.semi_supervised import ARMS, PREDICTIONS_FILE, SUPERVISED

log = logging.getLogger(__name__)


def gather(sweep_id: str, experiment: str) -> pd.DataFrame:
    """One row per finished job of the sweep: fraction, seed, the semi_supervised stage run that
    holds its files, and its metrics."""
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.stage = 'pipeline'"
    )
    if runs.empty:
        return pd.DataFrame()
    stages = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.stage = 'semi_supervised'"
    )
    holder = {}
    for _, stage in stages.iterrows():
        source = stage.get(f"tags.{tracking.CACHE_SOURCE_TAG}")
        holder[stage.get("tags.mlflow.parentRunId")] = source if isinstance(source, str) and source else stage["run_id"]
    frame = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "status": runs["status"],
            "fraction": pd.to_numeric(runs.get("params.semi.fraction"), errors="coerce"),
            "seed": pd.to_numeric(runs.get("params.semi.seed"), errors="coerce"),
            "stage_run": [holder.get(r) for r in runs["run_id"]],
            "scheme": runs.get("params.dataset.scheme"),
        }
    )
    for column in runs.columns:
        if column.startswith("metrics.") and (
            column[8:].startswith(("test_", "dev_", "seconds_")) or column[8:] == "labelled_tokens"
        ):
            frame[column[8:]] = runs[column].to_numpy()
    return frame


def long_table(jobs: pd.DataFrame, score: str) -> pd.DataFrame:
    """One row per job and arm: fraction, seed, arm, labelled tokens, dev and test score."""
    rows = []
    for _, job in jobs.iterrows():
        for arm in ARMS:
            value = job.get(f"test_{score}_{arm}")
            if value is not None and pd.notna(value):
                rows.append(
                    {
                        "fraction": job["fraction"],
                        "seed": job["seed"],
                        "arm": arm,
                        "labelled_tokens": job.get("labelled_tokens"),
                        "dev": job.get(f"dev_{score}_{arm}"),
                        "test": value,
                        "seconds": job.get(f"seconds_{arm}"),
                    }
                )
    return pd.DataFrame(rows)


def curve_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per fraction and arm: seeds, labelled tokens (mean), test mean, min and max, and the mean
    difference from the supervised counterpart."""
    table = (
        rows.groupby(["fraction", "arm"], sort=True)
        .agg(seeds=("test", "size"), labelled_tokens=("labelled_tokens", "mean"), test_mean=("test", "mean"),
             test_min=("test", "min"), test_max=("test", "max"), dev_mean=("dev", "mean"), seconds=("seconds", "mean"))
        .reset_index()
    )  # fmt: skip
    means = table.set_index(["fraction", "arm"])["test_mean"]
    table["vs_supervised"] = [
        row.test_mean - means.get((row.fraction, SUPERVISED[row.arm]), np.nan) if row.arm in SUPERVISED else np.nan
        for row in table.itertuples()
    ]
    return table


def _predictions(run_id: str) -> pd.DataFrame:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as folder:
        path = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=f"semi_supervised/{PREDICTIONS_FILE}", dst_path=folder
        )
        return pd.read_csv(path, sep="\t", keep_default_na=False, na_values=[], dtype=str)


def _sentences(frame: pd.DataFrame, column: str) -> list[list[str]]:
    breaks = np.flatnonzero(np.diff(frame["sentence"].astype(int).to_numpy(), prepend=-1) != 0).tolist() + [len(frame)]
    values = frame[column].tolist()
    return [values[a:b] for a, b in zip(breaks[:-1], breaks[1:])]


def paired_tests(predictions: dict[float, list[pd.DataFrame]], chunked: bool, samples: int, seed: int) -> pd.DataFrame:
    """McNemar and paired bootstrap of every semi-supervised arm against its supervised counterpart,
    per fraction, the seeds pooled (see the module docstring)."""
    rows = []
    for fraction, frames in sorted(predictions.items()):
        for arm, base in SUPERVISED.items():
            usable = [f for f in frames if arm in f and base in f]
            if not usable:
                continue
            gold = [s for f in usable for s in _sentences(f, "gold")]
            first = [s for f in usable for s in _sentences(f, base)]
            second = [s for f in usable for s in _sentences(f, arm)]
            test = metrics.mcnemar(gold, first, second)
            row = {"fraction": fraction, "arm": arm, "baseline": base, "seeds": len(usable), "p_mcnemar": test["p_value"],
                   "only_baseline_right": test["only_first_correct"], "only_arm_right": test["only_second_correct"]}  # fmt: skip
            for _, b in metrics.paired_bootstrap(gold, first, second, chunked, samples=samples, seed=seed).iterrows():
                row[f"{b['metric']}_difference"] = b["second"] - b["first"]
                row[f"p_bootstrap_{b['metric']}"] = b["p_value"]
            rows.append(row)
    return pd.DataFrame(rows)


def plot_curves(table: pd.DataFrame, path: Path, score: str) -> None:
    """Test score against the labelled fraction, mean line and min-max band per arm."""
    fig, axes = figure(6.5, 4.5, 1)
    ax = axes[0]
    for arm in [a for a in ARMS if a in set(table["arm"])]:
        part = table[table["arm"] == arm].sort_values("fraction")
        line = ax.plot(part["fraction"], part["test_mean"], "o-", label=arm)[0]
        ax.fill_between(part["fraction"], part["test_min"], part["test_max"], color=line.get_color(), alpha=0.15)
    log_scale(ax, "x")
    ax.set_xlabel("labelled fraction of the training sentences (the rest unlabelled)")
    ax.set_ylabel(f"test {'chunk F1' if score == 'f1' else 'token accuracy'} (mean, range over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def summarize(sweep_id: str, parent_run_id: str | None, experiment: str, settings=None) -> pd.DataFrame:
    """Gather the sweep's jobs and log the comparison of the arms to the parent run."""
    jobs = gather(sweep_id, experiment)
    finished = jobs[(jobs.status == "FINISHED") & jobs.stage_run.notna()] if not jobs.empty else jobs
    if finished.empty:
        log.info("[semi-supervised %s] no finished jobs to summarise", sweep_id)
        return jobs
    chunked = str(finished["scheme"].iloc[0]).lower() != "none"
    score = "f1" if chunked else "accuracy"
    rows = long_table(finished, score)
    table = curve_table(rows)
    samples = int(getattr(settings, "bootstrap_samples", 1000) if settings is not None else 1000)
    seed = int(getattr(settings, "seed", 0) if settings is not None else 0)
    predictions: dict[float, list[pd.DataFrame]] = {}
    for _, job in finished.iterrows():
        predictions.setdefault(float(job["fraction"]), []).append(_predictions(job["stage_run"]))
    tests = paired_tests(predictions, chunked, samples, seed)
    lines = [
        f"# Semi-supervised learning: {len(finished)} of {len(jobs)} jobs finished",
        "",
        f"test {score} per labelled fraction and arm (mean, min and max over seeds;"
        " vs_supervised: mean minus the supervised arm's)",
        "",
        markdown_table(table),
    ]
    if not tests.empty:
        lines += ["", f"Paired tests against the supervised arm (seeds pooled; bootstrap: {samples} resamples, seed {seed})", "",
                  markdown_table(tests)]  # fmt: skip
    text = "\n".join(lines) + "\n"
    client = MlflowClient()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "semi_supervised.md").write_text(text)
        table.to_csv(folder / "semi_supervised.csv", index=False)
        tests.to_csv(folder / "tests.csv", index=False)
        rows.to_csv(folder / "jobs.csv", index=False)
        plot_curves(table, folder / "learning_curves.png", score)
        if parent_run_id:
            for row in table.itertuples():
                client.log_metric(parent_run_id, f"test_{score}_{row.arm}_{row.fraction:g}", float(row.test_mean))
            for row in tests.to_dict("records"):
                suffix = f"{row['arm']}_vs_{row['baseline']}_{row['fraction']:g}"
                client.log_metric(parent_run_id, f"p_mcnemar_{suffix}", float(row["p_mcnemar"]))
                for key, value in row.items():
                    if key.startswith("p_bootstrap_"):
                        client.log_metric(parent_run_id, f"{key}_{suffix}", float(value))
            client.log_metric(parent_run_id, "jobs_finished", float(len(finished)))
            client.log_metric(parent_run_id, "jobs_failed", float((jobs.status == "FAILED").sum()))
            for path in sorted(folder.iterdir()):
                client.log_artifact(parent_run_id, str(path))
    log.info("[semi-supervised %s]\n%s", sweep_id, text)
    return jobs

"""The summary of an active-learning sweep (``+experiment=active_learning``): every arm's learning
curve (mean and range over its seeds), its area under the curve and the tokens it needed to reach
99% of the full-data score, logged to the sweep's parent run.

The area is the mean test score over the labelled-token axis, from the starting set to the fewest
tokens any run of the sweep ended with (so every arm is measured over the same range); each run's
area is taken on its own curve and the arm's is their mean. ``tokens_to_99`` is the mean over the
arm's runs of the fewest labelled tokens at which the run's test score reached 99% of the ``full``
arm's (NaN for a run that never did; the arm's figure is then NaN too, with the count of runs that
did in ``reached_99``).
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

from pipeline import tracking
from pipeline.report import markdown_table
from pipeline.stages.active_learning import CURVE_FILE, area_under_curve, plot_curves, tokens_to_reach

log = logging.getLogger(__name__)

TARGET = 0.99  # of the full-data score


def gather(sweep_id: str, experiment: str) -> pd.DataFrame:
    """One row per job of the sweep: its pipeline run, status, arm, seed and active-learning stage run."""
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.stage = 'pipeline'"
    )
    if runs.empty:
        return pd.DataFrame()
    stages = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.sweep_id = '{sweep_id}' and tags.stage = 'active_learning'"
    )
    holder = {}
    for _, stage in stages.iterrows():
        source = stage.get(f"tags.{tracking.CACHE_SOURCE_TAG}")
        holder[stage.get("tags.mlflow.parentRunId")] = source if isinstance(source, str) and source else stage["run_id"]
    return pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "status": runs["status"],
            "arm": runs.get("params.active_learning.arm"),
            "seed": pd.to_numeric(runs.get("params.active_learning.seed"), errors="coerce"),
            "curve_run": [holder.get(r) for r in runs["run_id"]],
            "scheme": runs.get("params.dataset.scheme"),
        }
    )


def curve(run_id: str) -> pd.DataFrame:
    """The rounds of one active-learning stage run (its ``curve.csv`` artifact)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as folder:
        path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"active_learning/{CURVE_FILE}", dst_path=folder)
        return pd.read_csv(path)


def table_of(curves: dict[str, list[pd.DataFrame]], full_score: float | None) -> pd.DataFrame:
    """One row per arm (``full`` left out): runs, area under the curve (mean and range over runs),
    final tokens and score, tokens to reach 99% of ``full_score`` and how many runs reached it."""
    arms = {arm: frames for arm, frames in curves.items() if arm != "full"}
    if not arms:
        return pd.DataFrame()
    end = min(float(f["labelled_tokens"].max()) for frames in arms.values() for f in frames)
    rows = []
    for arm, frames in sorted(arms.items()):
        areas = [area_under_curve(f["labelled_tokens"], f["test_score"], end) for f in frames]
        reached = []
        if full_score:
            reached = [tokens_to_reach(f["labelled_tokens"], f["test_score"], TARGET * full_score) for f in frames]
        rows.append(
            {
                "arm": arm,
                "runs": len(frames),
                "aulc": float(np.mean(areas)),
                "aulc_min": float(np.min(areas)),
                "aulc_max": float(np.max(areas)),
                "final_tokens": float(np.mean([f["labelled_tokens"].iloc[-1] for f in frames])),
                "final_test_score": float(np.mean([f["test_score"].iloc[-1] for f in frames])),
                "tokens_to_99": float(np.mean(reached)) if reached else float("nan"),
                "reached_99": int(np.sum(np.isfinite(reached))) if reached else 0,
            }
        )
    return pd.DataFrame(rows)


def summarize(sweep_id: str, parent_run_id: str | None, experiment: str, settings=None) -> pd.DataFrame:
    """Gather the sweep's curves and log the comparison of the arms to the parent run."""
    jobs = gather(sweep_id, experiment)
    if jobs.empty:
        log.info("[active learning %s] no jobs to summarise", sweep_id)
        return jobs
    finished = jobs[(jobs.status == "FINISHED") & jobs.curve_run.notna()]
    curves: dict[str, list[pd.DataFrame]] = {}
    for _, job in finished.iterrows():
        curves.setdefault(str(job["arm"]), []).append(curve(job["curve_run"]))
    full = curves.get("full")
    full_score = float(np.mean([f["test_score"].iloc[-1] for f in full])) if full else None
    table = table_of(curves, full_score)
    chunked = str(finished["scheme"].iloc[0] if len(finished) else "none").lower() != "none"
    lines = [f"# Active learning: {len(finished)} of {len(jobs)} jobs finished"]
    if full_score is not None:
        lines.append(f"\nfull-data test score: {full_score:.2f} (99%: {TARGET * full_score:.2f})")
    if not table.empty:
        lines += ["", markdown_table(table)]
    text = "\n".join(lines) + "\n"
    client = MlflowClient()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "active_learning.md").write_text(text)
        table.to_csv(folder / "active_learning.csv", index=False)
        rows = [f.assign(arm=arm, run=k) for arm, frames in curves.items() for k, f in enumerate(frames)]
        if rows:
            pd.concat(rows, ignore_index=True).to_csv(folder / "learning_curves.csv", index=False)
            plot_curves(curves, folder / "learning_curves.png", "test_score", chunked)
        if parent_run_id:
            if full_score is not None:
                client.log_metric(parent_run_id, "full_test_score", full_score)
            for _, row in table.iterrows():
                client.log_metric(parent_run_id, f"aulc_{row['arm']}", row["aulc"])
                if np.isfinite(row["tokens_to_99"]):
                    client.log_metric(parent_run_id, f"tokens_to_99_{row['arm']}", row["tokens_to_99"])
            client.log_metric(parent_run_id, "jobs_finished", float(len(finished)))
            client.log_metric(parent_run_id, "jobs_failed", float((jobs.status == "FAILED").sum()))
            for path in sorted(folder.iterdir()):
                client.log_artifact(parent_run_id, str(path))
    log.info("[active learning %s]\n%s", sweep_id, text)
    return jobs

"""A sweep's summary: its jobs' pipeline runs gathered into a table, a plot, the best job and its
registered model, logged to the sweep's parent run.

The grid's summary (the default ``sweep.summary``) of a Hydra multirun, an Optuna sweep and a
regularisation path alike; ``pipeline.sweeps.callback.SweepTracking`` calls it when the jobs are done
(``pipeline.sweeps.compare`` and ``pipeline.sweeps.learning_curves`` are the other summaries).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from pipeline import tracking
from pipeline.engine.runner import summary_key
from pipeline.engine.stage import TRIAL_STATE_TAG
from pipeline.report import figure, log_scale, markdown_table, save_figure
from pipeline.sweeps.trial_environment import TRIAL_TAG
from pipeline.tracking import champion

log = logging.getLogger(__name__)


def strength(frame: pd.DataFrame) -> pd.Series:
    """The regularisation strength of each run: c1 when it has an L1 term (l1; elasticnet, whose
    c2 is c1 times ``l2_ratio``), else c2 (lbfgs, sgd)."""
    c1 = pd.to_numeric(frame.get("params.trainer.c1"), errors="coerce").fillna(0.0)
    c2 = pd.to_numeric(frame.get("params.trainer.c2"), errors="coerce").fillna(0.0)
    return c1.where(c1 > 0, c2)


def _shown(value, spec: str = ".2f") -> str:
    """``value`` formatted by ``spec``, or ``none`` when it is missing (None or NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "none"
    return "none" if np.isnan(number) else format(number, spec)


def _numbers(runs: pd.DataFrame, column: str) -> pd.Series:
    """``runs[column]`` as numbers (NaN where absent, and everywhere when no run has it)."""
    return pd.to_numeric(runs[column], errors="coerce") if column in runs else pd.Series(np.nan, index=runs.index)


def _evaluation_keys(runs: pd.DataFrame) -> pd.Series:
    """Per run, the key of the data its dev and test scores were measured on (the tag the pipeline
    run records from its prepare stage's file digests and dataset settings; empty when absent)."""
    column = f"tags.{champion.EVALUATION_RUN_TAG}"
    keys = runs[column] if column in runs else pd.Series(None, index=runs.index, dtype=object)
    return keys.where(keys.map(lambda v: isinstance(v, str)), "").astype(object)


def gather(sweep_id: str, experiment: str, tag: str = "sweep_id", metric: str | None = None) -> pd.DataFrame:
    """One row per pipeline run whose ``tag`` is ``sweep_id`` (the jobs of a sweep; the points of a
    regularisation path with ``tag="path_id"``), with its settings, scores and status; ``state``
    is the status but PRUNED for a pruned Optuna trial (its run is KILLED). With ``metric`` (a
    sweeper's objective, ``<stage>.<name>``) a column ``objective`` holds each run's value of it."""
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string=f"tags.`{tag}` = '{sweep_id}' and tags.stage = 'pipeline'"
    )
    if runs.empty:
        return pd.DataFrame()
    # F1 when the jobs show it: on dev, or only on test (data.final_fit=train+dev jobs have no dev score)
    f1 = "metrics.dev_f1" in runs or ("metrics.dev_accuracy" not in runs and "metrics.test_f1" in runs)
    score = "metrics.dev_f1" if f1 else "metrics.dev_accuracy"
    test = "metrics.test_f1" if "metrics.test_f1" in runs else "metrics.test_accuracy"
    table = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "status": runs["status"],
            "state": runs.get(f"tags.{TRIAL_STATE_TAG}", pd.Series(index=runs.index, dtype=object)).fillna(runs["status"]),
            "run_name": runs.get("tags.mlflow.runName"),  # the dataset, model, trainer and the job's swept settings
            "model": runs.get("tags.model"),
            "trainer": runs.get("tags.trainer"),
            "c1": pd.to_numeric(runs.get("params.trainer.c1"), errors="coerce"),
            "c2": pd.to_numeric(runs.get("params.trainer.c2"), errors="coerce"),
            "strength": strength(runs),
            "dev_score": runs.get(score),
            "test_score": runs.get(test),
            "nonzero_weights": runs.get("metrics.nonzero_weights"),
            "iterations": _numbers(runs, "metrics.iterations").fillna(_numbers(runs, "metrics.pruned_at_iteration")),
            "train_seconds": runs.get("metrics.train_seconds"),
            "model_uri": runs.get(f"tags.{tracking.MODEL_URI_TAG}"),
            "registry_name": runs.get("params.registry.name"),
            "dataset": runs.get("params.dataset.name"),
            "train_fraction": runs.get("params.data.train_fraction"),
            "final_fit": runs.get("params.data.final_fit"),
            "evaluation": _evaluation_keys(runs),
            "trial": _numbers(runs, f"tags.{TRIAL_TAG}"),
            "started": runs["start_time"],
        }
    )
    if table["model"].notna().any():  # the strengths are a CRF's: another model's jobs (an HMM's) read no trainer
        table.loc[table["model"].notna() & (table["model"] != "crf"), ["c1", "c2", "strength"]] = np.nan
    if metric:
        key = summary_key(metric)
        table.insert(table.columns.get_loc("dev_score"), "objective", _numbers(runs, f"metrics.{key}") if key else np.nan)
    table.attrs["score"] = score.split(".", 1)[1].removeprefix("dev_")  # "f1" or "accuracy"
    return table.sort_values(["trainer", "strength"], ignore_index=True)


def _varied_settings(jobs: pd.DataFrame, experiment: str) -> str:
    """The dataset settings that differ between ``jobs`` (by the run parameters they logged)."""
    ids = ", ".join(f"'{run_id}'" for run_id in jobs.run_id)
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string=f"attributes.run_id IN ({ids})")
    columns = [c for c in runs.columns if c.startswith("params.dataset.") and runs[c].nunique(dropna=False) > 1]
    return ", ".join(f"{c.removeprefix('params.')}={'/'.join(sorted(map(str, runs[c].unique())))}" for c in columns)


def best_job(finished: pd.DataFrame, rank: str, direction: str = "maximize") -> pd.Series:
    """The row of ``finished`` (jobs with a value in column ``rank``) with the best value in the
    ``direction`` (``maximize`` or ``minimize``); among tied jobs the lowest Optuna trial number, as
    the sweeper names its best trial, else (a grid) the one started first."""
    values = pd.to_numeric(finished[rank], errors="coerce")
    best = values.min() if direction == "minimize" else values.max()
    order = [column for column in ("trial", "started") if column in finished]
    return finished[values == best].sort_values(order, kind="stable", na_position="last").iloc[0]


def plot(table: pd.DataFrame, path: Path, score_name: str) -> None:
    fig, (left, right) = figure(11, 4, 2)
    finished = table[table.status == "FINISHED"]
    strengths = pd.to_numeric(finished["strength"], errors="coerce")
    by_strength = bool((strengths > 0).any()) and strengths.nunique() > 1  # else (an HMM sweep): the jobs in order
    for trainer, part in finished.groupby("trainer"):
        x = part["strength"] if by_strength else np.arange(len(part))
        left.plot(x, part["dev_score"], "o-", label=trainer)
        right.plot(x, part["nonzero_weights"], "o-", label=trainer)
    for ax, label in ((left, f"dev {score_name}"), (right, "non-zero weights")):
        if by_strength:
            log_scale(ax, "x")
        ax.set_xlabel("regularisation strength (c1 or c2)" if by_strength else "job")
        ax.set_ylabel(label)
        ax.legend()
    if (pd.to_numeric(finished["nonzero_weights"], errors="coerce") > 0).any():
        log_scale(right, "y")
    save_figure(fig, path)


def _final_fit(job: pd.Series) -> str:
    """The job's ``data.final_fit`` (``train`` when its run does not show one)."""
    value = job.get("final_fit")
    return value if isinstance(value, str) and value else "train"


def register_best(
    best: pd.Series,
    score_name: str,
    sweep_id: str,
    alias: str | None,
    metric: str | None = None,
    direction: str = "maximize",
    force_alias: bool = False,
    which: str = "the best job",
    force_declined: str = "",
) -> str | None:
    """Register a job's (by default the best job's) MLflow Model as a new version of its
    ``registry.name``, with its dev and test scores (and the sweep's objective ``metric``),
    dataset, data fraction, ``data.final_fit`` and evaluation key as version tags; ``alias`` moves
    to it when it is at least as good as the alias's holder by the same metric on the same
    evaluation data (:mod:`pipeline.tracking.champion`: a job without that metric, such as a
    ``data.final_fit=train+dev`` job without a dev score, never takes it by itself), or with
    ``force_alias`` (``force_declined``: why a set ``registry.force_alias`` does not apply to this
    job, tagged on its version). ``which`` names the job in the log. Returns ``models:/<name>@<alias>`` when
    the alias moved, else the version's URI."""
    if not isinstance(best.get("model_uri"), str) or not isinstance(best.get("registry_name"), str):
        log.warning("[sweep %s] %s %s logged no model (or registry name): nothing registered", sweep_id, which, best["run_id"])
        return None
    tags = {
        f"dev_{score_name}": _shown(best["dev_score"], ".4f"),
        f"test_{score_name}": _shown(best["test_score"], ".4f"),
        "run_id": best["run_id"],
        "sweep_id": sweep_id,
        champion.FINAL_FIT_TAG: _final_fit(best),
    }
    if metric:
        tags[metric] = _shown(best["objective"], ".6g")
    for name in ("dataset", "train_fraction"):
        if isinstance(best.get(name), str):
            tags["data.train_fraction" if name == "train_fraction" else name] = best[name]
    if best.get("evaluation"):
        tags[champion.EVALUATION_RUN_TAG] = str(best["evaluation"])
    value = best["objective"] if metric else best["dev_score"]
    # the name a single run's summary gives the same figure (evaluate.dev_f1 -> dev_f1), so that equal metrics compare
    judged_by = (summary_key(metric) or metric) if metric else f"dev_{score_name}"
    standing = None
    if _shown(value) != "none":
        standing = champion.Standing(judged_by, float(value), direction, str(best["evaluation"]))
    elif _final_fit(best) == "train+dev":
        tags[champion.UNSCORED_TAG] = "data.final_fit=train+dev: no dev score"
    else:
        tags[champion.UNSCORED_TAG] = f"the job has no {judged_by}"
    version, moved = tracking.register_model(
        best["model_uri"], best["registry_name"], alias, tags, standing, force_alias, force_declined
    )
    where = f"models:/{best['registry_name']}@{alias}" if moved else f"models:/{best['registry_name']}/{version.version}"
    log.info("[sweep %s] registered %s as %s version %s: %s", sweep_id, which, best["registry_name"], version.version, where)
    return where


def _still_registering(stopping: Callable[[], bool] | None, sweep_id: str) -> bool:
    """Whether the sweep may still register: not once it is being stopped."""
    if stopping is not None and stopping():
        log.warning("[sweep %s] stopped by SIGTERM during its summary: nothing is registered", sweep_id)
        return False
    return True


def summarize(
    sweep_id: str,
    parent_run_id: str | None,
    experiment: str,
    registry: DictConfig | None = None,
    tag: str = "sweep_id",
    metric: str | None = None,
    direction: str = "maximize",
    stopping: Callable[[], bool] | None = None,
) -> pd.DataFrame:
    """Build the sweep table and plot, log them to the parent run and the best setting to the console;
    with ``registry.sweep``, register the best job's model (see :func:`register_best`), unless
    ``stopping()`` says, just before, that the sweep is being stopped (a SIGTERM during the summary). The best is
    chosen among finished jobs only (not failed, nor pruned trials): the largest dev score, or the
    sweeper's objective ``metric`` in its ``direction`` (``maximize`` or ``minimize``).
    ``tag``: see :func:`gather`.

    Finished ``data.final_fit=train+dev`` jobs without the ranking metric (they have no dev score)
    cannot be ranked: with ``registry.sweep`` each is registered as a version of its own, which
    does not take the alias (:mod:`pipeline.tracking.champion`); ``registry.force_alias`` forces
    the alias onto the best job, or onto the only such job of a sweep without a best job (never
    onto one of several). When no finished job can be ranked or registered, the log says so."""
    table = gather(sweep_id, experiment, tag, metric)
    if table.empty:
        log.info("[sweep %s] no finished jobs to summarise", sweep_id)
        return table
    score_name = table.attrs.get("score", "dev_score")
    rank = "objective" if metric else "dev_score"
    done = table[table.status == "FINISHED"]
    finished = done.dropna(subset=[rank])
    final_fits = done[done[rank].isna() & (done.final_fit == "train+dev")]  # no dev score: nothing to rank them by
    register = registry is not None and bool(registry.sweep)
    scored = finished  # plotted whatever is chosen
    evaluations = done.evaluation[done.evaluation != ""].unique()
    if len(evaluations) > 1:  # dev scores of other dev sets (or datasets) do not compare: no job is "best"
        varied = _varied_settings(done, experiment)
        log.warning(
            "[sweep %s] its finished jobs were scored on %d different evaluation data (the dataset, its files, columns, label "
            "or dev split differ%s): they are not ranked against each other, so no best job is named%s",
            sweep_id, len(evaluations), f": {varied}" if varied else "", " and none is registered" if register else "",
        )  # fmt: skip
        finished, final_fits = finished.iloc[:0], final_fits.iloc[:0]
    if finished.empty and not done.empty and len(evaluations) <= 1:
        wanted = f"the sweep's metric {metric}" if metric else f"a dev score (dev_{score_name})"
        log.warning(
            "[sweep %s] no finished job has %s: no best job%s",
            sweep_id,
            wanted,
            f"; {len(final_fits)} data.final_fit=train+dev job(s) registered without a score"
            if register and not final_fits.empty
            else (": nothing registered" if register else ""),
        )
    client = MlflowClient()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        table.to_csv(folder / "sweep_summary.csv", index=False)
        hidden = ["run_id", "run_name", "model", "model_uri", "registry_name", "evaluation", "trial", "started"]
        if not (table.final_fit == "train+dev").any():
            hidden.append("final_fit")
        text = markdown_table(table.drop(columns=hidden))
        if not finished.empty:
            best = best_job(finished, rank, direction)
            by = f"by {metric} ({direction}, {best['objective']:.4g})" if metric else "on dev"
            job = best.get("run_name") if isinstance(best.get("run_name"), str) else f"trainer={best['trainer']}"
            strengths = f" (c1={best['c1']:g} c2={best['c2']:g})" if best.get("model") == "crf" else ""  # what the CRF used
            text += (
                f"\n\nbest {by}: {job}{strengths}, "
                f"dev {score_name} {_shown(best['dev_score'])}, test {_shown(best['test_score'])}"
            )
            if parent_run_id:
                for name in ("dev_score", "test_score"):  # absent when the stages run stop before evaluate
                    if _shown(best[name]) != "none":
                        client.log_metric(parent_run_id, f"best_{name}", float(best[name]))
                client.set_tag(parent_run_id, "best_run_id", best["run_id"])
                if metric:
                    client.log_metric(parent_run_id, "best_objective", float(best["objective"]))
            if register and _still_registering(stopping, sweep_id):
                force = bool(registry.get("force_alias", False))
                registered = register_best(best, score_name, sweep_id, registry.alias, metric, direction, force)
                if registered and parent_run_id:
                    client.set_tag(parent_run_id, "registered_model", registered)
                    text += f"\nregistered: {registered}"
        if not scored.empty:
            plot(table, folder / "sweep.png", score_name)
        if register and not final_fits.empty and _still_registering(stopping, sweep_id):
            # registry.force_alias moves the alias to the one model the sweep chose: its best job, or,
            # when it has none, its only train+dev job; among several unranked ones it picks none
            force = bool(registry.get("force_alias", False)) and finished.empty and len(final_fits) == 1
            declined = ""
            if bool(registry.get("force_alias", False)) and not force:
                declined = "it moves the alias to the sweep's best job, or to its only train+dev job; this sweep has " + (
                    "a best job" if not finished.empty else f"{len(final_fits)} train+dev jobs without a dev score"
                )
                log.warning("[sweep %s] registry.force_alias=true: %s; none of them is forced", sweep_id, declined)
            which = "a data.final_fit=train+dev job (no dev score)"
            registered = [
                register_best(job, score_name, sweep_id, registry.alias, metric, direction, force, which, declined)
                for _, job in final_fits.iterrows()
            ]
            registered = [r for r in registered if r]
            if registered:
                text += "\nregistered without a dev score (data.final_fit=train+dev): " + ", ".join(registered)
                if parent_run_id:
                    client.set_tag(parent_run_id, "registered_final_fits", ", ".join(registered))
        (folder / "sweep_summary.md").write_text(text + "\n")
        if parent_run_id:
            client.log_metric(parent_run_id, "jobs_finished", float((table.status == "FINISHED").sum()))
            client.log_metric(parent_run_id, "jobs_failed", float((table.status == "FAILED").sum()))
            client.log_metric(parent_run_id, "jobs_pruned", float((table.state == "PRUNED").sum()))
            for name in ("sweep_summary.csv", "sweep_summary.md", "sweep.png"):
                if (folder / name).exists():
                    client.log_artifact(parent_run_id, str(folder / name))
    log.info("[sweep %s]\n%s", sweep_id, text)
    return table

"""A regularisation path in one job (glmnet's idea): ``python -m pipeline +experiment=reg_path``.

The job fits the strengths of ``path.strengths`` from the strongest down, each fit starting from
the previous point's weights (``crf.CRF(warm_start=True)``): a weaker penalty moves the optimum a
little, so each fit starts close to it and needs fewer iterations than from zero. The strength is
``trainer.strength``, so the trainer chooses what moves: c2 (``trainer=lbfgs``), c1 (``l1``) or
both along ``l2_ratio`` (``elasticnet``). A point whose fit stopped at ``trainer.max_iterations``
is no starting point (the next fit would carry its training on): the next point starts from zero.

Each point is an ordinary pipeline run, made to look like a grid job: an MLflow run tagged
``stage=pipeline`` with its prepare/featurize/train/evaluate stage runs, the same evaluation and
artifacts, its MLflow Model, tagged with the path's id (``path_id``) and, inside a multirun, the
sweep's id. They are nested under the path's own run (``stage=path``; under the sweep's parent run
in a multirun), which gets the grid's summary of the points (table, plot, best on dev, and outside
a multirun the registered champion; a multirun registers its best point itself).

Cache: every point keeps its own cache entries. The train stage's key includes the hash of the
previous point's train output (the input ``warm_start``), because a warm-started fit stops at a
slightly different place than a cold one; so a repeated path is all cache hits, changing one
strength recomputes from that point on, and the first (cold) point shares its entry with a grid
job of the same setting. Pruning does not apply to a path.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
import uuid
from typing import Any

from mlflow.entities import Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline import tracking
from pipeline.engine.cache import StageCache
from pipeline.engine.runner import (
    PipelineJob,
    checked_plan,
    objective_value,
    pipeline_run,
    run_tags,
    setting_reader,
    stage_reads,
    swept_overrides,
)
from pipeline.engine.validate import SettingsError, finite_number, section, strength_moves
from pipeline.models import ModelAdapter
from pipeline.tracking import SWEEP_ID_VARIABLE, SWEEP_PARENT_VARIABLE
from pipeline.tracking.lifecycle import END_REASON_TAG
from pipeline.tracking.run_store import MlflowRunStore

log = logging.getLogger(__name__)

PATH_TAG = "path_id"
POINT_TAG = "path_point"  # the point's place on the path, 0 = the strongest


def point_config(cfg: DictConfig, strength: float) -> DictConfig:
    """``cfg`` with ``trainer.strength`` set to ``strength`` (a copy)."""
    point = copy.deepcopy(cfg)
    OmegaConf.update(point, "trainer.strength", float(strength), merge=False)
    return point


def path_strengths(cfg: DictConfig) -> list[float]:
    """``path.strengths``, strongest first; SettingsError (one line) unless they are distinct
    positive numbers and ``trainer.strength`` sets c1 or c2 of the chosen trainer."""
    values = section(cfg, "path.strengths")
    if isinstance(values, ListConfig):
        values = OmegaConf.to_container(values, resolve=True)
    if not isinstance(values, list) or not values:
        raise SettingsError(f"bad setting path.strengths={values!r}: a list of regularisation strengths, e.g. [10, 1, 0.1]")
    for value in values:
        if not finite_number(value) or value <= 0:
            raise SettingsError(f"bad setting path.strengths={values!r}: {value!r} is not a positive number")
    if len(set(values)) != len(values):
        raise SettingsError(f"bad setting path.strengths={values!r}: a strength is repeated")
    if OmegaConf.select(cfg, "trainer.strength") is None:
        raise SettingsError("bad setting path.strengths: the trainer has no strength to move (trainer.strength)")
    if len(values) > 1 and not strength_moves(cfg, min(values), max(values)):  # c1/c2 fixed: the same at every strength
        raise SettingsError(
            f"bad setting path.strengths: trainer.strength does not set c1 or c2 of trainer={cfg.trainer.name} "
            f"(c1={OmegaConf.select(cfg, 'trainer.c1')}, c2={OmegaConf.select(cfg, 'trainer.c2')} are set directly); "
            "leave them to the strength"
        )
    return sorted((float(v) for v in values), reverse=True)


def path_job(cfg: DictConfig) -> bool:
    """Whether ``cfg`` asks for a regularisation path (``path.strengths`` set) rather than one run."""
    return OmegaConf.select(cfg, "path.strengths") is not None


def check_path(cfg: DictConfig, adapter: ModelAdapter, order: list[str]) -> list[float]:
    """What a path needs beyond an ordinary run's settings (the ``check`` of
    :func:`pipeline.engine.runner.checked_plan`); its strengths, strongest first. SettingsError
    (one line) otherwise."""
    strengths = path_strengths(cfg)
    if not adapter.warm_starts:
        raise SettingsError(f"bad setting model={cfg.model.name}: a regularisation path needs a model that warm-starts (crf)")
    if not adapter.can_warm_start(cfg):
        raise SettingsError(
            f"bad setting trainer.algorithm={cfg.trainer.algorithm}: a regularisation path needs a trainer that warm-starts"
            " (lbfgs or l2sgd)"
        )
    if "train" not in order:
        raise SettingsError(f"bad setting stages={list(cfg.stages)}: a regularisation path trains (add train or evaluate)")
    for strength in strengths:  # each point's trainer as the run's own settings check takes it (c2 at most 1e12, ...)
        try:
            adapter.validate(point_config(cfg, strength))
        except SettingsError as error:
            raise SettingsError(f"bad setting path.strengths: at strength {strength:g}, {error}") from None
    return strengths


def run_path(cfg: DictConfig, trial_tags: dict[str, str] | None = None, store: MlflowRunStore | None = None) -> dict[str, Any]:
    """Fit the path (see the module docstring).

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config, with ``path.strengths``.
    trial_tags : dict, optional
        A sweep trial's tags, on every run of the path (pruning does not apply to a path).
    store : MlflowRunStore, optional
        The store of the path's runs (None: a new one).

    Returns
    -------
    dict
        The best point's results on dev (every stage's metrics, namespaced as
        :func:`pipeline.engine.runner.run_pipeline`'s) with ``path.best_strength``.
    """
    strengths: list[float] = []
    store = store if store is not None else MlflowRunStore()
    check = lambda adapter, order: strengths.extend(check_path(cfg, adapter, order))  # noqa: E731
    adapter, stages, order = checked_plan(cfg, store, check, trial_tags)
    store.open(cfg)
    job = PipelineJob(adapter, stages, order, StageCache(cfg.paths.cache_dir, remote=store.remote_cache()), store)
    client = MlflowClient(store.uri)
    experiment = str(cfg.tracking.experiment)
    path_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    in_sweep = bool(os.environ.get(SWEEP_ID_VARIABLE))
    tags = {**run_tags(cfg, adapter, store, trial_tags), PATH_TAG: path_id}
    reads = setting_reader(stage_reads(cfg, adapter, stages, order))
    prefix = [str(cfg.dataset.name), tags["model"], tags["trainer"], *swept_overrides(reads)]
    parent = os.environ.get(SWEEP_PARENT_VARIABLE)
    run = client.create_run(
        client.get_experiment_by_name(experiment).experiment_id,
        run_name="-".join([*prefix, "path"]),
        tags={**tags, "stage": "path", **({"mlflow.parentRunId": parent} if parent else {})},
    )
    params = [Param(k, v) for k, v in tracking.shown_params(tracking.flatten(OmegaConf.to_container(cfg, resolve=True))).items()]
    for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run.info.run_id, params=params[start : start + 100])
    log.info("[path %s] %d strengths of trainer=%s, strongest first: %s", path_id, len(strengths), cfg.trainer.name, strengths)
    points: list[tuple[float, dict[str, Any]]] = []
    previous = None
    try:
        for number, strength in enumerate(strengths):
            point = point_config(cfg, strength)
            point_tags = {**run_tags(point, adapter, store, trial_tags), PATH_TAG: path_id, POINT_TAG: str(number)}
            name = "-".join([*prefix, f"strength={strength:g}"])
            results, outputs = pipeline_run(
                point, job, name, point_tags, parent=run.info.run_id, warm_starts={"train": previous}, register=False
            )
            points.append((strength, results))
            log.info(
                "[path %s] point %d of %d: strength %g, %d iterations%s%s",
                path_id,
                number + 1,
                len(strengths),
                strength,
                int(results.get("train.iterations", 0)),
                " (warm start)" if previous is not None else "",
                " (cache)" if outputs["train"].cached else "",
            )
            previous = outputs["train"]
            problem = adapter.warm_start_problem(point, previous.folder) if number + 1 < len(strengths) else None
            if problem is not None:
                log.warning("[path %s] point %d %s: the next point starts from zero", path_id, number + 1, problem)
                previous = None
    except Exception as error:
        _close(client, run.info.run_id, path_id, experiment, cfg, in_sweep, "FAILED", error)
        raise
    _close(client, run.info.run_id, path_id, experiment, cfg, in_sweep, "FINISHED")
    scored = [(objective_value(results), strength, results) for strength, results in points]
    best = max(scored, key=lambda item: -math.inf if item[0] is None else item[0])
    return {**best[2], "path.best_strength": best[1]}


def _close(
    client: MlflowClient,
    run_id: str,
    path_id: str,
    experiment: str,
    cfg: DictConfig,
    in_sweep: bool,
    status: str,
    error: Exception | None = None,
) -> None:
    """Summarise the points (the grid's summary, by ``path_id``), then end the path's run with
    ``status``: FAILED with the reason when a point or the summary failed. Inside a multirun the
    sweep registers its best job, so a path registers only when run on its own."""
    from pipeline.sweeps.summary import summarize

    if error is not None:
        client.set_tag(run_id, END_REASON_TAG, f"{type(error).__name__}: {error}"[:5000])
    try:
        if bool(OmegaConf.select(cfg, "sweep.summarize", default=True)):
            registry = None if in_sweep else OmegaConf.select(cfg, "registry")
            summarize(path_id, run_id, experiment, registry, tag=PATH_TAG)
    except Exception as failure:
        log.error("[path %s] the path's summary failed: %s", path_id, failure)
        client.set_tag(run_id, END_REASON_TAG, f"summary failed: {type(failure).__name__}: {failure}"[:5000])
        status = "FAILED"
        if error is None:
            client.set_terminated(run_id, status)
            raise
    client.set_terminated(run_id, status)

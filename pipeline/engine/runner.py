"""Chain the stages under one parent run, reusing cached stage outputs.

``run_pipeline(cfg, store)`` is what ``python -m pipeline`` calls (``pipeline.__main__.run_pipeline``
with the MLflow store); tests call it with a config composed by ``hydra.compose``. The runner knows
stages only through their contract (``pipeline.engine.stage``), models only through their adapter
(``pipeline.models``), chosen once from ``cfg.model.adapter``, and the store it records runs in
only through :class:`~pipeline.engine.store.RunStore` (which also gives the stage cache's remote).
A sweep trial's job (an Optuna trial) adds to a run only through :class:`TrialHooks`. The caller
plugs these in (``pipeline.__main__``: ``pipeline.tracking.run_store`` and
``pipeline.sweeps.trial_stopping``); the engine imports no store and no sweeper.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from pipeline.engine.cache import StageCache, code_digest
from pipeline.engine.logs import name_overrides, named_overrides, swept_keys
from pipeline.engine.stage import (
    METRICS_FILE,
    SWEEP_ID_VARIABLE,
    TRIAL_STATE_TAG,
    WARM_START_INPUT,
    DevReporter,
    ModelAdapter,
    Stage,
    StageContext,
    TrainingStopped,
    frozen,
    load_adapter,
    load_stages,
)
from pipeline.engine.store import CACHE_SOURCE_TAG, MODEL_URI_TAG, SWEEP_PARENT_VARIABLE, RunStore, Standing, flatten
from pipeline.engine.validate import SettingsError, validate_settings
from pipeline.report import redacted_values, write_json

log = logging.getLogger(__name__)

HEADLINE = ("dev_f1", "test_f1", "dev_accuracy", "test_accuracy")  # scores repeated at the end of a run
CACHED_SUFFIX = "cached"  # the end of the name of a run whose every stage came from the cache


@dataclass
class StageOutput:
    folder: Path
    hash: str
    cached: bool
    metrics: dict
    model_uri: str | None = None  # the logged model of the stage's declared bundle (an MLflow Model's URI)
    external: dict | None = None  # hashes of the files it read from outside the pipeline (the dataset)
    input_files: dict | None = None  # those files, by the same keys, where the stage can name them
    bundle: Path | None = None  # its tagger bundle logged as a model
    seconds: float = 0.0  # wall time of the stage run, cache lookup and logging to the store included
    key: str | None = None  # its entry in the stage cache


def run_tags(cfg: DictConfig, adapter: ModelAdapter, store: RunStore, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags of a job's runs.

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config.
    adapter : ModelAdapter
        Its model adapter (names the trainer).
    store : RunStore
        The store the runs go to (its :meth:`~pipeline.engine.store.RunStore.source_tags`).
    extra : mapping, optional
        More tags (a sweep trial's: :meth:`TrialHooks.tags`).

    Returns
    -------
    dict of str to str
        Dataset, model, trainer, features, the source version, the sweep id (in a multirun) and ``extra``.
    """
    tags = {
        "dataset": str(cfg.dataset.name),
        "model": str(cfg.model.name),
        "trainer": adapter.trainer_tag(cfg),
        "features": str(cfg.features.name),
        **store.source_tags(),
    }
    sweep = os.environ.get(SWEEP_ID_VARIABLE)
    if sweep:
        tags["sweep_id"] = sweep
    tags.update(extra or {})
    return tags


def plan(stages: dict[str, Stage], wanted: list[str], adapter: ModelAdapter) -> list[str]:
    """The stages to run.

    Parameters
    ----------
    stages : dict of str to Stage
        Every stage, in running order (:func:`~pipeline.engine.stage.load_stages`).
    wanted : list of str
        The stages asked for (``cfg.stages``).
    adapter : ModelAdapter
        The model adapter (a stage's upstream stages may depend on it).

    Returns
    -------
    list of str
        The wanted stages and, transitively, the stages they read, in running order.

    Raises
    ------
    ValueError
        A wanted stage that does not exist.
    """
    for name in wanted:
        if name not in stages:
            raise ValueError(f"unknown stage {name!r}; stages: {list(stages)}")
    needed, pending = set(), list(wanted)
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending.extend(stages[name].upstream(adapter))
    return [name for name in stages if name in needed]


def stage_key(stage: Stage, cfg: DictConfig, adapter: ModelAdapter, input_hashes: dict[str, str], cache: StageCache) -> tuple:
    """The cache key of ``stage`` under ``cfg`` and what it is made of.

    Parameters
    ----------
    stage : Stage
        The stage.
    cfg : DictConfig
        The job's composed config.
    adapter : ModelAdapter
        The model adapter.
    input_hashes : dict of str to str
        {upstream stage name: its output hash}.
    cache : StageCache
        The cache that computes the key.

    Returns
    -------
    tuple
        (config slice, settings, cache key, hashes of external input files).
    """
    config = frozen(stage.config_slice(cfg, adapter))
    settings = frozen(stage.settings(cfg, adapter))
    external = stage.external_inputs(config, settings)
    key = cache.key(
        stage.name, OmegaConf.to_container(config), {**input_hashes, **external}, code_digest(stage.code_modules(adapter))
    )
    return config, settings, key, external


def _relog_steps(path: Path, store: RunStore) -> None:
    """A cached entry's per-iteration CSV (column ``iteration``) as step metrics of the open run again."""
    history = pd.read_csv(path)
    columns = [c for c in history.columns if c != "iteration"]
    store.log_steps(
        [
            (int(row["iteration"]), {c: float(row[c]) for c in columns if pd.notna(row[c])})
            for row in history.to_dict(orient="records")
        ]
    )


def end_stopped(stopped: TrainingStopped, store: RunStore) -> None:
    """End the open run as a pruned trial's: KILLED (stopped on purpose; its scores are not
    those of its settings, so it is neither FINISHED nor FAILED), tagged ``crf.trial_state=PRUNED``
    with the reason, the iteration and the last dev score.

    Parameters
    ----------
    stopped : TrainingStopped
        Why and where the training stopped.
    store : RunStore
        The store whose innermost open run ends.
    """
    store.set_tags({TRIAL_STATE_TAG: "PRUNED"})
    store.log_metrics({"pruned_at_iteration": float(stopped.iteration), f"pruned_{stopped.metric}": stopped.value})
    store.end_run("KILLED", reason=str(stopped))


def run_stage(
    stage: Stage,
    cfg: DictConfig,
    adapter: ModelAdapter,
    inputs: dict[str, StageOutput],
    cache: StageCache,
    store: RunStore,
    tags: dict,
    report_dev: DevReporter | None = None,
) -> StageOutput:
    """Run (or reuse from the cache) one stage inside a run nested in the open (pipeline) run.

    Parameters
    ----------
    stage : Stage
        The stage.
    cfg : DictConfig
        The job's composed config.
    adapter : ModelAdapter
        The model adapter.
    inputs : dict of str to StageOutput
        The upstream stages' outputs (and, for a warm-started stage,
        :data:`~pipeline.models.WARM_START_INPUT`); their hashes are part of the key.
    cache : StageCache
        Where the stage's output is looked up and built.
    store : RunStore
        Where the stage run is recorded.
    tags : dict
        Tags of the stage run (``stage`` and ``cache_key`` are added).
    report_dev : DevReporter, optional
        Called with the dev scores during training.

    Returns
    -------
    StageOutput
        Its output folder, hash, metrics and logged model.

    Raises
    ------
    TrainingStopped
        When the dev reporter stopped the training: the stage run ends KILLED (:func:`end_stopped`)
        and nothing is cached.
    """
    name = stage.name
    began = time.perf_counter()
    config, settings, key, external = stage_key(stage, cfg, adapter, {k: v.hash for k, v in inputs.items()}, cache)
    with store.run(name, {**tags, "stage": name, "cache_key": key}, nested=True):
        params = flatten(OmegaConf.to_container(config))
        params.update(flatten(OmegaConf.to_container(settings), "settings."))
        store.log_params(params)
        found = None if cfg.force else cache.lookup(name, key)
        if found is not None:
            log.info("[%s] cache hit %s: reusing %s", name, key[:12], found)
            folder = found
        else:
            log.info("[%s] %s %s: computing", name, "forced" if cfg.force else "cache miss", key[:12])

            def produce(out: Path) -> None:
                folders = {k: v.folder for k, v in inputs.items()}
                context = StageContext(config, settings, folders, out, adapter, store.log_steps, key, report_dev)
                stage_metrics = stage.run(context)
                write_json(out / METRICS_FILE, stage_metrics)  # strict JSON: NaN -> null

            try:
                folder = cache.build(name, key, produce, replace=bool(cfg.force))
            except TrainingStopped as stopped:  # nothing was cached: the entry is not the settings' result
                end_stopped(stopped, store)
                raise
        stage_metrics = json.loads((folder / METRICS_FILE).read_text())
        store.set_tags({"cache": "hit" if found is not None else "miss", "cache_path": str(folder)})
        if found is not None and stage.step_metrics and (folder / stage.step_metrics).is_file():
            _relog_steps(folder / stage.step_metrics, store)
        store.log_metrics({k: float(v) for k, v in stage_metrics.items() if isinstance(v, (int, float))})
        source = store.cache_source(name, key) if found is not None else None
        if source is not None:  # the run that computed this entry holds its files: point at it
            store.set_tags({CACHE_SOURCE_TAG: source.run_id})
        else:
            logged = sorted({p for pattern in stage.artifacts(settings, adapter) for p in folder.glob(pattern) if p.is_file()})
            for path in logged:
                store.log_artifact(path, name)
        model_uri = None
        logged_model = stage.logged_model({k: v.folder for k, v in inputs.items()}, folder)
        if logged_model is not None:
            model_uri = source.model_uri if source is not None else None
            if model_uri is None:
                model_uri = store.log_model(logged_model)
            store.set_tags({MODEL_URI_TAG: model_uri})
        volatile = (METRICS_FILE, *stage.volatile(adapter))
        output = StageOutput(folder, cache.output_hash(folder, volatile), found is not None, stage_metrics, model_uri, external)
        output.bundle = None if logged_model is None else logged_model.bundle
        output.seconds = time.perf_counter() - began
        output.key = key
        output.input_files = stage.input_files(config, settings) if external else None
        store.log_metrics({"seconds": output.seconds})
        return output


def stage_reads(
    cfg: DictConfig, adapter: ModelAdapter, stages: Mapping[str, Stage], order: list[str]
) -> dict[str, tuple[dict, dict]]:
    """What the stages ``order`` read of ``cfg`` (a job's composed config): {stage name: (its config
    slice, its settings)}, as :func:`stage_key` takes them."""
    return {name: (stages[name].config_slice(cfg, adapter), stages[name].settings(cfg, adapter)) for name in order}


#: the config sections of the model itself, whose settings a model (and the stages it runs) may not read
MODEL_SECTIONS = ("model", "trainer")


def setting_reader(reads: Mapping[str, tuple[dict, dict]]) -> Callable[[str], bool]:
    """``reads(key)``: whether a job whose stages read ``reads`` (:func:`stage_reads`) reads the
    setting ``key`` (dotted, or a config group). Only keys of :data:`MODEL_SECTIONS` can be unread:
    one whose section no stage's config slice holds (an HMM's ``trainer.*``), or whose first part
    below it is neither in that section of a slice nor a stage's setting (an HMM's ``model.k``
    without add-k smoothing)."""

    def reading(key: str) -> bool:
        section, _, rest = key.lstrip("+~").partition(".")
        section = section.split("/")[0]
        if section not in MODEL_SECTIONS:
            return True
        parts = [config[section] for config, _ in reads.values() if section in config]
        name = rest.split(".")[0]
        if not parts:
            return False
        return (
            not name
            or any(not isinstance(part, dict) or name in part for part in parts)
            or any(name in settings for _, settings in reads.values())
        )

    return reading


def swept_overrides(reads: Callable[[str], bool] | None = None) -> list[str]:
    """Inside a Hydra multirun job, its overrides of the swept keys, ``c2=0.1``-style (the key's last
    part, as in ``hydra.job.override_dirname``), but those of settings the job does not read
    (``reads``, :func:`setting_reader`); else an empty list."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return []
    hydra_cfg = HydraConfig.get()
    return named_overrides(list(hydra_cfg.overrides.task), swept_keys(hydra_cfg), reads)


def log_dataset(cfg: DictConfig, outputs: Mapping[str, StageOutput], store: RunStore) -> None:
    """The dataset the stages read (their external input files) as the open run's input.

    Parameters
    ----------
    cfg : DictConfig
        The run's composed config (``dataset.name``).
    outputs : mapping of str to StageOutput
        The stages' outputs: the hashes of the external input files each read, and those files.
    store : RunStore
        The store of the open run.
    """
    file_hashes = {k: v for o in outputs.values() for k, v in (o.external or {}).items()}
    files = {k: v for o in outputs.values() for k, v in (o.input_files or {}).items()}
    if file_hashes and files:
        store.log_dataset(str(cfg.dataset.name), files, file_hashes)


def register_single_run(
    cfg: DictConfig, model_uri: str, summary: dict[str, Any], run_id: str, store: RunStore, evaluation: str
) -> None:
    """With ``registry.register`` outside a sweep (a sweep registers its best job itself): the run's
    model as a new version of ``registry.name``, with its dev/test scores, dataset, ``data.train_fraction``,
    ``data.final_fit`` and evaluation key as version tags; ``registry.alias`` moved by the rule of
    ``pipeline.tracking.champion`` (a run without a dev score, as under ``data.final_fit=train+dev``,
    never takes it unless forced).

    Parameters
    ----------
    cfg : DictConfig
        The run's composed config (``registry``).
    model_uri : str
        The run's logged model.
    summary : dict
        The run's summary metrics (``dev_f1``, ``test_f1``, ...).
    run_id : str
        The pipeline run (a version tag).
    store : RunStore
        Its store; the open run is tagged ``registered_model``.
    evaluation : str
        The key of the data the run's dev and test scores were measured on (:meth:`RunStore.tag_evaluation`).
    """
    registry = OmegaConf.select(cfg, "registry")
    if registry is None or not registry.register or os.environ.get(SWEEP_ID_VARIABLE):
        return
    scores = {k: f"{summary[k]:.4f}" for k in HEADLINE if k in summary}
    metric = next((k for k in ("dev_f1", "dev_accuracy") if isinstance(summary.get(k), (int, float))), None)
    standing = Standing(metric, float(summary[metric]), evaluation) if metric is not None else None
    final_fit = str(OmegaConf.select(cfg, "data.final_fit", default="train"))
    tags = {
        **scores,
        "run_id": run_id,
        "dataset": str(cfg.dataset.name),
        "data.train_fraction": str(cfg.data.train_fraction),
        "data.final_fit": final_fit,
        "crf.evaluation": evaluation,  # the key of the data its scores were measured on (dataset, splits, test set)
    }
    if standing is None:  # the registry's version tag of why it has no standing (pipeline.tracking.champion)
        tags["standing.missing"] = (
            "data.final_fit=train+dev: no dev score" if final_fit == "train+dev" else "the run logged no dev_f1 or dev_accuracy"
        )
    version = store.register_model(
        model_uri, str(registry.name), registry.alias, tags, standing, bool(registry.get("force_alias", False))
    )
    store.set_tags({"registered_model": f"models:/{registry.name}/{version}"})
    log.info("registered the model as %s version %s", registry.name, version)


def record_invalid_sweep_job(
    cfg: DictConfig, error: Exception, store: RunStore, extra_tags: Mapping[str, str] | None = None
) -> None:
    """A sweep job whose settings are invalid is still recorded under the sweep, as a FAILED run
    with the reason (a single run just stops, leaving nothing behind).

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config.
    error : Exception
        Why its settings were refused (the end reason, cut to 5000 characters).
    store : RunStore
        The store the sweep records its runs in (opened here).
    extra_tags : mapping, optional
        More tags of the run (a sweep trial's).
    """
    parent = os.environ.get(SWEEP_PARENT_VARIABLE)
    if not parent:
        return
    store.open(cfg)
    adapter = load_adapter(cfg.model)
    tags = {**run_tags(cfg, adapter, store, extra_tags), "stage": "pipeline"}
    name = "-".join([str(cfg.dataset.name), tags["model"], tags["trainer"], *swept_overrides()])
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    store.record_failed_run(name, tags, params, parent, str(error)[:5000])


def checked_plan(
    cfg: DictConfig,
    store: RunStore,
    check: Callable[[ModelAdapter, list[str]], None] | None = None,
    extra_tags: Mapping[str, str] | None = None,
) -> tuple[ModelAdapter, dict[str, Stage], list[str]]:
    """The job's model adapter, the stages and the order to run them in, once every setting has
    been checked: bad settings fail before any stage runs.

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config.
    store : RunStore
        Where a refused sweep job is recorded (:func:`record_invalid_sweep_job`).
    check : callable, optional
        ``check(adapter, order)``: what a caller such as a regularisation path needs beyond the
        adapter's, the run's and the stages' own checks; raises SettingsError.
    extra_tags : mapping, optional
        Tags of the FAILED run that records invalid settings under a sweep (a trial's).

    Returns
    -------
    tuple
        (the model adapter, {name: stage} of every stage, the names of the stages to run in order).

    Raises
    ------
    SettingsError
        One line naming the bad setting; in a multirun the job is recorded under the sweep first.
    """
    try:
        return validated_plan(cfg, check)
    except SettingsError as err:
        record_invalid_sweep_job(cfg, err, store, extra_tags)
        raise


def validated_plan(
    cfg: DictConfig, check: Callable[[ModelAdapter, list[str]], None] | None = None
) -> tuple[ModelAdapter, dict[str, Stage], list[str]]:
    """:func:`checked_plan` without a store: what a job's settings checks are, so a sweep can make
    them for each of its jobs before the first one runs (nothing is read, written or recorded).

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config.
    check : callable, optional
        ``check(adapter, order)``, as for :func:`checked_plan`.

    Returns
    -------
    tuple
        (the model adapter, {name: stage} of every stage, the names of the stages to run in order).

    Raises
    ------
    SettingsError
        One line naming the bad setting.
    """
    stages = load_stages()
    try:
        adapter = load_adapter(cfg.model)
        order = plan(stages, list(cfg.stages), adapter)
        validate_settings(cfg, [stages[name] for name in order])
        if check is not None:
            check(adapter, order)
    except (SettingsError, ValueError) as err:
        raise (err if isinstance(err, SettingsError) else SettingsError(f"bad setting: {err}")) from None
    return adapter, stages, order


WarmStart = Callable[[dict[str, "StageOutput"]], "StageOutput | None"]


class TrialHooks(Protocol):
    """What a sweep trial's job adds to :func:`run_pipeline` (Optuna's:
    ``pipeline.sweeps.trial_stopping.OptunaTrial``, plugged in by ``pipeline.__main__``)."""

    def tags(self) -> dict[str, str]:
        """The trial's tags on every run of its job."""
        ...

    def begin(self, cfg: DictConfig, job: PipelineJob) -> tuple[DevReporter | None, dict[str, WarmStart]]:
        """Before the stages run: the reporter of dev scores during training (it may stop the
        training, :class:`~pipeline.engine.stage.TrainingStopped`) and {stage name: function of the
        outputs so far that gives the earlier output that stage starts from, or None}."""
        ...

    def end(self, cfg: DictConfig, job: PipelineJob, results: dict[str, Any], outputs: dict[str, StageOutput]) -> None:
        """After the stages ran (or a pruned training ended them): record what later trials need."""
        ...


def run_pipeline(cfg: DictConfig, store: RunStore, trial: TrialHooks | None = None) -> dict[str, Any]:
    """Run the configured stages.

    Parameters
    ----------
    cfg : DictConfig
        The job's composed config.
    store : RunStore
        Where the runs are recorded (opened here, once the settings are checked); its
        :meth:`~pipeline.engine.store.RunStore.remote_cache` is the stage cache's remote.
    trial : TrialHooks, optional
        The sweep trial this job is (None: not a trial's job).

    Returns
    -------
    dict
        Every stage's metrics, namespaced ``stage.metric`` (in a pruned trial:
        ``pipeline.pruned_at_iteration`` and the last dev score only).
    """
    trial_tags = trial.tags() if trial is not None else {}
    adapter, stages, order = checked_plan(cfg, store, extra_tags=trial_tags)
    store.open(cfg)
    tags = run_tags(cfg, adapter, store, trial_tags)
    reads = setting_reader(stage_reads(cfg, adapter, stages, order))
    run_name = "-".join([str(cfg.dataset.name), tags["model"], tags["trainer"], *name_overrides(reads)])
    job = PipelineJob(adapter, stages, order, StageCache(cfg.paths.cache_dir, remote=store.remote_cache()), store)
    reporter, warm_starts = trial.begin(cfg, job) if trial is not None else (None, {})
    results, outputs = pipeline_run(
        cfg,
        job,
        run_name,
        tags,
        parent=os.environ.get(SWEEP_PARENT_VARIABLE),
        warm_starts=warm_starts,
        report_dev=reporter,
    )
    if trial is not None:
        trial.end(cfg, job, results, outputs)
    return results


@dataclass
class PipelineJob:
    """What the pipeline runs of one job share: the model adapter, the stages and their order, the
    cache and the (opened) run store (a regularisation path runs several pipelines in one job)."""

    adapter: ModelAdapter
    stages: dict[str, Stage]
    order: list[str]
    cache: StageCache
    store: RunStore


def pipeline_run(
    cfg: DictConfig,
    job: PipelineJob,
    run_name: str,
    tags: dict[str, str],
    parent: str | None = None,
    warm_starts: Mapping[str, StageOutput | WarmStart | None] | None = None,
    report_dev: DevReporter | None = None,
    register: bool = True,
) -> tuple[dict[str, Any], dict[str, StageOutput]]:
    """One pipeline run (a run tagged ``stage=pipeline``, in ``job.store``) of ``job``'s stages under ``cfg``.

    A pruned trial ends the run KILLED (:func:`end_stopped`) and returns ``pipeline.pruned_at_iteration``
    and the last dev score instead of the stages' metrics.

    Parameters
    ----------
    cfg : DictConfig
        The run's composed config.
    job : PipelineJob
        The adapter, stages, order, cache and store the run uses.
    run_name : str
        The run's name.
    tags : dict
        Tags of the pipeline run and its stage runs.
    parent : str, optional
        The run id to nest the pipeline run under (a sweep's or a path's run).
    warm_starts : mapping, optional
        {stage name: the earlier output of that stage it starts from (a regularisation path's
        previous point), or a function of the outputs so far that gives it or None (an Optuna
        trial's nearest finished trial)}; given to the stage as the input ``WARM_START_INPUT``.
    report_dev : DevReporter, optional
        Called with the dev scores during training (an Optuna trial's reporter).
    register : bool, default True
        Honour ``registry.register``.

    Returns
    -------
    tuple
        (every stage's metrics namespaced ``stage.metric``, {stage name: its output}).
    """
    adapter, stages, cache, store = job.adapter, job.stages, job.cache, job.store
    outputs: dict[str, StageOutput] = {}
    results: dict[str, Any] = {}
    with store.run(run_name, {**tags, "stage": "pipeline"}, parent=parent or None) as run:
        store.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "config.yaml"
            shown = OmegaConf.create(redacted_values(OmegaConf.to_container(cfg, resolve=True)))
            path.write_text(OmegaConf.to_yaml(shown))  # no URL's password in the store
            store.log_artifact(path)
        summary: dict[str, Any] = {}
        try:
            for name in job.order:  # upstream stages run (or come from the cache) first
                stage = stages[name]
                inputs = {upstream: outputs[upstream] for upstream in stage.upstream(adapter)}
                stage_tags = tags
                start = (warm_starts or {}).get(name)
                if callable(start):
                    start = start(outputs)
                if start is not None:
                    inputs[WARM_START_INPUT] = start
                    stage_tags = {**tags, "warm_start_from": str(start.folder)}
                outputs[name] = run_stage(stage, cfg, adapter, inputs, cache, store, stage_tags, report_dev)
                results.update({f"{name}.{k}": v for k, v in outputs[name].metrics.items()})
                if stage.summary_prefix is not None:
                    summary.update({stage.summary_prefix + k: v for k, v in outputs[name].metrics.items()})
        except TrainingStopped as stopped:
            end_stopped(stopped, store)
            log.info("done: run %s%s pruned: %s", run.run_id, f" in sweep run {parent}" if parent else "", stopped)
            results = {"pipeline.pruned_at_iteration": stopped.iteration, f"pipeline.pruned_{stopped.metric}": stopped.value}
            return results, outputs
        numbers = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}
        headline = {k: numbers[k] for k in HEADLINE if k in numbers}
        store.log_metrics(headline)  # first, so they head the run page's metrics
        store.log_metrics({k: v for k, v in numbers.items() if k not in headline})
        file_hashes = {k: v for o in outputs.values() for k, v in (o.external or {}).items()}
        log_dataset(cfg, outputs, store)
        evaluation = store.tag_evaluation(OmegaConf.to_container(cfg.dataset, resolve=True), file_hashes)
        models = [o.model_uri for o in outputs.values() if o.model_uri]
        if models:
            store.set_tags({MODEL_URI_TAG: models[-1]})
            store.link_model(run.run_id, models[-1])  # the run page's "Logged models"
            if register:
                register_single_run(cfg, models[-1], summary, run.run_id, store, evaluation)
        log.info(
            "stage seconds:\n%s",
            "\n".join(f"  {s:<10} {o.seconds:8.2f}{' (cache)' if o.cached else ''}" for s, o in outputs.items()),
        )
        hits = [s for s, o in outputs.items() if o.cached]
        store.set_tags({"cache_hits": ",".join(hits) or "none"})
        if outputs and len(hits) == len(outputs):  # nothing computed: say so in the runs list
            run_name = f"{run_name}-{CACHED_SUFFIX}"
            store.rename_run(run.run_id, run_name)
            store.set_tags({"cache_only": "true"})
        scores = ", ".join(f"{k} {v:.2f}" for k, v in headline.items())
        # what loads elsewhere: the pipeline run's own id does not (its files are in its stage runs)
        bundled = [(s, o.bundle) for s, o in outputs.items() if o.model_uri and o.bundle is not None]
        handoff = store.handoff_lines(run.run_id, *bundled[-1]) if bundled else []
        store.write_note(headline, handoff, len(hits), len(outputs))
        log.info(
            "done: run %s (%s)%s (%d of %d stages from the cache)%s\n  open: %s\n  outputs: %s%s",
            run.run_id,
            run_name,
            f" in sweep run {parent}" if parent else "",
            len(hits),
            len(outputs),
            f"; {scores}" if scores else "",
            store.run_link(run),
            "; ".join(f"{s} {o.folder}" for s, o in outputs.items()),
            "".join(f"\n  {line}" for line in handoff),
        )
    return results, outputs


def summary_key(metric: str) -> str | None:
    """The key under which a job's pipeline run shows a stage metric.

    Parameters
    ----------
    metric : str
        ``<stage>.<name>``, e.g. ``evaluate.dev_f1``.

    Returns
    -------
    str or None
        The stage's ``summary_prefix`` and the name (``evaluate.dev_f1`` -> ``dev_f1``,
        ``prepare.train_tokens`` -> ``data.train_tokens``); None for an unknown stage or one whose
        metrics the pipeline run does not repeat.
    """
    name, _, metric_name = str(metric).rpartition(".")
    stage = load_stages().get(name)
    if stage is None or stage.summary_prefix is None or not metric_name:
        return None
    return stage.summary_prefix + metric_name


def objective_value(results: dict[str, Any], metric: str | None = None) -> float | None:
    """What a sweep optimises.

    Parameters
    ----------
    results : dict
        A job's results (:func:`run_pipeline`'s).
    metric : str, optional
        A stage's metric, ``evaluate.dev_f1`` (a sweeper names it in the job's environment,
        :data:`pipeline.sweeps.trial_environment.METRIC_VARIABLE`).

    Returns
    -------
    float or None
        ``metric`` when given, else dev F1 for chunk/entity tasks, else dev accuracy (of any
        stage); None for a pruned trial (it has no result).

    Raises
    ------
    ValueError
        Naming the job's metrics when ``metric`` is not one of them.
    """
    if "pipeline.pruned_at_iteration" in results:
        return None
    if metric:
        if metric not in results:
            raise ValueError(f"the sweep's metric {metric!r} is not one of this job's metrics: {', '.join(sorted(results))}")
        return float(results[metric])
    for suffix in (".dev_f1", ".dev_accuracy"):
        for key, value in results.items():
            if key.endswith(suffix):
                return float(value)
    return None

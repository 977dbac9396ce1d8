"""The job side of an Optuna sweep: dev scores reported to the trial during training, Optuna's
pruning (a trial stopped early) and warm starts from a finished trial.

The sweeper (``hydra_plugins/crf_optuna_sweeper``, in the launching process) asks the study for a
trial and launches a job with the trial's values as overrides. The job, a separate process on
any machine, learns which trial it is from its environment (:data:`STORAGE_VARIABLE`,
:data:`STUDY_VARIABLE`, :data:`TRIAL_VARIABLE`: set through ``hydra.job.env_set``, so they reach Ray and
SLURM jobs too) and opens the same study in the shared storage, with the pruner the sweeper stored
in the study (its user attribute ``pruner``). Every ``train.dev_every`` iterations the training
loop hands its dev scores to :class:`TrialReporter`, which reports the one the study optimises as
the trial's intermediate value at that iteration and asks the pruner; when the pruner says stop,
the reporter marks the trial PRUNED in the study and raises :class:`TrialPruned` (the engine's
``TrainingStopped``), which ends the training and the job's runs (KILLED, tagged
``crf.trial_state=PRUNED``; see the runner).

Warm starts: a job that finishes records its train output (cache key and content hash) and its
features' content hash on its trial; a job the sweeper offers a finished trial
(:data:`WARM_START_VARIABLE`) reads them, starts from that output if its own features are the same,
the entry is in its stage cache and the model adapter finds it of the job's algorithm and model
layout (``warm_start_problem``), and then marks its trial ``warm_start_trial``.

:class:`OptunaTrial` is how this reaches the engine (its ``TrialHooks``): ``pipeline.__main__``
builds it from the environment (:func:`trial_from_environment`) and hands it to the runner. This
module imports Optuna only when a job is a trial.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from pipeline.engine.runner import PipelineJob, StageOutput, WarmStart
from pipeline.engine.stage import TRIAL_STATE_TAG, DevReporter, TrainingStopped
from pipeline.sweeps.trial_environment import (
    DEV_SCORES,
    FEATURES_ATTR,
    METRIC_VARIABLE,
    STORAGE_VARIABLE,
    STUDY_TAG,
    STUDY_VARIABLE,
    TRAIN_OUTPUT_ATTR,
    TRIAL_TAG,
    TRIAL_VARIABLE,
    WARM_START_ATTR,
    WARM_START_VARIABLE,
)

__all__ = [  # the names tests and the sweeper read from here
    "DEV_SCORES",
    "FEATURES_ATTR",
    "METRIC_VARIABLE",
    "STORAGE_VARIABLE",
    "STUDY_TAG",
    "STUDY_VARIABLE",
    "TRAIN_OUTPUT_ATTR",
    "TRIAL_STATE_TAG",
    "TRIAL_TAG",
    "TRIAL_VARIABLE",
    "WARM_START_ATTR",
    "WARM_START_VARIABLE",
    "OptunaTrial",
    "TrialPruned",
    "TrialReporter",
    "reporter_from_environment",
    "trial_from_environment",
]

log = logging.getLogger(__name__)
# the stages a trial's warm start concerns: the one that starts from a finished trial's output,
# and the one whose output must be the same for the weights to fit
WARM_STAGE, FEATURES_STAGE = "train", "featurize"


class TrialPruned(TrainingStopped):
    """The study's pruner stopped this trial's training (not a failure)."""

    def __init__(self, trial: int, iteration: int, metric: str, value: float) -> None:
        message = f"trial {trial} pruned by the study's pruner at iteration {iteration} ({metric} {value:.2f})"
        super().__init__(message, iteration, metric, value)
        self.trial = trial

    def __reduce__(self) -> tuple:
        return type(self), (self.trial, self.iteration, self.metric, self.value)


def trial_environment() -> dict[str, str] | None:
    """{storage, study, trial} when this process runs an Optuna trial's job, else None."""
    values = {name: os.environ.get(variable) for name, variable in
              (("storage", STORAGE_VARIABLE), ("study", STUDY_VARIABLE), ("trial", TRIAL_VARIABLE))}  # fmt: skip
    if not values["trial"]:
        return None
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise RuntimeError(f"an Optuna trial's job needs {', '.join(missing)} in its environment (set by the sweeper)")
    return values  # type: ignore[return-value]


def reported_score(metric: str | None, scores: Mapping[str, float]) -> tuple[str, float] | None:
    """The dev score of ``scores`` that stands for the study's ``metric`` (null: F1 when there is
    one, else accuracy, as :func:`pipeline.engine.runner.objective_value`); None if absent."""
    wanted = metric.rsplit(".", 1)[1] if metric else None
    for name in (wanted,) if wanted else ("dev_f1", "dev_accuracy"):
        if name in scores:
            return name, float(scores[name])
    return None


class TrialReporter:
    """Reports one job's dev scores to its Optuna trial and prunes it when the pruner says so."""

    def __init__(self, storage: str, study_name: str, number: int) -> None:
        import optuna

        from pipeline.sweeps.search import build_pruner, open_storage

        optuna.logging.disable_default_handler()  # optuna's messages go through the job's log
        optuna.logging.enable_propagation()
        store = open_storage(storage)
        study_id = store.get_study_id_from_name(study_name)
        attributes = store.get_study_user_attrs(study_id)
        self.metric: str | None = attributes.get("metric")
        self.number = number
        self.store, self.study_id = store, study_id
        self.study = optuna.load_study(study_name=study_name, storage=store, pruner=build_pruner(attributes.get("pruner")))
        # the trial the sweeper asked for, by its number; Trial(study, id) is how a process other
        # than the one that asked for a trial reports to it (as optuna-integration's callbacks do)
        self.trial = optuna.trial.Trial(self.study, store.get_trial_id_from_study_id_trial_number(study_id, number))

    def warm_start_output(self, source: int, features: str) -> tuple[str, str] | None:
        """(cache key, content hash) of trial ``source``'s train output, which this trial starts
        from, if its job recorded one trained on the same features (content hash ``features``);
        else None, logged."""
        trial_id = self.store.get_trial_id_from_study_id_trial_number(self.study_id, source)
        attributes = self.store.get_trial(trial_id).user_attrs
        train = attributes.get(TRAIN_OUTPUT_ATTR)
        problem = None
        if not isinstance(train, dict) or not {"key", "hash"} <= set(train):
            problem = "no train output recorded"
        elif attributes.get(FEATURES_ATTR) != features:
            problem = "other features"
        if problem is not None:
            log.warning("trial %d: trial %d's weights do not fit (%s): training from zero", self.number, source, problem)
            return None
        return str(train["key"]), str(train["hash"])

    def started_from(self, source: int) -> None:
        """Record (and log) that this trial's fit starts from trial ``source``'s weights."""
        self.trial.set_user_attr(WARM_START_ATTR, source)
        log.info("trial %d starts from the weights of trial %d", self.number, source)

    def record_outputs(self, train: Any, features: str) -> None:
        """Record this trial's train output (a :class:`pipeline.engine.runner.StageOutput`: its
        cache key and content hash) and the content hash of its features: later trials may start
        from its weights."""
        self.trial.set_user_attr(TRAIN_OUTPUT_ATTR, {"key": train.key, "hash": train.hash})
        self.trial.set_user_attr(FEATURES_ATTR, features)

    def __call__(self, iteration: int, scores: Mapping[str, float]) -> None:
        found = reported_score(self.metric, scores)
        if found is None:
            return
        name, value = found
        self.trial.report(value, step=int(iteration))
        if self.trial.should_prune():
            import optuna

            self.study.tell(self.trial, state=optuna.trial.TrialState.PRUNED)
            log.info("trial %d: pruned at iteration %d (%s %.2f)", self.number, iteration, name, value)
            raise TrialPruned(self.number, int(iteration), name, value)


def reporter_from_environment() -> TrialReporter | None:
    """The reporter of this job's trial (see the module docstring), or None outside an Optuna sweep."""
    found = trial_environment()
    if found is None:
        return None
    return TrialReporter(found["storage"], found["study"], int(found["trial"]))


def warm_start_trial() -> int | None:
    """The finished trial this job's trial starts from (set by the sweeper), or None."""
    value = os.environ.get(WARM_START_VARIABLE)
    return int(value) if value else None


def trial_tags() -> dict[str, Any]:
    """The trial's number and study as run tags (empty outside an Optuna sweep)."""
    found = trial_environment()
    return {} if found is None else {TRIAL_TAG: found["trial"], STUDY_TAG: found["study"]}


class OptunaTrial:
    """An Optuna trial's job as the engine sees it (``pipeline.engine.runner.TrialHooks``): its
    tags, its reporter of dev scores (which may prune it), the finished trial its training starts
    from (see the module docstring) and, once it finished, its outputs recorded for later trials.

    Parameters
    ----------
    environment : dict
        {storage, study, trial} of :func:`trial_environment`.
    """

    def __init__(self, environment: Mapping[str, str]) -> None:
        self.environment = dict(environment)
        self.reporter: TrialReporter | None = None
        self.warm = False

    def tags(self) -> dict[str, str]:
        return {TRIAL_TAG: self.environment["trial"], STUDY_TAG: self.environment["study"]}

    def begin(self, cfg: DictConfig, job: PipelineJob) -> tuple[DevReporter | None, dict[str, WarmStart]]:
        reporter = TrialReporter(self.environment["storage"], self.environment["study"], int(self.environment["trial"]))
        self.reporter, adapter, number = reporter, job.adapter, reporter.number
        self.warm = adapter.can_warm_start(cfg)
        source = warm_start_trial()
        if source is not None and not self.warm:
            log.info("trial %d: trainer %s does not start from given weights: from zero", number, adapter.trainer_tag(cfg))
            source = None
        if source is None:
            return reporter, {}

        def trial_start(outputs: dict[str, StageOutput]) -> StageOutput | None:
            """The train output of the finished trial the sweeper chose, if it was trained on this
            job's features, is in the cache and fits this job's settings (the adapter's
            ``warm_start_problem``); else None (logged): the fit starts from zero."""
            features = outputs.get(FEATURES_STAGE)
            if features is None:
                log.warning("trial %d: no featurize stage to compare with trial %d's: training from zero", number, source)
                return None
            found = reporter.warm_start_output(source, features.hash)
            if found is None:
                return None
            key, content = found
            folder = job.cache.lookup(WARM_STAGE, key)
            if folder is None:
                log.warning("trial %d: trial %d's train output %s is not in the cache: from zero", reporter.number, source, key)
                return None
            problem = adapter.warm_start_problem(cfg, folder)
            if problem is not None:
                log.warning("trial %d: trial %d's weights do not fit (%s): training from zero", reporter.number, source, problem)
                return None
            reporter.started_from(source)
            return StageOutput(folder, content, cached=True, metrics={}, key=key)

        return reporter, {WARM_STAGE: trial_start}

    def end(self, cfg: DictConfig, job: PipelineJob, results: dict[str, Any], outputs: dict[str, StageOutput]) -> None:
        trained = outputs.get(WARM_STAGE)
        finished = "pipeline.pruned_at_iteration" not in results
        if self.reporter is not None and self.warm and trained is not None and FEATURES_STAGE in outputs and finished:
            self.reporter.record_outputs(trained, outputs[FEATURES_STAGE].hash)


def trial_from_environment() -> OptunaTrial | None:
    """The :class:`OptunaTrial` this process's job is (see :func:`trial_environment`), or None."""
    found = trial_environment()
    return None if found is None else OptunaTrial(found)

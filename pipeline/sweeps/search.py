"""The Optuna sweeper's settings: its search space, sampler, pruner and study storage.

The search space is written in Hydra's own sweep grammar, one entry per config key (the sweeper's
``params`` and the command line's sweep overrides, the command line winning):

- ``choice(lbfgs, l1, elasticnet)`` or ``lbfgs,l1,elasticnet``: a categorical (config groups too);
- ``interval(0.1, 0.9)``: a float drawn uniformly from [low, high]; ``tag(log, interval(0.001, 10))``
  on a log scale; ``tag(int, interval(1, 100))`` or Hydra's ``int(interval(1, 100))`` an integer
  (``tag(int, log, ...)`` both);
- ``range(10, 100, 10)``: integers start, start + step, ... below stop (Python's ``range``); a
  float range is a categorical of its values;
- a plain value (``trainer.threads: 1``): the same for every trial.

Each trial's values become ordinary Hydra overrides of its job (``trainer=l1 trainer.strength=0.0371``).
:func:`warm_start_source` chooses the finished trial a new one may start from. This module is
used by ``hydra_plugins/crf_optuna_sweeper`` in the launching process; the job side
(intermediate dev scores and pruning) is :mod:`pipeline.sweeps.trial_stopping`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from pipeline.engine.validate import finite_number
from pipeline.report import shown_url
from pipeline.sweeps.grid_preflight import MAX_RANGE, range_problem
from pipeline.sweeps.optuna_pruners import HeldMedianPruner, HeldPercentilePruner
from pipeline.sweeps.trial_environment import (
    DEV_SCORES,
    METRIC_VARIABLE,
    STORAGE_VARIABLE,
    STUDY_VARIABLE,
    TRAIN_OUTPUT_ATTR,
    TRIAL_VARIABLE,
    WARM_START_VARIABLE,
)
from pipeline.tracking.champion import metric_direction

__all__ = ["METRIC_VARIABLE", "STORAGE_VARIABLE", "STUDY_VARIABLE", "TRIAL_VARIABLE", "WARM_START_VARIABLE"]

SAMPLERS = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
PRUNERS = {
    "none": optuna.pruners.NopPruner,
    "median": HeldMedianPruner,  # Optuna's, with each finished trial held at its final score
    "percentile": HeldPercentilePruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "threshold": optuna.pruners.ThresholdPruner,
}
TAGS = {"log", "int"}
_PLAIN = re.compile(r"^[A-Za-z0-9_.\-/:]+$")  # a string value that needs no quotes in an override


class SweeperSettingError(ValueError):
    """A setting of the Optuna sweeper that cannot work; the message is one line naming it."""


@dataclass
class SearchSpace:
    """What a sweep varies (Optuna distributions by override key) and what every trial shares
    (overrides as written)."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)
    overrides: dict[str, Override] = field(default_factory=dict)  # every key's override, searched or fixed


def _distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override (see the module docstring)."""
    key, sweep = override.get_key_element(), override.value()
    tags = set(getattr(sweep, "tags", set()))
    if tags - TAGS:
        raise SweeperSettingError(f"{key}: unknown tag(s) {sorted(tags - TAGS)}; known: log, int (on interval)")
    if isinstance(sweep, IntervalSweep):
        if not (finite_number(sweep.start) and finite_number(sweep.end)):
            ends = ", ".join(f"{v:g}" if isinstance(v, float) else f"<{len(str(v))} digits>" for v in (sweep.start, sweep.end))
            raise SweeperSettingError(f"{key}: interval({ends}) needs finite ends")
        low, high = float(sweep.start), float(sweep.end)
        if not low < high:
            raise SweeperSettingError(f"{key}: interval({low:g}, {high:g}) is empty: the low end must be below the high end")
        if "log" in tags and low <= 0:
            raise SweeperSettingError(f"{key}: a log-scale interval needs a positive low end, not {low:g}")
        integral = all(isinstance(end, int) and not isinstance(end, bool) for end in (sweep.start, sweep.end))
        if "int" in tags or integral:  # tag(int, interval(a, b)), or Hydra's own int(interval(a, b)): int ends
            if low != int(low) or high != int(high):
                raise SweeperSettingError(f"{key}: tag(int, interval({low:g}, {high:g})) needs whole-number ends")
            return IntDistribution(int(low), int(high), log="log" in tags)
        return FloatDistribution(low, high, log="log" in tags)
    if tags:
        raise SweeperSettingError(f"{key}: tag({', '.join(sorted(tags))}, ...) applies to interval() only")
    if isinstance(sweep, RangeSweep):
        if sweep.shuffle:
            raise SweeperSettingError(f"{key}: shuffle() means nothing to a sampler; give the range itself")
        whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (sweep.start, sweep.stop, sweep.step))
        problem = range_problem(key, sweep, limit=None if whole and sweep.step > 0 else MAX_RANGE)  # not listed
        if problem:
            raise SweeperSettingError(problem)
        values = sweep.range()
        if whole and sweep.step > 0:
            return IntDistribution(values[0], values[-1], step=int(sweep.step))
        return CategoricalDistribution(list(values))
    if isinstance(sweep, ChoiceSweep):
        if sweep.shuffle:
            raise SweeperSettingError(f"{key}: shuffle() means nothing to a sampler; give the choice itself")
        values = list(sweep.list)
        bad = [v for v in values if not (v is None or isinstance(v, (bool, int, float, str)))]
        if bad:
            raise SweeperSettingError(f"{key}: choice values must be numbers, strings, booleans or null, not {bad[0]!r}")
        infinite = [v for v in values if isinstance(v, float) and not math.isfinite(v)]
        if infinite:
            raise SweeperSettingError(f"{key}: choice value {infinite[0]!r} is not a finite number (a trial cannot pass it)")
        if len(set(map(repr, values))) != len(values):
            raise SweeperSettingError(f"{key}: a choice value is repeated in {values}")
        return CategoricalDistribution(values)
    raise SweeperSettingError(f"{key}: {type(sweep).__name__} is not a search space (choice, range or interval)")


def parse_space(params: Mapping[str, Any] | None, arguments: Sequence[str]) -> SearchSpace:
    """The search space of the sweeper's ``params`` ({key: grammar string}) and the multirun's
    command-line ``arguments`` (its task overrides); a key on the command line replaces the same key
    of ``params``. SweeperSettingError (one line) for what is not a search space."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
    try:
        overrides = OverridesParser.create().parse_overrides(lines)
    except Exception as error:  # Hydra's grammar errors are multi-line: keep their first line
        raise SweeperSettingError(f"bad search space: {str(error).strip().splitlines()[0]}") from None
    chosen: dict[str, Override] = {}
    for override in overrides:  # the last word on a key wins (params first, then the command line)
        chosen.pop(override.get_key_element(), None)
        chosen[override.get_key_element()] = override
    space = SearchSpace(overrides=chosen)
    for key, override in chosen.items():
        if override.is_sweep_override():
            space.distributions[key] = _distribution(override)
        else:
            space.fixed.append(f"{key}={override.get_value_element_as_str()}")
    if not space.distributions:
        raise SweeperSettingError(
            "nothing to search: give hydra.sweeper.params (e.g. {trainer.c2: 'tag(log, interval(0.001, 10))'}) "
            "or a sweep override such as 'trainer.c2=tag(log, interval(0.001, 10))'"
        )
    return space


def _group_options(loader: Any, group: str) -> list[str]:
    """The options of config group ``group`` that Hydra's config ``loader`` knows (empty: no such group)."""
    if "." in group:  # a config key, never a group
        return []
    try:
        return list(loader.get_group_options(group))
    except Exception:  # not a group path Hydra can list
        return []


def _config_has(config: Any, key: str) -> bool:
    """Whether the composed ``config`` has ``key`` (dotted), without resolving its interpolations."""
    node = config
    for part in key.split("."):
        if not OmegaConf.is_dict(node) or part not in node:
            return False
        node = node._get_node(part)
    return True


def check_config_keys(space: SearchSpace, config: Any, loader: Any) -> None:
    """Every value of a config group the search space sets (searched or fixed) is an option of that
    group that Hydra's config ``loader`` (``hydra_context.config_loader``) lists, and every other key
    it changes (not added with ``+``/``++``) is a key of the composed ``config``; a key of a group the
    space sets (``trainer.c1`` beside ``trainer=choice(l1, lbfgs)``) that the composed config lacks
    must be in the config of each of the group's options the trials take (composed, as their jobs
    will be, only then). SweeperSettingError (one line) otherwise: so ``trainer=choice(nosuch, lbfgs)``
    is refused before any trial runs, not by its trial's job."""
    groups: dict[str, list[str]] = {}  # a config group the space sets: the options its trials take
    for key, override in space.overrides.items():
        if override.is_delete() or override.package:  # a group placed elsewhere (trainer@x=...): left to Hydra
            continue
        group = override.key_or_group
        options = _group_options(loader, group)
        if not options:
            continue
        distribution = space.distributions.get(key)
        if distribution is None:
            values = [override.value()]
        elif isinstance(distribution, CategoricalDistribution):
            values = list(distribution.choices)
        else:
            raise SweeperSettingError(f"{key}: a config group is searched with choice(...) of its options ({', '.join(options)})")
        for value in values:
            if value is None:  # no config of the group
                continue
            name = str(value)
            folder, _, option = name.rpartition("/")
            known = options if not folder else _group_options(loader, f"{group}/{folder}")
            if option not in known:
                raise SweeperSettingError(
                    f"{key}={name}: config group {group} has no option {name!r} (its options: {', '.join(options)})"
                )
        groups[group] = [format_value(v) for v in values]
    for key, override in space.overrides.items():
        name = override.key_or_group
        if override.is_add() or override.is_force_add() or override.is_delete() or name in groups or _config_has(config, name):
            continue
        group = next((g for g in groups if name.startswith(g.replace("/", ".") + ".")), None)
        if group is None:
            raise SweeperSettingError(f"{key}: no such config key (to add one, write +{name}=...)")
        for value in groups[group]:  # a key some option of the group may have: composed as the trials' jobs are
            overrides = [o for o in space.fixed if o.partition("=")[0] != group] + [f"{group}={value}"]
            try:
                composed = loader.load_sweep_config(config, overrides)
            except Exception as error:  # Hydra's composition errors are multi-line: keep the first
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise SweeperSettingError(f"{key}: the trials with {group}={value} cannot be composed: {first}") from None
            if not _config_has(composed, name):
                raise SweeperSettingError(f"{key}: no such config key with {group}={value} (to add one, write +{name}=...)")


def _checked_values(distribution: BaseDistribution) -> list[Any]:
    """The values of ``distribution`` whose trials are checked before a sweep: every choice, or both
    ends of a range (an integer range's last value on its step)."""
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    low, high = distribution.low, distribution.high
    if isinstance(distribution, IntDistribution):
        high = low + (high - low) // distribution.step * distribution.step
    return [low] if high == low else [low, high]


#: a search space with at most this many combinations of its choices and range ends is checked
#: whole before a sweep (values that are only bad together, such as trainer=sgd with c1 > 0)
MAX_CHECKED_COMBINATIONS = 16


def checked_trials(space: SearchSpace) -> list[dict[str, Any]]:
    """The searched values of the trials checked before a sweep (:func:`check_trials`): every
    combination of the searched keys' choices and range ends when there are at most
    :data:`MAX_CHECKED_COMBINATIONS`, else every key at each of its own with the others at their
    first."""
    values = {key: _checked_values(distribution) for key, distribution in space.distributions.items()}
    if math.prod(len(listed) for listed in values.values()) <= MAX_CHECKED_COMBINATIONS:
        return [dict(zip(values, combination)) for combination in itertools.product(*values.values())]
    first = {key: listed[0] for key, listed in values.items()}
    return [first, *({**first, key: value} for key, listed in values.items() for value in listed[1:])]


def stage_metric_names(job: Any, stage: str) -> tuple[str, ...] | None:
    """The glob patterns of the metrics that ``stage`` returns in ``job`` (a composed config), as the
    stage declares them (:meth:`pipeline.engine.stage.Stage.metric_names`; None: not declared)."""
    from pipeline.engine.stage import load_stages
    from pipeline.models import load_adapter

    return load_stages()[stage].metric_names(job, load_adapter(job.model))


#: a study's record of its trials' model when the search space searches ``model`` itself
SEARCHED_MODELS = "choice(...)"


def fixed_settings(job: Any) -> dict[str, str] | None:
    """What the stages of ``job`` (a composed config: a sweep's fixed settings, its searched keys at
    their defaults) read, section by section: {``<stage>.<section>``: a digest of that part of the
    stage's config slice}; None if the job's stages cannot be planned. A study records it, and a
    resume whose fixed settings give other digests is refused (their fits would not compare)."""
    from pipeline.engine.runner import stage_reads, validated_plan
    from pipeline.engine.validate import SettingsError

    try:
        adapter, stages, order = validated_plan(job)
        reads = stage_reads(job, adapter, stages, order)
    except (SettingsError, ValueError):
        return None
    return {
        f"{name}.{section}": hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
        for name, (config, _) in reads.items()
        for section, value in config.items()
    }


def check_trials(space: SearchSpace, config: Any, loader: Any, metric: str | None) -> None:
    """Compose and check the jobs of the trials of :func:`checked_trials` as their runs will check
    them before their first stage (:func:`pipeline.sweeps.grid_preflight.check_job`: the stages
    each will run and their own checks, the fixed settings included), and check that the sweep's
    objective exists in each: ``metric`` (null: the dev score) is a metric of a stage the job runs
    (one the stage declares, where it declares them: ``evaluate.nosuch`` is refused), an F1 needs
    a dataset with chunks (a scheme other than none), and a dev score needs a dev
    split, which a ``data.final_fit=train+dev`` run has not; and every trial is scored on the same
    data (:func:`pipeline.tracking.champion.evaluation_key`); and every searched key is one some
    trial's stages read (:func:`pipeline.sweeps.grid_preflight.unread_sweep_keys`).
    SweeperSettingError (one line) otherwise: so ``trainer.c2=choice(0.1, -1)`` or
    ``data.final_fit=nosuch`` is refused before any trial runs, not by a trial's job."""
    from crf.bundle import normalize_scheme
    from pipeline.engine.validate import SettingsError
    from pipeline.stages.prepare import final_fit
    from pipeline.sweeps.grid_preflight import check_job, unread_sweep_keys
    from pipeline.tracking.champion import evaluation_key

    evaluations: dict[str, str] = {}  # evaluation key -> the first trials scored on that data
    jobs = []  # (overrides, composed config, stages) of each checked trial
    for values in checked_trials(space):
        searched = " ".join(trial_overrides(values))
        try:
            job, order = check_job(loader, config, [*space.fixed, *trial_overrides(values)])
        except SettingsError as error:
            raise SweeperSettingError(f"the trials with {searched}: {error}") from None
        jobs.append(([*space.fixed, *trial_overrides(values)], job, order))
        evaluations.setdefault(evaluation_key(OmegaConf.to_container(job.dataset, resolve=True)), searched)
        if len(evaluations) > 1:
            first = next(iter(evaluations.values()))
            raise SweeperSettingError(
                f"the trials with {first} and those with {searched} are scored on different data (the dataset, its files, "
                "columns, label or dev split differ), so their scores do not compare: search one evaluation data per study"
            )
        stage, _, name = (metric or ".dev score").rpartition(".")
        if metric is not None and stage not in order:
            raise SweeperSettingError(
                f"hydra.sweeper.metric={metric}: the trials with {searched} do not run stage {stage} "
                f"(they run {', '.join(order)})"
            )
        scheme = normalize_scheme(OmegaConf.select(job, "dataset.scheme", default=None))
        if metric is not None and "_f1" in name and scheme == "none":
            raise SweeperSettingError(
                f"hydra.sweeper.metric={metric}: dataset {OmegaConf.select(job, 'dataset.name')} has no chunks (dataset.scheme="
                f"none), so its runs score accuracy, not F1: optimise {stage}.{name.replace('f1', 'accuracy', 1)}"
            )
        declared = None if metric is None else stage_metric_names(job, stage)
        if declared is not None and not any(fnmatch.fnmatchcase(name, pattern) for pattern in declared):
            raise SweeperSettingError(
                f"hydra.sweeper.metric={metric}: stage {stage} logs no metric {name} in the trials with {searched} "
                f"(its metrics: {', '.join(declared)}; * is a type's or field's name)"
            )
        if (metric is None or name in DEV_SCORES) and final_fit(job) != "train":
            raise SweeperSettingError(
                f"data.final_fit={final_fit(job)}: such a run has no dev split, so no trial would have the sweep's objective "
                f"({metric or 'the dev score'}); search with data.final_fit=train, then refit the chosen settings with "
                f"data.final_fit={final_fit(job)} in one run"
            )
    unread = unread_sweep_keys(jobs, "search", "trials")
    if unread:
        raise SweeperSettingError(unread)


def check_enqueued(trials: Sequence[Mapping[str, Any]] | None, space: SearchSpace) -> list[dict[str, Any]]:
    """``hydra.sweeper.enqueue``: settings to try first (each {key: value} of the search space; keys
    left out are sampled), checked against the space; SweeperSettingError (one line) otherwise."""
    checked = []
    for number, trial in enumerate(trials or []):
        if not isinstance(trial, Mapping) or not trial:
            raise SweeperSettingError(f"hydra.sweeper.enqueue[{number}]={trial!r}: a mapping of search-space keys to values")
        for key, value in trial.items():
            distribution = space.distributions.get(key)
            if distribution is None:
                raise SweeperSettingError(
                    f"hydra.sweeper.enqueue[{number}]: {key} is not searched (the space: {', '.join(space.distributions)})"
                )
            if isinstance(distribution, CategoricalDistribution):
                inside = value in distribution.choices
            else:
                number_given = isinstance(value, (int, float)) and not isinstance(value, bool)
                inside = number_given and distribution.low <= value <= distribution.high
            if not inside:
                raise SweeperSettingError(
                    f"hydra.sweeper.enqueue[{number}]: {key}={value!r} is outside its search space {distribution}"
                )
        checked.append(dict(trial))
    return checked


def format_value(value: Any) -> str:
    """``value`` as the value of a Hydra override: numbers exactly (``repr``), booleans and null
    as Hydra writes them, strings quoted unless they are plain words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SweeperSettingError(f"cannot pass {value!r} as an override")
        return repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def trial_overrides(params: Mapping[str, Any]) -> list[str]:
    """A trial's sampled values as the overrides of its job (in the search space's key order)."""
    return [f"{key}={format_value(value)}" for key, value in params.items()]


def _has_distance(distribution: BaseDistribution) -> bool:
    """Whether a near key's distribution has a distance: a float range, or a choice of numbers
    (``trainer.strength=0.01,0.1,1``); other choices (the trainer) are only equal or not."""
    if isinstance(distribution, FloatDistribution):
        return True
    return isinstance(distribution, CategoricalDistribution) and all(
        isinstance(c, (int, float)) and not isinstance(c, bool) for c in distribution.choices
    )


def _distance(value: Any, other: Any, distribution: BaseDistribution) -> float:
    """How far apart two values of a float distribution or a choice of numbers are: in log units
    on a log scale (a choice of positive numbers counts as one), else as a fraction of the range."""
    if isinstance(distribution, FloatDistribution):
        log_scale, low, high = distribution.log, distribution.low, distribution.high
    else:
        log_scale, low, high = min(distribution.choices) > 0, min(distribution.choices), max(distribution.choices)
    if log_scale:
        return abs(math.log(value) - math.log(other))
    return abs(value - other) / (high - low) if high > low else 0.0


def derived_seed(seed: int | None, stream: int = 1) -> int | None:
    """Another seed determined by ``seed`` and ``stream`` (at least 1; None stays None), for
    another random stream than ``seed``'s."""
    return None if seed is None else int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def _near_keys(near_keys: Sequence[str], distributions: Mapping[str, BaseDistribution]) -> tuple[list[str], list[str]]:
    """(the keys of ``near_keys`` that are searched as a float or a choice, those of them that
    have a distance: the strengths)."""
    near = [k for k in near_keys if isinstance(distributions.get(k), (FloatDistribution, CategoricalDistribution))]
    return near, [k for k in near if _has_distance(distributions[k])]


def strongest_first_startup(space: SearchSpace, near_keys: Sequence[str], count: int, seed: int | None) -> list[dict[str, Any]]:
    """``count`` settings drawn at random from ``space`` (seeded: what a sampler's random start-up
    would try), ordered by regularisation strength, strongest first: the sum of the numeric keys
    among ``near_keys`` (the strengths), each on its own scale (log for a log range). Enqueued as
    a sweep's first trials, the strong fits, quick from zero, run first and the weak ones, slow
    from zero, start from their weights and meet a pruner that has finished trials to compare.
    Empty when ``count`` is not positive or no strength is searched (nothing to order by)."""
    _, numeric = _near_keys(near_keys, space.distributions)
    if count <= 0 or not numeric:
        return []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created": the sweep's study is the one
    try:
        scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    finally:
        optuna.logging.set_verbosity(verbosity)
    drawn = [scratch.ask(space.distributions).params for _ in range(count)]
    drawn = [params for k, params in enumerate(drawn) if params not in drawn[:k]]  # a choice can repeat

    def strength(params: Mapping[str, Any]) -> float:
        total = 0.0
        for key in numeric:
            distribution = space.distributions[key]
            low = distribution.low if isinstance(distribution, FloatDistribution) else min(distribution.choices)
            total += _distance(params[key], low, distribution)
        return total

    return sorted(drawn, key=strength, reverse=True)


def warm_start_source(
    finished: Sequence[optuna.trial.FrozenTrial],
    params: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
    near_keys: Sequence[str],
) -> int | None:
    """The number of the trial among ``finished`` whose weights a trial with ``params`` should start
    from, or None: of those whose job recorded its train output (``TRAIN_OUTPUT_ATTR``), the ones
    with the same value of every key except the float and categorical keys in ``near_keys``
    (integer keys must be equal), and of those the nearest: the fewest non-numeric choices among
    the near keys (the trainer) of another value, then the nearest in the numeric ones (the
    regularisation strengths, summed distances, see :func:`_distance`), the latest on a tie. The
    job checks that the source's features, algorithm and model layout are its own before it uses
    the weights (:meth:`pipeline.models.ModelAdapter.warm_start_problem`)."""
    near, numeric = _near_keys(near_keys, distributions)
    plain = [k for k in near if k not in numeric]
    best: tuple[int, float, int] | None = None
    for trial in finished:
        if TRAIN_OUTPUT_ATTR not in trial.user_attrs or any(k not in trial.params for k in params):
            continue
        if any(trial.params[k] != v for k, v in params.items() if k not in near):
            continue
        others = sum(trial.params[k] != params[k] for k in plain)
        distance = sum(_distance(params[k], trial.params[k], distributions[k]) for k in numeric)
        rank = (others, distance, -trial.number)
        if best is None or rank < best:
            best = rank
    return None if best is None else -best[2]


def _build(kind_of: str, table: Mapping[str, type], settings: Mapping[str, Any] | None, default: str, **extra: Any) -> Any:
    settings = dict(settings or {})
    kind = str(settings.pop("kind", default))
    if kind not in table:
        raise SweeperSettingError(f"hydra.sweeper.{kind_of}.kind={kind!r}: one of {', '.join(table)}")
    try:
        return table[kind](**settings, **extra)
    except (TypeError, ValueError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SweeperSettingError(f"hydra.sweeper.{kind_of} ({kind}): {message}") from None


def build_sampler(settings: Mapping[str, Any] | None, seed: int | None) -> optuna.samplers.BaseSampler:
    """The sampler of ``hydra.sweeper.sampler`` (``kind``: tpe or random; the other keys are the
    sampler's arguments), seeded with ``seed``."""
    return _build("sampler", SAMPLERS, settings, "tpe", seed=seed)


def build_pruner(settings: Mapping[str, Any] | None) -> optuna.pruners.BasePruner:
    """The pruner of ``hydra.sweeper.pruner`` (``kind``: one of :data:`PRUNERS`; the other keys are
    the pruner's arguments; steps are training iterations). ``kind: none`` takes no arguments: those
    a pruner group left beside it (``hydra.sweeper.pruner.kind=none`` over the median's) are ignored."""
    if not prunes(settings):
        return optuna.pruners.NopPruner()
    return _build("pruner", PRUNERS, settings, "none")


def prunes(settings: Mapping[str, Any] | None) -> bool:
    """Whether ``hydra.sweeper.pruner`` prunes at all (kind other than none)."""
    return str(dict(settings or {}).get("kind", "none")) != "none"


def check_strength(space: SearchSpace) -> None:
    """The space does not search (or fix) ``trainer.strength`` while fixing ``trainer.c1`` or
    ``trainer.c2``: every trial would train with the fixed value whatever strength TPE is told it
    tried (:func:`pipeline.engine.validate.strength_conflict`)."""
    from pipeline.engine.validate import strength_conflict

    conflict = strength_conflict([*space.fixed, *(f"{key}=<searched>" for key in space.distributions)])
    if conflict:
        raise SweeperSettingError(f"{conflict} (to search c1 or c2 instead, drop the default space: '~hydra.sweeper.params')")


def check_objective(metric: str | None, direction: str, pruner: Mapping[str, Any] | None, dev_every: int | None) -> None:
    """The objective and pruning settings agree: a known direction; the dev score (``metric``
    null, or ``<stage>.dev_f1``/``<stage>.dev_accuracy``) is maximised, and so is any score,
    while an error, rate or cost is minimised (:func:`metric_direction`); pruning compares the dev
    score during training, so it needs that metric and dev scores (``train.dev_every`` > 0)."""
    if direction not in ("maximize", "minimize"):
        raise SweeperSettingError(f"hydra.sweeper.direction={direction!r}: maximize or minimize")
    if metric is not None and (not isinstance(metric, str) or "." not in metric):
        raise SweeperSettingError(f"hydra.sweeper.metric={metric!r}: a job's metric as <stage>.<name>, e.g. evaluate.dev_f1")
    if metric is not None:
        from pipeline.engine.runner import summary_key
        from pipeline.engine.stage import load_stages

        if summary_key(metric) is None:  # the sweep's summary ranks the jobs by their pipeline runs' metrics
            shown = ", ".join(name for name, stage in load_stages().items() if stage.summary_prefix is not None)
            raise SweeperSettingError(f"hydra.sweeper.metric={metric}: a metric of one of the stages {shown}, as <stage>.<name>")
    stage, _, name = (metric or ".").rpartition(".")
    if "test" in name.split("_"):  # test_f1, aulc_test, test_f1_crf: scores on the test set
        raise SweeperSettingError(
            f"hydra.sweeper.metric={metric}: a score on the test set, which a search must not see (the chosen model's "
            "test score would be optimistic, and it would be registered by it): optimise a dev score (null: the dev "
            "score, or e.g. evaluate.dev_accuracy) and report the chosen job's test score"
        )
    dev_score = metric is None or metric.rsplit(".", 1)[1] in DEV_SCORES
    if dev_score and direction != "maximize":
        raise SweeperSettingError(f"hydra.sweeper.direction={direction}: the dev score ({metric or 'default'}) is maximised")
    better = metric_direction(name) if metric is not None else None
    if better is not None and direction != better:  # the sweep would choose (and register) the worst job
        raise SweeperSettingError(
            f"hydra.sweeper.direction={direction}: {metric} is {'maximised' if better == 'maximize' else 'minimised'} "
            f"({'a score: higher' if better == 'maximize' else 'an error, rate or cost: lower'} is better); set "
            f"hydra.sweeper.direction={better}"
        )
    if prunes(pruner):
        if not dev_score:
            raise SweeperSettingError(
                f"hydra.sweeper.pruner compares the dev score during training, but the metric is {metric}: "
                "choose hydra/sweeper/pruner=none (or set hydra.sweeper.pruner.kind=none) or optimise the dev score"
            )
        if not dev_every:
            raise SweeperSettingError("pruning needs dev scores during training: set train.dev_every > 0 (e.g. 10)")


def _quoted(storage: object) -> str:
    """The storage setting as a refusal quotes it: a URL's user and password hidden (:func:`shown_url`)."""
    return repr(shown_url(storage)) if isinstance(storage, str) else repr(storage)


def storage_url(storage: str | None, output_dir: str | Path) -> str:
    """The study's storage: ``storage`` when given (a SQLAlchemy URL: ``sqlite:///...``,
    ``postgresql+psycopg://...``), else ``sqlite:///<output_dir>/optuna.db`` beside the MLflow
    store; a relative SQLite path is made absolute (the jobs may run in other folders), and a given
    one must be in an existing folder or the output folder (``output_dir``, which the run makes)."""
    url = storage or f"sqlite:///{Path(output_dir).absolute() / 'optuna.db'}"
    if not isinstance(url, str) or "://" not in url:
        raise SweeperSettingError(
            f"hydra.sweeper.storage={_quoted(storage)}: a database URL such as sqlite:////abs/path/optuna.db"
        )
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if path in ("", ":memory:"):
            raise SweeperSettingError(
                f"hydra.sweeper.storage={_quoted(storage)}: the jobs cannot reach an in-memory study; name a file"
            )
        folder = Path(os.path.abspath(path)).parent
        made = Path(os.path.abspath(output_dir))  # the run's output folder, made by the run
        if storage and not folder.exists() and folder != made:  # a misspelt path would be made, folders and all
            raise SweeperSettingError(
                f"hydra.sweeper.storage={_quoted(storage)}: the folder {folder} does not exist; create it or name another"
            )
        url = f"sqlite:///{Path(path).absolute()}"
    elif url.startswith("sqlite:"):
        raise SweeperSettingError(f"hydra.sweeper.storage={_quoted(storage)}: a SQLite study lives in a file (sqlite:///<path>)")
    return url


def _same_database(first: str, second: str) -> bool:
    """Whether two SQLAlchemy URLs name one database (one SQLite file, or one server's database
    whatever the driver); False for what is no database URL (an ``http://`` tracking server)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        a, b = make_url(first), make_url(second)
    except (ArgumentError, ValueError):
        return False
    if a.get_backend_name() != b.get_backend_name():
        return False
    if a.get_backend_name() == "sqlite":
        if not (a.database and b.database):
            return False
        first_file, second_file = Path(a.database), Path(b.database)
        if first_file.exists() and second_file.exists():
            return first_file.samefile(second_file)  # a hard link or a symbolic one to the same file too
        return first_file.resolve() == second_file.resolve()
    return (a.host, a.port, a.database) == (b.host, b.port, b.database)


def check_storage_apart(url: str, stores: Mapping[str, str]) -> None:
    """Refuse (one line) a study storage ``url`` that is the database of one of MLflow's ``stores``
    ({what: URI}): Optuna's tables and schema version would break that store for good."""
    for what, uri in stores.items():
        if _same_database(url, uri):
            raise SweeperSettingError(
                f"hydra.sweeper.storage={shown_url(url)}: is the database of MLflow's {what} store, which Optuna's tables "
                "would break; name another database (by default the study lives in optuna.db beside the store)"
            )


# the tables every Optuna storage has: a database holding others and not these is another program's
OPTUNA_TABLES = frozenset({"studies", "trials", "version_info"})


def check_storage_is_optunas(url: str) -> None:
    """Refuse (one line) a study storage ``url`` that is an existing SQLite file Optuna would write
    its tables into though it is no Optuna storage: another kind of file, or another program's
    database (another MLflow store's, say), which Optuna would change for good before its own
    version check failed."""
    from pipeline.tracking import sqlite_contents, sqlite_path

    database = sqlite_path(url)
    if database is None:
        return
    database = Path(os.path.realpath(database))
    if not database.is_file() or database.stat().st_size == 0:
        return
    try:
        tables, _ = sqlite_contents(database)
    except ValueError as error:
        raise SweeperSettingError(f"hydra.sweeper.storage: {error}; name a study's storage or a new file") from None
    if tables and not OPTUNA_TABLES <= tables:
        raise SweeperSettingError(
            f"hydra.sweeper.storage: {database} is another program's database (tables {', '.join(sorted(tables)[:4])}, ...; "
            "an MLflow store, say), not an Optuna storage, and Optuna would write its tables into it; name a study's "
            "storage or a new file"
        )


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's SQL storage at ``url``; a SQLite file (and its folder) is created if new, and waits
    up to a minute for a lock (the sweeper and its jobs write to it at the same time)."""
    engine: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        engine = {"connect_args": {"timeout": 60}}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine)

"""Check every job of a sweep before the first one runs.

Hydra's basic sweeper composes the jobs of a batch and launches them; a job whose setting cannot
work (``trainer.c2=nan`` among ``trainer.c2=0.1,nan``, ``data.final_fit=nosuch``, a config group
option that does not exist) would fail only when its turn comes, after the jobs before it trained,
and Hydra would end the sweep with a traceback. Here the sweep's jobs are expanded and composed as
the sweeper will do it, and each one is checked as its run would check it before its first stage
(:func:`check_job`: the stages the run will run, chosen as the runner chooses them, and their own
checks; nothing is read, written or logged): a refused setting ends the multirun before the sweep's
parent run exists, with one line naming the job and the setting (exit code 2), as a bad setting
ends a single run. The Optuna sweeper checks its trials' settings with the same :func:`check_job`.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.engine.validate import SettingsError, finite_number, renamed_key_hint
from pipeline.report import shown_override

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
GRID_SWEEPERS = (
    BASIC_SWEEPER,
    "hydra_plugins.crf_grid_sweeper.grid_sweeper.GridSweeper",
)  # the project's default is a BasicSweeper


def composition_problem(error: BaseException) -> str:
    """Hydra's (multi-line) error on composing a config as one line: its first line and, for a
    missing config group option, the group's options (``Could not find 'trainer/nosuch'
    (options of trainer: base, lbfgs, ...)``), for a key the config lacks, where a ``+`` may add it
    (Hydra's advice to use one is refused in most sections), or OmegaConf's, prefixed by the key it
    names, without the search path and the hint on HYDRA_FULL_ERROR."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    first, options, group = lines[0], [], None
    for line in lines[1:]:
        if line.startswith("Available options in"):
            group = line.removeprefix("Available options in").strip(" :'")
        elif line.startswith(("Config search path", "Set the environment variable")):
            break
        elif group is not None and not line.startswith("provider="):
            options.append(line)
    if group is not None:
        return f"{first} (options of {group}: {', '.join(options)})"
    if first.startswith("Could not override") and len(lines) > 1 and lines[1].startswith("To append"):  # a key the config lacks
        plus = lines[1].removeprefix("To append to your config use").strip()  # Hydra's advice, true only in some sections
        key = first.partition("'")[2].partition("'")[0]
        if renamed_key_hint(key):
            return f"{first.rstrip('.')}: the config has no such key{renamed_key_hint(key)}"
        return (
            f"{first.rstrip('.')}: the config has no such key (a misspelling?); {plus} adds it only where new keys are "
            "taken (a model's own parameters, feature views and lexicons, a dataset's optional keys)"
        )
    where = next((line.removeprefix("full_key:").strip() for line in lines[1:] if line.startswith("full_key:")), "")
    return f"{where}: {first}" if where and where not in first else first


# settings a sweep cannot vary: its parent run and its jobs' runs go to one tracking store
UNSWEPT = ("tracking.uri",)


def flag_order_problem(argv: list[str]) -> str | None:
    """One line, quoting no value, when a flag (``-m``) stands between settings: Hydra's argument
    parser takes the settings after it for unknown arguments and prints them whole (a URL's
    password too) in its usage error; else None."""
    settings = [i for i, arg in enumerate(argv) if not arg.startswith("-")]
    flags = [i for i, arg in enumerate(argv) if arg.startswith("-")]
    if settings and any(settings[0] < i < settings[-1] for i in flags):
        return "bad command line: put -m (and any other flag) before the settings: python -m <app> -m key=value ..."
    return None


def sweep_override_problem(config_name: str, argv: list[str], overrides: list[Any], fixed: list[str]) -> str | None:
    """Why a command line's sweep overrides (``a,b``, ``range()``, ``choice()``; ``overrides``
    parsed by Hydra's ``OverridesParser``, ``fixed`` the others' input lines) cannot run, in one
    line that quotes no value (a comma may be part of a password), or None: one in a run of app
    ``config_name`` that is no multirun (no ``-m`` in ``argv``, no ``hydra.mode: MULTIRUN`` as the
    experiments set; Hydra prints the value in an "Ambiguous value" message), or a sweep over a
    setting of :data:`UNSWEPT`. Call inside Hydra's ``initialize_config_dir``."""
    from hydra import compose
    from hydra.types import RunMode

    swept = [override for override in overrides if override.is_sweep_override()]
    if not swept:
        return None
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    if not multirun:
        configured = compose(config_name, overrides=fixed, return_hydra_config=True)
        multirun = OmegaConf.select(configured, "hydra.mode") == RunMode.MULTIRUN
    for override in swept:
        key = override.key_or_group
        if not multirun:
            return (
                f"bad setting {key}: its value is a list of values (a comma, range() or choice()), which only a sweep (-m) "
                f"takes; to give one value with a comma in it, quote it ({key}='\"...\"') or escape the comma (\\,)"
            )
        if key in UNSWEPT:
            return f"bad setting {key}: a sweep's runs all go to one tracking store; run one sweep per store"
    return None


MAX_RANGE = 100_000  # values of a range that is listed (a grid's, an Optuna choice of floats): more is a typo


def range_problem(key: str, sweep: Any, limit: int | None = MAX_RANGE) -> str | None:
    """A one-line problem with ``range(start, stop, step)`` of ``key`` (Hydra's ``RangeSweep``):
    a step of 0 or an end that is not a finite number (Hydra would raise, or count forever), no
    value at all (a sweep of no jobs), or more than ``limit`` values (None: no limit); None when
    it is a range to sweep."""
    ends = (sweep.start, sweep.stop, sweep.step)
    text = f"{key}=range({', '.join(str(v) for v in ends)})"
    if not all(finite_number(v) for v in ends):
        return f"bad sweep {text}: start, stop and step must be finite numbers"
    if sweep.step == 0:
        return f"bad sweep {text}: the step must not be 0"
    count = (sweep.stop - sweep.start) / sweep.step
    if count <= 0:
        return f"bad sweep {text}: it has no values (range stops before stop, as Python's does)"
    if limit is not None and not count <= limit:  # count may overflow to inf
        return f"bad sweep {text}: {count:,.0f} values, more than the {limit:,} a sweep lists"
    return None


def grid_jobs(config: DictConfig, loader: Any = None) -> list[list[str]]:
    """The overrides of each job the basic sweeper will launch for ``config`` (the multirun's
    config, with ``hydra``): its ``hydra.sweeper.params`` and the command line's overrides,
    expanded as :meth:`BasicSweeper.split_arguments` does (``loader``, Hydra's config loader,
    expands ``glob(...)`` of a config group's options).

    Raises
    ------
    SettingsError
        One line, when the sweep cannot be expanded (``range(0, 1, 0)``, ``interval(...)``, which
        a grid cannot take) or has no job.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep, RangeSweep

    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += list(OmegaConf.select(config, "hydra.overrides.task", default=None) or [])
    try:
        overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
        for override in overrides:
            key, sweep = override.get_key_element(), override.value()
            if override.is_sweep_override() and isinstance(sweep, IntervalSweep):
                raise SettingsError(
                    f"bad sweep {key}=interval({sweep.start:g}, {sweep.end:g}): a grid (Hydra's basic sweeper) runs listed "
                    "values; an interval is searched by hydra/sweeper=optuna"
                )
            problem = range_problem(key, sweep) if override.is_sweep_override() and isinstance(sweep, RangeSweep) else None
            if problem:
                raise SettingsError(problem)
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except SettingsError:
        raise
    except Exception as error:  # Hydra's own errors are multi-line: keep the first line
        raise SettingsError(f"bad sweep: {composition_problem(error)}") from None
    if not jobs:
        raise SettingsError("bad sweep: it has no job")
    return jobs


def check_job(loader: Any, config: DictConfig, overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """Compose the job of a multirun with ``overrides`` as its sweeper will (``loader``: Hydra's
    config loader, ``config``: the multirun's config) and check it as its run will check it before
    its first stage: the stages it will run and their own checks
    (:func:`pipeline.engine.runner.validated_plan`; a regularisation path's too).

    Returns
    -------
    tuple
        (the job's composed config, the names of the stages it will run, in order).

    Raises
    ------
    SettingsError
        One line: the job cannot be composed (a config group option that does not exist) or a
        setting of it cannot work.
    """
    from pipeline.engine.runner import validated_plan
    from pipeline.sweeps.path import check_path, path_job

    try:
        job = loader.load_sweep_config(config, list(overrides))
    except Exception as error:
        raise SettingsError(f"cannot compose the job: {composition_problem(error)}") from None
    check = (lambda adapter, order: check_path(job, adapter, order)) if path_job(job) else None
    _, _, order = validated_plan(job, check)
    return job, order


def check_grid_jobs(config: DictConfig) -> list[tuple[list[str], DictConfig]] | None:
    """Exit (code 2, one line) if a job of the basic sweeper's grid cannot be composed or has a
    setting that cannot work (:func:`check_job`), or the grid cannot be expanded.

    Returns
    -------
    list of (list of str, DictConfig), or None
        Each job's overrides and composed config, in the sweep's order (a job whose check itself
        failed is left out: it checks its settings again as it starts); None for other sweepers, or
        outside a Hydra app (no config loader to compose jobs).
    """
    from hydra.core.global_hydra import GlobalHydra

    if OmegaConf.select(config, "hydra.sweeper._target_", default=None) not in GRID_SWEEPERS:
        return None
    hydra = GlobalHydra.instance()
    if not hydra.is_initialized():
        return None
    loader = hydra.config_loader()
    try:
        jobs = grid_jobs(config, loader)
    except SettingsError as error:
        log.error("%s; no job was run", error)
        sys.exit(2)
    composed, checked = [], []
    for number, job in enumerate(jobs):
        try:
            checked.append((list(job), *check_job(loader, config, list(job))))
            composed.append(checked[-1][:2])
        except SettingsError as error:
            log.error("sweep job #%d (%s): %s; no job was run", number, " ".join(map(shown_override, job)), error)
            sys.exit(2)
        except Exception as error:  # a fault of the check itself: the job checks its settings again as it starts
            log.warning(
                "sweep job #%d (%s) not checked: %s: %s", number, " ".join(map(shown_override, job)), type(error).__name__, error
            )
    unread = unread_sweep_keys(checked)
    if unread:
        log.error("%s; no job was run", unread)
        sys.exit(2)
    return composed


#: the config sections whose keys change a job's fit through the stages that read them (their
#: config slices and settings); the others (tracking, registry, paths, path, hydra, ...) act
#: outside the stages
FIT_SECTIONS = (
    "data",
    "dataset",
    "features",
    "model",
    "trainer",
    "seed",
    "featurize",
    "train",
    "evaluate",
    "active_learning",
    "semi",
)


def job_fingerprint(job: DictConfig, order: list[str]) -> str:
    """What the stages ``order`` of ``job`` (a composed config) read
    (:func:`pipeline.engine.runner.stage_reads`; a regularisation path's: its points', each with
    its own ``trainer.strength``) as one JSON text: two jobs with the same fingerprint make the same
    fits (the second's are the first's cache entries)."""
    from pipeline.engine.runner import stage_reads
    from pipeline.engine.stage import load_adapter, load_stages
    from pipeline.sweeps.path import path_job, path_strengths, point_config

    adapter, stages = load_adapter(job.model), load_stages()
    points = [point_config(job, strength) for strength in path_strengths(job)] if path_job(job) else [job]
    return json.dumps([stage_reads(point, adapter, stages, order) for point in points], sort_keys=True, default=str)


def unread_sweep_keys(jobs: list[tuple[list[str], DictConfig, list[str]]], kind: str = "sweep", runs: str = "jobs") -> str | None:
    """The problem (one line) of a ``kind`` of sweep whose ``jobs`` (overrides, composed config,
    the stages it runs; ``runs`` in the message) differ in a key of :data:`FIT_SECTIONS` that no
    stage of theirs reads: every two jobs that differ only in it have the same
    :func:`job_fingerprint` (``trainer.c2`` or ``features`` with ``model=hmm``), so they would be the
    same fit; None if there is none."""
    settings = [dict(override.partition("=")[::2] for override in overrides) for overrides, _, _ in jobs]
    fingerprints: list[str | None] = []
    for _, job, order in jobs:
        try:
            fingerprints.append(job_fingerprint(job, order))
        except Exception:  # a stage that cannot slice this job: its own check says why when it runs
            fingerprints.append(None)
    unread: dict[str, tuple[DictConfig, list[str]]] = {}  # key -> a job that does not read it
    for key in dict.fromkeys(key for values in settings for key in values):
        if key.lstrip("+~").split(".")[0].split("/")[0] not in FIT_SECTIONS:
            continue
        groups: dict[str, dict[str, str | None]] = {}  # the other keys' values -> {this key's value: fingerprint}
        first: dict[str, int] = {}  # the other keys' values -> the first job with them
        for number, (values, fingerprint) in enumerate(zip(settings, fingerprints)):
            others = json.dumps(sorted((k, v) for k, v in values.items() if k != key))
            groups.setdefault(others, {})[values.get(key, "")] = fingerprint
            first.setdefault(others, number)
        compared = [others for others, group in groups.items() if len(group) > 1]
        if compared and all(None not in groups[o].values() and len(set(groups[o].values())) == 1 for o in compared):
            unread[key] = jobs[first[compared[0]]][1:]
    if not unread:
        return None
    from pipeline.sweeps.path import path_job

    job, order = next(iter(unread.values()))
    points = ", at each point of path.strengths" if path_job(job) else ""
    return (
        f"the {kind} over {', '.join(unread)}: {runs} that differ only there would be the same fit, as no stage they run "
        f"({', '.join(order)}, with model={job.model.name}{points}) reads {'it' if len(unread) == 1 else 'them'}"
    )

"""The Hydra apps beside the pipeline: the tag command and the benchmarks (``python -m pipeline.<app>`` shims run them)."""

from __future__ import annotations

import difflib
import itertools
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def added_setting(cfg: DictConfig, what: str) -> str | None:
    """Why a ``+key=value`` on the command line of app ``what`` is refused, or None: an app's
    settings all exist in its config, so an added one is a misspelling that would be ignored
    (``+marginal=true`` for ``marginals``, ``+benchmark.repetiton=5``)."""
    from pipeline.engine.validate import command_line

    for override in command_line(cfg):
        key = override.lstrip("+").split("=", 1)[0].strip()
        if override.startswith("+") and not override.startswith("++") and not key.startswith("hydra.") and "/" not in key:
            parent, _, name = key.rpartition(".")
            siblings = OmegaConf.select(cfg, parent, default=None) if parent else cfg
            known = [str(k) for k in (siblings.keys() if isinstance(siblings, DictConfig) else []) if k != name]
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {parent + '.' if parent else ''}{near[0]}?" if near else ""
            return f"bad setting +{key}: {what} has no such setting{hint}"
    return None


CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
_ABSENT = object()


MAX_JOBS_CHECKED = 64  # a multirun's jobs composed and checked before the first runs


def exit_if_uncomposable(config_name: str, argv: list[str], check: Callable[[DictConfig], None] | None = None) -> None:
    """Before Hydra runs app ``config_name``: a command line that cannot be composed with its config
    (a key the config lacks, ``marginal=true`` for ``marginals``; an option a config group lacks; an
    override that does not parse), or whose settings ``check`` refuses, ends the command in one
    line with exit status 2, where Hydra would print several lines and exit 1. With ``-m`` every
    job of the sweep (its first :data:`MAX_JOBS_CHECKED`) is composed and checked, so that none
    runs before a later one is refused. A command line with another flag (``--cfg``, ``--help``) is
    left to Hydra."""
    if any(arg.startswith("-") and arg not in ("-m", "--multirun") for arg in argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pipeline.report import redacted, shown_override
    from pipeline.sweeps.grid_preflight import composition_problem, flag_order_problem, sweep_override_problem

    misplaced = flag_order_problem(argv)
    if misplaced:
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("%s", misplaced)
        sys.exit(2)
    arguments = [arg for arg in argv if not arg.startswith("-")]
    GlobalHydra.instance().clear()
    problem = None
    try:
        overrides = OverridesParser.create().parse_overrides(arguments)
        fixed = [o.input_line for o in overrides if not o.is_sweep_override()]
        swept = [
            [f"{o.input_line.split('=', 1)[0]}={v}" for v in o.sweep_string_iterator()]
            for o in overrides
            if o.is_sweep_override()
        ]
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            base = compose(config_name)
            problem = sweep_override_problem(config_name, argv, overrides, fixed)
            jobs = itertools.islice(itertools.product(*swept), MAX_JOBS_CHECKED if problem is None else 0)
            for number, job in enumerate(jobs):
                cfg = compose(config_name, overrides=fixed + list(job), return_hydra_config=True)
                where = f" (job #{number}: {' '.join(map(shown_override, job))})" if swept else ""
                problem = _added_key(base, fixed + list(job)) or added_setting(cfg, "the command")
                if problem is None and check is not None:
                    try:
                        check(cfg)
                    except ValueError as error:
                        problem = _without_prefix(str(error))
                if problem:
                    problem += where
                    break
    except Exception as error:
        problem = composition_problem(error).split("; +", 1)[0]  # a '+' adds nothing an app reads
    finally:
        GlobalHydra.instance().clear()
    if problem:
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("bad setting: %s", redacted(_without_prefix(problem)))  # a store's URL may hold a password
        sys.exit(2)


def _without_prefix(problem: str) -> str:
    """``problem`` without a leading ``bad setting`` (with or without its colon)."""
    return problem.removeprefix("bad setting: ").removeprefix("bad setting ")


def tracked(check: Callable[[DictConfig], None], model_setting: str | None = None) -> Callable[[DictConfig], None]:
    """The settings check of a command that logs to MLflow: ``check``, then the tracking store (and,
    for a command that reads the model ``model_setting`` names, the registry's store, which must
    hold one when that is a ``models:/`` URI: :func:`pipeline.tracking.stores_problem`) and the
    dataset's files (found or downloaded: :func:`pipeline.stages.data.config_data_problem`; and
    what their checksums say: :func:`pipeline.stages.data.checksum_problem`), each refused in one
    line (ValueError)."""

    def checked(cfg: DictConfig) -> None:
        check(cfg)
        from pipeline.engine.validate import SettingsError
        from pipeline.stages.data import checksum_problem, config_data_problem
        from pipeline.tracking import registry_uri, stores_problem, tracking_uri

        model = str(OmegaConf.select(cfg, model_setting, default="")) if model_setting else ""
        try:
            registry = registry_uri(cfg) if model_setting else None
            problem = stores_problem(tracking_uri(cfg), registry, read_registry=model.startswith("models:/"))
        except SettingsError as error:
            problem = str(error)
        problem = problem or config_data_problem(cfg)
        if not problem and "dataset" in cfg:  # the files are there now: are they the ones the config names?
            problem = checksum_problem(OmegaConf.to_container(cfg.dataset, resolve=True), cfg.data.root)
        if problem:
            raise ValueError(problem)

    return checked


def _added_key(base: DictConfig, overrides: list[str]) -> str | None:
    """Why a ``++key=value`` among ``overrides`` is refused: it adds a key ``base`` lacks, without a word."""
    for override in overrides:
        key = override.lstrip("+").split("=", 1)[0].strip()
        missing = OmegaConf.select(base, key, default=_ABSENT) is _ABSENT
        if override.startswith("++") and not key.startswith("hydra.") and "/" not in key and missing:
            return f"{override}: the config has no such key (a misspelling?)"
    return None


def run_checked(check: Callable[[DictConfig], None], main: Callable[[DictConfig], None], cfg: DictConfig) -> None:
    """``main(cfg)`` once ``check(cfg)`` passes and no setting was added with ``+``
    (:func:`added_setting`); a setting refused (ValueError) ends the command first, in one line
    with exit status 2, before any run opens."""
    try:
        problem = added_setting(cfg, "the command")
        if problem:
            raise ValueError(problem)
        check(cfg)
    except ValueError as error:
        from pipeline.report import redacted

        text = redacted(str(error))  # a store's URL may hold a password
        log.error("%s", text if text.startswith("bad setting") else f"bad setting {text}")
        sys.exit(2)
    main(cfg)

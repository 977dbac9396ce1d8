"""The Hydra apps beside the pipeline: the tag command and the benchmarks (``python -m pipeline.<app>`` shims run them)."""

from __future__ import annotations

import difflib
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


def exit_if_uncomposable(config_name: str, argv: list[str]) -> None:
    """Before Hydra runs app ``config_name``: a command line that cannot be composed with its config
    (a key the config lacks, ``marginal=true`` for ``marginals``; an option a config group lacks; an
    override that does not parse) ends the command in one line with exit status 2, where Hydra
    would print several lines and exit 1. A command line with a flag (``--cfg``, ``--help``) is
    left to Hydra."""
    if any(arg.startswith("-") for arg in argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from pipeline.report import redacted
    from pipeline.sweeps.grid_preflight import composition_problem

    GlobalHydra.instance().clear()
    problem = None
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            compose(config_name, overrides=list(argv))
            base = compose(config_name)
        for override in argv:  # ++key=value adds a key the config lacks, without a word
            key = override.lstrip("+").split("=", 1)[0].strip()
            missing = OmegaConf.select(base, key, default=_ABSENT) is _ABSENT
            if override.startswith("++") and not key.startswith("hydra.") and "/" not in key and missing:
                problem = f"{override}: the config has no such key (a misspelling?)"
    except Exception as error:
        problem = composition_problem(error).split("; +", 1)[0]  # a '+' adds nothing an app reads
    finally:
        GlobalHydra.instance().clear()
    if problem:
        logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        log.error("bad setting: %s", redacted(problem))  # a store's URL may hold a password
        sys.exit(2)


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
        text = str(error)
        log.error("%s", text if text.startswith("bad setting") else f"bad setting {text}")
        sys.exit(2)
    main(cfg)

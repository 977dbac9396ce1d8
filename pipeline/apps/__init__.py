"""The Hydra apps beside the pipeline: the tag command and the benchmarks (``python -m pipeline.<app>`` shims run them)."""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def added_setting(cfg: DictConfig, what: str) -> str | None:
    """Why a ``+key=value`` on the command line of app ``what`` is refused, or None: an app's
    settings all exist in its config, so an added one is a misspelling that would be ignored
    (``+marginal=true`` for ``marginals``, ``+benchmark.repetiton=5``)."""
    from pipeline.engine.validate import command_line

    for override in command_line(cfg):
        key = override.lstrip("+").split("=", 1)[0].strip()
        if override.startswith("+") and not key.startswith("hydra.") and "/" not in key:  # "/": a config group
            parent, _, name = key.rpartition(".")
            siblings = OmegaConf.select(cfg, parent, default=None) if parent else cfg
            known = [str(k) for k in (siblings.keys() if isinstance(siblings, DictConfig) else []) if k != name]
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {parent + '.' if parent else ''}{near[0]}?" if near else ""
            return f"bad setting +{key}: {what} has no such setting{hint}"
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
        text = str(error)
        log.error("%s", text if text.startswith("bad setting") else f"bad setting {text}")
        sys.exit(2)
    main(cfg)

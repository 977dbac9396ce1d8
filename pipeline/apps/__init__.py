"""The Hydra apps beside the pipeline: the tag command and the benchmarks (``python -m pipeline.<app>`` shims run them)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from omegaconf import DictConfig

log = logging.getLogger(__name__)


def run_checked(check: Callable[[DictConfig], None], main: Callable[[DictConfig], None], cfg: DictConfig) -> None:
    """``main(cfg)`` once ``check(cfg)`` passes; a setting it refuses (ValueError) ends the command
    first, in one line with exit status 2, before any run opens."""
    try:
        check(cfg)
    except ValueError as error:
        text = str(error)
        log.error("%s", text if text.startswith("bad setting") else f"bad setting {text}")
        sys.exit(2)
    main(cfg)

"""Log records that say which job of a multirun wrote them.

``JobContext`` is a logging filter (wired into ``conf/hydra/job_logging/pipeline.yaml``) that
sets ``record.job``: empty in a single run; in a multirun job `` [#<hydra.job.num> <swept
values>]``, where the swept values are the job's overrides whose keys the sweep varies (the
sweeper's ``params`` and the command line's sweep overrides, read from the sweep's
``multirun.yaml``). So the progress lines of parallel jobs can be told apart in one console.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from pipeline.report import redacted, shown_override


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


# settings that never change a run's result (where files are, how runs are tracked, threads, the
# dev-score cadence) and the config groups its name already shows: not part of a run's name
UNNAMED = (
    "paths",
    "tracking",
    "hydra",
    "registry",
    "force",
    "data.root",
    "data.download",
    "dataset.files",
    "trainer.threads",
    "train.dev_every",
)
IN_NAME = ("dataset", "model", "trainer")  # the name starts <dataset>-<model>-<trainer>


def named_overrides(
    overrides: Sequence[str], keys: Collection[str] | None = None, reads: Callable[[str], bool] | None = None
) -> list[str]:
    """What a run's name shows of its overrides: ``strength=0.3`` for ``trainer.strength=0.3`` (the
    key's last part, as in ``hydra.job.override_dirname``).

    Parameters
    ----------
    overrides : sequence of str
        Hydra overrides, ``key=value`` (``+``/``~`` prefixes allowed).
    keys : collection of str, optional
        Show only overrides of these keys (a multirun job: the swept keys). None: every override
        but those of :data:`UNNAMED` and the config groups of :data:`IN_NAME` (a single run).
    reads : callable, optional
        ``reads(key)``: whether the run reads the setting (:func:`pipeline.engine.runner.setting_reader`);
        an override of a setting it does not read (an HMM's ``trainer.strength``) is not shown.

    Returns
    -------
    list of str
        ``last-part-of-key=value``, in the order given.
    """
    shown = []
    for override in overrides:
        if "=" not in override:
            continue
        key, value = override.split("=", 1)
        key = key.lstrip("+~")
        if reads is not None and not reads(key):
            continue
        if keys is not None:
            if key not in keys:
                continue
        elif key in IN_NAME or any(key == k or key.startswith(k + ".") for k in UNNAMED):
            continue
        shown.append(shown_override(key.rsplit(".", 1)[-1] + "=" + value))  # a URL's secret hidden
    return shown


def name_overrides(reads: Callable[[str], bool] | None = None) -> list[str]:
    """The overrides a pipeline run's name shows (:func:`named_overrides`, with ``reads``): in a
    Hydra multirun job the swept ones (what differs between the sweep's jobs); in a single
    ``python -m pipeline`` run those of its command line that can change its result; else (no
    Hydra app) none."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return []
    hydra_cfg = HydraConfig.get()
    task = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return named_overrides(task, swept_keys(hydra_cfg), reads)
    return named_overrides(task, reads=reads)


def swept_keys(hydra_cfg) -> set[str]:
    """Keys a multirun varies: the sweeper's params and the sweep overrides of its command line."""
    keys = set((OmegaConf.select(hydra_cfg, "sweeper.params") or {}).keys())
    multirun = Path(str(hydra_cfg.sweep.dir)) / "multirun.yaml"
    if multirun.is_file():
        from hydra.core.override_parser.overrides_parser import OverridesParser

        task = OmegaConf.select(OmegaConf.load(multirun), "hydra.overrides.task") or []
        parsed = OverridesParser.create().parse_overrides(list(task))
        keys.update(o.key_or_group for o in parsed if o.is_sweep_override())
    return keys


def job_label() -> str:
    """`` [#num swept=values]`` inside a Hydra multirun job, else an empty string."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return ""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return ""
    overrides = list(hydra_cfg.overrides.task)
    keys = swept_keys(hydra_cfg)
    shown = [o for o in overrides if _key(o) in keys] if keys else overrides
    return f" [#{OmegaConf.select(hydra_cfg, 'job.num')} {','.join(map(shown_override, shown))}]"


class JobContext(logging.Filter):
    """Adds ``record.job`` (see the module docstring; a URL's secret in it hidden by
    :func:`job_label`); computed once per configured job."""

    def __init__(self) -> None:
        super().__init__()
        self.label: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.label is None:
            try:
                self.label = job_label()
            except Exception:  # never lose a log line over its label
                self.label = ""
        record.job = self.label
        return True


class Redacted(logging.Filter):
    """Hides a URL's secret in every record a handler writes (:func:`pipeline.report.redacted`):
    also in the lines of Hydra and of other libraries, which quote the command's overrides and
    the URLs they were given (wired into ``conf/hydra/job_logging/pipeline.yaml`` and
    ``conf/hydra/hydra_logging/pipeline.yaml``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: left for the handler to report
            return True
        shown = redacted(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True


class SecretsHidden(Callback):
    """A Hydra callback (``hydra.callbacks.secrets_hidden`` in ``conf/common/default.yaml``, so in
    every app) that hides a URL's secret in a job's overrides as the job ends: Hydra writes them to
    stderr, not through logging, when a job fails ("Error executing job with overrides: [...]"),
    in a single run and in each job of a sweep, wherever its launcher runs it."""

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        job_return.overrides = [shown_override(override) for override in job_return.overrides or ()]

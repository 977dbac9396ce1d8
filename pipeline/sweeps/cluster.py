"""Running a sweep's jobs beyond the launching process (Ray, SLURM through submitit).

Environment variables set in the launching process reach joblib's worker processes but not the
jobs of a Ray cluster or a SLURM allocation. :func:`pass_to_jobs` hands them over through Hydra
itself: it appends ``++hydra.job.env_set.<NAME>=<value>`` to the multirun's Hydra overrides, which
every launcher re-applies when it composes each job's config (``load_sweep_config``), and Hydra's
``run_job`` sets ``hydra.job.env_set`` in the job's environment while the job runs, wherever it runs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, read_write

from pipeline.tracking import SWEEP_ID_VARIABLE, SWEEP_PARENT_VARIABLE

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNSAFE = re.compile(r"['\\$\n]")  # what a quoted Hydra override value cannot hold as is


def job_environment(config: DictConfig, parent_run_id: str, sweep_id: str) -> dict[str, str]:
    """What every job of a multirun needs in its environment: the sweep's parent run and id, and the
    output and data folders as absolute paths of the launching process (their relative defaults
    would otherwise resolve against a Ray worker's or a SLURM job's working directory). A folder
    given on the command line still wins over these (they are only the defaults' variables)."""
    return {
        SWEEP_PARENT_VARIABLE: parent_run_id,
        SWEEP_ID_VARIABLE: sweep_id,
        "CRF_OUTPUT_DIR": str(Path(str(config.paths.output_dir)).absolute()),
        "CRF_DATA_HOME": str(Path(str(config.data.root)).absolute()),
    }


def unpassable(value: object) -> bool:
    """Whether ``value`` cannot reach the jobs' environment (:func:`pass_to_jobs`): it holds ``'``, a
    backslash, ``$`` or a line break, which a quoted Hydra override cannot carry as they are."""
    return _UNSAFE.search(str(value)) is not None


UNPASSABLE = "', \\, $ or a line break"  # what unpassable() finds, for messages


def pass_to_jobs(config: DictConfig, variables: Mapping[str, str]) -> None:
    """Make every job of the multirun whose (master) ``config`` this is run with ``variables`` set in
    its environment. Call it before the sweeper launches (a callback's ``on_multirun_start``)."""
    overrides = []
    for name, value in variables.items():
        if not _NAME.match(name) or unpassable(value):
            raise ValueError(f"cannot pass {name}={value!r} to the jobs: names are identifiers, values without {UNPASSABLE}")
        overrides.append(f"++hydra.job.env_set.{name}='{value}'")
    with read_write(config.hydra.overrides):
        kept = [o for o in config.hydra.overrides.hydra if not any(o.startswith(f"++hydra.job.env_set.{n}=") for n in variables)]
        config.hydra.overrides.hydra = kept + overrides


def _placement() -> dict:
    """Where this process runs: host, PID and, inside a Ray worker, the Ray node id."""
    where = {"host": socket.gethostname(), "pid": os.getpid()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        where["ray_node_id"] = ray.get_runtime_context().get_node_id()
    return where


class JobPlacement(Callback):
    """Records where a multirun ran: ``launcher.json`` in the sweep folder (the launching process)
    and ``placement.json`` in each job's folder (host, PID, Ray node id). Add it with
    ``+hydra.callbacks.placement._target_=pipeline.sweeps.cluster.JobPlacement``."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        folder = Path(str(config.hydra.sweep.dir))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "launcher.json").write_text(json.dumps(_placement()))

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        folder = Path(str(config.hydra.runtime.output_dir))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "placement.json").write_text(json.dumps(_placement()))

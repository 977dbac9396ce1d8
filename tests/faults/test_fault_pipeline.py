"""Fault injection through the real pipeline on the tiny generated corpus: tampered cache entries
are recomputed instead of served, stale temporary folders go, and prepared files and cache keys do
not depend on when or where the pipeline ran."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.cache import MANIFEST  # noqa: E402

STAGES = ("prepare", "featurize", "train", "evaluate")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("faults") / "data", n_train=40, n_test=10)


def _entries(out: Path, stage: str) -> list[Path]:
    """The published entries of ``stage`` (not the temporary or set-aside folders)."""
    folder = out / "cache" / stage
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def _run(data_root: Path, out: Path, *overrides: str) -> dict:
    return run_pipeline(compose_config(tiny_overrides(data_root, out) + list(overrides)))


def _misses(caplog) -> set[str]:
    """Stages the last run computed (from the runner's log)."""
    return {r.getMessage().split("]")[0][1:] for r in caplog.records if "computing" in r.getMessage()}


def _metrics(entry: Path) -> dict:
    return json.loads((entry / "stage_metrics.json").read_text())


def _rerun(data_root: Path, out: Path, caplog) -> tuple[dict, set[str], list[str]]:
    """Run again: (results, stages computed, warnings)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline"):
        results = _run(data_root, out)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return results, _misses(caplog), warnings


def test_tampered_entries_are_recomputed_not_served(data_root, tmp_path, caplog):
    out = tmp_path / "out"
    first = _run(data_root, out)

    # an edited result file: the run reports the real result, not the edited one
    (evaluate,) = _entries(out, "evaluate")
    (evaluate / "stage_metrics.json").write_text(json.dumps({**_metrics(evaluate), "test_f1": 12.5}, indent=1))
    again, computed, warnings = _rerun(data_root, out, caplog)
    assert again["evaluate.test_f1"] == first["evaluate.test_f1"] != 12.5
    assert computed == {"evaluate"}
    assert any(str(evaluate) in w and "stage_metrics.json: " in w for w in warnings)
    assert len(list((out / "cache" / "evaluate").glob(".bad-*"))) == 1

    (train,) = _entries(out, "train")
    (train / "stage_metrics.json").write_text(json.dumps({**_metrics(train), "iterations": 12345}, indent=1))
    again, computed, warnings = _rerun(data_root, out, caplog)
    assert again["train.iterations"] == first["train.iterations"] != 12345
    assert "train" in computed and any(str(train) in w for w in warnings)

    # a corrupted model file (same size, other bytes) in the cache is never handed to evaluate
    (train,) = _entries(out, "train")
    model = bytearray((train / "model.npz").read_bytes())
    model[len(model) // 2] ^= 0xFF
    (train / "model.npz").write_bytes(bytes(model))
    again, computed, warnings = _rerun(data_root, out, caplog)
    assert "train" in computed and any(str(train) in w and "model.npz: content differs" in w for w in warnings)
    assert again["evaluate.test_f1"] == first["evaluate.test_f1"]  # training is deterministic

    # an entry without its manifest (an old failure: "Directory not empty" on every later run)
    (featurize,) = _entries(out, "featurize")
    (featurize / MANIFEST).unlink()
    again, computed, warnings = _rerun(data_root, out, caplog)
    assert "featurize" in computed and any(f"no {MANIFEST}" in w for w in warnings)
    assert again["evaluate.test_f1"] == first["evaluate.test_f1"]
    assert all(len(_entries(out, s)) >= 1 for s in STAGES)
    assert _metrics(_entries(out, "train")[-1])["iterations"] == first["train.iterations"]


def test_stale_temporary_folders_of_a_dead_process_are_removed(data_root, tmp_path):
    out = tmp_path / "out"
    _run(data_root, out, "stages=[prepare]")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    stale = out / "cache" / "prepare" / f".tmp-{'a' * 16}-{child.pid}@{socket.gethostname()}-0123abcd"
    stale.mkdir()
    (stale / "train.conll.gz").write_bytes(b"\x1f\x8b half")
    _run(data_root, out, "stages=[prepare]")
    assert not stale.exists()


def test_prepared_files_and_keys_do_not_depend_on_time_or_folder(data_root, tmp_path):
    def snapshot(out: Path) -> dict:
        (prepare,) = _entries(out, "prepare")
        (featurize,) = _entries(out, "featurize")
        files = {p.name: p.read_bytes() for p in sorted(prepare.glob("*.conll.gz"))}
        return {"prepare": prepare.name, "featurize": featurize.name, "files": files}

    first = tmp_path / "first"
    _run(data_root, first, "stages=[featurize]")
    before = snapshot(first)
    assert set(before["files"]) == {"train.conll.gz", "dev.conll.gz", "test.conll.gz"}
    _run(data_root, first, "stages=[featurize]", "force=true")  # a forced rerun, a second or more later
    assert snapshot(first) == before
    second = tmp_path / "second"
    _run(data_root, second, "stages=[featurize]")  # another output folder
    assert snapshot(second) == before


@pytest.mark.slow
def test_train_and_evaluate_keys_do_not_depend_on_time_or_folder(data_root, tmp_path):
    """Files holding measured times (features.json, history.csv, stage_metrics.json) differ between
    identical runs; the keys of the stages downstream of them must not."""

    def keys(out: Path) -> dict[str, str]:
        return {stage: _entries(out, stage)[-1].name for stage in ("train", "evaluate")}

    first = tmp_path / "first"
    _run(data_root, first)
    before = keys(first)
    features = (_entries(first, "featurize")[0] / "features.json").read_bytes()
    _run(data_root, first, "force=true")  # a forced rerun: every stage computed again, later
    assert (_entries(first, "featurize")[0] / "features.json").read_bytes() != features  # its timings changed
    assert keys(first) == before
    assert all(len(_entries(first, s)) == 1 for s in STAGES)
    second = tmp_path / "second"
    _run(data_root, second)  # another output folder
    assert keys(second) == before


def test_the_sweep_plot_of_jobs_without_a_strength_is_drawn(tmp_path):
    """An HMM sweep has no regularisation strength and no weight count: its summary plot is drawn
    by job, not refused by a log axis (which failed the sweep's parent run after every job)."""
    import numpy as np
    import pandas as pd

    from pipeline.sweeps import summary

    table = pd.DataFrame({"status": ["FINISHED"] * 3, "trainer": ["hmm"] * 3, "strength": [np.nan] * 3,
                          "dev_score": [80.0, 81.5, 79.0], "nonzero_weights": [np.nan] * 3})  # fmt: skip
    summary.plot(table, tmp_path / "sweep.png", "f1")
    assert (tmp_path / "sweep.png").stat().st_size > 0

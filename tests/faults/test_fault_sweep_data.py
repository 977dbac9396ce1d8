"""A sweep whose jobs name data files that no download can provide is refused before its parent run
exists (one line naming the job, exit code 2), as a single run is: its jobs used to find the missing
files one by one, each leaving a FAILED run."""

from __future__ import annotations

import copy
import logging
import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from pipeline_helpers import CONF_DIR, refused_line, tiny_overrides, write_corpus  # noqa: E402

from pipeline.sweeps.callback import SweepTracking, check_sweeper_settings  # noqa: E402
from pipeline.sweeps.grid_preflight import BASIC_SWEEPER  # noqa: E402


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("data"), n_train=10, n_test=5)


def _multirun(root, out, task: list[str], sweeper: str = "basic"):
    """The config Hydra hands to ``on_multirun_start`` for ``python -m pipeline -m <task>`` on the tiny corpus at ``root``."""
    fixed = [t for t in task if "," not in t and "choice(" not in t]
    overrides = [*(["hydra/sweeper=optuna"] if sweeper == "optuna" else []), *tiny_overrides(root, out), *fixed]
    config = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    with open_dict(config):
        config.hydra.overrides.task = [*tiny_overrides(root, out), *task]
        if sweeper == "basic":
            config.hydra.sweeper = {"_target_": BASIC_SWEEPER, "max_batch_size": None, "params": {}}
    return config


@pytest.mark.parametrize("sweeper", ["grid", "basic"])  # the project's default grid sweeper, and Hydra's own
def test_a_grid_job_whose_data_file_is_missing_ends_the_sweep_before_its_parent_run(data_root, tmp_path, caplog, sweeper):
    missing = "dataset.files.train.path=conll2000/train.txt.gz,conll2000/nosuch.txt.gz"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        config = _multirun(data_root, tmp_path / "out", [missing], sweeper)
        if sweeper == "grid":
            assert config.hydra.sweeper._target_ == "hydra_plugins.crf_grid_sweeper.grid_sweeper.GridSweeper"
        line = refused_line(lambda: SweepTracking().on_multirun_start(config), caplog)
    assert line.startswith("sweep job #1 (") and "dataset.files.train.path=conll2000/nosuch.txt.gz" in line, line
    assert f"missing files under data root {data_root}: {data_root / 'conll2000' / 'nosuch.txt.gz'}." in line
    assert line.endswith("; no job was run")
    assert not (tmp_path / "out").exists()  # no store, so no parent run


def test_a_grid_job_whose_data_file_is_a_folder_is_named(data_root, tmp_path, caplog):
    (data_root / "conll2000" / "folder.txt").mkdir(exist_ok=True)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        config = _multirun(data_root, tmp_path / "out", ["dataset.files.test.path=conll2000/folder.txt,conll2000/test.txt.gz"])
        line = refused_line(lambda: check_sweeper_settings(config), caplog)
    assert line.startswith("sweep job #0 (") and "folder.txt" in line and "is a directory" in line, line


def test_an_optuna_sweep_on_missing_data_ends_before_its_parent_run(tmp_path, caplog):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        config = _multirun(tmp_path / "empty", tmp_path / "out", [], sweeper="optuna")
        line = refused_line(lambda: SweepTracking().on_multirun_start(config), caplog)
    assert line.startswith("dataset 'conll2000': missing files under data root") and "no job was run" in line, line
    assert not (tmp_path / "out").exists()  # no store, so no parent run; no study's storage either


def test_sweeps_whose_data_is_there_or_chosen_by_the_sweep_pass(data_root, tmp_path, caplog):
    """A grid on data that is there passes, and so does an Optuna sweep that chooses the data root
    itself: the multirun's own (default) root is not one any job reads, so it is not checked."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None), caplog.at_level(logging.WARNING):
        check_sweeper_settings(_multirun(data_root, tmp_path / "out", ["trainer.c2=0.1,1"]))
        chosen = _multirun(tmp_path / "empty", tmp_path / "out", [], sweeper="optuna")
        with open_dict(chosen):
            chosen.hydra.sweeper.params = {**chosen.hydra.sweeper.params, "data.root": f"choice({data_root},{data_root})"}
        from pipeline.sweeps.callback import check_sweep_data

        check_sweep_data(copy.deepcopy(chosen), None)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


def test_the_sweep_parent_runs_parameters_hide_a_url_secret(data_root, tmp_path):
    """A sweep's parent run logged its shared settings as given: a dataset's download URL with its
    user and password, where the job runs hide them (round 39)."""
    from mlflow.tracking import MlflowClient

    url = "dataset.files.train.url=https://alice:S3CRET@h.example/x"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        config = _multirun(data_root, tmp_path / "out", [url, "trainer.c2=0.1,1"])
        callback = SweepTracking()
        callback.on_multirun_start(config)
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    params = client.get_run(callback.parent_run_id).data.params
    client.set_terminated(callback.parent_run_id, "FINISHED")
    assert params["dataset.files.train.url"] == "https://***@h.example/x", params["dataset.files.train.url"]
    assert not any("S3CRET" in value or "alice" in value for value in params.values())

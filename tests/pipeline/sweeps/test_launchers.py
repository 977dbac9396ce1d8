"""Sweeps through other Hydra launchers: Ray (a real two-node cluster on this machine) and submitit.

The launcher presets of ``conf/hydra/launcher/`` compose; the sweep id and parent run reach every
job through Hydra's ``hydra.job.env_set`` (``pipeline.sweeps.cluster.pass_to_jobs``), not through the
launching process's environment. The Ray test starts a head and a worker node on 127.0.0.1 inside a
network and PID namespace (``unshare``: only loopback, and every process of the cluster dies with
the namespace), runs a multirun there with ``hydra/launcher=ray_cluster`` and checks that each job
ran in a Ray worker (not in the launching process) on both nodes and attached its run to the sweep.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from pipeline_helpers import tiny_overrides, write_corpus  # noqa: E402

from pipeline.sweeps.cluster import job_environment, pass_to_jobs  # noqa: E402

PROJECT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
PLACEMENT = "+hydra.callbacks.placement._target_=pipeline.sweeps.cluster.JobPlacement"


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _compose_hydra(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from pipeline_helpers import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_pass_to_jobs_adds_env_set_overrides_that_compose():
    cfg = _compose_hydra([])
    OmegaConf.set_readonly(cfg.hydra, True)
    pass_to_jobs(cfg, {"CRF_SWEEP_ID": "20261122-072953-a9361d", "CRF_SWEEP_PARENT_RUN_ID": "aa9a38ee"})
    pass_to_jobs(cfg, {"CRF_SWEEP_ID": "20261122-080000-000000"})  # a second call replaces, not repeats
    hydra_overrides = list(cfg.hydra.overrides.hydra)
    assert sum("CRF_SWEEP_ID" in o for o in hydra_overrides) == 1
    job = _compose_hydra(hydra_overrides)  # what load_sweep_config does for each job
    assert job.hydra.job.env_set == {"CRF_SWEEP_PARENT_RUN_ID": "aa9a38ee", "CRF_SWEEP_ID": "20261122-080000-000000"}
    with pytest.raises(ValueError, match="cannot pass"):
        pass_to_jobs(cfg, {"CRF_SWEEP_ID": "a b'"})


def test_jobs_get_the_launching_process_folders_as_absolute_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CRF_OUTPUT_DIR", raising=False)
    cfg = _compose_hydra(["data.root=my data"])
    env = job_environment(cfg, "abc123", "20261122-1")
    assert env["CRF_OUTPUT_DIR"] == str(tmp_path / "outputs") and env["CRF_DATA_HOME"] == str(tmp_path / "my data")
    pass_to_jobs(cfg, env)
    job = _compose_hydra(list(cfg.hydra.overrides.hydra))
    assert job.hydra.job.env_set.CRF_DATA_HOME == str(tmp_path / "my data")


@pytest.mark.skipif(
    not (_has("hydra_plugins.hydra_ray_launcher") and _has("hydra_plugins.hydra_submitit_launcher")), reason="no cluster extra"
)
def test_launcher_presets_compose():
    ray = _compose_hydra(["hydra/launcher=ray_cluster", "hydra.launcher.ray.init.address=10.0.0.1:6379"]).hydra.launcher
    assert ray._target_.endswith("RayLauncher") and ray.ray.init.address == "10.0.0.1:6379"
    assert ray.ray.init.object_store_memory is None and ray.ray.remote.num_cpus == 1
    assert "n_jobs" not in ray
    local = _compose_hydra(["hydra/launcher=ray_local"]).hydra.launcher
    assert local.ray.init.address is None and local.ray.init.num_cpus == 2
    slurm = _compose_hydra(["hydra/launcher=slurm", "hydra.launcher.partition=cpu"]).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher")
    assert (slurm.partition, slurm.cpus_per_task, slurm.mem_gb, slurm.timeout_min) == ("cpu", 1, 4, 120)
    here = _compose_hydra(["hydra/launcher=submitit_here"]).hydra.launcher
    assert here._target_.endswith("LocalLauncher") and here.cpus_per_task == 1
    assert _compose_hydra([]).hydra.launcher.n_jobs == 2  # the default stays joblib, two jobs


def _unshare_works() -> str | None:
    """None if a network + PID namespace can be made here, else why not."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", "ip link set lo up"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"unshare is not permitted here: {probe.stderr.strip()[:200]}"


def _job_folders(out: Path) -> tuple[dict, list[dict]]:
    (sweep_dir,) = (out / "hydra" / "multirun").iterdir()
    launcher = json.loads((sweep_dir / "launcher.json").read_text())
    jobs = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/placement.json"))]
    return launcher, jobs


def _explain(out: Path, jobs: list) -> str:
    """Each job run's status and end reason, and the tail of every job's log: what a failure needs."""
    lines = [f"{j.info.run_name}: {j.info.status} {j.data.tags.get('crf.end_reason', '')}" for j in jobs]
    for log in sorted((out / "hydra" / "multirun").glob("*/*/pipeline.log")):
        lines += [f"--- {log.parent.name}/{log.name}", *log.read_text(errors="replace").splitlines()[-15:]]
    return "\n".join(lines)


def _check_sweep_runs(out: Path, n_jobs: int, finished: int | None = None) -> tuple:
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    (sweep,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'sweep'")
    jobs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    finished = n_jobs if finished is None else finished
    assert len(jobs) == n_jobs
    assert all(j.data.tags["mlflow.parentRunId"] == sweep.info.run_id for j in jobs)
    assert all(j.data.tags["sweep_id"] == sweep.data.tags["sweep_id"] for j in jobs)
    assert sum(j.info.status == "FINISHED" for j in jobs) == finished, _explain(out, jobs)
    assert sweep.data.metrics["jobs_finished"] == finished and "best_test_score" in sweep.data.metrics
    assert "sweep_summary.csv" in {a.path for a in client.list_artifacts(sweep.info.run_id)}
    return sweep, jobs


def _pipeline_command(data_root: Path, out: Path, launcher: list[str], sweep: list[str]) -> list[str]:
    overrides = [o for o in tiny_overrides(data_root, out) if not any(o.startswith(s.split("=")[0] + "=") for s in sweep)]
    return [sys.executable, "-m", "pipeline", "-m", *sweep, *overrides, *launcher, PLACEMENT]


@pytest.mark.slow
def test_sweep_on_a_two_node_ray_cluster(tmp_path):
    reason = _unshare_works()
    if reason:
        pytest.skip(reason)
    if not _has("hydra_plugins.hydra_ray_launcher"):
        pytest.skip("hydra-ray-launcher is not installed (pip install -e .[cluster])")
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    out = tmp_path / "out"
    ray = shlex.quote(str(VENV_BIN / "ray"))
    common = "--num-cpus=1 --disable-usage-stats"
    sweep = _pipeline_command(
        data_root, out, ["hydra/launcher=ray_cluster", "hydra.launcher.ray.init.address=127.0.0.1:6379"], ["trainer.c2=0.1,3"]
    )
    script = f"""
set -e
ip link set lo up
temp=$(mktemp -d /tmp/ray-XXXXXX)
trap '{ray} stop --force >/dev/null 2>&1 || true; rm -rf "$temp"' EXIT
{ray} start --head --node-ip-address=127.0.0.1 --port=6379 {common} --include-dashboard=false --temp-dir="$temp" >/dev/null
{ray} start --address=127.0.0.1:6379 --node-ip-address=127.0.0.1 {common} >/dev/null
{shlex.join(sweep)}
"""
    # Ray 2.5x+ token authentication with a token of this test's own for the nodes and the driver (a
    # token file left in ~/.ray by an earlier local ray.init() would otherwise be half picked up)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", **auth}
    env.pop("MLFLOW_TRACKING_URI", None)
    # a PID namespace too: `ray stop` sees only this cluster's processes, and all die with the namespace
    command = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", script]
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    launcher, jobs = _job_folders(out)
    assert len(jobs) == 2
    assert all("ray_node_id" in job and job["pid"] != launcher["pid"] for job in jobs)  # in Ray workers
    assert len({job["ray_node_id"] for job in jobs}) == 2  # one job on each node (one CPU each)
    _check_sweep_runs(out, 2)


@pytest.mark.slow
def test_sweep_through_submitit_with_a_failing_job(tmp_path):
    if not _has("hydra_plugins.hydra_submitit_launcher"):
        pytest.skip("hydra-submitit-launcher is not installed (pip install -e .[cluster])")
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    out = tmp_path / "out"
    # the second job's data cannot be read (a cut-off gzip file, found as it is read, not before the sweep): it fails
    # after its run has started; the other is kept (each job is a fresh interpreter importing the pipeline: two are enough)
    bad = write_corpus(tmp_path / "bad", n_train=60, n_test=20)
    train = bad / "conll2000" / "train.txt.gz"
    train.write_bytes(train.read_bytes()[:-40])
    command = _pipeline_command(data_root, out, ["hydra/launcher=submitit_here"], [f"data.root={data_root},{bad}"])
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # the launching process forked from the test's server (its imports made once); the jobs are submitit's own processes
    done = forkserver.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode != 0  # Hydra reports the failed job
    launcher, jobs = _job_folders(out)
    assert len(jobs) == 2 and all(job["pid"] != launcher["pid"] for job in jobs)  # submitit's own processes
    sweep, runs = _check_sweep_runs(out, 2, finished=1)
    assert sweep.data.metrics["jobs_failed"] == 1 and sweep.info.status == "FAILED"

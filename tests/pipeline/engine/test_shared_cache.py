"""The tracking server as the stage cache shared by machines (``pipeline.tracking.remote_cache``).

Two output folders ("machines", each with its own local cache) share one real ``mlflow server``:
the second run finds every stage's entry in the tracking store, downloads and verifies it, and
computes nothing; its runs point at the first machine's runs. A tampered upload is not used.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402
from server_helpers import mlflow_server  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.cache import StageCache  # noqa: E402
from pipeline.engine.runner import METRICS_FILE  # noqa: E402
from pipeline.engine.stage import load_stages  # noqa: E402
from pipeline.models import load_adapter  # noqa: E402
from pipeline.tracking import remote_cache  # noqa: E402


def test_shared_stores_are_told_from_local_ones():
    assert remote_cache.is_shared("http://10.0.0.5:5000") and remote_cache.is_shared("postgresql+psycopg://u@h/db")
    assert not remote_cache.is_shared("sqlite:////tmp/mlflow.db") and not remote_cache.is_shared("file:///tmp/mlruns")
    assert remote_cache.remote_for("sqlite:////tmp/x.db") is None


class FolderRemote:
    """A remote store in a folder (what another machine's tracking store holds), counting its calls."""

    def __init__(self, root: Path) -> None:
        self.root, self.accepted_keys, self.published = root, [], []

    def fetch(self, stage: str, key: str, into: Path) -> Path | None:
        source = self.root / stage / key
        if not source.is_dir():
            return None
        shutil.copytree(source, into / "cache")
        return into / "cache"

    def accepted(self, stage: str, key: str) -> None:
        self.accepted_keys.append((stage, key))

    def publish(self, stage: str, key: str, folder: Path) -> None:
        self.published.append((stage, key))
        shutil.copytree(folder, self.root / stage / key, dirs_exist_ok=True)


def _produce(out: Path) -> None:
    (out / "matrix.npy").write_bytes(b"\x93NUMPY" + bytes(range(200)))
    (out / "sub").mkdir()
    (out / "sub" / "labels.txt").write_text("B-NP\nI-NP\n")


def test_a_cache_with_a_remote_publishes_what_it_builds_and_fetches_what_it_misses(tmp_path):
    remote = FolderRemote(tmp_path / "remote")
    first = StageCache(tmp_path / "one", remote=remote)
    built = first.build("featurize", "k" * 64, _produce)
    assert remote.published == [("featurize", "k" * 64)]
    second = StageCache(tmp_path / "two", remote=remote)
    found = second.lookup("featurize", "k" * 64)
    assert found == second.path("featurize", "k" * 64) and remote.accepted_keys == [("featurize", "k" * 64)]
    assert (found / "manifest.json").read_bytes() == (built / "manifest.json").read_bytes()
    assert second.lookup("featurize", "m" * 64) is None  # not in the remote either
    assert not [p for p in (tmp_path / "two" / "featurize").iterdir() if p.name.startswith(".tmp-")]


def test_a_tampered_remote_entry_is_not_used(tmp_path, caplog):
    remote = FolderRemote(tmp_path / "remote")
    StageCache(tmp_path / "one", remote=remote).build("featurize", "k" * 64, _produce)
    (tmp_path / "remote" / "featurize" / ("k" * 64) / "sub" / "labels.txt").write_text("B-VP\nI-NP\n")  # same size
    second = StageCache(tmp_path / "two", remote=remote)
    assert second.lookup("featurize", "k" * 64) is None
    assert remote.accepted_keys == [] and "labels.txt: content differs" in caplog.text
    assert not (tmp_path / "two" / "featurize" / ("k" * 64)).exists()
    assert StageCache(tmp_path / "three", remote=None).lookup("featurize", "k" * 64) is None  # no remote: a plain miss


def test_tracking_store_publishes_fetches_and_tags(tmp_path, monkeypatch):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("remote", (tmp_path / "artifacts").as_uri()))
    store, key = remote_cache.TrackingStore(), "k" * 64
    with mlflow.start_run(tags={"stage": "featurize", "cache_key": key}) as source:
        StageCache(tmp_path / "one", remote=store).build("featurize", key, _produce)
    with mlflow.start_run(tags={"stage": "featurize", "cache_key": key}) as copy:
        found = StageCache(tmp_path / "two", remote=store).lookup("featurize", key)
        assert found is not None and (found / "sub" / "labels.txt").read_text() == "B-NP\nI-NP\n"
        assert StageCache(tmp_path / "three", remote=store).lookup("featurize", "m" * 64) is None
    client = mlflow.tracking.MlflowClient()
    assert client.get_run(source.info.run_id).data.tags[remote_cache.UPLOAD_TAG] == "cache"
    assert client.get_run(copy.info.run_id).data.tags[remote_cache.FETCHED_TAG] == source.info.run_id
    assert remote_cache.UPLOAD_TAG not in client.get_run(copy.info.run_id).data.tags


def _content(path: Path):
    """A file's content less what differs between identical runs: measured times in JSON metrics
    (keys with ``seconds``/``_per_second``), gzip headers (evaluate writes the time into them)."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return {k: v for k, v in data.items() if "second" not in k} if isinstance(data, dict) else data
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def _stage_runs(client: MlflowClient, experiment_id: str, output: Path) -> dict:
    runs = client.search_runs([experiment_id], filter_string="tags.stage != 'pipeline'")
    return {r.data.tags["stage"]: r for r in runs if r.data.tags["cache_path"].startswith(str(output))}


@pytest.mark.slow
def test_a_second_machine_reuses_every_stage_through_the_tracking_server(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data_root = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    with mlflow_server(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts", tmp_path / "server.log") as url:
        server = ["tracking=server", f"tracking.uri={url}"]
        first = run_pipeline(compose_config(tiny_overrides(data_root, tmp_path / "one") + server))
        second = run_pipeline(compose_config(tiny_overrides(data_root, tmp_path / "two") + server))
        client = MlflowClient(url)
        experiment = client.get_experiment_by_name("crf").experiment_id
        one, two = _stage_runs(client, experiment, tmp_path / "one"), _stage_runs(client, experiment, tmp_path / "two")
        assert set(one) == set(two) == {"prepare", "featurize", "train", "evaluate"}
        for stage in one:
            assert one[stage].data.tags["cache"] == "miss" and one[stage].data.tags[remote_cache.UPLOAD_TAG] == "cache"
            # nothing recomputed: fetched from the first machine's run, which the hit points at
            assert two[stage].data.tags["cache"] == "hit", stage
            assert two[stage].data.tags[remote_cache.FETCHED_TAG] == one[stage].info.run_id
            assert two[stage].data.tags["cache_source_run_id"] == one[stage].info.run_id
            assert remote_cache.UPLOAD_TAG not in two[stage].data.tags  # a copy is not uploaded again
            # the local copy is the same entry, file for file
            a, b = Path(one[stage].data.tags["cache_path"]), Path(two[stage].data.tags["cache_path"])
            assert a.name == b.name and json.loads((a / "manifest.json").read_text()) == json.loads(
                (b / "manifest.json").read_text()
            )
        assert second == first
        assert len(list((tmp_path / "two" / "cache" / "featurize").iterdir())) == 1

        # a third machine whose download does not match its manifest recomputes the stage instead
        upload = sorted((tmp_path / "artifacts").rglob("cache/manifest.json"))[0].parent  # one stage's upload
        victim = next(p for p in upload.iterdir() if p.name != "manifest.json" and p.is_file())
        victim.write_bytes(victim.read_bytes() + b"tampered")
        third = run_pipeline(compose_config(tiny_overrides(data_root, tmp_path / "three") + server))
        three = _stage_runs(client, experiment, tmp_path / "three")
        recomputed = [stage for stage, run in three.items() if run.data.tags["cache"] == "miss"]
        assert recomputed and all(remote_cache.FETCHED_TAG not in three[stage].data.tags for stage in recomputed)
        # computed on another machine, the same results: the same files but for measured times
        for stage in recomputed:
            a, b = (Path(r.data.tags["cache_path"]) for r in (one[stage], three[stage]))
            files = json.loads((a / "manifest.json").read_text())["files"]
            assert files.keys() == json.loads((b / "manifest.json").read_text())["files"].keys()
            adapter = load_adapter(compose_config([]).model)
            volatile = {METRICS_FILE, *load_stages()[stage].volatile(adapter)}
            for name in files:
                if name not in volatile:  # files holding measured times (left out of downstream keys too)
                    assert _content(a / name) == _content(b / name), f"{stage}/{name}"
        assert {k: third[k] for k in ("evaluate.dev_f1", "evaluate.test_f1")} == {
            k: first[k] for k in ("evaluate.dev_f1", "evaluate.test_f1")
        }

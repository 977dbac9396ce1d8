"""The pipeline: config composition, stage caching, a tiny end-to-end run, data errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import CONF_DIR, compose_config, composition_shortcuts, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.cache import StageCache  # noqa: E402
from pipeline.report import markdown_table  # noqa: E402
from pipeline.stages.data import MissingDataError, load_dataset, read_split  # noqa: E402
from pipeline.tracking import TrackingUnavailable, tracking_uri  # noqa: E402


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


REQUIRED_SETTINGS = {"features.clusters"}  # the only settings a shipped config leaves to the command line


def _is_missing(cfg, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent)
    return node is not None and leaf in node.keys() and OmegaConf.is_missing(node, leaf)


@pytest.mark.parametrize("group", ["dataset", "features", "model", "trainer", "tracking"])
def test_every_shipped_config_composes_and_resolves(group):
    options = _options(group)
    assert options
    for option in options:
        cfg = compose_config([f"{group}={option}"])
        # a config may ask for a setting the user must give (a word-cluster paths file); any other
        # missing value fails the resolution below
        missing = [key for key in REQUIRED_SETTINGS if _is_missing(cfg, key)]
        if missing:  # (composed again only then: with no setting to add it is the same config)
            cfg = compose_config([f"{group}={option}", *(f"{key}=/abs/file.txt" for key in missing)])
        resolved = OmegaConf.to_container(cfg, resolve=True)
        assert resolved[group]["name" if group != "tracking" else "experiment"]
        if group == "trainer":
            assert resolved["trainer"]["c1"] >= 0 and resolved["trainer"]["c2"] >= 0


def test_experiments_and_benchmark_compose():
    experiments = {experiment: compose_config([f"+experiment={experiment}"]) for experiment in _options("experiment")}
    for cfg in experiments.values():
        OmegaConf.to_container(cfg, resolve=True)
    sweep = experiments["reg_sweep"]
    assert sweep.trainer.threads == 1
    elastic = compose_config(["trainer=elasticnet", "trainer.strength=0.5", "trainer.l2_ratio=0.2"])
    assert elastic.trainer.c1 == 0.5 and elastic.trainer.c2 == pytest.approx(0.1)
    bench = compose_config(["dataset=ud_english_ewt_xpos", "features=pos"], name="benchmark")
    assert bench.dataset.label == "xpos" and bench.benchmark.repetitions >= 3
    hmm_bench = compose_config([], name="hmm_benchmark")
    assert hmm_bench.dataset.label == "upos" and list(hmm_bench.hmm_benchmark.capitalization) == [False, True]
    # the HMM observes what the dataset says: POS tags for CoNLL-2000, capitalised words for EWT
    assert compose_config(["model=hmm"]).model.observation == "pos"
    ewt = compose_config(["model=hmm", "dataset=ud_english_ewt_upos"])
    assert ewt.model.observation == "w" and ewt.model.capitalization is True
    versus = experiments["hmm_vs_crf"]
    assert versus.stages == ["train", "evaluate"] and versus.comparison.bootstrap_samples >= 1000


def test_the_test_sessions_composition_shortcuts_compose_the_same_configs():
    """The tests compose with :func:`pipeline_helpers.composition_shortcuts` on (tests/conftest.py):
    every config composes to the same as with plain Hydra, Hydra's own node included."""
    from hydra import compose, initialize_config_dir

    cases = [
        ("config", ["trainer=l1", "model.order=2"], True),
        ("config", ["hydra/sweeper=optuna", "+experiment=reg_path", "data.root=/x"], True),
        ("config", ["model=hmm", "dataset=ud_english_ewt_upos"], False),
        ("benchmark", [], False),
    ]
    composed = {}
    for on in (False, True, True):  # (the second time from what the first parsed)
        with composition_shortcuts(on), initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            composed.setdefault(on, []).append(
                [OmegaConf.to_yaml(compose(config_name=n, overrides=o, return_hydra_config=h)) for n, o, h in cases]
            )
    assert composed[True] == [composed[False][0]] * 2


def test_stage_cache_hits_misses_and_is_atomic(tmp_path):
    cache = StageCache(tmp_path)
    key = cache.key("train", {"c2": 1.0}, {"featurize": "abc"}, code="v1")
    assert cache.key("train", {"c2": 1.0}, {"featurize": "abc"}, code="v1") == key
    assert cache.key("train", {"c2": 1}, {"featurize": "abc"}, code="v1") == key  # 1 and 1.0 are the same setting
    assert cache.key("train", {"c2": "1"}, {"featurize": "abc"}, code="v1") != key  # a string is not a number
    assert cache.key("train", {"c2": True}, {"featurize": "abc"}, code="v1") != key  # nor is a boolean
    assert cache.key("train", {"c2": 1.0}, {"featurize": "abd"}, code="v1") != key
    assert cache.key("train", {"c2": 1.0}, {"featurize": "abc"}, code="v2") != key
    assert cache.lookup("train", key) is None

    def broken(folder: Path) -> None:
        (folder / "half.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.build("train", key, broken)
    assert cache.lookup("train", key) is None
    assert not list((tmp_path / "train").iterdir())  # nothing half-written is left
    path = cache.build("train", key, lambda folder: (folder / "model.txt").write_text("weights"))
    assert cache.lookup("train", key) == path and (path / "model.txt").read_text() == "weights"
    before = cache.output_hash(path)
    cache.build("train", key, lambda folder: (folder / "model.txt").write_text("new weights"), replace=True)
    assert cache.output_hash(path) != before


def _stage_runs(client, experiment: str, parent_id: str) -> dict:
    runs = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    return {r.data.tags["stage"]: r for r in runs}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return write_corpus(root / "data"), root / "out"


def test_tiny_pipeline_end_to_end_and_caching(tiny, caplog):
    data_root, out = tiny
    cfg = compose_config(tiny_overrides(data_root, out))
    results = run_pipeline(cfg)
    assert results["evaluate.test_f1"] > 80.0
    uri = tracking_uri(cfg)
    assert uri == f"sqlite:///{out.absolute() / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crf")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    assert parent.data.tags["dataset"] == "conll2000" and parent.data.tags["trainer"] == "lbfgs"
    assert parent.data.tags["mlflow.source.git.commit"] and parent.data.params["trainer.c2"] == "1.0"
    assert parent.data.metrics["test_f1"] == pytest.approx(results["evaluate.test_f1"])
    stages = _stage_runs(client, "crf", parent.info.run_id)
    assert set(stages) == {"prepare", "featurize", "train", "evaluate"}
    assert all(run.data.tags["cache"] == "miss" for run in stages.values())
    history = client.get_metric_history(stages["train"].info.run_id, "loss")
    assert len(history) == int(stages["train"].data.metrics["iterations"]) and history[-1].step == len(history)
    assert client.get_metric_history(stages["train"].info.run_id, "dev_f1")
    artifacts = {a.path for stage in stages.values() for a in client.list_artifacts(stage.info.run_id, stage.data.tags["stage"])}
    for name in (
        "prepare/stats.json",
        "prepare/train.conll.gz",
        "featurize/extractor.npz",
        "train/model.npz",
        "train/history.csv",
        "evaluate/confusion_test.png",
        "evaluate/calibration_test.png",
        "evaluate/predictions_test.tsv.gz",
        "evaluate/segments_test.csv.gz",
        "evaluate/test_per_type.csv",
    ):
        assert name in artifacts, name
    assert "config.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id)}

    # the same config again, with settings that cannot change results (threads, dev cadence, c2 written
    # as an int): every stage comes from the cache, visibly, and the end of the run says where things are
    caplog.set_level(logging.INFO, logger="pipeline")
    same = ["trainer.threads=1", "train.dev_every=3", "trainer.c2=1"]
    again = run_pipeline(compose_config(tiny_overrides(data_root, out) + same))
    assert again["evaluate.test_f1"] == results["evaluate.test_f1"]
    latest = client.search_runs(
        [experiment.experiment_id], filter_string="tags.stage = 'pipeline'", order_by=["start_time DESC"]
    )[0]
    assert latest.data.tags["cache_hits"] == "prepare,featurize,train,evaluate"
    cached = _stage_runs(client, "crf", latest.info.run_id)
    assert {r.data.tags["cache"] for r in cached.values()} == {"hit"}
    # a cached training run still gets its learning curve as step metrics
    assert len(client.get_metric_history(cached["train"].info.run_id, "loss")) == len(history)
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done:")][-1]
    assert latest.info.run_id in done and f"mlflow ui --backend-store-uri {uri}" in done and "test_f1" in done
    assert str(Path(cached["train"].data.tags["cache_path"])) in done

    # only the trainer changes: data and features are reused, training is redone
    changed = compose_config(tiny_overrides(data_root, out) + ["trainer.strength=0.3"])
    run_pipeline(changed)
    latest = client.search_runs(
        [experiment.experiment_id], filter_string="tags.stage = 'pipeline'", order_by=["start_time DESC"]
    )[0]
    assert latest.data.tags["cache_hits"] == "prepare,featurize"

    # force recomputes everything
    run_pipeline(compose_config(tiny_overrides(data_root, out) + ["force=true"]))
    latest = client.search_runs(
        [experiment.experiment_id], filter_string="tags.stage = 'pipeline'", order_by=["start_time DESC"]
    )[0]
    assert latest.data.tags["cache_hits"] == "none"


def test_changed_input_file_misses_the_cache(tmp_path):
    data_root = write_corpus(tmp_path / "data", n_train=40, n_test=10)
    out = tmp_path / "out"
    overrides = tiny_overrides(data_root, out) + ["stages=[featurize]"]
    run_pipeline(compose_config(overrides))
    write_corpus(tmp_path / "data", n_train=40, n_test=10, seed=1)  # same paths, new content
    run_pipeline(compose_config(overrides))
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    latest = client.search_runs(
        [client.get_experiment_by_name("crf").experiment_id],
        filter_string="tags.stage = 'pipeline'",
        order_by=["start_time DESC"],
    )[0]
    assert latest.data.tags["cache_hits"] == "none"


def test_missing_data_offline_names_files_and_remedy(tmp_path):
    cfg = compose_config(
        [
            f"data.root={tmp_path}",
            f"paths.output_dir={tmp_path / 'out'}",
            "dataset.files.train.url=http://127.0.0.1:9/train.txt.gz",
            "dataset.files.test.url=http://127.0.0.1:9/test.txt.gz",
        ]
    )
    with pytest.raises(MissingDataError) as info:
        load_dataset(OmegaConf.to_container(cfg.dataset, resolve=True), tmp_path, download=True, carve_dev=False)
    message = str(info.value)
    assert str(tmp_path / "conll2000" / "train.txt.gz") in message and str(tmp_path / "conll2000" / "test.txt.gz") in message
    assert "CRF_DATA_HOME" in message and "download from http://127.0.0.1:9/train.txt.gz failed" in message


def test_unreachable_server_fails_before_any_stage(tmp_path):
    cfg = compose_config([f"paths.output_dir={tmp_path}", "tracking=server", "tracking.uri=http://127.0.0.1:9"])
    with pytest.raises(TrackingUnavailable, match="not reachable"):
        run_pipeline(cfg)
    assert not (tmp_path / "cache").exists()


def test_environment_tracking_uri_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/elsewhere.db")
    cfg = compose_config([f"paths.output_dir={tmp_path}"])
    assert tracking_uri(cfg) == f"sqlite:///{tmp_path}/elsewhere.db"


def test_markdown_table_formats_cells():
    frame = pd.DataFrame(
        {
            "flag": [True, False],
            "tokens": [211727.0, np.nan],
            "name": ["crf", None],
            "p": [3.9e-46, 95.88],
            "mixed": [True, 2.5],
        }
    )
    lines = markdown_table(frame).splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(frame.columns)
    first, second = ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
    assert first == ["True", "211,727", "crf", "3.9e-46", "True"]
    assert second == ["False", "", "", "95.88", "2.5"]


def test_log_axes_are_labelled_in_plain_numbers():
    """Within one decade and across many, the labels are numbers, never TeX (``$10^{3}$``)."""
    from pipeline.report import figure, log_scale

    for low, high, expected in ((370.0, 3700.0, {"400", "1000", "2000"}), (0.01, 1e4, {"1e\u221202", "1", "10000"})):
        fig, (ax,) = figure(6.5, 4)
        ax.plot([1, 30], [high, low])
        log_scale(ax, "y")
        fig.canvas.draw()
        labels = {t.get_text() for t in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()} - {""}
        assert expected <= labels and not any("$" in label for label in labels), labels
        assert ax.get_yscale() == "log"


def test_unknown_dataset_format_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown format 'xml'.*conll.*conllu"):
        read_split(tmp_path / "x.xml", {"name": "refs", "format": "xml", "columns": ["w"]})

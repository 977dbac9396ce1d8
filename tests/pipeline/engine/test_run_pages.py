"""What a person sees of a pipeline run: run names that tell runs apart, the run page (headline
scores first, a description, the logged model linked), and every URI the run prints loads with
MLflow's own loader. In process, on the tiny corpus, with a real MLflow SQLite store."""

from __future__ import annotations

import logging
import os
import warnings

import pandas as pd
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import open_dict  # noqa: E402
from pipeline_helpers import CONF_DIR, tiny_overrides, write_corpus  # noqa: E402

from pipeline import tracking  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.logs import named_overrides  # noqa: E402


def test_named_overrides_show_what_changes_a_result():
    task = [
        "trainer=l1",
        "trainer.strength=0.3",
        "paths.output_dir=/tmp/x",
        "data.root=/d",
        "+features=pos",
        "trainer.threads=2",
        "dataset.files.train.sha256=null",
        "tracking=server",
        "force=true",
    ]
    assert named_overrides(task) == ["strength=0.3", "features=pos"]
    # a multirun job: only the swept keys, whatever they are
    assert named_overrides(task, {"trainer.strength", "trainer"}) == ["trainer=l1", "strength=0.3"]


def _single_run(overrides: list[str]):
    """The config of ``python -m pipeline <overrides>``, with Hydra's run config set as the app sets it."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """A plain run, one with ``trainer=l1 trainer.strength=0.3`` and the plain one again (every
    stage from the cache): (store URI, [pipeline run], [closing message])."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    root = tmp_path_factory.mktemp("pages")
    base = tiny_overrides(write_corpus(root / "data", n_train=80, n_test=20), root / "out") + ["trainer.threads=1"]
    handler, runner_log = _Lines(), logging.getLogger("pipeline.engine.runner")
    level = runner_log.level
    runner_log.addHandler(handler)
    runner_log.setLevel(logging.INFO)
    closings = []
    try:
        for extra in ([], ["trainer=l1", "trainer.strength=0.3"], []):
            handler.messages.clear()
            run_pipeline(_single_run(base + extra))
            closings.append(next(m for m in handler.messages if m.startswith("done: run ")))
    finally:
        runner_log.removeHandler(handler)
        runner_log.setLevel(level)
        HydraConfig.instance().cfg = None
    uri = f"sqlite:///{root / 'out' / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crf").experiment_id
    runs = client.search_runs([experiment], "tags.stage = 'pipeline'", order_by=["attributes.start_time ASC"])
    return uri, runs, closings


def test_run_names_say_what_differs(three_runs):
    _, runs, closings = three_runs
    # max_iterations=30 is the tiny corpus's own override; paths, data root, checksums and threads are not shown
    assert [r.info.run_name for r in runs] == [
        "conll2000-crf-lbfgs-max_iterations=30",
        "conll2000-crf-l1-max_iterations=30-strength=0.3",
        "conll2000-crf-lbfgs-max_iterations=30-cached",
    ]
    assert [r.data.tags.get("cache_only") for r in runs] == [None, None, "true"]
    assert runs[2].data.tags["cache_hits"] == "prepare,featurize,train,evaluate"
    for run, closing in zip(runs, closings):
        assert closing.startswith(f"done: run {run.info.run_id} ({run.info.run_name})")


def test_run_page_heads_with_scores_and_a_note(three_runs):
    uri, runs, closings = three_runs
    for run, closing in zip(runs, closings):
        metrics = list(run.data.metrics)  # the store's order: the run page's
        assert metrics[:4] == ["dev_f1", "test_f1", "dev_accuracy", "test_accuracy"], metrics[:6]
        assert len(metrics) > 10
        note = run.data.tags[tracking.NOTE_TAG]
        model = run.data.tags[tracking.MODEL_URI_TAG]
        assert note.startswith(f"dev_f1 **{run.data.metrics['dev_f1']:.2f}** · test_f1 **{run.data.metrics['test_f1']:.2f}**")
        assert f"- model: `{model}`" in note and f'mlflow.pyfunc.load_model("{model}")' in note
        tag_line = next(line.strip()[len("tag: ") :] for line in closing.splitlines() if line.strip().startswith("tag: "))
        assert f"- tag: `{tag_line}`" in note and f"tracking.uri={uri}" in tag_line
    assert "(0 of 4 stages from the cache)" in runs[0].data.tags[tracking.NOTE_TAG]
    assert "(every stage from the cache)" in runs[2].data.tags[tracking.NOTE_TAG]


def test_parent_run_links_its_logged_model(three_runs):
    uri, runs, _ = three_runs
    client = MlflowClient(uri)
    for run in runs:
        model_id = run.data.tags[tracking.MODEL_URI_TAG][len("models:/") :]
        assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
    # the cached run links the model the first run logged: one model, not a second copy
    assert runs[2].outputs.model_outputs[0].model_id == runs[0].outputs.model_outputs[0].model_id
    experiment = runs[0].info.experiment_id
    assert len(client.search_logged_models([experiment])) == 2  # the lbfgs and the l1 model


def test_every_printed_uri_loads_with_mlflows_loader(three_runs):
    """Found: ``runs:/<train run id>/train`` was printed as loadable, but MLflow's loader found no
    MLmodel there; and every run warned "Add type hints to the predict method"."""
    uri, runs, closings = three_runs
    frame = pd.DataFrame(
        {"sentence": [0, 0, 0, 1, 1], "w": ["the", "dog", "runs", "a", "cat"], "pos": ["DT", "NN", "VB", "DT", "NN"]}
    )
    loaded = 0
    with tracking.using_store(uri), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for closing in closings:
            lines = dict(line.strip().split(": ", 1) for line in closing.splitlines()[1:])
            printed = [lines["model"].split()[0], lines["train run"]]
            assert printed[1].endswith("/model")
            for reference in printed:
                labels = mlflow.pyfunc.load_model(reference).predict(frame)["label"].tolist()
                assert labels[:2] == ["B-NP", "I-NP"], reference
                loaded += 1
    assert loaded == 6
    assert not [w for w in caught if "type hints" in str(w.message)], [str(w.message) for w in caught]

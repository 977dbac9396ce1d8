"""Model adapters: the CRF and the HMM behind one interface, and a third model kind added as one
module and one config file (tests/toy_kind.py, tests/conf/model/majority.yaml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.models import load_adapter  # noqa: E402
from pipeline.models.crf import CRFAdapter  # noqa: E402
from pipeline.models.hmm import HMMAdapter  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("adapters") / "data", n_train=60, n_test=20)


def test_the_adapter_is_chosen_once_from_the_model_config():
    crf = load_adapter(compose_config([]).model)
    hmm = load_adapter(compose_config(["model=hmm"]).model)
    assert isinstance(crf, CRFAdapter) and isinstance(hmm, HMMAdapter)
    assert crf.upstream == ("prepare", "featurize") and hmm.upstream == ("prepare",)
    cfg = compose_config(["trainer=l1", "trainer.threads=2"])
    assert crf.trainer_tag(cfg) == "l1" and hmm.trainer_tag(cfg) == "counting"
    sliced = crf.config_slice(cfg)
    assert set(sliced) == {"model", "trainer", "seed"} and "threads" not in sliced["trainer"]
    assert sliced["model"]["all_possible_states"] is False
    assert crf.settings(cfg)["threads"] == 2
    assert set(hmm.config_slice(compose_config(["model=hmm"]))) == {"model"}
    with pytest.raises(ValueError, match="model.adapter"):
        load_adapter({"name": "x"})
    with pytest.raises(ValueError, match="cannot load adapter"):
        load_adapter({"name": "x", "adapter": "pipeline.models.nothing.Here"})


@pytest.mark.parametrize("model", ["crf", "hmm"])
def test_both_adapters_run_through_the_same_stages(corpus, tmp_path, model):
    results = run_pipeline(compose_config(tiny_overrides(corpus, tmp_path / "out") + [f"model={model}", "stages=[evaluate]"]))
    assert results["evaluate.test_accuracy"] > 80.0
    assert ("featurize.attributes" in results) == (model == "crf")
    assert results["train.model_bytes"] > 0


TESTS = Path(__file__).resolve().parents[2]


def test_a_new_model_kind_is_one_module_and_one_config_file(corpus, tmp_path):
    """A toy kind (tests/toy_kind.py and tests/conf/model/majority.yaml, from a config folder
    outside conf/) runs through every stage, the tag command and the MLflow Model, with no change
    to the runner, the stages, the bundle or the served model's code."""
    out = tmp_path / "out"
    overrides = tiny_overrides(corpus, out) + [f"hydra.searchpath=[file://{TESTS / 'conf'}]", "model=majority"]
    results = run_pipeline(compose_config(overrides))
    assert "featurize.attributes" not in results  # the adapter's upstream: prepare only
    # the toy corpus's most frequent chunk label is I-NP: the score is its share of the test tokens
    assert 20.0 < results["evaluate.test_accuracy"] < 60.0 and results["train.labels"] >= 4
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    assert parent.data.tags["model"] == "majority" and parent.data.tags["trainer"] == "majority"
    (train,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.stage = 'train'"
    )
    assert {a.path for a in client.list_artifacts(train.info.run_id, "train")} == {"train/bundle.npz", "train/counts.json"}
    assert client.get_metric_history(train.info.run_id, "majority_share")
    assert run_pipeline(compose_config(overrides)) == results  # its entries are cached like any other

    (bundle,) = (out / "cache" / "train").glob("*/bundle.npz")
    sentences = tmp_path / "in.conll"
    sentences.write_text("the\nold\ndog\n\nruns\n")
    # the project (as an installed one would be) and tests/, where the kind's module is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]), "MLFLOW_DISABLE_TELEMETRY": "true"}

    def tag(*extra: str) -> subprocess.CompletedProcess:
        output, hydra = tmp_path / "out.jsonl", tmp_path / "hydra"
        command = [sys.executable, "-m", "pipeline.tag", f"model={bundle}", f"input={sentences}", f"output={output}",
                   f"hydra.run.dir={hydra}", *extra]  # fmt: skip
        return forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)

    refused = tag()  # the kind's module not imported: a clear refusal
    assert refused.returncode == 2 and "model kind 'majority' is unknown here" in refused.stdout + refused.stderr
    done = tag("plugins=[toy_kind]")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["labels"] for line in lines] == [["I-NP"] * 3, ["I-NP"]]

    # the MLflow Model carries the kind's module: it loads in a process that never imported it
    model_uri = parent.data.tags["model_uri"]
    store = f"sqlite:///{out / 'mlflow.db'}"
    script = (
        f"import mlflow, pandas as pd; mlflow.set_tracking_uri({store!r}); m = mlflow.pyfunc.load_model({model_uri!r}); "
        "print(m.predict(pd.DataFrame({'sentence': [0, 0], 'w': ['the', 'dog']}))['label'].tolist())"
    )
    loaded = forkserver.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**env, "PYTHONPATH": str(TESTS.parent)})  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip().splitlines()[-1] == "['I-NP', 'I-NP']"


def test_a_new_dataset_is_one_config_file_in_a_folder_of_its_own(tmp_path):
    """A dataset and a feature set from a config folder outside conf/ (tests/conf/dataset/toy_ner.yaml:
    tab-separated columns, a "#" header line per sentence, the word column named "token"; and
    tests/conf/features/toy_tokens.yaml), read through every stage by both models, with the
    known/unknown-word figures taken from its word column."""
    rng = np.random.default_rng(0)
    names, verbs = ["Ada", "Bob", "Cy"], ["runs", "sees", "likes"]
    folder = tmp_path / "data" / "toy_ner"
    folder.mkdir(parents=True)
    for split, n in (("train", 80), ("test", 20)):
        lines = []
        for k in range(n):
            person = str(rng.choice(names))
            ending = ["#\tSYM\tO"] + ([".\t.\tO"] if split == "train" else [])  # test sentences are not training ones
            lines += [f"# sentence {k}", f"{person}\tNNP\tB-PER", f"{rng.choice(verbs)}\tVBZ\tO", *ending, ""]
        (folder / f"{split}.tsv").write_text("\n".join(lines))
    for model in ("crf", "hmm"):
        overrides = tiny_overrides(tmp_path / "data", tmp_path / "out") + [
            f"hydra.searchpath=[file://{TESTS / 'conf'}]",
            "dataset=toy_ner",
            "features=toy_tokens",
            "dataset.files.train.sha256=null",
            "dataset.files.test.sha256=null",
            f"model={model}",
        ]
        results = run_pipeline(compose_config(overrides))
        assert results["prepare.train_tokens"] == 4 * 64  # the "#" header lines are not tokens, the word "#" is
        assert results["evaluate.test_f1"] == 100.0 and "evaluate.test_known_accuracy" in results


def test_a_new_stage_is_one_module_named_in_the_stage_list(corpus, tmp_path, monkeypatch):
    """A stage from outside the pipeline (tests/toy_stage.py) runs after its upstream stage, is
    cached and keyed like the others, and logs its metrics and artifact, once its module is named
    in STAGE_MODULES (the one line a new stage adds there)."""
    import pipeline.stages as stage_package

    monkeypatch.setattr(stage_package, "STAGE_MODULES", (*stage_package.STAGE_MODULES, "toy_stage"))
    out = tmp_path / "out"
    overrides = tiny_overrides(corpus, out) + ["stages=[label_counts]"]
    results = run_pipeline(compose_config(overrides))
    assert set(results) >= {"prepare.train_tokens", "label_counts.train_labels", "label_counts.test_majority_share"}
    assert not any(name.startswith(("featurize.", "train.", "evaluate.")) for name in results)  # only its upstream ran
    assert results["label_counts.train_labels"] == 5  # B-NP I-NP B-VP B-PP O in the toy grammar
    assert 30.0 < results["label_counts.train_majority_share"] < 60.0
    assert run_pipeline(compose_config(overrides)) == results
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'label_counts'")
    assert sorted(run.data.tags["cache"] for run in runs) == ["hit", "miss"]
    miss, hit = sorted(runs, key=lambda run: run.data.tags["cache"] == "hit")
    assert {a.path for a in client.list_artifacts(miss.info.run_id, "label_counts")} == {"label_counts/label_counts.json"}
    assert hit.data.tags["cache_source_run_id"] == miss.info.run_id  # a hit points at the run holding the files
    with pytest.raises(Exception, match="label_counts"):  # without the line, the stage is unknown
        monkeypatch.undo()
        run_pipeline(compose_config(overrides))

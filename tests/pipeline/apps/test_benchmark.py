"""The speed benchmark (pipeline.apps.benchmark, pipeline.apps.bench_worker): smoke runs of each input path
on the tiny generated corpus, the tutorial's feature dicts, and the joint EWT label set."""

from __future__ import annotations

import types
from pathlib import Path

import forkserver
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from pipeline.apps import benchmark
from pipeline.apps.bench_worker import joint_labels, sentence_dicts, word2features
from tests.pipeline_helpers import CONF_DIR, write_corpus

TUTORIAL_KEYS = {
    "bias",
    "word.lower()",
    "word[-3:]",
    "word[-2:]",
    "word.isupper()",
    "word.istitle()",
    "word.isdigit()",
    "postag",
    "postag[:2]",
}
NEIGHBOUR_KEYS = {"word.lower()", "word.istitle()", "word.isupper()", "postag", "postag[:2]"}


@pytest.fixture
def forked_workers(monkeypatch):
    """Benchmark workers forked from the test fork server instead of fresh interpreters: the same
    ``python -m pipeline.apps.bench_worker`` command and files, without 3 s of imports per worker. One
    test (the batch input path) keeps fresh interpreters, as users run them; the peak memory of a forked
    worker counts the server's imports, and these tests only ask it to be positive."""
    monkeypatch.setattr(benchmark, "subprocess", types.SimpleNamespace(run=forkserver.run))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return write_corpus(root / "data"), root / "out"


def _config(data_root: Path, out: Path, *overrides: str):
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        return compose(
            config_name="benchmark",
            overrides=[
                f"data.root={data_root}",
                f"paths.output_dir={out}",
                "dataset.files.train.sha256=null",
                "dataset.files.test.sha256=null",
                "benchmark.quick=true",
                "benchmark.per_call.enabled=false",
                *overrides,
            ],
        )


def test_word2features_has_the_tutorial_keys():
    sentence = [("He", "PRP", "B-NP"), ("reckons", "VBZ", "B-VP"), ("1990", "CD", "B-NP")]
    first, middle, last = (word2features(sentence, i) for i in range(3))
    assert set(middle) == TUTORIAL_KEYS | {f"-1:{k}" for k in NEIGHBOUR_KEYS} | {f"+1:{k}" for k in NEIGHBOUR_KEYS}
    assert set(first) == TUTORIAL_KEYS | {"BOS"} | {f"+1:{k}" for k in NEIGHBOUR_KEYS}
    assert set(last) == TUTORIAL_KEYS | {"EOS"} | {f"-1:{k}" for k in NEIGHBOUR_KEYS}
    assert middle["word.lower()"] == "reckons" and middle["word[-3:]"] == "ons" and middle["word[-2:]"] == "ns"
    assert middle["postag[:2]"] == "VB" and middle["-1:word.istitle()"] is True and middle["+1:postag"] == "CD"
    assert last["word.isdigit()"] is True and first["bias"] == 1.0 and first["BOS"] is True
    # without a POS column the POS keys are left out; the label column is never read as POS
    (dicts,) = sentence_dicts([[("Smith,", "B-author")]], ["w", "field"], "field")
    assert set(dicts[0]) == TUTORIAL_KEYS - {"postag", "postag[:2]"} | {"BOS", "EOS"}


@pytest.mark.parametrize("path", ["batch", "strings", "dicts"])
def test_quick_run_of_each_input_path_logs_results(tiny, path, request):
    if path != "batch":
        request.getfixturevalue("forked_workers")
    data_root, out = tiny
    cfg = _config(data_root, out / path, f"benchmark.input={path}", "benchmark.growth_enabled=false")
    benchmark.main(cfg)
    folder = out / path / "benchmark" / f"conll2000-{path}"
    runs = pd.read_csv(folder / "runs.csv")
    assert sorted(runs.tool) == ["crfsuite", "ours"] and set(runs.input) == {path}
    assert (runs.train_seconds > 0).all() and (runs.tag_tokens_per_second > 0).all() and (runs.peak_memory_mib > 0).all()
    assert (runs.token_accuracy > 50).all()
    table = pd.read_csv(folder / "results.csv", index_col=0)
    assert table.loc["train_seconds", "ratio"] > 0
    assert "F1 per field" in (folder / "results.md").read_text()
    client = MlflowClient(f"sqlite:///{(out / path).absolute() / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("crf").experiment_id], "tags.stage = 'benchmark'")
    assert run.data.tags["input"] == path and run.data.metrics["ours.train_seconds"] > 0
    assert "crfsuite.tag_tokens_per_second" in run.data.metrics


@pytest.mark.slow
def test_quick_per_call_rows_are_logged(tiny, forked_workers, monkeypatch):
    """The per-call part: every row measured on both sides where it has two, logged to MLflow; the
    served model's latencies (p50, p99) are there. Its measuring process (``python -m
    pipeline.apps.per_call_benchmark``) and the benchmark's workers are forked from the test fork
    server, as in the tests above; the served model is a real ``mlflow models serve``."""
    from pipeline.apps import per_call_benchmark

    monkeypatch.setattr(per_call_benchmark, "subprocess", types.SimpleNamespace(run=forkserver.run))
    data_root, out = tiny
    cfg = _config(data_root, out / "per_call", "benchmark.growth_enabled=false", "benchmark.per_call.enabled=true")
    benchmark.main(cfg)
    table = pd.read_csv(out / "per_call" / "benchmark" / "conll2000-batch" / "per_call.csv")
    assert len(table) == 15 and (table.ours > 0).all()
    assert table.path.str.contains("Tagger.tag").any() and table.path.str.contains("l2sgd final loss").any()
    assert table.path.str.contains(
        r"chunk confidence \(predict_segments\)"
    ).any()  # order 2 over candidate labels against order 1
    served = table[table.path.str.contains("served model")]  # latencies of a real `mlflow models serve`
    assert len(served) == 2 and (served.unit == "ms").all()
    apis = table[table.path.str.contains("API")]
    assert (apis.crfsuite > 0).all() and (apis.ratio > 0).all()
    client = MlflowClient(f"sqlite:///{(out / 'per_call').absolute() / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("crf").experiment_id], "tags.stage = 'benchmark'")
    assert any(name.startswith("per_call.python-crfsuite_API") for name in run.data.metrics)


def test_elastic_net_rows_give_the_loss_and_active_features_of_both_tools(tiny, forked_workers):
    """The tutorial's settings (c1 = c2 = 0.1) on the same attributes: both tools run OWL-QN
    from zero on the same model (CRFsuite's: every label pair, no start/end weights)."""
    data_root, out = tiny
    cfg = _config(data_root, out / "l1", "benchmark.c1=0.1", "benchmark.c2=0.1", "benchmark.growth_enabled=false")
    benchmark.main(cfg)
    folder = out / "l1" / "benchmark" / "conll2000-batch"
    runs = pd.read_csv(folder / "runs.csv").set_index("tool")
    assert (runs.iterations == 10).all() and (runs.active_features > 0).all()
    assert runs.loss["ours"] == pytest.approx(runs.loss["crfsuite"], rel=0.02)
    assert runs.features["ours"] == runs.features["crfsuite"]
    table = pd.read_csv(folder / "results.csv", index_col=0)
    assert table.loc["loss", "ratio"] == pytest.approx(1.0, abs=0.02)
    assert "| loss" in (folder / "results.md").read_text()


def test_quick_growth_repeats_the_training_data(tiny, forked_workers):
    data_root, out = tiny
    cfg = _config(data_root, out / "growth", "benchmark.tools=[ours]", "benchmark.growth.label_sets=[]")
    benchmark.main(cfg)
    growth = pd.read_csv(out / "growth" / "benchmark" / "conll2000-batch" / "growth.csv")
    tokens = dict(zip(growth.value, growth.train_tokens))
    assert set(growth.case) == {"fraction", "repeat"}
    assert tokens["2x0.1"] == 2 * tokens["0.1"] and (growth.peak_memory_mib > 0).all()


def test_unknown_input_path_is_refused(tiny):
    data_root, out = tiny
    with pytest.raises(ValueError, match="benchmark.input='csv'"):
        benchmark._settings(_config(data_root, out, "benchmark.input=csv"))


@pytest.mark.parametrize(
    "app, overrides, message",
    [
        ("benchmark", ["benchmark.tools=[nosuch]"], "bad setting benchmark.tools=['nosuch']: different tools of ours"),
        ("benchmark", ["benchmark.tools=[ours,ours]"], "bad setting benchmark.tools=['ours', 'ours']"),
        ("benchmark", ["benchmark.repetitions=0"], "bad setting benchmark.repetitions=0: a whole number >= 1"),
        ("benchmark", ["benchmark.per_call.served=no"], "bad setting benchmark.per_call.served='no': true or false"),
        ("benchmark", ["benchmark.train_fraction=0"], "bad setting benchmark.train_fraction=0: a number in (0, 1]"),
        ("benchmark", ["benchmark.period=0"], "bad setting benchmark.period=0: a whole number >= 1"),
        ("benchmark", ["benchmark.c2=-1"], "bad setting benchmark.c2=-1: a finite number >= 0"),
        ("benchmark", ["benchmark.epsilon=abc"], "bad setting benchmark.epsilon='abc'"),
        ("benchmark", ["benchmark.feature_set=nosuch"], "bad setting benchmark.feature_set='nosuch': sparse or dense"),
        (
            "benchmark",
            ["benchmark.growth.fractions=[1.5]"],
            "bad setting benchmark.growth.fractions=[1.5]: a list of numbers in (0, 1]",
        ),
        ("benchmark", ["benchmark.growth.repeats=[0]"], "bad setting benchmark.growth.repeats=[0]: a list of whole"),
        ("benchmark", ["benchmark.growth.label_sets=[nosuch]"], "bad setting benchmark.growth.label_sets: 'nosuch' names no"),
        ("benchmark", ["benchmark.growth.fractions=0.5"], "bad setting benchmark.growth.fractions=0.5: a list of numbers"),
        (
            "benchmark",
            ["benchmark.growth.label_sets=[../config]"],
            "bad setting benchmark.growth.label_sets: '../config' names no",
        ),
        ("benchmark", ["~benchmark.tag_repeats"], "bad setting benchmark.tag_repeats: missing"),
        (
            "benchmark",
            ["data.root=/nonexistent", "data.download=false"],
            "bad setting benchmark.growth.label_sets: ud_english_ewt_upos's file",
        ),
        ("hmm_benchmark", ["hmm_benchmark.repetitions=0"], "bad setting hmm_benchmark.repetitions=0: a whole number >= 1"),
        ("hmm_benchmark", ["hmm_benchmark.observation=nosuch"], "bad setting hmm_benchmark.observation='nosuch': not one of"),
        ("hmm_benchmark", ["hmm_benchmark.capitalization=[no]"], "bad setting hmm_benchmark.capitalization=['no']"),
        ("benchmark", ["+benchmark.repetiton=5"], "bad setting +benchmark.repetiton: the command has no such setting; did you"),
        ("hmm_benchmark", ["+nosuch=1"], "bad setting +nosuch: the command has no such setting"),
        ("model_benchmark", [], "bad setting model_benchmark.model: say which model to measure"),
        ("model_benchmark", ["model_benchmark.model=x", "model_benchmark.served=no"], "bad setting model_benchmark.served='no'"),
        # the tracking store and the dataset's files, checked as the pipeline checks them (round 30)
        ("benchmark", ["tracking.uri=file:///tmp/mlruns"], "bad setting: the tracking store file:///tmp/mlruns (tracking.uri"),
        ("hmm_benchmark", ["tracking.uri=/tmp/mlruns"], "bad setting: the tracking store /tmp/mlruns (tracking.uri"),
        ("model_benchmark", ["model_benchmark.model=x", "tracking.uri=nosuch://x"], "bad setting: the tracking store nosuch://x"),
        (
            "hmm_benchmark",
            ["data.root=/nonexistent", "data.download=false"],
            "bad setting dataset 'ud_english_ewt_upos': missing",
        ),
    ],
)
def test_a_benchmark_refuses_a_bad_setting_in_one_line_before_any_work(app, overrides, message, caplog):
    """``hmm_benchmark.repetitions=0`` and ``observation=nosuch`` gave tracebacks, and
    ``benchmark.tools=[nosuch]`` failed after its MLflow run opened (round 25); a file store and
    missing data files gave tracebacks (round 30)."""
    import importlib

    from pipeline.apps import run_checked, tracked

    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose(config_name=app, overrides=overrides, return_hydra_config=True)  # its command line, as a run has
    worked = []
    with pytest.raises(SystemExit) as ended:
        run_checked(tracked(importlib.import_module(f"pipeline.apps.{app}").check_settings), worked.append, cfg)
    assert ended.value.code == 2 and not worked
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"][0].startswith(message), caplog.text


def test_a_multirun_of_the_benchmark_refuses_a_bad_job_before_the_first_runs(caplog):
    """``-m benchmark.c2=1,-1`` ran all of job #0, then refused job #1; a key the config lacks got
    Hydra's several lines (round 29)."""
    from pipeline.apps import exit_if_uncomposable, tracked

    for argv, message in (
        (["-m", "benchmark.growth_enabled=false", "benchmark.c2=1,-1"], "benchmark.c2=-1: a finite number >= 0 (job #1: "),
        (["-m", "benchmark.repetiton=5"], "Could not override 'benchmark.repetiton': the config has no such key"),
        (["-m", "benchmark.c2=1,2", "tracking.uri=/tmp/mlruns"], "bad setting: the tracking store /tmp/mlruns"),  # round 30
    ):
        caplog.clear()
        with pytest.raises(SystemExit) as ended:
            exit_if_uncomposable("benchmark", argv, tracked(benchmark.check_settings))
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert ended.value.code == 2 and len(errors) == 1 and message in errors[0], errors
    exit_if_uncomposable("benchmark", ["-m", "benchmark.growth_enabled=false", "benchmark.c2=1,2"], benchmark.check_settings)


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ("other.db", "name two stores for the Model Registry"),  # another store than tracking.uri (round 31)
        ("folder", "the registry store sqlite:///{tmp}/folder: {tmp}/folder: a folder; name a file"),  # round 32
        ("dangling", "the registry store sqlite:///{tmp}/dangling: {tmp}/dangling: a symbolic link to"),
        ("new.db", "the registry store sqlite:///{tmp}/new.db (MLFLOW_REGISTRY_URI): no MLflow store there to read a model"),
    ],
)
def test_the_model_benchmark_checks_the_registry_it_reads_before_any_work(registry, message, tmp_path, monkeypatch, caplog):
    """``MLFLOW_REGISTRY_URI`` at another SQLite file created that file as a store, and at a folder
    or a dangling link the command retried until killed (rounds 31 and 32)."""
    from pipeline.apps import model_benchmark, run_checked, tracked

    (tmp_path / "folder").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{tmp_path / registry}")
    overrides = ["model_benchmark.model=models:/x@champion"]
    if registry == "other.db":
        overrides.append(f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}")
    else:  # the tracking store is the variable's, as the registry is
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose(config_name="model_benchmark", overrides=overrides)
    with pytest.raises(SystemExit) as ended:
        run_checked(tracked(model_benchmark.check_settings, "model_benchmark.model"), pytest.fail, cfg)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert ended.value.code == 2 and message.format(tmp=tmp_path) in errors[0], errors
    assert not (tmp_path / "other.db").exists() and not (tmp_path / "new.db").exists()
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("which", ["dataset", "label set"])
def test_a_dataset_file_that_fails_its_checksum_is_one_line_before_any_benchmark_run(which, tmp_path, caplog):
    """A corrupt or other-version data file, of the benchmark's dataset (round 32) or of a growth
    label set (round 33), failed in the benchmark's worker: a traceback, exit 1 and a FAILED run."""
    import gzip

    from pipeline.apps import run_checked, tracked

    root = tmp_path / "data"
    overrides = [f"data.root={root}", "data.download=false", f"paths.output_dir={tmp_path}"]
    if which == "dataset":
        overrides.append("benchmark.growth_enabled=false")
        files = ["conll2000/train.txt.gz", "conll2000/test.txt.gz"]
    else:  # the dataset itself has no checksum here: only the label set's files are checked
        overrides += ["dataset.files.train.sha256=null", "dataset.files.test.sha256=null"]
        files = ["conll2000/train.txt.gz", "conll2000/test.txt.gz"] + [
            f"ud_english_ewt/en_ewt-ud-{split}.conllu" for split in ("train", "dev", "test")
        ]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        text = b"Confidence NN B-NP\n\n" if name.endswith(".gz") else b"1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n"
        (root / name).write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose(config_name="benchmark", overrides=overrides)
    with pytest.raises(SystemExit) as ended:
        run_checked(tracked(benchmark.check_settings), pytest.fail, cfg)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert ended.value.code == 2 and "SHA-256 of its text is" in errors[0] and "\n" not in errors[0], errors
    assert ("label_sets: ud_english_ewt_upos" in errors[0]) == (which == "label set")
    assert not list(tmp_path.glob("**/*.db"))


def test_the_model_benchmark_refuses_a_model_the_store_lacks_in_one_line(tmp_path, caplog):
    from pipeline.apps import model_benchmark

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = ["model_benchmark.model=models:/nosuch@champion", f"tracking.uri={store}", f"paths.output_dir={tmp_path}"]
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose(config_name="model_benchmark", overrides=overrides)
    try:
        with pytest.raises(SystemExit) as ended:
            model_benchmark.main(cfg)
    finally:  # its setup pointed MLflow at the test's store
        model_benchmark.mlflow.set_tracking_uri(None)
        model_benchmark.mlflow.set_registry_uri(None)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert ended.value.code == 2 and errors[0].startswith("bad setting model_benchmark.model=models:/nosuch@champion: ")


@pytest.mark.slow
def test_joint_ewt_label_set_has_over_100_labels(shared_data):
    from pipeline.stages.data import load_dataset

    cfg = _config(shared_data, Path("/tmp"))
    (entry,) = [e for e in cfg.benchmark.growth.label_sets if not isinstance(e, str) and "joint_label" in e]
    dataset = benchmark.OmegaConf.load(Path(CONF_DIR) / "dataset" / f"{entry.dataset}.yaml")
    data = load_dataset(benchmark.OmegaConf.to_container(dataset), shared_data, download=False, carve_dev=False)
    joint_labels(data, list(entry.joint_label))
    labels = {label for sentence in data.labels("train") for label in sentence}
    assert len(labels) > 100 and "NN|NOUN" in labels and all(label.count("|") == 1 for label in labels)

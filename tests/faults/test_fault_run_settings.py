"""Settings that would hand a model its own answers, carve a dev set that cannot be, or ask for what
a run will not do are refused with one line before any stage: a feature reading the label column,
an HMM observing it, the label set to the word column, a dev split outside (0, 1) or with a seed
that is no integer, a multirun whose jobs are asked to register with the sweep's registration off,
a negative seed, a feature set that reads nothing."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config  # noqa: E402

from pipeline.engine.stage import load_stages  # noqa: E402
from pipeline.engine.validate import SettingsError, validate_settings  # noqa: E402


def _refused(overrides: list[str], stages: tuple[str, ...] = ("prepare", "featurize", "train")) -> str:
    everything = load_stages()
    with pytest.raises(SettingsError) as caught:
        validate_settings(compose_config(overrides), [everything[name] for name in stages])
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dataset.label=pos"], "features.templates ('pos[-2]') reads the label column 'pos' of dataset 'conll2000'"),
        (["features.numeric=[chunk]"], "bad setting features.numeric reads the label column 'chunk'"),
        (
            ["+features.views.tag={column: chunk}", "features.templates=['w[0]','tag[0]']"],
            "features.views.tag reads the label column",
        ),
        (["features.templates=['w[0]','w[0] | chunk[-1]']"], "features.templates ('w[0] | chunk[-1]') reads the label column"),
        (["dataset.label=w"], "bad setting dataset.label='w': the word column, which the model reads"),
        (
            ["model=hmm", "dataset.hmm.observation=chunk"],
            "model.observation='chunk': the label column; the HMM would",
        ),
        (["model=hmm", "model.observation=nosuch"], "bad setting model.observation='nosuch': not one of the dataset's columns"),
        (["dataset.dev_split.fraction=1"], "dataset.dev_split.fraction=1: the share of the training sentences held out, between"),
        (["dataset.dev_split.fraction=0"], "bad setting dataset.dev_split.fraction=0: "),
        (["dataset.dev_split.fraction=-0.5"], "bad setting dataset.dev_split.fraction=-0.5: "),
        (["dataset.dev_split.fraction=nan"], "bad setting dataset.dev_split.fraction=nan: "),
        (["dataset.dev_split.seed=abc"], "bad setting dataset.dev_split.seed='abc': must be an integer"),
        (["~dataset.dev_split.seed"], "bad setting dataset.dev_split={'fraction': 0.1}: fraction and seed"),
        (["dataset.comment_prefix=''"], "bad setting dataset.comment_prefix='': a non-empty string, or null for none"),
        (["dataset.format=nosuch"], "bad setting dataset.format='nosuch': one of conll, conllu, xml_sequences"),
        (["trainer.num_memories=1000000000000"], "num_memories=1000000000000 is above 1000: L-BFGS keeps two weight"),
        # settings that failed inside a stage (hostile round 11: L6, L7)
        (["seed=-1"], "bad setting seed=-1: must be an integer >= 0"),
        (["dataset.dev_split.seed=-3"], "bad setting dataset.dev_split.seed=-3: must be an integer >= 0"),
        (["features.templates=[]"], "bad setting features.templates=[]: the feature set has no template, numeric column or word"),
        # a dev split beside a dev file was ignored, while the run's name and keys changed (L15)
        (
            ["dataset=ud_english_ewt_upos", "features=pos", "dataset.dev_split={fraction: 0.1, seed: 1}"],
            "bad setting dataset.dev_split: dataset 'ud_english_ewt_upos' has a dev file (ud_english_ewt/en_ewt-ud-dev.conllu)",
        ),
        (["dataset.files.test=null"], "bad setting dataset.files.test=null: dataset 'conll2000' needs a test file"),  # L19
        (
            ["dataset=bc5cdr", "features=bio_ner", "dataset.files.dev=null"],
            "bad setting dataset.files.dev=null: dataset "
            "'bc5cdr' would have no dev split; set dataset.dev_split={fraction: 0.1, seed: 1} as well",
        ),
        (["dataset.files.train=null"], "bad setting dataset.files.train=null: dataset 'conll2000' needs a train file"),
    ],
)
def test_a_setting_that_hands_the_model_its_answers_or_no_dev_set_is_refused(overrides, message):
    assert message in _refused(overrides)


def test_the_shipped_datasets_and_their_feature_sets_pass():
    stages = [load_stages()[name] for name in ("prepare", "featurize", "train")]
    for overrides in (
        [],
        ["model=hmm"],
        ["dataset=bc5cdr", "features=bio_ner"],
        ["dataset=ud_english_ewt_upos", "features=pos"],
        ["dataset=anystyle", "features=references"],
        ["dataset.dev_split.fraction=0.5", "dataset.dev_split.seed=3"],
        ["dataset.dev_split.fraction='0.2'", "dataset.dev_split.seed='7'"],  # text, as ${oc.env:...} gives it
        ["dataset=ud_english_ewt_upos", "features=pos", "dataset.dev_split={fraction: 0.1, seed: 1}", "dataset.files.dev=null"],
    ):
        validate_settings(compose_config(overrides), stages)


def test_the_semi_supervised_hmm_arms_may_not_observe_the_label():
    semi = load_stages()["semi_supervised"]
    with pytest.raises(SettingsError, match=r"^bad setting dataset.hmm.observation='chunk': the label column"):
        semi.validate(compose_config(["+experiment=semi_supervised", "dataset.hmm.observation=chunk"]))


def test_a_dev_split_that_leaves_no_training_sentence_is_a_settings_error(tmp_path):
    """One training sentence and a dev split: the split took it, and featurising the empty training
    set ended in "no sentences given" with a traceback."""
    from pipeline.stages.data import load_dataset

    (tmp_path / "t").mkdir()
    for split, word in (("train", "a"), ("test", "c")):
        (tmp_path / "t" / f"{split}.txt").write_text(f"{word} B-NP\nb I-NP\n")
    dataset = {
        "name": "t", "format": "conll", "columns": ["w", "chunk"], "label": "chunk", "dev_split": {"fraction": 0.1, "seed": 1},
        "files": {"train": {"path": "t/train.txt"}, "test": {"path": "t/test.txt"}},
    }  # fmt: skip
    with pytest.raises(SettingsError, match=r"^bad setting dataset.dev_split.fraction=0.1: dataset 't' has 1 training sentence"):
        load_dataset(dataset, tmp_path)


def test_a_multirun_asked_to_register_with_the_sweeps_registration_off_is_refused():
    """Every job of such a multirun skipped registering (a sweep registers its best job itself), and
    the sweep did not either: nothing was registered, without a word (K12)."""
    from pipeline.__main__ import composition_refusal

    refused = composition_refusal(["-m", "trainer.c2=0.01,1", "registry.register=true", "registry.sweep=false"])
    assert refused.startswith("bad setting registry.register=true: in a multirun the sweep registers its best job on dev")
    assert composition_refusal(["-m", "trainer.c2=0.01,1", "registry.register=true"]) is None  # the sweep registers
    assert composition_refusal(["-m", "trainer.c2=0.01,1", "registry.sweep=false"]) is None  # nothing asked
    assert composition_refusal(["registry.register=true", "registry.sweep=false"]) is None  # a single run registers


@pytest.mark.parametrize(
    ("argument", "why"),
    [
        ("trainer.c2=choice()", "empty choice is not legal"),
        ("trainer.c2=interval(1)", "missing a required argument: 'end'"),
        ("features.templates=[w[0]]", "no viable alternative at input '[w['"),
    ],
)
def test_an_override_that_does_not_parse_is_named_in_one_line(argument, why):
    """Hydra printed its grammar error in four lines with exit code 1 (K11); now the one line names
    the override."""
    from pipeline.__main__ import composition_refusal

    for argv in (["-m", "trainer.c1=0,1", argument], [argument]):
        refused = composition_refusal(argv)
        assert refused.startswith(f"bad setting {argument}: ") and why in refused and "\n" not in refused


def test_a_sweep_over_a_hydra_setting_is_named_in_one_line():
    """``+hydra.sweeper.params.model.order=interval(1,2)`` (one key added to an Optuna search space
    the way other keys are added) was Hydra's 3-line "Sweeping over Hydra's configuration is not
    supported", exit 1, as the sweep started."""
    from pipeline.__main__ import composition_refusal

    for argument in ("+hydra.sweeper.params.model.order=interval(1,2)", "hydra.sweeper.n_trials=1,2"):
        refused = composition_refusal(["-m", "hydra/sweeper=optuna", argument])
        assert refused.startswith(f"bad setting {argument}: a sweep over one of Hydra's own settings"), refused
        assert "\n" not in refused
    assert "model.order=..." in composition_refusal(["-m", "+hydra.sweeper.params.model.order=interval(1,2)"])
    assert composition_refusal(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "model.order=choice(1,2)"]) is None


def test_a_view_or_lexicon_is_added_with_a_plus_as_named_data():
    """``+features.views.cv=...`` was refused as "features has no key 'views.cv'" right after Hydra
    had said to use '+' (K15); a view adds an entry, as a template does. The view is still
    checked: one over the label column is refused."""
    from hydra import compose, initialize_config_dir
    from pipeline_helpers import CONF_DIR

    def composed(overrides):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose(config_name="config", overrides=overrides, return_hydra_config=True)

    stages = [load_stages()[name] for name in ("prepare", "featurize", "train")]
    added = ["+features.views.cv={column: w, fn: lower}", "features.templates=['w[0]','cv[-1]']"]
    validate_settings(composed(added), stages)
    with pytest.raises(SettingsError, match="features.views.lab reads the label column 'chunk'"):
        validate_settings(composed(["+features.views.lab={column: chunk}", "features.templates=['lab[0]']"]), stages)
    with pytest.raises(SettingsError, match=r"^bad setting \+trainer.c22: trainer has no key 'c22'"):
        validate_settings(composed(["+trainer.c22=1"]), stages)


def test_a_split_set_to_null_has_no_file(tmp_path):
    """``dataset.files.dev=null`` (to carve the dev split from train instead) read as "no dev file",
    not as a file entry without a path (a TypeError inside prepare)."""
    from pipeline_helpers import write_corpus

    from pipeline.stages.data import config_data_problem, load_dataset

    root = write_corpus(tmp_path / "data", n_train=20, n_test=5)
    checksums = ["dataset.files.train.sha256=null", "dataset.files.test.sha256=null"]
    cfg = compose_config([f"data.root={root}", "data.download=false", "+dataset.files.dev=null", *checksums])
    assert config_data_problem(cfg) is None
    from omegaconf import OmegaConf

    data = load_dataset(OmegaConf.to_container(cfg.dataset, resolve=True), root, download=False)
    assert len(data.splits["dev"]) + len(data.splits["train"]) == 20 and len(data.splits["test"]) == 5


def test_a_bad_numeric_cell_is_one_line_naming_the_file_and_line_before_training(tmp_path):
    """A numeric feature column holding 'nan', '1_0' or text ended the run in a 33-line traceback
    from featurize (L13): one line (a data error, exit status 2) naming the file and line, from the
    prepare stage that reads the file."""
    from pipeline_helpers import tiny_overrides, write_corpus

    from crf.io import DataFormatError
    from pipeline.__main__ import run_pipeline

    root = write_corpus(tmp_path / "data", n_train=10, n_test=5)
    cfg = compose_config([*tiny_overrides(root, tmp_path / "out"), "features.numeric=[pos]", "stages=[featurize]"])
    where = r"train\.txt\.gz:1: numeric column 'pos' \(features\.numeric\) has the non-numeric value '\w+'$"
    with pytest.raises(DataFormatError, match=where):
        run_pipeline(cfg)


def test_a_tracking_store_that_is_another_programs_file_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """``tracking.uri`` at an Optuna study's database (or another program's, or a text file) started
    MLflow's schema migration in it: MLflow's tables written into the study's database, then a
    110-line alembic traceback, exit 1. An unknown scheme was a 46-line traceback."""
    import contextlib
    import importlib.util
    import sqlite3

    import optuna

    from pipeline.__main__ import composition_refusal
    from pipeline.tracking import TrackingUnavailable, check_store_exists
    from pipeline.tracking.lifecycle import prepare_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="s")
    (tmp_path / "notes.db").write_text("not a database\n")

    def tables() -> set[str]:
        with sqlite3.connect(tmp_path / "optuna.db") as connection:
            return {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    before = tables()
    for argv in (
        [f"tracking.uri=sqlite:///{tmp_path / 'optuna.db'}"],
        ["-m", "trainer.c2=0.1,1", f"tracking.uri=sqlite:///{tmp_path / 'optuna.db'}"],
    ):
        refused = composition_refusal(argv)
        assert refused.startswith(f"bad setting: the tracking store sqlite:///{tmp_path / 'optuna.db'} (tracking.uri or ")
        assert "is another program's database (tables alembic_version, studies" in refused and "\n" not in refused
    assert tables() == before and "experiments" not in before
    assert "is not an SQLite database" in composition_refusal([f"tracking.uri=sqlite:///{tmp_path / 'notes.db'}"])
    assert "MLflow has no tracking store for the scheme 'nosuch'" in composition_refusal(["tracking.uri=nosuch://x/y"])
    # spellings that reached MLflow all the same: a query string, an upper-case scheme; a file store, which MLflow 3 refuses
    assert "another program's database" in composition_refusal([f"tracking.uri='sqlite:///{tmp_path / 'optuna.db'}?timeout=20'"])
    assert "write the scheme 'SQLITE' in lower case" in composition_refusal([f"tracking.uri=SQLITE:///{tmp_path / 'x.db'}"])
    for folder in (f"file://{tmp_path / 'mlruns'}", str(tmp_path / "mlruns")):
        assert "MLflow 3 no longer opens a file store" in composition_refusal([f"tracking.uri={folder}"])
    for spelling in (
        f"sqlite+pysqlite:///{tmp_path / 'optuna.db'}",
        f"'sqlite:///file:{tmp_path / 'optuna.db'}?uri=true'",
        f"sqlite:///{tmp_path / 'new' / '..' / 'optuna.db'}",  # the store's folder is made first, then ``..`` walks out of it
    ):
        assert "another program's database" in composition_refusal([f"tracking.uri={spelling}"]), spelling
    assert not (tmp_path / "new").exists()
    assert "an in-memory SQLite database" in composition_refusal(["tracking.uri=sqlite://"])
    if importlib.util.find_spec("MySQLdb") is None:  # mysql:// loads mysqlclient, which the project does not install
        assert "its database driver is not installed" in composition_refusal(["tracking.uri=mysql://u@127.0.0.1:1/m"])
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{tmp_path / 'optuna.db'}")  # where the run registers its model
    registering = composition_refusal(["registry.register=true", f"paths.output_dir={tmp_path / 'out'}"])
    assert registering.startswith("bad setting: the registry store") and "another program's database" in registering
    monkeypatch.delenv("MLFLOW_REGISTRY_URI")
    with pytest.raises(TrackingUnavailable, match="another program's database"):  # the tag command reads models from it
        check_store_exists(f"sqlite:///{tmp_path / 'optuna.db'}")
    (tmp_path / "empty.db").write_bytes(b"")  # a new store to write, but none to read a model from: not made into one
    with pytest.raises(FileNotFoundError, match="no MLflow store at"):
        check_store_exists(f"sqlite:///{tmp_path / 'empty.db'}")
    assert (tmp_path / "empty.db").stat().st_size == 0
    assert tables() == before
    with contextlib.closing(sqlite3.connect(tmp_path / "alike.db")) as alike:  # MLflow's table names, not its schema
        alike.executescript("CREATE TABLE experiments (x); CREATE TABLE runs (x); CREATE TABLE alembic_version (version_num);")
    assert "another program's database" in composition_refusal([f"tracking.uri=sqlite:///{tmp_path / 'alike.db'}"])
    for key in ("paths.output_dir", "data.root"):  # a sweep passes both to its jobs' environment, which a quote cannot reach
        refused = composition_refusal(["-m", "trainer.c2=0.1,1", f'{key}="{tmp_path}/it\'s"'])
        assert refused.startswith(f"bad setting {key}=") and "cannot carry" in refused, refused
        assert "cannot carry" not in (composition_refusal([f'{key}="{tmp_path}/it\'s"']) or "")  # a single run is given none
    prepare_store(f"sqlite:///{tmp_path / 'mlflow.db'}")  # an MLflow store, and a new file: fine
    for store in ("mlflow.db", "new.db"):
        assert composition_refusal([f"tracking.uri=sqlite:///{tmp_path / store}"]) is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("+features.lexicons.loc={path: /nonexistent/loc.txt}", "bad setting features: lexicon 'loc': no file /nonexistent/"),
        ("+features.lexicons.loc={path: /tmp}", "bad setting features: lexicon 'loc': no file /tmp"),  # a folder
        ("+features.views.br4={column: w, fn: cluster, path: /nonexistent/p.txt, n: 4}", "bad setting features: view br4: no"),
    ],
)
def test_a_missing_lexicon_or_view_file_is_a_settings_error(override, message):
    """It was found only as the featurize stage's key was computed, after a run opened and prepare
    ran: a traceback, a FAILED run, and in a sweep FAILED jobs or an Optuna study (round 23)."""
    from pipeline.engine.runner import validated_plan

    with pytest.raises(SettingsError, match="^" + re.escape(message)):
        validated_plan(compose_config(["features=ner", override]))


@pytest.mark.parametrize(
    "override, message",
    [
        ("semi.hmm_order=5", "semi.hmm_order=5: 1 or 2"),
        ("semi.hmm_k=-1", "semi.hmm_k=-1: a finite add-k constant >= 0"),
        ("semi.hmm_k=abc", "semi.hmm_k='abc': a finite add-k constant >= 0"),
        ("semi.seed=abc", "semi.seed='abc': a whole number >= 0"),
    ],
)
def test_semi_supervised_settings_the_hmm_would_refuse_are_refused_before_any_run(override, message):
    """They passed the settings check and failed in a traceback once the sweep's parent run and the
    jobs' runs were open, all left FAILED (round 24)."""
    from pipeline.engine.runner import validated_plan

    with pytest.raises(SettingsError, match=re.escape(message)):
        validated_plan(compose_config(["+experiment=semi_supervised", override]))


@pytest.mark.parametrize(
    "override",
    ["comparison.bootstrap_samples=-1", "comparison.seed=abc", "comparison.top_labels=abc", "comparison.top_labels=-1",
     "+comparison.top_label=5"],
)  # fmt: skip
def test_comparison_settings_are_refused_before_the_sweep(override, caplog):
    """``comparison.bootstrap_samples=-1`` ran every job, then the summary failed: the parent run
    FAILED, exit status 0 (round 24)."""
    from pipeline.sweeps.callback import check_sweeper_settings

    with pytest.raises(SystemExit) as ended:
        check_sweeper_settings(compose_config(["+experiment=hmm_vs_crf", override]))
    assert ended.value.code == 2 and f"bad setting {override.split('=')[0].lstrip('+')}" in caplog.text

"""Fault injection on settings: bad values from the command line fail at once, with one line naming
the setting, before any stage runs."""

from __future__ import annotations

import os
from pathlib import Path

import forkserver
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import CONF_DIR, compose_config, tiny_overrides, write_corpus  # noqa: E402

from crf.features import FeatureExtractor  # noqa: E402
from pipeline.engine.validate import SettingsError, validate_settings  # noqa: E402


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.c2=abc"], "bad setting trainer.c2='abc': c2 must be a number"),
        (["trainer.c2=-1"], "bad setting trainer.c2=-1: c2 must be a finite number >= 0"),
        (["trainer.c2=nan"], "bad setting trainer.c2=nan: c2 must be a finite number"),
        (["trainer.c2=1" + "0" * 400], "c2 must be a finite number, got a value too large for a float"),
        # a strength no data can move the weights against is refused before any stage, not at training (R6b-3)
        (["trainer.c2=1e300"], "bad setting trainer.c2=1e+300: c2=1e+300 is above 1e+12: a prior this strong keeps"),
        (["trainer=sgd", "trainer.c2=1e13"], "c2=1e+13 is above 1e+12"),
        (["trainer=sgd", "trainer.c2=5e-324"], "algorithm='l2sgd' needs c2 >= 1e-100, got 4.94066e-324"),
        (["trainer=elasticnet", "trainer.strength=1e300"], "c2=1e+300 is above 1e+12"),
        (["trainer=l1", "trainer.strength=-0.5"], "bad setting trainer.c1=-0.5"),
        (["trainer.max_iterations=-1"], "bad setting trainer.max_iterations=-1: max_iterations must be a finite number >= 1"),
        (["trainer.max_iterations=2.5"], "max_iterations must be an integer"),
        (["trainer.num_memories=0"], "bad setting trainer.num_memories=0"),
        (["trainer.threads=0"], "bad setting trainer.threads=0"),
        (["trainer.algorithm=newton"], "unknown algorithm 'newton'"),
        (["trainer=sgd", "trainer.c2=0"], "needs c2 > 0"),
        (["trainer=elasticnet", "trainer.strength=abc"], "bad setting in trainer"),
        (["model.all_possible_states=maybe"], "bad setting model.all_possible_states='maybe'"),
        (["model=hmm", "model.transition_smoothing=add-k", "model.k=0"], "bad setting model.k=0: add-k smoothing needs k > 0"),
        (["model=hmm", "model.k=abc"], "bad setting model.k='abc': must be a number"),
        (["model=hmm", "model.order=3"], "bad setting model.order=3: order must be 1 or 2"),
        (["model=hmm", "model.capitalization=no"], "bad setting model.capitalization='no': capitalization must be True or False"),
        (["model=hmm", "model.emission_smoothing=kneser-ney"], "bad setting model.emission_smoothing='kneser-ney'"),
        (["model=hmm", "model.rare_threshold=-1"], "bad setting model.rare_threshold=-1"),
        (["model.adapter=pipeline.models.nothing.Adapter"], "bad setting model.adapter"),
        (["data.train_fraction=0"], "bad setting data.train_fraction=0: must be a number in (0, 1]"),
        (["data.train_fraction=1.5"], "bad setting data.train_fraction=1.5"),
        (["seed=x"], "bad setting seed='x': must be an integer"),
        (["train.dev_every=-2"], "bad setting train.dev_every=-2"),
    ],
)
def test_bad_settings_fail_with_one_line_naming_them(overrides, message):
    with pytest.raises(SettingsError) as caught:
        validate_settings(compose_config(overrides))
    text = str(caught.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dataset=anystyle", "features=references", "features.lexicons.months.lowercase=no"],
         "bad setting features.lexicons.months.lowercase='no': true or false"),
        (["+features.views.suffix.lowercase=0", "+features.views.suffix.column=w"],
         "bad setting features.views.suffix.lowercase=0"),
    ],
)  # fmt: skip
def test_every_switch_of_a_stage_is_true_or_false_before_any_stage(overrides, message):
    # every switch is true or false, not only the listed ones: a lexicon's lowercase=no was read as true (G9)
    from pipeline.engine.runner import validated_plan

    with pytest.raises(SettingsError) as caught:
        validated_plan(compose_config(overrides))
    assert message in str(caught.value)
    with pytest.raises(ValueError, match=r"view 'x': lowercase='no' must be true or false"):
        FeatureExtractor(columns=["w"], templates=["x[0]"], views={"x": {"column": "w", "lowercase": "no"}})
    with pytest.raises(ValueError, match=r"padding='no' must be true or false"):
        FeatureExtractor(columns=["w"], templates=["w[0]"], padding="no")


def test_a_download_url_off_the_web_is_refused_before_any_stage():
    # a file:// URL copied /etc/passwd into the data root as a "download" (hostile round 8, a note)
    from pipeline.engine.runner import validated_plan

    for url in ("file:///etc/passwd", "ftp://host/train.txt.gz", "/etc/passwd"):
        with pytest.raises(SettingsError, match=rf"^bad setting dataset.files.train.url='{url}': a download URL must be http"):
            validated_plan(compose_config([f"dataset.files.train.url={url}"]))
    validated_plan(compose_config(["dataset.files.train.url=null"]))  # no URL: a missing file is not downloaded


def test_a_checksum_in_upper_case_hex_is_the_same_checksum(tmp_path):
    from pipeline.stages.data import ChecksumError, resolve_files, text_sha256

    root = write_corpus(tmp_path / "data", n_train=5, n_test=2)
    digest = text_sha256(root / "conll2000" / "train.txt.gz")
    dataset = {"name": "toy", "files": {"train": {"path": "conll2000/train.txt.gz", "sha256": digest.upper()}}}
    assert resolve_files(dataset, root, download=False)["train"] == root / "conll2000" / "train.txt.gz"
    dataset["files"]["train"]["sha256"] = "0" * 64
    with pytest.raises(ChecksumError, match="expected 0000"):
        resolve_files(dataset, root, download=False)


def test_the_library_refuses_a_strength_no_data_can_move_before_any_iteration(tmp_path):
    from crf import CRF, pycrfsuite

    X, y = [[{"w=a": 1.0}, {"w=b": 1.0}]] * 3, [["A", "B"]] * 3
    iterations = []
    with pytest.raises(ValueError, match=r"c2=1e\+13 is above 1e\+12"):
        CRF(c2=1e13, callback=iterations.append).fit(X, y)
    assert iterations == []
    assert CRF(c2=1e12, max_iterations=3).fit(X, y).n_iter_ >= 1  # the bound itself trains
    assert CRF(c1=1e300, c2=0).fit(X, y).n_active_features_ == 0  # an L1 prior this strong: zero weights, the exact optimum
    trainer = pycrfsuite.Trainer(verbose=False)
    for xseq, yseq in zip(X, y):
        trainer.append(xseq, yseq)
    trainer.set_params({"c2": 1e300})
    with pytest.raises(ValueError, match=r"c2=1e\+300 is above 1e\+12"):
        trainer.train(str(tmp_path / "model.crfsuite"))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("group", ["model", "trainer"])
def test_every_shipped_model_and_trainer_passes(group):
    for option in sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml")):
        validate_settings(compose_config([f"{group}={option}"]))
    if group == "model":  # (each checked once, not in both cases)
        validate_settings(compose_config(["model=hmm", "model.transition_smoothing=add-k", "model.k=0.5"]))
    else:
        validate_settings(compose_config(["trainer.c2=1", "trainer.max_iterations=5", "train.dev_every=0"]))  # int for float


@pytest.mark.parametrize("bad", ["trainer.c2=abc", "trainer.max_iterations=-1"])
def test_the_pipeline_fails_before_prepare(tmp_path, bad):
    from pipeline.__main__ import run_pipeline

    data_root = write_corpus(tmp_path / "data", n_train=10, n_test=5)
    with pytest.raises(SettingsError, match="bad setting"):
        run_pipeline(compose_config(tiny_overrides(data_root, tmp_path / "out") + [bad]))
    assert not (tmp_path / "out" / "cache" / "prepare").exists()  # nothing was prepared


def _compose_with_overrides(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+trainer.c22=1"], "bad setting +trainer.c22: trainer has no key 'c22'"),
        (["+trainer.c22=1"], "did you mean trainer.c2?"),
        (["+data.train_fractoin=0.5"], "did you mean data.train_fraction?"),
        (["++evaluate.bins=3"], "bad setting +evaluate.bins"),
        (["model=hmm", "+model.kk=1"], "did you mean model.k?"),
        (["dataset.scheme=IOB3"], "bad setting dataset.scheme='IOB3': one of IOB1, IOB2, IOBES, none"),
        (["dataset.label=chunks"], "bad setting dataset.label='chunks': not one of the columns"),
        (["dataset.columns=[w,w,chunk]"], "a column name is repeated"),
        (["train.dev_every=null"], "bad setting train.dev_every=None"),
        (["sweep.summary=grids"], "bad setting sweep.summary='grids'"),
        (["stages=[active_learning]", "active_learning.arm=bogus"], "active_learning.arm='bogus'"),
        (["stages=[active_learning]", "active_learning.batch_tokens=abc"], "active_learning.batch_tokens='abc'"),
        (["stages=[active_learning]", "+active_learning.rnds=3"], "did you mean active_learning.rounds?"),
        (["stages=[active_learning]", "active_learning.seed=-1"], "active_learning.seed=-1: a whole number >= 0"),
        (["stages=[active_learning]", "active_learning.token_budget=abc"], "active_learning.token_budget='abc'"),
        (["evaluate.calibration_bins=0"], "bad setting evaluate.calibration_bins=0"),
        (["stages=[nothing]"], "unknown stage 'nothing'"),
        # the strength sets c1 and c2: an l1 run with c2 set would train elastic net, recorded as l1 at strength 1
        (["trainer=l1", "trainer.strength=1", "trainer.c2=0.1"], "bad setting trainer.c2=0.1 with trainer.strength=1"),
        (["trainer.c1=0.5", "trainer.strength=2"], "bad setting trainer.c1=0.5 with trainer.strength=2"),
        (["+experiment=active_learning", "trainer.strength=0.5"], "bad setting trainer.strength=0.5: c1 and c2 of trainer=lbfgs"),
    ],
)
def test_an_added_or_misspelt_key_is_refused_like_a_bad_value(overrides, message, tmp_path):
    from pipeline.__main__ import run_pipeline

    with pytest.raises(SettingsError) as caught:
        run_pipeline(_compose_with_overrides(overrides + [f"paths.output_dir={tmp_path}"]))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_keys_are_refused_without_the_command_line_too():
    """A key added in a config file (or by a compose without Hydra's own config) is checked
    against what the trainer, model and dataset sections can hold."""
    for overrides, message in (
        (["+trainer.c22=1"], "bad setting trainer.c22: trainer has no such key; did you mean trainer.c2?"),
        (["+model.all_possible_state=true"], "did you mean model.all_possible_states?"),
        (["+dataset.seperator=x"], "bad setting dataset.seperator: dataset has no such key; did you mean dataset.separator?"),
        # a dataset's CRF defaults, and the name earlier versions gave the candidate threshold
        (["+dataset.crf.pruning_threshold=0.01"], "bad setting dataset.crf.pruning_threshold: dataset.crf has no such key; "
         "did you mean dataset.crf.candidate_threshold?"),
        (["+model.pruning_threshold=0.01"], "did you mean model.candidate_threshold?"),
        (["+dataset.crf=0.01"], "bad setting dataset.crf=0.01: a mapping of CRF settings"),
    ):  # fmt: skip
        with pytest.raises(SettingsError, match=message.replace("?", "\\?")):
            validate_settings(compose_config(overrides))
    # an optional dataset key may be added, and any parameter the model's estimator has; experiments
    # and Hydra's own keys are untouched
    validate_settings(_compose_with_overrides(["+dataset.separator=' '"]))
    validate_settings(_compose_with_overrides(["+trainer.max_linesearch=40", "+model.min_freq=1"]))
    validate_settings(_compose_with_overrides(["+experiment=anystyle", "+hydra.job.env_set.X=1"]))


def _run_pipeline_command(tmp_path: Path, *overrides: str):
    import sys

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    return forkserver.run(
        [sys.executable, "-m", "pipeline", f"paths.output_dir={tmp_path / 'out'}", *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["trainer.c2=-1"], "bad setting trainer.c2=-1: c2 must be a finite number >= 0"),
        (["+trainer.c22=1"], "bad setting +trainer.c22: trainer has no key 'c22'"),
        (["dataset.scheme=BILOU"], "bad setting dataset.scheme='BILOU'"),
    ],
)
def test_the_command_reports_a_bad_setting_in_one_line_without_a_traceback(tmp_path, overrides, line):
    done = _run_pipeline_command(tmp_path, *overrides)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and line in output
    assert [text for text in output.splitlines() if "ERROR" in text] == [next(t for t in output.splitlines() if line in t)]
    assert not (tmp_path / "out" / "cache").exists()  # refused before any stage


@pytest.mark.slow
def test_the_command_reports_a_bad_data_line_in_one_line_without_a_traceback(tmp_path):
    import gzip

    root = write_corpus(tmp_path / "data", n_train=20, n_test=5)
    train = root / "conll2000" / "train.txt.gz"
    lines = gzip.decompress(train.read_bytes()).decode().split("\n")
    lines[4] = "word POS"  # two columns where three belong
    train.write_bytes(gzip.compress("\n".join(lines).encode()))
    done = _run_pipeline_command(
        tmp_path, f"data.root={root}", "data.download=false", "dataset.files.train.sha256=null", "dataset.files.test.sha256=null"
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    assert f"{train}:5: expected 3 columns, found 2: 'word POS'" in output
    assert not list((tmp_path / "out" / "cache" / "prepare").glob("*"))  # no entry, no temporary folder


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            ["dataset=ud_english_ewt_upos", "features=chunking"],
            r"features.templates: 'pos\[-2\]' reads 'pos'",
        ),
        (["features=chunking", "+features.views.up={column: upos, fn: lower}"], r"features.views.up: it reads column 'upos'"),
        (["features=chunking", "features.numeric=[width]"], r"features.numeric: 'width' is not a column"),
    ],
)
def test_a_feature_set_that_reads_a_column_the_dataset_lacks_is_refused_before_any_stage(overrides, match):
    from pipeline.stages.featurize import Featurize

    cfg = compose_config(overrides)
    with pytest.raises(SettingsError, match=match):
        Featurize().validate(cfg)


def test_a_feature_set_that_reads_columns_the_dataset_has_passes():
    # (checked once: it was checked again, the same, in each case of the test above)
    from pipeline.stages.featurize import Featurize

    Featurize().validate(compose_config(["features=chunking"]))  # conll2000 has the POS column


def test_an_integer_beyond_a_floats_range_is_one_setting_error_everywhere():
    """``trainer.c2=<400 digits>`` and such strengths or sweep ends raised a bare OverflowError
    (a Hydra traceback, exit 1) where every other bad number is one line (round 43)."""
    from hydra.core.override_parser.types import RangeSweep

    from crf import CRF
    from pipeline.sweeps import search
    from pipeline.sweeps.grid_preflight import range_problem
    from pipeline.sweeps.path import path_strengths

    huge = 10**400
    with pytest.raises(ValueError, match="^c1 must be a finite number, got a value too large for a float"):
        CRF(c1=huge).fit([[{"a": 1}]], [["A"]])
    config = compose_config(["+experiment=reg_path"])
    config.path.strengths = [huge, 1]
    with pytest.raises(SettingsError, match="is not a positive number"):
        path_strengths(config)
    assert "must be finite numbers" in range_problem("trainer.c2", RangeSweep(start=0, stop=huge, step=1))
    with pytest.raises(search.SweeperSettingError):  # one line, however Hydra's parser or ours refuses it
        search.parse_space({"trainer.c2": f"interval(0, {huge})"}, [])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"order": 1.0}, "order must be 1 or 2, got 1.0"),  # passed as 1, then an IndexError in fit (round 44)
        ({"rare_threshold": 10**400}, "rare_threshold must be a whole number >= 0 and at most"),
        ({"k": 10**400, "transition_smoothing": "add-k"}, "k must be a finite number, got a value too large for a float"),
        ({"block_elements": 10**400}, "block_elements must be a finite number, got a value too large for a float"),
    ],
)
def test_hmm_parameters_are_checked_before_counting(params, message):
    from crf.hmm import HMM

    with pytest.raises(ValueError, match=message):
        HMM(**params).fit([["a", "b"]], [["A", "B"]])


def test_a_fraction_beyond_a_floats_range_is_named():
    """The check's own message called ``.bit_length()``, which a Fraction lacks (round 44)."""
    from fractions import Fraction

    from crf import CRF

    with pytest.raises(ValueError, match="^c1 must be a finite number, got a value too large for a float"):
        CRF(c1=Fraction(10**400, 3)).fit([[{"a": 1}]], [["A"]])


def test_a_flag_between_settings_is_one_line_that_quotes_no_value(caplog):
    """``python -m pipeline a=b -m storage=<url>``: Hydra's argument parser printed the settings
    after the flag, a password too, as unrecognized arguments (round 44)."""
    from pipeline.__main__ import composition_refusal
    from pipeline.apps import exit_if_uncomposable

    argv = ["model=hmm", "-m", "hydra/sweeper=optuna", "hydra.sweeper.storage=postgresql://alice:S3CR3T@127.0.0.1:1/db"]
    refused = composition_refusal(argv)
    assert refused is not None and refused.startswith("bad command line: put -m") and "S3CR3T" not in refused
    with pytest.raises(SystemExit) as ended:
        exit_if_uncomposable("tag", ["models=x", "-m", "tracking.uri=http://a:S3CR3T@h"])
    assert ended.value.code == 2 and "put -m" in caplog.text and "S3CR3T" not in caplog.text


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"labelled_weight": -1}, "labelled_weight must be a finite number >= 0"),  # ran 20 iterations of NaN (round 45)
        ({"tolerance": float("nan")}, "tolerance must be a finite number >= 0"),
        ({"iterations": -5}, "iterations must be a finite number >= 0"),  # ran none, quietly
        ({"iterations": 2.5}, "iterations must be an integer"),
    ],
)
def test_baum_welch_settings_are_checked_before_the_first_iteration(params, message):
    from crf.hmm import HMM

    model = HMM(transition_smoothing="add-k", emission_smoothing="add-k").fit([["a", "b"]], [["A", "B"]])
    with pytest.raises(ValueError, match=message):
        model.baum_welch([["a", "c"]], **params)


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        (None, "a token must be a non-empty string"),
        (1, "a token must be a non-empty string"),
        (1.5, "a token must be a non-empty string"),
        ("", "a token must be a non-empty string"),
        (" ", "a token must not hold whitespace"),
        ("New York", "a token must not hold whitespace"),
        ("a\ud800", "a token must be text that UTF-8 can write"),
        ("\ufeffa", "a token must not begin with U\\+FEFF"),
    ],
)
def test_hmm_tokens_the_served_model_would_refuse_are_named(token, problem):
    """A None token failed deep in numpy; 1 and '1' became two words that print alike (round 45); an
    empty token, one holding whitespace and one with a lone surrogate (which then failed the
    model's save) were learnt, though the served model and the tag command refuse them (rounds 46, 47)."""
    from crf.hmm import HMM

    error = ValueError if isinstance(token, str) else TypeError
    with pytest.raises(error, match=f"^X: sequence 1, token 0: {problem}"):
        HMM().fit([["a"], [token, "b"]], [["A"], ["A", "B"]])
    model = HMM(transition_smoothing="add-k", emission_smoothing="add-k").fit([["a", "b"]], [["A", "B"]])
    with pytest.raises(error, match=f"^X_unlabelled: sequence 0, token 1: {problem}"):
        model.baum_welch([["a", token]])
    with pytest.raises(error, match=f"^X: sequence 0, token 1: {problem}"):
        model.predict([["a", token]])

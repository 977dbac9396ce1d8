"""Evaluation splits that are (mostly) an earlier split are refused: a dev file that is the test file
or a test file that is the training file gave "dev_accuracy 72.70, test_accuracy 72.70" without a
word, and an Optuna sweep on such settings tuned on the test set (L11)."""

from __future__ import annotations

import logging
import shutil

import pytest
from pipeline_helpers import compose_config, make_sentence, tiny_overrides, write_corpus

from pipeline.engine.validate import SettingsError
from pipeline.stages.data import check_disjoint, config_data_problem, load_dataset


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("data"), n_train=30, n_test=10)


def _dataset(data_root, *overrides: str) -> tuple:
    cfg = compose_config([*tiny_overrides(data_root, data_root / "out"), *overrides])
    from omegaconf import OmegaConf

    return cfg, OmegaConf.to_container(cfg.dataset, resolve=True)


def test_two_splits_that_name_one_file_are_refused_before_a_run(data_root):
    cfg, _ = _dataset(data_root, "dataset.files.test.path=conll2000/train.txt.gz")
    assert config_data_problem(cfg) == (
        f"dataset 'conll2000': the train and test files are the same file ({data_root / 'conll2000' / 'train.txt.gz'}): "
        "test scores would be train scores; name another file (dataset.files.test.path)"
    )
    (data_root / "conll2000" / "link.txt.gz").symlink_to(data_root / "conll2000" / "test.txt.gz")
    cfg, _ = _dataset(data_root, "+dataset.files.dev={path: conll2000/link.txt.gz}")
    assert "the test and dev files are the same file" in config_data_problem(cfg)  # through a link too
    assert config_data_problem(_dataset(data_root)[0]) is None


def test_a_copy_of_an_earlier_split_is_refused_as_the_run_reads_it(data_root, tmp_path):
    shutil.copy(data_root / "conll2000" / "train.txt.gz", tmp_path / "copy.txt.gz")
    cfg, dataset = _dataset(data_root, f"dataset.files.test.path={tmp_path / 'copy.txt.gz'}")
    assert config_data_problem(cfg) is None  # another file: found by content
    message = r"^dataset 'conll2000': 30 of the 30 sentences of 3\+ tokens \(100%\) of the test file .*copy.txt.gz also occur "
    with pytest.raises(SettingsError, match=message + r"in the train file .*train.txt.gz: scores on one would measure memory"):
        load_dataset(dataset, data_root, download=False)


def test_a_split_mostly_seen_before_is_refused_and_a_share_is_warned_about(caplog):
    """A test file cut from the training file, or a dev file that is the test file but for one
    sentence, was only warned about (L17); short sentences repeat in some data, so a share of
    the test sentences seen in training is a warning with the count, from a fifth on."""
    import numpy as np

    rng = np.random.default_rng(3)
    train = [make_sentence(rng) for _ in range(20)]
    fresh = [make_sentence(rng) for _ in range(10)]
    paths = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}
    with pytest.raises(
        SettingsError, match=r"10 of the 10 sentences of 3\+ tokens \(100%\) of the test file test.txt also occur in the train"
    ):
        check_disjoint("toy", {"train": train, "test": train[5:15]}, paths)  # cut from the training file
    with pytest.raises(
        SettingsError, match=r"9 of the 10 sentences of 3\+ tokens \(90%\) of the test file test.txt also occur in the dev file"
    ):
        check_disjoint("toy", {"train": train, "test": fresh, "dev": fresh[1:]}, paths)  # dev comes before test
    with pytest.raises(SettingsError, match=r"5 of the 5 sentences of 3\+ tokens \(100%\) of the dev file dev.txt also occur in "
                       r"the test file test.txt: .*\(dataset.files.dev.path\)"):  # fmt: skip
        check_disjoint("toy", {"train": train, "dev": fresh[:5], "test": fresh}, paths)  # a dev file cut from the test file
    with caplog.at_level(logging.WARNING):
        check_disjoint("toy", {"train": train, "test": train[:3] + fresh[:7]}, paths)
        check_disjoint("toy", {"train": train, "test": train[:1] + fresh[:9]}, paths)  # 10%: as in shipped data, silent
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("dataset 'toy': 3 of the 10 sentences of 3+ tokens (30%) of the test file test.txt also occur in the")
    check_disjoint(
        "toy", {"train": [[("a", "X")], [("b", "X")]], "test": [[("a", "X")], [("b", "X")]]}, paths
    )  # short: not counted

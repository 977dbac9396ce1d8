"""Fault injection on degenerate data sets: one label only, every sentence one token long, a label
that occurs only in test. Each runs through every stage with both models, gives the numbers an
independent count gives, and says what is degenerate about it in a warning."""

from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, tiny_overrides  # noqa: E402

from crf import load_bundle  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402

WORDS = ["a", "b", "c", "d", "e"]


def _write(root: Path, train, test) -> Path:
    folder = root / "conll2000"
    folder.mkdir(parents=True, exist_ok=True)
    for name, sentences in (("train", train), ("test", test)):
        with gzip.open(folder / f"{name}.txt.gz", "wt", encoding="utf-8") as out:
            for sentence in sentences:
                out.write("\n".join(" ".join(row) for row in sentence) + "\n\n")
    return root


def _run(tmp_path: Path, train, test, model: str) -> dict:
    root = _write(tmp_path / "data", train, test)
    return run_pipeline(compose_config(tiny_overrides(root, tmp_path / "out") + [f"model={model}"]))


def _tag(word: str) -> str:
    return "B-NP" if word in "ab" else "O"


@pytest.mark.parametrize("model", ["crf", "hmm"])
def test_one_label_only(tmp_path, caplog, model):
    rng = np.random.default_rng(0)
    train = [[(str(w), "X", "O") for w in rng.choice(WORDS, rng.integers(1, 5))] for _ in range(40)]
    test = [[(str(w), "X", "O") for w in rng.choice(WORDS, 3)] for _ in range(8)]
    with caplog.at_level(logging.WARNING):
        results = _run(tmp_path, train, test, model)
    assert "one label only ('O')" in caplog.text or "one label only (O)" in caplog.text
    assert results["prepare.n_labels"] == 1
    assert results["evaluate.test_accuracy"] == 100.0
    (bundle,) = (tmp_path / "out" / "cache" / "train").glob("*/bundle.npz")
    tagged = load_bundle(bundle).tag([[{"w": "a", "pos": "X"}, {"w": "zz", "pos": "X"}]])
    assert tagged[0]["labels"] == ["O", "O"]


@pytest.mark.parametrize("model", ["crf", "hmm"])
def test_every_sentence_one_token(tmp_path, model):
    rng = np.random.default_rng(1)
    train = [[(str(w), str(w).upper(), _tag(w))] for w in rng.choice(WORDS, 80)]
    test_words = rng.choice(WORDS, 12)
    test = [[(str(w), str(w).upper(), _tag(w))] for w in test_words]
    results = _run(tmp_path, train, test, model)
    assert results["prepare.test_tokens"] == results["prepare.test_sentences"] == 12
    # each POS tag determines the chunk: both models get every token right
    assert results["evaluate.test_accuracy"] == 100.0
    expected_chunks = sum(_tag(w) == "B-NP" for w in test_words)
    assert expected_chunks > 0 and results["evaluate.test_f1"] == 100.0


@pytest.mark.parametrize("model", ["crf", "hmm"])
def test_a_label_only_in_test_is_reported_and_scored_as_missed(tmp_path, caplog, model):
    rng = np.random.default_rng(2)
    train = [[(str(w), str(w).upper(), _tag(w)) for w in rng.choice(WORDS, 4)] for _ in range(60)]
    test_words = [rng.choice(WORDS, 4) for _ in range(10)]
    test = [[(str(w), str(w).upper(), "B-VP" if w == "e" else _tag(w)) for w in s] for s in test_words]
    with caplog.at_level(logging.WARNING):
        results = _run(tmp_path, train, test, model)
    unseen = sum(int(w == "e") for s in test_words for w in s)
    assert unseen > 0 and results["prepare.test_unseen_labels"] == 1
    assert f"1 label(s) of the test split never occur in training (B-VP; {unseen} tokens)" in caplog.text
    total = sum(len(s) for s in test_words)
    # everything but the unseen label is learnable from the POS column: exactly those tokens are wrong
    assert results["evaluate.test_accuracy"] == pytest.approx(100.0 * (total - unseen) / total)

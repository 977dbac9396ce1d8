"""The biomedical NER dataset configs (bc5cdr, ncbi_disease): they compose with the features, and
the shared copies read (checksums checked) into two-column IOB2 sentences a tagger learns from."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from crf import CRF
from crf.io import read_conll
from crf.metrics import chunk_scores
from pipeline.stages.data import resolve_files
from pipeline.stages.featurize import build_extractor

CONF_DIR = str(Path(__file__).resolve().parents[3] / "conf")
SETS = {"bc5cdr": {"Chemical", "Disease"}, "ncbi_disease": {"Disease"}}


def composed(dataset: str, features: str = "bio_ner"):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="config", overrides=[f"dataset={dataset}", f"features={features}"])


def data_home() -> Path:
    """The shared data folder (CRF_DATA_HOME, else ../shared/data beside the checkout's parent)."""
    home = Path(os.environ.get("CRF_DATA_HOME") or Path(__file__).resolve().parents[4] / "shared" / "data")
    if not (home / "bc5cdr" / "train.tsv").is_file() or not (home / "ncbi_disease" / "train.tsv").is_file():
        pytest.skip(f"shared NER data not found under {home} (set CRF_DATA_HOME to the shared data folder)")
    return home


@pytest.mark.parametrize("name", sorted(SETS))
def test_dataset_config_composes_with_pinned_files(name):
    config = composed(name)
    dataset = OmegaConf.to_container(config.dataset, resolve=True)
    assert dataset["name"] == name and dataset["columns"] == ["w", "ner"] and dataset["label"] == "ner"
    assert dataset["scheme"] == "IOB2" and dataset["separator"] == "\t" and dataset["dev_split"] is None
    assert set(dataset["files"]) == {"train", "dev", "test"}
    for spec in dataset["files"].values():
        assert spec["url"].startswith("https://raw.githubusercontent.com/cambridgeltl/MTL-Bioinformatics-2016/")
        assert "/df0df02fae6dbb87d88ffcf323b9096528f06f84/" in spec["url"] and len(spec["sha256"]) == 64
    assert config.features.name == "bio_ner"
    build_extractor(OmegaConf.to_container(config.features, resolve=True), dataset["columns"])


@pytest.mark.parametrize("name", sorted(SETS))
def test_shared_copies_read_and_a_crf_learns_from_a_few_sentences(name):
    home = data_home()
    dataset = OmegaConf.to_container(composed(name).dataset, resolve=True)
    paths = resolve_files(dataset, home, download=False)  # checks every file's sha256
    assert set(paths) == {"train", "dev", "test"}
    with open(paths["train"], encoding="utf-8") as handle:  # the first 40 sentences only
        lines = list(islice(handle, 1200))
    text = "".join(lines)
    blocks = [b for b in text.split("\n\n") if b.strip()][:-1]  # the last block may be cut off
    sentences = [[tuple(line.split("\t")) for line in block.splitlines()] for block in blocks]
    assert len(sentences) >= 30 and all(len(row) == 2 for s in sentences for row in s)
    labels = {row[1] for s in sentences for row in s}
    assert labels <= {"O"} | {f"{p}-{t}" for p in "BI" for t in SETS[name]}
    assert any(label.startswith("B-") for label in labels)
    # the reader the pipeline uses agrees on the first sentence
    first = read_conll(paths["train"], separator="\t", document_marker=None)[0]
    assert [tuple(row) for row in first] == sentences[0]
    features = OmegaConf.to_container(composed(name).features, resolve=True)
    extractor = build_extractor(features, dataset["columns"])
    X = extractor.fit_transform(sentences)
    y = [[row[1] for row in s] for s in sentences]
    model = CRF(algorithm="lbfgs", c2=0.1, max_iterations=50, random_state=0).fit(X, y)
    assert chunk_scores(y, model.predict(X)).f1 > 90.0  # it fits its own training sentences

"""Stage 1, prepare: read the dataset, carve the dev split, write splits and statistics.

Input: the dataset config and data root. Output folder: ``train.conll.gz``, ``dev.conll.gz``,
``test.conll.gz`` (tab-separated columns of the dataset, blank line between sentences) and
``stats.json``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path

from omegaconf import OmegaConf

from crf.io import read_conll
from pipeline.cache import file_sha256
from pipeline.data import Dataset, load_dataset, resolve_files, statistics, subset

SPLITS = ("train", "dev", "test")


def write_split(path: Path, sentences) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=5) as out:
        for sentence in sentences:
            out.write("\n".join("\t".join(row) for row in sentence))
            out.write("\n\n")


def read_prepared(folder: Path, dataset: Mapping) -> Dataset:
    """The prepared splits of a finished prepare stage."""
    columns = list(dataset["columns"])
    splits = {s: read_conll(folder / f"{s}.conll.gz", n_columns=len(columns), separator="\t") for s in SPLITS}
    return Dataset(dataset["name"], splits, columns, dataset["label"], dataset.get("scheme", "none"))


def config_slice(cfg) -> dict:
    """What this stage's output depends on (the data root is not: file checksums are)."""
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    return {"dataset": dataset, "train_fraction": cfg.data.train_fraction, "seed": cfg.seed}


def input_hashes(cfg) -> dict[str, str]:
    """SHA-256 of every dataset file (downloaded first if missing): an edited file is a new input."""
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    paths = resolve_files(dataset, cfg.data.root, download=cfg.data.download)
    return {f"file:{split}": file_sha256(path) for split, path in paths.items()}


def run(cfg, inputs: Mapping[str, Path], out: Path) -> dict:
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    data = load_dataset(dataset, cfg.data.root, download=cfg.data.download)
    data.splits["train"] = subset(data.splits["train"], float(cfg.data.train_fraction), int(cfg.seed))
    for split in SPLITS:
        write_split(out / f"{split}.conll.gz", data.splits[split])
    stats = statistics(data)
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    metrics = {}
    for split, entry in stats.items():
        metrics[f"{split}_sentences"] = entry["sentences"]
        metrics[f"{split}_tokens"] = entry["tokens"]
        if "oov_rate" in entry:
            metrics[f"{split}_oov_rate"] = entry["oov_rate"]
    metrics["n_labels"] = len(stats["train"]["labels"])
    return metrics

"""Stage 1, prepare: read the dataset, carve the dev split, write splits and statistics.

Config slice: the dataset, the training fraction and the seed; settings: the data root. Output
folder: ``train.conll.gz``, ``dev.conll.gz``, ``test.conll.gz`` (tab-separated columns of the
dataset, blank line between sentences), ``dataset.json`` (name, columns, label, scheme: how later
stages read the splits) and ``stats.json``.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from pathlib import Path

from omegaconf import OmegaConf

from crf.io import read_conll
from pipeline.cache import file_sha256
from pipeline.data import Dataset, load_dataset, resolve_files, statistics, subset
from pipeline.models import ModelAdapter
from pipeline.stage import Stage, StageContext

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
DATASET_FILE = "dataset.json"


def write_split(path: Path, sentences) -> None:
    """Tab-separated rows, a blank line after each sentence, gzip with a fixed header (no file name,
    mtime 0): the same sentences give the same bytes, so downstream cache keys do not change with
    the time or the output folder. A cell holding a tab or a line break would be read back as other
    columns or rows: it raises ValueError naming the sentence and token (nothing is written)."""
    texts = []
    for number, sentence in enumerate(sentences):
        text = "\n".join("\t".join(row) for row in sentence)
        if text.count("\t") != sum(len(row) - 1 for row in sentence) or text.count("\n") != len(sentence) - 1 or "\r" in text:
            position, cell = next((t, c) for t, row in enumerate(sentence) for c in row if any(b in c for b in "\t\n\r"))
            raise ValueError(
                f"{path.name}: sentence {number}, token {position}: the cell {cell!r} holds a tab or line break, "
                "which the tab-separated split file cannot keep (fix the data or the dataset's separator)"
            )
        texts.append(text)
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", compresslevel=5, fileobj=raw, mtime=0) as packed,
        io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as out,
    ):
        for text in texts:
            out.write(text)
            out.write("\n\n")


def read_prepared(folder: Path) -> Dataset:
    """The prepared splits of a finished prepare stage (its ``dataset.json`` says how to read them)."""
    spec = json.loads((folder / DATASET_FILE).read_text())
    columns = list(spec["columns"])
    splits = {s: read_conll(folder / f"{s}.conll.gz", n_columns=len(columns), separator="\t") for s in SPLITS}
    return Dataset(spec["name"], splits, columns, spec["label"], spec.get("scheme", "none"))


class Prepare(Stage):
    """Read the dataset, carve the dev split, take the training subset, write splits and statistics."""

    name = "prepare"
    summary_prefix = "data."  # the pipeline run shows the data statistics as data.train_tokens, ...
    logged = ("*.conll.gz", "stats.json", DATASET_FILE)

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        """What the output depends on (the data root is not: the files' checksums are)."""
        dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
        dataset.pop("evaluate", None)  # how the evaluate stage scores this dataset: its own key hashes it
        return {"dataset": dataset, "train_fraction": cfg.data.train_fraction, "seed": cfg.seed}

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        return {"root": str(cfg.data.root), "download": bool(cfg.data.download)}

    def external_inputs(self, config, settings) -> dict[str, str]:
        """SHA-256 of every dataset file (downloaded first if missing): an edited file is a new input."""
        paths = resolve_files(OmegaConf.to_container(config.dataset), settings.root, download=settings.download)
        return {f"file:{split}": file_sha256(path) for split, path in paths.items()}

    def run(self, context: StageContext) -> dict:
        config, out = context.config, context.out
        dataset = OmegaConf.to_container(config.dataset)
        data = load_dataset(dataset, context.settings.root, download=context.settings.download)
        data.splits["train"] = subset(data.splits["train"], float(config.train_fraction), int(config.seed))
        for split in SPLITS:
            write_split(out / f"{split}.conll.gz", data.splits[split])
        spec = {"name": data.name, "columns": data.columns, "label": data.label, "scheme": data.scheme}
        (out / DATASET_FILE).write_text(json.dumps(spec, indent=1))
        stats = statistics(data)
        (out / "stats.json").write_text(json.dumps(stats, indent=1))
        metrics = {}
        for split, entry in stats.items():
            metrics[f"{split}_sentences"] = entry["sentences"]
            metrics[f"{split}_tokens"] = entry["tokens"]
            if "oov_rate" in entry:
                metrics[f"{split}_oov_rate"] = entry["oov_rate"]
        metrics["n_labels"] = len(stats["train"]["labels"])
        if metrics["n_labels"] == 1:
            log.warning("the training split has one label only (%s): a model can only ever predict it", *stats["train"]["labels"])
        for split in ("dev", "test"):
            unseen = sorted(set(stats[split]["labels"]) - set(stats["train"]["labels"]))
            metrics[f"{split}_unseen_labels"] = len(unseen)
            if unseen:
                tokens = sum(stats[split]["labels"][label] for label in unseen)
                log.warning(
                    "%d label(s) of the %s split never occur in training (%s; %d tokens): no model trained here can predict them",
                    len(unseen), split, ", ".join(unseen[:10]) + (", ..." if len(unseen) > 10 else ""), tokens,
                )  # fmt: skip
        return metrics


STAGE = Prepare()

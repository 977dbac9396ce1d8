"""Stage 1, prepare: read the dataset, carve the dev split, write splits and statistics.

Config slice: the dataset, the training fraction, the seed (below a fraction of 1) and ``data.final_fit`` when it is not
``train`` (``train+dev``: the dev sentences join the training split and the dev split is empty,
see :func:`pipeline.stages.data.final_fit_splits`); settings: the data root. Output
folder: ``train.conll.gz``, ``dev.conll.gz``, ``test.conll.gz`` (tab-separated columns of the
dataset, blank line between sentences), ``dataset.json`` (name, columns, label, scheme: how later
stages read the splits) and ``stats.json``.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from omegaconf import OmegaConf

from crf.io import read_conll
from pipeline.engine.cache import file_sha256
from pipeline.engine.stage import BaseStage, StageContext
from pipeline.report import authority_problem, shown_url, write_json
from pipeline.stages.data import (
    READERS,
    ChecksumError,
    Dataset,
    MissingDataError,
    final_fit_splits,
    load_dataset,
    resolve_files,
    statistics,
    subset,
)

if TYPE_CHECKING:  # annotations only: the adapter's module is not this stage's code
    from pipeline.models import ModelAdapter

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
DATASET_FILE = "dataset.json"


# in a sentence's tab-separated text: a carriage return, an empty cell, or a blank line
_UNREADABLE = re.compile(r"\r|\t\t|\t(?:\n|$)|(?:^|\n)\t|(?:^|\n)[^\S\n]*(?:\n|$)")


def _cell_problem(row: tuple[str, ...]) -> str | None:
    """Why ``row`` cannot be one tab-separated line that reads back as itself, or None."""
    for c, cell in enumerate(row):
        if cell == "" or "\t" in cell or "\n" in cell or "\r" in cell:
            return f"column {c + 1}: the cell {cell!r} is empty or holds a tab or line break"
    if not "".join(row).strip():
        return f"every cell is blank {row!r} (the line would read as a sentence break)"
    return None


def sentence_lines(path: Path, number: int, sentence) -> str:
    """The sentence as tab-separated lines; a cell that would not read back as written (empty, or
    holding a tab, line break or carriage return; a row all blank) is refused with a ValueError
    naming the file, sentence and token (1-based). Checked on the joined text, cell by cell only
    when that finds a problem."""
    text = "\n".join("\t".join(row) for row in sentence)
    if (
        text.count("\n") != len(sentence) - 1
        or text.count("\t") != sum(len(row) - 1 for row in sentence)
        or _UNREADABLE.search(text)
    ):
        for t, row in enumerate(sentence):
            problem = _cell_problem(row)
            if problem:
                raise ValueError(f"{path.name}: sentence {number}, token {t + 1}, {problem}")
    return text


def write_split(path: Path, sentences) -> None:
    """Tab-separated rows, a blank line after each sentence, gzip with a fixed header (no file name,
    mtime 0): the same sentences give the same bytes, so downstream cache keys do not change with
    the time or the output folder. Cells that could not be read back as written are refused
    (see :func:`sentence_lines`)."""
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", compresslevel=5, fileobj=raw, mtime=0) as packed,
        io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as out,
    ):
        for number, sentence in enumerate(sentences, start=1):
            out.write(sentence_lines(path, number, sentence))
            out.write("\n\n")


def read_prepared(folder: Path) -> Dataset:
    """The prepared splits of a finished prepare stage (its ``dataset.json`` says how to read them)."""
    spec = json.loads((folder / DATASET_FILE).read_text())
    columns = list(spec["columns"])
    # the prepared files are this stage's own format: every non-blank line is a token (a word
    # `#` or `-DOCSTART-` included), whatever comments or markers the dataset's files had
    empty = set(spec.get("empty_splits", ()))  # data.final_fit=train+dev: the dev split (its file has no sentence)
    read = {"n_columns": len(columns), "separator": "\t", "comment_prefix": None, "document_marker": None}
    splits = {s: [] if s in empty else read_conll(folder / f"{s}.conll.gz", **read) for s in SPLITS}
    scheme, words = spec.get("scheme", "none"), spec.get("word_column")
    return Dataset(spec["name"], splits, columns, spec["label"], scheme, words, spec.get("tokenisation"))


def final_fit(cfg) -> str:
    """``data.final_fit`` (``train`` when the config has no such key)."""
    return str(OmegaConf.select(cfg, "data.final_fit", default="train"))


class Prepare(BaseStage):
    """Read the dataset, carve the dev split, take the training subset, write splits and statistics."""

    name = "prepare"
    summary_prefix = "data."  # the pipeline run shows the data statistics as data.train_tokens, ...

    def validate(self, cfg) -> None:
        """The final-fit setting, and download URLs of the web only (a ``file://`` URL would copy
        any file the process can read into the data root)."""
        from pipeline.engine.validate import SettingsError

        final_fit_splits({"train": [], "dev": []}, final_fit(cfg))
        data_format = OmegaConf.select(cfg, "dataset.format", default=None)
        if data_format not in READERS:
            raise SettingsError(f"bad setting dataset.format={data_format!r}: one of {', '.join(sorted(READERS))}")
        for split, spec in dict(OmegaConf.select(cfg, "dataset.files", default=None) or {}).items():
            url = spec.get("url") if hasattr(spec, "get") else None
            if url is not None and not str(url).lower().startswith(("http://", "https://")):
                raise SettingsError(
                    f"bad setting dataset.files.{split}.url={shown_url(str(url))!r}: a download URL must be http:// or https://"
                )
            if url is not None and (not urlsplit(str(url)).hostname or any(c <= " " or c == "\x7f" for c in str(url))):
                raise SettingsError(
                    f"bad setting dataset.files.{split}.url={shown_url(str(url))!r}: a download URL needs a host name and "
                    "no spaces or control characters (write a space as %20)"
                )
            problem = authority_problem(str(url)) if url is not None else None
            if problem is not None:
                raise SettingsError(f"bad setting dataset.files.{split}.url={shown_url(str(url))!r}: {problem}")

    def metric_names(self, cfg, adapter: ModelAdapter) -> tuple[str, ...]:
        """The statistics of :meth:`run`: sizes and OOV rates per split, label counts."""
        per_split = tuple(f"{split}_{name}" for split in SPLITS for name in ("sentences", "tokens", "oov_rate"))
        return (*per_split, "n_labels", "dev_unseen_labels", "test_unseen_labels")

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        """What the output depends on (the data root is not: the files' checksums are). The
        default ``data.final_fit=train`` and an empty ``features.numeric`` are left out, so the
        keys of earlier runs still hold."""
        dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
        dataset.pop("evaluate", None)  # how the evaluate stage scores this dataset: its own key hashes it
        dataset.pop("hmm", None)  # how an HMM reads it: the HMM's model section (and the semi-supervised stage) hash it
        fit = final_fit(cfg)
        numeric = list(OmegaConf.select(cfg, "features.numeric", default=None) or [])
        return {
            "dataset": dataset,
            "train_fraction": cfg.data.train_fraction,
            **({"seed": cfg.seed} if float(cfg.data.train_fraction) < 1 else {}),  # it draws the fraction, nothing else
            **({"final_fit": fit} if fit != "train" else {}),
            **({"numeric": numeric} if numeric else {}),  # checked in every file's every sentence
        }

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        return {"root": str(cfg.data.root), "download": bool(cfg.data.download)}

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("*.conll.gz", "stats.json", DATASET_FILE)

    def external_inputs(self, config, settings) -> dict[str, str]:
        """SHA-256 of every dataset file (downloaded first if missing): an edited file is a new input."""
        paths = resolve_files(OmegaConf.to_container(config.dataset), settings.root, download=settings.download)
        return {f"file:{split}": file_sha256(path) for split, path in paths.items()}

    def input_files(self, config, settings) -> dict[str, Path]:
        """The dataset files by the keys of :meth:`external_inputs`; none (with a warning) where they
        are no longer there or no longer match their checksums."""
        try:
            paths = resolve_files(OmegaConf.to_container(config.dataset, resolve=True), settings.root, download=False)
        except (MissingDataError, ChecksumError) as err:
            log.warning("dataset not logged as the run's input: %s", err)
            return {}
        return {f"file:{split}": path for split, path in paths.items()}

    def run(self, context: StageContext) -> dict:
        config, out = context.config, context.out
        dataset = OmegaConf.to_container(config.dataset)
        numeric = list(config.get("numeric") or [])
        data = load_dataset(dataset, context.settings.root, download=context.settings.download, numeric=numeric)
        data.splits["train"] = subset(data.splits["train"], float(config.train_fraction), int(config.get("seed", 0)))
        data.splits = final_fit_splits(data.splits, str(config.get("final_fit", "train")))
        for split in SPLITS:
            write_split(out / f"{split}.conll.gz", data.splits[split])
        spec = {
            "name": data.name,
            "columns": data.columns,
            "label": data.label,
            "scheme": data.scheme,
            "word_column": data.word_column,
            "tokenisation": data.tokenisation,
        }
        empty = [split for split in SPLITS if not data.splits[split]]
        if empty:  # only data.final_fit=train+dev empties a split (the dev split; a dataset's empty file is refused)
            spec["empty_splits"] = empty
        write_json(out / DATASET_FILE, spec)
        stats = statistics(data)
        write_json(out / "stats.json", stats)
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

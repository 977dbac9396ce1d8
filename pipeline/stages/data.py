"""Datasets: resolve files under a data root, download what is missing, verify, read, split.

A dataset is described by a config (``conf/dataset/*.yaml``): its files (path under the data
root, download URL, SHA-256 of the uncompressed text), format (a key of :data:`READERS`:
``conll``, ``conllu``, ``xml_sequences``), column names, the label column, the tagging scheme and
how to carve a dev split when there is none.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crf.features import numeric_cells
from crf.io import (
    DataFormatError,
    Sentence,
    atomic_write,
    check_input_file,
    read_blocks,
    read_conll,
    read_conllu,
    read_xml_sequences,
)
from pipeline.engine.validate import SettingsError
from pipeline.report import authority_problem, redacted, request_with_credentials, shown_url

DATA_HOME_VARIABLE = "CRF_DATA_HOME"
log = logging.getLogger(__name__)


class MissingDataError(SettingsError):
    """Dataset files that are neither on disk nor downloadable: a settings error (one line, exit 2)."""


class DataPathIsADirectory(MissingDataError, IsADirectoryError):
    """A dataset file's path that is a directory: a settings error (one line, exit 2)."""


class DataPathNotAFile(MissingDataError):
    """A dataset file's path that is a named pipe, socket or device: a settings error (one line, exit 2)."""


class ChecksumError(SettingsError):
    """A dataset file whose content does not match its recorded SHA-256 (one line, exit 2)."""


def default_data_root() -> Path:
    """``$CRF_DATA_HOME`` when set, else ``./data``."""
    return Path(os.environ.get(DATA_HOME_VARIABLE) or "data").absolute()


def text_sha256(path: Path) -> str:
    """SHA-256 of the file's text (decompressed when gzip); a truncated or corrupt gzip raises
    :class:`crf.io.DataFormatError` naming the file."""
    digest = hashlib.sha256()
    for block in read_blocks(path, 1 << 20):
        digest.update(block)
    return digest.hexdigest()


def _download(url: str, target: Path, timeout: float) -> None:
    """Fetch ``url`` (with the user and password it may hold, as basic authentication) into
    ``target`` atomically, with the permissions an ordinary write gives."""
    if not url.lower().startswith(("http://", "https://")):  # file:// would copy any file the process can read
        raise ValueError("a download URL must be http:// or https://")
    problem = authority_problem(url)
    if problem is not None:
        raise ValueError(problem)
    with urllib.request.urlopen(request_with_credentials(url), timeout=timeout) as response:
        atomic_write(target, lambda out: shutil.copyfileobj(response, out))


def dataset_files(dataset: Mapping) -> dict[str, Mapping]:
    """The files of ``dataset`` by split (``files``: split -> ``path`` and optional ``url`` and
    ``sha256``), without a split set to null (``dataset.files.dev=null``: no dev file). Raises
    :class:`SettingsError` (one line, quoting no value: a URL given in a file's place may hold a
    password) for an entry that is no such mapping with a path."""
    files = dataset.get("files")
    if not isinstance(files, Mapping):
        raise SettingsError(f"bad setting dataset.files: split names, each with {_FILE_ENTRY}; got {type(files).__name__}")
    for split, spec in files.items():
        if spec is not None and not (isinstance(spec, Mapping) and isinstance(spec.get("path"), str) and spec["path"]):
            what = f"a {type(spec).__name__}" if not isinstance(spec, Mapping) else "no path"
            raise SettingsError(f"bad setting dataset.files.{split}: a file is {_FILE_ENTRY}; got {what}")
    return {split: spec for split, spec in files.items() if spec is not None}


_FILE_ENTRY = "{path: <path under data.root>, url: <download URL or null>, sha256: <checksum or null>}"


def unavailable_files(dataset: Mapping, root: str | os.PathLike, download: bool = True) -> MissingDataError | None:
    """The error for files of ``dataset`` that no download can provide; reads no file and
    downloads nothing, so that a run can be refused before it starts.

    Parameters
    ----------
    dataset : mapping
        A dataset config (its ``name`` and ``files``: split -> ``path`` and optional ``url``).
    root : str or os.PathLike
        The data root the paths are under.
    download : bool, default=True
        Whether missing files with a URL will be downloaded.

    Returns
    -------
    MissingDataError or None
        For a directory, a named pipe, socket or device, a dangling symbolic link, or missing files
        with no download (``download`` false or no URL); None when every file is on disk or
        downloadable.
    """
    root = Path(root).absolute()
    missing = []
    for split, spec in dataset_files(dataset).items():
        path = root / spec["path"]
        try:
            check_input_file(path, expected=f"the {split} file of dataset {dataset.get('name')!r}")
        except IsADirectoryError as error:
            return DataPathIsADirectory(str(error))
        except FileNotFoundError as error:
            if path.is_symlink():
                return MissingDataError(str(error))
            if not (download and spec.get("url")):
                missing.append(f"{path} (no download configured)" if download else f"{path}")
        except OSError as error:
            return DataPathNotAFile(str(error))
    return _missing_files(dataset, root, missing) if missing else None


def checksum_problem(dataset: Mapping, root: str | os.PathLike) -> str | None:
    """Why a file of ``dataset`` present under ``root`` is not the one its config names (its text's
    SHA-256 differs: corrupt, or another version), in one line; None when each present file with a
    checksum matches (missing files and malformed entries are left to :func:`config_data_problem`)."""
    try:
        resolve_files(dataset, root, download=False)
    except ChecksumError as error:
        return str(error)
    except (SettingsError, TypeError, KeyError, AttributeError, OSError):
        return None
    return None


def config_data_problem(cfg: Any) -> str | None:
    """One line for the dataset files of a composed run config (``cfg``: its ``dataset`` and
    ``data.root``/``data.download``) that no download can provide (:func:`unavailable_files`), that
    a download tried here failed to provide (missing files with a URL are fetched now, not once a
    run is open), or two splits that name one file, so that a run or a sweep is refused before it
    opens; None when they are there, or named through settings only a run resolves (an
    interpolation of Hydra's run)."""
    from omegaconf import OmegaConf

    try:
        dataset = OmegaConf.to_container(cfg.dataset, resolve=True) if "dataset" in cfg else None
        root, download = OmegaConf.select(cfg, "data.root"), bool(OmegaConf.select(cfg, "data.download", default=True))
    except Exception:  # an interpolation only Hydra's run resolves: left to the run's own checks
        return None
    if not isinstance(dataset, dict) or root is None:
        return None
    try:
        files = {split: Path(str(root)) / spec["path"] for split, spec in dataset_files(dataset).items()}
    except SettingsError as error:  # a malformed files entry
        return str(error)
    problem = unavailable_files(dataset, str(root), download)
    if problem is not None:
        return str(problem)
    if download and not all(path.exists() for path in files.values()):
        try:
            resolve_files(dataset, str(root), download=True)
        except (MissingDataError, ChecksumError, DataFormatError) as error:
            return str(error)
    there = [(split, path) for split, path in files.items() if path.exists()]
    for i, (split, path) in enumerate(there):
        same = next((other for other, where in there[:i] if os.path.samefile(where, path)), None)
        if same is not None:  # checked again, by content, as the run reads them (check_disjoint)
            return (
                f"dataset {dataset.get('name')!r}: the {same} and {split} files are the same file ({path}): {split} scores "
                f"would be {same} scores; name another file (dataset.files.{split}.path)"
            )
    return None


def _missing_files(dataset: Mapping, root: Path, failures: list[str]) -> MissingDataError:
    return MissingDataError(
        f"dataset {dataset.get('name', '?')!r}: missing files under data root {root}: {'; '.join(failures)}. "
        f"Point the data root at a local copy: export {DATA_HOME_VARIABLE}=/path/to/data "
        f"(or pass data.root=/path/to/data), with the files at the paths above relative to it."
    )


def resolve_files(dataset: Mapping, root: str | os.PathLike, download: bool = True, timeout: float = 30.0) -> dict[str, Path]:
    """Paths of every file of ``dataset`` under ``root``, downloading and verifying missing ones.

    Raises :class:`MissingDataError` naming every file that could not be had (before any download
    when some file cannot be had at all: :func:`unavailable_files`), and :class:`ChecksumError`
    for a file whose content does not match.
    """
    problem = unavailable_files(dataset, root, download)
    if problem is not None:
        raise problem
    root = Path(root).absolute()
    paths: dict[str, Path] = {}
    failures: list[str] = []
    for split, spec in dataset_files(dataset).items():
        path = root / spec["path"]
        fetched = not path.is_file()
        if fetched:
            log.info("downloading %s to %s", shown_url(spec["url"]), path)
            try:
                _download(spec["url"], path, timeout)
                read_split(path, dataset)  # what the download gave must read as the dataset's files do
            except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException, ValueError) as err:
                with contextlib.suppress(OSError):  # not left for the next run to take as the file
                    path.unlink()
                why = redacted(str(getattr(err, "reason", err)))
                failures.append(f"{path} (download from {shown_url(spec['url'])} failed: {why})")
                continue
        expected = spec.get("sha256")
        if expected:
            actual = text_sha256(path)
            if actual != str(expected).strip().lower():  # hex digits: either case
                if fetched:  # not left for the next run to take as the file
                    path.unlink()
                raise ChecksumError(
                    f"{path}: SHA-256 of its text is {actual}, expected {expected} (corrupt or a different version)"
                    + (f"; the download from {shown_url(spec['url'])} was removed" if fetched else "")
                )
        paths[split] = path
    if failures:
        raise _missing_files(dataset, root, failures)
    return paths


@dataclass
class Dataset:
    """Sentences per split (``train``, ``dev``, ``test``) and how to read labels from them."""

    name: str
    splits: dict[str, list[Sentence]]
    columns: list[str]
    label: str
    scheme: str
    word_column: str | None = None  # the column of word forms (known/unknown words, vocabulary figures)
    tokenisation: str | None = None  # how the word tokens were made (see :func:`tokenisation`); None: unknown

    @property
    def label_index(self) -> int:
        return self.columns.index(self.label)

    def labels(self, split: str) -> list[list[str]]:
        i = self.label_index
        return [[row[i] for row in sentence] for sentence in self.splits[split]]

    def column(self, split: str, name: str) -> list[list[str]]:
        i = self.columns.index(name)
        return [[row[i] for row in sentence] for sentence in self.splits[split]]


def read_conll_dataset(path: Path, dataset: Mapping, token_lines: list[int] | None = None) -> list[Sentence]:
    """A ``conll`` dataset file: ``separator`` (None: any whitespace), and lines that look like
    directives only where the dataset says so: ``comment_prefix`` (sentence-header comment lines,
    e.g. ``#``; default none) and ``document_marker`` (e.g. CoNLL-2003's ``-DOCSTART-``; default
    none). Unset, a word ``#`` or ``-DOCSTART-`` is a token like any other (see
    :func:`crf.io.read_conll`)."""
    return read_conll(
        path,
        n_columns=len(dataset["columns"]),
        separator=dataset.get("separator"),
        comment_prefix=dataset.get("comment_prefix"),
        document_marker=dataset.get("document_marker"),
        token_lines=token_lines,
    )


# dataset ``format`` -> reader(path, dataset config, token_lines) -> sentences; a new file format is
# one entry. ``token_lines`` (a list, or None) gets each token's line number where the format has
# lines. CoNLL-U defines its comments (``#`` lines before a sentence) and has no document marker.
READERS: dict[str, Callable[[Path, Mapping, list[int] | None], list[Sentence]]] = {
    "conll": read_conll_dataset,
    "conllu": lambda path, dataset, token_lines=None: read_conllu(path, token_lines=token_lines),
    "xml_sequences": lambda path, dataset, token_lines=None: read_xml_sequences(path),
}


def read_split(path: Path, dataset: Mapping, token_lines: list[int] | None = None) -> list[Sentence]:
    """The sentences of one file of ``dataset``, read by the reader of its ``format``
    (``token_lines``: see :data:`READERS`)."""
    reader = READERS.get(dataset["format"])
    if reader is None:
        raise ValueError(f"dataset {dataset.get('name')!r}: unknown format {dataset['format']!r} (one of {sorted(READERS)})")
    return reader(path, dataset, token_lines)


def check_numeric_columns(
    dataset: Mapping, splits: Mapping[str, list], paths: Mapping[str, Path], numeric: Sequence[str]
) -> None:
    """Refuse a cell of a ``numeric`` column that is no finite number, or too large
    (:func:`crf.features.numeric_cells`), in any sentence of the files as read (before a training
    subset is drawn: a bad cell is found whichever sentences a run samples). Raises DataFormatError
    naming the file and line (the sentence and token in formats without lines)."""
    columns = list(dataset["columns"])
    for name in numeric:
        if name not in columns:  # the featurize stage's settings check names it
            continue
        index = columns.index(name)
        for split, sentences in splits.items():
            cells = [row[index] for sentence in sentences for row in sentence]
            _, bad = numeric_cells(cells)
            if bad is None:
                continue
            token, problem = bad
            token_lines: list[int] = []
            read_split(paths[split], dataset, token_lines)
            problem = f"numeric column {name!r} (features.numeric) {problem}"
            if len(token_lines) == len(cells):
                raise DataFormatError(paths[split], token_lines[token], problem)
            lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
            sentence = int(np.searchsorted(np.cumsum(lengths), token, side="right"))
            where = f"sentence {sentence + 1}, token {token - int(lengths[:sentence].sum()) + 1}"
            raise SettingsError(f"{paths[split]}: {where}: {problem}")


def seeded_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) sentence indices: a seeded random ``fraction`` is held out, both sorted."""
    rng = np.random.default_rng(seed)
    held = np.sort(rng.permutation(n)[: max(1, int(round(fraction * n)))])
    kept = np.setdiff1d(np.arange(n), held)
    return kept, held


def load_dataset(
    dataset: Mapping, root: str | os.PathLike, download: bool = True, carve_dev: bool = True, numeric: Sequence[str] = ()
) -> Dataset:
    """Read every split of ``dataset``; carve ``dev`` from ``train`` when configured (and
    ``carve_dev``: the speed benchmark trains on the whole training file, as CRFsuite's does).
    The ``numeric`` columns (``features.numeric``) are checked in every sentence of every file
    (:func:`check_numeric_columns`)."""
    paths = resolve_files(dataset, root, download)
    splits = {split: read_split(path, dataset) for split, path in paths.items()}
    check_disjoint(dataset.get("name"), splits, paths)
    columns = list(dataset["columns"])
    if dataset["label"] not in columns:
        raise ValueError(f"dataset {dataset['name']!r}: label column {dataset['label']!r} is not among {columns}")
    check_numeric_columns(dataset, splits, paths, numeric)
    if "dev" not in splits and carve_dev:
        rule = dataset.get("dev_split")
        if not rule:
            raise ValueError(f"dataset {dataset['name']!r} has no dev file and no dev_split rule")
        kept, held = seeded_split(len(splits["train"]), float(rule["fraction"]), int(rule["seed"]))
        if not kept.size:
            raise SettingsError(
                f"bad setting dataset.dev_split.fraction={rule['fraction']}: dataset {dataset['name']!r} has "
                f"{len(splits['train'])} training sentence(s), and the dev split would leave none to train on"
            )
        train = splits["train"]
        splits["train"] = [train[i] for i in kept]
        splits["dev"] = [train[i] for i in held]
    scheme = dataset.get("scheme", "none")
    return Dataset(dataset["name"], splits, columns, dataset["label"], scheme, word_column(dataset), tokenisation(dataset))


SHARED_REFUSED, SHARED_WARNED = 0.9, 0.2  # shares of one split's sentences found in another (check_disjoint)
SHARED_MIN_TOKENS = 3  # shorter sentences ("Thanks !", one-word items) repeat by nature, and are not counted


def check_disjoint(name: str | None, splits: Mapping[str, list], paths: Mapping[str, Path]) -> None:
    """Refuse (SettingsError) two splits of ``splits`` (train, dev, test; read from the files
    ``paths``) of which one has nearly all its sentences (:data:`SHARED_REFUSED`) in the other: a
    dev file that is (a copy of, or cut from) the test file, a test file cut from the training file;
    scores would measure memory, or tune on the test set. Warn from :data:`SHARED_WARNED` of an
    evaluation split's sentences on (repeats happen in some data, so a share is not a refusal). Only
    sentences of :data:`SHARED_MIN_TOKENS` tokens or more count: shorter ones repeat by nature."""
    keys = {
        split: [tuple(map(tuple, sentence)) for sentence in sentences if len(sentence) >= SHARED_MIN_TOKENS]
        for split, sentences in splits.items()
    }
    order = [split for split in ("train", "dev", "test") if split in keys]
    forward = [(later, earlier) for i, later in enumerate(order) for earlier in order[:i]]
    warnings = []
    for part, whole in forward + [(b, a) for a, b in forward]:  # either may be cut from the other (a dev file from test)
        seen = set(keys[whole])
        shared, total = sum(key in seen for key in keys[part]), len(keys[part])
        if not total or shared < SHARED_WARNED * total:
            continue
        share = f"{shared} of the {total} sentences of {SHARED_MIN_TOKENS}+ tokens ({100 * shared / total:.0f}%)"
        what = f"dataset {name!r}: {share} of the {part} file {paths[part]} also occur in the {whole} file {paths[whole]}"
        if shared >= SHARED_REFUSED * total:
            raise SettingsError(
                f"{what}: scores on one would measure memory, not generalisation; name another file (dataset.files.{part}.path)"
            )
        if part != "train":  # said from the evaluation split's side
            warnings.append(what)
    for what in warnings:  # once no pair is refused
        log.warning("%s: those sentences were seen before, which raises its scores", what)


# how a dataset format's word tokens were made: XML sequences split each field's text on whitespace
# (AnyStyle); CoNLL and CoNLL-U corpora are Penn-Treebank-like (punctuation and clitics split off)
FORMAT_TOKENISATION = {"xml_sequences": "whitespace", "conll": "punct", "conllu": "punct"}
TOKENISATIONS = ("whitespace", "punct")


def tokenisation(dataset: Mapping) -> str | None:
    """How ``dataset``'s word tokens were made: its ``tokenisation`` key (``whitespace`` or
    ``punct``), else the usual one of its ``format`` (:data:`FORMAT_TOKENISATION`); None: unknown.
    A tagger bundle records it, and the tag command splits plain text the same way."""
    value = dataset.get("tokenisation") or FORMAT_TOKENISATION.get(str(dataset.get("format")))
    if value is not None and value not in TOKENISATIONS:
        raise SettingsError(f"dataset {dataset.get('name')!r}: tokenisation={value!r}; one of {', '.join(TOKENISATIONS)}")
    return value


def word_column(dataset: Mapping) -> str | None:
    """The dataset's column of word forms: its ``word_column`` key, else ``w`` when it has one
    (None: no word column; figures about known words are left out)."""
    name = dataset.get("word_column", "w" if "w" in dataset["columns"] else None)
    if name is not None and name not in dataset["columns"]:
        raise ValueError(f"dataset {dataset.get('name')!r}: word_column {name!r} is not one of the columns {dataset['columns']}")
    return name


def subset(sentences: list, fraction: float, seed: int) -> list:
    """A seeded random ``fraction`` of the sentences (at least one), in their original order."""
    if fraction >= 1.0:
        return list(sentences)
    kept = seeded_split(len(sentences), fraction, seed)[1]
    return [sentences[i] for i in kept]


def statistics(data: Dataset) -> dict:
    """Sentences, tokens, label counts and out-of-vocabulary rate (of the word column) per split."""
    word = data.columns.index(data.word_column) if data.word_column is not None else None
    train_words = {row[word] for s in data.splits["train"] for row in s} if word is not None else set()
    out: dict = {}
    for split, sentences in data.splits.items():
        labels = [label for seq in data.labels(split) for label in seq]
        values, counts = np.unique(np.array(labels, dtype=object).astype(str), return_counts=True)
        entry = {
            "sentences": len(sentences),
            "tokens": len(labels),
            "labels": {str(v): int(c) for v, c in zip(values, counts)},
        }
        if train_words and sentences:  # an empty split (the dev split under data.final_fit=train+dev) has no rate
            words = [row[word] for s in sentences for row in s]
            entry["oov_rate"] = float(np.mean([w not in train_words for w in words])) if words else 0.0
        out[split] = entry
    return out


# data.final_fit: the sentences the model that is scored on test is trained on
FINAL_FITS = ("train", "train+dev")


def final_fit_splits(splits: Mapping[str, list], final_fit: str) -> dict[str, list]:
    """The splits the later stages see under ``data.final_fit``.

    ``train`` (the default) leaves them as they are. ``train+dev`` is the field's protocol for a
    final model (TaggerOne, tmChem and others train it on train and dev): the settings were chosen
    on dev by ``train`` runs, and this run trains the same settings on the training sentences
    followed by the dev sentences. Its dev split is then empty, so nothing downstream can score,
    report or stop on sentences it was trained on: such a run logs no dev scores (the dev scores of
    its settings are those of the ``train`` run) and its test scores are those of the refit model.

    Parameters
    ----------
    splits : mapping of str to list of sentences
        ``train``, ``dev`` and ``test`` (and any other split, passed through).
    final_fit : str
        One of :data:`FINAL_FITS`.

    Returns
    -------
    dict
        The splits to write: unchanged, or ``train`` = train + dev and ``dev`` = [].

    Raises
    ------
    SettingsError
        When ``final_fit`` is not one of :data:`FINAL_FITS`.
    """
    if final_fit not in FINAL_FITS:
        raise SettingsError(f"data.final_fit={final_fit!r}: one of {', '.join(FINAL_FITS)}")
    out = dict(splits)
    if final_fit == "train+dev":
        out["train"] = list(splits["train"]) + list(splits["dev"])
        out["dev"] = []
    return out

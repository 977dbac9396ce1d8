"""Word clusters learned from an unlabelled pool, as a cached step that feeds the featurize stage.

The pool is the training split's words (without their labels) plus any plain-text files the
features config (``features.clusters.pool``) or the dataset config (``dataset.unlabelled``) names.
Brown clusters (:mod:`crf.clusters`) of the pool are written as a paths file into a cache entry
``<paths.cache_dir>/clusters/<key>/clusters.txt``, keyed by the pool's content (a SHA-256 over its
words, sentence by sentence, and over each pool file), the clustering settings and the code of
this module and :mod:`crf.clusters`: the same pool is clustered once, a changed pool is
clustered again.

How a features config asks for clusters (``features.clusters``):

- a string: a paths file, which the config's own ``cluster`` views interpolate
  (``conf/features/chunking_clusters.yaml``); the string ``auto`` means "learn them from the pool"
  with the settings of :data:`DEFAULTS`;
- a mapping (``+features/clusters=brown``, ``conf/features/clusters/brown.yaml``): a ``source``
  (``auto`` or a paths file) and the clustering settings; it adds the views ``brown<n>`` (the first
  ``n`` bits of the word's path for each of ``prefixes``) over the word column with a template
  at each of ``offsets``, plus the ``templates`` given (conjunctions that read a ``brown<n>`` view,
  such as ``brown4[-1]|brown4[0]``), to any feature set.

A word without a path (not in the pool, or rarer than ``min_count``) gets no cluster attribute.
Pool files: ``format: conll`` (CoNLL-style columns, the word first, blank line between
sentences) or ``text`` (a sentence a line, tokens separated by whitespace), plain or gzip, read in
a stream.

Checks (:func:`validate`, the featurize stage's settings check, and :func:`validate_semi`, the
semi-supervised stage's), before any stage runs, each a one-line :class:`SettingsError` naming
the setting: every setting's type and range (``prefixes`` and ``offsets`` non-empty lists of
distinct whole numbers), the word column (a dataset column, not the label), views that the
feature set already has, and the files: a paths file or pool file that is missing, a folder,
unreadable or empty, a paths file whose first lines are not ``path<TAB>word<TAB>count``, a pool
file whose first lines do not fit ``format``. What only the whole pool tells is
refused as soon as it is counted, before clustering: a file without a word
(:class:`crf.io.DataFormatError` naming it), ``min_count`` leaving no word (naming the setting).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from crf.clusters import brown_clusters, count_bigrams, iter_words, write_paths
from crf.features import repeated_template, template_views
from crf.io import DataFormatError, decoded_lines
from pipeline.engine.cache import StageCache, code_digest, file_sha256
from pipeline.engine.validate import SettingsError, check_template_names

log = logging.getLogger(__name__)

AUTO = "auto"
STAGE_NAME = "clusters"  # the cache folder of the entries
PATHS_FILE = "clusters.txt"
POOL_FORMATS = ("conll", "text")
DEFAULTS: dict[str, Any] = {
    "source": AUTO,  # auto: learned from the pool; else a paths file
    "n_clusters": 100,  # the window m of Liang's algorithm: classes kept while words enter
    "min_count": 1,  # rarer words get no path
    "pool": [],  # plain-text files added to the training words
    "format": "conll",  # of the pool files: conll (word in the first column) or text (a sentence a line)
    "column": "w",  # the word column the views read
    "prefixes": [4, 6, 10, 20],  # path prefix lengths, one view brown<n> each
    "offsets": [-2, -1, 0, 1, 2],  # template offsets of every view
    "templates": [],  # more templates, each reading a view brown<n> of prefixes (conjunctions: brown4[-1]|brown4[0])
}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class PoolFileError(SettingsError, FileNotFoundError):
    """A pool or paths file that is missing, a folder, unreadable or empty: a settings error (one
    line naming the setting and the path, exit 2)."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole_numbers(name: str, value: Any, least: int | None, what: str) -> list[int]:
    """``value`` as a non-empty list of distinct whole numbers (>= ``least``), else a SettingsError
    naming ``name``: a repeated one would make every attribute of its view twice."""
    if not isinstance(value, (list, tuple)) or not value:
        raise SettingsError(f"bad setting {name}={value!r}: a non-empty list of {what}")
    if any(not _whole(n) or (least is not None and n < least) for n in value):
        raise SettingsError(f"bad setting {name}={list(value)!r}: {what}")
    repeated = sorted({n for n in value if list(value).count(n) > 1})
    if repeated:
        raise SettingsError(f"bad setting {name}={list(value)!r}: {repeated[0]} is repeated (each value once)")
    return list(value)


def _templates(name: str, value: Any, prefixes: Sequence[int], offsets: Sequence[int]) -> list[str]:
    """``value`` as a list of distinct template strings, each reading at least one view ``brown<n>``
    of ``prefixes`` (a template without one is no cluster feature and would stay when the clusters
    are left out) and none a ``brown<n>[offset]`` that ``offsets`` already gives (its attributes
    would be made twice), else a SettingsError naming ``name``. The template syntax itself (and the other
    views a template reads) is checked by the feature extractor."""
    value = [] if value is None else value
    if not isinstance(value, (list, tuple)) or any(not isinstance(t, str) or not t.strip() for t in value):
        raise SettingsError(f"bad setting {name}={value!r}: a list of templates such as 'brown4[-1]|brown4[0]'")
    views = {f"brown{n}" for n in prefixes}
    for template in value:
        if not _reads(template, views):
            raise SettingsError(
                f"bad setting {name}: template {template!r} reads no cluster view ({', '.join(sorted(views))}, from prefixes)"
            )
    given = [f"brown{n}[{o}]" for n in prefixes for o in offsets]
    repeated = repeated_template([*given, *value])
    if repeated is not None and repeated[0] in given:
        raise SettingsError(f"bad setting {name}: template {repeated[1]!r} is made already by prefixes and offsets")
    if repeated is not None:
        raise SettingsError(f"bad setting {name}: templates {repeated[0]!r} and {repeated[1]!r} read the same cells (keep one)")
    return [str(t) for t in value]


def settings_of(value: Any, name: str = "features.clusters") -> dict[str, Any] | None:
    """The clustering settings ``features.clusters`` asks for (:data:`DEFAULTS` filled in), None
    when it asks for none (unset, or a paths file the config's views name themselves).

    Parameters
    ----------
    value : None, str or mapping
        The ``features.clusters`` value.
    name : str
        The setting's name in messages (``semi.clusters`` for the semi-supervised stage's).

    Raises
    ------
    SettingsError
        An unknown key or a bad value, one line naming ``<name>.<key>`` (a ValueError).
    """
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise SettingsError(f"bad setting {name}={value!r}: a paths file, 'auto' or a mapping of settings")
        return dict(DEFAULTS) if value == AUTO else None
    if not isinstance(value, Mapping):
        raise SettingsError(f"bad setting {name}={value!r}: a paths file, 'auto' or a mapping of settings")
    unknown = sorted(set(value) - set(DEFAULTS))
    if unknown:
        raise SettingsError(f"bad setting {name}: unknown setting(s) {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **dict(value)}
    if not isinstance(settings["source"], str) or not settings["source"].strip():
        raise SettingsError(f"bad setting {name}.source={settings['source']!r}: 'auto' or a paths file")
    for key in ("n_clusters", "min_count"):
        if not _whole(settings[key]) or settings[key] < 1:
            raise SettingsError(f"bad setting {name}.{key}={settings[key]!r}: a whole number >= 1")
    if settings["format"] not in POOL_FORMATS:
        raise SettingsError(f"bad setting {name}.format={settings['format']!r}: one of {', '.join(POOL_FORMATS)}")
    if not isinstance(settings["column"], str) or not settings["column"]:
        raise SettingsError(f"bad setting {name}.column={settings['column']!r}: the name of a dataset column")
    settings["prefixes"] = _whole_numbers(
        f"{name}.prefixes", settings["prefixes"], 0, "whole numbers >= 0 (0, or more bits than a path has: the whole path)"
    )
    settings["offsets"] = _whole_numbers(f"{name}.offsets", settings["offsets"], None, "whole numbers (token offsets)")
    settings["templates"] = _templates(f"{name}.templates", settings["templates"], settings["prefixes"], settings["offsets"])
    pool = settings["pool"]
    pool = [] if pool is None else [pool] if isinstance(pool, str) else pool
    if not isinstance(pool, (list, tuple)) or any(not isinstance(p, str) or not p.strip() for p in pool):
        raise SettingsError(f"bad setting {name}.pool={settings['pool']!r}: a list of text files")
    settings["pool"] = [str(p) for p in pool]
    return settings


def clustering_slice(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the paths file depends on (not the views made of it)."""
    return {"n_clusters": settings["n_clusters"], "min_count": settings["min_count"], "format": settings["format"]}


def is_auto(features: Mapping) -> bool:
    """Whether ``features`` asks for clusters learned from the pool."""
    settings = settings_of(features.get("clusters"))
    return settings is not None and settings["source"] == AUTO


def resolved(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` as given when absolute, else against ``root`` (the project root by default)."""
    given = Path(str(path)).expanduser()
    return given if given.is_absolute() else Path(root if root is not None else PROJECT_ROOT) / given


def checked_file(setting: str, given: str | Path, what: str, root: str | Path | None = None) -> Path:
    """The resolved path (:func:`resolved`) of ``given`` when it is a readable, non-empty regular
    file.

    Raises
    ------
    PoolFileError
        One line naming ``setting``, ``what`` the file is for and the path: missing, a folder,
        not a regular file, unreadable or empty.
    """
    path = resolved(given, root)
    if not path.exists():
        problem = f"no {what} {path}"
    elif path.is_dir():
        problem = f"the {what} {path} is a folder, not a file"
    elif not path.is_file():
        problem = f"the {what} {path} is not a regular file"
    elif not os.access(path, os.R_OK):
        problem = f"the {what} {path} cannot be read"
    elif path.stat().st_size == 0:
        problem = f"the {what} {path} is empty"
    else:
        return path
    base = root if root is not None else PROJECT_ROOT
    relative = "" if Path(str(given)).expanduser().is_absolute() else f" (relative paths resolve against {base})"
    raise PoolFileError(f"bad setting {setting}: {problem}{relative}")


def pool_paths(
    features: Mapping,
    unlabelled: Sequence[str] | None = None,
    data_root: str | Path | None = None,
    name: str = "features.clusters",
) -> list[Path]:
    """The pool files: ``features.clusters.pool`` (relative paths against the project root) and the
    dataset's ``unlabelled`` files (relative paths against the data root), in that order; ``name``
    is the clusters setting's name in messages (``semi.clusters`` for the semi-supervised stage's).

    Raises
    ------
    PoolFileError
        A file that is missing, a folder, unreadable or empty, naming the setting and the path (a
        FileNotFoundError and a SettingsError).
    """
    settings = settings_of(features.get("clusters")) or {"pool": []}
    root = Path(data_root) if data_root is not None else Path.cwd()
    found = [checked_file(f"{name}.pool", given, "pool file") for given in settings["pool"]]
    return found + [checked_file("dataset.unlabelled", given, "pool file", root) for given in unlabelled or []]


def text_sentences(path: str | Path) -> Iterator[list[str]]:
    """The sentences of a plain-text file, a sentence a line (tokens split on whitespace; blank
    lines skipped), streamed; a file without a word raises ValueError naming it."""
    seen = False
    for _, line in decoded_lines(path):
        words = line.split()
        if words:
            seen = True
            yield words
    if not seen:
        raise DataFormatError(path, 1, "the text pool file holds no words (a pool file of features.clusters)")


def pool_sentences(train_words: Iterable[Sequence[str]], files: Sequence[Path], file_format: str) -> Iterator[Sequence[str]]:
    """The pool's sentences: the training words, then each file's (streamed)."""
    yield from train_words
    for path in files:
        yield from (text_sentences(path) if file_format == "text" else iter_words([path]))


def words_digest(sentences: Iterable[Sequence[str]]) -> str:
    """SHA-256 of a list of word sentences (words and sentence breaks unambiguously framed)."""
    h = hashlib.sha256()
    for sentence in sentences:
        h.update("\x1f".join(sentence).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()


def cluster_key(
    cache: StageCache, settings: Mapping[str, Any], train_words: Sequence[Sequence[str]], files: Sequence[Path]
) -> str:
    """The cache key of the clusters of this pool: its content, the clustering settings and the code."""
    inputs = {"train_words": words_digest(train_words), **{f"pool:{i}": file_sha256(p) for i, p in enumerate(files)}}
    return cache.key(STAGE_NAME, clustering_slice(settings), inputs, code_digest([__name__]))


def learn(
    cache_dir: str | Path,
    settings: Mapping[str, Any],
    train_words: Sequence[Sequence[str]],
    files: Sequence[Path],
    name: str = "features.clusters",
) -> tuple[Path, bool]:
    """The paths file of the pool's Brown clusters, from the cache or learned and cached.

    Parameters
    ----------
    cache_dir : path
        The stage cache's root (``paths.cache_dir``); entries go under ``clusters/<key>/``.
    settings : mapping
        From :func:`settings_of`.
    train_words : sequence of sequences of str
        The training split's sentences as words.
    files : sequence of Path
        The pool files (:func:`pool_paths`), read in a stream.
    name : str
        The settings' name in messages.

    Returns
    -------
    (Path, bool)
        The paths file, and whether it came from the cache.

    Raises
    ------
    SettingsError
        ``min_count`` leaves no word of the pool to cluster (known once the pool is counted, before
        the clustering).
    crf.io.DataFormatError
        A pool file that cannot be read or holds no words, naming it.
    """
    cache = StageCache(cache_dir)
    key = cluster_key(cache, settings, train_words, files)
    found = cache.lookup(STAGE_NAME, key, remote=False)
    if found is not None:
        log.info("[clusters] from the cache: %s", found / PATHS_FILE)
        return found / PATHS_FILE, True

    def produce(out: Path) -> None:
        began, cpu = time.perf_counter(), time.process_time()
        counts = count_bigrams(pool_sentences(train_words, files, settings["format"]))
        most = int(counts.counts[1:].max())
        if most < settings["min_count"]:
            raise SettingsError(
                f"bad setting {name}.min_count={settings['min_count']}: no word of the {counts.n_tokens}-token pool occurs "
                f"that often (the most frequent occurs {most} times), so nothing is left to cluster"
            )
        paths = brown_clusters(counts, int(settings["n_clusters"]), int(settings["min_count"]))
        write_paths(out / PATHS_FILE, paths, dict(zip(counts.words.tolist(), counts.counts.tolist())))
        log.info(
            "[clusters] %d words of a %d-token pool (%d files) in %d classes: %.1f s (%.1f s CPU)",
            len(paths), counts.n_tokens, len(files), settings["n_clusters"], time.perf_counter() - began,
            time.process_time() - cpu,
        )  # fmt: skip

    return cache.build(STAGE_NAME, key, produce) / PATHS_FILE, False


def expanded(features: Mapping, paths_file: str | Path | None) -> dict:
    """``features`` with the clusters it asks for in place: a mapping ``clusters`` becomes the views
    ``brown<n>`` (and their templates) over ``paths_file`` (or its ``source`` file when that is not
    ``auto``); with ``clusters: auto`` the views whose path is ``auto`` read ``paths_file``. With
    ``paths_file`` None and an ``auto`` source the cluster views are left out (what the featurize
    stage hashes before the file exists: the pool's content is hashed instead)."""
    features = copy.deepcopy(dict(features))
    value = features.get("clusters")
    settings = settings_of(value)
    if settings is None:
        return features
    source = settings["source"] if settings["source"] != AUTO else paths_file
    views = dict(features.get("views") or {})
    if isinstance(value, str):  # the config's own views interpolate features.clusters
        auto_views = {
            n
            for n, spec in views.items()
            if isinstance(spec, Mapping) and spec.get("fn") == "cluster" and spec.get("path") == AUTO
        }
        for name in auto_views:
            if source is None:
                views.pop(name)
            else:
                views[name] = {**dict(views[name]), "path": str(source)}
        features["views"] = views
        if source is None:
            features["templates"] = [t for t in features.get("templates") or [] if not _reads(t, auto_views)]
        return features
    features.pop("clusters")
    if source is None:
        return features
    templates = list(features.get("templates") or [])
    for n in settings["prefixes"]:
        name = f"brown{n}"
        views[name] = {"column": settings["column"], "fn": "cluster", "path": str(source), "n": int(n)}
        templates += [f"{name}[{offset}]" for offset in settings["offsets"]]
    templates += settings["templates"]
    features["views"], features["templates"] = views, templates
    return features


def _reads(template: str, names: set[str]) -> bool:
    """Whether a template reads any of the views ``names``."""
    return any(view in names for view in template_views(template))


def with_clusters(
    features: Mapping, train_words: Sequence[Sequence[str]], cache_dir: str | Path, unlabelled=None, data_root=None
) -> dict:
    """``features`` ready for the extractor: the clusters learned (or taken from the cache) when it
    asks for ``auto`` ones, else as :func:`expanded` makes them."""
    if not is_auto(features):
        return expanded(features, None)
    settings = settings_of(features.get("clusters"))
    paths_file, _ = learn(cache_dir, settings, train_words, pool_paths(features, unlabelled, data_root))
    return expanded(features, paths_file)


def copy_paths_file(features: Mapping, folder: Path) -> Path | None:
    """Copy the paths file that the views of an expanded ``features`` read into ``folder`` (as
    ``clusters.txt``, logged with the features); None when they read none."""
    for spec in dict(features.get("views") or {}).values():
        if isinstance(spec, Mapping) and spec.get("fn") == "cluster" and spec.get("path"):
            target = folder / PATHS_FILE
            shutil.copyfile(spec["path"], target)
            return target
    return None


def word_column(features: Mapping, default: str | None) -> str:
    """The column whose words the pool takes from the training split: the ``column`` of the
    clusters settings, or of the config's own ``auto`` cluster views, else ``default``.

    Raises
    ------
    ValueError
        No column is named and the dataset has no word column.
    """
    value = features.get("clusters")
    if isinstance(value, Mapping):
        return str(settings_of(value)["column"])
    for spec in dict(features.get("views") or {}).values():
        if isinstance(spec, Mapping) and spec.get("fn") == "cluster" and spec.get("path") == AUTO:
            return str(spec["column"])
    if default is None:
        raise ValueError("features.clusters: the dataset has no word column; name one with features.clusters.column")
    return default


# --- checks before any stage runs ------------------------------------------------------------
SNIFF_LINES = 200  # lines of a pool file read to tell its format


def format_problem(path: Path, file_format: str) -> str | None:
    """What is wrong when the first :data:`SNIFF_LINES` lines of a pool file do not look like
    ``file_format``, else None: a sentence-a-line text file read as ``conll`` would become one
    sentence of each line's first word, a CoNLL column file read as ``text`` sentences of words and
    tags. ``conll``: every token line has as many cells as the first (CoNLL-U files are not
    checked); ``text``: at least 10 lines all with the same number (>= 2) of tokens, with blank lines
    between them, look like columns, and a CoNLL-U file is refused.

    Raises
    ------
    crf.io.DataFormatError
        The file cannot be read (a broken gzip file, not UTF-8), naming it.
    """
    if str(path).endswith((".conllu", ".conllu.gz")):
        return "a CoNLL-U file, not a sentence a line (set features.clusters.format=conll)" if file_format == "text" else None
    widths: list[tuple[int, int]] = []  # (line number, cells) of the non-blank lines
    blank = False  # a blank line between them (CoNLL's sentence break)
    for number, line in decoded_lines(path):
        if number > SNIFF_LINES:
            break
        cells = line.split()
        blank = blank or (not cells and bool(widths))
        if cells and not (cells[0] == "-DOCSTART-" or (file_format == "text" and line.startswith("#"))):
            widths.append((number, len(cells)))
    if file_format == "conll":
        odd = next(((n, w) for n, w in widths if w != widths[0][1]), None) if widths else None
        if odd is not None:
            return (
                f"line {odd[0]} has {odd[1]} cells where line {widths[0][0]} has {widths[0][1]}: not a CoNLL column file "
                "(for a sentence a line set features.clusters.format=text)"
            )
        return None
    if blank and len(widths) >= 10 and len({w for _, w in widths}) == 1 and widths[0][1] >= 2:
        return (
            f"its first {len(widths)} lines all have {widths[0][1]} tokens: a CoNLL column file, not a sentence a line "
            "(for word columns set features.clusters.format=conll)"
        )
    return None


def paths_problem(path: Path) -> str | None:
    """What is wrong with the first :data:`SNIFF_LINES` lines of a paths file (the rules of
    :func:`crf.clusters.read_paths`: ``path<TAB>word[<TAB>count]``, the path a bit string), else
    None: a wrong file (a CoNLL file, a text file) is refused before any stage; the whole file is
    read, and checked, by the featurize stage.

    Raises
    ------
    crf.io.DataFormatError
        The file cannot be read (a broken gzip file, not UTF-8), naming it.
    """
    for number, line in decoded_lines(path):
        if number > SNIFF_LINES:
            break
        if not line.strip():
            continue
        parts = line.rstrip("\r").split("\t")
        if len(parts) not in (2, 3):
            return f"line {number}: expected 'path<TAB>word<TAB>count', got {len(parts)} tab-separated cells"
        if not parts[0] or set(parts[0]) - {"0", "1"}:
            return f"line {number}: path {parts[0]!r} is not a string of 0 and 1"
        if not parts[1]:
            return f"line {number}: empty word"
    return None


def _paths_file_checked(setting: str, given: str) -> None:
    path = checked_file(setting, given, "word-cluster paths file")
    problem = paths_problem(path)
    if problem:
        raise SettingsError(f"bad setting {setting}: paths file {path}: {problem}")


def _columns_checked(checks: Sequence[tuple[str, str]], dataset: Mapping) -> None:
    columns, label = list(dataset.get("columns") or []), dataset.get("label")
    for setting, column in checks:
        if column not in columns:
            raise SettingsError(
                f"bad setting {setting}={column!r}: not a column of dataset {dataset.get('name')!r} ({', '.join(columns)})"
            )
        if column == label:
            raise SettingsError(
                f"bad setting {setting}={column!r}: the label column (clusters of the labels would feed the answer to the model)"
            )


def _template_views_checked(setting: str, settings: Mapping[str, Any], features: Mapping, dataset: Mapping) -> None:
    """Refuse a ``templates`` entry that reads a name neither a ``brown<n>`` view of ``prefixes``, a
    view or lexicon of the feature set nor a dataset column (``brown4[0]|pos[0]`` on a dataset
    without ``pos``), or that does not parse."""
    known = {f"brown{n}" for n in settings["prefixes"]} | set(dict(features.get("views") or {}))
    known |= set(dict(features.get("lexicons") or {})) | {str(c) for c in dataset.get("columns") or []}
    what = f"a cluster view, a view of the feature set nor a column of dataset {dataset.get('name')!r}"
    check_template_names(setting, settings["templates"], known, what)


def validate(cfg) -> None:
    """Check the word clusters a run's features ask for, before any stage runs: the settings
    (:func:`settings_of`), the word column (a dataset column, not the label), the views they add
    (not already in the feature set) and their files: a paths file, or the pool files
    (``features.clusters.pool``, ``dataset.unlabelled``) readable, non-empty files whose first lines
    fit ``format``. What only the whole pool tells (no word in a file, ``min_count`` leaving no
    word) is refused by :func:`learn` once the pool is counted.

    Raises
    ------
    SettingsError
        One line naming the setting (and the file).
    """
    from pipeline.engine.validate import section

    features = section(cfg, "features")
    if not isinstance(features, Mapping):
        return
    value = features.get("clusters")
    settings = settings_of(value)
    if settings is None:
        if isinstance(value, str):  # a paths file the config's own views read
            _paths_file_checked("features.clusters", value)
        return
    dataset = section(cfg, "dataset")
    views = dict(features.get("views") or {})
    if isinstance(value, Mapping):
        taken = [f"brown{n}" for n in settings["prefixes"] if f"brown{n}" in views]
        if taken:
            raise SettingsError(
                f"bad setting features.clusters: the feature set {features.get('name')!r} has its own views "
                f"{', '.join(taken)}; give it features.clusters=auto or a paths file instead of a clusters mapping"
            )
        _columns_checked([("features.clusters.column", settings["column"])], dataset)
        _template_views_checked("features.clusters.templates", settings, features, dataset)
        if settings["source"] != AUTO:
            _paths_file_checked("features.clusters.source", settings["source"])
            return
    else:  # 'auto': the config's own views read the learned file
        auto = {n: spec for n, spec in views.items() if isinstance(spec, Mapping) and spec.get("fn") == "cluster"}
        auto = {n: spec for n, spec in auto.items() if spec.get("path") == AUTO}
        _columns_checked([(f"features.views.{n}.column", str(spec.get("column"))) for n, spec in auto.items()], dataset)
    unlabelled = dataset.get("unlabelled") or []
    if isinstance(unlabelled, str):
        unlabelled = [unlabelled]
    if not isinstance(unlabelled, Sequence) or not all(isinstance(p, str) and p for p in unlabelled):
        raise SettingsError(f"bad setting dataset.unlabelled={unlabelled!r}: a list of file paths (text or CoNLL pool files)")
    for path in pool_paths(features, list(unlabelled), section(cfg, "data.root")):
        problem = format_problem(path, settings["format"])
        if problem:
            raise SettingsError(f"bad setting features.clusters.format={settings['format']!r}: pool file {path}: {problem}")


def validate_semi(cfg) -> None:
    """Check the semi-supervised stage's clusters: ``semi.clusters`` (the ``crf_clusters`` arm's
    clustering of the training split's words plus the ``pool`` files, or a ``source`` paths file:
    the same file checks as :func:`validate`'s, named ``semi.clusters.*``) and the features it
    trains with (clusters learned from a pool there would be left out of every arm).

    Raises
    ------
    SettingsError
        One line naming the setting.
    """
    from pipeline.engine.validate import section

    semi = section(cfg, "semi") if "semi" in cfg else {}
    block = dict((semi or {}).get("clusters") or {})
    settings = settings_of(block, "semi.clusters")
    _columns_checked([("semi.clusters.column", settings["column"])], section(cfg, "dataset"))
    features = section(cfg, "features")
    if isinstance(features, Mapping):
        _template_views_checked("semi.clusters.templates", settings, features, section(cfg, "dataset"))
    if settings["source"] != AUTO:
        _paths_file_checked("semi.clusters.source", settings["source"])
    else:
        for path in pool_paths({"clusters": settings}, name="semi.clusters"):
            problem = format_problem(path, settings["format"])
            if problem:
                raise SettingsError(f"bad setting semi.clusters.format={settings['format']!r}: pool file {path}: {problem}")
    if isinstance(features, Mapping) and is_auto(features):
        raise SettingsError(
            "bad setting features.clusters: the semi_supervised stage does not learn the feature set's clusters "
            "(its crf_clusters arm learns its own, semi.clusters); drop them or give a paths file"
        )
    validate(cfg)
    arms = (semi or {}).get("arms")
    if isinstance(features, Mapping) and "crf_clusters" in (arms if arms is not None else ["crf_clusters"]):
        own = dict(expanded(features, None).get("views") or {})
        taken = [f"brown{n}" for n in settings["prefixes"] if f"brown{n}" in own]
        if taken:
            raise SettingsError(
                f"bad setting features.clusters: the feature set has views {', '.join(taken)}, which the crf_clusters arm "
                "adds from semi.clusters; drop the feature set's clusters or the crf_clusters arm (semi.arms)"
            )

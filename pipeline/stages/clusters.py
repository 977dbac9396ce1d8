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
  at each of ``offsets``, to any feature set.

A word without a path (not in the pool, or rarer than ``min_count``) gets no cluster attribute.
Pool files: ``format: conll`` (CoNLL-style columns, the word first, blank line between
sentences) or ``text`` (a sentence a line, tokens separated by whitespace), plain or gzip, read in
a stream; a missing or empty file is a one-line error naming it.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from crf.clusters import brown_clusters, count_bigrams, iter_words, write_paths
from crf.io import _decoded_lines
from pipeline.engine.cache import StageCache, code_digest, file_sha256

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
}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def settings_of(value: Any) -> dict[str, Any] | None:
    """The clustering settings ``features.clusters`` asks for (:data:`DEFAULTS` filled in), None
    when it asks for none (unset, or a paths file the config's views name themselves).

    Raises
    ------
    ValueError
        An unknown key or a bad value, naming ``features.clusters.<key>``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return dict(DEFAULTS) if value == AUTO else None
    if not isinstance(value, Mapping):
        raise ValueError(f"features.clusters={value!r}: a paths file, 'auto' or a mapping of settings")
    unknown = sorted(set(value) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"features.clusters: unknown setting(s) {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **dict(value)}
    for key in ("n_clusters", "min_count"):
        if not isinstance(settings[key], int) or isinstance(settings[key], bool) or settings[key] < 1:
            raise ValueError(f"features.clusters.{key}={settings[key]!r}: a whole number >= 1")
    if settings["format"] not in POOL_FORMATS:
        raise ValueError(f"features.clusters.format={settings['format']!r}: one of {', '.join(POOL_FORMATS)}")
    prefixes = list(settings["prefixes"] or [])
    if not prefixes or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in prefixes):
        raise ValueError(f"features.clusters.prefixes={prefixes!r}: whole numbers >= 0 (0: the whole path)")
    if any(not isinstance(o, int) or isinstance(o, bool) for o in list(settings["offsets"] or [])):
        raise ValueError(f"features.clusters.offsets={settings['offsets']!r}: whole numbers")
    if isinstance(settings["pool"], str):
        settings["pool"] = [settings["pool"]]
    settings["pool"] = [str(p) for p in settings["pool"] or []]
    return settings


def clustering_slice(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the paths file depends on (not the views made of it)."""
    return {"n_clusters": settings["n_clusters"], "min_count": settings["min_count"], "format": settings["format"]}


def is_auto(features: Mapping) -> bool:
    """Whether ``features`` asks for clusters learned from the pool."""
    settings = settings_of(features.get("clusters"))
    return settings is not None and settings["source"] == AUTO


def pool_paths(features: Mapping, unlabelled: Sequence[str] | None = None, data_root: str | Path | None = None) -> list[Path]:
    """The pool files: ``features.clusters.pool`` (relative paths against the project root) and the
    dataset's ``unlabelled`` files (relative paths against the data root), in that order.

    Raises
    ------
    FileNotFoundError
        A file that does not exist, naming the setting and the path.
    """
    settings = settings_of(features.get("clusters")) or {"pool": []}
    found: list[tuple[str, Path]] = []
    for given in settings["pool"]:
        path = Path(given).expanduser()
        found.append(("features.clusters.pool", path if path.is_absolute() else PROJECT_ROOT / path))
    for given in unlabelled or []:
        path = Path(str(given)).expanduser()
        root = Path(data_root) if data_root is not None else Path.cwd()
        found.append(("dataset.unlabelled", path if path.is_absolute() else root / path))
    for setting, path in found:
        if not path.is_file():
            raise FileNotFoundError(f"{setting}: no pool file {path}")
    return [path for _, path in found]


def text_sentences(path: str | Path) -> Iterator[list[str]]:
    """The sentences of a plain-text file, a sentence a line (tokens split on whitespace; blank
    lines skipped), streamed; a file without a word raises ValueError naming it."""
    seen = False
    for _, line in _decoded_lines(path):
        words = line.split()
        if words:
            seen = True
            yield words
    if not seen:
        raise ValueError(f"{path}: the text pool file holds no words")


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
    cache_dir: str | Path, settings: Mapping[str, Any], train_words: Sequence[Sequence[str]], files: Sequence[Path]
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

    Returns
    -------
    (Path, bool)
        The paths file, and whether it came from the cache.
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
    features["views"], features["templates"] = views, templates
    return features


def _reads(template: str, names: set[str]) -> bool:
    """Whether a template reads any of the views ``names``."""
    return any(part.split("[")[0] in names for part in template.split("|"))


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

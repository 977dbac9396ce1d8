"""Stage 2, featurize: fit the attribute vocabulary on train and build the sparse matrices.

Config slice: the features config. Input: the prepare stage's folder; external inputs: the
SHA-256 of every lexicon file (an edited lexicon is a new key). Relative lexicon paths resolve
against the project root (:data:`PROJECT_ROOT`, the folder holding ``conf/``), not the current
directory. Output folder: ``extractor.npz`` (the fitted vocabulary, see
``FeatureExtractor.state_arrays``), ``X_{train,dev,test}.npz`` (CSR matrices),
``offsets_{split}.npy`` and ``features.json`` (counts).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from crf import ModelFileError, load_arrays, save_arrays
from crf.batch import SequenceBatch
from crf.features import FeatureExtractor, NumericValueError, template_views
from pipeline.engine.cache import file_sha256
from pipeline.engine.stage import BaseStage, StageContext
from pipeline.engine.validate import SettingsError, check_template_names
from pipeline.report import write_json
from pipeline.stages import clusters
from pipeline.stages.prepare import SPLITS, read_prepared

if TYPE_CHECKING:  # annotations only: the adapter's module is not this stage's code
    from pipeline.models import ModelAdapter

EXTRACTOR_KIND = "crf.FeatureExtractor"
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding conf/


def lexicon_path(path: str) -> Path:
    """A lexicon file's path: absolute as given, relative against :data:`PROJECT_ROOT`."""
    given = Path(path).expanduser()
    return given if given.is_absolute() else PROJECT_ROOT / given


def lexicon_files(features: Mapping) -> dict[str, Path]:
    """{name: resolved path} of every file the features config reads: its ``lexicons`` and the
    views that read a file (``path``: word clusters); FileNotFoundError naming the lexicon or view
    and the path tried when a file is missing."""
    files = {name: lexicon_path(str(dict(spec)["path"])) for name, spec in dict(features.get("lexicons") or {}).items()}
    for name, spec in dict(features.get("views") or {}).items():
        if isinstance(spec, Mapping) and spec.get("path") is not None:
            files[f"view {name}"] = lexicon_path(str(spec["path"]))
    for name, path in files.items():
        what = name if name.startswith("view ") else f"lexicon {name!r}"
        if not path.is_file():
            raise FileNotFoundError(f"{what}: no file {path} (relative paths resolve against {PROJECT_ROOT})")
    return files


def build_extractor(features: Mapping, columns: Sequence[str]) -> FeatureExtractor:
    """A FeatureExtractor from a ``conf/features/*.yaml`` mapping. Each lexicon becomes a view
    over the word column ``w`` with templates at ``lexicon_offsets``; its path resolves by
    :func:`lexicon_path`."""
    views = {name: dict(spec) for name, spec in dict(features.get("views") or {}).items()}
    templates = list(features.get("templates") or [])
    paths = lexicon_files(features)
    for name, spec in views.items():
        if spec.get("path") is not None:
            spec["path"] = str(paths[f"view {name}"])
    for name, spec in dict(features.get("lexicons") or {}).items():
        spec = dict(spec)
        views[name] = {
            "column": spec.get("column", "w"),
            "fn": "lexicon",
            "path": str(paths[name]),
            "lowercase": spec.get("lowercase", False),  # checked by the extractor: "no" is not true
        }
        templates += [f"{name}[{offset}]" for offset in features.get("lexicon_offsets", [0])]
    return FeatureExtractor(
        columns=list(columns),
        templates=templates,
        views=views,
        numeric=list(features.get("numeric") or []),
        bos_eos=features.get("bos_eos", True),
        padding=features.get("padding", False),
        min_count=int(features.get("min_count", 1)),
    )


def check_switches(cfg) -> None:
    """Refuse (:class:`SettingsError`, one line) a view's or lexicon's ``lowercase`` that is not true
    or false: ``lowercase=no`` would read as true."""
    from pipeline.engine.validate import SettingsError, non_switch

    keys = [
        f"features.{group}.{name}.lowercase"
        for group in ("views", "lexicons")
        for name in dict(OmegaConf.select(cfg, f"features.{group}", default=None) or {})
    ]
    problem = non_switch(cfg, keys)
    if problem:
        raise SettingsError(f"bad setting {problem}")


def check_columns(cfg) -> None:
    """Refuse (:class:`SettingsError`, one line) a feature set that reads nothing (no template and
    no numeric column), or that reads a column the dataset lacks: a view or lexicon over it, a
    numeric attribute of it, or a template over a name that is neither one of its views nor a
    dataset column (``features=chunking`` reads ``pos``, which ``ud_english_ewt_upos`` has not)."""
    try:
        features = OmegaConf.to_container(cfg.features, resolve=True)
    except OmegaConfBaseException:  # a mandatory value left unset (a clusters file): named by its own check
        features = OmegaConf.to_container(cfg.features, resolve=False)
    if isinstance(features, Mapping) and not (features.get("templates") or features.get("numeric") or features.get("clusters")):
        raise SettingsError(
            f"bad setting features.templates={features.get('templates')!r}: the feature set has no template, numeric column "
            "or word clusters, so the model would read nothing of its input"
        )
    columns = [str(c) for c in (OmegaConf.select(cfg, "dataset.columns", default=None) or [])]
    if not columns or not isinstance(features, Mapping):
        return
    where = f"dataset {OmegaConf.select(cfg, 'dataset.name', default='?')!r} (columns {', '.join(columns)})"
    views = dict(features.get("views") or {})
    lexicons = dict(features.get("lexicons") or {})
    for kind, entries, default in (("views", views, None), ("lexicons", lexicons, "w")):
        for name, spec in entries.items():
            column = spec.get("column", default) if isinstance(spec, Mapping) else None
            if column is not None and column not in columns:
                raise SettingsError(f"bad setting features.{kind}.{name}: it reads column {column!r}, which {where} lacks")
    for name in features.get("numeric") or []:
        if name not in columns:
            raise SettingsError(f"bad setting features.numeric: {name!r} is not a column of {where}")
    known = set(columns) | set(views) | set(lexicons)
    check_template_names(
        "features.templates", features.get("templates") or [], known, f"a view of the feature set nor a column of {where}"
    )
    label = OmegaConf.select(cfg, "dataset.label", default=None)
    reads = _label_reader(features, views, lexicons, label)
    if reads is not None:
        raise SettingsError(
            f"bad setting {reads} reads the label column {label!r} of {where}: the model would be given its answers "
            "(name another dataset.label, or drop it from the features)"
        )


def _label_reader(features: Mapping, views: Mapping, lexicons: Mapping, label: str | None) -> str | None:
    """The first feature setting that reads the column ``label`` at tagging time (a view or lexicon
    over it, a numeric attribute of it, a template cell naming it), or None. A ``mentions`` view
    names the label column as the source of its lexicon: it reads it in training only."""
    if label is None:
        return None
    for kind, entries, default in (("views", views, None), ("lexicons", lexicons, "w")):
        for name, spec in entries.items():
            if isinstance(spec, Mapping) and spec.get("column", default) == label:
                return f"features.{kind}.{name}"
    if label in (features.get("numeric") or []):
        return "features.numeric"
    for template in features.get("templates") or []:
        if label in template_views(template):
            return f"features.templates ({template!r})"
    return None


def save_extractor(path: Path, extractor: FeatureExtractor) -> None:
    save_arrays(path, EXTRACTOR_KIND, {"config": extractor.config()}, extractor.state_arrays())


def load_extractor(path: Path) -> FeatureExtractor:
    """The fitted extractor saved at ``path``; a bad file raises ModelFileError naming it."""
    meta, arrays = load_arrays(path, EXTRACTOR_KIND)
    if not isinstance(meta, dict) or "config" not in meta:
        raise ModelFileError(f"{path}: no feature configuration in the file")
    return FeatureExtractor.from_state(meta["config"], arrays, path)


def load_batch(folder: Path, split: str) -> SequenceBatch:
    return SequenceBatch(sp.load_npz(folder / f"X_{split}.npz"), np.load(folder / f"offsets_{split}.npy", allow_pickle=False))


class Featurize(BaseStage):
    """Fit the attribute vocabulary on the training split; build every split's CSR matrix."""

    name = "featurize"
    summary_prefix = None

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("prepare",)

    def validate(self, cfg) -> None:
        check_switches(cfg)
        check_columns(cfg)
        clusters.validate(cfg)  # the word clusters' settings and files, before any stage runs
        features = OmegaConf.to_container(cfg.features, resolve=True)
        try:  # the lexicons' and file views' files (learned clusters' file does not exist yet: left out)
            lexicon_files(clusters.expanded(features, None))
        except FileNotFoundError as error:
            raise SettingsError(f"bad setting features: {error}") from None

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        features = OmegaConf.to_container(cfg.features, resolve=True)
        if clusters.is_auto(features):  # clusters learned from the pool: the dataset's unlabelled files join it
            return {"features": features, "unlabelled": list(OmegaConf.select(cfg, "dataset.unlabelled", default=None) or [])}
        return {"features": features}

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        # where learned clusters are cached, and the root of the dataset's unlabelled files: not hashed
        # (the pool's content is, see external_inputs)
        return {
            "log_matrices": bool(cfg.featurize.log_matrices),
            "cache_dir": str(cfg.paths.cache_dir),
            "data_root": str(cfg.data.root),
        }

    def external_inputs(self, config, settings) -> dict[str, str]:
        """SHA-256 of every file the features read (lexicons, cluster paths): editing one
        invalidates the cached features."""
        features = OmegaConf.to_container(config.features, resolve=True)
        files = lexicon_files(clusters.expanded(features, None))
        hashes = {f"lexicon:{name}": file_sha256(path) for name, path in files.items()}
        if clusters.is_auto(features):  # the pool's files (its training words are the prepare input)
            pool = clusters.pool_paths(features, list(config.get("unlabelled") or []), settings.data_root)
            hashes.update({f"pool:{i}": file_sha256(path) for i, path in enumerate(pool)})
        return hashes

    def volatile(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("features.json",)  # the feature-extraction times

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        """The vocabulary and counts; the matrices stay in the cache unless ``log_matrices``."""
        matrices = ("X_*.npz", "offsets_*.npy") if settings.log_matrices else ()
        return ("extractor.npz", "features.json", clusters.PATHS_FILE, *matrices)

    def run(self, context: StageContext) -> dict:
        data = read_prepared(context.inputs["prepare"])
        out = context.out
        features = OmegaConf.to_container(context.config.features)
        if clusters.is_auto(features):
            word = data.column("train", clusters.word_column(features, data.word_column))
            unlabelled = list(context.config.get("unlabelled") or [])
            features = clusters.with_clusters(features, word, context.settings.cache_dir, unlabelled, context.settings.data_root)
        else:
            features = clusters.expanded(features, None)
        clusters.copy_paths_file(features, out)
        extractor = build_extractor(features, data.columns)
        with _numeric_cells("train", data.name):
            extractor.fit(data.splits["train"])
        save_extractor(out / "extractor.npz", extractor)
        metrics = {"attributes": extractor.n_attributes}
        for split in (s for s in SPLITS if data.splits[s]):  # data.final_fit=train+dev: no dev split, no dev matrix
            began = time.perf_counter()
            with _numeric_cells(split, data.name):
                batch = extractor.transform(data.splits[split])
            metrics[f"{split}_feature_seconds"] = time.perf_counter() - began
            sp.save_npz(out / f"X_{split}.npz", batch.X, compressed=False)
            np.save(out / f"offsets_{split}.npy", batch.offsets)
            metrics[f"{split}_nonzeros"] = int(batch.X.nnz)
            metrics[f"{split}_attributes_per_token"] = batch.X.nnz / max(batch.n_tokens, 1)
        write_json(out / "features.json", metrics)
        return metrics


@contextlib.contextmanager
def _numeric_cells(split: str, dataset: str) -> Iterator[None]:
    """A numeric feature column's bad cell (NumericValueError), found before any training, as a
    one-line error naming the split (exit status 2), not a traceback."""
    try:
        yield
    except NumericValueError as error:
        raise SettingsError(
            f"the {split} split of dataset {dataset!r} (as prepared): {error}; fix the file, or leave the column out of "
            "features.numeric"
        ) from None


STAGE = Featurize()

"""``python -m pipeline.tag model=<bundle> input=<file> output=<file>``: tag new text with a trained model.

The model is a :class:`crf.ModelBundle` (``bundle.npz``, written by the train stage): a path to
the file or to a folder holding one, or an MLflow URI (``runs:/<run id>/train``, ``runs:/<train run
id>/model``, ``models:/<name>/<version>``, ``models:/<name>@champion``, ``models:/m-<id>``) whose artifacts hold
it (downloaded with :func:`mlflow.artifacts.download_artifacts`; the folder is searched for
``bundle.npz``). URIs resolve against the store the pipeline writes by default, chosen by the same
``tracking`` config (``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else
``sqlite:///<paths.output_dir>/mlflow.db``), for runs and for the Model Registry alike
(``MLFLOW_REGISTRY_URI`` only when set); a SQLite store that does not exist is an error, never a
new empty ``mlflow.db``. ``runs:/<pipeline run id>/train`` (the id a pipeline run prints) follows
the pipeline run to its train stage run (and a cached stage run to the run that computed it).

Chaining: ``model=[<first>,<second>,...]`` runs the models in order; each model's predictions
fill the column its training data labelled (``source.dataset.label`` of its bundle, e.g. ``xpos``
for the EWT XPOS tagger) and, through ``column_aliases`` (default ``{xpos: pos}``: UD's XPOS are
Penn Treebank tags, the tags of CoNLL-2000's ``pos`` column), the columns that name maps to.
A later model reads those columns; the input file gives every other column a model needs.

Formats are in :mod:`pipeline.apps.formats`: CoNLL columns are named by a header line or by the
training data's column layout the bundle records (``source.dataset.columns``), never guessed;
plain text is split as the first model's training tokens were made (``tokenize``, see
:func:`text_tokenisation`); every token passes :func:`crf.bundle.check_tokens`. With gold labels
in the input (the column named as the last model's label column) the last model's token accuracy
(and chunk precision, recall and F1 for chunk schemes) is logged and returned, all in percent
(0-100, as conlleval prints them); a placeholder column (every cell ``_``, or ``O`` for a chunk
scheme) is not scored.

Every problem with the settings, the output place, the model or the input is found before any
tagging: the command then logs one line and exits with status 2, leaving no output file.

The Hydra key ``model`` is also the name of the pipeline's model config group, which Hydra would
read as a group choice: the command line's ``model=...`` is passed to Hydra as ``models=...``
(either spelling works).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, ListConfig, OmegaConf

from crf import metrics
from crf.bundle import MIN_KNOWN, ModelBundle, TokenError, check_tokens, load_bundle, normalize_scheme
from crf.features import NumericValueError
from crf.io import check_input_file, special_file_kind
from pipeline.apps import added_setting
from pipeline.apps.formats import (
    OUTPUT_FORMATS,
    TOKENISATIONS,
    WORDS,
    Corpus,
    Prediction,
    check_conll_cells,
    detect_format,
    read_input,
    write_output,
)
from pipeline.models import BUNDLE_FILE
from pipeline.report import redacted

log = logging.getLogger(__name__)

#: the share of gold chunks not written in the model's scheme above which the gold column is taken
#: for another scheme: IOB1 against IOB2 writes most chunks otherwise (all but those right after a
#: chunk of their type), IOBES against IOB2 every one; gold with annotation slips, far fewer
OTHER_SCHEME_SHARE = 0.5
SCHEME_RULES = {
    "iob2": "every chunk begins with 'B-'",
    "iob1": "'B-' begins a chunk only right after one of its type",
    "iobes": "'S-' for a one-token chunk, 'B-' ... 'E-' for a longer one",
}
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")  # runs:/..., models:/..., s3://..., mlflow-artifacts:/...


class TagError(ValueError):
    """A bad model reference or input for the tag command (the message says which and why)."""


def _bundle_in(folder: Path, reference: str) -> Path:
    found = sorted(folder.rglob(BUNDLE_FILE))
    if not found:
        raise TagError(f"model {reference!r}: no {BUNDLE_FILE} in {folder} (train the model with this version of the pipeline)")
    if len(found) > 1:
        raise TagError(f"model {reference!r}: several {BUNDLE_FILE} files ({', '.join(map(str, found))}); name one")
    return found[0]


def resolve_model(reference: str, tracking_uri: str | None = None, registry_uri: str | None = None) -> Path:
    """The local path of the bundle ``reference`` names (a file, a folder holding one, or an MLflow
    URI resolved against ``tracking_uri`` and ``registry_uri``, default the tracking URI; both None:
    MLflow's own settings, which the tag command never leaves to chance)."""
    reference = str(reference)
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _bundle_in(path, reference)
    if special_file_kind(path) is not None:
        raise TagError(f"model {reference!r}: is {special_file_kind(path)}, not a model file")
    if not _URI.match(reference) or reference.startswith("file:/"):
        raise TagError(
            f"model {reference!r}: no such file or folder, and not an MLflow URI "
            "(runs:/<run id>/<path>, models:/<name>/<version>)"
        )
    if tracking_uri is None:
        local = _download(reference)
    else:
        from pipeline import tracking

        try:
            tracking.check_store_exists(tracking_uri)
            if registry_uri not in (None, tracking_uri):
                tracking.check_store_exists(registry_uri, tracking.REGISTRY_SETTING)
        except (FileNotFoundError, tracking.TrackingUnavailable) as err:
            raise TagError(f"model {reference!r}: {err}") from None
        store = tracking_uri if (registry_uri or tracking_uri) == tracking_uri else f"{tracking_uri} (registry {registry_uri})"
        log.info("model %s: from the store %s", reference, redacted(store))
        with tracking.using_store(tracking_uri, registry_uri):
            local = _download(reference)
    return local if local.is_file() else _bundle_in(local, reference)


def _download(reference: str) -> Path:
    """Download ``reference`` from the current MLflow store; ``runs:/<id>/<path>`` that fails is
    retried on the run that holds the files (see :func:`_files_run_uri`), else TagError: also for
    a URI the command cannot reach (``s3://`` without credentials, an unknown scheme, a scheme
    whose client is missing, an unreachable server), whatever its client raises."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=reference))
    except (MlflowException, OSError) as err:
        failure = str(err).splitlines()[0] if str(err) else type(err).__name__
    except Exception as err:  # noqa: BLE001 - a store the command cannot reach (s3:// without credentials, a scheme
        # whose client is not installed, a malformed address): its client's own exception, said in one line
        log.debug("downloading %s failed", reference, exc_info=True)
        failure = f"{type(err).__name__}: {str(err).splitlines()[0]}" if str(err) else type(err).__name__
    if reference.startswith("runs:/"):
        other, hint = _files_run_uri(reference)
        if other is not None:
            log.info("%s: %s; using %s", reference, hint, other)
            try:
                return Path(mlflow.artifacts.download_artifacts(artifact_uri=other))
            except (MlflowException, OSError):
                pass
        if hint:
            failure += f"; {hint}"
    raise TagError(f"model {reference!r}: cannot download its artifacts ({failure})")


def _files_run_uri(reference: str) -> tuple[str | None, str]:
    """For ``runs:/<id>/<path>``: (the same path in the run that holds the files, why) when the run
    is a pipeline run (its files are in its stage runs: the ``<path>`` stage's, else the one that
    logged the model) or a stage run that reused a cached result (its files are in the run that
    computed it); (None, the URIs that do load) otherwise; (None, "") for an unknown run."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipeline import tracking

    run_id, _, artifact = reference[len("runs:/") :].partition("/")
    client = MlflowClient()
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None, ""
    tags = run.data.tags
    stage = artifact.split("/", 1)[0] or "train"
    target = None
    if tags.get("stage") == "pipeline":
        child = tracking.stage_run(client, run, stage) or tracking.stage_run(client, run, "train")
        if child is not None:
            target = tracking.files_run(client, child)
            why = f"run {run_id} is a pipeline run, its {child.data.tags.get('stage')} stage ran as run {child.info.run_id}"
            if target.info.run_id != child.info.run_id:
                why += f" (reusing run {target.info.run_id})"
    elif tags.get(tracking.CACHE_SOURCE_TAG):
        target = tracking.files_run(client, run)
        why = f"run {run_id} reused the cached result of run {target.info.run_id}"
    if target is not None:
        return f"runs:/{target.info.run_id}/{artifact}", why
    loads = [tags[k] for k in (tracking.MODEL_URI_TAG, "registered_model") if tags.get(k)]
    return None, (f"run {run_id} has no {artifact!r}; these load: {', '.join(loads)}" if loads else "")


def output_column(bundle: ModelBundle) -> str:
    """The column a bundle predicts: its dataset's label column (``label`` when unknown)."""
    return str(bundle.source.get("dataset", {}).get("label") or "label")


def file_columns(bundles: Sequence[ModelBundle], aliases: Mapping[str, str]) -> list[str]:
    """The columns the input must give: every model's input columns that no earlier model fills."""
    needed: list[str] = []
    filled: set[str] = set()
    for bundle in bundles:
        needed += [c for c in bundle.input_columns if c not in filled and c not in needed]
        column = output_column(bundle)
        filled |= {column, *([aliases[column]] if column in aliases else [])}
    return needed


def check_chain_columns(bundles: Sequence[ModelBundle], aliases: Mapping[str, str], references: Sequence[str]) -> None:
    """Refuse a chain in which a model reads a column an earlier model fills (directly or through
    ``aliases``) with labels of another kind than it saw there in training: under half of the
    earlier model's labels are values the later one knows in that column (UPOS labels fed as
    ``pos`` to a PTB-tag chunker). The same rule as :func:`check_input_columns` for file columns."""
    filled: dict[str, int] = {}  # column -> the chain position of the model that fills it
    for position, bundle in enumerate(bundles):
        known = bundle.known_values()
        for column in bundle.input_columns:
            if column not in filled or column not in known:
                continue
            source = bundles[filled[column]]
            labels = [str(label) for label in source.labels]
            share = sum(label in known[column][0] for label in labels) / max(1, len(labels))
            if share < MIN_KNOWN:
                via = output_column(source)
                how = f" (column_aliases {via}={column})" if via != column else ""
                examples = ", ".join(repr(label) for label in labels if label not in known[column][0])
                raise TagError(
                    f"model {position + 1} of the chain ({references[position]}) reads {column!r} from model "
                    f"{filled[column] + 1} ({references[filled[column]]}), its {via!r}{how}, but {100 * share:.0f}% of those "
                    f"labels are values it saw there in training (not {examples[:80]}, ...): the chain feeds it another tag set"
                )
        column = output_column(bundle)
        for name in {column, aliases.get(column, column)}:
            filled[name] = position


def tag_corpus(bundles: Sequence[ModelBundle], corpus: Corpus, aliases: Mapping[str, str]) -> list[Prediction]:
    """Run the chain on ``corpus``; each model's labels join ``corpus.columns`` for the next."""
    predictions = []
    for bundle in bundles:
        began = time.perf_counter()
        result = bundle.tag_arrays(corpus.columns, corpus.lengths)
        result.warn_impossible(  # numbered from 1, as the input's errors are
            f"{bundle.kind}'s labels for them are an arbitrary path, written only to keep the file whole",
            np.arange(1, len(corpus.lengths) + 1),
        )
        labels = np.array(bundle.labels, dtype=object)[result.codes]
        column = output_column(bundle)
        for name in {column, aliases.get(column, column)}:
            corpus.columns[name] = labels
        predictions.append(Prediction(column, labels, result.marginals, result.segments))
        seconds = time.perf_counter() - began
        log.info(
            "%s: %d tokens tagged into %r in %.2fs (%.0f tokens/s)",
            bundle.kind,
            labels.size,
            column,
            seconds,
            labels.size / seconds,
        )
    return predictions


def check_gold_column(corpus: Corpus, bundle: ModelBundle, input_path) -> bool:
    """Whether the gold column is scored. Not when it is a placeholder: every cell CoNLL's ``_``,
    or, for a chunk scheme, ``O`` (the dummy label column CRF++- and CRFsuite-style input carries;
    an info line says so). Refused (TagError) when some but not all of its cells are ``_`` (no
    label), and when it does not hold the model's labels: under
    :data:`~crf.bundle.MIN_KNOWN` of its cells are labels the model knows, or, for a chunk scheme,
    of its cells outside ``O`` (an NER column is mostly ``O``, as a chunk column is not). A file
    whose columns were taken by position (no header) in another order than the training data's
    would otherwise be scored against words, tags or another task's labels ("accuracy 0.00").
    Labels the model does not know are scored as errors, with a warning that counts them."""
    if corpus.gold is None or not len(corpus.gold):
        return False
    gold, scheme = pd.Series(corpus.gold, dtype=object), normalize_scheme(bundle.scheme)
    inside = gold != "O"
    placeholder = "_" if (gold == "_").all() else "O" if scheme != "none" and not inside.any() else None
    if placeholder is not None:
        log.info("input %s: every cell of the gold column is %r: taken as a placeholder, not scored", input_path, placeholder)
        return False
    labels = set(bundle.labels) | set(map(str, bundle.labels))
    known = gold.isin(labels)
    shares = {"": float(known.mean())}
    if scheme != "none":
        shares[" of its cells outside 'O'"] = float(known[inside].mean())
    which = min(shares, key=shares.get)
    if shares[which] < MIN_KNOWN:
        examples = ", ".join(repr(v) for v in gold[~known].unique()[:3])
        raise TagError(
            f"input {input_path}: the column read as the gold labels holds{which} {100 * shares[which]:.0f}% labels the model "
            f"knows (not {examples}, ...): its columns are not in the order the model expects (name them with a first line "
            "'# global.columns = <names>'), or it holds another tag set or scheme than the model's"
        )
    blank = (gold == "_") & ("_" not in labels)
    if blank.any():  # CoNLL's "no value": a cell scored as a wrong answer would lower every figure
        first = int(np.argmax(blank.to_numpy()))
        sentence = int(np.searchsorted(corpus.offsets, first, side="right")) - 1
        raise TagError(
            f"input {input_path}: {int(blank.sum())} of the {len(gold)} cells of the gold column are '_' (no label), the first "
            f"at sentence {sentence + 1}, token {first - int(corpus.offsets[sentence]) + 1}: a gold column is scored only "
            "when every cell holds a label; fill them, or tag without scoring (score=false)"
        )
    if not known.all():  # a label the training data lacked (a rare type), or slips: counted as errors, and said so
        log.warning(
            "input %s: %d of the %d cells of the gold column (%.1f%%) are labels the model does not know (%s): "
            "they count as errors in the scores",
            input_path, int((~known).sum()), len(gold), 100 * float((~known).mean()),
            ", ".join(repr(v) for v in gold[~known].unique()[:3]) + (", ..." if gold[~known].nunique() > 3 else ""),
        )  # fmt: skip
    if scheme != "none":
        bad, total = metrics.scheme_violations(corpus.sentences(corpus.gold), scheme)
        if bad > OTHER_SCHEME_SHARE * total:  # the chunks score alike, the token accuracy would be off
            raise TagError(
                f"input {input_path}: {bad} of the {total} chunks of the gold column are not written as "
                f"{scheme.upper()} writes them ({SCHEME_RULES[scheme]}), the model's scheme: convert the column to "
                f"{scheme.upper()} to score it"
            )
    return True


def check_input_columns(corpus: Corpus, bundles: Sequence[ModelBundle], needed: Sequence[str], input_path) -> None:
    """Refuse a file when a column read into a model's input holds another kind of value than the
    model saw there in training (:meth:`crf.bundle.ModelBundle.column_findings`, the check that
    :meth:`~crf.bundle.ModelBundle.tag`, ``tag_frame`` and the served model make too): POS tags
    read as words, words read as POS tags, chunk tags or UPOS read as Penn Treebank tags. Columns
    taken by position (a CoNLL file of two or more columns without a header) are then in the wrong
    order; named ones (CoNLL-U, JSONL, a header) hold another kind of value than their name says
    (UPOS as ``pos``, CoNLL-U's ``_`` for an XPOS it does not give). A tag-set column the model
    half knows is tagged with a warning; a column of new words (text of another domain) is tagged."""
    for bundle in bundles:
        words = bundle.source.get("dataset", {}).get("word_column") or WORDS
        columns = {c: corpus.columns[c] for c in needed if c in corpus.columns}  # others: filled by an earlier model
        for finding in bundle.column_findings(columns, by_position=corpus.by_position, words=words):
            if finding.refusal is None:
                log.warning(
                    "input %s: %.0f%% of the column %r are values the model never saw there in training (%s, ...)",
                    input_path, 100 * (1 - finding.known), finding.column, finding.examples(),
                )  # fmt: skip
                continue
            if corpus.by_position:
                fix = "its columns are not in the order the model expects; name them (as they are) with a first line "
                fix += "'# global.columns = <names>'"
            else:
                fix = f"the file's {finding.column!r} is not the kind of value the model was trained on there"
            raise TagError(
                f"input {input_path}: the column read as {finding.column!r} holds {100 * finding.known:.0f}% values the model "
                f"saw there in training ({finding.refusal}; not {finding.examples()}, ...): {fix}"
            )


def score(bundle: ModelBundle, corpus: Corpus, prediction: Prediction) -> dict[str, float]:
    """The last model against the gold column, all in percent (0-100): token ``accuracy`` and, for
    chunk schemes, conlleval's chunk ``precision``, ``recall`` and ``f1``."""
    gold, predicted = corpus.sentences(corpus.gold), corpus.sentences(prediction.labels)
    scores = {"accuracy": metrics.token_accuracy(gold, predicted)}  # already a percentage
    if bundle.scheme != "none":
        chunks = metrics.chunk_scores(gold, predicted)
        scores.update({"precision": chunks.precision, "recall": chunks.recall, "f1": chunks.f1})
    return scores


def training_layout(bundles: Sequence[ModelBundle], needed: Sequence[str]) -> list[str] | None:
    """The column layout that names a CoNLL input's columns: the training data's columns
    (``source.dataset.columns``) of the last model, else of the first, that holds every column
    the chain reads from the file; None when no model records one."""
    for bundle in (bundles[-1], bundles[0]):
        layout = bundle.source.get("dataset", {}).get("columns")
        if isinstance(layout, list) and all(isinstance(c, str) for c in layout) and set(needed) <= set(layout):
            return layout
    return None


# how the word tokens of a dataset the pipeline ships were made, for bundles that do not record it
KNOWN_TOKENISATION = {
    "anystyle": "whitespace",
    "conll2000": "punct",
    "ud_english_ewt_upos": "punct",
    "ud_english_ewt_xpos": "punct",
}


def bundle_tokenisation(bundle: ModelBundle) -> str | None:
    """How the training tokens of ``bundle`` were made: ``whitespace`` or ``punct`` (its
    ``source.dataset.tokenisation``, else known from the dataset name it records), or None."""
    dataset = bundle.source.get("dataset", {})
    value = dataset.get("tokenisation") or KNOWN_TOKENISATION.get(str(dataset.get("name")))
    return value if value in TOKENISATIONS else None


def text_tokenisation(choice: str, bundle: ModelBundle, reference: str) -> str:
    """How to split plain text for ``bundle`` (the chain's first model): as its training tokens
    were made. ``choice`` (the ``tokenize`` setting): ``auto`` (the model's way) or a way that
    must agree with the model's; a model that does not record it needs the setting."""
    if choice not in ("auto", *TOKENISATIONS):
        raise TagError(f"tokenize={choice!r}; one of auto, {', '.join(TOKENISATIONS)}")
    recorded = bundle_tokenisation(bundle)
    if recorded is None:
        if choice == "auto":
            raise TagError(
                f"model {reference!r} does not record how its training text was tokenised: set tokenize=whitespace "
                "(split on spaces only) or tokenize=punct (punctuation split off, Penn-Treebank-like)"
            )
        return choice
    if choice not in ("auto", recorded):
        raise TagError(
            f"tokenize={choice}: model {reference!r} was trained on {recorded} tokens, so it would be fed tokens it never saw; "
            f"drop the setting or set tokenize={recorded}"
        )
    return recorded


def _artifact_roots(store: str, database: Path) -> list[Path]:
    """The local folders of the artifacts of a SQLite tracking store's experiments (their
    ``artifact_location``, read from the store; nothing for a store that does not exist yet, which
    a client would create), and the default layout's folder beside the database."""
    from urllib.parse import unquote, urlparse

    from pipeline.tracking import ARTIFACTS, store_problem

    roots = [database.parent / ARTIFACTS]
    if database.is_file() and store_problem(store) is None:  # MLflow would retry a damaged file for minutes
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        try:
            experiments = MlflowClient(tracking_uri=store).search_experiments(view_type=ViewType.ALL)
        except Exception as error:  # not a store MLflow can read (damaged, another program's): the default layout only
            log.debug("store %s: its experiments cannot be read (%s)", store, error)
            experiments = []
        for experiment in experiments:
            location = urlparse(experiment.artifact_location or "")
            if location.scheme in ("", "file") and location.path:
                roots.append(Path(unquote(location.path)))
    return roots


def _cache_entry_of(path: Path) -> Path | None:
    """The stage cache entry (a folder whose manifest names its stage and key) that holds ``path``
    (a resolved file path) within the three folders above it, or None."""
    import json

    from pipeline.engine.cache import MANIFEST

    for folder in list(path.parents)[:3]:
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and {"stage", "key", "files"} <= manifest.keys():
            return folder
    return None


def _holds_cache_entries(folder: Path, looked_at: int = 50) -> bool:
    """Whether ``folder`` holds stage cache entries (a stage's folder) or folders of them (a cache's
    root), judged by the first ``looked_at`` subfolders of each."""
    from pipeline.engine.cache import MANIFEST

    def subfolders(path: Path) -> list[Path]:
        try:
            return [child for _, child in zip(range(looked_at), (c for c in path.iterdir() if c.is_dir()))]
        except OSError:
            return []

    children = subfolders(folder)
    if any((child / MANIFEST).is_file() for child in children):
        return True
    return any((grandchild / MANIFEST).is_file() for child in children for grandchild in subfolders(child))


def check_not_a_model(
    output: str | Path,
    models: Sequence[Path],
    stores: Sequence[str | None] = (),
    cache_dir: str | Path | None = None,
    data_root: str | Path | None = None,
) -> None:
    """Refuse an output that is one of the bundle files the command reads (``models``: their local
    paths, a folder or ``~`` resolved), a file of a SQLite tracking store it reads them from
    (``stores``: URIs; the database and its journal files, existing or not) or in that store's
    artifact folders (its experiments' artifact locations), a file in the stage cache
    (``cache_dir``, ``paths.cache_dir``, any cache a model is read from, any cache entry), a file in
    the data root (``data_root``, ``data.root``, where the datasets are), or any SQLite database (an
    Optuna study's storage), through a link or not, new or existing: writing it would destroy the
    model, a dataset, or runs, registered models or a study, or put a file into a cache entry or an
    artifact folder that the next run would find damaged."""
    from pipeline.engine.cache import MANIFEST
    from pipeline.tracking import SQLITE_MAGIC, sqlite_path

    output_path = Path(output)
    for model in models:
        if model.is_file() and output_path.exists() and output_path.resolve() == model.resolve():
            raise TagError(f"output {output_path}: is the model file (model={model}); name another file")
    target = output_path.resolve()
    for store in filter(None, stores):
        database = sqlite_path(store)
        if database is None:
            continue
        files = [Path(f"{database}{end}") for end in ("", "-wal", "-journal", "-shm", ".lock", ".registry.lock")]
        if any(target == f.resolve() for f in files):
            raise TagError(f"output {output_path}: is a file of the tracking store {store}; name another file")
        for root in _artifact_roots(store, Path(database)):
            if target.is_relative_to(root.resolve()):
                raise TagError(f"output {output_path}: is a file in the artifact store of the tracking store {store} "
                               f"({root}); name a file outside it")  # fmt: skip
    if data_root is not None and target.is_relative_to(Path(data_root).resolve()):
        raise TagError(f"output {output_path}: is a file in the data root ({data_root}, data.root), where the datasets "
                       "are; name a file outside it")  # fmt: skip
    if cache_dir is not None and target.is_relative_to(Path(cache_dir).resolve()):
        raise TagError(f"output {output_path}: is a file in the stage cache ({cache_dir}, paths.cache_dir); name another file")
    for model in models:  # a model read from a stage cache entry (<cache>/<stage>/<key>/, with its manifest): that cache
        entry = model if model.is_dir() else model.parent
        if (entry / MANIFEST).is_file() and target.is_relative_to(entry.parent.parent.resolve()):
            raise TagError(f"output {output_path}: is a file in the stage cache {entry.parent.parent} that the model "
                           f"{model} is read from; name another file")  # fmt: skip
    entry = _cache_entry_of(target)
    if entry is not None:  # any stage's cache entry, wherever its cache is (another store's, another output folder's)
        raise TagError(f"output {output_path}: is a file of the stage cache entry {entry}; name another file")
    if _holds_cache_entries(target.parent):  # a stage's folder of entries, or a cache's folder of stages
        raise TagError(f"output {output_path}: is a file in a stage cache ({target.parent} holds cache entries); name "
                       "another file")  # fmt: skip
    if target.is_file():
        with open(target, "rb") as existing:
            if existing.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:  # an Optuna study's storage, another tracking store
                raise TagError(f"output {output_path}: is an SQLite database (an Optuna study's storage or a tracking "
                               "store, say), which the output would replace; name another file")  # fmt: skip


def _system_place(path: Path) -> str | None:
    """The ``/dev`` or ``/proc`` path that ``path``, its folder or a link on its way leads through
    (``/dev/stdout`` -> ``/proc/self/fd/1``), or None."""
    current, hops = Path(os.path.abspath(path)), 0
    while True:
        for place in (current, Path(os.path.realpath(current.parent))):
            if place.parts[1:2] in (("dev",), ("proc",)):
                return str(place if place == current else current)
        if not current.is_symlink() or hops == 40:
            return None
        current, hops = Path(os.path.abspath(current.parent / os.readlink(current))), hops + 1


def check_output(output: str | Path, input_path: Path) -> None:
    """Before any work: ``output`` must name a regular file that can be written (atomically: a new
    file in its folder renamed over it). Refused: a folder (or a name ending in ``/``), a device,
    pipe or socket (``/dev/null`` would be replaced by a file), anything in or linked through
    ``/dev`` or ``/proc`` (``/dev/stdout`` redirected to a file would replace that file), a missing or read-only folder, a
    read-only file, the input file itself, a dangling symbolic link (writing would replace the
    link; a link to a file is written through)."""
    output_path = Path(output)
    special = _system_place(output_path)
    if special is not None:  # /dev/stdout: a file behind it (a shell's >> redirect) would be replaced whole
        raise TagError(f"output {output}: is {special}, a stream or device, not a file; name a file (the output is "
                       "written whole, by replacing the file)")  # fmt: skip
    if output_path.is_symlink():  # written through (crf.io.atomic_write): check its target's place
        if not output_path.exists():
            raise TagError(f"output {output}: a symbolic link to {os.readlink(output_path)}, which does not exist; name a file")
        output_path = Path(os.path.realpath(output_path))
    if output_path.is_dir():
        raise TagError(f"output {output}: is a directory; name a file")
    if str(output).endswith(("/", os.sep)):
        raise TagError(f"output {output}: names a folder (it ends with '/'); name a file")
    if output_path.exists() and not output_path.is_file():
        raise TagError(f"output {output_path}: not a regular file (a device, pipe or socket); name a file")
    folder = output_path.parent if str(output_path.parent) else Path(".")
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise TagError(f"output {output_path}: the folder {folder} {what}")
    if output_path.exists() and input_path.exists() and output_path.resolve() == input_path.resolve():
        raise TagError(f"output {output_path}: is the input file; name another file")
    if output_path.exists() and not (output_path.stat().st_mode & 0o222):
        raise TagError(f"output {output_path}: the file is read-only")
    if not (folder.stat().st_mode & 0o222):
        raise TagError(f"output {output_path}: the folder {folder} is read-only")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{output_path.name}.", suffix=".probe"):
            pass
    except OSError as err:
        raise TagError(f"output {output_path}: cannot write in {folder} ({err.strerror or err})") from None


def _marker(value: object) -> str | None:
    """A ``comment_prefix``/``document_marker`` setting: None, or a non-empty string."""
    return None if value is None or value == "" else str(value)


def import_plugins(plugins) -> None:
    """Import the modules ``plugins`` names (a list of module names): those that register model
    kinds defined outside ``crf``. A bad entry is a TagError naming it."""
    if isinstance(plugins, str) or not isinstance(plugins, Sequence):
        raise TagError(f"plugins={plugins!r}: a list of module names, e.g. plugins=[my_kind]")
    for module in plugins:
        if not isinstance(module, str) or not module:
            raise TagError(f"plugins: {module!r} is not a module name")
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise TagError(f"plugins: cannot import {module!r} ({error})") from None


def run_tag(cfg: Mapping) -> dict:
    """The tag command without Hydra: ``cfg`` has ``models`` (a reference or a list), ``input``,
    ``output``, ``format``, ``conllu_pos``, ``output_format``, ``marginals``, ``column_aliases`` and
    optionally ``comment_prefix``, ``document_marker`` (CoNLL input), ``tokenize`` (text input:
    ``auto``, ``whitespace`` or ``punct``, see :func:`text_tokenisation`), ``plugins`` (modules that
    register model kinds defined outside ``crf``), ``tracking_uri`` and ``registry_uri``. Returns a
    summary (sentences, tokens, and with gold labels the scores in percent). Settings, output
    place, models and input are all checked before tagging."""
    references = cfg.get("models")
    if references is None or references == "???":
        raise TagError("set model=<bundle path | runs:/... | models:/...> (or model=[<first>,<second>] to chain)")
    if isinstance(references, (str, Path)):
        references = [references]
    references = [str(r) for r in references]
    if not references:
        raise TagError("model=[] names no model")
    if not cfg.get("input") or not cfg.get("output") or "???" in (cfg.get("input"), cfg.get("output")):
        raise TagError("set input=<file> and output=<file>")
    marginals = cfg.get("marginals", False)
    if not isinstance(marginals, bool):  # "no" would read as true
        raise TagError(f"marginals={marginals!r}: true or false")
    input_path, output_path = Path(cfg["input"]), Path(cfg["output"])
    fmt = detect_format(input_path, str(cfg.get("format", "auto")))
    out_format = detect_format(output_path, str(cfg.get("output_format", "auto")), OUTPUT_FORMATS)
    check_input_file(input_path, "input ")
    check_output(str(cfg["output"]), input_path)
    aliases = dict(cfg.get("column_aliases") or {})
    tracking_uri, registry_uri = cfg.get("tracking_uri"), cfg.get("registry_uri")
    import_plugins(cfg.get("plugins") or [])
    local = [resolve_model(r, tracking_uri, registry_uri) for r in references]
    check_not_a_model(
        cfg["output"],
        local,
        [tracking_uri, registry_uri],
        (cfg.get("paths") or {}).get("cache_dir"),
        (cfg.get("data") or {}).get("root"),
    )
    bundles = [load_bundle(path) for path in local]
    for reference, bundle in zip(references, bundles):
        log.info("model %s: %s over %s -> %r (%d labels, scheme %s)", reference, bundle.kind, bundle.input_columns,
                 output_column(bundle), len(bundle.labels), bundle.scheme)  # fmt: skip
    needed = file_columns(bundles, aliases)
    check_chain_columns(bundles, aliases, references)
    choice = str(cfg.get("tokenize", "auto"))
    if choice not in ("auto", *TOKENISATIONS):  # refused whatever the format, as every setting is
        raise TagError(f"tokenize={choice!r}; one of auto, {', '.join(TOKENISATIONS)}")
    if cfg.get("conllu_pos", "xpos") not in ("upos", "xpos"):
        raise TagError(f"conllu_pos={cfg.get('conllu_pos')!r}; upos or xpos")
    tokenisation = text_tokenisation(choice, bundles[0], references[0]) if fmt == "text" else "punct"
    if fmt == "text":
        log.info("plain text split into %s tokens, as model %s's training data", tokenisation, references[0])
    corpus = read_input(
        input_path,
        fmt,
        needed,
        str(cfg.get("conllu_pos", "xpos")),
        gold=output_column(bundles[-1]),
        comment_prefix=_marker(cfg.get("comment_prefix")),
        document_marker=_marker(cfg.get("document_marker")),
        layout=training_layout(bundles, needed),
        tokenisation=tokenisation,
    )
    try:  # the checks ModelBundle.tag and the MLflow Model make, counted from 1 as in the file
        check_tokens({c: corpus.columns[c] for c in needed}, corpus.offsets, base=1)
        for bundle in bundles:
            bundle.check_numeric_cells(corpus.columns, corpus.offsets, base=1)
    except (TokenError, NumericValueError) as err:
        raise TagError(f"input {input_path}: {err}") from None
    check_input_columns(corpus, bundles, needed, input_path)
    scoring = cfg.get("score", True)
    if not isinstance(scoring, bool):  # "no" would read as true
        raise TagError(f"score={scoring!r}: true or false")
    scored = scoring and check_gold_column(corpus, bundles[-1], input_path)
    log.info("read %d sentences, %d tokens (%s) from %s", corpus.lengths.size, int(corpus.lengths.sum()), fmt, input_path)
    if out_format == "conll":
        check_conll_cells(corpus, {output_column(b): b.labels for b in bundles})
    predictions = tag_corpus(bundles, corpus, aliases)
    write_output(output_path, out_format, corpus, predictions, marginals)
    log.info("wrote %s (%s)", output_path, out_format)
    summary = {"sentences": int(corpus.lengths.size), "tokens": int(corpus.lengths.sum())}
    if scored:
        scores = score(bundles[-1], corpus, predictions[-1])
        log.info("against the gold column (percent): %s", ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
        summary.update(scores)
    return summary


def main(cfg: DictConfig) -> None:
    from pipeline.tracking import registry_uri, tracking_uri

    problem = added_setting(cfg, "the tag command")
    if problem:
        log.error("%s", redacted(problem))
        sys.exit(2)
    try:
        settings = OmegaConf.to_container(cfg, resolve=True)
        models = settings.get("models")
        settings["models"] = list(models) if isinstance(models, (list, ListConfig)) else models
        settings["tracking_uri"] = tracking_uri(cfg)
        settings["registry_uri"] = registry_uri(cfg)
        run_tag(settings)
    except (ValueError, OSError) as err:  # TagError, DataFormatError, ModelFileError, OutputFormatError, ...
        log.error("%s", redacted(" ".join(str(err).split())) or type(err).__name__)  # a store URL may hold a password
        sys.exit(2)


def renamed(argv: list[str]) -> list[str]:
    """``model=...`` becomes ``models=...`` (see the module docstring)."""
    return [("models=" + a[len("model=") :]) if a.startswith("model=") else a for a in argv]

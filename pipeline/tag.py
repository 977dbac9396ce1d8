"""``python -m pipeline.tag model=<bundle> input=<file> output=<file>``: tag new text with a trained model.

The model is a :class:`crf.TaggerBundle` (``bundle.npz``, written by the train stage): a path to
the file or to a folder holding one, or an MLflow URI (``runs:/<run id>/train``,
``models:/<name>/<version>``, ...) whose artifacts hold it (downloaded with
:func:`mlflow.artifacts.download_artifacts`; the folder is searched for ``bundle.npz``).

Chaining: ``model=[<first>,<second>,...]`` runs the models in order; each model's predictions
fill the column its training data labelled (``source.dataset.label`` of its bundle, e.g. ``xpos``
for the EWT XPOS tagger) and, through ``column_aliases`` (default ``{xpos: pos}``: UD's XPOS are
Penn Treebank tags, the tags of CoNLL-2000's ``pos`` column), the columns that name maps to.
A later model reads those columns; the input file gives every other column a model needs.

Formats are in :mod:`pipeline.formats`. With gold labels in the input (a trailing CoNLL column,
or the predicted column of a CoNLL-U file) the last model's token accuracy (and chunk F1 for
chunk schemes) is logged. The Hydra key ``model`` is also the name of the pipeline's model config
group, which Hydra would read as a group choice: the command line's ``model=...`` is passed to
Hydra as ``models=...`` (either spelling works).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from crf import metrics
from crf.bundle import TaggerBundle, load_tagger
from pipeline.formats import OUTPUT_FORMATS, Corpus, Prediction, detect_format, read_input, write_output
from pipeline.models import BUNDLE_FILE

log = logging.getLogger(__name__)

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


def resolve_model(reference: str, tracking_uri: str | None = None) -> Path:
    """The local path of the bundle ``reference`` names (a file, a folder holding one, or an MLflow URI)."""
    reference = str(reference)
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _bundle_in(path, reference)
    if not _URI.match(reference) or reference.startswith("file:/"):
        raise TagError(
            f"model {reference!r}: no such file or folder, and not an MLflow URI "
            "(runs:/<run id>/<path>, models:/<name>/<version>)"
        )
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=reference, tracking_uri=tracking_uri))
    except (MlflowException, OSError) as err:
        raise TagError(f"model {reference!r}: cannot download its artifacts ({str(err).splitlines()[0]})") from None
    return local if local.is_file() else _bundle_in(local, reference)


def output_column(bundle: TaggerBundle) -> str:
    """The column a bundle predicts: its dataset's label column (``label`` when unknown)."""
    return str(bundle.source.get("dataset", {}).get("label") or "label")


def file_columns(bundles: Sequence[TaggerBundle], aliases: Mapping[str, str]) -> list[str]:
    """The columns the input must give: every model's input columns that no earlier model fills."""
    needed: list[str] = []
    filled: set[str] = set()
    for bundle in bundles:
        needed += [c for c in bundle.input_columns if c not in filled and c not in needed]
        column = output_column(bundle)
        filled |= {column, *([aliases[column]] if column in aliases else [])}
    return needed


def tag_corpus(bundles: Sequence[TaggerBundle], corpus: Corpus, aliases: Mapping[str, str]) -> list[Prediction]:
    """Run the chain on ``corpus``; each model's labels join ``corpus.columns`` for the next."""
    predictions = []
    for bundle in bundles:
        began = time.perf_counter()
        result = bundle.tag_arrays(corpus.columns, corpus.lengths)
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


def score(bundle: TaggerBundle, corpus: Corpus, prediction: Prediction) -> dict[str, float]:
    """Token accuracy (and chunk F1 for chunk schemes) of the last model against the gold column."""
    gold, predicted = corpus.sentences(corpus.gold), corpus.sentences(prediction.labels)
    scores = {"accuracy": 100.0 * metrics.token_accuracy(gold, predicted)}
    if bundle.scheme != "none":
        chunks = metrics.chunk_scores(gold, predicted)
        scores.update({"precision": chunks.precision, "recall": chunks.recall, "f1": chunks.f1})
    return scores


def run_tag(cfg: Mapping) -> dict:
    """The tag command without Hydra: ``cfg`` has ``models`` (a reference or a list), ``input``,
    ``output``, ``format``, ``conllu_pos``, ``output_format``, ``marginals``, ``column_aliases``
    and optionally ``tracking_uri``. Returns a summary (sentences, tokens, scores when gold)."""
    references = cfg.get("models")
    if references is None or references == "???":
        raise TagError("set model=<bundle path | runs:/... | models:/...> (or model=[<first>,<second>] to chain)")
    if isinstance(references, (str, Path)):
        references = [references]
    references = [str(r) for r in references]
    if not references:
        raise TagError("model=[] names no model")
    if not cfg.get("input") or not cfg.get("output"):
        raise TagError("set input=<file> and output=<file>")
    aliases = dict(cfg.get("column_aliases") or {})
    bundles = [load_tagger(resolve_model(r, cfg.get("tracking_uri"))) for r in references]
    for reference, bundle in zip(references, bundles):
        log.info("model %s: %s over %s -> %r (%d labels, scheme %s)", reference, bundle.kind, bundle.input_columns,
                 output_column(bundle), len(bundle.labels), bundle.scheme)  # fmt: skip
    input_path, output_path = Path(cfg["input"]), Path(cfg["output"])
    fmt = detect_format(input_path, str(cfg.get("format", "auto")))
    needed = file_columns(bundles, aliases)
    corpus = read_input(input_path, fmt, needed, str(cfg.get("conllu_pos", "xpos")), gold=output_column(bundles[-1]))
    log.info("read %d sentences, %d tokens (%s) from %s", corpus.lengths.size, int(corpus.lengths.sum()), fmt, input_path)
    predictions = tag_corpus(bundles, corpus, aliases)
    out_format = detect_format(output_path, str(cfg.get("output_format", "auto")), OUTPUT_FORMATS)
    write_output(output_path, out_format, corpus, predictions, bool(cfg.get("marginals", False)))
    log.info("wrote %s (%s)", output_path, out_format)
    summary = {"sentences": int(corpus.lengths.size), "tokens": int(corpus.lengths.sum())}
    if corpus.gold is not None:
        scores = score(bundles[-1], corpus, predictions[-1])
        log.info("against the gold column: %s", ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
        summary.update(scores)
    return summary


@hydra.main(version_base=None, config_path="../conf", config_name="tag")
def main(cfg: DictConfig) -> None:
    from crf.io import DataFormatError
    from crf.persist import ModelFileError
    from pipeline.tracking import tracking_uri

    settings = OmegaConf.to_container(cfg, resolve=True)
    models = settings.get("models")
    settings["models"] = list(models) if isinstance(models, (list, ListConfig)) else models
    settings["tracking_uri"] = tracking_uri(cfg)
    try:
        run_tag(settings)
    except (TagError, DataFormatError, ModelFileError, FileNotFoundError, ValueError) as err:
        log.error("%s", err)
        sys.exit(2)


def _renamed(argv: list[str]) -> list[str]:
    """``model=...`` becomes ``models=...`` (see the module docstring)."""
    return [("models=" + a[len("model=") :]) if a.startswith("model=") else a for a in argv]


if __name__ == "__main__":
    sys.argv = _renamed(sys.argv)
    main()

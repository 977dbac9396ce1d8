"""Stage 4, evaluate: scores on dev and test, tables, plots and predictions with confidence.

Config slice: ``evaluate``. Input: the prepare folder (the splits) and the train folder, whose
tagger bundle (``bundle.npz``) is what is scored: the file the tag command, the MLflow Model and
the server load, tagging the splits' raw token columns (feature extraction included in the
speed figures). Output folder: ``metrics.json``
(scores, tagging speed, accuracy on words seen and not seen in training);
``{split}_per_label.csv`` (token-level P/R/F1 per label) and, for chunk/entity tasks,
``{split}_per_type.csv`` (conlleval per type); ``confusion_test.csv`` and ``confusion_test.png``;
``predictions_{split}.tsv.gz`` (sentence, token, word, gold, predicted, marginal probability of
the predicted label, whether the word was seen in training); ``segments_{split}.csv.gz`` (chunk
tasks: each predicted chunk with its constrained forward-backward confidence and whether it is
correct); ``calibration_test.png`` (confidence against observed correctness: of chunks on chunk
tasks, else of tokens).

Chunk-scheme datasets also get (see :mod:`pipeline.stages.fields`): ``{split}_f1_<type>`` per chunk type,
``{split}_token_error`` and ``{split}_sequence_error`` (percent, on field types: AnyStyle's
``check``), ``{split}_seen_sequences`` (sequences found verbatim in train, or train and dev for
test) and the ``{split}_unseen_*`` figures on the others. Dataset settings (the dataset config's
``evaluate`` block; ``evaluate.<key>`` on the command line wins):

- ``confidence_field`` (e.g. ``author``): ``{split}_<field>_confidence_ap``, the average precision
  of the predicted segments of that type ranked by constrained forward-backward confidence, and
  ``{split}_<field>_calibration_error``; ``calibration_<field>_test.png``/``.csv``;
- ``correction_propagation`` (default false; the anystyle dataset turns it on): for every wrong
  sequence the first wrong token is fixed to its gold label and all those sequences are re-decoded
  at once by the bundle under that constraint; ``{split}_correction_*`` metrics (errors removed
  per fix, counts; a fix of probability 0 under the model, an HMM word never seen with its gold
  label, is counted apart and changes nothing) and ``corrections_{split}.csv``. The re-decode is
  one constrained Viterbi (the bundle's decode-only call).

The stage knows no model kind: the bundle holds it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from crf import metrics, single_threaded_blas
from crf.bundle import ModelBundle, Tagged, load_bundle, normalize_scheme
from pipeline.engine.stage import BaseStage, StageContext
from pipeline.models import BUNDLE_FILE, ModelAdapter
from pipeline.report import figure, save_figure, write_json
from pipeline.stages import fields
from pipeline.stages.data import Dataset
from pipeline.stages.prepare import read_prepared

log = logging.getLogger(__name__)

SCORED_SPLITS = ("dev", "test")
# the names of :func:`score_split`'s figures after ``<split>_`` (glob patterns: a type's or a field's name in place of *)
TOKEN_METRICS = ("tag_tokens_per_second", "accuracy", "calibration_error", "unknown_rate", "known_accuracy", "unknown_accuracy")
CHUNK_METRICS = (
    "precision", "recall", "f1", "f1_*", "token_error", "sequence_error", "seen_sequences", "unseen_f1", "unseen_f1_*",
    "unseen_token_error", "unseen_sequence_error", "*_confidence_ap", "*_calibration_error",
)  # fmt: skip
CORRECTION_METRICS = ("correction_*",)
# the .gz tables: zlib's default level (faster than gzip's 9 for nearly the same size) and no time
# stamp (the same run writes the same bytes)
GZIP = {"method": "gzip", "compresslevel": 6, "mtime": 0}
# the dataset's evaluation settings (its config's `evaluate` block) and their defaults
FIELD_SETTINGS = {"confidence_field": None, "correction_propagation": False}


def calibration_table(confidence: np.ndarray, correct: np.ndarray, bins: int) -> pd.DataFrame:
    """Per confidence bin: mean confidence, observed accuracy, count."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1]), 0, bins - 1)
    frame = pd.DataFrame({"bin": which, "confidence": confidence, "correct": correct.astype(float)})
    table = frame.groupby("bin").agg(confidence=("confidence", "mean"), accuracy=("correct", "mean"), count=("correct", "size"))
    table["low"], table["high"] = edges[table.index], edges[table.index + 1]
    return table.reset_index(drop=True)


def expected_calibration_error(table: pd.DataFrame) -> float:
    weights = table["count"] / table["count"].sum()
    return float((weights * (table["confidence"] - table["accuracy"]).abs()).sum())


def plot_calibration(table: pd.DataFrame, path: Path, what: str) -> None:
    fig, (ax,) = figure(5, 5)
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect calibration")
    ax.plot(table["confidence"], table["accuracy"], "o-", label=what)
    for _, row in table.iterrows():
        ax.annotate(
            f"{int(row['count'])}", (row["confidence"], row["accuracy"]), fontsize=7, xytext=(3, -9), textcoords="offset points"
        )
    ax.set_xlabel("model confidence")
    ax.set_ylabel("observed fraction correct")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left")
    ax.set_title(f"calibration: {what}")
    save_figure(fig, path)


def plot_confusion(confusion: pd.DataFrame, path: Path) -> None:
    counts = confusion.to_numpy().astype(float)
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = max(5.0, 0.28 * len(confusion))
    fig, (ax,) = figure(size + 1, size)
    image = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(confusion.columns)), confusion.columns, rotation=90, fontsize=7)
    ax.set_yticks(range(len(confusion.index)), confusion.index, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    fig.colorbar(image, ax=ax, fraction=0.046, label="row-normalised rate")
    save_figure(fig, path)


def known_words(data: Dataset) -> pd.Index | None:
    """Word forms of the training split: what 'known word' means for every model alike (None
    without a word column)."""
    if data.word_column is None:
        return None
    return pd.Index(pd.unique(pd.Series([w for s in data.column("train", data.word_column) for w in s], dtype=object)))


def field_scores(
    split: str,
    data: Dataset,
    gold: list[list[str]],
    predicted: list[list[str]],
    scores: metrics.ChunkScores,
    segments: pd.DataFrame | None,
    field: str | None,
    bins: int,
    out: Path,
) -> dict:
    """The chunk-scheme figures of :mod:`pipeline.stages.fields` for one split (see the module docstring);
    ``scores``: the split's :func:`crf.metrics.chunk_scores`; ``segments``: predicted chunks with
    ``confidence`` and ``correct`` columns, or None."""
    results: dict = {}
    results.update(fields.per_type_metrics(split, scores.per_type))
    flat_gold = np.array([label for seq in gold for label in seq], dtype=object)
    flat_pred = np.array([label for seq in predicted for label in seq], dtype=object)
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in gold])]).astype(np.int64)
    wrong = fields.wrong_tokens(flat_gold, flat_pred)
    token_error, sequence_error, wrong_sequences = fields.field_errors(wrong, offsets)
    results[f"{split}_token_error"], results[f"{split}_sequence_error"] = token_error, sequence_error
    known = data.splits["train"] + (data.splits["dev"] if split == "test" else [])
    seen = fields.seen_sequences(data.splits[split], known)
    results[f"{split}_seen_sequences"] = float(seen.sum())
    if seen.any() and not seen.all():
        unseen = np.flatnonzero(~seen)
        unseen_scores = metrics.chunk_scores([gold[i] for i in unseen], [predicted[i] for i in unseen])
        results[f"{split}_unseen_f1"] = unseen_scores.f1
        results[f"{split}_unseen_token_error"] = 100.0 * float(wrong[np.repeat(~seen, np.diff(offsets))].mean())
        results[f"{split}_unseen_sequence_error"] = 100.0 * float(wrong_sequences[unseen].mean())
        if field is not None and field in unseen_scores.per_type.index:
            results[fields.metric_name(f"{split}_unseen_f1_{field}")] = float(unseen_scores.per_type.loc[field, "f1"])
    if field is not None and segments is not None:
        chosen = segments[segments["type"] == field]
        results[fields.metric_name(f"{split}_{field}_confidence_ap")] = fields.confidence_average_precision(segments, field)
        if len(chosen):
            table = calibration_table(chosen["confidence"].to_numpy(), chosen["correct"].to_numpy(), bins)
            results[fields.metric_name(f"{split}_{field}_calibration_error")] = expected_calibration_error(table)
            if split == "test":
                table.to_csv(out / f"calibration_{field}_test.csv", index=False)
                plot_calibration(table, out / f"calibration_{field}_test.png", f"predicted {field} segments")
    return results


def tag_split(bundle: ModelBundle, data: Dataset, split: str) -> tuple[dict[str, np.ndarray], Tagged, float]:
    """The bundle's input columns over the split's tokens (each (T,)), its :class:`crf.bundle.Tagged`
    result and the seconds tagging took (features, Viterbi, marginals and segments)."""
    columns = {c: np.array([w for seq in data.column(split, c) for w in seq], dtype=object) for c in bundle.input_columns}
    lengths = np.array([len(s) for s in data.splits[split]], dtype=np.int64)
    began = time.perf_counter()
    tagged = bundle.tag_arrays(columns, lengths)
    tagged.warn_impossible(f"the {split} labels decoded for them are an arbitrary path, scored as they are")
    return columns, tagged, time.perf_counter() - began


def score_split(
    split: str,
    bundle: ModelBundle,
    tagging: tuple,
    data: Dataset,
    bins: int,
    out: Path,
    settings: dict,
    vocabulary: pd.Index | None,
) -> dict:
    """Every figure and file of one split, from :func:`tag_split`'s result."""
    field = settings["confidence_field"]
    chunked = data.scheme != "none"
    columns, tagged, seconds = tagging
    gold = data.labels(split)
    n_tokens = tagged.codes.size
    results: dict = {f"{split}_tag_tokens_per_second": n_tokens / seconds}
    classes = np.array(bundle.labels, dtype=object)
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in gold])])
    flat_predicted = classes[tagged.codes]
    predicted = [list(flat_predicted[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
    words = data.column(split, data.word_column) if data.word_column else [[""] * len(g) for g in gold]
    flat_words = [w for seq in words for w in seq]
    flat_gold = [label for seq in gold for label in seq]
    predictions = pd.DataFrame(
        {
            "sentence": np.repeat(np.arange(len(gold)), [len(g) for g in gold]),
            "token": np.concatenate([np.arange(len(g)) for g in gold]),
            "word": flat_words,
            "gold": flat_gold,
            "predicted": flat_predicted,
            "marginal": tagged.marginals,
        }
    )
    correct = predictions["gold"].to_numpy() == predictions["predicted"].to_numpy()
    if vocabulary is not None:
        predictions["known"] = vocabulary.get_indexer(pd.Series(flat_words, dtype=object)) >= 0
        known = predictions["known"].to_numpy()
        results[f"{split}_unknown_rate"] = 100.0 * float((~known).mean())
        if known.any():  # a figure with no tokens to count is left out, not reported as a number
            results[f"{split}_known_accuracy"] = 100.0 * float(correct[known].mean())
        if (~known).any():
            results[f"{split}_unknown_accuracy"] = 100.0 * float(correct[~known].mean())
    predictions.to_csv(out / f"predictions_{split}.tsv.gz", sep="\t", index=False, compression=GZIP)

    results[f"{split}_accuracy"] = metrics.token_accuracy(gold, predicted)
    metrics.label_scores(gold, predicted).to_csv(out / f"{split}_per_label.csv")
    segments = tagged.segments
    if chunked and settings["correction_propagation"]:
        table = fields.correction_propagation(
            bundle, columns, offsets.astype(np.int64), np.array(flat_gold, dtype=object), flat_predicted
        )
        table.to_csv(out / f"corrections_{split}.csv", index=False)
        results.update(fields.correction_summary(split, table))
    if chunked:
        scores = metrics.chunk_scores(gold, predicted)
        results.update({f"{split}_precision": scores.precision, f"{split}_recall": scores.recall, f"{split}_f1": scores.f1})
        scores.per_type.to_csv(out / f"{split}_per_type.csv")
        if scores.per_type.empty:
            log.warning("%s: no chunks in the gold labels or the predictions: chunk F1 is 0 by conlleval's rule", split)
    if segments is not None:
        truth = metrics.chunks(gold)
        merged = segments.merge(truth, on=["sequence", "start", "end", "type"], how="left", indicator=True)
        segments["correct"] = (merged["_merge"] == "both").to_numpy()
        segments.to_csv(out / f"segments_{split}.csv.gz", index=False, compression=GZIP)
        calibrated, hit, what = segments["confidence"].to_numpy(), segments["correct"].to_numpy(), "predicted chunks"
    else:
        calibrated, hit, what = tagged.marginals, correct, "predicted tokens"
    if chunked:
        results.update(field_scores(split, data, gold, predicted, scores, segments, field, bins, out))
    table = calibration_table(calibrated, hit, bins)
    results[f"{split}_calibration_error"] = expected_calibration_error(table)
    if split == "test":
        table.to_csv(out / "calibration_test.csv", index=False)
        plot_calibration(table, out / "calibration_test.png", what)
        confusion = metrics.confusion_matrix(gold, predicted, list(classes))
        confusion.to_csv(out / "confusion_test.csv")
        plot_confusion(confusion, out / "confusion_test.png")
    return results


def evaluate(bundle: ModelBundle, data: Dataset, bins: int, out: Path, settings: dict | None = None) -> dict:
    """Score ``bundle`` on dev and test; write the tables, plots and predictions into ``out``.
    ``settings``: the dataset's evaluation settings (:data:`FIELD_SETTINGS`)."""
    settings = {**FIELD_SETTINGS, **(settings or {})}
    vocabulary = known_words(data)
    # tagging is timed one split at a time (the speed figures); the rest of the two splits' work
    # (tables, compressed predictions, plots) then runs on two threads
    splits = [split for split in SCORED_SPLITS if data.splits[split]]  # data.final_fit=train+dev: test only
    tagged = {split: tag_split(bundle, data, split) for split in splits}
    if vocabulary is not None:  # pandas builds an index's hash table on first use, without a lock
        vocabulary.get_indexer(pd.Series([""], dtype=object))
    # the BLAS thread limit is process-wide: set here for both threads (the bundle's calls nest in it)
    with single_threaded_blas(), ThreadPoolExecutor(len(splits)) as pool:
        parts = pool.map(lambda split: score_split(split, bundle, tagged[split], data, bins, out, settings, vocabulary), splits)
        results = {k: v for part in parts for k, v in part.items()}
    write_json(out / "metrics.json", results)
    summary = ", ".join(f"{k} {v:.2f}" for k, v in results.items() if k.endswith(("_f1", "_accuracy")))
    log.info("%s", summary)
    return results


class Evaluate(BaseStage):
    name = "evaluate"

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("prepare", "train")

    def code_modules(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return (type(self).__module__, type(adapter).__module__)  # the adapter's module brings its model kind's code

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("metrics.json", "*.csv", "*.png", "*.gz")

    def validate(self, cfg) -> None:
        """The calibration bins and the dataset's evaluation settings."""
        from pipeline.engine.validate import SettingsError

        bins = cfg.evaluate.calibration_bins
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise SettingsError(f"bad setting evaluate.calibration_bins={bins!r}: an integer >= 1")
        try:
            fields = self.config_slice(cfg, None)["evaluate"]["fields"]
        except ValueError as error:
            raise SettingsError(f"bad setting dataset.evaluate: {error}") from None
        if fields["confidence_field"] is not None and not isinstance(fields["confidence_field"], str):
            raise SettingsError(
                f"bad setting evaluate.confidence_field={fields['confidence_field']!r}: a field (chunk type) name"
            )
        if not isinstance(fields["correction_propagation"], bool):
            raise SettingsError(
                f"bad setting evaluate.correction_propagation={fields['correction_propagation']!r}: true or false"
            )

    def metric_names(self, cfg, adapter: ModelAdapter) -> tuple[str, ...]:
        """:data:`TOKEN_METRICS` of each scored split; with chunks (a dataset scheme other than
        none) :data:`CHUNK_METRICS`, and :data:`CORRECTION_METRICS` when correction propagation is on."""
        names = TOKEN_METRICS
        if normalize_scheme(OmegaConf.select(cfg, "dataset.scheme", default=None)) != "none":
            names += CHUNK_METRICS
            if self.config_slice(cfg, adapter)["evaluate"]["fields"]["correction_propagation"]:
                names += CORRECTION_METRICS
        return tuple(f"{split}_{name}" for split in SCORED_SPLITS for name in names)

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        evaluate_cfg = OmegaConf.to_container(cfg.evaluate, resolve=True)
        dataset_cfg = OmegaConf.to_container(cfg.dataset, resolve=True).get("evaluate") or {}
        unknown = sorted(set(dataset_cfg) - set(FIELD_SETTINGS))
        if unknown:
            raise ValueError(
                f"dataset {cfg.dataset.name!r}: unknown evaluate settings {unknown}; known: {sorted(FIELD_SETTINGS)}"
            )
        chosen = {**FIELD_SETTINGS, **dataset_cfg, **{k: evaluate_cfg[k] for k in FIELD_SETTINGS if k in evaluate_cfg}}
        return {"evaluate": {**{k: v for k, v in evaluate_cfg.items() if k not in FIELD_SETTINGS}, "fields": chosen}}

    def run(self, context: StageContext) -> dict:
        data = read_prepared(context.inputs["prepare"])
        bundle = load_bundle(context.inputs["train"] / BUNDLE_FILE)
        settings = OmegaConf.to_container(context.config.evaluate.fields)
        return evaluate(bundle, data, int(context.config.evaluate.calibration_bins), context.out, settings)


STAGE = Evaluate()

"""Stage 4, evaluate: scores on dev and test, tables, plots and predictions with confidence.

Config slice: ``evaluate`` and the adapter's training slice (the tagger reads it). Input: the
prepare and train folders and the adapter's other upstream stages (featurize for the CRF); the
tagger comes from the model adapter. Output folder: ``metrics.json``
(scores, tagging speed, accuracy on words seen and not seen in training);
``{split}_per_label.csv`` (token-level P/R/F1 per label) and, for chunk/entity tasks,
``{split}_per_type.csv`` (conlleval per type); ``confusion_test.csv`` and ``confusion_test.png``;
``predictions_{split}.tsv.gz`` (sentence, token, word, gold, predicted, marginal probability of
the predicted label, whether the word was seen in training); ``segments_{split}.csv.gz`` (CRF:
each predicted chunk with its constrained forward-backward confidence and whether it is
correct); ``calibration_test.png`` (confidence against observed correctness: of chunks for the
CRF on chunk tasks, else of tokens).

Chunk-scheme datasets also get (see :mod:`pipeline.fields`): ``{split}_f1_<type>`` per chunk type,
``{split}_token_error`` and ``{split}_sequence_error`` (percent, on field types: AnyStyle's
``check``), ``{split}_seen_sequences`` (sequences found verbatim in train, or train and dev for
test) and the ``{split}_unseen_*`` figures on the others. Dataset settings (the dataset config's
``evaluate`` block; ``evaluate.<key>`` on the command line wins):

- ``confidence_field`` (e.g. ``author``): ``{split}_<field>_confidence_ap``, the average precision
  of the predicted segments of that type ranked by constrained forward-backward confidence, and
  ``{split}_<field>_calibration_error``; ``calibration_<field>_test.png``/``.csv``. A model whose
  tagger gives no segments (the HMM) is segmented by its bundle (``train/bundle.npz``);
- ``correction_propagation`` (default false; the anystyle dataset turns it on): for every wrong
  sequence the first wrong token is fixed to its gold label and all those sequences are re-decoded
  at once by the bundle under that constraint; ``{split}_correction_*`` metrics (errors removed
  per fix, counts; a fix of probability 0 under the model, an HMM word never seen with its gold
  label, is counted apart and changes nothing) and ``corrections_{split}.csv``. The re-decode is
  one constrained Viterbi (the bundle's decode-only call).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from crf import load_tagger, metrics
from crf._parallel import single_threaded_blas
from crf.batch import token_rows
from pipeline import fields
from pipeline.data import Dataset
from pipeline.models import BUNDLE_FILE, ModelAdapter, Tagger
from pipeline.prepare import read_prepared
from pipeline.report import figure, save_figure
from pipeline.stage import Stage, StageContext
from pipeline.strict_json import write_json

log = logging.getLogger(__name__)

SPLITS = ("dev", "test")
# the .gz tables: zlib's default level (level 9, gzip's default, took 0.33 s against 0.20 s for the
# CoNLL-2000 test predictions, 0.3% smaller) and no time stamp (the same run writes the same bytes)
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


def known_words(data) -> pd.Index:
    """Word forms of the training split: what 'known word' means for every model alike."""
    return pd.Index(pd.unique(pd.Series([w for s in data.column("train", "w") for w in s], dtype=object)))


def bundle_tagging(bundle_path: Path, data: Dataset, split: str):
    """(bundle, its input columns over the split's tokens (each (T,)), the :class:`crf.bundle.Tagged`
    result of tagging the split with it)."""
    bundle = load_tagger(bundle_path)
    columns = {c: np.array([w for seq in data.column(split, c) for w in seq], dtype=object) for c in bundle.input_columns}
    lengths = np.array([len(s) for s in data.splits[split]], dtype=np.int64)
    return bundle, columns, bundle.tag_arrays(columns, lengths)


def check_same_decoding(split: str, bundle, columns: dict, tagged, labels: np.ndarray) -> None:
    """The bundle (which gives segments and correction propagation) and the tagger (which gives
    the metrics) must decode the same best paths. Where their labels differ, the tagger's path is
    scored under the bundle's model: an equal score is a tie between optimal paths broken
    differently (logged); a lower one means a decoder is wrong, and no figure is written."""
    bundle_labels = np.array(bundle.labels, dtype=object)[tagged.codes]
    differ = bundle_labels != labels
    if not differ.any():
        return
    offsets = tagged.offsets
    sentences = np.unique(np.searchsorted(offsets, np.flatnonzero(differ), side="right") - 1)
    lengths = np.diff(offsets)[sentences]
    tokens = token_rows(offsets, sentences)
    index = {label: code for code, label in enumerate(bundle.labels)}
    forced = np.zeros((tokens.size, len(bundle.labels)), dtype=bool)
    forced[np.arange(tokens.size), [index[label] for label in labels[tokens]]] = True
    theirs = bundle.tag_arrays({c: v[tokens] for c, v in columns.items()}, lengths, allowed=forced, marginals=False).scores
    ours = tagged.scores[sentences]
    impossible = np.isneginf(ours) & np.isneginf(theirs)  # no path of nonzero probability: labels mean nothing
    ties = np.isclose(theirs, ours, rtol=1e-9, atol=1e-9)
    if not ties.all():
        first = int(sentences[np.argmin(ties)])
        raise RuntimeError(
            f"{split}: the bundle's and the tagger's best paths differ in score on {int((~ties).sum())} sentence(s) "
            f"(first: sentence {first}, {ours[np.argmin(ties)]!r} against {theirs[np.argmin(ties)]!r}): a decoder is wrong"
        )
    log.info(
        "%s: the bundle's and the tagger's labels differ on %d of %d tokens, in %d sentence(s) where both paths have the "
        "same score (ties between optimal paths, broken differently) and %d the model gives probability 0",
        split, int(differ.sum()), differ.size, int((~impossible).sum()), int(impossible.sum()),
    )  # fmt: skip


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
    """The chunk-scheme figures of :mod:`pipeline.fields` for one split (see the module docstring);
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


def bundle_needed(data: Dataset, settings: dict) -> bool:
    """Whether evaluation reads the trained bundle: chunk confidence of a field, or correction
    propagation, on a chunk-scheme dataset."""
    wanted = settings["confidence_field"] is not None or bool(settings["correction_propagation"])
    return data.scheme != "none" and wanted


def score_split(
    split: str,
    tag_result: tuple,
    segments: pd.DataFrame | None,
    classes: list[str],
    data: Dataset,
    bins: int,
    out: Path,
    settings: dict,
    vocabulary: pd.Index | None,
    bundle_path: Path | None,
) -> dict:
    """Every figure and file of one split, from the tagger's ``tag(split)`` result and segments."""
    field = settings["confidence_field"]
    chunked, needs_bundle = data.scheme != "none", bundle_needed(data, settings)
    gold = data.labels(split)
    flat_pred, confidence, seconds, seconds_with_features = tag_result
    n_tokens = flat_pred.size
    results: dict = {
        f"{split}_tag_tokens_per_second": n_tokens / seconds,
        f"{split}_tag_with_features_tokens_per_second": n_tokens / seconds_with_features,
    }
    classes = np.array(classes, dtype=object)
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in gold])])
    predicted = [list(classes[flat_pred[a:b]]) for a, b in zip(offsets[:-1], offsets[1:])]
    words = data.column(split, "w") if "w" in data.columns else [[""] * len(g) for g in gold]
    flat_words = [w for seq in words for w in seq]
    sentence = np.repeat(np.arange(len(gold)), [len(g) for g in gold])
    position = np.concatenate([np.arange(len(g)) for g in gold])
    flat_gold = [label for seq in gold for label in seq]
    predictions = pd.DataFrame(
        {
            "sentence": sentence,
            "token": position,
            "word": flat_words,
            "gold": flat_gold,
            "predicted": classes[flat_pred],
            "marginal": confidence,
        }
    )
    correct = predictions["gold"].to_numpy() == predictions["predicted"].to_numpy()
    if vocabulary is not None:
        predictions["known"] = vocabulary.get_indexer(pd.Series(flat_words, dtype=object)) >= 0
        known = predictions["known"].to_numpy()
        results[f"{split}_known_accuracy"] = 100.0 * float(correct[known].mean()) if known.any() else float("nan")
        results[f"{split}_unknown_accuracy"] = 100.0 * float(correct[~known].mean()) if (~known).any() else float("nan")
        results[f"{split}_unknown_rate"] = 100.0 * float((~known).mean())
    predictions.to_csv(out / f"predictions_{split}.tsv.gz", sep="\t", index=False, compression=GZIP)

    results[f"{split}_accuracy"] = metrics.token_accuracy(gold, predicted)
    metrics.label_scores(gold, predicted).to_csv(out / f"{split}_per_label.csv")
    if needs_bundle:  # with the bundle at hand its segments are the tagger's (the same constrained forward-backward)
        bundle, columns, tagged = bundle_tagging(Path(bundle_path), data, split)
        bundle_pred = np.array(bundle.labels, dtype=object)[tagged.codes]
        check_same_decoding(split, bundle, columns, tagged, classes[flat_pred])
        segments = tagged.segments
        if settings["correction_propagation"]:
            gold_array = np.array(flat_gold, dtype=object)
            table = fields.correction_propagation(bundle, columns, offsets.astype(np.int64), gold_array, bundle_pred)
            table.to_csv(out / f"corrections_{split}.csv", index=False)
            results.update(fields.correction_summary(split, table))
    if chunked:
        scores = metrics.chunk_scores(gold, predicted)
        results.update({f"{split}_precision": scores.precision, f"{split}_recall": scores.recall, f"{split}_f1": scores.f1})
        scores.per_type.to_csv(out / f"{split}_per_type.csv")
    if segments is not None:
        truth = metrics.chunks(gold)
        merged = segments.merge(truth, on=["sequence", "start", "end", "type"], how="left", indicator=True)
        segments["correct"] = (merged["_merge"] == "both").to_numpy()
        segments.to_csv(out / f"segments_{split}.csv.gz", index=False, compression=GZIP)
        calibrated, hit, what = segments["confidence"].to_numpy(), segments["correct"].to_numpy(), "predicted chunks"
    else:
        calibrated, hit, what = confidence, correct, "predicted tokens"
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


def evaluate(
    tagger: Tagger,
    data: Dataset,
    bins: int,
    out: Path,
    settings: dict | None = None,
    bundle_path: Path | None = None,
) -> dict:
    """Score ``tagger`` on dev and test; write the tables, plots and predictions into ``out``.

    ``settings``: the dataset's evaluation settings (:data:`FIELD_SETTINGS`); ``bundle_path``: the
    trained model's bundle, used for correction propagation and for segments the tagger does not give.
    """
    settings = {**FIELD_SETTINGS, **(settings or {})}
    vocabulary = known_words(data) if "w" in data.columns else None
    chunked, needs_bundle = data.scheme != "none", bundle_needed(data, settings)
    if needs_bundle and (bundle_path is None or not Path(bundle_path).is_file()):
        raise FileNotFoundError(
            f"evaluate: confidence_field/correction_propagation need the model's bundle, not found: {bundle_path}"
        )
    # tagging is timed one split at a time (the speed figures); the rest of the two splits' work
    # (tables, compressed predictions, segments, plots) then runs on two threads
    tagged = {}
    for split in SPLITS:
        tagged[split] = tagger.tag(split), tagger.segments(split) if chunked and not needs_bundle else None
    if vocabulary is not None:  # pandas builds an index's hash table on first use, without a lock
        vocabulary.get_indexer(pd.Series([""], dtype=object))
    # the BLAS thread limit is process-wide: set here for both threads (the bundle's calls nest in it)
    with single_threaded_blas(), ThreadPoolExecutor(len(SPLITS)) as pool:
        parts = pool.map(
            lambda split: score_split(split, *tagged[split], tagger.classes, data, bins, out, settings, vocabulary, bundle_path),
            SPLITS,
        )
        results = {k: v for part in parts for k, v in part.items()}
    write_json(out / "metrics.json", results)  # strict JSON: a score with no tokens to count is null
    summary = ", ".join(f"{k} {v:.2f}" for k, v in results.items() if k.endswith(("_f1", "_accuracy")))
    log.info("%s", summary)
    return results


class Evaluate(Stage):
    name = "evaluate"
    uses_adapter = True
    logged = ("metrics.json", "*.csv", "*.png", "*.gz")

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return (*adapter.upstream, "train")

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        evaluate_cfg = OmegaConf.to_container(cfg.evaluate, resolve=True)
        dataset_cfg = OmegaConf.to_container(cfg.dataset, resolve=True).get("evaluate") or {}
        unknown = sorted(set(dataset_cfg) - set(FIELD_SETTINGS))
        if unknown:
            raise ValueError(
                f"dataset {cfg.dataset.name!r}: unknown evaluate settings {unknown}; known: {sorted(FIELD_SETTINGS)}"
            )
        chosen = {**FIELD_SETTINGS, **dataset_cfg, **{k: evaluate_cfg[k] for k in FIELD_SETTINGS if k in evaluate_cfg}}
        return {
            "evaluate": {**{k: v for k, v in evaluate_cfg.items() if k not in FIELD_SETTINGS}, "fields": chosen},
            "training": adapter.config_slice(cfg),
        }

    def run(self, context: StageContext) -> dict:
        data = read_prepared(context.inputs["prepare"])
        tagger = context.adapter.tagger(context.config.training, context.inputs, data)
        settings = OmegaConf.to_container(context.config.evaluate.fields)
        bins = int(context.config.evaluate.calibration_bins)
        return evaluate(tagger, data, bins, context.out, settings, context.inputs["train"] / BUNDLE_FILE)


STAGE = Evaluate()

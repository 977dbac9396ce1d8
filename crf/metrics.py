"""Token accuracy, conlleval chunk precision/recall/F1, per-type tables, confusion matrices,
significance tests between two taggers (McNemar, paired bootstrap), and sklearn-crfsuite's flat
metrics (``flat_f1_score`` and co., computed by sklearn.metrics on the labels of all tokens).

Chunks follow conlleval's rules (a chunk starts and ends where conlleval's ``startOfChunk`` and
``endOfChunk`` say, from the tag before the first ``-`` and the type after it), extended for the
IOBES tags ``E`` and ``S`` as seqeval's default mode does. On IOB1 and IOB2 input this is exactly
conlleval; a chunk is correct when its start, end and type all match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd


def split_label(label: str) -> tuple[str, str]:
    """(tag, type) of a label, as conlleval/seqeval read it: ``B-NP`` -> ``("B", "NP")``.

    Parameters
    ----------
    label : str
        One label.

    Returns
    -------
    tag : str
        Its first character (``""`` for an empty label).
    type : str
        What follows the first ``-`` after the tag (the rest after the first character when there
        is none), or ``"_"`` when that is empty: ``O`` -> ``("O", "_")``.
    """
    return label[:1], label[1:].split("-", 1)[-1] or "_"


def _tag_arrays(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tag and type codes per token (strings), computed once per distinct label."""
    codes, uniques = pd.factorize(labels)
    parts = [split_label(str(u)) for u in uniques]
    tags = np.array([p[0] for p in parts], dtype=object)
    types = np.array([p[1] for p in parts], dtype=object)
    return tags[codes], types[codes]


def chunk_end(prev_tag, tag, prev_type, type_) -> np.ndarray:
    """Whether a chunk ends between two tokens (conlleval's ``endOfChunk``, with IOBES' ``E`` and ``S``).

    Parameters
    ----------
    prev_tag, tag : array_like of str
        The tags (as :func:`split_label` gives them) of the previous and the current token.
    prev_type, type_ : array_like of str
        Their types.

    Returns
    -------
    ndarray of bool
        Elementwise, with the broadcast shape of the arguments.
    """
    prev_tag, tag = np.asarray(prev_tag), np.asarray(tag)
    ends = (prev_tag == "E") | (prev_tag == "S")
    ends |= np.isin(prev_tag, ["B", "I"]) & np.isin(tag, ["B", "S", "O"])
    ends |= (prev_tag != "O") & (prev_tag != ".") & (np.asarray(prev_type) != np.asarray(type_))
    return ends


def chunk_start(prev_tag, tag, prev_type, type_) -> np.ndarray:
    """Whether a chunk starts at the current token (conlleval's ``startOfChunk``, with IOBES' ``E`` and ``S``).

    Parameters
    ----------
    prev_tag, tag : array_like of str
        The tags (as :func:`split_label` gives them) of the previous and the current token.
    prev_type, type_ : array_like of str
        Their types.

    Returns
    -------
    ndarray of bool
        Elementwise, with the broadcast shape of the arguments.
    """
    prev_tag, tag = np.asarray(prev_tag), np.asarray(tag)
    starts = (tag == "B") | (tag == "S")
    starts |= np.isin(prev_tag, ["E", "S", "O"]) & np.isin(tag, ["E", "I"])
    starts |= (tag != "O") & (tag != ".") & (np.asarray(prev_type) != np.asarray(type_))
    return starts


def _flatten(sequences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    flat = np.array([label for s in sequences for label in s], dtype=object)
    return flat, np.concatenate([[0], np.cumsum(lengths)])


def chunks(sequences: Sequence[Sequence[str]]) -> pd.DataFrame:
    """All chunks of all sequences.

    Parameters
    ----------
    sequences : sequence of sequences of str
        Label sequences (IOB1, IOB2 or IOBES labels such as ``B-NP``).

    Returns
    -------
    pandas.DataFrame
        One row per chunk, in order: ``sequence`` (its index in ``sequences``), ``start`` and
        ``end`` (token positions within the sequence, ``end`` exclusive) and ``type``.
    """
    flat, offsets = _flatten(sequences)
    return _chunks_flat(flat, offsets)


def scheme_violations(sequences: Sequence[Sequence[str]], scheme: str) -> tuple[int, int]:
    """How many chunks of ``sequences`` (as :func:`chunks` finds them) are not written as ``scheme``
    writes them, and how many chunks there are.

    IOB2 begins every chunk with ``B``; IOBES writes a one-token chunk ``S`` and a longer one
    ``B`` ... ``E``; IOB1 begins a chunk with ``B`` only right after a chunk of its type. Gold
    labels in another scheme than a model's hold only labels it knows, and score the same chunks,
    but a token accuracy that is off by the chunks written otherwise.

    Parameters
    ----------
    sequences : sequence of sequences of str
        Label sequences.
    scheme : str
        ``"iob1"``, ``"iob2"`` or ``"iobes"`` (any case).

    Returns
    -------
    (int, int)
        (chunks not in ``scheme``, chunks).
    """
    flat, offsets = _flatten(sequences)
    if flat.size == 0:
        return 0, 0
    starts, ends, tags, types, prev_tags, prev_types = _spans(flat, offsets)
    head, last, single = tags[starts], tags[ends - 1], ends - starts == 1
    scheme = scheme.lower()
    if scheme == "iobes":
        bad = np.where(single, head != "S", (head != "B") | (last != "E"))
    elif scheme in ("iob1", "iob2"):
        foreign = np.isin(head, ["E", "S"]) | np.isin(last, ["E", "S"])  # IOBES' tags
        if scheme == "iob2":
            bad = foreign | (head != "B")
        else:
            after_same_type = np.isin(prev_tags[starts], ["B", "I"]) & (prev_types[starts] == types[starts])
            bad = foreign | ((head == "B") != after_same_type)
    else:
        raise ValueError(f"scheme {scheme!r}: one of iob1, iob2, iobes")
    return int(bad.sum()), int(starts.size)


def _spans(flat: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    """(chunk starts, chunk ends (exclusive), then per token of the non-empty ``flat`` labels (n,):
    tags, types, previous tags and previous types, the previous token of a sequence's first being ``O``)."""
    n = flat.size
    tags, types = _tag_arrays(flat)
    first = np.zeros(n, dtype=bool)
    first[offsets[:-1][offsets[:-1] < n]] = True
    prev_tags, prev_types = np.where(first, "O", np.roll(tags, 1)), np.where(first, "_", np.roll(types, 1))
    starts = np.flatnonzero(chunk_start(prev_tags, tags, prev_types, types))
    closes = np.zeros(n + 1, dtype=bool)
    closes[:n] = chunk_end(prev_tags, tags, prev_types, types) | first
    closes[n] = True
    close_at = np.flatnonzero(closes)
    ends = close_at[np.searchsorted(close_at, starts, side="right")]
    return starts, ends, tags, types, prev_tags, prev_types


def _chunks_flat(flat: np.ndarray, offsets: np.ndarray) -> pd.DataFrame:
    n = flat.size
    if n == 0:
        return pd.DataFrame({"sequence": [], "start": [], "end": [], "type": []})
    starts, ends, _, types, _, _ = _spans(flat, offsets)
    sequence = np.searchsorted(offsets, starts, side="right") - 1
    return pd.DataFrame(
        {
            "sequence": sequence,
            "start": starts - offsets[sequence],
            "end": ends - offsets[sequence],
            "type": types[starts].astype(str),
        }
    )


@dataclass
class ChunkScores:
    """Overall chunk precision/recall/F1 (percent, as conlleval prints them) and counts.

    Parameters
    ----------
    precision, recall, f1 : float
        Overall chunk scores in percent (0 where undefined).
    n_gold, n_predicted, n_correct : int
        Chunk counts.
    accuracy : float
        Token accuracy in percent.
    per_type : pandas.DataFrame
        Indexed by chunk type: ``precision``, ``recall``, ``f1`` (percent), ``support`` (gold
        chunks), ``predicted``, ``correct``.
    """

    precision: float
    recall: float
    f1: float
    n_gold: int
    n_predicted: int
    n_correct: int
    accuracy: float
    per_type: pd.DataFrame  # index type; columns precision, recall, f1, support, predicted, correct


def _prf(correct, predicted, gold):
    precision = 100.0 * correct / predicted if predicted else 0.0
    recall = 100.0 * correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def chunk_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> ChunkScores:
    """conlleval's chunk P/R/F1 overall and per type, and token accuracy.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences.
    predicted : sequence of sequences of str
        The predicted label sequences, aligned with ``gold``.

    Returns
    -------
    ChunkScores
        ``precision``, ``recall``, ``f1`` and ``accuracy`` in percent (0 where undefined, as
        conlleval), ``n_gold``, ``n_predicted``, ``n_correct`` chunk counts, and ``per_type``: a
        frame indexed by type with precision, recall, f1 (percent), support, predicted, correct.

    Raises
    ------
    ValueError
        As :func:`check_aligned`.
    """
    check_aligned(gold, predicted)
    gold_chunks = chunks(gold)
    pred_chunks = chunks(predicted)
    key = ["sequence", "start", "end", "type"]
    correct = gold_chunks.merge(pred_chunks, on=key, how="inner")
    g = gold_chunks["type"].value_counts()
    p = pred_chunks["type"].value_counts()
    c = correct["type"].value_counts()
    types = sorted(set(g.index) | set(p.index))  # from the counts: a set of the column iterates every chunk
    rows = []
    for t in types:
        gt, pt, ct = int(g.get(t, 0)), int(p.get(t, 0)), int(c.get(t, 0))
        rows.append((t, *_prf(ct, pt, gt), gt, pt, ct))
    per_type = pd.DataFrame(rows, columns=["type", "precision", "recall", "f1", "support", "predicted", "correct"]).set_index(
        "type"
    )
    precision, recall, f1 = _prf(len(correct), len(pred_chunks), len(gold_chunks))
    return ChunkScores(
        precision, recall, f1, len(gold_chunks), len(pred_chunks), len(correct), token_accuracy(gold, predicted), per_type
    )


def check_aligned(gold, predicted, unknown: bool = False) -> None:
    """ValueError unless ``gold`` and ``predicted`` have the same number of sequences and labels
    per sequence, and (unless ``unknown``) no gold label is None: an unknown label cannot be
    scored (leave such tokens out, as :meth:`crf.CRF.score` does).

    Parameters
    ----------
    gold, predicted : sequence of sequences
        Label sequences.
    unknown : bool, default=False
        Allow gold labels that are None.

    Raises
    ------
    ValueError
        Naming the first sequence (and token) that differs in length or holds a None gold label.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sequences but {len(predicted)} predicted")
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sequence {i}: {len(g)} gold labels but {len(p)} predicted")
        if not unknown and any(label is None for label in g):
            position = next(t for t, label in enumerate(g) if label is None)
            raise ValueError(f"sequence {i}, token {position}: the gold label is None (unknown); score known labels only")


def token_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """Percentage of tokens whose predicted label equals the gold label.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences.
    predicted : sequence of sequences of str
        The predicted label sequences, aligned with ``gold``.

    Returns
    -------
    float
        Token accuracy in percent (0 to 100; 0.0 for no tokens).

    Raises
    ------
    ValueError
        As :func:`check_aligned`.
    """
    check_aligned(gold, predicted)
    g, _ = _flatten(gold)
    p, _ = _flatten(predicted)
    return 100.0 * float(np.mean(g == p)) if g.size else 0.0


def label_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> pd.DataFrame:
    """Per-label token-level precision, recall, F1 (percent) and support.

    The sequences must be aligned (the same number of sequences and of labels per sequence):
    :func:`check_aligned` refuses them otherwise.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences.
    predicted : sequence of sequences of str
        The predicted label sequences, aligned with ``gold``.

    Returns
    -------
    pandas.DataFrame
        Indexed by label (every label of either side, sorted), with ``precision``, ``recall``,
        ``f1`` in percent (0 where undefined) and ``support`` (gold count).
    """
    check_aligned(gold, predicted)
    g, _ = _flatten(gold)
    p, _ = _flatten(predicted)
    labels = sorted(set(g) | set(p))
    rows = []
    for label in labels:
        tp = int(np.sum((g == label) & (p == label)))
        rows.append((label, *_prf(tp, int(np.sum(p == label)), int(np.sum(g == label))), int(np.sum(g == label))))
    return pd.DataFrame(rows, columns=["label", "precision", "recall", "f1", "support"]).set_index("label")


def confusion_matrix(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], labels: Sequence[str] | None = None
) -> pd.DataFrame:
    """Counts of (gold label, predicted label) pairs; rows gold, columns predicted.

    The sequences must be aligned (the same number of sequences and of labels per sequence):
    :func:`check_aligned` refuses them otherwise.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences.
    predicted : sequence of sequences of str
        The predicted label sequences, aligned with ``gold``.
    labels : sequence of str, optional
        The rows and columns, in this order; tokens whose gold or predicted label is not among
        them are not counted. None: every label of either side, sorted.

    Returns
    -------
    pandas.DataFrame of shape (L, L), int
        Index named ``gold``, columns named ``predicted``.
    """
    check_aligned(gold, predicted)
    g, _ = _flatten(gold)
    p, _ = _flatten(predicted)
    labels = list(labels) if labels is not None else sorted(set(g) | set(p))
    index = {label: i for i, label in enumerate(labels)}
    gi = np.array([index.get(x, -1) for x in pd.unique(g)])[pd.factorize(g)[0]]
    pi = np.array([index.get(x, -1) for x in pd.unique(p)])[pd.factorize(p)[0]]
    keep = (gi >= 0) & (pi >= 0)
    counts = np.bincount(gi[keep] * len(labels) + pi[keep], minlength=len(labels) ** 2)
    return pd.DataFrame(
        counts.reshape(len(labels), len(labels)), index=pd.Index(labels, name="gold"), columns=pd.Index(labels, name="predicted")
    )


# --- significance of a difference between two taggers ---------------------------------------


def mcnemar(gold: Sequence[Sequence[str]], first: Sequence[Sequence[str]], second: Sequence[Sequence[str]]) -> dict:
    """Exact McNemar test on tokens: of the tokens exactly one tagger gets right, is the split
    between the two taggers 50:50?

    The sequences must be aligned: :func:`check_aligned` refuses them otherwise.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences.
    first, second : sequence of sequences of str
        The two taggers' predictions, aligned with ``gold``.

    Returns
    -------
    dict
        ``only_first_correct`` and ``only_second_correct`` (token counts, int) and ``p_value``,
        the two-sided exact binomial p-value (1.0 when no token is discordant).
    """
    from scipy.stats import binomtest

    check_aligned(gold, first)
    check_aligned(gold, second)
    g, _ = _flatten(gold)
    a, _ = _flatten(first)
    b, _ = _flatten(second)
    only_first = int(np.sum((a == g) & (b != g)))
    only_second = int(np.sum((a != g) & (b == g)))
    discordant = only_first + only_second
    p = 1.0 if discordant == 0 else float(binomtest(only_first, discordant, 0.5).pvalue)
    return {"only_first_correct": only_first, "only_second_correct": only_second, "p_value": p}


def sentence_counts(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], chunked: bool) -> np.ndarray:
    """Per sentence (N, 2) [correct tokens, tokens] or, chunked, (N, 5) with [correct chunks,
    predicted chunks, gold chunks] appended: the sufficient statistics of accuracy and F1.

    The sequences must be aligned (the same number of sequences and of labels per sequence):
    :func:`check_aligned` refuses them otherwise.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences.
    predicted : sequence of sequences of str
        The predicted label sequences, aligned with ``gold``.
    chunked : bool
        Add the chunk counts.

    Returns
    -------
    ndarray of shape (N, 2) or (N, 5), float64
        Counts per sentence.
    """
    check_aligned(gold, predicted)
    g, offsets = _flatten(gold)
    p, _ = _flatten(predicted)
    n = offsets.size - 1
    sentence = np.repeat(np.arange(n), np.diff(offsets))
    columns = [np.bincount(sentence, weights=(g == p), minlength=n), np.diff(offsets).astype(float)]
    if chunked:
        truth = _chunks_flat(g, offsets)
        guess = _chunks_flat(p, offsets)
        both = guess.merge(truth, on=["sequence", "start", "end", "type"])
        for frame in (both, guess, truth):
            columns.append(np.bincount(frame["sequence"].to_numpy(dtype=np.int64), minlength=n).astype(float))
    return np.stack(columns, axis=1)


def _scores_from_counts(totals: np.ndarray) -> np.ndarray:
    """Accuracy (and F1) in percent from summed sentence counts (..., 2 or 5)."""
    accuracy = 100.0 * totals[..., 0] / np.maximum(totals[..., 1], 1)
    if totals.shape[-1] == 2:
        return accuracy[..., None]
    correct, guessed, true = totals[..., 2], totals[..., 3], totals[..., 4]
    f1 = 100.0 * 2 * correct / np.maximum(guessed + true, 1)
    return np.stack([accuracy, f1], axis=-1)


def paired_bootstrap(gold, first, second, chunked: bool, samples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Paired bootstrap over sentences (Koehn 2004; Berg-Kirkpatrick et al. 2012): resample the
    test sentences with replacement ``samples`` times, score both taggers on each resample and
    count how often the difference is on either side of zero. Returns one row per metric (accuracy,
    and F1 when ``chunked``): both scores, the difference (second - first), a 95% interval of
    the difference and the two-sided p-value.

    The sequences must be aligned: :func:`check_aligned` refuses them otherwise.

    Parameters
    ----------
    gold : sequence of sequences of str
        The gold label sequences (N sentences).
    first, second : sequence of sequences of str
        The two taggers' predictions, aligned with ``gold``.
    chunked : bool
        Also compare chunk F1 (conlleval's chunks).
    samples : int, default=1000
        The number of resamples B.
    seed : int, default=0
        Seed of the resampling (NumPy's ``default_rng``).

    Returns
    -------
    pandas.DataFrame
        One row per metric: ``metric`` (``"accuracy"``, ``"f1"``), ``first``, ``second``,
        ``difference`` (percentage points), ``low_95``, ``high_95`` (the 2.5th and 97.5th
        percentiles of the resampled differences) and ``p_value`` (two-sided, add-one estimate:
        at least 2 / (B + 1)).
    """
    a = sentence_counts(gold, first, chunked)
    b = sentence_counts(gold, second, chunked)
    n = a.shape[0]
    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=samples).astype(float)  # (B, N)
    difference = _scores_from_counts(weights @ b) - _scores_from_counts(weights @ a)  # (B, metrics)
    observed_a, observed_b = _scores_from_counts(a.sum(axis=0)), _scores_from_counts(b.sum(axis=0))
    names = ["accuracy", "f1"][: observed_a.size]
    rows = []
    for k, name in enumerate(names):
        d = difference[:, k]
        # two-sided, with the add-one estimate: no resample reversing the sign means p < 1/B, not 0
        reversed_ = min(np.sum(d <= 0), np.sum(d >= 0))
        p = min(1.0, 2.0 * (reversed_ + 1) / (samples + 1))
        rows.append(
            {
                "metric": name,
                "first": observed_a[k],
                "second": observed_b[k],
                "difference": observed_b[k] - observed_a[k],
                "low_95": float(np.percentile(d, 2.5)),
                "high_95": float(np.percentile(d, 97.5)),
                "p_value": p,
            }
        )
    return pd.DataFrame(rows)


# --- sklearn-crfsuite's flat metrics: sklearn.metrics on the labels of all tokens -------------


def _flat_labels(gold, predicted) -> tuple[np.ndarray, np.ndarray]:
    check_aligned(gold, predicted)
    # plain arrays of the labels' own type: scikit-learn cannot classify object arrays of integers
    return np.asarray(_flatten(gold)[0].tolist()), np.asarray(_flatten(predicted)[0].tolist())


def flat_accuracy_score(y_true, y_pred) -> float:
    """Token accuracy (a fraction) over all sequences (sklearn-crfsuite's).

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.

    Returns
    -------
    float
        The fraction of tokens labelled right, 0 to 1.

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    from sklearn import metrics

    return float(metrics.accuracy_score(*_flat_labels(y_true, y_pred)))


def flat_precision_score(y_true, y_pred, **kwargs):
    """``sklearn.metrics.precision_score`` of the token labels (keyword arguments passed on).

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.
    **kwargs
        Passed on to ``sklearn.metrics.precision_score`` (``average``, ``labels``, ``zero_division``, ...).

    Returns
    -------
    float or ndarray
        What scikit-learn returns: a fraction, or one per label with ``average=None``.

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    from sklearn import metrics

    return metrics.precision_score(*_flat_labels(y_true, y_pred), **kwargs)


def flat_recall_score(y_true, y_pred, **kwargs):
    """``sklearn.metrics.recall_score`` of the token labels.

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.
    **kwargs
        Passed on to ``sklearn.metrics.recall_score`` (``average``, ``labels``, ``zero_division``, ...).

    Returns
    -------
    float or ndarray
        What scikit-learn returns: a fraction, or one per label with ``average=None``.

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    from sklearn import metrics

    return metrics.recall_score(*_flat_labels(y_true, y_pred), **kwargs)


def flat_f1_score(y_true, y_pred, **kwargs):
    """``sklearn.metrics.f1_score`` of the token labels (e.g. ``average="weighted", labels=...``).

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.
    **kwargs
        Passed on to ``sklearn.metrics.f1_score`` (``average``, ``labels``, ``zero_division``, ...).

    Returns
    -------
    float or ndarray
        What scikit-learn returns: a fraction, or one per label with ``average=None``.

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    from sklearn import metrics

    return metrics.f1_score(*_flat_labels(y_true, y_pred), **kwargs)


def flat_fbeta_score(y_true, y_pred, beta, **kwargs):
    """``sklearn.metrics.fbeta_score`` of the token labels.

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.
    beta : float
        The weight of recall against precision.
    **kwargs
        Passed on to ``sklearn.metrics.fbeta_score``.

    Returns
    -------
    float or ndarray
        What scikit-learn returns.

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    from sklearn import metrics

    return metrics.fbeta_score(*_flat_labels(y_true, y_pred), beta=beta, **kwargs)


def flat_classification_report(y_true, y_pred, labels=None, **kwargs):
    """``sklearn.metrics.classification_report`` of the token labels.

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.
    labels : sequence, optional
        The labels to report, in this order; None: every label.
    **kwargs
        Passed on to ``sklearn.metrics.classification_report`` (``digits``, ``output_dict``, ...).

    Returns
    -------
    str or dict
        The report (a dict with ``output_dict=True``).

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    from sklearn import metrics

    return metrics.classification_report(*_flat_labels(y_true, y_pred), labels=labels, **kwargs)


def sequence_accuracy_score(y_true, y_pred) -> float:
    """Fraction of sequences whose every label is right.

    Parameters
    ----------
    y_true : sequence of sequences
        The gold label sequences.
    y_pred : sequence of sequences
        The predicted label sequences, aligned with ``y_true``.

    Returns
    -------
    float
        0 to 1 (0.0 for no sequences).

    Raises
    ------
    ValueError
        As :func:`check_aligned` (a gold label of None included).
    """
    check_aligned(y_true, y_pred)
    if not len(y_true):
        return 0.0
    return float(np.mean([list(g) == list(p) for g, p in zip(y_true, y_pred)]))


def flat_scorer(metric=flat_f1_score, **kwargs):
    """A scorer for sklearn's model selection (``cross_val_score``, ``GridSearchCV``,
    ``RandomizedSearchCV``): ``make_scorer(metric, **kwargs)``, e.g.
    ``flat_scorer(flat_f1_score, average="weighted", labels=labels)``.

    Parameters
    ----------
    metric : callable, default=flat_f1_score
        ``metric(y_true, y_pred, **kwargs) -> float``, greater is better.
    **kwargs
        Passed on to ``metric`` at every call.

    Returns
    -------
    callable
        ``scorer(estimator, X, y)``, as ``sklearn.metrics.make_scorer`` makes it.
    """
    from sklearn.metrics import make_scorer

    return make_scorer(metric, **kwargs)

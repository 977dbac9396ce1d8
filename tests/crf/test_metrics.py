"""Chunk metrics against seqeval (conlleval-compatible mode) and by hand."""

from __future__ import annotations

import numpy as np
import pytest

from crf import metrics

seqeval = pytest.importorskip("seqeval.metrics")


def _random_sequences(rng, labels, n=200):
    return [list(rng.choice(labels, size=int(rng.integers(1, 12)))) for _ in range(n)]


@pytest.mark.parametrize(
    "labels",
    [
        ["O", "B-NP", "I-NP", "B-VP", "I-VP"],  # IOB2 (and ill-formed sequences of it)
        ["O", "I-PER", "I-LOC", "B-LOC"],  # IOB1
        ["O", "B-X", "I-X", "E-X", "S-X", "S-Y", "B-Y", "E-Y"],  # IOBES
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_seqeval_on_random_sequences(labels, seed):
    rng = np.random.default_rng(seed)
    gold = _random_sequences(rng, labels)
    pred = [[g if rng.random() < 0.7 else str(rng.choice(labels)) for g in s] for s in gold]
    ours = metrics.chunk_scores(gold, pred)
    assert ours.precision / 100 == pytest.approx(seqeval.precision_score(gold, pred), abs=1e-12)
    assert ours.recall / 100 == pytest.approx(seqeval.recall_score(gold, pred), abs=1e-12)
    assert ours.f1 / 100 == pytest.approx(seqeval.f1_score(gold, pred), abs=1e-12)
    assert ours.accuracy / 100 == pytest.approx(seqeval.accuracy_score(gold, pred), abs=1e-12)
    from seqeval.metrics.sequence_labeling import get_entities

    expected = sorted((t, s, e + 1) for t, s, e in get_entities([list(x) for x in gold]))
    found = metrics.chunks(gold)
    offsets = np.concatenate([[0], np.cumsum([len(s) + 1 for s in gold])])  # seqeval pads with 'O'
    flat = sorted(zip(found["type"], found["start"] + offsets[found["sequence"]], found["end"] + offsets[found["sequence"]]))
    assert flat == expected


def test_hand_counted_example():
    gold = [["B-NP", "I-NP", "O", "B-VP"], ["B-PP", "B-NP"]]
    pred = [["B-NP", "I-NP", "O", "B-NP"], ["B-PP", "I-PP"]]
    scores = metrics.chunk_scores(gold, pred)
    assert (scores.n_gold, scores.n_predicted, scores.n_correct) == (4, 3, 1)
    assert scores.per_type.loc["NP", "correct"] == 1 and scores.per_type.loc["VP", "support"] == 1
    assert scores.accuracy == pytest.approx(100 * 4 / 6)
    confusion = metrics.confusion_matrix(gold, pred)
    assert confusion.loc["B-VP", "B-NP"] == 1 and confusion.to_numpy().sum() == 6


def test_misaligned_input_is_rejected():
    with pytest.raises(ValueError, match="sequence 0: 2 gold labels but 1 predicted"):
        metrics.chunk_scores([["O", "O"]], [["O"]])
    # the same number of labels in all, split differently: per-sentence counts would be silently wrong
    gold, shifted = [["B-NP", "I-NP"], ["O"]], [["B-NP"], ["I-NP", "O"]]
    for score in (
        lambda: metrics.label_scores(gold, shifted),
        lambda: metrics.confusion_matrix(gold, shifted),
        lambda: metrics.mcnemar(gold, gold, shifted),
        lambda: metrics.sentence_counts(gold, shifted, chunked=True),
        lambda: metrics.paired_bootstrap(gold, gold, shifted, chunked=True, samples=10),
    ):
        with pytest.raises(ValueError, match="sequence 0: 2 gold labels but 1 predicted"):
            score()


def test_mcnemar_counts_and_exact_p_value():
    from scipy.stats import binom

    gold = [["A", "B", "A", "B"], ["A", "A"]]
    first = [["A", "A", "A", "B"], ["B", "A"]]  # wrong at 2 tokens
    second = [["A", "B", "B", "B"], ["A", "A"]]  # wrong at 1 token
    result = metrics.mcnemar(gold, first, second)
    assert result["only_first_correct"] == 1 and result["only_second_correct"] == 2
    # exact two-sided binomial with n = 3 discordant tokens: P(X <= 1) * 2 = 1.0
    assert result["p_value"] == pytest.approx(min(1.0, 2 * binom.cdf(1, 3, 0.5)))
    assert metrics.mcnemar(gold, first, first)["p_value"] == 1.0


def test_paired_bootstrap():
    rng = np.random.default_rng(0)
    labels = ["B-NP", "I-NP", "O", "B-VP"]
    gold = [list(rng.choice(labels, size=int(rng.integers(3, 12)))) for _ in range(200)]
    noisy = [[t if rng.random() < 0.8 else str(rng.choice(labels)) for t in s] for s in gold]
    better = [[t if rng.random() < 0.97 else str(rng.choice(labels)) for t in s] for s in gold]
    table = metrics.paired_bootstrap(gold, noisy, better, chunked=True, samples=500, seed=1).set_index("metric")
    # the observed scores are the ordinary ones
    assert table.loc["accuracy", "first"] == pytest.approx(metrics.token_accuracy(gold, noisy))
    assert table.loc["f1", "second"] == pytest.approx(metrics.chunk_scores(gold, better).f1)
    assert table.loc["f1", "difference"] > 0 and table.loc["f1", "low_95"] > 0
    assert table.loc["accuracy", "p_value"] < 0.01 and table.loc["f1", "p_value"] < 0.01
    same = metrics.paired_bootstrap(gold, noisy, noisy, chunked=False, samples=200)
    assert list(same["metric"]) == ["accuracy"] and same["p_value"].iloc[0] == 1.0 and same["difference"].iloc[0] == 0


def test_flat_metrics_match_sklearn_crfsuite():
    reference = pytest.importorskip("sklearn_crfsuite.metrics")
    rng = np.random.default_rng(0)
    labels = ["O", "B-NP", "I-NP", "B-VP"]
    gold = _random_sequences(rng, labels, n=50)
    predicted = [[label if rng.random() < 0.8 else str(rng.choice(labels)) for label in s] for s in gold]
    predicted[3] = list(gold[3])
    assert metrics.flat_accuracy_score(gold, predicted) == pytest.approx(reference.flat_accuracy_score(gold, predicted))
    for name in ("flat_f1_score", "flat_precision_score", "flat_recall_score"):
        for kwargs in ({"average": "weighted", "labels": labels[1:]}, {"average": "micro"}, {"average": None}):
            ours, theirs = getattr(metrics, name)(gold, predicted, **kwargs), getattr(reference, name)(gold, predicted, **kwargs)
            np.testing.assert_allclose(ours, theirs)
    assert metrics.flat_fbeta_score(gold, predicted, 0.5, average="macro") == pytest.approx(
        reference.flat_fbeta_score(gold, predicted, 0.5, average="macro")
    )
    report = metrics.flat_classification_report(gold, predicted, labels=labels[1:], digits=3)
    assert report == reference.flat_classification_report(gold, predicted, labels=labels[1:], digits=3)
    expected = np.mean([g == p for g, p in zip(gold, predicted)])
    assert metrics.sequence_accuracy_score(gold, predicted) == pytest.approx(expected) and expected > 0
    assert metrics.sequence_accuracy_score([], []) == 0.0
    with pytest.raises(ValueError, match="sequence 0"):
        metrics.flat_f1_score([["O", "O"]], [["O"]], average="micro")


def test_scorers_for_model_selection():
    from crf import CRF, scorers

    X = [[{"w": w} for w in words] for words in (["a", "b"], ["b", "a", "a"], ["a"])]
    y = [["A", "B"], ["B", "A", "A"], ["A"]]
    model = CRF(max_iterations=20).fit(X, y)
    assert scorers.flat_accuracy(model, X, y) == 1.0 and scorers.sequence_accuracy(model, X, y) == 1.0
    f1 = metrics.flat_scorer(metrics.flat_f1_score, average="macro")
    assert f1(model, X, y) == 1.0


def test_scheme_violations_count_the_chunks_written_in_another_scheme():
    """The same three chunks (NP 'the dog', NP 'it', VP 'ran') written in each scheme: each is
    clean in its own and counted where another scheme writes them otherwise."""
    from crf.metrics import scheme_violations

    written = {
        "iob2": [["B-NP", "I-NP", "B-NP", "B-VP", "O"]],
        "iob1": [["I-NP", "I-NP", "B-NP", "I-VP", "O"]],
        "iobes": [["B-NP", "E-NP", "S-NP", "S-VP", "O"]],
    }
    expected = {  # (scheme of the labels, scheme judged by) -> chunks not written that way
        ("iob2", "iob1"): 2, ("iob2", "iobes"): 3, ("iob1", "iob2"): 2, ("iob1", "iobes"): 3,
        ("iobes", "iob2"): 3, ("iobes", "iob1"): 3,
    }  # fmt: skip
    for source, labels in written.items():
        assert metrics.chunks(labels).equals(metrics.chunks(written["iob2"]))
        for judge in written:
            assert scheme_violations(labels, judge) == (expected.get((source, judge), 0), 3), (source, judge)
    assert scheme_violations([], "iob2") == (0, 0)
    assert scheme_violations([["O", "O"]], "IOBES") == (0, 0)
    with pytest.raises(ValueError, match="one of iob1, iob2, iobes"):
        scheme_violations(written["iob2"], "bilou")

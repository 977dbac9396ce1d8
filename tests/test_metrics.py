"""Chunk metrics against seqeval (conlleval-compatible mode) and by hand."""

from __future__ import annotations

import numpy as np
import pytest

from crf import metrics

seqeval = pytest.importorskip("seqeval.metrics")


def _random_sequences(rng, labels, n=200):
    return [list(rng.choice(labels, size=int(rng.integers(1, 12)))) for _ in range(n)]


@pytest.mark.parametrize("labels", [
    ["O", "B-NP", "I-NP", "B-VP", "I-VP"],  # IOB2 (and ill-formed sequences of it)
    ["O", "I-PER", "I-LOC", "B-LOC"],  # IOB1
    ["O", "B-X", "I-X", "E-X", "S-X", "S-Y", "B-Y", "E-Y"],  # IOBES
])
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

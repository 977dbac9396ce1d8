"""Integration: train on CoNLL-2000 with the CRFsuite chunking attributes; F1 >= 93 on test."""

from __future__ import annotations

import pytest

from crf import CRF, crfsuite_chunking_extractor, metrics, read_conll
from crf.io import column

pytestmark = pytest.mark.slow  # trains on the full CoNLL-2000 training set


@pytest.fixture(scope="module")
def chunker(request):
    data = request.getfixturevalue("shared_data")
    train = read_conll(data / "conll2000" / "train.txt.gz")
    test = read_conll(data / "conll2000" / "test.txt.gz")
    extractor = crfsuite_chunking_extractor()
    X_train = extractor.fit_transform(train)
    X_test = extractor.transform(test)
    model = CRF(c2=1.0).fit(X_train, column(train, 2), attribute_names=extractor.attribute_names())
    return model, X_test, column(test, 2)


def test_chunk_f1_reaches_93(chunker):
    model, X_test, gold = chunker
    predicted = model.predict(X_test)
    scores = metrics.chunk_scores(gold, predicted)
    print(
        f"CoNLL-2000 test: F1 {scores.f1:.2f}, accuracy {scores.accuracy:.2f}, {model.n_iter_} iterations ({model.stop_reason_})"
    )
    assert scores.f1 >= 93.0
    assert scores.accuracy >= 95.5


def test_metrics_agree_with_seqeval_on_real_predictions(chunker):
    seqeval = pytest.importorskip("seqeval.metrics")
    model, X_test, gold = chunker
    predicted = model.predict(X_test)
    ours = metrics.chunk_scores(gold, predicted)
    assert ours.f1 / 100 == pytest.approx(seqeval.f1_score(gold, predicted), abs=1e-12)
    assert ours.precision / 100 == pytest.approx(seqeval.precision_score(gold, predicted), abs=1e-12)
    assert ours.recall / 100 == pytest.approx(seqeval.recall_score(gold, predicted), abs=1e-12)
    report = seqeval.classification_report(gold, predicted, output_dict=True)
    for chunk_type, row in ours.per_type.iterrows():
        assert row["support"] == report[chunk_type]["support"]
        assert row["f1"] / 100 == pytest.approx(report[chunk_type]["f1-score"], abs=1e-12)


def test_segment_confidence_is_calibrated_on_real_data(chunker):
    """Confident chunks should be right more often than unsure ones."""
    model, X_test, gold = chunker
    segments = model.predict_segments(X_test)
    gold_chunks = metrics.chunks(gold)
    correct = segments.merge(gold_chunks, on=["sequence", "start", "end", "type"], how="left", indicator=True)["_merge"] == "both"
    confident = segments["confidence"].to_numpy() > 0.9
    assert correct[confident].mean() > 0.97 > correct[~confident].mean()
    assert ((segments["confidence"] >= 0) & (segments["confidence"] <= 1)).all()

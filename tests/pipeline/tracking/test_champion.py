"""The registry's alias rule (pipeline.tracking.champion): the champion only moves forward."""

from __future__ import annotations

import pytest

from pipeline.tracking.champion import Standing, alias_decision, evaluation_key

FLAT = {
    "dataset.name": "conll2000",
    "dataset.label": "chunk",
    "dataset.dev_split.fraction": "0.1",
    "dataset.dev_split.seed": "13",
    "dataset.files.test.sha256": "55f3",
    "dataset.files.train.sha256": "91a4",
    "data.train_fraction": "1.0",
    "trainer.c2": "1.0",
}


def test_the_evaluation_key_follows_dev_and_test_data_only():
    key = evaluation_key(FLAT)
    assert evaluation_key({**FLAT, "data.train_fraction": "0.1", "trainer.c2": "0.3"}) == key
    assert evaluation_key({**FLAT, "dataset.files.train.sha256": "other"}) == key
    assert evaluation_key({**FLAT, "dataset.dev_split.seed": "14"}) != key
    assert evaluation_key({**FLAT, "dataset.files.test.sha256": "other"}) != key
    assert evaluation_key({**FLAT, "dataset.name": "ud"}) != key
    assert evaluation_key({**FLAT, "dataset.dev_split.seed": 13}) == key  # compared as text, as MLflow params


def _standing(value, metric="dev_f1", direction="maximize", evaluation="e1"):
    return Standing(metric, value, direction, evaluation)


def test_a_standing_round_trips_through_version_tags():
    standing = _standing(85.91)
    assert Standing.from_tags(standing.tags()) == standing
    assert Standing.from_tags({"dev_f1": "85.9"}) is None


@pytest.mark.parametrize(
    "new, current, has_holder, force, moves, reason",
    [
        (_standing(67.04), _standing(85.91), True, False, False, "worse than the holder's 85.91"),
        (_standing(85.91), _standing(85.91), True, False, True, "at least"),
        (_standing(86.0), _standing(85.91), True, False, True, "at least"),
        (_standing(67.04), _standing(85.91), True, True, True, "forced"),
        (_standing(67.04), None, False, False, True, "no version held"),
        (_standing(90.0), None, True, False, False, "older version"),
        (_standing(90.0, evaluation="e2"), _standing(85.91), True, False, False, "other evaluation data"),
        (_standing(90.0, metric="dev_accuracy"), _standing(85.91), True, False, False, "chosen by dev_f1"),
        (_standing(0.02, "cal", "minimize"), _standing(0.03, "cal", "minimize"), True, False, True, "at least"),
        (_standing(0.04, "cal", "minimize"), _standing(0.03, "cal", "minimize"), True, False, False, "worse"),
        (_standing(float("nan")), _standing(85.91), True, False, False, "no score"),
    ],
)
def test_the_alias_only_moves_forward(new, current, has_holder, force, moves, reason):
    moved, why = alias_decision(new, current, has_holder, force)
    assert moved is moves
    assert reason in why

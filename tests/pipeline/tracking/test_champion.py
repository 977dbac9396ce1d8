"""The registry's alias rule (pipeline.tracking.champion): the champion only moves forward."""

from __future__ import annotations

import json

import pytest

from pipeline.tracking.champion import Standing, alias_decision, evaluation_key

DATASET = {
    "name": "conll2000",
    "format": "conll",
    "columns": ["w", "pos", "chunk"],
    "label": "chunk",
    "scheme": "IOB2",
    "dev_split": {"fraction": 0.1, "seed": 13},
    "files": {
        "train": {"path": "conll2000/train.txt.gz", "url": "https://x/train", "sha256": "91a4"},
        "test": {"path": "conll2000/test.txt.gz", "url": "https://x/test", "sha256": "55f3"},
    },
    "hmm": {"observation": "pos"},
}
DIGESTS = {"file:train": "aaaa", "file:test": "bbbb"}


def _changed(path: str, value):
    """DATASET with the setting at the dotted ``path`` replaced by ``value``."""
    copy = json.loads(json.dumps(DATASET))
    *parents, last = path.split(".")
    node = copy
    for part in parents:
        node = node[part]
    node[last] = value
    return copy


def test_the_evaluation_key_follows_everything_that_decides_the_dev_and_test_data():
    key = evaluation_key(DATASET, DIGESTS)
    # what the dev and test scores are computed on: each change is other evaluation data
    assert evaluation_key(DATASET, {**DIGESTS, "file:train": "cccc"}) != key  # the dev split is carved from train
    assert evaluation_key(DATASET, {**DIGESTS, "file:test": "cccc"}) != key
    assert evaluation_key(DATASET, {**DIGESTS, "file:dev": "cccc"}) == key  # no dev file configured: not read
    assert evaluation_key(_changed("files.dev", {"path": "d.txt"}), {**DIGESTS, "file:dev": "cccc"}) != key
    for path, value in [
        ("columns", ["w", "chunk", "pos"]),
        ("label", "pos"),
        ("scheme", "IOB1"),
        ("format", "conllu"),
        ("dev_split.seed", 14),
        ("dev_split.fraction", 0.2),
        ("name", "other"),
    ]:
        assert evaluation_key(_changed(path, value), DIGESTS) != key, path
    # with content digests, where the files lie and how they are fetched do not count
    assert evaluation_key(_changed("files.train.path", "copy/train.txt.gz"), DIGESTS) == key
    assert evaluation_key(_changed("files.test.url", "https://mirror/test"), DIGESTS) == key
    assert evaluation_key(_changed("hmm.observation", "w"), DIGESTS) == key  # how a model reads the data
    # without digests a file counts by its configured path and sha256
    bare = evaluation_key(DATASET)
    assert evaluation_key(_changed("files.train.path", "conll2000/test.txt.gz")) != bare
    assert evaluation_key(_changed("files.test.sha256", "other")) != bare


def _standing(value, metric="dev_f1", direction="maximize", evaluation="e1"):
    return Standing(metric, value, direction, evaluation)


def test_a_standing_is_written_as_version_tags():
    tags = _standing(85.91).tags()
    assert tags == {
        "standing.metric": "dev_f1",
        "standing.value": "85.91",
        "standing.direction": "maximize",
        "standing.evaluation": "e1",
    }


@pytest.mark.parametrize(
    "new, current, has_holder, force, moves, reason",
    [
        (_standing(67.04), _standing(85.91), True, False, False, "worse than the holder's 85.91"),
        (_standing(85.91), _standing(85.91), True, False, True, "at least"),
        (_standing(86.0), _standing(85.91), True, False, True, "at least"),
        (_standing(67.04), _standing(85.91), True, True, True, "forced"),
        (_standing(67.04), None, False, False, True, "no version held"),
        (_standing(90.0), None, True, False, False, "on this evaluation data is not known"),
        (_standing(90.0, evaluation="e2"), _standing(85.91), True, False, False, "other evaluation data"),
        (_standing(90.0, evaluation=""), _standing(85.91, evaluation=""), True, False, False, "other evaluation data"),
        (_standing(0.02, "cal", "minimize"), _standing(0.03, "cal", "minimize"), True, False, True, "at least"),
        (_standing(0.04, "cal", "minimize"), _standing(0.03, "cal", "minimize"), True, False, False, "worse"),
        (_standing(float("nan")), _standing(85.91), True, False, False, "no score"),
        (None, None, False, False, False, "kept free: this version has no score"),  # a scoreless version: never by itself
        (None, None, False, True, True, "forced"),
    ],
)
def test_the_alias_only_moves_forward(new, current, has_holder, force, moves, reason):
    moved, why = alias_decision(new, current, has_holder, force)
    assert moved is moves
    assert reason in why


def test_a_holder_whose_score_cannot_be_read_keeps_the_alias_and_the_reason_says_why():
    moved, why = alias_decision(_standing(70.0), None, True, False, unreadable="no run names its model")
    assert not moved
    assert why == (
        "kept: the holder's dev_f1 on this evaluation data is not known (no run names its model); "
        "force the move with registry.force_alias=true"
    )


def test_the_runs_of_a_model_are_searched_in_every_page_of_experiments():
    """MLflow returns experiments 1,000 at a time: a holder whose runs lie in a later page was kept
    as one with no readable score."""
    from types import SimpleNamespace

    from pipeline.tracking.champion import _runs_of_the_model

    class Page(list):
        def __init__(self, ids, token):
            super().__init__(SimpleNamespace(experiment_id=i) for i in ids)
            self.token = token

    pages = {None: Page(["1", "2"], "next"), "next": Page(["3"], None)}
    searched = []
    client = SimpleNamespace(
        search_experiments=lambda view_type, page_token: pages[page_token],
        search_runs=lambda experiments, found, run_view_type, max_results: searched.append(experiments) or ["run"],
    )
    assert _runs_of_the_model(client, SimpleNamespace(source="models:/m-1", run_id=None)) == ["run"]
    assert searched == [["1", "2", "3"]]

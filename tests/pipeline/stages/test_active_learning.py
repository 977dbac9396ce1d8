"""Active learning: the query strategies, token budgets, partial annotation and the round loop
(a resumed run makes the same choices as an uninterrupted one), the area under the curve, and the
experiment as a real Hydra multirun whose summary lands on the sweep's parent run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import forkserver
import numpy as np
import pandas as pd
import pytest
from conftest import word_class_corpus
from pipeline_helpers import write_corpus

from crf import CRF, AttributeIndex, metrics
from pipeline.stages import active_learning as al


def test_take_by_tokens_spends_the_budget_in_order():
    order = np.array([3, 0, 2, 1])
    costs = np.array([5, 7, 2, 4])  # by position
    np.testing.assert_array_equal(al.take_by_tokens(order, costs, 4), [3])  # one sentence reaches it
    np.testing.assert_array_equal(al.take_by_tokens(order, costs, 9), [3, 0])  # 4 + 5 reaches 9
    np.testing.assert_array_equal(al.take_by_tokens(order, costs, 10), [3, 0, 2])  # 9 < 10: one more
    np.testing.assert_array_equal(al.take_by_tokens(order, costs, 100), order)
    assert al.take_by_tokens(np.array([], dtype=int), costs, 5).size == 0


def test_area_under_the_curve_and_tokens_to_reach():
    tokens, scores = np.array([100, 200, 400]), np.array([50.0, 70.0, 90.0])
    # trapezoids: (50 + 70) / 2 * 100 + (70 + 90) / 2 * 200 = 6000 + 16000, over 300 tokens
    assert al.area_under_curve(tokens, scores) == pytest.approx(22000 / 300)
    # cut at 300: the score there is 80 by interpolation
    assert al.area_under_curve(tokens, scores, 300) == pytest.approx((6000 + 7500) / 200)
    assert al.tokens_to_reach(tokens, scores, 70.0) == 200 and np.isnan(al.tokens_to_reach(tokens, scores, 95.0))


def test_priorities_rank_the_most_uncertain_first():
    from crf._uncertainty import Uncertainty

    figures = Uncertainty(
        offsets=np.array([0, 2, 5, 6]),
        best_probability=np.array([0.9, 0.4, 0.6]),
        margin=np.array([0.8, 0.05, 0.3]),
        total_token_entropy=np.array([0.1, 2.0, 0.5]),
        nbest_entropy=np.array([0.2, 1.5, 0.9]),
    )
    rng = np.random.default_rng(0)
    for strategy in ("least_confidence", "margin", "token_entropy", "nbest_entropy"):
        assert np.argsort(-al.priority(strategy, figures, 3, rng))[0] == 1
    with pytest.raises(ValueError, match="unknown strategy"):
        al.priority("most_fun", figures, 3, rng)
    with pytest.raises(ValueError, match="active_learning.arm='most_fun'"):
        al.settings_of({"arm": "most_fun"})


@pytest.fixture(scope="module")
def task():
    X, y = word_class_corpus(0, 400, n_words=16, lengths=(2, 10), inside_below=9, a_below=13)
    dev_X, dev_y = word_class_corpus(1, 100, n_words=16, lengths=(2, 10), inside_below=9, a_below=13)
    index = AttributeIndex()
    return index.fit_transform(X), y, index.transform(dev_X), dev_y


def _run(task, settings, state=None, saved=None, stop_after=None):
    train, gold, dev, dev_gold = task
    rounds_seen = []

    def evaluate(model):
        score = metrics.token_accuracy(dev_gold, [list(p) for p in model.predict(dev)])
        return score, score

    def on_round(figures):
        rounds_seen.append(figures)
        if stop_after is not None and figures.round == stop_after:
            raise KeyboardInterrupt

    def make_model():
        return CRF(warm_start=True, c2=0.5, all_possible_transitions=True)

    rounds = al.simulate(train, gold, make_model, evaluate, settings, state, saved, on_round)
    return rounds


@pytest.mark.parametrize("arm", ["least_confidence", "margin", "token_entropy", "nbest_entropy", "random"])
def test_each_strategy_spends_its_budget_and_learns(task, arm):
    settings = al.settings_of({"arm": arm, "seed": 3, "initial_fraction": 0.02, "batch_tokens": 60, "rounds": 4})
    rounds = _run(task, settings)
    assert [r.round for r in rounds] == [0, 1, 2, 3, 4]
    tokens = [r.labelled_tokens for r in rounds]
    assert all(60 <= b - a < 60 + 10 for a, b in zip(tokens, tokens[1:]))  # a sentence over the budget at most
    assert rounds[-1].dev_score > rounds[0].dev_score


def test_partial_annotation_asks_only_unsure_tokens(task):
    train, gold, _, _ = task
    for mode in ("unknown", "model"):
        settings = al.settings_of({"arm": f"partial_{mode}", "seed": 1, "initial_fraction": 0.05, "batch_tokens": 40,
                                   "rounds": 2, "threshold": 0.9})  # fmt: skip
        saved = []
        rounds = _run(task, settings, saved=saved.append)
        annotation = saved[-1].annotation
        chosen = annotation.chosen
        known = sum(sum(label is not None for label in annotation.labels[i]) for i in chosen)
        tokens = sum(len(gold[i]) for i in chosen)
        assert rounds[-1].labelled_tokens == annotation.asked_tokens < tokens  # some tokens were not asked
        if mode == "unknown":
            assert known == annotation.asked_tokens and annotation.model_tokens == 0
        else:  # the others carry the model's labels
            assert known == tokens and annotation.model_tokens == tokens - annotation.asked_tokens
        for i in chosen:  # what was asked is the gold label
            asked = [label for label in annotation.labels[i] if label is not None]
            assert len(asked) <= len(gold[i])


def test_a_killed_run_resumes_from_its_last_round_and_ends_as_an_uninterrupted_one(task, tmp_path):
    settings = al.settings_of({"arm": "least_confidence", "seed": 2, "initial_fraction": 0.02, "batch_tokens": 50, "rounds": 4})
    whole = _run(task, settings)
    checkpoint = al._Checkpoint(tmp_path / "resume")

    def make_model():
        return CRF(warm_start=True, c2=0.5, all_possible_transitions=True)

    with pytest.raises(KeyboardInterrupt):
        _run(task, settings, saved=checkpoint.save, stop_after=2)
    state = checkpoint.load(make_model)
    assert state is not None and len(state.rounds) == 2  # killed before round 2 was saved
    resumed = _run(task, settings, state=state, saved=checkpoint.save)
    assert [(r.labelled_tokens, r.labelled_sentences) for r in resumed] == [
        (r.labelled_tokens, r.labelled_sentences) for r in whole
    ]
    assert [r.dev_score for r in resumed] == pytest.approx([r.dev_score for r in whole], abs=1e-9)


@pytest.mark.slow
def test_the_experiment_runs_as_a_multirun_and_summarises_the_arms(tmp_path):
    from mlflow.tracking import MlflowClient

    data = write_corpus(tmp_path / "data", n_train=300, n_test=40)
    command = [
        sys.executable, "-m", "pipeline", "+experiment=active_learning", f"paths.output_dir={tmp_path / 'out'}",
        f"data.root={data}", "data.download=false", "dataset.files.train.sha256=null", "dataset.files.test.sha256=null",
        "active_learning.arm=full,random,least_confidence,partial_unknown", "active_learning.seed=0,1",
        "active_learning.rounds=3", "active_learning.batch_tokens=100", "active_learning.initial_fraction=0.05",
        # the jobs in the sweep's process (Hydra's basic launcher) rather than a joblib pool of two fresh interpreters
        # (about 12 CPU-s of imports): the summary reads the jobs' runs, whatever ran them
        "hydra/launcher=basic",
    ]  # fmt: skip
    done = forkserver.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crf")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")
    metrics_logged = parent.data.metrics
    for arm in ("random", "least_confidence", "partial_unknown"):
        assert 0 < metrics_logged[f"aulc_{arm}"] <= 100
    assert metrics_logged["jobs_finished"] == 8 and metrics_logged["full_test_score"] > 90
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"active_learning.md", "active_learning.csv", "learning_curves.png", "learning_curves.csv"} <= names
    stages = client.search_runs([experiment.experiment_id], "tags.stage = 'active_learning'")
    steps = client.get_metric_history(stages[0].info.run_id, "labelled_tokens")
    assert steps and all(s.step >= 0 for s in steps)
    table = pd.read_csv(Path(client.download_artifacts(parent.info.run_id, "active_learning.csv", str(tmp_path))))
    assert set(table["arm"]) == {"random", "least_confidence", "partial_unknown"} and (table["runs"] == 2).all()


def test_a_kill_while_a_round_is_saved_resumes_from_the_round_before(task, tmp_path, monkeypatch):
    """Round 2's checkpoint is torn (the kill comes after its annotation and before its curve):
    the resumed run starts from round 1's whole state and ends as the uninterrupted one."""
    settings = al.settings_of({"arm": "margin", "seed": 4, "initial_fraction": 0.02, "batch_tokens": 50, "rounds": 4})
    whole = _run(task, settings)
    checkpoint = al._Checkpoint(tmp_path / "resume")
    real = al.rounds_frame

    def torn(rounds):
        if len(rounds) == 3:  # round 2: its folder holds the model and the annotation so far
            raise KeyboardInterrupt
        return real(rounds)

    monkeypatch.setattr(al, "rounds_frame", torn)
    with pytest.raises(KeyboardInterrupt):
        _run(task, settings, saved=checkpoint.save)
    monkeypatch.setattr(al, "rounds_frame", real)

    def make_model():
        return CRF(warm_start=True, c2=0.5, all_possible_transitions=True)

    state = checkpoint.load(make_model)
    assert state is not None and len(state.rounds) == 2 and state.rounds[-1].labelled_tokens == whole[1].labelled_tokens
    resumed = _run(task, settings, state=state, saved=checkpoint.save)
    assert [r.labelled_tokens for r in resumed] == [r.labelled_tokens for r in whole]

"""Semi-supervised learning: the dev stopping rule never keeps a model worse than its start,
confident tokens become labels and the rest stay unknown, self-training on a task whose answer is
known learns from unlabelled sentences, and the experiment's jobs and summary run in-process on a
tiny corpus (metrics per arm and fraction, paired tests, the curves plot)."""

from __future__ import annotations

import fnmatch

import numpy as np
import pandas as pd
import pytest
from conftest import word_class_corpus
from pipeline_helpers import compose_config, seed_store, tiny_overrides, write_corpus

from crf import CRF, AttributeIndex, metrics
from pipeline.stages import semi_supervised as semi


def test_the_dev_rule_keeps_the_best_step_and_never_one_below_the_start():
    scores = iter([0.5, 0.7, 0.6, 0.65, 0.9])
    best, seen, kept = semi.best_by_dev(0.6, lambda: (s := next(scores), f"model {s}"), limit=5, patience=2)
    assert (best, seen, kept) == (2, [0.6, 0.5, 0.7, 0.6, 0.65], "model 0.7")  # stopped 2 steps after the best
    falling = iter([0.4, 0.3])
    assert semi.best_by_dev(0.6, lambda: (next(falling), "worse"), limit=5, patience=2) == (0, [0.6, 0.4, 0.3], None)
    assert semi.best_by_dev(0.6, lambda: (1.0, "x"), limit=0, patience=2) == (0, [0.6], None)


def test_confident_tokens_become_labels_and_the_others_unknown():
    marginals = np.array([[0.97, 0.03], [0.5, 0.5], [0.01, 0.99], [0.2, 0.8]])
    labels = semi.confident_labels(marginals, np.array([0, 3, 4]), ["A", "B"], 0.95)
    assert labels == [["A", None, "B"], [None]]


def test_the_labelled_split_is_seeded_and_disjoint():
    labelled, unlabelled = semi.labelled_split(100, 0.1, 3)
    assert labelled.size == 10 and np.intersect1d(labelled, unlabelled).size == 0 and labelled.size + unlabelled.size == 100
    assert np.array_equal(semi.labelled_split(100, 0.1, 3)[0], labelled) and not np.array_equal(
        semi.labelled_split(100, 0.1, 4)[0], labelled
    )
    assert semi.labelled_split(5, 0.01, 0)[0].size == 1 and semi.labelled_split(5, 0.99, 0)[1].size == 1
    with pytest.raises(ValueError, match="semi.fraction=1.5"):
        semi.settings_of({"fraction": 1.5})
    with pytest.raises(ValueError, match="semi.arms=\\['hmm', 'svm'\\]"):
        semi.settings_of({"arms": ["hmm", "svm"]})


def test_self_training_labels_unlabelled_sentences_as_the_truth_would():
    """On a task whose answer is known (word classes decide the labels), the model trained on a few
    sentences labels confident tokens of the unlabelled ones correctly, and training on them as
    partial labels loses little accuracy."""
    X, y = word_class_corpus(seed=1, n=400, n_words=30, lengths=(4, 9), inside_below=12, a_below=20)
    index = AttributeIndex()
    batch = index.fit_transform(X)
    test_X, test_y = word_class_corpus(seed=2, n=200, n_words=30, lengths=(4, 9), inside_below=12, a_below=20)
    test = index.transform(test_X)
    labelled, unlabelled = semi.labelled_split(len(X), 0.1, 0)
    model = CRF(c2=0.1, max_iterations=100, all_possible_transitions=True).fit(batch.subset(labelled), [y[i] for i in labelled])
    before = metrics.token_accuracy(test_y, [list(p) for p in model.predict(test)])
    pool = batch.subset(unlabelled)
    marginals, _ = model.marginals(pool)
    guessed = semi.confident_labels(marginals, pool.offsets, list(model.classes_), 0.9)
    pairs = [(g, t) for s, i in zip(guessed, unlabelled) for g, t in zip(s, y[i]) if g is not None]
    assert len(pairs) > 0.3 * pool.n_tokens and np.mean([g == t for g, t in pairs]) > 0.99  # confident and right
    model.set_params(warm_start=True)
    model.fit(batch.subset(np.concatenate([labelled, unlabelled])), [y[i] for i in labelled] + guessed)
    after = metrics.token_accuracy(test_y, [list(p) for p in model.predict(test)])
    assert after >= before - 1.0  # (self-training can lose accuracy: the experiment keeps the round best on dev)


def test_the_experiment_runs_every_arm_and_the_summary_compares_them(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipeline.__main__ import run_pipeline
    from pipeline.sweeps import semi_supervised as summary

    data = write_corpus(tmp_path / "data", n_train=200, n_test=40)
    out = tmp_path / "out"
    store = seed_store(out)
    monkeypatch.setenv("CRF_SWEEP_ID", "semi-test")
    base = tiny_overrides(data, out) + ["+experiment=semi_supervised", "hydra.mode=RUN", "semi.em_iterations=3",
                                        "semi.self_training_rounds=2", "semi.clusters.n_clusters=8"]  # fmt: skip
    results = {}
    for fraction in (0.05, 0.2):
        for seed in (0, 1):
            cfg = compose_config(base + [f"semi.fraction={fraction}", f"semi.seed={seed}"])
            results[fraction, seed] = run_pipeline(cfg)
    for result in results.values():
        assert result["semi_supervised.dev_f1_hmm_em"] >= result["semi_supervised.dev_f1_hmm"]  # by construction
        assert result["semi_supervised.dev_f1_crf_self_training"] >= result["semi_supervised.dev_f1_crf"]
        assert all(0 <= result[f"semi_supervised.test_f1_{arm}"] <= 100 for arm in semi.ARMS)
        declared = semi.STAGE.metric_names(cfg, None)  # a sweep's objective is checked against these
        logged = [key.partition(".")[2] for key in result if key.startswith("semi_supervised.")]
        assert logged and all(any(fnmatch.fnmatchcase(name, pattern) for pattern in declared) for name in logged), logged
    again = run_pipeline(compose_config(base + ["semi.fraction=0.05", "semi.seed=0"]))  # a cached job
    assert again["semi_supervised.test_f1_crf"] == results[0.05, 0]["semi_supervised.test_f1_crf"]
    mlflow.set_tracking_uri(f"sqlite:///{store}")
    client = MlflowClient()
    experiment = client.get_experiment_by_name("crf")
    parent = client.create_run(experiment.experiment_id, tags={"stage": "sweep"}).info.run_id
    jobs = summary.summarize("semi-test", parent, "crf")
    assert len(jobs) == 5
    logged = client.get_run(parent).data.metrics
    for arm in semi.ARMS:
        for fraction in ("0.05", "0.2"):
            assert 0 <= logged[f"test_f1_{arm}_{fraction}"] <= 100
    expected = np.mean([results[0.2, s]["semi_supervised.test_f1_crf_clusters"] for s in (0, 1)])
    assert logged["test_f1_crf_clusters_0.2"] == pytest.approx(expected)
    for pair in ("hmm_em_vs_hmm", "crf_self_training_vs_crf", "crf_clusters_vs_crf"):
        assert 0 <= logged[f"p_mcnemar_{pair}_0.05"] <= 1 and 0 <= logged[f"p_bootstrap_f1_{pair}_0.05"] <= 1
    names = {a.path for a in client.list_artifacts(parent)}
    assert {"semi_supervised.md", "semi_supervised.csv", "tests.csv", "jobs.csv", "learning_curves.png"} <= names
    table = pd.read_csv(client.download_artifacts(parent, "semi_supervised.csv", str(tmp_path)))
    assert set(table["arm"]) == set(semi.ARMS) and set(table["fraction"]) == {0.05, 0.2}


def test_the_clusters_arm_learns_from_the_pool_files_or_reads_a_paths_file(tmp_path):
    from pipeline.__main__ import run_pipeline
    from pipeline.engine.stage import load_stages

    data = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    out = tmp_path / "out"
    seed_store(out)
    pool = tmp_path / "pool.txt"
    pool.write_text("the zebra sees a quagga .\na quagga runs .\n")  # words the corpus never has
    base = tiny_overrides(data, out) + ["+experiment=semi_supervised", "hydra.mode=RUN", "semi.arms=[crf,crf_clusters]",
                                        "semi.clusters.n_clusters=4", "semi.clusters.format=text"]  # fmt: skip
    pooled = base + [f"semi.clusters.pool=[{pool}]"]
    result = run_pipeline(compose_config(pooled))
    assert 0 <= result["semi_supervised.test_f1_crf_clusters"] <= 100
    learned = sorted((out / "cache" / "clusters").glob("*/clusters.txt"))
    assert len(learned) == 1 and {"zebra", "quagga"} <= {line.split("\t")[1] for line in learned[0].read_text().splitlines()}
    stage = load_stages()["semi_supervised"]
    hashed = stage.external_inputs(compose_config(pooled), None)
    assert set(hashed) == {"pool:0"} and stage.external_inputs(compose_config(base), None) == {}  # no pool: keys as before
    pool.write_text("the okapi sees a quagga .\n")  # an edited pool: a new job key and new clusters
    assert stage.external_inputs(compose_config(pooled), None) != hashed
    run_pipeline(compose_config(pooled))
    assert len(list((out / "cache" / "clusters").glob("*/clusters.txt"))) == 2
    paths = tmp_path / "paths.txt"  # a precomputed paths file: read as it is, nothing clustered
    paths.write_text(learned[0].read_text())
    given = base + [f"semi.clusters.source={paths}"]
    assert run_pipeline(compose_config(given))["semi_supervised.test_f1_crf_clusters"] >= 0
    assert len(list((out / "cache" / "clusters").glob("*/clusters.txt"))) == 2
    assert set(stage.external_inputs(compose_config(given), None)) == {"clusters:source"}

"""Shared test helpers: the shared data folder and small random chain models."""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import sqlite3
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest

# $CRF_DATA_HOME (what the pipeline reads) when set, else ../shared/data beside the checkout: a git worktree
# elsewhere (or CI) finds the data through the variable instead of skipping every test that needs it
SHARED_DATA = Path(os.environ.get("CRF_DATA_HOME") or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture(scope="session", autouse=True)
def _mlflow_schema_from_a_template():
    """Every SQLite MLflow store this test process creates gets its tables by copying one store migrated
    once per session (SQLite's backup API) instead of running MLflow's ~100 Alembic migrations again:
    about 3 s per store on a quiet machine, and nearly every pipeline test opens a fresh store. Only
    MLflow's ``_initialize_tables`` is replaced, and only for SQLite; the opening of the store around it
    (the lock of ``prepare_store``, the schema check, the default experiment) is MLflow's own. Child
    processes are not affected: they create their stores as users' processes do."""
    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store
    import sqlalchemy

    migrate = db_utils._initialize_tables
    folder = Path(tempfile.mkdtemp(prefix="mlflow-schema-"))
    template = folder / "schema.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{template}")
    migrate(engine)  # tables and Alembic's version only: no experiment (its artifact folder would be this one)
    engine.dispose()

    def copy_schema(engine) -> None:
        if engine.dialect.name != "sqlite":
            migrate(engine)
            return
        connection = engine.raw_connection()
        try:
            with sqlite3.connect(template) as source:
                source.backup(connection.driver_connection)
        finally:
            connection.close()

    db_utils._initialize_tables = registry_store._initialize_tables = copy_schema
    try:
        yield
    finally:
        db_utils._initialize_tables = registry_store._initialize_tables = migrate
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _sqlite_commits_without_waiting_for_the_disk():
    """SQLite databases opened through SQLAlchemy in this test process (MLflow's stores, Optuna's studies)
    commit without waiting for the disk (``PRAGMA synchronous=OFF``): a tiny pipeline run makes about 120
    commits, each a ~5 ms wait for the disk to sync (about 0.7 s of a 2.3 s run), and the tests read
    nothing of it. Only durability after a power loss or an operating-system crash differs; what a commit
    writes, the locks between processes and what a killed process leaves are the same. Child processes
    (which the tests about processes start) are not affected and sync as users' processes do."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def no_sync(connection, _record) -> None:
        if isinstance(connection, sqlite3.Connection):
            connection.execute("PRAGMA synchronous=OFF")

    event.listen(Engine, "connect", no_sync)
    try:
        yield
    finally:
        event.remove(Engine, "connect", no_sync)


@pytest.fixture(scope="session", autouse=True)
def _cheaper_hydra_compositions():
    """Hydra compositions in this test process take the shortcuts of
    :func:`pipeline_helpers.composition_shortcuts` (YAML parsed once per text, the ConfigStore shared):
    about a quarter less CPU per composition, the same composed config. Child processes are not
    affected (the fork server is a fresh interpreter)."""
    from pipeline_helpers import composition_shortcuts

    with composition_shortcuts(True):
        yield


AMBIENT = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_REGISTRY_URI",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_EXPERIMENT_NAME",
    "CRF_SWEEP_PARENT_RUN_ID",
    "CRF_SWEEP_ID",
)


@pytest.fixture(autouse=True)
def _no_ambient_store(monkeypatch):
    """Every test starts without the store settings an earlier test of the same process left in
    the environment: MLflow's URI setters export ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI``,
    which the pipeline honours, so a later run would write to the earlier test's store."""
    for name in AMBIENT:
        monkeypatch.delenv(name, raising=False)
    yield
    for name in AMBIENT:  # set during the test by MLflow's setters (not through monkeypatch): leave none to the next fixture
        os.environ.pop(name, None)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> types.SimpleNamespace:
    """One run of the default pipeline (every stage, local SQLite store) on the tiny generated corpus,
    shared by the tests that read what it made: ``cfg``, ``results``, ``out`` (output folder), ``uri``
    (tracking URI) and ``parent_id`` (its pipeline run). A test that runs the pipeline again in ``out``
    adds runs: tests look runs up from ``parent_id``, never as "the only run"."""
    from mlflow.tracking import MlflowClient
    from pipeline_helpers import compose_config, tiny_overrides, write_corpus

    from pipeline.__main__ import run_pipeline

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "CRF_SWEEP_PARENT_RUN_ID", "CRF_SWEEP_ID"):
        os.environ.pop(name, None)
    root = tmp_path_factory.mktemp("tiny-pipeline")
    out = root / "out"
    cfg = compose_config(tiny_overrides(write_corpus(root / "data"), out))
    results = run_pipeline(cfg)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # MLflow exports it; do not leak it to later tests
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("crf").experiment_id], "tags.stage = 'pipeline'")
    return types.SimpleNamespace(cfg=cfg, results=results, out=out, uri=uri, parent_id=parent.info.run_id)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``$CRF_DATA_HOME`` or ``../shared/data`` beside the checkout; tests needing it skip when it is absent."""
    if not (SHARED_DATA / "conll2000" / "train.txt.gz").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set CRF_DATA_HOME or put ../shared/data beside the checkout)")
    return SHARED_DATA


def random_chain(seed: int, n_labels: int, lengths, scale: float = 1.0):
    """Random emissions (T, L), transitions (L, L), start and end (L,) with the given scale."""
    rng = np.random.default_rng(seed)
    total = int(np.sum(lengths))
    return (
        scale * rng.normal(size=(total, n_labels)),
        scale * rng.normal(size=(n_labels, n_labels)),
        scale * rng.normal(size=n_labels),
        scale * rng.normal(size=n_labels),
    )


def enumerate_paths(emissions, transitions, start, end):
    """Every label sequence of one sequence with its score: (paths (K, n), scores (K,))."""
    n, L = emissions.shape
    paths = np.array(list(itertools.product(range(L), repeat=n)), dtype=np.int64)
    scores = start[paths[:, 0]] + end[paths[:, -1]] + emissions[np.arange(n), paths].sum(axis=1)
    if n > 1:
        scores = scores + transitions[paths[:, :-1], paths[:, 1:]].sum(axis=1)
    return paths, scores


def random_second_order(seed: int, n_labels: int, lengths, scale: float = 1.0):
    """Per-label emissions (T, L), triple scores (L + 1, L, L), first-label and closing scores."""
    rng = np.random.default_rng(seed)
    L = n_labels
    emissions = scale * rng.normal(size=(int(np.sum(lengths)), L))
    triples = scale * rng.normal(size=(L + 1, L, L))
    first = scale * rng.normal(size=L)  # score of y_0 (after two start symbols)
    closing = scale * rng.normal(size=(L + 1, L))  # score of ending after (y_{n-2}, y_{n-1})
    return emissions, triples, first, closing


def second_order_states(triples, first, closing):
    """Start and end per pair state (S,) for the pair-state chain."""
    L = triples.shape[1]
    start = np.full((L + 1, L), -np.inf)
    start[L] = first
    return start.ravel(), closing.ravel()


def enumerate_second_order(emissions, triples, first, closing):
    """(paths (K, n), scores (K,)) of one sequence under the second-order model."""
    n, L = emissions.shape
    paths = np.array(list(itertools.product(range(L), repeat=n)), dtype=np.int64)
    scores = first[paths[:, 0]] + emissions[np.arange(n), paths].sum(axis=1)
    for t in range(1, n):
        before = paths[:, t - 2] if t >= 2 else np.full(len(paths), L)
        scores = scores + triples[before, paths[:, t - 1], paths[:, t]]
    before_last = paths[:, -2] if n >= 2 else np.full(len(paths), L)
    return paths, scores + closing[before_last, paths[:, -1]]


def random_allowed(rng, n_tokens: int, n_labels: int, p: float = 0.5):
    """A random (T, L) boolean mask with at least one allowed label per token."""
    allowed = rng.random((n_tokens, n_labels)) < p
    allowed[np.arange(n_tokens), rng.integers(0, n_labels, size=n_tokens)] = True
    return allowed


def sequence_slices(lengths):
    """(first, stop) token offsets of every sequence."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return list(zip(offsets[:-1].tolist(), offsets[1:].tolist()))


def word_class_corpus(seed: int, n: int, n_words: int, lengths: tuple[int, int], inside_below: int, a_below: int):
    """A learnable tagging task over words ``w0..w{n_words-1}`` as feature dicts (word and previous
    word): words below 4 are ``O``; after a chunk, words below ``inside_below`` continue it
    (``I-A``); otherwise words below ``a_below`` start ``B-A`` and the rest ``B-B``. Sentence
    lengths are drawn from ``range(*lengths)``. Returns (X, y)."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for _ in range(n):
        words = [f"w{k}" for k in rng.integers(0, n_words, size=int(rng.integers(*lengths)))]
        labels = []
        for w in words:
            k = int(w[1:])
            labels.append(
                "O" if k < 4 else "I-A" if labels and labels[-1] != "O" and k < inside_below else "B-A" if k < a_below else "B-B"
            )
        X.append([{"w": w, "prev": words[i - 1] if i else "<s>"} for i, w in enumerate(words)])
        y.append(labels)
    return X, y


# ---- scheduling under xdist (`-n 2 --dist loadfile`): longest files first ------------------------------------------
#
# pytest-xdist hands out whole files; by default it orders them by their number of tests, which puts the files of
# one or two long tests (full-data trainings, servers, multiruns) last, where a 100 s file on one worker leaves the
# other idle. Workers instead receive the files longest first (greedy longest-processing-time order), estimated from
# these per-test seconds measured on a quiet 2-core machine (the CI log of the whole suite, scaled by the CPU-s a
# test's change saved) and 10 s for any other slow test; a test that is not slow costs its file's share of
# FAST_FILE_SECONDS below, or 0.05 s in a file not listed there. The figures only order the files: a stale one costs
# some balance, never a result. A run without xdist keeps pytest's own order.
MEASURED_SECONDS = {
    "tests/pipeline/sweeps/test_launchers.py::test_sweep_on_a_two_node_ray_cluster": 91,
    "tests/crf/test_references.py::test_core_trained_crf_on_gold": 75,
    "tests/crf/test_conll2000.py::test_chunk_f1_reaches_93": 72,  # the module fixture trains the model
    "tests/pipeline/tracking/test_postgres.py::test_parallel_jobs_against_a_postgres_backed_server": 55,
    "tests/pipeline/sweeps/test_optuna_sweeper.py::test_optuna_sweep_end_to_end_with_a_pruned_trial": 45,
    "tests/pipeline/sweeps/test_launchers.py::test_sweep_through_submitit_with_a_failing_job": 36,
    "tests/crf/test_upstream_suites.py::test_sklearn_crfsuite_suite_passes_against_crf": 36,  # with the module fixture
    "tests/pipeline/tracking/test_tracking_live.py::test_sweep_of_two_jobs_in_parallel": 28,
    "tests/crf/test_upstream_suites.py::test_sklearn_crfsuite_suite_passes_on_crf_pycrfsuite": 26,
    "tests/pipeline/sweeps/test_optuna_sweeper.py::test_optuna_sweep_warm_starts_a_trial_from_the_finished_one_nearest_to_it": 25,
    "tests/pipeline/tracking/test_mlflow_model.py::test_model_benchmark_measures_the_logged_model_and_reproduces_its_score": 24,
    "tests/pipeline/tracking/test_tracking_live.py::test_a_failing_job_does_not_lose_the_others": 23,
    "tests/pipeline/engine/test_shared_cache.py::test_a_second_machine_reuses_every_stage_through_the_tracking_server": 22,
    "tests/faults/test_fault_tracking.py::"
    "test_sigterm_to_a_joblib_sweeps_process_group_ends_every_run_and_summarises_the_sweep": 20,
    "tests/pipeline/tracking/test_tracking_live.py::test_hmm_versus_crf_comparison_end_to_end": 18,
    "tests/pipeline/apps/test_benchmark.py::test_quick_per_call_rows_are_logged": 17,
    "tests/pipeline/tracking/test_serve.py::test_served_model_answers_like_predict_in_strict_json": 14,  # with the module fixture
    "tests/pipeline/stages/test_active_learning.py::test_the_experiment_runs_as_a_multirun_and_summarises_the_arms": 14,
    "tests/crf/test_crfsuite_format.py::test_conll2000_crfsuite_model_tagged_by_our_crf": 12,  # 2,000 sentences: 36 s on all
    "tests/pipeline/tracking/test_registry.py::test_a_sweep_registers_its_best_job_as_champion": 10,
    "tests/crf/test_trainers.py::test_same_chunk_f1_as_python_crfsuite": 8,  # 1,000 sentences: 20 s on 2,000
    "tests/crf/test_crfsuite_format.py::test_conll2000_our_model_tagged_by_crfsuite": 6,  # (22 s on all)
    "tests/crf/test_sklearn.py::test_cross_val_score_in_parallel": 16,  # starts joblib's worker processes
}


# The tests that are not slow, per file: (CPU-seconds of all of them, how many there are), measured with the fast tier
# (`-m "not slow"`) on two workers; files under 1 s are not listed (their tests average 0.02 s). Counting every fast
# test as alike put files of a few long tests (a pipeline run each) last, where one left a worker busy 15 s alone.
FAST_FILE_SECONDS = {
    "tests/faults/test_fault_sweep_preflight.py": (37.0, 62),
    "tests/faults/test_fault_champion.py": (22.9, 23),
    "tests/pipeline/engine/test_pipeline.py": (16.1, 16),
    "tests/crf/test_second_order_crf.py": (15.5, 50),
    "tests/pipeline/apps/test_benchmark.py": (14.8, 7),
    "tests/pipeline/sweeps/test_reg_path.py": (14.1, 3),
    "tests/faults/test_fault_tag_contracts.py": (13.6, 86),
    "tests/faults/test_fault_clusters.py": (12.9, 48),
    "tests/pipeline/models/test_adapters.py": (11.8, 6),
    "tests/crf/test_sklearn.py": (11.4, 38),
    "tests/pipeline/apps/test_tag_command.py": (11.2, 15),
    "tests/faults/test_fault_optuna_study.py": (11.2, 21),
    "tests/faults/test_fault_degenerate.py": (10.8, 6),
    "tests/pipeline/engine/test_cache_keys.py": (10.6, 8),
    "tests/faults/test_fault_pipeline.py": (10.0, 4),
    "tests/pipeline/sweeps/test_optuna_sweeper.py": (9.8, 54),
    "tests/faults/test_fault_tracking.py": (9.8, 22),
    "tests/faults/test_fault_settings.py": (9.4, 58),
    "tests/faults/test_fault_model_files.py": (9.1, 114),
    "tests/pipeline/stages/test_semi_supervised.py": (6.7, 6),
    "tests/faults/test_fault_tag.py": (6.4, 61),
    "tests/pipeline/stages/test_final_fit.py": (6.1, 4),
    "tests/pipeline/engine/test_run_pages.py": (4.5, 5),
    "tests/pipeline/stages/test_evaluate_fields.py": (4.3, 10),
    "tests/faults/test_fault_run_settings.py": (4.2, 24),
    "tests/faults/test_fault_warm_start.py": (4.2, 60),
    "tests/crf/test_hmm.py": (4.0, 23),
    "tests/crf/test_chain.py": (3.4, 53),
    "tests/pipeline/models/test_second_order_pipeline.py": (3.2, 4),
    "tests/crf/test_per_call.py": (3.1, 25),
    "tests/crf/test_bundle.py": (3.0, 19),
    "tests/crf/test_clusters.py": (2.6, 10),
    "tests/pipeline/sweeps/test_grid_preflight.py": (2.5, 5),
    "tests/pipeline/stages/test_ner_datasets.py": (2.3, 4),
    "tests/pipeline/stages/test_clusters_stage.py": (2.3, 6),
    "tests/faults/test_fault_inputs.py": (2.0, 40),
    "tests/test_import_cycles.py": (1.7, 6),
    "tests/pipeline/sweeps/test_launchers.py": (1.6, 3),
    "tests/crf/test_partial_labels.py": (1.5, 9),
    "tests/pipeline/engine/test_run_store.py": (1.3, 4),
    "tests/pipeline/stages/test_active_learning.py": (1.2, 11),
    "tests/pipeline/tracking/test_mlflow_model.py": (1.1, 5),
    "tests/crf/test_pycrfsuite.py": (1.1, 50),
    # files new on main (measured there in one process; test_fault_objective.py's figure includes that process's imports)
    "tests/faults/test_fault_sweep_data.py": (3.6, 4),
    "tests/faults/test_fault_objective.py": (2.3, 19),
    "tests/faults/test_fault_sweep_endings.py": (1.2, 7),
}


def _expected_seconds(item) -> float:
    base = item.nodeid.split("[", 1)[0]
    if base in MEASURED_SECONDS:
        return MEASURED_SECONDS[base]
    if item.get_closest_marker("slow"):
        return 10.0
    seconds, count = FAST_FILE_SECONDS.get(item.nodeid.split("::", 1)[0], (0.05, 1))
    return seconds / count


def pytest_configure(config):
    """Keep the file order of the collection (below) instead of xdist's order by number of tests. The test process
    runs Python's cyclic garbage collector after every 50,000 new objects instead of 700 (see GC_THRESHOLDS)."""
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False
    if os.environ.get("CRF_TEST_GC", "1") != "0":
        gc.set_threshold(*GC_THRESHOLDS)


# A test process holds about 600,000 objects (MLflow, SQLAlchemy, pandas, scikit-learn, Hydra), and its pipeline runs
# allocate many more: at Python's default (700, 10, 10) the young-generation collections took about 0.11 CPU-s of a
# 1.6 CPU-s tiny pipeline run (74 of them), at (50,000, 20, 20) about 0.04 (one). Only when unreachable cycles are
# freed changes, never what a test computes; child processes keep the default. CRF_TEST_GC=0 keeps the default here too.
GC_THRESHOLDS = (50_000, 20, 20)


@pytest.hookimpl(trylast=True)  # after `-m` / `-k` deselected what will not run
def pytest_collection_modifyitems(config, items):
    """On an xdist worker, files longest first (by the estimate above), each file's tests in their order; the
    controller schedules the collection of its workers."""
    if not hasattr(config, "workerinput"):  # (a worker's own `dist` option reads "no")
        return
    seconds: dict[str, float] = {}
    for item in items:
        seconds[item.path] = seconds.get(item.path, 0.0) + _expected_seconds(item)
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-seconds[item.path], position[id(item)]))

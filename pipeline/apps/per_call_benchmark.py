"""Per-call rows of ``python -m pipeline.benchmark``: the paths a user takes one call at a time.

Run in one fresh process (``python -m pipeline.apps.per_call_benchmark SPEC OUT``, started by
:func:`per_call_table`), both tools on **the same CRFsuite model file** (``CRF(model_filename=...)``
writes it; python-crfsuite reads it), medians of ``repetitions`` alternating runs:

- ``Tagger.tag`` once per test sentence (python-crfsuite's API: ``crf.pycrfsuite`` against
  ``pycrfsuite``), ``predict_single`` once per sentence and ``predict`` on the whole test set
  (sklearn-crfsuite's API: ``crf.CRF`` against ``sklearn_crfsuite.CRF``), on the sklearn-crfsuite
  tutorial's ``word2features`` dicts;
- one long sequence (``long_sentences`` training sentences joined) against the same tokens as
  sentences, on this project's side: training seconds at a fixed iteration count, and tagging;
- ``algorithm="l2sgd"`` for ``sgd_epochs`` epochs on both sides: seconds and final loss;
- second-order tagging over candidate labels, and chunk confidence (``predict_segments``), against first order's
  on the same test set (this project);
- the compiled kernels' first call in a fresh process (Numba's import and cache load, or
  compilation when no cache exists) and Numba's installed size;
- with ``served``: a tagger bundle (the feature config's extractor, the same training sentences
  and iterations) logged as the pipeline's MLflow Model (:func:`pipeline.tracking.log_bundle_model`,
  into a throw-away SQLite store), served by ``mlflow models serve`` on 127.0.0.1, and
  ``served_requests`` one-sentence requests (test sentences in turn, each a ``dataframe_split``
  long frame, JSON encoding and decoding and a new HTTP connection included) after
  ``served_warmup`` untimed ones: p50 and p99 latency in milliseconds, next to the same
  sentences through the loaded model's ``predict`` in this process (the server's overhead is the
  difference). Latencies have no CRFsuite anchor.

The ratio column is "speed of ours over CRFsuite" for the API rows, and "cost of the long/SGD/
order-2 path over its anchor" for the others (see ``goal``).
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)


def _median_pair(first, second, repetitions: int, warm: bool = False) -> tuple[float, float, object, object]:
    """Median seconds of ``first()`` and ``second()`` run alternately, and their last results;
    with ``warm`` each runs once untimed first (loads, first-call compilation)."""
    a, b = [], []
    out_a = out_b = None
    if warm:
        first(), second()
    for rep in range(repetitions):
        for which in (0, 1) if rep % 2 == 0 else (1, 0):
            began = time.perf_counter()
            if which == 0:
                out_a = first()
                a.append(time.perf_counter() - began)
            else:
                out_b = second()
                b.append(time.perf_counter() - began)
    return statistics.median(a), statistics.median(b), out_a, out_b


def _package_mib(name: str) -> float:
    """Installed size (MiB) of a distribution's files, NaN if it is not installed."""
    from importlib import metadata

    try:
        files = metadata.distribution(name).files or []
    except metadata.PackageNotFoundError:
        return float("nan")
    return sum(f.locate().stat().st_size for f in files if f.locate().is_file()) / 2**20


def _warm_up_seconds() -> float:
    """Seconds of the compiled Viterbi's first call in a fresh process (import of Numba, cache load)."""
    code = (
        "import time, numpy as np; from crf import _compiled; t = time.perf_counter(); "
        "_compiled.viterbi(np.zeros((3, 2)), np.zeros((2, 2)), np.zeros(2), np.zeros(2), np.array([0, 3])); "
        "print(time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def served_latency(spec: dict, data, train: list, test: list) -> dict[str, float]:
    """p50/p99 milliseconds of one-sentence requests to the served model, and of the same calls
    in process (``served_*`` and ``pyfunc_*``); see the module docstring."""
    import mlflow
    import numpy as np

    from crf import CRF
    from crf.bundle import ModelBundle
    from crf.model import BundledCRF
    from pipeline import tracking
    from pipeline.apps.model_benchmark import long_frame, post_frame, served
    from pipeline.stages.featurize import build_extractor

    extractor = build_extractor(spec["features"], data.columns)
    model = CRF(c1=0.1, c2=0.1, max_iterations=int(spec["iterations"]))
    model.fit(extractor.fit_transform(train), [[row[data.label_index] for row in s] for s in train])
    bundle = ModelBundle(BundledCRF(extractor, model), scheme=data.scheme)
    inputs = [data.columns.index(c) for c in bundle.input_columns]
    frames = [long_frame({c: [[row[i] for row in s]] for c, i in zip(bundle.input_columns, inputs)}) for s in test]
    warmup, requests = int(spec["served_warmup"]), int(spec["served_requests"])
    order = [frames[k % len(frames)] for k in range(warmup + requests)]

    def latencies(call) -> np.ndarray:
        seconds = []
        for k, frame in enumerate(order):
            began = time.perf_counter()
            answer = call(frame)
            if k >= warmup:
                seconds.append(time.perf_counter() - began)
            if len(answer) != len(frame):
                raise RuntimeError(f"the model answered {len(answer)} rows for a sentence of {len(frame)} tokens")
        return np.array(seconds) * 1e3

    previous = mlflow.get_tracking_uri()
    with tempfile.TemporaryDirectory() as folder:
        bundle_path = Path(folder) / "bundle.npz"
        bundle.save(bundle_path)
        mlflow.set_tracking_uri(f"sqlite:///{Path(folder) / 'mlflow.db'}")
        try:
            # not the caller's experiment (MLFLOW_EXPERIMENT_ID); its artifacts in the temporary folder, not ./mlruns
            experiment = mlflow.create_experiment("per-call-served-model", (Path(folder) / "artifacts").as_uri())
            with mlflow.start_run(experiment_id=experiment, run_name="per-call-served-model"):
                uri = tracking.log_bundle_model(bundle_path, lambda columns: frames[0])
            loaded = mlflow.pyfunc.load_model(uri)
            in_process = latencies(loaded.predict)
            with served(uri, float(spec["serve_timeout"])) as url:
                over_http = latencies(lambda frame: post_frame(url, frame))
        finally:
            mlflow.set_tracking_uri(previous)
    out = {}
    for name, values in (("served", over_http), ("pyfunc", in_process)):
        out[f"{name}_p50"], out[f"{name}_p99"] = (float(np.percentile(values, q)) for q in (50, 99))
    return out


def measure(spec: dict) -> list[dict]:
    """The per-call rows (list of dicts: path, crfsuite, ours, ratio, unit, goal)."""
    import pycrfsuite
    import sklearn_crfsuite

    import crf.pycrfsuite as ours_api
    from crf import CRF
    from pipeline.apps.bench_worker import sentence_dicts
    from pipeline.stages.data import load_dataset

    reps = int(spec["repetitions"])
    data = load_dataset(spec["dataset"], spec["data_root"], download=False, carve_dev=False)
    train = data.splits["train"][: int(spec["train_sentences"])]
    test = data.splits["test"]
    label = data.label_index
    y_train = [[row[label] for row in s] for s in train]
    x_train, x_test = sentence_dicts(train, data.columns, data.label), sentence_dicts(test, data.columns, data.label)
    rows: list[dict] = []
    nan = float("nan")

    def row(path, crfsuite, ours, ratio, unit, goal):
        rows.append({"path": path, "crfsuite": crfsuite, "ours": ours, "ratio": ratio, "unit": unit, "goal": goal})
        log.info("%s: CRFsuite %s, ours %s, ratio %.2f (%s)", path, crfsuite, ours, ratio, goal)

    warm = _warm_up_seconds()
    row("compiled kernels: first call in a fresh process", float("nan"), warm, float("nan"), "s", "stated")
    size = _package_mib("numba") + _package_mib("llvmlite")
    row("numba + llvmlite installed size", float("nan"), size, float("nan"), "MiB", "stated")

    with tempfile.TemporaryDirectory() as folder:
        model_path = str(Path(folder) / "model.crfsuite")
        CRF(c1=0.1, c2=0.1, max_iterations=int(spec["iterations"]), model_filename=model_path).fit(x_train, y_train)
        theirs_tagger, our_tagger = pycrfsuite.Tagger(), ours_api.Tagger()
        theirs_tagger.open(model_path)
        our_tagger.open(model_path)
        a, b, ra, rb = _median_pair(
            lambda: [theirs_tagger.tag(x) for x in x_test], lambda: [our_tagger.tag(x) for x in x_test], reps, warm=True
        )
        assert ra == rb, "Tagger.tag: the two tools disagree"
        row("python-crfsuite API: Tagger.tag once per sentence", a, b, a / b, "s", "speed >= 1.5x")
        theirs, ours = sklearn_crfsuite.CRF(model_filename=model_path), CRF(model_filename=model_path)
        a, b, ra, rb = _median_pair(
            lambda: [theirs.predict_single(x) for x in x_test], lambda: [ours.predict_single(x) for x in x_test], reps, warm=True
        )
        assert ra == rb, "predict_single: the two tools disagree"
        row("sklearn-crfsuite API: predict_single once per sentence", a, b, a / b, "s", "speed >= 1.5x")
        a, b, _, _ = _median_pair(lambda: theirs.predict(x_test), lambda: ours.predict(x_test), reps, warm=True)
        row("sklearn-crfsuite API: predict on the test set of dicts", a, b, a / b, "s", "speed >= 2x")

    # one long sequence against the same tokens as sentences (this project, training and tagging)
    n_long = int(spec["long_sentences"])
    x_long, y_long = [[t for s in x_train[:n_long] for t in s]], [[y for s in y_train[:n_long] for y in s]]

    def fit(X, y):
        return CRF(c1=0.1, c2=0.1, max_iterations=int(spec["long_iterations"]), n_threads=1).fit(X, y)

    a, b, model, _ = _median_pair(lambda: fit(x_train[:n_long], y_train[:n_long]), lambda: fit(x_long, y_long), reps)
    row(f"one {len(x_long[0])}-token sequence vs {n_long} sentences: training", a, b, b / a, "s", "cost <= 2x")
    a, b, _, _ = _median_pair(lambda: model.predict(x_train[:n_long]), lambda: model.predict(x_long), reps, warm=True)
    row(f"one {len(x_long[0])}-token sequence vs {n_long} sentences: tagging", a, b, b / a, "s", "cost <= 2x")

    # l2sgd at the same epochs: seconds (ours include reading the dicts) and final loss
    epochs = int(spec["sgd_epochs"])

    def their_sgd():
        trainer = pycrfsuite.Trainer(verbose=False)
        for x, y in zip(x_train, y_train):
            trainer.append(x, y)
        trainer.select("l2sgd")
        trainer.set_params({"c2": 0.1, "max_iterations": epochs})
        with tempfile.TemporaryDirectory() as folder:
            trainer.train(str(Path(folder) / "sgd.crfsuite"))
        return trainer.logparser.last_iteration["loss"]

    def our_sgd():
        return CRF(algorithm="l2sgd", c2=0.1, max_iterations=epochs).fit(x_train, y_train).training_log_.last_iteration["loss"]

    a, b, loss_a, loss_b = _median_pair(their_sgd, our_sgd, reps)
    row(f"l2sgd, {epochs} epochs on {len(x_train)} sentences", a, b, b / a, "s", "time <= 2x")
    row("l2sgd final loss", loss_a, loss_b, loss_b / loss_a, "loss", "within 1%")

    # second order over candidate labels against first order, tagging the test set (this project)
    first = CRF(c1=0.1, c2=0.1, max_iterations=int(spec["iterations"])).fit(x_train, y_train)
    second = CRF(c1=0.1, c2=0.1, max_iterations=int(spec["iterations"]), order=2, candidate_threshold=spec["candidate_threshold"])
    second.fit(x_train, y_train)
    a, b, _, _ = _median_pair(lambda: first.predict(x_test), lambda: second.predict(x_test), reps, warm=True)
    row("order 2 over candidate labels vs order 1: tagging the test set", a, b, b / a, "s", "cost <= 2x")
    a, b, _, _ = _median_pair(lambda: first.predict_segments(x_test), lambda: second.predict_segments(x_test), reps, warm=True)
    row(
        "order 2 over candidate labels vs order 1: chunk confidence (predict_segments) on the test set",
        a,
        b,
        b / a,
        "s",
        "cost <= 2x",
    )

    if spec.get("served"):
        latency = served_latency(spec, data, train, test)
        for q in ("p50", "p99"):
            row(
                f"served model (mlflow models serve): one-sentence request, {q}",
                nan,
                latency[f"served_{q}"],
                nan,
                "ms",
                "reported",
            )
            row(
                f"the same model's predict in process: one sentence, {q}",
                nan,
                latency[f"pyfunc_{q}"],
                nan,
                "ms",
                "reported",
            )
    return rows


def per_call_table(spec: dict) -> pd.DataFrame:
    """:func:`measure` in a fresh process (its own warm-up and memory), as a table."""
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder) / "spec.json", Path(folder) / "out.json"
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, "-m", "pipeline.apps.per_call_benchmark", str(spec_path), str(out_path)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"per-call benchmark failed:\n{done.stderr[-4000:]}")
        return pd.DataFrame(json.loads(out_path.read_text()))


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(measure(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

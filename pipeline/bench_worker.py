"""One benchmark measurement in a fresh process: ``python -m pipeline.bench_worker SPEC OUT``.

SPEC is a JSON file: tool (``ours`` or ``crfsuite``), dataset config, data root, features config,
training fraction and seed, c1, c2, stopping rule, feature set (``sparse`` or ``dense``), tagging
repeats. OUT receives the figures as JSON. Running each measurement in its own process makes the
peak-memory figure that tool's alone.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from crf import CRF, metrics
from pipeline.data import load_dataset, subset
from pipeline.featurize import build_extractor


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(spec: dict) -> dict:
    data = load_dataset(spec["dataset"], spec["data_root"], download=False, carve_dev=False)
    train = subset(data.splits["train"], float(spec.get("train_fraction", 1.0)), int(spec.get("seed", 0)))
    test = data.splits["test"]
    label = data.label_index
    y_train = [[row[label] for row in s] for s in train]
    y_test = data.labels("test")
    tool = spec["tool"]
    dense = spec.get("feature_set", "sparse") == "dense"
    result: dict = {
        "tool": tool,
        "train_sentences": len(train),
        "train_tokens": sum(map(len, train)),
        "test_tokens": sum(map(len, test)),
        "labels": len(set(l for s in y_train for l in s)),
    }

    began = time.perf_counter()
    extractor = build_extractor(spec["features"], data.columns)
    X_train = extractor.fit_transform(train)
    X_test = extractor.transform(test)
    if tool == "crfsuite":
        x_train = extractor.attribute_lists(X_train)
        x_test = extractor.attribute_lists(X_test)
    result["feature_seconds"] = time.perf_counter() - began
    result["attributes"] = extractor.n_attributes

    if tool == "ours":
        model = CRF(
            c1=spec["c1"],
            c2=spec["c2"],
            max_iterations=spec.get("max_iterations"),
            epsilon=spec["epsilon"],
            period=spec["period"],
            delta=spec["delta"],
            num_memories=spec["num_memories"],
            all_possible_states=dense,
        )
        began = time.perf_counter()
        model.fit(X_train, y_train)
        result["train_seconds"] = time.perf_counter() - began
        result["iterations"] = model.n_iter_
        result["evaluations"] = model.n_evaluations_
        L = len(model.classes_)
        state = model.feature_index_.size if model.feature_index_ is not None else model.state_weights_.size
        result["features"] = int(state + L * L)
        elapsed = [0.0] + [entry["elapsed"] for entry in model.training_log_]
        result["iteration_seconds"] = float(np.median(np.diff(elapsed)))
        tag = lambda: model.predict(X_test)  # noqa: E731
    elif tool == "crfsuite":
        import pycrfsuite

        trainer = pycrfsuite.Trainer(verbose=False)
        began = time.perf_counter()
        for xseq, yseq in zip(x_train, y_train):
            trainer.append(pycrfsuite.ItemSequence(xseq), yseq)
        result["load_seconds"] = time.perf_counter() - began
        params = {
            "c1": spec["c1"],
            "c2": spec["c2"],
            "epsilon": spec["epsilon"],
            "period": spec["period"],
            "delta": spec["delta"],
            "num_memories": spec["num_memories"],
            "feature.possible_states": dense,
            "feature.possible_transitions": True,
        }
        if spec.get("max_iterations"):
            params["max_iterations"] = spec["max_iterations"]
        trainer.set_params(params)
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder) / "model.crfsuite")
            began = time.perf_counter()
            trainer.train(path)
            result["train_seconds"] = time.perf_counter() - began
            tagger = pycrfsuite.Tagger()
            tagger.open(path)
        result["iterations"] = len(trainer.logparser.iterations)
        result["evaluations"] = None
        result["features"] = trainer.logparser.featgen_num_features
        result["iteration_seconds"] = float(np.median([it["time"] for it in trainer.logparser.iterations]))
        items = [pycrfsuite.ItemSequence(xseq) for xseq in x_test]
        tag = lambda: [tagger.tag(item) for item in items]  # noqa: E731
    else:
        raise ValueError(f"unknown tool {tool!r}")
    result["seconds_per_iteration"] = result["train_seconds"] / max(result["iterations"], 1)

    times = []
    for _ in range(int(spec.get("tag_repeats", 5))):
        began = time.perf_counter()
        predicted = tag()
        times.append(time.perf_counter() - began)
    result["tag_seconds"] = float(np.median(times))
    result["tag_tokens_per_second"] = result["test_tokens"] / result["tag_seconds"]
    predicted = [list(p) for p in predicted]
    result["token_accuracy"] = metrics.token_accuracy(y_test, predicted)
    result["chunk_f1"] = metrics.chunk_scores(y_test, predicted).f1 if data.scheme != "none" else None
    result["peak_memory_mib"] = _peak_mib()
    return result


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    result = measure(spec)
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""One benchmark measurement in a fresh process: ``python -m pipeline.bench_worker SPEC OUT``.

SPEC is a JSON file: tool (``ours``: ``crf.CRF``; ``crfsuite``: CRFsuite through python-crfsuite;
``ours_pycrfsuite``: this project through python-crfsuite's API, ``crf.pycrfsuite``), input path
(``batch``, ``strings`` or ``dicts``), dataset config, data root, features config, training
fraction, seed and repeat count, joint label columns, c1, c2, stopping rule, feature set
(``sparse`` or ``dense``), whether every label pair is a transition feature, start/end weights on
our side (CRFsuite has none), tagging repeats.
OUT receives the figures as JSON. Running each measurement in its own process makes the
peak-memory figure that tool's alone.

Input paths (what is timed as training and tagging):

- ``batch``: this project's side gets the extractor's CSR batches (``CRF.fit(batch)``); CRFsuite
  gets the same attributes as strings through ``Trainer.append`` (timed apart as ``load_seconds``).
- ``strings``: every token a list of attribute strings (the feature config's attributes, as
  ``FeatureExtractor.attribute_lists`` names them); ``CRF.fit(lists, y)`` (attribute index
  included) against ``Trainer.append`` + ``train``, ``CRF.predict(lists)`` against
  ``Tagger.tag`` over the same lists.
- ``dicts``: every token a dict, the sklearn-crfsuite tutorial's ``word2features`` shape
  (:func:`word2features`), timed like ``strings``.

Times are wall seconds; ``*_cpu_seconds`` are CPU seconds of the process (all threads), the
steadier figure on a shared machine.
"""

from __future__ import annotations

import gc
import importlib
import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psutil

from crf import CRF, metrics
from pipeline.stages.data import load_dataset, subset
from pipeline.stages.featurize import build_extractor

INPUTS = ("batch", "strings", "dicts")
TOOLS = ("ours", "crfsuite", "ours_pycrfsuite")  # ours_pycrfsuite: python-crfsuite's API over this project
SENTENCES_PER_BATCH = 1000  # sentences converted to attribute lists at a time (bounds the temporary CSR batches)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_mib() -> float:
    """Current resident set size (MiB)."""
    return psutil.Process().memory_info().rss / 2**20


class _Clock:
    """Wall (``perf_counter``) and CPU (``process_time``, all threads) seconds since creation."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def word2features(sentence: Sequence[Sequence[str]], i: int, word: int = 0, pos: int | None = 1) -> dict:
    """Features of token ``i`` of ``sentence`` (rows of columns) in the sklearn-crfsuite tutorial's
    ``word2features`` shape: bias, the lower-cased word, its last 3 and 2 characters, is-upper,
    is-title, is-digit, the POS tag and its first 2 characters; the same (no suffixes, no is-digit)
    of the previous and next token under ``-1:`` and ``+1:``, or ``BOS``/``EOS`` at the ends.
    ``word``/``pos`` are column positions; ``pos=None`` leaves the POS keys out (data without tags)."""
    w = sentence[i][word]
    features = {
        "bias": 1.0,
        "word.lower()": w.lower(),
        "word[-3:]": w[-3:],
        "word[-2:]": w[-2:],
        "word.isupper()": w.isupper(),
        "word.istitle()": w.istitle(),
        "word.isdigit()": w.isdigit(),
    }
    if pos is not None:
        features["postag"] = sentence[i][pos]
        features["postag[:2]"] = sentence[i][pos][:2]
    for offset, prefix, end in ((-1, "-1:", "BOS"), (1, "+1:", "EOS")):
        j = i + offset
        if not 0 <= j < len(sentence):
            features[end] = True
            continue
        other = sentence[j][word]
        features[prefix + "word.lower()"] = other.lower()
        features[prefix + "word.istitle()"] = other.istitle()
        features[prefix + "word.isupper()"] = other.isupper()
        if pos is not None:
            features[prefix + "postag"] = sentence[j][pos]
            features[prefix + "postag[:2]"] = sentence[j][pos][:2]
    return features


def sentence_dicts(sentences: list, columns: Sequence[str], label: str) -> list[list[dict]]:
    """Every sentence as a list of :func:`word2features` dicts. The word is column ``w``; the POS
    tag is column ``pos`` (CoNLL-2000), else ``upos`` or ``xpos`` when it is not the label, else none."""
    pos = next((columns.index(c) for c in ("pos", "upos", "xpos") if c in columns and c != label), None)
    word = columns.index("w")
    return [[word2features(s, i, word, pos) for i in range(len(s))] for s in sentences]


def attribute_strings(extractor, sentences: list) -> list[list[list[str]]]:
    """Every sentence as lists of attribute strings (plain ``str``), ``SENTENCES_PER_BATCH`` sentences at a time."""
    names = extractor.attribute_names().astype(object)
    out: list[list[list[str]]] = []
    for start in range(0, len(sentences), SENTENCES_PER_BATCH):
        batch = extractor.transform(sentences[start : start + SENTENCES_PER_BATCH])
        X = batch.X
        tokens = [names[X.indices[X.indptr[t] : X.indptr[t + 1]]].tolist() for t in range(X.shape[0])]
        out.extend(tokens[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:]))
    return out


def joint_labels(data, columns: Sequence[str]) -> None:
    """Replace the label of every token, in place, by the given columns joined with ``|``
    (``[xpos, upos]``: ``NN|NOUN``)."""
    where = [data.columns.index(c) for c in columns]
    label = data.label_index
    for sentences in data.splits.values():
        for s in sentences:
            for t, row in enumerate(s):
                row = list(row)
                row[label] = "|".join(row[i] for i in where)
                s[t] = tuple(row)


def measure(spec: dict) -> dict:
    data = load_dataset(spec["dataset"], spec["data_root"], download=False, carve_dev=False)
    if spec.get("joint_label"):
        joint_labels(data, spec["joint_label"])
    train = subset(data.splits["train"], float(spec.get("train_fraction", 1.0)), int(spec.get("seed", 0)))
    train = train * int(spec.get("train_repeat", 1))
    test = data.splits["test"]
    label = data.label_index
    y_train = [[row[label] for row in s] for s in train]
    y_test = data.labels("test")
    tool = spec["tool"]
    path = spec.get("input", "batch")
    if path not in INPUTS:
        raise ValueError(f"unknown benchmark input {path!r}; one of {INPUTS}")
    dense = spec.get("feature_set", "sparse") == "dense"
    result: dict = {
        "tool": tool,
        "input": path,
        "train_sentences": len(train),
        "train_tokens": sum(map(len, train)),
        "test_tokens": sum(map(len, test)),
        "labels": len(set(l for s in y_train for l in s)),
    }

    began = time.perf_counter()
    if path == "dicts":
        x_train, x_test = sentence_dicts(train, data.columns, data.label), sentence_dicts(test, data.columns, data.label)
        result["attributes"] = None
    else:
        extractor = build_extractor(spec["features"], data.columns)
        if path == "strings":
            extractor.fit(train)
            x_train, x_test = attribute_strings(extractor, train), attribute_strings(extractor, test)
        else:
            X_train = extractor.fit_transform(train)
            X_test = extractor.transform(test)
            if tool == "crfsuite":
                x_train = extractor.attribute_lists(X_train)
                x_test = extractor.attribute_lists(X_test)
        result["attributes"] = extractor.n_attributes
    if path != "batch":  # the model's input is the lists: the tool's work is timed from here
        X_train, X_test = x_train, x_test
    result["feature_seconds"] = time.perf_counter() - began
    gc.collect()
    result["input_rss_mib"] = _rss_mib()

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
            all_possible_transitions=bool(spec.get("all_possible_transitions", True)),
            boundary_transitions=spec.get("boundary_transitions", False),
            callback=lambda info: stamps.append(time.process_time()),
        )
        stamps: list[float] = []  # CPU clock at the end of every iteration
        clock = _Clock()
        stamps.append(clock.cpu)
        model.fit(X_train, y_train)
        result["train_seconds"], result["train_cpu_seconds"] = clock.read()
        result["attributes"] = model.n_attributes_
        result["iterations"] = model.n_iter_
        result["evaluations"] = model.n_evaluations_
        L = len(model.classes_)
        state = model.feature_index_.size if model.feature_index_ is not None else model.state_weights_.size
        result["features"] = int(state + L * L)
        elapsed = [0.0] + [entry["elapsed"] for entry in model.training_log_]
        result["iteration_wall_seconds"] = float(np.median(np.diff(elapsed)))
        # CRFsuite's iteration log times with clock() (CPU of the process): compare like with like
        result["iteration_seconds"] = float(np.median(np.diff(stamps)))
        result["loss"] = model.training_log_[-1]["loss"] if model.training_log_ else None
        result["active_features"] = model.n_active_features_
        tag = lambda: model.predict(X_test)  # noqa: E731
    elif tool in ("crfsuite", "ours_pycrfsuite"):
        # CRFsuite through python-crfsuite, or this project through the same API (crf.pycrfsuite)
        pycrfsuite = importlib.import_module("pycrfsuite" if tool == "crfsuite" else "crf.pycrfsuite")

        trainer = pycrfsuite.Trainer(verbose=False)
        clock = _Clock()
        for xseq, yseq in zip(x_train, y_train):
            trainer.append(xseq, yseq)
        result["load_seconds"], load_cpu = clock.read()
        params = {
            "c1": spec["c1"],
            "c2": spec["c2"],
            "epsilon": spec["epsilon"],
            "period": spec["period"],
            "delta": spec["delta"],
            "num_memories": spec["num_memories"],
            "feature.possible_states": dense,
            "feature.possible_transitions": bool(spec.get("all_possible_transitions", True)),
        }
        if spec.get("max_iterations"):
            params["max_iterations"] = spec["max_iterations"]
        trainer.set_params(params)
        with tempfile.TemporaryDirectory() as folder:
            model_path = str(Path(folder) / "model.crfsuite")
            clock = _Clock()
            trainer.train(model_path)
            result["train_seconds"], result["train_cpu_seconds"] = clock.read()
            tagger = pycrfsuite.Tagger()
            tagger.open(model_path)
        if path != "batch":  # append is part of training from lists
            result["train_seconds"] += result["load_seconds"]
            result["train_cpu_seconds"] += load_cpu
        result["iterations"] = len(trainer.logparser.iterations)
        result["evaluations"] = None
        result["features"] = trainer.logparser.featgen_num_features
        result["iteration_seconds"] = float(np.median([it["time"] for it in trainer.logparser.iterations]))  # clock(): CPU
        result["iteration_wall_seconds"] = None
        last = trainer.logparser.last_iteration
        result["loss"], result["active_features"] = last.get("loss"), last.get("active_features")
        # batch: items prepared once (tagging alone); lists: Tagger.tag reads the lists, as a user's call does
        items = [pycrfsuite.ItemSequence(xseq) for xseq in x_test] if path == "batch" else x_test
        tag = lambda: [tagger.tag(item) for item in items]  # noqa: E731
    else:
        raise ValueError(f"unknown tool {tool!r}: one of {', '.join(TOOLS)}")
    result["seconds_per_iteration"] = result["train_seconds"] / max(result["iterations"], 1)

    times = []
    for _ in range(int(spec.get("tag_repeats", 5))):
        clock = _Clock()
        predicted = tag()
        times.append(clock.read())
    result["tag_seconds"] = float(np.median([wall for wall, _ in times]))
    result["tag_cpu_seconds"] = float(np.median([cpu for _, cpu in times]))
    result["tag_tokens_per_second"] = result["test_tokens"] / result["tag_seconds"]
    result["tag_tokens_per_cpu_second"] = result["test_tokens"] / max(result["tag_cpu_seconds"], 1e-9)
    predicted = [list(p) for p in predicted]
    result["token_accuracy"] = metrics.token_accuracy(y_test, predicted)
    if data.scheme != "none":
        scores = metrics.chunk_scores(y_test, predicted)
        result["chunk_f1"] = scores.f1
        result["field_f1"] = {str(k): float(v) for k, v in scores.per_type["f1"].items()}
    else:
        result["chunk_f1"], result["field_f1"] = None, None
    result["peak_memory_mib"] = _peak_mib()
    return result


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    result = measure(spec)
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

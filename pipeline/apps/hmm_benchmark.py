"""The HMM baseline against NLTK's TnT: ``python -m pipeline.hmm_benchmark``
(config ``conf/hmm_benchmark.yaml``).

Both taggers are trained on the dataset's training split and tag its test split, with and
without TnT's capitalisation option, alternating which goes first in each repetition. Reported
per tagger and option: accuracy on all, known and unknown words (percent), median training
seconds and median tagging tokens per second, and the ratios ours/NLTK; logged to the console and to
MLflow (``hmm_benchmark.csv``, ``hmm_benchmark.md``). NLTK is a reference only (``pip install
-e ".[dev]"``).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from omegaconf import DictConfig, ListConfig, OmegaConf

from crf import HMM
from pipeline import tracking
from pipeline.engine.validate import check_hmm_observation, non_whole_number
from pipeline.report import markdown_table
from pipeline.stages.data import load_dataset

log = logging.getLogger(__name__)


def _ours(X, y, X_test, capitalization: bool):
    began = time.perf_counter()
    model = HMM(order=2, capitalization=capitalization).fit(X, y)
    trained = time.perf_counter() - began
    began = time.perf_counter()
    predicted = model.predict(X_test)
    return trained, time.perf_counter() - began, [t for s in predicted for t in s]


def _nltk(X, y, X_test, capitalization: bool):
    from nltk.tag.tnt import TnT

    began = time.perf_counter()
    model = TnT(C=capitalization)
    model.train([list(zip(w, t)) for w, t in zip(X, y)])
    trained = time.perf_counter() - began
    began = time.perf_counter()
    predicted = model.tagdata(X_test)
    return trained, time.perf_counter() - began, [t for s in predicted for _, t in s]


def check_settings(cfg: DictConfig) -> None:
    """Refuse (ValueError naming the setting) a repetition count below 1, an observation that is no
    column of the dataset (or its label), and capitalisation options that are not true or false."""
    problem = non_whole_number(cfg, {"hmm_benchmark.repetitions": 1})
    if problem:
        raise ValueError(problem)
    check_hmm_observation(cfg, "hmm_benchmark.observation")
    options = OmegaConf.select(cfg, "hmm_benchmark.capitalization", default=None)
    if not isinstance(options, ListConfig) or not options or not all(isinstance(o, bool) for o in options):
        raise ValueError(f"hmm_benchmark.capitalization={options!r}: a list of true and false")


def main(cfg: DictConfig) -> None:
    settings = cfg.hmm_benchmark
    data = load_dataset(OmegaConf.to_container(cfg.dataset, resolve=True), cfg.data.root, download=cfg.data.download)
    X, y = data.column("train", settings.observation), data.labels("train")
    X_test, y_test = data.column("test", settings.observation), data.labels("test")
    gold = np.array([t for s in y_test for t in s], dtype=object)
    vocabulary = pd.Index(pd.unique(pd.Series([w for s in X for w in s], dtype=object)))
    known = vocabulary.get_indexer(pd.Series([w for s in X_test for w in s], dtype=object)) >= 0
    tools = {"ours": _ours, "nltk_tnt": _nltk}
    runs = []
    for repetition in range(int(settings.repetitions)):
        for capitalization in settings.capitalization:
            order = list(tools) if repetition % 2 == 0 else list(tools)[::-1]
            for tool in order:
                train_seconds, tag_seconds, predicted = tools[tool](X, y, X_test, bool(capitalization))
                correct = np.array(predicted, dtype=object) == gold
                runs.append(
                    {
                        "tool": tool,
                        "capitalization": bool(capitalization),
                        "repetition": repetition,
                        "accuracy": 100 * correct.mean(),
                        "known_accuracy": 100 * correct[known].mean(),
                        "unknown_accuracy": 100 * correct[~known].mean(),
                        "train_seconds": train_seconds,
                        "tag_tokens_per_second": gold.size / tag_seconds,
                    }
                )
                log.info("%s", runs[-1])
    frame = pd.DataFrame(runs)
    table = (
        frame.groupby(["capitalization", "tool"], sort=False).median(numeric_only=True).drop(columns="repetition").reset_index()
    )
    ratios = []
    for capitalization, part in table.groupby("capitalization", sort=False):
        ours, theirs = part[part.tool == "ours"].iloc[0], part[part.tool == "nltk_tnt"].iloc[0]
        ratios.append(
            {
                "capitalization": capitalization,
                "tool": "ours / nltk_tnt",
                **{c: ours[c] / theirs[c] for c in ("train_seconds", "tag_tokens_per_second")},
                **{c: ours[c] - theirs[c] for c in ("accuracy", "known_accuracy", "unknown_accuracy")},
            }
        )
    table = pd.concat([table, pd.DataFrame(ratios)], ignore_index=True)
    text = (
        f"HMM (TnT recipe) against NLTK TnT, {cfg.dataset.name}, {len(X):,} training sentences, "
        f"{gold.size:,} test tokens ({100 * (~known).mean():.2f}% unknown), medians of {int(settings.repetitions)} "
        "repetitions; last rows: accuracy differences (points) and time ratios\n\n" + markdown_table(table) + "\n"
    )
    log.info("\n%s", text)
    tracking.setup(cfg)
    with mlflow.start_run(
        run_name=f"hmm-benchmark-{cfg.dataset.name}",
        tags={"stage": "hmm_benchmark", "dataset": cfg.dataset.name, **tracking.source_tags()},
    ):
        tracking.log_params(tracking.flatten(OmegaConf.to_container(cfg, resolve=True)))
        for row in table.itertuples():
            prefix = f"{row.tool.replace(' / ', '_over_')}_{'cap' if row.capitalization else 'nocap'}"
            mlflow.log_metrics(
                {
                    f"{prefix}_{c}": float(getattr(row, c))
                    for c in ("accuracy", "known_accuracy", "unknown_accuracy", "train_seconds", "tag_tokens_per_second")
                }
            )
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            table.to_csv(folder / "hmm_benchmark.csv", index=False)
            frame.to_csv(folder / "hmm_benchmark_runs.csv", index=False)
            (folder / "hmm_benchmark.md").write_text(text)
            for path in folder.iterdir():
                mlflow.log_artifact(str(path))

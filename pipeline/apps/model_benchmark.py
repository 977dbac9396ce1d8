"""How fast a logged tagger answers on the paths its users take:
``python -m pipeline.model_benchmark model_benchmark.model=<runs:/...|models:/...>`` (config
``conf/model_benchmark.yaml``).

The dataset's test split is turned into the pyfunc model's long DataFrame (one row per token: a
``sentence`` id and the model's input columns) and tagged

- ``pyfunc``: ``mlflow.pyfunc.load_model(model).predict(frame)``, the model's own input checks
  (``pipeline/tracking/mlflow_model.py``; models logged before them also MLflow's input-schema check) and
  our DataFrame handling included;
- ``served`` (``served=true``): the same frame posted as ``dataframe_split`` JSON to
  ``mlflow models serve --env-manager local`` on 127.0.0.1, JSON encoding and decoding included.

Each path runs ``repetitions`` times after one warm-up call; reported are the median wall
seconds, tokens per wall second, tokens per CPU second of this process (for ``served``, the
server works in another process, so only wall time counts) and the score of the predictions
against the gold labels (chunk F1 for chunk schemes, else token accuracy), next to the
``test_f1``/``test_accuracy`` the model's pipeline run logged when there is one: the two must be
equal, and the benchmark fails (after logging its table) when they are not. Logged to the
console and to MLflow (``model_benchmark.csv``, ``model_benchmark.md``, tag ``same_as_logged``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf

from crf import metrics
from pipeline import tracking
from pipeline.engine.validate import non_switch, non_whole_number
from pipeline.report import markdown_table
from pipeline.stages.data import load_dataset
from pipeline.tracking.mlflow_model import SENTENCE

log = logging.getLogger(__name__)

# requests to the server on 127.0.0.1 never go through an HTTP proxy from the environment
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def long_frame(columns: dict[str, list[list[str]]]) -> pd.DataFrame:
    """Sentences given column by column (name -> sentences of strings) -> the long frame: one row
    per token, ``sentence`` (0, 1, ...) then the columns in the given order."""
    first = next(iter(columns.values()))
    lengths = [len(s) for s in first]
    frame = pd.DataFrame({name: [v for s in sentences for v in s] for name, sentences in columns.items()})
    frame.insert(0, SENTENCE, np.repeat(np.arange(len(lengths), dtype=np.int64), lengths))
    return frame


def _score(gold: list[list[str]], labels: list[str], chunked: bool) -> float:
    offsets = np.cumsum([0] + [len(s) for s in gold])
    predicted = [labels[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    return metrics.chunk_scores(gold, predicted).f1 if chunked else metrics.token_accuracy(gold, predicted)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the tests' servers use it too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(model_uri: str, timeout: float) -> Iterator[str]:
    """``mlflow models serve`` of ``model_uri`` on a free 127.0.0.1 port from this environment; its
    ``/invocations`` URL once ``/ping`` answers. The server's process group is stopped afterwards."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(), "MLFLOW_DISABLE_TELEMETRY": "true"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(OSError):
                    with LOCAL.open(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                        if response.status == 200:
                            break
                if process.poll() is not None or time.monotonic() > deadline:
                    output.seek(0)
                    why = (
                        f"exited with code {process.returncode}"
                        if process.poll() is not None
                        else f"did not answer in {timeout:.0f} s"
                    )
                    raise RuntimeError(f"mlflow models serve {why}:\n{output.read()[-3000:]}")
                time.sleep(0.5)
            yield f"http://127.0.0.1:{port}/invocations"
        finally:
            with contextlib.suppress(ProcessLookupError):  # the server may have exited already
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def post_frame(url: str, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a ``dataframe_split`` request to ``url``; the answer's predictions as a frame."""
    body = json.dumps({"dataframe_split": frame.to_dict(orient="split", index=False)}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with LOCAL.open(request, timeout=600) as response:
        return pd.DataFrame(json.loads(response.read())["predictions"])


def _measure(call: Callable[[], pd.DataFrame], repetitions: int) -> tuple[list[float], list[float], pd.DataFrame]:
    """Wall and CPU seconds of ``repetitions`` calls after one warm-up call; the last answer."""
    answer = call()
    walls, cpus = [], []
    for _ in range(repetitions):
        wall, cpu = time.perf_counter(), time.process_time()
        answer = call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus, answer


def _logged_score(model_uri: str, chunked: bool) -> float:
    """The test score the pipeline run behind ``model_uri`` logged (its parent run's metric), or NaN."""
    from mlflow.tracking import MlflowClient

    run_id = mlflow.models.get_model_info(model_uri).run_id
    if run_id is None:
        return float("nan")
    client = MlflowClient()
    run = client.get_run(run_id)
    parent = run.data.tags.get("mlflow.parentRunId")
    runs = [run] + ([client.get_run(parent)] if parent else [])
    name = "test_f1" if chunked else "test_accuracy"
    for candidate in runs:
        if name in candidate.data.metrics:
            return float(candidate.data.metrics[name])
    return float("nan")


def check_settings(cfg: DictConfig) -> None:
    """Refuse (ValueError naming the setting) a missing model, a count below 1 and a switch that is
    not true or false."""
    if not cfg.model_benchmark.model:
        raise ValueError("model_benchmark.model: say which model to measure (runs:/<run id>/model or models:/<name>@champion)")
    problem = non_whole_number(cfg, {"model_benchmark.repetitions": 1, "model_benchmark.serve_timeout": 1}) or non_switch(
        cfg, ("model_benchmark.served", "data.download")
    )  # "no" would read as true
    if problem:
        raise ValueError(problem)


def main(cfg: DictConfig) -> None:
    check_settings(cfg)
    settings = cfg.model_benchmark
    tracking.setup(cfg)
    model_uri = str(settings.model)
    began = time.perf_counter()
    try:
        model = mlflow.pyfunc.load_model(model_uri)
    except (MlflowException, OSError) as error:  # no such model, run or alias: one line, as a bad setting
        log.error("bad setting model_benchmark.model=%s: %s", model_uri, " ".join(str(error).split())[:300])
        sys.exit(2)
    load_seconds = time.perf_counter() - began
    bundle = model.unwrap_python_model().bundle
    chunked = bundle.scheme != "none"
    data = load_dataset(OmegaConf.to_container(cfg.dataset, resolve=True), cfg.data.root, download=cfg.data.download)
    gold = data.labels("test")
    frame = long_frame({name: data.column("test", name) for name in bundle.input_columns})
    tokens = len(frame)
    logged = _logged_score(model_uri, chunked)
    paths: dict[str, Callable[[], pd.DataFrame]] = {"pyfunc": lambda: model.predict(frame)}
    with contextlib.ExitStack() as stack:
        if settings.served:
            url = stack.enter_context(served(model_uri, float(settings.serve_timeout)))
            paths["served"] = lambda: post_frame(url, frame)
        rows = []
        for path, call in paths.items():
            walls, cpus, answer = _measure(call, int(settings.repetitions))
            wall, cpu = float(np.median(walls)), float(np.median(cpus))
            score = _score(gold, answer["label"].tolist(), chunked)
            rows.append(
                {
                    "path": path,
                    "tokens": tokens,
                    "wall_seconds": wall,
                    "tokens_per_second": tokens / wall,
                    "tokens_per_cpu_second": tokens / cpu if path == "pyfunc" and cpu > 0 else float("nan"),
                    "score": score,
                    "logged_score": logged,
                    "same_as_logged": bool(score == logged) if np.isfinite(logged) else None,
                }
            )
            log.info("%s", rows[-1])
    table = pd.DataFrame(rows)
    text = (
        f"Model {model_uri} on the {cfg.dataset.name} test split ({tokens:,} tokens, {len(gold):,} sentences), "
        f"median of {int(settings.repetitions)} calls after a warm-up; load {load_seconds:.2f} s; score = "
        f"{'chunk F1' if chunked else 'token accuracy'} (percent)\n\n" + markdown_table(table) + "\n"
    )
    log.info("\n%s", text)
    with mlflow.start_run(
        run_name=f"model-benchmark-{cfg.dataset.name}",
        tags={"stage": "model_benchmark", "dataset": cfg.dataset.name, "model_uri": model_uri, **tracking.source_tags()},
    ):
        tracking.log_params(tracking.flatten(OmegaConf.to_container(cfg, resolve=True)))
        mlflow.log_metric("load_seconds", load_seconds)
        for row in rows:
            mlflow.log_metrics(
                {f"{row['path']}_{k}": float(row[k]) for k in ("tokens_per_second", "tokens_per_cpu_second", "score")}
            )
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            table.to_csv(folder / "model_benchmark.csv", index=False)
            (folder / "model_benchmark.md").write_text(text)
            for path in folder.iterdir():
                mlflow.log_artifact(str(path))
        mismatched = [row["path"] for row in rows if row["same_as_logged"] is False]
        mlflow.set_tag("same_as_logged", "unknown" if not np.isfinite(logged) else str(not mismatched).lower())
    if mismatched:
        raise RuntimeError(
            f"the predictions through {', '.join(mismatched)} do not reproduce the score the model's run logged ({logged!r}): "
            f"is dataset={cfg.dataset.name} the model's dataset?"
        )

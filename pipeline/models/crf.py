"""The linear-chain CRF (``crf.CRF``) as a pipeline model.

Training reads the prepare and featurize folders and writes ``model.npz`` (see ``CRF.save``),
``bundle.npz`` (the model with its fitted features, labels, scheme and input columns: a
:class:`crf.ModelBundle`),
``history.csv`` (one row per iteration: loss, gradient norm, active features, elapsed seconds,
and dev accuracy/F1 every ``dev_every`` iterations) and ``learning_curve.png``. Each iteration
is logged (with an estimate of the time left) and sent as step metrics to the tracking run.
Config slice: ``model`` (``all_possible_states``, ``order``, ``candidate_threshold`` at order 2),
``trainer`` (without ``threads``) and ``seed``; settings: ``threads`` and ``dev_every``. A
second-order model over candidate labels also reports its candidate model's iterations and the first-order marginal mass
left out per training token.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from crf import CRF, IterationInfo, ModelBundle, metrics, parameter_applies
from crf.model import BundledCRF
from pipeline.engine.validate import SettingsError, section, unknown_keys, where
from pipeline.models import BUNDLE_FILE, METRICS_FILE, WARM_START_INPUT, BaseAdapter, bundle_source, default_threads
from pipeline.report import figure, log_scale, save_figure
from pipeline.stages.featurize import load_batch, load_extractor

log = logging.getLogger(__name__)

RUNTIME_KEYS = ("threads",)  # trainer keys that cannot change the model: settings, not hashed


# keys of the model and trainer sections that are not CRF parameters: the adapter, the config's own
# helpers (the swept strength, elastic net's ratio) and run-time settings
CONFIG_ONLY = ("name", "adapter", "strength", "l2_ratio", "threads")
# a train metric: 1 when the fit stopped at trainer.max_iterations rather than by its stopping rule
STOPPED_AT_CAP = "stopped_at_max_iterations"


def _first_order_full(model: Mapping) -> dict:
    """The ``model`` section without ``candidate_threshold`` at order 1: the config's threshold (a
    dataset's, for order 2) restricts second-order models only, and a first-order model has nothing
    to restrict (nor a different cache key)."""
    model = dict(model)
    if model.get("order", 1) == 1:
        model.pop("candidate_threshold", None)
    return model


def estimator_params(model: Mapping, trainer: Mapping) -> dict:
    """The CRF parameters of the ``model`` and ``trainer`` sections (``model`` wins); ValueError
    naming a key that is neither a parameter nor one of :data:`CONFIG_ONLY`. At ``order`` 1 the
    ``candidate_threshold`` is left out (see :func:`_first_order_full`)."""
    merged = {**dict(trainer), **_first_order_full(model)}
    known = set(CRF().get_params())
    unknown = sorted(k for k in merged if k not in known and k not in CONFIG_ONLY)
    if unknown:
        raise ValueError(f"{unknown[0]} is not a setting of the CRF (its parameters: {', '.join(sorted(known))})")
    return {k: v for k, v in merged.items() if k in known and v is not None}


def build_model(model: Mapping, trainer: Mapping, seed: int, dev_every: int, threads: int | None) -> CRF:
    """A CRF from the ``model`` and ``trainer`` config sections (see :func:`estimator_params`)."""
    return CRF(random_state=seed, dev_every=dev_every, n_threads=threads, **estimator_params(model, trainer))


def remaining_seconds(history: list[dict], max_iterations: int | None, period: int, delta: float) -> float | None:
    """Estimated seconds left: by the iteration cap when set, else by extrapolating the decay of
    the relative improvement over ``period`` down to ``delta`` (CRFsuite's stopping rule)."""
    if not history:
        return None
    per_iteration = history[-1]["elapsed"] / len(history)
    left = None
    if len(history) > period + 3 and delta > 0:
        losses = np.array([h["loss"] for h in history])
        improvement = (losses[:-period] - losses[period:]) / np.abs(losses[period:])
        recent = improvement[-min(len(improvement), 20) :]
        if np.all(recent > 0):
            slope, intercept = np.polyfit(np.arange(recent.size), np.log(recent), 1)
            if slope < 0:
                left = max(0.0, (math.log(delta) - (intercept + slope * (recent.size - 1))) / slope)
    if max_iterations:
        cap = max_iterations - len(history)
        left = cap if left is None else min(left, cap)
    return None if left is None else left * per_iteration


class Progress:
    """Per-iteration log line and step metrics (handed to ``log_steps`` in batches); the dev scores,
    every ``dev_every`` iterations, also to ``report_dev`` (an Optuna trial's reporter, which may
    stop the training by raising: the step metrics so far are logged before it is asked)."""

    def __init__(self, model: CRF, gold_dev, scheme: str, log_steps, log_every: int = 10, report_dev=None) -> None:
        self.model = model
        self.report_dev = report_dev
        self.gold_dev = gold_dev
        self.scheme = scheme
        self.log_steps = log_steps
        self.settings = model.validate_params()  # stopping rule with the algorithm's defaults
        self.history: list[dict] = []
        self.pending: list[tuple[int, dict]] = []
        self.log_every = log_every

    def __call__(self, info: IterationInfo) -> None:
        row = {
            "iteration": info.iteration,
            "loss": info.loss,
            "gradient_norm": info.gradient_norm,
            "active_features": info.active_features,
            "elapsed": info.elapsed,
        }
        if hasattr(info, "dev_predictions"):
            row["dev_accuracy"] = info.dev_accuracy  # the model's, against the same gold labels
            if self.scheme != "none":
                row["dev_f1"] = metrics.chunk_scores(self.gold_dev, info.dev_predictions).f1
        self.history.append(row)
        self.pending.append((info.iteration, {k: float(v) for k, v in row.items() if k != "iteration" and np.isfinite(v)}))
        if len(self.pending) >= self.log_every:
            self.flush()
        settings = self.settings  # the stopping rule with the algorithm's defaults filled in
        left = remaining_seconds(self.history, settings.max_iterations, settings.period, settings.delta)
        eta = "?" if left is None else f"~{left:.0f}s"
        dev = "".join(f" {k}={row[k]:.2f}" for k in ("dev_accuracy", "dev_f1") if k in row)
        log.info(
            "iter %4d  loss %14.4f  |g| %10s  active %8d  %7.1fs  left %s%s",
            info.iteration,
            info.loss,
            f"{info.gradient_norm:.4g}" if np.isfinite(info.gradient_norm) else "-",  # SGD computes none
            info.active_features,
            info.elapsed,
            eta,
            dev,
        )
        scores = {k: row[k] for k in ("dev_accuracy", "dev_f1") if k in row}
        if self.report_dev is not None and scores:
            self.flush()
            self.report_dev(info.iteration, scores)

    def flush(self) -> None:
        if self.pending:
            self.log_steps(self.pending)
        self.pending = []


def plot_learning_curve(history: pd.DataFrame, path: Path) -> None:
    """Loss (and dev score) against iterations; an empty history (training stopped at its start,
    e.g. one label only) gives an empty plot that says so."""
    fig, (ax,) = figure(6.5, 4)
    if not len(history):
        ax.text(0.5, 0.5, "no iterations: the starting weights were already optimal", ha="center", va="center")
        save_figure(fig, path)
        return
    ax.plot(history["iteration"], history["loss"], color="tab:blue")
    ax.set_xlabel("iteration")
    ax.set_ylabel("regularised loss", color="tab:blue")
    log_scale(ax, "y")
    dev_columns = [c for c in ("dev_f1", "dev_accuracy") if c in history]
    if dev_columns:
        other = ax.twinx()
        column = dev_columns[0]
        points = history.dropna(subset=[column])
        other.plot(points["iteration"], points[column], "o-", color="tab:orange")
        other.set_ylabel(column, color="tab:orange")
    save_figure(fig, path)


# the settings that decide which weights a CRF has (beside the data)
LAYOUT_PARAMS = (
    "min_freq",
    "all_possible_states",
    "all_possible_transitions",
    "boundary_transitions",
    "order",
    "candidate_threshold",
)


def _layout_value(model: CRF, name: str):
    """``model``'s parameter ``name`` as it shapes the weights (boundary_transitions=None means
    whatever the CRF resolves it to)."""
    return model.validate_params().boundary if name == "boundary_transitions" else model.get_params()[name]


def warm_started(path: Path, model: CRF) -> CRF:
    """The fitted CRF saved at ``path`` with ``model``'s parameters and ``warm_start=True``: its
    next ``fit`` starts from the saved weights (same features: the same featurize output)."""
    fitted = CRF.load(path)
    fitted.set_params(**{**model.get_params(), "warm_start": True})
    log.info("warm start from %s", path)
    return fitted


class CRFAdapter(BaseAdapter):
    name = "crf"
    warm_starts = True
    upstream = ("prepare", "featurize")
    artifacts = ("model.npz", BUNDLE_FILE, "history.csv", "learning_curve.png")
    volatile = ("history.csv",)  # the iterations' times
    metrics = (
        "train_seconds", "model_bytes", "iterations", "evaluations", "nonzero_weights", STOPPED_AT_CAP, "final_loss",
        "candidate_model_iterations", "excluded_mass_per_token",
    )  # fmt: skip

    def known_keys(self, section: str) -> frozenset[str]:
        return frozenset(CRF().get_params()) | frozenset(CONFIG_ONLY) if section in ("model", "trainer") else frozenset()

    def validate(self, cfg) -> None:
        """Every CRF setting as the estimator checks it (``CRF.validate_params``), and no key the
        CRF does not have (a misspelt one would be ignored)."""
        model, trainer = section(cfg, "model"), section(cfg, "trainer")
        unknown_keys("trainer", trainer, self.known_keys("trainer"))
        unknown_keys("model", model, self.known_keys("model"))
        try:
            estimator = build_model(model, trainer, seed=0, dev_every=int(cfg.train.dev_every), threads=trainer.get("threads"))
            estimator.validate_params()
        except ValueError as error:
            raise SettingsError(where(str(error), {"trainer": trainer, "model": model})) from None

    def config_slice(self, cfg) -> dict:
        trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
        return {
            "model": _first_order_full(OmegaConf.to_container(cfg.model, resolve=True)),
            "trainer": {k: v for k, v in trainer.items() if k not in RUNTIME_KEYS},
            "seed": cfg.seed,
        }

    def settings(self, cfg) -> dict:
        return {"threads": default_threads(cfg.trainer.get("threads")), "dev_every": int(cfg.train.dev_every)}

    def trainer_tag(self, cfg) -> str:
        return str(cfg.trainer.name)

    def can_warm_start(self, cfg) -> bool:
        """Whether the configured trainer starts from given weights (L-BFGS and SGD do; the
        online trainers, ap, pa and arow, do not)."""
        return parameter_applies("warm_start", str(cfg.trainer.algorithm))

    def warm_start_problem(self, cfg, folder: Path) -> str | None:
        """Why the CRF saved in ``folder`` is no starting point for ``cfg``'s fit, or None: it was
        trained by another algorithm (SGD stops where its start and its epochs take it, so from
        L-BFGS's weights it would report L-BFGS's optimum), or it has another model layout
        (:data:`LAYOUT_PARAMS`: a warm start would merge the two layouts), it cannot be read, or its
        fit stopped at ``trainer.max_iterations`` (SGD's epochs too): a warm start reaches the same
        optimum in fewer iterations only from an optimum, and from a capped fit the new fit would
        carry that fit's training on, to a model that neither setting gives from zero."""
        wanted = build_model(section(cfg, "model"), section(cfg, "trainer"), seed=0, dev_every=0, threads=None)
        try:
            saved = CRF.load(folder / "model.npz")
        except (OSError, ValueError) as error:  # ModelFileError is a ValueError
            return f"its model cannot be read: {error}"
        for name in ("algorithm", *LAYOUT_PARAMS):
            there, here = _layout_value(saved, name), _layout_value(wanted, name)
            if there != here:
                return f"{name} {there!r} there, {here!r} here"
        try:
            capped = json.loads((folder / METRICS_FILE).read_text()).get(STOPPED_AT_CAP)
        except (OSError, ValueError) as error:
            return f"its training record cannot be read: {error}"
        if capped is None:
            return f"its training record does not say whether it converged (no {STOPPED_AT_CAP})"
        if capped:  # a fit from it would carry that training on, not start near an optimum
            return "it stopped at its iteration cap (trainer.max_iterations), short of its optimum"
        return None

    def fit(self, context, data) -> dict:
        config, settings, inputs, out = context.config, context.settings, context.inputs, context.out
        extractor = load_extractor(inputs["featurize"] / "extractor.npz")
        X_train = load_batch(inputs["featurize"], "train")
        X_dev = load_batch(inputs["featurize"], "dev") if data.splits["dev"] else None  # data.final_fit=train+dev: none
        model = build_model(
            OmegaConf.to_container(config.model),
            OmegaConf.to_container(config.trainer),
            int(config.seed),
            int(settings.dev_every),
            settings.threads,
        )
        start = context.inputs.get(WARM_START_INPUT)
        if start is not None:  # a regularisation path's previous point: its weights are the starting point
            model = warm_started(start / "model.npz", model)
        progress = Progress(model, data.labels("dev"), data.scheme, context.log_steps, report_dev=context.report_dev)
        model.callback = progress
        began = time.perf_counter()
        y_dev = data.labels("dev") if X_dev is not None else None
        model.fit(X_train, data.labels("train"), X_dev, y_dev, attribute_names=extractor.attribute_names())
        if len(model.classes_) == 1:
            log.warning("the training data has one label only (%r): the model predicts it everywhere", model.classes_[0])
        seconds = time.perf_counter() - began
        progress.flush()
        model.callback = None
        model.save(out / "model.npz")
        source = bundle_source(data, OmegaConf.to_container(config), features=extractor.config())
        ModelBundle(BundledCRF(extractor, model), scheme=data.scheme, source=source).save(out / BUNDLE_FILE)
        history = pd.DataFrame(progress.history, columns=None if progress.history else ["iteration", "loss"])
        history.to_csv(out / "history.csv", index=False)
        plot_learning_curve(history, out / "learning_curve.png")
        log.info("%d iterations in %.1fs, stopped by %s", model.n_iter_, seconds, model.stop_reason_)
        candidate_choice = {}
        if model.candidate_model_ is not None:  # the candidate lattice: its size and the first-order mass it leaves out
            tokens = max(1, X_train.X.shape[0])
            candidate_choice = {
                "candidate_model_iterations": model.candidate_model_.n_iter_,
                "excluded_mass_per_token": model.excluded_mass_ / tokens,
            }
        return {
            "train_seconds": seconds,
            "model_bytes": (out / "model.npz").stat().st_size,
            "iterations": model.n_iter_,
            "evaluations": model.n_evaluations_,
            "nonzero_weights": model.n_active_features_,
            STOPPED_AT_CAP: float(model.stop_reason_ == "max_iterations"),
            **({"final_loss": float(history["loss"].iloc[-1])} if len(history) else {}),
            **candidate_choice,
        }

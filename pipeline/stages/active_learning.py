"""Pool-based active learning with a CRF, simulated: the training split is the pool and its gold
labels are the annotator.

A run starts from a seeded set of fully labelled sentences and repeats rounds: fit the model
(warm-started from the last round's weights), score it on dev and test, rank the sentences left
in the pool by a query strategy, and have the annotator label the top ones until the round's
budget of tokens is spent. Cost is counted in tokens asked of the annotator.

Strategies (each ranks the pool by one figure of :class:`crf.Uncertainty`, most
uncertain first): ``random``; ``least_confidence`` (1 - p(best path)); ``margin`` (the smallest
difference between the two best paths first); ``token_entropy`` (the sum of the tokens' marginal
entropies, Settles and Craven's total token entropy); ``nbest_entropy`` (the entropy of the N best
paths). With ``partial`` set, only the tokens of a selected sentence whose predicted label has a
marginal below ``threshold`` are asked (Tomanek and Hahn's semi-supervised selection); the others
stay unknown (``partial=unknown``: the model is trained on the known labels with the others
summed out) or take the model's label (``partial=model``: self-training).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from crf import Uncertainty
from pipeline.engine.stage import BaseStage, StageContext
from pipeline.models import ModelAdapter, default_threads
from pipeline.report import figure, save_figure

log = logging.getLogger(__name__)

STRATEGIES = ("random", "least_confidence", "margin", "token_entropy", "nbest_entropy")
# the uncertainty figure each strategy ranks by (crf._uncertainty.FIGURES)
FIGURE_OF = {
    "least_confidence": "best_probability",
    "margin": "margin",
    "token_entropy": "token_entropy",
    "nbest_entropy": "nbest_entropy",
}
PARTIAL_MODES = (None, "unknown", "model")


def priority(strategy: str, figures: Uncertainty | None, n: int, rng: np.random.Generator) -> np.ndarray:
    """A score per pool sentence (n,), higher = asked first."""
    if strategy == "random":
        return rng.random(n)
    if figures is None:
        raise ValueError(f"strategy {strategy!r} needs the model's uncertainty figures")
    if strategy == "least_confidence":
        return 1.0 - figures.best_probability
    if strategy == "margin":
        return -figures.margin
    if strategy == "token_entropy":
        return figures.total_token_entropy
    if strategy == "nbest_entropy":
        return figures.nbest_entropy
    raise ValueError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")


def take_by_tokens(order: np.ndarray, costs: np.ndarray, budget: int) -> np.ndarray:
    """The first entries of ``order`` (sentence positions, best first) whose ``costs`` (tokens
    each would cost, by position) add up to ``budget``: every sentence while the sum stays below
    it, and the one that reaches it. At least one when there is any."""
    if not order.size:
        return order
    spent = np.cumsum(costs[order])
    count = int(np.searchsorted(spent, budget, side="left")) + 1
    return order[: min(count, order.size)]


@dataclass
class Annotation:
    """The labels obtained so far: per training sentence a list of labels, None where nothing is
    known (not selected, or a token not asked in partial mode); and what they cost."""

    labels: list[list | None]  # None: the sentence is still in the pool
    asked_tokens: int = 0
    asked_sentences: int = 0
    model_tokens: int = 0  # labels taken from the model (partial=model), not asked

    @classmethod
    def empty(cls, n_sentences: int) -> Annotation:
        return cls([None] * n_sentences)

    @property
    def pool(self) -> np.ndarray:
        return np.array([i for i, labels in enumerate(self.labels) if labels is None], dtype=np.int64)

    @property
    def chosen(self) -> np.ndarray:
        return np.array([i for i, labels in enumerate(self.labels) if labels is not None], dtype=np.int64)

    def ask(self, sentence: int, gold: list) -> None:
        """The annotator labels every token of ``sentence``."""
        self.labels[sentence] = list(gold)
        self.asked_tokens += len(gold)
        self.asked_sentences += 1

    def ask_some(self, sentence: int, gold: list, asked: np.ndarray, guess: list | None) -> None:
        """The annotator labels the tokens ``asked`` (bool (n,)); the others keep ``guess`` (the
        model's labels) or stay unknown (``guess`` None)."""
        self.labels[sentence] = [gold[t] if asked[t] else (guess[t] if guess is not None else None) for t in range(len(gold))]
        self.asked_tokens += int(asked.sum())
        self.model_tokens += 0 if guess is None else int((~asked).sum())
        self.asked_sentences += int(asked.any())  # a sentence the annotator was shown


@dataclass
class Round:
    """One round's figures: the step metrics of the run."""

    round: int
    labelled_tokens: int  # tokens the annotator was asked (the seed set included)
    labelled_sentences: int
    dev_score: float
    test_score: float
    refit_seconds: float
    query_seconds: float
    iterations: int
    extra: dict = field(default_factory=dict)


def area_under_curve(tokens: np.ndarray, scores: np.ndarray, budget: float | None = None) -> float:
    """The mean score over the labelled-token axis: the trapezoid area under ``scores`` against
    ``tokens`` from the first point to ``budget`` (default: the last point), divided by that
    width. The curve is held at its last score beyond its last point."""
    tokens, scores = np.asarray(tokens, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    if tokens.size == 0:
        return float("nan")
    order = np.argsort(tokens, kind="stable")
    tokens, scores = tokens[order], scores[order]
    end = float(tokens[-1] if budget is None else budget)
    if end <= tokens[0]:
        return float(scores[0])
    inside = tokens < end
    x = np.concatenate([tokens[inside], [end]])
    y = np.concatenate([scores[inside], [np.interp(end, tokens, scores)]])
    return float(np.trapezoid(y, x) / (end - x[0]))


def tokens_to_reach(tokens: np.ndarray, scores: np.ndarray, target: float) -> float:
    """The fewest labelled tokens at which the curve reaches ``target`` (NaN if it never does)."""
    tokens, scores = np.asarray(tokens, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    order = np.argsort(tokens, kind="stable")
    reached = np.flatnonzero(scores[order] >= target)
    return float(tokens[order][reached[0]]) if reached.size else float("nan")


@dataclass
class Settings:
    """How a simulation runs (the ``active_learning`` config section)."""

    strategy: str = "least_confidence"
    seed: int = 0
    initial_fraction: float = 0.01  # of the training sentences, labelled before the first round
    batch_tokens: int = 1000  # tokens asked per round
    rounds: int = 20  # rounds after the initial fit (0: the initial fit only)
    token_budget: int | None = None  # stop once this many tokens were asked (None: rounds decide)
    partial: str | None = None  # None: whole sentences; unknown / model: see the module docstring
    threshold: float = 0.99  # partial: tokens whose predicted label has a marginal below this are asked
    n_best: int = 5  # paths in the N-best entropy
    arm: str = ""  # the experiment arm's name, for the logs (see ARMS)

    def __post_init__(self) -> None:
        for name in ("seed", "batch_tokens", "rounds", "n_best"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"active_learning.{name}={value!r}: an integer")
        if self.seed < 0:  # NumPy's generators take none
            raise ValueError(f"active_learning.seed={self.seed!r}: a whole number >= 0")
        for name in ("initial_fraction", "threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"active_learning.{name}={value!r}: a number")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"active_learning.strategy={self.strategy!r}: one of {', '.join(STRATEGIES)}")
        if self.partial not in PARTIAL_MODES:
            raise ValueError(f"active_learning.partial={self.partial!r}: one of null, unknown, model")
        if not 0 < self.initial_fraction <= 1:
            raise ValueError(f"active_learning.initial_fraction={self.initial_fraction!r}: a fraction in (0, 1]")
        if self.batch_tokens < 1 or self.rounds < 0 or self.n_best < 1:
            raise ValueError("active_learning: batch_tokens and n_best must be at least 1, rounds at least 0")
        budget = self.token_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"active_learning.token_budget={budget!r}: a whole number >= 1, or null")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"active_learning.threshold={self.threshold!r}: a probability in (0, 1]")

    @property
    def name(self) -> str:
        """The arm, or ``least_confidence, partial: unknown``: what the run does."""
        return self.arm or self.strategy + (f", partial: {self.partial}" if self.partial else "")


def initial_sentences(n_sentences: int, fraction: float, seed: int) -> np.ndarray:
    """The seeded starting set: ``ceil(fraction * n)`` sentences (at least one), sorted."""
    count = max(1, int(np.ceil(fraction * n_sentences)))
    return np.sort(np.random.default_rng(seed).permutation(n_sentences)[:count])


@dataclass
class RunState:
    """Where a simulation stands after a finished round: enough to go on after a kill."""

    annotation: Annotation
    rounds: list[Round]
    model: object  # the fitted crf.CRF of the last round


def _label_lists(annotation: Annotation, chosen: np.ndarray) -> list[list]:
    return [annotation.labels[i] for i in chosen]


def _query(model, pool_batch, pool: np.ndarray, settings: Settings, rng: np.random.Generator) -> np.ndarray:
    """The pool's sentences ranked by the strategy (positions into ``pool``), most wanted first."""
    figures = None
    if settings.strategy != "random":
        wanted = FIGURE_OF[settings.strategy]
        figures = model.uncertainty(pool_batch.subset(pool), n_best=settings.n_best, figures=(wanted,))
    return np.argsort(-priority(settings.strategy, figures, pool.size, rng), kind="stable")


def _annotate(model, pool_batch, annotation: Annotation, gold: list[list], pool: np.ndarray, order: np.ndarray,
              budget: int, settings: Settings) -> None:  # fmt: skip
    """The annotator labels the pool's sentences in ``order`` (positions into ``pool``) until
    ``budget`` tokens were asked: every token of each, or in partial mode the tokens whose
    predicted label's marginal is below the threshold (the cost is those tokens only, so the
    marginals are worked out a block of candidates at a time, as far as the budget goes)."""
    lengths = np.diff(pool_batch.offsets)
    if settings.partial is None:
        for sentence in pool[take_by_tokens(order, lengths[pool], budget)]:
            annotation.ask(int(sentence), gold[sentence])
        return
    classes = np.array(model.classes_, dtype=object)
    spent, position = 0, 0
    while spent < budget and position < order.size:
        block = pool[order[position : position + 256]]
        position += block.size
        part = pool_batch.subset(block)
        codes, _ = model.predict_codes(part)
        marginals, _ = model.marginals(part)
        for k, sentence in enumerate(block):
            predicted = codes[k]
            rows = slice(int(part.offsets[k]), int(part.offsets[k + 1]))
            asked = marginals[rows][np.arange(predicted.size), predicted] < settings.threshold
            guess = classes[predicted].tolist() if settings.partial == "model" else None
            annotation.ask_some(int(sentence), gold[sentence], asked, guess)
            spent += int(asked.sum())
            if spent >= budget:
                break


def simulate(pool_batch, gold: list[list], make_model, evaluate, settings: Settings, state: RunState | None = None,
             save_state=None, on_round=None) -> list[Round]:  # fmt: skip
    """Run (or, from ``state``, go on with) one simulation; returns every round's figures.

    ``pool_batch``: the training split's attribute batch (N sentences); ``gold``: its labels;
    ``make_model()``: a fresh ``crf.CRF`` with ``warm_start=True``; ``evaluate(model)``: its
    (dev score, test score); ``save_state(state)`` after every finished round; ``on_round(round)``
    to report it. Random draws are seeded by ``settings.seed``, the strategy and the round, so a
    resumed run makes the choices the uninterrupted one would have made."""
    n = len(gold)
    if state is None:
        annotation = Annotation.empty(n)
        for sentence in initial_sentences(n, settings.initial_fraction, settings.seed):
            annotation.ask(int(sentence), gold[sentence])
        state = RunState(annotation, [], make_model())
    annotation, model = state.annotation, state.model
    while True:
        number = len(state.rounds)
        query_seconds = 0.0
        if number > 0:
            spent = settings.token_budget is not None and annotation.asked_tokens >= settings.token_budget
            pool = annotation.pool
            if number > settings.rounds or spent or not pool.size:
                break
            began = time.perf_counter()
            rng = np.random.default_rng([settings.seed, STRATEGIES.index(settings.strategy), number])
            order = _query(model, pool_batch, pool, settings, rng)
            budget = settings.batch_tokens
            if settings.token_budget is not None:
                budget = min(budget, settings.token_budget - annotation.asked_tokens)
            _annotate(model, pool_batch, annotation, gold, pool, order, budget, settings)
            query_seconds = time.perf_counter() - began
        chosen = annotation.chosen
        began = time.perf_counter()
        model.fit(pool_batch.subset(chosen), _label_lists(annotation, chosen))
        refit = time.perf_counter() - began
        dev_score, test_score = evaluate(model)
        figures = Round(
            round=number,
            labelled_tokens=annotation.asked_tokens,
            labelled_sentences=annotation.asked_sentences,
            dev_score=dev_score,
            test_score=test_score,
            refit_seconds=refit,
            query_seconds=query_seconds,
            iterations=int(model.n_iter_),
            extra={"model_tokens": annotation.model_tokens},
        )
        state.rounds.append(figures)
        if on_round is not None:
            on_round(figures)
        if save_state is not None:
            save_state(state)
    return state.rounds


# --- the pipeline stage ----------------------------------------------------------------------

ARMS = {  # what an experiment arm runs: (strategy, partial mode); "full": every sentence, once
    **{s: (s, None) for s in STRATEGIES},
    "partial_unknown": ("least_confidence", "unknown"),  # sentences by least confidence, their unsure tokens asked
    "partial_model": ("least_confidence", "model"),
    "full": ("random", None),
}
CURVE_FILE = "curve.csv"


def settings_of(section: dict) -> Settings:
    """:class:`Settings` from the ``active_learning`` config section (its ``arm`` chooses the
    strategy and partial mode; ``full`` labels the whole training split in one step)."""
    section = dict(section)
    arm = section.pop("arm")
    if arm not in ARMS:
        raise ValueError(f"active_learning.arm={arm!r}: one of {', '.join(ARMS)}")
    strategy, partial = ARMS[arm]
    if arm == "full":
        section.update(initial_fraction=1.0, rounds=0, token_budget=None)
    return Settings(strategy=strategy, partial=partial, arm=arm, **section)


class _Checkpoint:
    """A run's state after each finished round, in ``folder`` (outside the cache entry being
    built, which a kill removes). Round k's state (the model, the annotation, the rounds so far)
    is written whole into ``round-<k>/``, and only then does the file ``current`` name it
    (written atomically): a kill during a save leaves the previous round's state current, never a
    mix of two rounds. Older round folders are removed after the switch."""

    CURRENT = "current"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def save(self, state: RunState) -> None:
        from crf.io import atomic_write

        name = f"round-{len(state.rounds) - 1}"
        target = self.folder / name
        shutil.rmtree(target, ignore_errors=True)  # a torn save of this round by a killed run
        target.mkdir(parents=True)
        state.model.save(target / "model.npz")
        annotation = {
            "labels": state.annotation.labels,
            "asked_tokens": state.annotation.asked_tokens,
            "asked_sentences": state.annotation.asked_sentences,
            "model_tokens": state.annotation.model_tokens,
        }
        atomic_write(target / "annotation.json", lambda out: out.write(json.dumps(annotation).encode()))
        frame = rounds_frame(state.rounds)
        atomic_write(target / CURVE_FILE, lambda out: out.write(frame.to_csv(index=False).encode()))
        atomic_write(self.folder / self.CURRENT, lambda out: out.write(name.encode()))
        for old in self.folder.glob("round-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, make_model) -> RunState | None:
        """The state of the last round saved whole, or None when there is none."""
        from crf import CRF

        try:
            source = self.folder / (self.folder / self.CURRENT).read_text().strip()
            annotation = json.loads((source / "annotation.json").read_text())
            frame = pd.read_csv(source / CURVE_FILE)
            loaded = CRF.load(source / "model.npz")
        except (OSError, ValueError):
            return None
        if frame.empty or int(frame["labelled_tokens"].iloc[-1]) != int(annotation["asked_tokens"]):
            return None  # not one round's state (written by another version): start afresh
        model = loaded.set_params(**make_model().get_params())
        fields = [k for k in Round.__dataclass_fields__ if k != "extra"]
        rounds = [
            Round(**{k: row[k] for k in fields}, extra={k: v for k, v in row.items() if k not in fields})
            for row in frame.to_dict(orient="records")
        ]
        labels = annotation.pop("labels")
        return RunState(Annotation(labels, **annotation), rounds, model)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def rounds_frame(rounds: list[Round]) -> pd.DataFrame:
    rows = []
    for r in rounds:
        row = {k: getattr(r, k) for k in Round.__dataclass_fields__ if k != "extra"}
        rows.append({**row, **r.extra})
    return pd.DataFrame(rows)


# the metrics of :meth:`ActiveLearning.run` (the last round's, and the curve's area and times)
RESULT_METRICS = (
    "labelled_tokens", "labelled_sentences", "dev_score", "test_score", "rounds", "aulc_test", "refit_seconds", "query_seconds",
)  # fmt: skip


class ActiveLearning(BaseStage):
    """One simulated active-learning run (one arm, one seed) of the CRF on the featurized splits."""

    name = "active_learning"  # a CRF experiment whatever model.adapter says: its code is its own module's
    step_metrics = CURVE_FILE

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("prepare", "featurize")

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        return (CURVE_FILE, "learning_curve.png")

    def validate(self, cfg) -> None:
        """The ``active_learning`` section as :class:`Settings` checks it."""
        from pipeline.engine.validate import SettingsError, section, unknown_keys

        values = section(cfg, "active_learning")
        unknown_keys("active_learning", values, set(DEFAULTS) | {"arm"})
        try:
            settings_of({**DEFAULTS, **values})
        except (TypeError, ValueError) as error:
            raise SettingsError(f"bad setting {str(error).splitlines()[0]}") from None

    def volatile(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return (CURVE_FILE,)  # its refit and query seconds

    def metric_names(self, cfg, adapter: ModelAdapter) -> tuple[str, ...]:
        return RESULT_METRICS

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        section = OmegaConf.to_container(cfg.active_learning, resolve=True)
        if section.get("arm") == "full":  # one fit on every sentence: the seed and round settings do not matter
            section = {"arm": "full"}
        trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
        return {
            "active_learning": section,
            "model": OmegaConf.to_container(cfg.model, resolve=True),
            "trainer": {k: v for k, v in trainer.items() if k != "threads"},
        }

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        return {"threads": default_threads(cfg.trainer.get("threads")), "resume_dir": str(Path(cfg.paths.output_dir) / "resume")}

    def run(self, context: StageContext) -> dict:
        from crf import metrics
        from pipeline.models.crf import build_model
        from pipeline.stages.featurize import load_batch
        from pipeline.stages.prepare import read_prepared

        config = context.config
        section = OmegaConf.to_container(config.active_learning)
        settings = settings_of({**DEFAULTS, **section})
        data = read_prepared(context.inputs["prepare"])
        train, dev, test = (load_batch(context.inputs["featurize"], split) for split in ("train", "dev", "test"))
        gold = {split: data.labels(split) for split in ("train", "dev", "test")}
        chunked = data.scheme != "none"

        def make_model():
            model = build_model(OmegaConf.to_container(config.model), OmegaConf.to_container(config.trainer), 0, 0,
                                context.settings.threads)  # fmt: skip
            model.set_params(warm_start=True)
            return model

        def score(model, batch, split: str) -> float:
            predicted = [list(p) for p in model.predict(batch)]
            if chunked:
                return metrics.chunk_scores(gold[split], predicted).f1
            return metrics.token_accuracy(gold[split], predicted)

        checkpoint = _Checkpoint(Path(context.settings.resume_dir) / self.name / context.key)
        single_fit = settings.rounds == 0  # nothing to resume (and the full arm's seeds share one key)
        state = None if single_fit else checkpoint.load(make_model)
        if state is not None:
            log.info("[active_learning] resuming %s after round %d", settings.name, len(state.rounds) - 1)

        def report(figures: Round) -> None:
            log.info(
                "[active_learning] %s round %d: %d tokens (%d sentences), dev %.2f, test %.2f, refit %.1fs, query %.1fs",
                settings.name, figures.round, figures.labelled_tokens, figures.labelled_sentences, figures.dev_score,
                figures.test_score, figures.refit_seconds, figures.query_seconds,
            )  # fmt: skip
            step = {k: float(getattr(figures, k)) for k in ("labelled_tokens", "labelled_sentences", "dev_score", "test_score",
                                                              "refit_seconds", "query_seconds")}  # fmt: skip
            context.log_steps([(figures.round, step)])

        rounds = simulate(
            train,
            gold["train"],
            make_model,
            lambda model: (score(model, dev, "dev"), score(model, test, "test")),
            settings,
            state,
            None if single_fit else checkpoint.save,
            report,
        )
        frame = rounds_frame(rounds).rename(columns={"round": "iteration"})
        frame.to_csv(context.out / CURVE_FILE, index=False)
        plot_curves({settings.name: [frame]}, context.out / "learning_curve.png", "test_score", chunked)
        if not single_fit:
            checkpoint.remove()
        last = rounds[-1]
        return {
            "labelled_tokens": last.labelled_tokens,
            "labelled_sentences": last.labelled_sentences,
            "dev_score": last.dev_score,
            "test_score": last.test_score,
            "rounds": len(rounds) - 1,
            "aulc_test": area_under_curve(frame["labelled_tokens"], frame["test_score"]),
            "refit_seconds": float(frame["refit_seconds"].sum()),
            "query_seconds": float(frame["query_seconds"].sum()),
        }


DEFAULTS = {k: v.default for k, v in Settings.__dataclass_fields__.items() if k not in ("strategy", "partial", "arm")}


def plot_curves(curves: dict[str, list[pd.DataFrame]], path: Path, score: str, chunked: bool) -> None:
    """Score against labelled tokens per arm: the mean over its runs (seeds) on a common token
    grid, with the range of the runs shaded."""
    fig, (ax,) = figure(7, 4.5)
    for name, frames in sorted(curves.items()):
        grid, values = _on_grid(frames, score)
        if grid.size == 1:
            ax.axhline(values.mean(), color="black", ls="--", lw=1, label=name)
            continue
        ax.plot(grid, values.mean(axis=0), label=name)
        if len(frames) > 1:
            ax.fill_between(grid, values.min(axis=0), values.max(axis=0), alpha=0.2)
    ax.set_xlabel("tokens labelled by the annotator")
    ax.set_ylabel(f"test {'chunk F1' if chunked else 'accuracy'} (%)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _on_grid(frames: list[pd.DataFrame], score: str) -> tuple[np.ndarray, np.ndarray]:
    """The runs' curves interpolated on the tokens every run reached: (grid (G,), values (R, G))."""
    low = max(float(f["labelled_tokens"].min()) for f in frames)
    high = min(float(f["labelled_tokens"].max()) for f in frames)
    grid = np.linspace(low, high, 50) if high > low else np.array([low])
    values = np.array([np.interp(grid, f["labelled_tokens"], f[score]) for f in frames])
    return grid, values


STAGE = ActiveLearning()

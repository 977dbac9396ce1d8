"""Learning from unlabelled text, simulated: a seeded ``fraction`` of the training sentences keeps
its labels, the rest of the split is unlabelled text; each arm is trained and scored on the same
split, dev and test (``+experiment=semi_supervised`` runs every fraction and seed; the sweep's
summary, :mod:`pipeline.sweeps.semi_supervised`, compares the arms).

Arms (the names in the metric names ``test_<score>_<arm>``):

- ``hmm``: a supervised add-k HMM over the dataset's HMM observation column (add-k, so that
  Baum-Welch has an update whose objective never decreases);
- ``hmm_em``: that HMM re-estimated by Baum-Welch on the unlabelled sentences, one EM iteration at
  a time; the model kept is the one with the best dev score among the supervised start and every
  iteration (stopped after ``patience`` iterations without a better dev score), so by
  construction it is never below ``hmm`` on dev (Merialdo 1994: EM from a supervised start can
  lower accuracy);
- ``crf``: the supervised CRF on the labelled sentences;
- ``crf_self_training``: rounds that warm-start the CRF on the labelled sentences plus the
  unlabelled ones labelled by the previous model where its marginal is at least ``threshold``
  (the other tokens unknown: partial labels); the round kept is the best on dev (round 0 is
  ``crf``);
- ``crf_clusters``: the supervised CRF with Brown cluster features learned from the whole training
  split's words (labelled and unlabelled) plus the files of ``semi.clusters.pool`` (cached by the
  pool's content, :mod:`pipeline.stages.clusters`), or read from a paths file ``semi.clusters.source``.

Config slice: the ``semi`` section (:data:`DEFAULTS`), the features, the trainer (not its threads),
the CRF model settings and the dataset's HMM observation. Input: the prepare stage's folder.
Output: ``predictions_test.tsv.gz`` (sentence, token, gold and one column per arm, for the paired
tests) and ``semi.json`` (the dev curves of EM and self-training).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from pipeline.engine.stage import BaseStage, StageContext

if TYPE_CHECKING:
    from pipeline.models import ModelAdapter

log = logging.getLogger(__name__)

ARMS = ("hmm", "hmm_em", "crf", "crf_self_training", "crf_clusters")
SUPERVISED = {"hmm_em": "hmm", "crf_self_training": "crf", "crf_clusters": "crf"}  # semi-supervised arm -> its baseline
PREDICTIONS_FILE = "predictions_test.tsv.gz"
DEFAULTS: dict[str, Any] = {
    "fraction": 0.1,  # of the training sentences, labelled; the rest is unlabelled text
    "seed": 0,  # which sentences are labelled
    "arms": list(ARMS),
    "em_iterations": 10,  # Baum-Welch iterations at most
    "em_patience": 2,  # stop after this many iterations without a better dev score
    "hmm_order": 2,
    "hmm_k": 0.1,  # add-k constant of the HMM arms
    "self_training_rounds": 3,
    "self_training_patience": 1,
    "self_training_iterations": 50,  # L-BFGS iterations at most per warm-started refit (null: the trainer's rule)
    "threshold": 0.95,  # a token's label is taken when its marginal is at least this
    "clusters": {},  # clustering settings of crf_clusters (see conf/features/clusters/brown.yaml)
}


def settings_of(section: dict) -> dict[str, Any]:
    """The ``semi`` section with :data:`DEFAULTS` filled in; ValueError naming a bad setting."""
    unknown = sorted(set(section) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"semi: unknown setting(s) {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **section}
    fraction = settings["fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"semi.fraction={fraction!r}: a fraction of the training sentences in (0, 1)")
    bad = sorted(set(settings["arms"]) - set(ARMS))
    if bad or not settings["arms"]:
        raise ValueError(f"semi.arms={settings['arms']!r}: some of {', '.join(ARMS)}")
    if not 0 < float(settings["threshold"]) <= 1:
        raise ValueError(f"semi.threshold={settings['threshold']!r}: in (0, 1]")
    if settings["self_training_iterations"] is not None and (
        not isinstance(settings["self_training_iterations"], int) or settings["self_training_iterations"] < 1
    ):
        raise ValueError(f"semi.self_training_iterations={settings['self_training_iterations']!r}: a whole number >= 1 or null")
    for key in ("em_iterations", "em_patience", "self_training_rounds", "self_training_patience", "hmm_order"):
        if (
            not isinstance(settings[key], int)
            or isinstance(settings[key], bool)
            or settings[key] < (1 if key == "hmm_order" else 0)
        ):
            raise ValueError(f"semi.{key}={settings[key]!r}: a whole number >= {1 if key == 'hmm_order' else 0}")
    if settings["hmm_order"] > 2:
        raise ValueError(f"semi.hmm_order={settings['hmm_order']!r}: 1 or 2 (the HMM's orders)")
    k = settings["hmm_k"]
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 <= k < float("inf"):
        raise ValueError(f"semi.hmm_k={k!r}: a finite add-k constant >= 0")
    seed = settings["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"semi.seed={seed!r}: a whole number >= 0")
    return settings


def labelled_split(n_sentences: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(labelled, unlabelled) sentence indices, both sorted: a seeded ``fraction`` (at least one
    sentence, at most all but one) is labelled."""
    n = min(max(1, int(round(fraction * n_sentences))), n_sentences - 1)
    chosen = np.random.default_rng(seed).permutation(n_sentences)[:n]
    labelled = np.sort(chosen)
    return labelled, np.setdiff1d(np.arange(n_sentences), labelled)


def confident_labels(marginals: np.ndarray, offsets: np.ndarray, classes: Sequence[str], threshold: float) -> list[list]:
    """Per sentence, the most probable label of each token where its marginal is at least
    ``threshold``, else None (unknown).

    Parameters
    ----------
    marginals : (T, L) node marginals, columns in ``classes`` order.
    offsets : (N + 1,) sentence boundaries in the rows.
    classes : (L,) the labels.
    threshold : the least marginal of a label that is taken.
    """
    best = marginals.argmax(axis=1)
    labels = np.asarray(classes, dtype=object)[best]
    labels[marginals[np.arange(best.size), best] < threshold] = None
    return [list(part) for part in np.split(labels, offsets[1:-1])]


def best_by_dev(start: float, steps: Callable[[], Any], limit: int, patience: int) -> tuple[int, list[float], Any]:
    """Run ``steps()`` (each returns (dev score, what to keep)) up to ``limit`` times; stop after
    ``patience`` steps without a better dev score. Returns (index of the best step, 0 = the start;
    the dev scores from the start on; what the best step kept, None for the start)."""
    scores, best, kept, waited = [start], 0, None, 0
    for step in range(1, limit + 1):
        score, keep = steps()
        scores.append(score)
        if score > scores[best]:
            best, kept, waited = step, keep, 0
        else:
            waited += 1
            if waited > patience - 1:
                break
    return best, scores, kept


class SemiSupervised(BaseStage):
    """One labelled fraction and seed: every arm trained and scored."""

    name = "semi_supervised"

    def upstream(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("prepare",)

    def artifacts(self, settings, adapter: ModelAdapter) -> tuple[str, ...]:
        return (PREDICTIONS_FILE, "semi.json")

    def volatile(self, adapter: ModelAdapter) -> tuple[str, ...]:
        return ("semi.json",)  # its seconds

    def validate(self, cfg) -> None:
        from pipeline.engine.validate import SettingsError, check_hmm_observation

        if OmegaConf.select(cfg, "dataset.hmm.observation", default=None) is not None:
            check_hmm_observation(cfg, "dataset.hmm.observation")  # the hmm arms observe it

        try:
            settings_of(OmegaConf.to_container(cfg.semi, resolve=True) if "semi" in cfg else {})
        except ValueError as error:
            raise SettingsError(f"bad setting {error}") from None
        from pipeline.stages import clusters

        clusters.validate_semi(cfg)  # semi.clusters and the features' clusters

    def metric_names(self, cfg, adapter: ModelAdapter) -> tuple[str, ...]:
        """The metrics of :meth:`run`: the split's sizes, each arm's dev and test scores (``*``: f1 or
        accuracy) and seconds, and the rounds kept."""
        per_arm = tuple(f"{name}_{arm}" for arm in ARMS for name in ("dev_*", "test_*", "seconds"))
        return (
            "labelled_sentences",
            "labelled_tokens",
            "unlabelled_sentences",
            *per_arm,
            "hmm_em_iterations",
            "self_training_rounds",
        )

    def config_slice(self, cfg, adapter: ModelAdapter) -> dict:
        section = OmegaConf.to_container(cfg.semi, resolve=True) if "semi" in cfg else {}
        trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
        model = OmegaConf.to_container(cfg.model, resolve=True) if cfg.model.get("name") == "crf" else {}
        return {
            "semi": section,
            "features": OmegaConf.to_container(cfg.features, resolve=True),
            "trainer": {k: v for k, v in trainer.items() if k != "threads"},
            "model": model,
            "observation": str(OmegaConf.select(cfg, "dataset.hmm.observation", default="w")),
        }

    def external_inputs(self, config, settings) -> dict[str, str]:
        """SHA-256 of the files the ``crf_clusters`` arm reads (``semi.clusters.source`` or its
        ``pool`` files): editing one invalidates the cached job."""
        from pipeline.engine.cache import file_sha256
        from pipeline.stages import clusters

        block = (OmegaConf.to_container(config.semi, resolve=True) if "semi" in config else {}).get("clusters") or {}
        chosen = clusters.settings_of({**clusters.DEFAULTS, **dict(block)}, "semi.clusters")
        if chosen["source"] != clusters.AUTO:
            return {"clusters:source": file_sha256(clusters.resolved(chosen["source"]))}
        files = clusters.pool_paths({"clusters": chosen}, name="semi.clusters")
        return {f"pool:{i}": file_sha256(path) for i, path in enumerate(files)}

    def settings(self, cfg, adapter: ModelAdapter) -> dict:
        from pipeline.models import default_threads

        return {"threads": default_threads(cfg.trainer.get("threads")), "cache_dir": str(cfg.paths.cache_dir)}

    def run(self, context: StageContext) -> dict:
        from pipeline.report import write_json
        from pipeline.stages.prepare import read_prepared

        config = OmegaConf.to_container(context.config)
        settings = settings_of(config["semi"])
        data = read_prepared(context.inputs["prepare"])
        experiment = Experiment(data, config, settings, context.settings.threads, context.settings.cache_dir)
        metrics, curves, predictions = experiment.run()
        predictions.to_csv(context.out / PREDICTIONS_FILE, sep="\t", index=False, compression={"method": "gzip", "mtime": 0})
        write_json(context.out / "semi.json", curves)
        return metrics


class Experiment:
    """The arms of one fraction and seed on prepared data (see the module docstring)."""

    def __init__(self, data, config: dict, settings: dict, threads: int | None, cache_dir: str | Path) -> None:
        from crf import metrics

        self.data, self.config, self.settings, self.threads, self.cache_dir = data, config, settings, threads, cache_dir
        self.chunked = data.scheme != "none"
        self.score_name = "f1" if self.chunked else "accuracy"
        self.gold = {split: data.labels(split) for split in ("train", "dev", "test")}
        train = data.splits["train"]
        if len(train) < 2:
            raise ValueError(f"semi: the training split has {len(train)} sentence(s); a labelled and an unlabelled part need 2")
        self.labelled, self.unlabelled = labelled_split(len(train), float(settings["fraction"]), int(settings["seed"]))
        self._metrics = metrics

    def score(self, split: str, predicted: Sequence[Sequence[str]]) -> float:
        gold, predicted = self.gold[split], [list(p) for p in predicted]
        if self.chunked:
            return self._metrics.chunk_scores(gold, predicted).f1
        return self._metrics.token_accuracy(gold, predicted)

    def accuracy(self, split: str, predicted) -> float:
        return self._metrics.token_accuracy(self.gold[split], [list(p) for p in predicted])

    # --- HMM arms ----------------------------------------------------------------------------

    def hmm_arms(self, wanted: set[str]) -> tuple[dict, dict, dict]:
        from crf import HMM

        observation = self.config["observation"]
        column = {s: self.data.column(s, observation) for s in ("train", "dev", "test")}
        train = column["train"]
        model = HMM(
            order=int(self.settings["hmm_order"]),
            transition_smoothing="add-k",
            emission_smoothing="add-k",
            k=float(self.settings["hmm_k"]),
            n_threads=self.threads,
        )
        began = time.perf_counter()
        model.fit([train[i] for i in self.labelled], [self.gold["train"][i] for i in self.labelled])
        seconds = {"hmm": time.perf_counter() - began}
        out = {"hmm": (model.predict(column["dev"]), model.predict(column["test"]))}
        curves: dict = {}
        if "hmm_em" in wanted:
            began = time.perf_counter()
            unlabelled = [train[i] for i in self.unlabelled]
            em = copy.deepcopy(model)

            def step():
                em.baum_welch(unlabelled, iterations=1)
                dev = em.predict(column["dev"])
                log.info("[semi] hmm_em iteration %d: dev %.4f (%.0f s)", len(em.em_history_), self.score("dev", dev),
                         time.perf_counter() - began)  # fmt: skip
                return self.score("dev", dev), (dev, em.predict(column["test"]))

            best, scores, kept = best_by_dev(
                self.score("dev", out["hmm"][0]), step, int(self.settings["em_iterations"]), int(self.settings["em_patience"])
            )
            out["hmm_em"] = out["hmm"] if kept is None else kept
            curves["hmm_em_dev"] = scores
            curves["hmm_em_best_iteration"] = best
            seconds["hmm_em"] = time.perf_counter() - began
            log.info("[semi] hmm_em: dev %s, kept iteration %d", " ".join(f"{s:.4f}" for s in scores), best)
        return out, curves, seconds

    # --- CRF arms ----------------------------------------------------------------------------

    def crf_model(self):
        from pipeline.models.crf import build_model

        model = build_model(self.config["model"] or {"name": "crf"}, self.config["trainer"], 0, 0, self.threads)
        model.set_params(warm_start=False)
        return model

    def batches(self, features: dict):
        from pipeline.stages.featurize import build_extractor

        extractor = build_extractor(features, self.data.columns)
        extractor.fit(self.data.splits["train"])  # the attribute vocabulary reads no labels
        return {s: extractor.transform(self.data.splits[s]) for s in ("train", "dev", "test")}

    def crf_arms(self, wanted: set[str]) -> tuple[dict, dict, dict]:
        from pipeline.stages import clusters

        features = clusters.expanded(self.config["features"], None)
        y = self.gold["train"]
        out, curves, seconds = {}, {}, {}
        if wanted & {"crf", "crf_self_training"}:
            plain = self.batches(features)
            began = time.perf_counter()
            supervised = self.crf_model().fit(plain["train"].subset(self.labelled), [y[i] for i in self.labelled])
            seconds["crf"] = time.perf_counter() - began
            out["crf"] = (supervised.predict(plain["dev"]), supervised.predict(plain["test"]))
            log.info("[semi] crf: dev %.4f (%.0f s)", self.score("dev", out["crf"][0]), seconds["crf"])
        if "crf_clusters" in wanted:
            began = time.perf_counter()
            block = clusters.settings_of({**clusters.DEFAULTS, **dict(self.settings["clusters"])}, "semi.clusters")
            paths_file = None  # a source paths file: the views read it (clusters.expanded)
            if block["source"] == clusters.AUTO:  # learned from the training words and the pool files
                words = self.data.column("train", clusters.word_column({"clusters": block}, self.data.word_column))
                files = clusters.pool_paths({"clusters": block}, name="semi.clusters")
                paths_file, _ = clusters.learn(self.cache_dir, block, words, files, "semi.clusters")
            with_clusters = clusters.expanded({**features, "clusters": block}, paths_file)
            batch = self.batches(with_clusters)
            model = self.crf_model().fit(batch["train"].subset(self.labelled), [y[i] for i in self.labelled])
            out["crf_clusters"] = (model.predict(batch["dev"]), model.predict(batch["test"]))
            seconds["crf_clusters"] = time.perf_counter() - began
            log.info("[semi] crf_clusters: dev %.4f (%.0f s)", self.score("dev", out["crf_clusters"][0]), seconds["crf_clusters"])
        if "crf_self_training" in wanted:
            began = time.perf_counter()
            out["crf_self_training"], curves = self.self_training(supervised, plain, out["crf"])
            seconds["crf_self_training"] = time.perf_counter() - began
        return out, curves, seconds

    def self_training(self, model, batch, start: tuple) -> tuple[tuple, dict]:
        """Rounds of self-training from the supervised ``model`` (see the module docstring)."""
        model = copy.deepcopy(model)
        model.set_params(warm_start=True)
        if self.settings["self_training_iterations"] is not None:  # warm-started: few iterations move far
            model.set_params(max_iterations=int(self.settings["self_training_iterations"]))
        y = self.gold["train"]
        pool = batch["train"].subset(self.unlabelled)
        labelled_y = [y[i] for i in self.labelled]
        taken: list[float] = []

        def step():
            marginals, _ = model.marginals(pool)
            guessed = confident_labels(marginals, pool.offsets, list(model.classes_), float(self.settings["threshold"]))
            known = np.fromiter((any(t is not None for t in s) for s in guessed), dtype=bool, count=len(guessed))
            taken.append(float(np.mean([t is not None for s in guessed for t in s])))
            rows = np.concatenate([self.labelled, self.unlabelled[known]])
            model.fit(batch["train"].subset(rows), labelled_y + [g for g, k in zip(guessed, known) if k])
            dev = model.predict(batch["dev"])
            share = 100 * taken[-1]
            log.info(
                "[semi] self-training round %d: %.1f%% of the unlabelled tokens taken, dev %.4f",
                len(taken),
                share,
                self.score("dev", dev),
            )
            return self.score("dev", dev), (dev, model.predict(batch["test"]))

        best, scores, kept = best_by_dev(
            self.score("dev", start[0]),
            step,
            int(self.settings["self_training_rounds"]),
            int(self.settings["self_training_patience"]),
        )
        log.info("[semi] crf_self_training: dev %s, kept round %d", " ".join(f"{s:.4f}" for s in scores), best)
        curves = {"self_training_dev": scores, "self_training_best_round": best, "self_training_taken": taken}
        return (start if kept is None else kept), curves

    def run(self) -> tuple[dict, dict, pd.DataFrame]:
        """Every wanted arm: (metrics, dev curves, test predictions)."""
        wanted = set(self.settings["arms"])
        predictions, curves, seconds = {}, {}, {}
        for arms in (self.crf_arms, self.hmm_arms):
            if wanted & ({"hmm", "hmm_em"} if arms == self.hmm_arms else {"crf", "crf_self_training", "crf_clusters"}):
                out, curve, took = arms(wanted)
                predictions.update(out)
                curves.update(curve)
                seconds.update(took)
        n_tokens = sum(len(self.gold["train"][i]) for i in self.labelled)
        metrics = {
            "labelled_sentences": len(self.labelled),
            "labelled_tokens": n_tokens,
            "unlabelled_sentences": len(self.unlabelled),
        }
        for arm in ARMS:
            if arm not in wanted:
                continue
            dev, test = predictions[arm]
            metrics[f"dev_{self.score_name}_{arm}"] = self.score("dev", dev)
            metrics[f"test_{self.score_name}_{arm}"] = self.score("test", test)
            if self.chunked:
                metrics[f"test_accuracy_{arm}"] = self.accuracy("test", test)
            metrics[f"seconds_{arm}"] = seconds[arm]
            log.info(
                "[semi] %s: dev %.4f, test %.4f",
                arm,
                metrics[f"dev_{self.score_name}_{arm}"],
                metrics[f"test_{self.score_name}_{arm}"],
            )
        if "hmm_em_best_iteration" in curves:
            metrics["hmm_em_iterations"] = curves["hmm_em_best_iteration"]
        if "self_training_best_round" in curves:
            metrics["self_training_rounds"] = curves["self_training_best_round"]
        curves["seconds"] = seconds
        gold = self.gold["test"]
        lengths = [len(s) for s in gold]
        frame = pd.DataFrame(
            {
                "sentence": np.repeat(np.arange(len(gold)), lengths),
                "token": np.concatenate([np.arange(n) for n in lengths]),
                "gold": [t for s in gold for t in s],
            }
        )
        for arm in ARMS:
            if arm in wanted:
                frame[arm] = [str(t) for s in predictions[arm][1] for t in s]
        return metrics, curves, frame


STAGE = SemiSupervised()

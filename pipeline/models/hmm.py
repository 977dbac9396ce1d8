"""The HMM baseline (``crf.HMMTagger``, trained by counting) as a pipeline model.

Training reads the prepare folder only (the HMM observes the column ``model.observation``) and
writes ``model.npz`` (see ``HMMTagger.save``), ``bundle.npz`` (the model with its labels, scheme
and observed column: a :class:`crf.TaggerBundle`) and ``hmm.json`` (sizes, interpolation weights).
Config slice: ``model``; settings: ``threads`` (one in a sweep job).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from crf import HMMTagger, TaggerBundle
from pipeline.models import BUNDLE_FILE, ModelAdapter, bundle_source, default_threads
from pipeline.strict_json import write_json

log = logging.getLogger(__name__)


def build_hmm(model: Mapping, threads: int | None) -> HMMTagger:
    """An HMMTagger from the ``model`` config section (keys that are HMMTagger parameters)."""
    params = {k: model[k] for k in HMMTagger().get_params() if k in model and model[k] is not None}
    return HMMTagger(n_threads=threads, **params)


class HMMTaggerView:
    """A saved HMM over the prepared words (no feature extraction: both times are decoding)."""

    def __init__(self, model: HMMTagger, observation: str, data) -> None:
        self.model = model
        self.observation = observation
        self.data = data
        self.classes = list(model.classes_)

    def tag(self, split: str) -> tuple[np.ndarray, np.ndarray, float, float]:
        X = self.data.column(split, self.observation)
        began = time.perf_counter()
        codes = self.model.predict_codes(X)
        seconds = time.perf_counter() - began
        marginals = self.model.marginals(X)
        return codes, marginals[np.arange(codes.size), codes], seconds, seconds

    def segments(self, split: str) -> None:
        return None


class HMMAdapter(ModelAdapter):
    name = "hmm"
    upstream = ("prepare",)
    artifacts = ("model.npz", BUNDLE_FILE, "hmm.json")

    def config_slice(self, cfg) -> dict:
        return {"model": OmegaConf.to_container(cfg.model, resolve=True)}

    def settings(self, cfg) -> dict:
        return {"threads": default_threads(None)}

    def trainer_tag(self, cfg) -> str:
        return "counting"

    def fit(self, context, data) -> dict:
        spec = OmegaConf.to_container(context.config.model)
        out = context.out
        model = build_hmm(spec, context.settings.threads)
        began = time.perf_counter()
        model.fit(data.column("train", spec["observation"]), data.labels("train"))
        seconds = time.perf_counter() - began
        model.save(out / "model.npz")
        bundle = TaggerBundle.from_hmm(
            model,
            observation=spec["observation"],
            scheme=data.scheme,
            source=bundle_source(data, OmegaConf.to_container(context.config)),
        )
        bundle.save(out / BUNDLE_FILE)
        info = {
            "train_seconds": seconds,
            "model_bytes": (out / "model.npz").stat().st_size,
            "labels": len(model.classes_),
            "hidden_labels": model.n_hidden_,
            "vocabulary": len(model.vocabulary_),
            "suffixes": 0 if model.suffix_model_ is None else len(model.suffix_model_.keys),
        }
        weights = model.interpolation_weights_
        if weights is not None:
            info.update({f"lambda_{n + 1}": float(w) for n, w in enumerate(weights)})
        write_json(out / "hmm.json", info)
        log.info("HMM order %d on %r: %.2fs, %s words", model.order, spec["observation"], seconds, f"{info['vocabulary']:,}")
        return info

    def tagger(self, config, inputs: Mapping[str, Path], data) -> HMMTaggerView:
        return HMMTaggerView(HMMTagger.load(inputs["train"] / "model.npz"), str(config.model.observation), data)

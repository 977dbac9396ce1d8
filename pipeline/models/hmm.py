"""The HMM baseline (``crf.HMM``, trained by counting) as a pipeline model.

Training reads the prepare folder only (the HMM observes the column ``model.observation``) and
writes ``model.npz`` (see ``HMM.save``), ``bundle.npz`` (the model with its labels, scheme
and observed column: a :class:`crf.ModelBundle`) and ``hmm.json`` (sizes, interpolation weights).
Config slice: ``model``; settings: ``threads`` (one in a sweep job).
"""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Mapping

from omegaconf import OmegaConf

from crf import HMM, ModelBundle
from crf.hmm import BundledHMM
from pipeline.engine.validate import SettingsError, check_hmm_observation, section, unknown_keys, where
from pipeline.models import BUNDLE_FILE, BaseAdapter, bundle_source, default_threads
from pipeline.report import write_json

log = logging.getLogger(__name__)

ADD_K = "add-k"


def build_hmm(model: Mapping, threads: int | None) -> HMM:
    """An HMM from the ``model`` config section (keys that are HMM parameters)."""
    params = {k: model[k] for k in HMM().get_params() if k in model and model[k] is not None}
    return HMM(n_threads=threads, **params)


class HMMAdapter(BaseAdapter):
    name = "hmm"
    upstream = ("prepare",)
    artifacts = ("model.npz", BUNDLE_FILE, "hmm.json")
    metrics = ("train_seconds", "model_bytes", "labels", "hidden_labels", "vocabulary", "suffixes", "lambda_*")

    def known_keys(self, section: str) -> frozenset[str]:
        return frozenset(HMM().get_params()) | {"name", "adapter", "observation"} if section == "model" else frozenset()

    def validate(self, cfg) -> None:
        """The HMM's settings as the estimator checks them, its keys, and add-k's k."""
        model = section(cfg, "model")
        unknown_keys("model", model, self.known_keys("model"))
        k = model.get("k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Real)):
            raise SettingsError(f"bad setting model.k={k!r}: must be a number")
        try:
            build_hmm(model, threads=None).check_params()
        except (TypeError, ValueError) as error:  # TypeError: a string compared with a number
            raise SettingsError(where(str(error), {"model": model})) from None
        if ADD_K in (model.get("transition_smoothing"), model.get("emission_smoothing")) and not (
            isinstance(k, numbers.Real) and not isinstance(k, bool) and k > 0
        ):
            raise SettingsError(
                f"bad setting model.k={k!r}: add-k smoothing needs k > 0 (k = 0 gives unseen events probability 0)"
            )
        check_hmm_observation(cfg, "model.observation")
        clusters = OmegaConf.select(cfg, "features.clusters", default=None)
        if clusters is not None:
            raise SettingsError(
                "bad setting features.clusters: model=hmm observes one column (model.observation) and uses no features, "
                "so word clusters would be ignored; drop them (+features/clusters=brown) or use model=crf"
            )

    def config_slice(self, cfg) -> dict:
        # the whole section: k and the suffix settings are kept in the saved model (baum_welch's prior
        # reads k) even where the counting smoothing does not use them
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
        bundle = ModelBundle(
            BundledHMM(model, spec["observation"]),
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

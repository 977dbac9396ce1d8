"""Settings checked before any stage runs.

A wrong-typed or out-of-range setting (``trainer.c2=abc``, ``trainer.max_iterations=-1``,
``model.k=0`` with add-k smoothing) should fail at once, before prepare and featurize spend
minutes, with one line naming the setting. :func:`validate_settings` checks the run's own settings
(seed, training fraction, dev cadence) and the model's: the estimator is built from the config
exactly as its adapter builds it for training (``build_model``/``build_hmm``) and checked by the
estimator's own parameter validation (``crf.params.validate`` for the CRF, ``_check_params`` for
the HMM), so the rules live in one place, the library.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from crf import params as hyper
from pipeline.models import load_adapter

_ADD_K = "add-k"
_CONFIG_NAMES = {"n_threads": "threads"}  # estimator parameter -> its key in the config, where they differ


class SettingsError(ValueError):
    """A setting that cannot work; the message is one line naming it and its value."""


def _section(cfg: DictConfig, name: str) -> Any:
    """The resolved ``cfg.<name>`` as plain containers; an interpolation that fails is a SettingsError."""
    try:
        node = OmegaConf.select(cfg, name, throw_on_missing=True)
        return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    except OmegaConfBaseException as error:
        message = str(error).splitlines()[0]
        raise SettingsError(f"bad setting in {name}: {message}") from None


def _where(message: str, sections: Mapping[str, Mapping]) -> str:
    """``message`` prefixed with the config path of the parameter it starts with (``trainer.c2``)."""
    name = message.split(maxsplit=1)[0].partition("=")[0] if message else ""
    name = _CONFIG_NAMES.get(name, name)
    for section, values in sections.items():
        if name in values:
            return f"bad setting {section}.{name}={values[name]!r}: {message}"
    return f"bad setting: {message}"


def _check_crf(cfg: DictConfig) -> None:
    from pipeline.models.crf import build_model

    model, trainer = _section(cfg, "model"), _section(cfg, "trainer")
    estimator = build_model(model, trainer, seed=0, dev_every=int(cfg.train.dev_every), threads=trainer.get("threads"))
    try:
        hyper.validate(estimator.get_params())
    except ValueError as error:
        raise SettingsError(_where(str(error), {"trainer": trainer, "model": model})) from None


def _check_hmm(cfg: DictConfig) -> None:
    from pipeline.models.hmm import build_hmm

    model = _section(cfg, "model")
    k = model.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Real)):
        raise SettingsError(f"bad setting model.k={k!r}: must be a number")
    estimator = build_hmm(model, threads=None)
    try:
        estimator._check_params()
    except (TypeError, ValueError) as error:  # TypeError: a string compared with a number
        raise SettingsError(_where(str(error), {"model": model})) from None
    if _ADD_K in (model.get("transition_smoothing"), model.get("emission_smoothing")) and not (
        isinstance(k, numbers.Real) and not isinstance(k, bool) and k > 0
    ):
        raise SettingsError(f"bad setting model.k={k!r}: add-k smoothing needs k > 0 (k = 0 gives unseen events probability 0)")
    for name, low in (("rare_threshold", 0), ("max_suffix", 0)):
        value = model.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low):
            raise SettingsError(f"bad setting model.{name}={value!r}: must be an integer >= {low}")


# model adapter (``model.adapter``) -> the check of its settings; an adapter with a ``validate(cfg)``
# method is asked directly instead
MODEL_CHECKS: dict[str, Callable[[DictConfig], None]] = {
    "pipeline.models.crf.CRFAdapter": _check_crf,
    "pipeline.models.hmm.HMMAdapter": _check_hmm,
}


def _check_run(cfg: DictConfig) -> None:
    seed = _section(cfg, "seed")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise SettingsError(f"bad setting seed={seed!r}: must be an integer")
    fraction = _section(cfg, "data.train_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise SettingsError(f"bad setting data.train_fraction={fraction!r}: must be a number in (0, 1]")
    dev_every = _section(cfg, "train.dev_every")
    if dev_every is not None and (isinstance(dev_every, bool) or not isinstance(dev_every, numbers.Integral) or dev_every < 0):
        raise SettingsError(f"bad setting train.dev_every={dev_every!r}: must be an integer >= 0 (0: never)")


def validate_settings(cfg: DictConfig) -> None:
    """Raise :class:`SettingsError` (one line naming the setting) if a run or model setting of
    ``cfg`` cannot work; nothing is read, written or logged."""
    _check_run(cfg)
    try:
        adapter = load_adapter(_section(cfg, "model"))
    except ValueError as error:
        raise SettingsError(f"bad setting model.adapter: {error}") from None
    own = getattr(adapter, "validate", None)
    if callable(own):
        own(cfg)
        return
    check = MODEL_CHECKS.get(f"{type(adapter).__module__}.{type(adapter).__qualname__}")
    if check is not None:
        check(cfg)

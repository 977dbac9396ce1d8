"""Settings checked before any stage runs.

A wrong-typed or out-of-range setting (``trainer.c2=abc``, ``trainer.max_iterations=-1``,
``model.k=0`` with add-k smoothing) should fail at once, before prepare and featurize spend
minutes, with one line naming the setting. :func:`validate_settings` checks the run's own settings
(seed, training fraction, dev cadence), the dataset's keys, and asks the model adapter to check
its own (``adapter.validate``: the estimator built from the config exactly as for training and
checked by the estimator's own parameter validation, so the rules live in one place, the library).
A key added on the command line under a section that has no such key (``+trainer.c22=1``) is
refused like a misspelt one.
"""

from __future__ import annotations

import copy
import difflib
import math
import numbers
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from crf.bundle import normalize_scheme
from crf.io import DataFormatError
from crf.model import TrainingError
from pipeline.engine.stage import load_adapter

_CONFIG_NAMES = {"n_threads": "threads"}  # estimator parameter -> its key in the config, where they differ
# every key a dataset config may have (pipeline/stages/data.py and the stages read them; hmm and crf: model defaults)
DATASET_KEYS = {
    "name", "task", "format", "columns", "label", "scheme", "files", "dev_split", "separator", "comment_prefix",
    "document_marker", "word_column", "hmm", "crf", "evaluate", "unlabelled",
}  # fmt: skip
DATASET_CRF_KEYS = {"candidate_threshold"}  # what conf/model/crf.yaml reads of a dataset's crf section
DATASET_REQUIRED = {"name", "format", "columns", "label", "files"}
SWEEP_SUMMARIES = ("grid", "comparison", "active_learning", "semi_supervised")

#: settings that are switches: true or false and nothing else (Hydra reads ``true``/``false`` as
#: booleans; ``no``, ``off`` or ``0`` stay what they are, and a string would count as true)
SWITCHES = (
    "force",
    "data.download",
    "featurize.log_matrices",
    "sweep.summarize",
    "registry.force_alias",
    "registry.sweep",
    "registry.register",
    "model.all_possible_states",
    "model.all_possible_transitions",
    "dataset.hmm.capitalization",
    "dataset.hmm.correction_propagation",
    "features.bos_eos",
    "features.padding",
)

# what the model registry takes (MLflow's rules): an alias of letters, digits, _ and -, but not
# "latest" or v<N>, which name versions; a model name that is not blank and holds no / or :
_ALIAS = re.compile(r"[\w\-]{1,255}")
_RESERVED_ALIAS = re.compile(r"latest|v\d+", re.IGNORECASE)


def finite_number(value: object) -> bool:
    """Whether ``value`` is a real number (not a bool) within a float's range: an ``int`` too large
    for a float is not (``math.isfinite`` would raise OverflowError on it)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class SettingsError(ValueError):
    """A setting that cannot work; the message is one line naming it and its value."""


# the errors whose one line says what and where (a setting, a data file's line, a fit that cannot go
# on): a single run ends with that line and exit status 2, and so does a grid sweep whose job raised one
ONE_LINE_ERRORS = (SettingsError, DataFormatError, TrainingError)


def section(cfg: DictConfig, name: str) -> Any:
    """The resolved ``cfg.<name>`` as plain containers; an interpolation that fails is a SettingsError."""
    try:
        node = OmegaConf.select(cfg, name, throw_on_missing=True)
        return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    except OmegaConfBaseException as error:
        message = str(error).splitlines()[0]
        raise SettingsError(f"bad setting in {name}: {message}") from None


def where(message: str, sections: Mapping[str, Mapping]) -> str:
    """``message`` prefixed with the config path of the parameter it starts with (``trainer.c2``)."""
    name = message.split(maxsplit=1)[0].partition("=")[0] if message else ""
    name = _CONFIG_NAMES.get(name, name)
    for part, values in sections.items():
        if name in values:
            return f"bad setting {part}.{name}={values[name]!r}: {message}"
    return f"bad setting: {message}"


def check_template_names(setting: str, templates: Iterable, known: set[str], what: str) -> None:
    """Refuse (SettingsError naming ``setting``) a feature template that does not parse or reads a
    name outside ``known`` (views, lexicons, columns), and two that read the same cells
    (:func:`crf.features.repeated_template`); ``what`` says what the known names are."""
    from crf.features import parse_template, repeated_template

    templates = list(templates)
    for template in templates:
        try:
            cells = parse_template(str(template)).cells
        except ValueError as error:
            raise SettingsError(f"bad setting {setting}: {error}") from None
        missing = [view for view, _ in cells if view not in known]
        if missing:
            raise SettingsError(f"bad setting {setting}: {template!r} reads {missing[0]!r}, neither {what}")
    repeated = repeated_template(templates)
    if repeated is not None:
        first, second = repeated
        raise SettingsError(f"bad setting {setting}: templates {first!r} and {second!r} read the same cells (keep one)")


#: settings of earlier versions under their current names
RENAMED_KEYS = {"pruning_threshold": "candidate_threshold"}


def renamed_key_hint(key: str) -> str:
    """``; <name> is now called <new name>`` when the last part of ``key`` is a renamed setting, else ''."""
    last = key.rsplit(".", 1)[-1]
    return f"; {last} is now called {RENAMED_KEYS[last]}" if last in RENAMED_KEYS else ""


def unknown_keys(section: str, values: Mapping, known: Iterable[str]) -> None:
    """A SettingsError naming the first key of ``values`` that is not ``known`` (with the nearest
    known key as a suggestion): a misspelt or invented key would otherwise be ignored quietly."""
    known = sorted(set(known))
    for key in values:
        if key not in known:
            near = [RENAMED_KEYS[key]] if RENAMED_KEYS.get(key) in known else difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {section}.{near[0]}?" if near else f"; known keys: {', '.join(known)}"
            raise SettingsError(f"bad setting {section}.{key}: {section} has no such key{hint}")


def _check_run(cfg: DictConfig) -> None:
    seed = section(cfg, "seed")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise SettingsError(f"bad setting seed={seed!r}: must be an integer >= 0 (NumPy's generators take no other)")
    fraction = section(cfg, "data.train_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction <= 1:
        raise SettingsError(f"bad setting data.train_fraction={fraction!r}: must be a number in (0, 1]")
    dev_every = section(cfg, "train.dev_every")
    if isinstance(dev_every, bool) or not isinstance(dev_every, numbers.Integral) or dev_every < 0:
        raise SettingsError(f"bad setting train.dev_every={dev_every!r}: must be an integer >= 0 (0: never)")
    summary = section(cfg, "sweep.summary")
    if summary not in SWEEP_SUMMARIES:
        raise SettingsError(f"bad setting sweep.summary={summary!r}: one of {', '.join(SWEEP_SUMMARIES)}")
    problem = non_switch(cfg, SWITCHES)
    if problem:
        raise SettingsError(f"bad setting {problem}")
    _check_registry(cfg)


def non_switch(cfg: DictConfig, keys: Iterable[str]) -> str | None:
    """``key=value: true or false`` for the first of ``keys`` that is set to anything but true or
    false (a string such as ``no`` would count as true); None when every one is a switch or unset."""
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not isinstance(value, bool):
            return f"{key}={value!r}: true or false"
    return None


def non_whole_number(cfg: DictConfig, least: Mapping[str, int]) -> str | None:
    """``key=value: a whole number >= n`` for the first key of ``least`` whose value is not a whole
    number of at least ``least[key]``; None when each is one or unset."""
    for key, smallest in least.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < smallest):
            return f"{key}={value!r}: a whole number >= {smallest}"
    return None


def _not_a_unique_path(name: str) -> bool:
    """Whether the registry would read ``name`` as a path that is not itself ('.', '..x', 'a//b')."""
    normal = posixpath.normpath(name)
    return normal != name or normal == "." or normal.startswith("..")


def _registers(cfg: DictConfig) -> bool:
    """Whether the run registers a model: with ``registry.register``, or as a job of a multirun
    (``hydra.mode``, or Hydra's running config) with ``registry.sweep``."""
    if OmegaConf.select(cfg, "registry.register", default=False):
        return True
    if not OmegaConf.select(cfg, "registry.sweep", default=False):
        return False
    mode = OmegaConf.select(cfg, "hydra.mode", default=None)
    if mode is None:
        from hydra.core.hydra_config import HydraConfig

        mode = HydraConfig.get().mode if HydraConfig.initialized() else None
    return getattr(mode, "name", mode) == "MULTIRUN"


def _check_registry(cfg: DictConfig) -> None:
    """``registry.name`` and ``registry.alias`` (null: none) as the model registry will take them,
    when the run registers a model, so that it is not refused by the registry after it trained."""
    if OmegaConf.select(cfg, "registry", default=None) is None or not _registers(cfg):
        return
    name, alias = OmegaConf.select(cfg, "registry.name", default=None), OmegaConf.select(cfg, "registry.alias", default=None)
    if not isinstance(name, str) or not name.strip() or "/" in name or ":" in name or _not_a_unique_path(name):
        raise SettingsError(
            f"bad setting registry.name={name!r}: a registered model's name (not blank, no '/' or ':', not '.' or '..')"
        )
    if alias is None:
        return
    if not isinstance(alias, str) or not _ALIAS.fullmatch(alias):
        raise SettingsError(f"bad setting registry.alias={alias!r}: letters, digits, '_' and '-' (at most 255; null: no alias)")
    if _RESERVED_ALIAS.fullmatch(alias):
        raise SettingsError(f"bad setting registry.alias={alias!r}: the registry reserves 'latest' and v<N> for versions")


def _check_dataset(cfg: DictConfig) -> None:
    dataset = section(cfg, "dataset")
    unknown_keys("dataset", dataset, DATASET_KEYS)
    crf_defaults = dataset.get("crf") or {}
    if not isinstance(crf_defaults, Mapping):
        raise SettingsError(f"bad setting dataset.crf={crf_defaults!r}: a mapping of CRF settings (candidate_threshold)")
    unknown_keys("dataset.crf", crf_defaults, DATASET_CRF_KEYS)
    missing = sorted(DATASET_REQUIRED - set(dataset))
    if missing:
        needed = ", ".join(sorted(DATASET_REQUIRED))
        raise SettingsError(f"bad setting dataset: {', '.join(missing)} missing (a dataset config needs {needed})")
    scheme = dataset.get("scheme", "none")
    try:
        normalize_scheme(scheme)
    except ValueError:
        raise SettingsError(
            f"bad setting dataset.scheme={scheme!r}: one of IOB1, IOB2, IOBES, none (none: no chunks, token accuracy only)"
        ) from None
    columns = dataset["columns"]
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
        raise SettingsError(f"bad setting dataset.columns={columns!r}: a list of column names")
    if len(set(columns)) != len(columns):
        raise SettingsError(f"bad setting dataset.columns={columns!r}: a column name is repeated")
    label = dataset["label"]
    if label not in columns:
        raise SettingsError(f"bad setting dataset.label={label!r}: not one of the columns {columns}")
    word = dataset.get("word_column", "w" if "w" in columns else None)
    if label == word:
        raise SettingsError(f"bad setting dataset.label={label!r}: the word column, which the model reads; name a label column")
    observation = OmegaConf.select(cfg, "dataset.hmm.observation", default=None)
    if observation is not None and observation not in columns:
        raise SettingsError(f"bad setting dataset.hmm.observation={observation!r}: not one of the columns {columns}")
    _check_dev_split(dataset.get("dev_split"))
    files = dataset.get("files")
    for split in ("train", "test") if isinstance(files, Mapping) else ():
        if files.get(split) is None:  # null, or not given: every run reads both
            raise SettingsError(f"bad setting dataset.files.{split}=null: dataset {dataset.get('name')!r} needs a {split} file")
    if isinstance(files, Mapping) and "dev" in files and files["dev"] is None and dataset.get("dev_split") is None:
        raise SettingsError(
            f"bad setting dataset.files.dev=null: dataset {dataset.get('name')!r} would have no dev split; set "
            "dataset.dev_split={fraction: 0.1, seed: 1} as well to carve one from the training file"
        )
    dev_file = files.get("dev") if isinstance(files, Mapping) else None
    if dataset.get("dev_split") is not None and dev_file is not None:  # the split would be ignored
        where = dev_file.get("path") if isinstance(dev_file, Mapping) else dev_file
        raise SettingsError(
            f"bad setting dataset.dev_split: dataset {dataset.get('name')!r} has a dev file ({where}), which is its dev "
            "split; set dataset.files.dev=null as well to carve the dev split from the training file instead"
        )
    prefix = dataset.get("comment_prefix")
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise SettingsError(f"bad setting dataset.comment_prefix={prefix!r}: a non-empty string, or null for none")


def check_hmm_observation(cfg: DictConfig, key: str) -> None:
    """Refuse an HMM observation that is not a dataset column, or that is its label column (the HMM
    would observe its own answers).

    Parameters
    ----------
    cfg : DictConfig
        The run's composed config.
    key : str
        The setting that names the observed column (``model.observation``, ``dataset.hmm.observation``).

    Raises
    ------
    SettingsError
        Naming ``key`` and its value.
    """
    observation, label = OmegaConf.select(cfg, key, default=None), OmegaConf.select(cfg, "dataset.label", default=None)
    columns = list(OmegaConf.select(cfg, "dataset.columns", default=None) or [])
    if columns and observation not in columns:
        raise SettingsError(f"bad setting {key}={observation!r}: not one of the dataset's columns {columns}")
    if observation == label:
        raise SettingsError(f"bad setting {key}={observation!r}: the label column; the HMM would observe its own answers")


def _number_of(value: Any, kind: type) -> Any:
    """``value`` read as ``kind`` when it is text that spells one (as the data stage reads it), else as it is."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            return value
    return value


def _check_dev_split(rule: Any) -> None:
    """A dev split carved from train (``fraction`` in (0, 1) and an integer ``seed``), or none."""
    if rule is None:
        return
    if not isinstance(rule, Mapping) or set(rule) != {"fraction", "seed"}:
        raise SettingsError(f"bad setting dataset.dev_split={rule!r}: fraction and seed, or null (the dataset's dev file)")
    fraction, seed = _number_of(rule["fraction"], float), _number_of(rule["seed"], int)  # from ${oc.env:...}: text
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 < fraction < 1:
        raise SettingsError(
            f"bad setting dataset.dev_split.fraction={fraction!r}: the share of the training sentences held out, "
            "between 0 and 1 (exclusive)"
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise SettingsError(f"bad setting dataset.dev_split.seed={seed!r}: must be an integer >= 0")


def added_keys(overrides: Sequence[str]) -> list[str]:
    """The keys that command-line overrides added with ``+``/``++`` inside an existing section
    (``+trainer.c22=1``); group choices (``+experiment=x``) and Hydra's own keys are not."""
    keys = []
    for override in overrides:
        if not override.startswith("+"):
            continue
        key = override.lstrip("+").split("=", 1)[0].strip()
        if "." in key and not key.startswith("hydra.") and "/" not in key.split(".", 1)[0]:
            keys.append(key)
    return keys


def command_line(cfg: DictConfig) -> list[str]:
    """The run's command-line overrides: from ``cfg.hydra`` when composed with it, else from the
    running Hydra app (none outside one)."""
    from hydra.core.hydra_config import HydraConfig

    task = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    if task is None and HydraConfig.initialized():
        task = HydraConfig.get().overrides.task
    return list(task or [])


# keys a section may lack in its config file and gain on the command line
_OPTIONAL = {"dataset": DATASET_KEYS}


# mappings of named entries, where a '+' adds an entry (+features.views.lower={column: w, fn: lower})
_NAMED_ENTRIES = ("features.views", "features.lexicons")


def _check_added_keys(cfg: DictConfig, adapter) -> None:
    for key in added_keys(command_line(cfg)):
        section, _, name = key.partition(".")
        optional = set(_OPTIONAL.get(section, ())) | set(adapter.known_keys(section))
        if name.split(".", 1)[0] in optional or key.rsplit(".", 1)[0] in _NAMED_ENTRIES:
            continue
        parent = OmegaConf.select(cfg, key.rsplit(".", 1)[0], default=None)
        known = [k for k in (parent.keys() if isinstance(parent, DictConfig) else []) if k != name.rsplit(".", 1)[-1]]
        near = difflib.get_close_matches(key.rsplit(".", 1)[-1], [str(k) for k in known], n=1)
        hint = f"; did you mean {key.rsplit('.', 1)[0]}.{near[0]}?" if near else ""
        raise SettingsError(
            f"bad setting +{key}: {section} has no key {name!r} (a '+' adds a new key; only existing keys can be set){hint}"
        )


def strength_conflict(overrides: Sequence[str]) -> str | None:
    """A one-line problem when ``overrides`` (Hydra override strings) set ``trainer.strength``
    together with ``trainer.c1`` or ``trainer.c2``: the strength is what sets c1 and c2 (c2 for
    lbfgs, c1 for l1, both for elasticnet), so a value given for either as well would train another
    model than the strength the run records (an l1 run with c2 set trains elastic net); else None."""
    values = {}
    for override in overrides:
        key, equals, value = override.partition("=")
        key = key.strip().lstrip("+~")
        if equals and key in ("trainer.strength", "trainer.c1", "trainer.c2"):
            values[key] = value.strip()
    if "trainer.strength" not in values or len(values) == 1:
        return None
    others = " ".join(f"{k}={v}" for k, v in values.items() if k != "trainer.strength")
    return (
        f"bad setting {others} with trainer.strength={values['trainer.strength']}: the strength sets c1 and c2 "
        "(trainer=lbfgs: c2, l1: c1, elasticnet: both, with trainer.l2_ratio), so set one or the other"
    )


def strength_moves(cfg: DictConfig, low: float, high: float) -> bool:
    """Whether c1 or c2 of ``cfg``'s trainer differ between ``trainer.strength`` = ``low`` and
    ``high`` (False when a config or an override fixed them, so the strength trains nothing)."""
    ends = []
    for strength in (low, high):
        point = copy.deepcopy(cfg)
        OmegaConf.update(point, "trainer.strength", float(strength), merge=False)
        ends.append((OmegaConf.select(point, "trainer.c1"), OmegaConf.select(point, "trainer.c2")))
    return ends[0] != ends[1]


def _fixed_strength(cfg: DictConfig, overrides: Sequence[str]) -> str | None:
    """A one-line problem when ``overrides`` set ``trainer.strength`` but c1 and c2 do not follow
    it (a config, such as an experiment's, fixed them): the run would record a strength it did
    not train with; else None."""
    if not any(o.lstrip("+~").split("=", 1)[0].strip() == "trainer.strength" for o in overrides):
        return None
    try:
        strength = OmegaConf.select(cfg, "trainer.strength")
        if isinstance(strength, bool) or not isinstance(strength, numbers.Real) or not strength > 0:
            return None  # the trainer's own checks name it
        if strength_moves(cfg, strength, 2.0 * strength):
            return None
    except OmegaConfBaseException:
        return None  # a bad value: the trainer's own checks name it
    return (
        f"bad setting trainer.strength={strength}: c1 and c2 of trainer={OmegaConf.select(cfg, 'trainer.name')} do not "
        f"follow it (c1={OmegaConf.select(cfg, 'trainer.c1')}, c2={OmegaConf.select(cfg, 'trainer.c2')}, fixed by a "
        "config): set trainer.c1/trainer.c2 instead"
    )


def validate_settings(cfg: DictConfig, stages=()) -> None:
    """Raise :class:`SettingsError` (one line naming the setting) if a run or model setting of
    ``cfg``, or a setting of one of ``stages`` (the stages the run will run), cannot work; nothing
    is read, written or logged."""
    try:
        adapter = load_adapter(section(cfg, "model"))
    except ValueError as error:
        raise SettingsError(f"bad setting model.adapter: {error}") from None
    _check_added_keys(cfg, adapter)
    overrides = command_line(cfg)
    conflict = strength_conflict(overrides) or _fixed_strength(cfg, overrides)
    if conflict:
        raise SettingsError(conflict)
    _check_run(cfg)
    _check_dataset(cfg)
    adapter.validate(cfg)
    for stage in stages:
        stage.validate(cfg)

"""python-crfsuite's interface over :class:`crf.CRF`: ``Trainer``, ``Tagger``, ``ItemSequence``.

Code written against python-crfsuite runs with ``import crf.pycrfsuite as pycrfsuite``, on any
machine with NumPy and SciPy. The module is a surface, not a second implementation: training is
:meth:`crf.CRF.fit` (``boundary_transitions=False``, which is CRFsuite's model; items become
attribute columns through :class:`crf.features.AttributeIndex`), and model files are CRFsuite's,
read and written by :mod:`crf.crfsuite` (a file trained here tags the same in
python-crfsuite, and the other way round). The tagger scores one sequence at a time as CRFsuite's
does, from the file's features.

What matches python-crfsuite 0.9.12 (CRFsuite 0.12):

- ``ItemSequence`` and every method taking items accept its item formats: lists of attribute
  names, dicts of ``name: number`` (``True``/``False`` are 1/0), ``name: str`` or ``bytes``
  (the attribute ``name:value``), and dicts, lists or sets nested under a name (``name:inner``);
- ``Trainer``: the algorithms (``lbfgs``, ``l2sgd``, ``ap``/``averaged-perceptron``,
  ``pa``/``passive-aggressive``, ``arow``), CRFsuite's parameter names, defaults and value types
  (``params``, ``get``, ``set``, ``get_params``, ``set_params``, ``help``; ``select`` resets them
  to the algorithm's defaults, as CRFsuite does), groups and ``train(model, holdout)`` (the
  instances of group ``holdout`` are left out of training and evaluated after every iteration);
- the training log: ``message`` receives CRFsuite's log text line by line, ``Trainer`` parses it
  (``logparser``, a :class:`TrainLogParser`) and calls ``on_start``, ``on_featgen_progress``,
  ``on_featgen_end``, ``on_prepared``, ``on_prepare_error``, ``on_iteration``,
  ``on_optimization_end`` and ``on_end``, which print it when ``verbose`` (python-crfsuite's
  output, on standard output);
- ``Tagger``: ``open``/``open_inmemory`` (context managers), ``close``, ``labels``, ``set``,
  ``tag``, ``probability``, ``marginal``, ``info`` (the parsed dump: weights with six
  decimals, ids as strings) and ``dump`` (CRFsuite's text);
- the exception types: ValueError for unknown parameters, algorithms, lengths that differ, a
  closed tagger's queries and invalid model files; OSError for missing files; RuntimeError for
  unknown labels in ``probability``/``marginal`` and for ``info``/``dump`` on a closed tagger;
  TypeError for items of the wrong type.

Where it differs: parameter values are checked when set (CRFsuite parses them with
``atoi``/``atof`` and takes anything); an empty item sequence cannot be appended (CRFsuite would
train on nothing from it); NaN or infinite attribute values are refused; a damaged model file
raises ValueError where CRFsuite may crash; ``linesearch`` other than ``MoreThuente`` raises
ValueError at ``train`` unless ``c1 > 0`` (the estimator's L-BFGS line search is More-Thuente's;
OWL-QN backtracks, as in CRFsuite). The log has CRFsuite's lines where this trainer knows the
figures: it leaves out the line-search step, SGD's learning rate per epoch and its calibration
trials. Labels seen only in the holdout
group are not in the model (CRFsuite keeps them, without features); as in CRFsuite, only
attributes with a non-zero weight are written.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
import re
import sys
import time
from collections import Counter, namedtuple
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain as chained
from itertools import repeat

import numpy as np

from . import _chain as chain
from . import _compiled
from . import _params as hyper
from ._optimize import IterationInfo
from ._tagger_view import ModelInfo
from ._training import TOO_LARGE, check_model_filename
from .attributes import _token_items, pair_table, sequence_entries
from .crfsuite import (
    _HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_KEY_BYTES,
    CRFsuiteModel,
    StateFeatures,
    crfsuite_from_crf,
    parse_crfsuite,
    unstorable_name,
    write_crfsuite,
)
from .model import CRF

log = logging.getLogger(__name__)

CRFSUITE_VERSION = "0.12.2"  # the CRFsuite release whose files, parameters and log this module reproduces
PYCRFSUITE_VERSION = "0.9.12"  # the python-crfsuite release whose interface it follows

__all__ = [
    "BaseTrainer",
    "CRFSUITE_VERSION",
    "CRFSuiteError",
    "ItemSequence",
    "LabelScore",
    "ParsedDump",
    "Tagger",
    "TrainLogParser",
    "Trainer",
]

ParsedDump = ModelInfo  # what Tagger.info() returns: header, labels, attributes, transitions, state_features


class CRFSuiteError(Exception):
    """python-crfsuite's error for a failed ``train``. This trainer raises the error itself
    (ValueError, OSError, ...) instead; the class exists so that ``except`` clauses keep working.

    Parameters
    ----------
    code : int, default=0
        CRFsuite's error code (in the message ``CRFsuite error <code>``).
    """

    def __init__(self, code: int = 0) -> None:
        self.code = code
        super().__init__(f"CRFsuite error {code}")


# --- items ------------------------------------------------------------------------------

_PLAIN_VALUES = frozenset((str, int, float, bool))
_STR_ONLY = frozenset((str,))


def _flat_item(item, position: int | str) -> dict[str, float]:
    """The attributes of an item of any accepted shape as ``{name: value}`` (repeated names add up,
    as CRFsuite adds their scores). ``position`` names the item in errors."""
    flat: dict[str, float] = {}
    where = f"item {position}" if isinstance(position, int) else position
    for name, value in _token_items(item, where):
        if not math.isfinite(value):
            raise ValueError(f"{where}: attribute {name!r} has the non-finite value {value}")
        if abs(value) >= TOO_LARGE:
            raise ValueError(
                f"{where}: attribute {name!r} has the value {value:g}, too large to train on or to tag "
                f"(the limit is {TOO_LARGE:g})"
            )
        flat[name] = flat.get(name, 0.0) + value
    return flat


def _finite_numbers(values) -> bool:
    """Whether every int and float of ``values`` is a finite float below :data:`TOO_LARGE` in
    magnitude (an int may be too large for a float)."""
    try:
        return all(abs(float(v)) < TOO_LARGE for v in values if type(v) is not str)
    except OverflowError:
        return False


def _item(item, position: int | str):
    """One item in a form :class:`crf.features.AttributeIndex` reads with python-crfsuite's rules
    and that later changes to the caller's objects cannot reach: a list of ``str`` names, a dict
    of ``str`` keys and ``str``/number values (copied), or else the flattened ``{name: value}``."""
    kind = type(item)
    if kind is list or kind is tuple:
        try:
            "".join(item)  # a C-level check that every name is a str
        except TypeError:
            return _flat_item(item, position)  # bytes names, or an error naming the position
        return list(item)
    if kind is dict:
        values = item.values()
        if set(map(type, item)) <= _STR_ONLY and set(map(type, values)) <= _PLAIN_VALUES and _finite_numbers(values):
            return dict(item)
        return _flat_item(item, position)
    if isinstance(item, (str, bytes)):
        where = f"item {position}" if isinstance(position, int) else position
        raise TypeError(f"{where} is the string {item!r}: an item is a dict or a list of attribute names")
    return _flat_item(item, position)


def _items(xseq, sequence: int | None = None) -> list:
    """The items of ``xseq`` (an :class:`ItemSequence` or an iterable of items), checked; errors
    name ``sequence N, item t`` (``item t`` without ``sequence``)."""
    if isinstance(xseq, ItemSequence):
        return xseq._items
    if isinstance(xseq, (str, bytes, Mapping, AbstractSet)) or not isinstance(xseq, Iterable):
        raise TypeError(f"an item sequence is a list of items (dicts or lists of attribute names), not a {type(xseq).__name__}")
    if sequence is None:
        return [_item(item, t) for t, item in enumerate(xseq)]
    return [_item(item, f"sequence {sequence}, item {t}") for t, item in enumerate(xseq)]


def _encodable(strings: list[str]) -> bool:
    """Whether UTF-8 can write every string of ``strings`` (no lone surrogate)."""
    try:
        "".join(strings).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_storable(items: list, labels: list[str], sequence: int) -> None:
    """Refuse the attribute names and labels of one sequence that a CRFsuite model file cannot
    hold (:func:`crf.crfsuite.unstorable_name`), as soon as it is appended: ``train`` writes one.
    The common case is checked by C-level joins; a suspect item is then looked at name by name."""
    if "\0" in "".join(labels) or max(map(len, labels)) >= MAX_KEY_BYTES // 4 or not _encodable(labels):
        for t, label in enumerate(labels):
            problem = unstorable_name(label)
            if problem is not None:
                raise ValueError(f"sequence {sequence}, item {t}: the label {label[:40]!r} {problem}")
    for t, item in enumerate(items):
        parts = item if isinstance(item, list) else [*item, *(v for v in item.values() if type(v) is str)]
        longest = max(map(len, parts), default=0)
        if "\0" not in "".join(parts) and 2 * longest + 1 < MAX_KEY_BYTES // 4 and _encodable(parts):
            continue
        for name, _ in _item_pairs(item):
            problem = unstorable_name(name)
            if problem is not None:
                raise ValueError(f"sequence {sequence}, item {t}: the attribute {name[:40]!r} {problem}")


def _labels(yseq, what: str = "yseq") -> list[str]:
    """``yseq`` as a list of ``str`` labels (``bytes`` are decoded as UTF-8; ValueError naming the
    item when they are not UTF-8)."""
    if isinstance(yseq, (str, bytes, AbstractSet, Mapping)) or not isinstance(yseq, Iterable):  # a set: no order
        raise TypeError(f"{what} must be a list of label strings, not a {type(yseq).__name__}")
    labels = list(yseq)
    try:
        "".join(labels)
    except TypeError:
        for t, label in enumerate(labels):
            if isinstance(label, bytes):
                try:
                    labels[t] = label.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{what}[{t}]: the label {label!r} is not valid UTF-8") from None
            elif not isinstance(label, str):
                raise TypeError(f"{what}[{t}] is {label!r}: labels must be strings") from None
    return labels


class ItemSequence:
    """The items of one sequence, converted once (python-crfsuite's ``ItemSequence``): pass it to
    :meth:`Trainer.append`, :meth:`Tagger.set` or :meth:`Tagger.tag` to skip the conversion.

    An item is a list of attribute names (each with value 1), or a dict: ``name: number`` (the
    attribute's value; ``True`` is 1 and ``False`` 0), ``name: str`` or ``bytes`` (the attribute
    ``name:value`` with value 1), or a dict, list or set under ``name`` (its attributes, read
    with the same rules, prefixed with ``name:``).

    Parameters
    ----------
    pyseq : list of items
        The sequence's items, as above.

    Raises
    ------
    TypeError, ValueError
        An item python-crfsuite would refuse (naming it).
    """

    __slots__ = ("_items",)

    def __init__(self, pyseq) -> None:
        self._items = _items(pyseq)

    def items(self) -> list[dict[str, float]]:
        """The attributes of every item as ``{name: value}`` dicts."""
        return [dict(_item_pairs(item)) for item in self._items]

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"<ItemSequence of size {len(self)}>"


# --- training parameters ----------------------------------------------------------------


@dataclass(frozen=True)
class _Parameter:
    """A CRFsuite training parameter: how its values are read and the :class:`crf.CRF` parameter
    it sets. ``kind``: ``"float"``, ``"int"``, ``"flag"`` or ``"linesearch"``; values must be at
    least ``low`` (above it when ``strict``); ``high`` is an upper bound for integers."""

    kind: str
    estimator: str
    low: float = 0.0
    strict: bool = False
    high: int | None = None


_PARAMETERS = {
    "feature.minfreq": _Parameter("float", "min_freq"),
    "feature.possible_states": _Parameter("flag", "all_possible_states"),
    "feature.possible_transitions": _Parameter("flag", "all_possible_transitions"),
    "c1": _Parameter("float", "c1"),
    "c2": _Parameter("float", "c2"),
    "max_iterations": _Parameter("int", "max_iterations", low=1),
    "num_memories": _Parameter("int", "num_memories", low=1),
    "epsilon": _Parameter("float", "epsilon"),
    "period": _Parameter("int", "period", low=1),
    "delta": _Parameter("float", "delta"),
    "linesearch": _Parameter("linesearch", "linesearch"),
    "max_linesearch": _Parameter("int", "max_linesearch", low=1),
    "calibration.eta": _Parameter("float", "calibration_eta", strict=True),
    "calibration.rate": _Parameter("float", "calibration_rate", low=1.0, strict=True),
    "calibration.samples": _Parameter("int", "calibration_samples", low=1),
    "calibration.candidates": _Parameter("int", "calibration_candidates", low=1),
    "calibration.max_trials": _Parameter("int", "calibration_max_trials", low=1),
    "type": _Parameter("int", "pa_type", high=2),
    "c": _Parameter("float", "c", strict=True),
    "error_sensitive": _Parameter("flag", "error_sensitive"),
    "averaging": _Parameter("flag", "averaging"),
    "variance": _Parameter("float", "variance", strict=True),
    "gamma": _Parameter("float", "gamma", strict=True),
}

_EPOCH_LOSS = "Stop when the loss of an epoch divided by the number of instances is below this."
# what each parameter means; keyed (algorithm, name) where it depends on the algorithm
_HELP = {
    "feature.minfreq": "Features (attribute-label and label-label pairs) seen less often than this are left out.",
    "feature.possible_states": "1: a state feature for every attribute with every label; 0: for the pairs seen in training.",
    "feature.possible_transitions": "1: a transition feature for every pair of labels; 0: for the pairs seen in training.",
    "c1": "The coefficient of the L1 regularisation term (0: no L1; above 0 the weights are trained by OWL-QN).",
    "c2": "The coefficient of the L2 regularisation term.",
    "max_iterations": "The largest number of iterations.",
    "num_memories": "How many recent steps L-BFGS keeps to approximate the inverse Hessian.",
    "epsilon": "Stop when the gradient norm divided by max(1, weight norm) is below this.",
    "period": "The number of iterations over which the improvement of the loss is measured (see delta).",
    "delta": "Stop when the loss improved by less than this fraction over the last `period` iterations.",
    "linesearch": "The line search of L-BFGS: MoreThuente (with c1 = 0, the one available); with c1 > 0 OWL-QN backtracks.",
    "max_linesearch": "The largest number of trials of one line search.",
    "calibration.eta": "The learning rate the calibration of SGD's initial learning rate starts from.",
    "calibration.rate": "The factor by which the calibration raises or lowers the learning rate.",
    "calibration.samples": "The number of instances the calibration trains on.",
    "calibration.candidates": "The number of learning rates that must lower the loss before the calibration stops.",
    "calibration.max_trials": "The largest number of learning rates the calibration tries.",
    "type": "The passive-aggressive update: 0 (no slack variable), 1 (PA-I) or 2 (PA-II).",
    "c": "The aggressiveness of PA-I and PA-II: larger values allow larger updates.",
    "error_sensitive": "1: the square root of the number of wrong labels enters the cost; 0: it does not.",
    "averaging": "1: the result is the average of the weights over all updates; 0: the last weights.",
    "variance": "The initial variance of every weight.",
    "gamma": "The trade-off between the loss and the change of the weights.",
    ("l2sgd", "max_iterations"): "The largest number of epochs (passes over the training data).",
    ("l2sgd", "delta"): "Stop when the loss improved by less than this fraction over the last `period` epochs.",
    ("averaged-perceptron", "epsilon"): _EPOCH_LOSS,
    ("passive-aggressive", "epsilon"): _EPOCH_LOSS,
    ("arow", "epsilon"): _EPOCH_LOSS,
}

_FEATURE_DEFAULTS = (("feature.minfreq", 0.0), ("feature.possible_states", False), ("feature.possible_transitions", False))
_INT_MAX = 2**31 - 1  # CRFsuite's "no limit" for L-BFGS iterations
# the parameters of each algorithm, in CRFsuite's order, with CRFsuite's defaults
_DEFAULTS = {
    "lbfgs": _FEATURE_DEFAULTS + (
        ("c1", 0.0), ("c2", 1.0), ("max_iterations", _INT_MAX), ("num_memories", 6), ("epsilon", 1e-5),
        ("period", 10), ("delta", 1e-5), ("linesearch", "MoreThuente"), ("max_linesearch", 20),
    ),
    "l2sgd": _FEATURE_DEFAULTS + (
        ("c2", 1.0), ("max_iterations", 1000), ("period", 10), ("delta", 1e-6), ("calibration.eta", 0.1),
        ("calibration.rate", 2.0), ("calibration.samples", 1000), ("calibration.candidates", 10), ("calibration.max_trials", 20),
    ),
    "averaged-perceptron": _FEATURE_DEFAULTS + (("max_iterations", 100), ("epsilon", 0.0)),
    "passive-aggressive": _FEATURE_DEFAULTS + (
        ("type", 1), ("c", 1.0), ("error_sensitive", True), ("averaging", True), ("max_iterations", 100), ("epsilon", 0.0),
    ),
    "arow": _FEATURE_DEFAULTS + (("variance", 1.0), ("gamma", 1.0), ("max_iterations", 100), ("epsilon", 0.0)),
}  # fmt: skip
_ALIASES = {"ap": "averaged-perceptron", "pa": "passive-aggressive"}
_ESTIMATOR_ALGORITHM = {
    "lbfgs": "lbfgs",
    "l2sgd": "l2sgd",
    "averaged-perceptron": "ap",
    "passive-aggressive": "pa",
    "arow": "arow",
}


def _number(name: str, value) -> float:
    """A finite number given as a number or as text (CRFsuite takes parameters as strings)."""
    if isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # an int beyond a float's range
            bits = int(value).bit_length()
            raise ValueError(f"parameter {name}: an integer of {bits:,} bits, too large for any setting") from None
    elif isinstance(value, (str, bytes)):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"parameter {name}: {value!r} is not a number") from None
    else:
        raise ValueError(f"parameter {name}: {value!r} is not a number")
    if not math.isfinite(number):
        raise ValueError(f"parameter {name} must be finite, got {value!r}")
    return number


def _parse(name: str, value):
    """The value of parameter ``name`` read from ``value``; ValueError when it is not allowed."""
    spec = _PARAMETERS[name]
    if spec.kind == "linesearch":
        if value not in hyper.LINESEARCHES:
            raise ValueError(f"parameter linesearch must be one of {', '.join(hyper.LINESEARCHES)}, got {value!r}")
        return value
    number = _number(name, value)
    if spec.kind == "flag":
        if number not in (0.0, 1.0):
            raise ValueError(f"parameter {name} must be 0 or 1 (or False or True), got {value!r}")
        return bool(number)
    if spec.kind == "int":
        if not number.is_integer():
            raise ValueError(f"parameter {name} must be an integer, got {value!r}")
        number = int(number)
    if number < spec.low or (spec.strict and number == spec.low) or (spec.high is not None and number > spec.high):
        bound = f"> {spec.low:g}" if spec.strict else f">= {spec.low:g}"
        if spec.high is not None:
            bound += f" and <= {spec.high}"
        raise ValueError(f"parameter {name} must be {bound}, got {value!r}")
    return number


# --- the training log ---------------------------------------------------------------------

LabelScore = namedtuple("LabelScore", "match model ref precision recall f1")

_HEAD = re.compile(r"\*{5} (?:Iteration|Epoch) #(\d+) \*{5}\n")
_FEATURES = re.compile(r"Number of features: (\d+)")
_SECONDS = re.compile(r"Seconds required: (\d+\.\d+)")
_TOTAL = re.compile(r"Total seconds required for training: (\d+\.\d+)")
_ITERATION_FIELDS = (
    ("loss", re.compile(r"Loss: (\d+\.\d+)"), float),
    ("feature_norm", re.compile(r"Feature norm: (\d+\.\d+)"), float),
    ("error_norm", re.compile(r"Error norm: (\d+\.\d+)"), float),
    ("active_features", re.compile(r"Active features: (\d+)"), int),
    ("linesearch_trials", re.compile(r"Line search trials: (\d+)"), int),
    ("linesearch_step", re.compile(r"Line search step: (\d+\.\d+)"), float),
    ("time", re.compile(r"Seconds required for this iteration: (\d+\.\d+)"), float),
)
_MACRO = re.compile(r"Macro-average precision, recall, F1: \((\d\.\d+), (\d\.\d+), (\d\.\d+)\)")
_ACCURACY = re.compile(r"(Item|Instance) accuracy: (\d+) / (\d+)")
_LABEL = re.compile(r"\s{4}(.+): \((\d+), (\d+), (\d+)\) \((\d\.\d+), (\d\.\d+), (\d\.\d+)\)")
_UNSEEN_LABEL = re.compile(r"\s{4}(.+): \(0, 0, 0\) \(\*{6}, \*{6}, \*{6}\)")
_PROGRESS = frozenset("0123456789.") | {"10"}


class TrainLogParser:
    """Reads CRFsuite's training log, one message at a time (:meth:`feed`), into figures and
    events (python-crfsuite's ``TrainLogParser``).

    ``iterations``: one dict per iteration with the fields the log gives (``num``, ``loss``,
    ``feature_norm``, ``error_norm``, ``active_features``, ``linesearch_trials``,
    ``linesearch_step``, ``time``, ``scores`` {label: :data:`LabelScore`} and, with holdout
    evaluation, ``avg_precision``, ``avg_recall``, ``avg_f1``, ``item_accuracy`` and
    ``instance_accuracy`` (fractions, with ``_float`` twins)); ``last_iteration``;
    ``featgen_num_features``, ``featgen_seconds``, ``featgen_percent``; ``training_seconds``;
    ``storing_seconds``; ``log`` (every message) and ``events`` ((event, first, end) message
    ranges).
    """

    def __init__(self) -> None:
        self.state: str | None = None
        self.featgen_percent = -2
        self.featgen_num_features: int | None = None
        self.featgen_seconds: float | None = None
        self.training_seconds: float | None = None
        self.storing_seconds: float | None = None
        self.iterations: list[dict] = []
        self.last_iteration: dict | None = None
        self.log: list[str] = []
        self.events: list[tuple[str, int, int]] = []

    def feed(self, line: str) -> str | None:
        """Read one message of the training log.

        Parameters
        ----------
        line : str
            The message (a line, or a progress mark).

        Returns
        -------
        str or None
            The event it completes (``start``, ``featgen_progress``, ``featgen_end``, ``prepared``,
            ``prepare_error``, ``iteration``, ``optimization_end``, ``end``), or None.
        """
        self.log.append(line)
        if self.state is None:
            self.state = "FEATGEN" if line.startswith("Feature generation") else "STARTING"
            self.events.append(("start", 0, len(self.log)))
            return "start"
        event = getattr(self, "_" + self.state.lower())(line)
        if event is not None:
            end = len(self.log)
            if event in ("prepared", "optimization_end"):  # the line that shows it begins the next part
                end -= 1
            self.events.append((event, self.events[-1][2], end))
        return event

    @property
    def last_log(self) -> str:
        """The messages of the latest event."""
        _, first, end = self.events[-1]
        return "".join(self.log[first:end])

    @staticmethod
    def _head(line: str) -> int | None:
        match = _HEAD.match(line)
        return int(match.group(1)) if match else None

    def _starting(self, line: str) -> None:
        if line.startswith("Feature generation"):
            self.state = "FEATGEN"

    def _featgen(self, line: str) -> str | None:
        if line in _PROGRESS:
            self.featgen_percent += 2
            return "featgen_progress"
        match = _FEATURES.match(line)
        if match:
            self.featgen_num_features = int(match.group(1))
            return None
        match = _SECONDS.match(line)
        if match:
            self.featgen_seconds = float(match.group(1))
            self.state = "AFTER_FEATGEN"
            return "featgen_end"
        return None

    def _after_featgen(self, line: str) -> str | None:
        if self._head(line) is not None:
            self.state = "ITERATION"
            self._iteration(line)
            return "prepared"
        if "terminated with error" in line:
            self.state = "AFTER_ITERATION"
            return "prepare_error"
        return None

    def _iteration(self, line: str) -> str | None:
        number = self._head(line)
        if number is not None:
            self.last_iteration = {"num": number, "scores": {}}
            self.iterations.append(self.last_iteration)
            return None
        if line == "\n":
            self.state = "AFTER_ITERATION"
            return "iteration"
        record = self.last_iteration
        for key, pattern, kind in _ITERATION_FIELDS:
            match = pattern.match(line)
            if match:
                record[key] = kind(match.group(1))
                return None
        match = _MACRO.match(line)
        if match:
            record["avg_precision"], record["avg_recall"], record["avg_f1"] = map(float, match.groups())
            return None
        match = _ACCURACY.match(line)
        if match:
            if int(match.group(3)):
                key = "item_accuracy" if match.group(1) == "Item" else "instance_accuracy"
                record[key] = Fraction(int(match.group(2)), int(match.group(3)))
                record[key + "_float"] = float(record[key])
            return None
        match = _LABEL.match(line)
        if match:
            counts, rates = map(int, match.group(2, 3, 4)), map(float, match.group(5, 6, 7))
            record["scores"][match.group(1)] = LabelScore(*counts, *rates)
            return None
        match = _UNSEEN_LABEL.match(line)
        if match:
            record["scores"][match.group(1)] = LabelScore(0, 0, 0, None, None, None)
        return None

    def _after_iteration(self, line: str) -> str | None:
        if self._head(line) is not None:
            self.state = "ITERATION"
            return self._iteration(line)
        match = _TOTAL.match(line)
        if match:
            self.training_seconds = float(match.group(1))
        if line.startswith("Storing the model"):
            self.state = "STORING"
            return "optimization_end"
        return None

    def _storing(self, line: str) -> str | None:
        if line == "\n":
            return "end"
        match = _SECONDS.match(line)
        if match:
            self.storing_seconds = float(match.group(1))
        return None


def _evaluation_lines(labels: list[str], reference: list[list[str]], predicted: list[list[str]]) -> list[str]:
    """CRFsuite's report of a holdout evaluation: per label (#match, #model, #ref) and precision,
    recall, F1 (stars for labels absent from the reference), the macro averages over all
    ``labels`` and the item and instance accuracies."""
    flat_reference = list(chained.from_iterable(reference))
    flat_predicted = list(chained.from_iterable(predicted))
    refs = Counter(flat_reference)
    model = Counter(flat_predicted)
    match = Counter(r for r, p in zip(flat_reference, flat_predicted) if r == p)
    lines = ["Performance by label (#match, #model, #ref) (precision, recall, F1):\n"]
    totals = [0.0, 0.0, 0.0]
    for label in labels:
        m, p, r = match[label], model[label], refs[label]
        if r == 0:
            lines.append(f"    {label}: ({m}, {p}, {r}) (******, ******, ******)\n")
            continue
        precision = m / p if p else 0.0
        recall = m / r
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        totals = [totals[0] + precision, totals[1] + recall, totals[2] + f1]
        lines.append(f"    {label}: ({m}, {p}, {r}) ({precision:1.4f}, {recall:1.4f}, {f1:1.4f})\n")
    n = max(len(labels), 1)
    lines.append("Macro-average precision, recall, F1: ({:f}, {:f}, {:f})\n".format(*(t / n for t in totals)))
    items, correct = len(flat_reference), sum(match.values())
    whole = sum(r == p for r, p in zip(reference, predicted))
    lines.append(f"Item accuracy: {correct} / {items} ({correct / items if items else 0.0:1.4f})\n")
    lines.append(f"Instance accuracy: {whole} / {len(reference)} ({whole / len(reference) if reference else 0.0:1.4f})\n")
    return lines


def _active_attributes_only(model: CRFsuiteModel) -> CRFsuiteModel:
    """``model`` without the attributes that have no state feature (CRFsuite writes only those
    with a non-zero weight), the others renumbered in their order."""
    attribute, label, weight = model.state_features
    used = np.unique(attribute)
    column = np.full(len(model.attributes), -1, dtype=np.int64)
    column[used] = np.arange(used.size)
    names = [model.attributes[i] for i in used.tolist()]
    return CRFsuiteModel(model.labels, names, StateFeatures(column[attribute], label, weight), model.transitions)


_EMPTY_MODEL = CRFsuiteModel([], [], StateFeatures(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)), np.zeros((0, 0)))


class _Training:
    """One run of :meth:`BaseTrainer.train`: the estimator's fit, reported as CRFsuite's log
    through the trainer's ``message``."""

    def __init__(self, trainer: BaseTrainer, holdout: int) -> None:
        self.say = trainer.message
        self.algorithm = trainer._algorithm
        self.values = dict(trainer._values)
        train = [i for i, group in enumerate(trainer._groups) if group != holdout]
        held = [i for i, group in enumerate(trainer._groups) if group == holdout] if holdout >= 0 else []
        self.X = [trainer._xseqs[i] for i in train]
        self.y = [trainer._yseqs[i] for i in train]
        self.X_dev = [trainer._xseqs[i] for i in held] or None
        self.y_dev = [trainer._yseqs[i] for i in held] or None
        self.holdout = holdout
        # the labels of all instances in order of first appearance: CRFsuite's label ids
        self.all_labels = list(dict.fromkeys(chained.from_iterable(trainer._yseqs)))
        self.classes = list(dict.fromkeys(chained.from_iterable(self.y)))
        self.began = time.perf_counter()
        self.prepared = False
        self.n_features = 0
        self.previous = (0.0, 1)  # elapsed seconds and objective evaluations after the last iteration
        self.iterations: list[IterationInfo] = []

    def lines(self, *lines: str) -> None:
        for line in lines:
            self.say(line + "\n")

    # the parts of the log, in order

    def start(self) -> None:
        if self.holdout >= 0:
            self.lines(f"Holdout group: {self.holdout + 1}", "")
        v = self.values
        self.lines(
            "Feature generation",
            "type: CRF1d",
            f"feature.minfreq: {v['feature.minfreq']:f}",
            f"feature.possible_states: {int(v['feature.possible_states'])}",
            f"feature.possible_transitions: {int(v['feature.possible_transitions'])}",
        )

    def featgen_end(self, n_state_features: int, iteration_seconds: float) -> None:
        """The end of feature generation and the algorithm's parameters (written when the first
        iteration reports, as the number of features is known from then)."""
        L = len(self.classes)
        self.n_features = n_state_features + (L * L if self.values["feature.possible_transitions"] else self._transition_count())
        for percent in range(11):
            self.say(str(percent))
            if percent < 10:
                for _ in range(4):
                    self.say(".")
        self.say("\n")
        seconds = time.perf_counter() - self.began - iteration_seconds
        self.lines(f"Number of features: {self.n_features}", f"Seconds required: {seconds:.3f}", "")
        self.lines(*self._parameter_lines(), "")
        self.prepared = True

    def _transition_count(self) -> int:
        """Label pairs seen at least max(feature.minfreq, 1) times: the transition features."""
        pairs = Counter(pair for labels in self.y for pair in zip(labels, labels[1:]))
        least = max(self.values["feature.minfreq"], 1.0)
        return sum(count >= least for count in pairs.values())

    def _parameter_lines(self) -> list[str]:
        v = self.values
        if self.algorithm == "lbfgs":
            return [
                "L-BFGS optimization", f"c1: {v['c1']:f}", f"c2: {v['c2']:f}", f"num_memories: {v['num_memories']}",
                f"max_iterations: {v['max_iterations']}", f"epsilon: {v['epsilon']:f}", f"stop: {v['period']}",
                f"delta: {v['delta']:f}", f"linesearch: {v['linesearch']}", f"linesearch.max_iterations: {v['max_linesearch']}",
            ]  # fmt: skip
        if self.algorithm == "l2sgd":
            samples = min(v["calibration.samples"], len(self.X))
            return [
                "Stochastic Gradient Descent (SGD)", f"c2: {v['c2']:f}", f"max_iterations: {v['max_iterations']}",
                f"period: {v['period']}", f"delta: {v['delta']:f}", "", "Calibrating the learning rate (eta)",
                f"calibration.eta: {v['calibration.eta']:f}", f"calibration.rate: {v['calibration.rate']:f}",
                f"calibration.samples: {samples}", f"calibration.candidates: {v['calibration.candidates']}",
                f"calibration.max_trials: {v['calibration.max_trials']}",
            ]  # fmt: skip
        title = {"averaged-perceptron": "Averaged perceptron", "arow": "Adaptive Regularization of Weights (AROW)"}
        if self.algorithm == "passive-aggressive":
            head = ["Passive Aggressive", f"type: {v['type']}", f"c: {v['c']:f}"]
            head += [f"error_sensitive: {int(v['error_sensitive'])}", f"averaging: {int(v['averaging'])}"]
        elif self.algorithm == "arow":
            head = [title["arow"], f"variance: {v['variance']:f}", f"gamma: {v['gamma']:f}"]
        else:
            head = [title["averaged-perceptron"]]
        return head + [f"max_iterations: {v['max_iterations']}", f"epsilon: {v['epsilon']:f}"]

    def iteration(self, info: IterationInfo) -> None:
        """The estimator's callback: one iteration's block, with the holdout evaluation."""
        seconds = info.elapsed - self.previous[0]
        if not self.prepared:
            L = len(self.classes)
            self.featgen_end(info.theta.size - L * L - 2 * L if info.theta is not None else 0, info.elapsed)
        self.iterations.append(info)
        if self.algorithm == "l2sgd":
            self.lines(f"***** Epoch #{info.iteration} *****", f"Loss: {info.loss:f}", f"Feature L2-norm: {info.feature_norm:f}")
        else:
            self.lines(f"***** Iteration #{info.iteration} *****", f"Loss: {info.loss:f}", f"Feature norm: {info.feature_norm:f}")
        if self.algorithm == "lbfgs":
            self.lines(f"Error norm: {info.gradient_norm:f}", f"Active features: {info.active_features}")
            if info.evaluations:
                self.lines(f"Line search trials: {info.evaluations - self.previous[1]}")
        self.lines(f"Seconds required for this iteration: {seconds:.3f}")
        if self.y_dev is not None and getattr(info, "dev_predictions", None) is not None:
            for line in _evaluation_lines(self.all_labels, self.y_dev, info.dev_predictions):
                self.say(line)
        self.say("\n")
        self.previous = (info.elapsed, info.evaluations)

    def optimization_end(self, reason: str) -> None:
        lines = []
        if self.algorithm == "lbfgs":
            messages = {
                "max_iterations": "L-BFGS terminated with the maximum number of iterations",
                "delta": "L-BFGS terminated with the stopping criteria",
                "epsilon": "L-BFGS resulted in convergence",
                "converged": "L-BFGS resulted in convergence",
            }
            lines.append(messages.get(reason, f"L-BFGS terminated with error ({reason})"))
        elif self.algorithm == "l2sgd":
            stop = "stopping criteria" if reason == "delta" else "maximum number of iterations"
            lines += [f"SGD terminated with the {stop}", f"Loss: {min((i.loss for i in self.iterations), default=0.0):f}"]
        elif reason == "epsilon":
            lines += ["Terminated with the stopping criterion", ""]
        seconds = self.iterations[-1].elapsed if self.iterations else 0.0
        self.lines(*lines, f"Total seconds required for training: {seconds:.3f}", "")

    def no_data(self) -> None:
        """CRFsuite's log when no instance is left for training: no features, no iterations."""
        self.featgen_end(0, 0.0)
        if self.algorithm == "lbfgs":
            self.lines("L-BFGS terminated with error code (-1020)")  # liblbfgs: no variables to optimise
        else:
            self.lines(f"{self._parameter_lines()[0]} terminated with error (no training instances)")
        self.lines("Total seconds required for training: 0.000", "")

    def store(self, path: str, model: CRFsuiteModel, n_attributes: int) -> None:
        began = time.perf_counter()
        self.say("Storing the model\n")
        active = model.state_features.weight.size + int(np.count_nonzero(model.transitions))
        L = len(model.labels)
        self.lines(
            f"Number of active features: {active} ({self.n_features})",
            f"Number of active attributes: {len(model.attributes)} ({n_attributes})",
            f"Number of active labels: {L} ({L})",
        )
        self.say("Writing labels\n")
        self.say("Writing attributes\n")
        self.say("Writing feature references for transitions\n")
        self.say("Writing feature references for attributes\n")
        write_crfsuite(path, model)
        self.lines(f"Seconds required: {time.perf_counter() - began:.3f}", "")

    def estimator(self) -> CRF:
        """The :class:`crf.CRF` with this run's algorithm and parameters (CRFsuite's model: no
        start/end weights) and the log as its callback."""
        settings = {_PARAMETERS[name].estimator: value for name, value in self.values.items()}
        return CRF(
            algorithm=_ESTIMATOR_ALGORITHM[self.algorithm],
            boundary_transitions=False,
            dev_every=1,
            callback=self.iteration,
            **settings,
        )

    def run(self, path: str) -> None:
        estimator = self.estimator()
        estimator.validate_params()  # before any work or output
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder is not None and not os.path.isdir(folder):
            raise FileNotFoundError(f"cannot write the model to {path!r}: no folder {folder!r}")
        self.start()
        if not self.X:
            log.warning("no instances to train on (holdout group %d): the model is empty", self.holdout)
            self.no_data()
            if path:
                self.store(path, _EMPTY_MODEL, 0)
            return
        estimator.fit(self.X, self.y, self.X_dev, self.y_dev)
        if not self.prepared:  # no iteration reported (nothing to optimise)
            index = estimator.feature_index_
            self.featgen_end(index.size if index is not None else estimator.state_weights_.size, 0.0)
        self.optimization_end(estimator.stop_reason_)
        if path:
            self.store(path, _active_attributes_only(crfsuite_from_crf(estimator)), estimator.n_attributes_)


class BaseTrainer:
    """Trains a CRF on appended instances and writes it as a CRFsuite model file
    (python-crfsuite's ``BaseTrainer``: ``message`` prints the raw log when ``verbose``).

    Parameters
    ----------
    algorithm : str, optional
        ``"lbfgs"`` (the default), ``"l2sgd"``, ``"ap"`` (``"averaged-perceptron"``), ``"pa"``
        (``"passive-aggressive"``) or ``"arow"`` (see :meth:`select`).
    params : dict, optional
        CRFsuite parameters ``{name: value}`` (see :meth:`set_params`).
    verbose : bool, default=True
        Show the training log.

    Raises
    ------
    ValueError
        An unknown algorithm, parameter name or a bad value.
    """

    verbose: bool | None = None

    def __new__(cls, *args, **kwargs):
        # the state lives here, so that subclasses whose __init__ does not call this class's
        # still work (python-crfsuite sets it up in Cython's __cinit__)
        self = super().__new__(cls)
        self._xseqs: list[list] = []
        self._yseqs: list[list[str]] = []
        self._groups: list[int] = []
        self._select("lbfgs")
        return self

    def __init__(self, algorithm: str | None = None, params: dict | None = None, verbose: bool = True) -> None:
        if algorithm is not None:
            self.select(algorithm)
        if params is not None:
            self.set_params(params)
        self.verbose = verbose

    def message(self, message: str) -> None:
        """Receives the training log, a line (or a progress mark) at a time; prints it when
        ``verbose``. Override it to handle the log; an exception raised here stops training.

        Parameters
        ----------
        message : str
            Part of CRFsuite's training log text.
        """
        if self.verbose:
            _show(message)

    def append(self, xseq, yseq, group: int = 0) -> None:
        """Add an instance: ``xseq`` (items, see :class:`ItemSequence`) labelled ``yseq`` (label
        strings, one per item). ``group`` numbers it for :meth:`train`'s ``holdout``.

        Parameters
        ----------
        xseq : list of items, or ItemSequence
            Each item a dict ``{attribute: value}`` or a list of attribute strings; not empty.
        yseq : sequence of str
            One label per item.
        group : int, default=0
            The instance's group number.

        Raises
        ------
        TypeError
            ``xseq`` not a list of items, a label that is not a string, or ``group`` not an integer.
        ValueError
            Different numbers of items and labels, an empty sequence, or a label or attribute name
            CRFsuite cannot store (naming sequence and item).
        """
        sequence = len(self._xseqs)
        items = _items(xseq, sequence)
        labels = _labels(yseq, f"sequence {sequence}: yseq")
        if len(items) != len(labels):
            raise ValueError(f"the numbers of items and labels differ: {len(items)} items, {len(labels)} labels")
        if not items:
            raise ValueError("an empty item sequence cannot be appended (it holds nothing to train on)")
        _check_storable(items, labels, sequence)
        if isinstance(group, bool) or not isinstance(group, numbers.Integral):
            raise TypeError(f"group must be an integer, got {group!r}")
        self._xseqs.append(items)
        self._yseqs.append(labels)
        self._groups.append(int(group))

    def _select(self, algorithm: str) -> None:
        self._algorithm = algorithm
        self._values = dict(_DEFAULTS[algorithm])

    def select(self, algorithm: str, type: str = "crf1d") -> None:
        """Choose the training algorithm (``lbfgs``, ``l2sgd``, ``ap``/``averaged-perceptron``,
        ``pa``/``passive-aggressive``, ``arow``; ``type`` must be ``crf1d``). The parameters go
        back to the algorithm's defaults, as in CRFsuite.

        Parameters
        ----------
        algorithm : str
            The algorithm's name (any case).
        type : str, default="crf1d"
            The graphical model; only ``"crf1d"``.

        Raises
        ------
        ValueError
            An unknown algorithm or type.
        """
        name = algorithm.lower() if isinstance(algorithm, str) else algorithm
        name = _ALIASES.get(name, name)
        if name not in _DEFAULTS or type != "crf1d":
            known = ", ".join(sorted(set(_DEFAULTS) | set(_ALIASES)))
            raise ValueError(f"bad arguments: algorithm={algorithm!r}, type={type!r} (algorithms: {known}; type: 'crf1d')")
        self._select(name)

    def params(self) -> list[str]:
        """The parameter names of the selected algorithm."""
        return list(self._values)

    def _check_name(self, name: str) -> None:
        if name not in self._values:
            raise ValueError(f"parameter not found: {name!r} (the parameters of {self._algorithm} are {', '.join(self._values)})")

    def set(self, name: str, value) -> None:
        """Set parameter ``name`` (a CRFsuite name such as ``c2``, ``max_iterations`` or
        ``feature.possible_transitions``) to ``value`` (a number, a bool or their text).

        Parameters
        ----------
        name : str
            A parameter of the selected algorithm (see :meth:`params`).
        value : int, float, bool or str
            Its value; text is parsed as CRFsuite parses it.

        Raises
        ------
        ValueError
            An unknown name, or a value of the wrong kind or out of range.
        """
        self._check_name(name)
        self._values[name] = _parse(name, value)

    def get(self, name: str):
        """The value of parameter ``name``.

        Parameters
        ----------
        name : str
            A parameter of the selected algorithm.

        Returns
        -------
        float, int, bool or str
            Its value (``calibration.samples`` as a float, as python-crfsuite gives it).

        Raises
        ------
        ValueError
            An unknown name.
        """
        self._check_name(name)
        value = self._values[name]
        return float(value) if name == "calibration.samples" else value  # python-crfsuite's type for it

    def set_params(self, params: dict) -> None:
        """Set several parameters ``{name: value}``; all are checked before any is set.

        Parameters
        ----------
        params : dict
            ``{name: value}``, as :meth:`set` takes them.

        Raises
        ------
        ValueError
            An unknown name or a bad value; then none is set.
        """
        parsed = {}
        for name, value in params.items():
            self._check_name(name)
            parsed[name] = _parse(name, value)
        self._values.update(parsed)

    def get_params(self) -> dict:
        """``{name: value}`` for every parameter of the selected algorithm.

        Returns
        -------
        dict
            As :meth:`get` gives each value.
        """
        return {name: self.get(name) for name in self.params()}

    def help(self, name: str) -> str:
        """What parameter ``name`` of the selected algorithm means.

        Parameters
        ----------
        name : str
            A parameter of the selected algorithm.

        Returns
        -------
        str
            Its description.

        Raises
        ------
        ValueError
            An unknown name.
        """
        self._check_name(name)
        return _HELP.get((self._algorithm, name), _HELP[name])

    def clear(self) -> None:
        """Remove every appended instance."""
        self._xseqs, self._yseqs, self._groups = [], [], []

    def train(self, model: str | os.PathLike, holdout: int = -1) -> None:
        """Train on the appended instances and write the model to the CRFsuite file ``model``
        (none when ``model`` is empty). The instances of group ``holdout`` (if >= 0) are not
        trained on but tagged after every iteration, and the log reports their accuracy.

        Parameters
        ----------
        model : str or os.PathLike
            The model file to write (``""``: none).
        holdout : int, default=-1
            The group to hold out; -1: none.

        Raises
        ------
        TypeError
            ``holdout`` is not an integer.
        """
        if isinstance(holdout, bool) or not isinstance(holdout, numbers.Integral):
            raise TypeError(f"holdout must be an integer group number (or -1), got {holdout!r}")
        path = os.fspath(model)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if path:
            check_model_filename(path, what="model")
        self._before_train()
        _Training(self, int(holdout)).run(path)

    def _before_train(self) -> None:
        pass


def _show(text: str) -> None:
    """python-crfsuite's verbose output: the log on standard output."""
    sys.stdout.write(text)


class Trainer(BaseTrainer):
    """:class:`BaseTrainer` that parses its log (``logparser``, a :class:`TrainLogParser` made by
    every :meth:`train`) and calls ``on_*`` methods per event when ``verbose``; they print the
    event's part of the log. Override them to report training differently.

    Parameters
    ----------
    algorithm, params, verbose
        As :class:`BaseTrainer`.
    """

    logparser: TrainLogParser | None = None

    def _before_train(self) -> None:
        self.logparser = TrainLogParser()

    def message(self, message: str) -> None:
        if self.logparser is None:
            self.logparser = TrainLogParser()
        event = self.logparser.feed(message)
        if not self.verbose or event is None:
            return
        text = self.logparser.last_log
        if event == "featgen_progress":
            self.on_featgen_progress(text, self.logparser.featgen_percent)
        elif event == "iteration":
            self.on_iteration(text, self.logparser.last_iteration)
        else:
            getattr(self, "on_" + event)(text)

    def on_start(self, log: str) -> None:
        """Training starts (the log's first message). Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        """
        _show(log)

    def on_featgen_progress(self, log: str, percent: int) -> None:
        """Feature generation progresses. Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        percent : int
            Its progress, 0 to 100.
        """
        _show(log)

    def on_featgen_end(self, log: str) -> None:
        """Feature generation ends. Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        """
        _show(log)

    def on_prepared(self, log: str) -> None:
        """Training is prepared (before the first iteration). Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        """
        _show(log)

    def on_prepare_error(self, log: str) -> None:
        """Preparing the data failed (python-crfsuite's event). Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        """
        _show(log)

    def on_iteration(self, log: str, info: dict) -> None:
        """An iteration ended. Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        info : dict
            Its figures, as :attr:`TrainLogParser.last_iteration` (``num``, ``loss``, ...).
        """
        _show(log)

    def on_optimization_end(self, log: str) -> None:
        """The optimiser stopped. Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        """
        _show(log)

    def on_end(self, log: str) -> None:
        """Training ended (the log's last part). Prints ``log``; override to report it otherwise.

        Parameters
        ----------
        log : str
            The log text of the event.
        """
        _show(log)


# --- tagging ------------------------------------------------------------------------------


def _item_pairs(item) -> Iterable[tuple[str, float]]:
    """(attribute, value) of every attribute of an item kept by :func:`_item`, in order."""
    if isinstance(item, list):
        return zip(item, repeat(1.0))
    return ((f"{key}:{value}", 1.0) if type(value) is str else (key, float(value)) for key, value in item.items())


class Tagger:
    """Tags item sequences with a CRFsuite model file (python-crfsuite's ``Tagger``).

    ``open``/``open_inmemory`` load a model and return a context manager that closes it;
    :meth:`set` (or :meth:`tag` with a sequence) makes a sequence current, and :meth:`tag`,
    :meth:`probability` and :meth:`marginal` query it. Scores are CRFsuite's: the sum of
    ``value * weight`` over an item's known attributes, plus the transition weights.
    """

    # class-level defaults: a subclass's __init__ need not call this class's
    _model: CRFsuiteModel | None = None
    _header: tuple | None = None
    _columns: dict[str, int] = {}  # attribute -> its id in the model
    _pairs: dict[str, dict[str, int]] | None = None  # pair_table(_columns), made by the first set()
    _label_ids: dict[str, int] = {}
    # the state features by attribute, as CRFsuite's tagger reads them: attribute a's are
    # _state_label[_state_first[a]:_state_first[a + 1]] with weights _state_weight[...]
    _state_first: np.ndarray | None = None  # (A + 1,)
    _state_label: np.ndarray | None = None  # (K,)
    _state_weight: np.ndarray | None = None  # (K,)
    _zeros: np.ndarray | None = None  # (L,) start and end weights (CRFsuite's files have none)
    _emissions: np.ndarray | None = None  # (T, L) of the current sequence
    _marginals: np.ndarray | None = None  # (T, L), made by the first marginal() query

    def open(self, name: str | os.PathLike) -> contextlib.closing:
        """Load the CRFsuite model file ``name`` (any model open before is closed first).

        Parameters
        ----------
        name : str or os.PathLike
            A CRFsuite first-order model file.

        Returns
        -------
        contextlib.closing
            A context manager that closes the tagger: ``with tagger.open(path): ...``.

        Raises
        ------
        OSError
            The file cannot be read.
        ValueError
            Not a valid CRFsuite model (a :class:`crf.CRFsuiteFormatError` for a damaged one).
        """
        self.close()
        with open(name, "rb") as file:
            head = file.read(HEADER_SIZE + 1)
            if head[:4] != MAGIC:
                raise ValueError(f"invalid model file {os.fspath(name)!r}: not a CRFsuite model (no {MAGIC!r} signature)")
            if len(head) <= HEADER_SIZE:
                raise ValueError(f"model file {os.fspath(name)!r} does not have a complete header")
            size, declared = os.fstat(file.fileno()).st_size, int.from_bytes(head[4:8], "little")
            if size != declared:  # checked before reading it all
                raise ValueError(f"model file {os.fspath(name)!r} has {size} bytes, its header says {declared}")
            data = head + file.read()
        self._load(data, name)
        return contextlib.closing(self)

    def open_inmemory(self, value: bytes) -> contextlib.closing:
        """Load a model from ``value``, the bytes of a CRFsuite model file.

        Parameters
        ----------
        value : bytes or bytearray
            The whole content of a CRFsuite first-order model file.

        Returns
        -------
        contextlib.closing
            A context manager that closes the tagger.

        Raises
        ------
        TypeError
            ``value`` is not bytes.
        ValueError
            Not a valid CRFsuite model.
        """
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"open_inmemory needs the model's bytes, not {type(value).__name__}")
        self.close()
        if bytes(value[:4]) != MAGIC:
            raise ValueError(f"invalid model: not a CRFsuite model (no {MAGIC!r} signature)")
        if len(value) < HEADER_SIZE:
            raise ValueError(f"invalid model: {len(value)} bytes, an incomplete header")
        self._load(bytes(value), "<memory>")
        return contextlib.closing(self)

    def _load(self, data: bytes, name) -> None:
        model = parse_crfsuite(data, name)  # checks every size and offset: a damaged file raises ValueError
        L = len(model.labels)
        attribute, label, weight = model.state_features
        order = np.argsort(attribute, kind="stable")  # by attribute, each one's in file order
        self._state_first = np.concatenate([[0], np.cumsum(np.bincount(attribute, minlength=len(model.attributes)))])
        self._state_label, self._state_weight = label[order].astype(np.int64), weight[order].astype(np.float64)
        self._model, self._header = model, _HEADER.unpack_from(data)
        self._columns = dict(zip(model.attributes, range(len(model.attributes))))
        self._pairs = None
        self._label_ids = dict(zip(model.labels, range(L)))
        self._emissions, self._zeros = np.zeros((0, L)), np.zeros(L)
        self._marginals = None

    def close(self) -> None:
        """Unload the model."""
        self._model = self._header = self._zeros = self._emissions = self._marginals = None
        self._state_first = self._state_label = self._state_weight = None
        self._columns, self._label_ids, self._pairs = {}, {}, None

    def _opened(self) -> CRFsuiteModel:
        if self._model is None:
            raise ValueError("the tagger is not opened: call open() or open_inmemory() first")
        return self._model

    def _weights(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Transitions and the (zero) start and end weights, as :mod:`crf._chain` takes them."""
        L = len(self._model.labels)
        return self._model.transitions, np.zeros(L), np.zeros(L)

    def labels(self) -> list[str]:
        """The model's labels."""
        return list(self._opened().labels)

    def set(self, xseq) -> None:
        """Make ``xseq`` the current sequence of :meth:`tag`, :meth:`probability` and :meth:`marginal`.

        Attributes the model does not know are ignored.

        Parameters
        ----------
        xseq : list of items, or ItemSequence
            Each item a dict ``{attribute: value}`` or a list of attribute strings (python-crfsuite's
            item rules, see :mod:`crf.attributes`).

        Raises
        ------
        ValueError
            No model is open.
        TypeError, ValueError
            An item python-crfsuite would refuse (naming it), or a value of 1e10 or more (too large to tag).
        """
        L = len(self._opened().labels)
        # items of the common shapes are read in one pass (known attributes only), others checked first
        entries = None
        if not isinstance(xseq, ItemSequence):
            if self._pairs is None:
                self._pairs = pair_table(self._columns)
            entries = sequence_entries(xseq, self._columns.get, self._pairs)
        if entries is None:
            items = xseq._items if isinstance(xseq, ItemSequence) else _items(xseq)
            names: list[str] = []
            weights: list[float] = []
            counts = np.zeros(len(items), dtype=np.int64)
            for t, item in enumerate(items):
                if type(item) is list:
                    names += item
                    weights += repeat(1.0, len(item))
                else:
                    for name, value in _item_pairs(item):
                        names.append(name)
                        weights.append(value)
                counts[t] = len(names)
            attributes = np.fromiter(map(self._columns.get, names, repeat(-1)), dtype=np.int64, count=len(names))
            known = attributes >= 0
            ends = np.concatenate([[0], np.cumsum(known)])[counts]
            entries = ends, attributes[known], np.array(weights, dtype=np.float64)[known]
        # every state feature of every known attribute, in item order: value * weight added to
        # its label's score, in the order CRFsuite's tagger adds them
        emissions = _compiled.state_feature_emissions(*entries, self._state_first, self._state_label, self._state_weight, L)
        self._emissions, self._marginals = emissions, None

    def tag(self, xseq=None) -> list[str]:
        """The most likely labels (Viterbi) of ``xseq`` (which becomes the current sequence), or of
        the current sequence.

        Parameters
        ----------
        xseq : list of items, or ItemSequence, optional
            As :meth:`set`; None: the current sequence.

        Returns
        -------
        list of str
            One label per item (``[]`` for an empty sequence).

        Raises
        ------
        ValueError
            No model is open.
        """
        if xseq is not None:
            self.set(xseq)
        model = self._opened()
        if not len(self._emissions):
            return []
        if not model.labels:
            raise ValueError("the model has no labels")
        emissions = self._emissions
        path, _ = _compiled.viterbi(emissions, model.transitions, self._zeros, self._zeros, np.array([0, len(emissions)]))
        return [model.labels[i] for i in path.tolist()]

    def probability(self, yseq) -> float:
        """p(``yseq`` | the current sequence); 0 for an empty sequence.

        Parameters
        ----------
        yseq : sequence of str
            One of the model's labels per item.

        Returns
        -------
        float
            The probability, 0 to 1.

        Raises
        ------
        ValueError
            No model is open, or ``yseq`` has another length than the sequence.
        RuntimeError
            A label the model does not know.
        """
        self._opened()
        emissions = self._emissions
        if not len(emissions):
            return 0.0
        labels = _labels(yseq)
        if len(labels) != len(emissions):
            raise ValueError(f"the numbers of items and labels differ: {len(emissions)} items, {len(labels)} labels")
        codes = np.array([self._label_code(label) for label in labels], dtype=np.int64)
        weights = self._weights()
        score = chain.sequence_scores(emissions, *weights, np.array([0, len(codes)]), codes)
        return float(np.exp(score - chain.log_partition(emissions, *weights, [len(codes)]))[0])

    def marginal(self, y: str, pos: int) -> float:
        """p(label ``y`` at position ``pos`` | the current sequence); 0 for an empty sequence.

        Parameters
        ----------
        y : str
            One of the model's labels.
        pos : int
            The item's position, 0-based.

        Returns
        -------
        float
            The marginal probability, 0 to 1.

        Raises
        ------
        ValueError
            No model is open, or ``pos`` out of range.
        TypeError
            ``pos`` is not an integer.
        RuntimeError
            A label the model does not know.
        """
        self._opened()
        emissions = self._emissions
        if not len(emissions):
            return 0.0
        if isinstance(pos, bool) or not isinstance(pos, numbers.Integral):
            raise TypeError(f"pos must be an integer, got {pos!r}")
        if not 0 <= pos < len(emissions):
            raise ValueError(f"position {pos} is out of range for a sequence of {len(emissions)} items")
        code = self._label_code(y)
        if self._marginals is None:
            self._marginals = chain.forward_backward(emissions, *self._weights(), [len(emissions)], counts=False).marginals
        return float(self._marginals[pos, code])

    def _label_code(self, label) -> int:
        code = self._label_ids.get(label)
        if code is None:
            raise RuntimeError(f"unknown label {label!r}: the model's labels are {self._model.labels}")
        return code

    def _closed_check(self) -> None:
        if self._model is None:
            raise RuntimeError("the tagger is closed: open a model first")

    def info(self) -> ParsedDump:
        """The model as python-crfsuite parses its dump: ``header`` (the file header's fields as
        text), ``labels`` and ``attributes`` ({name: id as text}), ``transitions``
        ({(from, to): weight}) and ``state_features`` ({(attribute, label): weight}), the weights
        as the dump prints them (six decimals)."""
        self._closed_check()
        model = self._model
        labels, attributes = model.labels, model.attributes
        rows, columns = np.nonzero(model.transitions)
        attribute, label, weight = model.state_features
        return ParsedDump(
            header=dict(self._header_lines()),
            labels={name: str(i) for i, name in enumerate(labels)},
            attributes={name: str(i) for i, name in enumerate(attributes)},
            transitions={
                (labels[i], labels[j]): float(f"{w:f}")
                for i, j, w in zip(rows.tolist(), columns.tolist(), model.transitions[rows, columns].tolist())
            },
            state_features={
                (attributes[a], labels[y]): float(f"{w:f}")
                for a, y, w in zip(attribute.tolist(), label.tolist(), weight.tolist())
            },
        )

    def _header_lines(self) -> list[tuple[str, str]]:
        magic, size, kind, version, features, L, A, *offsets = self._header
        fields = [("magic", magic.decode("latin-1")), ("size", str(size)), ("type", kind.decode("latin-1"))]
        fields += [("version", str(version)), ("num_features", str(features)), ("num_labels", str(L)), ("num_attrs", str(A))]
        names = ("off_features", "off_labels", "off_attrs", "off_labelrefs", "off_attrrefs")
        return fields + [(name, f"0x{offset:X}") for name, offset in zip(names, offsets)]

    def _dump_text(self) -> str:
        model = self._model
        labels, attributes = model.labels, model.attributes
        lines = ["FILEHEADER = {"] + [f"  {key}: {value}" for key, value in self._header_lines()] + ["}", ""]
        lines += ["LABELS = {"] + [f"  {i:5d}: {name}" for i, name in enumerate(labels)] + ["}", ""]
        lines += ["ATTRIBUTES = {"] + [f"  {i:5d}: {name}" for i, name in enumerate(attributes)] + ["}", ""]
        lines.append("TRANSITIONS = {")
        for i, j in zip(*np.nonzero(model.transitions)):
            lines.append(f"  (1) {labels[i]} --> {labels[j]}: {model.transitions[i, j]:f}")
        lines += ["}", "", "STATE_FEATURES = {"]
        attribute, label, weight = model.state_features
        for a, y, w in zip(attribute.tolist(), label.tolist(), weight.tolist()):
            lines.append(f"  (0) {attributes[a]} --> {labels[y]}: {w:f}")
        lines += ["}", ""]
        return "\n".join(lines) + "\n"

    def dump(self, filename: str | os.PathLike | None = None) -> None:
        """Write the model as CRFsuite's text dump to ``filename`` (standard output if None).

        Parameters
        ----------
        filename : str, os.PathLike or None, default=None
            The text file to write (UTF-8; replaced); None: standard output.

        Raises
        ------
        RuntimeError
            No model is open.
        """
        self._closed_check()
        text = self._dump_text()
        if filename is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            with open(filename, "w", encoding="utf-8") as out:
                out.write(text)

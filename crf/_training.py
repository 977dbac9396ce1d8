"""Training a CRF in three steps: a validated training problem, a solver, the fitted weights.

:func:`training_problem` turns one ``fit`` call (data, labels, dev data, the estimator's
parameters and, for a warm start, the fitted model it starts from) into a
:class:`TrainingProblem`, checking every input and the compatibility of the warm start before
any training. :func:`solve` runs the solver of the problem's algorithm on it. Neither touches the
estimator: :class:`crf.CRF` sets its fitted state from the problem and the solver's result.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _online as online
from . import _optimize as optimize
from . import _params as hyper
from ._objective import Objective, ParameterLayout
from ._order import chain_structure, exact_second_order_cost
from ._parallel import release_free_memory, single_threaded_blas
from ._persist import MAX_ABS_WEIGHT
from ._warm import PreviousFit
from .attributes import TOO_LARGE, AttributeIndex
from .batch import SequenceBatch, check_label_names, check_labels, label_classes
from .crfsuite import unstorable_name
from .io import writable_target

log = logging.getLogger("crf.model")

#: attribute values above this magnitude are reported when the algorithm works in the attributes'
#: own units (every one but lbfgs, which rescales them: see :func:`weight_scale`): next to 0/1
#: indicators, a constant 5 on every token already cost SGD and the perceptron 8 points of
#: training accuracy on CoNLL-2000 chunking features
LARGE_VALUE = 1.0


class TrainingError(RuntimeError):
    """Training ended without moving from its starting point although the objective was not at
    its minimum there: the data cannot be fitted as given (the message says why)."""


@dataclass
class TrainingProblem:
    """One ``fit`` call, checked: what the solver trains on and what the fitted model keeps.

    Attributes
    ----------
    batch : the training data, its columns in the model's attribute order (T tokens, A attributes).
    codes : (T,) int64 label index of every token; -1 where the label is unknown (None).
    classes : (L,) the labels of ``y``; on a warm start the old ones it has come first.
    attributes : (A,) attribute names, or None for an unnamed SequenceBatch.
    attribute_index : the fitted attribute vocabulary (None when X is a SequenceBatch, unless a warm start's
        batch names the fitted model's columns: then the fitted model's).
    layout : where each weight lives in the parameter vector.
    trainable : (tail_size,) which label n-gram weights are features.
    settings : the validated hyperparameters, with the algorithm's defaults filled in.
    start : the fit a warm start begins from (None: zero weights).
    dev : (dev batch, dev labels) or None.
    largest : (the attribute value of largest magnitude, where it is), or None.
    """

    batch: SequenceBatch
    codes: np.ndarray
    classes: list
    attributes: list[str] | None
    attribute_index: AttributeIndex | None
    layout: ParameterLayout
    trainable: np.ndarray
    settings: hyper.Settings
    start: PreviousFit | None
    dev: tuple[SequenceBatch, list] | None
    largest: tuple[float, str] | None

    @property
    def n_labels(self) -> int:
        return len(self.classes)


def flat_labels(y) -> np.ndarray:
    """All labels of ``y`` (a list of label sequences) in one object array (T,)."""
    check_label_sequences(y)
    flat = np.empty(sum(map(len, y)), dtype=object)
    flat[:] = [label for labels in y for label in labels]
    return flat


def split_by_sequence(flat, batch: SequenceBatch) -> list:
    """Per-token values ``flat`` (T,) as one list entry per sequence of ``batch``."""
    return [flat[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]


def label_sequences(problem: TrainingProblem) -> list[list]:
    """The training labels of ``problem`` as label sequences (None where unknown)."""
    classes = np.array([*problem.classes, None], dtype=object)
    return [part.tolist() for part in split_by_sequence(classes[problem.codes], problem.batch)]  # code -1 reads None


def entry_position(batch: SequenceBatch, entry: int, names=None) -> str:
    """``sequence i, token t: attribute <name or column>`` of the ``entry``-th stored value of X."""
    row = int(np.searchsorted(batch.X.indptr, entry, side="right")) - 1
    sequence = int(np.searchsorted(batch.offsets, row, side="right")) - 1
    column = int(batch.X.indices[entry])
    attribute = f"{names[column]!r}" if names is not None else f"column {column}"
    return f"sequence {sequence}, token {row - int(batch.offsets[sequence])}: attribute {attribute}"


def check_finite(batch: SequenceBatch, names=None, what: str = "") -> None:
    """Refuse a non-finite attribute value: it would silently turn into a NaN model or NaN marginals."""
    bad = np.flatnonzero(~np.isfinite(batch.X.data))
    if bad.size:
        where = entry_position(batch, int(bad[0]), names)
        raise ValueError(f"{what}{where} has the non-finite value {batch.X.data[bad[0]]} ({bad.size} such values)")


def check_taggable(batch: SequenceBatch, names=None, what: str = "") -> None:
    """Refuse a value no model can tag: non-finite (:func:`check_finite`), or of magnitude
    :data:`TOO_LARGE` or more, the limit of training too: one such score outweighs every other in
    the chain's sums, and the rest of its sequence becomes noise."""
    large = np.flatnonzero(~(np.abs(batch.X.data) < TOO_LARGE))  # one pass: NaN and infinities fail it too
    if large.size:
        check_finite(batch, names, what)  # the non-finite message first, where there is one
        where = entry_position(batch, int(large[0]), names)
        raise ValueError(f"{what}{where} has the value {batch.X.data[large[0]]:g}, too large to tag (the limit is {TOO_LARGE:g})")


def _largest_value(batch: SequenceBatch, names=None) -> tuple[float, str] | None:
    if not batch.X.nnz:
        return None
    entry = int(np.argmax(np.abs(batch.X.data)))
    return float(batch.X.data[entry]), entry_position(batch, entry, names)


def label_codes(y, batch: SequenceBatch, classes: Sequence, what: str = "") -> np.ndarray:
    """(T,) int64 index in ``classes`` of every label of ``y`` (-1 for None or a label not in
    ``classes``), after checking that ``y`` has a label per token of ``batch``."""
    if len(y) != batch.n_sequences:
        raise ValueError(f"{batch.n_sequences} sequences in X{what} but {len(y)} in y{what}")
    check_label_sequences(y, f"y{what}")
    for i, (labels, length) in enumerate(zip(y, batch.lengths)):
        if len(labels) != length:
            raise ValueError(f"sequence {i}: {length} tokens in X{what} but {len(labels)} labels in y{what}")
    index = {label: i for i, label in enumerate(classes)}
    codes, uniques = pd.factorize(flat_labels(y))  # None (unknown) gets -1
    mapping = np.array([index.get(u, -1) for u in uniques], dtype=np.int64)
    out = np.full(codes.size, -1, dtype=np.int64)
    known = codes >= 0
    out[known] = mapping[codes[known]]
    return out


def check_crfsuite_names(names: Sequence, what: str, rows: Callable[[int], np.ndarray], offsets: np.ndarray) -> None:
    """Refuse, before training, the ``names`` a CRFsuite model file cannot hold (see
    :func:`crf.crfsuite.unstorable_name`), naming the first one and the sequence and token where
    it first occurs: ``rows(i)`` gives the (sorted) token rows that hold name ``i``, ``offsets``
    (N + 1,) cut the rows into sequences."""
    for i, name in enumerate(names):
        problem = unstorable_name(name.item() if isinstance(name, np.generic) else name)
        if problem is not None:
            found = rows(i)
            if found.size:
                sequence = int(np.searchsorted(offsets, found[0], side="right")) - 1
                where = f"sequence {sequence}, token {int(found[0] - offsets[sequence])}: "
            else:
                where = ""
            raise ValueError(f"model_filename: {where}{what} {i} ({repr(name)[:40]}) {problem}")


def as_sequence_list(values, name: str):
    """``values`` as a sized sequence of sized sequences, read once.

    Parameters
    ----------
    values : SequenceBatch or iterable of sequences
        ``X`` or ``y`` of a call. A SequenceBatch and a sized container are kept; any other iterable
        (a generator, as sklearn-crfsuite accepts) is read into a list, and so is each sequence
        given as an iterator.
    name : str
        The argument's name, for the message.

    Returns
    -------
    SequenceBatch or sequence
        ``values``, or a list of its sequences.

    Raises
    ------
    TypeError
        A set or a mapping (no order, or read as its keys), a string, or no iterable at all.
    """
    if isinstance(values, (AbstractSet, Mapping)):  # a set has no order; a dict would be read as its keys
        raise TypeError(f"{name} must be a list of sequences, not a {type(values).__name__}")
    if isinstance(values, SequenceBatch):
        return values
    if not hasattr(values, "__len__"):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"{name} must be a list of sequences, not a {type(values).__name__}")
        values = list(values)
    if any(_unsized(item) for item in values):  # a sequence given as an iterator: read once, as Trainer.append does
        values = [list(item) if _unsized(item) else item for item in values]
    return values


def _unsized(item) -> bool:
    return not hasattr(item, "__len__") and hasattr(item, "__iter__") and not isinstance(item, (str, bytes, Mapping))


def check_label_sequences(y, what: str = "y") -> None:
    """Refuse a label sequence given as a string (its characters would become labels), a set (its
    labels come in no fixed order) or a dict (its keys would become labels), and ``y`` itself given
    as a set or a dict (its sequences could not be matched to the data's)."""
    if isinstance(y, (AbstractSet, Mapping)):
        raise TypeError(f"{what} must be a list of sequences, not a {type(y).__name__}")
    for i, labels in enumerate(y):
        if isinstance(labels, (str, bytes)):
            raise TypeError(f"{what}: sequence {i} is a string ({labels[:20]!r}), not a list of labels (one per token)")
        if isinstance(labels, (AbstractSet, Mapping)):
            raise TypeError(f"{what}: sequence {i} is a {type(labels).__name__}, not a list of labels (one per token, in order)")


def checked_attribute_names(attribute_names: object) -> list[str]:
    """``fit``'s ``attribute_names`` as a list, or TypeError/ValueError naming the argument and the
    position: an ordered collection (not a string, set or mapping: column j is named by the j-th
    name) of non-empty strings that UTF-8 can write."""
    if isinstance(attribute_names, (str, bytes)):
        raise TypeError("attribute_names must be a list of names, one per column of X, not a string")
    if isinstance(attribute_names, (AbstractSet, Mapping)):
        raise TypeError(
            f"attribute_names is a {type(attribute_names).__name__}, whose order is arbitrary: pass a list, "
            "column j named by its j-th name"
        )
    names = list(attribute_names)
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise TypeError(f"attribute_names {i}: {name!r} is not a non-empty string")
    check_names_encodable(names, "attribute_names")
    return names


def check_names_encodable(names: Sequence, what: str) -> None:
    """Refuse a label or attribute name that UTF-8 cannot write (a lone surrogate such as
    ``'\\ud800'``): neither a model file nor a CRFsuite file could hold it. One join and encode
    for the common case; the name is looked for only when one fails."""
    try:
        "\n".join(str(n) for n in names).encode("utf-8")
    except UnicodeEncodeError:
        for i, name in enumerate(names):
            try:
                str(name).encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"{what} {i} ({ascii(str(name))[:60]}) holds {error.object[error.start : error.end]!a}, which UTF-8 "
                    "cannot write (a lone surrogate), so no model file could hold it"
                ) from None


def check_model_filename(path, what: str = "model_filename") -> None:
    """Refuse, before training, a model file path (``what`` names the setting) that cannot be
    written: a folder, a file in a folder that does not exist, a dangling symbolic link, or what is
    not a regular file (:func:`crf.io.writable_target`)."""
    if path is None:
        return
    target = os.fspath(path)
    if os.path.isdir(target):
        raise IsADirectoryError(f"{what}: {target!r} is a folder, not a file to write the model to")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{what}: there is no folder {folder!r} to write the model to")
    try:
        writable_target(target)
    except OSError as error:
        raise type(error)(f"{what}: {error}") from None


def _check_dev_labels_known(flat: np.ndarray, offsets: np.ndarray) -> None:
    """Refuse a None (unknown) label in ``y_dev`` (flat (T,), sequences at ``offsets`` (N + 1,)):
    dev labels are scored, and a score counts known labels only."""
    unknown = np.flatnonzero(np.equal(np.asarray(flat, dtype=object), None))
    if len(unknown):
        sequence = int(np.searchsorted(offsets, unknown[0], side="right") - 1)
        raise ValueError(
            f"y_dev: sequence {sequence}, token {int(unknown[0] - offsets[sequence])} is None (unknown): "
            "dev labels are scored, so every one must be known (None marks an unknown label in y only)"
        )


def _check_dev_labels_trained(dev_classes: Sequence, classes: Sequence) -> None:
    """Refuse a ``y_dev`` none of whose labels (``dev_classes``) is a label of ``y`` (``classes``):
    every dev token would count as an error (labels coded another way, say ``0``/``1`` for
    ``'B-NP'``/``'I-NP'``); warn about the dev labels that ``y`` lacks, which no model of it can predict."""

    def shown(labels: Sequence) -> str:
        return ", ".join(repr(label)[:40] for label in labels[:3]) + (", ..." if len(labels) > 3 else "")

    known = set(classes)
    unseen = [label for label in dev_classes if label not in known]
    if not unseen:
        return
    if len(unseen) == len(dev_classes):
        raise ValueError(
            f"y_dev: none of its labels ({shown(unseen)}) is a label of y ({shown(list(classes))}): "
            "code the dev labels as the training labels are"
        )
    message = f"y_dev has {len(unseen)} label(s) that y lacks ({shown(unseen)}): no model of y predicts them"
    log.warning("%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=5)


def _check_call(X, y, X_dev, y_dev, attribute_names, params: dict, settings: hyper.Settings) -> np.ndarray:
    """The checks that need no featurisation; returns the flat training labels (T,)."""
    if (X_dev is None) != (y_dev is None):
        raise ValueError("pass both X_dev and y_dev to evaluate on held-out data (or neither)")
    check_model_filename(params["model_filename"])
    check_label_sequences(y)
    if y_dev is not None:
        check_label_sequences(y_dev, "y_dev")
    if X_dev is not None and len(X_dev) == 0:
        raise ValueError("X_dev and y_dev hold no sequence: pass held-out sequences, or leave both out")
    if attribute_names is not None:
        names = pd.Index([str(a) for a in attribute_names])
        if names.has_duplicates:
            raise ValueError(f"attribute_names: {names[names.duplicated()][0]!r} appears more than once")
        if isinstance(X, SequenceBatch) and len(names) != X.n_attributes:
            raise ValueError(f"{len(names)} attribute_names for a batch of {X.n_attributes} attribute columns")
    if params["model_filename"] is not None and isinstance(X, SequenceBatch) and attribute_names is None:
        raise ValueError("model_filename writes attribute names: pass attribute_names with a SequenceBatch")
    if len(X) == 0 or len(y) == 0:
        raise ValueError("fit needs at least one training sequence (X and y are empty)")
    if X_dev is not None and len(X_dev) != len(y_dev):
        raise ValueError(f"{len(X_dev)} sequences in X_dev but {len(y_dev)} in y_dev")
    flat = flat_labels(y)
    check_labels(flat, unknown=True)
    partial = any(label is None for label in flat)
    if partial and settings.algorithm not in ("lbfgs", "l2sgd"):
        raise ValueError(f"unknown labels (None) need algorithm='lbfgs' or 'l2sgd', not {settings.algorithm!r}")
    if partial and all(label is None for label in flat):
        raise ValueError("fit needs at least one known label (every label of y is None)")
    return flat


def _previous_fit(previous: PreviousFit | None, X, attribute_names, boundary: bool) -> PreviousFit | None:
    """The warm start's source checked against this call (None: no warm start)."""
    if previous is None:
        return None
    if isinstance(X, SequenceBatch):
        previous.check_batch(X, attribute_names)
    elif previous.attribute_names is None:
        raise ValueError(
            "warm_start: the fitted model's attributes have no names (it was fitted on a SequenceBatch without "
            "attribute_names), so new feature dicts or lists cannot be matched to its weights; fit on batches "
            "with the same columns"
        )
    return previous


def training_problem(
    X,
    y,
    X_dev,
    y_dev,
    attribute_names: Sequence[str] | None,
    params: dict,
    defaults: dict,
    previous: PreviousFit | None,
    label_order: Sequence | None = None,
) -> TrainingProblem:
    """Check one ``fit`` call and turn it into a :class:`TrainingProblem`; nothing is trained.

    Parameters
    ----------
    X, y, X_dev, y_dev, attribute_names : as :meth:`crf.CRF.fit` takes them.
    params : the estimator's ``get_params()``.
    defaults : the estimator's constructor defaults (see :func:`crf._params.validate`).
    previous : the fitted model a warm start begins from, or None.
    label_order : the order of the labels, which must be those of ``y`` (a candidate model takes its
        second-order model's); None: the labels of ``y`` in order of first appearance, a warm
        start's old ones first.

    Returns
    -------
    TrainingProblem

    Raises
    ------
    ValueError, TypeError
        A bad parameter, input, label or warm-start source, named in one line.
    """
    settings = hyper.validate(params, defaults)
    X, y = as_sequence_list(X, "X"), as_sequence_list(y, "y")
    if attribute_names is not None:  # read once: a generator of names would be empty the second time
        attribute_names = checked_attribute_names(attribute_names)
    if X_dev is not None and y_dev is not None:
        X_dev, y_dev = as_sequence_list(X_dev, "X_dev"), as_sequence_list(y_dev, "y_dev")
    flat = _check_call(X, y, X_dev, y_dev, attribute_names, params, settings)
    boundary = settings.boundary
    previous = _previous_fit(previous, X, attribute_names, boundary)
    classes = label_classes(flat, unknown=True)
    if previous is not None:
        check_label_names([*previous.classes, *classes], "warm_start")  # '1' then 1: a type changed by mistake
        classes = previous.merged_classes(classes)
    if label_order is not None:
        if len(label_order) != len(classes) or set(label_order) != set(classes):
            raise ValueError(f"label_order {list(label_order)!r} is not an order of the labels {classes!r}")
        classes = list(label_order)
    if isinstance(X, SequenceBatch):
        batch, attribute_index = X, None
        check_finite(batch, attribute_names)
        names = attribute_names if attribute_names is not None else previous and previous.attribute_names
        # the old names name the columns only when the batch has no column beyond them
        attributes = list(names) if names is not None and len(names) == batch.n_attributes else None
        if previous is not None and attribute_names is not None and [str(a) for a in attribute_names] == previous.attribute_names:
            # the fitted model's columns by name: its feature-dict reader still reads them (an unnamed batch
            # cannot be checked, so it keeps no reader: tagging dicts would trust columns nobody named)
            attribute_index = previous.attribute_index
    else:
        attribute_index = AttributeIndex()
        batch = attribute_index.fit_transform(X)
        attributes = [str(a) for a in attribute_index.names()]
    codes = label_codes(y, batch, classes)
    dev = None
    if X_dev is not None:
        dev_batch = _dev_batch(X_dev, batch.n_attributes, attribute_index)
        label_codes(y_dev, dev_batch, classes, what="_dev")  # lengths, per sequence
        dev_flat = flat_labels(y_dev)
        check_labels(dev_flat, unknown=True)
        _check_dev_labels_known(dev_flat, dev_batch.offsets)
        dev_classes = label_classes(dev_flat, unknown=True)
        check_label_names([*classes, *dev_classes], "y_dev")
        _check_dev_labels_trained(dev_classes, classes)
        dev = (dev_batch, y_dev)
    check_names_encodable(classes, "label")
    check_names_encodable(attributes or [], "attribute")
    if params["model_filename"] is not None:
        check_crfsuite_names(classes, "label", lambda i: np.flatnonzero(codes == i), batch.offsets)
        check_crfsuite_names(attributes or [], "attribute", lambda j: np.sort(batch.X[:, j].nonzero()[0]), batch.offsets)
    largest = _largest_value(batch, attributes)
    if largest is not None and abs(largest[0]) >= TOO_LARGE:
        raise ValueError(
            f"{largest[1]} has the value {largest[0]:g}, too large to train on (the limit is {TOO_LARGE:g}): scale it"
        )
    if dev is not None:
        check_taggable(dev[0], attributes, "X_dev: ")
    if largest is not None and abs(largest[0]) > LARGE_VALUE and params["algorithm"] != "lbfgs":
        message = (
            f"{largest[1]} has the value {largest[0]:g}: algorithm={params['algorithm']!r} steps in the attributes' "
            "own units, and values above 1 next to 0/1 indicators can stall it far from a good model; scale such "
            "attributes to [-1, 1], or train with 'lbfgs', which rescales them"
        )
        log.warning("%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    L = len(classes)
    order = params["order"]
    cost = exact_second_order_cost(L, batch.X.shape[0]) if order == 2 and params["candidate_threshold"] is None else None
    if cost is not None:
        log.warning("%s", cost)
        warnings.warn(cost, RuntimeWarning, stacklevel=3)
    index = hyper.feature_index(batch.X, codes, L, params["min_freq"], bool(params["all_possible_states"]))
    if batch.X.nnz and not batch.X.data.all():  # stored zeros named their pairs above (as CRFsuite's items do)
        X = batch.X.copy()  # and would only cost time in every step
        X.eliminate_zeros()
        batch = SequenceBatch(X, batch.offsets)
    structure = chain_structure(order, L)
    trainable = structure.trainable(batch.offsets, codes, params["min_freq"], boundary, bool(params["all_possible_transitions"]))
    return TrainingProblem(
        batch=batch,
        codes=codes,
        classes=classes,
        attributes=attributes,
        attribute_index=attribute_index,
        layout=ParameterLayout(batch.n_attributes, L, index, order),
        trainable=trainable,
        settings=settings,
        start=previous,
        dev=dev,
        largest=largest,
    )


def _dev_batch(X_dev, n_attributes: int, attribute_index: AttributeIndex | None) -> SequenceBatch:
    if isinstance(X_dev, SequenceBatch):
        if attribute_index is not None:  # a batch's columns have no names to match the attributes by
            raise ValueError(
                "the training data are token features (dicts or attribute names), read by name: pass X_dev the same way, "
                "not as a SequenceBatch"
            )
        if X_dev.n_attributes != n_attributes:
            raise ValueError(f"X_dev has {X_dev.n_attributes} attributes, the training batch {n_attributes}")
        check_finite(X_dev, what="X_dev: ")
        return X_dev
    if attribute_index is None:
        raise ValueError("the training data is a SequenceBatch: pass X_dev as a SequenceBatch too")
    try:
        return attribute_index.transform(X_dev)
    except (TypeError, ValueError) as error:
        raise type(error)(f"X_dev: {error}") from None


def solve(
    problem: TrainingProblem,
    params: dict,
    theta0: np.ndarray | None,
    callback: Callable | None,
    candidates: np.ndarray | None = None,
) -> optimize.TrainingResult:
    """Train ``problem`` from ``theta0`` (layout.size,) with the solver of its algorithm.

    Parameters
    ----------
    problem : the checked training problem.
    params : the estimator's ``get_params()`` (the solvers' settings).
    theta0 : the starting weights; None: zeros.
    callback : called with every :class:`~crf._optimize.IterationInfo`.
    candidates : (T, L) bool, a candidate lattice per token (order 2), or None.

    Returns
    -------
    TrainingResult
        The final weights, the iterations' history and why training stopped.
    """
    settings = problem.settings
    stopping = optimize.StoppingRule(settings.max_iterations, settings.epsilon, settings.period, settings.delta)
    frozen = problem.layout.n_state + np.flatnonzero(~problem.trainable)
    from_zero = theta0 is None
    theta0 = np.zeros(problem.layout.size) if theta0 is None else theta0
    if settings.algorithm != "lbfgs":  # steps in the attributes' units: stop at the first epoch no file could hold
        callback = _bounded(callback, problem, params)
    began = time.perf_counter()
    with single_threaded_blas():
        result = SOLVERS[settings.algorithm](problem, params, theta0, stopping, frozen, callback, candidates)
    log.debug("%s: %d iterations in %.1fs", settings.algorithm, result.iterations, time.perf_counter() - began)
    # from zero weights no step lowering the loss means the data cannot be fitted as given; a warm
    # start (or the candidate model's first-order optimum) may simply begin at the optimum
    if from_zero and result.iterations == 0 and result.stop_reason.startswith("line search"):
        largest = problem.largest
        where = "" if largest is None else f"; the largest attribute value is {largest[0]:g} ({largest[1]})"
        c1, c2 = float(params.get("c1") or 0.0), float(params.get("c2") or 0.0)
        if max(c1, c2) >= 1e6:  # the prior outweighs any data: zero weights are (all but) the optimum
            where = f"; c1={c1:g}, c2={c2:g}: a strength this large keeps every weight at zero"
        raise TrainingError(
            f"training could not move from its starting weights ({result.stop_reason}): no step lowered the loss{where}"
        )
    largest = float(np.max(np.abs(result.theta))) if result.theta.size else 0.0
    if largest == 0.0 and float(params.get("c1") or 0.0) > 0:  # the exact optimum, but rarely what was meant
        log.warning(
            "every weight is zero: c1=%g outweighs every attribute's evidence, so the model predicts one label", params["c1"]
        )
    if not largest <= MAX_ABS_WEIGHT:  # a model no file can hold (the bound that refuses tampered files), or NaN
        raise _beyond_bound(largest, problem, params)
    return result


def _beyond_bound(largest: float, problem: TrainingProblem, params: dict, epoch: int | None = None) -> TrainingError:
    when = "" if epoch is None else f" at epoch {epoch}"
    return TrainingError(
        f"training drove a weight to {largest:g}{when}, beyond the +-{MAX_ABS_WEIGHT:g} a model file holds: "
        + _weight_advice(problem, params)
    )


def _bounded(callback: Callable | None, problem: TrainingProblem, params: dict) -> Callable:
    """``callback`` after a check of each epoch's weights: the online and SGD trainers step in the
    attributes' own units, so a huge attribute value shows in the first epoch's weights, and
    training stops there instead of running every epoch towards a model no file can hold."""

    def checked(info: optimize.IterationInfo) -> None:
        if info.theta is not None and info.theta.size:
            largest = float(np.max(np.abs(info.theta)))
            if not largest <= MAX_ABS_WEIGHT:
                raise _beyond_bound(largest, problem, params, info.iteration)
        if callback is not None:
            callback(info)

    return checked


def _weight_advice(problem: TrainingProblem, params: dict) -> str:
    """What to change when training drove a weight beyond what a model file holds: the cause that
    the settings and the largest attribute value point to."""
    algorithm = params["algorithm"]
    value, where = problem.largest if problem.largest is not None else (0.0, "")
    if algorithm != "lbfgs" and abs(value) > LARGE_VALUE:
        return (
            f"{where} has the value {value:g}, and algorithm={algorithm!r} steps in the attributes' own units; scale such "
            "values to about [-1, 1], or train with algorithm='lbfgs'"
        )
    if algorithm == "lbfgs" and not (params.get("c1") or params.get("c2")):
        return "with c1=c2=0, data that some attribute separates has no finite optimum; set c2 > 0 (1e-6 is enough)"
    if algorithm in ("lbfgs", "l2sgd"):
        return "raise c2" + (f", or scale the attribute values up (the largest is {abs(value):g})" if abs(value) < 1 else "")
    return "scale the attribute values to about [-1, 1], or train with algorithm='lbfgs' and c2 > 0"


def weight_scale(problem: TrainingProblem) -> np.ndarray | None:
    """(layout.size,) each weight's unit for the solver: its attribute's typical magnitude (the
    median over the tokens where it occurs) where that is above 1, else 1 (and 1 for the label
    n-gram weights); None when no attribute is typically above 1 in magnitude (0/1 indicators, or
    a rare large value among ones), so that such data trains exactly as without it. See
    :func:`crf._optimize.lbfgs`."""
    if problem.largest is None or abs(problem.largest[0]) <= 1.0:
        return None
    X = problem.batch.X
    magnitude = np.abs(X.data)
    large = np.zeros(X.shape[1], dtype=bool)
    large[X.indices[magnitude > 1.0]] = True
    entries = np.flatnonzero(large[X.indices])  # every value of the attributes with a large one
    columns, values = X.indices[entries], magnitude[entries]
    order = np.lexsort((values, columns))
    columns, values = columns[order], values[order]
    attributes = np.flatnonzero(large)
    first = np.searchsorted(columns, attributes)
    counts = np.searchsorted(columns, attributes, side="right") - first
    typical = np.ones(X.shape[1])
    typical[attributes] = np.maximum(values[first + (counts - 1) // 2], 1.0)  # the (lower) median
    if np.all(typical == 1.0):
        return None
    layout = problem.layout
    if layout.feature_index is None:
        state = np.repeat(typical, layout.n_labels)
    else:
        state = typical[layout.feature_index // layout.n_labels]
    return np.concatenate([state, np.ones(layout.size - layout.n_state)])


def _warm_or_cold(objective, theta0: np.ndarray, params: dict, frozen: np.ndarray, source: str) -> np.ndarray:
    """``theta0`` (a warm start's weights, or a candidate-lattice model's first-order candidate model's: ``source``
    says which), or zero weights (the non-features' kept) when the regularised objective is lower
    there: weights carried over from data whose values had another scale can start so far off
    that the solver would stop long before the optimum."""
    if not np.any(theta0):
        return theta0
    cold = np.zeros_like(theta0)
    cold[frozen] = theta0[frozen]

    def total(theta: np.ndarray) -> float:
        return objective(theta)[0] + params["c2"] * float(theta @ theta) + params["c1"] * float(np.abs(theta).sum())

    warm_loss, cold_loss = total(theta0), total(cold)
    if not warm_loss <= cold_loss:
        log.log(
            logging.WARNING if source == "warm start" else logging.INFO,
            "%s: its weights fit this data worse than zero weights (objective %.6g against %.6g): training starts from "
            "zero weights",
            source,
            warm_loss,
            cold_loss,
        )
        return cold
    return theta0


def _lbfgs(problem, params, theta0, stopping, frozen, callback, candidates):
    batch = problem.batch
    objective = Objective(batch.X, batch.offsets, problem.codes, problem.layout, params["n_threads"], candidates=candidates)
    release_free_memory()  # what building it freed, before the iterations add their working memory
    result = optimize.lbfgs(
        objective,
        _warm_or_cold(
            objective, theta0, params, frozen, "warm start" if problem.start is not None else "the candidate model's start"
        ),
        params["c1"],
        params["c2"],
        stopping,
        params["num_memories"],
        callback,
        frozen,
        params["max_linesearch"],
        weight_scale(problem),
    )
    del objective
    release_free_memory()  # the iterations' working memory, before the model's weights are made
    return result


def _l2sgd(problem, params, theta0, stopping, frozen, callback, candidates):
    calibration = optimize.Calibration(
        params["calibration_eta"],
        params["calibration_rate"],
        params["calibration_samples"],
        params["calibration_candidates"],
        params["calibration_max_trials"],
    )
    batch = problem.batch
    return optimize.sgd(
        batch.X, batch.offsets, problem.codes, problem.layout, theta0, params["c2"], stopping, params["learning_rate"],
        params["batch_size"], params["random_state"], callback, frozen, calibration, candidates,
    )  # fmt: skip


def _online(problem, params, theta0, stopping, frozen, callback, candidates):
    rule = online.update_rule(
        problem.settings.algorithm, params["pa_type"], params["c"], params["error_sensitive"], params["averaging"],
        params["variance"], params["gamma"],
    )  # fmt: skip
    batch = problem.batch
    return online.train(
        batch.X, batch.offsets, problem.codes, problem.layout, frozen, rule, stopping, params["random_state"], callback
    )


#: the solver of each algorithm: (problem, params, theta0, stopping, frozen, callback, candidates) -> TrainingResult
SOLVERS = {"lbfgs": _lbfgs, "l2sgd": _l2sgd, "ap": _online, "pa": _online, "arow": _online}

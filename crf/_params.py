"""The hyperparameters of :class:`crf.CRF`: their documentation, defaults and validation.

The names and meanings are CRFsuite's (as sklearn-crfsuite passes them on), so a model trained
with the same numbers is the same model. Defaults that depend on the algorithm are ``None`` in
the constructor and resolved here, as CRFsuite does: ``max_iterations`` (lbfgs: no limit, l2sgd:
1000, ap/pa/arow: 100), ``epsilon`` (lbfgs: 1e-5, ap/pa/arow: 0) and ``delta`` (lbfgs: 1e-5,
l2sgd: 1e-6).
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

ALGORITHMS = ("lbfgs", "l2sgd", "ap", "pa", "arow")
LINESEARCHES = ("MoreThuente", "Backtracking", "StrongBacktracking")

DOC = """
    The parameters have CRFsuite's names and meanings; the algorithms a parameter applies to are
    in brackets (a parameter of other algorithms must keep its default: ``fit`` refuses it).

    Parameters
    ----------
    algorithm : {"lbfgs", "l2sgd", "ap", "pa", "arow"}, default="lbfgs"
        ``"lbfgs"`` (L-BFGS; with ``c1 > 0`` L1/elastic net by OWL-QN, as CRFsuite), ``"l2sgd"``
        (SGD with L2 and CRFsuite's learning-rate calibration), ``"ap"`` (averaged perceptron),
        ``"pa"`` (passive-aggressive), ``"arow"`` (adaptive regularisation of weights).
    min_freq : float, default=0.0
        State and transition features whose frequency in training (summed attribute values;
        occurrences of a label pair) is below ``min_freq`` are left out, as CRFsuite leaves them
        out: the pairs ``all_possible_states`` and ``all_possible_transitions`` add have
        frequency 0 and so stay only while ``min_freq <= 0``.
    all_possible_states : bool, default=False
        Every attribute with every label (True) or only the pairs seen in training (False,
        CRFsuite's default).
    all_possible_transitions : bool, default=False
        Every label pair (True) or only the pairs seen in training (False).
    c1 : float, default=0.0
        [lbfgs] L1 coefficient: loss = NLL + c1 |w|_1 + c2 ||w||^2.
    c2 : float, default=1.0
        [lbfgs, l2sgd] L2 coefficient, at most 1e12 (l2sgd needs c2 > 0).
    max_iterations : int or None, default=None
        Iterations (epochs for the online algorithms); None: the algorithm's default (lbfgs: no
        limit, l2sgd: 1000, ap/pa/arow: 100).
    num_memories : int, default=6
        [lbfgs] L-BFGS history (pairs of weight vectors kept), at most 1000.
    epsilon : float or None, default=None
        [lbfgs] stop when ||g|| / max(1, ||w||) < epsilon (default 1e-5); [ap, pa, arow] stop
        when the epoch's loss divided by the number of sequences is below epsilon (default 0).
    period : int, default=10
        [lbfgs, l2sgd] with ``delta``: the number of iterations the improvement is measured over.
    delta : float or None, default=None
        [lbfgs, l2sgd] stop when the loss improved by less than ``delta`` (relative) over the
        last ``period`` iterations (default: lbfgs 1e-5, l2sgd 1e-6).
    linesearch : {"MoreThuente", "Backtracking", "StrongBacktracking"}, default="MoreThuente"
        [lbfgs] with ``c1 == 0`` only ``"MoreThuente"`` is available (the backtracking variants
        raise ValueError); with ``c1 > 0`` OWL-QN always backtracks, whatever is given, as
        CRFsuite does.
    max_linesearch : int, default=20
        [lbfgs] maximum line-search trials per iteration.
    calibration_eta : float, default=0.1
        [l2sgd] initial learning rate of the calibration search (ignored when ``learning_rate``
        is given, as are the other calibration parameters).
    calibration_rate : float, default=2.0
        [l2sgd] factor (> 1) by which the calibration changes the learning rate.
    calibration_samples : int, default=1000
        [l2sgd] the most sequences (a random sample) the calibration tries a rate on.
    calibration_candidates : int, default=10
        [l2sgd] the number of loss-improving rates the calibration looks for in each direction.
    calibration_max_trials : int, default=20
        [l2sgd] the most trials of the calibration.
    pa_type : {0, 1, 2}, default=1
        [pa] 0 (no slack), 1 (PA-I) or 2 (PA-II).
    c : float, default=1.0
        [pa] aggressiveness of PA-I and PA-II.
    error_sensitive : bool, default=True
        [pa] add the square root of the number of wrong labels to the cost.
    averaging : bool, default=True
        [pa] return the average of the weights over all updates.
    variance : float, default=1.0
        [arow] initial variance of every weight.
    gamma : float, default=1.0
        [arow] trade-off between loss and change.
    verbose : bool, default=False
        Log every iteration at INFO level (logger ``crf.model``).
    model_filename : str, os.PathLike or None, default=None
        A CRFsuite model file (sklearn-crfsuite's meaning): an unfitted estimator whose file
        exists is that file's model (read on first use); after ``fit`` the model is written there
        in CRFsuite's format.
    keep_tempfiles : bool, default=False
        Accepted for compatibility; this implementation writes no temporary files.
    trainer_cls : None
        python-crfsuite trainer class; not applicable here (anything but None raises).
    boundary_transitions : bool or None, default=None
        Learn start and end weights (L,) per label (True); False gives exactly CRFsuite's
        first-order model, which has none. None: True, except with ``model_filename`` (a
        CRFsuite file cannot hold them).
    learning_rate : float or None, default=None
        [l2sgd] fixed initial learning rate eta0 instead of the calibrated one.
    batch_size : int, default=1
        [l2sgd] sequences per update (1: CRFsuite's per-sequence SGD).
    random_state : int or None, default=0
        Seed of the shuffling (l2sgd, ap, pa, arow).
    dev_every : int, default=10
        With ``X_dev``, evaluate every ``dev_every`` iterations (0: never).
    n_threads : int or None, default=None
        Threads for the sparse products and tagging (None or 0: the number of cores, at most 4).
    callback : callable or None, default=None
        Called with every :class:`crf.IterationInfo` (one per iteration or epoch).
    warm_start : bool, default=False
        [lbfgs, l2sgd] start the next ``fit`` from this model's weights (scikit-learn's meaning);
        attributes and labels the new data brings start at zero, and an old label the new data
        lacks is dropped (the refit has a cold fit's labels and features).
    order : {1, 2}, default=1
        [lbfgs, l2sgd for 2] 1 (transitions over label pairs) or 2 (also over label trigrams: the
        chain runs over label pairs, exact, O(L^3) per token; see :mod:`crf._order`). An order-2
        model cannot be written as a CRFsuite file (``model_filename``).
    candidate_threshold : float or None, default=None
        [order 2] None: exact second order. A number p in (0, 1): first train a first-order
        model with the same settings (kept as ``candidate_model_``); at each token keep the labels whose
        first-order marginal is at least p, at most ``crf.model.MAX_CANDIDATES`` of them (the
        most probable; always the most probable one; in training the gold label too); train and
        tag the second-order model over those candidates only (what MarMoT calls pruning), at O(K^3) per
        token for K candidates. The likelihood is then over the candidate lattice (an approximation:
        ``excluded_mass_`` reports the first-order marginal mass left out in training), and
        every query (marginals, probabilities, k-best) is over the candidates, chosen by the
        threshold of the fit (``candidate_threshold_``: setting ``candidate_threshold`` anew changes
        nothing until the next fit, nor what ``save`` writes). Exact second order
        over more than 20 labels is slow (O(L^3) per token: about 19x first order's time per
        iteration at 49 labels): ``fit`` then warns with the expected time per iteration and
        suggests ``candidate_threshold=0.01``.
"""

# the parameters of sklearn-crfsuite's CRF, each None there by default, meaning "not set": here too
# (this project's own, such as random_state and dev_every, keep their meaning of None)
SKLEARN_CRFSUITE_PARAMETERS = (
    "algorithm", "min_freq", "all_possible_states", "all_possible_transitions", "c1", "c2", "max_iterations",
    "num_memories", "epsilon", "period", "delta", "linesearch", "max_linesearch", "calibration_eta", "calibration_rate",
    "calibration_samples", "calibration_candidates", "calibration_max_trials", "pa_type", "c", "error_sensitive",
    "averaging", "variance", "gamma", "verbose", "model_filename", "keep_tempfiles", "trainer_cls",
)  # fmt: skip

# parameters that only mean something for some algorithms (their defaults are the constructor's:
# crf.CRF's signature is the one source of defaults)
_SPECIFIC = {
    "c1": ("lbfgs",),
    "c2": ("lbfgs", "l2sgd"),
    "num_memories": ("lbfgs",),
    "linesearch": ("lbfgs",),
    "max_linesearch": ("lbfgs",),
    "calibration_eta": ("l2sgd",),
    "calibration_rate": ("l2sgd",),
    "calibration_samples": ("l2sgd",),
    "calibration_candidates": ("l2sgd",),
    "calibration_max_trials": ("l2sgd",),
    "learning_rate": ("l2sgd",),
    "warm_start": ("lbfgs", "l2sgd"),
    "batch_size": ("l2sgd",),
    "pa_type": ("pa",),
    "c": ("pa",),
    "error_sensitive": ("pa",),
    "averaging": ("pa",),
    "variance": ("arow",),
    "gamma": ("arow",),
}
_STOPPING = {"epsilon": ("lbfgs", "ap", "pa", "arow"), "period": ("lbfgs", "l2sgd"), "delta": ("lbfgs", "l2sgd")}
_MAX_ITERATIONS = {"lbfgs": None, "l2sgd": 1000, "ap": 100, "pa": 100, "arow": 100}
_EPSILON = {"lbfgs": 1e-5, "ap": 0.0, "pa": 0.0, "arow": 0.0, "l2sgd": 0.0}
_DELTA = {"lbfgs": 1e-5, "l2sgd": 1e-6}
_BLOCK_TOKENS = 1 << 16  # tokens marked at a time by feature_index (bounds its temporary keys)


def parameter_applies(name: str, algorithm: str) -> bool:
    """Whether the parameter ``name`` means something for ``algorithm`` (every parameter that is
    not specific to some algorithms does).

    Parameters
    ----------
    name : str
        A :class:`crf.CRF` parameter name (an unknown name counts as applying to every algorithm).
    algorithm : str
        One of ``"lbfgs"``, ``"l2sgd"``, ``"ap"``, ``"pa"``, ``"arow"``.

    Returns
    -------
    bool
        False when ``name`` is specific to other algorithms (``fit`` then refuses a value other
        than its default).
    """
    return algorithm in _SPECIFIC.get(name, (algorithm,))


@dataclass
class Settings:
    """The validated training settings, with the algorithm's defaults filled in."""

    algorithm: str
    max_iterations: int | None
    epsilon: float
    period: int
    delta: float
    boundary: bool  # start/end weights: boundary_transitions, resolved


# the largest L2 strength: far above it no training set moves the weights from zero (the optimum
# |w| ~ |gradient| / 2 c2 changes the loss by less than its float64 rounding); a large c1 simply gives
# zero weights, the exact optimum, so it has no such bound
MAX_C2 = 1e12
# the longest L-BFGS history: 2 x 1000 weight vectors is already gigabytes for a large model
MAX_MEMORIES = 1000
MIN_SGD_C2 = 1e-100  # l2sgd's smallest L2 strength: its steps divide by it


def _number(name: str, value, low: float = 0.0, strict: bool = False, integer: bool = False):
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int (or a Fraction) beyond a float's range
        raise ValueError(f"{name} must be a finite number, got a value too large for a float") from None
    if not finite or value < low or (strict and value == low):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low}, got {value!r}")
    return value


def _flag(name: str, value) -> bool:
    if isinstance(value, bool) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def validate(p: dict, defaults: dict) -> Settings:
    """Check every hyperparameter of ``p``.

    Parameters
    ----------
    p : a :class:`crf.CRF`'s ``get_params()``; a parameter of sklearn-crfsuite's signature given
        as None is set to its default here (in place), as sklearn-crfsuite reads None ("not set").
    defaults : the constructor's defaults ({parameter: default}; crf.CRF's signature is the one
        source of defaults): a parameter specific to other algorithms must keep its default.

    Returns
    -------
    Settings
        The stopping settings with the algorithm's defaults filled in, and whether the model has
        start/end weights (``boundary_transitions``; None means yes, except with
        ``model_filename``, as a CRFsuite file cannot hold them).

    Raises
    ------
    ValueError
        Naming the first bad parameter.
    """
    for name in SKLEARN_CRFSUITE_PARAMETERS:
        if p.get(name) is None and defaults.get(name) is not None:
            p[name] = defaults[name]  # sklearn-crfsuite's None: "not set"
    algorithm = p["algorithm"]
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: use one of {', '.join(map(repr, ALGORITHMS))}")
    for name in ("c1", "c2", "min_freq"):
        _number(name, p[name])
    if p["c2"] > MAX_C2:
        raise ValueError(
            f"c2={p['c2']:g} is above {MAX_C2:g}: a prior this strong keeps every weight at (all but) zero, whatever "
            "the data (useful strengths are about 1e-4 to 1e3)"
        )
    for name in ("calibration_eta", "c", "variance", "gamma"):
        _number(name, p[name], strict=True)
    if p["learning_rate"] is not None:
        _number("learning_rate", p["learning_rate"], strict=True)
    _number("calibration_rate", p["calibration_rate"], low=1.0, strict=True)
    for name in ("num_memories", "period", "max_linesearch", "batch_size", "calibration_samples"):
        _number(name, p[name], low=1, integer=True)
    if p["num_memories"] > MAX_MEMORIES:  # two weight vectors per pair: memory, not accuracy, is what grows
        raise ValueError(
            f"num_memories={p['num_memories']} is above {MAX_MEMORIES}: L-BFGS keeps two weight vectors per pair "
            "(CRFsuite's default is 6; more than about 20 rarely helps)"
        )
    for name in ("calibration_candidates", "calibration_max_trials"):
        _number(name, p[name], low=1, integer=True)
    _number("dev_every", p["dev_every"], integer=True)
    for name in ("max_iterations", "n_threads"):
        if p[name] is not None:
            _number(name, p[name], low=1, integer=True)
    for name in ("epsilon", "delta"):
        if p[name] is not None:
            _number(name, p[name])
    for name in ("all_possible_states", "all_possible_transitions", "error_sensitive", "averaging", "warm_start"):
        _flag(name, p[name])
    if p["boundary_transitions"] is not None:
        _flag("boundary_transitions", p["boundary_transitions"])
    _flag("keep_tempfiles", p["keep_tempfiles"])
    if p["pa_type"] not in (0, 1, 2) or isinstance(p["pa_type"], bool):
        raise ValueError(f"pa_type must be 0, 1 or 2, got {p['pa_type']!r}")
    if p["linesearch"] not in LINESEARCHES:
        raise ValueError(f"unknown linesearch {p['linesearch']!r}: use one of {', '.join(LINESEARCHES)}")
    if p["linesearch"] != "MoreThuente" and not p["c1"] > 0:
        raise ValueError(f"linesearch={p['linesearch']!r} is not available: the L-BFGS line search is More-Thuente only")
    if p["trainer_cls"] is not None:
        raise ValueError("trainer_cls selects a python-crfsuite trainer class and does not apply here; leave it None")
    if p["callback"] is not None and not callable(p["callback"]):
        raise ValueError(f"callback must be callable, got {p['callback']!r}")
    seed = p["random_state"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ValueError(f"random_state must be an integer >= 0 or None, got {p['random_state']!r}")  # NumPy's rule
    order = p["order"]
    if isinstance(order, bool) or order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order!r}")
    if order == 2 and algorithm not in ("lbfgs", "l2sgd"):
        raise ValueError(f"order=2 is trained by algorithm='lbfgs' or 'l2sgd', not {algorithm!r}")
    if order == 2 and p["model_filename"] is not None:
        raise ValueError("model_filename writes a CRFsuite model, which holds first-order models only: order=1")
    threshold = p["candidate_threshold"]
    if threshold is not None:
        _number("candidate_threshold", threshold, strict=True)
        if not threshold < 1:
            raise ValueError(f"candidate_threshold must lie in (0, 1), got {threshold!r}")
        if order != 2:
            raise ValueError("candidate_threshold restricts a second-order model to candidate labels: it needs order=2")
    if algorithm == "l2sgd" and p["c2"] <= 0:
        raise ValueError("algorithm='l2sgd' needs c2 > 0 (its step size is 1 / (lambda t) with lambda = 2 c2 / N)")
    if algorithm == "l2sgd" and p["c2"] < MIN_SGD_C2:  # 1 / lambda would overflow float64
        raise ValueError(f"algorithm='l2sgd' needs c2 >= {MIN_SGD_C2:g}, got {p['c2']:g} (its step size is 1 / (lambda t))")
    for name, algorithms in _SPECIFIC.items():
        if algorithm not in algorithms and p[name] != defaults[name]:
            raise ValueError(
                f"{name}={p[name]!r} does not apply to algorithm={algorithm!r} (only {', '.join(algorithms)}): "
                f"set {name}=None (its default, {defaults[name]!r})"
            )
    for name, algorithms in _STOPPING.items():
        if algorithm not in algorithms and p[name] is not None and name != "period":
            log.warning("%s=%r is not used by algorithm=%r (only %s)", name, p[name], algorithm, ", ".join(algorithms))
    if p["boundary_transitions"] and p["model_filename"] is not None:
        raise ValueError("model_filename writes a CRFsuite model, which has no start/end weights: boundary_transitions=False")
    boundary = p["model_filename"] is None if p["boundary_transitions"] is None else bool(p["boundary_transitions"])
    return Settings(
        boundary=boundary,
        algorithm=algorithm,
        max_iterations=p["max_iterations"] if p["max_iterations"] is not None else _MAX_ITERATIONS[algorithm],
        epsilon=p["epsilon"] if p["epsilon"] is not None else _EPSILON[algorithm],
        period=p["period"],
        delta=p["delta"] if p["delta"] is not None else _DELTA.get(algorithm, 0.0),
    )


def feature_index(X, labels: np.ndarray, n_labels: int, min_freq: float = 0.0, all_states: bool = False) -> np.ndarray | None:
    """Flat (A, L) indices (sorted) of the attribute/label pairs that are state features, chosen
    as CRFsuite chooses them: a pair's frequency is the sum of its attribute's values at the
    tokens of that label in ``X`` (T, A) with ``labels`` (T,) (0 for a pair never seen; a stored
    zero counts as seen), and a pair is a feature when that frequency is at least ``min_freq``
    and it was seen or ``all_states`` (CRFsuite's ``possible_states``) adds every pair. None
    when every pair is a feature (the dense table). Tokens whose label is unknown (-1) make no
    pairs."""
    if labels.size and labels.min() < 0:
        known = np.flatnonzero(labels >= 0)
        return feature_index(X[known], labels[known], n_labels, min_freq, all_states)
    n_cells = X.shape[1] * n_labels
    no_negative = not X.nnz or X.data.min() >= 0
    if all_states and min_freq <= 0:  # every pair, but those seen whose values sum below min_freq
        if no_negative:
            return None
        pairs, sums = _pair_sums(X, labels, n_labels)
        dropped = pairs[sums < min_freq]
        return np.setdiff1d(np.arange(n_cells), dropped, assume_unique=True) if dropped.size else None
    # (with min_freq > 0 the pairs never seen, of frequency 0, are no features either way)
    every_seen = min_freq <= 0 and no_negative  # else the sums decide (a pair summing below 0 is no feature)
    if every_seen and n_cells <= 8 * max(X.nnz, 1 << 20):
        # a mark per (attribute, label) cell, no larger than the int64 keys a sort would need (or
        # 8 MiB): the marked cells come out sorted, without sorting, a block of tokens at a time
        seen = np.zeros(n_cells, dtype=bool)
        for first in range(0, X.shape[0], _BLOCK_TOKENS):
            stop = min(first + _BLOCK_TOKENS, X.shape[0])
            begin, end = X.indptr[first], X.indptr[stop]
            within = np.repeat(labels[first:stop], np.diff(X.indptr[first : stop + 1]))
            seen[X.indices[begin:end].astype(np.int64) * n_labels + within] = True
        return np.flatnonzero(seen)
    if every_seen:
        return np.unique(_pair_keys(X, labels, n_labels))  # no inverse: half the temporary memory of the sort
    pairs, sums = _pair_sums(X, labels, n_labels)
    return pairs[sums >= min_freq]


def _pair_keys(X, labels: np.ndarray, n_labels: int) -> np.ndarray:
    """The flat (attribute, label) cell of every stored entry of ``X`` (T, A) (nnz,)."""
    return X.indices.astype(np.int64) * n_labels + np.repeat(labels, np.diff(X.indptr))


def _pair_sums(X, labels: np.ndarray, n_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """(the flat cells of the pairs seen, sorted; their summed attribute values)."""
    pairs, inverse = np.unique(_pair_keys(X, labels, n_labels), return_inverse=True)
    return pairs, np.bincount(inverse, weights=X.data, minlength=pairs.size)

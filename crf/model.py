"""The ``CRF`` estimator: fit, predict, marginals, segment confidence, save and load.

A scikit-learn estimator with sklearn-crfsuite's surface, so that its users can switch by
changing an import. ``X`` is a list of sequences of token features (dicts or lists of attribute
strings, as for python-crfsuite) or a :class:`~crf.batch.SequenceBatch` from
:class:`~crf.features.FeatureExtractor`; ``y`` is a list of label sequences.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from . import _chain as chain
from . import _compiled, metrics
from . import _model_file as model_file
from . import _online as online
from . import _optimize as optimize
from . import _params as hyper
from ._crfsuite_view import CRFsuiteView, training_log
from ._objective import Objective, ParameterLayout
from ._order import FirstOrderChain, chain_structure
from ._parallel import Workers, contiguous_parts, release_free_memory, single_threaded_blas, thread_count
from ._persist import ModelFileError
from ._segments import SegmentQueries
from ._uncertainty import UncertaintyQueries
from ._warm import PreviousFit
from .attributes import sequence_entries
from .batch import SequenceBatch, check_labels, label_classes
from .bundle import prefixed, register_kind
from .features import AttributeIndex, FeatureExtractor

log = logging.getLogger(__name__)

# where the fitted attributes that read None before fit keep their values (see CRF.classes_)
_FITTED_PRIVATE = ("_classes", "_attributes", "_training_log")

#: the most candidate labels marginal pruning keeps at a token (crf.CRF's pruning_threshold): the
#: pruned second-order lattice costs O(K^3) per token for K candidates
MAX_CANDIDATES = 6

# the fitted attribute of each block of the tail of label n-gram weights (see crf._order)
TAIL_ATTRIBUTES = {
    "transitions": "transitions_",
    "start": "start_weights_",
    "end": "end_weights_",
    "trigrams": "trigram_weights_",
    "pair_end": "pair_end_weights_",
}


class NotFittedCRFError(NotFittedError, RuntimeError):
    """A query on a CRF that has not been fitted (sklearn's NotFittedError)."""


def _flat_labels(y) -> np.ndarray:
    """All labels of ``y`` (a list of label sequences) in one object array (T,)."""
    flat = np.empty(sum(map(len, y)), dtype=object)
    flat[:] = list(itertools.chain.from_iterable(y))
    return flat


#: attribute values of at least this magnitude are reported: next to the usual 0/1 indicators they
#: make the objective so badly scaled that quasi-Newton steps cannot move
LARGE_VALUE = 1e6


def _entry_position(batch: SequenceBatch, entry: int, names=None) -> str:
    """``sequence i, token t: attribute <name or column>`` of the ``entry``-th stored value of X."""
    row = int(np.searchsorted(batch.X.indptr, entry, side="right")) - 1
    sequence = int(np.searchsorted(batch.offsets, row, side="right")) - 1
    column = int(batch.X.indices[entry])
    attribute = f"{names[column]!r}" if names is not None else f"column {column}"
    return f"sequence {sequence}, token {row - int(batch.offsets[sequence])}: attribute {attribute}"


def _check_finite(batch: SequenceBatch, names=None) -> None:
    """A non-finite attribute value would silently turn into a NaN model or NaN marginals."""
    bad = np.flatnonzero(~np.isfinite(batch.X.data))
    if bad.size:
        where = _entry_position(batch, int(bad[0]), names)
        raise ValueError(f"{where} has the non-finite value {batch.X.data[bad[0]]} ({bad.size} such values)")


def _largest_value(batch: SequenceBatch, names=None) -> tuple[float, str] | None:
    """The attribute value of largest magnitude and where it is, or None for an empty matrix."""
    if not batch.X.nnz:
        return None
    entry = int(np.argmax(np.abs(batch.X.data)))
    return float(batch.X.data[entry]), _entry_position(batch, entry, names)


class TrainingError(RuntimeError):
    """Training ended without moving from its starting point although the objective was not at
    its minimum there: the data cannot be fitted as given (the message says why)."""


class CRF(SegmentQueries, UncertaintyQueries, CRFsuiteView, BaseEstimator):
    """Linear-chain conditional random field, a scikit-learn estimator with sklearn-crfsuite's
    parameters, methods and fitted attributes (``None`` before ``fit``): ``classes_``,
    ``attributes_``, ``num_attributes_``, ``state_features_``, ``transition_features_``,
    ``size_``, ``training_log_``, ``tagger_``.
    """

    def __init__(
        self,
        algorithm: str = "lbfgs",
        min_freq: float = 0.0,
        all_possible_states: bool = False,
        all_possible_transitions: bool = False,
        c1: float = 0.0,
        c2: float = 1.0,
        max_iterations: int | None = None,
        num_memories: int = 6,
        epsilon: float | None = None,
        period: int = 10,
        delta: float | None = None,
        linesearch: str = "MoreThuente",
        max_linesearch: int = 20,
        calibration_eta: float = 0.1,
        calibration_rate: float = 2.0,
        calibration_samples: int = 1000,
        calibration_candidates: int = 10,
        calibration_max_trials: int = 20,
        pa_type: int = 1,
        c: float = 1.0,
        error_sensitive: bool = True,
        averaging: bool = True,
        variance: float = 1.0,
        gamma: float = 1.0,
        verbose: bool = False,
        model_filename: str | os.PathLike | None = None,
        keep_tempfiles: bool = False,
        trainer_cls=None,
        boundary_transitions: bool | None = None,
        learning_rate: float | None = None,
        batch_size: int = 1,
        random_state: int | None = 0,
        dev_every: int = 10,
        n_threads: int | None = None,
        callback=None,
        warm_start: bool = False,
        order: int = 1,
        pruning_threshold: float | None = None,
    ) -> None:
        arguments = dict(locals())
        del arguments["self"]
        for name, value in arguments.items():  # parameters only: everything else happens in fit
            setattr(self, name, value)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.dict = True
        tags.target_tags.required = True
        return tags

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_tagger", None)
        return state

    # sklearn-crfsuite's fitted attributes that read None before fit; each first loads
    # ``model_filename`` when it names an existing CRFsuite file, as sklearn-crfsuite does
    @property
    def classes_(self) -> list | None:
        """The labels, in the model's order (None before fit)."""
        self._load_model_file()
        return self.__dict__.get("_classes")

    @classes_.setter
    def classes_(self, value: list) -> None:
        self.__dict__["_classes"] = value

    @property
    def attributes_(self) -> list[str] | None:
        """The attribute names, in column order (None before fit, or when fitted on an unnamed batch)."""
        self._load_model_file()
        return self.__dict__.get("_attributes")

    @attributes_.setter
    def attributes_(self, value: list[str] | None) -> None:
        self.__dict__["_attributes"] = value

    @property
    def training_log_(self):
        """The iterations of the last fit (a :class:`crf._crfsuite_view.TrainingLog`; None before fit)."""
        self._load_model_file()
        return self.__dict__.get("_training_log")

    @training_log_.setter
    def training_log_(self, value) -> None:
        self.__dict__["_training_log"] = value

    def __sklearn_is_fitted__(self) -> bool:
        return self._fitted()

    def _load_model_file(self) -> bool:
        """Load ``model_filename`` (a CRFsuite model) into this unfitted estimator, if it exists."""
        path = self.__dict__.get("model_filename")
        if path is None or "state_weights_" in self.__dict__ or not os.path.isfile(path) or self.__dict__.get("_fitting"):
            return False
        from .crfsuite import read_crfsuite_model

        self._take_fitted_state(read_crfsuite_model(path))
        return True

    def _fitted_state(self) -> dict:
        """The attributes ``fit`` sets (its learned state), by name in ``__dict__``."""
        return {k: v for k, v in vars(self).items() if k.endswith("_") or k in _FITTED_PRIVATE}

    def _take_fitted_state(self, other: CRF) -> None:
        """Become fitted as ``other`` is (its weights, vocabularies and log), keeping own parameters."""
        self.__dict__.update(other._fitted_state())

    def _boundary(self) -> bool:
        if self.boundary_transitions is None:
            return self.model_filename is None  # CRFsuite's files have no start/end weights
        if self.boundary_transitions and self.model_filename is not None:
            raise ValueError("model_filename writes a CRFsuite model, which has no start/end weights: boundary_transitions=False")
        return bool(self.boundary_transitions)

    # --- inputs --------------------------------------------------------------------------

    def _batch(self, X, fitting: bool = False) -> SequenceBatch:
        if isinstance(X, SequenceBatch):
            if not fitting and X.n_attributes != self.n_attributes_:
                raise ValueError(f"batch has {X.n_attributes} attributes, the model was fitted on {self.n_attributes_}")
            _check_finite(X)
            return X
        if fitting:
            self.attribute_index_ = AttributeIndex()
            return self.attribute_index_.fit_transform(X)
        if getattr(self, "attribute_index_", None) is None:
            raise ValueError("this model was fitted on a SequenceBatch: pass a SequenceBatch")
        return self.attribute_index_.transform(X)

    def _label_codes(self, y, batch: SequenceBatch) -> np.ndarray:
        if len(y) != batch.n_sequences:
            raise ValueError(f"{batch.n_sequences} sequences in X but {len(y)} in y")
        for i, (labels, length) in enumerate(zip(y, batch.lengths)):
            if len(labels) != length:
                raise ValueError(f"sequence {i}: {length} tokens in X but {len(labels)} labels in y")
        flat = _flat_labels(y)
        index = {label: i for i, label in enumerate(self.classes_)}
        codes, uniques = pd.factorize(flat)  # None (unknown) gets -1
        mapping = np.array([index.get(u, -1) for u in uniques], dtype=np.int64)
        out = np.full(codes.size, -1, dtype=np.int64)
        known = codes >= 0
        out[known] = mapping[codes[known]]
        return out

    # --- training ------------------------------------------------------------------------

    def fit(self, X, y, X_dev=None, y_dev=None, attribute_names: Sequence[str] | None = None) -> CRF:
        """Train on ``X``, ``y``; with ``X_dev``/``y_dev``, report dev accuracy every
        ``dev_every`` iterations. ``attribute_names`` names the columns of a SequenceBatch.
        Hyperparameters and dev arguments are checked before any work.

        A label of None is unknown (``lbfgs`` and ``l2sgd``): training then maximises the
        probability of the known labels with the unknown ones summed out, and a sequence with no
        known label adds nothing. Only known labels make features. With ``warm_start=True`` a
        fitted model's weights are the starting point: its attributes and labels keep their
        columns, new ones are added after them with weights starting at zero (a SequenceBatch
        must keep the old columns: the same extractor, or one that only appends)."""
        if (X_dev is None) != (y_dev is None):
            raise ValueError("pass both X_dev and y_dev to evaluate on held-out data (or neither)")
        settings = hyper.validate(self.get_params())
        boundary = self._boundary()
        if self.model_filename is not None and isinstance(X, SequenceBatch) and attribute_names is None:
            raise ValueError("model_filename writes attribute names: pass attribute_names with a SequenceBatch")
        if len(X) == 0 or len(y) == 0:
            raise ValueError("fit needs at least one training sequence (X and y are empty)")
        flat_labels = _flat_labels(y)
        check_labels(flat_labels, unknown=True)
        partial = any(label is None for label in flat_labels)
        if partial and settings.algorithm not in ("lbfgs", "l2sgd"):
            raise ValueError(f"unknown labels (None) need algorithm='lbfgs' or 'l2sgd', not {settings.algorithm!r}")
        if partial and all(label is None for label in flat_labels):
            raise ValueError("fit needs at least one known label (every label of y is None)")
        previous = PreviousFit.of(self) if self.warm_start and self._fitted() else None
        if previous is not None and isinstance(X, SequenceBatch):
            previous.check_batch(X, attribute_names)  # before the fitted model is cleared
        elif previous is not None and previous.attribute_names is None:
            raise ValueError(
                "warm_start: the fitted model's attributes have no names (it was fitted on a SequenceBatch without "
                "attribute_names), so new feature dicts or lists cannot be matched to its weights; fit on batches "
                "with the same columns"
            )
        began = time.perf_counter()
        before = self._fitted_state()  # put back if this fit fails: a failed fit leaves the model as it was
        for name in [*before, "_tagger"]:
            self.__dict__.pop(name, None)
        self._fitting = True
        try:
            batch = self._batch(X, fitting=True)
            if isinstance(X, SequenceBatch):
                self.attribute_index_ = None
                names = attribute_names if attribute_names is not None else previous and previous.attribute_names
                self.attributes_ = list(names) if names is not None else None
            else:
                if previous is not None and previous.attribute_names is not None:
                    batch = self._merge_attributes(previous, batch)
                self.attributes_ = [str(a) for a in self.attribute_index_.names()]
            classes = label_classes(flat_labels, unknown=True)
            self.classes_ = classes if previous is None else previous.merged_classes(classes)
            self.n_attributes_ = batch.n_attributes
            largest = _largest_value(batch, self.attributes_)
            if largest is not None and abs(largest[0]) >= LARGE_VALUE:
                message = (
                    f"{largest[1]} has the value {largest[0]:g}: attribute values this large leave the objective so badly "
                    "scaled that training may not move; scale such attributes (for example to [0, 1] or by a logarithm)"
                )
                log.warning("%s", message)
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            codes = self._label_codes(y, batch)
            dev_batch = None
            if X_dev is not None:
                dev_batch = self._batch(X_dev)
                if len(y_dev) != dev_batch.n_sequences:
                    raise ValueError(f"{dev_batch.n_sequences} sequences in X_dev but {len(y_dev)} in y_dev")
            L = len(self.classes_)
            index = None if self.all_possible_states else hyper.feature_index(batch.X, codes, L, self.min_freq)
            structure = chain_structure(self.order, L)
            trainable = structure.trainable(batch.offsets, codes, self.min_freq, boundary, bool(self.all_possible_transitions))
            if previous is not None:
                index, trainable = previous.feature_index(index, L), previous.trainable(trainable, structure)
            params = ParameterLayout(batch.n_attributes, L, index, self.order)
            candidates, start_from = None, previous
            self.pruner_, self.pruned_mass_ = None, None
            if self.pruning_threshold is not None:
                self.pruner_ = self._fit_pruner(batch, y, previous)
                candidates = self.pruner_.candidates(batch.X, batch.lengths, self.pruning_threshold)
                known = np.flatnonzero(codes >= 0)
                candidates[known, codes[known]] = True  # the gold labels stay in the lattice
                self.pruned_mass_ = self.pruner_.pruned_mass(batch.X, batch.lengths, candidates)
                log.info(
                    "pruning: %.2f candidate labels per token (of %d), first-order mass pruned away %.2e per token",
                    candidates.sum() / max(1, candidates.shape[0]), L, self.pruned_mass_ / max(1, candidates.shape[0]),
                )  # fmt: skip
                if start_from is None:  # from the first-order optimum: its weights, no trigram weight yet
                    start_from = PreviousFit.of(self.pruner_)
            theta0 = start_from.theta(params) if start_from is not None else np.zeros(params.size)
            callback = self._iteration_callback(params, dev_batch, y_dev)
            result = self._train(settings, batch, codes, params, trainable, callback, theta0, candidates)
            # from zero weights no step lowering the loss means the data cannot be fitted as given; a
            # warm start (or the pruner's first-order optimum) may simply begin at the optimum
            if start_from is None and result.iterations == 0 and result.stop_reason.startswith("line search"):
                where = "" if largest is None else f"; the largest attribute value is {largest[0]:g} ({largest[1]})"
                raise TrainingError(
                    f"training could not move from its starting weights ({result.stop_reason}): no step lowered the loss{where}"
                )
        except BaseException:
            for name in [*self._fitted_state(), "_tagger"]:
                self.__dict__.pop(name, None)
            self.__dict__.update(before)
            raise
        finally:
            del self._fitting
        self._set_weights(params, result.theta)
        self.training_log_ = training_log(result.history)
        self.n_iter_ = result.iterations
        self.n_evaluations_ = result.evaluations
        self.stop_reason_ = result.stop_reason
        self.training_seconds_ = time.perf_counter() - began
        if self.model_filename is not None:
            from .crfsuite import write_crfsuite_model

            write_crfsuite_model(self, self.model_filename)
        return self

    def _merge_attributes(self, previous: PreviousFit, batch: SequenceBatch) -> SequenceBatch:
        """``batch`` (under the new data's own attribute index) moved into the columns of the old
        attributes followed by the new ones; the index becomes that merged one."""
        merged, columns = previous.merged_names(self.attribute_index_.names().tolist())
        X = batch.X.copy()
        X.indices = columns[X.indices].astype(X.indices.dtype)
        X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], len(merged)))
        X.sort_indices()
        self.attribute_index_.index_ = dict(zip(merged, range(len(merged))))
        return SequenceBatch(X, batch.offsets)

    def _fit_pruner(self, batch: SequenceBatch, y, previous: PreviousFit | None) -> CRF:
        """The first-order model whose marginals choose the candidate labels of a pruned
        second-order model: this model's settings at order 1, warm-started from the previous
        fit's pruner when there is one."""
        settings = {k: v for k, v in self.get_params().items() if k not in ("callback", "model_filename", "verbose")}
        pruner = CRF(**{**settings, "order": 1, "pruning_threshold": None, "warm_start": False})
        old = previous.pruner if previous is not None else None
        if old is not None:
            pruner._take_fitted_state(old)
            pruner.warm_start = True
        began = time.perf_counter()
        pruner.fit(batch, y, attribute_names=self.attributes_)
        log.info("pruning model (first order): %d iterations, %.1fs", pruner.n_iter_, time.perf_counter() - began)
        pruner.warm_start = False
        return pruner

    def _train(self, settings, batch, codes, params, trainable, callback, theta0, candidates=None) -> optimize.TrainingResult:
        stopping = optimize.StoppingRule(settings.max_iterations, settings.epsilon, settings.period, settings.delta)
        frozen = params.n_state + np.flatnonzero(~trainable)
        with single_threaded_blas():
            if settings.algorithm == "lbfgs":
                objective = Objective(batch.X, batch.offsets, codes, params, self.n_threads, candidates=candidates)
                release_free_memory()  # what building it freed, before the iterations add their working memory
                result = optimize.lbfgs(
                    objective, theta0, self.c1, self.c2, stopping, self.num_memories, callback, frozen, self.max_linesearch
                )
                del objective
                release_free_memory()  # the iterations' working memory, before the model's weights are made
                return result
            if settings.algorithm == "l2sgd":
                calibration = optimize.Calibration(
                    self.calibration_eta,
                    self.calibration_rate,
                    self.calibration_samples,
                    self.calibration_candidates,
                    self.calibration_max_trials,
                )
                return optimize.sgd(
                    batch.X, batch.offsets, codes, params, theta0, self.c2, stopping, self.learning_rate,
                    self.batch_size, self.random_state, callback, frozen, calibration, candidates,
                )  # fmt: skip
            rule = online.update_rule(
                settings.algorithm, self.pa_type, self.c, self.error_sensitive, self.averaging, self.variance, self.gamma
            )
            return online.train(batch.X, batch.offsets, codes, params, frozen, rule, stopping, self.random_state, callback)

    def _set_weights(self, params: ParameterLayout, theta: np.ndarray) -> None:
        state = params.split(theta)[0]
        # sparse layouts get a fresh (A, L) array from split; dense ones a view of theta
        self.state_weights_ = state if params.feature_index is not None else state.copy()
        for name, values in params.tail_blocks(theta).items():
            setattr(self, TAIL_ATTRIBUTES[name], np.array(values))
        self.feature_index_ = params.feature_index

    def _iteration_callback(self, params, dev_batch, y_dev):
        def report(info: optimize.IterationInfo) -> None:
            if dev_batch is not None and self.dev_every and info.iteration % self.dev_every == 0 and info.theta is not None:
                self._set_weights(params, info.theta)
                info.dev_predictions = self._predict_lists(dev_batch)
                info.dev_accuracy = metrics.token_accuracy(y_dev, info.dev_predictions)
            if self.verbose:
                dev = f" dev_acc={info.dev_accuracy:.2f}" if hasattr(info, "dev_accuracy") else ""
                log.info(
                    "iter %4d loss=%.4f |w|=%.4g |g|=%.4g active=%d %.1fs%s",
                    info.iteration, info.loss, info.feature_norm, info.gradient_norm, info.active_features, info.elapsed, dev,
                )  # fmt: skip
            if self.callback is not None:
                self.callback(info)

        return report

    # --- inference -----------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if "state_weights_" not in self.__dict__ and not self._load_model_file():
            raise NotFittedCRFError("this CRF is not fitted yet; call fit() or CRF.load()")

    def emissions(self, X) -> tuple[np.ndarray, SequenceBatch]:
        """Emission scores (T, L) and the batch they belong to."""
        self._check_fitted()
        batch = self._batch(X)
        return np.asarray(batch.X @ self.state_weights_), batch

    def chain_inputs(self, X) -> tuple[np.ndarray, tuple, SequenceBatch]:
        """What the chain runs on: per-state emissions (T, S) (labels for order 1, label pairs
        for order 2, pairs of candidate slots for a pruned model: see :mod:`crf._order`), the
        scores (transitions or transition operator, start (S,), end (S,)) and the batch. The
        operator maps states back to labels (``labels_at``, ``label_marginals``)."""
        emissions, batch = self.emissions(X)
        states, scores = self._chain_of(emissions, batch.X, batch.lengths)
        return states, scores, batch

    def _chain_of(self, emissions: np.ndarray, X, lengths: np.ndarray) -> tuple[np.ndarray, tuple]:
        """(per-state emissions (T, S), (transitions, start, end)) of the rows ``X`` (T, A) with
        per-label ``emissions`` (T, L), sequences of ``lengths``; a pruned model's lattice is
        over the candidates its pruner keeps."""
        candidates = None
        if self.__dict__.get("pruner_") is not None:
            candidates = self.pruner_.candidates(X, lengths, self.pruning_threshold)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        lattice, tail = self._structure().lattice_in_order(offsets, candidates), self._tail()
        return lattice.emissions(emissions, tail), lattice.scores(tail)

    def _structure(self) -> FirstOrderChain:
        """The tail structure of this model's order (:mod:`crf._order`)."""
        return chain_structure(self.order, len(self.classes_))

    def _tail(self) -> np.ndarray:
        """The fitted tail of label n-gram weights, flat (see :mod:`crf._order`)."""
        return np.concatenate([np.ravel(getattr(self, TAIL_ATTRIBUTES[name])) for name in self._structure().blocks])

    def _weights(self):
        """(transitions or transition operator, start (S,), end (S,)) of the unpruned chain."""
        return self._structure().scores(self._tail())

    def _label_marginals(self, marginals: np.ndarray, transitions, reduce=np.add) -> np.ndarray:
        """Per-state marginals (T, S) as per-label ones (T, L) (max-marginals with np.maximum)."""
        return chain.operator_of(transitions).label_marginals(marginals, len(self.classes_), reduce)

    def candidates(self, X, lengths: np.ndarray, threshold: float) -> np.ndarray:
        """The labels kept at each token by marginal pruning (T, L) bool: those whose marginal
        under this model is at least ``threshold``, at most :data:`MAX_CANDIDATES` of them (the
        most probable), and always the most probable one. ``X`` (T, A)."""
        self._check_fitted()
        marginals = self._marginals_of(X, lengths)
        keep = marginals >= threshold
        keep[np.arange(marginals.shape[0]), marginals.argmax(axis=1)] = True
        if marginals.shape[1] > MAX_CANDIDATES:
            below = np.partition(marginals, -MAX_CANDIDATES, axis=1)[:, -MAX_CANDIDATES]  # the cap's smallest marginal
            keep &= marginals >= below[:, None]
        return keep

    def _marginals_of(self, X, lengths: np.ndarray) -> np.ndarray:
        """Token marginals (T, L) of the rows ``X`` (T, A)."""
        states, scores = self._chain_of(np.asarray(X @ self.state_weights_), X, lengths)
        marginals = chain.forward_backward(states, *scores, lengths, counts=False).marginals
        return self._label_marginals(marginals, scores[0])

    def pruned_mass(self, X, lengths: np.ndarray, keep: np.ndarray) -> float:
        """The marginal probability this model gives the labels ``keep`` (T, L) drops, summed over
        tokens: a bound (by the union bound) on the probability, under this model, of the paths
        that leave the pruned lattice, summed over sequences."""
        return float(np.where(keep, 0.0, self._marginals_of(X, lengths)).sum())

    def _split(self, flat, batch: SequenceBatch) -> list:
        return [flat[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]

    def _by_sequence(self, X, query) -> list:
        """``query(batch)`` (one list entry per sequence) over the non-empty sequences of ``X``,
        with ``[]`` for empty ones (a SequenceBatch has none)."""
        self._check_fitted()
        if isinstance(X, SequenceBatch):
            return query(X) if X.n_sequences else []
        kept = [i for i, sequence in enumerate(X) if len(sequence)]
        out: list = [[] for _ in range(len(X))]
        if kept:
            for i, value in zip(kept, query([X[i] for i in kept] if len(kept) < len(X) else X)):
                out[i] = value
        return out

    def _predict_lists(self, X) -> list[list[str]]:
        classes = np.array(self.classes_, dtype=object)
        return self._by_sequence(X, lambda batch: [classes[part].tolist() for part in self.predict_codes(batch)[0]])

    def predict(self, X) -> np.ndarray:
        """Most likely label sequence (Viterbi) of every sequence, as sklearn-crfsuite returns it:
        ``np.array(list of label lists, dtype=object)``."""
        return np.array(self._predict_lists(X), dtype=object)

    def predict_codes(self, X) -> tuple[list[np.ndarray], np.ndarray]:
        """Viterbi label indices per sequence and the path scores (N,).

        Contiguous parts of the batch are tagged on separate threads."""
        self._check_fitted()
        batch = self._batch(X)
        n_threads = thread_count(self.n_threads)

        def tag(part: tuple[int, int]):
            rows = slice(int(batch.offsets[part[0]]), int(batch.offsets[part[1]]))
            lengths = batch.lengths[part[0] : part[1]]
            emissions, weights = self._chain_of(np.asarray(batch.X[rows] @ self.state_weights_), batch.X[rows], lengths)
            states, scores = chain.viterbi(emissions, *weights, lengths)
            return chain.operator_of(weights[0]).labels_at(states), scores

        with single_threaded_blas(), Workers(n_threads) as workers:
            parts = workers.map(tag, contiguous_parts(batch.offsets, n_threads))
        labels = np.concatenate([p[0] for p in parts])
        scores = np.concatenate([p[1] for p in parts])
        return self._split(labels, batch), scores

    def predict_single(self, xseq) -> list[str]:
        """Labels of one sequence (a list of str)."""
        self._check_fitted()
        emissions = self._sequence_emissions(xseq)
        if emissions is None:
            return self._predict_lists([xseq])[0]
        classes = self.classes_
        if self.order == 1:  # the chain's scores are the fitted arrays themselves: straight to the kernel
            weights = (self.transitions_, self.start_weights_, self.end_weights_)
            labels, _ = _compiled.viterbi(emissions, *weights, np.array([0, len(emissions)]))
            return [classes[i] for i in labels.tolist()]
        weights = self._chain_of(emissions, None, np.array([len(emissions)]))[1]
        states, _ = chain.viterbi(emissions, *weights, [len(emissions)])
        return [classes[i] for i in chain.operator_of(weights[0]).labels_at(states).tolist()]

    def _sequence_emissions(self, xseq) -> np.ndarray | None:
        """Emission scores (T, L) of one sequence of tokens, read without a batch (the per-call
        path: :func:`crf.attributes.sequence_entries`, then a compiled sparse product). The same
        bits as :meth:`emissions` gives (each token's attributes added in column order, as
        scipy's sparse product adds them). None where the batch path is needed: a model fitted
        on batches or with a pruning model, an empty sequence, tokens of rare shapes, a token
        that repeats an attribute."""
        index = self.__dict__.get("attribute_index_")
        if index is None or self.__dict__.get("pruner_") is not None or isinstance(xseq, SequenceBatch):
            return None
        entries = sequence_entries(xseq, index.index_.get)
        if entries is None:
            return None
        return _compiled.rows_times_dense(*entries, self.state_weights_)

    def marginals(self, X) -> tuple[np.ndarray, SequenceBatch]:
        """Node marginals p(y_t = l | x) as a (T, L) array (columns in ``classes_`` order)."""
        posterior, _, batch = self.posterior(X)
        return posterior.marginals, batch

    def posterior(self, X, keep_messages: bool = False) -> tuple[chain.Posterior, np.ndarray, SequenceBatch]:
        """Forward-backward over ``X``: the :class:`crf._chain.Posterior` (log Z (N,), marginals
        (T, L) in ``classes_`` order and, with ``keep_messages``, the per-state log messages that
        :meth:`segments_of` reuses), the chain's per-state emissions (T, S) (see
        :meth:`chain_inputs`; the per-label ones for order 1) and the batch. The chain's scores
        are kept on the posterior (``scores``) for :meth:`segments_of`."""
        emissions, scores, batch = self.chain_inputs(X)
        posterior = chain.forward_backward(emissions, *scores, batch.lengths, keep_messages=keep_messages, counts=False)
        posterior.marginals = self._label_marginals(posterior.marginals, scores[0])
        posterior.scores = scores
        return posterior, emissions, batch

    def _marginal_dicts(self, X) -> list[list[dict[str, float]]]:
        def query(X):
            marginals, batch = self.marginals(X)
            return self._split([dict(zip(self.classes_, row)) for row in marginals.tolist()], batch)

        return self._by_sequence(X, query)

    def predict_marginals(self, X) -> np.ndarray:
        """Per token, a dict label -> marginal probability, as sklearn-crfsuite returns it:
        ``np.array(list of lists of dicts, dtype=object)``."""
        return np.array(self._marginal_dicts(X), dtype=object)

    def predict_marginals_single(self, xseq) -> list[dict[str, float]]:
        return self._marginal_dicts([xseq])[0]

    def log_partition(self, X) -> np.ndarray:
        """log Z(x) of every sequence (N,)."""
        emissions, scores, batch = self.chain_inputs(X)
        return chain.log_partition(emissions, *scores, batch.lengths)

    def sequence_probability(self, X, y) -> np.ndarray:
        """p(y | x) for every given labelling (N,) (0 for a labelling a pruned model's lattice leaves out)."""
        emissions, scores, batch = self.chain_inputs(X)
        codes = self._label_codes(y, batch)
        if np.any(codes < 0):
            raise ValueError("y contains labels the model does not know")
        return np.exp(
            path_scores(emissions, scores, batch.offsets, codes) - chain.log_partition(emissions, *scores, batch.lengths)
        )

    def score(self, X, y) -> float:
        """Token accuracy (a fraction) of the predictions (sklearn-crfsuite's ``score``); gold
        labels that are None (unknown) are left out (NaN if every one is)."""
        predicted = self._predict_lists(X)
        gold = _flat_labels(y)
        known = np.array([label is not None for label in gold], dtype=bool)
        if known.all():
            return metrics.flat_accuracy_score(y, predicted)
        metrics.check_aligned(y, predicted, unknown=True)
        flat = _flat_labels(predicted)
        return float(np.mean(gold[known] == flat[known])) if known.any() else float("nan")

    # --- persistence ---------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the fitted model to one ``.npz`` file (no pickle; checksummed; atomic)."""
        self._check_fitted()
        model_file.save(self, path)

    @classmethod
    def load(cls, path) -> CRF:
        """Read a model written by :meth:`save`; raises ModelFileError on a bad file."""
        return model_file.load(cls, path)


CRF.__doc__ += hyper.DOC


def path_scores(emissions: np.ndarray, scores: tuple, offsets: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """score(y) (N,) of the labelling ``codes`` (T,) of sequences at ``offsets`` under the
    chain's per-state ``emissions`` and ``scores``; -inf where the chain has no state for it."""
    first = np.zeros(codes.size, dtype=bool)
    first[offsets[:-1][offsets[:-1] < codes.size]] = True
    states = chain.operator_of(scores[0]).states_of_labels(codes, first)
    missing = np.add.reduceat((states < 0).astype(np.int64), offsets[:-1]) > 0 if codes.size else np.zeros(0, dtype=bool)
    with np.errstate(invalid="ignore"):
        out = chain.sequence_scores(emissions, *scores, offsets, np.maximum(states, 0))
    return np.where(missing, -np.inf, out)


@register_kind
class BundledCRF:
    """A CRF and its fitted feature extractor as the part of a :class:`crf.TaggerBundle`: the
    emissions come from the extractor's attributes of the raw token columns."""

    kind = "crf"

    def __init__(self, extractor: FeatureExtractor, model: CRF) -> None:
        if extractor.n_attributes != model.n_attributes_:
            raise ValueError(f"the extractor has {extractor.n_attributes} attributes, the CRF {model.n_attributes_}")
        self.extractor, self.model = extractor, model
        self.labels = [str(c) for c in model.classes_]
        # the most states a token can have (a pruned model's depend on its candidates)
        slots = min(MAX_CANDIDATES, len(self.labels)) if model.__dict__.get("pruner_") is not None else None
        self.n_states = model._structure().n_states if slots is None else (slots + 1) * slots
        self.columns = extractor.input_columns()

    def scores(self, columns, lengths):
        blank = np.full(int(lengths.sum()), "", dtype=object)
        rows = list(zip(*(columns.get(c, blank) for c in self.extractor.columns)))
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        batch = self.extractor.transform([rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])])
        model = self.model
        emissions, scores = model._chain_of(np.asarray(batch.X @ model.state_weights_), batch.X, lengths)
        return (emissions, *scores)

    def parts(self):
        meta, arrays = model_file.to_arrays(self.model)
        out = {f"model/{k}": v for k, v in arrays.items()}
        out.update({f"features/{k}": v for k, v in self.extractor.state_arrays().items()})
        return {"model": meta, "features": self.extractor.config()}, out

    @classmethod
    def from_parts(cls, meta, arrays, path):
        extractor = FeatureExtractor.from_state(meta["features"], prefixed(arrays, "features/"), path)
        model = model_file.from_arrays(CRF, meta["model"], prefixed(arrays, "model/"), path)
        if extractor.n_attributes != model.n_attributes_:
            raise ModelFileError(
                f"{path}: the features give {extractor.n_attributes} attributes, the CRF reads {model.n_attributes_}"
            )
        return cls(extractor, model)

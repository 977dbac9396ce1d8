"""The ``CRF`` estimator: fit, predict, marginals, segment confidence, save and load.

A scikit-learn estimator with sklearn-crfsuite's surface, so that its users can switch by
changing an import. ``X`` is a list of sequences of token features (dicts or lists of attribute
strings, as for python-crfsuite) or a :class:`~crf.batch.SequenceBatch` from
:class:`~crf.features.FeatureExtractor`; ``y`` is a list of label sequences.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import time
from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from . import _chain as chain
from . import _compiled, crfsuite, metrics
from . import _model_file as model_file
from . import _optimize as optimize
from . import _params as hyper
from ._feature_tables import FeatureTables
from ._order import TAIL_ATTRIBUTES, ChainStructure, chain_structure
from ._parallel import Workers, contiguous_parts, single_threaded_blas, thread_count
from ._path_scores import path_scores
from ._persist import ModelFileError
from ._segments import SegmentQueries
from ._training import (
    TrainingError,
    TrainingProblem,
    as_sequence_list,
    check_taggable,
    flat_labels,
    label_codes,
    label_sequences,
    solve,
    split_by_sequence,
    training_problem,
)
from ._training_log import TrainingLog, training_log
from ._uncertainty import UncertaintyQueries
from ._warm import PreviousFit
from .attributes import check_sequence_container, sequence_entries
from .batch import SequenceBatch
from .bundle import prefixed, register_kind
from .features import FeatureExtractor

__all__ = ["CRF", "BundledCRF", "NotFittedCRFError", "TrainingError", "path_scores"]

log = logging.getLogger(__name__)

# where the fitted attributes that read None before fit keep their values (see CRF.classes_)
_FITTED_PRIVATE = ("_classes", "_attributes", "_training_log")

#: the most candidate labels the first-order marginals keep at a token (crf.CRF's candidate_threshold): the
#: candidate second-order lattice costs O(K^3) per token for K candidates
MAX_CANDIDATES = 6
# attributes of models pickled by earlier versions, under their current names
_EARLIER_ATTRIBUTES = {
    "pruning_threshold": "candidate_threshold",
    "pruning_threshold_": "candidate_threshold_",
    "pruner_": "candidate_model_",
    "pruned_mass_": "excluded_mass_",
}


class NotFittedCRFError(NotFittedError, RuntimeError):
    """A query on a CRF that has not been fitted (sklearn's NotFittedError)."""


class CRF(SegmentQueries, UncertaintyQueries, FeatureTables, BaseEstimator):
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
        candidate_threshold: float | None = None,
    ) -> None:
        # parameters only, as scikit-learn's estimators store them: everything else happens in fit
        self.algorithm = algorithm
        self.min_freq = min_freq
        self.all_possible_states = all_possible_states
        self.all_possible_transitions = all_possible_transitions
        self.c1 = c1
        self.c2 = c2
        self.max_iterations = max_iterations
        self.num_memories = num_memories
        self.epsilon = epsilon
        self.period = period
        self.delta = delta
        self.linesearch = linesearch
        self.max_linesearch = max_linesearch
        self.calibration_eta = calibration_eta
        self.calibration_rate = calibration_rate
        self.calibration_samples = calibration_samples
        self.calibration_candidates = calibration_candidates
        self.calibration_max_trials = calibration_max_trials
        self.pa_type = pa_type
        self.c = c
        self.error_sensitive = error_sensitive
        self.averaging = averaging
        self.variance = variance
        self.gamma = gamma
        self.verbose = verbose
        self.model_filename = model_filename
        self.keep_tempfiles = keep_tempfiles
        self.trainer_cls = trainer_cls
        self.boundary_transitions = boundary_transitions
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.random_state = random_state
        self.dev_every = dev_every
        self.n_threads = n_threads
        self.callback = callback
        self.warm_start = warm_start
        self.order = order
        self.candidate_threshold = candidate_threshold

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

    def __setstate__(self, state: dict) -> None:
        # a model pickled by an earlier version: its candidate labels under their earlier names,
        # and before ``candidate_threshold_`` was kept, only the parameter
        state = {_EARLIER_ATTRIBUTES.get(k, k): v for k, v in state.items()}
        if state.get("candidate_model_") is not None and "candidate_threshold_" not in state:
            state["candidate_threshold_"] = state.get("candidate_threshold")
        super().__setstate__(state)

    # sklearn-crfsuite's fitted attributes that read None before fit; an unfitted estimator whose
    # ``model_filename`` names an existing CRFsuite file is that file's model, as in sklearn-crfsuite
    @property
    def classes_(self) -> list | None:
        """The labels, in the model's order (None before fit)."""
        self._fitted()
        return self.__dict__.get("_classes")

    @classes_.setter
    def classes_(self, value: list) -> None:
        self.__dict__["_classes"] = value

    @property
    def attributes_(self) -> list[str] | None:
        """The attribute names, in column order (None before fit, or when fitted on an unnamed batch)."""
        self._fitted()
        return self.__dict__.get("_attributes")

    @attributes_.setter
    def attributes_(self, value: list[str] | None) -> None:
        self.__dict__["_attributes"] = value

    @property
    def training_log_(self) -> TrainingLog | None:
        """The iterations of the last fit (a :class:`crf._training_log.TrainingLog`; None before fit)."""
        self._fitted()
        return self.__dict__.get("_training_log")

    @training_log_.setter
    def training_log_(self, value: TrainingLog | None) -> None:
        self.__dict__["_training_log"] = value

    @property
    def fitted_order(self) -> int:
        """The order of the fitted weights (2 when they have label-trigram weights), whatever
        ``order`` says now."""
        return 2 if "trigram_weights_" in self.__dict__ else 1

    def __sklearn_is_fitted__(self) -> bool:
        return self._fitted()

    def _fitted(self) -> bool:
        """Whether the weights are there, reading ``model_filename`` first when it names an
        existing CRFsuite file and nothing else is fitted."""
        if "state_weights_" in self.__dict__:
            return True
        path = self.__dict__.get("model_filename")
        if path is None or not os.path.isfile(path):
            return False
        self._set_fitted_attributes(crfsuite.fitted_attributes(crfsuite.read_crfsuite(path)))
        return True

    @classmethod
    def from_crfsuite(cls, source: str | os.PathLike | crfsuite.CRFsuiteModel) -> CRF:
        """A fitted CRF that tags exactly as CRFsuite's tagger does with a CRFsuite model.

        Parameters
        ----------
        source : str, os.PathLike or CRFsuiteModel
            A CRFsuite model file (python-crfsuite's, sklearn-crfsuite's) or a read one
            (:func:`crf.read_crfsuite`).

        Returns
        -------
        CRF
            Start and end weights 0, ``boundary_transitions=False``.

        Raises
        ------
        crf.CRFsuiteFormatError
            A missing or bad file, or a model without labels.
        """
        model = source if isinstance(source, crfsuite.CRFsuiteModel) else crfsuite.read_crfsuite(source)
        if not model.labels:  # a file CRFsuite writes when it had nothing to train on
            raise crfsuite.CRFsuiteFormatError(f"{source}: the model has no labels (CRFsuite trained it on no data)")
        out = cls(boundary_transitions=False)
        out._set_fitted_attributes(crfsuite.fitted_attributes(model))
        return out

    def _set_fitted_attributes(self, attributes: dict) -> None:
        for name, value in attributes.items():
            setattr(self, name, value)

    @contextlib.contextmanager
    def _replacing_fitted_state(self):
        """Clear the fitted state (every attribute ``fit`` sets) for the block to set a new one;
        if the block fails, the old state is put back (a failed fit leaves the model as it was)."""

        def fitted() -> list[str]:
            return [k for k in vars(self) if k.endswith("_") or k in _FITTED_PRIVATE or k == "_tagger"]

        before = {k: self.__dict__.pop(k) for k in fitted()}
        try:
            yield
        except BaseException:
            for name in fitted():
                del self.__dict__[name]
            self.__dict__.update(before)
            raise

    def validate_params(self) -> hyper.Settings:
        """Check every parameter (what ``fit`` checks first).

        Returns
        -------
        crf._params.Settings
            The stopping settings with the algorithm's defaults filled in and ``boundary``,
            whether the model gets start/end weights (``boundary_transitions`` resolved).

        Raises
        ------
        ValueError
            Naming the first bad parameter.
        """
        return hyper.validate(self.get_params(), _DEFAULTS)

    # --- inputs --------------------------------------------------------------------------

    def _batch(self, X) -> SequenceBatch:
        if isinstance(X, SequenceBatch):
            if X.n_attributes != self.n_attributes_:
                raise ValueError(f"batch has {X.n_attributes} attributes, the model was fitted on {self.n_attributes_}")
            check_taggable(X, self.__dict__.get("_attributes"))
            return X
        if getattr(self, "attribute_index_", None) is None:
            raise ValueError("this model was fitted on a SequenceBatch: pass a SequenceBatch")
        batch = self.attribute_index_.transform(as_sequence_list(X, "X"))
        check_taggable(batch, self.__dict__.get("_attributes"))
        return batch

    # --- training ------------------------------------------------------------------------

    def fit(self, X, y, X_dev=None, y_dev=None, attribute_names: Sequence[str] | None = None) -> CRF:
        """Train on ``X``, ``y``.

        Every parameter and input is checked before any training (:mod:`crf._training`): the
        call becomes one training problem, the solver of ``algorithm`` trains it, and the fitted
        state is set at the end (a failed fit leaves the model as it was).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each token a dict ``{attribute: value}`` or a list of attribute strings; or a
            :class:`~crf.batch.SequenceBatch` (T tokens x A attributes).
        y : list of label sequences
            One label (a string or an integer) per token. A label of None is unknown (``lbfgs``
            and ``l2sgd``): training then maximises the probability of the known labels with the
            unknown ones summed out; only known labels make features.
        X_dev, y_dev : optional
            Held-out data in the form of ``X`` and ``y``; the dev accuracy (percent) is reported
            every ``dev_every`` iterations (to ``callback``, as ``IterationInfo.dev_accuracy``).
        attribute_names : sequence of str of length A, optional
            The names of a SequenceBatch's columns.

        Returns
        -------
        CRF
            self. With ``warm_start=True`` a fitted model's weights are the starting point: the
            attributes and labels are those of the new data, as in a cold fit (old labels first);
            an old attribute's weights go to the attribute of the same name (a SequenceBatch
            without names keeps the old columns first), new ones start at zero, and an old
            attribute or label that the new data lacks is dropped.

        Raises
        ------
        ValueError, TypeError
            A bad parameter, input or warm-start source, naming it, before any training.
        TrainingError
            Training could not move from its starting point although that was not the minimum,
            or drove a weight beyond what a model file holds (1e6); the message says why.
        """
        return self._fit(X, y, X_dev, y_dev, attribute_names)

    def _fit(self, X, y, X_dev=None, y_dev=None, attribute_names=None, label_order: Sequence | None = None) -> CRF:
        """:meth:`fit`, with the labels in ``label_order`` when given (a candidate model takes its model's)."""
        began = time.perf_counter()
        params = self.get_params()
        previous = PreviousFit.of(self) if self.warm_start and self._fitted() else None
        problem = training_problem(X, y, X_dev, y_dev, attribute_names, params, _DEFAULTS, previous, label_order)
        candidate_model, candidates, excluded_mass = self._candidate_choice(problem)
        start = problem.start or (PreviousFit.of(candidate_model) if candidate_model is not None else None)
        theta0 = None if start is None else start.theta(problem.layout, problem.trainable, problem.classes, problem.attributes)
        result = solve(problem, params, theta0, self._iteration_callback(problem, candidate_model), candidates)
        with self._replacing_fitted_state():
            self._set_fitted(problem, result.theta, candidate_model, excluded_mass)
            self.training_log_ = training_log(result.history)
            self.n_iter_ = result.iterations
            self.n_evaluations_ = result.evaluations
            self.stop_reason_ = result.stop_reason
            self.training_seconds_ = time.perf_counter() - began
            if self.model_filename is not None:  # sklearn-crfsuite's model_filename
                crfsuite.write_crfsuite_model(self, self.model_filename)
        return self

    def _set_fitted(
        self, problem: TrainingProblem, theta: np.ndarray, candidate_model: CRF | None, excluded_mass: float | None
    ) -> None:
        """Become the model of ``problem`` with the weights ``theta`` (layout.size,)."""
        layout = problem.layout
        self.classes_ = problem.classes
        self.attributes_ = problem.attributes
        self.attribute_index_ = problem.attribute_index
        self.n_attributes_ = problem.batch.n_attributes
        state = layout.split(theta)[0]
        # sparse layouts get a fresh (A, L) array from split; dense ones a view of theta
        self.state_weights_ = state if layout.feature_index is not None else state.copy()
        for name, values in layout.tail_blocks(theta).items():
            setattr(self, TAIL_ATTRIBUTES[name], np.array(values))
        self.feature_index_ = layout.feature_index
        self.candidate_model_ = candidate_model
        self.excluded_mass_ = excluded_mass
        # the threshold the candidates are chosen by, as fitted: ``candidate_threshold`` may be set anew
        self.candidate_threshold_ = None if candidate_model is None else float(self.candidate_threshold)

    def _candidate_choice(self, problem: TrainingProblem) -> tuple[CRF | None, np.ndarray | None, float | None]:
        """(the first-order model whose marginals choose the candidate labels of a
        second-order model, the candidates (T, L) bool, the first-order mass they leave out), or
        Nones without ``candidate_threshold``. The candidate model has this model's settings at order 1 and
        is warm-started from the previous fit's candidate model when there is one."""
        if self.candidate_threshold is None:
            return None, None, None
        settings = {k: v for k, v in self.get_params().items() if k not in ("callback", "model_filename", "verbose")}
        settings.update(order=1, candidate_threshold=None, warm_start=False)
        old = problem.start.candidate_model if problem.start is not None else None
        candidate_model = CRF(**settings) if old is None else copy.copy(old).set_params(**{**settings, "warm_start": True})
        began = time.perf_counter()
        batch, y = problem.batch, label_sequences(problem)
        # in the model's label order (a warm start's merged labels), which the candidates' columns follow
        candidate_model._fit(batch, y, attribute_names=problem.attributes, label_order=problem.classes)
        log.info("candidate model (first order): %d iterations, %.1fs", candidate_model.n_iter_, time.perf_counter() - began)
        candidate_model.warm_start = False
        candidates = candidate_model.candidates(batch.X, batch.lengths, self.candidate_threshold)
        known = np.flatnonzero(problem.codes >= 0)
        candidates[known, problem.codes[known]] = True  # the gold labels stay in the lattice
        excluded_mass = candidate_model.excluded_mass(batch.X, batch.lengths, candidates)
        log.info(
            "candidate labels: %.2f per token (of %d), first-order mass left out %.2e per token",
            candidates.sum() / max(1, candidates.shape[0]), problem.n_labels, excluded_mass / max(1, candidates.shape[0]),
        )  # fmt: skip
        return candidate_model, candidates, excluded_mass

    def _iteration_callback(self, problem: TrainingProblem, candidate_model: CRF | None):
        """The solver's per-iteration callback: dev accuracy every ``dev_every`` iterations (by a
        snapshot of the model at that iteration's weights), the verbose log line, ``callback``."""
        dev = problem.dev

        def report(info: optimize.IterationInfo) -> None:
            if dev is not None and self.dev_every and info.iteration % self.dev_every == 0 and info.theta is not None:
                snapshot = CRF(order=self.order, candidate_threshold=self.candidate_threshold, n_threads=self.n_threads)
                snapshot._set_fitted(problem, info.theta, candidate_model, None)
                info.dev_predictions = snapshot._predict_lists(dev[0])
                info.dev_accuracy = metrics.token_accuracy(dev[1], info.dev_predictions)
            if self.verbose:
                extra = f" dev_acc={info.dev_accuracy:.2f}" if hasattr(info, "dev_accuracy") else ""
                log.info(
                    "iter %4d loss=%.4f |w|=%.4g |g|=%.4g active=%d %.1fs%s",
                    info.iteration, info.loss, info.feature_norm, info.gradient_norm, info.active_features, info.elapsed, extra,
                )  # fmt: skip
            if self.callback is not None:
                self.callback(info)

        return report

    # --- inference -----------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not self._fitted():
            raise NotFittedCRFError("this CRF is not fitted yet; call fit() or CRF.load()")

    def emissions(self, X) -> tuple[np.ndarray, SequenceBatch]:
        """Emission scores: the state weights applied to every token's attributes.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.

        Returns
        -------
        emissions : ndarray of shape (T, L), float64
            ``X @ state_weights_``: the score of every label (``classes_`` order) at every token.
        batch : SequenceBatch
            The batch the rows belong to (``X`` itself when it is one).

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            A SequenceBatch whose number of attributes is not the model's; a non-finite value, or
            one of 1e10 or more (too large to tag, as to train on); a list input to a model fitted
            on a SequenceBatch.
        """
        self._check_fitted()
        batch = self._batch(X)
        return np.asarray(batch.X @ self.state_weights_), batch

    def chain_inputs(self, X) -> tuple[np.ndarray, tuple, SequenceBatch]:
        """What the chain runs on: per-state emissions, chain scores and the batch.

        The states are the labels for order 1, label pairs for order 2 and pairs of candidate
        slots for a candidate-lattice model (see :mod:`crf._order`).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.

        Returns
        -------
        states : ndarray of shape (T, S), float64
            Per-state emission scores (S = L for order 1).
        scores : tuple
            ``(transitions, start, end)``: an (L, L) transition matrix for order 1, else a
            transition operator, which maps states back to labels (``labels_at``,
            ``label_marginals``); start and end scores of shape (S,).
        batch : SequenceBatch
            The batch the rows belong to.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        emissions, batch = self.emissions(X)
        states, scores = self._chain_of(emissions, batch.X, batch.lengths)
        return states, scores, batch

    def _chain_of(self, emissions: np.ndarray, X, lengths: np.ndarray) -> tuple[np.ndarray, tuple]:
        """(per-state emissions (T, S), (transitions, start, end)) of the rows ``X`` (T, A) with
        per-label ``emissions`` (T, L), sequences of ``lengths``; a candidate-lattice model's lattice is
        over the candidates its candidate model keeps."""
        candidates = None
        if self.__dict__.get("candidate_model_") is not None:
            candidates = self.candidate_model_.candidates(X, lengths, self.candidate_threshold_)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        lattice, tail = self._structure().lattice_in_order(offsets, candidates), self._tail()
        return lattice.emissions(emissions, tail), lattice.scores(tail)

    def _structure(self) -> ChainStructure:
        """The tail structure of this model's order (:mod:`crf._order`)."""
        return chain_structure(self.fitted_order, len(self.classes_))

    def _tail(self) -> np.ndarray:
        """The fitted tail of label n-gram weights, flat (see :mod:`crf._order`)."""
        return np.concatenate([np.ravel(getattr(self, TAIL_ATTRIBUTES[name])) for name in self._structure().blocks])

    def _weights(self):
        """(transitions or transition operator, start (S,), end (S,)) of the full chain."""
        return self._structure().scores(self._tail())

    def _label_marginals(self, marginals: np.ndarray, transitions, reduce=np.add) -> np.ndarray:
        """Per-state marginals (T, S) as per-label ones (T, L) (max-marginals with np.maximum)."""
        return chain.operator_of(transitions).label_marginals(marginals, len(self.classes_), reduce)

    def candidates(self, X, lengths: np.ndarray, threshold: float) -> np.ndarray:
        """The labels kept at each token by their first-order marginals (this model as the candidate model).

        A label is kept where its marginal under this model is at least ``threshold``, at most
        :data:`MAX_CANDIDATES` of them (the most probable); the most probable label is always kept.

        Parameters
        ----------
        X : sparse matrix of shape (T, A)
            The tokens' attribute rows (a SequenceBatch's ``X``), in the model's columns.
        lengths : ndarray of shape (N,), int
            Tokens per sequence; they sum to T.
        threshold : float
            The least marginal probability a label needs, in (0, 1).

        Returns
        -------
        ndarray of shape (T, L), bool
            True where the label (``classes_`` order) is a candidate at the token.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        """
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

    def excluded_mass(self, X, lengths: np.ndarray, keep: np.ndarray) -> float:
        """The marginal probability this model gives the labels that ``keep`` drops, summed over tokens.

        By the union bound, an upper bound on the probability (under this model) of the paths
        that leave the candidate lattice, summed over sequences.

        Parameters
        ----------
        X : sparse matrix of shape (T, A)
            The tokens' attribute rows, in the model's columns.
        lengths : ndarray of shape (N,), int
            Tokens per sequence; they sum to T.
        keep : ndarray of shape (T, L), bool
            The kept labels (as :meth:`candidates` gives them).

        Returns
        -------
        float
            The summed marginal probability of the dropped labels, between 0 and T.
        """
        return float(np.where(keep, 0.0, self._marginals_of(X, lengths)).sum())

    def _by_sequence(self, X, query) -> list:
        """``query(batch)`` (one list entry per sequence) over the non-empty sequences of ``X``,
        with ``[]`` for empty ones (a SequenceBatch has none)."""
        self._check_fitted()
        if isinstance(X, SequenceBatch):
            return query(X) if X.n_sequences else []
        check_sequence_container(X)
        X = as_sequence_list(X, "X")
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
        """Most likely label sequence (Viterbi) of every sequence, as sklearn-crfsuite returns it.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.

        Returns
        -------
        ndarray of shape (N,), dtype object
            ``np.array(list of label lists, dtype=object)``: one list of labels (from ``classes_``)
            per sequence; an empty sequence gets ``[]``. When every sequence has the same length T,
            NumPy makes that a 2-D object array of shape (N, T).

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        return np.array(self._predict_lists(X), dtype=object)

    def predict_codes(self, X) -> tuple[list[np.ndarray], np.ndarray]:
        """Viterbi label indices per sequence and the path scores.

        Contiguous parts of the batch are tagged on separate threads (``n_threads``). Ties go to
        the lowest label index, as in CRFsuite.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.
            Every sequence must have at least one token.

        Returns
        -------
        labels : list of N ndarrays, int
            Per sequence, the index in ``classes_`` of every token's label, shape (T_i,).
        scores : ndarray of shape (N,), float64
            The unnormalised log score of every best path (its emission and transition weights
            summed); ``scores - log_partition(X)`` is its log probability.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
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
        return split_by_sequence(labels, batch), scores

    def predict_single(self, xseq) -> list[str]:
        """Most likely labels of one sequence (Viterbi), as sklearn-crfsuite's ``predict_single``.

        Parameters
        ----------
        xseq : list
            One sequence: a list of tokens, each a dict ``{attribute: value}`` or a list of
            attribute strings.

        Returns
        -------
        list
            One label (from ``classes_``) per token; ``[]`` for an empty sequence.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            A model fitted on a SequenceBatch (it takes no feature dicts).
        """
        self._check_fitted()
        emissions = self._sequence_emissions(xseq)
        if emissions is None:
            return self._predict_lists([xseq])[0]
        classes = self.classes_
        if self.fitted_order == 1:  # the chain's scores are the fitted arrays themselves: straight to the kernel
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
        on batches or with a candidate model, an empty sequence, tokens of rare shapes, a token
        that repeats an attribute."""
        index = self.__dict__.get("attribute_index_")
        if index is None or self.__dict__.get("candidate_model_") is not None or isinstance(xseq, SequenceBatch):
            return None
        columns = index.index_
        entries = sequence_entries(xseq, columns.get, index.pairs_for(columns))
        if entries is None:
            return None
        return _compiled.rows_times_dense(*entries, self.state_weights_)

    def marginals(self, X) -> tuple[np.ndarray, SequenceBatch]:
        """Node marginals p(y_t = l | x) of every token (forward-backward).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.

        Returns
        -------
        marginals : ndarray of shape (T, L), float64
            Rows sum to 1; columns in ``classes_`` order.
        batch : SequenceBatch
            The batch the rows belong to.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        posterior, _, batch = self.posterior(X)
        return posterior.marginals, batch

    def posterior(self, X, keep_messages: bool = False) -> tuple[chain.Posterior, np.ndarray, SequenceBatch]:
        """Forward-backward over ``X``.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.
        keep_messages : bool, default=False
            Keep the per-state log messages on the posterior, for :meth:`segments_of` to reuse.

        Returns
        -------
        posterior : crf._chain.Posterior
            ``log_z`` (N,), ``marginals`` (T, L) in ``classes_`` order, the log messages with
            ``keep_messages``, and ``scores``, the chain's scores (as :meth:`chain_inputs`).
        states : ndarray of shape (T, S), float64
            The chain's per-state emissions (see :meth:`chain_inputs`; the per-label ones for order 1).
        batch : SequenceBatch
            The batch the rows belong to.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        emissions, scores, batch = self.chain_inputs(X)
        posterior = chain.forward_backward(emissions, *scores, batch.lengths, keep_messages=keep_messages, counts=False)
        posterior.marginals = self._label_marginals(posterior.marginals, scores[0])
        posterior.scores = scores
        return posterior, emissions, batch

    def _marginal_dicts(self, X) -> list[list[dict[str, float]]]:
        def query(X):
            marginals, batch = self.marginals(X)
            return split_by_sequence([dict(zip(self.classes_, row)) for row in marginals.tolist()], batch)

        return self._by_sequence(X, query)

    def predict_marginals(self, X) -> np.ndarray:
        """Per token, a dict label -> marginal probability, as sklearn-crfsuite returns it.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.

        Returns
        -------
        ndarray, dtype object
            ``np.array(list of lists of dicts, dtype=object)``: per sequence, per token
            ``{label: p(y_t = label | x)}`` over ``classes_``; an empty sequence gets ``[]``.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        return np.array(self._marginal_dicts(X), dtype=object)

    def predict_marginals_single(self, xseq) -> list[dict[str, float]]:
        """Per token of one sequence, a dict label -> marginal probability (sklearn-crfsuite's).

        Parameters
        ----------
        xseq : list
            One sequence: a list of tokens, each a dict ``{attribute: value}`` or a list of
            attribute strings.

        Returns
        -------
        list of dict
            ``{label: p(y_t = label | x)}`` over ``classes_`` for every token; ``[]`` for an empty
            sequence.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        return self._marginal_dicts([xseq])[0]

    def log_partition(self, X) -> np.ndarray:
        """The log partition function log Z(x) of every sequence (natural log).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.

        Returns
        -------
        ndarray of shape (N,), float64
            log Z(x) of every sequence (over the candidate lattice for a candidate-lattice model).

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`emissions`.
        """
        emissions, scores, batch = self.chain_inputs(X)
        return chain.log_partition(emissions, *scores, batch.lengths)

    def sequence_probability(self, X, y) -> np.ndarray:
        """The probability p(y | x) of every given labelling.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.
        y : list of N label sequences
            One label from ``classes_`` per token of ``X``.

        Returns
        -------
        ndarray of shape (N,), float64
            p(y | x) of every sequence, in [0, 1] (0 for a labelling a candidate-lattice model's lattice
            leaves out).

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            ``y`` and ``X`` differ in their number of sequences or tokens, or ``y`` has a label the
            model does not know (None included); or as :meth:`emissions`.
        """
        emissions, scores, batch = self.chain_inputs(X)
        codes = label_codes(y, batch, self.classes_)
        if np.any(codes < 0):
            raise ValueError("y contains labels the model does not know")
        return np.exp(
            path_scores(emissions, scores, batch.offsets, codes) - chain.log_partition(emissions, *scores, batch.lengths)
        )

    def score(self, X, y) -> float:
        """Token accuracy of the predictions (sklearn-crfsuite's ``score``).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            Each sequence a list of tokens, each token a dict ``{attribute: value}`` or a list of
            attribute strings (value 1), as for :meth:`fit`; or a :class:`~crf.batch.SequenceBatch`
            of N sequences, T tokens in all, with the model's A attributes (a model fitted on a
            SequenceBatch takes only SequenceBatch input; a batch's columns are read in ``attributes_`` order,
            by position). Attributes the model never saw are ignored.
        y : list of N label sequences
            The gold labels, one per token; a label of None (unknown) is left out.

        Returns
        -------
        float
            The fraction of known gold labels predicted, in [0, 1]; NaN when every one is None.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            ``y`` and ``X`` differ in their number of sequences or tokens; or as :meth:`emissions`.
        """
        predicted = self._predict_lists(X)
        y = as_sequence_list(y, "y")
        gold = flat_labels(y)
        known = np.array([label is not None for label in gold], dtype=bool)
        if known.all():
            return metrics.flat_accuracy_score(y, predicted)
        metrics.check_aligned(y, predicted, unknown=True)
        flat = flat_labels(predicted)
        return float(np.mean(gold[known] == flat[known])) if known.any() else float("nan")

    # --- persistence ---------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the fitted model to one ``.npz`` file (no pickle; checksummed; atomic).

        Parameters
        ----------
        path : str or os.PathLike
            The file to write (its folder is created; an existing file is replaced only once the
            new one is complete). Read it back with :meth:`load`.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            A weight too large for any loader to accept (see :data:`crf._persist.MAX_ABS_WEIGHT`);
            nothing is written.
        """
        self._check_fitted()
        model_file.save(self, path)

    @classmethod
    def load(cls, path) -> CRF:
        """Read a model written by :meth:`save`.

        Parameters
        ----------
        path : str or os.PathLike
            A file written by :meth:`save`.

        Returns
        -------
        CRF
            The fitted model, with the parameters it was saved with (except ``model_filename``,
            ``callback``, ``trainer_cls`` and ``keep_tempfiles``, which a file may not set: they
            keep their defaults).

        Raises
        ------
        crf.ModelFileError
            A missing, damaged, inconsistent or foreign file, naming ``path``.
        """
        return model_file.load(cls, path)


CRF.__doc__ += hyper.DOC

# crf.CRF's signature is the one source of the parameters' defaults
_DEFAULTS = {name: p.default for name, p in inspect.signature(CRF.__init__).parameters.items() if name != "self"}


@register_kind
class BundledCRF:
    """A CRF and its fitted feature extractor as the part of a :class:`crf.ModelBundle`: the
    emissions come from the extractor's attributes of the raw token columns.

    Parameters
    ----------
    extractor : FeatureExtractor
        The fitted extractor the CRF was trained on.
    model : CRF
        The fitted CRF.

    Raises
    ------
    ValueError
        The extractor and the CRF have different numbers of attributes.
    """

    kind = "crf"

    def __init__(self, extractor: FeatureExtractor, model: CRF) -> None:
        if extractor.n_attributes != model.n_attributes_:
            raise ValueError(f"the extractor has {extractor.n_attributes} attributes, the CRF {model.n_attributes_}")
        self.extractor, self.model = extractor, model
        self.labels = [str(c) for c in model.classes_]
        # the most states a token can have (a candidate-lattice model's depend on its candidates)
        slots = min(MAX_CANDIDATES, len(self.labels)) if model.__dict__.get("candidate_model_") is not None else None
        self.n_states = model._structure().n_states if slots is None else (slots + 1) * slots
        self.columns = extractor.input_columns()
        self.numeric_columns = list(extractor.numeric)  # read as numbers (ModelBundle.check_numeric_cells)

    def training_values(self) -> dict[str, tuple[np.ndarray, bool]]:
        """The values each input column that a template reads as it is held in training (the
        extractor's vocabulary of that view), as ``{column: (values, False)}``: the extractor keeps
        no counts to tell a tag set from words. Columns read only through derived views are left out."""
        vocabulary = self.extractor.vocabulary_
        return {column: (vocabulary[column], False) for column in self.columns if column in vocabulary}

    def scores(self, columns, lengths):
        """The chain's inputs for sentences given as flat token columns (:class:`crf.bundle.BundledModel`).

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            The token columns (at least ``columns``).
        lengths : ndarray of shape (N,), int
            Tokens per sentence.

        Returns
        -------
        tuple
            (emissions (T, S), transitions (an (L, L) matrix or a transition operator), start
            (S,), end (S,)).
        """
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
        """The part saved by :meth:`parts` (:class:`crf.bundle.BundledModel`).

        Parameters
        ----------
        meta : dict
            The bundle's metadata.
        arrays : dict of str to ndarray
            The bundle's arrays.
        path : str or os.PathLike
            Names the file in error messages.

        Returns
        -------
        BundledCRF

        Raises
        ------
        crf.ModelFileError
            What does not fit, naming ``path``.
        """
        extractor = FeatureExtractor.from_state(meta["features"], prefixed(arrays, "features/"), path)
        model = model_file.from_arrays(CRF, meta["model"], prefixed(arrays, "model/"), path)
        if extractor.n_attributes != model.n_attributes_:
            raise ModelFileError(
                f"{path}: the features give {extractor.n_attributes} attributes, the CRF reads {model.n_attributes_}"
            )
        return cls(extractor, model)

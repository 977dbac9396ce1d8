"""python-crfsuite's view of a fitted :class:`crf.CRF`: ``Tagger``, the model dump and the
training log, so that code written against ``sklearn_crfsuite.CRF.tagger_`` and
``training_log_`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from . import _chain as chain
from . import _model_file as model_file

if TYPE_CHECKING:
    from .model import CRF


class TrainingLog(list):
    """Per-iteration records (dicts), with CRFsuite's fields where the algorithm reports them:
    ``num``, ``loss``, ``feature_norm``, ``error_norm`` (gradient norm, lbfgs), ``active_features``,
    ``time`` (seconds of this iteration); plus ``iteration``, ``gradient_norm`` and ``elapsed``
    (seconds since the start). ``iterations`` and ``last_iteration`` are python-crfsuite's
    ``TrainLogParser`` names."""

    @property
    def iterations(self) -> list[dict]:
        return list(self)

    @property
    def last_iteration(self) -> dict | None:
        return self[-1] if self else None


def training_log(history) -> TrainingLog:
    """A :class:`TrainingLog` from a list of :class:`~crf._optimize.IterationInfo`."""
    log, previous = TrainingLog(), 0.0
    for info in history:
        row = {
            "num": info.iteration,
            "iteration": info.iteration,
            "loss": info.loss,
            "feature_norm": info.feature_norm,
            "active_features": info.active_features,
            "time": info.elapsed - previous,
            "elapsed": info.elapsed,
            "gradient_norm": info.gradient_norm,
        }
        if np.isfinite(info.gradient_norm):
            row["error_norm"] = info.gradient_norm
        log.append(row)
        previous = info.elapsed
    return log


@dataclass
class ModelInfo:
    """What python-crfsuite's ``Tagger.info()`` returns (a parsed model dump): ``header``,
    ``labels`` {label: id}, ``attributes`` {attribute: id}, ``transitions`` {(from, to): weight}
    and ``state_features`` {(attribute, label): weight}, non-zero weights only."""

    header: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    attributes: dict = field(default_factory=dict)
    transitions: dict = field(default_factory=dict)
    state_features: dict = field(default_factory=dict)


class TaggerView:
    """python-crfsuite's ``Tagger`` methods over a fitted :class:`crf.CRF`: ``set`` a sequence of
    token features, then ``tag``, ``probability`` and ``marginal`` query it."""

    def __init__(self, model: CRF) -> None:
        self.model = model
        self._emissions: np.ndarray | None = None  # (n, S) per-state emissions of the current sequence
        self._scores: tuple | None = None  # the chain's (transitions, start, end) for them
        self._marginals: np.ndarray | None = None  # (n, L), computed on the first marginal() query

    def labels(self) -> list[str]:
        return list(self.model.classes_)

    def set(self, xseq) -> None:
        """Make ``xseq`` (a list of token features) the current sequence."""
        if len(xseq):
            self._emissions, self._scores, _ = self.model.chain_inputs([xseq])
        else:
            self._emissions, self._scores = np.zeros((0, self.model._structure().n_states)), self.model._weights()
        self._marginals = None

    def _current(self) -> np.ndarray:
        if self._emissions is None:
            raise ValueError("no sequence set: call set(xseq) or tag(xseq) first")
        return self._emissions

    def tag(self, xseq=None) -> list[str]:
        """Viterbi labels of ``xseq`` (or of the current sequence)."""
        if xseq is not None:
            self.set(xseq)
        emissions = self._current()
        if not len(emissions):
            return []
        states, _ = chain.viterbi(emissions, *self._scores, [len(emissions)])
        return [self.model.classes_[c] for c in chain.operator_of(self._scores[0]).labels_at(states)]

    def probability(self, yseq) -> float:
        """p(yseq | current sequence)."""
        emissions = self._current()
        if len(yseq) != len(emissions):
            raise ValueError(f"{len(yseq)} labels for a sequence of {len(emissions)} tokens")
        index = {label: i for i, label in enumerate(self.model.classes_)}
        unknown = [label for label in yseq if label not in index]
        if unknown:
            raise ValueError(f"unknown labels {unknown[:5]}")
        codes = np.array([index[label] for label in yseq], dtype=np.int64)
        from .model import path_scores

        gold = path_scores(emissions, self._scores, np.array([0, len(codes)]), codes)
        return float(np.exp(gold - chain.log_partition(emissions, *self._scores, [len(codes)]))[0])

    def marginal(self, y: str, pos: int) -> float:
        """p(label at ``pos`` = ``y`` | current sequence)."""
        emissions = self._current()
        if not 0 <= pos < len(emissions):
            raise IndexError(f"position {pos} outside a sequence of {len(emissions)} tokens")
        if self._marginals is None:
            marginals = chain.forward_backward(emissions, *self._scores, [len(emissions)], counts=False).marginals
            self._marginals = self.model._label_marginals(marginals, self._scores[0])
        return float(self._marginals[pos, list(self.model.classes_).index(y)])

    def info(self) -> ModelInfo:
        """The model's labels, attributes and non-zero weights, as python-crfsuite's dump."""
        model = self.model
        return ModelInfo(
            header={"size": str(model.size_), "num_attrs": str(model.num_attributes_), "num_labels": str(len(model.classes_))},
            labels={label: i for i, label in enumerate(model.classes_)},
            attributes={name: i for i, name in enumerate(model.attributes_ or [])},
            transitions=model.transition_features_,
            state_features=model.state_features_,
        )

    def close(self) -> None:
        self._emissions = self._marginals = None


class CRFsuiteView:
    """Mixin of :class:`crf.CRF`: sklearn-crfsuite's fitted attributes (None before ``fit``) and
    feature tables. Needs ``_fitted``, ``_check_fitted`` and the fitted weights."""

    def _fitted(self) -> bool:
        return "state_weights_" in self.__dict__ or self._load_model_file()

    def _attribute_name(self, index: int) -> str:
        return self.attributes_[index] if self.attributes_ is not None else f"#{index}"

    @property
    def tagger_(self) -> TaggerView | None:
        """A python-crfsuite-style :class:`~crf._crfsuite_view.TaggerView` over this model."""
        if not self._fitted():
            return None
        if self.__dict__.get("_tagger") is None:
            self._tagger = TaggerView(self)
        return self._tagger

    @property
    def num_attributes_(self) -> int | None:
        """Number of attributes (columns of X) the model knows."""
        return int(self.n_attributes_) if self._fitted() else None

    @property
    def state_features_(self) -> dict[tuple[str, str], float] | None:
        """{(attribute, label): weight} for the non-zero state weights (as CRFsuite dumps them)."""
        if not self._fitted():
            return None
        L = len(self.classes_)
        flat = np.flatnonzero(self.state_weights_.ravel())
        weights = self.state_weights_.ravel()[flat]
        return {(self._attribute_name(i // L), self.classes_[i % L]): float(w) for i, w in zip(flat.tolist(), weights.tolist())}

    @property
    def transition_features_(self) -> dict[tuple[str, str], float] | None:
        """{(previous label, label): weight} for the non-zero transition weights."""
        if not self._fitted():
            return None
        rows, cols = np.nonzero(self.transitions_)
        weights = self.transitions_[rows, cols].tolist()
        return {(self.classes_[i], self.classes_[j]): w for i, j, w in zip(rows.tolist(), cols.tolist(), weights)}

    def top_features(self, n: int = 20) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The ``n`` most positive and most negative state features, and all transitions sorted
        by weight: (state frame [attribute, label, weight], transition frame [from, to, weight])."""
        self._check_fitted()
        L = len(self.classes_)
        flat = self.state_weights_.ravel()
        order = np.argsort(flat)
        picks = np.concatenate([order[::-1][:n], order[:n]])
        state = pd.DataFrame(
            {
                "attribute": [self._attribute_name(i // L) for i in picks],
                "label": [self.classes_[i % L] for i in picks],
                "weight": flat[picks],
            }
        )
        classes = np.array(self.classes_, dtype=object)
        transitions = pd.DataFrame(
            {"from": np.repeat(classes, L), "to": np.tile(classes, L), "weight": self.transitions_.ravel()}
        ).sort_values("weight", ascending=False, ignore_index=True)
        return state, transitions

    @property
    def size_(self) -> int | None:
        """Model size in bytes: the size of the file :meth:`save` writes."""
        return model_file.size_in_bytes(self) if self._fitted() else None

    @property
    def n_active_features_(self) -> int:
        """Number of non-zero weights (CRFsuite's active features)."""
        self._check_fitted()
        return int(np.count_nonzero(self.state_weights_) + np.count_nonzero(self._tail()))

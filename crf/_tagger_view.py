"""python-crfsuite's ``Tagger`` over a fitted :class:`crf.CRF` (sklearn-crfsuite's ``CRF.tagger_``)
and the model dump its ``info()`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _chain as chain
from ._path_scores import path_scores


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
    """python-crfsuite's ``Tagger`` methods over a fitted :class:`crf.CRF` (its public methods
    only): ``set`` a sequence of token features, then ``tag``, ``probability`` and ``marginal``
    query it."""

    def __init__(self, model) -> None:
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
        else:  # an empty sequence: nothing to tag, and its one (empty) labelling has probability 1
            self._emissions, self._scores = np.zeros((0, len(self.model.classes_))), None
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
        if not len(yseq):
            return 1.0
        codes = np.array([index[label] for label in yseq], dtype=np.int64)
        gold = path_scores(emissions, self._scores, np.array([0, len(codes)]), codes)
        return float(np.exp(gold - chain.log_partition(emissions, *self._scores, [len(codes)]))[0])

    def marginal(self, y: str, pos: int) -> float:
        """p(label at ``pos`` = ``y`` | current sequence)."""
        emissions = self._current()
        if not 0 <= pos < len(emissions):
            raise IndexError(f"position {pos} outside a sequence of {len(emissions)} tokens")
        if self._marginals is None:
            marginals = chain.forward_backward(emissions, *self._scores, [len(emissions)], counts=False).marginals
            self._marginals = chain.operator_of(self._scores[0]).label_marginals(marginals, len(self.model.classes_), np.add)
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

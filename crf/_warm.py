"""Warm starts: the weights of a fitted CRF carried into the parameter layout of a new fit.

A new fit may bring attributes and labels the old one never saw. Old attributes keep their
columns (old ones first, new ones after, in order of first appearance). The labels are the new
data's, as in a cold fit: the old ones it still has first (in their old order), then the new ones;
an old label the new data lacks is dropped (as a class it would take probability mass, so the fit
would not reach the cold fit's optimum). The new fit's features are what its own data and
settings make, as in a cold fit; an old weight starts where the new layout still has its feature
(state weights by attribute and label, label n-gram weights by their labels), every other weight
starts at zero. The objective is convex, so a warm start reaches the cold fit's optimum, only in
fewer iterations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._objective import ParameterLayout
from ._order import TAIL_ATTRIBUTES, chain_structure
from .batch import SequenceBatch


@dataclass
class PreviousFit:
    """What a warm start keeps of a fitted model."""

    classes: list
    attribute_names: list[str] | None  # (A_old,) in column order; None for unnamed batch columns
    state: np.ndarray  # (A_old, L_old) dense state weights
    transitions: np.ndarray  # (L_old, L_old)
    start: np.ndarray  # (L_old,)
    end: np.ndarray  # (L_old,)
    tail: dict | None = None  # the tail's blocks by name (see crf._order), second-order ones included
    pruner: object = None  # the fitted first-order pruning model of a pruned second-order CRF
    attribute_index: object = None  # the fitted model's feature-dict reader (crf.attributes.AttributeIndex), if any

    @classmethod
    def of(cls, model) -> PreviousFit:
        """The weights and vocabularies of the fitted ``model`` (a :class:`crf.CRF`)."""
        names = model.attributes_
        structure = chain_structure(model.fitted_order, len(model.classes_))  # whatever ``order`` says now
        tail = {name: getattr(model, TAIL_ATTRIBUTES[name]) for name in structure.blocks}
        return cls(
            tail={name: np.array(block, dtype=np.float64).reshape(structure.blocks[name]) for name, block in tail.items()},
            pruner=model.__dict__.get("pruner_"),
            attribute_index=model.__dict__.get("attribute_index_"),
            classes=list(model.classes_),
            attribute_names=None if names is None else [str(n) for n in names],
            state=np.asarray(model.state_weights_, dtype=np.float64),
            transitions=np.asarray(model.transitions_, dtype=np.float64),
            start=np.asarray(model.start_weights_, dtype=np.float64),
            end=np.asarray(model.end_weights_, dtype=np.float64),
        )

    @property
    def n_attributes(self) -> int:
        return self.state.shape[0]

    def merged_classes(self, new: Sequence) -> list:
        """The classes of a fit on labels ``new`` (distinct, in order of first appearance): the old
        classes that ``new`` has, in their old order, then the labels of ``new`` they lack."""
        present, known = set(new), set(self.classes)
        return [label for label in self.classes if label in present] + [label for label in new if label not in known]

    def label_places(self, classes: Sequence | None) -> np.ndarray:
        """(L_old,) int64: the index of each old class in the new ``classes``, -1 for one the new
        fit dropped (None: the old classes are the first ones, in order)."""
        if classes is None:
            return np.arange(len(self.classes), dtype=np.int64)
        return pd.Index(list(classes), dtype=object).get_indexer(pd.Index(self.classes, dtype=object)).astype(np.int64)

    def merged_names(self, new_names: Sequence[str]) -> tuple[list[str], np.ndarray]:
        """(the old attribute names then the new ones they lack, the column of each of
        ``new_names`` (A_new,) in that merged order)."""
        old = pd.Index(self.attribute_names or [])
        new = pd.Index(list(new_names))
        fresh = new[~new.isin(old)]
        merged = old.append(fresh)
        return merged.tolist(), merged.get_indexer(new).astype(np.int64)

    def check_batch(self, batch: SequenceBatch, attribute_names: Sequence[str] | None) -> None:
        """A SequenceBatch must keep the old columns: the same attributes in the first A_old
        columns (an extractor that only appends), checked by name. A model whose attributes have
        names (fitted on feature dicts, or on a batch with ``attribute_names``) needs them again:
        columns without names could be in any order, and the refit model could no longer read
        feature dicts."""
        if attribute_names is None and self.attribute_names is not None:
            raise ValueError(
                "warm_start: the fitted model's attributes have names, but this SequenceBatch comes without "
                "attribute_names, so its columns cannot be matched to the model's weights; pass attribute_names "
                "(the extractor's column names, the model's attributes_ first)"
            )
        if batch.n_attributes < self.n_attributes:
            raise ValueError(
                f"warm_start: the batch has {batch.n_attributes} attribute columns, fewer than the {self.n_attributes} "
                "of the fitted model; transform the new data with the same extractor"
            )
        if attribute_names is not None and self.attribute_names is not None:
            head = [str(n) for n in list(attribute_names)[: self.n_attributes]]
            if head != self.attribute_names:
                where = next(i for i, (a, b) in enumerate(zip(head, self.attribute_names)) if a != b)
                raise ValueError(
                    f"warm_start: attribute column {where} is {head[where]!r} now but was {self.attribute_names[where]!r}; "
                    "the new batch must keep the old columns (transform it with the same extractor)"
                )

    def _places(self, new_shape: tuple, old_shape: tuple, labels: np.ndarray) -> tuple[tuple, tuple]:
        """(old index, new index): where the old block's entries that the new block keeps go in a
        block of ``new_shape``. Every axis is a label axis and maps by ``labels``
        (:meth:`label_places`, kept labels only); an axis one longer than the labels (the "before
        the sequence" index last, see :mod:`crf._order`) moves its last index to the new last."""
        olds, news = [], []
        for new, old in zip(new_shape, old_shape):
            places = np.append(labels, new - 1) if old == len(self.classes) + 1 else labels
            kept = np.flatnonzero(places >= 0)
            olds.append(kept)
            news.append(places[kept])
        return np.ix_(*olds), np.ix_(*news)

    def _blocks(self, structure, labels: np.ndarray) -> list[tuple[str, np.ndarray, tuple]]:
        """(name, the old block's kept entries, their places in the new block) for the tail blocks
        both models have."""
        out = []
        for name, shape in structure.blocks.items():
            old = (self.tail or {}).get(name)
            if old is not None:
                take, places = self._places(shape, old.shape, labels)
                out.append((name, old[take], places))
        return out

    def theta(self, params: ParameterLayout, trainable: np.ndarray | None = None, classes: Sequence | None = None) -> np.ndarray:
        """The starting weights (params.size,): the old weights where the new layout has a place
        for them (its state features, and the label n-gram weights that ``trainable`` (tail_size,)
        marks), zeros elsewhere. ``classes`` (L,) are the new fit's labels (None: the old ones
        first, in order). The new layout is the new fit's alone, so a warm start reaches the cold
        fit's optimum: old features that the new data or settings no longer make are dropped, not
        kept."""
        A_old = self.state.shape[0]
        L = params.n_labels
        labels = self.label_places(classes)  # (L_old,) new index of each old label, -1 if dropped
        theta = np.zeros(params.size)
        if params.feature_index is None:
            state = theta[: params.n_state].reshape(params.n_attributes, L)
            kept = np.flatnonzero(labels >= 0)
            state[:A_old, labels[kept]] = self.state[:, kept]
        else:
            attributes, new_labels = np.divmod(params.feature_index, L)
            old_label = np.full(L, -1, dtype=np.int64)  # (L,) old index of each new label, -1 if new
            kept = np.flatnonzero(labels >= 0)
            old_label[labels[kept]] = kept
            old = (attributes < A_old) & (old_label[new_labels] >= 0)
            theta[: params.n_state][old] = self.state[attributes[old], old_label[new_labels[old]]]
        blocks = params.tail_blocks(theta)
        for name, old, places in self._blocks(params.chain, labels):
            blocks[name][places] = old
        if trainable is not None:
            theta[params.n_state :][~trainable] = 0.0
        return theta

"""Warm starts: the weights of a fitted CRF carried into the parameter layout of a new fit.

A new fit may bring attributes and labels the old one never saw. Old attributes and labels keep
their columns (old ones first, new ones after, in order of first appearance). The new fit's
features are what its own data and settings make, as in a cold fit; an old weight starts where
the new layout still has its feature (state weights by attribute and label, label n-gram weights
by their labels), every other weight starts at zero. The objective is convex, so a warm start
reaches the cold fit's optimum, only in fewer iterations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._objective import ParameterLayout
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

    @classmethod
    def of(cls, model) -> PreviousFit:
        """The weights and vocabularies of the fitted ``model`` (a :class:`crf.CRF`)."""
        names = model.attributes_
        structure = model._structure()  # of the fitted weights' order, whatever ``order`` says now
        tail = structure.split(model._tail())
        return cls(
            tail={name: np.array(block, dtype=np.float64) for name, block in tail.items()},
            pruner=model.__dict__.get("pruner_"),
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
        """The old classes, then the labels of ``new`` (distinct, in order) that they lack."""
        known = set(self.classes)
        return self.classes + [label for label in new if label not in known]

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
        columns (an extractor that only appends), checked by name when both fits named them."""
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

    def _places(self, new_shape: tuple, old_shape: tuple) -> tuple:
        """The index of the old block's entries in a new block of ``new_shape``: label axes keep
        their indices; an axis one longer than the labels (the "before the sequence" index last,
        see :mod:`crf._order`) moves its last index to the new last."""
        index = []
        for new, old in zip(new_shape, old_shape):
            places = np.arange(old)
            if old == len(self.classes) + 1:
                places[-1] = new - 1
            index.append(places)
        return np.ix_(*index)

    def _blocks(self, structure) -> list[tuple[str, np.ndarray, tuple]]:
        """(name, old block, its places in the new block) for the tail blocks both models have."""
        out = []
        for name, shape in structure.blocks.items():
            old = (self.tail or {}).get(name)
            if old is not None:
                out.append((name, old, self._places(shape, old.shape)))
        return out

    def theta(self, params: ParameterLayout, trainable: np.ndarray | None = None) -> np.ndarray:
        """The starting weights (params.size,): the old weights where the new layout has a place
        for them (its state features, and the label n-gram weights that ``trainable`` (tail_size,)
        marks), zeros elsewhere. The new layout is the new fit's alone, so a warm start reaches
        the cold fit's optimum: old features that the new data or settings no longer make are
        dropped, not kept."""
        A_old, L_old = self.state.shape
        L = params.n_labels
        theta = np.zeros(params.size)
        if params.feature_index is None:
            state = theta[: params.n_state].reshape(params.n_attributes, L)
            state[:A_old, :L_old] = self.state
        else:
            attributes, labels = np.divmod(params.feature_index, L)
            old = (attributes < A_old) & (labels < L_old)
            theta[: params.n_state][old] = self.state[attributes[old], labels[old]]
        blocks = params.tail_blocks(theta)
        for name, old, places in self._blocks(params.chain):
            blocks[name][places] = old
        if trainable is not None:
            theta[params.n_state :][~trainable] = 0.0
        return theta

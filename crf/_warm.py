"""Warm starts: the weights of a fitted CRF carried into the parameter layout of a new fit.

A new fit may bring attributes and labels the old one never saw, and lack some it had. Its
attributes are the new data's, as in a cold fit (in order of first appearance; a SequenceBatch's
columns as given); an old attribute's weights go to the column of the same name, and those of an
attribute the new data lacks are dropped (with ``all_possible_states`` they would otherwise be
features no data term touches, kept at their old values). Columns without names match by
position. The labels are the new data's too: the old ones it still has first (in their old
order), then the new ones; an old label the new data lacks is dropped (as a class it would take
probability mass, so the fit would not reach the cold fit's optimum). The new fit's features are
what its own data and settings make, as in a cold fit; an old weight starts where the new layout
still has its feature (state weights by attribute and label, label n-gram weights by their
labels), every other weight starts at zero. The objective is convex, so a warm start reaches the
cold fit's optimum, only in fewer iterations.
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
    candidate_model: object = None  # the fitted first-order candidate model of a second-order CRF over candidate labels
    attribute_index: object = None  # the fitted model's feature-dict reader (crf.attributes.AttributeIndex), if any

    @classmethod
    def of(cls, model) -> PreviousFit:
        """The weights and vocabularies of the fitted ``model`` (a :class:`crf.CRF`)."""
        names = model.attributes_
        structure = chain_structure(model.fitted_order, len(model.classes_))  # whatever ``order`` says now
        tail = {name: getattr(model, TAIL_ATTRIBUTES[name]) for name in structure.blocks}
        return cls(
            tail={name: np.array(block, dtype=np.float64).reshape(structure.blocks[name]) for name, block in tail.items()},
            candidate_model=model.__dict__.get("candidate_model_"),
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

    def attribute_places(self, names: Sequence[str] | None) -> np.ndarray:
        """(A_old,) int64: the column of each old attribute among the new fit's attribute
        ``names`` (A_new,), -1 for one the new fit lacks; by name when both fits name their
        attributes, else by position (the first A_old columns)."""
        if names is None or self.attribute_names is None:
            return np.arange(self.n_attributes, dtype=np.int64)
        return pd.Index([str(n) for n in names]).get_indexer(pd.Index(self.attribute_names)).astype(np.int64)

    def check_batch(self, batch: SequenceBatch, attribute_names: Sequence[str] | None) -> None:
        """A SequenceBatch's columns must be matched to the old ones: by name when the fitted
        model's attributes have names (fitted on feature dicts, or on a batch with
        ``attribute_names``), which it then needs again (columns without names could be in any
        order, and the refit model could no longer read feature dicts); by position when neither
        has names, so the batch keeps the old columns first (an extractor that only appends)."""
        if attribute_names is None and self.attribute_names is not None:
            raise ValueError(
                "warm_start: the fitted model's attributes have names, but this SequenceBatch comes without "
                "attribute_names, so its columns cannot be matched to the model's weights; pass attribute_names "
                "(the extractor's column names)"
            )
        if self.attribute_names is None and batch.n_attributes < self.n_attributes:
            raise ValueError(
                f"warm_start: the batch has {batch.n_attributes} attribute columns, fewer than the {self.n_attributes} "
                "of the fitted model; transform the new data with the same extractor"
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

    def theta(
        self,
        params: ParameterLayout,
        trainable: np.ndarray | None = None,
        classes: Sequence | None = None,
        attributes: Sequence[str] | None = None,
    ) -> np.ndarray:
        """The starting weights (params.size,): the old weights where the new layout has a place
        for them (its state features, and the label n-gram weights that ``trainable`` (tail_size,)
        marks), zeros elsewhere. ``classes`` (L,) are the new fit's labels (None: the old ones
        first, in order); ``attributes`` (A,) its attribute names (None: the old columns first,
        in order; see :meth:`attribute_places`). The new layout is the new fit's alone, so a warm
        start reaches the cold fit's optimum: old features that the new data or settings no
        longer make are dropped, not kept."""
        L = params.n_labels
        labels = self.label_places(classes)  # (L_old,) new index of each old label, -1 if dropped
        places = self.attribute_places(attributes)  # (A_old,) new column of each old attribute, -1 if gone
        theta = np.zeros(params.size)
        if params.feature_index is None:
            state = theta[: params.n_state].reshape(params.n_attributes, L)
            kept_labels, kept_attributes = np.flatnonzero(labels >= 0), np.flatnonzero(places >= 0)
            state[np.ix_(places[kept_attributes], labels[kept_labels])] = self.state[np.ix_(kept_attributes, kept_labels)]
        else:
            new_attributes, new_labels = np.divmod(params.feature_index, L)
            old_label = np.full(L, -1, dtype=np.int64)  # (L,) old index of each new label, -1 if new
            kept = np.flatnonzero(labels >= 0)
            old_label[labels[kept]] = kept
            old_attribute = np.full(params.n_attributes, -1, dtype=np.int64)  # (A,) old column of each, -1 if new
            kept = np.flatnonzero(places >= 0)
            old_attribute[places[kept]] = kept
            rows, columns = old_attribute[new_attributes], old_label[new_labels]
            old = (rows >= 0) & (columns >= 0)
            theta[: params.n_state][old] = self.state[rows[old], columns[old]]
        blocks = params.tail_blocks(theta)
        for name, old, places in self._blocks(params.chain, labels):
            blocks[name][places] = old
        if trainable is not None:
            theta[params.n_state :][~trainable] = 0.0
        return theta

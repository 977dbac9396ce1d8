"""sklearn-crfsuite's fitted attributes and feature tables of :class:`crf.CRF` (``tagger_``,
``state_features_``, ``transition_features_``, ``size_``, ...), read from the fitted weights."""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import _model_file as model_file
from ._tagger_view import TaggerView


class FeatureTables:
    """Mixin of :class:`crf.CRF`: sklearn-crfsuite's fitted attributes (None before ``fit``) and
    feature tables. Needs ``_fitted``, ``_check_fitted``, ``_tail`` and the fitted weights."""

    def _attribute_name(self, index: int) -> str:
        return self.attributes_[index] if self.attributes_ is not None else f"#{index}"

    @property
    def tagger_(self) -> TaggerView | None:
        """A python-crfsuite-style :class:`~crf._tagger_view.TaggerView` over this model."""
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
        by weight: (state frame [attribute, label, weight], transition frame [from, to, weight]).

        Parameters
        ----------
        n : int, default=20
            How many of each end of the state weights.

        Returns
        -------
        state : pandas.DataFrame
            2n rows (``attribute``, ``label``, ``weight``): the n largest state weights in
            decreasing order, then the n smallest in increasing order, over the whole (A, L) table
            (zeros included; with fewer than 2n weights a row can appear in both halves). An
            attribute without a name reads ``#<column>``.
        transitions : pandas.DataFrame
            L * L rows (``from``, ``to``, ``weight``), by decreasing weight.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        """
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
        """Model size in bytes: the size of the file :meth:`save` writes (measured by writing it
        once per fit, on the first read; a name ending in ``_``, so the next fit clears it)."""
        if not self._fitted():
            return None
        if "_size_" not in self.__dict__:
            self.__dict__["_size_"] = model_file.size_in_bytes(self)
        return self.__dict__["_size_"]

    @property
    def n_active_features_(self) -> int:
        """Number of non-zero weights (CRFsuite's active features)."""
        self._check_fitted()
        return int(np.count_nonzero(self.state_weights_) + np.count_nonzero(self._tail()))

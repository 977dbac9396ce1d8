"""The negative conditional log-likelihood of a labelled batch and its exact gradient.

Parameters are one flat vector ``theta``: the state weights first, then transitions (L*L,
row-major [previous, current]), then start (L) and end (L) weights. State weights are either
*dense* (every attribute with every label: A*L values, row-major (A, L)) or *sparse* (CRFsuite's
default: only the attribute/label pairs seen in the training data, listed by ``feature_index``,
flat indices into the (A, L) grid).

The gradient is observed minus expected feature counts: for the state weights
``X.T @ (marginals - onehot(y))``, one sparse-transpose product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import chain


@dataclass
class ParameterLayout:
    """Where each weight lives in ``theta``."""

    n_attributes: int
    n_labels: int
    feature_index: np.ndarray | None = None  # sparse state features: flat (A, L) indices

    @property
    def n_state(self) -> int:
        if self.feature_index is None:
            return self.n_attributes * self.n_labels
        return int(self.feature_index.size)

    @property
    def size(self) -> int:
        return self.n_state + self.n_labels * self.n_labels + 2 * self.n_labels

    def split(self, theta: np.ndarray, state_buffer: np.ndarray | None = None):
        """(state (A, L), transitions (L, L), start (L,), end (L,)) views/copies of ``theta``."""
        L, n = self.n_labels, self.n_state
        if self.feature_index is None:
            state = theta[:n].reshape(self.n_attributes, L)
        else:
            state = np.zeros((self.n_attributes, L)) if state_buffer is None else state_buffer
            state.ravel()[self.feature_index] = theta[:n]
        transitions = theta[n:n + L * L].reshape(L, L)
        start = theta[n + L * L:n + L * L + L]
        end = theta[n + L * L + L:]
        return state, transitions, start, end

    def join(self, state: np.ndarray, transitions, start, end) -> np.ndarray:
        """Inverse of :meth:`split`: a flat ``theta`` (picks the feature entries in sparse mode)."""
        flat_state = state.ravel() if self.feature_index is None else state.ravel()[self.feature_index]
        return np.concatenate([flat_state, np.ravel(transitions), start, end])


def observed_feature_index(X: sp.csr_matrix, labels: np.ndarray, n_labels: int) -> np.ndarray:
    """Flat (A, L) indices of the attribute/label pairs that occur in the data (sorted)."""
    onehot = _onehot(labels, n_labels)
    counts = (X.T.tocsr() @ onehot).tocoo()
    return np.unique(counts.row.astype(np.int64) * n_labels + counts.col)


def _onehot(labels: np.ndarray, n_labels: int) -> sp.csr_matrix:
    n = labels.size
    return sp.csr_matrix((np.ones(n), (np.arange(n), labels)), shape=(n, n_labels))


class Objective:
    """NLL(theta) = sum_i [log Z(x_i) - score(y_i | x_i)] and its gradient for one batch.

    ``X`` (T, A) CSR, ``offsets`` (N + 1,), ``labels`` (T,) label indices in [0, L).
    Calling the object returns ``(loss, gradient)``; regularisation is added by the optimiser.
    """

    def __init__(self, X: sp.csr_matrix, offsets: np.ndarray, labels: np.ndarray, params: ParameterLayout) -> None:
        self.X = sp.csr_matrix(X, dtype=np.float64)
        self.XT = self.X.T.tocsr()
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.params = params
        self.layout = chain.Layout.from_lengths(np.diff(self.offsets))
        L = params.n_labels
        observed = (self.XT @ _onehot(self.labels, L)).toarray()
        self.observed_state = observed.ravel() if params.feature_index is None else observed.ravel()[params.feature_index]
        first, last = self.offsets[:-1], self.offsets[1:] - 1
        is_first = np.zeros(self.labels.size, dtype=bool)
        is_first[first] = True
        edges = np.flatnonzero(~is_first)
        pair = self.labels[edges - 1] * L + self.labels[edges]
        self.observed_transitions = np.bincount(pair, minlength=L * L).astype(np.float64)
        self.observed_start = np.bincount(self.labels[first], minlength=L).astype(np.float64)
        self.observed_end = np.bincount(self.labels[last], minlength=L).astype(np.float64)
        self._state_buffer = None if params.feature_index is None else np.zeros((params.n_attributes, L))

    @property
    def n_tokens(self) -> int:
        return int(self.labels.size)

    def emissions(self, state: np.ndarray) -> np.ndarray:
        """Emission scores (T, L) = X @ state."""
        return np.asarray(self.X @ state)

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        state, transitions, start, end = self.params.split(theta, self._state_buffer)
        emissions = self.emissions(state)
        posterior = chain.forward_backward(emissions, transitions, start, end, self.layout)
        gold = chain.sequence_scores(emissions, transitions, start, end, self.offsets, self.labels)
        loss = float(np.sum(posterior.log_z - gold))
        expected_state = np.asarray(self.XT @ posterior.marginals)
        if self.params.feature_index is None:
            grad_state = expected_state.ravel() - self.observed_state
        else:
            grad_state = expected_state.ravel()[self.params.feature_index] - self.observed_state
        marginals = posterior.marginals
        gradient = np.concatenate([
            grad_state,
            posterior.transition_counts.ravel() - self.observed_transitions,
            marginals[self.offsets[:-1]].sum(axis=0) - self.observed_start,
            marginals[self.offsets[1:] - 1].sum(axis=0) - self.observed_end,
        ])
        return loss, gradient

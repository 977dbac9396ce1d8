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

import os
from concurrent.futures import ThreadPoolExecutor
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


class RowBlocks:
    """A CSR matrix split into row blocks so its two products can use several cores.

    ``X @ W`` runs block by block in a thread pool (scipy's sparse kernels release the GIL) and
    ``X.T @ P`` is the sum of the blocks' transposed products, each streaming its rows once.
    """

    def __init__(self, X: sp.csr_matrix, n_threads: int | None = None) -> None:
        self.shape = X.shape
        n_threads = n_threads or min(os.cpu_count() or 1, 4)
        bounds = np.linspace(0, X.shape[0], n_threads + 1).astype(np.int64)
        self.bounds = bounds
        self.blocks = [X[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        self.pool = ThreadPoolExecutor(n_threads) if n_threads > 1 else None

    def _map(self, function, items):
        return list(self.pool.map(function, items)) if self.pool else [function(i) for i in items]

    def dot(self, W: np.ndarray) -> np.ndarray:
        """X @ W, shape (rows, W.shape[1])."""
        out = np.empty((self.shape[0], W.shape[1]))

        def product(i):
            out[self.bounds[i]:self.bounds[i + 1]] = self.blocks[i] @ W

        self._map(product, range(len(self.blocks)))
        return out

    def transpose_dot(self, P: np.ndarray) -> np.ndarray:
        """X.T @ P, shape (columns, P.shape[1])."""
        parts = self._map(lambda i: np.asarray(self.blocks[i].T @ P[self.bounds[i]:self.bounds[i + 1]]), range(len(self.blocks)))
        total = parts[0]
        for part in parts[1:]:
            total += part
        return total


class Objective:
    """NLL(theta) = sum_i [log Z(x_i) - score(y_i | x_i)] and its gradient for one batch.

    ``X`` (T, A) CSR, ``offsets`` (N + 1,), ``labels`` (T,) label indices in [0, L).
    Calling the object returns ``(loss, gradient)``; regularisation is added by the optimiser.
    The token rows are stored once in the packed time-major order of :class:`chain.Layout`, so an
    evaluation never permutes anything.
    """

    def __init__(self, X: sp.csr_matrix, offsets: np.ndarray, labels: np.ndarray, params: ParameterLayout,
                 n_threads: int | None = None) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.int64)
        self.params = params
        self.layout = chain.Layout.from_lengths(np.diff(offsets))
        rows = self.layout.token_of_row
        self.X = RowBlocks(sp.csr_matrix(X, dtype=np.float64)[rows], n_threads)
        self.labels = labels[rows]
        L = params.n_labels
        observed = self.X.transpose_dot(_onehot(self.labels, L).toarray())
        self.observed_state = observed.ravel() if params.feature_index is None else observed.ravel()[params.feature_index]
        first, last = offsets[:-1], offsets[1:] - 1
        is_first = np.zeros(labels.size, dtype=bool)
        is_first[first] = True
        edges = np.flatnonzero(~is_first)
        pair = labels[edges - 1] * L + labels[edges]
        self.observed_transitions = np.bincount(pair, minlength=L * L).astype(np.float64)
        self.observed_start = np.bincount(labels[first], minlength=L).astype(np.float64)
        self.observed_end = np.bincount(labels[last], minlength=L).astype(np.float64)
        self._state_buffer = None if params.feature_index is None else np.zeros((params.n_attributes, L))

    @property
    def n_tokens(self) -> int:
        return int(self.labels.size)

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        state, transitions, start, end = self.params.split(theta, self._state_buffer)
        emissions = self.X.dot(state)  # packed order
        posterior = chain.forward_backward(emissions, transitions, start, end, self.layout, packed=True)
        # the gold score summed over the batch: emission part plus observed counts of the rest
        gold = (emissions[np.arange(self.labels.size), self.labels].sum()
                + transitions.ravel() @ self.observed_transitions + start @ self.observed_start + end @ self.observed_end)
        loss = float(posterior.log_z.sum() - gold)
        expected_state = self.X.transpose_dot(posterior.marginals)
        if self.params.feature_index is None:
            grad_state = expected_state.ravel() - self.observed_state
        else:
            grad_state = expected_state.ravel()[self.params.feature_index] - self.observed_state
        marginals = posterior.marginals
        last = self.layout.last_rows()
        gradient = np.concatenate([
            grad_state,
            posterior.transition_counts.ravel() - self.observed_transitions,
            marginals[self.layout.first_rows()].sum(axis=0) - self.observed_start,
            marginals[last].sum(axis=0) - self.observed_end,
        ])
        return loss, gradient

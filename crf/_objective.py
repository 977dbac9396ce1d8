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

from . import _chain as chain
from ._order import ChainStructure, chain_structure
from ._parallel import Workers, thread_count
from .batch import token_rows


@dataclass
class ParameterLayout:
    """Where each weight lives in ``theta``: the state weights, then the tail of label n-gram
    weights of the model's ``order`` (see :mod:`crf._order`: transitions, start, end, and for
    order 2 trigrams and pair_end)."""

    n_attributes: int
    n_labels: int
    feature_index: np.ndarray | None = None  # sparse state features: flat (A, L) indices
    order: int = 1

    @property
    def chain(self) -> ChainStructure:
        """The order's tail structure (:mod:`crf._order`)."""
        if getattr(self, "_chain", None) is None or self._chain.n_labels != self.n_labels or self._chain.order != self.order:
            self._chain = chain_structure(self.order, self.n_labels)
        return self._chain

    @property
    def n_state(self) -> int:
        if self.feature_index is None:
            return self.n_attributes * self.n_labels
        return int(self.feature_index.size)

    @property
    def size(self) -> int:
        return self.n_state + self.chain.tail_size

    def split(self, theta: np.ndarray):
        """(state (A, L), transitions (L, L), start (L,), end (L,)) views/copies of ``theta``
        (the first-order part of the tail; :meth:`tail_blocks` has all of it)."""
        L, n = self.n_labels, self.n_state
        if self.feature_index is None:
            state = theta[:n].reshape(self.n_attributes, L)
        else:
            state = np.zeros((self.n_attributes, L))
            state.ravel()[self.feature_index] = theta[:n]
        blocks = self.tail_blocks(theta)
        return state, blocks["transitions"], blocks["start"], blocks["end"]

    def tail_blocks(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        """The tail's weights by name (views of ``theta``)."""
        return self.chain.split(theta[self.n_state :])

    def chain_scores(self, theta: np.ndarray) -> tuple:
        """(transitions or operator, start (S,), end (S,)) of ``theta`` for :mod:`crf._chain`."""
        return self.chain.scores(theta[self.n_state :])

    def join(self, state: np.ndarray, *tail) -> np.ndarray:
        """Inverse of :meth:`split` (picks the feature entries in sparse mode): the state weights
        then the tail, given as its blocks in order or as one flat array."""
        flat_state = state.ravel() if self.feature_index is None else state.ravel()[self.feature_index]
        return np.concatenate([flat_state, *(np.ravel(block) for block in tail)])


class FeaturePartition:
    """How the state features split between the shared product and the per-label blocks.

    Attributes that are features with many labels (at least ``SHARED_MIN_LABELS``; all of them
    in the dense layout) go through one sparse-times-dense product over their columns of X. The
    other attributes, each a feature with only a few labels, are grouped by label. Computed once
    per model and shared by every block of tokens.
    """

    SHARED_MIN_LABELS = 8

    def __init__(self, params: ParameterLayout) -> None:
        A, L = params.n_attributes, params.n_labels
        self.identity = params.feature_index is None
        index = np.arange(A * L) if self.identity else params.feature_index
        self.n_labels, self.n_state = L, index.size
        attribute, label = index // L, index % L
        shared = np.bincount(attribute, minlength=A) >= min(self.SHARED_MIN_LABELS, L)
        self.shared_columns = np.flatnonzero(shared)
        shared_index = np.full(A, -1, dtype=np.int64)  # attribute -> its column in the shared product
        shared_index[self.shared_columns] = np.arange(self.shared_columns.size)
        in_shared = shared[attribute]
        self.shared_positions = np.flatnonzero(in_shared)
        self.shared_flat = shared_index[attribute[in_shared]] * L + label[in_shared]
        # the other features by label, then by position: their columns in the per-label incidence matrix
        local = np.flatnonzero(~in_shared)
        self.local_positions = local[np.argsort(label[local], kind="stable")]
        self.n_local = self.local_positions.size
        # attribute and label of every local column, in column order (n_local,)
        self.local_attributes = attribute[self.local_positions]
        self.local_labels = label[self.local_positions]

    def shared_weights(self, theta_state: np.ndarray) -> np.ndarray:
        """The (A_shared, L) weights of the shared attributes: one matrix for all blocks, filled
        once per evaluation (before the blocks run)."""
        if self.identity:
            return theta_state.reshape(-1, self.n_labels)
        if not hasattr(self, "_shared"):
            self._shared = np.zeros((self.shared_columns.size, self.n_labels))
        self._shared.ravel()[self.shared_flat] = theta_state[self.shared_positions]
        return self._shared


class StateFeatures:
    """State features of one block of tokens: emissions ``X @ W`` and expected counts, where W
    (A, L) holds the state weights and is zero outside the model's features.

    The shared attributes (see :class:`FeaturePartition`) go through one product
    ``X_shared @ W_shared``. The other (token, feature) incidences form one sparse matrix
    ``local`` (T * L, n_local) whose row ``t * L + l`` holds token t's features with label l,
    so the emissions, seen flat (T * L,), gain ``local @ theta_local`` and the gradient is
    ``local.T @ P.ravel()``: two contiguous products instead of one strided one per label.
    ``local`` is stored by column: most of its T * L rows are empty, and both products are then
    faster than by row, with a third of the index memory. Work and memory follow the (token,
    feature) incidences where they are few, without storing the many incidences of frequent
    attributes (the shared product covers those).
    """

    def __init__(self, X: sp.csr_matrix, partition: FeaturePartition) -> None:
        self.partition = partition
        self.n_tokens = X.shape[0]
        L = partition.n_labels
        self.X_shared = X if partition.identity else X[:, partition.shared_columns]
        shape = (self.n_tokens * L, partition.n_local)
        self.local = sp.csc_matrix(shape)
        if partition.n_local:
            # column j of ``local`` is X's column attribute_j with every row t moved to t * L + label_j:
            # one column gather of X by column (duplicate entries summed, rows sorted), then the row
            # numbers rewritten in place, which keeps their order: canonical form without a sort
            block = X.tocsc()[:, partition.local_attributes]
            block.sum_duplicates()
            index_type = np.int32 if shape[0] <= np.iinfo(np.int32).max else np.int64
            rows = block.indices.astype(index_type)
            rows *= L
            rows += np.repeat(partition.local_labels.astype(index_type), np.diff(block.indptr))
            self.local = sp.csc_matrix((block.data, rows, block.indptr), shape=shape)

    def emissions(self, theta_state: np.ndarray, shared_weights: np.ndarray | None = None) -> np.ndarray:
        """Emission scores (T, L) for the state weights ``theta_state`` (and their shared part
        ``partition.shared_weights(theta_state)``, computed here if not given)."""
        part = self.partition
        W = part.shared_weights(theta_state) if shared_weights is None else shared_weights
        out = np.asarray(self.X_shared @ W) if W.shape[0] else np.zeros((self.n_tokens, part.n_labels))
        if part.n_local:
            out += (self.local @ theta_state[part.local_positions]).reshape(out.shape)
        return out

    def gradient(self, P: np.ndarray) -> np.ndarray:
        """Expected feature counts (n_state,) for marginals ``P`` (T, L)."""
        part = self.partition
        shared = np.asarray(self.X_shared.T @ P).ravel() if part.shared_columns.size else np.zeros(0)
        if part.identity:
            return shared
        out = np.empty(part.n_state)
        out[part.shared_positions] = shared[part.shared_flat]
        out[part.local_positions] = self.local.T @ np.ascontiguousarray(P).ravel()
        return out


class _Block:
    """Some fully labelled sequences, stored in their own packed time-major order.

    ``candidates`` (T, L) bool (input order), when given, restrict every sum to the paths through
    the candidate labels of each token (the gold labels must be among them): the block
    then contributes ``log Z_candidates(x) - score(y)``, where Z_candidates <= Z sums those paths only.
    The chain runs over the structure's :meth:`~crf._order.ChainStructure.lattice` for them (a
    second-order one over each token's candidates only)."""

    def __init__(
        self,
        X: sp.csr_matrix,
        offsets: np.ndarray,
        labels: np.ndarray,
        partition: FeaturePartition,
        structure: ChainStructure,
        candidates: np.ndarray | None = None,
    ) -> None:
        self.layout = chain.Layout.from_lengths(np.diff(offsets))
        rows = self.layout.token_of_row
        X = X[rows]
        self.labels = labels[rows]
        self.states = StateFeatures(X, partition)
        self.lattice = structure.lattice(self.layout, None if candidates is None else np.asarray(candidates, dtype=bool)[rows])

    def observed_state(self, n_labels: int) -> np.ndarray:
        """Observed state feature counts of this block's gold labels."""
        return self.states.gradient(np.eye(n_labels)[self.labels])

    def chain_emissions(
        self, theta_state: np.ndarray, shared_weights: np.ndarray, tail: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(per-label emissions (T, L), the lattice's per-state emissions (T, S)), packed."""
        emissions = self.states.emissions(theta_state, shared_weights)
        return emissions, self.lattice.emissions(emissions, tail)

    def evaluate(
        self, theta_state: np.ndarray, shared_weights: np.ndarray, tail: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(log Z summed, emission score of the gold labels summed, expected state counts,
        expected transition counts (the operator's count shape), state marginals summed at first
        and last tokens (2, S) in the structure's states); ``tail``: the label n-gram weights."""
        emissions, states = self.chain_emissions(theta_state, shared_weights, tail)
        gold = float(emissions[np.arange(self.labels.size), self.labels].sum())
        del emissions
        # the recursion works in the emissions' own array (one (T, S) array fewer per thread);
        # sequences it must redo in log space take them anew
        posterior = chain.forward_backward(
            states,
            *self.lattice.scores(tail),
            self.layout,
            packed=True,
            emissions_again=lambda: self.chain_emissions(theta_state, shared_weights, tail)[1],
        )
        del states
        marginals = posterior.marginals
        ends = self.lattice.boundary_sums(marginals)
        node = self.lattice.label_marginals(marginals)
        return float(posterior.log_z.sum()), gold, self.states.gradient(node), posterior.transition_counts, ends


class _PartialBlock(_Block):
    """Some partially labelled sequences (label -1: unknown). Each contributes
    ``log Z(x) - log Z(x | known labels)``, the second term by forward-backward over the paths
    that agree with the known labels, and expected counts minus expected counts under that
    constraint (in place of the observed counts of a fully labelled sequence)."""

    def __init__(self, X, offsets, labels, partition, structure, candidates=None) -> None:
        super().__init__(X, offsets, labels, partition, structure, candidates)
        L = partition.n_labels
        allowed = np.ones((self.labels.size, L), dtype=bool)  # packed (T, L)
        known = np.flatnonzero(self.labels >= 0)
        allowed[known] = False
        allowed[known, self.labels[known]] = True
        self.allowed = self.lattice.state_mask(allowed)  # (T, S)

    def observed_state(self, n_labels: int) -> np.ndarray:
        return np.zeros(self.states.partition.n_state)

    def evaluate(self, theta_state, shared_weights, tail):
        _, states = self.chain_emissions(theta_state, shared_weights, tail)
        scores = self.lattice.scores(tail)
        clamped = chain.forward_backward(states, *scores, self.layout, packed=True, allowed=self.allowed)
        free = chain.forward_backward(
            states,
            *scores,
            self.layout,
            packed=True,
            emissions_again=lambda: self.chain_emissions(theta_state, shared_weights, tail)[1],
        )
        del states
        difference = free.marginals - clamped.marginals
        ends = self.lattice.boundary_sums(difference)
        log_z = float(free.log_z.sum() - clamped.log_z.sum())
        counts = free.transition_counts - clamped.transition_counts
        return log_z, 0.0, self.states.gradient(self.lattice.label_marginals(difference)), counts, ends


def _share_ones(matrices: list[sp.spmatrix]) -> None:
    """Point the data of the binary matrices (all values 1) at one read-only array of ones. It is
    as long as the largest one, and the blocks' matrices are of similar size: scipy copies a data
    array that is a view of less than half its base whenever it wraps it in a new matrix (as a
    transpose does)."""
    binary = [m for m in matrices if m.nnz and np.all(m.data == 1.0)]
    if binary:
        ones = np.ones(max(m.nnz for m in binary))
        ones.setflags(write=False)
        for m in binary:
            m.data = ones[: m.nnz]


def block_count(n_cells: int, n_sequences: int, block_cells: int, multiple: int = 4) -> int:
    """Blocks for ``n_cells`` (token, label) cells: ``ceil(n_cells / block_cells)``, rounded up to
    ``multiple`` when above 1 (to balance the load of up to ``multiple`` threads), at most one per
    sequence. Independent of the thread count."""
    n = max(1, -(-int(n_cells) // max(1, int(block_cells))))
    if n > 1:
        n = -(-n // multiple) * multiple
    return max(1, min(n, int(n_sequences)))


def _blocks_of(lengths: np.ndarray, n_blocks: int) -> list[np.ndarray]:
    """Sequence indices in ``n_blocks`` groups of about equal token counts, each a run of
    similar lengths (sorted longest first, cut where the running token count crosses k / n_blocks
    of the total). A block's recursion takes as many Python steps as its longest sequence, so
    keeping lengths together makes most blocks short; indices within a group are sorted."""
    order = np.argsort(-lengths, kind="stable")
    tokens = np.cumsum(lengths[order])
    cuts = np.searchsorted(tokens, tokens[-1] * np.arange(1, n_blocks) / n_blocks, side="left") + 1
    return [np.sort(group) for group in np.split(order, np.unique(np.clip(cuts, 1, order.size))) if group.size]


class Objective:
    """NLL(theta) = sum_i [log Z(x_i) - score(y_i | x_i)] and its gradient for one batch.

    ``X`` (T, A) CSR, ``offsets`` (N + 1,), ``labels`` (T,) label indices in [0, L), or -1 for
    a label that is not known: a sequence with unknown labels contributes
    ``log Z(x_i) - log Z(x_i | its known labels)``, minus the log of the probability of its known
    labels with the others summed out (see :class:`_PartialBlock`); one with no known label
    contributes nothing and is left out. Calling the object returns ``(loss, gradient)``;
    regularisation is added by the optimiser.

    The sequences are cut into blocks of about ``block_cells`` (token, label) cells (default
    :attr:`BLOCK_CELLS`) by length (see :func:`_blocks_of`), each stored once in its own packed time-major order; a thread pool
    evaluates the blocks and their results are summed in block order. The partition depends on
    the data and ``block_cells`` only, never on the thread count, so any number of threads gives
    bit-identical losses and gradients. Working memory of the recursions scales with the block,
    not the corpus. Call it inside :func:`crf._parallel.single_threaded_blas`.
    """

    #: (token, label) cells per block (8 bytes each per (T, L) array of a block): larger blocks
    #: run their long tails with few rows per step, smaller ones take more Python steps
    BLOCK_CELLS = 1_500_000
    #: with candidates, sequences whose tokens have at most this many go into one group of blocks
    SHARED_SLOTS = 3

    def __init__(
        self,
        X: sp.csr_matrix,
        offsets: np.ndarray,
        labels: np.ndarray,
        params: ParameterLayout,
        n_threads: int | None = None,
        block_cells: int | None = None,
        candidates: np.ndarray | None = None,
    ) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.int64)
        X = sp.csr_matrix(X, dtype=np.float64)
        self.params = params
        self.n_threads = thread_count(n_threads)
        lengths = np.diff(offsets)
        if labels.size and (labels.min() < -1 or labels.max() >= params.n_labels):
            raise ValueError(f"labels must lie in [0, {params.n_labels}) or be -1 (unknown)")
        known_before = np.concatenate([[0], np.cumsum(labels >= 0)])
        known = known_before[offsets[1:]] - known_before[offsets[:-1]]  # known labels per sequence
        full = np.flatnonzero((known == lengths) & (lengths > 0))
        partial = np.flatnonzero((known > 0) & (known < lengths))
        structure = params.chain
        if candidates is not None:
            candidates = np.asarray(candidates, dtype=bool)
            if candidates.shape != (labels.size, params.n_labels):
                raise ValueError(f"candidates must have shape {(labels.size, params.n_labels)}, got {candidates.shape}")
            known = np.flatnonzero(labels >= 0)
            if not candidates[known, labels[known]].all():
                raise ValueError("candidates must include every known gold label")
        self.partition = FeaturePartition(params)
        cells = block_cells or self.BLOCK_CELLS
        self.blocks = []
        # with candidates, sequences go into blocks by their largest candidate count (the slots of
        # their candidate lattice: a block pads every token to its widest one), then by length
        slots = np.zeros(lengths.size, dtype=np.int64)
        if candidates is not None and labels.size:
            counts = candidates.sum(axis=1)
            nonempty = lengths > 0
            slots[nonempty] = np.maximum.reduceat(counts, offsets[:-1][nonempty])
            # the narrowest lattices share one group (padded to SHARED_SLOTS): each block costs a
            # dense gradient of the state weights, more than the few padded slots
            slots = np.maximum(slots, min(self.SHARED_SLOTS, params.n_labels))
        for kind, everyone in ((_Block, full), (_PartialBlock, partial)):
            for width in np.unique(slots[everyone]):
                members = everyone[slots[everyone] == width]
                per_token = structure.cells_per_token(None if candidates is None else int(width))
                member_cells = int(lengths[members].sum()) * per_token * (2 if kind is _PartialBlock else 1)
                # several width groups already give the threads several blocks: no rounding up to 4 each
                multiple = 4 if candidates is None else 1
                self._add_blocks(kind, members, member_cells, cells, X, offsets, lengths, labels, structure, candidates, multiple)
        _share_ones([block.states.local for block in self.blocks])
        _share_ones([block.states.X_shared for block in self.blocks])
        self.workers = Workers(self.n_threads if len(self.blocks) > 1 else 1)
        self._observed(offsets, lengths, labels, full, partial)

    def _add_blocks(
        self, kind, members, member_cells, cells, X, offsets, lengths, labels, structure, candidates, multiple: int = 4
    ) -> None:
        """The sequences ``members`` as blocks of about ``cells`` working values each (their count
        a multiple of ``multiple`` when above 1)."""
        for group in _blocks_of(lengths[members], block_count(member_cells, members.size, cells, multiple)):
            sequences = members[group]
            rows = token_rows(offsets, sequences)
            sub_offsets = np.concatenate([[0], np.cumsum(lengths[sequences])])
            sub_candidates = None if candidates is None else candidates[rows]
            self.blocks.append(kind(X[rows], sub_offsets, labels[rows], self.partition, structure, sub_candidates))

    def _observed(self, offsets, lengths, labels, full, partial) -> None:
        """Observed state and tail counts of the labels, and the sizes."""
        params, partition, structure = self.params, self.partition, self.params.chain
        L = params.n_labels
        self.observed_state = sum((block.observed_state(L) for block in self.blocks), np.zeros(partition.n_state))
        # observed tail counts (transitions, start, end, ...) of the fully labelled sequences
        rows = token_rows(offsets, full)
        full_offsets = np.concatenate([[0], np.cumsum(lengths[full])])
        self.observed_tail = structure.observed_tail(full_offsets, labels[rows])
        self.n_tokens = int(labels.size)
        self.n_sequences = int(full.size + partial.size)  # those that contribute

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        n = self.params.n_state
        shared = self.partition.shared_weights(theta[:n])
        if not self.blocks:  # no sequence with a known label: the likelihood is constant
            return 0.0, np.zeros(self.params.size)
        parts = self.workers.imap(lambda block: block.evaluate(theta[:n], shared, theta[n:]), self.blocks)
        # summed in block order (results come in order), so the sums are the same for any thread
        # count; in place into the first block's fresh arrays, each block's dropped once added
        log_z, gold, state, pairs, ends = next(parts)
        for part in parts:
            log_z, gold = log_z + part[0], gold + part[1]
            state += part[2]
            pairs += part[3]
            ends += part[4]
        gold += theta[n:] @ self.observed_tail
        gradient = np.empty(self.params.size)
        np.subtract(state, self.observed_state, out=gradient[:n])
        np.subtract(self.params.chain.tail_counts(pairs, ends[0], ends[1]), self.observed_tail, out=gradient[n:])
        return float(log_z - gold), gradient

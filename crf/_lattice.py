"""Exact Viterbi decoding of an n-gram HMM over the states it can actually be in.

Under a model whose emission log probabilities are -inf for most (token, label) pairs (TnT's:
a known word has probability zero under every tag it was never seen with), every path through
such a pair scores -inf. Restricting each token to its *candidates* (labels of finite emission),
and a second-order chain's pair states to pairs of candidates, therefore loses no path of finite
score: the decoding is exact, not a beam. The work per token is the number of edges between the
candidate states of consecutive tokens, a few instead of L^2 (first order) or L^3 (second order).

The lattice is stored flat, in the time-major packed order of :class:`crf._layout.Layout`, so the
recursion is a Python loop over time steps of vectorised segment maxima (``np.maximum.reduceat``
over each state's incoming edges), no loop over sequences or tokens.
"""

from __future__ import annotations

import numpy as np

from ._layout import Layout, positions_within


def _ranges(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` (G,) items: the group of each item and its index in its group."""
    group = np.repeat(np.arange(counts.size), counts)
    return group, positions_within(counts)


def _candidates(emissions: np.ndarray) -> np.ndarray:
    """Which labels each token keeps (T, H): those of finite emission, or all if none is."""
    finite = np.isfinite(emissions)
    finite[~finite.any(axis=1)] = True
    return finite


def lattice_edges(emissions: np.ndarray, lengths, order: int) -> np.ndarray:
    """Edges into each token's states (T,) (``emissions`` (T, H) in input order): the product of
    the candidate counts of the token and the ``order`` tokens before it in its sequence."""
    count = _candidates(emissions).sum(axis=1)
    position = positions_within(lengths)
    edges = count.copy()
    for back in range(1, order + 1):
        edges[back:] *= np.where(position[back:] >= back, count[:-back], 1)
    return edges


def ngram_viterbi(emissions: np.ndarray, table: np.ndarray, lengths) -> np.ndarray:
    """Best hidden label of every token under an HMM of order 1 or 2 (exact Viterbi).

    ``emissions`` (T, H) log P(x_t | h) for all tokens in input order (-inf: impossible);
    ``table`` (H + 1,) * (order + 1) log transition probabilities, index H being the start symbol
    on context axes and the end symbol on the last axis (:mod:`crf._hmm_smoothing`'s layout);
    ``lengths`` (N,) sequence lengths. Returns hidden labels (T,) in input order. Ties go to the
    lowest previous label, as in :func:`crf._chain.viterbi`. A token with no finite emission keeps
    every label (its sequence scores -inf and gets an arbitrary labelling).
    """
    H, order = emissions.shape[1], table.ndim - 1
    layout = Layout.from_lengths(lengths)
    packed = emissions[layout.token_of_row]
    row, label = np.nonzero(_candidates(packed))  # candidates by row, labels ascending
    n_cand = np.bincount(row, minlength=packed.shape[0])
    cand_start = np.cumsum(n_cand) - n_cand
    step = np.repeat(np.arange(layout.n_steps), layout.n_active)
    first = step == 0
    previous = np.where(first, 0, layout.step_start[np.maximum(step - 1, 0)] + layout.rank_of_row)
    # states: order 1, a candidate c; order 2, a pair (previous candidate or start, candidate)
    n_context = np.where(first, 1, n_cand[previous]) if order == 2 else np.ones_like(n_cand)
    n_states = n_context * n_cand
    state_start = np.cumsum(n_states) - n_states
    token, local = _ranges(n_states)
    i, j = local // n_cand[token], local % n_cand[token]
    current = label[cand_start[token] + j]
    context = (np.where(first[token], H, label[cand_start[previous[token]] + i]),) if order == 2 else ()
    emitted = packed[token, current]
    # edges into the states of non-first tokens, grouped by target state; an edge from state
    # number h of the previous token that leads into (i, j) (order 2: from the states (h, i))
    head = previous[token]
    if order == 2:
        n_in, stride, base = np.where(first[token], 0, n_context[head]), n_cand[head], state_start[head] + i
    else:
        n_in, stride, base = np.where(first[token], 0, n_states[head]), None, state_start[head]
    edge_start = np.concatenate([[0], np.cumsum(n_in)])
    # source = base + h * stride with h = edge - edge_start[target]
    stride = 1 if stride is None else stride
    edge = np.arange(edge_start[-1])
    source = np.repeat(base - edge_start[:-1] * stride, n_in)
    source += edge * np.repeat(stride, n_in) if order == 2 else edge
    source = source.astype(np.int32)
    # table entry [*context of the source, label of the source, label of the target]: the
    # source's label is the target's context label in order 2
    width = np.int64(H + 1)
    key = (context[0] if order == 2 else current) * width**order
    target_key = context[0] * width + current if order == 2 else current
    weight = table.ravel()[key[source] + np.repeat(target_key, n_in)]
    weight += np.repeat(emitted, n_in)
    # forward: best score and back pointer of every state, one time step at a time
    delta = np.where(first[token], table[(H,) * order + (slice(None),)][current] + emitted, -np.inf)
    pointer = np.full(token.size, -1, dtype=np.int64)
    for t in range(1, layout.n_steps):
        rows = layout.rows(t)
        states = slice(int(state_start[rows.start]), int(state_start[rows.stop - 1] + n_states[rows.stop - 1]))
        edges = slice(int(edge_start[states.start]), int(edge_start[states.stop]))
        delta[states], best = _segment_max(delta[source[edges]] + weight[edges], n_in[states])
        pointer[states] = source[edges.start + best]
    # the best final state of each sequence (by rank), then the back pointers
    last = layout.last_rows()
    owner, local = _ranges(n_states[last])
    finals = state_start[last][owner] + local
    state = finals[
        _segment_max(delta[finals] + table[tuple(c[finals] for c in context) + (current[finals], H)], n_states[last])[1]
    ]
    out = np.empty(packed.shape[0], dtype=np.int64)
    ending = layout.lengths[layout.order] - 1
    for t in range(layout.n_steps - 1, -1, -1):
        active = np.flatnonzero(ending >= t)
        out[layout.step_start[t] + active] = current[state[active]]
        state[active] = pointer[state[active]]
    return layout.unpack(out)


def _segment_max(scores: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximum of each consecutive segment of ``counts`` (G,) (all positive) entries of ``scores``,
    and the position in ``scores`` of its first occurrence: (G,) each."""
    starts = np.cumsum(counts) - counts
    best = np.maximum.reduceat(scores, starts)
    hits = np.flatnonzero(scores == np.repeat(best, counts))  # at least one per segment
    segment = np.searchsorted(starts, hits, side="right") - 1
    first = np.ones(hits.size, dtype=bool)
    first[1:] = segment[1:] != segment[:-1]
    return best, hits[first]

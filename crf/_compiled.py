"""Compiled kernels for per-call work: Viterbi (first order and second order over candidate labels), the log-space
forward and backward recursions (a candidate second-order lattice's tagging messages and marginals;
the constrained windows of segment confidence, first order or over candidate labels), sparse emission scores.

One call tags one sentence or a whole batch, sequence after sequence, with no Python work per
token or per step: the regime (one sentence, one long sequence) where NumPy's per-call overhead
dominates. Each kernel is written once, as plain Python on arrays, and compiled with Numba on
first use (``import crf`` does not import Numba; the compiled code is cached on disk next to this
module, or in Numba's user cache directory, so later processes skip most of the warm-up). Without
Numba the same functions run as plain Python (correct, slow), with one warning.

The kernels release the GIL, so :mod:`crf._parallel`'s threads can run them side by side.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

log = logging.getLogger(__name__)

_lock = threading.Lock()
_compiled: dict[str, object] = {}


def _reach(labels, t, width):  # pragma: no cover - compiled
    """How many slots of token ``t`` of a candidate lattice to visit: past the last filled one of its
    ``width`` slots (``labels`` (T, K), -1 where empty) they are all empty."""
    reach = 0
    for k in range(width):
        if labels[t, k] >= 0:
            reach = k + 1
    return reach


def _source_weights(table, labels, before, before2, t, s, reach, weights):  # pragma: no cover - compiled
    """Row ``s`` of ``weights`` (S, K): the scores of the edges from state s = (i, j) of token
    ``t - 1`` of a candidate lattice into the first ``reach`` slots k of token ``t`` (``table[before2[t,
    i], before[t, j], labels[t, k]]``, -inf into an empty slot; see :func:`_viterbi`). False, and
    the row left as it was, when slot i or j is empty: the state has no edges."""
    width = labels.shape[1]
    a, b = before2[t, s // width], before[t, s % width]
    if a < 0 or b < 0:
        return False
    for k in range(reach):
        c = labels[t, k]
        weights[s, k] = table[a, b, c] if c >= 0 else -np.inf
    return True


#: the helpers the kernels call, compiled (once) before the first kernel is
_HELPERS = ("_reach", "_source_weights")


def _viterbi(emissions, table, start, end, offsets, slots, states, scores):  # pragma: no cover - compiled
    """Best state path of every sequence, into ``states`` (T,) and ``scores`` (N,): the one
    max-plus recursion of a first-order chain and of a candidate second-order lattice.

    ``emissions`` (T, S) per-state log scores (sequences one after another), ``start``/``end``
    (S,), ``offsets`` (N + 1,). The edges into a token are runs: each state s of the previous
    token leads into ``width`` consecutive states from ``(s % middle) * width``, scored by row s
    of a (S, width) weight table.

    - First order (``slots`` None): states are labels (S = L, middle 1, width L) and the weight
      table is ``table`` (L, L) [previous, current] at every token.
    - Second order over candidate labels: ``slots`` = (labels, before, before2): ``labels`` (T, K) the label in
      each slot of each token (-1: empty), ``before`` (T, K) the previous token's, ``before2``
      (T, K + 1) the labels that can precede those (see
      :class:`crf._transitions.CandidateSecondOrderTransitions`); states (i, j) = ``i * K + j``
      (S = (K + 1) K, middle K, width K), and the edge from (i, j) of token t - 1 into (j, k) of
      token t scores ``table[before2[t, i], before[t, j], labels[t, k]]``
      (``table`` (L + 1, L, L)), -inf where a slot is empty.

    Ties go to the lowest source state (for a second-order target, the lowest slot two back) and
    the best last state is the lowest among equals; a state no edge reaches with a finite score
    keeps pointer 0, and a sequence with no finite path scores -inf (its states 0 where nothing is
    better). Scores are summed as ``(delta[source] + weight) + emission``."""
    n_states = emissions.shape[1]
    if slots is None:  # first order (None: Numba compiles this case apart, with the candidate-lattice branches cut out)
        width, middle = n_states, 1
        weights = table.reshape((n_states, n_states))  # (a reshape types as the other branch's weights)
    else:
        labels, before, before2 = slots
        width = middle = labels.shape[1]
        weights = np.empty((n_states, width))
    longest = 0
    for n in range(offsets.size - 1):
        longest = max(longest, offsets[n + 1] - offsets[n])
    back = np.zeros((max(longest, 1), n_states), dtype=np.int64)
    delta = np.empty(n_states)
    following = np.empty(n_states)
    for n in range(offsets.size - 1):
        first, stop = offsets[n], offsets[n + 1]
        if stop <= first:
            scores[n] = 0.0
            continue
        for s in range(n_states):
            delta[s] = start[s] + emissions[first, s]
        for t in range(first + 1, stop):
            pointers = back[t - first]
            for s in range(n_states):
                following[s] = -np.inf
                pointers[s] = 0
            reach = width  # the targets (j, k) of a source (i, j) past k = reach - 1 have empty slots k
            if slots is not None:
                reach = _reach(labels, t, width)
            for s in range(n_states):  # source by source: the inner loop over a run has no branch
                value_in = delta[s]
                if slots is not None:  # this source's weights (none: its edges are all -inf)
                    if value_in == -np.inf:  # (most pair states are empty)
                        continue
                    if not _source_weights(table, labels, before, before2, t, s, reach, weights):
                        continue
                base = (s % middle) * width
                for k in range(reach):
                    value = value_in + weights[s, k]
                    better = value > following[base + k]
                    following[base + k] = value if better else following[base + k]
                    pointers[base + k] = s if better else pointers[base + k]
            for s in range(n_states):
                delta[s] = following[s] + emissions[t, s]
        best = delta[0] + end[0]
        arg = 0
        for s in range(1, n_states):
            value = delta[s] + end[s]
            if value > best:
                best = value
                arg = s
        scores[n] = best
        states[stop - 1] = arg
        for t in range(stop - 1, first, -1):
            arg = back[t - first, arg]
            states[t - 1] = arg


def _log_forward(
    emissions, table, start, slots, first, window_offsets, allowed, entering, incoming, final, messages
):  # pragma: no cover - compiled
    """Sum-product forward recursion in log space over runs of consecutive tokens (whole
    sequences, or windows of them with per-state constraints): the one log-space forward of a
    first-order chain and of a candidate second-order lattice.

    ``emissions`` (T, S) per-state log scores (tokens in input order); ``table`` and ``slots`` as
    in :func:`_viterbi` (edges into a token are runs of ``width`` consecutive target states from
    ``(s % middle) * width`` per source state s). Run r covers the ``window_offsets[r + 1] -
    window_offsets[r]`` tokens from ``first[r]``. Its first token's message is ``start`` plus the
    emissions or, with ``entering[r]``, the forward step from ``incoming[first[r] - 1]`` (S,) (the
    log message of the token before the run). Where ``allowed`` (W, S) has rows (W: all runs'
    tokens), a state it disallows at a token of a run gets -inf (before the step to the next
    token). Writes each run's last log message into ``final`` (R, S) and, where ``messages`` has
    rows, every token's into ``messages`` (W, S). Each target's log-sum-exp over its incoming
    edges is accumulated edge by edge (source by source) with a running maximum."""
    n_states = emissions.shape[1]
    if slots is None:  # first order
        width, middle = n_states, 1
        weights = table.reshape((n_states, n_states))
    else:
        labels, before, before2 = slots
        width = middle = labels.shape[1]
        weights = np.empty((n_states, width))
    masked = allowed.shape[0] > 0
    keep = messages.shape[0] > 0
    current = np.empty(n_states)
    source = np.empty(n_states)
    top = np.empty(n_states)
    total = np.empty(n_states)
    for r in range(first.size):
        row = window_offsets[r]
        for s in range(n_states):
            current[s] = -np.inf
        for u in range(window_offsets[r + 1] - row):
            t = first[r] + u
            if u == 0 and not entering[r]:
                for s in range(n_states):
                    current[s] = start[s] + emissions[t, s]
            else:
                for s in range(n_states):
                    source[s] = incoming[t - 1, s] if u == 0 else current[s]
                    top[s] = -np.inf
                    total[s] = 0.0
                reach = width  # past reach - 1 the slots k of this token are empty
                if slots is not None:
                    reach = _reach(labels, t, width)
                for s in range(n_states):
                    value_in = source[s]
                    if value_in == -np.inf:
                        continue
                    if slots is not None:
                        if not _source_weights(table, labels, before, before2, t, s, reach, weights):
                            continue
                    base = (s % middle) * width
                    for k in range(reach):
                        value = value_in + weights[s, k]
                        target = base + k
                        if value > top[target]:
                            total[target] = total[target] * np.exp(top[target] - value) + 1.0
                            top[target] = value
                        elif value > -np.inf:
                            total[target] += np.exp(value - top[target])
                for s in range(n_states):
                    current[s] = (top[s] + np.log(total[s]) if top[s] > -np.inf else -np.inf) + emissions[t, s]
            if masked:
                for s in range(n_states):
                    if not allowed[row + u, s]:
                        current[s] = -np.inf
            if keep:
                for s in range(n_states):
                    messages[row + u, s] = current[s]
        for s in range(n_states):
            final[r, s] = current[s]


def _log_backward(emissions, table, end, slots, offsets, log_beta):  # pragma: no cover - compiled
    """Sum-product backward recursion in log space of every sequence (``offsets`` (N + 1,)), the
    edges as in :func:`_log_forward`: ``log_beta`` (T, S) gets, for each token's states, the log
    sum over everything after the token (its own emission excluded), ``end`` included."""
    n_states = emissions.shape[1]
    if slots is None:  # first order
        width, middle = n_states, 1
        weights = table.reshape((n_states, n_states))
    else:
        labels, before, before2 = slots
        width = middle = labels.shape[1]
        weights = np.empty((n_states, width))
    values = np.empty(width)
    for n in range(offsets.size - 1):
        first, stop = offsets[n], offsets[n + 1]
        if stop <= first:
            continue
        for s in range(n_states):
            log_beta[stop - 1, s] = end[s]
        for t in range(stop - 1, first, -1):
            reach = width
            if slots is not None:
                reach = _reach(labels, t, width)
            for s in range(n_states):
                log_beta[t - 1, s] = -np.inf
                if slots is not None:
                    if not _source_weights(table, labels, before, before2, t, s, reach, weights):
                        continue
                base = (s % middle) * width
                best = -np.inf
                for k in range(reach):
                    values[k] = weights[s, k] + emissions[t, base + k] + log_beta[t, base + k]
                    best = max(best, values[k])
                if best == -np.inf:
                    continue
                total = 0.0
                for k in range(reach):
                    total += np.exp(values[k] - best)
                log_beta[t - 1, s] = best + np.log(total)


def _sparse_times_dense(indptr, indices, data, weights, out):  # pragma: no cover - compiled
    """``out`` (T, L) = the CSR rows (``indptr`` (T + 1,), ``indices``, ``data``) times ``weights``
    (A, L), each row's entries added in their stored order."""
    n_labels = weights.shape[1]
    for t in range(indptr.size - 1):
        for j in range(n_labels):
            out[t, j] = 0.0
        for k in range(indptr[t], indptr[t + 1]):
            column, value = indices[k], data[k]
            for j in range(n_labels):
                out[t, j] += value * weights[column, j]


def _forward_backward_first_order(
    emissions, transitions, start, end, step_start, lengths, marginals, log_z, counts, with_counts, log_alpha, log_beta, keep
):  # pragma: no cover - compiled
    """Sum-product forward-backward of a first-order chain in scaled probability space.

    ``emissions`` (T, L) in a :class:`crf._layout.Layout`'s packed order: the token t of the
    sequence of rank r is row ``step_start[t] + r``; ``lengths`` (N,) by rank. Writes node
    marginals (T, L) (packed), ``log_z`` (N,) by rank (NaN where the scaled numbers fail: the
    caller recomputes those sequences in log space) and, with ``with_counts``, adds the expected
    transition counts of the other sequences into ``counts`` (L, L). With ``keep`` it writes the
    true log forward and backward messages into ``log_alpha`` and ``log_beta`` (T, L), packed. The transition table is
    taken as ``exp(transitions - column maximum)`` and each token's scores as ``exp(scores -
    row maximum)`` (the column maxima folded into the scores), so products underflow only for
    extreme score ranges, which the checks catch.
    """
    n_labels = emissions.shape[1]
    top = np.empty(n_labels)
    for j in range(n_labels):
        best = -np.inf
        for i in range(n_labels):
            best = max(best, transitions[i, j])
        top[j] = best if np.isfinite(best) else 0.0
    table = np.empty((n_labels, n_labels))
    for i in range(n_labels):
        for j in range(n_labels):
            table[i, j] = np.exp(transitions[i, j] - top[j])
    table_t = np.ascontiguousarray(table.T)
    end_top = -np.inf
    for j in range(n_labels):
        end_top = max(end_top, end[j])
    if not np.isfinite(end_top):
        end_top = 0.0
    closing = np.empty(n_labels)
    for j in range(n_labels):
        closing[j] = np.exp(end[j] - end_top)
    longest = 0
    for r in range(lengths.size):
        longest = max(longest, lengths[r])
    weights = np.empty((longest, n_labels))  # exp of each token's shifted scores
    alpha = np.empty((longest, n_labels))
    scale = np.empty(longest)  # each step's normaliser
    cumulative = np.empty(longest)  # log of the product of the normalisers (and row maxima) so far
    beta = np.empty(n_labels)
    before = np.empty(n_labels)
    pending = np.zeros((n_labels, n_labels))
    for r in range(lengths.size):
        n = lengths[r]
        log_scale = 0.0
        ok = True
        for t in range(n):
            row = step_start[t] + r
            peak = -np.inf
            for j in range(n_labels):
                value = emissions[row, j] + (start[j] if t == 0 else top[j])
                weights[t, j] = value
                peak = max(peak, value)
            if not np.isfinite(peak):
                ok = False
                break
            for j in range(n_labels):
                weights[t, j] = np.exp(weights[t, j] - peak)
            total = 0.0
            if t == 0:
                for j in range(n_labels):
                    alpha[0, j] = weights[0, j]
                    total += alpha[0, j]
            else:
                for j in range(n_labels):
                    alpha[t, j] = 0.0
                for i in range(n_labels):  # (2-d indexing, not row views: a view per row costs more than its work)
                    previous = alpha[t - 1, i]
                    if previous != 0.0:
                        for j in range(n_labels):
                            alpha[t, j] += previous * table[i, j]
                for j in range(n_labels):
                    alpha[t, j] *= weights[t, j]
                    total += alpha[t, j]
            if not (total > 0.0) or not np.isfinite(total):
                ok = False
                break
            for j in range(n_labels):
                alpha[t, j] /= total
            scale[t] = total
            log_scale += np.log(total) + peak
            cumulative[t] = log_scale
        final = 0.0
        if ok:
            for j in range(n_labels):
                final += alpha[n - 1, j] * closing[j]
            ok = final > 0.0 and np.isfinite(final)
        if not ok:
            log_z[r] = np.nan
            for t in range(n):
                for j in range(n_labels):
                    marginals[step_start[t] + r, j] = np.nan
            continue
        log_z[r] = log_scale + np.log(final) + end_top
        # backward, with the forward normalisers: alpha_t . beta_t = final at every t
        for j in range(n_labels):
            beta[j] = closing[j]
        for i in range(n_labels):
            for j in range(n_labels):
                pending[i, j] = 0.0
        for t in range(n - 1, -1, -1):
            row = step_start[t] + r
            mass = 0.0
            if keep:
                for j in range(n_labels):
                    log_alpha[row, j] = np.log(alpha[t, j]) + cumulative[t]
                    log_beta[row, j] = np.log(beta[j]) + log_z[r] - np.log(final) - cumulative[t]
            for j in range(n_labels):
                value = alpha[t, j] * beta[j] / final
                marginals[row, j] = value
                mass += value
            if not (abs(mass - 1.0) < 1e-6):
                ok = False
                break
            if t == 0:
                break
            for j in range(n_labels):
                before[j] = weights[t, j] * beta[j] / scale[t]
            if with_counts:
                for i in range(n_labels):
                    source = alpha[t - 1, i] / final
                    if source != 0.0:
                        for j in range(n_labels):
                            pending[i, j] += source * table[i, j] * before[j]
            for i in range(n_labels):
                beta[i] = 0.0
            for j in range(n_labels):  # by columns of the table (rows of its transpose): no reduction in the inner loop
                factor = before[j]
                if factor != 0.0:
                    for i in range(n_labels):
                        beta[i] += table_t[j, i] * factor
        if not ok:
            log_z[r] = np.nan
            for t in range(n):
                for j in range(n_labels):
                    marginals[step_start[t] + r, j] = np.nan
            continue
        if with_counts:
            for i in range(n_labels):
                for j in range(n_labels):
                    counts[i, j] += pending[i, j]


def _state_feature_emissions(ends, attributes, values, first, labels, weights, out):  # pragma: no cover - compiled
    """``out[t, labels[k]] += weights[k] * value`` for every state feature k of every entry
    (attribute, value) of row t, in entry order (CRFsuite's tagger's order); ``out`` zeros."""
    begin = 0
    for t in range(ends.size):
        for entry in range(begin, ends[t]):
            attribute, value = attributes[entry], values[entry]
            for k in range(first[attribute], first[attribute + 1]):
                out[t, labels[k]] += weights[k] * value
        begin = ends[t]


def _sequence_gradient(indptr, indices, data, labels, marginals, out):  # pragma: no cover - compiled
    """``out`` (A, L) += the CSR rows' transpose times (``marginals`` - one-hot ``labels``): the
    expected minus observed state feature counts of one sequence."""
    n_labels = marginals.shape[1]
    for t in range(indptr.size - 1):
        gold = labels[t]
        for k in range(indptr[t], indptr[t + 1]):
            column, value = indices[k], data[k]
            for j in range(n_labels):
                out[column, j] += value * marginals[t, j]
            out[column, gold] -= value


def _masked_rows_step(rows, weights, step, mask, masked, factor):  # pragma: no cover - compiled
    """``weights[rows[c], j] -= factor * step[c, j]`` for the rows ``rows`` (C,) of ``weights``
    (A, L) and ``step`` (C, L), where ``mask[rows[c], j]`` (with ``masked``; else everywhere):
    one SGD update of the weights of the attributes a sequence contains, features only."""
    for c in range(rows.size):
        row = rows[c]
        for j in range(weights.shape[1]):
            if not masked or mask[row, j]:
                weights[row, j] -= factor * step[c, j]


def _sorted_rows_times_dense(ends, columns, values, weights, out):  # pragma: no cover - compiled
    """``out`` (T, L) = rows given as unsorted entries times ``weights`` (A, L), each row's
    entries added in increasing column order (the order of a CSR matrix with sorted indices);
    ``ends`` (T,) where each row's entries end. Returns False (``out`` incomplete) if a row
    repeats a column."""
    n_labels = weights.shape[1]
    longest = 0
    begin = 0
    for t in range(ends.size):
        longest = max(longest, ends[t] - begin)
        begin = ends[t]
    order = np.empty(longest, dtype=np.int64)
    begin = 0
    for t in range(ends.size):
        size = ends[t] - begin
        for k in range(size):  # insertion sort of the row's entries by column (rows are short)
            entry = begin + k
            column = columns[entry]
            at = k
            while at > 0 and columns[order[at - 1]] > column:
                order[at] = order[at - 1]
                at -= 1
            if at > 0 and columns[order[at - 1]] == column:
                return False
            order[at] = entry
        for j in range(n_labels):
            out[t, j] = 0.0
        for k in range(size):
            entry = order[k]
            column, value = columns[entry], values[entry]
            for j in range(n_labels):
                out[t, j] += value * weights[column, j]
        begin = ends[t]
    return True


def _kernel(name: str):
    """The compiled kernel ``name`` (compiled on first use; the plain function without Numba)."""
    kernel = _compiled.get(name)
    if kernel is not None:
        return kernel
    with _lock:
        if name not in _compiled:
            function = globals()[name]
            try:
                import numba
            except ImportError:  # pragma: no cover - numba is a dependency
                log.warning("numba is not installed: %s runs as plain Python (slow)", name)
                _compiled[name] = function
            else:
                for helper in _HELPERS:  # a kernel resolves the helpers it calls when it is compiled
                    if helper not in _compiled:  # inlined into each kernel: the same code as written out there
                        inlined = numba.njit(cache=True, nogil=True, inline="always")(globals()[helper])
                        _compiled[helper] = globals()[helper] = inlined
                _compiled[name] = numba.njit(cache=True, nogil=True)(function)
    return _compiled[name]


def viterbi(
    emissions: np.ndarray, transitions: np.ndarray, start, end, offsets: np.ndarray, slots: tuple | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Best state sequence of every sequence of a first-order chain or a candidate second-order lattice.

    Parameters
    ----------
    emissions : (T, S) float array, log scores of every token's states (sequences one after another).
    transitions : (L, L) float array indexed [previous, current] (first order, S = L); with
        ``slots``, the (L + 1, L, L) label-triple scores of the candidate lattice.
    start, end : (S,) float arrays, scores of the first and last state of a sequence.
    offsets : (N + 1,) int array, where each sequence starts in ``emissions`` and where the last ends.
    slots : None (first order), or (labels (T, K), before (T, K), before2 (T, K + 1)) int arrays
        of a :class:`crf._transitions.CandidateSecondOrderTransitions` (tokens in input order;
        S = (K + 1) K).

    Returns
    -------
    states : (T,) int64, the best path's states (labels for first order); ties go to the lowest state id.
    scores : (N,) float64, the best path's score (-inf if no path has a finite score).
    """
    emissions, offsets = _floats(emissions), np.asarray(offsets, dtype=np.int64)
    states = np.zeros(emissions.shape[0], dtype=np.int64)
    scores = np.empty(offsets.size - 1)
    if slots is not None:
        slots = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in slots)
    _kernel("_viterbi")(emissions, _contiguous(transitions), _floats(start), _floats(end), offsets, slots, states, scores)
    return states, scores


def _contiguous(array) -> np.ndarray:
    """``array`` as C-contiguous float64 (a copy only if it is not already)."""
    if type(array) is np.ndarray and array.dtype == np.float64 and array.flags.c_contiguous:
        return array
    return np.ascontiguousarray(array, dtype=np.float64)


def _floats(array) -> np.ndarray:
    """``array`` as float64 (a copy only if it is not already)."""
    return array if type(array) is np.ndarray and array.dtype == np.float64 else np.asarray(array, dtype=np.float64)


def forward_backward(
    emissions,
    transitions,
    start,
    end,
    step_start,
    lengths,
    with_counts: bool,
    overwrite: bool = False,
    keep_messages: bool = False,
):
    """Forward-backward of a first-order chain on packed emissions (see
    :func:`_forward_backward_first_order`): (log Z (N,) by rank, NaN for the sequences to
    recompute in log space, marginals (T, L) packed, transition counts (L, L) or None). With
    ``overwrite`` the marginals are written over ``emissions`` (float64; each sequence's scores
    are read before its marginals are written). With ``keep_messages`` the true log messages
    (log alpha, log beta) (T, L), packed, follow; else two None."""
    emissions = _floats(emissions)
    marginals = emissions if overwrite else np.empty(emissions.shape)
    log_z = np.empty(len(lengths))
    counts = np.zeros((emissions.shape[1], emissions.shape[1]))
    messages = (np.empty(emissions.shape), np.empty(emissions.shape)) if keep_messages else (np.empty((0, 0)),) * 2
    _kernel("_forward_backward_first_order")(
        emissions,
        _floats(transitions),
        _floats(start),
        _floats(end),
        np.asarray(step_start, dtype=np.int64),
        np.asarray(lengths, dtype=np.int64),
        marginals,
        log_z,
        counts,
        with_counts,
        *messages,
        keep_messages,
    )
    return log_z, marginals, counts if with_counts else None, *(messages if keep_messages else (None, None))


def state_feature_emissions(ends, attributes, values, first, labels, weights, n_labels: int) -> np.ndarray:
    """Emission scores (T, L) from entries (attribute, value) per row and the state features
    listed by attribute (attribute a's are ``labels[first[a]:first[a + 1]]`` with ``weights``),
    added in entry order as CRFsuite's tagger adds them. ``ends`` (T,): where each row's entries end."""
    ends = np.asarray(ends, dtype=np.int64)
    out = np.zeros((ends.size, n_labels))
    _kernel("_state_feature_emissions")(
        ends,
        np.asarray(attributes, dtype=np.int64),
        _floats(values),
        np.asarray(first, dtype=np.int64),
        np.asarray(labels, dtype=np.int64),
        _floats(weights),
        out,
    )
    return out


def sequence_gradient(indptr, indices, data, labels, marginals: np.ndarray, n_columns: int) -> np.ndarray:
    """Expected minus observed state feature counts (A, L) of one sequence: the CSR rows
    (``indptr`` (T + 1,), ``indices``, ``data``) transposed times (``marginals`` (T, L) minus the
    one-hot gold ``labels`` (T,))."""
    out = np.zeros((n_columns, marginals.shape[1]))
    _kernel("_sequence_gradient")(
        np.asarray(indptr, dtype=np.int64),
        np.asarray(indices, dtype=np.int64),
        _floats(data),
        np.asarray(labels, dtype=np.int64),
        _floats(marginals),
        out,
    )
    return out


def rows_times_dense(ends, columns, values, weights: np.ndarray) -> np.ndarray | None:
    """Rows given as entries (column, value) times dense ``weights`` (A, L): (T, L) float64, or
    None if a row names a column twice.

    ``ends`` (T,): where each row's entries end (cumulative counts); ``columns`` and ``values``
    (E,): the entries, in any order within a row. Each row's entries are added in increasing
    column order, starting from 0: the bits of a CSR product with sorted indices."""
    ends = np.asarray(ends, dtype=np.int64)
    out = np.empty((ends.size, weights.shape[1]))
    complete = _kernel("_sorted_rows_times_dense")(
        ends, np.asarray(columns, dtype=np.int64), np.asarray(values, dtype=np.float64), weights, out
    )
    return out if complete else None


def sparse_times_dense(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Rows of a CSR matrix (T, A) times dense ``weights`` (A, L): (T, L) float64.

    ``indptr`` (T + 1,), ``indices`` and ``data`` (nnz,) as in :class:`scipy.sparse.csr_matrix`;
    each row's entries are added in their stored order, starting from 0."""
    out = np.empty((indptr.size - 1, weights.shape[1]))
    _kernel("_sparse_times_dense")(
        np.ascontiguousarray(indptr, dtype=np.int64),
        np.ascontiguousarray(indices, dtype=np.int64),
        np.ascontiguousarray(data, dtype=np.float64),
        np.ascontiguousarray(weights, dtype=np.float64),
        out,
    )
    return out


def _slot_arrays(slots: tuple | None) -> tuple | None:
    return None if slots is None else tuple(np.ascontiguousarray(a, dtype=np.int64) for a in slots)


def log_forward(
    emissions: np.ndarray,
    transitions: np.ndarray,
    start,
    first: np.ndarray,
    window_offsets: np.ndarray,
    slots: tuple | None = None,
    allowed: np.ndarray | None = None,
    incoming: np.ndarray | None = None,
    entering: np.ndarray | None = None,
    keep: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Log-space forward messages over runs of tokens (:func:`_log_forward`).

    Parameters
    ----------
    emissions : (T, S) float array, log scores of every token's states (tokens in input order).
    transitions : (L, L) float array [previous, current] (first order, S = L); with ``slots``,
        the (L + 1, L, L) label-triple scores of a candidate second-order lattice.
    start : (S,) float array, scores of a sequence's first state.
    first : (R,) int array, the first token (index into ``emissions``) of every run.
    window_offsets : (R + 1,) int array, where each run's tokens start among all runs' (W in all).
    slots : None (first order), or (labels (T, K), before (T, K), before2 (T, K + 1)) int arrays of
        a :class:`crf._transitions.CandidateSecondOrderTransitions` (S = (K + 1) K).
    allowed : (W, S) bool array or None, the states each run's tokens may take.
    incoming : (T, S) float array or None, the log forward messages the runs with ``entering`` start from.
    entering : (R,) bool array or None (none), whether run r starts from ``incoming[first[r] - 1]``
        rather than from ``start``.
    keep : bool, whether to return every token's message.

    Returns
    -------
    final : (R, S) float64, each run's last log message (-inf: no allowed path).
    messages : (W, S) float64 with ``keep``, else None.
    """
    emissions = _contiguous(emissions)
    first = np.asarray(first, dtype=np.int64)
    window_offsets = np.asarray(window_offsets, dtype=np.int64)
    n_states = emissions.shape[1]
    final = np.empty((first.size, n_states))
    messages = np.empty((int(window_offsets[-1]) if keep else 0, n_states))
    allowed = np.zeros((0, n_states), dtype=np.bool_) if allowed is None else np.ascontiguousarray(allowed, dtype=np.bool_)
    incoming = np.empty((0, n_states)) if incoming is None else _contiguous(incoming)
    entering = np.zeros(first.size, dtype=np.bool_) if entering is None else np.ascontiguousarray(entering, dtype=np.bool_)
    _kernel("_log_forward")(
        emissions, _contiguous(transitions), _floats(start), _slot_arrays(slots), first, window_offsets, allowed, entering,
        incoming, final, messages,
    )  # fmt: skip
    return final, messages if keep else None


def log_backward(
    emissions: np.ndarray, transitions: np.ndarray, end, offsets: np.ndarray, slots: tuple | None = None
) -> np.ndarray:
    """Log-space backward messages (T, S) of every sequence at ``offsets`` (N + 1,) (:func:`_log_backward`);
    the other arguments as :func:`log_forward`'s, ``end`` (S,) the scores of a sequence's last state."""
    emissions = _contiguous(emissions)
    log_beta = np.empty(emissions.shape)
    _kernel("_log_backward")(
        emissions, _contiguous(transitions), _floats(end), _slot_arrays(slots), np.asarray(offsets, dtype=np.int64), log_beta
    )
    return log_beta

"""Linear-chain recursions and the queries built on them: log Z, marginals, entropy, Viterbi,
k-best, constrained decoding and constrained spans.

Scores
------
For a sequence of length n with labels y, ``score(y) = start[y_0] + sum_t emissions[t, y_t]
+ sum_{t>0} transitions[y_{t-1}, y_t] + end[y_{n-1}]`` and ``p(y|x) = exp(score(y) - log Z)``.
Arrays: ``emissions`` (T, L) for all tokens of all sequences in token order, ``transitions``
(L, L) indexed [previous, current] (or an operator of :mod:`crf._transitions`, such as
:class:`SecondOrderTransitions`, whose states then replace labels), ``start`` and ``end`` (L,).

One forward and one backward recursion (over the time-major :class:`Layout`) serve every query
through a semiring of :mod:`crf._semirings` and a transition operator of :mod:`crf._transitions`;
neither is inspected here. Messages are kept normalised per row with the log of the normaliser
accumulated, so the true log message is ``semiring.to_log(value) + cumulative log normaliser``.
Where one call would otherwise pay NumPy's per-step overhead, the compiled kernels of
:mod:`crf._compiled` run instead, each the one implementation of its recursion for the chains it
takes: first-order forward-backward, Viterbi (first order and second order over candidate labels), and the
log-space forward and backward (a candidate lattice's tagging messages, constrained windows).

Constraints: ``allowed`` (T, L) boolean masks (True = the label is allowed at that token) give
the emissions of disallowed labels the semiring's zero (a log score of -inf), so decoding and
marginals run over the allowed paths only. A token with no allowed label makes its sequence
impossible: log Z = -inf, NaN marginals, Viterbi score -inf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import _compiled
from ._layout import Layout
from ._semirings import KMaxSemiring, LogSemiring, MaxSemiring, ScaledSemiring
from ._transitions import CandidateSecondOrderTransitions, FirstOrderTransitions, SecondOrderTransitions

__all__ = [
    "KMaxSemiring",
    "Layout",
    "LogSemiring",
    "MaxSemiring",
    "Posterior",
    "ScaledSemiring",
    "SecondOrderTransitions",
    "constrained_log_probability",
    "edge_marginals",
    "entropy",
    "forward_backward",
    "kbest_viterbi",
    "log_partition",
    "sequence_scores",
    "viterbi",
]


def operator_of(transitions):
    """A transition operator: (L, L) score matrices are wrapped, operators pass through."""
    return transitions if hasattr(transitions, "lift") else FirstOrderTransitions(transitions)


_operator = operator_of


def _layout(lengths) -> Layout:
    return lengths if isinstance(lengths, Layout) else Layout.from_lengths(lengths)


def _masked(emissions: np.ndarray, allowed, operator) -> np.ndarray:
    """Emissions with disallowed labels at log score -inf; ``allowed`` (T, L) per label or
    (T, S) per state (a per-label mask of a pair-state chain is expanded to its states)."""
    if allowed is None:
        return emissions
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.shape != emissions.shape:
        allowed = operator.label_mask(allowed)
    if allowed.shape != emissions.shape:
        raise ValueError(f"allowed must have shape {emissions.shape} (or per label), got {np.shape(allowed)}")
    return np.where(allowed, emissions, -np.inf)


# --- the recursions -----------------------------------------------------------------------


def _lifted_scores(packed: np.ndarray, operator, start, layout: Layout, semiring, overwrite: bool = False):
    """Packed emissions with the incoming-transition offsets folded in, lifted.

    The operator takes each target state's best incoming score ``column_top`` out of its table
    (so the lifted table peaks at the semiring's one and products underflow only in extreme
    cases); it is added here to the emissions of every non-first token. The first token of each
    sequence takes ``start`` instead. ``packed`` (T, S) is in packed order; it is modified (and
    reused) only with ``overwrite``. Returns (lifted emissions (T, S), their log offsets (T,),
    lifted operator).
    """
    column_top, lifted_operator = operator.lift(semiring)
    first = layout.first_rows()
    shifted = packed if overwrite else np.empty_like(packed)
    np.add(packed[first], start, out=shifted[first])
    # (S,) for every row, or (T, S) per row for an operator that carries per-token data
    np.add(packed[first.stop :], np.broadcast_to(column_top, packed.shape)[first.stop :], out=shifted[first.stop :])
    lifted, offset = semiring.from_log(shifted, inplace=True)
    return lifted, offset, lifted_operator


def _forward(lifted, offset, operator, layout: Layout, semiring):
    """Normalised forward messages (T, S, *V), cumulative log normalisers (T,) and each row's own
    step normaliser (T,) (the log of what its message was divided by). True log message:
    ``to_log(alpha[r]) + log_scale[r]``."""
    alpha = np.empty(lifted.shape + semiring.value_shape)
    log_scale, step_log = np.empty(lifted.shape[0]), np.empty(lifted.shape[0])
    rows = layout.rows(0)
    first = semiring.times(semiring.ones(lifted[rows].shape), lifted[rows])
    step_log[rows] = semiring.normalize(first, out=alpha[rows])[1]
    log_scale[rows] = step_log[rows] + offset[rows]
    for t in range(1, layout.n_steps):
        rows, previous = layout.rows(t), layout.rows(t - 1, layout.n_active[t])
        incoming = operator.at(rows).forward(alpha[previous])
        step_log[rows] = semiring.normalize(semiring.times(incoming, lifted[rows]), out=alpha[rows])[1]
        log_scale[rows] = log_scale[previous] + step_log[rows] + offset[rows]
    return alpha, log_scale, step_log


def _backward(lifted, offset, operator, end_lifted, end_log, layout: Layout, semiring, visit) -> np.ndarray:
    """The backward pass: normalised backward messages, handed over step by step from the last
    step to the first; returns their cumulative log normalisers (T,).

    beta[r] covers everything after the token of row r (its own emission excluded), end
    transition included; its true log is ``to_log(beta[r]) + log_scale[r]``. ``visit(t, beta_t,
    log_scale_t, weighted_t)`` gets the (n_t, S) messages of step t's rows, their (n_t,) log
    normalisers and, for t > 0, the messages times those rows' lifted emissions (None at t = 0).
    ``beta_t`` lies in a buffer the pass reuses two steps later: it is valid during the call
    only. No (T, S) array of messages is held.
    """
    log_scale = np.full(lifted.shape[0], end_log)
    steps = np.empty((2, int(layout.n_active[0])) + lifted.shape[1:])  # steps t and t - 1, by parity
    steps[(layout.n_steps - 1) % 2][:] = end_lifted
    for t in range(layout.n_steps - 1, 0, -1):
        following, n = layout.rows(t), int(layout.n_active[t])
        rows = layout.rows(t - 1, n)
        current, before = steps[t % 2][:n], steps[(t - 1) % 2][: int(layout.n_active[t - 1])]
        before[n:] = end_lifted  # the sequences that end at step t - 1
        weighted = semiring.times(current, lifted[following])
        norm = semiring.normalize(operator.at(following).backward(weighted), out=before[:n])[1]
        log_scale[rows] = log_scale[following] + offset[following] + norm
        visit(t, current, log_scale[following], weighted)
    visit(0, steps[0][: int(layout.n_active[0])], log_scale[layout.first_rows()], None)
    return log_scale


# log of the alpha-beta overlap below which an edge normaliser is taken from the full forward
# product: at 1e-50, the values flushed below 1e-75 change it by at most L * 1e-25 of itself
_LOG_SMALL_OVERLAP = np.log(1e-50)


def _step_counts(previous, following, row_overlap, row_step_log, operator, semiring) -> np.ndarray:
    """Expected transition counts (table shape) of one step's edges: ``previous`` (n, S) alpha of
    the rows before, ``following`` (n, S) lifted emissions times beta of the step's rows, their
    ``row_overlap`` (n,) ``to_log(dot(alpha, beta))`` and forward step normalisers (n,).

    Z_n = plus_ij previous_i table_ij following_j: the forward step into these rows gave alpha
    times its normaliser, so Z_n is that normaliser times plus_j alpha beta (no second pass of
    the forward product). A semiring that flushes tiny values loses up to L * FLUSH of that sum,
    so rows whose sum is small take the full product instead."""
    log_norm = row_overlap + row_step_log
    small = ~(row_overlap > _LOG_SMALL_OVERLAP)
    if small.any():
        full = semiring.plus(semiring.times(operator.forward(previous)[small], following[small]), axis=1)
        log_norm[small] = semiring.to_log(full)
    weighted = semiring.times(previous, semiring.weights(-log_norm)[:, None])
    return operator.counts(weighted, following)


@dataclass
class Posterior:
    """Results of forward-backward (in input order, or packed order when asked for).

    ``log_z`` (N,), ``marginals`` (T, L) node marginals p(y_t | x), ``transition_counts`` (L, L)
    expected transition counts summed over all edges (None when not asked for) (the operator's table shape), ``log_alpha``
    and ``log_beta`` (T, L) true log forward/backward messages (only when requested).
    """

    log_z: np.ndarray
    marginals: np.ndarray
    transition_counts: np.ndarray
    log_alpha: np.ndarray | None = None
    log_beta: np.ndarray | None = None
    scores: tuple | None = None  # the chain's (transitions, start, end), where a caller keeps them


def _closing(end, semiring):
    """The end scores lifted (1, S), and the log of what was taken out of them."""
    end_lifted, end_offset = semiring.from_log(np.array(end, dtype=np.float64)[None, :], inplace=True)
    end_lifted, end_norm = semiring.normalize(end_lifted)
    return end_lifted, end_norm[0] + end_offset[0]


def _log_z(alpha, alpha_scale, end_lifted, end_log, layout: Layout, semiring) -> np.ndarray:
    """log Z by rank from the forward messages of the last rows."""
    closing = semiring.normalize(semiring.times(alpha[layout.last_rows()], end_lifted))[1]
    return alpha_scale[layout.last_rows()] + closing + end_log


def _forward_backward_packed(packed, operator, start, end, layout: Layout, semiring, keep_messages, overwrite=False, counts=True):
    """Forward-backward in one semiring on packed emissions; results packed, ``log_z`` by rank.
    Sequences whose normalisers underflow (or are impossible) contribute no transition counts;
    with a ``semiring.fallback`` they get ``log_z`` NaN and :func:`forward_backward` recomputes them.

    The backward pass hands each step's messages on as it goes (to the alpha-beta overlaps, the
    edge counts, the kept log messages and the node marginals, which are written into the
    forward buffer's rows once nothing needs them), so no (T, S) array of them is held."""
    lifted, offset, lifted_operator = _lifted_scores(packed, operator, start, layout, semiring, overwrite)
    alpha, alpha_scale, step_log = _forward(lifted, offset, lifted_operator, layout, semiring)
    end_lifted, end_log = _closing(end, semiring)
    log_z = _log_z(alpha, alpha_scale, end_lifted, end_log, layout, semiring)
    overlap = np.empty(lifted.shape[0])  # to_log(dot(alpha, beta)) per row
    total = np.zeros(lifted_operator.total_shape) if counts else None
    log_alpha = np.empty_like(alpha) if keep_messages else None
    log_beta = np.empty_like(alpha) if keep_messages else None

    def edge_counts(forward: np.ndarray, t: int, weighted: np.ndarray, keep=slice(None)) -> np.ndarray:
        """Counts of the edges into step t (of the rows ``keep`` of the n_t sequences there)."""
        n, rows = weighted.shape[0], layout.rows(t)
        previous = forward[layout.rows(t - 1, n)][keep]
        step = lifted_operator.at(
            rows if isinstance(keep, slice) and keep == slice(None) else np.arange(rows.start, rows.stop)[keep]
        )
        return _step_counts(previous, weighted[keep], overlap[rows][keep], step_log[rows][keep], step, semiring)

    if keep_messages:  # before the node marginals take alpha's place
        with np.errstate(invalid="ignore"):
            np.add(semiring.to_log(alpha), alpha_scale[:, None], out=log_alpha)

    def visit(t: int, beta_t: np.ndarray, beta_scale_t: np.ndarray, weighted: np.ndarray | None) -> None:
        rows = layout.rows(t)
        alpha_t = alpha[rows]
        if keep_messages:
            log_beta[rows] = semiring.to_log(beta_t) + beta_scale_t[:, None]
        # alpha_t * beta_t, the node marginals unnormalised, go into alpha_t's rows: the edges
        # into step t + 1 have used them, those into step t use the rows before
        joint = semiring.times(alpha_t, beta_t, out=alpha_t)
        if total is not None:  # the edge counts need the overlaps step by step
            overlap[rows] = semiring.to_log(semiring.plus(joint, axis=1))
            if t > 0:
                total[...] += edge_counts(alpha, t, weighted)

    # messages are normalised: only a failed sequence (see below) gives NaN or inf in the pass,
    # and its results are redone
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        beta_scale = _backward(lifted, offset, lifted_operator, end_lifted[0], end_log, layout, semiring, visit)
        if total is None:  # alpha holds alpha * beta now: all rows' overlaps in one pass
            overlap[:] = semiring.to_log(semiring.plus(alpha, axis=1))
    with np.errstate(invalid="ignore"):
        marginals = semiring.to_prob(semiring.normalize(alpha)[0])
    failed = ~np.isfinite(log_z) | ~np.isfinite(beta_scale[layout.first_rows()])
    # every token's alpha * beta, times both scales, is Z in exact arithmetic; a token where it is
    # not (values a flushing semiring set to zero in one pass mattered later) fails its sequence,
    # which is then recomputed in the fallback semiring. A flush both passes share (see
    # ScaledSemiring) keeps the identity and is not caught here.
    if semiring.fallback is not None:
        with np.errstate(invalid="ignore"):
            agrees = np.isclose(overlap + alpha_scale + beta_scale, log_z[layout.rank_of_row], rtol=1e-9, atol=1e-6)
        failed[layout.rank_of_row[~agrees]] = True
    if total is not None and failed.any():
        # the counts above took in the failed sequences: count the others again, with the forward
        # messages recomputed (their buffer now holds the marginals) and a second backward pass
        healthy, forward = ~failed, _forward(lifted, offset, lifted_operator, layout, semiring)[0]
        total[...] = 0.0

        def recount(t: int, beta_t: np.ndarray, beta_scale_t: np.ndarray, weighted: np.ndarray | None) -> None:
            if t > 0:
                total[...] += edge_counts(forward, t, weighted, healthy[: weighted.shape[0]])

        _backward(lifted, offset, lifted_operator, end_lifted[0], end_log, layout, semiring, recount)
        del forward
    del lifted
    if semiring.fallback is not None:  # to be recomputed; in the exact semiring -inf means impossible
        log_z[failed] = np.nan
    return Posterior(log_z, marginals, None if total is None else lifted_operator.expand(total), log_alpha, log_beta)


def forward_backward(
    emissions: np.ndarray,
    transitions,
    start: np.ndarray,
    end: np.ndarray,
    lengths,
    keep_messages: bool = False,
    semiring=ScaledSemiring,
    packed: bool = False,
    allowed: np.ndarray | None = None,
    counts: bool = True,
    emissions_again: Callable[[], np.ndarray] | None = None,
) -> Posterior:
    """log Z, node marginals and expected transition counts for every sequence.

    Runs in ``semiring`` (scaled probabilities by default) and recomputes any sequence whose
    normalisers underflow in ``semiring.fallback`` (log space), so the result is finite for any
    finite scores. With ``packed=True`` the emissions (and ``allowed``) are already in the
    layout's packed order (see :class:`Layout`) and the per-token results stay in that order;
    ``log_z`` is always by sequence in input order. ``allowed`` (T, L) restricts every sum to
    the allowed paths (see the module docstring). ``emissions`` is not modified (unless
    ``emissions_again`` is given, below). With ``counts=False`` the expected transition counts
    (a quarter of the work when only marginals are wanted, as in tagging) are skipped and
    ``transition_counts`` is None.

    A candidate second-order lattice without counts (tagging: marginals, messages; tokens in input
    order, the default semiring) runs in the compiled log-space forward and backward of
    :mod:`crf._compiled` instead: exact, with no fallback.

    ``emissions_again``, a function returning the same packed emissions anew, lets the recursion
    use ``emissions`` (packed, float64, no ``allowed``) as its working memory instead of a copy:
    its values are then lost, and the function is called only if some sequences must be
    recomputed in the fallback semiring.
    """
    if emissions_again is not None and not (packed and allowed is None and np.asarray(emissions).dtype == np.float64):
        raise ValueError("emissions_again needs packed float64 emissions and no allowed mask")
    emissions = np.asarray(emissions, dtype=np.float64)
    layout, operator = _layout(lengths), _operator(transitions)
    if type(operator) is CandidateSecondOrderTransitions and semiring is ScaledSemiring and not (counts or packed):
        # tagging over a candidate lattice (marginals, segment confidence): the compiled log-space
        # recursions over each token's slots, exact with no fallback
        return _candidate_posterior(_masked(emissions, allowed, operator), operator, start, end, layout, keep_messages)

    def gather() -> np.ndarray:
        source = _masked(emissions, allowed, operator)
        return source if packed else source[layout.token_of_row]

    if not packed:  # an operator with per-token data takes it in the emissions' packed order
        operator = operator.take(layout.token_of_row)

    emissions_packed = gather()
    # a gathered or masked copy is ours to use as working memory, and so is the caller's array
    # when it can be made again
    own = emissions_packed is not emissions or emissions_again is not None
    if type(operator) is FirstOrderTransitions and semiring is ScaledSemiring:
        # the compiled kernel: no Python work per step, so one long sequence costs what its
        # tokens cost as sentences; the sequences it cannot scale are redone in log space below
        result = Posterior(
            *_compiled.forward_backward(
                emissions_packed,
                operator.scores,
                start,
                end,
                layout.step_start,
                layout.lengths[layout.order],
                counts,
                own,
                keep_messages,
            )
        )
    else:
        result = _forward_backward_packed(emissions_packed, operator, start, end, layout, semiring, keep_messages, own, counts)
    failed = np.flatnonzero(np.isnan(result.log_z))
    if failed.size and semiring.fallback is not None:
        if own:  # the working copy was consumed
            emissions_packed = gather() if emissions_again is None else np.asarray(emissions_again(), dtype=np.float64)
        rows, failed_lengths = layout.rows_of_ranks(failed)
        redo = forward_backward(
            emissions_packed[rows],
            operator.take(rows),
            start,
            end,
            failed_lengths,
            keep_messages,
            semiring.fallback,
            counts=counts,
        )
        result.log_z[failed] = redo.log_z
        result.marginals[rows] = redo.marginals
        if counts:
            result.transition_counts = result.transition_counts + redo.transition_counts
        if keep_messages:
            result.log_alpha[rows] = redo.log_alpha
            result.log_beta[rows] = redo.log_beta
    result.log_z = layout.unrank(result.log_z)
    if not packed:
        for name in ("marginals", "log_alpha", "log_beta"):
            values = getattr(result, name)
            if values is not None:
                setattr(result, name, layout.unpack(values))
    return result


def _slots(operator) -> tuple | None:
    """The per-token slot labels of a candidate lattice for :mod:`crf._compiled`'s kernels (None: first order)."""
    return (operator.labels, operator.before, operator.before2) if type(operator) is CandidateSecondOrderTransitions else None


def _candidate_posterior(emissions, operator, start, end, layout: Layout, keep_messages: bool) -> Posterior:
    """:func:`forward_backward`'s results (no counts, tokens in input order) of a candidate lattice,
    from the compiled log-space forward and backward recursions."""
    offsets = np.concatenate([[0], np.cumsum(layout.lengths)])
    slots = _slots(operator)
    final, log_alpha = _compiled.log_forward(emissions, operator.scores, start, offsets[:-1], offsets, slots, keep=True)
    log_beta = _compiled.log_backward(emissions, operator.scores, end, offsets, slots)
    log_z = _log_sum_exp(final + np.asarray(end, dtype=np.float64))
    # an impossible sequence (log Z -inf) gets zero marginals, as from the log-space fallback
    log_norm = np.where(np.isfinite(log_z), log_z, np.inf)[np.repeat(np.arange(layout.lengths.size), layout.lengths)]
    marginals = np.exp(log_alpha + log_beta - log_norm[:, None])
    if not keep_messages:
        log_alpha = log_beta = None
    return Posterior(log_z, marginals, None, log_alpha, log_beta)


def _log_sum_exp(values: np.ndarray) -> np.ndarray:
    """log sum exp of the rows of ``values`` (n, S), -inf for a row of -inf."""
    top = values.max(axis=1) if values.shape[1] else np.full(values.shape[0], -np.inf)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(values - safe[:, None]).sum(axis=1)) + safe


def log_partition(emissions, transitions, start, end, lengths, allowed=None) -> np.ndarray:
    """log Z(x) for every sequence (over the allowed paths when ``allowed`` is given), shape (N,)."""
    return forward_backward(emissions, transitions, start, end, lengths, allowed=allowed, counts=False).log_z


def edge_marginals(emissions, transitions, start, end, lengths) -> np.ndarray:
    """p(y_{t-1}=i, y_t=j | x) for every token, shape (T, L, L) (the operator's table shape
    after T); zeros for first tokens. Computed in log space: exact for any weights."""
    emissions = np.asarray(emissions, dtype=np.float64)
    layout, operator = _layout(lengths), _operator(transitions)
    semiring = LogSemiring
    operator = operator.take(layout.token_of_row)
    lifted, offset, lifted_operator = _lifted_scores(emissions[layout.token_of_row], operator, start, layout, semiring, True)
    alpha = _forward(lifted, offset, lifted_operator, layout, semiring)[0]
    end_lifted, end_log = _closing(end, semiring)
    packed = np.zeros((emissions.shape[0],) + lifted_operator.edge_shape)

    def store(t: int, beta_t: np.ndarray, beta_scale_t: np.ndarray, weighted: np.ndarray | None) -> None:
        if t > 0:  # alpha of the rows before, the table, and beta times the emissions of step t's rows
            previous = alpha[layout.rows(t - 1, weighted.shape[0])]
            step = lifted_operator.at(layout.rows(t))
            joint = semiring.times(semiring.times(step.source(previous), step.values), step.target(weighted))
            flat = semiring.normalize(joint.reshape(joint.shape[0], -1))[0]
            packed[layout.rows(t)] = semiring.to_prob(flat).reshape(joint.shape)

    _backward(lifted, offset, lifted_operator, end_lifted[0], end_log, layout, semiring, store)
    return layout.unpack(packed)


def entropy(emissions, transitions, start, end, lengths, allowed=None) -> np.ndarray:
    """Entropy H(y | x) of every sequence's label distribution (over the allowed paths), (N,):
    ``log Z - E[score(y)]``, the expectation from node and edge marginals. Exact (log space);
    for inspection (active learning, confidence), it holds the (T, table shape) edge marginals."""
    layout, operator = _layout(lengths), _operator(transitions)
    emissions = _masked(np.asarray(emissions, dtype=np.float64), allowed, operator)
    posterior = forward_backward(emissions, operator, start, end, layout, semiring=LogSemiring)
    edges = edge_marginals(emissions, operator, start, end, layout)
    offsets = np.concatenate([[0], np.cumsum(layout.lengths)])

    def expected(probabilities: np.ndarray, scores: np.ndarray) -> np.ndarray:  # 0 * -inf counts 0
        with np.errstate(invalid="ignore"):
            products = probabilities * scores
        return np.where(probabilities > 0, products, 0.0).reshape(probabilities.shape[0], -1).sum(axis=1)

    per_token = expected(posterior.marginals, emissions) + expected(edges, np.broadcast_to(operator.edge_table(), edges.shape))
    boundary = expected(posterior.marginals[offsets[:-1]], np.asarray(start)[None]) + expected(
        posterior.marginals[offsets[1:] - 1], np.asarray(end)[None]
    )
    return posterior.log_z - np.add.reduceat(per_token, offsets[:-1]) - boundary


# --- best paths -----------------------------------------------------------------------------


def _best_paths(emissions, transitions, start, end, lengths, allowed, semiring) -> tuple[np.ndarray, np.ndarray]:
    """The paths a selective semiring keeps (its V numbers per value: 1 for max-product, k for
    k-best): states (T, V) in input order and scores (N, V), best first, -inf if none."""
    emissions = np.asarray(emissions, dtype=np.float64)
    layout, operator = _layout(lengths), _operator(transitions)
    emissions = _masked(emissions, allowed, operator)
    operator = operator.take(layout.token_of_row)
    lifted, offset, lifted_operator = _lifted_scores(emissions[layout.token_of_row], operator, start, layout, semiring, True)
    alpha, log_scale, _ = _forward(lifted, offset, lifted_operator, layout, semiring)
    last = layout.last_rows()
    end_lifted, end_offset = semiring.from_log(np.array(end, dtype=np.float64)[None, :], inplace=True)
    closing = semiring.times(alpha[last], end_lifted)
    top, best = semiring.argtop(closing.reshape(last.size, -1))  # (N, V) each; best = state * V + rank
    scores_by_rank = log_scale[last][:, None] + semiring.to_log(top) + end_offset[0]
    size = top.shape[1]

    states = np.empty((lifted.shape[0], size), dtype=np.int64)
    ending = layout.lengths[layout.order] - 1  # last step of each rank
    current = np.zeros((last.size, size), dtype=np.int64)  # flat (state, rank) index per path
    for t in range(layout.n_steps - 1, -1, -1):
        n = int(layout.n_active[t])
        stops_here = ending[:n] == t
        current[:n][stops_here] = best[:n][stops_here]
        states[layout.rows(t)] = current[:n] // size
        if t > 0:  # the previous entries these paths came from (back pointers of the chosen entries only)
            current[:n] = lifted_operator.at(layout.rows(t, n)).pointers(alpha[layout.rows(t - 1, n)], current[:n])
    return layout.unpack(states), layout.unrank(scores_by_rank)


def _checked_offsets(lengths, emissions: np.ndarray) -> np.ndarray:
    """Where each sequence starts, and the end (N + 1,), of ``lengths`` that cover ``emissions``."""
    lengths = lengths.lengths if isinstance(lengths, Layout) else np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.min() <= 0:
        raise ValueError("lengths must be a non-empty 1-D array of positive integers")
    if int(lengths.sum()) != emissions.shape[0]:
        raise ValueError(f"the lengths add up to {int(lengths.sum())} tokens, the emissions have {emissions.shape[0]}")
    return np.concatenate([[0], np.cumsum(lengths)])


def viterbi(emissions, transitions, start, end, lengths, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """Best label sequence of every sequence: (labels (T,) in input order, scores (N,)).

    With ``allowed`` (T, L) the best among the allowed paths (score -inf if there is none).
    Ties go to the lowest label (as in CRFsuite). A first-order chain (an (L, L) matrix) and a
    candidate second-order lattice (its slots, tokens in input order) run in the one compiled
    Viterbi kernel of :mod:`crf._compiled`; other transition operators (exact second order) through the
    max-product semiring of the shared recursion."""
    operator = _operator(transitions)
    if type(operator) is FirstOrderTransitions:
        emissions = _masked(np.asarray(emissions, dtype=np.float64), allowed, operator)
        return _compiled.viterbi(emissions, operator.scores, start, end, _checked_offsets(lengths, emissions))
    if type(operator) is CandidateSecondOrderTransitions:  # the same kernel over each token's slots
        emissions = _masked(np.asarray(emissions, dtype=np.float64), allowed, operator)
        slots = (operator.labels, operator.before, operator.before2)
        return _compiled.viterbi(emissions, operator.scores, start, end, _checked_offsets(lengths, emissions), slots)
    states, scores = _best_paths(emissions, operator, start, end, lengths, allowed, MaxSemiring)
    return states[:, 0], scores[:, 0]


def kbest_viterbi(emissions, transitions, start, end, lengths, k: int, allowed=None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best label sequences of every sequence, best first (n-best decoding).

    Returns (labels (k, T): ``labels[j]`` is every sequence's (j+1)-th best labelling in input
    token order; scores (N, k)). A sequence with fewer than k paths (or allowed paths) gets
    score -inf and labels -1 in the missing places. Works for any transition operator (for
    :class:`SecondOrderTransitions` the labels are pair states, as with :func:`viterbi`); cost
    O(k log k) times Viterbi's per step.
    """
    states, scores = _best_paths(emissions, transitions, start, end, lengths, allowed, KMaxSemiring(k))
    layout = _layout(lengths)
    sequence_of_token = np.repeat(np.arange(layout.lengths.size), layout.lengths)
    states[~np.isfinite(scores[sequence_of_token])] = -1
    return np.ascontiguousarray(states.T), scores


# --- scores of given labellings and constrained spans ----------------------------------------


def sequence_scores(emissions, transitions, start, end, offsets, labels) -> np.ndarray:
    """score(y) of the given labelling of every sequence, shape (N,). ``labels`` (T,) are states
    of the operator (labels for a first-order chain; see its ``edge_scores``)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    n_tokens = labels.size
    token_scores = emissions[np.arange(n_tokens), labels]
    is_first = np.zeros(n_tokens, dtype=bool)
    is_first[offsets[:-1]] = True
    previous = np.where(is_first, labels, np.roll(labels, 1))  # a first token's own state: any edge will do
    edges = _operator(transitions).edge_scores(previous, labels)
    token_scores = token_scores + np.where(is_first, np.asarray(start)[labels], edges)
    totals = np.add.reduceat(token_scores, offsets[:-1])
    return totals + end[labels[offsets[1:] - 1]]


def constrained_log_probability(
    log_alpha: np.ndarray,
    log_beta: np.ndarray,
    log_z: np.ndarray,
    emissions: np.ndarray,
    transitions: np.ndarray,
    start: np.ndarray,
    offsets: np.ndarray,
    sequence: np.ndarray,
    first: np.ndarray,
    allowed: np.ndarray,
    window_offsets: np.ndarray,
) -> np.ndarray:
    """log p(y_t in allowed_t for every t in a window | x), for many windows at once.

    Constrained forward-backward (Culotta & McCallum 2004): the forward recursion is re-run only
    inside each window with the emissions of disallowed labels masked out, started from the
    unconstrained forward message of the token before the window (or ``start``) and closed with
    the unconstrained backward message of the window's last token.

    ``log_alpha``, ``log_beta`` (T, S) and ``log_z`` (N,) come from :func:`forward_backward`
    with ``keep_messages=True``. Window k lies in sequence ``sequence[k]`` from its token
    ``first[k]`` on; its allowed-label masks are ``allowed[window_offsets[k]:window_offsets[k+1]]``
    (a (W, L) boolean array over all windows, or (W, S) per state; a per-label mask of a
    pair-state chain allows every state of the label). Returns (K,) log probabilities.

    A first-order chain and a candidate second-order lattice run all windows in the one compiled
    log-space forward of :func:`crf._compiled.log_forward` (tokens in input order; the one that
    computes a candidate lattice's tagging messages); other operators (exact second order) through
    the shared recursion in the log semiring.
    """
    sequence = np.asarray(sequence, dtype=np.int64)
    first = np.asarray(first, dtype=np.int64)
    widths = np.diff(window_offsets)
    starts = offsets[sequence] + first
    if np.any(first < 0) or np.any(starts + widths > offsets[sequence + 1]):
        raise ValueError("a window runs outside its sequence")
    window_tokens = np.repeat(starts, widths) + (np.arange(widths.sum()) - np.repeat(window_offsets[:-1], widths))
    semiring, operator = LogSemiring, _operator(transitions)
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.shape[1:] != emissions.shape[1:]:  # per label: every state of the label
        allowed = operator.label_mask(allowed, window_tokens)
    if type(operator) in (FirstOrderTransitions, CandidateSecondOrderTransitions):
        # the compiled log-space forward over all windows at once (tokens in input order)
        if np.any(widths <= 0):
            raise ValueError("a window has no tokens")
        emissions = np.asarray(emissions, dtype=np.float64)
        final, _ = _compiled.log_forward(
            emissions, operator.scores, start, starts, window_offsets, _slots(operator), allowed, log_alpha, first > 0
        )
        closing = _log_sum_exp(final + log_beta[starts + widths - 1])
        return _log_share(closing, log_z[sequence])
    masked = np.where(allowed, emissions[window_tokens], -np.inf)
    column_top, lifted_operator = operator.lift(semiring)
    # the incoming message of each window, folded into its first token's emissions
    incoming = np.tile(start, (sequence.size, 1))
    inner = first > 0
    entering = starts[inner]
    column_top = np.broadcast_to(column_top, emissions.shape)[entering]
    incoming[inner] = lifted_operator.at(entering).forward(log_alpha[entering - 1]) + column_top
    masked[window_offsets[:-1]] += incoming
    layout = Layout.from_lengths(widths)
    # windows start from their own incoming message, so "start" is already in `masked`
    lifted, offset, lifted_operator = _lifted_scores(
        masked[layout.token_of_row], operator.take(window_tokens[layout.token_of_row]), np.zeros_like(start), layout, semiring
    )
    alpha, log_scale, _ = _forward(lifted, offset, lifted_operator, layout, semiring)
    last = layout.last_rows()
    window_last_token = window_tokens[window_offsets[1:] - 1][layout.order]
    closing = semiring.plus(semiring.times(alpha[last], log_beta[window_last_token]), axis=1)
    by_rank = _log_share(log_scale[last] + closing, log_z[sequence[layout.order]])
    return layout.unrank(by_rank)


def _log_share(log_part: np.ndarray, log_z: np.ndarray) -> np.ndarray:
    """log(part / Z) per window: -inf (probability 0) where the sequence itself is impossible
    (log Z = -inf), not the NaN of -inf - -inf."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isneginf(log_z), -np.inf, log_part - log_z)

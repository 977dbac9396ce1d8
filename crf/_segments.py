"""Segment queries of a fitted :class:`crf.CRF`: constrained forward-backward over windows of
labels, and every predicted chunk with its confidence (Culotta & McCallum 2004)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from . import _chain as chain
from . import metrics
from ._layout import positions_within


@dataclass
class ChunkWindows:
    """The chunks of a labelling and what defines their confidence: a chunk's window is its
    tokens with exactly their labels, plus the token before (any label that does not extend the
    chunk: ``before_masks``) and the token after (any label that does not continue it:
    ``after_masks``), as :meth:`crf.CRF.predict_segments` reports them.

    ``chunks``: frame with sequence, start, end (exclusive), type (K rows); ``first``/``stop``
    (K,) flat token indices of each chunk's first token and one past its last; ``before``/``after``
    (K,) whether the window has a token before/after the chunk; ``before_masks``/``after_masks``
    (K, L) allowed labels there (rows without such a token are unused).
    """

    chunks: pd.DataFrame
    first: np.ndarray
    stop: np.ndarray
    before: np.ndarray
    after: np.ndarray
    before_masks: np.ndarray
    after_masks: np.ndarray

    @classmethod
    def of(cls, codes: np.ndarray, offsets: np.ndarray, classes: Sequence[str]) -> ChunkWindows:
        """Chunks of ``codes`` (T,) over sentences at ``offsets`` (N + 1,), all at once."""
        L = len(classes)
        found = metrics._chunks_flat(np.asarray(classes, dtype=object)[codes], offsets)
        tags, types = zip(*(metrics.split_label(c) for c in classes))
        tags, types = np.array(tags), np.array(types)
        row_tags, column_tags = np.broadcast_arrays(tags[:, None], tags[None, :])
        row_types, column_types = np.broadcast_arrays(types[:, None], types[None, :])
        # starts[first, prev]: a chunk starting with label `first` starts after label `prev`
        starts = metrics.chunk_start(column_tags, row_tags, column_types, row_types)
        # ends[last, next]: a chunk ending with label `last` ends before label `next`
        ends = metrics.chunk_end(row_tags, column_tags, row_types, column_types)
        sequence = found["sequence"].to_numpy(np.int64)
        first = offsets[sequence] + found["start"].to_numpy(np.int64)
        stop = offsets[sequence] + found["end"].to_numpy(np.int64)
        before = first > offsets[sequence]
        after = stop < offsets[sequence + 1]
        return cls(found, first, stop, before, after, starts[codes[first]].reshape(-1, L), ends[codes[stop - 1]].reshape(-1, L))

    def window_masks(self, codes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The windows as :func:`crf._chain.constrained_log_probability` takes them: (first token
        of each window within its sequence (K,), masks (W, L), window offsets (K + 1,))."""
        K, L = self.first.size, self.before_masks.shape[1]
        inside = self.stop - self.first
        widths = inside + self.before + self.after
        window_offsets = np.concatenate([[0], np.cumsum(widths)])
        masks = np.zeros((int(window_offsets[-1]), L), dtype=bool)
        chunk_of_row = np.repeat(np.arange(K), inside)
        within = positions_within(inside)
        tokens = self.first[chunk_of_row] + within
        masks[window_offsets[chunk_of_row] + self.before[chunk_of_row] + within, codes[tokens]] = True
        masks[window_offsets[:-1][self.before]] = self.before_masks[self.before]
        masks[window_offsets[1:][self.after] - 1] = self.after_masks[self.after]
        sequence = self.chunks["sequence"].to_numpy(np.int64)
        return self.first - self.before - offsets[sequence], masks, window_offsets

    def log_probability(self, codes, posterior: chain.Posterior, emissions, transitions, start) -> np.ndarray:
        """log p(window k | x) (K,) for a first-order chain over labels ((L, L) ``transitions``), in closed
        form: the chunk's labels are fixed, so the constrained forward recursion over its window
        reduces to a sum of scores plus one log-sum-exp at each end. The same quantity as
        :func:`crf._chain.constrained_log_probability` on :meth:`window_masks`, without a
        recursion over the windows. ``posterior``: forward-backward with ``keep_messages``."""
        first, stop = self.first, self.stop
        inside = stop - first
        chunk_of_token = np.repeat(np.arange(first.size), inside)
        tokens = np.repeat(first, inside) + positions_within(inside)
        labels = codes[tokens]
        score = emissions[tokens, labels]
        follows = tokens > np.repeat(first, inside)
        score[follows] += transitions[codes[tokens[follows] - 1], labels[follows]]
        total = np.bincount(chunk_of_token, weights=score, minlength=first.size)
        log_alpha, log_beta = posterior.log_alpha, posterior.log_beta
        head, tail = codes[first], codes[stop - 1]
        opening = np.asarray(start, dtype=np.float64)[head].copy()
        b = self.before
        with np.errstate(invalid="ignore", divide="ignore"):
            entering = np.where(self.before_masks[b], log_alpha[first[b] - 1] + transitions[:, head[b]].T, -np.inf)
            opening[b] = logsumexp(entering, axis=1)
            closing = log_beta[stop - 1, tail]
            a = self.after
            leaving = transitions[tail[a]] + emissions[stop[a]] + log_beta[stop[a]]
            closing[a] = logsumexp(np.where(self.after_masks[a], leaving, -np.inf), axis=1)
            # a sentence of probability 0 (log_z -inf) gets NaN, as the recursion gives it
            return opening + total + closing - posterior.log_z[self.chunks["sequence"].to_numpy(np.int64)]


class SegmentQueries:
    """Mixin of :class:`crf.CRF`: needs ``chain_inputs``, ``_chain_of``, ``state_weights_`` and ``classes_``."""

    def span_probability(self, X, sequence: Sequence[int], start: Sequence[int], allowed: Sequence[np.ndarray]) -> np.ndarray:
        """Constrained forward-backward: p(y_t in allowed_t for the window of each query | x).

        Query k covers tokens ``start[k] : start[k] + len(allowed[k])`` of sequence
        ``sequence[k]``; ``allowed[k]`` is a (width, L) boolean mask over ``classes_``.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all).
        sequence : sequence of int, length K
            The sequence of each query (0-based, in ``X``).
        start : sequence of int, length K
            The first token of each window, within its sequence (0-based).
        allowed : sequence of K ndarrays of shape (width_k, L), bool
            The labels each token of the window may take, columns in ``classes_`` order.

        Returns
        -------
        ndarray of shape (K,), float64
            The probability of each query (0 for an empty query list).

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`crf.CRF.emissions`.
        """
        emissions, scores, batch = self.chain_inputs(X)
        posterior = chain.forward_backward(emissions, *scores, batch.lengths, keep_messages=True, counts=False)
        return np.exp(self._constrained(posterior, emissions, scores, batch, sequence, start, allowed))

    def _constrained(self, posterior, emissions, scores, batch, sequence, start, allowed) -> np.ndarray:
        if len(sequence) == 0:
            return np.zeros(0)
        widths = np.array([len(a) for a in allowed], dtype=np.int64)
        window_offsets = np.concatenate([[0], np.cumsum(widths)])
        masks = np.concatenate([np.asarray(a, dtype=bool) for a in allowed])
        return chain.constrained_log_probability(
            posterior.log_alpha,
            posterior.log_beta,
            posterior.log_z,
            emissions,
            scores[0],
            scores[1],
            batch.offsets,
            np.asarray(sequence),
            np.asarray(start),
            masks,
            window_offsets,
        )

    def predict_segments(self, X) -> pd.DataFrame:
        """Predicted chunks/entities with their confidence.

        One row per chunk of the Viterbi labelling (conlleval's chunk rules): ``sequence``,
        ``start``, ``end`` (exclusive), ``type`` and ``confidence``: the probability under the model
        that the chunk's tokens carry exactly their predicted labels, that the token before does
        not extend the chunk and that the token after does not continue it (constrained
        forward-backward over that window, Culotta & McCallum 2004).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all).

        Returns
        -------
        pandas.DataFrame
            One row per chunk: ``sequence`` (index in ``X``), ``start``, ``end`` (exclusive;
            token positions within the sequence), ``type`` (str) and ``confidence`` (0 to 1).

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`crf.CRF.emissions`.
        """
        emissions, scores, batch = self.chain_inputs(X)
        states, _ = chain.viterbi(emissions, *scores, batch.lengths)
        labels = chain.operator_of(scores[0]).labels_at(states)
        posterior = chain.forward_backward(emissions, *scores, batch.lengths, keep_messages=True, counts=False)
        posterior.scores = scores
        return self.segments_of(labels, emissions, batch, posterior)

    def segments_of(self, labels: np.ndarray, emissions: np.ndarray, batch, posterior=None) -> pd.DataFrame:
        """The chunks of the labelling ``labels`` with their confidence, as :meth:`predict_segments`
        gives them.

        A first-order chain (states are labels) takes the closed form of
        :meth:`ChunkWindows.log_probability`, any other constrained forward-backward.

        Parameters
        ----------
        labels : ndarray of shape (T,), int
            Label indices in ``classes_`` (e.g. ``predict_codes``', concatenated).
        emissions : ndarray of shape (T, S), float64
            The chain's per-state emissions, as :meth:`posterior` returns them.
        batch : SequenceBatch
            The batch, as :meth:`posterior` returns it.
        posterior : crf._chain.Posterior, optional
            :meth:`posterior`'s, with ``keep_messages=True``, when the caller has it, so that
            forward-backward is not run twice; None: run here.

        Returns
        -------
        pandas.DataFrame
            As :meth:`predict_segments`.
        """
        windows = ChunkWindows.of(labels, batch.offsets, self.classes_)
        found = windows.chunks.reset_index(drop=True)
        if found.empty:
            found["confidence"] = []
            return found
        if posterior is None or posterior.log_alpha is None or posterior.scores is None:
            # the chain's scores for these emissions (a candidate-lattice model's depend on the batch)
            _, scores = self._chain_of(np.asarray(batch.X @ self.state_weights_), batch.X, batch.lengths)
            posterior = chain.forward_backward(emissions, *scores, batch.lengths, keep_messages=True, counts=False)
            posterior.scores = scores
        transitions, start, _ = posterior.scores
        if emissions.shape[1] == len(self.classes_):
            log_p = windows.log_probability(labels, posterior, emissions, transitions, start)
        else:
            first, masks, window_offsets = windows.window_masks(labels, batch.offsets)
            sequence = found["sequence"].to_numpy(np.int64)
            with np.errstate(invalid="ignore"):
                log_p = chain.constrained_log_probability(
                    posterior.log_alpha, posterior.log_beta, posterior.log_z, emissions, transitions, start,
                    batch.offsets, sequence, first, masks, window_offsets,
                )  # fmt: skip
        found["confidence"] = np.exp(log_p)
        return found

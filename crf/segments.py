"""Segment queries of a fitted :class:`crf.CRF`: constrained forward-backward over windows of
labels, and every predicted chunk with its confidence (Culotta & McCallum 2004)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from . import chain, metrics


class SegmentQueries:
    """Mixin of :class:`crf.CRF`: needs ``emissions``, ``_weights``, ``_split`` and ``classes_``."""

    def span_probability(self, X, sequence: Sequence[int], start: Sequence[int], allowed: Sequence[np.ndarray]) -> np.ndarray:
        """Constrained forward-backward: p(y_t in allowed_t for the window of each query | x).

        Query k covers tokens ``start[k] : start[k] + len(allowed[k])`` of sequence
        ``sequence[k]``; ``allowed[k]`` is a (width, L) boolean mask over ``classes_``.
        Returns (K,) probabilities.
        """
        emissions, batch = self.emissions(X)
        posterior = chain.forward_backward(emissions, *self._weights(), batch.lengths, keep_messages=True)
        return np.exp(self._constrained(posterior, emissions, batch, sequence, start, allowed))

    def _constrained(self, posterior, emissions, batch, sequence, start, allowed) -> np.ndarray:
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
            self.transitions_,
            self.start_weights_,
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
        """
        emissions, batch = self.emissions(X)
        labels, _ = chain.viterbi(emissions, *self._weights(), batch.lengths)
        classes = np.array(self.classes_, dtype=object)
        predicted = [list(classes[p]) for p in self._split(labels, batch)]
        found = metrics.chunks(predicted)
        if found.empty:
            found["confidence"] = []
            return found
        posterior = chain.forward_backward(emissions, *self._weights(), batch.lengths, keep_messages=True)
        tags, types = zip(*(metrics.split_label(c) for c in self.classes_))
        tags, types = np.array(tags), np.array(types)
        lengths = batch.lengths
        seqs, firsts, allowed = [], [], []
        for seq, s, e in zip(found["sequence"].to_numpy(), found["start"].to_numpy(), found["end"].to_numpy()):
            offset = batch.offsets[seq]
            inside = labels[offset + s : offset + e]
            rows = [np.arange(len(classes))[None, :] == inside[:, None]]
            window_start = s
            if s > 0:  # the previous token must not belong to this chunk
                first = inside[0]
                rows.insert(0, metrics.chunk_start(tags, tags[first], types, types[first])[None, :])
                window_start = s - 1
            if e < lengths[seq]:  # the next token must not continue it
                last = inside[-1]
                rows.append(metrics.chunk_end(tags[last], tags, types[last], types)[None, :])
            seqs.append(seq)
            firsts.append(window_start)
            allowed.append(np.concatenate(rows))
        found["confidence"] = np.exp(self._constrained(posterior, emissions, batch, seqs, firsts, allowed))
        return found

"""Time-major packing of many sequences for the vectorised chain recursions.

Sequences are sorted by length (longest first) and tokens stored time-major: the rows of step t
are the t-th tokens of the sequences longer than t, and the first rows of step t continue the
first rows of step t-1. A recursion is then a Python loop over time steps whose body works on
contiguous blocks; there is no loop over sequences or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def positions_within(counts) -> np.ndarray:
    """For consecutive groups of ``counts`` (G,) items: each item's position in its group, shape
    (sum(counts),); e.g. counts [2, 3] -> [0, 1, 0, 1, 2]."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


@dataclass
class Layout:
    """Packed time-major order for sequences of the given lengths.

    ``order`` (N,): sequence indices by decreasing length (ties keep input order).
    ``n_active`` (S,): sequences longer than t, for each step t < S = max length.
    ``step_start`` (S + 1,): first packed row of each step.
    ``token_of_row`` (T,): token row (in input order) stored at each packed row.
    ``rank_of_row`` (T,): position in ``order`` of the sequence of each packed row.
    """

    lengths: np.ndarray
    order: np.ndarray
    n_active: np.ndarray
    step_start: np.ndarray
    token_of_row: np.ndarray
    rank_of_row: np.ndarray

    @classmethod
    def from_lengths(cls, lengths) -> Layout:
        """The layout of sequences of ``lengths`` (N,) positive integers."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or lengths.size == 0 or np.any(lengths <= 0):
            raise ValueError("lengths must be a non-empty 1-D array of positive integers")
        order = np.argsort(-lengths, kind="stable")
        steps = int(lengths.max())
        at_most = np.cumsum(np.bincount(lengths, minlength=steps + 1))[:steps]
        n_active = lengths.size - at_most  # number of sequences with length > t
        step_start = np.concatenate([[0], np.cumsum(n_active)])
        total = int(step_start[-1])
        step_of_row = np.repeat(np.arange(steps), n_active)
        rank_of_row = np.arange(total) - step_start[step_of_row]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        token_of_row = offsets[order[rank_of_row]] + step_of_row
        return cls(lengths, order, n_active, step_start, token_of_row, rank_of_row)

    @property
    def n_steps(self) -> int:
        return int(self.n_active.size)

    def rows(self, t: int, count: int | None = None) -> slice:
        """Packed rows of step t (the first ``count`` of them)."""
        start = int(self.step_start[t])
        return slice(start, start + int(self.n_active[t] if count is None else count))

    def first_rows(self) -> slice:
        return self.rows(0)

    def last_rows(self) -> np.ndarray:
        """Packed row of the last token of each sequence, by rank (N,)."""
        ranks = np.arange(self.lengths.size)
        return self.step_start[self.lengths[self.order] - 1] + ranks

    def rows_of_ranks(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Packed rows of the sequences at ``ranks``, each sequence's tokens in order; and lengths."""
        lengths = self.lengths[self.order[ranks]]
        steps = positions_within(lengths)
        return self.step_start[steps] + np.repeat(ranks, lengths), lengths

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Per-row values (T, ...) in packed order, back in input token order."""
        out = np.empty_like(packed)
        out[self.token_of_row] = packed
        return out

    def unrank(self, by_rank: np.ndarray) -> np.ndarray:
        """Per-sequence values (N, ...) by rank, back in input sequence order."""
        out = np.empty_like(by_rank)
        out[self.order] = by_rank
        return out

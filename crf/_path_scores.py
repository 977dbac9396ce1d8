"""The score of a given labelling under a chain's scores (any order, over candidate labels or all)."""

from __future__ import annotations

import numpy as np

from . import _chain as chain


def path_scores(emissions: np.ndarray, scores: tuple, offsets: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """score(y) of every sequence.

    Parameters
    ----------
    emissions : (T, S) per-state emission scores.
    scores : the chain's (transitions or transition operator, start (S,), end (S,)).
    offsets : (N + 1,) where each sequence starts in the T tokens.
    codes : (T,) label index of every token.

    Returns
    -------
    ndarray (N,)
        The labelling's score; -inf where the chain has no state for it (a candidate lattice).
    """
    first = np.zeros(codes.size, dtype=bool)
    first[offsets[:-1][offsets[:-1] < codes.size]] = True
    states = chain.operator_of(scores[0]).states_of_labels(codes, first)
    missing = np.add.reduceat((states < 0).astype(np.int64), offsets[:-1]) > 0 if codes.size else np.zeros(0, dtype=bool)
    with np.errstate(invalid="ignore"):
        out = chain.sequence_scores(emissions, *scores, offsets, np.maximum(states, 0))
    return np.where(missing, -np.inf, out)

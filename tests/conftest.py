"""Shared test helpers: the shared data folder and small random chain models."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the checkout; tests needing it skip when it is absent."""
    if not (SHARED_DATA / "conll2000" / "train.txt.gz").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA} (expected ../shared/data beside the checkout)")
    return SHARED_DATA


def random_chain(seed: int, n_labels: int, lengths, scale: float = 1.0):
    """Random emissions (T, L), transitions (L, L), start and end (L,) with the given scale."""
    rng = np.random.default_rng(seed)
    total = int(np.sum(lengths))
    return (
        scale * rng.normal(size=(total, n_labels)),
        scale * rng.normal(size=(n_labels, n_labels)),
        scale * rng.normal(size=n_labels),
        scale * rng.normal(size=n_labels),
    )


def enumerate_paths(emissions, transitions, start, end):
    """Every label sequence of one sequence with its score: (paths (K, n), scores (K,))."""
    n, L = emissions.shape
    paths = np.array(list(itertools.product(range(L), repeat=n)), dtype=np.int64)
    scores = start[paths[:, 0]] + end[paths[:, -1]] + emissions[np.arange(n), paths].sum(axis=1)
    if n > 1:
        scores = scores + transitions[paths[:, :-1], paths[:, 1:]].sum(axis=1)
    return paths, scores

"""How sure a CRF is of each sequence: the figures active-learning query strategies rank by.

All come from one forward-backward (log Z and the token marginals) and one k-best Viterbi pass
over a batch: the probability of the best path (least confidence: 1 - p), the margin between the
two best paths, the entropies of the token marginals (Settles and Craven's total token entropy
is their sum), the entropy of the label distribution of the whole sequence, and the entropy of
the N best paths renormalised among themselves (N-best sequence entropy). Entropies are in nats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import chain


@dataclass
class Uncertainty:
    """Per-sequence figures (N,) and per-token marginal entropies (T,) of a batch."""

    best_probability: np.ndarray  # p(best path | x)
    margin: np.ndarray  # p(best) - p(second best); p(best) when there is one path only
    token_entropy: np.ndarray  # (T,) entropy of each token's marginal distribution
    total_token_entropy: np.ndarray  # sum over the sequence's tokens
    nbest_entropy: np.ndarray  # entropy of the N best paths' probabilities, renormalised
    offsets: np.ndarray  # (N + 1,) token offsets of the sequences

    def frame(self) -> pd.DataFrame:
        """One row per sequence: ``best_probability``, ``margin``, ``total_token_entropy``,
        ``nbest_entropy`` and ``tokens``."""
        return pd.DataFrame(
            {
                "best_probability": self.best_probability,
                "margin": self.margin,
                "total_token_entropy": self.total_token_entropy,
                "nbest_entropy": self.nbest_entropy,
                "tokens": np.diff(self.offsets),
            }
        )


def marginal_entropy(marginals: np.ndarray) -> np.ndarray:
    """Entropy of every row of ``marginals`` (T, L), in nats (0 log 0 counts 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(marginals > 0, marginals * np.log(marginals), 0.0)
    return -terms.sum(axis=1)


def path_entropy(log_probabilities: np.ndarray) -> np.ndarray:
    """Entropy (N,) of each row of path log-probabilities (N, k), renormalised over its finite
    entries (the paths a sequence has among the k)."""
    finite = np.isfinite(log_probabilities)
    shifted = np.where(finite, log_probabilities - np.max(np.where(finite, log_probabilities, -np.inf), axis=1)[:, None], -np.inf)
    weights = np.exp(shifted)
    q = weights / weights.sum(axis=1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(q > 0, q * np.log(q), 0.0).sum(axis=1)


class UncertaintyQueries:
    """Mixin of :class:`crf.CRF`: needs ``emissions`` and ``_weights``."""

    def uncertainty(self, X, n_best: int = 5) -> Uncertainty:
        """The :class:`Uncertainty` figures of every sequence of ``X`` (a SequenceBatch or lists
        of token features without empty sequences), from one forward-backward and one
        ``max(n_best, 2)``-best Viterbi pass."""
        if int(n_best) < 1:
            raise ValueError(f"n_best must be at least 1, got {n_best!r}")
        emissions, batch = self.emissions(X)
        if np.any(batch.lengths == 0):
            raise ValueError("uncertainty needs sequences of at least one token")
        weights = self._weights()
        posterior = chain.forward_backward(emissions, *weights, batch.lengths, counts=False)
        _, scores = chain.kbest_viterbi(emissions, *weights, batch.lengths, max(int(n_best), 2))
        log_p = scores - posterior.log_z[:, None]  # (N, k) path log-probabilities, -inf where none
        p = np.exp(log_p)
        token = marginal_entropy(posterior.marginals)
        return Uncertainty(
            best_probability=p[:, 0],
            margin=p[:, 0] - p[:, 1],
            token_entropy=token,
            total_token_entropy=np.add.reduceat(token, batch.offsets[:-1]) if token.size else np.zeros(0),
            nbest_entropy=path_entropy(log_p[:, : int(n_best)]),
            offsets=batch.offsets,
        )

    def best_path_probability(self, X) -> np.ndarray:
        """p(best path | x) of every sequence (N,): 1 minus it is least confidence."""
        return self.uncertainty(X, n_best=2).best_probability

    def best_path_margin(self, X) -> np.ndarray:
        """p(best path | x) - p(second best path | x) of every sequence (N,)."""
        return self.uncertainty(X, n_best=2).margin

    def token_entropies(self, X) -> list[np.ndarray]:
        """The entropy of each token's marginal distribution, per sequence (a list of (n_i,))."""
        figures = self.uncertainty(X, n_best=2)
        return [figures.token_entropy[a:b] for a, b in zip(figures.offsets[:-1], figures.offsets[1:])]

    def sequence_entropy(self, X) -> np.ndarray:
        """H(y | x) of every sequence (N,), over all its label sequences (exact, in nats)."""
        emissions, batch = self.emissions(X)
        return chain.entropy(emissions, *self._weights(), batch.lengths)

    def nbest_entropy(self, X, n_best: int = 5) -> np.ndarray:
        """Entropy of the ``n_best`` best paths of every sequence (N,), their probabilities
        renormalised among themselves (Settles and Craven's N-best sequence entropy)."""
        return self.uncertainty(X, n_best=n_best).nbest_entropy

"""How sure a CRF is of each sequence: the figures active-learning query strategies rank by.

Each comes from one or two passes over a batch (see :meth:`UncertaintyQueries.uncertainty`):
the probability of the best path (least confidence: 1 - p), the margin between the
two best paths, the entropies of the token marginals (Settles and Craven's total token entropy
is their sum), the entropy of the label distribution of the whole sequence, and the entropy of
the N best paths renormalised among themselves (N-best sequence entropy). Entropies are in nats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _chain as chain
from ._semirings import MaxSemiring

FIGURES = ("best_probability", "margin", "token_entropy", "nbest_entropy")


@dataclass
class Uncertainty:
    """Per-sequence figures (N,) and per-token marginal entropies (T,) of a batch; a figure that
    was not asked for is None. Entropies are in nats.

    Parameters
    ----------
    offsets : ndarray of shape (N + 1,), int
        Token offsets of the N sequences.
    best_probability : ndarray of shape (N,), float64, optional
        p(best path | x).
    margin : ndarray of shape (N,), float64, optional
        p(best) - p(second best); p(best) when there is one path only.
    token_entropy : ndarray of shape (T,), float64, optional
        Entropy of each token's marginal distribution.
    total_token_entropy : ndarray of shape (N,), float64, optional
        The sum of ``token_entropy`` over each sequence's tokens.
    nbest_entropy : ndarray of shape (N,), float64, optional
        Entropy of the N best paths' probabilities, renormalised among themselves.
    """

    offsets: np.ndarray  # (N + 1,) token offsets of the sequences
    best_probability: np.ndarray | None = None  # p(best path | x)
    margin: np.ndarray | None = None  # p(best) - p(second best); p(best) when there is one path only
    token_entropy: np.ndarray | None = None  # (T,) entropy of each token's marginal distribution
    total_token_entropy: np.ndarray | None = None  # sum over the sequence's tokens
    nbest_entropy: np.ndarray | None = None  # entropy of the N best paths' probabilities, renormalised

    def frame(self) -> pd.DataFrame:
        """One row per sequence: the figures computed and ``tokens``.

        Returns
        -------
        pandas.DataFrame
            N rows; columns ``best_probability``, ``margin``, ``total_token_entropy``,
            ``nbest_entropy`` (those computed) and ``tokens`` (the sequence's length).
        """
        columns = {
            name: getattr(self, name)
            for name in ("best_probability", "margin", "total_token_entropy", "nbest_entropy")
            if getattr(self, name) is not None
        }
        return pd.DataFrame({**columns, "tokens": np.diff(self.offsets)})


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
    """Mixin of :class:`crf.CRF`: needs ``chain_inputs`` and ``_label_marginals``."""

    def uncertainty(self, X, n_best: int = 5, figures=FIGURES) -> Uncertainty:
        """The :class:`Uncertainty` ``figures`` (names of its fields; ``token_entropy`` gives the
        total too) of every sequence of ``X`` (a SequenceBatch or lists of token features, no
        empty sequence). Each costs one pass over the batch, shared where they can be: log Z and
        the token marginals by forward-backward; the best path and, from max-marginals, the
        second best by max-product forward-backward (the second best path leaves the best one at
        some token, so its score is the highest max-marginal of a label off the best path); the
        N best paths by k-best Viterbi (the costliest: about ``n_best`` times Viterbi's work).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all), no empty sequence.
        n_best : int, default=5
            The number of best paths ``nbest_entropy`` renormalises over (at least 1).
        figures : iterable of str, default=FIGURES
            Any of ``"best_probability"``, ``"margin"``, ``"token_entropy"``, ``"nbest_entropy"``.

        Returns
        -------
        Uncertainty
            The figures asked for (the others None); entropies in nats.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            An empty sequence, an unknown figure or ``n_best < 1``; or as :meth:`crf.CRF.emissions`.
        """
        unknown = set(figures) - set(FIGURES)
        if unknown:
            raise ValueError(f"unknown uncertainty figures {sorted(unknown)}; one of {', '.join(FIGURES)}")
        if int(n_best) < 1:
            raise ValueError(f"n_best must be at least 1, got {n_best!r}")
        emissions, weights, batch = self.chain_inputs(X)
        if np.any(batch.lengths == 0):
            raise ValueError("uncertainty needs sequences of at least one token")
        out = Uncertainty(offsets=batch.offsets)
        posterior = chain.forward_backward(emissions, *weights, batch.lengths, counts=False)
        if "token_entropy" in figures:
            out.token_entropy = marginal_entropy(self._label_marginals(posterior.marginals, weights[0]))
            out.total_token_entropy = np.add.reduceat(out.token_entropy, batch.offsets[:-1])
        if "best_probability" in figures or "margin" in figures:
            best = chain.forward_backward(emissions, *weights, batch.lengths, counts=False, semiring=MaxSemiring)
            out.best_probability = np.exp(best.log_z - posterior.log_z)
            if "margin" in figures:
                # per token, the largest max-marginal of a label off the best path, relative to it
                by_label = self._label_marginals(best.marginals, weights[0], np.maximum)
                if by_label.shape[1] > 1:
                    second = np.partition(by_label, -2, axis=1)[:, -2]
                    ratio = np.maximum.reduceat(second, batch.offsets[:-1])  # p(second best) / p(best)
                else:  # one label: one path
                    ratio = np.zeros(batch.n_sequences)
                out.margin = out.best_probability * (1.0 - ratio)
        if "nbest_entropy" in figures:
            _, scores = chain.kbest_viterbi(emissions, *weights, batch.lengths, int(n_best))
            out.nbest_entropy = path_entropy(scores - posterior.log_z[:, None])
        return out

    def best_path_probability(self, X) -> np.ndarray:
        """p(best path | x) of every sequence: 1 minus it is least confidence.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all), no empty sequence.

        Returns
        -------
        ndarray of shape (N,), float64
            Probabilities, 0 to 1.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            An empty sequence; or as :meth:`crf.CRF.emissions`.
        """
        return self.uncertainty(X, figures=("best_probability",)).best_probability

    def best_path_margin(self, X) -> np.ndarray:
        """p(best path | x) - p(second best path | x) of every sequence.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all), no empty sequence.

        Returns
        -------
        ndarray of shape (N,), float64
            0 to 1; p(best path | x) when the sequence has one path only.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            An empty sequence; or as :meth:`crf.CRF.emissions`.
        """
        return self.uncertainty(X, figures=("margin",)).margin

    def token_entropies(self, X) -> list[np.ndarray]:
        """The entropy of each token's marginal distribution, per sequence.

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all), no empty sequence.

        Returns
        -------
        list of N ndarrays
            Per sequence, shape (n_i,) for its n_i tokens, in nats.

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            An empty sequence; or as :meth:`crf.CRF.emissions`.
        """
        figures = self.uncertainty(X, figures=("token_entropy",))
        return [figures.token_entropy[a:b] for a, b in zip(figures.offsets[:-1], figures.offsets[1:])]

    def sequence_entropy(self, X) -> np.ndarray:
        """H(y | x) of every sequence, over all its label sequences (exact).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all), no empty sequence.

        Returns
        -------
        ndarray of shape (N,), float64
            Entropies in nats.

        Raises
        ------
        NotFittedCRFError, ValueError
            As :meth:`crf.CRF.emissions`.
        """
        emissions, scores, batch = self.chain_inputs(X)
        return chain.entropy(emissions, *scores, batch.lengths)

    def nbest_entropy(self, X, n_best: int = 5) -> np.ndarray:
        """Entropy of the ``n_best`` best paths of every sequence (N,), their probabilities
        renormalised among themselves (Settles and Craven's N-best sequence entropy).

        Parameters
        ----------
        X : list of sequences of token features, or SequenceBatch
            As for :meth:`crf.CRF.predict` (N sequences, T tokens in all), no empty sequence.
        n_best : int, default=5
            The number of best paths (at least 1); a sequence with fewer paths uses all of them.

        Returns
        -------
        ndarray of shape (N,), float64
            Entropies in nats (0 for a sequence with one path).

        Raises
        ------
        NotFittedCRFError
            Before ``fit``.
        ValueError
            An empty sequence or ``n_best < 1``; or as :meth:`crf.CRF.emissions`.
        """
        return self.uncertainty(X, n_best=n_best, figures=("nbest_entropy",)).nbest_entropy

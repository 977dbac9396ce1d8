"""The HMM baseline: a first- or second-order hidden Markov tagger decoded by the CRF's recursions.

An HMM is a linear chain whose scores are log probabilities: ``start`` = log P(y_0 | <s>),
``transitions`` = log P(y_t | y_{t-1}) (second order: log P(y_t | y_{t-2}, y_{t-1}), run over
label pairs by :class:`crf._chain.SecondOrderTransitions`), ``end`` = log P(</s> | ...) and
``emissions[t, y]`` = log P(x_t | y). With these scores :func:`crf._chain.viterbi` is HMM Viterbi
and the log partition function of :func:`crf._chain.forward_backward` is log p(x): the CRF and the
HMM share one recursion.

Estimation is by counting, with either
- add-k (Lidstone) smoothing of transitions and emissions: the MAP estimate under a symmetric
  Dirichlet(k + 1) prior, which Baum-Welch (:meth:`HMM.baum_welch`) re-estimates; or
- the TnT recipe (Brants 2000): transitions by deleted interpolation of unigram, bigram and
  trigram estimates, known words by relative frequency, and unknown words by a suffix model
  learnt from rare words (separately for capitalised and other words).
Counting and smoothing live in :mod:`crf._hmm_smoothing` (whose docstring describes the
transition tables' layout); this module holds the estimator.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp

from . import _chain as chain
from ._hmm_smoothing import (
    add_k_log_probabilities,
    check_possible,
    count_transitions,
    dirichlet_log_objective,
    emission_arrays,
    emission_tables,
    expected_transition_table,
    interpolated_log_probabilities,
    interpolation_weights,
    suffix_emissions,
    valid_contexts,
)
from ._lattice import lattice_edges, ngram_viterbi
from ._parallel import Workers, single_threaded_blas, thread_count
from ._params import _number
from ._persist import (
    ModelFileError,
    arrays_to_strings,
    check_classes,
    check_table_size,
    check_thread_count,
    check_unique,
    checked_array,
    load_arrays,
    save_arrays,
    strings_to_arrays,
)
from .batch import check_labels, label_classes
from .bundle import prefixed, register_kind, token_problem

_KIND = "crf.HMMTagger"  # the kind its files carry (the class was once named so)
_TRANSITION_SMOOTHING = ("add-k", "interpolation")
_EMISSION_SMOOTHING = ("add-k", "suffix")
_PARAMS = (
    "order transition_smoothing emission_smoothing k rare_threshold max_suffix capitalization block_elements n_threads"
).split()


# --- the estimator ------------------------------------------------------------------------


@dataclass
class EMIteration:
    """One Baum-Welch iteration: the log-likelihood of the unlabelled sentences under the model
    the iteration started from, and the MAP objective it increases (likelihood of the unlabelled
    sentences, weighted joint likelihood of the labelled ones, log Dirichlet prior).

    Parameters
    ----------
    iteration : int
        1-based iteration number.
    log_likelihood : float
        Natural-log likelihood of the unlabelled sentences.
    objective : float
        The MAP objective (natural log); it never decreases from one iteration to the next.
    seconds : float
        Wall-clock seconds since :meth:`HMM.baum_welch` began (cumulative, not per iteration).
    """

    iteration: int
    log_likelihood: float
    objective: float
    seconds: float


_LARGEST = int(np.iinfo(np.int64).max)  # counts and thresholds are int64


class HMM:
    """Hidden Markov model of order 1 or 2 (a sequence labeller), decoded with the CRF's chain recursions.

    ``order``, the smoothing choices, ``capitalization`` and ``k`` are checked by :meth:`fit`
    (ValueError naming the bad one), not by the constructor. With ``capitalization`` the label
    axis of the fitted tables (not ``classes_``) has the 2L hidden labels.

    Parameters
    ----------
    order : {1, 2}, default=2
        1 (bigram transitions) or 2 (trigram transitions, TnT).
    transition_smoothing : {"interpolation", "add-k"}, default="interpolation"
        Deleted interpolation, or add-k on the transition counts.
    emission_smoothing : {"suffix", "add-k"}, default="suffix"
        ``"suffix"``: relative frequency for known words, a suffix model for unknown ones;
        ``"add-k"``: add-k on every word, and one symbol for all unknown words.
    k : float, default=0.1
        The add-k constant, >= 0 (used where add-k smoothing is chosen).
    rare_threshold : int, default=10
        Words seen at most this often teach the suffix model.
    max_suffix : int, default=10
        Longest suffix (in characters) the suffix model uses.
    capitalization : bool, default=False
        TnT's capitalisation option: each label splits into a capitalised and an uncapitalised
        hidden state (2L hidden labels), so transitions see capitalisation; needs
        ``emission_smoothing="suffix"``. It costs 4x (first order) or 8x (second order) the
        decoding work.
    block_elements : int, default=4_000_000
        Tokens x states per recursion call (bounds memory; about 8 bytes each).
    n_threads : int or None, default=None
        Threads for tagging and Baum-Welch (None or 0: the number of cores, at most 4).

    Attributes
    ----------
    classes_ : list of length L
        The labels (strings or integers, as given), sorted.
    vocabulary_ : list of str of length V
        The known words.
    log_transitions_ : ndarray of shape (L + 1,) * (order + 1), float64
        Natural-log transition probabilities, index L standing for the sequence boundary (see
        :mod:`crf._hmm_smoothing`).
    log_emissions_ : ndarray of shape (V + 1, L), float64
        Natural-log P(word | label), the unknown-word row last.
    suffix_model_ : SuffixModel or None
        The suffix model of unknown words (``emission_smoothing="suffix"``).
    interpolation_weights_ : ndarray of shape (order + 1,) or None
        The deleted-interpolation weights (``transition_smoothing="interpolation"``).
    unknown_given_label_ : ndarray of shape (L,) or None
        P(unknown word | label) of the suffix model.
    transition_counts_ : ndarray of shape (L + 1,) * (order + 1), float64
        The transition counts the estimates come from.
    emission_counts_ : ndarray of shape (V, L), float64
        Word/label counts.
    em_history_ : list of EMIteration
        The iterations of :meth:`baum_welch` (empty after :meth:`fit`).
    """

    def __init__(
        self,
        order: int = 2,
        transition_smoothing: str = "interpolation",
        emission_smoothing: str = "suffix",
        k: float = 0.1,
        rare_threshold: int = 10,
        max_suffix: int = 10,
        capitalization: bool = False,
        block_elements: int = 4_000_000,
        n_threads: int | None = None,
    ) -> None:
        self.order = order
        self.capitalization = capitalization
        self.transition_smoothing = transition_smoothing
        self.emission_smoothing = emission_smoothing
        self.k = k
        self.rare_threshold = rare_threshold
        self.max_suffix = max_suffix
        self.block_elements = block_elements
        self.n_threads = n_threads

    def get_params(self) -> dict:
        """The constructor parameters (as scikit-learn's ``get_params``).

        Returns
        -------
        dict
            Parameter name -> current value.
        """
        return {name: getattr(self, name) for name in _PARAMS}

    def check_params(self) -> None:
        """Refuse settings that cannot work (an order other than 1 or 2, an unknown smoothing, a
        negative ``k``...) before any counting; :meth:`fit` calls it first.

        Raises
        ------
        ValueError
            Naming the parameter and the value given.
        """
        if isinstance(self.order, (bool, np.bool_)) or not isinstance(self.order, (int, np.integer)) or self.order not in (1, 2):
            raise ValueError(f"order must be 1 or 2, got {self.order!r}")  # 1.0 too: the counts index by it
        if self.transition_smoothing not in _TRANSITION_SMOOTHING:
            raise ValueError(f"transition_smoothing must be one of {_TRANSITION_SMOOTHING}, got {self.transition_smoothing!r}")
        if self.emission_smoothing not in _EMISSION_SMOOTHING:
            raise ValueError(f"emission_smoothing must be one of {_EMISSION_SMOOTHING}, got {self.emission_smoothing!r}")
        if not isinstance(self.capitalization, (bool, np.bool_)):  # "no" or "false" would read as true
            raise ValueError(f"capitalization must be True or False, got {self.capitalization!r}")
        if self.capitalization and self.emission_smoothing != "suffix":
            raise ValueError("capitalization=True needs emission_smoothing='suffix'")
        for name, strict in (("k", False), ("block_elements", True)):  # within a float's range, as numpy reads them
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0, got {value!r}")
            _number(name, value, strict=strict)
        for name in ("rare_threshold", "max_suffix"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
            if value > _LARGEST:
                raise ValueError(f"{name} must be a whole number >= 0 and at most {_LARGEST}, got {len(str(value))} digits")

    # --- training ---------------------------------------------------------------------------

    @staticmethod
    def _flatten(X, name: str = "X", tokens: bool = True) -> tuple[list[str], np.ndarray]:
        if isinstance(X, str) or any(isinstance(x, str) for x in X):
            raise TypeError(f"{name} must be a list of token sequences (lists of strings), not strings: tokenise first")
        if isinstance(X, AbstractSet) or any(isinstance(x, AbstractSet) for x in X):  # no order to read them in
            raise TypeError(f"{name} must be a list of token sequences (lists of strings), not sets")
        lengths = np.fromiter((len(x) for x in X), dtype=np.int64, count=len(X))
        if lengths.size == 0 or np.any(lengths == 0):
            raise ValueError(f"{name} must be a non-empty list of non-empty sequences")
        flat = list(itertools.chain.from_iterable(X))
        if not tokens:
            return flat, lengths
        if pd.api.types.infer_dtype(flat, skipna=False) != "string":  # None, 1 (which prints as '1'), NaN
            index, why = next(i for i, word in enumerate(flat) if not isinstance(word, str)), TypeError
        else:  # the served model's and the tag command's check, once per distinct word
            bad = {word for word in set(flat) if token_problem(word)}
            if not bad:
                return flat, lengths
            index, why = next(i for i, word in enumerate(flat) if word in bad), ValueError
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        sequence = int(np.searchsorted(offsets, index, side="right")) - 1
        raise why(f"{name}: sequence {sequence}, token {index - int(offsets[sequence])}: {token_problem(flat[index])}")

    def fit(self, X: Sequence[Sequence[str]], y: Sequence[Sequence[str]]) -> HMM:
        """Estimate by counting.

        Parameters
        ----------
        X : sequence of N sequences of str
            Observation sequences (the observed column, e.g. words or POS tags); every sequence
            non-empty.
        y : sequence of N sequences
            Label sequences (strings or integers), one label per observation.

        Returns
        -------
        HMM
            self, with ``classes_`` (L,), ``vocabulary_`` (V,), the log tables and their counts.

        Raises
        ------
        ValueError
            A bad parameter; empty input; ``X`` and ``y`` of different lengths.
        TypeError
            Strings instead of lists of tokens; a label that is neither a string nor an integer.
        """
        self.check_params()
        words, lengths = self._flatten(X)
        labels, label_lengths = self._flatten(y, "y", tokens=False)
        if not np.array_equal(lengths, label_lengths):
            bad = int(np.flatnonzero(lengths != label_lengths)[0]) if lengths.size == label_lengths.size else None
            raise ValueError(
                "X and y differ in length"
                + (f" at sequence {bad}" if bad is not None else f" ({lengths.size} vs {label_lengths.size} sequences)")
            )
        check_labels(np.asarray(labels, dtype=object))  # before factorising, which would merge True with 1
        label_codes, classes = pd.factorize(pd.Series(labels, dtype=object), sort=True)
        word_codes, vocabulary = pd.factorize(pd.Series(words, dtype=object))
        self.classes_ = label_classes(np.asarray(classes, dtype=object))  # strings or integers, as given
        self.vocabulary_ = [str(w) for w in vocabulary]
        V = len(self.vocabulary_)
        if self.capitalization:
            label_codes = label_codes + len(self.classes_) * self._capitalised(self.vocabulary_)[word_codes]
        L = self.n_hidden_
        self.transition_counts_ = count_transitions(label_codes, lengths, L, self.order)
        self.emission_counts_ = np.bincount(word_codes * L + label_codes, minlength=V * L).reshape(V, L).astype(np.float64)
        self.em_history_: list[EMIteration] = []
        self._estimate()
        return self

    @property
    def n_hidden_(self) -> int:
        """Number of hidden labels: L, or 2L with ``capitalization`` (label + L if capitalised)."""
        return len(self.classes_) * (2 if self.capitalization else 1)

    @staticmethod
    def _capitalised(words: Sequence[str]) -> np.ndarray:
        return np.fromiter((w[:1].isupper() for w in words), dtype=bool, count=len(words)).astype(np.int64)

    def _estimate(self) -> None:
        """Probability tables from ``transition_counts_`` and ``emission_counts_``."""
        L = self.n_hidden_
        valid = valid_contexts(L, self.order)
        counts = self.transition_counts_
        if self.transition_smoothing == "add-k":
            self.interpolation_weights_ = None
            table = add_k_log_probabilities(counts, self.k, valid)
        else:
            self.interpolation_weights_ = interpolation_weights(counts)
            table = interpolated_log_probabilities(counts, self.interpolation_weights_, valid)
        self.log_transitions_ = table
        emission_counts = self.emission_counts_
        if self.emission_smoothing == "add-k":
            self.suffix_model_ = None
            self.unknown_given_label_ = None
            with_unknown = np.vstack([emission_counts, np.zeros((1, L))])
            self.log_emissions_ = add_k_log_probabilities(with_unknown.T, self.k).T
            return
        self.suffix_model_, self.unknown_given_label_, self.log_emissions_ = suffix_emissions(
            self.vocabulary_, emission_counts, self.rare_threshold, self.max_suffix
        )

    # --- scores for the chain ------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "log_transitions_"):
            raise RuntimeError("this HMM is not fitted yet; call fit(X, y) first")

    def _chain_scores(self):
        """(transitions, start, end) for :mod:`crf._chain`; second order as pair states."""
        L, table = self.n_hidden_, self.log_transitions_
        if self.order == 1:
            return table[:L, :L], table[L, :L], table[:L, L]
        transitions = chain.SecondOrderTransitions(table[:, :L, :L])
        start = np.full((L + 1, L), -np.inf)
        start[L] = table[L, L, :L]
        return transitions, start.ravel(), table[:, :L, L].ravel()

    def word_ids(self, words: Sequence[str]) -> np.ndarray:
        """Vocabulary index of each word.

        Parameters
        ----------
        words : sequence of str
            n observations.

        Returns
        -------
        ndarray of shape (n,), int
            Index in ``vocabulary_``, -1 for an unknown word.
        """
        return pd.Index(self.vocabulary_).get_indexer(pd.Series(words, dtype=object))

    def emissions(self, words: Sequence[str]) -> np.ndarray:
        """log P(word | label) of every word.

        Parameters
        ----------
        words : sequence of str
            n observations (flat, all sequences).

        Returns
        -------
        ndarray of shape (n, H), float64
            Natural-log emission probabilities over the H hidden labels (L, or 2L with
            ``capitalization``); an unknown word's from the suffix model when there is one.

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        """
        self._check_fitted()
        ids = self.word_ids(words)
        out = self.log_emissions_[np.where(ids >= 0, ids, len(self.vocabulary_))]
        unknown = np.flatnonzero(ids < 0)
        if unknown.size and self.suffix_model_ is not None:
            codes, types = pd.factorize(pd.Series([words[i] for i in unknown], dtype=object))
            out[unknown] += self.suffix_model_.lookup(list(types))[codes]
            if self.capitalization:  # an unknown word's case picks its half of the hidden labels
                L = len(self.classes_)
                capitalised = self._capitalised(list(types))[codes].astype(bool)
                out[unknown[capitalised], :L] = -np.inf
                out[unknown[~capitalised], L:] = -np.inf
        return out

    def _map_blocks(
        self, X, work: Callable[[np.ndarray, np.ndarray, tuple, slice], object], per_label: bool = False, possible: bool = True
    ) -> list:
        """``work(emissions (T_c, S), lengths (N_c,), chain scores, token slice)`` on every block,
        in threads; the slice places the block's tokens among all tokens of ``X``. Blocks are
        contiguous sequence ranges of at most ``block_elements`` tokens x states each (a longer
        sequence gets one of its own). With ``per_label`` the emissions stay per hidden label
        (T_c, H) and a token counts 4 elements per edge into its finite-emission states (about
        32 bytes of lattice per edge, so that the arrays stay in cache)."""
        self._check_fitted()
        words, lengths = self._flatten(X)
        scores = self._chain_scores()
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        all_emissions = self.emissions(words)
        if possible:  # decoding and marginals need every token to have some label
            check_possible(all_emissions, words, offsets)
        H = self.n_hidden_
        costs = 4 * lattice_edges(all_emissions, lengths, self.order) if per_label else H * (H + 1) ** (self.order - 1)
        ends = np.concatenate([[0], np.cumsum(np.broadcast_to(costs, offsets[-1:]))])[offsets]  # cost before each sequence
        ranges, first = [], 0
        while first < lengths.size:
            last = max(first + 1, int(np.searchsorted(ends, ends[first] + self.block_elements, side="right")) - 1)
            ranges.append((first, last))
            first = last

        def run(part):
            first, last = part
            emissions = all_emissions[offsets[first] : offsets[last]]
            if self.order == 2 and not per_label:
                emissions = scores[0].state_emissions(emissions)
            return work(emissions, lengths[first:last], scores, slice(int(offsets[first]), int(offsets[last])))

        with single_threaded_blas(), Workers(thread_count(self.n_threads)) as workers:
            return workers.map(run, ranges)

    # --- queries -------------------------------------------------------------------------

    def predict_codes(self, X: Sequence[Sequence[str]]) -> np.ndarray:
        """Viterbi label indices of all tokens: exact, over the states of finite emission only
        (:func:`crf._lattice.ngram_viterbi`).

        Parameters
        ----------
        X : sequence of N sequences of str
            Observation sequences (the observed column, e.g. words), T observations in all; every
            sequence non-empty.

        Returns
        -------
        ndarray of shape (T,), int
            Index in ``classes_`` of each token's label, flat.

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        TypeError
            ``X`` is a string or holds strings instead of token lists.
        ValueError
            ``X`` is empty or holds an empty sequence; a word of probability 0 under every label
            (an unseen word under add-k with k = 0), naming sequence and token.
        """

        def decode(emissions, lengths, _scores, _tokens):
            return ngram_viterbi(emissions, self.log_transitions_, lengths) % len(self.classes_)

        return np.concatenate(self._map_blocks(X, decode, per_label=True))

    def predict(self, X: Sequence[Sequence[str]]) -> list[list[str]]:
        """The most probable label sequence of each observation sequence.

        Parameters
        ----------
        X : sequence of N sequences of str
            Observation sequences (the observed column, e.g. words), T observations in all; every
            sequence non-empty.

        Returns
        -------
        list of N lists
            The labels (from ``classes_``) of every sequence.

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        TypeError
            ``X`` is a string or holds strings instead of token lists.
        ValueError
            ``X`` is empty or holds an empty sequence; a word of probability 0 under every label
            (an unseen word under add-k with k = 0), naming sequence and token.
        """
        codes = self.predict_codes(X)
        classes = np.array(self.classes_, dtype=object)
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in X])])
        return [list(classes[codes[a:b]]) for a, b in zip(offsets[:-1], offsets[1:])]

    def _posteriors(self, X, possible: bool = True) -> list[chain.Posterior]:
        return self._map_blocks(
            X,
            lambda emissions, lengths, scores, _tokens: chain.forward_backward(emissions, *scores, lengths, counts=False),
            possible=possible,
        )

    def _hidden_marginals(self, states: np.ndarray) -> np.ndarray:
        """Per-state marginals (T, S) summed to the hidden labels (T, H)."""
        H = self.n_hidden_
        return states if self.order == 1 else states.reshape(-1, H + 1, H).sum(axis=1)

    def log_likelihood(self, X: Sequence[Sequence[str]], per_sequence: bool = False):
        """log p(x) by the forward algorithm. Unknown words count as one symbol (their suffix
        model reweighting is part of its probability).

        Parameters
        ----------
        X : sequence of N sequences of str
            Observation sequences (the observed column, e.g. words), T observations in all; every
            sequence non-empty.
        per_sequence : bool, default=False
            Return one value per sequence instead of the total.

        Returns
        -------
        float, or ndarray of shape (N,) with ``per_sequence``
            Natural-log probabilities (-inf for a sequence of probability 0).

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        TypeError, ValueError
            Strings instead of token lists; empty input or an empty sequence.
        """
        values = np.concatenate([p.log_z for p in self._posteriors(X, possible=False)])
        return values if per_sequence else float(values.sum())

    def marginals(self, X: Sequence[Sequence[str]]) -> np.ndarray:
        """Posterior label probabilities p(y_t = l | x) of all tokens.

        Parameters
        ----------
        X : sequence of N sequences of str
            Observation sequences (the observed column, e.g. words), T observations in all; every
            sequence non-empty.

        Returns
        -------
        ndarray of shape (T, L), float64
            Columns in ``classes_`` order; each row sums to 1.

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        TypeError
            ``X`` is a string or holds strings instead of token lists.
        ValueError
            ``X`` is empty or holds an empty sequence; a word of probability 0 under every label
            (an unseen word under add-k with k = 0), naming sequence and token.
        """
        L, H = len(self.classes_), self.n_hidden_
        node = [self._hidden_marginals(p.marginals) for p in self._posteriors(X)]
        return np.concatenate(node).reshape(-1, H // L, L).sum(axis=1)

    def score(self, X: Sequence[Sequence[str]], y: Sequence[Sequence[str]]) -> float:
        """Token accuracy of the predictions.

        Parameters
        ----------
        X : sequence of N sequences of str
            Observation sequences (the observed column, e.g. words), T observations in all; every
            sequence non-empty.
        y : sequence of N sequences
            Their gold label sequences.

        Returns
        -------
        float
            The fraction of tokens labelled right (0 to 1).

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        TypeError
            ``X`` is a string or holds strings instead of token lists.
        ValueError
            ``X`` is empty or holds an empty sequence; a word of probability 0 under every label
            (an unseen word under add-k with k = 0), naming sequence and token; ``y`` with another
            number of labels in all than ``X`` has tokens.
        """
        predicted = self.predict_codes(X)
        gold = self._flatten(y, "y", tokens=False)[0]
        if len(gold) != predicted.size:
            raise ValueError("X and y differ in length")
        classes = np.array(self.classes_, dtype=object)
        return float(np.mean(classes[predicted] == np.array(gold, dtype=object)))

    # --- Baum-Welch ----------------------------------------------------------------------

    def _expected_counts(self, X) -> tuple[float, np.ndarray, np.ndarray]:
        """E-step: (log p(X), expected transition counts, expected emission counts (V, L))."""
        V = len(self.vocabulary_)
        ids = self.word_ids(self._flatten(X)[0])
        if np.any(ids < 0):
            raise ValueError("Baum-Welch needs every word in the vocabulary")  # baum_welch extends it first

        def count(emissions, lengths, scores, tokens):
            post = chain.forward_backward(emissions, *scores, lengths)
            node = self._hidden_marginals(post.marginals)
            transitions = expected_transition_table(post.transition_counts, post.marginals, node, lengths, self.order)
            block_ids = ids[tokens]
            membership = sp.csr_matrix(
                (np.ones(block_ids.size), (block_ids, np.arange(block_ids.size))), shape=(V, block_ids.size)
            )
            return float(post.log_z.sum()), transitions, membership @ node

        parts = self._map_blocks(X, count)
        return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)

    def baum_welch(
        self,
        X_unlabelled: Sequence[Sequence[str]],
        iterations: int = 20,
        tolerance: float = 1e-5,
        labelled_weight: float = 1.0,
        callback: Callable[[EMIteration], None] | None = None,
    ) -> HMM:
        """Re-estimate the fitted model by EM on unlabelled observation sequences.

        Starts from the supervised model (call :meth:`fit` first); its labelled counts stay in
        the M-step with weight ``labelled_weight`` (1: semi-supervised; 0: unsupervised from the
        supervised start). Words of ``X_unlabelled`` missing from the vocabulary are added to it
        first (with zero labelled counts). Each M-step is the add-k estimate from labelled plus
        expected counts, the MAP estimate under a Dirichlet(k + 1) prior, so the objective in
        ``em_history_`` never decreases (with k = 0 and labelled_weight = 0 it is the plain
        log-likelihood). Stops after ``iterations`` or when the objective improves by less than
        ``tolerance`` relative. Only add-k models: the interpolated and suffix estimates have no
        EM update with that guarantee.

        Parameters
        ----------
        X_unlabelled : sequence of sequences of str
            Observation sequences without labels; every sequence non-empty.
        iterations : int, default=20
            The most EM iterations.
        tolerance : float, default=1e-5
            Stop when the objective improves by less than this, relative.
        labelled_weight : float, default=1.0
            Weight of the supervised counts in each M-step.
        callback : callable, optional
            Called with each iteration's :class:`EMIteration`.

        Returns
        -------
        HMM
            self, re-estimated; ``em_history_`` lists the iterations.
        """
        self._check_fitted()
        _number("iterations", iterations, integer=True)
        _number("tolerance", tolerance)
        _number("labelled_weight", labelled_weight)
        if self.transition_smoothing != "add-k" or self.emission_smoothing != "add-k":
            raise ValueError(
                "Baum-Welch re-estimates add-k models only (transition_smoothing='add-k', "
                "emission_smoothing='add-k'): deleted interpolation and the suffix model have "
                "no EM update that guarantees the likelihood never decreases"
            )
        words, _ = self._flatten(X_unlabelled, "X_unlabelled")
        new_words = pd.Index(pd.unique(pd.Series(words, dtype=object))).difference(pd.Index(self.vocabulary_), sort=False)
        if len(new_words):
            self.vocabulary_ = self.vocabulary_ + [str(w) for w in new_words]
            self.emission_counts_ = np.vstack([self.emission_counts_, np.zeros((len(new_words), self.n_hidden_))])
            self._estimate()
        labelled_transitions = labelled_weight * self.transition_counts_
        labelled_emissions = labelled_weight * self.emission_counts_
        supervised = (self.transition_counts_, self.emission_counts_)
        previous = -np.inf
        began = time.perf_counter()
        for iteration in range(1, iterations + 1):
            log_likelihood, expected_transitions, expected_emissions = self._expected_counts(X_unlabelled)
            objective = log_likelihood + dirichlet_log_objective(
                self.log_transitions_, self.log_emissions_, labelled_transitions, labelled_emissions, self.k, self.order
            )
            record = EMIteration(iteration, log_likelihood, objective, time.perf_counter() - began)
            self.em_history_.append(record)
            if callback is not None:
                callback(record)
            if np.isfinite(previous) and objective - previous <= tolerance * abs(previous):
                break
            previous = objective
            self.transition_counts_ = labelled_transitions + expected_transitions
            self.emission_counts_ = labelled_emissions + expected_emissions
            self._estimate()
        # keep the supervised counts as the model's labelled evidence for any later call
        self.transition_counts_, self.emission_counts_ = supervised
        return self

    # --- persistence ---------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The fitted tables as (JSON-ready metadata, named arrays): what :meth:`save` writes,
        for containers that hold an HMM among other things (:class:`crf.bundle.ModelBundle`).

        Returns
        -------
        meta : dict
            The parameters, ``classes``, the suffix model's theta and the interpolation weights.
        arrays : dict of str to ndarray
            The log tables, the vocabulary (as a blob and offsets) and the suffix model's arrays;
            read back by :meth:`from_arrays`.

        Raises
        ------
        RuntimeError
            Before ``fit``.
        """
        self._check_fitted()
        arrays = {"log_transitions": self.log_transitions_} | emission_arrays(self.log_emissions_, self.suffix_model_)
        arrays["vocabulary_blob"], arrays["vocabulary_offsets"] = strings_to_arrays(self.vocabulary_)
        if self.suffix_model_ is not None:
            arrays["unknown_given_label"] = self.unknown_given_label_
        meta = {
            "params": {k: v.item() if isinstance(v, np.generic) else v for k, v in self.get_params().items()},  # JSON
            "classes": list(self.classes_),
            "suffix_theta": None if self.suffix_model_ is None else self.suffix_model_.theta,
            "interpolation_weights": None
            if self.interpolation_weights_ is None
            else [float(w) for w in self.interpolation_weights_],
        }
        return meta, arrays

    def save(self, path) -> None:
        """Write the fitted tables to one ``.npz`` file (no pickle; checksummed; atomic).

        Parameters
        ----------
        path : str or os.PathLike
            The file to write (replaced whole, or left as it was on an error).

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        """
        meta, arrays = self.to_arrays()
        save_arrays(path, _KIND, meta, arrays)

    @classmethod
    def load(cls, path) -> HMM:
        """Read a model written by :meth:`save`.

        Parameters
        ----------
        path : str or os.PathLike
            A file :meth:`save` wrote.

        Returns
        -------
        HMM

        Raises
        ------
        ModelFileError
            On a damaged, tampered or foreign file (nothing in it is executed).
        """
        meta, arrays = load_arrays(path, _KIND)
        return cls.from_arrays(meta, arrays, path)

    @classmethod
    def from_arrays(cls, meta: dict, arrays: dict[str, np.ndarray], path="model") -> HMM:
        """The HMM of :meth:`to_arrays`' output.

        Sizes are checked against each other and against what the file holds before any dense
        table is built; log probabilities must be finite or -inf, other numbers finite, class
        labels, words and suffixes distinct.

        Parameters
        ----------
        meta : dict
            The metadata :meth:`to_arrays` gave (as read back from JSON).
        arrays : dict of str to ndarray
            The arrays :meth:`to_arrays` gave.
        path : str or os.PathLike, default="model"
            Names the source in error messages.

        Returns
        -------
        HMM
            A fitted HMM.

        Raises
        ------
        crf.ModelFileError
            Naming ``path``, on any missing, malformed or inconsistent field.
        """
        try:
            return cls._from_arrays(meta, arrays, path)
        except ModelFileError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
            raise ModelFileError(f"{path}: malformed HMM file ({type(err).__name__}: {err})") from None

    @classmethod
    def _from_arrays(cls, meta: dict, arrays: dict[str, np.ndarray], path) -> HMM:
        if not isinstance(meta["params"], dict):
            raise ModelFileError(f"{path}: the parameters are not a JSON object")
        params = dict(meta["params"])
        if "chunk_elements" in params:  # its earlier name, in files written before
            params["block_elements"] = params.pop("chunk_elements")
        model = cls(**params)
        model.check_params()
        check_thread_count(path, model.n_threads)
        model.classes_ = check_classes(path, meta["classes"])  # strings or integers, as trained (the header is checksummed)
        model.vocabulary_ = arrays_to_strings(arrays["vocabulary_blob"], arrays["vocabulary_offsets"])
        check_unique(path, "word", model.vocabulary_)
        L, V = model.n_hidden_, len(model.vocabulary_)
        n_suffixes = arrays["suffix_offsets"].size - 1 if "suffix_offsets" in arrays else 0
        stored = sum(a.nbytes for a in arrays.values())
        check_table_size(
            path,
            f"the emission tables of {V:,} words and {n_suffixes:,} suffixes x {L:,} labels",
            (V + 1 + n_suffixes) * L,
            stored,
        )
        shape = (L + 1,) * (model.order + 1)
        model.log_transitions_ = checked_array(path, arrays, "log_transitions", "f", shape, finite=True, minus_inf=True)
        model.log_transitions_ = model.log_transitions_.astype(np.float64)
        theta = meta["suffix_theta"]
        if model.emission_smoothing == "suffix" and not (isinstance(theta, (int, float)) and np.isfinite(theta) and theta >= 0):
            raise ModelFileError(f"{path}: suffix_theta {theta!r} is not a finite number >= 0")
        model.log_emissions_, model.suffix_model_ = emission_tables(arrays, V, L, model.max_suffix, theta)
        tables = {"log emissions": model.log_emissions_}
        if model.suffix_model_ is not None:
            tables["suffix log probabilities"] = model.suffix_model_.log_probabilities
            check_unique(path, "suffix", model.suffix_model_.keys)
            missing = [key for key in ("C|", "l|") if key not in model.suffix_model_.rows]
            if missing:
                raise ModelFileError(f"{path}: the suffix model lacks the empty suffixes {missing}")
        checked_array(path, tables, "log emissions", "f", (V + 1, L), finite=True, minus_inf=True)
        if "suffix log probabilities" in tables:
            checked_array(path, tables, "suffix log probabilities", "f", (n_suffixes, L), finite=True, minus_inf=True)
        weights = meta.get("interpolation_weights")
        if weights is not None and not (isinstance(weights, list) and all(isinstance(w, (int, float)) for w in weights)):
            raise ModelFileError(f"{path}: interpolation_weights {weights!r} are not a list of numbers")
        model.interpolation_weights_ = None if weights is None else np.array(weights, dtype=np.float64)
        if model.interpolation_weights_ is not None and not np.all(np.isfinite(model.interpolation_weights_)):
            raise ModelFileError(f"{path}: interpolation_weights {weights!r} are not finite")
        suffix = model.emission_smoothing == "suffix"
        model.unknown_given_label_ = (
            checked_array(path, arrays, "unknown_given_label", "f", (L,), finite=True).astype(np.float64) if suffix else None
        )
        if model.suffix_model_ is None and suffix:
            raise ModelFileError(f"{path}: a suffix-smoothed HMM without its suffix model")
        model.em_history_ = []
        return model


@register_kind
class BundledHMM:
    """An HMM and the column it observes as the part of a :class:`crf.ModelBundle`.

    Parameters
    ----------
    model : HMM
        A fitted HMM.
    observation : str
        The token column it observes (e.g. the words).
    """

    kind = "hmm"

    def __init__(self, model: HMM, observation: str) -> None:
        self.model, self.observation = model, str(observation)
        self.labels = [str(c) for c in model.classes_]
        H = model.n_hidden_
        self.n_states = H if model.order == 1 else (H + 1) * H
        self.columns = [self.observation]

    def training_values(self) -> dict[str, tuple[list[str], bool]]:
        """The values its observed column held in training: ``{observation: (vocabulary (V,),
        closed)}``, ``closed`` when they are few enough to be a tag set (at most
        :data:`crf.bundle.CLOSED_SET`), not words."""
        from .bundle import CLOSED_SET

        vocabulary = self.model.vocabulary_
        return {self.observation: (vocabulary, len(vocabulary) <= CLOSED_SET)}

    def scores(self, columns, lengths):
        """The chain's inputs for sentences given as flat token columns (:class:`crf.bundle.BundledModel`).

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            The token columns (at least ``columns``).
        lengths : ndarray of shape (N,), int
            Tokens per sentence.

        Returns
        -------
        tuple
            (emissions (T, S), transitions (an (L, L) matrix or a transition operator), start
            (S,), end (S,)).
        """
        transitions, start, end = self.model._chain_scores()
        emissions = self.model.emissions(list(columns[self.observation]))
        if self.model.order == 2:
            emissions = transitions.state_emissions(emissions)
        return emissions, transitions, start, end

    def parts(self):
        meta, arrays = self.model.to_arrays()
        return {"model": meta, "observation": self.observation}, {f"model/{k}": v for k, v in arrays.items()}

    @classmethod
    def from_parts(cls, meta, arrays, path):
        """The part saved by :meth:`parts` (:class:`crf.bundle.BundledModel`).

        Parameters
        ----------
        meta : dict
            The bundle's metadata.
        arrays : dict of str to ndarray
            The bundle's arrays.
        path : str or os.PathLike
            Names the file in error messages.

        Returns
        -------
        BundledHMM

        Raises
        ------
        crf.ModelFileError
            What does not fit, naming ``path``.
        """
        model = HMM.from_arrays(meta["model"], prefixed(arrays, "model/"), path)
        if not isinstance(meta["observation"], str):
            raise ModelFileError(f"{path}: the observed column {meta['observation']!r} is not a column name")
        return cls(model, meta["observation"])

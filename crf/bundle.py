"""One self-contained tagger file per trained model: :class:`ModelBundle`.

A bundle holds everything needed to tag new text: the model's part (:class:`BundledModel`: a
:class:`crf.CRF` with its fitted :class:`crf.FeatureExtractor`, an :class:`crf.HMM` with
the column it observes, or any kind registered with :func:`register_kind`), the label set, the
tagging scheme (``iob1``, ``iob2``, ``iobes`` or ``none``), the input columns it reads and the
dataset/feature/model config it came from. It is one ``.npz`` file written by
:func:`crf._persist.save_arrays` (kind ``crf.ModelBundle``: no pickle, checksummed, atomic),
holding the part's metadata and arrays under keys of its own. This module knows no model kind:
each kind's code lives with its estimator, and a bundle names its kind.

Tagging runs one path for both kinds of model, on arrays: per-state emission scores (T, S) and a
transition operator (a CRF: S = L labels, label pairs at order 2, pairs of candidate slots over
candidate labels; an HMM: its hidden states), whose ``labels_at``/``label_marginals`` map states to labels, Viterbi
and forward-backward of :mod:`crf._chain` under optional allowed-label masks (``fixed`` labels),
and chunk confidences: the quantity :meth:`crf.CRF.predict_segments` reports, by constrained
forward-backward. For first-order chains over labels (the CRF, a first-order HMM without
capitalisation states) it is computed in closed form for all chunks at once
(:meth:`ChunkWindows.log_probability`: the chunk's labels are fixed, so only the two window ends
need a log-sum-exp); otherwise by :func:`crf._chain.constrained_log_probability` on the windows'
masks. Sentences are processed in contiguous groups of bounded size (tokens x states), with
single-threaded BLAS (its threads only cost on (n, L) x (L, L) products).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
import pandas as pd

from . import _chain as chain
from ._layout import positions_within
from ._parallel import single_threaded_blas
from ._persist import ModelFileError, check_unique, load_arrays, save_arrays
from ._segments import ChunkWindows

log = logging.getLogger(__name__)

#: an observed column whose training values number at most this many is a closed set (a tag set:
#: 17 to 50 POS tags, 23 chunk tags); a word vocabulary of a model worth tagging with is larger
CLOSED_SET = 100
#: the least share of an input column's cells that the model saw in that column in training: a
#: tag-set column below it is refused (it holds another kind of value); below WARN_KNOWN, warned of
MIN_KNOWN = 0.5
WARN_KNOWN = 0.9
MIN_EVIDENCE = 5  # a column is refused on at least this many cells the model never saw there (a few are no evidence)
WORDS = "w"  # the word column of the pipeline's data sets, when a bundle's source names none
FRAME_OUTPUTS = ("label", "marginal", "segment_confidence")  # the columns ModelBundle.tag_frame adds
KIND = "crf.TaggerBundle"  # the kind its files carry (the class was once named so)
SCHEMES = ("iob1", "iob2", "iobes", "none")
CHUNK_ELEMENTS = 4_000_000  # tokens x states per recursion call (about 8 bytes each, a few arrays)


def normalize_scheme(scheme: str | None) -> str:
    """``scheme`` in lower case (``IOB2`` -> ``iob2``; None -> ``none``).

    Parameters
    ----------
    scheme : str or None
        A tagging scheme name: ``iob1``, ``iob2``, ``iobes`` or ``none``, in any case.

    Returns
    -------
    str
        One of :data:`SCHEMES`.

    Raises
    ------
    ValueError
        An unknown scheme.
    """
    value = "none" if scheme is None else str(scheme).lower()
    if value not in SCHEMES:
        raise ValueError(f"unknown tagging scheme {scheme!r}; one of {SCHEMES}")
    return value


class TokenError(ValueError):
    """A token the model cannot read (see :func:`check_tokens`). ``index``: its flat position (0-based)
    among all tokens; ``sentence`` and ``token``: its position as the message counts them; ``column``,
    ``value`` and ``problem`` (the reason, without the position).

    Parameters
    ----------
    index : int
        The token's flat position (0-based) among all tokens.
    sentence, token : int
        Its sentence and its position in it, as the message counts them.
    column : str
        The column holding the bad value.
    value : object
        The bad value.
    problem : str
        Why it is refused.
    """

    def __init__(self, index: int, sentence: int, token: int, column: str, value: object, problem: str) -> None:
        self.index, self.sentence, self.token = index, sentence, token
        self.column, self.value, self.problem = column, value, problem
        super().__init__(f"sentence {sentence}, token {token}, column {column!r}: {problem}")

    def __reduce__(self) -> tuple:  # pickled with its own arguments (it may cross to another process)
        return type(self), (self.index, self.sentence, self.token, self.column, self.value, self.problem)


def shown_value(value: object, width: int = 60) -> str:
    """A refused value for a message: ``null`` for a missing one (None, NaN), else its type and a short repr.

    Parameters
    ----------
    value : object
        The value.
    width : int, default=60
        The most characters of its repr shown (longer ones end in ``...``).

    Returns
    -------
    str
    """
    if value is None or (isinstance(value, (float, np.floating)) and np.isnan(value)) or value is pd.NA:
        return "null (a missing value)"
    text = repr(value)
    return f"{type(value).__name__} " + (text if len(text) <= width else text[: width - 3] + "...")


_SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: no UTF-8 writer takes it


_BYTE_ORDER_MARK = "\ufeff"


def token_problem(value: object) -> str | None:
    """Why ``value`` cannot be a token, or None: a token is a non-empty string without whitespace
    (every training reader splits tokens on whitespace, so a model never saw one that holds it).

    Parameters
    ----------
    value : object
        A would-be token.

    Returns
    -------
    str or None
        The reason it is refused (not a non-empty ``str``, whitespace, a lone surrogate, a leading
        byte-order mark), or None.
    """
    if not isinstance(value, str) or value == "":
        return f"a token must be a non-empty string, got {shown_value(value)}"
    if value.split() != [value]:
        return f"a token must not hold whitespace (a space, tab or line break), got {shown_value(value)}"
    if _SURROGATE.search(value):
        return f"a token must be text that UTF-8 can write (it holds a lone surrogate), got {shown_value(value)}"
    if value.startswith(_BYTE_ORDER_MARK):
        return (
            f"a token must not begin with U+FEFF (a byte-order mark, which readers drop at the start of a file), "
            f"got {shown_value(value)}"
        )
    return None


def _integral_id(value: object) -> bool:
    """An integer that fits 64 bits, or a float with such an integer value (1.0); not a boolean."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        return False
    return isinstance(value, (int, np.integer, float, np.floating)) and -(2**63) <= int(value) < 2**63


def _plain(value: object) -> object:
    """A NumPy scalar as the Python value it holds (its repr without ``np.int64(...)``)."""
    return value.item() if isinstance(value, np.generic) else value


def _checked_ids(ids: np.ndarray, column: str) -> np.ndarray:
    """``ids`` (T,) objects as int64 (integers) or as objects (strings), or ValueError naming the
    first that is missing, not an integer, or not of the first id's kind."""
    kind = pd.api.types.infer_dtype(ids, skipna=False)  # one pass in C: the usual columns need no per-row check
    if kind == "string":
        return ids
    if kind == "integer":
        try:
            return ids.astype(np.int64)
        except OverflowError:  # beyond 64 bits: the scan below names the row
            pass
    absent = pd.isna(pd.Series(ids, dtype=object)).to_numpy()
    if absent.any():
        row = int(np.argmax(absent))
        raise ValueError(f"row {row}: the {column!r} id is {shown_value(ids[row])}")
    text = np.fromiter((isinstance(v, str) for v in ids), dtype=bool, count=ids.size)  # NumPy's str_ too
    if text[0]:
        if not text.all():
            row = int(np.argmin(text))
            raise ValueError(f"row {row}: the {column!r} id {shown_value(ids[row])} is not a string, as the first id is: "
                             "give every sentence id as an integer, or every one as a string")  # fmt: skip
        return ids
    integral = np.fromiter((_integral_id(v) for v in ids), dtype=bool, count=ids.size)
    if not integral.all():
        row = int(np.argmin(integral))
        value = ids[row]
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            why = "is beyond the range of a signed 64-bit integer"
        else:
            why = "is not an integer" + (", as the first id is: give every sentence id as an integer, or every one as a string"
                                         if text[row] else "")  # fmt: skip
        raise ValueError(f"row {row}: the {column!r} id {shown_value(value)} {why}")
    return np.fromiter((int(v) for v in ids), dtype=np.int64, count=ids.size)


def sentence_offsets(ids: np.ndarray, column: str) -> np.ndarray:
    """The sentence offsets of token rows whose sentence ids are ``ids``: the one rule of
    :meth:`ModelBundle.tag_frame` and the MLflow Model. The ids are all integers (a float with an
    integer value counts; at most 64 bits; not booleans) or all strings, none missing, and each
    sentence's rows are contiguous (in any order of ids).

    Parameters
    ----------
    ids : ndarray of shape (T,)
        The sentence id of each row.
    column : str
        The id column's name, for the message.

    Returns
    -------
    ndarray of shape (N + 1,), int64
        Where each sentence's rows begin, then T.

    Raises
    ------
    ValueError
        A missing id, one of another kind than the first (or an integer of more than 64 bits, a
        fraction, a boolean), or an id that reappears after another one, naming the row (counted
        from 0).
    """
    raw = np.asarray(ids).reshape(-1)
    with np.errstate(invalid="ignore"):
        if raw.dtype.kind in "iu" and (raw.size == 0 or raw.max() < 2**63):  # the usual integer column: nothing to check
            values = raw.astype(np.int64)
        elif raw.dtype.kind == "f" and np.all((raw == np.floor(raw)) & (raw >= -(2.0**63)) & (raw < 2.0**63)):  # no NaN either
            values = raw.astype(np.int64)
        else:  # objects, or a float or unsigned column with a bad value: each value checked, the first bad one named
            values = _checked_ids(raw.astype(object), column)
    codes, _ = pd.factorize(values)  # numbered in order of appearance
    runs = np.flatnonzero(np.diff(codes, prepend=-1) != 0)  # where each run of one id begins
    again = np.flatnonzero(codes[runs] != np.arange(runs.size))  # a run whose id is not new: it was seen before
    if again.size:
        row = int(runs[again[0]])
        raise ValueError(
            f"row {row}: {column!r} {_plain(values[row])!r} reappears after {_plain(values[row - 1])!r}: the rows of each "
            "sentence must be contiguous"
        )
    return np.append(runs, codes.size).astype(np.int64)


def check_tokens(columns: Mapping[str, np.ndarray], offsets: np.ndarray, base: int = 0) -> None:
    """The one check of tokens before tagging (the tag command, :meth:`ModelBundle.tag`,
    :meth:`ModelBundle.tag_frame` and the MLflow Model use it): every value of ``columns``
    ({name: (T,) values}) is a non-empty ``str`` holding no whitespace. ``offsets`` (N + 1,)
    cut the T tokens into sentences. Raises :class:`TokenError` for the first bad token (in
    column order), naming its sentence and token counted from ``base`` (0 or 1).

    Parameters
    ----------
    columns : mapping of str to array_like of shape (T,)
        Every token column's values.
    offsets : array_like of shape (N + 1,), int
        Sentence offsets into the T tokens.
    base : int, default=0
        What the first sentence and token are counted as in the message.

    Raises
    ------
    TokenError
        The first bad token.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    for name, values in columns.items():
        values = np.asarray(values, dtype=object)
        if values.size == 0:
            continue
        series = pd.Series(values, dtype=object)
        if pd.api.types.infer_dtype(values, skipna=False) == "string":
            bad = (series.str.len() == 0) | series.str.contains(r"\s", regex=True)  # \s: what str.split() splits on
            bad |= series.str.contains(_SURROGATE.pattern, regex=True) | series.str.startswith(_BYTE_ORDER_MARK)
            if not bad.any():
                continue
            index = int(np.argmax(bad.to_numpy()))
        else:
            index = next(i for i, v in enumerate(values) if token_problem(v) is not None)  # only on a refusal
        sentence = int(np.searchsorted(offsets, index, side="right")) - 1
        token = index - int(offsets[sentence])
        raise TokenError(index, sentence + base, token + base, str(name), values[index], token_problem(values[index]))


def _not_a_list(value: object) -> bool:
    """True for what cannot be a list of sentences or of tokens: a string (it would be read one
    character per item), bytes, a mapping (a single token dict would be read by its keys), a set
    (its items come in no fixed order) or a value that has no length."""
    refused_kind = isinstance(value, (str, bytes, Mapping, AbstractSet))
    return refused_kind or not hasattr(value, "__len__") or not hasattr(value, "__iter__")


def check_sentences(sentences: object) -> None:
    """Refuse (ValueError) ``sentences`` that are not a list of sentences each a list of tokens:
    a string (``tag("DT")``), a sentence given as a string (``tag(["NNP"])``: one token per
    character otherwise) or as one token dict (``tag([{"w": "the"}])``: its keys otherwise).
    The shape check of :meth:`ModelBundle.tag` and the MLflow Model's list of sentences."""
    if _not_a_list(sentences):
        raise ValueError(
            f"sentences must be a list of sentences, each a list of tokens; got {shown_value(sentences)} "
            "(one sentence of words: [['The', 'cat']])"
        )
    for number, sentence in enumerate(sentences):
        if _not_a_list(sentence):
            what = "one token dict" if isinstance(sentence, Mapping) else shown_value(sentence)
            raise ValueError(
                f"sentence {number} must be a list of tokens, got {what} (a sentence of one token: [token], not token)"
            )


def tag_like(cells: pd.Series) -> bool:
    """Whether a column's cells look like a tag set rather than words: at most :data:`CLOSED_SET`
    distinct values, each used twice on average or more (a text's words repeat far less: 100
    tokens of English hold about 65 distinct words)."""
    distinct = cells.nunique()
    return distinct <= CLOSED_SET and 2 * distinct <= len(cells)


@dataclass(frozen=True)
class ColumnFinding:
    """What :meth:`ModelBundle.column_findings` found in one input column.

    ``known``: the share (0-1) of its cells that the model saw in that column in training;
    ``unseen``: up to three of its values the model never saw there; ``refusal``: why it cannot be
    tagged (``"of a set of 42"``, ``"and 80% values it saw in column 'w'"``), or None when it is
    a tag set the model half knows, worth a warning only."""

    column: str
    known: float
    unseen: tuple
    refusal: str | None

    def examples(self) -> str:
        return ", ".join(repr(v) for v in self.unseen)


class ColumnValueError(ValueError):
    """An input column that holds another kind of value than the model saw there in training
    (:meth:`ModelBundle.check_column_values`)."""


def check_unique_columns(names: Sequence) -> None:
    """Refuse (ValueError) column ``names`` of which one appears more than once (a frame's columns):
    which of the two would be read is undefined. The check of :meth:`ModelBundle.tag_frame` and the MLflow Model."""
    names = pd.Index(names)
    repeated = sorted({str(c) for c in names[names.duplicated()]})
    if repeated:
        raise ValueError(f"the column(s) {repeated} appear more than once")


def check_position(value: object, sentence: int, length: int) -> int:
    """A ``fixed`` token position: a true integer (``int`` or a NumPy integer, not a bool, float or
    string) in ``0 .. length - 1``; else ValueError naming the sentence."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"fixed: sentence {sentence}: a token position must be an integer, got {shown_value(value)}")
    if not 0 <= int(value) < length:
        raise ValueError(f"fixed: sentence {sentence} has no token {int(value)} (it has {length})")
    return int(value)


@dataclass
class Tagged:
    """Flat results over T tokens of N sentences: ``codes`` (T,) label indices, ``marginals``
    (T,) probability of each predicted label (NaN when not computed), ``offsets`` (N + 1,),
    ``segments`` (a frame with sequence, start, end, type, confidence; None for scheme ``none``
    or a decode-only call) and ``scores`` (N,) the model's log score of each decoded path:
    -inf when the sentence has no path of nonzero probability under the allowed labels (an HMM
    whose emission of a word under a fixed label is 0, contradictory masks), and then its
    ``codes`` are meaningless (they need not even respect the masks).

    Parameters
    ----------
    codes : ndarray of shape (T,), int64
        Label indices (``labels`` order).
    marginals : ndarray of shape (T,), float64
        The probability of each predicted label (NaN when not computed).
    offsets : ndarray of shape (N + 1,), int
        Sentence offsets.
    segments : pandas.DataFrame or None
        Columns sequence, start, end (exclusive), type, confidence.
    scores : ndarray of shape (N,), float64, optional
        Log score of each decoded path.
    """

    codes: np.ndarray
    marginals: np.ndarray
    offsets: np.ndarray
    segments: pd.DataFrame | None
    scores: np.ndarray | None = None

    @property
    def possible(self) -> np.ndarray:
        """(N,) bool: the sentence has a decoded path of nonzero probability."""
        return np.isfinite(self.scores)

    def warn_impossible(self, consequence: str, numbers: np.ndarray | None = None, fixed: bool = False) -> np.ndarray:
        """Log a warning when some sentences have no labelling of nonzero probability, saying what
        became of their labels (``consequence``); return their positions (n,). ``numbers`` (N,): the
        sentence numbers to name (default: positions from 0); ``fixed``: under fixed labels."""
        impossible = np.flatnonzero(~self.possible)
        if impossible.size:
            first = impossible[0] if numbers is None else numbers[impossible[0]]
            log.warning(
                "%d of %d sentences have no labelling of nonzero probability under the model%s (first: sentence %d): %s",
                impossible.size, self.scores.size, " and the fixed labels" if fixed else "", first, consequence,
            )  # fmt: skip
        return impossible


def _groups(lengths: np.ndarray, n_states: int) -> list[tuple[int, int]]:
    """Contiguous sentence ranges of at most ``CHUNK_ELEMENTS`` tokens x states (a longer single
    sentence gets a range of its own)."""
    budget = max(1, CHUNK_ELEMENTS // max(n_states, 1))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ranges, first = [], 0
    while first < lengths.size:
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + budget, side="right")) - 1)
        ranges.append((first, last))
        first = last
    return ranges


class BundledModel(Protocol):
    """What a bundle needs of a model kind: its part of the bundle.

    ``kind`` names it in the file; ``labels`` (L,); ``n_states`` (S) of its chain (at most: it
    sizes the groups of sentences), the operator mapping states to labels (modulo L); ``columns``
    the token columns its scores read; optionally ``numeric_columns``, those of them read as
    numbers (:meth:`ModelBundle.check_numeric_cells`);
    ``scores(columns, lengths)`` the chain's inputs for sentences given as flat token columns:
    (emissions (T, S), transition scores (L, L) or an operator of :mod:`crf._transitions`, start
    (S,), end (S,)); ``parts()`` the JSON metadata and arrays it is saved as (keys of its own),
    and ``from_parts(meta, arrays, path)`` the part again, refusing with
    :class:`crf.ModelFileError` naming ``path`` what does not fit.

    Parameters
    ----------
    *args, **kwargs
        A Protocol: each kind's class has its own constructor (see :class:`crf.model.BundledCRF`,
        :class:`crf.hmm.BundledHMM`).
    """

    kind: ClassVar[str]
    labels: list[str]
    n_states: int
    columns: list[str]

    def scores(self, columns: Mapping[str, np.ndarray], lengths: np.ndarray) -> tuple:
        """The chain's inputs for sentences given as flat token columns.

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            The token columns (at least ``columns``).
        lengths : ndarray of shape (N,), int
            Tokens per sentence.

        Returns
        -------
        tuple
            (emissions (T, S), transitions (an (L, L) matrix or a transition operator of
            :mod:`crf._transitions`), start (S,), end (S,)).
        """
        ...

    def parts(self) -> tuple[dict, dict[str, np.ndarray]]: ...

    # optional: ``training_values()``, a mapping of input column -> (the values it held in training,
    # whether they are a closed set) (see :meth:`ModelBundle.known_values`); a kind without it
    # skips that check

    @classmethod
    def from_parts(cls, meta: dict, arrays: dict[str, np.ndarray], path) -> BundledModel:
        """The part again, from what :meth:`parts` gave.

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
        BundledModel

        Raises
        ------
        crf.ModelFileError
            What does not fit, naming ``path``.
        """
        ...


# the model kinds a bundle can hold: registered by the modules that define them
# (:func:`register_kind`); the library's own are imported on first use
_KINDS: dict[str, type] = {}
_BUILT_IN = {"crf": "crf.model", "hmm": "crf.hmm"}


def prefixed(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The entries of ``arrays`` under ``prefix``, without it (a part's arrays in a bundle).

    Parameters
    ----------
    arrays : mapping of str to ndarray
        Named arrays.
    prefix : str
        Such as ``"model/"``.

    Returns
    -------
    dict of str to ndarray
        The entries whose name starts with ``prefix``, the prefix removed.
    """
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def register_kind(part: type) -> type:
    """Make bundles of kind ``part.kind`` loadable (use as a class decorator).

    Parameters
    ----------
    part : type
        A :class:`BundledModel` class (a later registration of the same kind replaces it).

    Returns
    -------
    type
        ``part`` itself.
    """
    _KINDS[part.kind] = part
    return part


def kind_class(kind: str, path="bundle") -> type:
    """The registered part class of ``kind`` (the library's own kinds are imported on first use).

    Parameters
    ----------
    kind : str
        The kind a bundle file names (``"crf"``, ``"hmm"`` or one registered by a plugin).
    path : str or os.PathLike, default="bundle"
        Names the file in the error message.

    Returns
    -------
    type
        The :class:`BundledModel` class.

    Raises
    ------
    crf.ModelFileError
        An unknown kind, naming ``path``.
    """
    if kind not in _KINDS and kind in _BUILT_IN:
        importlib.import_module(_BUILT_IN[kind])
    if kind not in _KINDS:
        raise ModelFileError(
            f"{path}: model kind {kind!r} is unknown here (import the module that registers it first: "
            f"the tag command's plugins=[...]); known: {sorted(set(_KINDS) | set(_BUILT_IN))}"
        )
    return _KINDS[kind]


class ModelBundle:
    """A trained tagger with everything needed to use it (see the module docstring).

    ``part``: the model's :class:`BundledModel` (e.g. :class:`crf.model.BundledCRF`,
    :class:`crf.hmm.BundledHMM`). Attributes: ``kind``, ``model`` (the part's estimator),
    ``labels`` (L,), ``scheme``, ``input_columns`` (the token columns it reads: the part's, or a
    superset given), ``source`` (the dataset/features/model config it came from;
    ``source["dataset"]["label"]``, when present, names the column it predicts).

    Parameters
    ----------
    part : BundledModel
        The model's part (it gives ``kind``, ``labels``, ``columns``, ``n_states`` and the chain scores).
    scheme : str
        The tagging scheme of the labels: ``"iob1"``, ``"iob2"``, ``"iobes"`` or ``"none"``, in any
        case (None reads ``"none"``); segments and their confidences need a chunk scheme.
    input_columns : sequence of str, optional
        The token columns a caller must give; None: the part's own. They must include every column
        the part reads.
    source : mapping, optional
        The dataset/features/model config the model came from (kept as given; saved as JSON).

    Raises
    ------
    ValueError
        An unknown scheme, or ``input_columns`` lacking a column the part reads.
    """

    def __init__(self, part: BundledModel, *, scheme: str, input_columns: Sequence[str] | None = None,
                 source: Mapping | None = None) -> None:  # fmt: skip
        self.part = part
        self.kind = part.kind
        self.model = getattr(part, "model", None)
        self.labels = [str(c) for c in part.labels]
        self.scheme = normalize_scheme(scheme)
        self.input_columns = [str(c) for c in (part.columns if input_columns is None else input_columns)]
        self.source = dict(source or {})
        missing = [c for c in part.columns if c not in self.input_columns]
        if missing:
            raise ValueError(f"the model reads columns {missing}, which input_columns {self.input_columns} lack")
        self._known: dict[str, tuple[pd.Index, bool]] | None = None  # :meth:`_known_index`, made on first use
        self._labels_index: pd.Index | None = None  # :meth:`_label_index`, made on first use

    def known_values(self) -> dict[str, tuple[set, bool]]:
        """The values each input column held in training, where the part records them.

        Returns
        -------
        dict of str to (set of str, bool)
            Column name -> (its values in training, whether they are a closed set such as a tag
            set); empty when the part does not record them.
        """
        return {column: (set(values), closed) for column, (values, closed) in self._known_index().items()}

    def _known_index(self) -> dict[str, tuple[pd.Index, bool]]:
        """:meth:`known_values` as indexes (their hash tables made once per bundle)."""
        if self._known is None:
            values = getattr(self.part, "training_values", None)
            known = values() if callable(values) else {}
            self._known = {
                str(c): (pd.Index(sorted({str(v) for v in vocabulary}), dtype=object), bool(closed))
                for c, (vocabulary, closed) in known.items()
            }
        return self._known

    def column_findings(
        self, columns: Mapping[str, np.ndarray], by_position: bool = False, words: str | None = None
    ) -> list[ColumnFinding]:
        """The input columns that hold another kind of value than the model saw there in training.

        A column is refused when under :data:`MIN_KNOWN` of its cells are values the model saw in
        it, and either another column's training values or the model's labels match more of its
        cells (two at least: POS tags given as words, words as POS tags, chunk tags as POS tags),
        or it is a tag set with at least :data:`MIN_EVIDENCE` cells the model never saw there (fewer,
        such as one or two real tags a small model lacks, are no evidence). A tag set is a closed
        set the part records (:meth:`known_values`), or a column other than the words of at most
        :data:`CLOSED_SET` training values whose cells look like a tag set (:func:`tag_like`) or,
        where the bundle names its word column (``source.dataset.word_column``, or ``w`` among
        ``source.dataset.columns``, as the pipeline's do) or the columns came by position, are too
        few to tell (under twice that many). A tag set of which under :data:`WARN_KNOWN` is known,
        and one that is not refused, are reported without a refusal. A column of new words (text
        of another domain) is not reported.

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            Token columns; those the part records no training values for are skipped.
        by_position : bool, default=False
            The columns were taken by position (a file without names): a closed set is then a tag
            set even in the word column's place.
        words : str, optional
            The word column (never a tag set, however few words the model saw); default the
            source's ``dataset.word_column``, else ``"w"``.

        Returns
        -------
        list of ColumnFinding
            In the order of :meth:`known_values`.
        """
        known = self._known_index()
        dataset = self.source.get("dataset", {})
        recorded = dataset.get("word_column") or (WORDS if WORDS in (dataset.get("columns") or []) else None)
        words = words or recorded or WORDS
        found = []
        for column, (values, closed) in known.items():
            if column not in columns or not len(columns[column]):
                continue
            cells = pd.Series(columns[column], dtype=object)
            seen = values.get_indexer(cells) >= 0
            own = float(seen.mean())
            unseen = tuple(cells[~seen].unique()[:3])
            # too few cells to look like a tag set: judged by the model's vocabulary, where the bundle names its words
            short = bool(words if by_position else recorded) and len(cells) < 2 * CLOSED_SET
            few = len(values) <= CLOSED_SET and (tag_like(cells) or short)
            tag_set = (closed and (by_position or column != words)) or (column != words and few)
            if own >= MIN_KNOWN:
                if tag_set and own < WARN_KNOWN:
                    found.append(ColumnFinding(column, own, unseen, None))
                continue
            others = {f"in column {o!r}": v.get_indexer(cells) >= 0 for o, (v, _) in known.items() if o != column}
            others["as its labels"] = self._label_index().get_indexer(cells) >= 0
            better = max(others, key=lambda name: others[name].sum())
            share = float(others[better].mean())
            if share > own and int(others[better].sum()) >= 2:  # two cells of another column's kind: evidence
                found.append(ColumnFinding(column, own, unseen, f"and {100 * share:.0f}% values it saw {better}"))
            elif tag_set and int((~seen).sum()) >= MIN_EVIDENCE:
                found.append(ColumnFinding(column, own, unseen, f"of a set of {len(values)}"))
            elif tag_set:
                found.append(ColumnFinding(column, own, unseen, None))
        return found

    def _label_index(self) -> pd.Index:
        """The model's labels as an index (its hash table made once per bundle)."""
        if self._labels_index is None:
            self._labels_index = pd.Index(sorted(set(self.labels)), dtype=object)
        return self._labels_index

    def check_numeric_cells(self, columns: Mapping[str, np.ndarray], offsets: np.ndarray, base: int = 0) -> None:
        """Refuse a cell of a numeric feature column (a CRF's ``features.numeric``) that is no finite
        number or is too large (:func:`crf.features.numeric_cells`, the check of training data), with
        its position counted as :func:`check_tokens` counts it.

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            The input columns' cells (columns the model does not read as numbers are ignored).
        offsets : ndarray of shape (N + 1,), int
            Sentence offsets into the T tokens.
        base : int, default=0
            What the first sentence and token are counted as in the message.

        Raises
        ------
        NumericValueError
            The first bad cell: its sentence, token and column. It is a ValueError.
        """
        from .features import NumericValueError, numeric_cells

        for name in getattr(self.part, "numeric_columns", ()):
            if name not in columns or len(columns[name]) == 0:
                continue
            _, bad = numeric_cells(columns[name])
            if bad is not None:
                token, problem = bad
                sentence = int(np.searchsorted(offsets, token, side="right")) - 1
                where = f"sentence {sentence + base}, token {token - int(offsets[sentence]) + base}"
                raise NumericValueError(f"{where}, numeric column {name!r} {problem}")

    def check_column_values(self, columns: Mapping[str, np.ndarray]) -> None:
        """Refuse token columns of another kind than the model saw there (:meth:`column_findings`:
        UPOS tags given as ``pos`` to a chunker that read Penn Treebank tags, words as tags);
        log a warning for a tag-set column of which the model knows under :data:`WARN_KNOWN`.

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            The input columns' token strings (columns the model does not read are ignored).

        Raises
        ------
        ColumnValueError
            The first refused column, named with its share of known values and examples. It is a ValueError.
        """
        for finding in self.column_findings(columns):
            share = 100 * finding.known
            if finding.refusal is None:
                log.warning(
                    "%.0f%% of the column %r are values the model never saw there in training (%s, ...)",
                    100 - share, finding.column, finding.examples(),
                )  # fmt: skip
                continue
            raise ColumnValueError(
                f"the column {finding.column!r} holds {share:.0f}% values the model saw there in training ({finding.refusal}; "
                f"not {finding.examples()}, ...): it is not the kind of value the model was trained on there"
            )

    # --- persistence ----------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the bundle to one ``.npz`` file (no pickle; checksummed; atomic).

        Parameters
        ----------
        path : str or os.PathLike
            The file to write (its folder is created; an existing file is replaced only once the
            new one is complete). Read it back with :meth:`load` or :func:`crf.load_bundle`.
        """
        part_meta, arrays = self.part.parts()
        meta = {
            "bundle_kind": self.kind,
            "labels": self.labels,
            "scheme": self.scheme,
            "input_columns": self.input_columns,
            "source": self.source,
            **part_meta,
        }
        save_arrays(path, KIND, meta, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ModelBundle:
        """Read a bundle written by :meth:`save`.

        Parameters
        ----------
        path : str or os.PathLike
            A file written by :meth:`save`.

        Returns
        -------
        ModelBundle

        Raises
        ------
        crf.ModelFileError
            Naming ``path``, on a bad file: unreadable, tampered with, of a kind not known here, or
            checksummed but inconsistent (the part's own checks; labels must be distinct and match
            the model's classes, input columns a non-empty list of distinct names).
        """
        meta, arrays = load_arrays(path, KIND)
        try:
            columns = meta["input_columns"]
            if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
                raise ModelFileError(f"{path}: input_columns {columns!r} is not a non-empty list of column names")
            check_unique(path, "input column", columns)
            if not isinstance(meta["source"], dict):
                raise ModelFileError(f"{path}: the source config is not a JSON object")
            kind = meta["bundle_kind"]
            if not isinstance(kind, str):
                raise ModelFileError(f"{path}: the bundle kind {kind!r} is not a name")
            part = kind_class(kind, path).from_parts(meta, arrays, path)
            try:
                bundle = cls(part, scheme=meta["scheme"], input_columns=columns, source=meta["source"])
            except ValueError as err:
                raise ModelFileError(f"{path}: {err}") from None
            labels = meta["labels"]
            if not isinstance(labels, list) or bundle.labels != [str(c) for c in labels]:
                raise ModelFileError(f"{path}: the label list does not match the model's classes")
        except ModelFileError:
            raise
        except (KeyError, TypeError, ValueError) as err:
            raise ModelFileError(f"{path}: malformed tagger bundle ({type(err).__name__}: {err})") from None
        return bundle

    # --- tagging on arrays ----------------------------------------------------------------

    def tag_arrays(
        self, columns: Mapping[str, np.ndarray], lengths: np.ndarray, allowed: np.ndarray | None = None, marginals: bool = True
    ) -> Tagged:
        """Tag sentences given as flat token columns.

        The tokens are not checked here (:meth:`tag` and :meth:`tag_frame` check them with
        :func:`check_tokens`). A sentence the model gives probability 0 (an HMM whose training
        sentences all ended alike, an HMM word never seen with a fixed label, contradictory masks)
        gets score -inf (``Tagged.possible`` False), meaningless codes, NaN or 0 marginals and NaN
        confidences.

        Parameters
        ----------
        columns : mapping of str to ndarray of shape (T,)
            Every input column's token strings, the N sentences one after another (columns the
            model does not read are ignored).
        lengths : ndarray of shape (N,), int
            Tokens per sentence, each at least 1; they sum to T.
        allowed : ndarray of shape (T, L), bool, optional
            The labels (``labels`` order) each token may take; None: any.
        marginals : bool, default=True
            False: Viterbi only (marginals NaN, no segments).

        Returns
        -------
        Tagged
            ``codes`` (T,) label indices, ``marginals`` (T,) the probability of each predicted label,
            ``offsets`` (N + 1,), ``segments`` (a frame with sequence, start, end (exclusive), type,
            confidence; None for scheme ``none`` or ``marginals=False``) and ``scores`` (N,) the
            log score of each decoded path.

        Raises
        ------
        ValueError
            A missing input column, no sentences, or a sentence without tokens.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        missing = [c for c in self.input_columns if c not in columns]
        if missing:
            raise ValueError(f"the model needs input columns {self.input_columns}; missing {missing} (given {sorted(columns)})")
        if lengths.size == 0:
            raise ValueError("no sentences to tag")
        if np.any(lengths <= 0):
            raise ValueError(f"sentence {int(np.argmax(lengths <= 0))} has no tokens")
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        codes = np.empty(int(offsets[-1]), dtype=np.int64)
        token_marginals = np.full(int(offsets[-1]), np.nan)
        scores = np.empty(lengths.size)
        segments = []
        chunked = self.scheme != "none" and marginals
        with single_threaded_blas():  # tiny (n, L) @ (L, L) products: BLAS threads only cost
            for first, last in _groups(lengths, self.part.n_states):
                self._tag_group(
                    columns, lengths, offsets, allowed, first, last, codes, token_marginals, segments, scores, marginals
                )
        frame = None
        if chunked:
            frame = pd.concat(segments, ignore_index=True)
            frame = frame.astype({"sequence": np.int64, "start": np.int64, "end": np.int64, "confidence": np.float64})
        return Tagged(codes, token_marginals, offsets, frame, scores)

    def _tag_group(self, columns, lengths, offsets, allowed, first, last, codes, marginals, segments, scores, full=True) -> None:
        """Tag sentences ``first:last`` into ``codes``/``marginals`` (T,) and ``scores`` (N,),
        appending their chunks to ``segments``; ``full`` False: Viterbi only."""
        L = len(self.labels)
        chunked = self.scheme != "none"
        tokens = slice(int(offsets[first]), int(offsets[last]))
        part_lengths = lengths[first:last]
        part_offsets = offsets[first : last + 1] - offsets[first]
        emissions, transitions, start, end = self.part.scores(
            {c: np.asarray(columns[c])[tokens] for c in self.input_columns}, part_lengths
        )
        operator = chain.operator_of(transitions)  # maps states to labels (modulo L: hidden labels to labels)
        mask = None if allowed is None else operator.label_mask(allowed[tokens])
        states, scores[first:last] = chain.viterbi(emissions, transitions, start, end, part_lengths, allowed=mask)
        part_codes = operator.labels_at(states) % L
        if not full:
            codes[tokens] = part_codes
            return
        posterior = chain.forward_backward(
            emissions, transitions, start, end, part_lengths, keep_messages=chunked, allowed=mask, counts=False
        )
        by_label = operator.label_marginals(posterior.marginals, L)
        codes[tokens] = part_codes
        marginals[tokens] = by_label[np.arange(part_codes.size), part_codes]
        if chunked:
            windows = ChunkWindows.of(part_codes, part_offsets, self.labels)
            found = windows.chunks
            masked = emissions if mask is None else np.where(mask, emissions, -np.inf)
            if len(found) == 0:
                log_p = np.zeros(0)
            elif emissions.shape[1] == L and isinstance(transitions, np.ndarray):  # states are labels, first order: closed form
                log_p = windows.log_probability(part_codes, posterior, masked, transitions, start)
            else:
                window_first, window_masks, window_offsets = windows.window_masks(part_codes, part_offsets)
                with np.errstate(invalid="ignore"):  # a sentence of probability 0 gets NaN
                    log_p = chain.constrained_log_probability(
                        posterior.log_alpha, posterior.log_beta, posterior.log_z, masked, transitions, start,
                        part_offsets, found["sequence"].to_numpy(np.int64), window_first,
                        window_masks, window_offsets,
                    )  # fmt: skip
            found["confidence"] = np.exp(log_p)
            found["sequence"] = found["sequence"].to_numpy(np.int64) + first
            segments.append(found)

    def _allowed(self, fixed, offsets: np.ndarray) -> np.ndarray | None:
        """(T, L) masks from per-sentence {token index: label} dicts (None: no constraint)."""
        if fixed is None:
            return None
        n = offsets.size - 1
        if isinstance(fixed, (Mapping, str, bytes)) or not isinstance(fixed, (Sequence, np.ndarray)):
            raise ValueError(f"fixed must be a list with one dict (or None) per sentence, not {type(fixed).__name__}")
        if len(fixed) != n:
            raise ValueError(f"fixed has {len(fixed)} entries for {n} sentences")
        index = {label: i for i, label in enumerate(self.labels)}
        rows, labels = [], []
        for i, constraints in enumerate(fixed):
            if constraints is not None and not isinstance(constraints, Mapping):
                raise ValueError(
                    f"fixed: sentence {i}: a dict of {{token position: label}} (or None), not {type(constraints).__name__}"
                )
            for position, label in dict(constraints or {}).items():
                position = check_position(position, i, int(offsets[i + 1] - offsets[i]))
                if label not in index:
                    raise ValueError(f"fixed: sentence {i}, token {position}: unknown label {label!r} (labels: {self.labels})")
                rows.append(offsets[i] + position)
                labels.append(index[label])
        allowed = np.ones((int(offsets[-1]), len(self.labels)), dtype=bool)
        if rows:
            allowed[rows] = False
            allowed[rows, labels] = True
        return allowed

    # --- the user's calls -----------------------------------------------------------------

    def _columns_of(self, sentences) -> tuple[dict[str, np.ndarray], np.ndarray]:
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        tokens = [token for sentence in sentences for token in sentence]
        if not tokens:
            return {c: np.zeros(0, dtype=object) for c in self.input_columns}, lengths
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        if not isinstance(tokens[0], Mapping):
            if len(self.input_columns) != 1:
                raise ValueError(
                    f"tokens given as plain strings, but the model needs input columns {self.input_columns}: "
                    "give each token as a dict {column: value}"
                )
            values = np.fromiter(tokens, dtype=object, count=len(tokens))  # never a 2-D array of list tokens
            check_tokens({self.input_columns[0]: values}, offsets)
            self.check_numeric_cells({self.input_columns[0]: values}, offsets)
            self.check_column_values({self.input_columns[0]: values})
            return {self.input_columns[0]: values}, lengths
        is_dict = np.fromiter((isinstance(token, Mapping) for token in tokens), dtype=bool, count=len(tokens))
        if not is_dict.all():
            index = int(np.argmin(is_dict))
            sentence = int(np.searchsorted(offsets, index, side="right")) - 1
            raise TokenError(
                index, sentence, index - int(offsets[sentence]), self.input_columns[0], tokens[index],
                f"a token must be a dict {{column: value}} like the others, got {shown_value(tokens[index])}",
            )  # fmt: skip
        columns = {}
        for name in self.input_columns:
            try:
                columns[name] = np.array([token[name] for token in tokens], dtype=object)
            except KeyError:
                given = sorted({key for token in tokens for key in token})
                missing = [c for c in self.input_columns if any(c not in token for token in tokens)]
                raise ValueError(
                    f"the model needs input columns {self.input_columns}; missing {missing} (given {given})"
                ) from None
        check_tokens(columns, offsets)
        self.check_numeric_cells(columns, offsets)
        self.check_column_values(columns)
        return columns, lengths

    def tag(self, sentences: Sequence, fixed: Sequence[Mapping[int, str] | None] | None = None) -> list[dict]:
        """Tag sentences of token dicts or strings.

        A sentence with no labelling of nonzero probability (an HMM word never seen with its fixed
        label, say) gets labels None (and NaN marginals), with a warning.

        Parameters
        ----------
        sentences : sequence of sequences
            Each sentence a list of token dicts ``{column: value}`` holding every input column, or
            of strings when the model reads one column. An empty sentence gets empty lists.
        fixed : sequence of mapping or None, optional
            One entry per sentence: ``{token index (0-based): label}`` or None; decoding and
            marginals are then under those labels.

        Returns
        -------
        list of dict
            Per sentence ``{"labels": [...], "marginals": [...], "segments": [{"start", "end",
            "type", "confidence"}, ...]}``: ``marginals`` the probability of each predicted label,
            ``end`` exclusive, ``confidence`` the probability of the chunk (``segments`` only for
            chunk schemes).

        Raises
        ------
        TokenError
            A token that is not a non-empty string without whitespace (:func:`check_tokens`),
            naming sentence and token, counted from 0. It is a ValueError.
        ColumnValueError
            A column of another kind of value than the model saw there (:meth:`check_column_values`).
        ValueError
            A missing input column; plain strings for a model that reads several columns;
            ``fixed`` with the wrong number of entries, a token index out of range or an unknown label.
            Also: ``sentences`` given as a string or a sentence given as a string or one token dict
            (:func:`check_sentences`); ``fixed`` positions that are not integers (``1.7``, ``"1"``, ``True``).
        """
        check_sentences(sentences)
        if len(sentences) == 0:
            return []
        columns, lengths = self._columns_of(sentences)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        allowed = self._allowed(fixed, offsets)
        chunked = self.scheme != "none"
        out = [{"labels": [], "marginals": [], **({"segments": []} if chunked else {})} for _ in lengths]
        kept = np.flatnonzero(lengths > 0)
        if kept.size == 0:
            return out
        result = self.tag_arrays(columns, lengths[kept], allowed)
        result.warn_impossible("their labels are None", kept, fixed=fixed is not None)
        classes = np.array(self.labels, dtype=object)
        for j, (i, a, b) in enumerate(zip(kept, offsets[kept], offsets[kept + 1])):
            # no labelling of nonzero probability (under the fixed labels): none is reported
            out[i]["labels"] = classes[result.codes[a:b]].tolist() if result.possible[j] else [None] * int(b - a)
            out[i]["marginals"] = result.marginals[a:b].tolist()
        if result.segments is not None:
            for row in result.segments.itertuples(index=False):
                if not result.possible[row.sequence]:  # no labelling, so no chunks either
                    continue
                out[kept[row.sequence]]["segments"].append(
                    {"start": int(row.start), "end": int(row.end), "type": str(row.type), "confidence": float(row.confidence)}
                )
        return out

    def tag_frame(self, frame: pd.DataFrame, sentence: str = "sentence") -> pd.DataFrame:
        """Tag a long-form frame: one row per token.

        Parameters
        ----------
        frame : pandas.DataFrame
            A sentence id column (integers or strings; each sentence's rows together) and the input
            columns (token strings).
        sentence : str, default="sentence"
            The name of the sentence id column.

        Returns
        -------
        pandas.DataFrame
            A copy (same index and row order) with ``label`` (missing, with a warning, for a sentence of
            probability 0 under the model) and ``marginal`` (the probability of the label) added,
            and ``segment_confidence`` (the probability of the token's chunk; NaN outside chunks)
            for chunk schemes.

        Raises
        ------
        TokenError
            A bad token, as :meth:`tag` checks them (sentences and tokens counted from 0 in the
            order of the rows).
        ColumnValueError
            A column of another kind of value than the model saw there, as :meth:`tag` checks them.
        ValueError
            A missing column, a column named as an output (``label``, ``marginal``,
            ``segment_confidence``), or a sentence id that is missing, of another kind than the
            first, or that reappears after another one (:func:`sentence_offsets`).
            Also: a column that appears more than once (:func:`check_unique_columns`, the served
            model's check).
        """
        check_unique_columns(frame.columns)
        written = [c for c in FRAME_OUTPUTS if c in frame.columns]
        if written:  # it would be replaced by the prediction: gold labels sent as "label" would come back as the model's
            raise ValueError(f"the input has a column {written[0]!r}, which tag_frame writes (its outputs: "
                             f"{', '.join(FRAME_OUTPUTS)}): rename it")  # fmt: skip
        missing = [c for c in [sentence, *self.input_columns] if c not in frame.columns]
        if missing:
            raise ValueError(
                f"the model needs columns {[sentence, *self.input_columns]}; missing {missing} (given {list(frame.columns)})"
            )
        out = frame.copy()
        if len(frame) == 0:
            out["label"] = pd.Series(dtype=object)
            out["marginal"] = pd.Series(dtype=np.float64)
            if self.scheme != "none":
                out["segment_confidence"] = pd.Series(dtype=np.float64)
            return out
        offsets = sentence_offsets(frame[sentence].to_numpy(), sentence)
        columns = {c: frame[c].to_numpy(dtype=object) for c in self.input_columns}
        check_tokens(columns, offsets)  # numbers are refused, not read as their text
        self.check_numeric_cells(columns, offsets)
        self.check_column_values(columns)
        result = self.tag_arrays(columns, np.diff(offsets))
        labels = np.array(self.labels, dtype=object)[result.codes]
        result.warn_impossible("their rows' labels are None")
        labels[np.repeat(~result.possible, np.diff(offsets))] = None
        out["label"] = labels
        out["marginal"] = result.marginals
        if result.segments is not None:
            confidence = np.full(len(frame), np.nan)
            seg = result.segments
            widths = (seg["end"] - seg["start"]).to_numpy()
            first = offsets[seg["sequence"].to_numpy()] + seg["start"].to_numpy()
            tokens = np.repeat(first, widths) + positions_within(widths)
            confidence[tokens] = np.repeat(seg["confidence"].to_numpy(), widths)
            out["segment_confidence"] = confidence
        return out


def load_bundle(path: str | os.PathLike) -> ModelBundle:
    """Read a :class:`ModelBundle` file (:meth:`ModelBundle.load`).

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :meth:`ModelBundle.save`.

    Returns
    -------
    ModelBundle

    Raises
    ------
    crf.ModelFileError
        Naming ``path``, on a bad file.
    """
    return ModelBundle.load(path)

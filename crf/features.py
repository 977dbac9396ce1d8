"""Feature extraction configured by data: views, CRF++-style templates, lexicons, numbers.

Vocabulary
----------
A *view* is one string (or nothing) per token: a raw input column (``w``, ``pos``) or a token
function of a column (``lower``, ``shape``, ``suffix`` with ``n``, ``is_title``, ...) or lexicon
membership (``lexicon`` with a file of entries, matched as longest multi-token spans and marked
``B-TYPE``/``I-TYPE``), or membership in the lexicon of the fitting data's own entity mentions
(``mentions``: learned from a ``label`` column when fitting, matched out of fold on the fitting data
itself, see :func:`out_of_fold_marks`), or an abbreviation's long-form head (``abbreviation``: a short form defined as
``long form ( SF )`` carries the long form's last word on its uses in the next ``n`` tokens;
``abbreviation_loose`` also reads ``( SF ;``/``,``/``/`` and skips ``type``-like words and Roman
numerals before the ``(``; the ``_suffix`` variants give the head's last 4 letters) or a word
cluster (``cluster`` with a ``path`` to a Brown paths file, see :mod:`crf.clusters`: the first ``n``
bits of the word's path, the whole path when shorter or ``n=0``; a word without a path, unknown to
the clustering, has no value and so no attribute).
A *template* such as ``w[-1]|w[0]`` conjoins views at relative offsets; its
attribute for a token is the string ``w[-1]|w[0]=He|reckons`` (CRFsuite's naming). Cells outside
the sentence either drop the attribute (``padding=False``, CRFsuite's chunking example) or take the
value ``__BOS__`` / ``__EOS__`` (``padding=True``, CRF++). ``numeric`` columns become real-valued
attributes named after the column, and ``bos_eos`` adds ``__BOS__`` on the first and ``__EOS__`` on
the last token.

How it stays fast: each view is computed once per distinct source value, never per token; each
template's cells are integer codes combined into one int64 key per token; fitting is ``np.unique``
over those keys and transforming is ``np.searchsorted``. No attribute string is built per token.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ._persist import ModelFileError, check_unique, checked_array
from .attributes import TOO_LARGE, AttributeIndex  # noqa: F401  (AttributeIndex re-exported: python-crfsuite-style input)
from .batch import SequenceBatch, offsets_from_lengths
from .io import DataFormatError, Sentence, decoded_lines

BOS, EOS = "__BOS__", "__EOS__"


# --- token functions: str -> str | None (None: no attribute for this token) -------------------


def _shape(word: str) -> str:
    out = []
    for ch in word:
        if ch.isupper():
            out.append("X")
        elif ch.islower():
            out.append("x")
        elif ch.isdigit():
            out.append("d")
        else:
            out.append(ch)
    return "".join(out)


def _short_shape(word: str) -> str:
    return re.sub(r"(.)\1+", r"\1", _shape(word))


def _flag(value: bool) -> str | None:
    return "1" if value else None


# --- biomedical NER token functions (the kinds of BANNER, tmChem, DNorm/TaggerOne) ----------------

GREEK_LETTERS = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
)  # fmt: skip
# a Greek letter as a word or as a word part ("alpha", "TNF-alpha", "beta2", "Alpha-1"), or a Greek character
_GREEK = re.compile(r"(?:^|[^a-z])(" + "|".join(GREEK_LETTERS) + r")(?=$|[^a-z])|([\u0391-\u03c9])", re.IGNORECASE)
_ROMAN = re.compile(r"^(?=[IVXLC])C{0,3}(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})$")
# a chemical formula: element-like symbols with counts ("H2O", "NaCl", "CaCO3", "Fe2+", "(NH4)2SO4"),
# at least two symbols or one symbol with a count
_FORMULA = re.compile(r"^(?:\(?[A-Z][a-z]?\d*\)?\d*){1,}[+-]?$")
_FORMULA_PARTS = re.compile(r"[A-Z][a-z]?")
# suffixes stripped by `stem`, longest first; what remains must keep at least 3 characters
_SUFFIXES = (
    "ational", "ations", "ation", "ements", "ement", "nesses", "ness", "ities", "ity", "ically", "ical",
    "ingly", "ings", "ing", "edly", "ies", "ied", "ed", "es", "ly", "al", "ic", "s",
)  # fmt: skip


def _greek(word: str) -> str | None:
    """The first Greek letter named or written in ``word`` (lower-cased name or character), or None."""
    match = _GREEK.search(word)
    if match is None:
        return None
    return (match.group(1) or match.group(2)).lower()


def _is_roman(word: str) -> bool:
    """``word`` is an upper-case Roman numeral (I .. CCCXCIX)."""
    return bool(_ROMAN.match(word))


def _is_formula(word: str) -> bool:
    """``word`` looks like a chemical formula: element-like symbols and counts, with a digit, a
    charge or at least two symbols ("H2O", "NaCl", "Ca2+"); a plain capitalised word is not one."""
    if not _FORMULA.match(word) or word.isupper() and len(word) > 1 and not any(c.isdigit() for c in word):
        return False
    parts = _FORMULA_PARTS.findall(word)
    return any(c.isdigit() or c in "+-" for c in word) or len(parts) >= 2 and "".join(parts) == word


def _punct_pattern(word: str) -> str | None:
    """The non-alphanumeric characters inside ``word`` in order ("1,2-diol" -> ",-"), for tokens
    that also hold a letter or digit; None otherwise."""
    if not any(c.isalnum() for c in word):
        return None
    marks = "".join(c for c in word if not c.isalnum())
    return marks or None


def _digit_norm(word: str) -> str:
    """Lower-cased ``word`` with every run of digits replaced by ``0`` ("IL-12" -> "il-0")."""
    return re.sub(r"\d+", "0", word.lower())


def _stem(word: str) -> str:
    """A small suffix-stripping stemmer over the digit-normalised lower-cased word: the longest
    suffix of a fixed list is removed when at least 3 characters stay, then a final "e" ("tumours" ->
    "tumour", "induce", "induced" and "inducing" -> "induc", "toxicities" -> "toxic"); "ies" becomes "y"."""
    low = _digit_norm(word)
    if not low.isalpha() or len(low) <= 4:
        return low
    stem = low
    for suffix in _SUFFIXES:
        if low.endswith(suffix) and len(low) - len(suffix) >= 3:
            stem = low[: -len(suffix)]
            stem = stem + "y" if suffix in ("ies", "ied") else stem
            break
    return stem[:-1] if stem.endswith("e") and len(stem) > 3 else stem


def _digit_count(word: str, n: int) -> str | None:
    """How many digits ``word`` holds, capped at ``n`` (None without digits)."""
    count = sum(c.isdigit() for c in word)
    return str(min(count, n or 10**9)) if count else None


TOKEN_FUNCTIONS: dict[str, Callable[[str, int], str | None]] = {
    "identity": lambda w, n: w,
    "lower": lambda w, n: w.lower(),
    "shape": lambda w, n: _shape(w),
    "short_shape": lambda w, n: _short_shape(w),
    "prefix": lambda w, n: w[:n] if len(w) >= n else None,
    "suffix": lambda w, n: w[-n:] if len(w) >= n else None,
    "length": lambda w, n: str(min(len(w), n or 10**9)),
    "is_title": lambda w, n: _flag(w.istitle()),
    "is_upper": lambda w, n: _flag(w.isupper()),
    "is_lower": lambda w, n: _flag(w.islower()),
    "is_digit": lambda w, n: _flag(w.isdigit()),
    "has_digit": lambda w, n: _flag(any(c.isdigit() for c in w)),
    "has_upper": lambda w, n: _flag(any(c.isupper() for c in w)),
    "has_hyphen": lambda w, n: _flag("-" in w),
    "is_punct": lambda w, n: _flag(all(not c.isalnum() for c in w)),
    "greek": lambda w, n: _greek(w),
    "is_roman": lambda w, n: _flag(_is_roman(w)),
    "is_formula": lambda w, n: _flag(_is_formula(w)),
    "punct_pattern": lambda w, n: _punct_pattern(w),
    "digit_norm": lambda w, n: _digit_norm(w),
    "stem": lambda w, n: _stem(w),
    "digit_count": _digit_count,
}

# view functions that read the whole corpus in order, not one token: lexicon spans, abbreviations
CORPUS_FUNCTIONS = (
    "lexicon",
    "mentions",
    "abbreviation_mentions",
    "abbreviation",
    "abbreviation_suffix",
    "abbreviation_loose",
    "abbreviation_loose_suffix",
)
# corpus functions that learn a lexicon from the fitting data's labels (ViewSpec.label)
_MENTION_FUNCTIONS = ("mentions", "abbreviation_mentions")
# view functions that look words up in a table read from a file: Brown cluster path prefixes
TABLE_FUNCTIONS = ("cluster",)

_SHORT_FORM = re.compile(r"^(?=.*[A-Z])[A-Za-z0-9][A-Za-z0-9+-]{1,9}$")
_HEAD_WORD = re.compile(r"^[A-Za-z][A-Za-z-]{2,}$")


def abbreviation_heads(
    words: np.ndarray,
    position: np.ndarray,
    length: np.ndarray,
    window: int = 400,
    loose: bool = False,
    carry: np.ndarray | None = None,
) -> np.ndarray:
    """The head word of each abbreviation's long form, on every use of the abbreviation.

    A definition is ``long form ( SF )`` inside one sentence: ``SF`` a short form (2 to 10
    letters, digits, ``+``/``-``, with an upper-case letter) between a ``(`` and a ``)`` token,
    after a word of at least 3 letters, the long form's head (lower-cased: "atrial fibrillation (
    AF )" gives ``fibrillation``). Every token equal to a short form defined at most ``window``
    tokens before it (the nearest such definition; the definition's own short form included) gets
    that head; the others get None. Corpora of abstracts in document order put an abstract's
    definitions before its later uses of the abbreviation.

    Parameters
    ----------
    words : ndarray of shape (T,), object
        The corpus' tokens in order.
    position : ndarray of shape (T,), int
        Each token's index in its sentence.
    length : ndarray of shape (T,), int
        Its sentence's length.
    window : int, default=400
        The most tokens a use may follow its definition by.
    loose : bool, default=False
        Also read ``( SF ;``, ``( SF ,`` and ``( SF /`` definitions ("Schwartz - Jampel syndrome
        ( SJS ; ..."), and take as head the nearest of the 3 words before the ``(`` that is a head
        word and neither a Roman numeral nor a word like ``type`` ("osteopetrosis type 2 ( AO2 )"
        gives ``osteopetrosis``): the ``abbreviation_loose`` views.
    carry : ndarray of shape (T,), object, optional
        Values per token to carry instead of the head word: each use gets ``carry`` at its
        definition's head (None there: no value); the ``abbreviation_mentions`` view carries the
        training-mention lexicon's type of the long form's last word.

    Returns
    -------
    ndarray of shape (T,), object
        The lower-cased head word (or its ``carry`` value) on each use of a defined short form,
        None elsewhere.
    """
    words = np.asarray(words, dtype=object)
    n = words.size
    heads = np.full(n, None, dtype=object)
    if n < 4:
        return heads
    # candidate short forms at i: words[i-1] == "(", words[i+1] == ")", all in one sentence, a head at i-2
    i = np.arange(2, n - 1)
    inside = (position[i] >= 2) & (position[i] + 1 < length[i])
    closers = _LOOSE_CLOSERS if loose else (")",)
    i = i[inside & (words[i - 1] == "(") & np.isin(words[i + 1], closers)]
    if i.size == 0:
        return heads
    short = np.fromiter((bool(_SHORT_FORM.match(sf)) for sf in words[i]), dtype=bool, count=i.size)
    # the head: the word before the "(" (loose: the nearest head word of the 3 before it, in the sentence)
    head_at = np.full(i.size, -1, dtype=np.int64)
    for back in range(2, 5 if loose else 3):
        candidate = i - back
        valid = (head_at < 0) & (position[i] >= back)
        valid[valid] = [_is_head(w, loose) for w in words[candidate[valid]]]
        head_at[valid] = candidate[valid]
    ok = short & (head_at >= 0)
    defined, head_of = i[ok], dict(zip(i[ok].tolist(), head_at[ok].tolist()))
    if defined.size == 0:
        return heads
    # every use of a defined short form, matched to the nearest definition at or before it
    forms, form_codes = np.unique(words[defined].astype(str), return_inverse=True)
    token_codes = pd.Index(forms).get_indexer(pd.Index(words, dtype=object))
    uses = np.flatnonzero(token_codes >= 0)
    def_keys = form_codes.astype(np.int64) * n + defined  # sorted by (form, position)
    order = np.argsort(def_keys)
    def_keys, defined = def_keys[order], defined[order]
    use_keys = token_codes[uses].astype(np.int64) * n + uses
    slot = np.searchsorted(def_keys, use_keys, side="right") - 1
    found = slot >= 0
    found[found] = def_keys[slot[found]] // n == token_codes[uses[found]]
    source = np.where(found, defined[np.maximum(slot, 0)], -1)
    near = found & (uses - source <= window)
    head_positions = np.fromiter((head_of[d] for d in source[near].tolist()), dtype=np.int64, count=int(near.sum()))
    if carry is not None:
        heads[uses[near]] = np.asarray(carry, dtype=object)[head_positions]
    else:
        heads[uses[near]] = np.array([w.lower() for w in words[head_positions]], dtype=object)
    return heads


_LOOSE_CLOSERS = (")", ";", ",", "/")
_NOT_HEADS = frozenset({"type", "types", "form", "forms", "class", "stage", "grade", "group"})


def _is_head(word: str, loose: bool) -> bool:
    """Whether ``word`` can head an abbreviation's long form (see :func:`abbreviation_heads`)."""
    if not _HEAD_WORD.match(word):
        return False
    return not loose or (word.lower() not in _NOT_HEADS and not _ROMAN.match(word))


class NumericValueError(ValueError):
    """A cell of a numeric feature column that is no finite number, or too large; names the column,
    the sentence and the token (counted from 0)."""


def numeric_cells(cells: Sequence) -> tuple[np.ndarray, tuple[int, str] | None]:
    """The values of a ``numeric`` column's cells, and its first bad cell.

    A cell is read as pandas reads a number (``pd.to_numeric``); it is bad when it is no finite
    number, or when its size is :data:`TOO_LARGE` or more (one such score drowns the rest of its
    sentence).

    Parameters
    ----------
    cells : sequence of str or number, length T
        The column's cells, in token order.

    Returns
    -------
    values : ndarray of shape (T,), float64
        The parsed values (NaN where a cell is not a number).
    bad : (int, str) or None
        The index of the first bad cell and what is wrong with it ("has the non-numeric value
        'x'", or "has the value 1e+12, too large ..."), or None when every cell is good.
    """
    values = pd.to_numeric(pd.Series(cells, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    wrong = np.flatnonzero(~np.isfinite(values))
    if wrong.size:
        return values, (int(wrong[0]), f"has the non-numeric value {cells[int(wrong[0])]!r}")
    large = np.flatnonzero(np.abs(values) >= TOO_LARGE)
    if large.size:
        return values, (int(large[0]), f"has the value {values[large[0]]:g}, too large (the limit is {TOO_LARGE:g}): scale it")
    return values, None


@dataclass
class ViewSpec:
    """How to compute one view: ``fn`` applied to ``column`` (``n`` for affixes and lengths).

    Parameters
    ----------
    column : str
        The input column the view reads.
    fn : str, default="identity"
        A token function (``TOKEN_FUNCTIONS``), a corpus function (``"lexicon"``, ``"mentions"``,
        ``"abbreviation"``, ``"abbreviation_suffix"``) or ``"cluster"``.
    n : int, default=0
        The function's number: affix or length for token functions, the path prefix length for
        ``"cluster"`` (0: the whole path), the number of folds for ``"mentions"`` (0: 10).
    path : str, optional
        The lexicon file (``"lexicon"``) or Brown paths file (``"cluster"``); they need one.
    lowercase : bool, default=False
        Match the lexicon, or look clusters up, on lower-cased tokens.
    label : str, optional
        The label column (IOB2) whose entity mentions make a ``"mentions"`` view's lexicon; read
        by :meth:`FeatureExtractor.fit` only, never when transforming.
    """

    column: str
    fn: str = "identity"
    n: int = 0
    path: str | None = None  # lexicon file (fn "lexicon") or Brown paths file (fn "cluster", n: prefix length)
    lowercase: bool = False  # lexicon matching / cluster lookup on lower-cased tokens
    label: str | None = None  # fn "mentions": the IOB2 label column the lexicon is learned from (at fit only)


@dataclass
class _Template:
    name: str
    cells: list[tuple[str, int]]  # (view name, offset)


_CELL = re.compile(r"^\s*([A-Za-z_][\w.]*)\[\s*(-?\d+)\s*\]\s*$")


def parse_template(text: str) -> _Template:
    """Parse ``view[offset]|view[offset]|...`` into its cells.

    Parameters
    ----------
    text : str
        A template such as ``"w[-1]|w[0]"``: cells ``name[offset]`` joined by ``|`` (spaces
        around a cell allowed); the offset is an integer, negative for tokens before.

    Returns
    -------
    _Template
        ``name`` (``text`` stripped) and ``cells``, a list of (view name, offset).

    Raises
    ------
    ValueError
        A cell not of the form ``name[offset]``.
    """
    cells = []
    for part in text.split("|"):
        match = _CELL.match(part)
        if not match:
            raise ValueError(f"bad template {text!r}: cell {part!r} is not of the form name[offset]")
        cells.append((match.group(1), int(match.group(2))))
    return _Template(text.strip(), cells)


def template_views(text: str) -> list[str]:
    """The names a template's cells read (``"w[-1] | pos[0]"`` -> ``["w", "pos"]``), read leniently:
    a cell that is not of the form ``name[offset]`` gives what stands before its ``[``
    (:func:`parse_template` names such a cell as an error)."""
    return [part.split("[")[0].strip() for part in str(text).split("|")]


def repeated_template(templates: Sequence[str]) -> tuple[str, str] | None:
    """The first two of ``templates`` that read the same cells, in any order or spacing.

    Two such templates (``"w[0]|w[1]"`` and ``"w[1] | w[0]"``) make the same features under two
    names, counting their evidence twice against the prior.

    Parameters
    ----------
    templates : sequence of str
        Templates as :func:`parse_template` reads them; those that do not parse are skipped (it
        names them).

    Returns
    -------
    tuple of (str, str) or None
        The earlier and the later of the first such pair; None when all differ.
    """
    seen: dict[frozenset, str] = {}
    for text in templates:
        try:
            key = frozenset(parse_template(str(text)).cells)
        except ValueError:
            continue
        if key in seen:
            return seen[key], str(text)
        seen[key] = str(text)
    return None


def _is_flag(value) -> bool:
    """True or False, or the integers 1 and 0 (as extractors saved before switches were checked may hold)."""
    return isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1))


@dataclass
class _Corpus:
    """Token-level arrays of a corpus: one object array per input column, plus positions."""

    columns: dict[str, np.ndarray]
    lengths: np.ndarray  # (N,)
    position: np.ndarray  # (T,) index of each token within its sentence
    length: np.ndarray  # (T,) length of each token's sentence

    def where(self, token: int) -> str:
        """``sentence s, token t`` of the flat token index ``token``."""
        sentence = int(np.searchsorted(np.cumsum(self.lengths), token, side="right"))
        return f"sentence {sentence}, token {int(self.position[token])}"


def _corpus(sentences: Sequence[Sentence], names: Sequence[str], needed: set[str]) -> _Corpus:
    if len(sentences) == 0:
        raise ValueError("no sentences given")
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    if np.any(lengths == 0):
        raise ValueError(f"sentence {int(np.argmax(lengths == 0))} has no tokens")
    columns = {}
    for index, name in enumerate(names):
        if name in needed:
            columns[name] = np.array([row[index] for s in sentences for row in s], dtype=object)
    offsets = offsets_from_lengths(lengths)
    length = np.repeat(lengths, lengths)
    position = np.arange(int(lengths.sum())) - np.repeat(offsets[:-1], lengths)
    return _Corpus(columns, lengths, position, length)


@dataclass
class FeatureExtractor:
    """Turn sentences (lists of token rows) into a :class:`SequenceBatch`.

    Parameters
    ----------
    columns : sequence of str
        Names of the input columns by position (a label column may be named and unused).
    templates : sequence of str, default=()
        CRF++-style templates over views, e.g. ``["w[0]", "w[-1]|w[0]", "pos[0]"]``.
    views : mapping of str to mapping, default={}
        Derived views, name -> ``{"column": "w", "fn": "suffix", "n": 3}`` (the fields of
        :class:`ViewSpec`); every column name is a view of itself.
    numeric : sequence of str, default=()
        Columns whose float value becomes a real-valued attribute of that name.
    bos_eos : bool, default=True
        Add ``__BOS__`` to first and ``__EOS__`` to last tokens.
    padding : bool, default=False
        Cells outside the sentence read ``__BOS__``/``__EOS__`` (True) or drop the attribute (False).
    min_count : int, default=1
        Keep template attributes seen at least this many times in the fitting data.

    Raises
    ------
    ValueError
        A view of an unknown column or function (or a lexicon/cluster view without ``path``), a
        bad template, a template over an unknown view, or a ``numeric`` name that is not a column.
    """

    columns: Sequence[str]
    templates: Sequence[str] = ()
    views: Mapping[str, Mapping] = field(default_factory=dict)
    numeric: Sequence[str] = ()
    bos_eos: bool = True
    padding: bool = False
    min_count: int = 1

    def __post_init__(self) -> None:
        self.columns = list(self.columns)
        for name in ("bos_eos", "padding"):
            if not _is_flag(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")
            setattr(self, name, bool(getattr(self, name)))
        self._specs: dict[str, ViewSpec] = {name: ViewSpec(column=name) for name in self.columns}
        for name, spec in dict(self.views).items():
            spec = ViewSpec(**dict(spec))
            if spec.column not in self.columns:
                raise ValueError(f"view {name!r} reads unknown column {spec.column!r}")
            known = [*TOKEN_FUNCTIONS, *CORPUS_FUNCTIONS, *TABLE_FUNCTIONS]
            if spec.fn not in known:
                raise ValueError(f"view {name!r}: unknown function {spec.fn!r}; known: {sorted(known)}")
            if spec.fn in ("lexicon", "cluster") and not spec.path:
                raise ValueError(f"view {name!r}: a {spec.fn} view needs a 'path'")
            if spec.fn in _MENTION_FUNCTIONS and spec.label not in self.columns:
                raise ValueError(f"view {name!r}: a {spec.fn} view needs a 'label' column, one of {self.columns}")
            if spec.fn in _MENTION_FUNCTIONS and (not isinstance(spec.n, int) or spec.n < 0 or spec.n == 1):
                raise ValueError(f"view {name!r}: the number of folds n={spec.n!r} must be 0 (10) or a whole number >= 2")
            if spec.fn == "cluster" and (not isinstance(spec.n, int) or spec.n < 0):
                raise ValueError(f"view {name!r}: prefix length n={spec.n!r} must be a whole number >= 0")
            if not _is_flag(spec.lowercase):  # "no" would read as true
                raise ValueError(f"view {name!r}: lowercase={spec.lowercase!r} must be true or false")
            spec.lowercase = bool(spec.lowercase)
            self._specs[name] = spec
        self._templates = [parse_template(t) for t in self.templates]
        for template in self._templates:
            for view, _ in template.cells:
                if view not in self._specs:
                    raise ValueError(f"template {template.name!r} uses unknown view {view!r}")
        for name in self.numeric:
            if name not in self.columns:
                raise ValueError(f"numeric attribute {name!r} is not a column")
        self._lexicons: dict[str, dict[tuple[str, ...], str]] = {}
        self._tables: dict[str, dict[str, str]] = {}  # cluster view -> {word: path prefix}
        self._paths_files: dict[str, dict[str, str]] = {}  # the last paths file read
        self._fit_marks: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # mentions view -> (words, lengths, marks)
        self.fitted_ = False

    # --- views ---------------------------------------------------------------------------

    def _used_views(self) -> list[str]:
        return sorted({view for t in self._templates for view, _ in t.cells})

    def _lexicon(self, name: str) -> dict[tuple[str, ...], str]:
        if name not in self._lexicons:
            spec = self._specs[name]
            self._lexicons[name] = read_lexicon(spec.path, spec.lowercase)
        return self._lexicons[name]

    def _table(self, name: str) -> dict[str, str]:
        """{word: value} of a cluster view: its path prefixes, read from its paths file once (or
        from the saved state)."""
        if name not in self._tables:
            from .clusters import path_prefixes, read_paths

            spec = self._specs[name]
            if spec.path not in self._paths_files:  # several prefix views read one file once
                self._paths_files = {spec.path: read_paths(spec.path)}
            self._tables[name] = path_prefixes(self._paths_files[spec.path], spec.n)
        return self._tables[name]

    def _view_values(self, name: str, corpus: _Corpus) -> tuple[np.ndarray, np.ndarray]:
        """(codes (T,) into ``uniques``, uniques) for view ``name``; code -1 means no value."""
        spec = self._specs[name]
        source = corpus.columns[spec.column]
        if spec.fn == "lexicon":
            words = np.array([w.lower() for w in source], dtype=object) if spec.lowercase else source
            marks = lexicon_marks(words, corpus.position, corpus.length, self._lexicon(name))
            return pd.factorize(marks, use_na_sentinel=True)
        if spec.fn in _MENTION_FUNCTIONS:
            fitted = self._fit_marks.get(name)
            if fitted is not None and _same_tokens(fitted[0], fitted[1], source, corpus.lengths):
                marks = fitted[2]  # the fitting data: its out-of-fold marks
            else:
                words = _lowered(source) if spec.lowercase else source
                marks = lexicon_marks(words, corpus.position, corpus.length, self._lexicons[name])
            if spec.fn == "abbreviation_mentions":  # the type of the long form's last word, on the short form's uses
                kinds = np.array([m if m is None else m.partition("-")[2] or m for m in marks], dtype=object)
                marks = abbreviation_heads(source, corpus.position, corpus.length, 400, loose=True, carry=kinds)
            return pd.factorize(marks, use_na_sentinel=True)
        if spec.fn.startswith("abbreviation"):
            heads = abbreviation_heads(source, corpus.position, corpus.length, spec.n or 400, loose="loose" in spec.fn)
            if spec.fn.endswith("_suffix"):  # the head's last 4 letters: "fibrillation" -> "tion"
                heads = np.array([h if h is None else h[-4:] for h in heads], dtype=object)
            return pd.factorize(heads, use_na_sentinel=True)
        codes, uniques = pd.factorize(source)
        if spec.fn == "identity":
            return codes, np.asarray(uniques, dtype=object)
        if spec.fn == "cluster":  # one look-up per distinct word; unknown words get None
            table = self._table(name)
            mapped = np.array([table.get(u.lower() if spec.lowercase else u) for u in uniques], dtype=object)
        else:
            function = TOKEN_FUNCTIONS[spec.fn]
            mapped = np.array([function(u, spec.n) for u in uniques], dtype=object)
        view_codes, view_uniques = pd.factorize(mapped, use_na_sentinel=True)
        return np.where(codes >= 0, view_codes[codes], -1), np.asarray(view_uniques, dtype=object)

    # --- templates -----------------------------------------------------------------------

    def _template_keys(self, template: _Template, view_codes: dict[str, np.ndarray], corpus: _Corpus) -> np.ndarray:
        """One int64 key per token for ``template``; -1 where the attribute is absent."""
        keys = np.zeros(corpus.position.size, dtype=np.int64)
        valid = np.ones(corpus.position.size, dtype=bool)
        multiplier = 1
        for view, offset in template.cells:
            size = len(self.vocabulary_[view])
            codes = view_codes[view]
            target = corpus.position + offset
            inside = (target >= 0) & (target < corpus.length)
            cell = np.full(codes.size, -1, dtype=np.int64)
            source_rows = np.flatnonzero(inside)
            cell[source_rows] = codes[source_rows + offset]
            if self.padding:
                cell[target < 0] = size
                cell[target >= corpus.length] = size + 1
            valid &= cell >= 0
            keys += np.maximum(cell, 0) * multiplier
            multiplier *= size + 2
            if multiplier >= 2**62:
                raise ValueError(f"template {template.name!r} has too many value combinations for int64 keys")
        keys[~valid] = -1
        return keys

    def _view_codes_fitted(self, corpus: _Corpus) -> dict[str, np.ndarray]:
        """Codes of every used view against the fitted vocabularies (-1: unseen or absent)."""
        out = {}
        for name in self._used_views():
            codes, uniques = self._view_values(name, corpus)
            index = self._view_index[name]
            if len(uniques) == 0:
                out[name] = np.full(codes.size, -1, dtype=np.int64)
                continue
            lookup = index.get_indexer(pd.Index(uniques, dtype=object))
            out[name] = np.where(codes >= 0, lookup[np.maximum(codes, 0)], -1).astype(np.int64)
        return out

    def fit(self, sentences: Sequence[Sentence]) -> FeatureExtractor:
        """Fit the view vocabularies and the attribute vocabulary on ``sentences``.

        Parameters
        ----------
        sentences : sequence of sentences
            Each sentence a non-empty list of token rows (tuples of column strings, as the
            :mod:`crf.io` readers give them) with at least ``len(columns)`` cells.

        Returns
        -------
        FeatureExtractor
            self, fitted (``vocabulary_``, ``template_keys_``, ``fitted_``).

        Raises
        ------
        ValueError
            No sentences, an empty sentence or a token row with fewer cells than ``columns``
            (naming sentence and token); two templates that read the same cells.
        DataFormatError
            A bad lexicon or cluster file (read on first use).

        Notes
        -----
        A ``"mentions"`` view learns its lexicon from the label column of ``sentences``; on these
        same sentences (:meth:`transform` of the fitting data) it gives out-of-fold marks, each
        fold's tokens matched against the mentions of the other folds (contiguous blocks of
        sentences), so the training data does not see its own mentions; on other data it matches
        the whole lexicon.
        """
        repeated = repeated_template([t.name for t in self._templates])
        if repeated is not None:
            raise ValueError(f"templates {repeated[0]!r} and {repeated[1]!r} read the same cells: keep one")
        mention_views = [v for v in self._used_views() if self._specs[v].fn in _MENTION_FUNCTIONS]
        corpus = self._read(sentences, extra={self._specs[v].label for v in mention_views})
        self._fit_marks = {}
        for name in mention_views:
            spec = self._specs[name]
            source = corpus.columns[spec.column]
            words = _lowered(source) if spec.lowercase else source
            labels = corpus.columns[spec.label]
            self._lexicons[name] = mention_lexicon(words, labels, corpus.position)
            marks = out_of_fold_marks(words, labels, corpus.position, corpus.length, corpus.lengths, spec.n or 10)
            self._fit_marks[name] = (source, corpus.lengths, marks)
        self.vocabulary_: dict[str, np.ndarray] = {}
        self._view_index: dict[str, pd.Index] = {}
        for name in self._used_views():
            _, uniques = self._view_values(name, corpus)
            self.vocabulary_[name] = np.asarray(uniques, dtype=str)
            self._view_index[name] = pd.Index(uniques, dtype=object)
        view_codes = self._view_codes_fitted(corpus)
        self.template_keys_: list[np.ndarray] = []
        for template in self._templates:
            keys = self._template_keys(template, view_codes, corpus)
            unique, counts = np.unique(keys[keys >= 0], return_counts=True)
            self.template_keys_.append(unique[counts >= self.min_count])
        self.fitted_ = True
        self._names: np.ndarray | None = None
        return self

    @property
    def n_attributes(self) -> int:
        """How many attribute columns :meth:`transform` gives (template keys, numeric columns, BOS/EOS)."""
        self._check_fitted()
        return int(sum(k.size for k in self.template_keys_)) + len(self.numeric) + (2 if self.bos_eos else 0)

    def _check_fitted(self) -> None:
        if not self.fitted_:
            raise RuntimeError("FeatureExtractor is not fitted; call fit() first")

    def _read(self, sentences: Sequence[Sentence], extra: set[str] = frozenset()) -> _Corpus:
        needed = {self._specs[v].column for v in self._used_views()} | set(self.numeric) | set(extra)
        widths = np.fromiter(map(len, chain.from_iterable(sentences)), dtype=np.int64)
        short = np.flatnonzero(widths < len(self.columns))
        if short.size:
            lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
            offsets = offsets_from_lengths(lengths)
            i = int(np.searchsorted(offsets, short[0], side="right")) - 1
            raise ValueError(
                f"sentence {i}, token {short[0] - offsets[i]}: {widths[short[0]]} columns, "
                f"the extractor expects {len(self.columns)} ({self.columns})"
            )
        return _corpus(sentences, self.columns, needed)

    def transform(self, sentences: Sequence[Sentence]) -> SequenceBatch:
        """Featurise ``sentences`` with the fitted vocabulary; unseen attributes are ignored.

        Parameters
        ----------
        sentences : sequence of sentences
            Each sentence a non-empty list of token rows (tuples of column strings, as the
            :mod:`crf.io` readers give them) with at least ``len(columns)`` cells.

        Returns
        -------
        SequenceBatch
            ``X`` (T, A) float64 CSR (A = :attr:`n_attributes`; 1.0 per present attribute, the
            value for ``numeric`` columns, zeros not stored), offsets (N + 1,).

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        ValueError
            No sentences, an empty sentence or a token row with fewer cells than ``columns``
            (naming sentence and token), or a ``numeric`` cell that is not a finite number.
        """
        self._check_fitted()
        corpus = self._read(sentences)
        view_codes = self._view_codes_fitted(corpus)
        n_tokens = corpus.position.size
        # one int32 column of attribute ids per source (template, numeric column, BOS/EOS), -1
        # where absent; every source owns its own id range, so each row's ids come out sorted
        n_sources = len(self._templates) + len(self.numeric) + (2 if self.bos_eos else 0)
        table = np.full((n_tokens, n_sources), -1, dtype=np.int32)
        weights: dict[int, np.ndarray] = {}  # source -> (T,) values of a numeric column
        base = 0
        for k, (template, fitted) in enumerate(zip(self._templates, self.template_keys_)):
            keys = self._template_keys(template, view_codes, corpus)
            slot = np.searchsorted(fitted, keys)
            found = (keys >= 0) & (slot < fitted.size)
            found[found] = fitted[slot[found]] == keys[found]
            table[found, k] = base + slot[found]
            base += fitted.size
        for k, name in enumerate(self.numeric, start=len(self._templates)):
            parsed, bad = numeric_cells(corpus.columns[name])
            if bad is not None:
                raise NumericValueError(f"numeric column {name!r}: {corpus.where(bad[0])} {bad[1]}")
            table[parsed != 0.0, k] = base
            weights[k] = parsed
            base += 1
        if self.bos_eos:
            table[corpus.position == 0, -2] = base
            table[corpus.position == corpus.length - 1, -1] = base + 1
        present = table >= 0
        indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))])
        indices = table[present]
        data = np.ones(indices.size)
        for k, parsed in weights.items():  # entry of row t, source k sits after the row's earlier sources
            rows = np.flatnonzero(present[:, k])
            data[indptr[rows] + present[rows, :k].sum(axis=1)] = parsed[rows]
        matrix = sp.csr_matrix((data, indices, indptr), shape=(n_tokens, self.n_attributes))
        return SequenceBatch(matrix, offsets_from_lengths(corpus.lengths))

    def fit_transform(self, sentences: Sequence[Sentence]) -> SequenceBatch:
        """:meth:`fit`, then :meth:`transform` of the same ``sentences``.

        Parameters
        ----------
        sentences : sequence of sentences
            Each sentence a non-empty list of token rows (tuples of column strings, as the
            :mod:`crf.io` readers give them) with at least ``len(columns)`` cells.

        Returns
        -------
        SequenceBatch
            As :meth:`transform`.

        Raises
        ------
        ValueError
            No sentences, an empty sentence or a token row with fewer cells than ``columns``
            (naming sentence and token), or a ``numeric`` cell that is not a finite number.
        """
        return self.fit(sentences).transform(sentences)

    # --- names ---------------------------------------------------------------------------

    def attribute_names(self) -> np.ndarray:
        """Names of all attributes, in column order of the batch.

        Returns
        -------
        ndarray of shape (A,), object
            ``template=cell|cell`` for template attributes (``__BOS__``/``__EOS__`` for cells
            outside the sentence with ``padding``), then the ``numeric`` column names, then
            ``__BOS__`` and ``__EOS__`` with ``bos_eos``.

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        """
        self._check_fitted()
        if self._names is None:
            names: list[str] = []
            for template, fitted in zip(self._templates, self.template_keys_):
                parts = []
                multiplier = 1
                for view, _ in template.cells:
                    vocab = self.vocabulary_[view]
                    size = vocab.size
                    code = (fitted // multiplier) % (size + 2)
                    labels = np.concatenate([vocab.astype(object), np.array([BOS, EOS], dtype=object)])
                    parts.append(labels[code])
                    multiplier *= size + 2
                prefix = template.name + "="
                names.extend(prefix + "|".join(cells) for cells in zip(*parts))
            names.extend(self.numeric)
            if self.bos_eos:
                names.extend([BOS, EOS])
            self._names = np.array(names, dtype=object)
        return self._names

    def attribute_lists(self, batch: SequenceBatch) -> list[list[list[str]]]:
        """The batch as nested lists of attribute strings (for python-crfsuite and the like).

        Parameters
        ----------
        batch : SequenceBatch
            A batch this extractor made (its columns are :meth:`attribute_names`).

        Returns
        -------
        list of lists of lists of str
            Per sequence, per token, the names of its stored attributes in column order (a
            numeric attribute's value is not kept).

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        """
        names = self.attribute_names()
        X = batch.X
        per_token = [list(names[X.indices[X.indptr[i] : X.indptr[i + 1]]]) for i in range(X.shape[0])]
        return [per_token[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]

    # --- persistence ---------------------------------------------------------------------

    def input_columns(self) -> list[str]:
        """The columns its features read, in its column order (the others it may ignore).

        Returns
        -------
        list of str
            A subset of ``columns``: those a used view or a ``numeric`` attribute reads.
        """
        used = {self._specs[v].column for v in self._used_views()} | set(self.numeric)
        return [c for c in self.columns if c in used]

    def config(self) -> dict:
        """The constructor arguments, JSON-ready.

        Returns
        -------
        dict
            ``columns``, ``templates``, ``views``, ``numeric``, ``bos_eos``, ``padding``,
            ``min_count``: ``FeatureExtractor(**config())`` is an unfitted copy.
        """
        return {
            "columns": list(self.columns),
            "templates": [t.name for t in self._templates],
            "views": {k: dict(v) for k, v in dict(self.views).items()},
            "numeric": list(self.numeric),
            "bos_eos": self.bos_eos,
            "padding": self.padding,
            "min_count": self.min_count,
        }

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (strings as unicode arrays; no objects).

        Returns
        -------
        dict of str to ndarray
            ``view/<name>`` vocabularies, ``template/<i>`` keys (int64, sorted), and the tables of
            lexicon and cluster views; :meth:`from_state` reads them back.

        Raises
        ------
        RuntimeError
            Before :meth:`fit`.
        """
        self._check_fitted()
        arrays: dict[str, np.ndarray] = {}
        for name, vocab in self.vocabulary_.items():
            arrays[f"view/{name}"] = vocab.astype(str)
        for i, keys in enumerate(self.template_keys_):
            arrays[f"template/{i}"] = keys
        for name in self._lexicons:
            entries = self._lexicons[name]
            arrays[f"lexicon/{name}/entries"] = np.array([" ".join(k) for k in entries], dtype=str)
            arrays[f"lexicon/{name}/types"] = np.array(list(entries.values()), dtype=str)
        for name in self._used_views():
            if self._specs[name].fn == "cluster":
                table = self._table(name)
                arrays[f"cluster/{name}/words"] = np.array(list(table), dtype=str)
                arrays[f"cluster/{name}/values"] = np.array(list(table.values()), dtype=str)
        return arrays

    @classmethod
    def from_state(cls, config: Mapping, arrays: Mapping[str, np.ndarray], path=None) -> FeatureExtractor:
        """Rebuild a fitted extractor from :meth:`config` and :meth:`state_arrays`. A state that
        does not fit its config (a missing, non-string or repeated vocabulary entry, template
        keys out of their range or not strictly increasing, lexicon entries without types)
        raises :class:`crf.ModelFileError` naming ``path`` (the file it came from).

        Parameters
        ----------
        config : mapping
            What :meth:`config` gave: the constructor arguments.
        arrays : mapping of str to ndarray
            What :meth:`state_arrays` gave.
        path : str or os.PathLike, optional
            Names the source in error messages.

        Returns
        -------
        FeatureExtractor
            Fitted, without reading any lexicon or cluster file (their tables come from ``arrays``).

        Raises
        ------
        crf.ModelFileError
            A bad config or a state that does not fit it.
        """
        where = path if path is not None else "saved feature state"
        if not isinstance(config, Mapping):
            raise ModelFileError(f"{where}: the feature config is not a mapping")
        try:
            extractor = cls(**config)
        except (TypeError, ValueError) as err:
            raise ModelFileError(f"{where}: bad feature config ({type(err).__name__}: {err})") from None
        extractor.vocabulary_ = {}
        extractor._view_index = {}
        for name in extractor._used_views():
            key = f"view/{name}"
            if key not in arrays:
                raise ModelFileError(f"{where}: the saved feature state lacks the vocabulary of view {name!r}")
            vocab = checked_array(where, arrays, key, "U", (None,))
            check_unique(where, f"view {name!r}: value", vocab.tolist())
            extractor.vocabulary_[name] = vocab
            extractor._view_index[name] = pd.Index(vocab.astype(object), dtype=object)
            if extractor._specs[name].fn in ("lexicon", *_MENTION_FUNCTIONS):
                entries = checked_array(where, arrays, f"lexicon/{name}/entries", "U", (None,))
                types = checked_array(where, arrays, f"lexicon/{name}/types", "U", entries.shape)
                extractor._lexicons[name] = {tuple(str(e).split()): str(t) for e, t in zip(entries, types)}
            if extractor._specs[name].fn == "cluster":
                words = checked_array(where, arrays, f"cluster/{name}/words", "U", (None,))
                values = checked_array(where, arrays, f"cluster/{name}/values", "U", words.shape)
                check_unique(where, f"cluster view {name!r}: word", words.tolist())
                extractor._tables[name] = dict(zip(words.tolist(), values.tolist()))
        extractor.template_keys_ = []
        for i, template in enumerate(extractor._templates):
            keys = checked_array(where, arrays, f"template/{i}", "iu", (None,)).astype(np.int64)
            space = math.prod(len(extractor.vocabulary_[view]) + 2 for view, _ in template.cells)
            if space >= 2**62:
                raise ModelFileError(f"{where}: template {template.name!r} has too many value combinations for int64 keys")
            if np.any(np.diff(keys) <= 0) or (keys.size and (keys[0] < 0 or keys[-1] >= space)):
                raise ModelFileError(
                    f"{where}: template {i} ({template.name!r}) keys are not strictly increasing within 0 .. {space - 1}"
                )
            extractor.template_keys_.append(keys)
        extractor.fitted_ = True
        extractor._names = None
        return extractor


# the attribute set of CRFsuite's CoNLL-2000 chunking example: words and POS tags in a window of 5
CRFSUITE_CHUNKING_TEMPLATES = (
    [f"w[{k}]" for k in range(-2, 3)]
    + ["w[-1]|w[0]", "w[0]|w[1]"]
    + [f"pos[{k}]" for k in range(-2, 3)]
    + [f"pos[{k}]|pos[{k + 1}]" for k in range(-2, 2)]
    + [f"pos[{k}]|pos[{k + 1}]|pos[{k + 2}]" for k in range(-2, 1)]
)


def crfsuite_chunking_extractor() -> FeatureExtractor:
    """The CRFsuite CoNLL-2000 chunking attribute set over columns ``w pos chunk``.

    Returns
    -------
    FeatureExtractor
        Unfitted: the templates of CRFsuite's chunking example (words and POS tags in a window
        of 5 and their n-grams), ``bos_eos=True``, ``padding=False``.
    """
    return FeatureExtractor(columns=["w", "pos", "chunk"], templates=CRFSUITE_CHUNKING_TEMPLATES, bos_eos=True, padding=False)


# --- lexicons: files of (multi-token) entries with optional types, matched as longest spans ---


def read_lexicon(path: str | os.PathLike, lowercase: bool = False) -> dict[tuple[str, ...], str]:
    """Read a lexicon file: one entry a line, tokens separated by spaces, optional TAB then type.

    Blank lines and lines starting with ``#`` are skipped; an entry listed again takes its last type.

    Parameters
    ----------
    path : str or os.PathLike
        A UTF-8 text file, plain or gzip.
    lowercase : bool, default=False
        Lower-case the entries' tokens (to match lower-cased words).

    Returns
    -------
    dict of tuple of str to str
        The entry's token tuple -> its type (``""`` when untyped).

    Raises
    ------
    DataFormatError
        An entry without tokens, a file without entries, or text that is not UTF-8 (naming file
        and line).
    FileNotFoundError, IsADirectoryError
        A missing path, or a folder.
    """
    entries: dict[tuple[str, ...], str] = {}
    for number, line in decoded_lines(path):
        if not line.strip() or line.startswith("#"):
            continue
        text, _, kind = line.partition("\t")
        tokens = tuple(text.lower().split() if lowercase else text.split())
        if not tokens:
            raise DataFormatError(path, number, "lexicon entry has no tokens")
        entries[tokens] = kind.strip()
    if not entries:
        raise DataFormatError(path, 1, "lexicon holds no entries")
    return entries


def lexicon_marks(words: np.ndarray, position: np.ndarray, length: np.ndarray, entries: dict[tuple[str, ...], str]) -> np.ndarray:
    """Longest-match lexicon spans as ``B-TYPE``/``I-TYPE`` per token (None outside spans).

    Longer entries are matched first; a span that overlaps one already marked is skipped (among
    entries of one length, the earlier span wins). Spans never cross a sentence boundary.

    Parameters
    ----------
    words : ndarray of shape (T,), object
        The corpus' tokens, sentence after sentence.
    position : ndarray of shape (T,), int
        Each token's index in its sentence.
    length : ndarray of shape (T,), int
        Its sentence's length.
    entries : dict of tuple of str to str
        As from :func:`read_lexicon`.

    Returns
    -------
    ndarray of shape (T,), object
        ``"B-TYPE"`` on a span's first token, ``"I-TYPE"`` on the others (``"B"``/``"I"`` for an
        untyped entry), None outside spans.
    """
    marks = np.full(words.size, None, dtype=object)
    covered = np.zeros(words.size, dtype=bool)
    for size in sorted({len(k) for k in entries}, reverse=True):
        # start positions whose span of `size` tokens stays inside the sentence
        starts = np.flatnonzero(position + size <= length)
        if starts.size == 0:
            continue
        windows = zip(*(words[starts + k] for k in range(size)))
        kinds = [entries.get(window) for window in windows]
        hit = np.array([kind is not None for kind in kinds], dtype=bool)
        for start, kind in zip(starts[hit], np.asarray(kinds, dtype=object)[hit]):
            span = slice(start, start + size)
            if covered[span].any():
                continue  # a longer (or earlier) entry already owns part of this span
            covered[span] = True
            suffix = f"-{kind}" if kind else ""
            marks[start] = "B" + suffix
            marks[start + 1 : start + size] = "I" + suffix
    return marks


def _lowered(words: np.ndarray) -> np.ndarray:
    """``words`` lower-cased, one ``str.lower`` per distinct word."""
    codes, uniques = pd.factorize(words)
    return np.array([u.lower() for u in uniques], dtype=object)[codes]


def _same_tokens(words: np.ndarray, lengths: np.ndarray, other_words: np.ndarray, other_lengths: np.ndarray) -> bool:
    """Whether two corpora hold the same sentences (lengths and tokens)."""
    if words is other_words:
        return True
    return bool(
        lengths.size == other_lengths.size
        and np.array_equal(lengths, other_lengths)
        and words.size == other_words.size
        and np.array_equal(words, other_words)
    )


def mention_spans(labels: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entity mentions of an IOB2 (or IOB1) label column as token spans.

    A mention starts at a ``B-X`` token, or at an ``I-X`` token that does not continue a mention
    of type ``X`` (a sentence's first token, or one after ``O`` or another type), and runs over
    the ``I-X`` tokens that follow it in its sentence.

    Parameters
    ----------
    labels : ndarray of shape (T,), object
        The labels, sentence after sentence (``O``, ``B-X``, ``I-X``).
    position : ndarray of shape (T,), int
        Each token's index in its sentence.

    Returns
    -------
    starts, ends : ndarray of shape (M,), int64
        Each mention's first token and one past its last token.
    types : ndarray of shape (M,), object
        Each mention's type ``X``.
    """
    labels = np.asarray(labels, dtype=object).astype(str)
    prefix = np.char.partition(labels, "-")
    tag, kind = prefix[:, 0], prefix[:, 2]
    inside = np.isin(tag, ("B", "I")) & (kind != "")
    previous_kind = np.concatenate([[""], kind[:-1]])
    previous_inside = np.concatenate([[False], inside[:-1]])
    continues = inside & (tag == "I") & (position > 0) & previous_inside & (previous_kind == kind)
    starts = np.flatnonzero(inside & ~continues)
    # a mention ends where the next token neither continues it nor stays inside
    next_continues = np.concatenate([continues[1:], [False]])
    ends = np.flatnonzero(inside & ~next_continues) + 1
    return starts.astype(np.int64), ends.astype(np.int64), kind[starts].astype(object)


def mention_lexicon(words: np.ndarray, labels: np.ndarray, position: np.ndarray) -> dict[tuple[str, ...], str]:
    """The lexicon of a labelled corpus' entity mentions: token tuple -> its most frequent type.

    Parameters
    ----------
    words : ndarray of shape (T,), object
        The tokens as they are to be matched (lower-cased for a lower-cased lexicon).
    labels : ndarray of shape (T,), object
        Their IOB2 labels (see :func:`mention_spans`).
    position : ndarray of shape (T,), int
        Each token's index in its sentence.

    Returns
    -------
    dict of tuple of str to str
        As :func:`read_lexicon` gives, for :func:`lexicon_marks`; ties between types go to the
        type seen first.
    """
    starts, ends, types = mention_spans(labels, position)
    entries = [tuple(words[a:b].tolist()) for a, b in zip(starts.tolist(), ends.tolist())]  # one step per mention
    return _majority_types(entries, types.tolist())


def _majority_types(entries: Sequence[tuple[str, ...]], types: Sequence[str]) -> dict[tuple[str, ...], str]:
    """{entry: its most frequent type} over parallel lists of mentions and types."""
    counts: dict[tuple[str, ...], dict[str, int]] = {}
    for entry, kind in zip(entries, types):
        seen = counts.setdefault(entry, {})
        seen[kind] = seen.get(kind, 0) + 1
    return {entry: max(seen, key=seen.get) for entry, seen in counts.items()}


def out_of_fold_marks(
    words: np.ndarray, labels: np.ndarray, position: np.ndarray, length: np.ndarray, lengths: np.ndarray, folds: int = 10
) -> np.ndarray:
    """Lexicon marks of a labelled corpus from its own mentions, out of fold.

    The sentences are cut into ``folds`` contiguous blocks (documents stay mostly whole); each
    block's tokens are matched (:func:`lexicon_marks`) against the lexicon of the other blocks'
    mentions (:func:`mention_lexicon`), so a mention is marked only when it also occurs elsewhere.

    Parameters
    ----------
    words, labels : ndarray of shape (T,), object
        The tokens as matched, and their IOB2 labels.
    position, length : ndarray of shape (T,), int
        Each token's index in its sentence, and its sentence's length.
    lengths : ndarray of shape (N,), int
        The sentences' lengths (they sum to T).
    folds : int, default=10
        The number of blocks (at most N; at least 2).

    Returns
    -------
    ndarray of shape (T,), object
        ``B-TYPE``/``I-TYPE`` or None per token, as :func:`lexicon_marks`.
    """
    n = lengths.size
    folds = max(2, min(int(folds), n))
    fold_of_sentence = np.arange(n) * folds // n
    fold = np.repeat(fold_of_sentence, lengths)
    starts, ends, types = mention_spans(labels, position)
    mention_fold = fold[starts]
    entries = [tuple(words[a:b].tolist()) for a, b in zip(starts.tolist(), ends.tolist())]  # one step per mention
    marks = np.full(words.size, None, dtype=object)
    for k in range(folds):
        others = np.flatnonzero(mention_fold != k).tolist()
        lexicon = _majority_types([entries[i] for i in others], [types[i] for i in others])
        rows = np.flatnonzero(fold == k)
        if rows.size and lexicon:
            marks[rows] = lexicon_marks(words[rows], position[rows], length[rows], lexicon)
    return marks

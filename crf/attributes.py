"""Attribute vocabulary for python-crfsuite-style input: tokens as dicts or lists of strings.

Token rules (those of ``pycrfsuite.ItemSequence``, checked against python-crfsuite in the tests):

- a list (or tuple) token lists binary attributes: ``["w=He", "pos=PRP"]``, each weight 1;
- in a dict token, a ``str`` value ``v`` of key ``k`` is the attribute ``k:v`` with weight 1;
  ``bytes`` are decoded as UTF-8 and read like ``str``;
- a number (``int``, ``float``, ``bool``, NumPy scalars) is the weight of attribute ``k``
  (``True`` is 1.0, ``False`` is 0.0: the attribute is in the vocabulary but adds nothing);
- a nested dict ``{k: {j: v}}`` is ``k:j`` read with the same rules (``k:j:v`` for a string);
- a list, tuple or set of strings ``{k: [a, b]}`` is ``k:a`` and ``k:b``, weight 1 each
  (python-crfsuite itself rejects tuples there); a set's members are read in sorted order, as
  are those of a set given as a token, so that nothing depends on Python's hash seed.

A token that repeats an attribute adds the weights (as CRFsuite does). NaN and infinite weights
are rejected with their position.

How it stays fast: the tokens of a whole batch are flattened with C-level iteration
(``itertools.chain``, ``map``) into one list of attribute names, one array of weights and one
array of token rows; names are looked up in a C hash table (pandas') a block at a time; the
matrix is assembled with NumPy. Only tokens or values of rare shapes (nested dicts, lists in dicts, bytes,
NumPy scalars, non-dict mappings) go through a Python loop, and only those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from decimal import Decimal
from functools import partial
from itertools import chain, repeat
from numbers import Real

import numpy as np
import scipy.sparse as sp
from pandas._libs.hashtable import Int64HashTable, PyObjectHashTable  # pandas' C hash tables

from .batch import SequenceBatch, offsets_from_lengths

# kinds of tokens and of dict values
_LIST, _DICT, _STR, _OTHER = 0, 1, 2, 3
#: attribute values of at least this magnitude are refused, in training and in tagging: their
#: products with the weights lose the 0/1 indicators' contributions to rounding, and from about
#: 1e150 their squares overflow
TOO_LARGE = 1e10
_TOKEN_KIND = {list: _LIST, tuple: _LIST, dict: _DICT, str: _STR, bytes: _STR}
_TEXT, _NUMBER, _RARE = 0, 1, 2
_VALUE_TYPES = PyObjectHashTable(8)  # exact types of the common dict values, looked up a batch at a time
_VALUE_TYPES.map_locations(np.array([str, float, int, bool], dtype=object))
_VALUE_KINDS = np.array([_TEXT, _NUMBER, _NUMBER, _NUMBER, _RARE], dtype=np.int8)  # by code; -1 (other) is the last


class _Entries:
    """The flattened attributes of a batch of T tokens: E entries (name, weight) in token order.

    ``names`` (E,) object array, ``values`` (E,) float64, ``starts`` (T + 1,) int64: token t owns
    entries ``starts[t]:starts[t + 1]``; ``offsets`` (N + 1,) token offsets of the N sequences,
    the first being sequence ``first`` of the input. ``checked``: every name is known to be a
    ``str``; otherwise (list tokens, read as they are) a name may be bytes or not a name at all,
    and :meth:`lookup` checks those it does not find.
    """

    def __init__(
        self, names: np.ndarray, values: np.ndarray, starts: np.ndarray, offsets: np.ndarray, first: int, checked: bool
    ) -> None:
        self.names, self.values, self.starts, self.offsets = names, values, starts, offsets
        self.first, self.checked = first, checked

    def lookup(self, table: PyObjectHashTable) -> np.ndarray:
        """Each name's code in ``table`` (E,), -1 where absent. Unchecked names that are not
        found are checked then: bytes are decoded (in ``names``) and looked up again, anything
        else that is not a ``str`` raises TypeError with its position."""
        if self.checked:
            return table.lookup(self.names)
        try:
            codes, unhashable = table.lookup(self.names), False
        except TypeError:  # an unhashable name: the check below finds it and says where
            codes, unhashable = np.full(self.names.size, -1, dtype=np.int64), True
        absent = np.flatnonzero(codes < 0)
        odd = absent[~np.fromiter(map(isinstance, self.names[absent], repeat(str)), dtype=bool, count=absent.size)]
        if odd.size:
            rows = np.searchsorted(self.starts, odd, side="right") - 1
            self.names[odd] = [
                _text(self.names[e], _At(self.offsets, r, self.first)) for e, r in zip(odd.tolist(), rows.tolist())
            ]
            codes[odd] = table.lookup(self.names[odd])
        self.checked = True
        return table.lookup(self.names) if unhashable else codes


class _At:
    """The position ``sequence i, token j`` of a token row, formatted only when an error needs it.
    ``offsets`` are those of a block of sequences whose first is sequence ``first`` of the input."""

    def __init__(self, offsets: np.ndarray, row: int, first: int = 0) -> None:
        self.offsets, self.row, self.first = offsets, row, first

    def __str__(self) -> str:
        sequence = int(np.searchsorted(self.offsets, self.row, side="right")) - 1
        return f"sequence {self.first + sequence}, token {self.row - int(self.offsets[sequence])}"


def _text(value, where: _At) -> str:
    """A name part given as ``str`` or UTF-8 ``bytes``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{where}: attribute {value!r} is not valid UTF-8 ({error})") from None
    raise TypeError(f"{where}: attribute names must be str or bytes, not {type(value).__name__} ({value!r})")


def _shown(value, limit: int = 60) -> str:
    """``repr(value)`` for a message, shortened; a value whose repr cannot be made (a fraction of
    integers beyond Python's 4,300-digit limit) is named by its type."""
    try:
        text = repr(value)
    except ValueError:
        return f"<a {type(value).__name__} too long to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _weight(name: str, value, where) -> float:
    """The number ``value`` of attribute ``name`` as a float; an integer beyond a float's range
    is refused with its position (``float()`` alone raises a bare OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        size = f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else f"the value {_shown(value)}"
        raise ValueError(f"{where}: attribute {name!r} has {size}, too large for a float") from None
    except (TypeError, ValueError):  # a number type that is no real quantity (np.timedelta64, ...)
        raise TypeError(
            f"{where}: attribute {name!r} has the value {_shown(value)} ({type(value).__name__}), not a real number"
        ) from None


def _expand(name: str, value, where: _At) -> Iterable[tuple[str, float]]:
    """(attribute, weight) pairs of the dict item ``name: value`` (python-crfsuite's rules; any
    real number, ``decimal.Decimal`` included, is a weight)."""
    if isinstance(value, (str, bytes)):
        yield f"{name}:{_text(value, where)}", 1.0
    elif isinstance(value, (Real, Decimal, np.bool_)):
        yield name, _weight(name, value, where)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _expand(f"{name}:{_text(key, where)}", inner, where)
    elif isinstance(value, (list, tuple, set, frozenset)):
        names = [f"{name}:{_text(item, f'{where}: attribute {name!r}')}" for item in value]
        for each in sorted(names) if isinstance(value, AbstractSet) else names:  # a set's own order follows the hash seed
            yield each, 1.0
    else:
        raise TypeError(
            f"{where}: attribute {name!r} has a value of type {type(value).__name__}; "
            "expected str, bytes, a number, a dict or a list of strings"
        )


def _token_items(token, where: _At) -> Iterable[tuple[str, float]]:
    """(attribute, weight) pairs of a token of any accepted shape (the slow, general path)."""
    if isinstance(token, (str, bytes)):
        raise TypeError(f"{where} is the string {token!r}: a token must be a dict or a list of attribute strings")
    if isinstance(token, Mapping):
        for key, value in token.items():
            yield from _expand(_text(key, where), value, where)
    elif hasattr(token, "keys") and hasattr(token, "items"):  # a pandas Series: read as a list, its names would be lost
        raise TypeError(
            f"{where} is a {type(token).__name__}: a token must be a dict or a list of attribute strings "
            "(give a pandas row as row.to_dict())"
        )
    elif isinstance(token, Iterable):
        names = [_text(name, where) for name in token]
        for name in sorted(names) if isinstance(token, AbstractSet) else names:  # a set's own order follows the hash seed
            yield name, 1.0
    else:
        raise TypeError(f"{where}: a token must be a dict or a list of attribute strings, not {type(token).__name__}")


def _all_str(items: Sequence) -> bool:
    """Whether every item is a ``str``: ``str.join`` accepts nothing else (C-level passes over
    blocks of 65,536 items, so the joined text stays small)."""
    try:
        for start in range(0, len(items), 1 << 16):
            "".join(items[start : start + (1 << 16)])
    except TypeError:
        return False
    return True


def _slow(tokens: Sequence, rows: np.ndarray, at: Callable[[int], _At]) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
    """Entries of tokens of rare shapes, one Python loop over them (and only them)."""
    out_rows: list[int] = []
    names: list[str] = []
    values: list[float] = []
    for token, row in zip(tokens, rows.tolist()):
        for name, value in _token_items(token, at(row)):
            out_rows.append(row)
            names.append(name)
            values.append(value)
    return np.asarray(out_rows, dtype=np.int64), names, np.asarray(values, dtype=np.float64)


def _list_tokens(
    tokens: list, rows: np.ndarray, at: Callable[[int], _At], check: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries of list tokens: every element is a binary attribute. Without ``check`` the names
    are left as they are, for :meth:`_Entries.lookup` to check those it does not find."""
    counts = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    size = int(counts.sum())
    names = np.fromiter(chain.from_iterable(tokens), dtype=object, count=size)
    entry_rows = np.repeat(rows, counts)
    if check and not _all_str(names):  # bytes or worse: fix up those entries only
        odd = np.flatnonzero(~np.fromiter(map(isinstance, names, repeat(str)), dtype=bool, count=size))
        names[odd] = [_text(names[e], at(int(entry_rows[e]))) for e in odd.tolist()]
    return entry_rows, names, np.ones(size)


def _joined(key_names: np.ndarray, key_codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``key:value`` names (E,) of entries with ``str`` values (E,) and keys ``key_names[key_codes]``.
    Each distinct pair is joined once and its entries share the string, so its hash is computed
    once too (names repeat: a corpus has far fewer distinct ones than entries)."""
    value_names, value_codes = PyObjectHashTable(1 << 12).factorize(values)
    pairs = key_codes.astype(np.int64) * len(value_names) + value_codes
    distinct, pair_codes = Int64HashTable(1 << 12).factorize(pairs)
    key_of, value_of = np.divmod(distinct, len(value_names))
    joined = np.fromiter(map(":".join, zip(key_names[key_of], value_names[value_of])), dtype=object, count=distinct.size)
    return joined[pair_codes]


def _dict_tokens(tokens: list, rows: np.ndarray, at: Callable[[int], _At]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries of dict tokens: string values by name concatenation, numbers as weights, the rest
    (bytes, nested dicts, lists, NumPy scalars, odd keys) through :func:`_expand`."""
    counts = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    size = int(counts.sum())
    keys = np.fromiter(chain.from_iterable(tokens), dtype=object, count=size)
    values = np.fromiter(chain.from_iterable(map(dict.values, tokens)), dtype=object, count=size)
    entry_rows = np.repeat(rows, counts)
    kind = _VALUE_KINDS[_VALUE_TYPES.lookup(np.fromiter(map(type, values), dtype=object, count=size))]
    key_names, key_codes = PyObjectHashTable(64).factorize(keys)  # distinct keys; -1 for None and NaN
    plain = np.append(np.fromiter(map(isinstance, key_names, repeat(str)), dtype=bool, count=len(key_names)), False)
    kind[~plain[key_codes]] = _RARE  # (code -1 reads the appended False)
    text = np.flatnonzero(kind == _TEXT)
    number = np.flatnonzero(kind == _NUMBER)
    names = keys.copy()
    if text.size:
        names[text] = _joined(key_names, key_codes[text], values[text])
    weights = np.ones(size)
    try:
        weights[number] = values[number].astype(np.float64)
    except OverflowError:  # an int beyond a float's range: say which
        for e in number.tolist():
            _weight(keys[e], values[e], at(int(entry_rows[e])))
    rare = np.flatnonzero(kind == _RARE)
    if rare.size == 0:
        return entry_rows, names, weights
    pairs = [
        list(_expand(_text(k, where), v, where))
        for k, v, where in zip(keys[rare], values[rare], (at(int(r)) for r in entry_rows[rare]))
    ]
    common = kind != _RARE
    all_rows = np.concatenate([entry_rows[common], np.repeat(entry_rows[rare], [len(p) for p in pairs])])
    all_names = names[common].tolist() + [name for p in pairs for name, _ in p]
    all_weights = np.concatenate([weights[common], np.array([w for p in pairs for _, w in p], dtype=np.float64)])
    order = np.argsort(all_rows, kind="stable")
    return all_rows[order], np.fromiter(all_names, dtype=object, count=len(all_names))[order], all_weights[order]


def check_sequence_container(sequences: object) -> None:
    """Refuse ``X`` given as a string, a dict (read as its keys) or a set (no order: its sequences
    could not be matched to labels or results): TypeError, one line."""
    if isinstance(sequences, (str, bytes, Mapping, AbstractSet)):
        raise TypeError(f"X must be a list of sequences of tokens, not a {type(sequences).__name__}")


def _sequence_list(sequences: Iterable[Sequence]) -> tuple[list, np.ndarray]:
    """``X`` as a list of sequences and their lengths (N,), checking its shape (a set has no order,
    so neither ``X`` nor one of its sequences may be one)."""
    check_sequence_container(sequences)
    sequences = list(sequences)
    kinds = map(type, sequences)
    bad = [i for i, kind in enumerate(kinds) if _TOKEN_KIND.get(kind) in (_DICT, _STR) or issubclass(kind, AbstractSet)]
    if bad:
        what = type(sequences[bad[0]]).__name__
        raise TypeError(f"sequence {bad[0]} is a {what}, not a list of tokens: X must be a list of sequences of tokens")
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    if np.any(lengths == 0):
        raise ValueError(f"sequence {int(np.argmax(lengths == 0))} has no tokens")
    return sequences, lengths


def _blocks(lengths: np.ndarray, block_tokens: int) -> list[tuple[int, int]]:
    """Consecutive ranges ``(first, stop)`` of sequences holding about ``block_tokens`` tokens each: a
    block ends with the sequence that reaches the next multiple of ``block_tokens`` tokens (so a long
    sequence lengthens its block)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be at least 1, not {block_tokens}")
    if lengths.size == 0:
        return []
    ends = np.cumsum(lengths)
    marks = np.arange(1, int(ends[-1]) // block_tokens + 1) * block_tokens
    stops = np.unique(np.append(np.searchsorted(ends, marks, side="left") + 1, lengths.size))
    stops = stops[stops <= lengths.size].tolist()
    return list(zip([0, *stops[:-1]], stops))


def _entries(sequences: list, lengths: np.ndarray, first: int = 0) -> _Entries:
    """Flatten sequences of tokens (sequences ``first``... of the input) into entries, checking the
    tokens' shapes and weights."""
    offsets = offsets_from_lengths(lengths)
    at = partial(_At, offsets, first=first)
    tokens = list(chain.from_iterable(sequences))
    kind = np.fromiter(map(_TOKEN_KIND.get, map(type, tokens), repeat(_OTHER)), dtype=np.int8, count=len(tokens))
    strings = np.flatnonzero(kind == _STR)
    if strings.size:
        row = int(strings[0])
        raise TypeError(f"{at(row)} is the string {tokens[row]!r}: a token must be a dict or a list of attribute strings")
    groups = []
    only_lists = bool(np.all(kind == _LIST))  # then the names are checked only where not found
    for code, reader in ((_LIST, _list_tokens), (_DICT, _dict_tokens), (_OTHER, _slow)):
        rows = np.flatnonzero(kind == code)
        if rows.size:
            group = tokens if rows.size == len(tokens) else [tokens[r] for r in rows.tolist()]
            groups.append(_list_tokens(group, rows, at, check=False) if only_lists else reader(group, rows, at))
    if len(groups) == 1:
        rows, names, values = groups[0]
    elif not groups:
        rows, names, values = np.empty(0, np.int64), [], np.empty(0)
    else:  # a batch mixing token shapes: put the entries back in token order
        rows = np.concatenate([g[0] for g in groups])
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], np.concatenate([g[2] for g in groups])[order]
        names = np.fromiter(chain.from_iterable(g[1] for g in groups), dtype=object, count=rows.size)[order]
    if not isinstance(names, np.ndarray):
        names = np.fromiter(names, dtype=object, count=len(names))
    finite = np.isfinite(values)
    if not finite.all():
        e = int(np.argmin(finite))
        raise ValueError(f"{at(int(rows[e]))}: attribute {names[e]!r} has the non-finite weight {values[e]}")
    starts = offsets_from_lengths(np.bincount(rows, minlength=len(tokens)))
    return _Entries(names, values, starts, offsets, first, checked=not only_lists)


def pair_table(columns: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """The names of ``columns`` (name -> column) split at each of their colons: ``table[k][v]`` is
    the column of the name ``k:v``, so a dict item ``k: v`` (a ``str`` value) is looked up without
    building the string ``k:v`` (a name with two colons is listed under both splits).

    Parameters
    ----------
    columns : mapping of str to int
        Attribute name -> column.

    Returns
    -------
    dict of str to dict of str to int
        ``table[k][v]``: the column of ``k:v``.
    """
    table: dict[str, dict[str, int]] = {}
    for name, column in columns.items():
        colon = name.find(":")
        while colon >= 0:
            table.setdefault(name[:colon], {})[name[colon + 1 :]] = column
            colon = name.find(":", colon + 1)
    return table


_NO_VALUES: dict[str, int] = {}


def sequence_entries(
    sequence, column_of: Callable, pairs: Mapping[str, Mapping[str, int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The known attributes of one sequence of tokens of the common shapes, for per-call work.

    ``column_of`` maps an attribute name to its column, or None (``dict.get`` of a vocabulary);
    ``pairs`` is the vocabulary's :func:`pair_table`, which names the column of a dict item
    ``k: v`` with a ``str`` value. Tokens are lists of ``str`` names, or dicts of ``str`` keys
    and ``str``/``float``/``int``/``bool`` values, read by the module's rules in one pass (no
    array per token). Returns (where each token's entries end (T,), columns (E,), weights (E,))
    with the known entries of nonzero weight, in input order (a repeated name is repeated), or
    None for anything else (another shape, bytes, a non-finite or too large weight; an empty
    sequence): the general path reads those and says what is wrong.

    Parameters
    ----------
    sequence : iterable of tokens
        One sequence.
    column_of : callable
        ``column_of(name) -> int or None``.
    pairs : mapping of str to mapping of str to int
        The vocabulary's :func:`pair_table`.

    Returns
    -------
    tuple of (ndarray of shape (T,), ndarray of shape (E,), ndarray of shape (E,)) or None
        (token ends, int64; columns, int64; weights, float64), or None as above.
    """
    ends: list[int] = []
    columns: list[int] = []
    numbered: list[int] = []  # positions in ``columns`` of the entries whose weight is not 1
    numbers: list[float] = []
    column, end, pair = columns.append, ends.append, pairs.get
    try:
        for token in sequence:
            kind = type(token)
            if kind is dict:
                for key, value in token.items():
                    value_kind = type(value)
                    if value_kind is str:
                        found = pair(key, _NO_VALUES).get(value)
                        if found is not None:
                            column(found)
                        elif type(key) is not str:  # bytes (decoded by the general path) or not a name
                            return None
                    elif value_kind is bool:  # True is weight 1, False adds nothing
                        if type(key) is not str:
                            return None
                        if value:
                            found = column_of(key)
                            if found is not None:
                                column(found)
                    elif value_kind is float or value_kind is int:
                        if type(key) is not str or not -TOO_LARGE < value < TOO_LARGE:  # NaN, infinities, too large:
                            return None  # the general path says where
                        found = column_of(key)
                        if found is not None and value:
                            if value != 1:
                                numbered.append(len(columns))
                                numbers.append(float(value))
                            column(found)
                    else:
                        return None
            elif kind is list or kind is tuple:
                for name in token:
                    found = column_of(name)
                    if found is not None:
                        column(found)
                    elif type(name) is not str:  # bytes (decoded by the general path) or not a name
                        return None
            else:
                return None
            end(len(columns))
    except (TypeError, OverflowError):  # an unhashable name; an integer beyond a float's range
        return None
    if not ends:
        return None
    weights = np.ones(len(columns))
    if numbers:
        weights[numbered] = numbers
    return np.array(ends, dtype=np.int64), np.array(columns, dtype=np.int64), weights


class AttributeIndex:
    """Vocabulary of attribute names for python-crfsuite-style input (see the module docstring).

    ``index_`` maps each attribute name to its column, numbered in order of first appearance
    in the fitting data, as CRFsuite numbers attributes (within a token, values of rare shapes
    come after the plain ones). ``X`` arguments are lists (or iterables) of sequences of tokens.
    Input is read ``block_tokens`` tokens at a time, which bounds the memory of the temporary
    per-attribute arrays (about 40 bytes for each attribute of each token in a block).

    Names are looked up in a pandas object hash table kept beside ``index_`` (built on first
    use; never pickled): one C call per block, faster than ``dict.get`` per
    name. The table is rebuilt when ``index_`` is replaced or changes size; to change the
    vocabulary, assign a new dict (renumbering the same names in place is not seen).
    """

    block_tokens = 1 << 14

    def __init__(self) -> None:
        self.index_: dict[str, int] = {}
        # (the dict, its size, its hash table): one tuple, read and replaced whole, so a thread
        # never pairs a table with another dict than the one it was built from
        self._lookup: tuple[dict, int, PyObjectHashTable] | None = None
        self._pairs: tuple[dict, int, dict[str, dict[str, int]]] | None = None  # the same, for :func:`pair_table`

    @property
    def index_(self) -> dict[str, int]:
        """The fitted vocabulary: attribute name -> column index."""
        return self._index

    @index_.setter
    def index_(self, index: dict[str, int]) -> None:
        self._index = index

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lookup", "_pairs")}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        if "index_" in state:  # pickled before index_ became a property
            state["_index"] = state.pop("index_")
        self.__dict__.update(state)
        self._lookup = self._pairs = None

    def _table_for(self, index: dict[str, int]) -> PyObjectHashTable:
        """The hash table of ``index`` (built on first use, and again if ``index_`` was replaced or
        changed size)."""
        cached = self._lookup
        if cached is not None and cached[0] is index and cached[1] == len(index):
            return cached[2]
        table = PyObjectHashTable(len(index))
        columns = np.fromiter(index.values(), dtype=np.int64, count=len(index))
        if np.array_equal(columns, np.arange(columns.size)):  # names in column order: one C call
            names = np.empty(len(index), dtype=object)
            names[:] = list(index)
            table.map_locations(names)
        else:  # an index_ set in another order
            for name, column in index.items():
                table.set_item(name, column)
        self._lookup = (index, len(index), table)
        return table

    def pairs_for(self, index: dict[str, int]) -> dict[str, dict[str, int]]:
        """The :func:`pair_table` of ``index`` (built on first use, and again if ``index_`` was
        replaced or changed size).

        Parameters
        ----------
        index : dict of str to int
            The vocabulary (attribute name -> column), normally ``index_``.

        Returns
        -------
        dict of str to dict of str to int
            ``table[k][v]``: the column of the name ``k:v``, for every colon of every name.
        """
        cached = self.__dict__.get("_pairs")
        if cached is not None and cached[0] is index and cached[1] == len(index):
            return cached[2]
        table = pair_table(index)
        self._pairs = (index, len(index), table)
        return table

    def fit(self, sequences: Iterable[Sequence], min_freq: float = 0) -> AttributeIndex:
        """Learn the vocabulary of ``sequences`` (a list of sequences of tokens).

        ``min_freq``: keep attributes whose weights add up to at least this much in ``sequences``
        (occurrences, for binary attributes); 0 keeps every attribute seen, even one only ever
        weighing 0 (``False``). CRFsuite's ``feature.minfreq`` applies the same sum to each
        (attribute, label) feature, so with non-negative weights dropping attributes first never
        drops a feature it keeps.

        Parameters
        ----------
        sequences : iterable of sequences of tokens
            Each token a dict or a list of attribute strings (the module docstring's rules); every
            sequence has at least one token.
        min_freq : float, default=0
            The least summed weight an attribute needs to be kept.

        Returns
        -------
        AttributeIndex
            self, with ``index_`` set (replaced only once the whole input has been read).

        Raises
        ------
        TypeError
            Input that is not a list of sequences of tokens, a token that is neither a dict nor a
            list of strings, an attribute name that is not ``str`` or ``bytes``, or a value of
            another type; the message names sequence and token.
        ValueError
            An empty sequence, a NaN or infinite weight, a number too large for a float, or bytes
            that are not UTF-8, naming where;
            no sequences at all.
        """
        self.fit_transform(sequences, min_freq)
        return self

    def transform(self, sequences: Iterable[Sequence]) -> SequenceBatch:
        """The attribute matrix (T, A) of ``sequences``; attributes not in the vocabulary are ignored.

        Parameters
        ----------
        sequences : iterable of sequences of tokens
            Each token a dict or a list of attribute strings (the module docstring's rules); every
            sequence has at least one token.

        Returns
        -------
        SequenceBatch
            ``X`` (T, A) float64 CSR in ``index_``'s columns (a repeated attribute's weights added,
            zero weights not stored) and the offsets (N + 1,).

        Raises
        ------
        TypeError
            Input that is not a list of sequences of tokens, a token that is neither a dict nor a
            list of strings, an attribute name that is not ``str`` or ``bytes``, or a value of
            another type; the message names sequence and token.
        ValueError
            An empty sequence, a NaN or infinite weight, a number too large for a float, or bytes
            that are not UTF-8, naming where.
        """
        index = self._index  # read once: the table must be this dict's
        return self._encode(sequences, index, self._table_for(index), grow=False)

    def fit_transform(self, sequences: Iterable[Sequence], min_freq: float = 0) -> SequenceBatch:
        """:meth:`fit` and :meth:`transform` in one pass over ``sequences``.

        Parameters
        ----------
        sequences : iterable of sequences of tokens
            Each token a dict or a list of attribute strings (the module docstring's rules); every
            sequence has at least one token.
        min_freq : float, default=0
            As :meth:`fit`: columns of attributes below it are dropped from the matrix too.

        Returns
        -------
        SequenceBatch
            As :meth:`transform` gives under the new vocabulary, except that an entry of value 0
            is kept as a stored zero: training data, in which its attribute/label pair is a
            feature, as CRFsuite makes one (``CRF.fit`` drops such zeros once it has listed the
            pairs). :meth:`transform` stores none.

        Raises
        ------
        TypeError
            Input that is not a list of sequences of tokens, a token that is neither a dict nor a
            list of strings, an attribute name that is not ``str`` or ``bytes``, or a value of
            another type; the message names sequence and token.
        ValueError
            An empty sequence, a NaN or infinite weight, a number too large for a float, or bytes
            that are not UTF-8, naming where;
            no sequences at all.
        """
        index: dict[str, int] = {}
        table = PyObjectHashTable()
        batch = self._encode(sequences, index, table, grow=True)
        if batch.n_sequences == 0:
            raise ValueError("no sequences to fit the attribute index on")
        if min_freq > 0:
            totals = np.bincount(batch.X.indices, weights=batch.X.data, minlength=len(index))
            keep = totals >= min_freq
            names = np.asarray(list(index), dtype=object)[keep].tolist()  # the dict's order is column order
            index, table = dict(zip(names, range(len(names)))), None
            batch = SequenceBatch(batch.X[:, keep], batch.offsets)
        self._lookup = None if table is None else (index, len(index), table)
        self.index_ = index  # only once the whole input has been read
        return batch

    def _encode(self, sequences: Iterable, index: dict[str, int], table: PyObjectHashTable, grow: bool) -> SequenceBatch:
        """The attribute matrix of ``sequences`` under ``index`` (``table`` maps the same names to
        the same columns), block by block; with ``grow``, names not in ``index`` are first added to
        both, numbered in order of first appearance."""
        sequences, lengths = _sequence_list(sequences)
        # per block: kept entries per token, their columns and weights (after an empty start)
        counts, columns, values = [np.empty(0, np.int64)], [np.empty(0, np.int32)], [np.empty(0)]
        pairs = None
        for first, stop in _blocks(lengths, self.block_tokens):
            if not grow and type(next(iter(sequences[first]))) is dict:  # dict tokens: looked up one entry at a time
                pairs = self.pairs_for(index) if pairs is None else pairs
                found = sequence_entries(chain.from_iterable(sequences[first:stop]), index.get, pairs)
                if found is not None:
                    ends, known, weights = found
                    counts.append(np.diff(ends, prepend=0))
                    columns.append(known.astype(np.int32))
                    values.append(weights)
                    continue
            entries = _entries(sequences[first:stop], lengths[first:stop], first)
            codes = entries.lookup(table)
            names = entries.names
            if grow:
                unseen = np.flatnonzero(codes < 0)
                if unseen.size:
                    fresh = list(dict.fromkeys(names[unseen].tolist()))  # in order of first appearance
                    for column, name in enumerate(fresh, len(index)):  # new names only, not every entry
                        table.set_item(name, column)
                    index.update(zip(fresh, range(len(index), len(index) + len(fresh))))
                    codes[unseen] = table.lookup(names[unseen])
            # training data keeps an entry of value 0 as a stored zero: its attribute/label pair is a
            # feature (CRFsuite makes one, whose weight is trained where the attribute is non-zero)
            keep = (codes >= 0) & ((entries.values != 0.0) | grow)
            counts.append(np.diff(np.concatenate([[0], np.cumsum(keep)])[entries.starts]))
            columns.append(codes[keep].astype(np.int32))
            values.append(entries.values[keep])
        indptr = offsets_from_lengths(np.concatenate(counts))
        matrix = sp.csr_matrix((np.concatenate(values), np.concatenate(columns), indptr), shape=(int(lengths.sum()), len(index)))
        matrix.sum_duplicates()
        return SequenceBatch(matrix, offsets_from_lengths(lengths))

    def names(self) -> np.ndarray:
        """Attribute names in column order.

        Returns
        -------
        ndarray of shape (A,), object
            ``names[j]`` is the name of column ``j`` of ``index_``.
        """
        names = np.empty(len(self.index_), dtype=object)
        names[np.fromiter(self.index_.values(), dtype=np.int64, count=len(self.index_))] = list(self.index_)
        return names

"""Input and output formats of the tag command (``python -m pipeline.tag``).

Inputs become a :class:`Corpus`: flat token columns (T,) plus sentence lengths (N,), and an
optional gold label column. Readers (``format``; ``auto`` picks by extension, ``.gz`` ignored):

- ``conll`` (``.conll``, ``.txt``, ``.tsv``, other): whitespace-separated columns, blank line
  between sentences, read by :func:`crf.io.read_conll`. Columns are named, never guessed
  (:func:`conll_names`): by a first line ``# global.columns = w pos chunk`` (as CoNLL-U Plus
  names its columns), else by the model's training data (a file holds the first columns of the
  dataset's own files: ``w pos`` or ``w pos chunk`` for a CoNLL-2000 model), else one column of
  words for a model that reads words; anything else is refused. Gold labels are the column named
  as the model's label column, if the file has it. Every non-blank line is a token
  (a word ``#`` or ``-DOCSTART-`` too), as the pipeline reads a CoNLL dataset, unless the command
  names a ``comment_prefix`` (sentence-header lines such as ``# sent_id = 1``) or a
  ``document_marker`` (CoNLL-2003's ``-DOCSTART-`` lines). Read by a CoNLL-U-shaped layout (a
  model trained on CoNLL-U), multiword-token range lines (ID ``3-4``) and empty nodes (ID ``5.1``)
  are skipped, as in training, never read as extra tokens.
- ``conllu`` (``.conllu``): :func:`crf.io.read_conllu`; FORM becomes ``w``, and UPOS or XPOS
  (option ``conllu_pos``) ``pos``; every CoNLL-U column is also available under its own name
  (``upos``, ``xpos``, ...), which gives gold labels when the model predicts one of them.
- ``jsonl`` (``.jsonl``, ``.json``): one JSON object per line, ``{"tokens": [...]}``, tokens as
  strings (words: a model that reads ``w`` alone) or objects ``{column: value}``. The value of
  each column the model reads must be a string: anything else (null, a number, a list, a
  boolean, an empty string) and a key given twice in one object are refused naming line, token
  and column. The label column's key, given for every token (or for none), holds the gold labels,
  checked the same way; other keys are not read.
- ``text`` (``.txt`` only when asked): one sentence per line of words, split by :func:`tokenize`
  as the model's training tokens were made (``whitespace`` or ``punct``).

Every token read is then checked as :meth:`crf.ModelBundle.tag` checks it
(:func:`crf.bundle.check_tokens`: a non-empty string without whitespace).

Writers (atomic: :func:`crf.io.atomic_write`): ``conll`` (the input columns, the gold column
when there is one, then each model's predicted column and, with ``marginals``, its marginal) and
``jsonl`` (per sentence: ``tokens``, ``labels``, ``marginals``, ``segments`` with confidence, and
``columns``: every predicted column by name).

What a reader gets back is what was meant:

- CoNLL output is read back by splitting on whitespace (as :func:`crf.io.read_conll` and the
  input side of this command do), so a cell that is empty or holds any whitespace (a space, tab,
  newline, ...) cannot be written faithfully: it is refused (:class:`OutputFormatError` naming
  sentence, token and column), before any tagging (:func:`check_conll_cells`). There is no
  escaping: write JSONL (``output_format=jsonl``), which holds any token.
- JSONL output is strict JSON (:func:`pipeline.report.dumps`): a marginal or confidence that is
  not a number (a sentence the model gives probability 0) is ``null``, never ``NaN``; the line
  separators some readers split lines on (U+0085, U+2028, U+2029) are written escaped.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import logging
import re
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import regex

from crf.io import CONLLU_COLUMNS, DataFormatError, atomic_write, check_input_file, decoded_lines, read_conll, read_conllu
from pipeline.report import dumps

log = logging.getLogger(__name__)

FORMATS = ("conll", "conllu", "jsonl", "text")
TOKENISATIONS = ("whitespace", "punct")  # how plain text is split into tokens (:func:`tokenize`)
WORDS = "w"  # the column of word forms: what plain text, a bare JSONL string and a one-column CoNLL file give
HEADER = "# global.columns ="  # a CoNLL file's optional first line naming its columns (as CoNLL-U Plus does)
OUTPUT_FORMATS = ("conll", "jsonl")
# characters json.dumps(ensure_ascii=False) leaves raw that str.splitlines() and some JSONL readers split on
_LINE_SEPARATORS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class OutputFormatError(ValueError):
    """A value the chosen output format cannot hold faithfully (the message names where and why)."""


# abbreviations that keep their period before anything but the end of the line (case as written):
# titles, company words, months, US states, street words, as Penn Treebank text (CoNLL-2000) and EWT write them
_ABBREVIATIONS = (
    "Mr|Mrs|Ms|Messrs|Mmes|Dr|Drs|Prof|St|Jr|Sr|Rev|Gov|Sen|Rep|Reps|Gen|Col|Lt|Sgt|Capt|Adm|Cmdr|Maj|Pres|"
    "Inc|Corp|Co|Cos|Ltd|Bros|Assn|Dept|Univ|No|Nos|vs|v|etc|Sens|approx|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|"
    "Ala|Ariz|Ark|Calif|Colo|Conn|Del|Fla|Ga|Ill|Ind|Kan|Kans|Ky|La|Md|Mass|Mich|Minn|Mo|Mont|Neb|Nev|Okla|Ore|Pa|"
    "Tenn|Tex|Va|Vt|Wis|Wyo|Ave|Blvd|Rd|Mt|Ft"
)
# Penn-Treebank-like tokenisation of raw text, tried left to right at each position:
_TOKEN = re.compile(
    rf"""
      (?:https?://|www\.)\S+?(?=[.,;:!?)\]'"]*(?:\s|$))  # web addresses (trailing punctuation split off)
    | [\w.+-]+@\w[\w-]*(?:\.[\w-]+)+    # e-mail addresses
    | \w+(?=n['’]t\b)                   # do|n't, ca|n't, is|n't: the word before the clitic
    | n['’]t\b                          # the clitic itself
    | ['’](?:s|re|ve|ll|d|m)\b          # 's 're 've 'll 'd 'm
    | (?:can(?=not\b)|(?:gon|wan)(?=na\b)|got(?=ta\b)|(?:gim|lem)(?=me\b))  # can|not, gon|na, got|ta, gim|me
    | [A-Za-z](?:\.[A-Za-z])+\.?(?:-\w+)*  # abbreviations written with dots: U.S., e.g., a.m, B.A.T, U.S.-made
    | (?-i:(?:{_ABBREVIATIONS})\.)(?:-\w+)*(?!\s*$)  # Mr., Inc., Sept., Calif.-based (a final period split off)
    | (?-i:[A-Z]\.(?=\s+[A-Z]))         # an initial before a name: J. Smith
    | [A-Za-z]+\.(?=\s+(?-i:[a-z])|\s*,)  # a period before a lowercase word or a comma is an abbreviation's
    | (?-i:[A-Z]{{1,2}})\$              # currencies: US$, C$
    | '\d\ds\b                          # decades: '80s
    | \d+(?:[.,:/]\d+)*(?:-\w+)*(?!\w)  # numbers: 3.14, 1,000, 10:30, 1/2, 30-year, 713-853-3989 (then % alone; 3rd is a word)
    | \w+(?:[-&/]\w+|'(?!(?:s|re|ve|ll|d|m)\b)\w+)*  # words, hyphenated words, AT&T, and/or, o'clock (not John|'s)
    | [.!?]{{2,}}|--|``|''|<<|>>|[‘’“”]{{2}}  # runs of punctuation: ... !! ?! << ’’
    | [:;]-?[()DPp](?!\w)               # emoticons :) ;-(
    | \S                                # any other character but space, alone
    """,
    re.VERBOSE | re.IGNORECASE,
)


def tokenize(line: str, how: str = "punct") -> list[str]:
    """Tokens of one line of raw text. ``how="punct"``: Penn-Treebank-like, as CoNLL-2000 and UD
    English were tokenised: words, numbers (``3.14``, ``1,000``), hyphenated words (``30-year``),
    names with ``&`` (``AT&T``), abbreviations with their period (``U.S.``, ``Mr.``, ``Inc.``,
    ``Sept.``; a known abbreviation, an initial before a name, or any word whose period is followed
    by a lowercase word or a comma; a period at the end of the line is split off), e-mail and web
    addresses whole, clitics split off (``do n't``, ``it 's``, ``we 're``; ``can not``, ``gon na``,
    ``wan na``, ``got ta``, ``gim me``, ``lem me``, as the Penn Treebank and EWT split them), each other punctuation
    character alone (runs of ``.!?``, ``--`` and emoticons whole; ``5%`` is ``5 %``); quotes stay as
    written (PTB's ````''`` conversion is not done). Tokens are whole grapheme clusters (an accent
    written apart, an emoji with its skin tone or joiners, a flag) and NFC and NFD text give the
    same tokens (see :func:`_clusters`). ``how="whitespace"``: the line split on
    whitespace (``Trinkoff,`` stays one token), as AnyStyle's training sequences were."""
    if how == "whitespace":
        return line.split()
    if how != "punct":
        raise ValueError(f"tokenize={how!r}; one of {', '.join(TOKENISATIONS)}")
    if _NEEDS_CLUSTERS.search(line) is None:
        return [found.group() for found in _TOKEN.finditer(line)]
    bounds, skeleton = _clusters(line)
    return [line[bounds[found.start()] : bounds[found.end()]] for found in _TOKEN.finditer(skeleton)]


# what makes a line need grapheme clusters: a character that joins the one before or after it
# (Unicode's Grapheme_Cluster_Break Extend, SpacingMark, Prepend, ZWJ: combining marks, skin tones,
# halfwidth voiced marks, a Malayalam dot reph), regional indicators (flags), format characters and
# other invisible ones (direction marks, soft hyphens, variation selectors, Hangul fillers)
_NEEDS_CLUSTERS = regex.compile(
    r"[\p{M}\p{Cf}\p{Default_Ignorable_Code_Point}\p{Grapheme_Cluster_Break=Extend}\p{Grapheme_Cluster_Break=SpacingMark}"
    r"\p{Grapheme_Cluster_Break=Prepend}\p{Grapheme_Cluster_Break=ZWJ}\p{Grapheme_Cluster_Break=Regional_Indicator}]"
)
_CLUSTER = regex.compile(r"\X")  # an extended grapheme cluster (Unicode UAX #29): what a reader sees as one character
# characters that show nothing of their own (Unicode's default-ignorable code points: joiners, direction
# marks, soft hyphens, variation selectors, a byte-order mark, Hangul fillers, a zero-width space)
_INVISIBLE = regex.compile(r"\p{Default_Ignorable_Code_Point}")
_ZERO_WIDTH_SPACE = "\u200b"


def _clusters(line: str) -> tuple[list[int], str]:
    """``line`` as one stand-in character per user-perceived character, for :data:`_TOKEN` to
    match: ``(bounds, skeleton)``, where skeleton character ``i`` stands for ``line[bounds[i]:
    bounds[i + 1]]`` (``bounds`` has one more entry than ``skeleton``).

    The stand-in of a cluster of several characters is its NFC form when that is one character
    (``e`` + U+0301 is ``é``, so NFC and NFD text give the same tokens), else its first character
    that is no mark or format character (an emoji sequence stands as its first emoji, a flag as its
    first indicator). Marks and invisible characters (direction marks, soft hyphens, joiners,
    variation selectors) after a character belong to it, as Unicode's word rules have it (UAX #29,
    WB4). With nothing before them (at the line's start or after a space), invisible characters
    count as space (so does a zero-width space) and a run of marks joins the next word, or stands
    alone as a visible character: a token never starts with an invisible character.
    """
    bounds: list[int] = []
    skeleton: list[str] = []  # pieces: a run of spaces or a plain word stands as itself
    for run in _RUNS.finditer(line):
        begin, end = run.span()
        if run.group()[0].isspace() or _NEEDS_CLUSTERS.search(line, begin, end) is None:
            bounds.extend(range(begin, end))
            skeleton.append(run.group())
        else:
            _word_clusters(line, begin, end, bounds, skeleton)
    bounds.append(len(line))
    return bounds, "".join(skeleton)


_RUNS = re.compile(r"\s+|\S+")  # what _TOKEN takes for space, and the words between


def _word_clusters(line: str, begin: int, end: int, bounds: list[int], skeleton: list[str]) -> None:
    """Append the stand-ins of the word ``line[begin:end]`` (no space in it) and where each starts
    (see :func:`_clusters`)."""
    orphan = -1  # where a run of visible marks with nothing before it began
    after_space = True
    clusters = _CLUSTER.findall(line, begin, end)
    special = set(_NEEDS_CLUSTERS.findall(line, begin, end))
    for text, start in zip(clusters, itertools.accumulate(map(len, clusters), initial=begin)):
        if len(text) == 1 and text not in special:  # most are one plain character
            bounds.append(orphan if orphan >= 0 else start)
            skeleton.append(text)
            orphan, after_space = -1, False
            continue
        if text == _ZERO_WIDTH_SPACE:
            _close_orphan(line, orphan, start, bounds, skeleton)
            bounds.append(start)
            skeleton.append(" ")
            orphan, after_space = -1, True
            continue
        stand_in = _stand_in(text)
        if stand_in is None:  # marks and invisible characters only
            if orphan < 0 and not after_space:
                continue  # they belong to the character before them (its span grows on to the next start)
            orphan = orphan if orphan >= 0 else _first_visible(text, start)
            continue
        bounds.append(orphan if orphan >= 0 else _first_visible(text, start))  # invisible ones go before
        skeleton.append(stand_in)
        orphan, after_space = -1, False
    _close_orphan(line, orphan, end, bounds, skeleton)


def _first_visible(text: str, start: int) -> int:
    """Where in the line (``text`` starts at ``start``) the first character of ``text`` that is
    neither space nor invisible is, or -1."""
    return next((start + i for i, c in enumerate(text) if not (c.isspace() or _INVISIBLE.match(c))), -1)


def _close_orphan(line: str, orphan: int, end: int, bounds: list[int], skeleton: list[str]) -> None:
    """A run ``line[orphan:end]`` of marks with nothing before or after it (a space or the line's
    ends), starting with a visible one: a character of its own. ``orphan < 0``: none."""
    if orphan < 0:
        return
    bounds.append(orphan)
    skeleton.append(line[orphan])


def _stand_in(cluster: str) -> str | None:
    """The one character :data:`_TOKEN` sees for ``cluster`` (see :func:`_clusters`); None for a
    cluster of marks and invisible characters only."""
    if len(cluster) == 1:  # as itself, as on a line that needs no clusters (NFC would turn a Kelvin sign into K)
        return None if _attaches(cluster) else cluster
    composed = unicodedata.normalize("NFC", cluster)
    return next((c for c in composed if not _attaches(c)), None)


def _attaches(character: str) -> bool:
    """Whether ``character`` goes with a character next to it: a combining mark (Unicode category
    M*), a format character (Cf: joiners, direction marks, soft hyphens, Arabic number signs) or an
    invisible one (a variation selector, a Hangul filler)."""
    category = unicodedata.category(character)
    return category[0] == "M" or category == "Cf" or _INVISIBLE.match(character) is not None


@dataclass
class Corpus:
    """Sentences as flat token columns: ``columns`` {name: (T,) object array}, ``lengths`` (N,);
    ``gold`` (T,) labels or None; ``token_columns``: the columns given per token (in order);
    ``by_position``: whether the columns were named by their position (a CoNLL file without a
    header line), not by names the file gives."""

    columns: dict[str, np.ndarray]
    lengths: np.ndarray
    gold: np.ndarray | None = None
    token_columns: list[str] = field(default_factory=list)
    by_position: bool = False

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def sentences(self, values: np.ndarray) -> list[list]:
        """Flat per-token ``values`` (T,) cut into per-sentence lists."""
        offsets = self.offsets
        return [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def detect_format(path: Path, choice: str, choices: Sequence[str] = FORMATS) -> str:
    """``choice`` if not ``auto``, else the format of ``path``'s extension (``.gz`` ignored)."""
    if choice != "auto":
        if choice not in choices:
            raise ValueError(f"unknown format {choice!r}; one of auto, {', '.join(choices)}")
        return choice
    suffixes = [s.lower() for s in Path(path).suffixes if s.lower() != ".gz"]
    suffix = suffixes[-1] if suffixes else ""
    by_suffix = {".conllu": "conllu", ".jsonl": "jsonl", ".json": "jsonl"}
    found = by_suffix.get(suffix, "conll")
    if found not in choices:
        raise ValueError(f"{path}: cannot pick the format from the extension {suffix!r}; set it ({', '.join(choices)})")
    return found


def _flat(sentences: list[list[tuple[str, ...]]]) -> tuple[list[tuple[str, ...]], np.ndarray]:
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    return [row for sentence in sentences for row in sentence], lengths


def read_input(
    path: str | Path,
    fmt: str,
    columns: Sequence[str],
    conllu_pos: str = "xpos",
    gold: str | None = None,
    comment_prefix: str | None = None,
    document_marker: str | None = None,
    layout: Sequence[str] | None = None,
    tokenisation: str = "punct",
) -> Corpus:
    """Read ``path`` in format ``fmt`` (see the module docstring) for a model chain needing the
    token ``columns``; ``gold`` names the label column: gold labels are only ever taken from a
    column of that name; ``comment_prefix`` and ``document_marker``: the CoNLL lines that are not
    tokens (default: none); ``layout``: the columns of the model's training data, in order (names
    a CoNLL file's columns, see :func:`conll_names`); ``tokenisation``: how text is split
    (:func:`tokenize`)."""
    path = Path(path)
    check_input_file(path, "input ")
    columns = list(columns)
    if fmt == "conll":
        header = _conll_header(path)
        if header is not None and comment_prefix is not None and not HEADER.startswith(comment_prefix):
            raise DataFormatError(
                path, 1, f"a {HEADER!r} header line with comment_prefix={comment_prefix!r}: unset it or use '#'"
            )
        prefix = comment_prefix or (HEADER if header is not None else None)
        rows, lengths = _flat(read_conll(path, comment_prefix=prefix, document_marker=document_marker or None))
        names = conll_names(path, len(rows[0]), columns, gold, header, layout)
        values = list(zip(*rows))
        data = {name: np.array(values[i], dtype=object) for i, name in enumerate(names)}
        if header is None and "id" in data:  # a CoNLL-U-shaped layout: its first column must hold token numbers
            numbers = pd.Series(data["id"], dtype=str).str.fullmatch(r"\d+(?:[-.]\d+)?").to_numpy()
            if not numbers.all():
                first = int(np.argmin(numbers))
                raise DataFormatError(
                    path, 1, f"read as the training data's columns {names}, but the column 'id' holds {data['id'][first]!r} "
                    f"(token {first + 1} of the file): give CoNLL-U, or name the columns in a first line '{HEADER} ...'",
                )  # fmt: skip
            data, lengths = _skip_non_words(path, data, lengths)
        given = [c for c in names if c != gold]
        by_position = header is None and len(names) > 1  # one column cannot be out of order
        return Corpus(data, lengths, data.get(gold) if gold else None, given, by_position=by_position)
    if fmt == "conllu":
        if conllu_pos not in ("upos", "xpos"):
            raise ValueError(f"conllu_pos must be 'upos' or 'xpos', got {conllu_pos!r}")
        rows, lengths = _flat(read_conllu(path))
        values = list(zip(*rows))
        data = {name: np.array(values[i], dtype=object) for i, name in enumerate(CONLLU_COLUMNS)}
        data["w"] = data["form"]
        data["pos"] = data[conllu_pos]
        missing = [c for c in columns if c not in data]
        if missing:
            raise ValueError(f"{path}: CoNLL-U gives the columns {sorted(data)}, the model also needs {missing}")
        return Corpus(data, lengths, data.get(gold) if gold else None, columns)
    if fmt == "jsonl":
        return _read_jsonl(path, columns, gold)
    if fmt == "text":
        if columns != [WORDS]:
            raise ValueError(f"{path}: plain text gives words only (column {WORDS!r}), but the model needs the columns {columns}")
        # one sentence per line, whatever ends the lines: CR alone (old Mac exports), U+2028/U+2029, NEL
        sentences = [tokenize(part, tokenisation) for _, line in decoded_lines(path) for part in line.splitlines()]
        sentences = [s for s in sentences if s]
        if not sentences:
            raise DataFormatError(path, 1, "no text (the file is empty or blank)")
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        return Corpus({columns[0]: np.array([t for s in sentences for t in s], dtype=object)}, lengths, None, columns)
    raise ValueError(f"unknown input format {fmt!r}; one of {FORMATS}")


def _skip_non_words(path: Path, data: dict[str, np.ndarray], lengths: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """CoNLL-U lines read by a CoNLL-U-shaped layout without their non-words: multiword-token
    range lines (ID ``3-4``, whose parts follow as tokens) and empty nodes (ID ``5.1``) are
    skipped, as :func:`crf.io.read_conllu` skips them when the training data is read. ``data``
    {column: (T,) values} with an ``id`` column, ``lengths`` (N,); a sentence left without tokens
    is refused."""
    words = ~pd.Series(data["id"], dtype=str).str.contains(r"[-.]", regex=True).to_numpy()
    if words.all():
        return data, lengths
    sentence = np.repeat(np.arange(lengths.size), lengths)
    kept = np.bincount(sentence[words], minlength=lengths.size).astype(np.int64)
    if np.any(kept == 0):
        empty = int(np.argmax(kept == 0))
        raise DataFormatError(path, 1, f"sentence {empty + 1} holds only multiword-token ranges or empty nodes (IDs 3-4, 5.1)")
    log.info(
        "%s: skipped %d multiword-token range lines and empty nodes (as CoNLL-U training data is read)", path, int((~words).sum())
    )
    return {name: values[words] for name, values in data.items()}, kept


def _conll_header(path: Path) -> list[str] | None:
    """The column names of a CoNLL file's first line ``# global.columns = w pos chunk``, or None."""
    for number, line in decoded_lines(path):
        if not line.strip():
            continue
        if not line.startswith(HEADER):
            return None
        names = line[len(HEADER) :].split()
        if not names or len(set(names)) != len(names):
            raise DataFormatError(path, number, f"the header names the columns {names}: give distinct names")
        return names
    return None


def conll_names(
    path: Path, width: int, needed: Sequence[str], gold: str | None, header: Sequence[str] | None, layout: Sequence[str] | None
) -> list[str]:
    """The names of a CoNLL file's ``width`` columns. A CoNLL file has no names of its own, so they
    come from its ``header`` line (``# global.columns = ...``), else from ``layout`` (the columns
    of the model's training data, in order: the file holds the first ``width`` of them, as the
    dataset's own files do); one column for a model that reads words alone is words (``w``).
    Anything else is refused (DataFormatError): a column is never guessed, and gold labels come
    only from a column named ``gold`` (the label column)."""
    needed = list(needed)
    if header is not None:
        if len(header) != width:
            raise DataFormatError(path, 1, f"the header names {len(header)} columns {list(header)}, the lines have {width}")
        names, origin = list(header), "the header"
    elif width == 1 and needed == [WORDS]:
        names, origin = [WORDS], "words"
    elif layout:
        layout = list(layout)
        if width > len(layout):
            raise DataFormatError(
                path, 1, f"{width} columns, but the model's training data has {len(layout)}: {layout} "
                f"(the model needs the columns {needed}; name the file's columns in a first line '{HEADER} ...')",
            )  # fmt: skip
        names, origin = layout[:width], f"the first {width} of the training data's columns {layout}"
    else:
        raise DataFormatError(
            path, 1, f"{width} columns, but the model needs the columns {needed} and does not record its training data's "
            f"column layout: name the file's columns in a first line '{HEADER} {' '.join(needed + ([gold] if gold else []))}', "
            "or give CoNLL-U or JSONL",
        )  # fmt: skip
    missing = [c for c in needed if c not in names]
    if missing:
        raise DataFormatError(
            path, 1, f"{width} columns, read as {names} ({origin}), but the model needs the columns {needed}: {missing} missing "
            f"(name the file's columns in a first line '{HEADER} ...')",
        )  # fmt: skip
    return names


def _json_kind(value: object) -> str:
    """A decoded JSON value as a message shows it: its JSON type and (shortened) text."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return "an empty string" if not value else f"string {json.dumps(value)[:60]}"
    kind = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}.get(type(value), type(value).__name__)
    return f"{kind} {json.dumps(value)[:60]}"


def _jsonl_value(path: Path, number: int, position: int, column: str | None, value: object) -> str:
    """``value`` if it is a non-empty string, else DataFormatError naming line, token and column."""
    if isinstance(value, str) and value:
        return value
    where = f"token {position}" + (f", column {column!r}" if column else "")
    raise DataFormatError(path, number, f"{where}: expected a non-empty string, got {_json_kind(value)}")


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s object hook: a dict, refusing a key given twice (JSON leaves it undefined)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return record


def _json_integer(text: str) -> int | float:
    """A JSON integer; one of more digits than Python converts (``sys.get_int_max_str_digits``,
    4,300 by default) as a float (inf), as a
    JSON number past a float's range is read, so that a key the reader does not use cannot make
    the line unreadable (a token value must be a string either way)."""
    limit = sys.get_int_max_str_digits()  # 0: no limit
    return int(text) if not limit or len(text.lstrip("-")) <= limit else float(text)


def _listed_gold(path: Path, number: int, record: dict, sentence: list, gold: str | None) -> list | None:
    """A line's sentence-level ``"gold"`` list (as :func:`write_jsonl` writes the gold labels it
    read), when the model has a label column ``gold``: one label per token, and the tokens do not
    give them too; None without one."""
    if gold is None or "gold" not in record:
        return None
    listed = record["gold"]
    if not isinstance(listed, list) or len(listed) != len(sentence):
        got = f"a list of {len(listed)}" if isinstance(listed, list) else _json_kind(listed)
        raise DataFormatError(path, number, f'"gold" must be a list of one label per token ({len(sentence)}), got {got}')
    if any(isinstance(token, dict) and gold in token for token in sentence):
        raise DataFormatError(path, number, f'the gold labels are given twice: in "gold" and in the tokens\' {gold!r}; give one')
    return listed


def _read_jsonl(path: Path, columns: list[str], gold: str | None = None) -> Corpus:
    """``{"tokens": [...]}`` per line; every value a non-empty string (checked with its position).
    The gold labels, when given for all sentences or none: the label column ``gold`` in every token
    object, or a sentence-level ``"gold"`` list of one label per token (as :func:`write_jsonl`
    writes them)."""
    values: dict[str, list[str]] = {c: [] for c in columns}
    golds: list[str] = []
    with_gold: bool | None = None  # whether the tokens give the gold column: as the first token does
    lengths: list[int] = []
    unread: tuple[int, list[str]] | None = None  # the first line whose tokens hold keys nothing reads, and those keys
    for number, line in decoded_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_unique_keys, parse_int=_json_integer)
        except json.JSONDecodeError as err:
            raise DataFormatError(path, number, f"not valid JSON ({err.msg})") from None
        except RecursionError:
            raise DataFormatError(path, number, "not valid JSON here (arrays or objects nested too deeply)") from None
        except _DuplicateKey as err:
            raise DataFormatError(path, number, f"the key {err.key!r} appears more than once in one object") from None
        sentence = record.get("tokens") if isinstance(record, dict) else None
        if not isinstance(sentence, list) or not sentence:
            raise DataFormatError(path, number, 'expected an object with a non-empty list "tokens"')
        listed = _listed_gold(path, number, record, sentence, gold)
        for position, token in enumerate(sentence, start=1):
            if gold is not None and isinstance(token, (dict, str)):
                has = listed is not None or (isinstance(token, dict) and gold in token)
                with_gold = has if with_gold is None else with_gold
                if has != with_gold:
                    raise DataFormatError(
                        path, number, f"token {position} {'gives' if has else 'lacks'} the label column {gold!r}, which the "
                        f"first token {'lacks' if has else 'gives'}: give the gold labels for every token or for none",
                    )  # fmt: skip
                if has:
                    value = listed[position - 1] if listed is not None else token[gold]
                    golds.append(_jsonl_value(path, number, position, gold, value))
            if isinstance(token, dict):
                if unread is None and set(token) - {*columns, gold}:
                    unread = number, sorted(set(token) - {*columns, gold})
                missing = [c for c in columns if c not in token]
                if missing:
                    raise DataFormatError(
                        path, number, f"token {position} {token} lacks the columns {missing} (the model needs {columns})"
                    )
                for c in columns:
                    values[c].append(_jsonl_value(path, number, position, c, token[c]))
            elif isinstance(token, str):
                if columns != [WORDS]:
                    raise DataFormatError(
                        path, number, f"tokens given as strings are words (column {WORDS!r}), but the model needs the columns "
                        f"{columns}: give objects {{column: value}}",
                    )  # fmt: skip
                values[columns[0]].append(_jsonl_value(path, number, position, None, token))
            else:
                raise DataFormatError(
                    path, number, f"token {position}: a token must be a string or an object, got {_json_kind(token)}"
                )
        lengths.append(len(sentence))
    if not lengths:
        raise DataFormatError(path, 1, "no sentences (the file is empty or blank)")
    if unread is not None:  # gold labels under another key than the label column would go unscored without a word
        log.warning(
            "%s:%d: token keys %s are not read and not written back (the model reads %s%s)", path, unread[0],
            unread[1], columns, "" if gold is None else f"; gold labels are read from {gold!r}",
        )  # fmt: skip
    data = {c: np.array(v, dtype=object) for c, v in values.items()}
    return Corpus(data, np.array(lengths, dtype=np.int64), np.array(golds, dtype=object) if with_gold else None, columns)


@dataclass
class Prediction:
    """One model's output over the corpus: the column it fills, labels (T,), marginals (T,) and
    segments (a frame: sequence, start, end, type, confidence; None for scheme ``none``)."""

    column: str
    labels: np.ndarray
    marginals: np.ndarray
    segments: pd.DataFrame | None


def conll_cell_problem(value: object) -> str | None:
    """Why ``value`` cannot be one cell of a whitespace-separated CoNLL line, or None."""
    text = str(value)
    if text == "":
        return "is empty"
    if text.split() != [text]:
        return "holds whitespace (a space, tab or line break), which a CoNLL reader splits on"
    return None


def _check_cells(cells: Sequence[tuple[str, np.ndarray]], offsets: np.ndarray) -> None:
    """OutputFormatError for the first cell (in ``cells``: (column name, (T,) values)) that
    :func:`conll_cell_problem` refuses, naming its sentence, token (1-based) and column."""
    for name, values in cells:
        text = pd.Series(values, dtype=object).astype(str)
        bad = np.flatnonzero((text.str.len() == 0) | text.str.contains(r"\s", regex=True))  # \s: what str.split() splits on
        if bad.size:
            index = int(bad[0])
            sentence = int(np.searchsorted(offsets, index, side="right"))
            token = index - int(offsets[sentence - 1]) + 1
            raise OutputFormatError(
                f"CoNLL output: sentence {sentence}, token {token}, column {name!r}: {values[index]!r} "
                f"{conll_cell_problem(values[index])}; write JSONL instead (output_format=jsonl)"
            )


def check_conll_cells(corpus: Corpus, label_sets: Mapping[str, Sequence[str]] | None = None) -> None:
    """Refuse (:class:`OutputFormatError`, naming sentence, token and column, 1-based) a corpus
    whose token or gold cells could not be written as CoNLL cells, and models whose labels
    (``label_sets``: column -> the labels a model can predict) could not: checked before tagging."""
    cells = [(c, corpus.columns[c]) for c in corpus.token_columns]
    if corpus.gold is not None:
        cells.append(("gold", corpus.gold))
    _check_cells(cells, corpus.offsets)
    for column, labels in (label_sets or {}).items():
        for label in labels:
            problem = conll_cell_problem(label)
            if problem:
                raise OutputFormatError(f"CoNLL output: the model's label {label!r} for {column!r} {problem}; write JSONL")


def write_conll(path: str | Path, corpus: Corpus, predictions: Sequence[Prediction], marginals: bool) -> None:
    """Tab-separated: the input columns, gold (if any), each prediction (and its marginal). A cell
    that could not be read back as written is refused (:func:`check_conll_cells`); nothing is written then."""
    cells = [corpus.columns[c] for c in corpus.token_columns]
    names = list(corpus.token_columns)
    if corpus.gold is not None:
        cells.append(corpus.gold)
        names.append("gold")
    for prediction in predictions:
        cells.append(prediction.labels)
        names.append(prediction.column)
        if marginals:
            cells.append(np.char.mod("%.6f", prediction.marginals).astype(object))
            names.append(f"{prediction.column} marginal")
    offsets = corpus.offsets
    _check_cells(list(zip(names, cells)), offsets)
    lines = pd.DataFrame({i: c for i, c in enumerate(cells)}).astype(str).agg("\t".join, axis=1).to_numpy()
    text = io.StringIO()
    for a, b in zip(offsets[:-1], offsets[1:]):
        text.write("\n".join(lines[a:b]))
        text.write("\n\n")
    _write_text(path, text.getvalue())


def jsonl_line(record: Mapping) -> str:
    """One strict-JSON line: non-finite numbers as null, the Unicode line separators escaped."""
    text = dumps(record, ensure_ascii=False)
    for raw, escaped in _LINE_SEPARATORS.items():
        text = text.replace(raw, escaped)
    return text


def write_jsonl(path: str | Path, corpus: Corpus, predictions: Sequence[Prediction]) -> None:
    """One object per sentence: ``tokens`` (strings for one input column, else objects), ``gold``
    (the gold labels, if read), ``labels``/``marginals``/``segments`` of the last model,
    ``columns`` {column: labels} of all."""
    offsets = corpus.offsets
    if len(corpus.token_columns) == 1:
        tokens = corpus.sentences(corpus.columns[corpus.token_columns[0]])
    else:
        frame = pd.DataFrame({c: corpus.columns[c] for c in corpus.token_columns})
        records = frame.to_dict("records")
        tokens = [records[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    last = predictions[-1]
    labels = {p.column: corpus.sentences(p.labels) for p in predictions}
    marginals = corpus.sentences(np.round(last.marginals, 6))  # NaN (an impossible sentence) is written as null
    segments: list[list[dict]] = [[] for _ in tokens]
    if last.segments is not None:
        for row in last.segments.itertuples(index=False):
            segments[row.sequence].append(
                {
                    "start": int(row.start),
                    "end": int(row.end),
                    "type": str(row.type),
                    "confidence": round(float(row.confidence), 6),
                }
            )
    gold = None if corpus.gold is None else corpus.sentences(corpus.gold)
    text = io.StringIO()
    for i, sentence in enumerate(tokens):
        record = {"tokens": sentence, **({} if gold is None else {"gold": gold[i]})}
        record.update(labels=labels[last.column][i], marginals=marginals[i])
        if last.segments is not None:
            record["segments"] = segments[i]
        if len(predictions) > 1:
            record["columns"] = {column: values[i] for column, values in labels.items()}
        text.write(jsonl_line(record))
        text.write("\n")
    _write_text(path, text.getvalue())


def _write_text(path: str | Path, text: str) -> None:
    """``text`` as UTF-8 at ``path``, atomically; gzip-compressed when the name ends in ``.gz`` (as
    inputs so named are read), with no time stamp in the header, so that one output is one file."""
    data = text.encode("utf-8")
    if str(path).lower().endswith(".gz"):  # as the format is read from the name: in any case
        data = gzip.compress(data, mtime=0)
    atomic_write(path, lambda out: out.write(data))


def write_output(path: str | Path, fmt: str, corpus: Corpus, predictions: Sequence[Prediction], marginals: bool) -> None:
    if fmt == "conll":
        write_conll(path, corpus, predictions, marginals)
    elif fmt == "jsonl":
        write_jsonl(path, corpus, predictions)
    else:
        raise ValueError(f"unknown output format {fmt!r}; one of {OUTPUT_FORMATS}")

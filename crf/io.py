"""Readers for CoNLL column files and CoNLL-U treebanks.

A corpus is returned as a list of sentences; a sentence is a list of token rows and a token row
is a tuple of column strings. Every format problem raises :class:`DataFormatError`, whose message
names the file, the 1-based line number and the problem.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterator
from pathlib import Path

Sentence = list[tuple[str, ...]]

_GZIP_MAGIC = b"\x1f\x8b"


class DataFormatError(ValueError):
    """A malformed input file; ``path``, ``line`` and ``problem`` say where and what."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        super().__init__(f"{self.path}:{line}: {problem}")


def _decoded_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its newline), reading gzip transparently."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as probe:
        is_gzip = probe.read(2) == _GZIP_MAGIC
    opener = gzip.open if is_gzip else open
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataFormatError(
                        path, number, f"not valid UTF-8 (byte {err.start}: {raw[err.start : err.start + 1]!r})"
                    ) from None
                yield number, text.rstrip("\r\n")
    except (OSError, EOFError) as err:  # a truncated or corrupt gzip stream
        raise DataFormatError(path, 0, f"cannot read file: {err}") from None


def _sentences(path: str | os.PathLike, parse: Callable[[int, str], tuple[str, ...] | None], what: str) -> list[Sentence]:
    """Group a file's token lines into sentences: blank lines end sentences, ``parse(number,
    line)`` turns a line into a token row (None: skip the line) or raises DataFormatError."""
    sentences: list[Sentence] = []
    current: Sentence = []
    saw_any_line = False
    for number, line in _decoded_lines(path):
        saw_any_line = True
        if not line.strip():
            if current:
                sentences.append(current)
                current = []
            continue
        row = parse(number, line)
        if row is not None:
            current.append(row)
    if current:
        sentences.append(current)
    if not saw_any_line:
        raise DataFormatError(path, 1, "file is empty")
    if not sentences:
        raise DataFormatError(path, 1, f"file holds no {what} lines")
    return sentences


def read_conll(
    path: str | os.PathLike,
    n_columns: int | None = None,
    separator: str | None = None,
) -> list[Sentence]:
    """Read a CoNLL column file: one token per line, columns split by ``separator``.

    ``separator=None`` splits on any run of whitespace; pass ``"\\t"`` for strictly tab-separated
    files whose cells may contain spaces. Blank lines end sentences and ``-DOCSTART-`` lines are
    skipped. Every token line must have ``n_columns`` columns (by default, as many as the first
    token line).
    """
    expected = [n_columns]

    def parse(number: int, line: str) -> tuple[str, ...] | None:
        cells = tuple(line.split(separator)) if separator else tuple(line.split())
        if cells[0] == "-DOCSTART-":
            return None
        if expected[0] is None:
            expected[0] = len(cells)
        if len(cells) != expected[0]:
            raise DataFormatError(path, number, f"expected {expected[0]} columns, found {len(cells)}: {line!r}")
        if any(cell == "" for cell in cells):
            raise DataFormatError(path, number, f"empty column in {line!r}")
        return cells

    return _sentences(path, parse, "token")


CONLLU_COLUMNS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")


def read_conllu(path: str | os.PathLike) -> list[Sentence]:
    """Read the word lines of a CoNLL-U file as 10-column token rows.

    Comment lines (``#``), multiword-token lines (ID ``3-4``) and empty nodes (ID ``8.1``) are
    skipped. A word line must have exactly 10 tab-separated columns and an integer ID.
    """

    def parse(number: int, line: str) -> tuple[str, ...] | None:
        if line.startswith("#"):
            return None
        cells = tuple(line.split("\t"))
        if len(cells) != 10:
            raise DataFormatError(path, number, f"expected 10 tab-separated columns, found {len(cells)}")
        token_id = cells[0]
        if "-" in token_id or "." in token_id:
            return None
        if not token_id.isdigit():
            raise DataFormatError(path, number, f"word ID {token_id!r} is not an integer")
        return cells

    return _sentences(path, parse, "word")


def column(sentences: list[Sentence], index: int) -> list[list[str]]:
    """Pick one column from every token: ``[[row[index] for row in s] for s in sentences]``."""
    return [[row[index] for row in sentence] for sentence in sentences]

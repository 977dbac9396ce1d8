"""Lexicons: files of (multi-token) entries with optional types, matched as longest spans."""

from __future__ import annotations

import os

import numpy as np

from .io import DataFormatError, _decoded_lines


def read_lexicon(path: str | os.PathLike, lowercase: bool = False) -> dict[tuple[str, ...], str]:
    """Read a lexicon file: one entry a line, tokens separated by spaces, optional TAB then type.

    Returns a mapping from the entry's token tuple to its type (``""`` when untyped).
    """
    entries: dict[tuple[str, ...], str] = {}
    for number, line in _decoded_lines(path):
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

    ``words`` (T,) object array of the corpus' tokens, ``position`` (T,) each token's index in its
    sentence, ``length`` (T,) its sentence's length; ``entries`` as from :func:`read_lexicon`.
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

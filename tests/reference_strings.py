"""Generated reference strings in AnyStyle's XML (``<dataset><sequence><author>...``), for tests of the
reference-field dataset, its features and the evaluate stage's field figures."""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

_SURNAMES = ["Smith", "Müller", "Dupont", "Garcia", "Nakamura", "Okafor", "Rossi", "Novak"]
_TITLE_WORDS = ["growth", "mindset", "labor", "markets", "cyclic", "fatigue", "theory", "of", "the", "in", "models"]
_JOURNALS = ["J Endod,", "Journal of Economics,", "Physical Review Letters,", "Acta Materialia,"]
_MONTHS = ["January", "March", "September", "Dec."]


def _reference(rng) -> str:
    """One generated <sequence>: authors, date, title, journal, volume, pages (field order varies)."""
    authors = [f"{rng.choice(_SURNAMES)}, {chr(65 + int(rng.integers(26)))}." for _ in range(int(rng.integers(1, 4)))]
    fields = [
        ("author", ", ".join(authors[:-1]) + (", &amp; " if len(authors) > 1 else "") + authors[-1]),
        ("date", f"({rng.choice(_MONTHS)} {int(rng.integers(1950, 2025))})."),
        ("title", " ".join(rng.choice(_TITLE_WORDS, size=int(rng.integers(2, 7)))).capitalize() + "."),
        ("journal", escape(str(rng.choice(_JOURNALS)))),
        ("volume", f"Vol. {int(rng.integers(1, 90))},"),
        ("pages", f"pp. {int(rng.integers(1, 500))}-{int(rng.integers(500, 900))}."),
    ]
    if rng.random() < 0.3:
        fields.insert(0, ("citation-number", f"[{int(rng.integers(1, 60))}]"))
    return "<sequence>" + "".join(f"<{tag}>{text}</{tag}>" for tag, text in fields) + "</sequence>"


def write_references(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    body = "\n".join(_reference(rng) for _ in range(n))
    path.write_text(f'<?xml version="1.0" encoding="UTF-8"?>\n<dataset>\n{body}\n</dataset>\n', encoding="utf-8")
    return path

"""Small report helpers: Markdown tables without extra dependencies."""

from __future__ import annotations

import numbers

import pandas as pd


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, numbers.Integral):
        return f"{value:,}"
    if isinstance(value, numbers.Real):
        v = float(value)
        if v.is_integer() and abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-style Markdown table of ``frame`` (index not included)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])

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


def figure(width: float, height: float, columns: int = 1):
    """A matplotlib figure (headless backend) with ``columns`` axes side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path) -> None:
    """Lay out, write as PNG and release the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

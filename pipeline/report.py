"""Small report helpers: Markdown tables (pandas + tabulate) and matplotlib figures."""

from __future__ import annotations

import numpy as np
import pandas as pd


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-style Markdown table of ``frame`` (index not included) by ``DataFrame.to_markdown``:
    missing values blank, booleans True/False, whole or large numbers with thousands separators
    and no decimals, other numbers to 4 significant digits."""
    formats = []
    for name in frame.columns:
        column = frame[name]
        numbers = pd.to_numeric(column, errors="coerce") if column.dtype != bool else pd.Series(dtype=float)
        numbers = numbers.dropna()
        large = not numbers.empty and (numbers.abs().max() >= 1000 or (numbers == numbers.round()).all())
        formats.append(",.0f" if large else ".4g")
    cells = frame.astype(object).map(lambda v: str(v) if isinstance(v, (bool, np.bool_)) else v)  # not 1/0
    cells = cells.astype(object).where(frame.notna(), None)
    return cells.to_markdown(index=False, missingval="", floatfmt=formats, intfmt=",")


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

"""Build a FeatureExtractor from a feature config and a dataset's column names."""

from __future__ import annotations

from typing import Mapping, Sequence

from crf.features import FeatureExtractor


def build_extractor(features: Mapping, columns: Sequence[str]) -> FeatureExtractor:
    """``features`` is a ``conf/features/*.yaml`` mapping. Each lexicon becomes a view over the
    word column ``w`` and templates at ``lexicon_offsets``."""
    views = {name: dict(spec) for name, spec in dict(features.get("views") or {}).items()}
    templates = list(features.get("templates") or [])
    for name, spec in dict(features.get("lexicons") or {}).items():
        spec = dict(spec)
        views[name] = {"column": spec.get("column", "w"), "fn": "lexicon", "path": spec["path"], "lowercase": bool(spec.get("lowercase", False))}
        templates += [f"{name}[{offset}]" for offset in features.get("lexicon_offsets", [0])]
    return FeatureExtractor(
        columns=list(columns),
        templates=templates,
        views=views,
        numeric=list(features.get("numeric") or []),
        bos_eos=bool(features.get("bos_eos", True)),
        padding=bool(features.get("padding", False)),
        min_count=int(features.get("min_count", 1)),
    )

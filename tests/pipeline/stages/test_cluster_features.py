"""Cluster features in the pipeline: the paths file is part of the featurize stage's key (an
edited file is new features, never a stale cache entry), and a relative path resolves against the
project root, as a lexicon's does."""

from __future__ import annotations

import pytest

from crf.clusters import write_paths
from pipeline.engine.stage import frozen
from pipeline.stages.featurize import PROJECT_ROOT, Featurize, build_extractor

FEATURIZE = Featurize()


def _features(path: str) -> dict:
    return {"templates": ["w[0]", "brown4[0]"], "views": {"brown4": {"column": "w", "fn": "cluster", "path": path, "n": 4}}}


def test_an_edited_paths_file_changes_the_featurize_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = tmp_path / "paths.txt"
    write_paths(paths, {"the": "0110", "dog": "1011"}, {"the": 5, "dog": 2})
    before = FEATURIZE.external_inputs(frozen({"features": _features(str(paths))}), None)
    write_paths(paths, {"the": "0110", "dog": "0111"}, {"the": 5, "dog": 2})
    after = FEATURIZE.external_inputs(frozen({"features": _features(str(paths))}), None)
    assert set(before) == {"lexicon:view brown4"} and before != after
    extractor = build_extractor(_features(str(paths)), ["w"])
    extractor.fit([[("dog",)]])
    assert "brown4[0]=0111" in {str(n) for n in extractor.attribute_names()} or extractor.n_attributes > 1


def test_a_relative_paths_file_resolves_against_the_project_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the project root
    with pytest.raises(FileNotFoundError, match=f"view brown4: no file {PROJECT_ROOT}/clusters/none.txt"):
        FEATURIZE.external_inputs(frozen({"features": _features("clusters/none.txt")}), None)

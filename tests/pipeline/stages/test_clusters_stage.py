"""Word clusters learned by the pipeline from an unlabelled pool: cached by the pool's content (a
second run is a cache hit, a changed pool is a new entry and new featurize key), one config option
turns them on for any feature set, and bad pool files are one-line errors naming them."""

from __future__ import annotations

import gzip

import pytest
from pipeline_helpers import compose_config, seed_store, tiny_overrides, write_corpus

from crf.clusters import read_paths
from pipeline.__main__ import run_pipeline
from pipeline.engine.stage import frozen
from pipeline.stages import clusters
from pipeline.stages.featurize import Featurize

FEATURIZE = Featurize()
WORDS = [["the", "dog", "runs"], ["a", "cat", "runs"], ["the", "cat", "sees", "a", "dog"]]


def test_the_pool_is_clustered_once_and_a_changed_pool_is_clustered_again(tmp_path):
    settings = clusters.settings_of("auto")
    first, hit = clusters.learn(tmp_path, settings, WORDS, [])
    assert not hit and set(read_paths(first)) == {"the", "a", "dog", "cat", "runs", "sees"}
    again, hit = clusters.learn(tmp_path, settings, WORDS, [])
    assert hit and again == first
    extra = tmp_path / "news.txt"
    extra.write_text("the man runs\n\na dog sees the man\n")
    grown, hit = clusters.learn(tmp_path, {**settings, "format": "text"}, WORDS, [extra])
    assert not hit and grown != first and "man" in read_paths(grown)
    edited, hit = clusters.learn(tmp_path, settings, [*WORDS, ["the", "man"]], [])
    assert not hit and edited not in (first, grown)
    assert clusters.learn(tmp_path, {**settings, "n_clusters": 3}, WORDS, [])[0] != first  # a setting is part of the key


def test_bad_pool_files_are_one_line_errors_naming_them(tmp_path):
    missing = tmp_path / "none.txt"
    with pytest.raises(FileNotFoundError, match=f"features.clusters.pool: no pool file {missing}"):
        clusters.pool_paths({"clusters": {"pool": [str(missing)]}})
    with pytest.raises(FileNotFoundError, match="dataset.unlabelled: no pool file .*/raw/news.txt"):
        clusters.pool_paths({"clusters": "auto"}, ["raw/news.txt"], tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=f"{empty}:1: the text pool file holds no words"):
        clusters.learn(tmp_path, {**clusters.settings_of("auto"), "format": "text"}, WORDS, [empty])
    with pytest.raises(ValueError, match=r"features.clusters: unknown setting\(s\) \['n_cluster'\]"):
        clusters.settings_of({"n_cluster": 5})
    with pytest.raises(ValueError, match="features.clusters.format='xml'"):
        clusters.settings_of({"format": "xml"})


def test_one_option_adds_cluster_views_to_any_feature_set():
    features = {"templates": ["w[0]"], "views": {}, "clusters": {"prefixes": [4, 6], "offsets": [0, 1]}}
    out = clusters.expanded(features, "/tmp/paths.txt")
    assert out["templates"] == ["w[0]", "brown4[0]", "brown4[1]", "brown6[0]", "brown6[1]"] and "clusters" not in out
    assert out["views"]["brown6"] == {"column": "w", "fn": "cluster", "path": "/tmp/paths.txt", "n": 6}
    assert clusters.expanded(features, None)["templates"] == ["w[0]"]  # before the file exists: no cluster views
    view = {"column": "w", "fn": "cluster", "path": "auto", "n": 4}
    own = {"templates": ["w[0]", "b4[0]", "b4[-1]|w[0]"], "views": {"b4": view}, "clusters": "auto"}
    assert clusters.expanded(own, None)["templates"] == ["w[0]"]
    assert clusters.expanded(own, "/p.txt")["views"]["b4"]["path"] == "/p.txt"
    plain = {"templates": ["w[0]"], "views": {}}
    assert clusters.expanded(plain, None) == plain and not clusters.is_auto(plain)


def test_the_featurize_key_changes_with_the_pool_files(tmp_path):
    pool = tmp_path / "pool.conll"
    pool.write_text("the\nman\n\n")
    features = {"templates": ["w[0]"], "views": {}, "clusters": {"pool": [str(pool)]}}
    settings = frozen({"data_root": str(tmp_path)})
    before = FEATURIZE.external_inputs(frozen({"features": features, "unlabelled": []}), settings)
    pool.write_text("the\nwoman\n\n")
    after = FEATURIZE.external_inputs(frozen({"features": features, "unlabelled": []}), settings)
    assert set(before) == {"pool:0"} and before != after


@pytest.mark.parametrize("option", [["+features/clusters=brown"], ["features=chunking_clusters", "features.clusters=auto"]])
def test_the_pipeline_learns_clusters_from_the_training_words_and_reuses_them(tmp_path, option):
    data = write_corpus(tmp_path / "data", n_train=60, n_test=20)
    out = tmp_path / "out"
    seed_store(out)
    cfg = compose_config(tiny_overrides(data, out) + ["stages=[featurize]", *option])
    first = run_pipeline(cfg)
    assert first["featurize.attributes"] > 0
    (entry,) = (out / "cache" / "clusters").iterdir()
    paths = read_paths(entry / clusters.PATHS_FILE)
    assert {"dog", "cat", "the"} <= set(paths)
    (features,) = [p for p in (out / "cache" / "featurize").iterdir() if not p.name.startswith(".")]
    assert (features / clusters.PATHS_FILE).read_bytes() == (entry / clusters.PATHS_FILE).read_bytes()
    second = run_pipeline(cfg)  # everything from the cache
    assert second["featurize.attributes"] == first["featurize.attributes"]
    assert len(list((out / "cache" / "featurize").iterdir())) == 1
    # a plain-text pool file named by the dataset joins the pool: new clusters, new features
    (data / "extra.txt.gz").write_bytes(gzip.compress(b"the zebra runs\na zebra sees the dog\n"))
    grown = compose_config(
        tiny_overrides(data, out) + ["stages=[featurize]", *option, "+dataset.unlabelled=[extra.txt.gz]"]
        + (["features.clusters.format=text"] if "+features/clusters=brown" in option else [])
    )  # fmt: skip
    if "+features/clusters=brown" in option:
        run_pipeline(grown)
        assert len(list((out / "cache" / "clusters").iterdir())) == 2
        assert len([p for p in (out / "cache" / "featurize").iterdir() if not p.name.startswith(".")]) == 2

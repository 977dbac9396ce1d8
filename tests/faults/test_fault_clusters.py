"""Fault injection on the word clusters (``+features/clusters=brown``, ``features.clusters``,
``semi.clusters``): every setting and every way its files can be wrong is refused with one line
naming the setting (and the file), before any stage runs; what only the pool's content tells
(a file without a word, ``min_count`` leaving no word) is refused by name once the pool is
counted, before the clustering."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import forkserver
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import compose_config, tiny_overrides, write_corpus  # noqa: E402

from crf.clusters import main as clusters_main  # noqa: E402
from crf.clusters import path_prefixes, read_paths  # noqa: E402
from crf.io import DataFormatError  # noqa: E402
from pipeline.engine.stage import load_stages  # noqa: E402
from pipeline.engine.validate import SettingsError, validate_settings  # noqa: E402
from pipeline.stages import clusters  # noqa: E402
from pipeline.stages.featurize import build_extractor  # noqa: E402

BROWN = "+features/clusters=brown"
WORDS = [["the", "dog", "runs"], ["a", "cat", "runs"], ["the", "cat", "sees", "a", "dog"]]


def _refused(overrides: list[str], stages: tuple[str, ...] = ("featurize",)) -> str:
    """The one-line message of the SettingsError that validating ``overrides`` raises."""
    everything = load_stages()
    with pytest.raises(SettingsError) as caught:
        validate_settings(compose_config(overrides), [everything[name] for name in stages])
    text = str(caught.value)
    assert "\n" not in text
    return text


def _passes(overrides: list[str]) -> None:
    """Validating ``overrides`` with the featurize stage's checks raises nothing."""
    validate_settings(compose_config(overrides), [load_stages()["featurize"]])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["features.clusters.prefixes=[-1]"], "bad setting features.clusters.prefixes=[-1]: whole numbers >= 0"),
        (["features.clusters.prefixes=[]"], "bad setting features.clusters.prefixes=[]: a non-empty list"),
        (["features.clusters.prefixes=4"], "bad setting features.clusters.prefixes=4: a non-empty list"),
        (["features.clusters.prefixes=[4,4]"], "bad setting features.clusters.prefixes=[4, 4]: 4 is repeated"),
        (["features.clusters.prefixes=[a]"], "bad setting features.clusters.prefixes=['a']"),
        (["features.clusters.offsets=[0.5]"], "bad setting features.clusters.offsets=[0.5]: whole numbers"),
        (["features.clusters.offsets=[]"], "bad setting features.clusters.offsets=[]: a non-empty list"),
        (["features.clusters.offsets=[0,0]"], "bad setting features.clusters.offsets=[0, 0]: 0 is repeated"),
        (["features.clusters.offsets=[true]"], "bad setting features.clusters.offsets=[True]"),
        (["features.clusters.n_clusters=0"], "bad setting features.clusters.n_clusters=0: a whole number >= 1"),
        (["features.clusters.n_clusters=1e400"], "bad setting features.clusters.n_clusters=inf"),
        (["features.clusters.n_clusters=abc"], "bad setting features.clusters.n_clusters='abc'"),
        (["features.clusters.min_count=0"], "bad setting features.clusters.min_count=0: a whole number >= 1"),
        (["features.clusters.format=xml"], "bad setting features.clusters.format='xml': one of conll, text"),
        (["features.clusters.column=nosuch"], "bad setting features.clusters.column='nosuch': not a column of dataset"),
        (["features.clusters.column=chunk"], "bad setting features.clusters.column='chunk': the label column"),
        (["features.clusters.column=null"], "bad setting features.clusters.column=None"),
        (["features.clusters.source=''"], "bad setting features.clusters.source=''"),
        (["features.clusters.pool=[null]"], "bad setting features.clusters.pool=[None]: a list of text files"),
        (["features.clusters.templates='brown4[0]'"], "bad setting features.clusters.templates='brown4[0]': a list of templates"),
        (["features.clusters.templates=['']"], "bad setting features.clusters.templates=['']: a list of templates"),
        (["features.clusters.templates=['w[0]|pos[0]']"], "template 'w[0]|pos[0]' reads no cluster view (brown10, brown20"),
        (["features.clusters.templates=['brown5[0]']"], "template 'brown5[0]' reads no cluster view"),
        (
            ["features.clusters.templates=['brown4[0]|pos[0]','brown4[0]|pos[0]']"],
            "'brown4[0]|pos[0]' and 'brown4[0]|pos[0]' read the same cells",
        ),
        (
            ["features.clusters.templates=['brown4[0]|pos[0]','pos[0] | brown4[ 0 ]']"],
            "'brown4[0]|pos[0]' and 'pos[0] | brown4[ 0 ]' read the same",
        ),
        (["features.clusters.templates=['brown6[1]']"], "template 'brown6[1]' is made already by prefixes and offsets"),
        (["features.clusters.templates=['brown6[ 1 ]']"], "template 'brown6[ 1 ]' is made already by prefixes and offsets"),
        (["features.clusters.templates=['brown4[0]|lemma[0]']"], "'brown4[0]|lemma[0]' reads 'lemma', neither a cluster view"),
        (["features.clusters.templates=['brown4[x]']"], "bad setting features.clusters.templates: "),
        (
            ["features.templates=['w[0]','w[-1]|w[0]','w[0] | w[-1]']"],
            "features.templates: templates 'w[-1]|w[0]' and 'w[0] | w[-1]'",
        ),
    ],
)
def test_every_clusters_setting_is_checked_before_any_stage(overrides, message):
    assert message in _refused([BROWN, *overrides])


def test_the_settings_the_shipped_configs_use_pass_and_mean_what_they_say(tmp_path):
    _passes([BROWN])
    _passes([BROWN, "features.clusters.column=pos", "features.clusters.prefixes=[0,1000]"])
    _passes([BROWN, "features.clusters.templates=['brown4[-1]|brown4[0]','brown6[0]|pos[0]']", "features.clusters.offsets=[0]"])
    _passes(["+features/clusters=brown_pos"])  # the CoNLL-2000 preset: offsets -1..1, clusters x POS
    refused = _refused(["dataset=bc5cdr", "features=bio_ner", "+features/clusters=brown_pos"])
    assert "features.clusters.templates: 'brown4[0]|pos[0]' reads 'pos'" in refused
    semi = ["+experiment=semi_supervised", "dataset=bc5cdr", "features=bio_ner", "features/clusters@semi.clusters=brown_pos"]
    assert "semi.clusters.templates: 'brown4[0]|pos[0]' reads 'pos'" in _refused(semi, ("semi_supervised",))
    # conjunctions come after the per-offset templates, in the order given; without the clusters' file none is made
    settings = clusters.settings_of({"prefixes": [4], "offsets": [0], "templates": ["brown4[-1]|brown4[0]", "brown4[0]|w[0]"]})
    made = clusters.expanded({"templates": ["w[0]"], "views": {}, "clusters": settings}, "paths.txt")
    assert made["templates"] == ["w[0]", "brown4[0]", "brown4[-1]|brown4[0]", "brown4[0]|w[0]"]
    assert clusters.expanded({"templates": ["w[0]"], "views": {}, "clusters": settings}, None)["templates"] == ["w[0]"]
    paths_file = tmp_path / "paths.txt"
    paths_file.write_text("0110\tthe\t2\n1011\tdog\t1\n")
    made = clusters.expanded({"templates": [], "views": {}, "bos_eos": False, "clusters": settings}, paths_file)
    extractor = build_extractor(made, ["w", "y"]).fit([[("the", "O"), ("dog", "O"), ("cat", "O")]])
    # "cat" has no path: no brown4[0] and no conjunction reading it
    assert sorted(extractor.attribute_names().tolist()) == [
        "brown4[-1]|brown4[0]=0110|1011",
        "brown4[0]=0110",
        "brown4[0]=1011",
        "brown4[0]|w[0]=0110|the",
        "brown4[0]|w[0]=1011|dog",
    ]
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) \['n_cluster'\]"):
        clusters.settings_of({"n_cluster": 5})
    # a prefix at least as long as every path is the whole path, as 0 is (documented in brown.yaml)
    paths = {"the": "0101", "cat": "11"}
    assert path_prefixes(paths, 1000) == path_prefixes(paths, 0) == paths


def _files(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "folder"
    folder.mkdir()
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    text = tmp_path / "news.txt"
    text.write_text("the man runs home\na dog sees the man\nthe end\n" * 5)
    conll = tmp_path / "columns.txt"
    conll.write_text("the DT B-NP\ndog NN I-NP\nruns VB B-VP\n\n" * 6)
    conllu = tmp_path / "ud.conllu"
    conllu.write_text("# text = the dog\n1\tthe\tthe\tDET\n2\tdog\tdog\tNOUN\n\n")
    paths = tmp_path / "paths.txt"
    paths.write_text("0101\tthe\t5\n011\tdog\t3\n")
    files = {"missing": tmp_path / "none.txt", "folder": folder, "empty": empty, "text": text, "conll": conll}
    return {**files, "conllu": conllu, "paths": paths}


@pytest.mark.parametrize(
    ("setting", "case", "message"),
    [
        ("source", "missing", "bad setting features.clusters.source: no word-cluster paths file {path}"),
        ("source", "folder", "bad setting features.clusters.source: the word-cluster paths file {path} is a folder"),
        ("source", "empty", "bad setting features.clusters.source: the word-cluster paths file {path} is empty"),
        ("source", "conll", "bad setting features.clusters.source: paths file {path}: line 1: expected 'path<TAB>word"),
        ("pool", "missing", "bad setting features.clusters.pool: no pool file {path}"),
        ("pool", "folder", "bad setting features.clusters.pool: the pool file {path} is a folder, not a file"),
        ("pool", "empty", "bad setting features.clusters.pool: the pool file {path} is empty"),
        ("pool", "text", "bad setting features.clusters.format='conll': pool file {path}: line 2 has 5 cells where line 1"),
        ("text_pool", "conll", "bad setting features.clusters.format='text': pool file {path}: its first 18 lines all have 3"),
        ("text_pool", "conllu", "bad setting features.clusters.format='text': pool file {path}: a CoNLL-U file"),
        ("paths_file", "missing", "bad setting features.clusters: no word-cluster paths file {path}"),
        ("paths_file", "folder", "bad setting features.clusters: the word-cluster paths file {path} is a folder"),
        ("unlabelled", "missing", "bad setting dataset.unlabelled: no pool file {path}"),
    ],
)
def test_every_way_a_clusters_file_can_be_wrong_is_refused_before_any_stage(tmp_path, setting, case, message):
    path = _files(tmp_path)[case]
    overrides = {
        "source": [BROWN, f"features.clusters.source={path}"],
        "pool": [BROWN, f"features.clusters.pool=[{path}]"],
        "text_pool": [BROWN, f"features.clusters.pool=[{path}]", "features.clusters.format=text"],
        "paths_file": ["features=chunking_clusters", f"features.clusters={path}"],
        "unlabelled": [BROWN, f"data.root={tmp_path}", f"+dataset.unlabelled=[{path.name}]"],
    }[setting]
    assert message.format(path=path) in _refused(overrides)
    assert "bad setting dataset.unlabelled=5: a list of file paths" in _refused([BROWN, "+dataset.unlabelled=5"])
    missing = clusters.PoolFileError("x")
    assert isinstance(missing, FileNotFoundError) and isinstance(missing, SettingsError)  # both ways of catching it


def test_good_pool_and_paths_files_pass(tmp_path):
    files = _files(tmp_path)
    _passes([BROWN, f"features.clusters.pool=[{files['conll']}]"])
    text = [BROWN, f"features.clusters.pool=[{files['text']}]", "features.clusters.format=text"]
    _passes(text)
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("New York\n" * 12)  # equal lines without CoNLL's blank lines: a sentence a line
    _passes([BROWN, f"features.clusters.pool=[{pairs}]", "features.clusters.format=text"])
    for conll_pool in (files["conll"], files["conllu"]):
        _passes([BROWN, f"features.clusters.pool=[{conll_pool}]"])
    _passes([BROWN, f"features.clusters.source={files['paths']}"])
    _passes(["features=chunking_clusters", f"features.clusters={files['paths']}"])


def test_what_only_the_pool_tells_is_refused_by_name_before_clustering(tmp_path, monkeypatch):
    blank = tmp_path / "blank.txt.gz"
    blank.write_bytes(gzip.compress(b"\n\n\n"))  # not empty on disk, no word inside
    settings = {**clusters.settings_of("auto"), "format": "text"}
    with pytest.raises(DataFormatError, match=f"{blank}:1: the text pool file holds no words"):
        clusters.learn(tmp_path, settings, WORDS, [blank])

    def never(*args, **kwargs):
        raise AssertionError("clustered although nothing was left to cluster")

    monkeypatch.setattr(clusters, "brown_clusters", never)
    with pytest.raises(SettingsError) as caught:
        clusters.learn(tmp_path, {**settings, "min_count": 1000000}, WORDS, [])
    assert str(caught.value) == (
        "bad setting features.clusters.min_count=1000000: no word of the 11-token pool occurs that often "
        "(the most frequent occurs 2 times), so nothing is left to cluster"
    )
    with pytest.raises(SettingsError, match=r"^bad setting semi.clusters.min_count=9:"):
        clusters.learn(tmp_path, {**settings, "min_count": 9}, WORDS, [], "semi.clusters")
    assert not list((tmp_path / "clusters").glob("*"))  # no entry, no temporary folder left


def test_clusters_a_model_or_stage_would_ignore_or_clash_with_are_refused(tmp_path):
    # the HMM uses no features: the run would be named after clusters it never saw
    assert "bad setting features.clusters: model=hmm observes one column" in _refused(["model=hmm", BROWN], ())
    validate_settings(compose_config(["model=hmm"]))
    # a feature set with its own cluster views: a clusters mapping would add views of the same names
    assert "has its own views brown4, brown6, brown10, brown20" in _refused(["features=chunking_clusters", BROWN])
    # the semi-supervised stage: its crf_clusters arm clusters the training words and semi.clusters.pool
    # with semi.clusters, or reads semi.clusters.source: their files are checked as features.clusters' are
    semi = load_stages()["semi_supervised"]
    validate_settings(compose_config(["+experiment=semi_supervised"]), [semi])
    files = _files(tmp_path)
    for key, value, message in [
        ("pool", [files["missing"]], f"bad setting semi.clusters.pool: no pool file {files['missing']}"),
        ("pool", [files["text"]], f"bad setting semi.clusters.format='conll': pool file {files['text']}: line 2 has 5"),
        ("source", files["missing"], f"bad setting semi.clusters.source: no word-cluster paths file {files['missing']}"),
        ("source", files["conll"], f"bad setting semi.clusters.source: paths file {files['conll']}: line 1: expected"),
        ("prefixes", [4, 4], "bad setting semi.clusters.prefixes=[4, 4]: 4 is repeated"),
        ("column", "chunk", "bad setting semi.clusters.column='chunk': the label column"),
    ]:  # every key of brown.yaml can be set on the command line (R6b-6)
        shown = "[" + ",".join(str(v) for v in value) + "]" if isinstance(value, list) else value
        cfg = compose_config(["+experiment=semi_supervised", f"semi.clusters.{key}={shown}"])
        with pytest.raises(SettingsError) as caught:
            validate_settings(cfg, [semi])
        assert message in str(caught.value) and "\n" not in str(caught.value)
    text_pool = [f"semi.clusters.pool=[{files['text']}]", "semi.clusters.format=text"]
    for good in ([f"semi.clusters.pool=[{files['conll']}]"], text_pool, [f"semi.clusters.source={files['paths']}"]):
        validate_settings(compose_config(["+experiment=semi_supervised", *good]), [semi])
    message = "bad setting features.clusters: the semi_supervised stage does not learn the feature set's clusters"
    assert message in _refused(["+experiment=semi_supervised", BROWN], ("semi_supervised",))
    paths = tmp_path / "paths.txt"
    paths.write_text("0101\tthe\t5\n011\tdog\t3\n")
    own = ["+experiment=semi_supervised", "features=chunking_clusters", f"features.clusters={paths}"]
    assert "the feature set has views brown4, brown6, brown10, brown20, which the crf_clusters arm adds" in _refused(
        own, ("semi_supervised",)
    )
    validate_settings(compose_config([*own, "semi.arms=[crf,crf_self_training]"]), [semi])


def test_the_clusters_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    pool = tmp_path / "pool.txt"
    pool.write_text("the DT\ncat NN\n\n")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    out = tmp_path / "paths.txt"
    for argv, message in [
        (["--clusters", "0", str(pool)], "--clusters 0: must be at least 1"),
        (["--min-count", "0", str(pool)], "--min-count 0: must be at least 1"),
        ([str(tmp_path / "none.txt")], "none.txt: no such file"),
        ([str(tmp_path)], f"{tmp_path}: not a file"),
        ([str(blank)], f"{blank}:1: the text pool file holds no words"),
        (["--min-count", "5", str(pool)], "no word occurs min_count=5 times"),
    ]:
        with pytest.raises(SystemExit) as caught:
            clusters_main(["--out", str(out), *argv])
        assert caught.value.code == 2
        assert message in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(DataFormatError, match="not a folder"):
        read_paths(tmp_path)


@pytest.mark.slow
def test_the_command_refuses_a_bad_clusters_setting_in_one_line_without_a_traceback(tmp_path):
    root = write_corpus(tmp_path / "data", n_train=20, n_test=5)
    done = forkserver.run(
        [sys.executable, "-m", "pipeline", *tiny_overrides(root, tmp_path / "out"), BROWN, "features.clusters.prefixes=[4,4]"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if "ERROR" in line]
    line = "bad setting features.clusters.prefixes=[4, 4]: 4 is repeated (each value once)"
    assert len(errors) == 1 and errors[0].endswith(line)
    assert not (tmp_path / "out" / "cache").exists()  # refused before any stage

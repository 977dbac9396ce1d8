"""Field-extraction figures of the evaluate stage (pipeline/stages/fields.py): token and sequence error,
per-type F1, confidence average precision, correction propagation; and a pipeline run on
generated reference strings that logs them."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402
from pipeline_helpers import compose_config  # noqa: E402
from reference_strings import write_references  # noqa: E402
from sklearn.metrics import average_precision_score  # noqa: E402

from crf import HMM, ModelBundle, metrics  # noqa: E402
from crf.hmm import BundledHMM  # noqa: E402
from pipeline.__main__ import run_pipeline  # noqa: E402
from pipeline.engine.stage import frozen  # noqa: E402
from pipeline.stages import fields  # noqa: E402
from pipeline.stages.featurize import STAGE as FEATURIZE  # noqa: E402
from pipeline.stages.featurize import build_extractor  # noqa: E402
from pipeline.tracking import tracking_uri  # noqa: E402

GOLD = [
    ["B-author", "I-author", "B-title", "I-title"],
    ["B-date", "O"],
    ["B-author", "B-title"],
    ["B-author", "B-author"],
]
PREDICTED = [
    ["B-author", "I-author", "B-title", "I-title"],
    ["B-date", "B-date"],  # O read as date: one wrong token
    ["B-title", "B-title"],  # author read as title: one wrong token
    ["B-author", "I-author"],  # the right field on both tokens, only the chunk boundary differs
]


def _flat(sequences):
    return np.array([label for s in sequences for label in s], dtype=object), np.cumsum([0] + [len(s) for s in sequences])


def test_token_and_sequence_error_by_hand():
    gold, offsets = _flat(GOLD)
    predicted, _ = _flat(PREDICTED)
    wrong = fields.wrong_tokens(gold, predicted)
    assert wrong.tolist() == [False] * 4 + [False, True] + [True, False] + [False, False]
    token_error, sequence_error, wrong_sequences = fields.field_errors(wrong, offsets)
    assert token_error == pytest.approx(100 * 2 / 10) and sequence_error == pytest.approx(100 * 2 / 4)
    assert wrong_sequences.tolist() == [False, True, True, False]
    assert fields.label_types(np.array(["B-container-title", "I-NP", "O"], dtype=object)).tolist() == [
        "container-title",
        "NP",
        "_",
    ]


def test_per_type_f1_is_chunk_scores_per_type_with_safe_names():
    scores = metrics.chunk_scores(GOLD, PREDICTED)
    found = fields.per_type_metrics("test", scores.per_type)
    assert found == {f"test_f1_{kind}": pytest.approx(row["f1"]) for kind, row in scores.per_type.iterrows()}
    # by hand: gold author chunks 4 (1 + 1 + 2), predicted 2, right 1 (the last sequence's one
    # predicted chunk spans two gold ones): P 50, R 25
    assert found["test_f1_author"] == pytest.approx(2 * 50 * 25 / 75)
    assert fields.metric_name("test_f1_container-title") == "test_f1_container-title"
    assert fields.metric_name("dev_f1_a:b(c)*") == "dev_f1_a_b_c__"
    assert all(re.fullmatch(r"[0-9A-Za-z_\-. /]+", fields.metric_name(n)) for n in ("x\u00e9", "a+b", "[1]"))


def test_confidence_average_precision_against_sklearn_and_by_hand():
    segments = pd.DataFrame(
        {
            "type": ["author", "title", "author", "author", "author", "title"],
            "confidence": [0.9, 0.99, 0.8, 0.7, 0.4, 0.1],
            "correct": [True, False, False, True, True, True],
        }
    )
    ap = fields.confidence_average_precision(segments, "author")
    authors = segments[segments["type"] == "author"]
    assert ap == pytest.approx(average_precision_score(authors["correct"], authors["confidence"]))
    # ranking: right, wrong, right, right -> precisions at the hits 1, 2/3, 3/4 -> AP = mean
    assert ap == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
    assert np.isnan(fields.confidence_average_precision(segments, "journal"))
    assert np.isnan(fields.confidence_average_precision(segments.assign(correct=False), "author"))


def _ambiguous_bundle() -> ModelBundle:
    """A first-order add-k HMM: the word "x" is as likely under every label, and "x x" is far
    more often B-a I-a than B-b I-b; a b-chunk's second token is never I-a (nor an a-chunk's I-b)."""
    words = [["x", "x"]] * 6 + [["x", "x"]] * 2 + [["y"]] * 4
    tags = [["B-a", "I-a"]] * 6 + [["B-b", "I-b"]] * 2 + [["B-a"], ["B-b"], ["B-a"], ["B-b"]]
    hmm = HMM(order=1, transition_smoothing="add-k", emission_smoothing="add-k", k=0.01).fit(words, tags)
    return ModelBundle(BundledHMM(hmm, "w"), scheme="iob2")


def test_correction_propagation_fixes_the_neighbour():
    bundle = _ambiguous_bundle()
    words = np.array(["x", "x", "y", "x", "x"], dtype=object)
    offsets = np.array([0, 2, 3, 5])
    gold = np.array(["B-b", "I-b", "B-a", "B-a", "I-a"], dtype=object)
    tagged = bundle.tag_arrays({"w": words}, np.diff(offsets))
    predicted = np.array(bundle.labels, dtype=object)[tagged.codes]
    assert predicted[:2].tolist() == ["B-a", "I-a"]  # the first sequence is wrong on both tokens
    table = fields.correction_propagation(bundle, {"w": words}, offsets, gold, predicted)
    wrong = fields.wrong_tokens(gold, predicted)
    _, _, wrong_sequences = fields.field_errors(wrong, offsets)
    assert table["sequence"].tolist() == np.flatnonzero(wrong_sequences).tolist()
    first = table.set_index("sequence").loc[0]
    # fixing token 0 to B-b forces I-b on token 1 (B-b -> I-a was never seen): its error goes
    assert (first["fixed_token"], first["gold_label"]) == (0, "B-b")
    assert (first["errors_before"], first["errors_after"], first["removed"], first["introduced"]) == (1, 0, 1, 0)
    # the public constrained decode agrees
    fixed = bundle.tag([["x", "x"]], fixed=[{0: "B-b"}])
    assert fixed[0]["labels"] == ["B-b", "I-b"]
    summary = fields.correction_summary("test", table)
    assert summary["test_correction_errors_removed"] == table["removed"].sum()
    assert summary["test_correction_errors_removed_per_fix"] == pytest.approx(table["removed"].sum() / len(table))
    assert summary["test_correction_fixes"] == len(table)
    # a gold label the model never saw cannot be fixed: the next wrong token is, or the sequence is left out
    unseen_gold = gold.copy()
    unseen_gold[0] = "B-c"
    table = fields.correction_propagation(bundle, {"w": words}, offsets, unseen_gold, predicted)
    assert table.set_index("sequence").loc[0, "fixed_token"] == 1
    unseen_gold[1] = "I-c"
    table = fields.correction_propagation(bundle, {"w": words}, offsets, unseen_gold, predicted)
    assert 0 not in table["sequence"].tolist()
    # no wrong sequence: an empty table
    assert fields.correction_propagation(bundle, {"w": words}, offsets, predicted, predicted).empty


def test_seen_sequences():
    known = [[("a", "B-x"), ("b", "I-x")], [("c", "O")]]
    split = [[("a", "B-x"), ("b", "I-x")], [("a", "B-x"), ("b", "B-x")], [("c", "O")]]
    assert fields.seen_sequences(split, known).tolist() == [True, False, True]


def test_lexicon_paths_resolve_against_the_project_root_and_key_featurize(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the project root
    features = OmegaConf.to_container(OmegaConf.load(FEATURE_FILE))
    build_extractor(features, ["w", "field"])  # the relative conf/lexicons paths are found
    lexicon = tmp_path / "words.txt"
    lexicon.write_text("# test lexicon\nalpha\n", encoding="utf-8")
    own = {"lexicons": {"words": {"path": str(lexicon), "lowercase": True}}, "templates": []}
    before = FEATURIZE.external_inputs(frozen({"features": own}), None)
    lexicon.write_text("# test lexicon\nalpha\nbeta\n", encoding="utf-8")
    after = FEATURIZE.external_inputs(frozen({"features": own}), None)
    assert set(before) == {"lexicon:words"} and before != after
    missing = {"lexicons": {"words": {"path": "no/such/file.txt"}}}
    with pytest.raises(FileNotFoundError, match="lexicon 'words'.*no/such/file.txt"):
        FEATURIZE.external_inputs(frozen({"features": missing}), None)


FEATURE_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "conf", "features", "references.yaml")


@pytest.fixture
def references(tmp_path):
    folder = tmp_path / "data" / "anystyle"
    folder.mkdir(parents=True)
    write_references(folder / "core.xml", 60, seed=3)
    write_references(folder / "gold.xml", 25, seed=4)
    return tmp_path / "data", tmp_path / "out"


def _overrides(data_root, out) -> list[str]:
    return [
        "dataset=anystyle",
        "features=references",
        f"data.root={data_root}",
        f"paths.output_dir={out}",
        "data.download=false",
        "dataset.files.train.sha256=null",
        "dataset.files.test.sha256=null",
        "trainer.max_iterations=40",
        "trainer.threads=1",
        "train.dev_every=0",
    ]


@pytest.mark.parametrize("model", ["crf", "hmm"])
def test_pipeline_logs_field_metrics_on_generated_references(references, model, tmp_path, monkeypatch, mlflow_clean=None):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CRF_SWEEP_PARENT_RUN_ID", raising=False)
    monkeypatch.delenv("CRF_SWEEP_ID", raising=False)
    monkeypatch.chdir(tmp_path)  # lexicons resolve against the project root, not here
    data_root, out = references
    cfg = compose_config(_overrides(data_root, out) + [f"model={model}"])
    results = run_pipeline(cfg)
    for split in ("dev", "test"):
        for name in ("f1_author", "token_error", "sequence_error", "author_confidence_ap", "correction_fixes"):
            assert f"evaluate.{split}_{name}" in results, name
    assert 0.0 <= results["evaluate.test_token_error"] <= results["evaluate.test_sequence_error"] <= 100.0
    if model == "crf":
        assert results["evaluate.test_f1_author"] > 90.0 and results["evaluate.test_author_confidence_ap"] > 0.9
    client = MlflowClient(tracking_uri(cfg))
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'pipeline'")
    logged = parent.data.metrics
    for name in ("test_f1_author", "test_token_error", "test_sequence_error", "test_author_confidence_ap"):
        assert logged[name] == pytest.approx(results[f"evaluate.{name}"], nan_ok=True)
    assert "test_f1_citation-number" in logged  # a type with a dash is a valid MLflow name
    evaluate_folder = next(out.glob("cache/evaluate/*/"))
    assert (evaluate_folder / "calibration_author_test.png").is_file()
    corrections = pd.read_csv(evaluate_folder / "corrections_test.csv")
    assert len(corrections) == results["evaluate.test_correction_fixes"]


def test_correction_propagation_counts_nothing_for_a_fix_of_probability_zero():
    """A second-order TnT HMM gives a known word probability 0 under a label it was never seen
    with: fixing it there leaves no labelling of nonzero probability, and Viterbi's labels are
    then arbitrary (they were counted as introduced errors). Such a fix is marked impossible and
    changes nothing; a possible one in the same call is counted as usual."""
    words = [["a", "b"], ["b", "a"], ["a", "a"], ["b", "b"], ["c", "c"], ["c", "c"]]
    tags = [["B-x", "B-y"], ["B-y", "B-x"], ["B-x", "I-x"], ["B-y", "I-y"], ["B-x", "I-x"], ["B-y", "I-y"]]
    hmm = HMM(order=2).fit(words, tags)  # TnT: "a" only ever B-x/I-x, "b" only B-y/I-y
    bundle = ModelBundle(BundledHMM(hmm, "w"), scheme="iob2")
    flat = np.array(["a", "b", "c", "c"], dtype=object)
    offsets = np.array([0, 2, 4])
    tagged = bundle.tag_arrays({"w": flat}, np.diff(offsets))
    predicted = np.array(bundle.labels, dtype=object)[tagged.codes]
    assert predicted[:2].tolist() == ["B-x", "B-y"]
    gold = np.array(["B-y", "B-y", "B-y", "I-y"], dtype=object)  # "a" as B-y: impossible for the model
    if predicted[2] == "B-y":
        gold[2:] = ["B-x", "I-x"]
    table = fields.correction_propagation(bundle, {"w": flat}, offsets, gold, predicted).set_index("sequence")
    assert table.loc[0, "fixed_token"] == 0 and not table.loc[0, "possible"]
    assert table.loc[0, ["errors_before", "errors_after", "removed", "introduced"]].tolist() == [0, 0, 0, 0]
    # the possible fix: "c c" fixed to its gold first label decodes to the gold chunk
    assert table.loc[1, "possible"] and table.loc[1, "fixed_token"] == 0
    assert table.loc[1, ["errors_before", "errors_after", "removed", "introduced"]].tolist() == [1, 0, 1, 0]
    assert bundle.tag([["a", "b"]], fixed=[{0: "B-y"}])[0]["labels"] == [None, None]
    summary = fields.correction_summary("test", table.reset_index())
    assert summary["test_correction_fixes"] == 2 and summary["test_correction_impossible_fixes"] == 1
    assert summary["test_correction_errors_removed_per_fix"] == 1.0


def test_confidence_ap_refuses_segments_without_a_confidence():
    segments = pd.DataFrame({"type": ["author", "author"], "confidence": [0.9, np.nan], "correct": [True, False]})
    with pytest.raises(ValueError, match="1 predicted 'author' segments have no finite confidence"):
        fields.confidence_average_precision(segments, "author")

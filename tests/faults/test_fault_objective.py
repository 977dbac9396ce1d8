"""A sweep's objective is optimised in the direction in which it gets better: maximising an error
(``evaluate.dev_token_error``) chose the worst job and registered it as the champion (L5)."""

from __future__ import annotations

import pytest

from pipeline.sweeps import search
from pipeline.sweeps.search import SweeperSettingError, check_objective, metric_direction


@pytest.mark.parametrize(
    ("metric", "better"),
    [
        ("evaluate.dev_token_error", "minimize"),
        ("evaluate.dev_sequence_error", "minimize"),
        ("evaluate.dev_calibration_error", "minimize"),
        ("evaluate.dev_NP_calibration_error", "minimize"),
        ("evaluate.dev_unknown_rate", "minimize"),
        ("evaluate.dev_unseen_token_error", "minimize"),
        ("train.train_seconds", "minimize"),
        ("train.model_bytes", "minimize"),
        ("train.final_loss", "minimize"),
        ("evaluate.dev_precision", "maximize"),
        ("evaluate.dev_f1_NP", "maximize"),
        ("evaluate.dev_NP_confidence_ap", "maximize"),
        ("evaluate.dev_known_accuracy", "maximize"),
        ("evaluate.dev_tag_tokens_per_second", "maximize"),
        ("semi_supervised.dev_f1_hmm_em", "maximize"),
    ],
)
def test_an_objective_against_its_metrics_direction_is_refused(metric, better):
    worse = "maximize" if better == "minimize" else "minimize"
    with pytest.raises(SweeperSettingError, match=rf"^hydra.sweeper.direction={worse}: .*set hydra.sweeper.direction={better}$"):
        check_objective(metric, worse, {"kind": "none"}, 10)
    check_objective(metric, better, {"kind": "none"}, 10)


@pytest.mark.parametrize("metric", ["train.nonzero_weights", "train.iterations", "evaluate.dev_correction_fixes"])
def test_a_count_may_be_optimised_either_way(metric):
    assert metric_direction(metric.split(".")[1]) is None
    for direction in ("maximize", "minimize"):
        check_objective(metric, direction, {"kind": "none"}, 10)


def test_the_dev_score_is_still_maximised():
    with pytest.raises(SweeperSettingError, match=r"the dev score \(default\) is maximised"):
        check_objective(None, "minimize", {"kind": "none"}, 10)
    assert search.metric_direction("dev_accuracy") == "maximize"


@pytest.mark.parametrize("metric", ["evaluate.test_f1", "active_learning.aulc_test", "semi_supervised.test_f1_crf"])
def test_a_test_set_score_is_no_objective_wherever_its_name_says_test(metric):
    with pytest.raises(SweeperSettingError, match="a score on the test set, which a search must not see"):
        check_objective(metric, "maximize", {"kind": "none"}, 10)

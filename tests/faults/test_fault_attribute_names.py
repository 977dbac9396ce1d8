"""``CRF.fit``'s ``attribute_names`` given as a set named the columns in hash order, so a CRFsuite
model file mapped the weights to other attributes from one process to the next; numbers and None
as names trained, and a lone surrogate ended in a bare codec error (M5). Refused before training,
naming the argument and the position."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from crf import CRF
from crf.batch import SequenceBatch

Y = [["A", "B"], ["C", "D"]]


def _batch() -> SequenceBatch:
    """Four one-hot attribute columns over two sequences of two tokens: column j marks label j."""
    return SequenceBatch(sp.identity(4, format="csr"), np.array([0, 2, 4]))


@pytest.mark.parametrize(
    "names, error, message",
    [
        ({"a", "b", "c", "d"}, TypeError, r"^attribute_names is a set, whose order is arbitrary: pass a list"),
        (frozenset("abcd"), TypeError, r"^attribute_names is a frozenset, whose order is arbitrary"),
        (dict.fromkeys("abcd"), TypeError, r"^attribute_names is a dict, whose order is arbitrary"),
        ([1, 2, 3, 4], TypeError, r"^attribute_names 0: 1 is not a non-empty string$"),
        (["a", None, "c", "d"], TypeError, r"^attribute_names 1: None is not a non-empty string$"),
        (["a", "", "c", "d"], TypeError, r"^attribute_names 1: '' is not a non-empty string$"),
        (["a", "b\ud800", "c", "d"], ValueError, r"^attribute_names 1 \('b\\ud800'\) holds '\\ud800', which UTF-8 cannot write"),
        ("abcd", TypeError, r"^attribute_names must be a list of names, one per column of X, not a string$"),
    ],
)
def test_attribute_names_must_be_an_ordered_list_of_strings(names, error, message, tmp_path):
    model = CRF(max_iterations=50, model_filename=str(tmp_path / "m.crfsuite"))
    with pytest.raises(error, match=message):
        model.fit(_batch(), Y, attribute_names=names)
    assert not (tmp_path / "m.crfsuite").exists()


def test_a_list_or_array_of_names_names_the_columns_in_order(tmp_path):
    from crf.pycrfsuite import Tagger

    for names in (["a", "b", "c", "d"], np.array(["a", "b", "c", "d"]), (n for n in "abcd")):
        model = CRF(max_iterations=50, model_filename=str(tmp_path / "m.crfsuite")).fit(_batch(), Y, attribute_names=names)
        assert list(model.attributes_) == ["a", "b", "c", "d"]
        tagger = Tagger()
        tagger.open(str(tmp_path / "m.crfsuite"))
        assert tagger.tag([{"c": 1.0}, {"d": 1.0}]) == ["C", "D"] and tagger.tag([{"a": 1.0}, {"b": 1.0}]) == ["A", "B"]


def test_a_dev_batch_beside_token_features_is_refused():
    """Dict training data with X_dev as a SequenceBatch: the batch's columns were read by position as
    the attributes in order of first appearance, so the dev score was of other features (M7)."""
    X = [[{"c": 1.0}, {"b": 1.0}], [{"a": 1.0}, {"c": 1.0}]]
    y = [["C", "B"], ["A", "C"]]
    dev = SequenceBatch(sp.identity(4, format="csr")[:, :3], np.array([0, 2, 4]))
    with pytest.raises(ValueError, match=r"^the training data are token features .*: pass X_dev the same way, not as a Sequence"):
        CRF(max_iterations=5).fit(X, y, X_dev=dev, y_dev=[["A", "B"], ["C", "A"]])
    CRF(max_iterations=5).fit(X, y, X_dev=X, y_dev=y)

"""A bad cell of a numeric feature column (``features.numeric``) is refused where its file is read,
naming the file and line, whichever sentences a run samples: it ended in a traceback from the
featurize stage naming "sentence 7, token 0" of the split, and a training subset that left its
sentence out trained without a word (L13)."""

from __future__ import annotations

import pytest
from pipeline_helpers import compose_config, tiny_overrides, write_corpus

from crf.features import numeric_cells
from crf.io import DataFormatError
from pipeline.stages.data import load_dataset
from pipeline.stages.prepare import STAGE as PREPARE

CONLL = {
    "name": "scored",
    "format": "conll",
    "columns": ["w", "score", "chunk"],
    "label": "chunk",
    "scheme": "iob2",
    "separator": None,
    "comment_prefix": "#",
}


def _write(path, sentences, header=""):
    path.write_text(header + "\n\n".join("\n".join(" ".join(row) for row in s) for s in sentences) + "\n")
    return path


def _files(tmp_path, bad: str, *, header: str = "") -> dict:
    good = [[("a", "1", "B-NP"), ("b", "-2.5", "I-NP")], [("c", "0", "O"), ("d", "3e2", "B-VP"), ("e", "7", "O")]]
    train = good * 5 + [[("x", "1", "B-NP"), ("y", bad, "O")]]  # the bad cell is the last file's last token
    _write(tmp_path / "train.txt", train, header)
    _write(tmp_path / "test.txt", [[("f", "2", "B-NP"), ("g", "1", "I-NP"), ("h", "0", "O")]])
    files = {"train": {"path": "train.txt"}, "test": {"path": "test.txt"}}
    return {**CONLL, "files": files, "dev_split": {"fraction": 0.2, "seed": 0}}


@pytest.mark.parametrize(
    "cell, problem",
    [
        ("nan", "has the non-numeric value 'nan'"),
        ("inf", "has the non-numeric value 'inf'"),
        ("1_0", "has the non-numeric value '1_0'"),
        ("0x1F", "has the non-numeric value '0x1F'"),
        ("\u22125", "has the non-numeric value '\u22125'"),
        ("1e400", "has the non-numeric value '1e400'"),
        ("123456789012", "has the value 1.23457e+11, too large (the limit is 1e+10): scale it"),
    ],
)
def test_a_bad_numeric_cell_names_its_file_and_line(tmp_path, cell, problem):
    dataset = _files(tmp_path, cell, header="# a comment line before the first sentence\n")
    with pytest.raises(DataFormatError) as raised:
        load_dataset(dataset, tmp_path, download=False, numeric=["score"])
    # 1 comment line, 10 sentences of 2 or 3 tokens (25 lines) with a blank line after each, then x and y
    assert (raised.value.path, raised.value.line) == (str(tmp_path / "train.txt"), 38)
    assert raised.value.problem == f"numeric column 'score' (features.numeric) {problem}"
    assert (tmp_path / "train.txt").read_text().splitlines()[37].split()[1] == cell
    load_dataset(dataset, tmp_path, download=False)  # not a numeric feature: a column like any other


def test_a_conllu_cell_is_located_past_skipped_lines(tmp_path):
    """Comment, multiword-token and empty-node lines are not tokens; the line is still the file's."""
    rows = [
        "# sent_id = 1",
        "1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        "1\tdo\tdo\tAUX\tVBP\t_\t0\troot\t_\t_",
        "2\tn't\tnot\tPART\tRB\t_\t1\tadvmod\t_\t_",
        "2.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t1:conj\t_",
        "3\tgo\tgo\tVERB\tVB\t_\tseven\tconj\t_\t_",
    ]
    (tmp_path / "train.conllu").write_text("\n".join(rows) + "\n\n")
    (tmp_path / "test.conllu").write_text("\n".join(rows[:3]) + "\n\n")
    dataset = {
        "name": "ud",
        "format": "conllu",
        "columns": ["id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc"],
        "label": "upos",
        "files": {"train": {"path": "train.conllu"}, "test": {"path": "test.conllu"}},
    }
    message = r"train\.conllu:6: numeric column 'head' \(features\.numeric\) has the non-numeric value 'seven'$"
    with pytest.raises(DataFormatError, match=message):
        load_dataset(dataset, tmp_path, download=False, numeric=["head"])


def test_numeric_cells_reads_numbers_as_pandas_does_and_names_the_first_bad_one():
    values, bad = numeric_cells(["1", "-2.5", "3e2", " 4", "0"])
    assert values.tolist() == [1.0, -2.5, 300.0, 4.0, 0.0] and bad is None
    _, bad = numeric_cells(["1", "x", "nan"])
    assert bad == (1, "has the non-numeric value 'x'")


def test_the_prepare_stage_checks_the_numeric_columns_and_keeps_the_old_keys_without_them(tmp_path):
    """With ``features.numeric`` set, the prepare stage's key names the columns it checked; without,
    the key is the one earlier runs computed (no ``numeric`` entry)."""
    root = write_corpus(tmp_path / "data", n_train=12, n_test=4)
    plain = compose_config(tiny_overrides(root, tmp_path / "out"))
    assert "numeric" not in PREPARE.config_slice(plain, None)
    cfg = compose_config([*tiny_overrides(root, tmp_path / "out"), "features.numeric=[pos]"])
    assert PREPARE.config_slice(cfg, None)["numeric"] == ["pos"]

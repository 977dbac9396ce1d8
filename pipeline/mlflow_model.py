"""A trained tagger as an MLflow Model: the models-from-code file of the pipeline's pyfunc model.

``pipeline.tracking.log_tagger_model`` logs this file as ``python_model`` (MLflow runs it on load;
nothing of ours is pickled) with the tagger bundle (``crf.bundle``, one checksummed ``.npz``) as
the artifact ``bundle`` and the ``crf`` package as code. ``mlflow.pyfunc.load_model(uri)`` and
``mlflow models serve`` then tag:

- a long DataFrame: one row per token, a ``sentence`` id column (rows of a sentence contiguous and
  in order) and the model's input columns (e.g. ``w``, ``pos``); the answer is the same rows with
  ``label`` (str), ``marginal`` (probability of that label) and, for chunk/entity schemes,
  ``segment_confidence`` (probability of the whole predicted chunk the token is in, NaN outside);
- a list of sentences, each a list of token dicts ``{column: value}``: the same long answer, with
  ``sentence`` the position of the sentence in the list.

This file imports only MLflow, pandas and ``crf`` (a library without Hydra or MLflow), so the
served model needs nothing of the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlflow
import pandas as pd

from crf.bundle import TaggerBundle, load_tagger

SENTENCE = "sentence"  # the column that says which sentence a token row belongs to


def sentences_frame(sentences: Sequence[Sequence[dict]], columns: Sequence[str]) -> pd.DataFrame:
    """Sentences of token dicts -> the long frame (``sentence`` = position in the list, then ``columns``)."""
    lengths = [len(sentence) for sentence in sentences]
    tokens = [token for sentence in sentences for token in sentence]
    frame = pd.DataFrame.from_records(tokens) if tokens else pd.DataFrame(columns=list(columns))
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"the tokens lack the column(s) {missing}: this model reads {list(columns)}, got {list(frame.columns)}")
    frame = frame[list(columns)]
    frame.insert(0, SENTENCE, pd.RangeIndex(len(lengths)).repeat(lengths))
    return frame


def is_sentence_list(model_input: Any) -> bool:
    """True for a list of sentences that are lists of token dicts."""
    return isinstance(model_input, list) and all(
        isinstance(s, (list, tuple)) and all(isinstance(t, dict) for t in s) for s in model_input
    )


def tag(bundle: TaggerBundle, model_input: pd.DataFrame | Sequence[Sequence[dict]]) -> pd.DataFrame:
    """The tagged long frame of ``model_input`` (see the module docstring)."""
    if is_sentence_list(model_input):
        model_input = sentences_frame(model_input, bundle.input_columns)
    if not isinstance(model_input, pd.DataFrame):
        raise TypeError(
            f"expected a DataFrame (columns {SENTENCE!r}, {', '.join(map(repr, bundle.input_columns))}) or a list of "
            f"sentences of token dicts, got {type(model_input).__name__}"
        )
    if SENTENCE not in model_input.columns:
        raise ValueError(
            f"the input has no {SENTENCE!r} column (the sentence id of each token row); columns: {list(model_input.columns)}"
        )
    return bundle.tag_frame(model_input, sentence=SENTENCE)


class TaggerModel(mlflow.pyfunc.PythonModel):
    """The pyfunc model: loads the bundle artifact once, tags long frames or lists of sentences."""

    def load_context(self, context) -> None:
        self.bundle = load_tagger(context.artifacts["bundle"])

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        return tag(self.bundle, model_input)


mlflow.models.set_model(TaggerModel())

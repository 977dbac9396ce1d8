"""A trained tagger as an MLflow Model: the models-from-code file of the pipeline's pyfunc model.

``pipeline.tracking.log_bundle_model`` logs this file as ``python_model`` (MLflow runs it on load;
nothing of ours is pickled) with the tagger bundle (``crf.bundle``, one checksummed ``.npz``) as
the artifact ``bundle`` and the ``crf`` package as code. ``mlflow.pyfunc.load_model(uri)`` and
``mlflow models serve`` then tag:

- a long DataFrame: one row per token, a ``sentence`` id column (all integers or all strings; the
  rows of each sentence together) and the model's input columns (e.g. ``w``,
  ``pos``); the answer is the same rows with ``label`` (str; null, with a warning, in a sentence
  the model gives probability 0), ``marginal`` (probability of that label) and, for chunk/entity
  schemes, ``segment_confidence`` (probability of the whole predicted chunk the token is in, None
  outside);
- a list of sentences, each a list of token dicts ``{column: value}``: the same long answer, with
  ``sentence`` the position of the sentence in the list.

A request the model cannot use (no rows, a missing column, a sentence id that is missing or of
another kind than the first, a sentence whose rows are apart, a token that is not a non-empty
string without whitespace: null, NaN, a number, a list, ``"a b"``; the check
:func:`crf.bundle.check_tokens` of the bundle and the tag command) raises
:class:`ModelInputError`: ``mlflow models serve`` answers HTTP 400 with a one-line ``message``
naming the row, column and problem, and no stack trace. The answer is strict JSON: a marginal or
confidence that is not a number (outside any chunk, or a sentence the model gives probability 0)
is None (``null``), never NaN.

Of MLflow's request formats, ``dataframe_split`` and ``dataframe_records`` hand the values over as
sent. ``instances`` and ``inputs`` go through NumPy first, which writes a number or ``true`` in a
column of text as text (``7`` becomes the token ``"7"``): those cannot be told from text here.

The model has no MLflow input schema (its columns are in the MLmodel ``metadata``:
``sentence_column``, ``input_columns``): MLflow's schema check would refuse bad requests before
this code sees them, with a message that echoes the whole request over several lines, and would
turn a list of sentences into an empty frame.

This file imports only MLflow, numpy, pandas and ``crf`` (a library without Hydra or MLflow), so the
served model needs nothing of the pipeline.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from crf.bundle import (
    ModelBundle,
    TokenError,
    check_sentences,
    check_tokens,
    check_unique_columns,
    load_bundle,
    sentence_offsets,
    shown_value,
)

log = logging.getLogger(__name__)

SENTENCE = "sentence"  # the column that says which sentence a token row belongs to


class OneLineError(MlflowException):
    """An MlflowException whose message stays one line: the reason given at construction.

    MLflow's scoring server rewrites the message of an MlflowException raised by ``predict`` to
    ``Failed to predict data '<the whole request>'. Error: ...``: several lines echoing the input.
    Here the message is set once and later assignments are ignored; the answer's body is then
    ``{"error_code": ..., "message": <reason>}`` with no stack trace."""

    def __init__(self, reason: str, error_code: int) -> None:
        super().__init__(" ".join(reason.split()), error_code=error_code)

    @property
    def message(self) -> str:
        return self._reason

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_reason"):  # MlflowException.__init__ sets it; later rewrites are ignored
            self._reason = value


class ModelInputError(OneLineError, ValueError):
    """A request the tagger cannot use: HTTP 400 (``INVALID_PARAMETER_VALUE``) from the scoring
    server, the reason (row, column, problem) as its one-line message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, INVALID_PARAMETER_VALUE)


class TaggingFailed(OneLineError):
    """An unexpected failure inside the tagger: HTTP 500 with a one-line message (the traceback goes
    to the server's log, not into the answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, INTERNAL_ERROR)


def sentences_frame(sentences: Sequence[Sequence[dict]], columns: Sequence[str]) -> pd.DataFrame:
    """Sentences of token dicts -> the long frame (``sentence`` = position in the list, then ``columns``)."""
    if not sentences:
        raise ModelInputError("no sentences to tag (the list is empty)")
    for number, sentence in enumerate(sentences):
        if not sentence:
            raise ModelInputError(f"sentence {number} has no tokens")
        for position, token in enumerate(sentence):
            missing = [c for c in columns if c not in token]
            if missing:
                raise ModelInputError(
                    f"sentence {number}, token {position}: lacks the column(s) {missing}; this model reads {list(columns)}"
                )
    lengths = [len(sentence) for sentence in sentences]
    tokens = [token for sentence in sentences for token in sentence]
    frame = pd.DataFrame(tokens, dtype=object)[list(columns)]  # (see as_frame on dtype=object)
    frame.insert(0, SENTENCE, pd.RangeIndex(len(lengths)).repeat(lengths))
    return frame


def is_sentence_list(model_input: Any) -> bool:
    """True for a list of sentences that are lists of token dicts."""
    return isinstance(model_input, list) and all(
        isinstance(s, (list, tuple)) and all(isinstance(t, dict) for t in s) for s in model_input
    )


def _scalar(value: Any) -> Any:
    """A value that MLflow's reading of an ``inputs`` or ``instances`` request wrapped as a 0-d
    NumPy array, unwrapped (so that the checks name the value sent); any other value as it is."""
    return value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value


def _cells(column: Any) -> Any:
    """A column of a mapping of columns with its 0-d array cells unwrapped (:func:`_scalar`):
    MLflow reads an ``instances`` request with a null among text values as such a column."""
    if not (isinstance(column, np.ndarray) and column.dtype == object and column.ndim == 1):
        return column
    cells = np.empty(column.size, dtype=object)
    cells[:] = [_scalar(value) for value in column]
    return cells


def as_frame(model_input: Any, columns: Sequence[str]) -> pd.DataFrame:
    """The long frame of any accepted input: a DataFrame, a list of sentences of token dicts, a
    list of token records (with ``sentence``) or a mapping of columns; else ModelInputError.
    Built as columns of Python objects: pandas' default text columns (pyarrow) cannot hold every
    string (a lone surrogate), and the token check, not the table's constructor, names a bad one."""
    if isinstance(model_input, np.ndarray):
        model_input = model_input.tolist()
    if isinstance(model_input, pd.DataFrame):
        return model_input
    if isinstance(model_input, list) and model_input and all(isinstance(t, dict) for t in model_input):
        return pd.DataFrame([{k: _scalar(v) for k, v in t.items()} for t in model_input], dtype=object)
    if is_sentence_list(model_input):
        return sentences_frame(model_input, columns)
    if isinstance(model_input, dict):
        try:
            return pd.DataFrame({k: _cells(v) for k, v in model_input.items()}, dtype=object)
        except (ValueError, TypeError) as err:
            raise ModelInputError(f"cannot read the columns as a table: {str(err).splitlines()[0]}") from None
    if isinstance(model_input, list) and model_input and any(isinstance(s, (list, tuple)) for s in model_input):
        try:  # a list of sentences with a sentence given as a string or one token dict: the bundle's shape check
            check_sentences(model_input)
        except ValueError as err:
            raise ModelInputError(str(err)) from None
    raise ModelInputError(
        f"expected a table (columns {SENTENCE!r}, {', '.join(map(repr, columns))}) or a list of sentences of token "
        f"objects, got {shown_value(model_input)}"
    )


def check_frame(frame: pd.DataFrame, columns: Sequence[str]) -> None:
    """Refuse (ModelInputError, rows counted from 0) a frame the model cannot tag: no rows, a
    missing column, a sentence id that is missing or of another kind than the first, or whose sentence's rows
    are not contiguous (:func:`crf.bundle.sentence_offsets`, the rule of ``tag_frame``), a token
    that is not a non-empty string without whitespace (:func:`crf.bundle.check_tokens`)."""
    try:  # the bundle's own check (ModelBundle.tag_frame makes it too)
        check_unique_columns(frame.columns)
    except ValueError as err:
        raise ModelInputError(str(err)) from None
    missing = [c for c in [SENTENCE, *columns] if c not in frame.columns]
    if missing:
        raise ModelInputError(
            f"missing column(s) {missing}: this model reads {SENTENCE!r} (the sentence id of each token row) and "
            f"{list(columns)}; got {[str(c) for c in frame.columns]}"
        )
    if len(frame) == 0:
        raise ModelInputError("the input has no rows (no tokens to tag)")
    try:  # the rule of ModelBundle.tag_frame: integer or string ids, each sentence's rows together
        offsets = sentence_offsets(frame[SENTENCE].to_numpy(), SENTENCE)
    except ValueError as err:
        raise ModelInputError(str(err)) from None
    try:  # the one token check of the bundle and the tag command
        check_tokens({c: frame[c].to_numpy(dtype=object) for c in columns}, offsets)
    except TokenError as err:
        raise ModelInputError(
            f"row {err.index} (sentence {frame[SENTENCE].iloc[err.index]!s}), column {err.column!r}: {err.problem} "
            f"(token {err.token} of the sentence, counted from 0)"
        ) from None


def _finite_or_none(values: pd.Series) -> pd.Series:
    """``values`` with None where a value is missing (None, NaN, ``pd.NA``: pandas 3 reads a text
    column with a gap as its ``str`` dtype, whose gaps are NaN) or a non-finite number: a float
    column becomes objects; other columns keep their values and, when nothing changes, their dtype."""
    if values.dtype.kind == "f":
        numbers = values.to_numpy(dtype=np.float64)
        return pd.Series(np.where(np.isfinite(numbers), numbers.astype(object), None), index=values.index, dtype=object)
    cells = values.to_numpy(dtype=object)
    bad = pd.isna(cells) | np.fromiter(
        (isinstance(v, (float, np.floating)) and not np.isfinite(v) for v in cells), dtype=bool, count=cells.size
    )
    if not bad.any():
        return values
    cells = cells.copy()
    cells[bad] = None
    return pd.Series(cells, index=values.index, dtype=object)


def tag(bundle: ModelBundle, model_input: pd.DataFrame | Sequence[Sequence[dict]]) -> pd.DataFrame:
    """The tagged long frame of ``model_input`` (see the module docstring)."""
    frame = as_frame(model_input, bundle.input_columns)
    check_frame(frame, bundle.input_columns)
    try:
        out = bundle.tag_frame(frame, sentence=SENTENCE)
    except ValueError as err:  # anything the checks above did not foresee: still a one-line 400
        raise ModelInputError(str(err).splitlines()[0] if str(err) else type(err).__name__) from None
    for column in out.columns:  # the answer and any extra columns the request carried: strict JSON
        out[column] = _finite_or_none(out[column])
    return out


class BundleModel(mlflow.pyfunc.PythonModel):
    """The pyfunc model: loads the bundle artifact once, tags long frames or lists of sentences."""

    def load_context(self, context) -> None:
        for module in (context.model_config or {}).get("kind_modules", []):  # kinds defined outside crf register here
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise MlflowException(f"the model's kind module {module!r} cannot be imported ({error})") from None
        self.bundle = load_bundle(context.artifacts["bundle"])

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Tag ``model_input`` (see the module docstring; a list of sentences is accepted too).

        The ``pd.DataFrame`` hint is what ``mlflow models serve`` hands over for a ``dataframe_split``
        or ``dataframe_records`` request; MLflow infers no schema from it and validates nothing
        itself, so bad requests still get this module's one-line reasons."""
        try:
            return tag(self.bundle, model_input)
        except OneLineError:
            raise
        except Exception as err:  # MLflow's server would put the stack trace into the answer
            log.exception("tagging failed")
            raise TaggingFailed(f"tagging failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None


mlflow.models.set_model(BundleModel())

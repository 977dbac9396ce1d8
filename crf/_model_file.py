"""Model files of :class:`crf.CRF`: the project's own ``.npz`` format (no pickle, checksummed,
atomic; :mod:`crf._persist`) and, for ``model_filename``, CRFsuite's format
(:mod:`crf.crfsuite`).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ._persist import (
    MAX_ABS_WEIGHT,
    ModelFileError,
    arrays_to_strings,
    check_classes,
    check_table_size,
    check_thread_count,
    check_unique,
    checked_array,
    load_arrays,
    save_arrays,
    strings_to_arrays,
    weight_beyond_bound,
)
from .features import AttributeIndex

KIND = "crf.CRF"
WEIGHT_ARRAYS = ("transitions", "start", "end", "state_values", "trigrams", "pair_end")


# the tail blocks (see crf._order) beyond the first-order ones, by array name: (attribute, shape)
def _second_order_blocks(L: int) -> dict[str, tuple[str, tuple]]:
    return {"trigrams": ("trigram_weights_", (L + 1, L, L)), "pair_end": ("pair_end_weights_", (L + 1, L))}


def _arrays(model) -> dict[str, np.ndarray]:
    arrays = {"transitions": model.transitions_, "start": model.start_weights_, "end": model.end_weights_}
    if model.fitted_order == 2:
        for name, (attribute, _) in _second_order_blocks(len(model.classes_)).items():
            arrays[name] = getattr(model, attribute)
    if model.feature_index_ is not None:
        arrays["feature_index"] = model.feature_index_
        arrays["state_values"] = model.state_weights_.ravel()[model.feature_index_]
    else:
        arrays["state_values"] = model.state_weights_
    if model.attributes_ is not None:
        arrays["attribute_blob"], arrays["attribute_offsets"] = strings_to_arrays(model.attributes_)
    return arrays


def to_arrays(model) -> tuple[dict, dict[str, np.ndarray]]:
    """The fitted ``model`` as (JSON-ready metadata, named arrays): what :func:`save` writes,
    for containers that hold a CRF among other things (:class:`crf.bundle.ModelBundle`)."""
    for name, weights in _arrays(model).items():
        if name in WEIGHT_ARRAYS and weights.size and float(np.max(np.abs(weights))) > MAX_ABS_WEIGHT:
            raise ValueError(f"cannot save this model: {name} holds {weight_beyond_bound(weights)}")
    params = {k: v for k, v in model.get_params().items() if isinstance(v, (str, int, float, bool, type(None)))}
    if params.get("boundary_transitions") is None and model.model_filename is not None:
        # the file does not keep model_filename, which made "unset" mean "no start/end weights"
        params["boundary_transitions"] = False
    params["order"] = model.fitted_order  # the weights' order, whatever ``order`` was set to since
    # the fitted candidate choice, likewise
    restricted = model.__dict__.get("candidate_model_") is not None
    params["candidate_threshold"] = model.candidate_threshold_ if restricted else None
    meta = {
        "params": params,
        "classes": list(model.classes_),
        "n_attributes": int(model.n_attributes_),
        "sparse": model.feature_index_ is not None,
        "dict_input": getattr(model, "attribute_index_", None) is not None,
    }
    arrays = _arrays(model)
    candidate_model = model.__dict__.get("candidate_model_")
    if candidate_model is not None:  # the first-order model that chooses a second-order one's candidates
        meta["candidate_model"], candidate_model_arrays = to_arrays(candidate_model)
        arrays.update({f"candidate_model/{k}": v for k, v in candidate_model_arrays.items()})
    return meta, arrays


def save(model, path) -> None:
    """Write the fitted ``model`` to one ``.npz`` file; a model no loader would accept (a weight
    beyond :data:`crf._persist.MAX_ABS_WEIGHT`) is refused with a ValueError before writing."""
    meta, arrays = to_arrays(model)
    save_arrays(path, KIND, meta, arrays)


def size_in_bytes(model) -> int:
    """Size of the file :func:`save` writes for ``model`` (written to a temporary folder)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.npz")
        save(model, path)
        return os.path.getsize(path)


def load(cls: type, path):
    """Read a model written by :func:`save`; raises ModelFileError on a bad file."""
    meta, arrays = load_arrays(path, KIND)
    return from_arrays(cls, meta, arrays, path)


# parameters a model file may not set: a path a later fit would write to, callables, classes
NOT_FROM_FILES = ("model_filename", "callback", "trainer_cls", "keep_tempfiles")


def from_arrays(cls: type, meta: dict, arrays: dict[str, np.ndarray], path="model"):
    """The CRF of :func:`to_arrays`' output; ``path`` names the source in ModelFileError messages.

    Every size is checked against the others and against what the file holds (the dense (A, L)
    state table is built only when :func:`crf._persist.check_table_size` allows it), weights must
    be finite, class labels distinct and the sparse feature index strictly increasing."""
    try:
        return _from_arrays(cls, meta, arrays, path)
    except ModelFileError:
        raise
    except KeyError as err:
        raise ModelFileError(f"{path}: missing field {err}") from None
    except (IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{path}: malformed CRF model ({type(err).__name__}: {err})") from None


# names that files written by earlier versions use for a second-order model's candidate labels
_EARLIER_NAMES = {"pruning_threshold": "candidate_threshold", "pruner": "candidate_model"}


def _current_names(fields: dict, path) -> dict:
    """``fields`` with the names of :data:`_EARLIER_NAMES` replaced; ModelFileError for a file that
    holds both the earlier and the current name of one field (the two could disagree)."""
    both = [k for k in fields if k in _EARLIER_NAMES and _EARLIER_NAMES[k] in fields]
    if both:
        raise ModelFileError(f"{path}: holds both {both[0]!r} and {_EARLIER_NAMES[both[0]]!r} (one field, two names)")
    return {_EARLIER_NAMES.get(k, k): v for k, v in fields.items()}


def _with_current_names(meta: dict, arrays: dict[str, np.ndarray], path) -> tuple[dict, dict[str, np.ndarray]]:
    """``meta`` (its parameters too) and ``arrays`` (``pruner/...``) under the current names."""
    if not isinstance(meta, dict):
        return meta, arrays
    meta = _current_names(meta, path)
    if isinstance(meta.get("params"), dict):
        meta["params"] = _current_names(meta["params"], path)
    earlier = [k for k in arrays if k.startswith("pruner/")]
    if earlier and any(k.startswith("candidate_model/") for k in arrays):
        raise ModelFileError(f"{path}: holds both 'pruner/' and 'candidate_model/' arrays (one model, two names)")
    return meta, {("candidate_model/" + k[len("pruner/") :] if k in earlier else k): v for k, v in arrays.items()}


def _check_candidate_settings(path, model, meta: dict) -> None:
    """A candidate threshold, as :class:`crf.CRF` takes one (a number in (0, 1), order 2), with its
    candidate model in the file, and a candidate model only with a threshold."""
    threshold = model.candidate_threshold
    if threshold is None:
        if meta.get("candidate_model") is not None:
            raise ModelFileError(f"{path}: a candidate model without a candidate_threshold")
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ModelFileError(f"{path}: candidate_threshold {threshold!r} is not a number in (0, 1)")
    if model.order != 2:
        raise ModelFileError(f"{path}: candidate_threshold in a model of order {model.order} (candidate labels need order 2)")
    if not isinstance(meta.get("candidate_model"), dict):
        raise ModelFileError(f"{path}: a second-order model over candidate labels without its candidate model")


def _check_no_other_arrays(path, model, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Every array of the file is one this model reads (its metadata says which): weights of
    another order, a sparse table's index in a dense model or a candidate model's arrays beside a
    model without one would be ignored, and the file loaded as another model than it holds."""
    used = {"transitions", "start", "end", "state_values", "attribute_blob", "attribute_offsets"}
    used |= {"feature_index"} if meta["sparse"] else set()
    used |= set(_second_order_blocks(0)) if model.order == 2 else set()
    inner = model.candidate_threshold is not None
    other = sorted(k for k in arrays if k not in used and not (inner and k.startswith("candidate_model/")))
    if other:
        raise ModelFileError(f"{path}: arrays this model does not use ({', '.join(other[:5])}): not the file it claims to be")


def _from_arrays(cls: type, meta: dict, arrays: dict[str, np.ndarray], path):
    known = cls().get_params()
    meta, arrays = _with_current_names(meta, arrays, path)
    if not isinstance(meta["params"], dict):
        raise ModelFileError(f"{path}: the parameters are not a JSON object")
    # a file sets hyperparameters only: never where a later fit writes, nor code to call
    model = cls(**{k: v for k, v in meta["params"].items() if k in known and k not in NOT_FROM_FILES})
    check_thread_count(path, model.n_threads)
    if isinstance(model.order, bool) or model.order not in (1, 2):
        raise ModelFileError(f"{path}: order {model.order!r} is not 1 or 2")
    classes = check_classes(path, meta["classes"])  # strings or integers, as trained (the header is checksummed)
    A, L = meta["n_attributes"], len(classes)
    if not isinstance(A, int) or isinstance(A, bool) or A < 0:
        raise ModelFileError(f"{path}: n_attributes {A!r} is not a count")
    model.classes_ = classes
    model.n_attributes_ = A
    stored = sum(a.nbytes for a in arrays.values())
    check_table_size(path, f"the state weights of {A:,} attributes x {L:,} labels", A * L + L * L, stored)
    transitions = checked_array(path, arrays, "transitions", "f", (L, L), finite=True, bounded=True).astype(np.float64)
    start = checked_array(path, arrays, "start", "f", (L,), finite=True, bounded=True).astype(np.float64)
    end = checked_array(path, arrays, "end", "f", (L,), finite=True, bounded=True).astype(np.float64)
    if model.order == 2:
        check_table_size(path, f"the trigram weights of {L:,} labels", (L + 1) * L * L, stored)
        for name, (attribute, shape) in _second_order_blocks(L).items():
            setattr(model, attribute, checked_array(path, arrays, name, "f", shape, finite=True, bounded=True).astype(np.float64))
    model.candidate_model_, model.excluded_mass_, model.candidate_threshold_ = None, None, None
    _check_candidate_settings(path, model, meta)
    _check_no_other_arrays(path, model, meta, arrays)
    if model.candidate_threshold is not None:
        inner = {k[len("candidate_model/") :]: v for k, v in arrays.items() if k.startswith("candidate_model/")}
        model.candidate_model_ = _from_arrays(cls, meta["candidate_model"], inner, f"{path} (candidate model)")
        if (
            model.candidate_model_.order != 1
            or model.candidate_model_.candidate_model_ is not None
            or list(model.candidate_model_.classes_) != list(classes)
            or model.candidate_model_.n_attributes_ != A
        ):
            raise ModelFileError(f"{path}: the candidate model is not a first-order model of the same labels and attributes")
        model.candidate_threshold_ = float(model.candidate_threshold)
    state = np.zeros((A, L))
    if meta["sparse"]:
        index = checked_array(path, arrays, "feature_index", "iu", (None,)).astype(np.int64)
        values = checked_array(path, arrays, "state_values", "f", index.shape, finite=True, bounded=True)
        if index.size and (index[0] < 0 or index[-1] >= A * L or np.any(np.diff(index) <= 0)):
            raise ModelFileError(f"{path}: feature index out of range or not strictly increasing (0 .. {A * L - 1})")
        state.ravel()[index] = values
        model.feature_index_ = index
    else:
        state[:] = checked_array(path, arrays, "state_values", "f", (A, L), finite=True, bounded=True)
        model.feature_index_ = None
    model.state_weights_ = state
    model.transitions_ = transitions
    model.start_weights_ = start
    model.end_weights_ = end
    model.attributes_ = (
        arrays_to_strings(arrays["attribute_blob"], arrays["attribute_offsets"]) if "attribute_blob" in arrays else None
    )
    if model.attributes_ is not None and len(model.attributes_) != A:
        raise ModelFileError(f"{path}: {len(model.attributes_)} attribute names for {A} attributes")
    if meta.get("dict_input"):
        if model.attributes_ is None:
            raise ModelFileError(f"{path}: a dict-input model without attribute names")
        check_unique(path, "attribute name", model.attributes_)  # each name must map to one column
        model.attribute_index_ = AttributeIndex()
        model.attribute_index_.index_ = {name: i for i, name in enumerate(model.attributes_)}
    else:
        model.attribute_index_ = None
    return model

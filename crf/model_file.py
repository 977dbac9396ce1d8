"""Model files of :class:`crf.CRF`: the project's own ``.npz`` format (no pickle, checksummed,
atomic; :mod:`crf.persist`) and, for ``model_filename``, CRFsuite's format
(:mod:`crf.crfsuite_format`).
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

import numpy as np

from .features import AttributeIndex
from .persist import ModelFileError, arrays_to_strings, load_arrays, save_arrays, strings_to_arrays

if TYPE_CHECKING:
    from .model import CRF

KIND = "crf.CRF"


def _arrays(model: CRF) -> dict[str, np.ndarray]:
    arrays = {"transitions": model.transitions_, "start": model.start_weights_, "end": model.end_weights_}
    if model.feature_index_ is not None:
        arrays["feature_index"] = model.feature_index_
        arrays["state_values"] = model.state_weights_.ravel()[model.feature_index_]
    else:
        arrays["state_values"] = model.state_weights_
    if model.attributes_ is not None:
        arrays["attribute_blob"], arrays["attribute_offsets"] = strings_to_arrays(model.attributes_)
    return arrays


def to_arrays(model: CRF) -> tuple[dict, dict[str, np.ndarray]]:
    """The fitted ``model`` as (JSON-ready metadata, named arrays): what :func:`save` writes,
    for containers that hold a CRF among other things (:class:`crf.bundle.TaggerBundle`)."""
    meta = {
        "params": {k: v for k, v in model.get_params().items() if isinstance(v, (str, int, float, bool, type(None)))},
        "classes": list(model.classes_),
        "n_attributes": int(model.n_attributes_),
        "sparse": model.feature_index_ is not None,
        "dict_input": getattr(model, "attribute_index_", None) is not None,
    }
    return meta, _arrays(model)


def save(model: CRF, path) -> None:
    """Write the fitted ``model`` to one ``.npz`` file."""
    meta, arrays = to_arrays(model)
    save_arrays(path, KIND, meta, arrays)


def size_in_bytes(model: CRF) -> int:
    """Size of the file :func:`save` writes for ``model`` (written to a temporary folder)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.npz")
        save(model, path)
        return os.path.getsize(path)


def load(cls: type[CRF], path) -> CRF:
    """Read a model written by :func:`save`; raises ModelFileError on a bad file."""
    meta, arrays = load_arrays(path, KIND)
    return from_arrays(cls, meta, arrays, path)


def from_arrays(cls: type[CRF], meta: dict, arrays: dict[str, np.ndarray], path="model") -> CRF:
    """The CRF of :func:`to_arrays`' output; ``path`` names the source in ModelFileError messages."""
    try:
        known = cls().get_params()
        model = cls(**{k: v for k, v in meta["params"].items() if k in known})
        classes = list(meta["classes"])  # strings or integers, as trained (the header is checksummed)
        if not all(isinstance(c, (str, int)) for c in classes):
            raise ModelFileError(f"{path}: class labels must be strings or integers")
        A, L = int(meta["n_attributes"]), len(classes)
        model.classes_ = classes
        model.n_attributes_ = A
        transitions = arrays["transitions"].astype(np.float64)
        if transitions.shape != (L, L) or arrays["start"].shape != (L,) or arrays["end"].shape != (L,):
            raise ModelFileError(f"{path}: weight shapes do not match {L} labels")
        state = np.zeros((A, L))
        if meta["sparse"]:
            index = arrays["feature_index"].astype(np.int64)
            if (
                index.ndim != 1
                or index.size != arrays["state_values"].size
                or (index.size and (index.min() < 0 or index.max() >= A * L))
            ):
                raise ModelFileError(f"{path}: feature index out of range")
            state.ravel()[index] = arrays["state_values"]
            model.feature_index_ = index
        else:
            if arrays["state_values"].shape != (A, L):
                raise ModelFileError(f"{path}: state weights have shape {arrays['state_values'].shape}, expected {(A, L)}")
            state[:] = arrays["state_values"]
            model.feature_index_ = None
        model.state_weights_ = state
        model.transitions_ = transitions
        model.start_weights_ = arrays["start"].astype(np.float64)
        model.end_weights_ = arrays["end"].astype(np.float64)
        model.attributes_ = (
            arrays_to_strings(arrays["attribute_blob"], arrays["attribute_offsets"]) if "attribute_blob" in arrays else None
        )
        if model.attributes_ is not None and len(model.attributes_) != A:
            raise ModelFileError(f"{path}: {len(model.attributes_)} attribute names for {A} attributes")
        if meta.get("dict_input"):
            if model.attributes_ is None:
                raise ModelFileError(f"{path}: a dict-input model without attribute names")
            model.attribute_index_ = AttributeIndex()
            model.attribute_index_.index_ = {name: i for i, name in enumerate(model.attributes_)}
        else:
            model.attribute_index_ = None
    except KeyError as err:
        raise ModelFileError(f"{path}: missing field {err}") from None
    return model


def read_crfsuite_model(path) -> CRF:
    """A fitted CRF from a CRFsuite model file (python-crfsuite's, sklearn-crfsuite's)."""
    from .crfsuite_format import crf_from_crfsuite, read_crfsuite

    return crf_from_crfsuite(read_crfsuite(path))


def write_crfsuite_model(model: CRF, path) -> None:
    """Write ``model`` (no start/end weights) as a CRFsuite model file."""
    from .crfsuite_format import crfsuite_from_crf, write_crfsuite

    write_crfsuite(path, crfsuite_from_crf(model))

"""A NumPy/SciPy linear-chain CRF: exact inference, L-BFGS/OWL-QN/SGD training, partial labels,
active-learning queries, metrics, an HMM baseline, and CRFsuite's file format and Python APIs.

This package is a library of its own: it imports NumPy, SciPy, pandas, scikit-learn, Numba (its
compiled kernels), threadpoolctl and the standard library. Its names are imported on first use, so
importing one module (``crf.io``) does not import the others.

Public modules: ``crf.model`` (:class:`CRF`), ``crf.hmm`` (:class:`HMM`), ``crf.features``,
``crf.attributes``, ``crf.batch``, ``crf.io``, ``crf.metrics``, ``crf.scorers``, ``crf.bundle``,
``crf.crfsuite`` (model files), ``crf.pycrfsuite`` (python-crfsuite's API). Modules whose names
start with ``_`` are the kernels behind them.
"""

import warnings
from importlib import import_module

_EXPORTS = {
    "AttributeIndex": "attributes",
    "CRF": "model",
    "CRFsuiteFormatError": "crfsuite",
    "CRFsuiteModel": "crfsuite",
    "DataFormatError": "io",
    "FeatureExtractor": "features",
    "HMM": "hmm",
    "IterationInfo": "_optimize",
    "ModelFileError": "_persist",
    "SequenceBatch": "batch",
    "ModelBundle": "bundle",
    "TrainingError": "model",
    "Uncertainty": "_uncertainty",
    "crfsuite_chunking_extractor": "features",
    "load_arrays": "_persist",
    "load_bundle": "bundle",
    "parameter_applies": "_params",
    "read_conll": "io",
    "read_conllu": "io",
    "read_crfsuite": "crfsuite",
    "read_xml_sequences": "io",
    "save_arrays": "_persist",
    "single_threaded_blas": "_parallel",
    "write_crfsuite": "crfsuite",
}

# earlier names, each of which meant more than one thing in this project: still importable, with a warning
_RENAMED = {"HMMTagger": "HMM", "TaggerBundle": "ModelBundle", "load_tagger": "load_bundle"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _RENAMED:
        warnings.warn(f"crf.{name} is now crf.{_RENAMED[name]}", DeprecationWarning, stacklevel=2)
        return __getattr__(_RENAMED[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crf' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

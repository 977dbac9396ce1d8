"""A NumPy/SciPy linear-chain CRF: exact inference, L-BFGS/L1/SGD training, metrics, HMM baseline.

This package is a library of its own: it imports NumPy, SciPy, pandas and the standard library.
"""

from .batch import SequenceBatch
from .bundle import TaggerBundle, load_tagger
from .crfsuite_format import CRFsuiteFormatError, CRFsuiteModel, read_crfsuite, write_crfsuite
from .features import AttributeIndex, FeatureExtractor, crfsuite_chunking_extractor
from .hmm import HMMTagger
from .io import DataFormatError, read_conll, read_conllu, read_xml_sequences
from .model import CRF
from .persist import ModelFileError
from .tagger import Tagger

__all__ = [
    "CRF",
    "CRFsuiteFormatError",
    "CRFsuiteModel",
    "AttributeIndex",
    "DataFormatError",
    "FeatureExtractor",
    "HMMTagger",
    "ModelFileError",
    "SequenceBatch",
    "Tagger",
    "TaggerBundle",
    "crfsuite_chunking_extractor",
    "load_tagger",
    "read_conll",
    "read_conllu",
    "read_xml_sequences",
    "read_crfsuite",
    "write_crfsuite",
]

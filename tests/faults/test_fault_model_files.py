"""Fault injection on model files from elsewhere: archives whose members inflate far beyond their
size, ``.npy`` headers whose shapes do not fit their members, files whose checksums are valid but
whose contents are not (non-finite weights, repeated names, sizes that do not fit each other),
CRFsuite files whose chunks and references overlap, loop or point past the end; and the
permissions of every file written through the atomic write. Each refusal must be the project's
:class:`crf.ModelFileError` naming the file and the problem, reached before anything large is
read or allocated."""

from __future__ import annotations

import io
import os
import stat
import struct
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import make_sentence, serving_files  # noqa: E402

from crf import CRF, HMM, FeatureExtractor, ModelBundle, ModelFileError, load_bundle  # noqa: E402
from crf._persist import load_arrays, save_arrays  # noqa: E402
from crf.crfsuite import (  # noqa: E402  # noqa: E402
    _HEADER,
    CHUNK_SIZE,
    HEADER_SIZE,
    MAX_KEY_BYTES,
    CRFsuiteFormatError,
    build_cqdb,
    crfsuite_from_crf,
    hashlittle,
    read_cqdb,
    read_crfsuite,
    write_crfsuite,
)
from crf.hmm import BundledHMM
from crf.io import atomic_write  # noqa: E402
from crf.model import BundledCRF
from pipeline.apps.formats import Prediction, read_input, write_output  # noqa: E402
from pipeline.stages.data import _download  # noqa: E402
from pipeline.stages.featurize import EXTRACTOR_KIND, load_extractor, save_extractor  # noqa: E402

COLUMNS = ["w", "pos", "chunk"]
BOMB_BYTES = 32 << 20  # what the bomb member inflates to (it is about 32 KB compressed)
PEAK_BYTES = 4 << 20  # what loading a refused file may allocate at most


class _Kind:
    """How to save and load one kind of ``.npz`` model file, and its container kind."""

    def __init__(self, kind: str, save: Callable[[Path], None], load: Callable[[Path], object]) -> None:
        self.kind, self.save, self.load = kind, save, load


@pytest.fixture(scope="module")
def fitted():
    """Small fitted models: a CRF on extractor batches, a dict-input CRF (without start/end
    weights, so CRFsuite's format holds it), an HMM, two bundles."""
    rng = np.random.default_rng(0)
    train = [make_sentence(rng) for _ in range(40)]
    labels = [[row[2] for row in s] for s in train]
    extractor = FeatureExtractor(columns=COLUMNS, templates=["w[0]", "pos[0]", "pos[-1]|pos[0]"])
    crf = CRF(max_iterations=15, c2=0.1).fit(extractor.fit_transform(train), labels)
    dict_crf = CRF(max_iterations=15, c2=0.1, boundary_transitions=False).fit(
        [[{"w": w, "pos": p} for w, p, _ in s] for s in train], labels
    )
    hmm = HMM().fit([[row[0] for row in s] for s in train], labels)
    return {
        "extractor": extractor,
        "crf": dict_crf,
        "hmm": hmm,
        "crf_bundle": ModelBundle(BundledCRF(extractor, crf), scheme="iob2", input_columns=["w", "pos"]),
        "hmm_bundle": ModelBundle(BundledHMM(hmm, "w"), scheme="iob2"),
    }


@pytest.fixture(scope="module")
def kinds(fitted) -> dict[str, _Kind]:
    return {
        "crf": _Kind("crf.CRF", fitted["crf"].save, CRF.load),
        "hmm": _Kind("crf.HMMTagger", fitted["hmm"].save, HMM.load),
        "crf_bundle": _Kind("crf.TaggerBundle", fitted["crf_bundle"].save, load_bundle),
        "hmm_bundle": _Kind("crf.TaggerBundle", fitted["hmm_bundle"].save, load_bundle),
        "extractor": _Kind(EXTRACTOR_KIND, lambda path: save_extractor(path, fitted["extractor"]), load_extractor),
    }


def _rewrite(path: Path, replace: dict[str, Callable[[zipfile.ZipFile], None]]) -> None:
    """Rewrite the archive at ``path`` keeping every member but those of ``replace``, each of which
    is written instead by its function (given the output archive)."""
    with zipfile.ZipFile(path) as source:
        kept = [(info, source.read(info)) for info in source.infolist() if info.filename[:-4] not in replace]
    with zipfile.ZipFile(path, "w") as out:
        for info, data in kept:
            out.writestr(info, data)
        for write in replace.values():
            write(out)


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue()


def _bomb(name: str) -> Callable[[zipfile.ZipFile], None]:
    """A deflated member ``name`` whose float64 zeros inflate to BOMB_BYTES (about 1000:1)."""

    def write(out: zipfile.ZipFile) -> None:
        info = zipfile.ZipInfo(f"{name}.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with out.open(info, "w", force_zip64=True) as member:
            member.write(_npy_header((BOMB_BYTES // 8,)))
            block = bytes(1 << 20)
            for _ in range(BOMB_BYTES >> 20):
                member.write(block)

    return write


def _stored(name: str, data: bytes) -> Callable[[zipfile.ZipFile], None]:
    return lambda out: out.writestr(zipfile.ZipInfo(f"{name}.npy"), data)


def _refused(load: Callable[[Path], object], path: Path, *patterns: str) -> ModelFileError:
    """Load ``path``: it must raise ModelFileError naming the file and matching ``patterns``,
    quickly and without allocating more than PEAK_BYTES."""
    before = path.read_bytes()
    tracemalloc.start()
    began = time.perf_counter()
    try:
        with pytest.raises(ModelFileError) as caught:
            load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert message.startswith(f"{path}:"), message
    for pattern in patterns:
        assert pattern in message, message
    assert peak < PEAK_BYTES, f"{peak:,} bytes allocated while refusing {path}"
    assert time.perf_counter() - began < 5.0
    assert path.read_bytes() == before  # loading never writes
    return caught.value


def _resave(path: Path, kind: str, edit: Callable[[dict, dict], None]) -> None:
    """Edit the metadata and arrays of a model file and save it again: valid checksums."""
    meta, arrays = load_arrays(path, kind)
    edit(meta, arrays)
    save_arrays(path, kind, meta, arrays)


# --- archives that would inflate or allocate far beyond their size ------------------------


@pytest.mark.parametrize("which", ["crf", "hmm", "crf_bundle", "hmm_bundle", "extractor"])
def test_a_zip_bomb_member_is_refused_without_inflating_it(kinds, tmp_path, which):
    kind = kinds[which]
    path = tmp_path / "model.npz"
    kind.save(path)
    name = next(n[:-4] for n in zipfile.ZipFile(path).namelist() if n != "__meta__.npy")
    _rewrite(path, {name: _bomb(name)})
    assert path.stat().st_size < BOMB_BYTES // 500
    _refused(kind.load, path, f"array {name!r} declares {BOMB_BYTES + 128:,} bytes compressed into", "without inflating it")


def test_a_zip_bomb_metadata_member_is_refused(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _rewrite(path, {"__meta__": _bomb("__meta__")})
    _refused(CRF.load, path, "'__meta__' declares", "without inflating it")


@pytest.mark.parametrize(
    "text",
    [b'{"kind": "\xff"}', b'{"n": ' + b"9" * 5000 + b"}", b'{"kind": '],
    ids=["not-utf8", "huge-integer", "not-json"],
)
def test_metadata_that_is_not_readable_json_is_refused(kinds, tmp_path, text):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _rewrite(path, {"__meta__": _stored("__meta__", _npy_header((len(text),), "|u1") + text)})
    _refused(CRF.load, path, "unreadable or truncated model file")


@pytest.mark.parametrize("which", ["crf", "hmm", "crf_bundle", "extractor"])
def test_an_npy_header_whose_shape_does_not_fit_its_member(kinds, tmp_path, which):
    kind = kinds[which]
    path = tmp_path / "model.npz"
    kind.save(path)
    name = next(n[:-4] for n in zipfile.ZipFile(path).namelist() if n != "__meta__.npy")
    _rewrite(path, {name: _stored(name, _npy_header((1 << 40,)) + bytes(16))})
    _refused(kind.load, path, f"array {name!r} declares shape (1099511627776,) of float64", "holds 16 bytes of data")


def test_an_object_array_member_is_refused_before_reading(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["hmm"].save(path)
    _rewrite(path, {"log_transitions": _stored("log_transitions", _npy_header((1,), "|O") + b"\x80\x04N.")})
    _refused(HMM.load, path, "'log_transitions' has dtype object")


def test_repeated_member_names_are_refused(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    with zipfile.ZipFile(path) as source:
        info = source.getinfo("transitions.npy")
        data = source.read(info)
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "a") as out:
        out.writestr("transitions.npy", data)
    _refused(CRF.load, path, "array 'transitions' appears twice")


def test_deeply_nested_metadata_is_refused(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    nested = np.frombuffer(b"[" * 200_000 + b"]" * 200_000, dtype=np.uint8)
    with io.BytesIO() as buffer:
        np.save(buffer, nested)
        data = buffer.getvalue()
    _rewrite(path, {"__meta__": _stored("__meta__", data)})
    _refused(CRF.load, path, "unreadable or truncated model file")


def test_declared_attribute_count_that_no_file_could_describe(fitted, tmp_path):
    """A sparse CRF without attribute names declaring 10^12 attributes: the dense (A, L) table is
    refused before it is allocated."""
    path = tmp_path / "model.npz"
    batch_crf = fitted["crf_bundle"].model
    batch_crf.save(path)
    _resave(path, "crf.CRF", lambda meta, arrays: meta.update(n_attributes=10**12))
    _refused(CRF.load, path, "state weights of 1,000,000,000,000 attributes", "do not fit the file")


def test_string_offsets_that_go_back_are_refused(kinds, tmp_path):
    """Offsets 0, n, 0, n, ... would make every string the whole blob (quadratic memory)."""
    path = tmp_path / "model.npz"
    kinds["hmm"].save(path)

    def edit(meta, arrays):
        size = arrays["vocabulary_blob"].size
        arrays["vocabulary_offsets"] = np.tile(np.array([0, size], dtype=np.int64), 20_000)

    _resave(path, "crf.HMMTagger", edit)
    _refused(HMM.load, path, "malformed HMM file", "string offsets do not run from 0 to")


def test_sparse_counts_that_do_not_add_up_are_refused(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["hmm"].save(path)

    def edit(meta, arrays):
        counts = arrays["known_emissions_counts"].astype(np.uint32)
        counts[0] = 2**32 - 1  # np.repeat would make 4 billion entries
        arrays["known_emissions_counts"] = counts

    _resave(path, "crf.HMMTagger", edit)
    _refused(HMM.load, path, "known_emissions", "entries, expected")


def test_archives_without_metadata_or_readable_zip_name_the_file(tmp_path):
    path = tmp_path / "model.npz"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    _refused(CRF.load, path, "unreadable or truncated")
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("weights.npy", _npy_header((0,)))
    _refused(CRF.load, path, "no metadata")
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("notes.txt", b"hello")
    _refused(CRF.load, path, "member 'notes.txt' is not a .npy array")


def _recompress(path: Path, method: int) -> None:
    """Rewrite every member of the archive at ``path`` with compression ``method``."""
    with zipfile.ZipFile(path) as source:
        members = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", compression=method) as out:
        for name, data in members:
            out.writestr(name, data)


@pytest.mark.parametrize("which", ["crf", "hmm_bundle"])
def test_a_deflated_copy_of_a_valid_file_still_loads(kinds, tmp_path, which):
    """np.savez_compressed's archives (ordinary ratios) are not bombs."""
    kind = kinds[which]
    plain, packed = tmp_path / "plain.npz", tmp_path / "packed.npz"
    kind.save(plain)
    kind.save(packed)
    _recompress(packed, zipfile.ZIP_DEFLATED)
    assert packed.stat().st_size < plain.stat().st_size
    assert load_arrays(packed, kind.kind)[0] == load_arrays(plain, kind.kind)[0]
    kind.load(packed)


def test_other_compression_methods_are_refused(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _recompress(path, zipfile.ZIP_BZIP2)
    _refused(CRF.load, path, "uses compression method 12 (only stored or deflated)")


def test_metadata_that_is_not_a_byte_string(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    with io.BytesIO() as buffer:
        np.save(buffer, np.zeros(4))
        _rewrite(path, {"__meta__": _stored("__meta__", buffer.getvalue())})
    _refused(CRF.load, path, "the metadata is not a byte string")


# --- valid checksums, invalid contents ---------------------------------------------------


def _poison(name: str, value: float) -> Callable[[dict, dict], None]:
    def edit(meta, arrays):
        array = arrays[name].copy()
        array.flat[0] = value
        arrays[name] = array

    return edit


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", ["transitions", "start", "state_values"])
def test_non_finite_crf_weights(kinds, tmp_path, name, value):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _resave(path, "crf.CRF", _poison(name, value))
    _refused(CRF.load, path, f"array {name!r} holds the non-finite value {value}")


@pytest.mark.parametrize("name", ["transitions", "end", "state_values"])
def test_crf_weights_too_large_to_decode_with(kinds, tmp_path, name):
    """Finite weights whose sums overflow or lose every digit (1e308 + 1e308 is inf): refused at
    load like a damaged file."""
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _resave(path, "crf.CRF", _poison(name, -1e308))
    _refused(CRF.load, path, f"array {name!r} holds the weight -1e+308, beyond")


def test_crfsuite_weights_whose_sum_would_overflow(tmp_path):
    """The same state feature twice, each 1e308 (finite): CRFsuite's tagger adds them up to
    infinity. Refused at load, through the estimator and through crf.pycrfsuite's Tagger."""
    from crf.crfsuite import CRFsuiteModel, StateFeatures
    from crf.pycrfsuite import Tagger

    marker = 0.123456789
    model = CRFsuiteModel(
        ["A", "B"],
        ["a", "b"],
        StateFeatures(np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([marker, marker, 2.0])),
        np.zeros((2, 2)),
    )
    path = tmp_path / "twice.crfsuite"
    write_crfsuite(path, model)
    data = path.read_bytes()
    assert data.count(struct.pack("<d", marker)) == 2
    path.write_bytes(data.replace(struct.pack("<d", marker), struct.pack("<d", 1e308)))
    _refused(read_crfsuite, path, "a feature holds the weight 1e+308, beyond")
    with pytest.raises(CRFsuiteFormatError, match="beyond"):
        CRF(model_filename=str(path)).classes_  # noqa: B018  (the file is read on first use)
    with pytest.raises(CRFsuiteFormatError, match="beyond"):
        Tagger().open(str(path))


def test_a_model_no_loader_would_accept_is_not_saved(fitted, tmp_path):
    model, heavy = fitted["crf"], tmp_path / "heavy.npz"
    saved = model.transitions_.copy()
    try:
        model.transitions_[0, 0] = 2e6
        with pytest.raises(ValueError, match="cannot save this model: transitions holds the weight 2e\\+06"):
            model.save(heavy)
        with pytest.raises(ValueError, match="no reader would accept"):
            write_crfsuite(tmp_path / "heavy.crfsuite", crfsuite_from_crf(model))
    finally:
        model.transitions_[:] = saved
    assert not heavy.exists() and not (tmp_path / "heavy.crfsuite").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["log_transitions", "unknown_emissions", "known_emissions_values"])
def test_hmm_log_probabilities_that_are_nan_or_plus_infinity(kinds, tmp_path, name, value):
    path = tmp_path / "model.npz"
    kinds["hmm"].save(path)
    _resave(path, "crf.HMMTagger", _poison(name, value))
    _refused(HMM.load, path, "non-finite value")


def test_hmm_minus_infinity_stays_allowed(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["hmm"].save(path)
    _resave(path, "crf.HMMTagger", _poison("log_transitions", -float("inf")))
    assert HMM.load(path).log_transitions_.flat[0] == -np.inf


@pytest.mark.parametrize("bundle", ["crf_bundle", "hmm_bundle"])
def test_non_finite_weights_in_a_bundle(kinds, tmp_path, bundle):
    path = tmp_path / "bundle.npz"
    kinds[bundle].save(path)
    name = "model/transitions" if bundle == "crf_bundle" else "model/log_transitions"
    _resave(path, "crf.TaggerBundle", _poison(name, float("nan")))
    _refused(load_bundle, path, "transitions' holds the non-finite value nan")


@pytest.mark.parametrize("which", ["crf", "hmm"])
def test_duplicate_class_names(kinds, tmp_path, which):
    kind = kinds[which]
    path = tmp_path / "model.npz"
    kind.save(path)

    def edit(meta, arrays):
        meta["classes"][1] = meta["classes"][0]

    _resave(path, kind.kind, edit)
    _refused(kind.load, path, "class label", "appears twice")


@pytest.mark.parametrize("bundle", ["crf_bundle", "hmm_bundle"])
def test_duplicate_labels_in_a_bundle(kinds, tmp_path, bundle):
    path = tmp_path / "bundle.npz"
    kinds[bundle].save(path)

    def edit(meta, arrays):
        meta["model"]["classes"][1] = meta["model"]["classes"][0]
        meta["labels"][1] = meta["labels"][0]

    _resave(path, "crf.TaggerBundle", edit)
    _refused(load_bundle, path, "appears twice")


def test_integer_and_string_class_that_print_alike(kinds, tmp_path):
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _resave(path, "crf.CRF", lambda meta, arrays: meta.update(classes=[1, "1", *meta["classes"][2:]]))
    _refused(CRF.load, path, "class label '1' appears twice")


CRF_INCONSISTENCIES = {
    "transitions-shape": (
        lambda m, a: a.update(transitions=np.zeros((len(m["classes"]) + 1, len(m["classes"])))),
        "'transitions' has shape",
    ),
    "start-shape": (lambda m, a: a.update(start=np.zeros(1)), "'start' has shape (1,)"),
    "index-out-of-range": (lambda m, a: a["feature_index"].__setitem__(-1, 10**9), "feature index out of range"),
    "index-unsorted": (lambda m, a: a.update(feature_index=a["feature_index"][::-1].copy()), "not strictly increasing"),
    "values-length": (lambda m, a: a.update(state_values=a["state_values"][:-1]), "'state_values' has shape"),
    "attribute-count": (lambda m, a: m.update(n_attributes=m["n_attributes"] + 1), "attribute names for"),
    "weights-as-strings": (lambda m, a: a.update(start=a["start"].astype(str)), "'start' has dtype <U"),
    "no-classes": (lambda m, a: m.update(classes=[]), "not a non-empty list"),
    "n-threads": (lambda m, a: m["params"].update(n_threads=10**9), "n_threads 1000000000"),
    "params-not-a-dict": (lambda m, a: m.update(params=[1, 2]), "parameters are not a JSON object"),
}


@pytest.mark.parametrize("case", list(CRF_INCONSISTENCIES))
def test_inconsistent_crf_files(kinds, tmp_path, case):
    edit, message = CRF_INCONSISTENCIES[case]
    path = tmp_path / "model.npz"
    kinds["crf"].save(path)
    _resave(path, "crf.CRF", edit)
    _refused(CRF.load, path, message)


def _drop_suffix(meta: dict, arrays: dict) -> None:
    """Rename the empty capitalised suffix "C|" (the suffix model's last resort) to "X|"."""
    blob = arrays["suffix_blob"].tobytes()
    offsets = arrays["suffix_offsets"]
    keys = [blob[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    keys[keys.index(b"C|")] = b"X|"
    arrays["suffix_blob"] = np.frombuffer(b"".join(keys), dtype=np.uint8).copy()


HMM_INCONSISTENCIES = {
    "duplicate-word": (
        lambda m, a: a.update(vocabulary_blob=np.frombuffer(b"aa", np.uint8).copy(), vocabulary_offsets=np.array([0, 1, 2])),
        "word 'a' appears twice",
    ),
    "transitions-shape": (lambda m, a: a.update(log_transitions=a["log_transitions"][:-1]), "'log_transitions' has shape"),
    "emission-column": (lambda m, a: a["known_emissions_columns"].__setitem__(0, 200), "a column lies outside"),
    "missing-empty-suffix": (_drop_suffix, "lacks the empty suffixes ['C|']"),
    "bad-order": (lambda m, a: m["params"].update(order=3), "order must be 1 or 2"),
    "negative-max-suffix": (lambda m, a: m["params"].update(max_suffix=-1), "max_suffix must be a whole number >= 0, got -1"),
    "n-threads": (lambda m, a: m["params"].update(n_threads=-1), "n_threads -1"),
    "theta": (lambda m, a: m.update(suffix_theta=float("nan")), "suffix_theta nan"),
    "unknown-given-label": (lambda m, a: a.update(unknown_given_label=a["unknown_given_label"][:1]), "'unknown_given_label'"),
}


@pytest.mark.parametrize("case", list(HMM_INCONSISTENCIES))
def test_inconsistent_hmm_files(kinds, tmp_path, case):
    edit, message = HMM_INCONSISTENCIES[case]
    path = tmp_path / "model.npz"
    kinds["hmm"].save(path)
    _resave(path, "crf.HMMTagger", edit)
    _refused(HMM.load, path, message)


def _extractor_vocabulary(edit: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict, dict], None]:
    return lambda meta, arrays: arrays.update({"features/view/w": edit(arrays["features/view/w"])})


BUNDLE_INCONSISTENCIES = {
    "duplicate-vocabulary": (
        _extractor_vocabulary(lambda v: np.concatenate([v[:1], v[:-1]])),
        "view 'w': value",
    ),
    "vocabulary-as-numbers": (_extractor_vocabulary(lambda v: np.arange(v.size)), "'view/w' has dtype int64"),
    "template-key-out-of-range": (
        lambda m, a: a["features/template/0"].__setitem__(-1, 10**15),
        "template 0 ('w[0]') keys are not strictly increasing within 0 ..",
    ),
    "attribute-count": (
        lambda m, a: a.update({"features/template/0": a["features/template/0"][:-1]}),
        "the features give",
    ),
    "input-columns-string": (lambda m, a: m.update(input_columns="w"), "input_columns 'w' is not"),
    "input-columns-repeated": (lambda m, a: m.update(input_columns=["w", "pos", "w"]), "input column 'w' appears twice"),
    "labels-differ": (lambda m, a: m["labels"].reverse(), "label list does not match"),
    "unknown-config-key": (lambda m, a: m["features"].update(color="red"), "bad feature config"),
}


@pytest.mark.parametrize("case", list(BUNDLE_INCONSISTENCIES))
def test_inconsistent_crf_bundles(kinds, tmp_path, case):
    edit, message = BUNDLE_INCONSISTENCIES[case]
    path = tmp_path / "bundle.npz"
    kinds["crf_bundle"].save(path)
    _resave(path, "crf.TaggerBundle", edit)
    _refused(load_bundle, path, message)


def test_inconsistent_extractor_file(kinds, tmp_path):
    path = tmp_path / "extractor.npz"
    kinds["extractor"].save(path)
    _resave(path, EXTRACTOR_KIND, lambda meta, arrays: arrays["template/1"].__setitem__(0, -5))
    with pytest.raises(ModelFileError, match="template 1 .* keys are not strictly increasing"):
        load_extractor(path)


def test_valid_files_still_load_after_a_round_trip_through_resave(kinds, tmp_path):
    for name, kind in kinds.items():
        path = tmp_path / f"{name}.npz"
        kind.save(path)
        _resave(path, kind.kind, lambda meta, arrays: None)
        kind.load(path)


# --- CRFsuite files ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def crfsuite_bytes(fitted, tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("crfsuite") / "model.crfsuite"
    write_crfsuite(path, crfsuite_from_crf(fitted["crf"]))
    return path.read_bytes()


def _offsets(data: bytes) -> dict[str, int]:
    return dict(zip(("features", "labels", "attrs", "labelrefs", "attrrefs"), struct.unpack_from("<5I", data, 28)))


def _crfsuite_refused(tmp_path: Path, data: bytes | bytearray, *patterns: str) -> None:
    path = tmp_path / "hostile.crfsuite"
    path.write_bytes(bytes(data))
    error = _refused(read_crfsuite, path, *patterns)
    assert isinstance(error, CRFsuiteFormatError)
    with pytest.raises(CRFsuiteFormatError, match=str(path)):
        getattr(CRF(model_filename=str(path)), "classes_")  # noqa: B009  (loaded on first use)
    _refused(load_bundle, path, "not an .npz archive")


def test_crfsuite_chunks_that_overlap(crfsuite_bytes, tmp_path):
    data = bytearray(crfsuite_bytes)
    offsets = _offsets(crfsuite_bytes)
    size = struct.unpack_from("<I", data, offsets["labelrefs"] + 4)[0]
    struct.pack_into("<I", data, offsets["labelrefs"] + 4, size + 8)  # runs into the AFRF chunk
    _crfsuite_refused(tmp_path, data, "chunk at offset", "overlaps another chunk")


def test_crfsuite_chunk_offset_pointing_into_another_chunk(crfsuite_bytes, tmp_path):
    data = bytearray(crfsuite_bytes)
    offsets = _offsets(crfsuite_bytes)
    struct.pack_into("<I", data, 28 + 4 * 2, offsets["labels"])  # the attribute strings are the label strings
    _crfsuite_refused(tmp_path, data, "overlaps another chunk")


def test_crfsuite_reference_list_looping_into_its_offset_table(crfsuite_bytes, tmp_path):
    data = bytearray(crfsuite_bytes)
    start = _offsets(crfsuite_bytes)["attrrefs"]
    struct.pack_into("<I", data, start + 12, start + 8)  # attribute 0's list is the chunk's own count field
    _crfsuite_refused(tmp_path, data, "attribute reference list lies outside its chunk")


def test_crfsuite_reference_lists_shared_by_many_owners(crfsuite_bytes, tmp_path):
    """Every attribute pointing at one list: each list is in bounds, but together they would
    repeat it once per owner (quadratic in the file's size)."""
    data = bytearray(crfsuite_bytes)
    start = _offsets(crfsuite_bytes)["attrrefs"]
    count = struct.unpack_from("<I", data, start + 8)[0]
    first = struct.unpack_from("<I", data, start + 12)[0]
    struct.pack_into(f"<{count}I", data, start + 12, *([first] * count))
    _crfsuite_refused(tmp_path, data, "overlaps another one (shared or looping references)")


@pytest.mark.parametrize("field", ["features", "labels", "attrs", "labelrefs", "attrrefs"])
def test_crfsuite_offset_beyond_the_end(crfsuite_bytes, tmp_path, field):
    data = bytearray(crfsuite_bytes)
    index = list(_offsets(crfsuite_bytes)).index(field)
    struct.pack_into("<I", data, 28 + 4 * index, len(data) + 1000)
    _crfsuite_refused(tmp_path, data, "at offset")


def test_crfsuite_record_offset_beyond_the_end(crfsuite_bytes, tmp_path):
    data = bytearray(crfsuite_bytes)
    start = _offsets(crfsuite_bytes)["attrs"]
    backward = struct.unpack_from("<I", data, start + 20)[0]
    struct.pack_into("<I", data, start + backward, 2**31)
    _crfsuite_refused(tmp_path, data, "record offset is out of range")


@pytest.mark.parametrize("field", [("labels", 20), ("attributes", 24)])
def test_crfsuite_counts_too_large_for_the_file(crfsuite_bytes, tmp_path, field):
    data = bytearray(crfsuite_bytes)
    struct.pack_into("<I", data, field[1], 2**31)
    _crfsuite_refused(tmp_path, data, "do not fit the file")


def test_crfsuite_counts_of_names_whose_table_no_file_could_describe(tmp_path):
    """Labels and attributes are each backed by their strings, but their product is not: 10^4
    labels x 10^4 attributes would be a 1.6 GB table from a file of under a megabyte."""
    path = tmp_path / "big.crfsuite"
    _write_crfsuite_without_features(path, [f"L{i}" for i in range(10_000)], [f"a{i}" for i in range(10_000)])
    assert path.stat().st_size < 1 << 20
    _refused(read_crfsuite, path, "the weights of 10,000 attributes x 10,000 labels", "do not fit the file")


def _write_crfsuite_without_features(path: Path, labels: list[str], attributes: list[str]) -> None:
    """A CRFsuite file with ``labels`` and ``attributes`` and no features at all."""

    parts = [b"FEAT" + struct.pack("<II", CHUNK_SIZE, 0), build_cqdb(labels), build_cqdb(attributes)]
    parts.append(b"\0" * (-sum(len(p) for p in parts) % 4))
    for chunk_id, count in ((b"LFRF", len(labels)), (b"AFRF", len(attributes))):
        begin = HEADER_SIZE + sum(len(p) for p in parts)
        lists = begin + CHUNK_SIZE + 4 * count + 4 * np.arange(count)
        body = np.concatenate([lists, np.zeros(count)]).astype("<u4").tobytes()
        parts.append(chunk_id + struct.pack("<II", CHUNK_SIZE + len(body), count) + body)
    offsets, position = [], HEADER_SIZE
    for part in parts:
        offsets.append(position)
        position += len(part)
    counts = (len(labels), len(attributes))
    header = _HEADER.pack(b"lCRF", position, b"FOMC", 100, 0, *counts, *(offsets[i] for i in (0, 1, 2, 4, 5)))
    path.write_bytes(header + b"".join(parts))


def test_crfsuite_records_that_overlap(crfsuite_bytes, tmp_path):
    """Key 0 stretched over record 1 (which ends in NUL, as a key must): the two keys would share bytes."""
    data = bytearray(crfsuite_bytes)
    start = _offsets(crfsuite_bytes)["attrs"]
    backward = struct.unpack_from("<I", data, start + 20)[0]
    first, second = struct.unpack_from("<2I", data, start + backward)
    key_size = struct.unpack_from("<I", data, start + second + 4)[0]
    struct.pack_into("<I", data, start + first + 4, second + 8 + key_size - first - 8)
    _crfsuite_refused(tmp_path, data, "records, hash tables and backward array overlap")


def test_crfsuite_duplicate_label_names(crfsuite_bytes, tmp_path):
    data = bytearray(crfsuite_bytes)
    offsets = _offsets(crfsuite_bytes)
    labels = read_crfsuite_labels(crfsuite_bytes)
    same = next(b for b in labels[1:] if len(b) == len(labels[0]))
    replaced = build_cqdb([labels[0] if name == same else name for name in labels])
    assert len(replaced) == offsets["attrs"] - offsets["labels"]
    data[offsets["labels"] : offsets["attrs"]] = replaced
    _crfsuite_refused(tmp_path, data, f"label {labels[0]!r} appears twice")


def read_crfsuite_labels(data: bytes) -> list[str]:
    return read_cqdb(data, _offsets(data)["labels"], struct.unpack_from("<I", data, 20)[0])


def test_crfsuite_hash_of_one_long_key_takes_linear_memory():
    """lookup3 over one 16 KB key and 20,000 short ones: no (keys x longest key) padding (which
    would be 330 MB here)."""
    keys = [b"x" * (16 << 10)] + [b"a%d\0" % i for i in range(20_000)]
    tracemalloc.start()
    try:
        hashes = hashlittle(keys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert hashes.size == len(keys) and hashes[1] == hashlittle([keys[1]])[0] and hashes[0] == hashlittle(keys[:1])[0]
    assert peak < PEAK_BYTES


def test_crfsuite_keys_longer_than_the_bound_are_not_written():
    with pytest.raises(ValueError, match="65,537 bytes long: a CRFsuite model file holds names of at most 65,535"):
        build_cqdb(["x" * (MAX_KEY_BYTES + 1)])


# --- file permissions --------------------------------------------------------------------


@pytest.fixture
def umask():
    """Set the process umask for one test (restored afterwards)."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda value: os.umask(value)
    os.umask(saved)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_write_gives_a_new_file_the_umask_mode(tmp_path, umask, mask, expected):
    umask(mask)
    path = tmp_path / "out.txt"
    atomic_write(path, lambda out: out.write(b"hello"))
    assert _mode(path) == expected and path.read_bytes() == b"hello"
    assert os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("old_mode", [0o644, 0o600, 0o640])
def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path, umask, old_mode):
    umask(0o077 if old_mode == 0o644 else 0o022)
    path = tmp_path / "out.txt"
    path.write_bytes(b"old")
    path.chmod(old_mode)
    atomic_write(path, lambda out: out.write(b"new"))
    assert _mode(path) == old_mode and path.read_bytes() == b"new"


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, umask):
    path = tmp_path / "out.txt"
    path.write_bytes(b"old")

    def fail(out):
        out.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, fail)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.txt"]


def _tag_output(fitted, path: Path) -> None:
    source = path.parent.parent / "input.txt"
    source.write_text("the DT\ndog NN\n\n")
    corpus = read_input(source, "conll", ["w", "pos"], layout=["w", "pos"])  # a CoNLL file names no columns: the layout does
    predictions = [Prediction("chunk", np.array(["B-NP", "I-NP"], dtype=object), np.array([0.9, 0.8]), None)]
    write_output(path, "conll", corpus, predictions, marginals=True)


SAVERS = {
    "crf": lambda fitted, path: fitted["crf"].save(path),
    "hmm": lambda fitted, path: fitted["hmm"].save(path),
    "bundle": lambda fitted, path: fitted["crf_bundle"].save(path),
    "extractor": lambda fitted, path: save_extractor(path, fitted["extractor"]),
    "crfsuite": lambda fitted, path: write_crfsuite(path, crfsuite_from_crf(fitted["crf"])),
    "tag-output": _tag_output,
}


@pytest.mark.parametrize("saver", list(SAVERS))
def test_saved_files_get_the_mode_of_an_ordinary_write(fitted, tmp_path, umask, saver):
    save = SAVERS[saver]
    path = tmp_path / "out" / "file"
    path.parent.mkdir()
    umask(0o022)
    save(fitted, path)
    assert _mode(path) == 0o644
    path.unlink()
    umask(0o077)
    save(fitted, path)
    assert _mode(path) == 0o600
    path.chmod(0o644)  # a user's shared file, overwritten under a strict umask, stays shared
    save(fitted, path)
    assert _mode(path) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["file"]


def test_a_download_gets_the_mode_of_an_ordinary_write(tmp_path, umask):
    source = tmp_path / "source.txt"
    source.write_bytes(b"data\n")
    umask(0o022)
    target = tmp_path / "data" / "train.txt"
    server, base = serving_files(tmp_path)
    try:
        _download(f"{base}/source.txt", target, timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    assert target.read_bytes() == b"data\n" and _mode(target) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["train.txt"]


def test_a_model_file_cannot_choose_where_a_later_fit_writes_or_what_it_calls(fitted, tmp_path):
    """The header's checksum is no signature: a file anyone wrote may name a CRFsuite path or a
    callback among its parameters. Loading keeps the hyperparameters and drops those."""
    path = tmp_path / "crf.npz"
    fitted["crf"].save(path)
    target = tmp_path / "chosen_by_the_file.crfsuite"

    def plant(meta: dict, arrays: dict) -> None:
        meta["params"].update(model_filename=str(target), keep_tempfiles=True, c2=0.25)

    _resave(path, "crf.CRF", plant)
    loaded = CRF.load(path)
    assert loaded.model_filename is None and loaded.keep_tempfiles is False and loaded.c2 == 0.25


def test_atomic_write_never_replaces_a_device_a_pipe_or_a_folder(tmp_path):
    """The rename would put a regular file where /dev/null or a pipe was: refused, nothing left."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(OSError, match="not a regular file"):
        atomic_write(pipe, lambda out: out.write(b"x"))
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    link = tmp_path / "to-pipe"
    link.symlink_to(pipe)
    with pytest.raises(OSError, match="not a regular file"):
        atomic_write(link, lambda out: out.write(b"x"))
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and link.is_symlink()
    with pytest.raises(IsADirectoryError, match="a folder"):
        atomic_write(tmp_path, lambda out: out.write(b"x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "to-pipe"]

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
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pipeline_helpers import make_sentence  # noqa: E402

from crf import CRF, FeatureExtractor, HMMTagger, ModelFileError, TaggerBundle, load_tagger  # noqa: E402
from crf.crfsuite_format import (  # noqa: E402
    crfsuite_from_crf,
    write_crfsuite,
)
from crf.persist import atomic_write, load_arrays, save_arrays  # noqa: E402
from pipeline.data import _download  # noqa: E402
from pipeline.featurize import EXTRACTOR_KIND, load_extractor, save_extractor  # noqa: E402
from pipeline.formats import Prediction, read_input, write_output  # noqa: E402

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
    hmm = HMMTagger().fit([[row[0] for row in s] for s in train], labels)
    return {
        "extractor": extractor,
        "crf": dict_crf,
        "hmm": hmm,
        "crf_bundle": TaggerBundle.from_crf(extractor, crf, scheme="iob2", input_columns=["w", "pos"]),
        "hmm_bundle": TaggerBundle.from_hmm(hmm, observation="w", scheme="iob2"),
    }


@pytest.fixture(scope="module")
def kinds(fitted) -> dict[str, _Kind]:
    return {
        "crf": _Kind("crf.CRF", fitted["crf"].save, CRF.load),
        "hmm": _Kind("crf.HMMTagger", fitted["hmm"].save, HMMTagger.load),
        "crf_bundle": _Kind("crf.TaggerBundle", fitted["crf_bundle"].save, load_tagger),
        "hmm_bundle": _Kind("crf.TaggerBundle", fitted["hmm_bundle"].save, load_tagger),
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
    corpus = read_input(source, "conll", ["w", "pos"])
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
    _download(source.as_uri(), target, timeout=5)
    assert target.read_bytes() == b"data\n" and _mode(target) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["train.txt"]

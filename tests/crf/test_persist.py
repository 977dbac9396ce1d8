"""The pickle-free model container: every byte that changes behaviour is checksummed."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from crf._persist import FORMAT_VERSION, ModelFileError, load_arrays, save_arrays

KIND = "test.Thing"


def _write(path, meta=None):
    arrays = {"weights": np.arange(6, dtype=np.float64).reshape(2, 3), "codes": np.array([3, 1], dtype=np.int64)}
    save_arrays(path, KIND, meta or {"classes": ["B-NP", "I-NP"], "c2": 1.0}, arrays)
    return arrays


def _rewrite_header(path, edit):
    """Rewrite the JSON header of an archive in place, keeping every array as it is."""
    with np.load(path, allow_pickle=False) as archive:
        payload = {name: archive[name] for name in archive.files}
    header = json.loads(payload["__meta__"].tobytes().decode("utf-8"))
    edit(header)
    payload["__meta__"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    with open(path, "wb") as out:
        np.savez(out, **payload)


def test_round_trip(tmp_path):
    path = tmp_path / "m.npz"
    arrays = _write(path)
    meta, loaded = load_arrays(path, KIND)
    assert meta == {"classes": ["B-NP", "I-NP"], "c2": 1.0}
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value)


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h["meta"]["classes"].reverse(),  # swapped class names: would predict wrong labels
        lambda h: h["meta"].update(c2=10.0),
        lambda h: h.update(kind="test.Other", header_sha256=h["header_sha256"]),
    ],
    ids=["swapped-classes", "edited-parameter", "edited-kind"],
)
def test_edited_header_is_rejected(tmp_path, edit):
    path = tmp_path / "m.npz"
    _write(path)
    _rewrite_header(path, edit)
    with pytest.raises(ModelFileError, match="header .* fails its checksum"):
        load_arrays(path, KIND)


def test_unknown_format_version_names_the_versions_read(tmp_path):
    path = tmp_path / "m.npz"
    _write(path)
    _rewrite_header(path, lambda h: h.update(format_version=99))
    with pytest.raises(ModelFileError, match=rf"format version 99 .* it writes {FORMAT_VERSION}"):
        load_arrays(path, KIND)


def test_edited_array_and_wrong_kind_and_non_archive(tmp_path):
    path = tmp_path / "m.npz"
    _write(path)
    with np.load(path, allow_pickle=False) as archive:
        payload = {name: archive[name] for name in archive.files}
    payload["weights"] = payload["weights"] + 1.0
    with open(path, "wb") as out:
        np.savez(out, **payload)
    with pytest.raises(ModelFileError, match="'weights' fails its checksum"):
        load_arrays(path, KIND)
    _write(path)
    with pytest.raises(ModelFileError, match="expected a 'test.Other'"):
        load_arrays(path, "test.Other")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(ModelFileError, match="not an .npz archive"):
        load_arrays(junk, KIND)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ModelFileError, match="unreadable or truncated"):
        load_arrays(truncated, KIND)
    assert zipfile.is_zipfile(path)
    glued = tmp_path / "glued.npz"  # one model file's bytes, then another's: it loaded as the second (round 34)
    glued.write_bytes(path.read_bytes() + path.read_bytes())
    with pytest.raises(ModelFileError, match="holds bytes before its archive"):
        load_arrays(glued, KIND)


def test_a_version_1_header_without_its_checksum_is_refused(tmp_path):
    """Claiming the old format must not skip the header check (edited class names would load)."""
    path = tmp_path / "m.npz"
    _write(path)

    def downgrade(header):
        header["format_version"] = 1
        del header["header_sha256"]
        header["meta"]["classes"].reverse()

    _rewrite_header(path, downgrade)
    with pytest.raises(ModelFileError, match="format version 1 is not one this code reads"):
        load_arrays(path, KIND)

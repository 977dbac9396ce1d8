"""The upstream test suites, run against this project: python-crfsuite 0.9.12's ``tests/``
against :mod:`crf.pycrfsuite`, sklearn-crfsuite 0.5.0's ``tests/test_crf.py`` against
:class:`crf.CRF` and against sklearn-crfsuite's own estimator running on :mod:`crf.pycrfsuite`.

Each suite runs in a subprocess from its source distribution (``.ci/run`` downloads them into
``.ci/cache/``; ``CRF_UPSTREAM_SDISTS`` names another folder), once against the real package
and once through a shim: a temporary package of the upstream name, first on ``PYTHONPATH``, that
re-exports this project's module. Every test that passes against the real package must pass
through the shim. The tests skip, saying why, when a source distribution is absent; without the
real package installed, every test must pass through the shim. Nothing here uses the network.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDISTS = Path(os.environ.get("CRF_UPSTREAM_SDISTS", ROOT / ".ci" / "cache"))
PYTHON_CRFSUITE = "python_crfsuite-0.9.12"  # the archive's name (python-crfsuite==0.9.12 to pip)
SKLEARN_CRFSUITE = "sklearn_crfsuite-0.5.0"

# shim packages: {package: {file: source}}
PYCRFSUITE_SHIM = {
    "pycrfsuite": {
        "__init__.py": "from crf.pycrfsuite import *  # noqa: F401,F403\n",
        "_logparser.py": "from crf.pycrfsuite import LabelScore, TrainLogParser  # noqa: F401\n",
    }
}
SKLEARN_CRFSUITE_SHIM = {"sklearn_crfsuite": {"__init__.py": "from crf import CRF, metrics  # noqa: F401\n"}}

pytestmark = pytest.mark.slow


def upstream_tests(name: str, destination: Path) -> Path:
    """The ``tests/`` folder of the source distribution ``name`` (e.g. ``python_crfsuite-0.9.12``),
    extracted into ``destination``; skips the test when the archive is absent."""
    archive = SDISTS / f"{name}.tar.gz"
    if not archive.is_file():
        requirement = name.replace("_", "-").replace("-0.", "==0.")
        pytest.skip(f"{archive} not found: .ci/run downloads it (pip download --no-deps --no-binary :all: {requirement})")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"{name}/tests/")]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12
        tar.extractall(destination, members=members, **safe)
    return destination / name / "tests"


def write_shim(folder: Path, packages: dict[str, dict[str, str]]) -> Path:
    for package, files in packages.items():
        (folder / package).mkdir(parents=True)
        for filename, source in files.items():
            (folder / package / filename).write_text(source)
    return folder


def run_suite(tests: Path, report: Path, python_path: list[Path], arguments: list[str] = ()) -> tuple[dict[str, str], str]:
    """pytest on ``tests`` (the extracted ``tests/`` or a file in it) in a subprocess whose working
    folder holds only ``tests/`` (the source distribution's own package is not there to be
    imported): ({test id: passed | failed | skipped}, its output). Fails if nothing ran."""
    root = tests.parent if tests.is_dir() else tests.parent.parent
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, python_path)), MPLBACKEND="Agg")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib"]
    command += ["--junitxml", str(report), *arguments, str(tests)]
    run = subprocess.run(
        command, cwd=root, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800
    )
    assert report.is_file(), f"pytest wrote no report\n{run.stdout[-3000:]}"
    results = outcomes(report)
    assert results, f"no tests ran\n{run.stdout[-3000:]}"
    return results, run.stdout


def outcomes(report: Path) -> dict[str, str]:
    """{test id: passed | failed | skipped} from a JUnit report (xfail counts as skipped)."""
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        results[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return results


def check(name: str, ours: dict[str, str], output: str, reference: dict[str, str] | None) -> None:
    """Every test that passes against the ``reference`` passes in ``ours`` (every test that is
    not skipped, without a reference), and none of ``ours`` fails."""
    if reference is not None:
        expected = {t for t, outcome in reference.items() if outcome == "passed"}
    else:
        expected = {t for t, outcome in ours.items() if outcome != "skipped"}
    missing = sorted(t for t in expected if ours.get(t) != "passed")
    failed = sorted(t for t, outcome in ours.items() if outcome == "failed")
    counts = {kind: sum(o == kind for o in ours.values()) for kind in ("passed", "failed", "skipped")}
    against = "no reference installed" if reference is None else f"{len(expected)} pass against the reference"
    print(f"{name}: {counts}; {against}")
    assert not missing and not failed, f"{name}: not passing: {missing or failed}\n{output[-4000:]}"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_python_crfsuite_suite_passes_against_crf_pycrfsuite(tmp_path):
    tests = upstream_tests(PYTHON_CRFSUITE, tmp_path / "sdist")
    doctests = ["--doctest-modules"]  # the log parser's tests are doctests
    reference = run_suite(tests, tmp_path / "reference.xml", [], doctests)[0] if installed("pycrfsuite") else None
    ours, output = run_suite(tests, tmp_path / "ours.xml", [write_shim(tmp_path / "shim", PYCRFSUITE_SHIM), ROOT], doctests)
    check("crf.pycrfsuite", ours, output, reference)


@pytest.fixture(scope="module")
def sklearn_crfsuite_suite(tmp_path_factory) -> tuple[Path, dict[str, str] | None]:
    """sklearn-crfsuite's ``tests/test_crf.py`` and its outcomes with the real sklearn-crfsuite
    and python-crfsuite (None when they are not installed)."""
    folder = tmp_path_factory.mktemp("sklearn-crfsuite")
    suite = upstream_tests(SKLEARN_CRFSUITE, folder / "sdist") / "test_crf.py"
    if not (installed("sklearn_crfsuite") and installed("pycrfsuite")):
        return suite, None
    return suite, run_suite(suite, folder / "reference.xml", [])[0]


def test_sklearn_crfsuite_suite_passes_against_crf(sklearn_crfsuite_suite, tmp_path):
    suite, reference = sklearn_crfsuite_suite
    ours, output = run_suite(suite, tmp_path / "ours.xml", [write_shim(tmp_path / "shim", SKLEARN_CRFSUITE_SHIM), ROOT])
    check("crf.CRF", ours, output, reference)


def test_sklearn_crfsuite_suite_passes_on_crf_pycrfsuite(sklearn_crfsuite_suite, tmp_path):
    """sklearn-crfsuite's own estimator (python-crfsuite's largest user) with crf.pycrfsuite
    in place of python-crfsuite."""
    if not installed("sklearn_crfsuite"):
        pytest.skip("sklearn-crfsuite is not installed")
    suite, reference = sklearn_crfsuite_suite
    ours, output = run_suite(suite, tmp_path / "ours.xml", [write_shim(tmp_path / "shim", PYCRFSUITE_SHIM), ROOT])
    check("sklearn-crfsuite on crf.pycrfsuite", ours, output, reference)

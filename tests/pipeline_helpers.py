"""Helpers for pipeline tests: a tiny generated chunking corpus and composed configs."""

from __future__ import annotations

import atexit
import copy
import gzip
import shutil
import tempfile
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

import pipeline  # noqa: F401  (registers the config resolvers)

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
_EMPTY_STORE: list[Path] = []  # an MLflow SQLite store with its schema and no runs, made once per process

# a toy grammar: determiner/adjective/noun runs are NPs, verbs VPs, prepositions PPs
_WORDS = {
    "DT": ["the", "a", "this"],
    "JJ": ["big", "old", "red", "new"],
    "NN": ["dog", "cat", "house", "price", "man"],
    "VB": ["runs", "sees", "buys", "likes"],
    "IN": ["in", "on", "of"],
    ".": ["."],
}


def _noun_phrase(rng):
    tags = ["DT"] + ["JJ"] * int(rng.integers(0, 3)) + ["NN"]
    return [(str(rng.choice(_WORDS[t])), t, ("B-NP" if i == 0 else "I-NP")) for i, t in enumerate(tags)]


def make_sentence(rng) -> list[tuple[str, str, str]]:
    rows = _noun_phrase(rng) + [(str(rng.choice(_WORDS["VB"])), "VB", "B-VP")] + _noun_phrase(rng)
    if rng.random() < 0.5:
        rows += [(str(rng.choice(_WORDS["IN"])), "IN", "B-PP")] + _noun_phrase(rng)
    return rows + [(".", ".", "O")]


def write_corpus(root: Path, n_train: int = 120, n_test: int = 40, seed: int = 0) -> Path:
    """CoNLL-2000-shaped files at ``root/conll2000/{train,test}.txt.gz``; returns root."""
    rng = np.random.default_rng(seed)
    folder = root / "conll2000"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        with gzip.open(folder / f"{name}.txt.gz", "wt", encoding="utf-8") as out:
            for _ in range(n):
                out.write("\n".join(" ".join(row) for row in make_sentence(rng)) + "\n\n")
    return root


def tiny_overrides(data_root: Path, output_dir: Path) -> list[str]:
    """Overrides that point the default pipeline at the tiny corpus and a temporary store."""
    return [
        f"data.root={data_root}",
        f"paths.output_dir={output_dir}",
        "data.download=false",
        "dataset.files.train.sha256=null",
        "dataset.files.test.sha256=null",
        "trainer.max_iterations=30",
        "train.dev_every=5",
    ]


def compose_config(overrides: list[str], name: str = "config"):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name=name, overrides=overrides)


def seed_store(output_dir: Path) -> Path:
    """Put an empty MLflow store at ``output_dir/mlflow.db``, where the local tracking config looks
    (``tracking=local``); returns its path. Its schema is made once per test process and copied:
    creating MLflow's tables takes seconds, a copy none. For tests that do not test store creation."""
    if not _EMPTY_STORE:
        from pipeline.tracking.lifecycle import prepare_store

        folder = Path(tempfile.mkdtemp(prefix="empty-mlflow-store-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        prepare_store(f"sqlite:///{folder / 'mlflow.db'}")
        _EMPTY_STORE.append(folder / "mlflow.db")
    output_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(_EMPTY_STORE[0], output_dir / "mlflow.db"))


class _YamlParsedOnce(types.ModuleType):
    """PyYAML as OmegaConf sees it, with ``load`` remembering what each text parsed to."""

    def __init__(self, yaml_module):
        super().__init__("yaml")
        self._yaml, self._parsed = yaml_module, {}

    def __getattr__(self, name):
        if name in ("_yaml", "_parsed"):  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self._yaml, name)

    def load(self, stream, Loader):  # noqa: N803 (PyYAML's name)
        text = stream if isinstance(stream, (str, bytes)) else stream.read()
        # OmegaConf makes its loader class anew on every call: the same class by name and definition
        key = (Loader.__module__, Loader.__qualname__, text)
        if key not in self._parsed:
            self._parsed[key] = self._yaml.load(text, Loader=Loader)
        return copy.deepcopy(self._parsed[key])


def _sharing_the_store(source, memo):
    return copy.copy(source)  # its other fields: two strings


@contextmanager
def composition_shortcuts(on: bool):
    """With ``on``, two costs that every Hydra composition (0.15-0.2 CPU-s) repeats are cut in this
    process; without, the plain Hydra and OmegaConf (as a test that compares the two needs):

    - each config file is parsed from YAML once: OmegaConf's parse (``OmegaConf.load``, which Hydra
      calls for each file of each composition) gets a copy of the Python objects the same text parsed
      to before, then builds its config from them as usual. The key is the text itself, so an edited
      or new file parses afresh; Hydra's search, defaults, merging and overrides run every time.
    - the copy of the config repository that each composition makes shares the one ``ConfigStore``
      instead of deep-copying it (about 12 ms): what a new repository holds (``ConfigStore.instance()``),
      and the store hands out copies of its configs (``ConfigStore.load``), so nothing can change it.

    The settings before are restored on exit."""
    import omegaconf.omegaconf as omegaconf_module
    from hydra._internal.core_plugins.structured_config_source import StructuredConfigSource

    saved_yaml, saved_copy = omegaconf_module.yaml, StructuredConfigSource.__dict__.get("__deepcopy__")
    plain = saved_yaml._yaml if isinstance(saved_yaml, _YamlParsedOnce) else saved_yaml
    omegaconf_module.yaml = (saved_yaml if plain is not saved_yaml else _YamlParsedOnce(plain)) if on else plain
    if on:
        StructuredConfigSource.__deepcopy__ = _sharing_the_store
    elif saved_copy is not None:
        del StructuredConfigSource.__deepcopy__
    try:
        yield
    finally:
        omegaconf_module.yaml = saved_yaml
        if saved_copy is not None:
            StructuredConfigSource.__deepcopy__ = saved_copy
        elif "__deepcopy__" in StructuredConfigSource.__dict__:
            del StructuredConfigSource.__deepcopy__


def refused_line(call, caplog) -> str:
    """The one line (ERROR, and no WARNING beside it) that ``call()`` logs as it exits with code 2."""
    import logging

    import pytest

    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as ended:
        call()
    lines = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
    assert ended.value.code == 2 and len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


def serving_files(folder: Path, authorization: str | None = None):
    """A loopback HTTP server of ``folder``'s files (answering 401 to a request without the
    ``Authorization`` header ``authorization``, when given): (the server, its base URL); the caller
    shuts it down."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def do_GET(self):
            if authorization is not None and self.headers.get("Authorization") != authorization:
                self.send_error(401, "Unauthorized")
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"

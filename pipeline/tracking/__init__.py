"""MLflow set-up shared by every entry point: where the store is, and what a run records.

Store resolution: ``MLFLOW_TRACKING_URI`` when set, else ``tracking.uri`` from the config
(``tracking=server`` points at a tracking server; both set to different stores is refused), else a
SQLite store at an absolute path under the output folder, ``sqlite:///<outputs>/mlflow.db`` with
artifacts beside it. An HTTP store is checked before any work starts, so an unreachable server
fails at once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import logging
import os
import sqlite3
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
import pandas as pd  # noqa: E402
from mlflow.data.dataset_source_registry import resolve_dataset_source  # noqa: E402
from mlflow.data.meta_dataset import MetaDataset  # noqa: E402
from mlflow.models import ModelSignature  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow.types import ColSpec, Schema  # noqa: E402

from pipeline.engine.store import CACHE_SOURCE_TAG, MODEL_URI_TAG, SWEEP_PARENT_VARIABLE, flatten  # noqa: E402
from pipeline.models import SWEEP_ID_VARIABLE  # noqa: E402
from pipeline.report import authority_problem, redacted, redacted_values, request_with_credentials, shown_url  # noqa: E402
from pipeline.tracking import (
    champion,
    lifecycle,  # noqa: E402
)
from pipeline.tracking.lifecycle import sqlite_path  # noqa: E402

log = logging.getLogger(__name__)
ARTIFACTS = "mlartifacts"  # a local (SQLite) store's artifact folder, beside its database

# SWEEP_PARENT_VARIABLE: how a sweep's launching process tells its jobs (in other processes) where to
# attach their runs; it, the engine's tag names and ``flatten`` are defined by the engine's run store
__all__ = ["CACHE_SOURCE_TAG", "MODEL_URI_TAG", "SWEEP_ID_VARIABLE", "SWEEP_PARENT_VARIABLE", "flatten"]
# MLflow's own tag for the source commit; its automatic value needs the entry script inside the
# checkout (not so under pytest, nor for runs created with MlflowClient), so we set it ourselves
GIT_COMMIT_TAG = "mlflow.source.git.commit"


class TrackingUnavailable(RuntimeError):
    """The configured tracking server cannot be reached."""


def output_root(cfg: Mapping) -> Path:
    return Path(cfg["paths"]["output_dir"]).absolute()


def tracking_uri(cfg: Mapping) -> str:
    """The tracking store: ``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else the SQLite store
    under the output folder. Both set to different stores is refused (SettingsError, one line):
    which one a run or a ``models:/`` lookup reads must never be left to a rule the user cannot see."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    configured = cfg["tracking"].get("uri")
    if env and configured and str(configured) != env:
        from pipeline.engine.validate import SettingsError

        raise SettingsError(
            f"MLFLOW_TRACKING_URI={shown_url(env)} and tracking.uri={shown_url(str(configured))} name two stores: unset the "
            "variable or drop the setting"
        )
    if env:
        return env
    if configured:
        return str(configured)
    return f"sqlite:///{output_root(cfg) / 'mlflow.db'}"


def registry_uri(cfg: Mapping) -> str:
    """The Model Registry's store: ``MLFLOW_REGISTRY_URI`` when set, else the tracking store (as the
    pipeline registers models: MLflow's registry follows the tracking URI unless that variable is set).
    The variable naming another store than ``tracking.uri`` is refused (SettingsError, one line), as
    :func:`tracking_uri` refuses ``MLFLOW_TRACKING_URI``: a setting names the store of both."""
    env = os.environ.get("MLFLOW_REGISTRY_URI")
    configured = cfg["tracking"].get("uri")
    if env and configured and str(configured) != env:
        from pipeline.engine.validate import SettingsError

        raise SettingsError(
            f"MLFLOW_REGISTRY_URI={shown_url(env)} and tracking.uri={shown_url(str(configured))} name two stores for the "
            "Model Registry: unset the variable or drop the setting"
        )
    return env or tracking_uri(cfg)


STORE_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first bytes of every SQLite database file
# what names the tracking store, and the registry's when it is another (messages say which to fix)
TRACKING_SETTING = "tracking.uri or MLFLOW_TRACKING_URI"
REGISTRY_SETTING = "MLFLOW_REGISTRY_URI"


def store_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be the pipeline's tracking store, in a few words, or None: a scheme MLflow
    has no store for, or an existing SQLite path that is not an MLflow store (another kind of file,
    or another program's database, an Optuna study's say, into which MLflow would write its tables).
    An empty file or database is a new store."""
    if uri in ("databricks", "databricks-uc", "uc"):
        return None
    written = uri.split(":", 1)[0] if "://" in uri else ""
    scheme = written.split("+", 1)[0]
    if scheme in ("", "file"):  # a folder of runs (a bare path too)
        return (
            "MLflow 3 no longer opens a file store (a folder of runs); name a database, e.g. sqlite:///<folder>/mlflow.db "
            "(`mlflow migrate-filestore` converts an old one)"
        )
    if written != written.lower():  # SQLAlchemy knows no upper-case dialect
        return f"write the scheme {written!r} in lower case"
    if scheme not in STORE_SCHEMES:
        return f"MLflow has no tracking store for the scheme {scheme!r} (sqlite:///, http(s)://, postgresql:// ...)"
    if scheme in ("http", "https"):
        problem = authority_problem(uri)
        if problem is not None:
            return f"not a server URL: {problem}"
        parts = urllib.parse.urlsplit(uri)
        if parts.query or parts.fragment:  # MLflow appends its API paths to the URL as written
            return "a tracking server URL takes no query or fragment (a token goes in MLFLOW_TRACKING_TOKEN)"
    if scheme == "sqlite" and sqlite_path(uri) is None:
        return "an in-memory SQLite database, whose runs and models vanish with the process; name a file (sqlite:///<path>)"
    if scheme in ("postgresql", "mysql", "mssql"):
        try:  # the database driver the URI names (psycopg2 by default for postgresql://), loaded as MLflow would
            import sqlalchemy

            sqlalchemy.engine.make_url(uri).get_dialect().import_dbapi()
        except ImportError as error:
            return f"its database driver is not installed ({error}); install it, or name one that is (e.g. postgresql+psycopg://)"
        except Exception as error:  # noqa: BLE001 - SQLAlchemy's URL errors come as several types
            return f"not a database URL SQLAlchemy reads ({type(error).__name__}: {error})"
    database = sqlite_path(uri)
    if database is None:
        return None
    # the file as it will be once the store's folder is made: ``new/../x.db`` is ``x.db`` then,
    # though the system cannot walk ``..`` out of a folder that does not exist yet
    database = Path(os.path.realpath(database))
    if not database.is_file() or database.stat().st_size == 0:
        return None
    try:
        tables, versions = sqlite_contents(database)
    except ValueError as error:
        return f"{error}; name an MLflow store or a new file"
    if tables and not (versions and versions <= mlflow_schema_versions()):  # MLflow's schema: its migrations' revisions
        return (
            f"{database} is another program's database (tables {', '.join(sorted(tables)[:4])}, ...; an Optuna study's "
            "storage, say), not an MLflow store, and MLflow would write its tables into it; name a store or a new file"
        )
    return None


def sqlite_contents(database: Path) -> tuple[set[str], set[str]]:
    """The table names and Alembic revisions (``alembic_version``: MLflow's and Optuna's schema
    versions) of the existing SQLite file ``database``, read without writing. Raises ValueError
    (naming the file) when it is no SQLite database or cannot be read as one."""
    with open(database, "rb") as file:
        if file.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise ValueError(f"{database} is not an SQLite database")
    try:
        with contextlib.closing(sqlite3.connect(f"{database.absolute().as_uri()}?mode=ro", uri=True)) as connection:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            versions = (
                {row[0] for row in connection.execute("SELECT version_num FROM alembic_version")}
                if "alembic_version" in tables
                else set()
            )
    except sqlite3.Error as error:
        raise ValueError(f"{database} cannot be read as an SQLite database ({error})") from None
    return tables, versions


@functools.cache
def stores_problem(store: str, registry: str | None = None, read_registry: bool = False) -> str | None:
    """One line (``bad setting: ...``) on why the tracking ``store`` or the ``registry`` store
    (None: the tracking store) cannot be used, before a run opens: a SQLite path that cannot be a
    database file (a folder, a dangling link), a scheme MLflow has no store for, another program's
    database (:func:`store_problem`), with ``read_registry`` (a command that reads a model from the
    registry) a SQLite registry that does not exist yet, or a server or database that does not
    answer (:func:`check_reachable`); None when both can be used."""
    from crf.io import writable_target

    stores = {store: ("tracking store", TRACKING_SETTING)}
    if registry is not None and registry != store:
        stores = {registry: ("registry store", REGISTRY_SETTING), **stores}
    for uri, (what, setting) in stores.items():
        database = sqlite_path(uri)
        if database is not None:
            try:
                writable_target(database)  # SQLite cannot open a folder or a dangling link (MLflow retries for minutes)
            except OSError as error:
                return f"bad setting: the {what} {shown_url(uri)}: {str(error).removesuffix('; not written')}; name a file"
        problem = store_problem(uri)
        if problem:
            return f"bad setting: the {what} {shown_url(uri)} ({setting}): {problem}"
    read = registry or store
    database = sqlite_path(read)
    if read_registry and database is not None and (not database.is_file() or database.stat().st_size == 0):
        what, setting = stores[read]
        return f"bad setting: the {what} {shown_url(read)} ({setting}): no MLflow store there to read a model from"
    for uri, (_, setting) in stores.items():  # a server or database that does not answer
        try:
            check_reachable(uri, setting=setting)
        except TrackingUnavailable as error:
            return str(error)
    return None


def mlflow_schema_versions() -> frozenset[str]:
    """The schema versions of MLflow's SQL stores (the revisions of its database migrations)."""
    from mlflow.store.db_migrations import versions

    return frozenset(path.name.split("_", 1)[0] for path in Path(versions.__path__[0]).glob("[0-9a-f]*_*.py"))


def check_store_exists(uri: str, setting: str = TRACKING_SETTING) -> None:
    """A SQLite store must already exist to be read: SQLAlchemy would otherwise create an empty
    ``mlflow.db`` (a stray file, and a confusing "not found" afterwards). Raise FileNotFoundError
    naming the file and how the pipeline chooses it (``setting``: the tracking store's settings or
    :data:`REGISTRY_SETTING`); check an HTTP store with :func:`check_reachable`."""
    path = sqlite_path(uri)
    if path is not None and (not path.is_file() or path.stat().st_size == 0):  # an empty file holds no model to read
        if setting == REGISTRY_SETTING:
            raise FileNotFoundError(f"no MLflow store at {path} ({shown_url(uri)}, {REGISTRY_SETTING})")
        raise FileNotFoundError(
            f"no MLflow store at {path} ({shown_url(uri)}). The pipeline writes its store under paths.output_dir "
            "(default ./outputs of the folder it ran in): run this command there, or name the store with "
            "paths.output_dir=<that folder>, tracking.uri=<its URI> or MLFLOW_TRACKING_URI"
        )
    problem = store_problem(uri)
    if problem is not None:  # MLflow would write its tables into another program's database as it opened it
        raise TrackingUnavailable(f"the store {shown_url(uri)}: {problem}")
    check_reachable(uri, setting=setting)


@contextlib.contextmanager
def using_store(tracking: str, registry: str | None = None) -> Iterator[None]:
    """Inside the block MLflow's fluent API reads ``tracking`` and the Model Registry ``registry``
    (default: ``tracking``): ``models:/`` and ``runs:/`` URIs resolve there and nowhere else (left
    unset, the registry falls back to ``sqlite:///mlflow.db`` in the current folder, creating it).
    The previous URIs and the ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI`` variables (which
    MLflow's setters export) are restored afterwards."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    environment = {name: os.environ.get(name) for name in names}
    before = (getattr(tracking_utils, "_tracking_uri", None), getattr(registry_utils, "_registry_uri", None))
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(registry or tracking)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_reachable(uri: str, timeout: float = 5.0, setting: str = TRACKING_SETTING) -> None:
    """Check that a remote store answers: for an HTTP store GET /health (with the user and
    password the URL holds, as basic authentication), for a database server a connection (given
    ``timeout`` seconds); raise TrackingUnavailable, in one line with the password as ``***`` and
    naming the ``setting`` that chose the store, if it does not. A local store is not checked."""
    if uri.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(uri)
        request = request_with_credentials(urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/health")))
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if response.status != 200:
                    raise TrackingUnavailable(f"MLflow tracking server {redacted(uri)} answered {response.status} on /health")
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as err:
            raise TrackingUnavailable(
                f"MLflow tracking server {redacted(uri)} is not reachable ({redacted(str(getattr(err, 'reason', err)))}). "
                f"Start it (see README: mlflow server ...) or fix {setting}"
                + (" (unset, the local store is used)." if setting == TRACKING_SETTING else ".")
            ) from None
        return
    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    if scheme not in ("postgresql", "mysql"):
        return
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": max(1, round(timeout))})
    except Exception:  # noqa: BLE001 - a URL or driver problem: store_problem names those
        return
    try:
        with engine.connect():
            pass
    except Exception as error:  # noqa: BLE001 - SQLAlchemy wraps each driver's own errors
        first = redacted((str(getattr(error, "orig", None) or error).strip().splitlines() or [""])[0])[:300]
        raise TrackingUnavailable(
            f"the database server of {redacted(uri)} cannot be reached ({type(error).__name__}: {first}); start it or "
            f"fix {setting}"
        ) from None
    finally:
        engine.dispose()


def setup(cfg: Mapping) -> str:
    """Point MLflow at the configured store and experiment; return the tracking URI."""
    uri = tracking_uri(cfg)
    check_reachable(uri)
    database = sqlite_path(uri)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    lifecycle.prepare_store(uri)  # a fresh SQLite store's schema, under a lock
    if redacted(uri) != uri:  # MLflow prints each run's page with the store's URL as given, password and all
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    # MLflow also exports the URI as MLFLOW_TRACKING_URI, which would then win over the next config
    # composed in this process (tests, notebooks): keep the variable as the user left it
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
    name = cfg["tracking"]["experiment"]
    client = MlflowClient(uri)
    if client.get_experiment_by_name(name) is None:
        location = None
        if database is not None:
            location = (output_root(cfg) / ARTIFACTS).as_uri()
        try:
            client.create_experiment(name, artifact_location=location)
        except mlflow.exceptions.MlflowException:
            pass  # created meanwhile by a parallel job
    mlflow.set_experiment(name)
    lifecycle.mark_stranded(client)  # runs left RUNNING by processes that are gone
    return uri


def git_commit() -> str:
    """The project's current git commit (``unknown`` outside a checkout)."""
    try:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def source_tags() -> dict[str, str]:
    """MLflow's standard source-commit tag, when the project is a git checkout, and the process that
    runs it (``lifecycle.owner_tags``: how a later start recognises a run this process left RUNNING)."""
    commit = git_commit()
    return {**({GIT_COMMIT_TAG: commit} if commit != "unknown" else {}), **lifecycle.owner_tags()}


def shown_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as a run records them: a URL's user and password as ``***`` (a dataset's download
    URL, a store's URL may hold them)."""
    return redacted_values(dict(params))


def log_params(params: Mapping[str, Any]) -> None:
    """Log params (``log_batch`` splits them into MLflow's per-call limits itself), as
    :func:`shown_params` shows them."""
    mlflow.log_params(shown_params(params))


def store_hint(uri: str, run_id: str, experiment_id: str) -> str:
    """How a user opens ``run_id``'s page: for a local store the ``mlflow ui`` command and the page's
    URL on its default port; else the page's URL on the server."""
    uri = redacted(uri)  # a printed line: no password
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"mlflow ui --backend-store-uri {uri}, then http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}"


def files_run(client: MlflowClient, run: Any) -> Any:
    """The run holding ``run``'s files: a stage run that reused a cached result logged none and
    names the run that computed it (tag ``cache_source_run_id``); else ``run`` itself."""
    source = run.data.tags.get(CACHE_SOURCE_TAG)
    return client.get_run(source) if source else run


def stage_run(client: MlflowClient, pipeline_run: Any, stage: str) -> Any | None:
    """The ``stage`` run nested in a pipeline run (None when it has none)."""
    found = client.search_runs(
        [pipeline_run.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{pipeline_run.info.run_id}' and tags.stage = '{stage}'",
        max_results=1,
    )
    return found[0] if found else None


def handoff_lines(client: MlflowClient, uri: str, pipeline_run_id: str, stage: str, bundle: Path) -> list[str]:
    """How to use a finished pipeline run's model elsewhere, each line a URI that
    ``mlflow.pyfunc.load_model`` accepts (in that store) or a path.

    Parameters
    ----------
    client : MlflowClient
        A client of the store ``uri``.
    uri : str
        The tracking URI (named in the tag command, so it works from any folder).
    pipeline_run_id : str
        The finished pipeline run (its tag ``model_uri`` names the logged model).
    stage : str
        The stage that logged the model (``train``).
    bundle : Path
        The bundle file in the stage cache.

    Returns
    -------
    list of str
        ``model: models:/m-<id>`` (and the registered version), ``train run: runs:/<id>/model`` of
        the stage run the model was logged in (a cached stage run's: the run that computed it; the
        pipeline run's own id does not load: its model was logged in that stage run),
        ``bundle: <path>`` and ``tag: python -m pipeline.tag ...``.
    """
    run = client.get_run(pipeline_run_id)
    model_uri = run.data.tags.get(MODEL_URI_TAG)
    lines = []
    if model_uri:
        registered = run.data.tags.get("registered_model")
        lines.append(f"model: {model_uri}" + (f" (registered as {registered})" if registered else ""))
        child = stage_run(client, run, stage)
        if child is not None:
            lines.append(f"{stage} run: runs:/{files_run(client, child).info.run_id}/{MODEL_NAME}")
    lines.append(f"bundle: {bundle}")
    model = model_uri or str(bundle)
    lines.append(f"tag: python -m pipeline.tag model={model} input=<file> output=<file> tracking.uri={redacted(uri)}")
    return lines


def link_model(client: MlflowClient, run_id: str, model_uri: str) -> None:
    """Link the logged model ``models:/m-<id>`` to ``run_id`` as one of its outputs: MLflow's run page
    lists a run's output models under "Logged models" (a pipeline run's model is logged in its
    train stage run, or in an earlier run when that stage came from the cache). Other URIs: nothing."""
    from mlflow.entities import LoggedModelOutput

    if model_uri.startswith("models:/m-") and "/" not in model_uri[len("models:/") :]:
        client.log_outputs(run_id, [LoggedModelOutput(model_uri[len("models:/") :], step=0)])


NOTE_TAG = "mlflow.note.content"  # MLflow's run description (markdown), shown on the run page


def run_note(scores: Mapping[str, float], handoff: Sequence[str], cached: int, stages: int) -> str:
    """A pipeline run's description: its headline scores, how many stages came from the cache and
    how to use its model (:func:`handoff_lines`, code-formatted).

    Parameters
    ----------
    scores : mapping of str to float
        The headline scores (``dev_f1``, ``test_f1`` or accuracies, in percent).
    handoff : sequence of str
        ``name: value`` lines.
    cached, stages : int
        Stages that came from the cache, and all stages run.

    Returns
    -------
    str
        Markdown.
    """
    head = " · ".join(f"{k} **{v:.2f}**" for k, v in scores.items()) or "no scores"
    reuse = "every stage from the cache" if stages and cached == stages else f"{cached} of {stages} stages from the cache"
    items = dict(line.split(": ", 1) for line in handoff if ": " in line)
    lines = [f"{head} ({reuse})", ""]
    if "model" in items:
        model = items["model"].split()[0]
        lines.append(f"- model: `{items['model']}`")
        lines.append(f'- in Python (this store as the tracking URI): `mlflow.pyfunc.load_model("{model}")`')
    # the shown first: the tag command, then where the files are
    lines += [f"- {name}: `{value}`" for name, value in sorted(items.items(), key=lambda i: i[0] != "tag") if name != "model"]
    return "\n".join(lines)


# the models-from-code file of the bundle's MLflow Model, and the library it runs (shipped as code)
MODEL_CODE = Path(__file__).resolve().with_name("mlflow_model.py")
LIBRARY = Path(__file__).resolve().parents[2] / "crf"
MODEL_NAME = "model"  # the logged model's name inside its run
DIGEST_CHARS = 36  # the longest dataset digest MLflow stores
LOG_INPUT_ATTEMPTS = 3


def bundle_signature(input_columns: Sequence[str], chunked: bool) -> ModelSignature:
    """Outputs: label, marginal and, for chunk/entity schemes, segment_confidence (null outside a
    chunk). No input schema: the model checks its input itself and answers a bad request with a
    one-line reason (see ``pipeline/tracking/mlflow_model.py``); the input columns are in the model's
    metadata (:func:`bundle_metadata`) and its input example."""
    outputs = [ColSpec("string", "label"), ColSpec("double", "marginal")]
    if chunked:
        outputs.append(ColSpec("double", "segment_confidence", required=False))
    return ModelSignature(inputs=None, outputs=Schema(outputs))


def bundle_metadata(input_columns: Sequence[str]) -> dict[str, Any]:
    """What the logged model reads, recorded in its MLmodel file: the sentence id column and the
    token columns (strings), one row per token."""
    return {"sentence_column": "sentence", "input_columns": list(input_columns)}


def requirements() -> list[str]:
    """The pinned packages the served model imports (the ``crf`` package itself is shipped as code)."""
    return list(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[str, ...]:
    """What :func:`requirements` pins, read once per process (a search of every installed
    package's metadata each time: about 0.1 s)."""
    from importlib.metadata import version

    return tuple(f"{name}=={version(name)}" for name in ("mlflow", "numpy", "scipy", "pandas"))


def log_bundle_model(bundle_path: Path, example: Callable[[list[str]], pd.DataFrame | None] = lambda columns: None) -> str:
    """Log the model bundle at ``bundle_path`` as a pyfunc MLflow Model in the active run; its URI.

    Models-from-code: ``pipeline/tracking/mlflow_model.py`` is the model, the bundle its artifact,
    the ``crf`` package its code (and the module of a model kind defined elsewhere, imported when
    the model loads); nothing is pickled. ``example(input_columns)``: a few long-form
    input rows (``sentence`` and the bundle's input columns), or None.
    """
    import sys

    from crf.bundle import load_bundle

    bundle = load_bundle(bundle_path)
    code, config = [str(LIBRARY)], {}
    module = type(bundle.part).__module__
    # a model kind defined outside the library: its module goes along, imported by its file's name
    # (so a kind's module must import as a top-level module, as tests/toy_kind.py does)
    if module.split(".")[0] != "crf":
        code.append(str(Path(sys.modules[module].__file__)))
        config["kind_modules"] = [module.rsplit(".", 1)[-1]]  # imported by that name from the model's code
    info = mlflow.pyfunc.log_model(
        name=MODEL_NAME,
        python_model=str(MODEL_CODE),
        artifacts={"bundle": str(bundle_path)},
        code_paths=code,
        model_config=config or None,
        signature=bundle_signature(bundle.input_columns, bundle.scheme != "none"),
        metadata=bundle_metadata(bundle.input_columns),
        input_example=example(list(bundle.input_columns)),
        pip_requirements=requirements(),
    )
    return info.model_uri


def latest_stage_run(stage: str, key: str, condition: str) -> Any | None:
    """The latest FINISHED run of ``stage`` (in the active run's experiment) with the cache key
    ``key`` that also matches ``condition`` (an MLflow filter), or None (also without an active run)."""
    active = mlflow.active_run()
    if active is None:
        return None
    found = MlflowClient().search_runs(
        [active.info.experiment_id],
        filter_string=f"tags.cache_key = '{key}' and tags.stage = '{stage}' and {condition} and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0] if found else None


def cache_source_run(stage: str, key: str) -> Any | None:
    """The finished run of ``stage`` that computed the cache entry ``key`` (its tag ``cache=miss``), or None."""
    return latest_stage_run(stage, key, "tags.cache = 'miss'")


def log_dataset(name: str, files: Mapping[str, Path], file_hashes: Mapping[str, str]) -> None:
    """Record the dataset as the active run's input: ``name``; the SHA-256 of its files' hashes (the
    file's own for a one-file dataset) as the input tag ``sha256`` and, cut to MLflow's 36
    characters, as the digest; the source: the folder (or file) it was read from."""
    digests = [file_hashes[k] for k in sorted(file_hashes)]
    digest = digests[0] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()
    paths = [Path(p).absolute() for p in files.values()]
    where = paths[0] if len(paths) == 1 else Path(os.path.commonpath(paths))
    with warnings.catch_warnings():  # MLflow registers its local-file source twice and says so
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(where.as_uri())
    dataset = MetaDataset(source, name=name, digest=digest[:DIGEST_CHARS])
    # MLflow looks the dataset up and then inserts it: two sweep jobs logging the same dataset at
    # the same moment both insert, and the store's unique key (experiment, name, digest) fails the
    # second. Its transaction is rolled back, so logging again finds the first job's row.
    for attempt in range(LOG_INPUT_ATTEMPTS):
        try:
            mlflow.log_input(dataset, context="training", tags={"sha256": digest})
            return
        except mlflow.exceptions.MlflowException as error:
            if attempt == LOG_INPUT_ATTEMPTS - 1:
                raise
            log.info("logging the dataset input failed (%s); trying again", str(error)[:200])
            time.sleep(0.2 * (attempt + 1))


def register_model(
    model_uri: str,
    name: str,
    alias: str | None,
    tags: Mapping[str, Any],
    standing: champion.Standing | None = None,
    force_alias: bool = False,
    force_declined: str = "",
) -> tuple[Any, bool]:
    """Register ``model_uri`` as a new version of the registered model ``name`` (created if new).

    Parameters
    ----------
    model_uri, name : the logged model and the registered model it becomes a version of.
    alias : e.g. ``champion``: moved to the new version only by the rule of
        :mod:`pipeline.tracking.champion` (at least as good as the holder by the same metric on
        the same evaluation data; a version without a standing never takes it by itself), or
        always with ``force_alias``.
    tags : version tags (scores, run id, dataset, ``data.train_fraction``, ``data.final_fit``,
        ...); the standing's tags and the alias decision are added. A version without a standing
        is tagged :data:`~pipeline.tracking.champion.UNSCORED_TAG` (why it has none: the value
        ``tags`` gives under that key, else ``no score``).
    standing : what the version was chosen by (None: nothing to compare).
    force_declined : why ``registry.force_alias=true``, though set, does not apply to this version
        (its alias decision says so).

    Returns
    -------
    (ModelVersion, whether the alias moved to it)
    """
    client = MlflowClient()
    all_tags = {k: str(v) for k, v in tags.items()}
    unscored = ""
    if standing is not None:
        all_tags.pop(champion.UNSCORED_TAG, None)
        all_tags |= standing.tags()
    else:
        unscored = all_tags.setdefault(champion.UNSCORED_TAG, "no score")
    version = mlflow.register_model(model_uri, name, tags=all_tags)
    if not alias:
        return version, False
    moved, reason = champion.settle_alias(
        client, name, alias, version.version, standing, force_alias, mlflow.get_registry_uri(), unscored, force_declined
    )
    (log.info if moved else log.warning)("%s version %s, alias %s: %s", name, version.version, alias, reason)
    return version, moved

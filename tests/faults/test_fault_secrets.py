"""A URL's password never reaches a log line, a run parameter or a results file, and a remote store
that does not answer is one line before anything runs (round 18: a tracking server's URL with a
password was printed whole in a 19-line traceback; a database server that did not answer made
MLflow retry for 107 s, then a 198-line traceback)."""

from __future__ import annotations

import base64
import http.server
import re
import threading

import pytest

from pipeline.report import redacted, shown_url
from pipeline.tracking import TrackingUnavailable, check_reachable


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:s3cret@127.0.0.1:1/x.gz", "http://***@127.0.0.1:1/x.gz"),
        ("http://:s3cret@host/x", "http://***@host/x"),  # no user name
        ("https://s3cret@host/x", "https://***@host/x"),  # an access token as the user name
        ("https://T0KEN:x-oauth-basic@github.com/o/r", "https://***@github.com/o/r"),  # a token, then a placeholder
        ("https://sk_live_K3Y:@api.example.org/v1", "https://***@api.example.org/v1"),  # an API key, empty password
        ("http://u:s3/cret@host:1/t.gz", "http://***@host:1/t.gz"),  # a raw "/" in the password
        ("http://u:s3@cret@host:1/t.gz", "http://***@host:1/t.gz"),  # a raw "@" in it
        ("postgresql+psycopg://u:s3cret@db:5432/optuna", "postgresql+psycopg://***@db:5432/optuna"),
        ("http://h/t.gz?token=s3cret", "http://h/t.gz?token=***"),  # a secret in the query
        ("https://h/t.gz?v=2&X-Amz-Signature=s3cret&x=1", "https://h/t.gz?v=2&X-Amz-Signature=***&x=1"),
        ("https://h/t.gz?api_key=s3cret#part", "https://h/t.gz?api_key=***#part"),
        ("https://h/t.gz?page=2&lang=en", "https://h/t.gz?page=2&lang=en"),  # no secret named
        ("http://u:horse battery@h:1/t.gz", "http://***@h:1/t.gz"),  # a space in the password (round 22)
        ("http://u:horse\u00a0battery@h:1/t.gz", "http://***@h:1/t.gz"),  # a no-break space (round 23)
        ("postgresql://u:a\u3000b@h:1/db", "postgresql://***@h:1/db"),  # an ideographic space
        ("View run at: http://u:a b@h:1/#/runs/1 ok", "View run at: http://***@h:1/#/runs/1 ok"),
        ("http://h/t#access_token=s3cret&x=1", "http://h/t#access_token=***&x=1"),  # a token in the fragment
        # other names of a password or token, and a name percent-encoded (the server decodes it: "token")
        (
            "http://h/t?pass=a1&pw=b2&session=c3&jwt=d4&%74oken=e5&v=1",
            "http://h/t?pass=***&pw=***&session=***&jwt=***&%74oken=***&v=1",
        ),
        ("sqlite:////tmp/a@b/mlflow.db", "sqlite:////tmp/a@b/mlflow.db"),  # a path, no secret
        ("see http://host/x and write to a@b.org", "see http://***@b.org"),  # read as a spaced password: over-hidden
        ("http://host/x then http://h/y", "http://host/x then http://h/y"),  # no "@": nothing to hide
        ("http://u:horse Batt/Stap1e@h:1/t.gz", "http://***@h:1/t.gz"),  # a space and a "/" (round 24)
        ("http://u:horse\nStap1e@h:1/t.gz", "http://***@h:1/t.gz"),  # a line break (an environment variable)
        ("store http://u:horse Batt\nStap1e@h:1 (x)", "store http://***@h:1 (x)"),
        ("see http://host/x\n  email: a@b.org", "see http://***@b.org"),  # over-hidden: as a broken password (round 40)
        ("https://alice:HUN/TER2\nXYZ@h/x", "https://***@h/x"),  # a raw "/" or "@", then a line break (round 40)
        ("https://alice:HUN@TER2\r\nXYZ@h/x", "https://***@h/x"),
        ("http://h/t?token=abc;SeCr3t&v=1", "http://h/t?token=***&v=1"),  # a ";" in the value: sent as part of it (round 25)
        ("http://h/t?v=1;token=SeCr3t&w=2", "http://h/t?v=1;token=***&w=2"),  # a ";" between parameters
        ("http://h/t?v=1;w=2", "http://h/t?v=1;w=2"),
        # a path-only URL (no user) quoted beside a store's URL with a secret: both stay readable (round 32)
        ("A=sqlite:////tmp/t.db and B=http://u:s3cret@h:9 name two", "A=sqlite:////tmp/t.db and B=http://***@h:9 name two"),
        (
            "the store sqlite:////tmp/a.db, not http://tok@h:5000/ here",
            "the store sqlite:////tmp/a.db, not http://***@h:5000/ here",
        ),
        # a "/" too many before the user: no host to send it to, but a secret all the same (round 33)
        ("http:///u:s3cret@127.0.0.1:9", "http:///***@127.0.0.1:9"),
        ("store http:///u:horse battery@h:1 (x)", "store http:///***@h:1 (x)"),
        ("postgresql:////u:s3cret@db/x", "postgresql:////***@db/x"),
        ("sqlite+pysqlite:////tmp/a@b/mlflow.db", "sqlite+pysqlite:////tmp/a@b/mlflow.db"),  # paths, no user
        ("file:///tmp/a@b/mlruns", "file:///tmp/a@b/mlruns"),
        # a user and password where SQLite's and a file's URLs hold a host (round 34: shown in clear)
        ("sqlite://u:s3cret@localhost/x.db", "sqlite://***@localhost/x.db"),
        ("sqlite+pysqlite://u:s3cret@h/x.db", "sqlite+pysqlite://***@h/x.db"),
        ("file://u:s3cret@host/mlruns", "file://***@host/mlruns"),
        # a server's URL with fewer slashes (round 34)
        ("http:/u:s3cret@127.0.0.1:9", "http:/***@127.0.0.1:9"),
        ("http:u:s3cret@127.0.0.1:9", "http:***@127.0.0.1:9"),
        ("postgresql+psycopg:u:s3cret@db/x", "postgresql+psycopg:***@db/x"),
        ("note: write to a@b.org", "note: write to a@b.org"),  # prose with a colon: no scheme
        # schemes in capitals, and the short form of any scheme (round 35)
        ("HTTP:u:s3cret@h", "HTTP:***@h"),
        ("HTTPS:/u:s3cret@h", "HTTPS:/***@h"),
        ("POSTGRESQL:u:s3cret@db", "POSTGRESQL:***@db"),
        ("HTTP://u:s3cret@h/x", "HTTP://***@h/x"),
        ("SQLITE:////tmp/a@b/mlflow.db", "SQLITE:////tmp/a@b/mlflow.db"),
        ("mlflow-artifacts:u:s3cret@h", "mlflow-artifacts:***@h"),
        ("s3:/u:s3cret@bucket", "s3:/***@bucket"),
        ("file:/tmp/a@b/mlruns", "file:/tmp/a@b/mlruns"),
    ],
)
def test_the_secret_of_every_url_is_hidden(url, shown):
    assert redacted(url) == shown
    if len(url.split()) == 1:  # a whole URL, as a message quotes it
        assert shown_url(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [  # a whole URL written with fewer slashes, its password holding a space or a "/" (round 36)
        ("https:/u:horse battery@h:1/x", "https:/***@h:1/x"),
        ("postgresql:u:a/b@db/x", "postgresql:***@db/x"),
        ("HTTP:u:a\tb@h", "HTTP:***@h"),
        ("sqlite:/tmp/a@b.db", "sqlite:/tmp/a@b.db"),  # a path
        (" https:u:SEK RET@h", "https:***@h"),  # padded or quoted, as a variable may hold it (round 37)
        ("' https://u:SEK RET@h/x'", "https://***@h/x"),
        ("1https://TOKUSER:SEKRIT@h:9", "1https://***@h:9"),  # a stray character before the scheme (round 38)
        ("-https://TOKUSER:SEKRIT@h:9", "-https://***@h:9"),
        ("https://alice:S3C\nR ET@h", "https://***@h"),  # a line break, then a space (round 39)
        ("HTTP:alice:S3C RET@h", "HTTP:***@h"),  # fewer slashes, a space
        ("http:alice:S3C/RET@h", "http:***@h"),  # fewer slashes, a raw "/"
        ("C:/data/a@b.txt", "C:/***@b.txt"),  # read as a URL: over-hidden, nothing shown
    ],
)
def test_a_whole_url_with_fewer_slashes_is_quoted_without_its_secret(url, shown):
    assert shown_url(url) == shown


@pytest.mark.parametrize(
    "text",
    [
        r"[#0 tracking.uri=postgresql\://TOKUSER\:SEKRIT@127.0.0.1\:9/db]",  # a sweep's job label
        r"\t#0 : tracking.uri=https\://TOKUSER\:SEK\,RIT@127.0.0.1\:9 trainer.c2=0.1",  # Hydra's launch line
    ],
)
def test_a_url_as_hydra_escapes_it_is_shown_without_its_secret(text):
    """Hydra writes an override's ':' as '\\:' in the lines it prints and in a job's label: the
    URL was not recognised and its user and password were printed (round 38)."""
    shown = redacted(text)
    assert "TOKUSER" not in shown and "SEK" not in shown and "://***@127.0.0.1:9" in shown, shown


def test_hydra_and_job_log_lines_hide_a_url_secret(tmp_path, capsys):
    """Every handler of Hydra's own logging and of the jobs' logging hides a secret, whatever
    logger writes the line (Hydra's launcher quotes every override of a job)."""
    import logging.config

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from pipeline_helpers import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        hydra_cfg = compose("config", return_hydra_config=True).hydra
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for part in ("hydra_logging", "job_logging"):
            settings = OmegaConf.to_container(hydra_cfg[part], resolve=False)
            if "file" in settings["handlers"]:
                settings["handlers"]["file"]["filename"] = str(tmp_path / f"{part}.log")
            logging.config.dictConfig(settings)
            logging.getLogger("hydra.core.utils").info(r"\t#0 : tracking.uri=https\://TOKUSER\:SEKRIT@127.0.0.1\:9")
            logging.getLogger("urllib3.connectionpool").warning("store %s failed", "postgresql://TOKUSER:SEKRIT@db/x")
            for handler in logging.getLogger().handlers:
                handler.flush()
    finally:
        logging.getLogger().handlers[:] = saved[0]
        logging.getLogger().setLevel(saved[1])
    written = capsys.readouterr().out + (tmp_path / "job_logging.log").read_text()
    assert written.count("://***@") == 6 and "SEKRIT" not in written and "TOKUSER" not in written, written


@pytest.mark.parametrize("app", ["config", "tag", "benchmark", "model_benchmark", "hmm_benchmark"])
def test_a_failed_job_is_named_by_hydra_without_a_url_secret(app, capsys):
    """Hydra writes a failed job's overrides to stderr (not through logging) before its error, in a
    single run and in a sweep's jobs: every app's callbacks hide the secret in them as the job
    ends (round 38; a single run's crash showed it in round 39)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import JobReturn, JobStatus
    from pipeline_helpers import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        config = compose(app, return_hydra_config=True)
    failed = JobReturn(
        overrides=["dataset.files.train.url=https\\://u\\:s3cret@h\\:9/x", "tracking.uri=http://u:s3cret@h"],
        status=JobStatus.FAILED,
        _return_value=ValueError("x"),
    )
    Callbacks(config).on_job_end(config=config, job_return=failed)
    with pytest.raises(ValueError):
        _ = failed.return_value
    printed = capsys.readouterr().err
    assert "Error executing job" in printed and "://***@h" in printed and "s3cret" not in printed, printed


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["tracking.uri=https://TOKUSER:SEK,RIT@127.0.0.1:9"], "its value is a list of values"),
        (["-m", "tracking.uri=https://TOKUSER:SEKRIT@127.0.0.1:9,https://TOKUSER:SEKRIT@127.0.0.1:8"], "one tracking store"),
    ],
)
def test_a_comma_in_a_password_or_a_sweep_over_stores_is_one_line_that_quotes_no_value(argv, problem, caplog):
    """A comma (a password may hold one) made Hydra print "Ambiguous value" with the whole value,
    exit 1; a sweep over tracking stores opened a parent run, then ended in a traceback (round 38)."""
    from pipeline.__main__ import composition_refusal
    from pipeline.apps import exit_if_uncomposable

    refused = composition_refusal(argv)
    assert refused and problem in refused and "SEK" not in refused and "TOKUSER" not in refused, refused
    with pytest.raises(SystemExit) as ended:
        flags, settings = [a for a in argv if a.startswith("-")], [a for a in argv if not a.startswith("-")]
        exit_if_uncomposable("tag", [*flags, "models=models:/x/1", "input=a.txt", *settings])
    assert ended.value.code == 2 and problem in caplog.text and "SEK" not in caplog.text


def test_a_sweep_job_is_named_on_one_line_without_a_url_secret():
    """A sweep job's label quoted its overrides as given: a password holding a raw "/" and a line
    break was printed, over two lines (round 40)."""
    from pipeline.report import shown_override

    shown = shown_override("dataset.files.train.url='https://alice:HUN/TER2\nXYZ@127.0.0.1:1/a'")
    assert shown == "dataset.files.train.url=https://***@127.0.0.1:1/a", shown
    assert shown_override("tracking.experiment=a\nb") == "tracking.experiment=a\\nb"
    assert shown_override("trainer.c2=0.1") == "trainer.c2=0.1"


def test_a_url_given_in_a_files_place_is_one_line_that_quotes_no_value(tmp_path):
    """``dataset.files.train=<url>`` and ``+dataset.files.extra.url=<url>`` crashed a run (TypeError,
    KeyError: 'path') after Hydra printed the overrides, password and all (round 39)."""
    from pipeline.__main__ import composition_refusal

    root = [f"data.root={tmp_path}", f"paths.output_dir={tmp_path / 'out'}"]
    refused = composition_refusal([*root, "dataset.files.train=https://alice:S3CRET@h/x"])
    assert (
        refused is not None
        and refused.startswith("bad setting dataset.files.train: a file is {path: ")
        and "got a str" in refused
    )
    refused = composition_refusal([*root, "+dataset.files.extra.url=https://alice:S3CRET@h/x"])
    assert refused is not None and refused.startswith("bad setting dataset.files.extra:") and refused.endswith("got no path")
    assert not (tmp_path / "out").exists()


def test_an_unreachable_tracking_server_is_one_line_without_its_password():
    from pipeline.__main__ import composition_refusal
    from pipeline.apps.model_benchmark import free_port

    port = free_port()  # nothing listens there
    refused = composition_refusal([f"tracking.uri=http://u:s3cret@127.0.0.1:{port}"])
    assert refused is not None and "\n" not in refused and "is not reachable" in refused, refused
    assert "s3cret" not in redacted(refused) and f"http://***@127.0.0.1:{port}" in redacted(refused)
    with pytest.raises(TrackingUnavailable) as unreachable:
        check_reachable(f"http://u:s3cret@127.0.0.1:{port}")
    assert "s3cret" not in str(unreachable.value) and "fix tracking.uri or MLFLOW_TRACKING_URI" in str(unreachable.value)
    with pytest.raises(TrackingUnavailable) as unreachable:  # the registry's server names its own variable (round 32)
        check_reachable(f"http://u:s3cret@127.0.0.1:{port}", setting="MLFLOW_REGISTRY_URI")
    assert "fix MLFLOW_REGISTRY_URI." in str(unreachable.value) and "tracking.uri" not in str(unreachable.value)


def test_a_database_server_that_does_not_answer_is_one_line_at_once():
    pytest.importorskip("psycopg")
    from pipeline.apps.model_benchmark import free_port

    with pytest.raises(TrackingUnavailable, match=r"^the database server of postgresql\+psycopg://\*\*\*@127\.0\.0\.1:"):
        check_reachable(f"postgresql+psycopg://u:s3cret@127.0.0.1:{free_port()}/db", timeout=2)


def test_a_tracking_server_behind_basic_authentication_is_reached_with_the_urls_credentials():
    """urllib takes no credentials from a URL: the check resolved ``u:pw@127.0.0.1`` as a host name
    and refused a server MLflow itself reaches."""
    seen = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            seen.append((self.path, self.headers.get("Authorization")))
            good = self.headers.get("Authorization") == "Basic " + base64.b64encode(b"u:p@ss").decode()
            self.send_response(200 if good else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        check_reachable(f"http://u:p%40ss@127.0.0.1:{port}")
        assert seen[-1][0] == "/health"
        with pytest.raises(TrackingUnavailable, match="not reachable|answered 401"):
            check_reachable(f"http://u:wrong@127.0.0.1:{port}")
    finally:
        server.shutdown()
        server.server_close()


def test_the_lines_a_run_prints_name_its_store_without_the_password():
    """A run on ``http://u:pw@host`` printed the password in its run-page lines (ours and MLflow's
    own "View run" lines) and in the run's description (round 19)."""
    from pipeline.tracking import store_hint

    line = store_hint("http://u:s3cret@127.0.0.1:5000", "r1", "1")
    assert line == "http://***@127.0.0.1:5000/#/experiments/1/runs/r1"
    assert "s3cret" not in store_hint("postgresql://u:s3cret@db/mlflow", "r1", "1")


@pytest.mark.parametrize(
    "password, problem",
    [
        ("Prefix0/tail", "percent-encoded: %2F"),
        ("Prefix0?tail", "percent-encoded: %2F"),
        ("Prefix0#tail", "percent-encoded: %2F"),
        ("Ab[Prefix0]z", "percent-encoded: %2F"),  # read as an IPv6 address (round 22)
        ("Prefix0[9", "percent-encoded: %2F"),
        ("horse Prefix0", "a space or control character (write a space as %20)"),  # round 22
    ],
)
def test_a_url_whose_password_breaks_it_is_refused_without_quoting_it(password, problem, tmp_path):
    """A raw ``/``, ``?`` or ``#`` in a password ends the URL's host part there: urllib took what came
    before for a port and quoted it (``nonnumeric port: 'Prefix0'``), in a traceback for the tracking
    store and in the one-line error of a download (round 21); brackets gave a traceback naming what
    they held, and a space was redacted nowhere (round 22)."""
    from pipeline.__main__ import composition_refusal
    from pipeline.stages.data import MissingDataError, resolve_files

    refused = composition_refusal(["tracking=server", f"tracking.uri='http://u:{password}@127.0.0.1:1'"])
    assert refused is not None and "\n" not in refused and problem in refused, refused
    assert "Prefix0" not in redacted(refused)
    dataset = {"name": "toy", "files": {"train": {"path": "t.gz", "url": f"http://u:{password}@127.0.0.1:1/t.gz"}}}
    with pytest.raises(MissingDataError, match=re.escape(problem)) as missing:
        resolve_files(dataset, tmp_path, download=True)
    assert "Prefix0" not in redacted(str(missing.value))


@pytest.mark.parametrize("password", ["horse\nPrefix0", "horse\n\nPrefix0", "horse\nBatt Prefix0"])
def test_a_tracking_uri_whose_password_holds_a_line_break_is_refused_in_one_line_without_it(password, monkeypatch):
    """An environment variable can hold a raw line break: the refusal's URL then spanned two lines,
    and the second showed the rest of the password (round 24); with two, or a space after one, the
    first part showed (round 26)."""
    from pipeline.__main__ import composition_refusal

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://u:{password}@127.0.0.1:1")
    refused = composition_refusal([])
    assert refused is not None and "a space or control character" in refused, refused
    shown = redacted(refused)
    assert "\n" not in shown and "Prefix0" not in shown and "horse" not in shown, shown


def test_a_refused_url_with_a_space_in_its_secret_is_quoted_without_the_rest_of_it(tmp_path, monkeypatch):
    """A token's value stops at a raw space in free text, so every refusal of such a URL quoted what
    follows the space (round 25): a URL a message quotes is cut at its first whitespace."""
    from pipeline.__main__ import composition_refusal
    from pipeline.stages.data import MissingDataError, resolve_files

    dataset = {"name": "toy", "files": {"train": {"path": "t.gz", "url": "http://127.0.0.1:1/t.gz?token=abc SeCr3t"}}}
    with pytest.raises(MissingDataError) as missing:
        resolve_files(dataset, tmp_path, download=True)
    assert "SeCr3t" not in redacted(str(missing.value)) and "token=*** ..." in str(missing.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://u:horse Batt@127.0.0.1:1/?token=abc SeCr3t")
    refused = composition_refusal([])
    assert refused is not None and "SeCr3t" not in redacted(refused) and "horse" not in redacted(refused), refused


def test_a_tracking_server_url_with_a_query_is_refused():
    """MLflow appends its API paths to the URL as written (``/?token=x/api/2.0/...``), got the UI's
    HTML back and failed in a traceback naming the token (round 21)."""
    from pipeline.__main__ import composition_refusal

    refused = composition_refusal(["tracking=server", "tracking.uri='http://127.0.0.1:1/?token=s3cret'"])
    assert refused is not None and refused.endswith("takes no query or fragment (a token goes in MLFLOW_TRACKING_TOKEN)")
    assert "s3cret" not in redacted(refused)


def test_a_secret_that_yaml_would_fold_over_two_lines_is_hidden_in_the_logged_config():
    """The logged config.yaml was redacted as YAML text, where a value's line break is written as a
    blank line: a password holding a raw '/' and a line break stayed (round 40). Values are hidden
    before the YAML is written."""
    from omegaconf import OmegaConf

    from pipeline.report import redacted_values

    config = {"tracking": {"experiment": "https://alice:HUN/TER2\nXYZ@example.org/x"}, "list": ["http://u:p w@h"], "n": 3}
    assert "TER2" in redacted(OmegaConf.to_yaml(OmegaConf.create(config)))  # the text route misses it
    shown = OmegaConf.to_yaml(OmegaConf.create(redacted_values(config)))
    assert "TER2" not in shown and "alice" not in shown and "p w" not in shown and "https://***@example.org/x" in shown, shown

"""A download URL that urllib cannot even open (a space in it, no host) was taken by the settings
check and ended in a 54-line ``http.client.InvalidURL`` traceback from the prepare stage (M2):
refused with the settings, and any URL error of a download is the one-line missing-file error."""

from __future__ import annotations

import gzip
import re

import pytest
from pipeline_helpers import compose_config, serving_files

from pipeline.engine.validate import SettingsError
from pipeline.stages.data import MissingDataError, resolve_files


@pytest.mark.parametrize("url", ["'http://a b/x.gz'", "http:///x.gz", "https://", "'http://host/x\x01.gz'"])
def test_a_url_without_a_host_or_with_a_space_is_a_settings_error(url):
    from pipeline.engine.runner import validated_plan

    with pytest.raises(SettingsError, match=r"^bad setting dataset.files.train.url=.*: a download URL needs a host name and no"):
        validated_plan(compose_config([f"dataset.files.train.url={url}"]))
    validated_plan(compose_config(["dataset.files.train.url='http://host/a%20b.gz'"]))  # a space written as %20


def test_a_url_urllib_refuses_is_the_missing_file_error(tmp_path):
    dataset = {"name": "toy", "files": {"train": {"path": "train.txt.gz", "url": "http://a b/x.gz"}}}
    with pytest.raises(MissingDataError, match=r"train.txt.gz \(download from http://a \.\.\. failed: it holds a space or"):
        resolve_files(dataset, tmp_path, download=True)


def test_a_download_that_fails_refuses_the_run_before_it_opens(tmp_path):
    """A missing file whose URL could not be fetched (connection refused) was downloaded only inside
    the run: a single run left a FAILED run in the store, and a grid its parent and every job's run.
    The download is tried with the settings check, before any run opens; a file it fetches stays."""

    from pipeline.apps.model_benchmark import free_port
    from pipeline.stages.data import config_data_problem

    port = free_port()  # nothing listens there: connection refused
    (tmp_path / "conll2000").mkdir()
    (tmp_path / "conll2000" / "test.txt.gz").write_bytes(b"")
    overrides = [f"data.root={tmp_path}", f"dataset.files.train.url=http://127.0.0.1:{port}/train.txt.gz"]
    overrides += ["dataset.files.train.sha256=null", "dataset.files.test.sha256=null"]
    problem = config_data_problem(compose_config(overrides))
    assert problem is not None and "\n" not in problem
    assert f"train.txt.gz (download from http://127.0.0.1:{port}/train.txt.gz failed: " in problem

    served = tmp_path / "served"
    served.mkdir()
    good = gzip.compress(b"He PRP B-NP\nsays VBZ B-VP\n\n")
    (served / "train.txt.gz").write_bytes(good)

    server, base = serving_files(served)
    try:
        url = f"{base}/train.txt.gz"
        assert config_data_problem(compose_config([*overrides[:1], f"dataset.files.train.url={url}", *overrides[2:]])) is None
    finally:
        server.shutdown()
        server.server_close()
    assert (tmp_path / "conll2000" / "train.txt.gz").read_bytes() == good  # fetched before any run


def test_a_download_urls_password_is_neither_logged_nor_stored(tmp_path, caplog):
    """``http://user:s3cret@host/...`` was printed whole in the run's one-line error (and would be a
    run parameter and in the logged config.yaml): the password is ``***`` in all of them."""
    from mlflow.tracking import MlflowClient
    from pipeline_helpers import tiny_overrides, write_corpus

    from pipeline.__main__ import run_pipeline
    from pipeline.apps.model_benchmark import free_port

    dataset = {"name": "toy", "files": {"train": {"path": "t.gz", "url": f"http://user:s3cret@127.0.0.1:{free_port()}/t.gz"}}}
    with pytest.raises(MissingDataError) as refused:
        resolve_files(dataset, tmp_path, download=True)
    assert "http://***@127.0.0.1:" in str(refused.value) and "s3cret" not in str(refused.value) + caplog.text
    corpus = write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    overrides = [*tiny_overrides(corpus, out), "stages=[prepare]", "dataset.files.train.url=https://user:s3cret@example.org/t.gz"]
    run_pipeline(compose_config(overrides))
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    params = [value for run in runs for value in run.data.params.values()]
    assert "https://***@example.org/t.gz" in params and not any("s3cret" in value for value in params)
    pipeline = next(run for run in runs if run.data.tags.get("stage") == "pipeline")
    config = client.download_artifacts(pipeline.info.run_id, "config.yaml", str(tmp_path))
    text = open(config).read()
    assert "***@example.org" in text and "s3cret" not in text


@pytest.mark.parametrize(
    "content, sha256, problem",
    [
        (b"<!DOCTYPE html><html>moved</html>\n", None, "download from .* failed: .*train.txt.gz:1: "),  # HTML for a .gz
        (None, None, "download from .* failed: .*train.txt.gz:.*truncated or corrupt gzip"),  # cut short
        (None, "0" * 64, "download from .* failed: .*train.txt.gz:.*truncated or corrupt gzip"),  # with a checksum set
        ("good", "0" * 64, r"SHA-256 of its text is [0-9a-f]{64}, expected 0{64} .*; the download from .* was removed"),
    ],
)
def test_a_download_that_gives_bad_content_refuses_the_run_and_is_not_kept(tmp_path, content, sha256, problem):
    """What a URL served was checked only as the run read it: HTML or a cut-short gzip opened runs
    (left FAILED), a checksum on a truncated gzip was a 19-line traceback, and the bad file stayed in
    the data root, taken as the data by every later run even once the URL was fixed."""

    from pipeline.stages.data import config_data_problem

    served = tmp_path / "served"
    served.mkdir()
    whole = gzip.compress(b"He PRP B-NP\nsays VBZ B-VP\n\n")
    body = whole if content == "good" else whole[: len(whole) // 2] if content is None else content
    (served / "train.txt.gz").write_bytes(body)
    (tmp_path / "data" / "conll2000").mkdir(parents=True)
    (tmp_path / "data" / "conll2000" / "test.txt.gz").write_bytes(whole)
    server, base = serving_files(served)
    try:
        overrides = [f"data.root={tmp_path / 'data'}", f"dataset.files.train.url={base}/train.txt.gz"]
        overrides += [f"dataset.files.train.sha256={sha256 or 'null'}", "dataset.files.test.sha256=null"]
        problem_line = config_data_problem(compose_config(overrides))
    finally:
        server.shutdown()
        server.server_close()
    assert problem_line is not None and "\n" not in problem_line and re.search(problem, problem_line), problem_line
    assert not (tmp_path / "data" / "conll2000" / "train.txt.gz").exists()  # the next run downloads it again


def test_a_download_url_with_a_user_and_password_sends_them_as_basic_authentication(tmp_path, caplog):
    """urllib takes no credentials from a URL: ``http://user:pass@host:port/...`` failed with
    "nonnumeric port". The user and password (percent-decoded) go as basic authentication; a wrong
    password is the one-line missing-file error, with the password as ``***``."""
    import base64

    from pipeline.stages.data import config_data_problem

    served = tmp_path / "served"
    served.mkdir()
    good = gzip.compress(b"He PRP B-NP\nsays VBZ B-VP\n\n")
    (served / "train.txt.gz").write_bytes(good)
    (tmp_path / "data" / "conll2000").mkdir(parents=True)
    (tmp_path / "data" / "conll2000" / "test.txt.gz").write_bytes(good)
    server, base = serving_files(served, "Basic " + base64.b64encode(b"me:p@ss/w").decode())
    host = base.removeprefix("http://")
    overrides = [f"data.root={tmp_path / 'data'}", "dataset.files.train.sha256=null", "dataset.files.test.sha256=null"]
    try:
        wrong = config_data_problem(compose_config([*overrides, f"dataset.files.train.url=http://me:Wr0ng@{host}/train.txt.gz"]))
        assert not (tmp_path / "data" / "conll2000" / "train.txt.gz").exists()
        right = config_data_problem(
            compose_config([*overrides, f"dataset.files.train.url=http://me:p%40ss%2Fw@{host}/train.txt.gz"])
        )
    finally:
        server.shutdown()
        server.server_close()
    assert wrong is not None and "\n" not in wrong, wrong
    assert re.search(r"download from http://\*\*\*@127.0.0.1:\d+/train.txt.gz failed: Unauthorized", wrong), wrong
    assert right is None
    assert (tmp_path / "data" / "conll2000" / "train.txt.gz").read_bytes() == good
    assert "Wr0ng" not in wrong + caplog.text and "p%40ss" not in caplog.text


def test_a_redirect_is_followed_without_the_urls_credentials(tmp_path):
    """urllib carried the Authorization header of ``http://user:pass@a/...`` to the host a redirect
    named (round 21): the credentials go to the URL's own host only."""
    import base64
    import http.server
    import threading

    seen = []

    class Recording(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            if self.path == "/moved.gz":
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/train.txt.gz")
                self.end_headers()
                return
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dataset = {
        "name": "toy",
        "files": {"train": {"path": "t.gz", "url": f"http://me:s3cret@127.0.0.1:{server.server_address[1]}/moved.gz"}},
    }
    try:
        with pytest.raises(MissingDataError, match="failed: Not Found"):
            resolve_files(dataset, tmp_path, download=True)
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Basic " + base64.b64encode(b"me:s3cret").decode(), None]


def test_a_file_url_copies_nothing_into_the_data_root(tmp_path):
    """The settings check refuses ``file://`` URLs, but the download ran first (in the pre-run data
    check) and copied the file into the data root (round 21's clean-up found the gap)."""
    source = tmp_path / "elsewhere.txt.gz"
    source.write_bytes(gzip.compress(b"He PRP B-NP\n\n"))
    dataset = {"name": "toy", "files": {"train": {"path": "copy.txt.gz", "url": source.as_uri()}}}
    with pytest.raises(MissingDataError, match="a download URL must be http:// or https://"):
        resolve_files(dataset, tmp_path / "data", download=True)
    assert not (tmp_path / "data" / "copy.txt.gz").exists()

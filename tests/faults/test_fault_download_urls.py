"""A download URL that urllib cannot even open (a space in it, no host) was taken by the settings
check and ended in a 54-line ``http.client.InvalidURL`` traceback from the prepare stage (M2):
refused with the settings, and any URL error of a download is the one-line missing-file error."""

from __future__ import annotations

import pytest
from pipeline_helpers import compose_config

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
    with pytest.raises(MissingDataError, match=r"train.txt.gz \(download from http://a b/x.gz failed: URL can't contain control"):
        resolve_files(dataset, tmp_path, download=True)


def test_a_download_that_fails_refuses_the_run_before_it_opens(tmp_path):
    """A missing file whose URL could not be fetched (connection refused) was downloaded only inside
    the run: a single run left a FAILED run in the store, and a grid its parent and every job's run.
    The download is tried with the settings check, before any run opens; a file it fetches stays."""
    import http.server
    import threading

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
    (served / "train.txt.gz").write_bytes(b"\x1f\x8b")  # what the server hands out, whatever it is

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/train.txt.gz"
        assert config_data_problem(compose_config([*overrides[:1], f"dataset.files.train.url={url}", *overrides[2:]])) is None
    finally:
        server.shutdown()
        server.server_close()
    assert (tmp_path / "conll2000" / "train.txt.gz").read_bytes() == b"\x1f\x8b"  # fetched before any run

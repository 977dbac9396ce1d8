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

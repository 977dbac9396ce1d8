"""``python -m pipeline.benchmark``: this project's CRF against CRFsuite (:mod:`pipeline.apps.benchmark`)."""

import sys

import hydra
from omegaconf import DictConfig

from pipeline.apps import benchmark as app
from pipeline.apps import exit_if_uncomposable, run_checked, tracked


@hydra.main(version_base=None, config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    run_checked(tracked(app.check_settings), app.main, cfg)


if __name__ == "__main__":
    exit_if_uncomposable("benchmark", sys.argv[1:], tracked(app.check_settings))
    main()

"""``python -m pipeline.hmm_benchmark``: the HMM against NLTK's TnT (:mod:`pipeline.apps.hmm_benchmark`)."""

import sys

import hydra
from omegaconf import DictConfig

from pipeline.apps import exit_if_uncomposable, run_checked, tracked
from pipeline.apps import hmm_benchmark as app


@hydra.main(version_base=None, config_path="../conf", config_name="hmm_benchmark")
def main(cfg: DictConfig) -> None:
    run_checked(tracked(app.check_settings), app.main, cfg)


if __name__ == "__main__":
    exit_if_uncomposable("hmm_benchmark", sys.argv[1:], tracked(app.check_settings))
    main()

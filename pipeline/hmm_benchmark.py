"""``python -m pipeline.hmm_benchmark``: the HMM against NLTK's TnT (:mod:`pipeline.apps.hmm_benchmark`)."""

import hydra
from omegaconf import DictConfig

from pipeline.apps import hmm_benchmark as app
from pipeline.apps import run_checked


@hydra.main(version_base=None, config_path="../conf", config_name="hmm_benchmark")
def main(cfg: DictConfig) -> None:
    run_checked(app.check_settings, app.main, cfg)


if __name__ == "__main__":
    main()

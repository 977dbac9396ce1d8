"""``python -m pipeline.model_benchmark``: a logged MLflow Model on the paths users take
(:mod:`pipeline.apps.model_benchmark`)."""

import sys

import hydra
from omegaconf import DictConfig

from pipeline.apps import exit_if_uncomposable, run_checked, tracked
from pipeline.apps import model_benchmark as app


@hydra.main(version_base=None, config_path="../conf", config_name="model_benchmark")
def main(cfg: DictConfig) -> None:
    run_checked(tracked(app.check_settings, "model_benchmark.model"), app.main, cfg)


if __name__ == "__main__":
    exit_if_uncomposable("model_benchmark", sys.argv[1:], tracked(app.check_settings, "model_benchmark.model"))
    main()

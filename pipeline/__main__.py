"""``python -m pipeline``: the Hydra app that runs the configured stages (conf/config.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from pipeline.runner import objective_value, run_pipeline


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    return objective_value(run_pipeline(cfg))


if __name__ == "__main__":
    main()

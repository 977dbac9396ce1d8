"""The tag command: ``python -m pipeline.tag model=<bundle | runs:/... | models:/...> input=<file> output=<file>``
(the app is :mod:`pipeline.apps.tag`; the command line's ``model=`` is passed to Hydra as ``models=``)."""

import sys

import hydra
from omegaconf import DictConfig

from pipeline.apps import exit_if_uncomposable
from pipeline.apps import tag as app


@hydra.main(version_base=None, config_path="../conf", config_name="tag")
def main(cfg: DictConfig) -> None:
    app.main(cfg)


if __name__ == "__main__":
    sys.argv = app.renamed(sys.argv)
    exit_if_uncomposable("tag", sys.argv[1:])
    main()

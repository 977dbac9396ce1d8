"""Hydra-configured, MLflow-tracked experiment stages around the ``crf`` core."""

"""Hydra-configured, MLflow-tracked experiment stages around the ``crf`` core."""

from omegaconf import OmegaConf

# used by conf/trainer/elasticnet.yaml: c2 = strength * l2_ratio
OmegaConf.register_new_resolver("multiply", lambda a, b: float(a) * float(b), replace=True)

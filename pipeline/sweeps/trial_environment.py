"""What the Optuna sweeper and its jobs agree on: the environment variables that tell a job which
trial it is, and the tags and trial attributes they write.

The sweeper side (``pipeline.sweeps.search``, ``hydra_plugins/crf_optuna_sweeper``) and the job side
(``pipeline.sweeps.trial_stopping``) both import these names from here; this module imports nothing.
"""

# how the launching process tells a job which trial it is
STORAGE_VARIABLE = "CRF_OPTUNA_STORAGE"
STUDY_VARIABLE = "CRF_OPTUNA_STUDY"
TRIAL_VARIABLE = "CRF_OPTUNA_TRIAL"
WARM_START_VARIABLE = "CRF_OPTUNA_WARM_START"  # the finished trial whose weights this trial starts from
# what a job returns to a sweeper (pipeline.engine.runner.objective_value); unset: the dev score
METRIC_VARIABLE = "CRF_SWEEP_METRIC"
DEV_SCORES = ("dev_f1", "dev_accuracy")  # what the training loop reports during training

TRIAL_TAG = "optuna.trial"  # the trial number, on every run of a trial's job
STUDY_TAG = "optuna.study"
# a finished job's train output ({key, hash}) and its features' content hash, on its trial: where
# later trials start from
TRAIN_OUTPUT_ATTR = "train_output"
FEATURES_ATTR = "featurize_output"
WARM_START_ATTR = "warm_start_trial"  # on a trial that started from another's weights

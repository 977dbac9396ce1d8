"""The pipeline's stages, one module each (each holds a ``STAGE``), and the dataset files they read.

The engine loads the stages listed in :data:`STAGE_MODULES` (``pipeline.engine.stage.load_stages``);
a new stage is one module here and one line there.
"""

# the stage modules in the order they run; a stage's upstream stages come before it
STAGE_MODULES = (
    "pipeline.stages.prepare",
    "pipeline.stages.featurize",
    "pipeline.stages.train",
    "pipeline.stages.evaluate",
    "pipeline.stages.active_learning",
    "pipeline.stages.semi_supervised",
)

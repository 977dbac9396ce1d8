"""The pipeline's stages, one module each (each holds a ``STAGE``), and the dataset files they read."""

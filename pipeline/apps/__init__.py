"""The Hydra apps beside the pipeline: the tag command and the benchmarks (``python -m pipeline.<app>`` shims run them)."""

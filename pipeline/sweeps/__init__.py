"""Multiruns: the sweep's parent run and its summaries (settings grid, HMM versus CRF, active learning), job placement."""

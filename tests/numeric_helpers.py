"""Numerical helpers shared by the gradient tests."""

from __future__ import annotations

import numpy as np


def finite_difference(fun, theta: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central differences of ``fun(theta)[0]`` (a scalar) in every coordinate of ``theta`` (n,)."""
    grad = np.zeros_like(theta)
    for i in range(theta.size):
        bump = np.zeros_like(theta)
        bump[i] = step
        grad[i] = (fun(theta + bump)[0] - fun(theta - bump)[0]) / (2 * step)
    return grad

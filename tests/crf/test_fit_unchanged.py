"""``CRF.fit`` gives what it gave before it became a template over a training problem.

The figures (iterations, final loss, sum of squared weights) were computed by the previous
implementation of ``fit`` on this generated data; the refactor must reproduce them (to 1e-12,
which leaves room for another BLAS, not for another computation).
"""

from __future__ import annotations

import numpy as np
import pytest

from crf import CRF

# computed by the implementation of fit before the refactor, with these configurations
EXPECTED = {
    "l2": (29, 367.9749530188699, 15.704614251637777),
    "owlqn": (65, 370.43201913816483, 18.37261787468998),
    "order2": (32, 352.98704564468613, 13.330467348888295),
    "candidates": (30, 352.9871717818797, 13.338828623755274),
    "l2sgd": (8, 398.4263097842181, 0.3183951435572),
    "pa": (8, 220.7035357592724, 0.9473826115819381),
    "warm": (37, 367.97496190284755, 15.602563526914718),
}

CONFIGS = {
    "l2": dict(c2=0.3),
    "owlqn": dict(c1=0.2, c2=0.05),
    "order2": dict(order=2, c2=0.5, max_iterations=60),
    "candidates": dict(order=2, candidate_threshold=0.02, c2=0.5, max_iterations=60),
    "l2sgd": dict(algorithm="l2sgd", c2=0.5, max_iterations=8),
    "pa": dict(algorithm="pa", max_iterations=8),
}


def _data(n: int = 60, seed: int = 3):
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "it", "big", "red"]
    X, y = [], []
    for _ in range(n):
        k = int(rng.integers(2, 9))
        w = rng.choice(words, size=k)
        X.append([{"w": v, "p": w[t - 1] if t else "<s>", "len": len(v) / 3} for t, v in enumerate(w)])
        y.append([["N", "V", "D", "P"][(words.index(v) + t) % 4] for t, v in enumerate(w)])
    return X, y


def _figures(model: CRF, boundary: bool = True) -> tuple[int, float, float]:
    blocks = [model.state_weights_, model.transitions_] + ([model.start_weights_, model.end_weights_] if boundary else [])
    w = np.concatenate([np.ravel(b) for b in blocks])
    return model.n_iter_, model.training_log_.last_iteration["loss"], float(np.sum(w * w))


def _check(figures, expected) -> None:
    assert figures[0] == expected[0]
    assert figures[1:] == pytest.approx(expected[1:], rel=1e-12)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fit_reproduces_the_previous_implementation(name):
    X, y = _data()
    model = CRF(n_threads=1, **CONFIGS[name]).fit(X, y, X[:10], y[:10])
    _check(_figures(model), EXPECTED[name])


def test_a_warm_start_reproduces_the_previous_implementation():
    X, y = _data()
    model = CRF(c2=0.3, n_threads=1, max_iterations=15).fit(X[:30], y[:30])
    model.set_params(warm_start=True, max_iterations=None)
    model.fit(X, y)
    _check(_figures(model, boundary=False), EXPECTED["warm"])

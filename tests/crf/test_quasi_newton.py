"""The L-BFGS optimiser and its More-Thuente line search: the Wolfe conditions on the functions
of Moré and Thuente's paper, minimisers of quadratics and of Rosenbrock's function, the same CRF
optimum as scipy's L-BFGS-B, and the failure modes."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp

from crf import _optimize as optimize
from crf import _quasi_newton as quasi_newton
from crf._objective import Objective, ParameterLayout


def along_a_line(phi):
    """A function of x (1,) whose restriction to d = (1,) from x = (0,) is phi (value, slope)."""

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, slope = phi(float(x[0]))
        return value, np.array([slope])

    return fun


def phi_1(a: float, beta: float = 2.0) -> tuple[float, float]:  # minimiser at sqrt(2)
    return -a / (a * a + beta), (a * a - beta) / (a * a + beta) ** 2


def phi_2(a: float, beta: float = 0.004) -> tuple[float, float]:  # minimiser at 1.6
    return (a + beta) ** 5 - 2.0 * (a + beta) ** 4, 5.0 * (a + beta) ** 4 - 8.0 * (a + beta) ** 3


def phi_quartic(a: float) -> tuple[float, float]:  # convex, minimiser at 3, very flat near it
    return (a - 3.0) ** 4 - a, 4.0 * (a - 3.0) ** 3 - 1.0


@pytest.mark.parametrize("phi", [phi_1, phi_2, phi_quartic])
@pytest.mark.parametrize("start", [1e-3, 1e-1, 10.0, 1e3])
@pytest.mark.parametrize("ftol, gtol", [(1e-4, 0.9), (1e-3, 0.1), (0.1, 0.1)])
def test_line_search_steps_meet_the_strong_wolfe_conditions(phi, start, ftol, gtol):
    fun = along_a_line(phi)
    f0, g0 = fun(np.zeros(1))
    out = np.empty(1)
    wolfe = quasi_newton.WolfeConditions(ftol=ftol, gtol=gtol)
    step, value, grad, trials = quasi_newton.line_search(fun, np.zeros(1), f0, g0, np.ones(1), start, out, 30, wolfe)
    assert out[0] == step and value == phi(step)[0] and grad[0] == phi(step)[1]
    assert value <= f0 + ftol * step * g0[0]
    assert abs(grad[0]) <= gtol * abs(g0[0])
    assert 1 <= trials <= 30


def test_a_step_that_overflows_is_backed_off():
    def phi(a: float) -> tuple[float, float]:
        return (np.inf, np.inf) if a > 5 else ((a - 1.0) ** 2, 2.0 * (a - 1.0))

    fun = along_a_line(phi)
    f0, g0 = fun(np.zeros(1))
    step, value, _, _ = quasi_newton.line_search(fun, np.zeros(1), f0, g0, np.ones(1), 100.0, np.empty(1))
    assert step <= 5 and value < f0


def test_line_search_extrapolates_where_the_cubic_does_not_turn():
    """Where the slope shrinks but the interpolating cubic has no minimiser beyond the trial,
    Moré-Thuente jumps to the far end of the allowed range (here 1 -> 5), as MINPACK's dcsrch does."""
    steps = []

    def phi(a: float) -> tuple[float, float]:
        steps.append(a)
        return phi_quartic(a)

    fun = along_a_line(phi)
    f0, g0 = fun(np.zeros(1))
    steps.clear()
    wolfe = quasi_newton.WolfeConditions(ftol=1e-3, gtol=0.1)
    quasi_newton.line_search(fun, np.zeros(1), f0, g0, np.ones(1), 1.0, np.empty(1), 30, wolfe)
    assert steps == [1.0, 5.0, 3.0625]


def test_a_search_that_fails_returns_its_lowest_point_below_the_start():
    """Beyond a = 0.3 the objective is NaN, and inside it no step meets the curvature condition
    within the 4 trials allowed: the lowest point tried is returned, not an error."""

    def phi(a: float) -> tuple[float, float]:
        return (np.nan, np.nan) if a > 0.3 else (-a, -1.0)

    fun = along_a_line(phi)
    f0, g0 = fun(np.zeros(1))
    out = np.empty(1)
    step, value, grad, _ = quasi_newton.line_search(fun, np.zeros(1), f0, g0, np.ones(1), 1.0, out, 4)
    assert 0 < step <= 0.3 and value == -step and out[0] == step and grad[0] == -1.0
    with pytest.raises(quasi_newton.LineSearchError):  # nothing below the start: an error
        quasi_newton.line_search(along_a_line(lambda a: (np.nan, np.nan)), np.zeros(1), f0, g0, np.ones(1), 1.0, out, 4)


def test_an_exact_minimum_ends_the_iterations_and_a_bad_start_is_refused():
    # f = (x - 1)^2 + x^2 reaches x = 0.5, where g = 0, exactly: the iterations end there
    # (a further line search along a zero direction would fail)
    points = list(quasi_newton.minimise(lambda x: (float((x - 1) @ (x - 1) + x @ x), 4 * x - 2), np.zeros(1)))
    assert points[-1][0][0] == 0.5 and points[-1][2][0] == 0.0
    with pytest.raises(ValueError, match="not finite"):
        list(quasi_newton.minimise(lambda x: (np.nan, x), np.ones(2)))
    with pytest.raises(ValueError, match="at least one pair"):
        quasi_newton.CurvaturePairs(0, 3)


def test_what_a_search_returns_is_what_was_evaluated_at_the_returned_point():
    """Whether it succeeds or gives up after a few trials (through stage 1's shifted
    interpolation, with the last trial not the best), a search returns f and g exactly as
    evaluated at ``out = x + a d``, and below f0."""

    def phi(a: float) -> tuple[float, float]:
        return (a - 1.0) ** 2 + 0.3 * (a - 1.0) ** 4 - 1.0 / 3.0, 2.0 * (a - 1.0) + 1.2 * (a - 1.0) ** 3

    fun = along_a_line(phi)
    x = np.full(1, 0.1)
    f0, g0 = fun(x)
    returned = 0
    for start in (0.05, 0.3, 2.5, 3.7, 7.0):
        for trials in (2, 3, 4, 5):
            for ftol in (1e-4, 0.3):
                out = np.empty(1)
                wolfe = quasi_newton.WolfeConditions(ftol=ftol, gtol=1e-12)  # hard to meet: searches give up
                try:
                    step, value, grad, _ = quasi_newton.line_search(fun, x, f0, g0, np.ones(1), start, out, trials, wolfe)
                except quasi_newton.LineSearchError:
                    continue
                returned += 1
                assert out[0] == x[0] + step
                assert (value, grad[0]) == phi(out[0]) and value < f0
    assert returned >= 20

    # a point with sufficient decrease at 0.5, then one shifted (stage 1) update, then giving up:
    # the value returned is f(0.5) as evaluated, not as shifted and shifted back
    for f_half in np.linspace(0.01, 0.3, 60):

        def kinked(a: float, f_half: float = float(f_half)) -> tuple[float, float]:
            return (1.0, -1.8) if a == 0 else ((f_half, -1.7) if a == 0.5 else (f_half / 2, -1.7))

        out = np.empty(1)
        wolfe = quasi_newton.WolfeConditions(ftol=0.45, gtol=0.9)
        fun = along_a_line(kinked)
        step, value, _, _ = quasi_newton.line_search(fun, np.zeros(1), 1.0, np.array([-1.8]), np.ones(1), 0.5, out, 2, wolfe)
        assert step == out[0] == 0.5 and value == f_half


def test_line_search_refuses_an_ascent_direction():
    fun = along_a_line(phi_quartic)
    f0, g0 = fun(np.zeros(1))
    with pytest.raises(quasi_newton.LineSearchError, match="descent"):
        quasi_newton.line_search(fun, np.zeros(1), f0, g0, -np.ones(1), 1.0, np.empty(1))


def test_lbfgs_finds_the_minimiser_of_a_quadratic_and_of_rosenbrocks_function():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(40, 40))
    A, b = M @ M.T + 0.5 * np.eye(40), rng.normal(size=40)
    solution = np.linalg.solve(A, b)

    def quadratic(x: np.ndarray) -> tuple[float, np.ndarray]:  # minimum 0: no rounding floor near it
        g = A @ (x - solution)
        return 0.5 * float((x - solution) @ g), g

    for x, _, g in quasi_newton.minimise(quadratic, np.zeros(40)):  # noqa: B007
        if np.linalg.norm(g) < 1e-9:
            break
    np.testing.assert_allclose(x, solution, atol=1e-8)

    iterations = 0
    rosenbrock = lambda x: (scipy.optimize.rosen(x), scipy.optimize.rosen_der(x))  # noqa: E731
    for x, _, g in quasi_newton.minimise(rosenbrock, np.full(8, -1.2)):  # noqa: B007
        iterations += 1
        if np.linalg.norm(g) < 1e-9:
            break
    np.testing.assert_allclose(x, np.ones(8), atol=1e-9)
    assert iterations < 200


def test_curvature_pairs_refuse_a_step_without_positive_curvature():
    pairs = quasi_newton.CurvaturePairs(2, 3)
    x, g = np.zeros(3), np.array([1.0, -2.0, 0.5])
    assert pairs.push(np.array([1.0, 0, 0]), x, np.array([3.0, -2.0, 0.5]), g)  # s.y = 2
    assert not pairs.push(np.array([0, 1.0, 0]), x, np.array([1.0, -3.0, 0.5]), g)  # s.y = -1
    assert pairs.push(np.array([0, 0, 1.0]), x, np.array([1.0, -2.0, 1.5]), g)  # s.y = 1
    assert not pairs.push(np.array([1.0, 0, 0]), x, g, g)  # y = 0: the oldest pair goes, nothing replaces it
    direction = pairs.direction(g, np.empty(3))
    # one pair (s = e3, y = e3) left: H scales by s.y / y.y = 1 and is the identity on e3
    np.testing.assert_allclose(direction, -g)
    assert float(direction @ g) < 0


def test_two_loop_direction_is_the_bfgs_inverse_hessian_product():
    """With m pairs the two-loop recursion applies the BFGS update of ``(s.y / y.y) I`` by each
    pair in turn, oldest first: built here as dense matrices. Also after the memory wrapped."""
    rng = np.random.default_rng(1)
    n, m = 7, 3
    M = rng.normal(size=(n, n))
    A = M @ M.T + np.eye(n)
    pairs = quasi_newton.CurvaturePairs(m, n)
    kept = []
    for _ in range(5):
        x, s = rng.normal(size=n), rng.normal(size=n)
        assert pairs.push(x + s, x, A @ (x + s), A @ x)
        kept = (kept + [(s, A @ s)])[-m:]
    s_new, y_new = kept[-1]
    H = (s_new @ y_new) / (y_new @ y_new) * np.eye(n)
    for s, y in kept:
        rho = 1.0 / (s @ y)
        V = np.eye(n) - rho * np.outer(y, s)
        H = V.T @ H @ V + rho * np.outer(s, s)
    g = rng.normal(size=n)
    np.testing.assert_allclose(pairs.direction(g, np.empty(n)), -H @ g, rtol=1e-10)
    with pytest.raises(ValueError, match="contiguous"):
        pairs.direction(g, np.empty(2 * n)[::2])


def test_a_zero_gradient_ends_at_once():
    assert list(quasi_newton.minimise(lambda x: (float(x @ x), 2.0 * x), np.zeros(5))) == []


def test_frozen_weights_keep_their_value_under_l2():
    """The L2 term is added before the frozen positions are cleared: a frozen weight does not move."""
    rng = np.random.default_rng(2)
    target = rng.normal(size=6)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        return float((theta - target) @ (theta - target)), 2.0 * (theta - target)

    theta0 = np.zeros(6)
    theta0[[1, 4]] = 0.7
    result = optimize.lbfgs(objective, theta0, c2=0.5, frozen=np.array([1, 4]), stopping=optimize.StoppingRule(max_iterations=50))
    assert result.theta[1] == 0.7 and result.theta[4] == 0.7
    free = [0, 2, 3, 5]
    np.testing.assert_allclose(result.theta[free], target[free] / 1.5, atol=1e-6)  # argmin of |t - x|^2 + 0.5 x^2


def crf_problem(seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, size=60)
    T, n_attributes, n_labels = int(lengths.sum()), 30, 4
    X = sp.random(T, n_attributes, density=0.15, random_state=seed, format="csr")
    labels = np.argmax(X[:, :n_labels].toarray() + 0.2 * rng.random((T, n_labels)), axis=1)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    params = ParameterLayout(n_attributes, n_labels)
    return Objective(X, offsets, labels, params, 1), params


def test_training_reaches_the_optimum_scipys_lbfgs_b_reaches():
    objective, params = crf_problem(4)
    c2 = 0.3
    stopping = optimize.StoppingRule(max_iterations=1000, epsilon=1e-7, period=0)
    ours = optimize.lbfgs(objective, np.zeros(params.size), c2=c2, stopping=stopping)

    def regularised(theta):
        loss, grad = objective(theta)
        return loss + c2 * theta @ theta, grad + 2 * c2 * theta

    options = {"gtol": 1e-12, "ftol": 0, "maxiter": 10**4}
    reference = scipy.optimize.minimize(regularised, np.zeros(params.size), jac=True, method="L-BFGS-B", options=options)
    assert ours.stop_reason == "epsilon"
    assert ours.history[-1].loss == pytest.approx(reference.fun, rel=1e-12)
    np.testing.assert_allclose(ours.theta, reference.x, atol=1e-5)
    assert all(b.loss <= a.loss for a, b in zip(ours.history, ours.history[1:]))
    assert ours.evaluations <= 1.5 * ours.iterations + 2  # unit steps are taken almost always


# --- OWL-QN (L1 and elastic net) ------------------------------------------------------------


def soft_threshold(z: np.ndarray, t: float) -> np.ndarray:
    return np.sign(z) * np.maximum(np.abs(z) - t, 0.0)


def proximal_gradient(smooth, c1: float, x0: np.ndarray, iterations: int) -> np.ndarray:
    """An independent reference: accelerated proximal gradient (FISTA with backtracking on the
    Lipschitz estimate and a restart whenever the objective goes up) on ``smooth + c1 |x|_1``,
    until an iterate moves no weight by more than 1e-13 or rounding stops all progress."""
    x, y, t, lipschitz = x0.copy(), x0.copy(), 1.0, 1.0
    previous = np.inf
    for _ in range(iterations):
        fy, gy = smooth(y)
        while True:
            z = soft_threshold(y - gy / lipschitz, c1 / lipschitz)
            fz = smooth(z)[0]
            if fz <= fy + gy @ (z - y) + 0.5 * lipschitz * (z - y) @ (z - y):
                break
            lipschitz *= 2.0
        total = fz + c1 * np.abs(z).sum()
        if total > previous:
            if t == 1.0:  # a plain proximal step from the last iterate went up: rounding's floor
                return x
            y, t = x.copy(), 1.0  # momentum overshot: restart from the last iterate
            continue
        previous = total
        if np.max(np.abs(z - x)) < 1e-13:
            return z
        t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        y = z + (t - 1.0) / t_next * (z - x)
        x, t = z, t_next
    raise AssertionError(f"the reference did not converge in {iterations} iterations")


def small_crf_problem(seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, size=25)
    T, n_attributes, n_labels = int(lengths.sum()), 8, 3
    X = sp.random(T, n_attributes, density=0.3, random_state=seed, format="csr")
    labels = np.argmax(X[:, :n_labels].toarray() + 0.3 * rng.random((T, n_labels)), axis=1)
    params = ParameterLayout(n_attributes, n_labels)
    return Objective(X, np.concatenate([[0], np.cumsum(lengths)]), labels, params, 1), params


@pytest.mark.parametrize("seed, c1, c2", [(0, 0.4, 0.3), (1, 1.0, 0.5), (2, 0.2, 1.0)])
def test_owlqn_reaches_the_proximal_gradient_optimum_with_the_same_zeros(seed, c1, c2):
    objective, params = small_crf_problem(seed)

    def smooth(theta):
        loss, grad = objective(theta)
        return loss + c2 * theta @ theta, grad + 2 * c2 * theta

    stopping = optimize.StoppingRule(max_iterations=500, epsilon=1e-9, period=0)
    ours = optimize.lbfgs(objective, np.zeros(params.size), c1=c1, c2=c2, stopping=stopping)
    reference = proximal_gradient(smooth, c1, np.zeros(params.size), 3000)
    assert 0 < np.count_nonzero(reference) < params.size  # the penalty zeroes some weights, not all
    np.testing.assert_array_equal(ours.theta != 0, reference != 0)
    np.testing.assert_allclose(ours.theta, reference, atol=1e-6)
    total = smooth(reference)[0] + c1 * np.abs(reference).sum()
    assert ours.history[-1].loss == pytest.approx(total, rel=1e-10)
    # optimality: |g_i| <= c1 at zeros, g_i = -c1 sign(theta_i) elsewhere
    g = smooth(ours.theta)[1]
    active = ours.theta != 0
    assert np.all(np.abs(g[~active]) <= c1 + 1e-7)
    np.testing.assert_allclose(g[active], -c1 * np.sign(ours.theta[active]), atol=1e-6)


def test_owlqn_steps_stay_in_their_orthant_and_never_raise_the_objective():
    objective, params = small_crf_problem(3)
    c1, c2 = 0.3, 0.05
    x0 = np.random.default_rng(3).normal(scale=0.5, size=params.size)  # a warm start with mixed signs
    previous, previous_pg, totals, zeros_seen = x0.copy(), None, [], 0

    def smooth(theta):
        loss, grad = objective(theta)
        return loss + c2 * theta @ theta, grad + 2 * c2 * theta

    value, grad = smooth(x0)
    previous_pg = quasi_newton.pseudo_gradient(x0, grad, c1, np.empty(params.size))
    totals.append(value + c1 * np.abs(x0).sum())
    iterations = quasi_newton.orthant_wise_minimise(smooth, x0, c1)
    with pytest.raises(quasi_newton.LineSearchError):  # run until rounding leaves no decrease to find
        for k, (x, total, pg) in enumerate(iterations):
            orthant = np.where(previous != 0, np.sign(previous), -np.sign(previous_pg))
            assert np.all(x * orthant >= 0), f"iteration {k + 1} left its orthant"
            assert np.all(x[orthant == 0] == 0)
            assert total <= totals[-1]
            assert total == pytest.approx(smooth(x)[0] + c1 * np.abs(x).sum(), rel=1e-14)
            zeros_seen += int(np.sum((previous != 0) & (x == 0)))
            totals.append(total)
            previous, previous_pg = x.copy(), pg.copy()
    assert len(totals) > 20 and zeros_seen > 0  # weights were set to zero by the projection on the way
    assert totals[-1] < totals[0]


def test_owlqn_keeps_frozen_weights_and_a_zero_pseudo_gradient_ends_at_once():
    rng = np.random.default_rng(4)
    target = rng.normal(size=8)

    def objective(theta):
        return float((theta - target) @ (theta - target)), 2.0 * (theta - target)

    theta0 = np.zeros(8)
    theta0[[2, 5]] = [0.7, -0.3]  # frozen at non-zero values: the penalty must not move them
    frozen = np.array([2, 5, 6])  # and one frozen at zero
    result = optimize.lbfgs(objective, theta0, c1=0.4, c2=0.0, frozen=frozen, stopping=optimize.StoppingRule(max_iterations=100))
    assert result.theta[2] == 0.7 and result.theta[5] == -0.3 and result.theta[6] == 0.0
    free = [0, 1, 3, 4, 7]  # argmin of (x - t)^2 + 0.4 |x| is the soft threshold of t at 0.2
    np.testing.assert_allclose(result.theta[free], soft_threshold(target[free], 0.2), atol=1e-8)
    # a start that is already optimal: no iteration, the start returned
    assert list(quasi_newton.orthant_wise_minimise(lambda x: (float(x @ x), 2 * x), np.zeros(4), 1.0)) == []
    with pytest.raises(ValueError, match="c1 > 0"):
        next(quasi_newton.orthant_wise_minimise(objective, np.zeros(8), 0.0))
    with pytest.raises(ValueError, match="not finite"):
        next(quasi_newton.orthant_wise_minimise(lambda x: (np.nan, x), np.ones(2), 1.0))


def test_owlqn_warm_started_at_its_optimum_stays_and_from_elsewhere_returns_to_it():
    objective, params = small_crf_problem(5)
    stopping = optimize.StoppingRule(max_iterations=500, epsilon=1e-8, period=0)
    cold = optimize.lbfgs(objective, np.zeros(params.size), c1=0.5, c2=0.2, stopping=stopping)
    again = optimize.lbfgs(objective, cold.theta, c1=0.5, c2=0.2, stopping=stopping)
    assert again.iterations <= 3
    np.testing.assert_allclose(again.theta, cold.theta, atol=1e-7)
    elsewhere = cold.theta + np.random.default_rng(5).normal(scale=0.3, size=params.size)
    back = optimize.lbfgs(objective, elsewhere, c1=0.5, c2=0.2, stopping=stopping)
    np.testing.assert_array_equal(back.theta != 0, cold.theta != 0)
    np.testing.assert_allclose(back.theta, cold.theta, atol=1e-6)
    assert back.history[0].loss > cold.history[-1].loss


def test_a_failing_owlqn_line_search_keeps_the_last_point():
    """An objective that is NaN everywhere but at the start: no step gives a decrease, the
    search gives up after its trials and the starting point is the result."""

    def objective(theta):
        if np.any(theta != 0):
            return np.nan, np.full_like(theta, np.nan)
        return 1.0, np.full_like(theta, -2.0)

    result = optimize.lbfgs(objective, np.zeros(3), c1=0.5, c2=0.0, max_linesearch=5)
    assert result.stop_reason.startswith("line search") and result.iterations == 0
    np.testing.assert_array_equal(result.theta, np.zeros(3))
    assert result.evaluations == 6

"""Limited-memory quasi-Newton minimisers: L-BFGS for smooth objectives, with the More-Thuente
line search (CRFsuite's default), and OWL-QN for a smooth objective plus ``c1 * |x|_1`` (Andrew
and Gao, ICML 2007; CRFsuite's L1 trainer), with the backtracking search CRFsuite uses for it.
Both take their directions from one two-loop recursion (:class:`CurvaturePairs`).

Written here rather than taken from scipy because the work per iteration decides training time
once the objective is fast: scipy's L-BFGS-B solves a bounded problem (Cauchy point, subspace
minimisation) and copies the variables and gradient between Python and Fortran on every call,
which with millions of weights is much of an iteration. Here an iteration is the two-loop recursion
(2m dot products and 2m BLAS axpys over n) and a few vector updates, in place.

The line search finds a step satisfying the strong Wolfe conditions
``f(x + a d) <= f(x) + ftol a g.d`` and ``|g(x + a d).d| <= gtol |g.d|`` by safeguarded cubic and
quadratic interpolation (Moré and Thuente, ACM TOMS 20(3), 1994), with CRFsuite's constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from scipy.linalg import blas

Function = Callable[[np.ndarray], tuple[float, np.ndarray]]


class LineSearchError(RuntimeError):
    """No step met the Wolfe conditions within the allowed trials (or the interval collapsed)."""


@dataclass(frozen=True)
class WolfeConditions:
    ftol: float = 1e-4  # sufficient decrease
    gtol: float = 0.9  # curvature
    xtol: float = 1e-16  # relative width of the interval of uncertainty at which to give up
    min_step: float = 1e-20
    max_step: float = 1e20


class CurvaturePairs:
    """The last ``m`` steps ``s = x' - x`` and gradient changes ``y = g' - g`` as rows of two
    (m, n) arrays (the oldest row is overwritten), and the inverse-Hessian product they define."""

    def __init__(self, m: int, n: int) -> None:
        if m < 1:
            raise ValueError(f"the memory needs at least one pair, not {m}")
        self.s, self.y = np.empty((m, n)), np.empty((m, n))
        self.rho = np.zeros(m)  # 1 / (s . y) per row
        self.rows: list[int] = []  # rows in use, oldest first

    def push(self, x_new: np.ndarray, x: np.ndarray, g_new: np.ndarray, g: np.ndarray) -> bool:
        """Store the pair of one accepted step. When ``s . y`` is not positive (the approximation
        would become indefinite) the pair is not stored and False is returned; if the memory was
        full, the oldest pair is gone all the same (its row was written over)."""
        full = len(self.rows) == len(self.rho)
        row = self.rows.pop(0) if full else len(self.rows)
        s, y = self.s[row], self.y[row]
        np.subtract(x_new, x, out=s)
        np.subtract(g_new, g, out=y)
        sy = float(s @ y)
        if not sy > np.finfo(float).eps * float(y @ y):
            if full:  # the oldest pair was overwritten: its row stays in use, empty
                self.rho[row] = 0.0
                self.rows.insert(0, row)
            return False
        self.rho[row] = 1.0 / sy
        self.rows.append(row)
        return True

    def direction(self, g: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out = -H g`` (n,) by the two-loop recursion; with no pairs, ``-g``. ``H`` starts from
        ``(s.y / y.y) I`` of the newest pair. ``out``: a C-contiguous float64 array (BLAS
        updates it in place)."""
        if not (out.flags.c_contiguous and out.dtype == np.float64):
            raise ValueError("out must be a C-contiguous float64 array")
        np.negative(g, out=out)
        rows = [r for r in self.rows if self.rho[r] > 0]
        alpha = dict.fromkeys(rows, 0.0)
        for r in reversed(rows):
            alpha[r] = self.rho[r] * float(self.s[r] @ out)
            blas.daxpy(self.y[r], out, a=-alpha[r])
        if rows:
            last = rows[-1]
            out *= 1.0 / (self.rho[last] * float(self.y[last] @ self.y[last]))  # s.y / y.y
        for r in rows:
            beta = self.rho[r] * float(self.y[r] @ out)
            blas.daxpy(self.s[r], out, a=alpha[r] - beta)
        return out


def _cubic_ratio(u: float, fu: float, du: float, v: float, fv: float, dv: float) -> tuple[float, float]:
    """(r, gamma) for the cubic interpolating (u, fu, du) and (v, fv, dv): its minimiser is
    ``u + r (v - u)``; gamma = 0 when the cubic has no minimiser beyond u (a negative
    discriminant, possible only from rounding where one is expected, counts as 0)."""
    theta = 3.0 * (fu - fv) / (v - u) + du + dv
    scale = max(abs(theta), abs(du), abs(dv))
    gamma = scale * math.sqrt(max((theta / scale) ** 2 - (du / scale) * (dv / scale), 0.0))
    if v < u:
        gamma = -gamma
    return ((gamma - du) + theta) / (((gamma - du) + gamma) + dv), gamma


def _cubic_step(u: float, fu: float, du: float, v: float, fv: float, dv: float) -> float:
    return u + _cubic_ratio(u, fu, du, v, fv, dv)[0] * (v - u)


def _next_trial(best: tuple, other: tuple, trial: tuple, bracketed: bool, low: float, high: float) -> tuple:
    """One interval update of the More-Thuente search. ``best`` (the step with the lowest value
    so far), ``other`` (the interval's other end) and ``trial`` are (step, value, slope); ``low``,
    ``high`` bound the new step while no minimiser is bracketed. Returns (next step, bracketed,
    best, other)."""
    (bx, fx, dx), (sp, fp, dp) = best, trial
    opposite = dp * math.copysign(1.0, dx) < 0
    if fp > fx:  # higher value: a minimiser lies between best and trial
        cubic = _cubic_step(bx, fx, dx, sp, fp, dp)
        quadratic = bx + dx / ((fx - fp) / (sp - bx) + dx) / 2.0 * (sp - bx)
        step = cubic if abs(cubic - bx) < abs(quadratic - bx) else cubic + (quadratic - cubic) / 2.0
        bracketed = True
    elif opposite:  # lower value, the slope changed sign: a minimiser lies between trial and best
        cubic = _cubic_step(sp, fp, dp, bx, fx, dx)
        secant = sp + dp / (dp - dx) * (bx - sp)
        step = cubic if abs(cubic - sp) > abs(secant - sp) else secant
        bracketed = True
    elif abs(dp) < abs(dx):  # lower value, same sign, the slope shrinks in size
        ratio, gamma = _cubic_ratio(sp, fp, dp, bx, fx, dx)
        if ratio < 0 and gamma != 0:
            cubic = sp + ratio * (bx - sp)
        else:  # the cubic does not turn beyond the trial: extrapolate
            cubic = high if sp > bx else low
        secant = sp + dp / (dp - dx) * (bx - sp)
        if bracketed:
            step = cubic if abs(cubic - sp) < abs(secant - sp) else secant
            toward = sp + 0.66 * (other[0] - sp)
            step = min(toward, step) if sp > bx else max(toward, step)
        else:
            step = cubic if abs(cubic - sp) > abs(secant - sp) else secant
            step = min(high, max(low, step))
    elif bracketed:  # lower value, same sign, the slope does not shrink: the minimiser is toward other
        step = _cubic_step(sp, fp, dp, *other) if math.isfinite(other[1]) else sp + 0.5 * (other[0] - sp)
    else:
        step = high if sp > bx else low
    if fp > fx:
        other = trial
    else:
        if opposite:
            other = best
        best = trial
    return step, bracketed, best, other


def line_search(
    fun: Function,
    x: np.ndarray,
    f0: float,
    g0: np.ndarray,
    d: np.ndarray,
    step: float,
    out: np.ndarray,
    max_trials: int = 20,
    wolfe: WolfeConditions = WolfeConditions(),
) -> tuple[float, float, np.ndarray, int]:
    """Find ``a`` with ``x + a d`` meeting the strong Wolfe conditions, trying ``step`` first.

    The accepted point is written into ``out`` (n,). Returns (a, f(out), g(out), evaluations).
    When no step is found in ``max_trials`` evaluations or rounding leaves no room to progress,
    the lowest point tried is returned if it is below ``f0`` (a decrease is not thrown away;
    CRFsuite's and L-BFGS-B's searches go back to ``x`` instead); otherwise, and if ``d`` is not
    a descent direction, :class:`LineSearchError` is raised."""
    slope0 = float(g0 @ d)
    if not slope0 < 0:
        raise LineSearchError(f"not a descent direction (g.d = {slope0:g})")
    decrease = wolfe.ftol * slope0  # the sufficient-decrease line: f0 + a * decrease
    best = other = (0.0, f0, slope0)
    bracketed, stage_one = False, True
    width = wolfe.max_step - wolfe.min_step
    previous_width = 2.0 * width
    low, high = 0.0, step + 4.0 * step
    best_value, best_grad = f0, None  # f and g at best as evaluated (best[1] is rounded by stage 1's shifts)

    def give_up(problem: str, trials: int) -> tuple[float, float, np.ndarray, int]:
        if best_grad is None or not best_value < f0:
            raise LineSearchError(problem)
        np.multiply(d, best[0], out=out)  # the same operations as when it was tried: the same point
        np.add(out, x, out=out)
        return best[0], best_value, best_grad, trials

    def shift(p: tuple, sign: float) -> tuple:  # (a, f, f') -> (a, psi, psi') and back (sign -1)
        return p[0], p[1] - sign * (f0 + p[0] * decrease), p[2] - sign * decrease

    for trial_number in range(1, max_trials + 1):
        np.multiply(d, step, out=out)
        out += x
        value, grad = fun(out)
        slope = float(grad @ d)
        line = f0 + step * decrease
        if not (math.isfinite(value) and math.isfinite(slope)):  # overflow: back off toward the best step
            other, bracketed = (step, math.inf, math.inf), True
            low, high = min(best[0], step), max(best[0], step)
            step = best[0] + 0.5 * (step - best[0])
            continue
        if value <= line and abs(slope) <= wolfe.gtol * -slope0:
            return step, value, grad, trial_number
        problem = None
        if bracketed and (step <= low or step >= high):
            problem = "rounding errors prevent progress"
        elif bracketed and high - low <= wolfe.xtol * high:
            problem = "the interval of uncertainty is below xtol"
        elif step == wolfe.max_step and value <= line and slope <= decrease:
            problem = "the step is at its maximum"
        elif step == wolfe.min_step and (value > line or slope >= decrease):
            problem = "the step is at its minimum"
        if problem is not None:
            if value < f0 and value <= best[1]:  # the best this search can do; take the decrease
                return step, value, grad, trial_number
            return give_up(problem, trial_number)
        if stage_one and value <= line and slope >= 0:
            stage_one = False
        trial = (step, value, slope)
        try:
            if stage_one and line < value <= best[1]:
                # interpolate psi(a) = f(a) - f0 - a * decrease instead: same minimisers, and a
                # lower value of psi is a step that keeps sufficient decrease
                step, bracketed, best, other = _next_trial(shift(best, 1), shift(other, 1), shift(trial, 1), bracketed, low, high)
                best, other = shift(best, -1), shift(other, -1)
            else:
                step, bracketed, best, other = _next_trial(best, other, trial, bracketed, low, high)
        except (ArithmeticError, ValueError) as error:  # a degenerate interpolation (equal points)
            if value <= best[1]:
                best, best_value, best_grad = trial, value, grad
            return give_up(f"the interpolation broke down ({error})", trial_number)
        if best[0] == trial[0]:
            best_value, best_grad = value, grad
        if bracketed:
            if abs(other[0] - best[0]) >= 0.66 * previous_width:
                step = best[0] + 0.5 * (other[0] - best[0])  # the interval shrinks too slowly: bisect
            previous_width, width = width, abs(other[0] - best[0])
            low, high = min(best[0], other[0]), max(best[0], other[0])
        else:
            low, high = step + 1.1 * (step - best[0]), step + 4.0 * (step - best[0])
        step = min(max(step, wolfe.min_step), wolfe.max_step)
        if bracketed and (step <= low or step >= high or high - low <= wolfe.xtol * high):
            step = best[0]  # no further progress possible: try the best step so far
    return give_up(f"no step met the Wolfe conditions in {max_trials} trials", max_trials)


def minimise(
    fun: Function,
    x0: np.ndarray,
    num_memories: int = 6,
    max_trials: int = 20,
    wolfe: WolfeConditions = WolfeConditions(),
) -> Iterator[tuple[np.ndarray, float, np.ndarray]]:
    """L-BFGS from ``x0``: yields (x (n,), f(x), gradient (n,)) after every iteration until the
    caller stops asking, or the gradient is zero. The first step is ``1 / ||g||`` along ``-g``
    (CRFsuite's), later ones start at 1. A line search that finds no lower point raises
    :class:`LineSearchError`; the last yielded point is then the best one. A value or gradient
    at ``x0`` that is not finite raises ValueError.

    ``fun(x)`` returns (value, a new gradient array). The yielded ``x`` is a buffer the next
    iteration but one overwrites: copy it to keep it."""
    x = np.array(x0, dtype=np.float64)
    value, grad = fun(x)
    if not (math.isfinite(value) and np.isfinite(grad).all()):
        raise ValueError(f"the objective is not finite at the starting point (value {value})")
    if not np.any(grad):
        return
    pairs = CurvaturePairs(num_memories, x.size)
    direction = np.negative(grad)
    step = 1.0 / float(np.linalg.norm(direction))
    trial = np.empty_like(x)
    while True:
        step, new_value, new_grad, _ = line_search(fun, x, value, grad, direction, step, trial, max_trials, wolfe)
        pairs.push(trial, x, new_grad, grad)
        x, trial = trial, x
        value, grad = new_value, new_grad
        yield x, value, grad
        if not np.any(grad):
            return
        pairs.direction(grad, out=direction)
        step = 1.0


def l1_term(x: np.ndarray, c1: float | np.ndarray) -> float:
    """``sum_i c1_i |x_i|`` for ``c1`` a number or an array (n,) of per-coordinate strengths."""
    return float(np.abs(x) @ c1) if isinstance(c1, np.ndarray) else c1 * float(np.abs(x).sum())


def pseudo_gradient(x: np.ndarray, g: np.ndarray, c1: float | np.ndarray, out: np.ndarray) -> np.ndarray:
    """OWL-QN's pseudo-gradient of ``f(x) + c1 |x|_1`` (n,) into ``out``, from the smooth part's
    gradient ``g``: ``g + c1 sign(x)`` where ``x != 0``; at ``x == 0`` the one-sided derivative
    that points downhill (``g + c1`` if ``g < -c1``, ``g - c1`` if ``g > c1``), else 0 (zero is
    optimal along that coordinate). ``c1``: a number or per-coordinate strengths (n,)."""
    np.copysign(c1, x, out=out)  # +-c1 by the sign of x (also at x == +-0: fixed below)
    out += g
    zero = x == 0
    at_zero = g[zero]
    c1 = c1[zero] if isinstance(c1, np.ndarray) else c1
    out[zero] = np.where(at_zero < -c1, at_zero + c1, np.where(at_zero > c1, at_zero - c1, 0.0))
    return out


def orthant_wise_minimise(
    fun: Function,
    x0: np.ndarray,
    c1: float | np.ndarray,
    num_memories: int = 6,
    max_trials: int = 20,
    ftol: float = 1e-4,
    min_step: float = 1e-20,
    fixed: np.ndarray | None = None,
) -> Iterator[tuple[np.ndarray, float, np.ndarray]]:
    """OWL-QN from ``x0`` on ``F(x) = f(x) + c1 |x|_1`` (``c1`` a number, or per-coordinate
    strengths (n,)): yields (x (n,), F(x), pseudo-gradient
    (n,)) after every iteration until the caller stops asking or the pseudo-gradient is zero.

    ``fun(x)`` returns (f(x), a new gradient array of f). Each iteration takes the direction
    ``d = -H pg`` of the two-loop recursion (pairs of steps and changes of f's gradient) and
    zeroes the components whose sign disagrees with ``-pg``; the line search tries ``x + a d``,
    with every coordinate that would leave the orthant of the current point (at a zero, the
    orthant of ``-pg``) set to zero, halving ``a`` (from 1; from ``1 / ||pg||`` at the start)
    until ``F(x') <= F(x) + ftol pg.(x' - x)`` (CRFsuite's ``line_search_backtracking_owlqn``).
    No trial in ``max_trials``, or a step below ``min_step``, raises :class:`LineSearchError`;
    the last yielded point is then the best one. ``fixed``: positions whose pseudo-gradient is
    taken as 0, so they keep their starting value. A value or gradient at ``x0`` that is not
    finite raises ValueError.

    It follows liblbfgs's OWL-QN (CRFsuite's) step for step, but for three safeguards that a
    convex smooth part never triggers: a pair with ``s.y <= 0`` is not stored, a direction the
    orthant constraint empties falls back to ``-pg``, and a step below ``min_step`` is not tried.

    The yielded ``x`` is a buffer the next iteration but one overwrites: copy it to keep it."""
    if not (np.all(np.isfinite(c1)) and np.all(np.greater(c1, 0))):
        raise ValueError(f"OWL-QN needs a finite c1 > 0, got {c1!r}")
    x = np.array(x0, dtype=np.float64)
    value, grad = fun(x)
    total = value + l1_term(x, c1)
    if not (math.isfinite(total) and np.isfinite(grad).all()):
        raise ValueError(f"the objective is not finite at the starting point (value {value})")
    pg = pseudo_gradient(x, grad, c1, np.empty_like(x))
    if fixed is not None:
        pg[fixed] = 0.0
    if not np.any(pg):
        return
    pairs = CurvaturePairs(num_memories, x.size)
    direction = np.negative(pg)
    orthant = np.empty_like(x)
    trial, moved = np.empty_like(x), np.empty_like(x)
    step = 1.0 / float(np.linalg.norm(pg))
    while True:
        np.copyto(orthant, x)
        np.copyto(orthant, -pg, where=x == 0)  # a zero coordinate may move only downhill
        for _ in range(max_trials):
            np.multiply(direction, step, out=trial)
            trial += x
            trial[np.signbit(trial) != np.signbit(orthant)] = 0.0  # left its orthant (or no orthant: pg = 0)
            trial[orthant == 0] = 0.0
            new_value, new_grad = fun(trial)
            new_total = new_value + l1_term(trial, c1)
            np.subtract(trial, x, out=moved)
            if new_total <= total + ftol * float(pg @ moved):  # False for NaN: back off
                break
            step *= 0.5
            if step < min_step:
                raise LineSearchError(f"the step fell below {min_step:g} without sufficient decrease")
        else:
            raise LineSearchError(f"no step met the sufficient-decrease condition in {max_trials} trials")
        pairs.push(trial, x, new_grad, grad)
        x, trial = trial, x
        value, grad, total = new_value, new_grad, new_total
        pseudo_gradient(x, grad, c1, out=pg)
        if fixed is not None:
            pg[fixed] = 0.0
        yield x, total, pg
        if not np.any(pg):
            return
        pairs.direction(pg, out=direction)
        direction[direction * pg >= 0] = 0.0  # keep only components that descend along -pg
        if not np.any(direction):  # the quasi-Newton direction lies wholly in the wrong orthant
            np.negative(pg, out=direction)
        step = 1.0

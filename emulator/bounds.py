"""Error bounds that tests use as tolerances. Each is proved in proofs/ (file named per function).

NumPy/standard library only.
"""

from __future__ import annotations

U64 = 2.0**-53  # unit roundoff of binary64
U32 = 2.0**-24  # unit roundoff of binary32


def gamma(k: int, u: float = U64) -> float:
    """Higham's gamma_k = k u / (1 - k u), for k u < 1."""
    if k * u >= 1:
        raise ValueError("k*u must be < 1")
    return k * u / (1 - k * u)


def sum_of_squares_order_bound(n_terms: int, computed_sum: float) -> float:
    """Largest possible |a - b| between two fp64 sums of the same n nonnegative, exactly
    representable terms added in any two orders, given one of the computed sums.

    proofs/telemetry.md: each computed sum s^ satisfies |s^ - s| <= gamma_{n-1} s (Higham, Accuracy
    and Stability of Numerical Algorithms, 2nd ed., eq. (4.4) holds for every order of a recursive
    summation, and for nonnegative terms sum |x_i| = s); so |a - b| <= 2 gamma_{n-1} s, and
    s <= s^ / (1 - gamma_{n-1}).
    """
    g = gamma(max(n_terms - 1, 0))
    return 2 * g * computed_sum / (1 - g)


def mean_order_bound(n_terms: int, computed_mean: float, u: float = U32) -> float:
    """Largest possible |a - b| between two means a = fl(S_A / c), b = fl(S_B / c) of the same n
    nonnegative terms, whose sums S_A, S_B were added in two orders, given a (proofs/loss.md):
    |a - b| <= |a| (2 gamma_{n-1} (1 + u) / ((1 - gamma_{n-1}) (1 - u)) + 2 u / (1 - u))."""
    g = gamma(max(n_terms - 1, 0), u)
    return abs(computed_mean) * (2 * g * (1 + u) / ((1 - g) * (1 - u)) + 2 * u / (1 - u))

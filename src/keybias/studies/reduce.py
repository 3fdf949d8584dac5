"""Reductions for claims: NaN never passes, an empty selection never passes.

A judge reduces a column to the one number its claim compares with a bound. Reducing over
NaN or over nothing must not produce a number that looks like evidence, so each function
here either returns a reduction over finite entries, or NaN (which fails the claim by name),
or raises when the caller asks for `strict`. Dropping non-finite entries is never silent:
the caller names it with `drop_nonfinite=True`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


class EmptySelection(ValueError):
    """A claim's data selection is empty."""


class NonFiniteValues(ValueError):
    """A claim's data holds NaN or infinite entries that nobody chose to exclude."""


def finite_values(values: Iterable[float] | Any, what: str, *, drop_nonfinite: bool = False) -> np.ndarray:
    """`values` as a flat float64 array, checked: raise rather than reduce over bad data.

    Raises `NonFiniteValues` (naming `what` and the count) if an entry is NaN or infinite,
    unless `drop_nonfinite`, which drops them explicitly; raises `EmptySelection` if nothing
    is left.
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    bad = ~np.isfinite(arr)
    if bad.any() and not drop_nonfinite:
        raise NonFiniteValues(f"{what}: {int(bad.sum())} of {arr.size} entries are not finite")
    arr = arr[~bad]
    if arr.size == 0:
        raise EmptySelection(f"{what}: the selection is empty")
    return arr


def finite_reduce(
    values, reducer: Callable[[np.ndarray], float], what: str, *,
    drop_nonfinite: bool = False, strict: bool = False,
) -> float:
    """`reducer` over `finite_values(values, what)`; NaN (or, if `strict`, the error) otherwise.

    The NaN makes the claim built on it fail by name (NaN never holds).
    """
    try:
        return float(reducer(finite_values(values, what, drop_nonfinite=drop_nonfinite)))
    except (EmptySelection, NonFiniteValues):
        if strict:
            raise
        return math.nan


def finite_max(values, what: str, **kw) -> float:
    return finite_reduce(values, np.max, what, **kw)


def finite_min(values, what: str, **kw) -> float:
    return finite_reduce(values, np.min, what, **kw)


def finite_mean(values, what: str, **kw) -> float:
    return finite_reduce(values, np.mean, what, **kw)


def finite_median(values, what: str, **kw) -> float:
    return finite_reduce(values, np.median, what, **kw)

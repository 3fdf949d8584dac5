"""Reductions for claims: NaN never passes, an empty selection never passes.

A judge reduces a column to the one number its claim compares with a bound. Reducing over
NaN or over nothing must not produce a number that looks like evidence, so every function here
either reduces over finite entries or fails: by default it returns NaN (a NaN value never holds,
so the claim built on it fails by name), and with `strict=True` it raises.

Leaving entries out is never silent. A caller that means to drop non-finite entries (say, the
rows of a fully masked query, whose softmax is undefined) names the reason in
`exclude_nonfinite="..."` and passes a list as `excluded=`: the reduction appends an `Exclusion`
(what, reason, how many of how many) to it, and the judge hands that list to its `Claim`
(`exclusions=`), which writes it into the claim's record.

Functions: `finite_values` (the checked array), `finite_reduce` (any reducer), and
`finite_max`, `finite_min`, `finite_mean`, `finite_median`, `finite_sum`, `finite_count`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


class EmptySelection(ValueError):
    """A claim's data selection is empty."""


class NonFiniteValues(ValueError):
    """A claim's data holds NaN or infinite entries that nobody chose to exclude."""


@dataclass(frozen=True)
class Exclusion:
    """Entries a reduction left out, and why (recorded with the claim)."""

    what: str
    reason: str
    dropped: int
    total: int

    def __str__(self) -> str:
        return f"{self.what}: {self.dropped} of {self.total} entries left out ({self.reason})"


def finite_values(
    values: Iterable[float] | Any, what: str, *,
    exclude_nonfinite: str | None = None, excluded: list[Exclusion] | None = None,
) -> np.ndarray:
    """`values` as a flat float64 array, checked: raise rather than reduce over bad data.

    Raises `NonFiniteValues` (naming `what` and the count) if an entry is NaN or infinite,
    unless `exclude_nonfinite` names the reason to drop them, in which case `excluded` (a list)
    must be given and receives an `Exclusion` whenever something was dropped. Raises
    `EmptySelection` if nothing is left.
    """
    if exclude_nonfinite is not None:
        if not str(exclude_nonfinite).strip():
            raise ValueError(f"{what}: exclude_nonfinite must name the reason for the exclusion")
        if excluded is None:
            raise ValueError(f"{what}: an exclusion must be recorded; pass a list as excluded= "
                             "and hand it to the claim (Claim(exclusions=...))")
    arr = np.asarray(values, dtype=np.float64).ravel()
    bad = ~np.isfinite(arr)
    if bad.any():
        if exclude_nonfinite is None:
            raise NonFiniteValues(f"{what}: {int(bad.sum())} of {arr.size} entries are not finite")
        excluded.append(Exclusion(what, exclude_nonfinite, int(bad.sum()), int(arr.size)))
    arr = arr[~bad]
    if arr.size == 0:
        raise EmptySelection(f"{what}: the selection is empty")
    return arr


def finite_reduce(
    values, reducer: Callable[[np.ndarray], float], what: str, *,
    exclude_nonfinite: str | None = None, excluded: list[Exclusion] | None = None, strict: bool = False,
) -> float:
    """`reducer` over `finite_values(values, what, ...)`; NaN (or, if `strict`, the error) otherwise.

    The NaN makes the claim built on it fail by name (NaN never holds).
    """
    try:
        arr = finite_values(values, what, exclude_nonfinite=exclude_nonfinite, excluded=excluded)
    except (EmptySelection, NonFiniteValues):
        if strict:
            raise
        return math.nan
    return float(reducer(arr))


def finite_max(values, what: str, **kw) -> float:
    return finite_reduce(values, np.max, what, **kw)


def finite_min(values, what: str, **kw) -> float:
    return finite_reduce(values, np.min, what, **kw)


def finite_mean(values, what: str, **kw) -> float:
    return finite_reduce(values, np.mean, what, **kw)


def finite_median(values, what: str, **kw) -> float:
    return finite_reduce(values, np.median, what, **kw)


def finite_sum(values, what: str, **kw) -> float:
    """The sum; booleans count as 0/1, so this also counts the rows where a condition holds."""
    return finite_reduce(values, np.sum, what, **kw)


def finite_count(flags, what: str, **kw) -> float:
    """How many of `flags` are true (NaN for an empty selection or a missing flag)."""
    return finite_reduce(flags, lambda arr: float(np.count_nonzero(arr)), what, **kw)

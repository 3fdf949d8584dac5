"""The conditions study's judge: pure functions of the measured frame, so a test can hand it
doctored data. Every bound is fixed from theory before any data; the claims name its origin."""

from __future__ import annotations

import math

import pandas as pd

from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim
from keybias.core.reduce import finite_max, finite_min
from keybias.studies.conditions.cases import CASES, NOT_REDUNDANT, REDUNDANT, Case, claim_id

# Bounds, fixed from theory before any data (the claims name these origins):
# float64 has unit roundoff 1.1e-16; a handful of sums of O(1) terms stays below 1e-13
# relative, so 1e-10 leaves three orders of margin for "no effect".
REDUNDANT_MAX = 1e-10
REDUNDANT_ORIGIN = "theory: float64 rounding (unit roundoff 1.1e-16) with three orders of margin"
# A real dependence on the parameter must stand four orders above that tolerance.
BREAK_MIN = 1e-6
BREAK_ORIGIN = "theory: four orders of magnitude above the float64 rounding tolerance"
# Adam divides the gradient by sqrt(v)+eps: a float64 rounding gradient (< 1e-15) over
# eps = 1e-8 moves a parameter by < 1e-7 learning rates; a real gradient moves it by ~1.
ADAM_STILL_MAX = 1e-6
ADAM_STILL_ORIGIN = "theory: a float64 rounding gradient over Adam's eps=1e-8 moves < 1e-7 learning rates"
ADAM_MOVES_MIN = 0.5
ADAM_MOVES_ORIGIN = "theory: Adam's first step moves a coordinate whose gradient exceeds eps by one learning rate"


QUANTITIES = {
    # quantity: (redundant bound, origin, not-redundant bound, origin, what `effect` is)
    "output": (REDUNDANT_MAX, REDUNDANT_ORIGIN, BREAK_MIN, BREAK_ORIGIN,
               "max |out(p + delta) - out(p)| / max |out(p)|"),
    "gradient": (REDUNDANT_MAX, REDUNDANT_ORIGIN, BREAK_MIN, BREAK_ORIGIN,
                 "||dL/db_k|| / ||dL/db_q||"),
    "adam_step": (ADAM_STILL_MAX, ADAM_STILL_ORIGIN, ADAM_MOVES_MIN, ADAM_MOVES_ORIGIN,
                  "max |delta b_k| / lr after one Adam step"),
    "fold": (REDUNDANT_MAX, REDUNDANT_ORIGIN, BREAK_MIN, BREAK_ORIGIN,
             "max |out(folded) - out(original)| / max |out(original)|"),
}


def bounds_for(case: Case) -> tuple[float, str, str]:
    """(bound, comparison, origin) that the case's prediction is judged against."""
    still, still_origin, moves, moves_origin, _ = QUANTITIES[case.quantity]
    if case.predicted == REDUNDANT:
        return still, "<=", still_origin
    return moves, ">=", moves_origin


def _reduce(effects: pd.Series, predicted: str, what: str) -> float:
    """Worst seed for the prediction: the largest effect of a redundant case, the smallest of a
    broken one. A non-finite effect or an empty selection gives NaN, which fails the claim."""
    values = pd.to_numeric(effects, errors="coerce")
    return finite_max(values, what) if predicted == REDUNDANT else finite_min(values, what)


def summary(frame: pd.DataFrame, cases: list[Case] = CASES) -> pd.DataFrame:
    """One row per case: the worst seed, its bound and the verdict (`redundant`/`not_redundant`)."""
    rows = []
    for case in cases:
        sel = frame[(frame["condition"] == case.condition) & (frame["variant"] == case.variant)]
        value = _reduce(sel["effect"], case.predicted, f"effect of {claim_id(case)} over seeds")
        bound, comparison, origin = bounds_for(case)
        still, _, moves, _, _ = QUANTITIES[case.quantity]
        if not math.isfinite(value):
            verdict = "undecided"
        elif value <= still:
            verdict = REDUNDANT
        elif value >= moves:
            verdict = NOT_REDUNDANT
        else:
            verdict = "undecided"
        rows.append({"condition": case.condition, "variant": case.variant, "quantity": case.quantity,
                     "predicted": case.predicted, "seeds": int(sel["seed"].nunique()),
                     "effect": value, "bound": bound, "comparison": comparison,
                     "verdict": verdict, "claim": claim_id(case)})
    return pd.DataFrame(rows)


def judge(frame: pd.DataFrame, cases: list[Case] = CASES) -> list[Claim]:
    """One claim per case (kind `Case.kind`): its worst seed is on the predicted side of its bound."""
    claims = []
    for row, case in zip(summary(frame, cases).itertuples(), cases, strict=True):
        bound, comparison, origin = bounds_for(case)
        claims.append(build_claim(
            claim_id(case), f"{case.statement} (worst of {row.seeds} seeds, float64)",
            value=row.effect, bound=bound, comparison=comparison, kind=case.kind, bound_origin=origin,
            identity=case.statement if case.kind == "proof" else None,
        ))
    return claims


# option with appended slots -> (claim that need_weights changes the output, claim that
# need_weights=True gives the documented output)
QUIRK_CLAIM_IDS = (
    ("add_bias_kv", "cond-quirk-add-bias-kv-need-weights-changes-output",
     "cond-quirk-add-bias-kv-need-weights-true-documented"),
    ("add_zero_attn", "cond-quirk-add-zero-attn-need-weights-changes-output",
     "cond-quirk-add-zero-attn-need-weights-true-documented"),
)


def judge_quirk(rows: pd.DataFrame) -> list[Claim]:
    """Claims on the reproducer. The tests: with appended slots, need_weights changes PyTorch's
    float64 output by more than float64 rounding can (the size of that change, against a bound
    fixed by theory); a PyTorch that applied the given mask on both paths would fail them. The
    consistency checks: need_weights=True gives the documented output, and without appended slots
    both paths agree (PyTorch's documented behaviour, which the reproducer's reference restates)."""
    def value(option: str, column: str) -> float:
        sel = rows.loc[rows["option"] == option, column]
        return float(sel.iloc[0]) if len(sel) == 1 else math.nan

    claims = []
    for option, changes_id, documented_id in QUIRK_CLAIM_IDS:
        claims.append(build_claim(
            changes_id,
            f"With {option} and is_causal=True, nn.MultiheadAttention's float64 output with need_weights=False differs from need_weights=True by more than float64 rounding could cause (largest absolute difference).",
            value=value(option, "max_abs_diff_need_weights"), bound=BREAK_MIN, bound_origin=BREAK_ORIGIN,
        ))
        claims.append(build_claim(
            documented_id,
            f"With {option} and is_causal=True, need_weights=True gives the documented output (the given causal mask, padded for the extra slot) to float64 rounding.",
            value=value(option, "max_abs_diff_true_vs_reference"), bound=REDUNDANT_MAX,
            comparison="<=", bound_origin=REDUNDANT_ORIGIN,
        ))
    claims.append(build_claim(
        "cond-quirk-plain-paths-agree",
        "Without appended slots, need_weights=False and need_weights=True give the same output under is_causal=True, to float64 rounding.",
        value=value("plain", "max_abs_diff_need_weights"), bound=REDUNDANT_MAX,
        comparison="<=", bound_origin=REDUNDANT_ORIGIN,
    ))
    return claims


# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
for _case in CASES:
    _bound, _comparison, _origin = bounds_for(_case)
    register_claim(ClaimSpec(claim_id(_case), "07_conditions", _case.kind, comparison=_comparison, bound=_bound,
                             origin=_origin, value_class="effect"))
# The finding's measurement: the size of the output change that need_weights causes with appended
# slots, against the theory bound of a real dependence (four orders above float64 rounding). It is
# PyTorch's behaviour, not this project's code, that sets the value: a PyTorch that applied the given
# mask on both paths would give a change of float64 rounding and fail it (params/claims/rules.md).
COND_QUIRK_NEED_WEIGHTS_CHANGES_OUTPUT = register_claim(ClaimSpec(
    'cond-quirk-{option}-need-weights-changes-output', '07_conditions', 'test',
    comparison='>=',
    bound=BREAK_MIN,
    origin=BREAK_ORIGIN,
    finding='need-weights-quirk',
    value_class='effect',
    params={'option': ('add-bias-kv', 'add-zero-attn')},
))
# regression checks of PyTorch's documented behaviour, against a reference that restates it: they
# check the reproduction (that the reference and the plain paths are what the documentation says),
# they do not measure the quirk
COND_QUIRK_NEED_WEIGHTS_TRUE_DOCUMENTED = register_claim(ClaimSpec(
    'cond-quirk-{option}-need-weights-true-documented', '07_conditions', 'consistency',
    bound=1e-10,
    origin='theory: float64 rounding (unit roundoff 1.1e-16) with three orders of margin',
    value_class='effect',
    params={'option': ('add-bias-kv', 'add-zero-attn')},
))
COND_QUIRK_PLAIN_PATHS_AGREE = register_claim(ClaimSpec(
    'cond-quirk-plain-paths-agree', '07_conditions', 'consistency',
    bound=1e-10,
    origin='theory: float64 rounding (unit roundoff 1.1e-16) with three orders of margin',
    value_class='effect',
))

"""Notebook 05, judge layer: pure functions from the measured tables to claims and macros.

Nothing here measures or plots; a test hands these functions doctored tables (a change above
rounding, a control without power, a refused family whose b_k was redundant) and checks that
the named claim then fails. Claims are `keybias.core.recorder.Claim`s.

Macro names are written out in full (grep from paper/ finds each); a test checks that they
follow the pattern Pret<variant><quantity><dtype>, the dtype word from
`keybias.studies.params.DTYPE_MACRO`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim
from keybias.core.reduce import (
    finite_max,
    finite_min,
    finite_values,
    require_columns,
    require_finite,
)

# Per (dtype, variant) of the embedding-change table, the macros of its max |change|, 1 - min
# cosine, tolerance and change over the noise floor, in that order.
CHANGE_QUANTITIES = ("max_abs_diff", "cosine_gap", "tolerance", "over_noise_floor")
CHANGE_MACROS = {
    ("float32", "strip_key_bias"): ("PretStripDiffFloatThirtyTwo", "PretStripCosGapFloatThirtyTwo",
                                    "PretStripTolFloatThirtyTwo", "PretStripOverNoiseFloatThirtyTwo"),
    ("float32", "zero_key_bias"): ("PretZeroDiffFloatThirtyTwo", "PretZeroCosGapFloatThirtyTwo",
                                   "PretZeroTolFloatThirtyTwo", "PretZeroOverNoiseFloatThirtyTwo"),
    ("float32", "random_key_bias"): ("PretRandomDiffFloatThirtyTwo", "PretRandomCosGapFloatThirtyTwo",
                                     "PretRandomTolFloatThirtyTwo", "PretRandomOverNoiseFloatThirtyTwo"),
    ("float32", "fold_value_bias"): ("PretFoldDiffFloatThirtyTwo", "PretFoldCosGapFloatThirtyTwo",
                                     "PretFoldTolFloatThirtyTwo", "PretFoldOverNoiseFloatThirtyTwo"),
    ("float32", "strip_and_fold"): ("PretBothDiffFloatThirtyTwo", "PretBothCosGapFloatThirtyTwo",
                                    "PretBothTolFloatThirtyTwo", "PretBothOverNoiseFloatThirtyTwo"),
    ("float32", "random_query_bias_control"): ("PretControlDiffFloatThirtyTwo", "PretControlCosGapFloatThirtyTwo",
                                               "PretControlTolFloatThirtyTwo", "PretControlOverNoiseFloatThirtyTwo"),
    ("float32", "rebatch_unchanged"): ("PretNoiseDiffFloatThirtyTwo", "PretNoiseCosGapFloatThirtyTwo",
                                       "PretNoiseTolFloatThirtyTwo", "PretNoiseOverNoiseFloatThirtyTwo"),
    ("float64", "strip_key_bias"): ("PretStripDiffFloatSixtyFour", "PretStripCosGapFloatSixtyFour",
                                    "PretStripTolFloatSixtyFour", "PretStripOverNoiseFloatSixtyFour"),
    ("float64", "zero_key_bias"): ("PretZeroDiffFloatSixtyFour", "PretZeroCosGapFloatSixtyFour",
                                   "PretZeroTolFloatSixtyFour", "PretZeroOverNoiseFloatSixtyFour"),
    ("float64", "random_key_bias"): ("PretRandomDiffFloatSixtyFour", "PretRandomCosGapFloatSixtyFour",
                                     "PretRandomTolFloatSixtyFour", "PretRandomOverNoiseFloatSixtyFour"),
    ("float64", "fold_value_bias"): ("PretFoldDiffFloatSixtyFour", "PretFoldCosGapFloatSixtyFour",
                                     "PretFoldTolFloatSixtyFour", "PretFoldOverNoiseFloatSixtyFour"),
    ("float64", "strip_and_fold"): ("PretBothDiffFloatSixtyFour", "PretBothCosGapFloatSixtyFour",
                                    "PretBothTolFloatSixtyFour", "PretBothOverNoiseFloatSixtyFour"),
    ("float64", "random_query_bias_control"): ("PretControlDiffFloatSixtyFour", "PretControlCosGapFloatSixtyFour",
                                               "PretControlTolFloatSixtyFour", "PretControlOverNoiseFloatSixtyFour"),
    ("float64", "rebatch_unchanged"): ("PretNoiseDiffFloatSixtyFour", "PretNoiseCosGapFloatSixtyFour",
                                       "PretNoiseTolFloatSixtyFour", "PretNoiseOverNoiseFloatSixtyFour"),
}
CHANGE_DTYPES = ("float32", "float64")
CHANGE_CLAIMS = (("strip_key_bias", "Removing the key bias with strip_key_bias"),
                 ("zero_key_bias", "Setting every key bias to zero"),
                 ("random_key_bias", "Setting every key bias to a large random vector"),
                 ("fold_value_bias", "Folding the value bias with fold_value_bias"),
                 ("strip_and_fold", "Stripping b_k and folding b_v together"))
# A variant whose edited weights equal another variant's: its claim is implied by that one's.
SAME_AS = {"zero_key_bias": "strip_key_bias"}
# The changes the surgery tool makes: it certifies each module in float64 before it returns (and
# rolls back what it cannot certify), so their float64 no-change claims restate the tool's own
# guarantee: consistency checks, not tests (params/claims/rules.md, issue 30, third round).
TOOL_CERTIFIED = ("strip_key_bias", "fold_value_bias", "strip_and_fold")
TESTED_DTYPE = "float64"  # the dtype whose no-change claims are judged on their own (analytic bound)
# The one change made by hand, which the tool does not certify: the test the controls protect.
HAND_EDIT = "random_key_bias"
# Per reference model: the macros of its key-bias entries, its total parameters and the key bias's share.
MODEL_MACROS = {"bert-base": ("PretSavedBertBase", "PretTotalBertBase", "PretFractionBertBase"),
                "bert-large": ("PretSavedBertLarge", "PretTotalBertLarge", "PretFractionBertLarge"),
                "vit-base": ("PretSavedViTBase", "PretTotalViTBase", "PretFractionViTBase"),
                "gpt2": ("PretSavedGPTTwo", "PretTotalGPTTwo", "PretFractionGPTTwo")}


def _claim(claim_id, statement, value, bound, comparison, kind, origin, **extra) -> Claim:
    return build_claim(id=claim_id, statement=statement, value=value, bound=bound, comparison=comparison, kind=kind,
                 bound_origin=origin, **extra)


def pretrained_claims(changes: pd.DataFrame, norms: pd.DataFrame, info: dict,
                      savings: pd.DataFrame) -> tuple[list[Claim], dict]:
    """Claims and macros of notebook 05's MiniLM part.

    * float64 change claims, against the analytic float64 tolerance of the verdict rule (theory):
      setting b_k to a large random vector by hand is the `test` (plausible data, a b_k that is
      not redundant, would fail it); the tool's own edits (strip, fold, both) are `consistency`
      checks, because the tool certifies each module in float64 before it returns and rolls back
      what it cannot certify (TOOL_CERTIFIED); zeroing b_k is the strip's weights again (`implied`).
    * float32 change claims: the float32 tolerance is min(analytic, e_0 + e_1 + tol64), measured
      against the float64 twin, so a float64-redundant row is redundant in float32 by the triangle
      inequality: these are `implied` by the float64 claim of the same change. The float64 rows
      are required: without them the float32 rows would be a test nothing records.
    * each dtype's positive control must exceed that dtype's tolerance; it protects the random
      key bias's test (its min_detectable is the tolerance as a share of the control's change);
    * parameter counts against the configs (consistency: they check module discovery).
    Missing rows raise: a claim is never silently dropped.
    """
    require_columns(changes, ["dtype", "variant", "max_abs_diff", "min_cosine", "tolerance", "over_noise_floor",
                              "tolerance_kind", "parameters_saved"], "changes")
    require_columns(norms, ["bk_norm", "bq_norm", "bv_norm", "bk_over_key_norm", "key_norm_median"], "norms")
    require_columns(savings, ["model", "key_bias_parameters", "total_parameters", "fraction_key_bias",
                              "config_count"], "savings")
    rows = {(r.dtype, r.variant): r for r in changes.itertuples()}
    # an empty or non-finite norm table raises: the norms come from the weights, never from a failed run
    ratio_max = finite_max(norms["bk_norm"] / norms["bq_norm"], "||b_k|| / ||b_q|| per layer", strict=True)

    def norm(column, reduce):
        return reduce(norms[column], f"{column} per layer", strict=True)

    # the ratio of b_k to b_q in one fixed checkpoint is reported (PretBkOverBqMax), not claimed: a
    # bound of one is not a prediction it could plausibly have failed (params/claims/rules.md, issue 30)
    claims: list[Claim] = []
    macros: dict[str, Any] = {
        "PretSentences": info["sentences"], "PretLayers": info["n_layers"], "PretHidden": info["hidden_size"],
        "PretParams": info["n_parameters"], "PretThreads": info["num_threads"],
        "PretBkNormMin": norm("bk_norm", finite_min), "PretBkNormMax": norm("bk_norm", finite_max),
        "PretBqNormMin": norm("bq_norm", finite_min), "PretBqNormMax": norm("bq_norm", finite_max),
        "PretBvNormMin": norm("bv_norm", finite_min), "PretBvNormMax": norm("bv_norm", finite_max),
        "PretBkOverKeyMax": norm("bk_over_key_norm", finite_max),
        "PretKeyNormMin": norm("key_norm_median", finite_min), "PretKeyNormMax": norm("key_norm_median", finite_max),
        "PretBkOverBqMax": ratio_max,
    }
    dtypes = sorted({d for d, _ in rows})
    for dtype in dtypes:
        if dtype not in CHANGE_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r} in changes")
    if TESTED_DTYPE not in dtypes:
        raise ValueError(f"changes has no {TESTED_DTYPE} rows: the other dtypes' claims follow from them")
    for (dtype, variant), names in CHANGE_MACROS.items():
        r = rows.get((dtype, variant))
        for name, quantity in zip(names, CHANGE_QUANTITIES, strict=True):
            if r is None:
                macros[name] = r"\text{(not run)}"
            elif quantity == "over_noise_floor" and not math.isfinite(r.over_noise_floor):
                # the noise floor comes from a rebatched rerun, which this dtype did not have (NaN by design)
                if any(v == "rebatch_unchanged" for d, v in rows if d == dtype):
                    raise ValueError(f"changes: {dtype} {variant} has no ratio to the measured noise floor")
                macros[name] = r"\text{(not measured)}"
            else:
                value = 1 - r.min_cosine if quantity == "cosine_gap" else getattr(r, quantity)
                macros[name] = float(finite_values([value], f"{dtype} {variant} {quantity}")[0])
    for dtype in dtypes:
        control = rows.get((dtype, "random_query_bias_control"))
        if control is None:
            raise ValueError(f"changes has no positive control row for {dtype}")
        origin = ("verdict rule, analytic float64 bound (theory)" if dtype == TESTED_DTYPE else
                  "verdict rule: float32 bound, measured against the float64 twin where it ran")
        for variant, what in CHANGE_CLAIMS:
            r = rows.get((dtype, variant))
            if r is None:
                raise ValueError(f"changes has no {variant} row for {dtype}")
            slug = variant.replace('_', '-')
            claim_id = f"pretrained-{slug}-within-rounding-{dtype}"
            statement = (f"{what} changes the {dtype} sentence embeddings of all-MiniLM-L6-v2 by no more than "
                         "the rounding tolerance; a change of the share given of the random-b_q control's would "
                         "exceed it.")
            value = float(finite_values([r.max_abs_diff], f"{dtype} {variant} change")[0])
            # the smallest change the rule sees is its tolerance: as a share of the control's change
            control_change = float(finite_values([control.max_abs_diff], f"{dtype} control change")[0])
            extra = {"min_detectable": float(r.tolerance) / control_change}
            if dtype != TESTED_DTYPE:
                if r.tolerance_kind != "measured":
                    raise ValueError(f"changes: the {dtype} {variant} tolerance is not measured against its "
                                     f"{TESTED_DTYPE} twin, so its claim would not follow from the twin's")
                claims.append(_claim(claim_id, statement, value, r.tolerance, "<=", "implied",
                                     "min(analytic, e0 + e1 + float64 tolerance): follows from the float64 claim",
                                     implied_by=[f"pretrained-{slug}-within-rounding-{TESTED_DTYPE}"], **extra))
            elif variant in SAME_AS:
                # zeroing b_k is what strip_key_bias does to the weights: the same measurement again
                parent = f"pretrained-{SAME_AS[variant].replace('_', '-')}-within-rounding-{dtype}"
                claims.append(_claim(claim_id, statement, value, r.tolerance, "<=", "implied",
                                     "the same weights as the strip: follows from the strip claim",
                                     implied_by=[parent], **extra))
            elif variant in TOOL_CERTIFIED:
                claims.append(_claim(claim_id, statement, value, r.tolerance, "<=", "consistency",
                                     "verdict rule, analytic float64 bound (theory); the tool certified the "
                                     "edit in float64 before it returned, so a cross-check of that guarantee",
                                     **extra))
            else:
                claims.append(_claim(claim_id, statement, value, r.tolerance, "<=", "test",
                                     "verdict rule, analytic float64 bound (theory)", **extra))
        claims.append(_claim(f"pretrained-control-detected-{dtype}",
                             f"A random query bias of the same size changes the {dtype} embeddings by more than "
                             "the rounding tolerance: the power of the no-change tests.",
                             control.max_abs_diff, control.tolerance, ">", "control", origin,
                             protects=[f"pretrained-{HAND_EDIT.replace('_', '-')}-within-rounding-{TESTED_DTYPE}"]))
    f32 = changes[changes["dtype"] == "float32"]
    measured = int((f32["tolerance_kind"] == "measured").sum())
    macros["PretTolMeasuredCount"] = measured
    macros["PretTolRowCount"] = len(f32)
    macros["PretTolSentence"] = (
        "Every float32 row uses this measured tolerance." if measured == len(f32) else
        f"Without float64 runs ({len(f32) - measured} of {len(f32)} float32 rows here) the tolerance is "
        "the analytic bound of the verdict rule instead.")
    saved = int(info["strip_report"]["parameters_saved"])
    macros["PretSavedStrip"] = saved
    macros["PretSavedBoth"] = int(finite_max(changes.loc[changes["variant"] == "strip_and_fold", "parameters_saved"],
                                             "parameters saved by strip_and_fold", strict=True))
    claims.append(_claim("pretrained-strip-saves-layers-times-hidden",
                         "strip_key_bias removes one hidden-size vector per layer from all-MiniLM-L6-v2.",
                         saved, info["n_layers"] * info["hidden_size"], "==", "consistency",
                         "the config: layers times hidden size"))
    for s in savings[savings["model"].isin(MODEL_MACROS)].itertuples():
        saved_name, total_name, fraction_name = MODEL_MACROS[s.model]
        found, count, fraction = finite_values([s.key_bias_parameters, s.config_count, s.fraction_key_bias],
                                               f"{s.model} parameter counts")
        macros[saved_name] = int(found)
        macros[total_name] = int(s.total_parameters)
        macros[fraction_name] = 100 * float(fraction)
        claims.append(_claim(f"pretrained-saved-{s.model}-matches-config",
                             f"The attention modules found in a {s.model} model built from its standard config hold "
                             "layers times hidden size key-bias entries.",
                             int(found), int(count), "==", "consistency",
                             "the config: layers times hidden size"))
    return claims, macros


def family_claims(table: pd.DataFrame) -> tuple[list[Claim], dict]:
    """Claims and macros of the family table (pure: a test hands it doctored tables).

    * decisions (consistency): every family's decision is the expected one (the issue's list);
    * handled (test): strip + fold leave every handled model's float64 outputs within the bound
      2^-24 max|y| (float32's unit roundoff; fixed before the data);
    * control (test): zeroing b_q by hand moves every handled model beyond that bound, so the
      check could see an edit of the same kind (its smallest such change is the power);
    * refusals needed (test): zeroing b_k by hand moves every refused model beyond the bound.
    A non-finite change or bound of a judged family raises; an empty selection fails the claims."""
    if table.empty:
        raise ValueError("family table is empty")
    require_columns(table, ["expected", "strip", "whole_change", "forced_change", "bound", "certified_max_ratio"],
                    "family table")
    handled = table[table["expected"] == "handled"]
    refused = table[table["expected"] == "refused"]
    if handled.empty or refused.empty:
        raise ValueError("family table needs handled and refused families")
    decided = np.where(table["strip"] == "refused", "refused", "handled")
    wrong = int((decided != table["expected"]).sum())

    # a NaN change or bound raises (the refused families have no whole-model change: NaN by design)
    handled_ratio = finite_max(handled["whole_change"] / handled["bound"], "handled families' change / bound")
    control_ratio = finite_min(handled["forced_change"] / handled["bound"], "handled families' control / bound")
    refused_ratio = finite_min(refused["forced_change"] / refused["bound"], "refused families' change / bound")
    origin = "float32 unit roundoff times the output size (2^-24 max|y|), fixed before the data"
    claims = [
        _claim("pretrained-families-decisions-as-expected",
               "The surgery tool handles every family listed as redundant and refuses every family listed as not.",
               wrong, 0, "==", "consistency", "the issue's list of families"),
        _claim("pretrained-families-handled-unchanged-float64",
               "Removing b_k and folding b_v leaves the float64 outputs of every handled family within float32 "
               "rounding.", handled_ratio, 1.0, "<=", "consistency", origin,
               min_detectable=finite_min(handled["forced_change"], "handled families' control changes")),
        _claim("pretrained-families-control-detected",
               "Zeroing the query bias by hand moves every handled family's outputs beyond float32 rounding: "
               "the power of the no-change test.",
               control_ratio, 1.0, ">", "control", origin, protects=["pretrained-families-handled-unchanged-float64"]),
        _claim("pretrained-families-refusals-needed",
               "Zeroing the key bias by hand moves every refused family's outputs beyond float32 rounding.",
               refused_ratio, 1.0, ">", "test", origin),
    ]
    macros = {
        "PretFamilies": len(table), "PretFamiliesHandled": len(handled), "PretFamiliesRefused": len(refused),
        "PretFamiliesWrong": wrong, "PretFamiliesHandledRatio": handled_ratio,
        "PretFamiliesControlRatio": control_ratio, "PretFamiliesRefusedRatio": refused_ratio,
        # the tool certifies the handled families only (a refused family has no ratio: NaN by design)
        "PretFamiliesCertifiedMax": finite_max(handled["certified_max_ratio"], "handled families' certified ratios",
                                               strict=True),
    }
    return claims, macros


# Per status of the architecture table, the macro of its count.
ARCH_CLASSES = (("removed exactly", "PretArchRemoved"), ("no key bias", "PretArchNoKeyBias"),
                ("refused", "PretArchRefused"), ("not certified", "PretArchNotCertified"),
                ("could not build", "PretArchNotBuilt"))


def architecture_violations(table: pd.DataFrame) -> tuple[int, int, int]:
    """(handled rows over their bound, refused rows whose refusal was not needed, handled rows).

    Handled: the tool changed the model (status "removed exactly", or a fold that was kept);
    its float64 output change must be <= 2^-24 max|y|. Refused: editing b_k by hand (zeroed, or
    shifted) must move the whole model's output, or the refused module's own output on its real
    calls, beyond that module's or model's bound. A NaN change or bound of a judged row raises."""
    require_columns(table, ["status", "fold", "output_change", "output_bound", "naive_change",
                            "naive_unit_change", "naive_unit_bound"], "architecture table")
    handled = table[(table["status"] == "removed exactly") | (table["fold"] == "folded")]
    require_finite(handled, ["output_change", "output_bound"], "handled architectures")
    over = ~(handled["output_change"].astype(float) <= handled["output_bound"].astype(float))
    refused = table[table["status"] == "refused"]
    require_finite(refused, ["naive_change", "output_bound", "naive_unit_change", "naive_unit_bound"],
                   "refused architectures")
    needed = ((refused["naive_change"].astype(float) > refused["output_bound"].astype(float))
              | (refused["naive_unit_change"].astype(float) > refused["naive_unit_bound"].astype(float)))
    return int(over.sum()), int((~needed).sum()), len(handled)


def architecture_claims(table: pd.DataFrame) -> tuple[list[Claim], dict]:
    """The claim and macros of the table over all of transformers (pure: a test hands it
    doctored tables). One `test` claim counts the violations of both halves: a handled
    architecture whose output moved beyond rounding, and a refusal where b_k was redundant.
    An empty table or one with no handled row raises: the claim never passes on nothing."""
    if table.empty:
        raise ValueError("architecture table is empty")
    unknown = set(table["status"]) - {s for s, _ in ARCH_CLASSES}
    if unknown:
        raise ValueError(f"unknown statuses {sorted(unknown)} in the architecture table")
    over, unneeded, n_handled = architecture_violations(table)
    if n_handled == 0:
        raise ValueError("architecture table has no handled architecture: nothing to judge")
    claims = [_claim(
        "pretrained-architectures-handled-exact-refusals-needed",
        "Over the architectures of the installed transformers built as tiny instances, strip and fold never moved a handled model's "
        "float64 output beyond float32 rounding, and every refusal was needed: editing b_k by hand moves the "
        "refused model's or module's output beyond it.",
        over + unneeded, 0, "==", "consistency",
        "the tool's own certification, rerun with the tool's inputs and bound: a cross-check, not a test")]
    counts = table["status"].value_counts()
    macros: dict[str, Any] = {"PretArchTotal": len(table), "PretArchHandled": n_handled,
                              "PretArchFolded": int((table["fold"] == "folded").sum()),
                              "PretArchViolations": over + unneeded, "PretArchHandledOver": over,
                              "PretArchRefusalsNotNeeded": unneeded,
                              "PretArchTimm": int((table["reason"] == "needs timm (not installed)").sum())}
    for status, name in ARCH_CLASSES:
        macros[name] = int(counts.get(status, 0))
    macros["PretArchClassified"] = len(table) - macros["PretArchNotBuilt"]
    return claims, macros

# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
PRETRAINED_CONTROL_DETECTED = register_claim(ClaimSpec(
    'pretrained-control-detected-{dtype}', '05_pretrained', 'control',
    comparison='>',
    origin='verdict rule',
    value_class='f32',
    bound_class='rms_error',
    params={'dtype': ('float32', 'float64')},
))
PRETRAINED_RANDOM_KEY_BIAS_WITHIN_ROUNDING_FLOAT64 = register_claim(ClaimSpec(
    'pretrained-random-key-bias-within-rounding-float64', '05_pretrained', 'test',
    origin='verdict rule, analytic float64 bound (theory)',
    finding='pretrained-strip-exact',
    value_class='noise',
    bound_class='rms_error',
))
# the tool certifies each of these edits in float64 before it returns (params/claims/rules.md)
PRETRAINED_TOOL_EDITS_WITHIN_ROUNDING_FLOAT64 = register_claim(ClaimSpec(
    'pretrained-{variant}-within-rounding-float64', '05_pretrained', 'consistency',
    origin='verdict rule, analytic float64 bound (theory); the tool certified the edit in float64',
    value_class='noise',
    bound_class='rms_error',
    params={'variant': ('strip-key-bias', 'fold-value-bias', 'strip-and-fold')},
))
PRETRAINED_STRIP_SAVES_LAYERS_TIMES_HIDDEN = register_claim(ClaimSpec(
    'pretrained-strip-saves-layers-times-hidden', '05_pretrained', 'consistency',
    comparison='==',
    origin='the config: layers times hidden size',
))
PRETRAINED_SAVED_MATCHES_CONFIG = register_claim(ClaimSpec(
    'pretrained-saved-{model}-matches-config', '05_pretrained', 'consistency',
    comparison='==',
    origin='the config: layers times hidden size',
    params={'model': ('bert-base', 'bert-large', 'vit-base', 'gpt2')},
))
PRETRAINED_FAMILIES_DECISIONS_AS_EXPECTED = register_claim(ClaimSpec(
    'pretrained-families-decisions-as-expected', '05_pretrained', 'consistency',
    comparison='==',
    bound=0.0,
    origin="the issue's list of families",
))
# the tool certifies each handled family before it changes it, so the outcome is the code's
# (params/claims/rules.md, issue 30)
PRETRAINED_FAMILIES_HANDLED_UNCHANGED_FLOAT64 = register_claim(ClaimSpec(
    'pretrained-families-handled-unchanged-float64', '05_pretrained', 'consistency',
    bound=1.0,
    origin='float32 unit roundoff times the output size (2^-24 max|y|), fixed before the data',
    value_class='noise',
))
PRETRAINED_FAMILIES_CONTROL_DETECTED = register_claim(ClaimSpec(
    'pretrained-families-control-detected', '05_pretrained', 'control',
    comparison='>',
    bound=1.0,
    origin='float32 unit roundoff times the output size (2^-24 max|y|), fixed before the data',
    value_class='f32',
))
PRETRAINED_FAMILIES_REFUSALS_NEEDED = register_claim(ClaimSpec(
    'pretrained-families-refusals-needed', '05_pretrained', 'test',
    comparison='>',
    bound=1.0,
    origin='float32 unit roundoff times the output size (2^-24 max|y|), fixed before the data',
    finding='pretrained-strip-exact',
    value_class='f32',
))
PRETRAINED_ARCHITECTURES_HANDLED_EXACT_REFUSALS_NEEDED = register_claim(ClaimSpec(
    'pretrained-architectures-handled-exact-refusals-needed', '05_pretrained', 'consistency',
    comparison='==',
    bound=0.0,
    origin="the tool's own certification, rerun with the tool's inputs and bound: a cross-check, not a test",
))
PRETRAINED_WITHIN_ROUNDING_FLOAT32 = register_claim(ClaimSpec(
    'pretrained-{variant}-within-rounding-float32', '05_pretrained', 'implied',
    # implied by the float64 claim of the same change: the float32 tolerance is measured against it
    origin='min(analytic, e0 + e1 + float64 tolerance): follows from the float64 claim',
    value_class='noise',
    bound_class='rms_error',
    params={'variant': ('strip-key-bias', 'zero-key-bias', 'random-key-bias', 'fold-value-bias', 'strip-and-fold')},
))
PRETRAINED_ZERO_KEY_BIAS_WITHIN_ROUNDING_FLOAT64 = register_claim(ClaimSpec(
    'pretrained-zero-key-bias-within-rounding-float64', '05_pretrained', 'implied',
    origin='the same weights as the strip: follows from the strip claim',
    value_class='noise',
    bound_class='rms_error',
))

"""Notebook 05, judge layer: pure functions from the measured tables to claims and macros.

Nothing here measures or plots; a test hands these functions doctored tables (a change above
rounding, a control without power, a refused family whose b_k was redundant) and checks that
the named claim then fails. Claims are dicts of `Recorder.claim` keywords.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

DTYPE_TAGS = {"float32": "FloatThirtyTwo", "float64": "FloatSixtyFour"}
VARIANT_TAGS = {"strip_key_bias": "Strip", "zero_key_bias": "Zero", "random_key_bias": "Random",
                "fold_value_bias": "Fold", "strip_and_fold": "Both", "random_query_bias_control": "Control",
                "rebatch_unchanged": "Noise"}
CHANGE_CLAIMS = (("strip_key_bias", "Removing the key bias with strip_key_bias"),
                 ("zero_key_bias", "Setting every key bias to zero"),
                 ("random_key_bias", "Setting every key bias to a large random vector"),
                 ("fold_value_bias", "Folding the value bias with fold_value_bias"),
                 ("strip_and_fold", "Stripping b_k and folding b_v together"))
MODEL_TAGS = {"bert-base": "BertBase", "bert-large": "BertLarge", "vit-base": "ViTBase", "gpt2": "GPTTwo"}


def _claim(claim_id, statement, value, bound, comparison, kind, origin, **extra) -> dict[str, Any]:
    return {"claim_id": claim_id, "statement": statement, "value": float(value), "bound": float(bound),
            "comparison": comparison, "kind": kind, "bound_origin": origin, **extra}


def pretrained_claims(changes: pd.DataFrame, norms: pd.DataFrame, info: dict,
                      savings: pd.DataFrame) -> tuple[list[dict], dict]:
    """Claims (dicts for Recorder.claims_from) and macros of notebook 05's MiniLM part.

    * float64 change claims (test): each change of b_k or b_v against the analytic float64
      tolerance of the verdict rule (theory); a surgery that changes outputs fails them.
    * float32 change claims: where float64 also ran, the float32 tolerance is min(analytic,
      e_0 + e_1 + tol64), so a float64-redundant row is redundant in float32 by the triangle
      inequality: these are `implied` by the float64 claim of the same change and not counted.
      Without float64 the analytic float32 tolerance makes them independent `test`s.
    * each dtype's positive control (test) must exceed that dtype's tolerance;
    * b_k smaller than b_q in every layer (test, an observation of the trained model);
    * parameter counts against the configs (consistency: they check module discovery).
    Missing rows raise: a claim is never silently dropped.
    """
    rows = {(r.dtype, r.variant): r for r in changes.itertuples()}
    ratio = norms["bk_norm"] / norms["bq_norm"]
    if ratio.empty or not np.isfinite(ratio).all():
        raise ValueError("bias norm table is empty or has non-finite entries")
    claims = [_claim("pretrained-bk-smaller-than-bq",
                     "In every layer of all-MiniLM-L6-v2 the learned key bias is smaller than the query bias.",
                     ratio.max(), 1.0, "<", "test", "the ratio one: the claim compares the two sizes")]
    macros: dict[str, Any] = {
        "PretSentences": info["sentences"], "PretLayers": info["n_layers"], "PretHidden": info["hidden_size"],
        "PretParams": info["n_parameters"], "PretThreads": info["num_threads"],
        "PretBkNormMin": norms["bk_norm"].min(), "PretBkNormMax": norms["bk_norm"].max(),
        "PretBqNormMin": norms["bq_norm"].min(), "PretBqNormMax": norms["bq_norm"].max(),
        "PretBvNormMin": norms["bv_norm"].min(), "PretBvNormMax": norms["bv_norm"].max(),
        "PretBkOverKeyMax": norms["bk_over_key_norm"].max(),
        "PretKeyNormMin": norms["key_norm_median"].min(), "PretKeyNormMax": norms["key_norm_median"].max(),
        "PretBkOverBqMax": ratio.max(),
    }
    dtypes = sorted({d for d, _ in rows})
    for dtype in dtypes:
        if dtype not in DTYPE_TAGS:
            raise ValueError(f"unknown dtype {dtype!r} in changes")
    for dtype, tag in DTYPE_TAGS.items():
        for variant, short in VARIANT_TAGS.items():
            r = rows.get((dtype, variant))
            for kind, value in (("Diff", "max_abs_diff"), ("CosGap", None), ("Tol", "tolerance"),
                                ("OverNoise", "over_noise_floor")):
                if r is None:
                    macros[f"Pret{short}{kind}{tag}"] = r"\text{(not run)}"
                else:
                    macros[f"Pret{short}{kind}{tag}"] = float(1 - r.min_cosine if value is None else getattr(r, value))
    for dtype in dtypes:
        control = rows.get((dtype, "random_query_bias_control"))
        if control is None:
            raise ValueError(f"changes has no positive control row for {dtype}")
        origin = ("verdict rule, analytic float64 bound (theory)" if dtype == "float64" else
                  "verdict rule: float32 bound, measured against the float64 twin where it ran")
        claims.append(_claim(f"pretrained-control-detected-{dtype}",
                             f"A random query bias of the same size changes the {dtype} embeddings by more than "
                             "the rounding tolerance.", control.max_abs_diff, control.tolerance, ">", "test", origin))
        for variant, what in CHANGE_CLAIMS:
            r = rows.get((dtype, variant))
            if r is None:
                raise ValueError(f"changes has no {variant} row for {dtype}")
            claim_id = f"pretrained-{variant.replace('_', '-')}-within-rounding-{dtype}"
            statement = (f"{what} changes the {dtype} sentence embeddings of all-MiniLM-L6-v2 by no more than "
                         "the rounding tolerance.")
            value = r.max_abs_diff if np.isfinite(r.max_abs_diff) else math.inf
            extra = {"min_detectable": float(control.max_abs_diff)}
            if dtype == "float32" and r.tolerance_kind == "measured":
                parent = f"pretrained-{variant.replace('_', '-')}-within-rounding-float64"
                claims.append(_claim(claim_id, statement, value, r.tolerance, "<=", "implied",
                                     "min(analytic, e0 + e1 + float64 tolerance): follows from the float64 claim",
                                     implied_by=[parent], **extra))
            else:
                claims.append(_claim(claim_id, statement, value, r.tolerance, "<=", "test",
                                     f"verdict rule, analytic {dtype} bound (theory)", **extra))
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
    macros["PretSavedBoth"] = int(changes.loc[changes["variant"] == "strip_and_fold", "parameters_saved"].max())
    claims.append(_claim("pretrained-strip-saves-layers-times-hidden",
                         "strip_key_bias removes one hidden-size vector per layer from all-MiniLM-L6-v2.",
                         saved, info["n_layers"] * info["hidden_size"], "==", "consistency",
                         "the config: layers times hidden size"))
    for s in savings[savings["model"].isin(MODEL_TAGS)].itertuples():
        tag = MODEL_TAGS[s.model]
        macros[f"PretSaved{tag}"] = int(s.key_bias_parameters)
        macros[f"PretTotal{tag}"] = int(s.total_parameters)
        macros[f"PretFraction{tag}"] = 100 * float(s.fraction_key_bias)
        claims.append(_claim(f"pretrained-saved-{s.model}-matches-config",
                             f"The attention modules found in a {s.model} model built from its standard config hold "
                             "layers times hidden size key-bias entries.",
                             s.key_bias_parameters, s.config_count, "==", "consistency",
                             "the config: layers times hidden size"))
    return claims, macros


def family_claims(table: pd.DataFrame) -> tuple[list[dict], dict]:
    """Claims and macros of the family table (pure: a test hands it doctored tables).

    * decisions (consistency): every family's decision is the expected one (the issue's list);
    * handled (test): strip + fold leave every handled model's float64 outputs within the bound
      2^-24 max|y| (float32's unit roundoff; fixed before the data);
    * control (test): zeroing b_q by hand moves every handled model beyond that bound, so the
      check could see an edit of the same kind (its smallest such change is the power);
    * refusals needed (test): zeroing b_k by hand moves every refused model beyond the bound.
    Non-finite or empty selections fail the claims."""
    if table.empty:
        raise ValueError("family table is empty")
    handled = table[table["expected"] == "handled"]
    refused = table[table["expected"] == "refused"]
    if handled.empty or refused.empty:
        raise ValueError("family table needs handled and refused families")
    decided = np.where(table["strip"] == "refused", "refused", "handled")
    wrong = int((decided != table["expected"]).sum())

    def worst(values: pd.Series, bound: pd.Series, largest: bool) -> float:
        ratio = (values / bound).to_numpy(dtype=float)
        if not np.isfinite(ratio).all() or ratio.size == 0:
            return math.inf if largest else -math.inf
        return float(ratio.max() if largest else ratio.min())

    handled_ratio = worst(handled["whole_change"], handled["bound"], largest=True)
    control_ratio = worst(handled["forced_change"], handled["bound"], largest=False)
    refused_ratio = worst(refused["forced_change"], refused["bound"], largest=False)
    origin = "float32 unit roundoff times the output size (2^-24 max|y|), fixed before the data"
    claims = [
        _claim("pretrained-families-decisions-as-expected",
               "The surgery tool handles every family listed as redundant and refuses every family listed as not.",
               wrong, 0, "==", "consistency", "the issue's list of families"),
        _claim("pretrained-families-handled-unchanged-float64",
               "Removing b_k and folding b_v leaves the float64 outputs of every handled family within float32 "
               "rounding.", handled_ratio, 1.0, "<=", "test", origin,
               min_detectable=float((handled["forced_change"]).min())),
        _claim("pretrained-families-control-detected",
               "Zeroing the query bias by hand moves every handled family's outputs beyond float32 rounding.",
               control_ratio, 1.0, ">", "test", origin),
        _claim("pretrained-families-refusals-needed",
               "Zeroing the key bias by hand moves every refused family's outputs beyond float32 rounding.",
               refused_ratio, 1.0, ">", "test", origin),
    ]
    macros = {
        "PretFamilies": len(table), "PretFamiliesHandled": len(handled), "PretFamiliesRefused": len(refused),
        "PretFamiliesWrong": wrong, "PretFamiliesHandledRatio": handled_ratio,
        "PretFamiliesControlRatio": control_ratio, "PretFamiliesRefusedRatio": refused_ratio,
        "PretFamiliesCertifiedMax": float(np.nanmax(table["certified_max_ratio"].to_numpy(dtype=float))),
    }
    return claims, macros


ARCH_CLASSES = (("removed exactly", "Removed"), ("no key bias", "NoKeyBias"), ("refused", "Refused"),
                ("not certified", "NotCertified"), ("could not build", "NotBuilt"))


def architecture_violations(table: pd.DataFrame) -> tuple[int, int, int]:
    """(handled rows over their bound, refused rows whose refusal was not needed, handled rows).

    Handled: the tool changed the model (status "removed exactly", or a fold that was kept);
    its float64 output change must be <= 2^-24 max|y|. Refused: editing b_k by hand (zeroed, or
    shifted) must move the whole model's output, or the refused module's own output on its real
    calls, beyond that module's or model's bound. NaN counts as a violation."""
    handled = table[(table["status"] == "removed exactly") | (table["fold"] == "folded")]
    over = ~(handled["output_change"].astype(float) <= handled["output_bound"].astype(float))
    refused = table[table["status"] == "refused"]
    needed = ((refused["naive_change"].astype(float) > refused["output_bound"].astype(float))
              | (refused["naive_unit_change"].astype(float) > refused["naive_unit_bound"].astype(float)))
    return int(over.sum()), int((~needed).sum()), len(handled)


def architecture_claims(table: pd.DataFrame) -> tuple[list[dict], dict]:
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
        over + unneeded, 0, "==", "test",
        "float32 unit roundoff times the output size (2^-24 max|y|), fixed before the data; zero violations")]
    counts = table["status"].value_counts()
    macros: dict[str, Any] = {"PretArchTotal": len(table), "PretArchHandled": n_handled,
                              "PretArchFolded": int((table["fold"] == "folded").sum()),
                              "PretArchViolations": over + unneeded, "PretArchHandledOver": over,
                              "PretArchRefusalsNotNeeded": unneeded,
                              "PretArchTimm": int((table["reason"] == "needs timm (not installed)").sum())}
    for status, tag in ARCH_CLASSES:
        macros[f"PretArch{tag}"] = int(counts.get(status, 0))
    macros["PretArchClassified"] = len(table) - macros["PretArchNotBuilt"]
    return claims, macros

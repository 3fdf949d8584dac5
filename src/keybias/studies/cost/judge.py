"""Judging the cost benchmark: the byte model, claims and macros from DataFrames alone.

Every function here is pure (DataFrames and dicts in, DataFrames, claims and macros out), so
a test can hand it doctored timings: a saving larger than the removed work, a noisy control.
Only one timing claim gates the build, and it holds at any timing resolution; what the timing
resolved on this machine is reported as machine-specific macros, never claimed. Claims are
`keybias.core.recorder.Claim`s; macro names are written out in full.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim
from keybias.core.reduce import (
    finite_max,
    finite_median,
    finite_min,
    finite_reduce,
    require_columns,
    require_finite,
)
from keybias.studies.cost.memory import OPTIMIZER_STATES, mha_param_count
from keybias.studies.cost.stats import HEADLINE_PHASE, LEVEL


def _max(values, what: str) -> float:
    """A macro's maximum: raises on NaN or on an empty selection."""
    return finite_max(values, what, strict=True)


def _min(values, what: str) -> float:
    return finite_min(values, what, strict=True)

# Peak memory bandwidth of current data-centre GPUs, for the byte model's *prediction* only
# (nothing here is measured on a GPU): macro tag -> (name, bytes/s).
GPU_BANDWIDTHS = {
    # NVIDIA H100 Tensor Core GPU datasheet, specifications table, H100 SXM: GPU memory bandwidth
    # 3.35 TB/s (80 GB HBM3); https://www.nvidia.com/en-us/data-center/h100/
    "HOneHundred": ("H100 SXM (HBM3)", 3.35e12),
    # NVIDIA H200 Tensor Core GPU datasheet, specifications table, H200 SXM: GPU memory bandwidth
    # 4.8 TB/s (141 GB HBM3e); https://www.nvidia.com/en-us/data-center/h200/
    "HTwoHundred": ("H200 SXM (HBM3e)", 4.8e12),
}
# Per GPU tag: the macros of its name, bandwidth and smallest and largest predicted saving.
GPU_MACROS = {
    "HOneHundred": ("CostGpuHOneHundredName", "CostGpuHOneHundredBandwidthTBs", "CostGpuHOneHundredPredictedMinUs",
                    "CostGpuHOneHundredPredictedMaxUs"),
    "HTwoHundred": ("CostGpuHTwoHundredName", "CostGpuHTwoHundredBandwidthTBs", "CostGpuHTwoHundredPredictedMinUs",
                    "CostGpuHTwoHundredPredictedMaxUs"),
}
# Per pass: the macros of its kernel count with b_k, the kernels removed and the largest removed byte share.
KERNEL_MACROS = {
    "inference": ("CostKernelsInference", "CostKernelsRemovedInference", "CostRemovedByteShareInferencePercent"),
    "training": ("CostKernelsTraining", "CostKernelsRemovedTraining", "CostRemovedByteShareTrainingPercent"),
}
# Per training sub-phase: the macros of its significantly slower and resolved (faster) configurations.
SUBPHASE_MACROS = {
    "forward": ("CostSubphaseSlowerForward", "CostSubphaseFasterForward"),
    "backward": ("CostSubphaseSlowerBackward", "CostSubphaseFasterBackward"),
    "step": ("CostSubphaseSlowerStep", "CostSubphaseFasterStep"),
}


def removed_work(embed_dim: int, seq_len: int, batch: int, optimizer: str = "adam", itemsize: int = 4) -> dict:
    """Bytes of the operations that disappear with b_k (see the docstring of `keybias.studies.cost.measure`).

    forward: the bias add reads and writes B*S*E values; backward: the reduction for grad b_k
    reads B*S*E; optimizer: touches E*(#state + 2) values (param, grad, states).
    """
    bse = batch * seq_len * embed_dim
    return {
        "forward_bytes": 2 * bse * itemsize,
        "backward_bytes": bse * itemsize,
        "step_bytes": embed_dim * (OPTIMIZER_STATES[optimizer] + 2) * itemsize,
    }


def headline(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the phase that stands for a whole pass: inference forward, training total."""
    keep = np.zeros(len(frame), dtype=bool)
    for mode, phase in HEADLINE_PHASE.items():
        keep |= ((frame["mode"] == mode) & (frame["phase"] == phase)).to_numpy()
    return frame[keep]


def predict_saving(ratios: pd.DataFrame, machine: dict, optimizer: str = "adam") -> pd.DataFrame:
    """The no_bk rows with the byte model's prediction and the measured saving side by side.

    predicted_bytes_s = removed bytes / measured copy bandwidth; predicted_s adds one
    small-kernel overhead for the removed reduction and the measured one-parameter optimizer
    step. `model_direction` compares the prediction with the saving's LEVEL interval in both
    directions: the model "over-predicts" when the whole interval lies below it,
    "under-predicts" when the whole interval lies above it, else "consistent".
    A saving is "resolved" when its interval excludes 0; otherwise its upper end bounds it.
    """
    out = ratios[ratios["ratio"] == "no_bk"].copy()
    if out.empty:
        raise ValueError("no no_bk rows to compare with the byte model")
    bw = float(machine["bandwidth_bytes_per_s"])
    step_s = {int(k): float(v) for k, v in machine["optimizer_param_step_s"].items()}
    pb, ps = [], []
    for r in out.itertuples():
        w = removed_work(int(r.embed_dim), int(r.seq_len), int(r.batch), optimizer)
        by = {"forward": w["forward_bytes"], "backward": w["backward_bytes"], "step": w["step_bytes"]}
        over = {"forward": 0.0, "backward": float(machine["small_op_s"]), "step": step_s[int(r.embed_dim)]}
        if r.mode == "inference":
            b, s = by["forward"] / bw, by["forward"] / bw
        elif r.phase == "total":
            b = sum(by.values()) / bw
            s = b + sum(over.values())
        else:
            b = by[r.phase] / bw
            s = b + over[r.phase]
        pb.append(b)
        ps.append(s)
    out["predicted_bytes_s"] = pb
    out["predicted_s"] = ps
    out["predicted_saving"] = out["predicted_s"] / out["denominator_median_s"]
    out["measured_saving"] = 1 - out["value"]
    out["saving_ci_low"] = 1 - out["ci_high"]
    out["saving_ci_high"] = 1 - out["ci_low"]
    out["saving_ci_low_adjusted"] = 1 - out["ci_high_adjusted"]
    out["saving_ci_high_adjusted"] = 1 - out["ci_low_adjusted"]
    out["resolved"] = out["saving_ci_low"] > 0
    out["significantly_slower"] = out["saving_ci_high"] < 0
    out["saving_upper_bound"] = out["saving_ci_high"]
    out["model_direction"] = np.select(
        [out["saving_ci_high"] < out["predicted_saving"], out["saving_ci_low"] > out["predicted_saving"]],
        ["over-predicts", "under-predicts"], "consistent")
    return out


def gpu_prediction(configs: pd.DataFrame, bandwidths: dict | None = None, optimizer: str = "adam") -> pd.DataFrame:
    """The byte model's prediction of the time removing b_k saves on data-centre GPUs.

    Removed bytes over the GPU's datasheet peak bandwidth: a prediction, not a measurement,
    and an optimistic one for the saving (a fused bias epilogue moves no extra bytes; kernel
    launch overheads are not counted). Training adds the backward and optimizer bytes.
    """
    bandwidths = GPU_BANDWIDTHS if bandwidths is None else bandwidths
    rows = []
    for c in configs.drop_duplicates(["block", "attention", "mode", "seq_len", "batch"]).itertuples():
        w = removed_work(int(c.embed_dim), int(c.seq_len), int(c.batch), optimizer)
        removed = w["forward_bytes"] + (w["backward_bytes"] + w["step_bytes"] if c.mode == "training" else 0)
        for tag, (gpu, bw) in bandwidths.items():
            rows.append({"block": c.block, "attention": c.attention, "mode": c.mode, "embed_dim": int(c.embed_dim),
                         "seq_len": int(c.seq_len), "batch": int(c.batch), "gpu": gpu, "gpu_tag": tag,
                         "bandwidth_bytes_per_s": bw,
                         "removed_bytes": removed, "predicted_saving_us": 1e6 * removed / bw,
                         "kind": "prediction (datasheet bandwidth; not measured)"})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- claims


def memory_claims(layer: pd.DataFrame, memory: pd.DataFrame) -> tuple[list[Claim], dict]:
    """The count claim (formulas against real modules) and the memory macros."""
    arch = memory.set_index("architecture")
    if layer.empty or memory.empty:
        raise ValueError("memory_claims needs per-layer and per-architecture rows")
    require_columns(memory, ["architecture", "embed_dim", "bk_params", "bk_training_adam_bytes"], "per-architecture counts")
    # a missing flag would read as True under astype(bool) and hide a mismatch
    require_finite(layer, ["match"], "per-layer counts")
    require_finite(memory, ["match", "bk_fraction_of_model"], "per-architecture counts")
    mismatches = int((~layer["match"].astype(bool)).sum() + (~memory["match"].astype(bool)).sum())
    claims = [build_claim(
        id="cost-memory-counts-match-modules",
        statement="The b_k and whole-model parameter counts of all reference architectures equal those of the real modules.",
        value=mismatches, bound=0, comparison="==", kind="consistency",
        bound_origin="exact bookkeeping: a closed formula equals the module's own count")]
    bert, xl = arch.loc["BERT-base"], arch.loc["GPT-2 XL"]
    e = int(bert.embed_dim)
    macros = {
        "CostBkFractionLayerPercent": 100 * e / mha_param_count(e),
        "CostBertEmbedDim": e,
        "CostBkParamsBertBase": int(bert.bk_params),
        "CostBkParamsGptXL": int(xl.bk_params),
        "CostBkAdamBytesGptXL": int(xl.bk_training_adam_bytes),
        "CostModelFractionMaxPercent": 100 * _max(memory.bk_fraction_of_model, "b_k share of the model"),
        "CostModelFractionMinPercent": 100 * _min(memory.bk_fraction_of_model, "b_k share of the model"),
        "CostArchitectureCount": len(memory),
    }
    return claims, macros


def _where(r: pd.Series) -> str:
    return f"{r['block']}, {r['attention']}-attention {r['mode']}, {int(r['seq_len'])} tokens, batch {int(r['batch'])}"


# A configuration is named by these columns in the timing, byte-model and bound tables.
CONFIG_COLUMNS = ["block", "attention", "mode", "seq_len", "batch"]


def bound_macros(bounds: pd.DataFrame) -> dict:
    """Macros of the counted saving bounds (`keybias.studies.cost.traffic`): deterministic."""
    if bounds.empty:
        raise ValueError("no saving bounds")
    require_columns(bounds, ["mode", "saving_bound", "kernels_with_bk", "kernels_without_bk", "removed_byte_share"],
                    "saving bounds")
    macros = {"CostSavingBoundMinPercent": 100 * _min(bounds["saving_bound"], "counted saving bounds"),
              "CostSavingBoundMaxPercent": 100 * _max(bounds["saving_bound"], "counted saving bounds")}
    for mode, (kernels, removed, byte_share) in KERNEL_MACROS.items():
        rows = bounds[bounds["mode"] == mode]
        if rows.empty:
            continue
        first = rows.iloc[0]
        macros[kernels] = int(first.kernels_with_bk)
        macros[removed] = int(first.kernels_with_bk - first.kernels_without_bk)
        macros[byte_share] = 100 * _max(rows["removed_byte_share"], f"{mode} removed byte shares")
    return macros


# The id of `saving_claims`' machine check (written to results/machine by `make bench`).
SAVING_CHECK = "cost-saving-within-removed-work"


def saving_claims(model: pd.DataFrame, bounds: pd.DataFrame) -> tuple[list[Claim], dict, dict]:
    """The counted upper bound alone, as one machine check (for `make bench` and the GPU judge, where
    the byte model's margin was not fixed): every headline configuration's simultaneous upper limit
    of the saving is at most its counted bound (`traffic.saving_bounds`, the larger of the removed
    shares of kernels and bytes). Noise widens the intervals and makes it harder to pass. Notebook 06
    judges the byte model itself (`byte_model_claims`), of which this is the upper bound. Empty
    selections and missing bounds raise; a non-finite entry fails it.
    """
    if "predicted_saving" not in model.columns:
        raise ValueError("saving_claims needs the rows of predict_saving")
    judged = byte_model_check(model, bounds)
    main = headline(model)
    low = judged["saving_ci_low_adjusted"].to_numpy(dtype=float)
    bound = judged["saving_bound"].to_numpy(dtype=float)
    low_over_bound = _max(low / bound, "lower limit over the counted bound")  # raises on NaN before counting
    above = int((low > bound).sum())
    # A machine check, not a claim of the results: it judges machine outputs (`make bench`, a GPU's
    # timings) that no profile's notebooks record, and a machine too noisy to resolve the bound fails
    # it, so its outcome is the machine's. It therefore has no ClaimSpec (the registry declares the
    # claims the notebooks record; params/claims/rules.md, issue 30, third round).
    claims = [Claim(
        SAVING_CHECK,
        "Removing b_k saves no configuration more of its step than the larger of the removed shares of "
        "the step's kernels and bytes: every simultaneous upper limit of the saving lies within that bound.",
        _judged_max(judged, "upper_over_bound", "upper limit over the counted bound"), 1.0, "<=",
        kind="consistency",
        bound_origin="theory: a step's time is a sum over its kernels, so the removed kernels' and "
                     "bytes' shares, counted in one step before timing, bound the saving (an upper bound only); "
                     "a machine check of the timings, outside the results")]
    macros = {"CostComparisons": len(main), "CostFamilySize": int(main["family_size"].iloc[0]),
              "CostComparisonsTraining": int((main["mode"] == "training").sum()),
              "CostComparisonsInference": int((main["mode"] == "inference").sum())}
    machine = {"CostSavingsAboveBound": above,
               "CostSavingLowOverBoundMaxPercent": 100 * low_over_bound,
               "CostSavingUpperOverBoundMaxPercent": 100 * _max(judged["upper_over_bound"], "upper limit over bound")}
    return claims, macros, machine


# The margin of the byte model's test, as a share of the pass, fixed before the run it judges: 1.5
# times the largest distance of a simultaneous interval limit from the prediction in three earlier
# paper-profile runs on 2-core CPUs that no claim judges again (Intel Xeon and AMD Zen 5 at ea77fed:
# 1.53 and 1.28 points; Intel under a load average of 9 on branch prec: 1.99 points), rounded to
# whole points. It is well under the counted kernel share (5.6%), the old bound. The claims fail when
# a simultaneous interval lies wholly beyond P +- BYTE_MARGIN; a wider interval contradicts nothing,
# so noise cannot fail them, and each states its resolution instead (`byte_model_claims`).
BYTE_MARGIN = 0.03


def byte_model_check(model: pd.DataFrame, bounds: pd.DataFrame, margin: float = BYTE_MARGIN) -> pd.DataFrame:
    """The headline rows of `predict_saving` with their counted bound and the byte model's test: the
    excess of the simultaneous lower limit over the prediction and the deficit of the simultaneous
    upper limit under it, each in units of `margin`. Empty selections and missing bounds raise."""
    main = headline(model)
    if main.empty:
        raise ValueError("no headline rows (inference forward or training total) to judge")
    cols = CONFIG_COLUMNS + ["saving_bound", "removed_kernel_share", "removed_byte_share"]
    require_columns(bounds, cols, "saving bounds")
    require_columns(main, ["saving_ci_low_adjusted", "saving_ci_high_adjusted", "predicted_saving", "value",
                           "ci_low_adjusted", "ci_high_adjusted"], "timing model")
    judged = main.merge(bounds[cols], on=CONFIG_COLUMNS, how="left", validate="one_to_one")
    if judged["saving_bound"].isna().any():
        missing = judged.loc[judged["saving_bound"].isna(), CONFIG_COLUMNS].to_dict("records")
        raise ValueError(f"no counted saving bound for {missing}")
    if not margin > 0:
        raise ValueError(f"margin={margin} must be positive")
    # how far the data place the saving beyond the prediction: the lower limit above it, the upper
    # limit below it (a test of the prediction that noise cannot fail: a wide interval contradicts
    # nothing, and its half-width is reported as the resolution)
    judged["byte_excess"] = judged["saving_ci_low_adjusted"] - judged["predicted_saving"]
    judged["byte_deficit"] = judged["predicted_saving"] - judged["saving_ci_high_adjusted"]
    judged["half_width"] = (judged["saving_ci_high_adjusted"] - judged["saving_ci_low_adjusted"]) / 2
    judged["byte_excess_over_margin"] = judged["byte_excess"] / margin
    judged["byte_deficit_over_margin"] = judged["byte_deficit"] / margin
    judged["upper_over_bound"] = judged["saving_ci_high_adjusted"] / judged["saving_bound"]
    judged["margin"] = margin
    return judged


def _judged_max(judged: pd.DataFrame, column: str, what: str) -> float:
    """max of `column`, or NaN (the claim fails) when a judged saving, interval, prediction or bound is not finite."""
    inputs = judged[["value", "ci_low_adjusted", "ci_high_adjusted", "predicted_saving", "saving_bound", column]]
    return finite_reduce(inputs, lambda _: float(judged[column].max()), what)


def byte_model_claims(model: pd.DataFrame, bounds: pd.DataFrame, margin: float = BYTE_MARGIN) -> tuple[list[Claim], dict, dict]:
    """The byte model as the prediction, tested against the measured saving in both directions.

    `cost-saving-within-byte-prediction`: no headline configuration's simultaneous lower limit of the
    saving lies more than `margin` above the byte model's prediction: the data do not show a saving
    larger than predicted (a B that loses more work than b_k, a timing that favours B, or removed
    work that costs more than its bytes, fails it); `cost-saving-not-below-byte-prediction`: no
    simultaneous upper limit lies more than `margin` below it (a B slower than A, or removed bytes
    that cost nothing, fails it). A claim about time may not depend on the machine's load, so noise
    cannot fail these claims; instead each states the smallest departure from the prediction it
    would have seen (`min_detectable`: the margin plus the widest half-width), which a loaded
    machine makes larger. `margin` is the profile's `byte_margin`
    (the paper's is BYTE_MARGIN). The counted kernel-and-byte share is an upper bound only, reported
    (`bound_macros`, and `saving_claims` for `make bench` and the GPU judge), not a claim here.
    Returns (claims, deterministic macros, this machine's macros).
    """
    judged = byte_model_check(model, bounds, margin)
    points = f"{100 * margin:g}"
    resolution = margin + _max(judged["half_width"], "interval half-widths")  # the smallest departure resolved
    why = ("1.5 times the largest distance of an interval limit from the prediction in three earlier paper-profile "
           "CPU runs (Intel, AMD Zen 5, Intel under load), none judged here" if margin == BYTE_MARGIN
           else "the profile's byte_margin")
    origin = (f"fixed before this run: {points} percentage points, {why}; the prediction is the byte model, "
              "counted bytes over the measured copy bandwidth, computed without the timed savings")
    within = build_claim(
        id="cost-saving-within-byte-prediction", bound_origin=origin,
        statement=f"For no configuration do the timings show that removing b_k saves more than the byte model "
                  f"predicts (removed bytes over the measured bandwidth, plus the removed reduction and optimizer "
                  f"update) plus {points} percentage points of the pass: the simultaneous {100 * LEVEL:g}% lower "
                  f"limit of the measured saving stays below prediction plus {points} points.",
        value=_judged_max(judged, "byte_excess_over_margin", "excess over the byte prediction"),
        bound=1.0, comparison="<=", min_detectable=resolution)
    not_below = build_claim(
        id="cost-saving-not-below-byte-prediction", bound_origin=origin,
        statement=f"For no configuration do the timings show that removing b_k saves less than the byte model "
                  f"predicts minus {points} percentage points of the pass: the simultaneous {100 * LEVEL:g}% upper "
                  f"limit of the measured saving stays above prediction minus {points} points.",
        value=_judged_max(judged, "byte_deficit_over_margin", "deficit under the byte prediction"),
        bound=1.0, comparison="<=", min_detectable=resolution)
    percent = round(100 * margin, 9)
    macros = {"CostByteMarginPercent": int(percent) if percent.is_integer() else percent}
    machine = {
        "CostByteExcessMaxPercent": 100 * _max(judged["byte_excess"], "excess over the byte prediction"),
        "CostByteDeficitMaxPercent": 100 * _max(judged["byte_deficit"], "deficit under the byte prediction"),
        "CostByteExcessOverMarginMax": _max(judged["byte_excess_over_margin"], "excess over the margin"),
        "CostByteDeficitOverMarginMax": _max(judged["byte_deficit_over_margin"], "deficit over the margin"),
        "CostByteResolutionPercent": 100 * resolution,
    }
    return [within, not_below], macros, machine


def resolution_table(ratios: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, what the benchmark could resolve on this machine: the control's and
    the saving's interval half-widths, with the repetitions and the rule that stopped them."""
    head = headline(ratios)
    wide = head.pivot_table(index=CONFIG_COLUMNS, columns="ratio", values="half_width").reset_index()
    wide = wide.rename(columns={"control": "control_half_width", "no_bk": "saving_half_width"})
    keep = ["reps", "stopped_by", "seconds_share", "seconds_spent"]
    require_columns(configs, CONFIG_COLUMNS + keep, "benchmark configurations")
    return wide.merge(configs[CONFIG_COLUMNS + keep], on=CONFIG_COLUMNS, how="left")


def timing_macros(ratios: pd.DataFrame, model: pd.DataFrame) -> dict:
    """This machine's timing numbers for the paper (all machine-specific: reported, never claimed).

    The smallest saving the design resolves here is the median half-width of the saving's
    interval (a saving is resolved when its interval excludes 0).
    """
    head = headline(ratios)
    ctrl = head[head["ratio"] == "control"]
    main = headline(model)
    if ctrl.empty or main.empty:
        raise ValueError("no headline rows (inference forward or training total) to report")
    level_miss = f"{100 * (1 - LEVEL):g}"
    # every flag and idxmax below reads these columns: a NaN must raise, not read as False or be skipped
    require_finite(ctrl, ["half_width", "contains_one"], "control intervals")
    require_finite(main, ["half_width", "measured_saving", "predicted_saving", "saving_ci_low_adjusted",
                          "saving_ci_high_adjusted", "saving_ci_high", "resolved", "significantly_slower"],
                   "timed savings")
    sub = model[(model["mode"] == "training") & (model["phase"] != "total")]
    require_finite(sub, ["resolved", "significantly_slower"], "timed sub-phases")
    excluded = len(ctrl) - int(ctrl["contains_one"].sum())
    macros = {
        "CostMinDetectablePercent": 100 * finite_median(main["half_width"], "saving half-widths", strict=True),
        "CostControlHalfWidthMedianPercent": 100 * finite_median(ctrl["half_width"], "control half-widths", strict=True),
        "CostControlHalfWidthMaxPercent": 100 * _max(ctrl["half_width"], "control half-widths"),
        "CostControlContainsOne": int(ctrl["contains_one"].sum()),
        "CostControlExcludesOne": excluded,
        "CostControlVerdict": (rf"more than the nominal {level_miss}\%, so the intervals are optimistic on this machine"
                               if excluded > (1 - LEVEL) * len(ctrl) else rf"in line with the nominal {level_miss}\%"),
        "CostDistinguishable": int(main["resolved"].sum()),
        "CostDistinguishableTraining": int(main.loc[main["mode"] == "training", "resolved"].sum()),
        "CostDistinguishableInference": int(main.loc[main["mode"] == "inference", "resolved"].sum()),
        "CostSlower": int(main["significantly_slower"].sum()),
        "CostModelConsistent": int((main["model_direction"] == "consistent").sum()),
        "CostModelOverPredicts": int((main["model_direction"] == "over-predicts").sum()),
        "CostModelUnderPredicts": int((main["model_direction"] == "under-predicts").sum()),
        "CostPredictedMaxPercent": 100 * _max(main["predicted_saving"], "byte predictions"),
        "CostPredictedMinPercent": 100 * _min(main["predicted_saving"], "byte predictions"),
        "CostMedianSavingPercent": 100 * finite_median(main["measured_saving"], "measured savings", strict=True),
        "CostSavingUpperAllPercent": 100 * _max(main["saving_ci_high_adjusted"], "upper limits of the saving"),
    }
    point = main.loc[main["measured_saving"].idxmax()]
    macros.update({
        "CostLargestPointSavingPercent": 100 * float(point.measured_saving),
        "CostLargestPointSavingLowPercent": 100 * float(point.saving_ci_low_adjusted),
        "CostLargestPointSavingHighPercent": 100 * float(point.saving_ci_high_adjusted),
        "CostLargestPointSavingWhere": _where(point),
    })
    # sub-phases of the training step (forward, backward, optimizer step)
    for phase, (slower, faster) in SUBPHASE_MACROS.items():
        rows = sub[sub["phase"] == phase]
        macros[slower] = int(rows["significantly_slower"].sum())
        macros[faster] = int(rows["resolved"].sum())
    macros["CostSubphaseSlower"] = int(sub["significantly_slower"].sum())
    slow = main[main["significantly_slower"]]
    macros["CostSlowerSentence"] = (
        "In no configuration was the step significantly slower without $b_k$." if slow.empty else
        "The step was significantly slower without $b_k$ in "
        + ("one configuration" if len(slow) == 1 else f"{len(slow)} configurations")
        + f", most clearly for {_where(slow.loc[slow['saving_ci_high'].idxmin()])}.")
    return macros


def verdict_table(model: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the saving, its interval, resolved or its upper bound, the model's side."""
    main = headline(model)
    cols = ["block", "attention", "mode", "seq_len", "batch", "reps", "denominator_median_s", "measured_saving",
            "saving_ci_low", "saving_ci_high", "resolved", "saving_upper_bound", "predicted_saving", "model_direction"]
    require_columns(main, cols, "timing model")
    out = main[cols].copy()
    out.loc[out["resolved"], "saving_upper_bound"] = math.nan  # a resolved saving needs no bound
    return out.reset_index(drop=True)


def gpu_macros(gpu: pd.DataFrame) -> dict:
    """Macros of the GPU prediction: bandwidths and the predicted saving range per GPU."""
    out = {}
    if gpu.empty:
        raise ValueError("no GPU prediction rows")
    unknown = sorted(set(gpu["gpu_tag"]) - set(GPU_MACROS))
    if unknown:
        raise ValueError(f"GPU tags {unknown} have no macros; known: {sorted(GPU_MACROS)}")
    for tag, rows in gpu.groupby("gpu_tag", sort=False):
        name, bandwidth, low, high = GPU_MACROS[tag]
        out[name] = str(rows["gpu"].iloc[0])
        out[bandwidth] = _max(rows["bandwidth_bytes_per_s"].iloc[:1], f"{tag} bandwidth") / 1e12
        out[low] = _min(rows["predicted_saving_us"], f"{tag} predicted savings")
        out[high] = _max(rows["predicted_saving_us"], f"{tag} predicted savings")
    return out

# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
COST_MEMORY_COUNTS_MATCH_MODULES = register_claim(ClaimSpec(
    'cost-memory-counts-match-modules', '06_cost', 'consistency',
    comparison='==',
    bound=0.0,
    origin="exact bookkeeping: a closed formula equals the module's own count",
))
COST_SAVING_WITHIN_BYTE_PREDICTION = register_claim(ClaimSpec(
    'cost-saving-within-byte-prediction', '06_cost', 'consistency',
    bound=1.0,
    origin='fixed before this run',
    value_class='machine',
))
COST_SAVING_NOT_BELOW_BYTE_PREDICTION = register_claim(ClaimSpec(
    'cost-saving-not-below-byte-prediction', '06_cost', 'consistency',
    bound=1.0,
    origin='fixed before this run',
    value_class='machine',
))

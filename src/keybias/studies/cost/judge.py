"""Judging the cost benchmark: the byte model, claims and macros from DataFrames alone.

Every function here is pure (DataFrames and dicts in, DataFrames, claims and macros out), so
a test can hand it doctored timings: a slower "removed" variant, a noisy control, a saving
the removed work cannot explain. Claims are dicts with the keywords of `Recorder.claim`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from keybias.studies.cost.memory import OPTIMIZER_STATES, mha_param_count
from keybias.studies.cost.stats import (
    CHANCE_TAIL,
    HEADLINE_PHASE,
    LEVEL,
    binomial_lower_fraction,
    binomial_upper_count,
)

# The resolution issue 12 asks of the benchmark: the control's interval half-width, as a share of step time.
ISSUE_RESOLUTION = 0.01
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
# Columns a timing row needs to be judged; a non-finite entry fails every claim it enters.
_RATIO_COLUMNS = ("value", "ci_low", "ci_high", "half_width")


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


def memory_claims(layer: pd.DataFrame, memory: pd.DataFrame) -> tuple[list[dict], dict]:
    """The count claim (formulas against real modules) and the memory macros."""
    arch = memory.set_index("architecture")
    if layer.empty or memory.empty:
        raise ValueError("memory_claims needs per-layer and per-architecture rows")
    mismatches = int((~layer["match"].astype(bool)).sum() + (~memory["match"].astype(bool)).sum())
    claims = [dict(
        claim_id="cost-memory-counts-match-modules",
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
        "CostModelFractionMaxPercent": float(100 * memory.bk_fraction_of_model.max()),
        "CostModelFractionMinPercent": float(100 * memory.bk_fraction_of_model.min()),
        "CostArchitectureCount": len(memory),
    }
    return claims, macros


def _finite_or_nan(frame: pd.DataFrame, columns, value: float) -> float:
    """`value`, or NaN (which fails the claim) when any judged entry is not finite."""
    arr = frame[list(columns)].to_numpy(dtype=float)
    return value if np.isfinite(arr).all() else float("nan")


def _where(r: pd.Series) -> str:
    return f"{r['block']}, {r['attention']}-attention {r['mode']}, $S={int(r['seq_len'])}$, $B={int(r['batch'])}$"


def timing_claims(ratios: pd.DataFrame, model: pd.DataFrame, *, resolution_bound: float = ISSUE_RESOLUTION,
                  resolution_origin: str = "issue 12: at most 1% of step time") -> tuple[list[dict], dict]:
    """Claims and macros of the timing benchmark, from its ratio and byte-model tables.

    - resolution: the median over configurations of the control's interval half-width is at
      most `resolution_bound` (a share of step time);
    - control coverage: identical implementations give intervals containing 1 in at least
      the share a Binomial(n, LEVEL) reaches except with probability CHANCE_TAIL;
    - byte model, two-sided: the model's prediction lies inside the saving's interval in at
      least that share of configurations; the directions of the misses are reported;
    - not slower: removing work cannot add time, so at most the count of one-sided misses
      that chance explains shows a significantly slower step.
    Empty selections raise; a non-finite entry makes the claims it enters fail.
    """
    head = headline(ratios)
    ctrl = head[head["ratio"] == "control"]
    main = headline(model)
    if ctrl.empty or main.empty:
        raise ValueError("no headline rows (inference forward or training total) to judge")
    n, m = len(ctrl), len(main)
    resolution = _finite_or_nan(ctrl, _RATIO_COLUMNS, float(np.median(ctrl["half_width"])))
    contains = int(ctrl["contains_one"].sum())
    coverage_bound = binomial_lower_fraction(n, LEVEL, CHANCE_TAIL)
    inside = int((main["model_direction"] == "consistent").sum())
    model_bound = binomial_lower_fraction(m, LEVEL, CHANCE_TAIL)
    slower = int(main["significantly_slower"].sum())
    slower_bound = binomial_upper_count(m, (1 - LEVEL) / 2, CHANCE_TAIL)
    judged = list(_RATIO_COLUMNS) + ["predicted_saving"]
    detectable = float(np.median(main["half_width"]))
    level = f"{100 * LEVEL:g}%"
    claims = [
        dict(claim_id="cost-control-resolution",
             statement=f"The noise control resolves the step time: the median over configurations of its {level} "
                       "interval half-width is within the bound.",
             value=resolution, bound=resolution_bound, comparison="<=", kind="test", bound_origin=resolution_origin),
        dict(claim_id="cost-control-ci-contains-one",
             statement="Two identical implementations timed against each other give an interval containing 1 "
                       "in the share of configurations the nominal level predicts.",
             value=_finite_or_nan(ctrl, _RATIO_COLUMNS, contains / n), bound=coverage_bound, comparison=">=",
             kind="test", bound_origin=f"Binomial(n, {LEVEL:g}) quantile at tail {CHANCE_TAIL:g}"),
        dict(claim_id="cost-saving-agrees-with-byte-model",
             statement="The byte model of the removed work predicts a saving inside the measured saving's interval "
                       "in the share of configurations the nominal level predicts (two-sided).",
             value=_finite_or_nan(main, judged, inside / m), bound=model_bound, comparison=">=", kind="test",
             bound_origin=f"byte model fixed before timing; Binomial(n, {LEVEL:g}) quantile at tail {CHANCE_TAIL:g}",
             min_detectable=detectable),
        dict(claim_id="cost-removal-not-slower",
             statement="Removing b_k makes no configuration's step significantly slower, beyond the one-sided "
                       "misses chance explains.",
             value=_finite_or_nan(main, judged, slower), bound=slower_bound, comparison="<=", kind="test",
             bound_origin=f"theory (removed work cannot add time); Binomial(n, {(1 - LEVEL) / 2:g}) upper quantile",
             min_detectable=detectable),
    ]
    macros = _timing_macros(ratios, model, ctrl, main, resolution_bound)
    macros.update({"CostControlCoverageBoundPercent": 100 * coverage_bound, "CostSlowerAllowed": slower_bound,
                   "CostModelBoundPercent": 100 * model_bound, "CostMinDetectablePercent": 100 * detectable})
    return claims, macros


def _timing_macros(ratios, model, ctrl, main, resolution_bound) -> dict:
    level_miss = f"{100 * (1 - LEVEL):g}"
    excluded = len(ctrl) - int(ctrl["contains_one"].sum())
    macros = {
        "CostLevelPercent": round(100 * LEVEL),
        "CostResolutionBoundPercent": 100 * resolution_bound,
        "CostControlHalfWidthMedianPercent": 100 * float(np.median(ctrl["half_width"])),
        "CostControlHalfWidthMaxPercent": 100 * float(ctrl["half_width"].max()),
        "CostControlContainsOne": int(ctrl["contains_one"].sum()),
        "CostControlCount": len(ctrl),
        "CostControlExcludesOne": excluded,
        "CostControlVerdict": (rf"more than the nominal {level_miss}\%, so the intervals are optimistic on this machine"
                               if excluded > (1 - LEVEL) * len(ctrl) else rf"in line with the nominal {level_miss}\%"),
        "CostComparisons": len(main),
        "CostDistinguishable": int(main["resolved"].sum()),
        "CostComparisonsTraining": int((main["mode"] == "training").sum()),
        "CostComparisonsInference": int((main["mode"] == "inference").sum()),
        "CostDistinguishableTraining": int(main.loc[main["mode"] == "training", "resolved"].sum()),
        "CostDistinguishableInference": int(main.loc[main["mode"] == "inference", "resolved"].sum()),
        "CostSlower": int(main["significantly_slower"].sum()),
        "CostModelConsistent": int((main["model_direction"] == "consistent").sum()),
        "CostModelOverPredicts": int((main["model_direction"] == "over-predicts").sum()),
        "CostModelUnderPredicts": int((main["model_direction"] == "under-predicts").sum()),
        "CostPredictedMaxPercent": 100 * float(main["predicted_saving"].max()),
        "CostPredictedMinPercent": 100 * float(main["predicted_saving"].min()),
        "CostMedianSavingPercent": 100 * float(np.median(main["measured_saving"])),
        "CostSavingUpperAllPercent": 100 * float(main["saving_ci_high_adjusted"].max()),
        "CostFamilySize": int(main["family_size"].iloc[0]),
    }
    point = main.loc[main["measured_saving"].idxmax()]
    macros.update({
        "CostLargestPointSavingPercent": 100 * float(point.measured_saving),
        "CostLargestPointSavingLowPercent": 100 * float(point.saving_ci_low_adjusted),
        "CostLargestPointSavingHighPercent": 100 * float(point.saving_ci_high_adjusted),
        "CostLargestPointSavingWhere": _where(point),
    })
    # sub-phases of the training step (forward, backward, optimizer step): reported, not claimed
    sub = model[(model["mode"] == "training") & (model["phase"] != "total")]
    for phase in ("forward", "backward", "step"):
        rows = sub[sub["phase"] == phase]
        name = phase.capitalize()
        macros[f"CostSubphaseSlower{name}"] = int(rows["significantly_slower"].sum())
        macros[f"CostSubphaseFaster{name}"] = int(rows["resolved"].sum())
    macros["CostSubphaseCount"] = int(sub.groupby("phase").size().max()) if len(sub) else 0
    macros["CostSubphaseSlower"] = int(sub["significantly_slower"].sum())
    slow = main[main["significantly_slower"]]
    macros["CostSlowerSentence"] = (
        "In no configuration was the step significantly slower without $b_k$." if slow.empty else
        f"The step was significantly slower without $b_k$ in {len(slow)} configuration(s), most clearly for "
        f"{_where(slow.loc[slow['saving_ci_high'].idxmin()])}.")
    return macros


def verdict_table(model: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the saving, its interval, resolved or its upper bound, the model's side."""
    main = headline(model)
    cols = ["block", "attention", "mode", "seq_len", "batch", "reps", "denominator_median_s", "measured_saving",
            "saving_ci_low", "saving_ci_high", "resolved", "saving_upper_bound", "predicted_saving", "model_direction"]
    out = main[[c for c in cols if c in main]].copy()
    out.loc[out["resolved"], "saving_upper_bound"] = math.nan  # a resolved saving needs no bound
    return out.reset_index(drop=True)


def gpu_macros(gpu: pd.DataFrame) -> dict:
    """Macros of the GPU prediction: bandwidths and the predicted saving range per GPU."""
    out = {}
    if gpu.empty:
        raise ValueError("no GPU prediction rows")
    for tag, rows in gpu.groupby("gpu_tag", sort=False):
        out[f"CostGpu{tag}Name"] = str(rows["gpu"].iloc[0])
        out[f"CostGpu{tag}BandwidthTBs"] = float(rows["bandwidth_bytes_per_s"].iloc[0]) / 1e12
        out[f"CostGpu{tag}PredictedMinUs"] = float(rows["predicted_saving_us"].min())
        out[f"CostGpu{tag}PredictedMaxUs"] = float(rows["predicted_saving_us"].max())
    return out


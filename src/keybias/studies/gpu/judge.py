"""Judge the GPU profile's recorded files with the same rules the CPU notebooks use (notebook 09).

Every claim here is one of notebooks 02, 03 and 06's own judges applied to the GPU's data, or a
count the GPU alone can make (the allocator's bytes). `on_gpu` renames such a claim (id prefix
`gpu-`, statement prefixed with where it was measured), so the manifest and the paper tell the
two apart. Pure: DataFrames and dicts in, `Claim`s and macros out, so tests hand it doctored data.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim
from keybias.core.reduce import NonFiniteValues, finite_max, finite_min, require_finite
from keybias.studies.cost import judge as cost_judge
from keybias.studies.invariance import judge as invariance_judge
from keybias.studies.precision import judge as precision_judge

PREFIX = "gpu-"


def on_gpu(claim, gpu: str) -> Claim:
    """`claim` (a Claim or claim dict) as the same finding on the GPU: id `gpu-<id>`, the
    statement prefixed with the GPU's name, implied_by renamed alike."""
    c = Claim.from_any(claim)
    implied = tuple(PREFIX + i for i in c.implied_by)
    return dataclasses.replace(c, id=PREFIX + c.id, statement=f"On the {gpu}: {c.statement}", implied_by=implied)


# ----------------------------------------------------------------------------- machine
def machine_macros(runs: dict[str, dict]) -> dict:
    """What made the recorded files: GPU, driver, PyTorch and CUDA, the commits, the dates and
    the seconds each section took (from the run records)."""
    machines = [r["machine"] for r in runs.values()]
    first = machines[0]
    for m in machines[1:]:
        for key in ("gpu", "torch", "torch_cuda", "driver"):
            if m.get(key) != first.get(key):
                raise ValueError(f"the recorded runs differ in {key}: {m.get(key)!r} vs {first.get(key)!r}")
    sections = {name: s for r in runs.values() for name, s in r["sections"].items()}
    failed = sorted(n for n, s in sections.items() if s["status"] != "measured")
    if failed:
        raise ValueError(f"recorded GPU sections did not finish: {failed}")
    commits = sorted({m["commit"][:7] for m in machines})
    dates = sorted({m["started_utc"][:10] for m in machines})
    return {
        "GpuName": first["gpu"], "GpuMemoryGiB": round(float(first["gpu_memory_gib"])),
        "GpuCapability": first["gpu_capability"], "GpuDriver": first["driver"],
        "GpuTorch": first["torch"], "GpuCuda": first["torch_cuda"], "GpuCommits": " and ".join(commits),
        "GpuDate": dates[0] if len(dates) == 1 else " to ".join((dates[0], dates[-1])),
        "GpuSecondsCost": round(sections["cost"]["seconds"]), "GpuSecondsPrecision": round(sections["precision"]["seconds"]),
        "GpuSecondsInvariance": round(sections["invariance"]["seconds"]),
        "GpuSecondsTotal": round(sum(s["seconds"] for s in sections.values())),
        "GpuInvPlanned": int(sections["invariance"]["configs_planned"]),
        "GpuInvRun": int(sections["invariance"]["configs_run"]),
    }


# ----------------------------------------------------------------------------- precision
def grid_step_log10(errors: pd.DataFrame) -> float:
    """The spacing of the |b_k|/|k| grid in decades, read from the recorded ratios."""
    r = np.log10(np.sort(errors["ratio"].unique()))
    steps = np.diff(r)
    if len(steps) == 0 or not np.allclose(steps, steps[0], rtol=1e-6):
        raise ValueError("the recorded ratios are not an even log grid")
    return float(steps[0])


def precision_results(errors, calibration, grads, gsum) -> dict:
    """Notebook 03's law, crossings and claims on the GPU's errors and gradients."""
    law, law_calibration = precision_judge.fit_law(errors), precision_judge.fit_law(calibration)
    pooled = precision_judge.pooled_slope(errors)
    crossing = precision_judge.accuracy_crossing(errors, law_calibration)
    checks = precision_judge.crossing_check(crossing, law_calibration, grid_step_log10(errors))
    seq_len = int(errors["seq_len"].iloc[0])
    claims = precision_judge.precision_claims(law, pooled, errors, checks, gsum, grads, seq_len,
                                              law_calibration=law_calibration)
    return {"law": law, "pooled": pooled, "crossing": crossing, "checks": checks, "claims": claims, "gsum": gsum}


def precision_macros(errors: pd.DataFrame, law: pd.DataFrame, pooled: pd.DataFrame) -> dict:
    """The paths that ran in each dtype, the fused kernels among them, and the pooled slopes' range."""
    ok = errors[errors["status"].eq("ok")]
    fused = sorted(set(ok["path"]) & {"sdpa_flash", "sdpa_efficient"})
    fused_dtypes = sorted(set(ok.loc[ok["path"].isin(fused), "dtype"]))
    slopes = pooled["slope"].to_numpy(dtype=float)
    return {
        "GpuPrecPaths": int(ok["path"].nunique()), "GpuPrecFusedPaths": len(fused),
        "GpuPrecFusedDtypes": ", ".join(fused_dtypes), "GpuPrecRows": len(ok),
        "GpuPrecSlopeMin": finite_min(slopes, "pooled slopes", strict=True),
        "GpuPrecSlopeMax": finite_max(slopes, "pooled slopes", strict=True),
        "GpuPrecNotRun": int((~errors["status"].eq("ok")).groupby([errors["dtype"], errors["path"]]).any().sum()),
    }


# ----------------------------------------------------------------------------- cost
def cost_results(model: pd.DataFrame, bounds: pd.DataFrame) -> dict:
    """Notebook 06's saving claim on the GPU's timings, and the headline table."""
    claims, macros, machine = cost_judge.saving_claims(model, bounds)
    byte_claims, _, byte_machine = cost_judge.byte_model_claims(model, bounds)
    claims = [*claims, *byte_claims]
    main = cost_judge.headline(model).merge(bounds[cost_judge.CONFIG_COLUMNS + ["saving_bound"]],
                                           on=cost_judge.CONFIG_COLUMNS, how="left", validate="one_to_one")
    require_finite(main, ["saving_ci_low_adjusted", "saving_ci_high_adjusted", "saving_bound"], "GPU timings")
    resolved = main[(main["saving_ci_low_adjusted"] > 0) | (main["saving_ci_high_adjusted"] < 0)]
    faster = main[main["saving_ci_low_adjusted"] > 0]
    slower = main[main["saving_ci_high_adjusted"] < 0]
    out = {
        "GpuCostConfigs": len(main), "GpuCostResolved": len(resolved), "GpuCostFaster": len(faster),
        "GpuCostSlower": len(slower),
        "GpuCostSavingMaxPercent": 100 * finite_max(main["measured_saving"], "measured saving"),
        "GpuCostUpperMaxPercent": 100 * finite_max(main["saving_ci_high_adjusted"], "upper end of the saving"),
        "GpuCostBoundMinPercent": 100 * finite_min(main["saving_bound"], "counted bounds", strict=True),
        "GpuCostLowOverBoundMaxPercent": float(machine["CostSavingLowOverBoundMaxPercent"]),
        "GpuCostPredictedMinPercent": 100 * finite_min(main["predicted_saving"], "byte prediction"),
        "GpuCostPredictedMaxPercent": 100 * finite_max(main["predicted_saving"], "byte prediction"),
        "GpuCostByteExcessMaxPercent": byte_machine["CostByteExcessMaxPercent"],
        "GpuCostByteDeficitMaxPercent": byte_machine["CostByteDeficitMaxPercent"],
    }
    return {"claims": claims, "macros": out, "headline": main}


# ----------------------------------------------------------------------------- memory
def memory_claims(allocator: pd.DataFrame) -> tuple[list[Claim], dict]:
    """The bytes the allocator reports for b_k's parameter, gradient and optimizer state against
    4 E (2 + states): a count, so the bound is exact equality (a padded or extra buffer fails it)."""
    ran = allocator[allocator["status"].eq("measured")]
    if ran.empty:
        raise ValueError("no allocator row was measured")
    off = (ran["measured_bytes"].astype(float) - ran["expected_bytes"].astype(float)).abs()
    claim = build_claim(
        id="gpu-memory-allocator-matches-count", kind="consistency",
        # every recorded width is a multiple of 512, where the allocator's rounding cannot show,
        # so the count could not have failed on these data: a cross-check until a width that is
        # not such a multiple is recorded (GPU_WIDTHS in keybias.studies.gpu.measure)
        bound_origin="exact count: 4 bytes times E times (parameter + gradient + optimizer states)",
        statement="On the GPU, the bytes the caching allocator holds for b_k's parameter, gradient and optimizer state "
                  "equal four bytes per entry times the count of those tensors, for every width and optimizer measured.",
        value=finite_max(off, "allocator bytes off the count"), bound=0.0, comparison="<=")
    macros = {"GpuMemoryRows": len(ran), "GpuMemoryWidths": ", ".join(str(int(e)) for e in sorted(ran["embed_dim"].unique())),
              "GpuMemoryBytesMax": int(finite_max(ran["measured_bytes"], "allocator bytes", strict=True))}
    return [claim], macros


# ----------------------------------------------------------------------------- invariance
def invariance_results(rows: pd.DataFrame, mags: pd.DataFrame) -> dict:
    """Notebook 02's claims of kind `test` on the GPU's sweep (the implied and consistency claims
    follow from these or count the CPU's profile), the verdict table and the sweep's counts.

    A sweep recorded before the drop's size-matched control was measured lacks its two columns:
    they enter as NaN, so the drop claim is still judged and states no smallest detectable effect."""
    unmeasured = [c for c in invariance_judge.DROP_CONTROL_COLUMNS if c not in rows.columns]
    rows = rows.assign(**{c: float("nan") for c in unmeasured})
    out = invariance_judge.invariance_claims(rows, mags, min_configs=0)
    tests = [c for c in map(Claim.from_any, out["claims"]) if c.kind == "test"]
    ok = invariance_judge.valid(rows)
    known = ok[ok["verdict_float64"].eq("not_redundant")]
    missed = known[known["verdict"].eq("redundant")]
    macros = {
        "GpuInvMeasured": int(rows["status"].eq("measured").sum()), "GpuInvValid": len(ok),
        "GpuInvRedundant": int(ok["verdict"].eq("redundant").sum()),
        "GpuInvNotRedundant": int(ok["verdict"].eq("not_redundant").sum()),
        "GpuInvKnownBreaks": len(known), "GpuInvMissed": len(missed),
        "GpuInvMissedDtypes": ", ".join(sorted(set(missed["dtype"]))) or "none",
    }
    return {"claims": tests, "macros": macros, "table": invariance_judge.verdict_table(rows),
            "power": invariance_judge.power_table(rows)}


def failure_details(invariance: dict, precision: dict) -> dict:
    """Where each transferred check that can fail is worst on the GPU: the (dtype, path) of the
    largest crossing deviation and of the largest b_k cosine, and the power-control cells the
    verdict rule did not see a break in. Macros for the paper's sentences about the GPU."""
    checks = precision["checks"]
    ratio = checks["deviation_log10"] / checks["allowance_log10"]  # inf for a one-sided crossing: the worst
    gsum = precision["gsum"]
    ok = gsum[gsum["status"].eq("ok")]
    cos_ratio = ok["bk_mean_cos"].abs() / ok["cos_bound"]
    for what, values in (("crossing deviation over allowance", ratio), ("b_k cosine over bound", cos_ratio)):
        if values.isna().any() or not len(values):  # idxmax would skip a NaN and name another case
            raise NonFiniteValues(f"{what}: {int(values.isna().sum())} of {len(values)} entries are NaN")
    worst = checks.loc[ratio.idxmax()]
    cos_worst = ok.loc[cos_ratio.idxmax()]
    power = invariance["power"]
    blind = power[power["undetected"] > 0]
    return {
        "GpuCrossingWorstCase": f"{worst['dtype']}, {worst['path']}".replace("_", " "),
        "GpuCrossingWorstMeasured": float(worst["crossing"]), "GpuCrossingWorstPredicted": float(worst["crossing_pred"]),
        "GpuCrossingWorstRatio": float(ratio.max()),
        "GpuCosWorstCase": f"{cos_worst['dtype']}, {cos_worst['path']}".replace("_", " "),
        "GpuCosWorst": float(cos_worst["bk_mean_cos"]), "GpuCosWorstBound": float(cos_worst["cos_bound"]),
        "GpuPowerUndetected": int(blind["undetected"].sum()),
        "GpuPowerUndetectedCells": "; ".join(f"{r.dtype}, E={int(r.embed_dim)}" for r in blind.itertuples()) or "none",
    }

# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
GPU_MEMORY_ALLOCATOR_MATCHES_COUNT = register_claim(ClaimSpec(
    'gpu-memory-allocator-matches-count', '09_gpu', 'consistency',
    bound=0.0,
    origin='exact count: 4 bytes times E times (parameter + gradient + optimizer states)',
))

"""Every judge entry point the notebooks call, run on the committed tables (`results/data`,
`results/machine` and `recorded/`): the inputs of the NaN-policy test and of the before/after check
that a change to a judge leaves the committed claims and macros as they are.

`calls()` maps a name to (the tables it reads, {argument: path}, and a function of those
tables returning the judge's outputs); a path is under the repository root. Run as a script it
snapshots those outputs and compares two snapshots (`main`).
"""

from __future__ import annotations

import math
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


@cache
def _csv(path: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / path)


def table(path: str) -> pd.DataFrame:
    return _csv(path).copy()


def _training():
    from keybias.studies.training import judge
    return {
        "training.pair_results": ({"pairs": "results/data/training_pairs.csv"}, lambda t: judge.pair_results(t["pairs"])),
        "training.bias_results": ({"bias": "results/data/training_bias_summary.csv"},
                                  lambda t: (judge.bias_results(t["bias"]), judge.bias_table(t["bias"]))),
        "training.verdict_results": ({"verdicts": "results/data/training_verdicts.csv"},
                                     lambda t: (judge.verdict_results(t["verdicts"]), judge.verdict_table(t["verdicts"]))),
    }


def _pretrained():
    from keybias.studies.pretrained import judge
    info = {"sentences": 100, "n_layers": 6, "hidden_size": 384, "n_parameters": 22713216, "num_threads": 1,
            "strip_report": {"parameters_saved": 6 * 384}}
    return {
        "pretrained.pretrained_claims": (
            {"changes": "results/data/pretrained_embedding_changes.csv", "norms": "results/data/pretrained_bias_norms.csv",
             "savings": "results/data/pretrained_parameters_saved.csv"},
            lambda t: judge.pretrained_claims(t["changes"], t["norms"], info, t["savings"])),
        "pretrained.family_claims": ({"table": "results/data/pretrained_families.csv"},
                                     lambda t: judge.family_claims(t["table"])),
        "pretrained.architecture_claims": ({"table": "results/data/pretrained_architectures.csv"},
                                           lambda t: judge.architecture_claims(t["table"])),
    }


def _precision_chain(errors, calibration, gsum, grads, seq_len=64):
    from keybias.studies.gpu.judge import grid_step_log10
    from keybias.studies.precision import judge
    law = judge.fit_law(errors)
    law_cal = judge.fit_law(calibration)
    pooled = judge.pooled_slope(errors)
    crossing = judge.accuracy_crossing(errors, law_cal)
    checks = judge.crossing_check(crossing, law_cal, grid_step_log10(errors))
    return {"law": law, "pooled": pooled, "crossing": crossing, "checks": checks,
            "law_macros": judge.law_macros(errors, law, pooled, law_cal),
            "crossing_macros": judge.crossing_macros(errors, crossing, checks),
            "gradient_macros": judge.gradient_macros(gsum, grads, seq_len),
            "claims": judge.precision_claims(law, pooled, errors, checks, gsum, grads, seq_len,
                                             law_calibration=law_cal)}


def _precision():
    return {"precision.all": (
        {"errors": "results/data/precision_errors.csv", "calibration": "results/data/precision_errors_calibration.csv",
         "gsum": "results/data/precision_gradient_summary.csv", "grads": "results/data/precision_gradients.csv"},
        lambda t: _precision_chain(t["errors"], t["calibration"], t["gsum"], t["grads"]))}


def null_factor() -> dict:
    nf = _csv("recorded/gpu-h200/invariance_null_factor.csv")  # the same calibration rule, recorded
    return {d: dict(zip(g["magnitude"].astype(float), g["kappa"].astype(float), strict=True))
            for d, g in nf.groupby("dtype", sort=False)}


def _invariance_all(df, mags):
    from keybias.studies.invariance import judge
    cells = judge.magnitude_cells(df, mags)
    return {"counts": judge.independent_counts(df), "cells": cells, "retired": judge.retired_predictions(cells),
            "power": judge.power_table(df), "verdicts": judge.verdict_table(df), "breaks": judge.breaks_table(df),
            "paths": judge.code_paths(df), "masked": judge.masked_rows(df), "rejections": judge.rejections(df),
            "claims": judge.invariance_claims(df, mags, min_configs=1, null_factor=null_factor())}


def _invariance():
    return {"invariance.all": ({"df": "results/data/invariance.csv", "mags": "results/data/invariance_magnitudes.csv"},
                               lambda t: _invariance_all(t["df"], t["mags"]))}


def _cost():
    from keybias.studies.cost import judge
    return {
        "cost.memory_claims": ({"layer": "results/data/cost_memory_layer.csv", "memory": "results/data/cost_memory.csv"},
                               lambda t: judge.memory_claims(t["layer"], t["memory"])),
        "cost.bound_macros": ({"bounds": "results/data/cost_saving_bounds.csv"}, lambda t: judge.bound_macros(t["bounds"])),
        "cost.gpu_macros": ({"gpu": "results/data/cost_gpu_prediction.csv"}, lambda t: judge.gpu_macros(t["gpu"])),
        "cost.model": ({"model": "results/machine/cost_timing_model.csv", "bounds": "results/data/cost_saving_bounds.csv",
                        "ratios": "results/machine/cost_timing_ratios.csv"},
                       lambda t: _cost_model(judge, _measured(t["model"]), t["bounds"], _measured(t["ratios"]))),
    }


def _measured(frame):
    """The notebook judges the measured rows (its machine tables add the devices not run)."""
    return frame[frame["status"] == "measured"].drop(columns=["status", "reason"]).reset_index(drop=True)


def _cost_model(judge, model, bounds, ratios):
    return {"saving": judge.saving_claims(model, bounds),
            "byte": judge.byte_model_claims(model, bounds, 0.03),
            "timing": judge.timing_macros(ratios, model),
            "verdicts": judge.verdict_table(model)}


def _longrun_full(traj, probes, entries):
    from keybias.studies.longrun import judge_full, record
    run = record.load_recorded(ROOT / "recorded/longrun-cpu")["run"]
    units = judge_full.units(traj, probes, entries)
    spans = pd.concat([judge_full.intervals(units, c) for c in ("exponent", "step_rate", "noise_elasticity")],
                      ignore_index=True)
    m = judge_full.macros(units, spans, run)
    return {"units": units, "spans": spans, "macros": m, "claims": judge_full.claims(units),
            "failed": judge_full.failed_predictions(units), "text": judge_full.findings_text(units, spans, m)}


def _longrun_build(grid, grid_probes, long, long_probes, entries):
    from keybias.studies.longrun import judge
    summary = judge.grid_summary(grid, grid_probes, lr=0.001)
    steps = sorted(set(range(100, 40001, 100)) | {40000})
    predicted = judge.predict_drift(grid, dtype="float32", eps=1e-12, steps=steps, lr=0.001, n_bias=32)
    comparison = judge.compare_with_prediction(long, predicted, lr=0.001)
    exponents = judge.drift_exponent(entries)
    return {"summary": summary, "grid_macros": judge.grid_macros(summary), "comparison": comparison,
            "exponents": exponents, "claim": judge.exponent_claim(exponents),
            "macros": judge.macros(comparison=comparison, exponents=exponents, long=long, probes=long_probes, grid=grid)}


def _longrun():
    rec = "recorded/longrun-cpu/longrun_full_"
    return {
        "longrun.full": ({"traj": rec + "trajectory.csv", "probes": rec + "probes.csv", "entries": rec + "entries.csv"},
                         lambda t: _longrun_full(t["traj"], t["probes"], t["entries"])),
        "longrun.build": ({"grid": "results/data/longrun_grid.csv", "grid_probes": "results/data/longrun_grid_probes.csv",
                           "long": "results/data/longrun_trajectory.csv", "long_probes": "results/data/longrun_probes.csv",
                           "entries": "results/data/longrun_entries.csv"},
                          lambda t: _longrun_build(t["grid"], t["grid_probes"], t["long"], t["long_probes"], t["entries"])),
    }


def _gpu():
    from keybias.studies.gpu import judge
    g = "recorded/gpu-h200/"

    def precision(t):
        out = judge.precision_results(t["errors"], t["calibration"], t["grads"], t["gsum"])
        return {"results": out, "macros": judge.precision_macros(t["errors"], out["law"], out["pooled"])}

    def invariance(t):
        inv = judge.invariance_results(t["rows"], t["mags"])
        precision = judge.precision_results(*(table(g + f"precision_{n}.csv") for n in (
            "errors", "errors_calibration", "gradients", "gradient_summary")))
        return {"results": inv, "failure": judge.failure_details(inv, precision)}

    return {
        "gpu.precision": ({"errors": g + "precision_errors.csv", "calibration": g + "precision_errors_calibration.csv",
                           "grads": g + "precision_gradients.csv", "gsum": g + "precision_gradient_summary.csv"}, precision),
        "gpu.invariance": ({"rows": g + "invariance_configs.csv", "mags": g + "invariance_magnitudes.csv"}, invariance),
        "gpu.cost": ({"model": g + "cost_model.csv", "bounds": g + "cost_saving_bounds.csv"},
                     lambda t: judge.cost_results(t["model"], t["bounds"])),
        "gpu.memory": ({"allocator": g + "memory_allocator.csv"}, lambda t: judge.memory_claims(t["allocator"])),
    }


def _checkpoints():
    from keybias.studies.checkpoints import judge
    return {
        "checkpoints.norm_claims": ({"norms": "results/data/checkpoint_bias_norms.csv"},
                                    lambda t: (judge.norm_claims(t["norms"]), judge.summary_table(t["norms"]))),
        "checkpoints.quantization_claims": ({"quant": "results/data/checkpoint_quantization.csv"},
                                            lambda t: judge.quantization_claims(t["quant"])),
        "checkpoints.baseline_macros": ({"quant": "results/data/checkpoint_quantization.csv",
                                         "norms": "results/data/checkpoint_bias_norms.csv"},
                                        lambda t: judge.baseline_macros(t["quant"], t["norms"])),
        "checkpoints.drift_macros": ({"grads": "results/data/checkpoint_gradient_noise.csv",
                                      "norms": "results/data/checkpoint_bias_norms.csv"},
                                     lambda t: judge.drift_macros(t["grads"], t["norms"])),
    }


def calls() -> dict:
    out = {}
    for part in (_training, _pretrained, _precision, _invariance, _cost, _longrun, _gpu, _checkpoints):
        out.update(part())
    return out


def run(name: str, tables: dict[str, pd.DataFrame] | None = None):
    """The outputs of call `name` on `tables` (default: the committed tables)."""
    spec, fn = calls()[name]
    given = {arg: (tables or {}).get(arg) for arg in spec}
    return fn({arg: (given[arg] if given[arg] is not None else table(path)) for arg, path in spec.items()})


def canonical(obj):
    """A comparable, picklable form of a judge's output (claims as their records, frames as records)."""
    from keybias.core.recorder import Claim
    if isinstance(obj, Claim):
        return ("Claim", canonical(obj.record("nb", "cpu", "p")))
    if isinstance(obj, pd.DataFrame):
        return ("DataFrame", list(obj.columns), canonical(obj.to_dict("records")))
    if isinstance(obj, pd.Series):
        return ("Series", canonical(obj.to_dict()))
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return "nan" if math.isnan(obj) else float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _diff(a, b, path: str, out: list) -> None:
    if type(a) is not type(b):
        out.append((path, a, b))
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append((f"{path}/{k}", a.get(k), b.get(k)))
            else:
                _diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            out.append((path, f"{len(a)} items", f"{len(b)} items"))
        else:
            for i, (u, v) in enumerate(zip(a, b, strict=True)):
                _diff(u, v, f"{path}[{i}]", out)
    elif a != b:
        out.append((path, a, b))


def main(argv=None) -> int:
    """`python tests/studies/judge_calls.py snapshot FILE` writes every entry point's outputs on the committed
    tables (run it with PYTHONPATH at the checkout to compare); `compare BEFORE AFTER` lists every
    value that differs and exits 1 if any does."""
    import pickle

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["snapshot"] and len(argv) == 2:
        snap = {}
        for name in calls():
            try:
                snap[name] = canonical(run(name))
            except Exception as exc:  # noqa: BLE001  (recorded, so that the comparison names it)
                snap[name] = ("ERROR", repr(exc))
        Path(argv[1]).write_bytes(pickle.dumps(snap))
        return 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        a, b = (pickle.loads(Path(p).read_bytes()) for p in argv[1:])
        out: list = []
        _diff(a, b, "", out)
        for path, x, y in out:
            print(f"{path}: {str(x)[:200]} -> {str(y)[:200]}")
        print(f"{len(out)} differences")
        return 1 if out else 0
    print(main.__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""Drift of the key bias over a long run: judge (pure functions of the measured DataFrames).

Nothing here trains or reads files: the prediction, the extrapolation, the claims and the macros
are computed from the frames that `keybias.studies.longrun.measure` returns, so a test can hand them doctored data.

The prediction uses notebook 04's noise law (`training.random_walk_drift`, Eq. training_adam_drift):
the expected squared drift of one layer's b_k after T steps is lr^2 * n * S(T), with
S(T) = sum_{t<=T} (sigma_t / (s_t + eps))^2 the running noise sum that `longrun.train_run` logs.
The short grid runs of the long run's setting give S(t) up to their length; beyond it S grows at
the grid's late-half rate (Adam's normalized step size once its second moment has settled).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from keybias.studies.training import judge as training_judge

# The measured drift of the long run must agree with the grid's prediction within this factor
# either way: the tolerance notebook 04 set for its noise law before any run (ADAM_FACTOR_BOUND).
PREDICTION_FACTOR_BOUND = training_judge.ADAM_FACTOR_BOUND
# The costly regime of notebook 03: ||b_k|| comparable to the typical key norm ||k||.
COSTLY_RATIO = 1.0
BERT_STEPS = 1_000_000  # BERT-base pretraining length (Devlin et al. 2019), the extrapolation horizon


def _finite(values, name: str) -> np.ndarray:
    """Values as floats; an empty selection raises. NaN entries are kept, so a max over them is NaN and the claim fails."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError(f"{name}: empty selection")
    return arr


def _strict_max(values) -> float:
    """Max that is NaN when any entry is NaN or when there is no entry, so a claim built on it fails."""
    arr = np.asarray(values, dtype=float)
    return float(np.max(arr)) if arr.size else math.nan


def _require(frame: pd.DataFrame, name: str, columns) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks columns {missing}")
    if frame.empty:
        raise ValueError(f"{name} is empty")


def noise_sum_curve(traj: pd.DataFrame) -> pd.DataFrame:
    """Per layer and logged step, the noise sum S(t) averaged over the runs (seeds) in `traj`."""
    _require(traj, "traj", ["step", "layer", "noise_sum"])
    return traj.groupby(["layer", "step"], sort=True)["noise_sum"].mean().reset_index()


def predict_drift(grid: pd.DataFrame, *, dtype: str, eps: float, steps, lr: float, n_bias: int) -> pd.DataFrame:
    """Predicted drift ||b_k(t) - b_k(0)|| per layer at `steps`, from the grid runs of (dtype, eps) only.

    S(t) is interpolated inside the grid's length T_g and continued linearly beyond it with the slope
    of its second half, (S(T_g) - S(T_g / 2)) / (T_g / 2). Predicted drift = lr * sqrt(n * S(t))."""
    _require(grid, "grid", ["dtype", "eps", "step", "layer", "noise_sum"])
    sel = grid[(grid["dtype"] == dtype) & np.isclose(grid["eps"], eps, rtol=1e-9, atol=0)]
    if sel.empty:
        raise ValueError(f"no grid run with dtype={dtype!r}, eps={eps!r} to predict from")
    curve = noise_sum_curve(sel)
    steps = np.asarray(steps, dtype=float)
    rows = []
    for layer, g in curve.groupby("layer", sort=True):
        t = np.concatenate([[0.0], g["step"].to_numpy(float)])
        s = np.concatenate([[0.0], g["noise_sum"].to_numpy(float)])
        t_end, s_end = t[-1], s[-1]
        s_half = float(np.interp(t_end / 2, t, s))
        rate = (s_end - s_half) / (t_end / 2)
        inside = np.interp(np.minimum(steps, t_end), t, s)
        total = np.where(steps <= t_end, inside, s_end + rate * (steps - t_end))
        for step, value in zip(steps, total, strict=True):
            rows.append({"layer": int(layer), "step": step, "noise_sum": float(value), "noise_rate": rate,
                         "grid_steps": int(t_end),
                         "predicted_drift": lr * math.sqrt(n_bias * max(float(value), 0.0))})
    return pd.DataFrame(rows)


def compare_with_prediction(long: pd.DataFrame, predicted: pd.DataFrame, *, lr: float) -> pd.DataFrame:
    """Per layer and logged step of the long run: measured drift, the grid's prediction, the drift
    the law gives from the long run's own noise (lr sqrt(n S_long)), and log2 ratios of each."""
    _require(long, "long", ["step", "layer", "drift_b_k", "noise_sum", "n_bias"])
    _require(predicted, "predicted", ["step", "layer", "predicted_drift"])
    merged = long.merge(predicted[["step", "layer", "predicted_drift", "grid_steps"]], on=["step", "layer"],
                        how="left", validate="one_to_one")
    merged["own_law_drift"] = lr * np.sqrt(merged["n_bias"] * merged["noise_sum"])
    merged["log2_vs_predicted"] = np.log2(merged["drift_b_k"] / merged["predicted_drift"])
    merged["log2_vs_own_law"] = np.log2(merged["drift_b_k"] / merged["own_law_drift"])
    return merged


def extrapolate(long: pd.DataFrame, probes: pd.DataFrame, *, lr: float, horizons) -> pd.DataFrame:
    """Per layer: when does ||b_k|| reach the typical key norm ||k||, if the walk goes on?

    From the long run's last logged step T: ||b_k(T')||^2 ~ ||b_k(T)||^2 + lr^2 n r (T' - T), r the
    noise-sum rate of the run's second half (Adam's normalized squared step per entry). ||k|| is the
    last probe's key norm, held fixed. Returns the rate, ||k||, the step T* where the two meet
    (T itself if already there; inf if the rate is 0) and ||b_k|| / ||k|| at each horizon."""
    _require(long, "long", ["step", "layer", "norm_b_k", "noise_sum", "n_bias"])
    _require(probes, "probes", ["step", "layer", "key_norm"])
    last_probe = probes[probes["step"] == probes["step"].max()].set_index("layer")["key_norm"]
    rows = []
    for layer, g in long.groupby("layer", sort=True):
        g = g.sort_values("step")
        t_end = float(g["step"].iloc[-1])
        s_end = float(g["noise_sum"].iloc[-1])
        s_half = float(np.interp(t_end / 2, np.concatenate([[0.0], g["step"]]), np.concatenate([[0.0], g["noise_sum"]])))
        rate = (s_end - s_half) / (t_end / 2)
        n = int(g["n_bias"].iloc[-1])
        norm_end = float(g["norm_b_k"].iloc[-1])
        key = float(last_probe.loc[layer])
        per_step = lr**2 * n * rate  # growth of ||b_k||^2 per step
        if norm_end >= COSTLY_RATIO * key:
            t_star = t_end
        elif per_step > 0:
            t_star = t_end + ((COSTLY_RATIO * key) ** 2 - norm_end**2) / per_step
        else:
            t_star = math.inf
        row = {"layer": int(layer), "steps": int(t_end), "norm_b_k": norm_end, "key_norm": key,
               "noise_rate": rate, "steps_to_key_norm": t_star}
        for h in horizons:
            norm_h = math.sqrt(norm_end**2 + per_step * max(h - t_end, 0.0))
            row[f"ratio_at_{int(h)}"] = norm_h / key
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- claims


def prediction_claim(comparison: pd.DataFrame) -> dict:
    """The long run's measured drift against the grid's prediction, at every logged step beyond the
    grid's length (where the prediction is an extrapolation), every layer."""
    _require(comparison, "comparison", ["step", "grid_steps", "log2_vs_predicted"])
    beyond = comparison[comparison["step"] > comparison["grid_steps"]]
    value = _strict_max(np.abs(_finite(beyond["log2_vs_predicted"], "steps beyond the grid")))
    return dict(
        claim_id="longrun-drift-matches-grid-prediction",
        statement=("Over the long run, beyond the length of the short grid runs, the measured drift of b_k in every "
                   "layer agrees with the drift predicted from the grid's noise by notebook 04's law within a factor "
                   f"of {PREDICTION_FACTOR_BOUND} (max |log2(measured/predicted)|)."),
        value=value, bound=math.log2(PREDICTION_FACTOR_BOUND), comparison="<=", kind="test",
        bound_origin="notebook 04's tolerance for its noise law, fixed before this run")


def own_law_claim(comparison: pd.DataFrame) -> dict:
    """The long run's measured drift against notebook 04's law fed with the long run's own noise."""
    _require(comparison, "comparison", ["step", "log2_vs_own_law"])
    late = comparison[comparison["step"] >= comparison["step"].max() / 10]
    value = _strict_max(np.abs(_finite(late["log2_vs_own_law"], "long-run steps")))
    return dict(
        claim_id="longrun-drift-is-noise-walk",
        statement=("From a tenth of the long run on, the drift of b_k in every layer agrees within a factor of "
                   f"{PREDICTION_FACTOR_BOUND} with the random walk that notebook 04's law computes from the run's own "
                   "gradient noise; a consistent gradient direction would drift about sqrt(T) times further."),
        value=value, bound=math.log2(PREDICTION_FACTOR_BOUND), comparison="<=", kind="test",
        bound_origin="notebook 04's tolerance for its noise law, fixed before this run")


def extrapolation_claim(extrap: pd.DataFrame, horizon: int = BERT_STEPS) -> dict:
    """Does ||b_k|| stay below ||k|| through `horizon` steps? Max over layers of the extrapolated ratio.

    The direction was first set from a 300-step pilot ("reaches ||k|| within the horizon"); the first
    paper-profile long run (seed 2) contradicted it (it extrapolated to about one and a half horizons,
    because ||k|| grew and the noise rate fell as training went on). That run is therefore the
    calibration of this claim's direction, and the paper profile's long run uses a seed it did not
    (held out), so the claim is tested on data that did not set it."""
    column = f"ratio_at_{int(horizon)}"
    _require(extrap, "extrapolation", [column])
    value = _strict_max(_finite(extrap[column], "layers"))
    return dict(
        claim_id="longrun-bk-below-key-norm-at-bert-length",
        statement=("Extrapolating the long run's random walk at its constant learning rate, ||b_k|| stays below the "
                   "typical key norm ||k|| of every layer, the regime where notebook 03 shows b_k costs precision, "
                   "through a BERT-length pretraining (max over layers of ||b_k|| / ||k|| at that step count)."),
        value=value, bound=COSTLY_RATIO, comparison="<", kind="test",
        bound_origin=("the costly regime ||b_k|| = ||k|| named in issue 12; direction calibrated on a long run "
                      "with another seed"))


def corpus_claim(sha256: str, expected: str) -> dict:
    return dict(
        claim_id="longrun-corpus-is-pinned-text",
        statement="The training text is byte for byte the pinned sympy source the paper names (sha256 equal).",
        value=1.0 if sha256 == expected else 0.0, bound=1.0, comparison="==", kind="consistency",
        bound_origin="the sha256 committed with the code")


# ----------------------------------------------------------------------------- macros


def macros(*, comparison: pd.DataFrame, extrap: pd.DataFrame, probes: pd.DataFrame, grid: pd.DataFrame,
           horizons) -> dict[str, object]:
    """Numbers the paper prints about the long run (letters-only names)."""
    _require(comparison, "comparison", ["step", "layer", "drift_b_k", "predicted_drift"])
    end = comparison[comparison["step"] == comparison["step"].max()]
    out: dict[str, object] = {
        "LongDriftMeasuredEnd": float(end["drift_b_k"].mean()),
        "LongDriftPredictedEnd": float(end["predicted_drift"].mean()),
        "LongDriftMaxFactor": 2.0 ** _strict_max(np.abs(comparison.loc[
            comparison["step"] > comparison["grid_steps"], "log2_vs_predicted"])),
        "LongKeyNormEnd": float(extrap["key_norm"].mean()),
        "LongKeyNormMin": float(extrap["key_norm"].min()),
        "LongNormBkEnd": float(extrap["norm_b_k"].mean()),
        "LongStepsToKeyNormMin": float(extrap["steps_to_key_norm"].min()),
        "LongPredictionFactorBound": PREDICTION_FACTOR_BOUND,
    }
    words = {100_000: "TenFive", 1_000_000: "TenSix"}
    for h in horizons:
        if int(h) in words:
            out[f"LongRatioAt{words[int(h)]}"] = _strict_max(extrap[f"ratio_at_{int(h)}"])
    last = probes[probes["step"] == probes["step"].max()]
    out["LongOutputChangeEnd"] = float(last["output_change_rms"].max())
    out["LongOutputPredictedEnd"] = float(last["predicted_change_rms"].max())
    rates = grid.groupby(["dtype", "eps"])["noise_sum"].size()
    out["LongGridSettings"] = int(len(rates))
    return out


def grid_summary(grid: pd.DataFrame, grid_probes: pd.DataFrame, *, lr: float) -> pd.DataFrame:
    """Per grid setting (dtype, eps), means over seeds and layers at the last step: drift, gradient RMS,
    the normalized step rate r = dS/dt of the second half (1 or more: Adam takes full-size random
    steps; << 1: eps damps them), the typical key norm at the last probe, and the step count at
    which a walk at that rate from zero reaches it, ||k||^2 / (lr^2 n r)."""
    _require(grid, "grid", ["dtype", "eps", "seed", "layer", "step", "drift_b_k", "grad_rms_b_k", "noise_sum",
                            "n_bias"])
    _require(grid_probes, "grid_probes", ["dtype", "eps", "step", "key_norm"])
    rows = []
    for (dtype, eps), g in grid.groupby(["dtype", "eps"], sort=False):
        t_end = g["step"].max()
        end = g[g["step"] == t_end]
        t_half = g.loc[g["step"] <= t_end / 2, "step"].max()
        half = g[g["step"] == t_half]
        rate = (end["noise_sum"].mean() - half["noise_sum"].mean()) / (t_end - t_half)
        p = grid_probes[(grid_probes["dtype"] == dtype) & (grid_probes["eps"] == eps)]
        key = float(p.loc[p["step"] == p["step"].max(), "key_norm"].mean())
        n = int(g["n_bias"].iloc[0])
        rows.append({"dtype": dtype, "eps": eps, "steps": int(t_end), "seeds": g["seed"].nunique(),
                     "drift_b_k": float(end["drift_b_k"].mean()), "grad_rms_b_k": float(g["grad_rms_b_k"].median()),
                     "noise_rate": float(rate), "key_norm": key,
                     "steps_to_key_norm": key**2 / (lr**2 * n * rate) if rate > 0 else math.inf,
                     "loss": float(end["loss"].mean()) if "loss" in end else math.nan})
    return pd.DataFrame(rows)


_DTYPE_WORD = {"float32": "FloatThirtyTwo", "bfloat16": "BfloatSixteen"}
_EXPONENT_WORD = {6: "Six", 7: "Seven", 8: "Eight", 9: "Nine", 10: "Ten", 12: "Twelve"}


def grid_macros(summary: pd.DataFrame) -> dict[str, object]:
    """Per grid setting: the noise rate and the step count to ||k|| (e.g. LongRateBfloatSixteenEpsEight)."""
    out: dict[str, object] = {}
    for _, r in summary.iterrows():
        exponent = -int(round(math.log10(r["eps"])))
        stem = f"{_DTYPE_WORD[r['dtype']]}Eps{_EXPONENT_WORD.get(exponent, 'Other')}"
        out[f"LongRate{stem}"] = float(r["noise_rate"])
        out[f"LongStepsToKey{stem}"] = float(r["steps_to_key_norm"])
    return out

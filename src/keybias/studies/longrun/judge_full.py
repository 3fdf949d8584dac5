"""Judge the recorded full grid of notebook 08 (`keybias.studies.longrun.record`): seeds x sizes x
Adam regimes. Pure functions of the recorded DataFrames, so tests hand them doctored data.

The unit of every interval here is one run (a seed): the spread is run to run, never a resample
of the entries of one run. Per run and layer (`units`):

- the drift exponent alpha: half the least-squares slope of log ||b_k(t) - b_k(0)||^2 against
  log t over the run's last decade (T/10..T), at the log-spaced steps of the recorded entries
  (1/2: a random walk; 1: constant velocity);
- the step rate r: the slope of notebook 04's noise sum S(t) = sum (sigma/(s + eps))^2 over the
  run's second half. Adam's step on b_k is about lr sqrt(r) per entry: r ~ 1 means full-size steps
  on the noise, r << 1 SGD-like steps lr g / eps;
- the noise elasticity: the slope of log sigma (the RMS of b_k's gradient) against log ||b_k||
  over the last decade. The candidate explanation "the rounding noise grows with ||b_k|| because
  the scores carry q.b_k" predicts it near 1 once ||b_k|| is comparable to ||k||;
- the gradient's bias along the drift: the mean, over the last decade's logged intervals, of the
  interval's mean gradient projected on the direction b_k had moved before the interval, in units of
  the gradient's RMS (`grad_along_drift`; 0 in expectation for zero-mean noise). Adam turns a bias
  mu along the drift into a drift velocity lr mu / (sigma + eps) (per entry m / (sqrt(v) + eps) with
  m ~ mu and sqrt(v) ~ sigma), which `velocity_predicted` gives and `velocity_measured` is compared with;
- the direction: the cosine between b_k and the mean query q-bar of the held-out probe windows at
  the last probe (isotropic chance: about 1/sqrt(n)).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from keybias.build.recorder import Claim
from keybias.studies.reduce import finite_max, finite_median, finite_min

WINDOW = 10  # the last decade of a run
SMALL_EPS, DEFAULT_EPS = 1e-12, 1e-8
CONFIDENCE = 0.95
UNIT = ["size", "dtype", "eps", "seed", "layer"]
SETTING = ["size", "dtype", "eps"]

# The finding each test claim of this module decides (the findings registry reads these ids).
FINDING_OF = {}


def _require(frame: pd.DataFrame, name: str, columns) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks columns {missing}")
    if frame.empty:
        raise ValueError(f"{name} is empty")


def _slope(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if ok.sum() < 3:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def units(traj: pd.DataFrame, probes: pd.DataFrame, entries: pd.DataFrame, *, window: int = WINDOW) -> pd.DataFrame:
    """One row per run and layer: the exponent, the step rate, the noise elasticity, the gradient's
    bias along the drift with the velocities it predicts and the measured one, and the direction."""
    _require(traj, "trajectory", UNIT + ["step", "drift_b_k", "norm_b_k", "grad_rms_b_k", "grad_along_drift",
                                         "noise_sum", "lr", "n_bias"])
    _require(probes, "probes", UNIT + ["step", "key_norm", "norm_b_k", "cos_b_k_mean_query"])
    _require(entries, "entries", UNIT + ["step", "entry", "displacement"])
    sq = (entries.assign(sq=entries["displacement"] ** 2)
          .groupby(UNIT + ["step"], sort=True)["sq"].mean().reset_index())
    rows = []
    for key, g in traj.groupby(UNIT, sort=True):
        g = g.sort_values("step")
        t_end = float(g["step"].max())
        late = g[g["step"] >= t_end / window]
        e = sq[(sq[UNIT] == pd.Series(key, index=UNIT)).all(axis=1)]
        e_late = e[e["step"] >= t_end / window]
        alpha = 0.5 * _slope(e_late["step"], e_late["sq"])
        half = g[g["step"] >= t_end / 2]
        rate = float((half["noise_sum"].iloc[-1] - half["noise_sum"].iloc[0])
                     / (half["step"].iloc[-1] - half["step"].iloc[0])) if len(half) > 1 else math.nan
        elastic_rows = late[late["step"].isin(e_late["step"])]
        elasticity = _slope(elastic_rows["norm_b_k"], elastic_rows["grad_rms_b_k"])
        eps, lr = float(key[2]), float(g["lr"].iloc[0])
        along = late["grad_along_drift"].to_numpy(float)
        sigma = late["grad_rms_b_k"].to_numpy(float)
        predicted = float(np.nanmean(along * sigma / (sigma + eps)))
        d0, d1 = float(late["drift_b_k"].iloc[0]), float(late["drift_b_k"].iloc[-1])
        measured = (d1 - d0) / (float(late["step"].iloc[-1]) - float(late["step"].iloc[0])) / lr
        p = probes[(probes[UNIT] == pd.Series(key, index=UNIT)).all(axis=1)]
        last = p[p["step"] == p["step"].max()].iloc[0]
        n = int(g["n_bias"].iloc[0])
        at = g[g["step"] <= 10_000]
        rows.append({**dict(zip(UNIT, key, strict=True)), "steps": int(t_end),
                     "window_start": int(e_late["step"].min()) if len(e_late) else 0,
                     "window_points": len(e_late), "n_bias": n, "exponent": alpha, "step_rate": rate,
                     "noise_elasticity": elasticity, "grad_rms_late": float(np.median(sigma)),
                     "grad_along_drift": float(np.nanmean(along)),
                     "grad_along_drift_se": float(np.nanstd(along, ddof=1) / math.sqrt(np.isfinite(along).sum())),
                     "velocity_measured": measured, "velocity_predicted": predicted,
                     "drift_end": d1, "drift_at_10000": float(at["drift_b_k"].iloc[-1]),
                     "step_of_drift_at_10000": int(at["step"].iloc[-1]),
                     "key_norm_end": float(last["key_norm"]), "bk_over_key_end": float(last["norm_b_k"] / last["key_norm"]),
                     "cos_mean_query": float(last["cos_b_k_mean_query"]),
                     "cos_mean_query_sqrt_n": float(last["cos_b_k_mean_query"]) * math.sqrt(n)})
    return pd.DataFrame(rows)


def per_seed(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """`column` averaged over the layers of each run: one value per (size, dtype, eps, seed)."""
    return table.groupby(SETTING + ["seed"], sort=False)[column].mean().reset_index()


def intervals(table: pd.DataFrame, column: str = "exponent", *, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per setting (size, dtype, eps): the mean over seeds of `column` (each seed's layers averaged
    first), its Student-t interval across seeds (df = seeds - 1) and the seeds' range. The spread is
    run to run: nothing within a run is resampled."""
    seeds = per_seed(table, column)
    rows = []
    for key, g in seeds.groupby(SETTING, sort=False):
        v = g[column].to_numpy(float)
        k = len(v)
        mean = float(v.mean())
        half = float(stats.t.ppf(0.5 + confidence / 2, k - 1) * v.std(ddof=1) / math.sqrt(k)) if k > 1 else math.inf
        rows.append({**dict(zip(SETTING, key, strict=True)), "seeds": k, "column": column, "mean": mean,
                     "low": mean - half, "high": mean + half, "min": float(v.min()), "max": float(v.max())})
    return pd.DataFrame(rows)


def _select(table, *, dtype=None, eps=None, size=None):
    sel = table
    if dtype is not None:
        sel = sel[sel["dtype"] == dtype]
    if eps is not None:
        sel = sel[np.isclose(sel["eps"].astype(float), eps, rtol=1e-9, atol=0)]
    if size is not None:
        sel = sel[sel["size"] == size]
    if sel.empty:
        raise ValueError(f"no recorded run with dtype={dtype!r}, eps={eps!r}, size={size!r}")
    return sel


def paired_ratio(table: pd.DataFrame, column: str, *, num: tuple[str, float], den: tuple[str, float]) -> pd.DataFrame:
    """Per (size, seed, layer): `column` of the run with (dtype, eps) = num over the same seed's and
    size's run with (dtype, eps) = den (paired: same seed, same batches, same initial weights)."""
    a = _select(table, dtype=num[0], eps=num[1]).set_index(["size", "seed", "layer"])[column]
    b = _select(table, dtype=den[0], eps=den[1]).set_index(["size", "seed", "layer"])[column]
    both = pd.concat({"num": a, "den": b}, axis=1, join="inner")
    if both.empty:
        raise ValueError("no paired runs")
    return both.assign(ratio=both["num"] / both["den"]).reset_index()

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

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim
from keybias.core.reduce import (
    finite_max,
    finite_mean,
    finite_median,
    finite_min,
    finite_std,
    finite_values,
    require_finite,
)
from keybias.studies.longrun import measure, record

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
    x, y = finite_values(x, "slope abscissae"), finite_values(y, "slope ordinates")  # a NaN raises
    # log-log: a non-positive entry has no logarithm (a displacement still exactly zero)
    ok = (x > 0) & (y > 0)
    if ok.sum() < 3:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def last_decade(run: pd.DataFrame, *, window: int = WINDOW) -> pd.DataFrame:
    """The rows of one run's (one layer's) trajectory from its last step / `window` on, by step."""
    run = run.sort_values("step")
    return run[run["step"] >= float(run["step"].max()) / window]


def velocities(late: pd.DataFrame, *, eps: float, lr: float, what: str) -> dict[str, float]:
    """From one run's (one layer's) last-decade trajectory rows (`last_decade`): the gradient RMS
    (median), the gradient's bias along the drift (mean over the intervals, with its standard error),
    the velocity Adam makes of it, lr mu sigma / (sigma + eps) averaged over the intervals, in units of
    lr (`velocity_predicted`), the measured velocity (the drift's growth from the window's first to its
    last row per step, in units of lr) and the drift at the last row. `units` judges the recorded runs
    with it and `null_units` the pure-noise walks, so the two cannot differ in how they compute these.

    The bias along the drift is undefined at the first logged step (no drift yet: NaN by design),
    which lies before the last decade; in the window a NaN raises."""
    along = finite_values(late["grad_along_drift"], f"{what} gradient along the drift")
    sigma = late["grad_rms_b_k"].to_numpy(float)
    predicted = finite_mean(along * sigma / (sigma + eps), f"{what} predicted velocity", strict=True)
    d0, d1 = float(late["drift_b_k"].iloc[0]), float(late["drift_b_k"].iloc[-1])
    measured = (d1 - d0) / (float(late["step"].iloc[-1]) - float(late["step"].iloc[0])) / lr
    return {"grad_rms_late": finite_median(sigma, f"{what} gradient RMS", strict=True),
            "grad_along_drift": finite_mean(along, f"{what} gradient along the drift", strict=True),
            "grad_along_drift_se": finite_std(along, f"{what} gradient along the drift") / math.sqrt(len(along)),
            "velocity_measured": measured, "velocity_predicted": predicted, "drift_end": d1}


def units(traj: pd.DataFrame, probes: pd.DataFrame, entries: pd.DataFrame, *, window: int = WINDOW) -> pd.DataFrame:
    """One row per run and layer: the exponent, the step rate, the noise elasticity, the gradient's
    bias along the drift with the velocities it predicts and the measured one, and the direction."""
    _require(traj, "trajectory", UNIT + ["step", "drift_b_k", "norm_b_k", "grad_rms_b_k", "grad_along_drift",
                                         "noise_sum", "lr", "n_bias"])
    _require(probes, "probes", UNIT + ["step", "key_norm", "norm_b_k", "cos_b_k_mean_query"])
    _require(entries, "entries", UNIT + ["step", "entry", "displacement"])
    require_finite(traj, ["step", "noise_sum", "drift_b_k", "grad_rms_b_k", "norm_b_k", "lr", "n_bias"], "trajectory")
    require_finite(entries, ["step", "displacement"], "entries")
    require_finite(probes, ["step", "key_norm", "norm_b_k", "cos_b_k_mean_query"], "probes")
    shortest = traj.groupby(UNIT)["step"].max().groupby(level="size").min()  # the bfloat16 runs' length
    sq = (entries.assign(sq=entries["displacement"] ** 2)
          .groupby(UNIT + ["step"], sort=True)["sq"].mean().reset_index())
    rows = []
    for key, g in traj.groupby(UNIT, sort=True):
        g = g.sort_values("step")
        t_end = float(g["step"].max())
        late = last_decade(g, window=window)
        e = sq[(sq[UNIT] == pd.Series(key, index=UNIT)).all(axis=1)]
        e_late = e[e["step"] >= t_end / window]
        alpha = 0.5 * _slope(e_late["step"], e_late["sq"])
        half = g[g["step"] >= t_end / 2]
        rate = float((half["noise_sum"].iloc[-1] - half["noise_sum"].iloc[0])
                     / (half["step"].iloc[-1] - half["step"].iloc[0])) if len(half) > 1 else math.nan
        elastic_rows = late[late["step"].isin(e_late["step"])]
        elasticity = _slope(elastic_rows["norm_b_k"], elastic_rows["grad_rms_b_k"])
        eps, lr = float(key[2]), float(g["lr"].iloc[0])
        what = f"{dict(zip(UNIT, key, strict=True))} last decade"
        speed = velocities(late, eps=eps, lr=lr, what=what)
        d1 = speed.pop("drift_end")
        p = probes[(probes[UNIT] == pd.Series(key, index=UNIT)).all(axis=1)]
        last = p[p["step"] == p["step"].max()].iloc[0]
        n = int(g["n_bias"].iloc[0])
        at = g[g["step"] <= int(shortest.loc[key[0]])]
        rows.append({**dict(zip(UNIT, key, strict=True)), "steps": int(t_end),
                     "window_start": int(e_late["step"].min()) if len(e_late) else 0,
                     "window_points": len(e_late), "n_bias": n, "exponent": alpha, "step_rate": rate,
                     "noise_elasticity": elasticity, **speed, "drift_end": d1, "drift_at_short": float(at["drift_b_k"].iloc[-1]),
                     "short_step": int(at["step"].iloc[-1]),
                     "key_norm_end": float(last["key_norm"]), "bk_over_key_end": float(last["norm_b_k"] / last["key_norm"]),
                     "cos_mean_query": float(last["cos_b_k_mean_query"]),
                     "cos_mean_query_sqrt_n": float(last["cos_b_k_mean_query"]) * math.sqrt(n)})
    return pd.DataFrame(rows)


def per_seed(table: pd.DataFrame, column: str) -> pd.DataFrame:
    """`column` averaged over the layers of each run: one value per (size, dtype, eps, seed)."""
    return table.groupby(SETTING + ["seed"], sort=False)[column].agg(
        lambda v: finite_mean(v, f"{column} over the layers of a run", strict=True)).reset_index()


def intervals(table: pd.DataFrame, column: str = "exponent", *, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per setting (size, dtype, eps): the mean over seeds of `column` (each seed's layers averaged
    first), its Student-t interval across seeds (df = seeds - 1) and the seeds' range. The spread is
    run to run: nothing within a run is resampled."""
    seeds = per_seed(table, column)
    rows = []
    for key, g in seeds.groupby(SETTING, sort=False):
        v = g[column].to_numpy(float)
        k = len(v)
        what = f"{column} over the seeds of {dict(zip(SETTING, key, strict=True))}"
        mean = finite_mean(v, what, strict=True)
        half = float(stats.t.ppf(0.5 + confidence / 2, k - 1) * finite_std(v, what) / math.sqrt(k)) if k > 1 else math.inf
        rows.append({**dict(zip(SETTING, key, strict=True)), "seeds": k, "column": column, "mean": mean,
                     "low": mean - half, "high": mean + half, "min": finite_min(v, what), "max": finite_max(v, what)})
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


# ----------------------------------------------------------------------------- claims
# Every bound below was fixed, with its origin, before the recorded grid ran (params/claims/rules.md,
# "Notebook 08: the recorded full grid").

EXPONENT_BOUND = 0.75  # halfway between a walk (1/2) and constant velocity (1)
BIAS_SE_BOUND = 3.0  # standard errors of the gradient bias along the drift
VELOCITY_LOG2_BOUND = 1.0  # a factor of 2
OPPOSITE_SIGN_LOG2 = 10.0  # a measured velocity of the opposite sign: a factor of 2^10
ELASTICITY_BOUND = 0.5  # halfway between no growth and the candidate's proportional growth
DETECT_Z = 1.645  # one-sided 95% normal quantile of the detectable effects
FULL_STEP_RATE = 0.5  # r = (sigma / (s + eps))^2 ~ 1 for full-size steps
SGD_STEP_RATE = 0.25  # the step at most half of full size
DAMPING_RATIO = 0.5  # sigma / (sigma + eps) < 1/2 when sigma < eps
FLOAT32, BFLOAT16 = "float32", "bfloat16"
SMALL = "small"

FINDING_OF.update({
    "longrun-noise-not-tracking-bias": "long-run-drift",
    "adam-sgd-steps-float32-default-eps": "adam-drift-regimes",
    "adam-default-eps-damps-drift": "adam-drift-regimes",
})


def _claim(**kw) -> Claim:
    """A Claim; `protects` (a control's protected test) only where this checkout's Claim has it."""

    if "protects" in kw and "protects" not in {f.name for f in dataclasses.fields(Claim)}:
        protects = kw.pop("protects")
        kw["kind"] = "consistency" if kw.get("kind") == "control" else kw.get("kind")
        kw["bound_origin"] = f"{kw.get('bound_origin', '')} (a positive control of {', '.join(protects)})"
    return build_claim(**kw)


def _float32(table, eps=None):
    sel = table[table["dtype"] == FLOAT32]
    if eps is not None:
        sel = sel[np.isclose(sel["eps"].astype(float), eps, rtol=1e-9, atol=0)]
    if sel.empty:
        raise ValueError(f"no float32 run with eps={eps!r}")
    return sel


def bias_claim(table: pd.DataFrame) -> Claim:
    sel = _select(_float32(table), size=SMALL)
    z = sel["grad_along_drift"] / sel["grad_along_drift_se"]
    # a retired prediction (RETIRED_AFTER_FAILING), judged as registered but no longer a claim, so
    # it has no ClaimSpec
    return Claim(
        id="longrun-gradient-biased-along-drift",
        statement=("In float32 (eps 1e-12 and 1e-8) the gradient of b_k is not zero-mean noise: over every small-model "
                   "run's last decade its mean keeps pushing b_k the way it has already moved, by more than "
                   f"{BIAS_SE_BOUND:g} standard errors (smallest over the runs)."),
        value=finite_min(z, "bias over its standard error"), bound=BIAS_SE_BOUND, comparison=">", kind="test",
        bound_origin="zero-mean noise gives 0; 3 standard errors, fixed before the runs")


def velocity_runs(table: pd.DataFrame) -> pd.DataFrame:
    """The rows the velocity claim judges: the small model's float32 runs (both eps)."""
    return _select(_float32(table), size=SMALL)


def velocity_log2(table: pd.DataFrame) -> np.ndarray:
    """Per row of `velocity_runs(table)`: |log2 measured / predicted velocity|; opposite signs (or a
    zero prediction) count as OPPOSITE_SIGN_LOG2, beyond any factor the bound allows; NaN stays NaN
    (and fails the reduction that reads it)."""
    sel = velocity_runs(table)
    ratio = (sel["velocity_measured"] / sel["velocity_predicted"]).to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        log2 = np.where(ratio > 0, np.abs(np.log2(np.where(ratio > 0, ratio, 1.0))), OPPOSITE_SIGN_LOG2)
    return np.where(np.isnan(ratio), np.nan, log2)


def velocity_claim(table: pd.DataFrame) -> Claim:
    log2 = velocity_log2(table)
    return build_claim(
        id="longrun-velocity-from-gradient-bias",
        statement=("In float32 (eps 1e-12 and 1e-8) the drift's velocity over every small-model run's last decade "
                   "is the velocity Adam makes of the gradient's bias, lr mu / (sigma + eps), within a factor of 2 "
                   "(largest |log2 measured / predicted|)."),
        value=finite_max(log2, "velocity log-ratios"), bound=VELOCITY_LOG2_BOUND, comparison="<=", kind="consistency",
        bound_origin="Adam's update in the small-signal limit, a factor 2 for sqrt(v_i) ~ sigma; fixed before the runs; "
                     "computed from the logged gradients by Adam's own rule, so a cross-check")


# ----------------------------------------------------------------------------- the pure-noise null
# The referee's question: is the velocity match built into how mu is measured? The null gives Adam a
# gradient with no bias at all, matched to each judged run, and judges it by the same code
# (`velocities`, `velocity_log2`). Its replicates, seed and bound were fixed in this code before
# the null was first run on the recorded grid (params/claims/rules.md).

NULL_REPLICATES = 50  # pure-noise walks per judged run; replicate r of every run makes one null grid
NULL_SEED = 80_800  # walk seeds: NULL_SEED + the run's index among the judged runs, sorted by UNIT
NULL_PASS_BOUND = 0.05  # the null may pass the velocity claim's check in fewer than 5% of its grids
NULL_REAL_VELOCITY = "velocity_measured_real"  # the judged run's own measured velocity, beside its null
NULL_REPLICATE = "replicate"
NULL_WALKS = "walks"  # null_summary: walks per run
NULL_VELOCITY = "null_velocity_measured"  # null_summary: the null walks' median measured velocity
NULL_SPEEDUP = "speedup_over_null"  # null_summary: the run's measured velocity over its null's
NULL_MATCH = "null_match_fraction"  # null_summary: the share of its null walks within the factor of 2


def null_units(table: pd.DataFrame, traj: pd.DataFrame, *, replicates: int = NULL_REPLICATES,
               seed: int = NULL_SEED, window: int = WINDOW) -> pd.DataFrame:
    """For every run (and layer) the velocity claim judges, `replicates` walks of Adam on pure
    zero-mean noise (`measure.adam_noise_walk`), matched to it: the same n_bias entries, lr, eps,
    steps and logged steps (read from the run's recorded trajectory), and a gradient N(0, sigma^2)
    per entry and step with sigma the run's late gradient RMS (`grad_rms_late`). Each walk is judged
    by `velocities` over its last decade exactly as the run was. One row per run and replicate: the
    run's keys, `replicate`, the columns of `velocities` and the run's own measured velocity."""
    _require(traj, "trajectory", UNIT + ["step", "lr"])
    runs = velocity_runs(table).sort_values(UNIT, kind="stable")
    logged = {key: g.sort_values("step") for key, g in traj.groupby(UNIT, sort=True)}
    rows = []
    for index, (_, run) in enumerate(runs.iterrows()):
        key = tuple(run[c] for c in UNIT)
        match = [k for k in logged if k[:2] == key[:2] and k[3:] == key[3:]
                 and math.isclose(float(k[2]), float(key[2]), rel_tol=1e-9)]
        if len(match) != 1:
            raise ValueError(f"no single recorded trajectory for {dict(zip(UNIT, key, strict=True))}")
        g = logged[match[0]]
        eps, lr = float(run["eps"]), float(g["lr"].iloc[0])
        sigma = float(run["grad_rms_late"])  # a NaN or non-positive sigma raises in the walk
        walks = measure.adam_noise_walk(np.full(replicates, sigma), eps, log_steps=g["step"].to_numpy(),
                                        n_bias=int(run["n_bias"]), lr=lr, seed=seed + index)
        for r, w in walks.groupby("walk", sort=True):
            what = f"null walk {r} of {dict(zip(UNIT, key, strict=True))} last decade"
            speed = velocities(last_decade(w, window=window), eps=eps, lr=lr, what=what)
            rows.append({**dict(zip(UNIT, key, strict=True)), NULL_REPLICATE: int(r), **speed,
                         NULL_REAL_VELOCITY: float(run["velocity_measured"])})
    return pd.DataFrame(rows)


def null_summary(null: pd.DataFrame) -> pd.DataFrame:
    """Per judged run: its measured velocity, the null's median measured velocity and their ratio
    (how many times faster than pure noise the run drifts), and the share of its null walks whose
    measured / predicted velocity lies within the velocity claim's factor."""
    _require(null, "null", UNIT + [NULL_REPLICATE, NULL_REAL_VELOCITY, "velocity_measured", "velocity_predicted"])
    rows = []
    for key, g in null.groupby(UNIT, sort=True):
        what = f"null of {dict(zip(UNIT, key, strict=True))}"
        real = finite_median(g[NULL_REAL_VELOCITY], f"{what} real velocity", strict=True)
        noise = finite_median(g["velocity_measured"], f"{what} null velocities", strict=True)
        log2 = finite_values(velocity_log2(g), f"{what} velocity log-ratios")
        rows.append({**dict(zip(UNIT, key, strict=True)), NULL_WALKS: len(g), "velocity_measured": real,
                     NULL_VELOCITY: noise, NULL_SPEEDUP: real / noise,
                     NULL_MATCH: float(np.mean(log2 <= VELOCITY_LOG2_BOUND))})
    return pd.DataFrame(rows)


def null_pass_fraction(null: pd.DataFrame) -> float:
    """The share of the null's replicate grids (replicate r of every judged run) on which the velocity
    claim's check (largest |log2 measured / predicted| <= its bound) holds."""
    _require(null, "null", UNIT + [NULL_REPLICATE, "velocity_measured", "velocity_predicted"])
    passes = [finite_max(velocity_log2(g), f"null grid {r} velocity log-ratios") <= VELOCITY_LOG2_BOUND
              for r, g in null.groupby(NULL_REPLICATE, sort=True)]
    return finite_mean(np.asarray(passes, dtype=float), "null grids passing", strict=True)


def null_claim(null: pd.DataFrame) -> Claim:
    grids = int(null[NULL_REPLICATE].nunique())
    return build_claim(
        id="longrun-velocity-null-fails",
        statement=("Negative control: Adam on pure zero-mean noise, matched to each small-model float32 run (its late "
                   "gradient RMS, lr, eps, steps and logged steps) and judged by the same code, passes the velocity "
                   f"check (every run within a factor of 2) in fewer than {NULL_PASS_BOUND:.0%} of {grids} null grids: "
                   "the match is not built into how the gradient's bias along the drift is measured."),
        value=null_pass_fraction(null), bound=NULL_PASS_BOUND, comparison="<", kind="control",
        protects=("longrun-velocity-from-gradient-bias",),
        bound_origin="a 5% false-pass rate, fixed in the code before the null ran on the recorded grid")


def null_macros(null: pd.DataFrame) -> dict[str, float]:
    """The null's numbers the paper prints: walks per run, the share of null grids passing the velocity
    check, the share of single null walks within its factor, and how many times faster than its null
    each judged run drifts (smallest and median over the runs)."""
    summary = null_summary(null)
    log2 = finite_values(velocity_log2(null), "null velocity log-ratios")
    return {"LongFullNullWalks": int(null.groupby(UNIT).size().min()),
            "LongFullNullPassFraction": null_pass_fraction(null),
            "LongFullNullMatchFraction": float(np.mean(log2 <= VELOCITY_LOG2_BOUND)),
            "LongFullNullSpeedupMin": finite_min(summary[NULL_SPEEDUP], "speedups over the null"),
            "LongFullNullSpeedupMedian": finite_median(summary[NULL_SPEEDUP], "speedups over the null"),
            "LongFullNullSpeedupMax": finite_max(summary[NULL_SPEEDUP], "speedups over the null")}


def null_text(m: dict) -> str:
    """The null's outcome in two sentences, from `null_macros`' numbers."""
    verdict = ("so the match is not built into how the bias is measured" if m["LongFullNullPassFraction"] < NULL_PASS_BOUND
               else "so the match is, at least in part, built into how the bias is measured")
    return (f"On pure zero-mean noise matched to each judged run ({m['LongFullNullWalks']} Adam walks per run), judged "
            f"by the same code, measured over predicted velocity lies within a factor of 2 in "
            f"{m['LongFullNullMatchFraction']:.1%} of the walks, and the velocity check holds on "
            f"{m['LongFullNullPassFraction']:.1%} of the null grids, {verdict}. The runs drift "
            f"{m['LongFullNullSpeedupMin']:.1f} to {m['LongFullNullSpeedupMax']:.1f} times faster than their null "
            f"(median {m['LongFullNullSpeedupMedian']:.1f}).")


def key_norm_elasticity(sel: pd.DataFrame) -> float:
    """The largest noise elasticity that noise growing with the whole key norm,
    sigma ~ (||k||^2 + ||b_k||^2)^(1/2), gives at the runs' final rho = ||b_k|| / ||k||: rho^2 / (1 + rho^2)."""
    rho = per_seed(sel, "bk_over_key_end")["bk_over_key_end"]
    return finite_max(rho**2 / (1 + rho**2), "key-norm elasticities")


def noise_claim(table: pd.DataFrame) -> Claim:
    sel = _select(_float32(table), size=SMALL)
    values = per_seed(sel, "noise_elasticity")["noise_elasticity"]
    # the true median at which the measured one exceeds the bound in 95% of reruns: the bound plus a
    # one-sided normal quantile of the median's standard error, sigma sqrt(pi / 2n) for n runs
    spread = finite_std(values, "noise elasticities") * math.sqrt(math.pi / (2 * len(values)))
    return build_claim(
        id="longrun-noise-not-tracking-bias",
        statement=("In the small model's float32 runs the candidate explanation that the gradient's rounding noise "
                   "grows with ||b_k|| (the scores carry q.b_k) does not hold: there the noise elasticity "
                   f"d log sigma / d log ||b_k|| over the last decade, median over the {len(values)} runs, lies below "
                   f"{ELASTICITY_BOUND}. This excludes noise in proportion to ||b_k||, not noise that grows with the "
                   "whole key norm (||k||^2 + ||b_k||^2)^(1/2), whose elasticity rho^2 / (1 + rho^2) at the runs' "
                   f"rho = ||b_k|| / ||k|| would be at most {key_norm_elasticity(sel):.2g}. "
                   "The claim does not judge the medium model."),
        value=finite_median(values, "noise elasticities"), bound=ELASTICITY_BOUND, comparison="<", kind="test",
        bound_origin="halfway between no growth and the proportional growth the candidate predicts; fixed before the runs",
        min_detectable=ELASTICITY_BOUND + DETECT_Z * spread)


def step_rate_claims(table: pd.DataFrame) -> list[Claim]:
    small = _float32(table, SMALL_EPS)["step_rate"]
    default = _float32(table, DEFAULT_EPS)["step_rate"]
    bf16 = _select(table, dtype=BFLOAT16, eps=DEFAULT_EPS)["step_rate"]
    return [
        build_claim(id="adam-full-steps-float32-small-eps",
              statement=("In float32 with eps = 1e-12 Adam takes full-size steps on b_k's rounding noise: the step rate "
                         f"r = (sigma / (s + eps))^2 is at least {FULL_STEP_RATE} in every layer of every run (smallest)."),
              value=finite_min(small, "step rates"), bound=FULL_STEP_RATE, comparison=">=", kind="consistency",
              # r is computed from the logged noise by Adam's own formula, which gives about 1 whenever
              # eps is far below the noise: a cross-check of that regime, not a test
              bound_origin="theory: r ~ 1 when eps is far below the noise (the formula's own limit)"),
        build_claim(id="adam-full-steps-bfloat16-default-eps",
              statement=("In bfloat16 autocast with the default eps = 1e-8 Adam also takes full-size steps on b_k: "
                         f"r >= {FULL_STEP_RATE} in every layer of every run (smallest)."),
              value=finite_min(bf16, "step rates"), bound=FULL_STEP_RATE, comparison=">=", kind="consistency",
              bound_origin="theory: bfloat16's rounding noise is about 2^16 times float32's, far above 1e-8 "
                           "(the formula's own limit)"),
        build_claim(id="adam-sgd-steps-float32-default-eps",
              statement=("In float32 with the default eps = 1e-8 Adam's steps on b_k are SGD-like, lr g / eps: "
                         f"r <= {SGD_STEP_RATE} in every layer of every run (largest)."),
              value=finite_max(default, "step rates"), bound=SGD_STEP_RATE, comparison="<=", kind="test",
              bound_origin="theory: float32 rounding noise of b_k's gradient below eps"),
    ]


def damping_claims(table: pd.DataFrame) -> list[Claim]:
    pairs = paired_ratio(table, "drift_end", num=(FLOAT32, DEFAULT_EPS), den=(FLOAT32, SMALL_EPS))
    control = paired_ratio(table, "drift_at_short", num=(BFLOAT16, DEFAULT_EPS), den=(FLOAT32, SMALL_EPS))
    return [
        build_claim(id="adam-default-eps-damps-drift",
              statement=("In float32 the default eps = 1e-8 at least halves the drift of b_k: at the run's end the drift "
                         "with eps = 1e-8 over the drift with eps = 1e-12, same seed and size, is at most "
                         f"{DAMPING_RATIO} in every pair (largest)."),
              value=finite_max(pairs["ratio"], "paired drift ratios"), bound=DAMPING_RATIO, comparison="<=",
              kind="test", bound_origin="theory: the step shrinks by sigma / (sigma + eps) < 1/2 when sigma < eps"),
        _claim(id="adam-drift-ratio-control-bfloat16",
               statement=("Positive control: the same paired ratio for bfloat16 with eps = 1e-8 against float32 with "
                          f"eps = 1e-12, at the bfloat16 run's last step, is above {DAMPING_RATIO} in every pair "
                          "(smallest): the ratio sees a regime of full-size steps."),
               value=finite_min(control["ratio"], "paired drift ratios"), bound=DAMPING_RATIO, comparison=">",
               kind="control", protects=("adam-default-eps-damps-drift",),
               bound_origin="the bound of the claim it protects"),
    ]


# Pre-registered predictions that the recorded grid contradicted. A claim the data contradict
# fails the build, so such a prediction cannot stay a claim; it is retired, and every build still
# computes it and reports its outcome (`failed_predictions`), so the failure is never hidden. The
# rules record (params/claims/rules.md) says when it failed and on what.
RETIRED_AFTER_FAILING = ("longrun-gradient-biased-along-drift",)


def claims(table: pd.DataFrame) -> list[Claim]:
    """Every claim on the recorded grid, in the order the notebook states them."""
    return [*explanation_claims(table), *regime_claims(table)]


def explanation_claims(table: pd.DataFrame) -> list[Claim]:
    """The claims on what drives the drift (section 3 of notebook 08)."""
    return [velocity_claim(table), noise_claim(table)]


def regime_claims(table: pd.DataFrame) -> list[Claim]:
    """The claims on Adam's two step regimes (section 4 of notebook 08)."""
    return [*step_rate_claims(table), *damping_claims(table)]


def failed_predictions(table: pd.DataFrame) -> list[dict]:
    """The retired predictions, judged exactly as their claims were, with their outcome: one dict
    per prediction (id, statement, value, bound, comparison, holds)."""
    out = []
    for claim in (bias_claim(table),):
        assert claim.id in RETIRED_AFTER_FAILING
        out.append({"id": claim.id, "statement": claim.statement, "value": claim.value, "bound": claim.bound,
                    "comparison": claim.comparison, "holds": claim.holds})
    return out


# ----------------------------------------------------------------------------- macros

_SIZE_WORD = {"small": "Small", "medium": "Medium"}
_REGIME_WORD = {(FLOAT32, SMALL_EPS): "FloatEpsTwelve", (FLOAT32, DEFAULT_EPS): "FloatEpsEight",
                (BFLOAT16, DEFAULT_EPS): "BfloatEpsEight"}


def _regime_word(dtype, eps) -> str:
    for (d, e), word in _REGIME_WORD.items():
        if d == dtype and math.isclose(float(eps), e, rel_tol=1e-9):
            return word
    raise ValueError(f"no macro word for dtype={dtype!r}, eps={eps!r}")


def macros(table: pd.DataFrame, spans: pd.DataFrame, run: dict) -> dict[str, object]:
    """The numbers the paper prints about the recorded grid (letters-only names)."""
    out: dict[str, object] = {
        "LongFullSeeds": int(table["seed"].nunique()),
        "LongFullSizes": int(table["size"].nunique()),
        "LongFullRuns": int(table.groupby(SETTING + ["seed"]).ngroups),
        "LongFullMinutes": round(float(run["wall_seconds"]) / 60.0),
        "LongFullCommit": str(run["commit"])[:7],
        "LongFullCpu": str(run["cpu"]),
        "LongFullTorch": str(run["torch"]),
    }
    # the training setup the paper states: the recorder's common settings and the context of its sizes
    out.update(LongFullLr=record.COMMON["lr"], LongFullBatch=record.COMMON["batch_size"],
               LongFullWeightDecay=record.COMMON["weight_decay"])
    contexts = {int(s["context"]) for s in run.get("sizes", record.SIZES).values()}
    out["LongFullContext"] = contexts.pop() if len(contexts) == 1 else "/".join(map(str, sorted(contexts)))
    for _, r in spans[spans["column"] == "exponent"].iterrows():
        stem = f"LongFullExponent{_SIZE_WORD[r['size']]}{_regime_word(r['dtype'], r['eps'])}"
        out[stem] = r["mean"]
        out[stem + "Low"] = r["low"]
        out[stem + "High"] = r["high"]
    for size in table["size"].unique():
        steps = int(table.loc[table["size"] == size, "steps"].max())
        out[f"LongFullSteps{_SIZE_WORD[size]}"] = steps
    out["LongFullStepsBfloat"] = int(_select(table, dtype=BFLOAT16).loc[:, "steps"].max())
    small = _select(table, dtype=FLOAT32, eps=SMALL_EPS, size=SMALL)
    f32_small = _select(_float32(table), size=SMALL)
    out["LongFullExponentMedianSmall"] = finite_median(per_seed(small, "exponent")["exponent"], "exponents")
    z = f32_small["grad_along_drift"] / f32_small["grad_along_drift_se"]
    out["LongFullBiasMinSe"] = finite_min(z, "bias z")
    out["LongFullBiasSmall"] = finite_median(small["grad_along_drift"], "bias")
    # the runs in which the velocity prediction is tested and holds: the paper says how few they are
    out["LongFullMechanismRuns"] = int(f32_small.groupby(SETTING + ["seed"]).ngroups)
    ratio = f32_small["velocity_measured"] / f32_small["velocity_predicted"]
    out["LongFullVelocityRatioMin"] = finite_min(ratio, "velocity ratios")
    out["LongFullVelocityRatioMax"] = finite_max(ratio, "velocity ratios")
    out["LongFullVelocitySmall"] = finite_median(small["velocity_measured"], "velocities")
    out["LongFullQueryCos"] = finite_median(per_seed(small, "cos_mean_query")["cos_mean_query"], "cosines")
    out["LongFullQueryCosSqrtN"] = finite_median(per_seed(small, "cos_mean_query_sqrt_n")["cos_mean_query_sqrt_n"],
                                                 "cosines")
    # the alignment with the mean query in the damped runs (default eps), whose drift is no faster than
    # a walk: as large there, so it is not a sign of the fast drift (rules.md: the retired direction test)
    out["LongFullQueryCosSqrtNDamped"] = finite_median(
        per_seed(_select(table, dtype=FLOAT32, eps=DEFAULT_EPS, size=SMALL), "cos_mean_query_sqrt_n")["cos_mean_query_sqrt_n"],
        "damped runs' cosines")
    out["LongFullQueryCosMedium"] = finite_median(
        per_seed(_select(table, dtype=FLOAT32, eps=SMALL_EPS, size="medium"), "cos_mean_query")["cos_mean_query"],
        "cosines") if (table["size"] == "medium").any() else math.nan
    out["LongFullNoiseElasticity"] = finite_median(per_seed(f32_small, "noise_elasticity")["noise_elasticity"],
                                                   "elasticities")
    out["LongFullNoiseKeyNormElasticityMax"] = key_norm_elasticity(f32_small)
    out["LongFullNoiseElasticityHigh"] = finite_max(intervals(f32_small, "noise_elasticity")["high"], "intervals")
    # the medium model, which the noise claim does not judge: the text reports where the candidate is not excluded
    if (table["size"] == "medium").any():
        medium = per_seed(_select(table, dtype=FLOAT32, eps=SMALL_EPS, size="medium"),
                          "noise_elasticity")["noise_elasticity"]
        out["LongFullNoiseElasticityMediumMin"] = finite_min(medium, "medium elasticities")
        out["LongFullNoiseElasticityMediumMax"] = finite_max(medium, "medium elasticities")
    else:
        out["LongFullNoiseElasticityMediumMin"] = out["LongFullNoiseElasticityMediumMax"] = math.nan
    rates = {w: table[(table["dtype"] == d) & np.isclose(table["eps"].astype(float), e, rtol=1e-9, atol=0)]["step_rate"]
             for (d, e), w in _REGIME_WORD.items()}
    out["LongFullRateFloatEpsTwelveMin"] = finite_min(rates["FloatEpsTwelve"], "rates")
    out["LongFullRateFloatEpsTwelveMedian"] = finite_median(rates["FloatEpsTwelve"], "rates")
    out["LongFullRateFloatEpsEightMax"] = finite_max(rates["FloatEpsEight"], "rates")
    out["LongFullRateFloatEpsEightMedian"] = finite_median(rates["FloatEpsEight"], "rates")
    out["LongFullRateBfloatEpsEightMin"] = finite_min(rates["BfloatEpsEight"], "rates")
    out["LongFullRateBfloatEpsEightMedian"] = finite_median(rates["BfloatEpsEight"], "rates")
    damp = paired_ratio(table, "drift_end", num=(FLOAT32, DEFAULT_EPS), den=(FLOAT32, SMALL_EPS))
    out["LongFullDampingMax"] = finite_max(damp["ratio"], "ratios")
    out["LongFullDampingMedian"] = finite_median(damp["ratio"], "ratios")
    control = paired_ratio(table, "drift_at_short", num=(BFLOAT16, DEFAULT_EPS), den=(FLOAT32, SMALL_EPS))
    out["LongFullControlMin"] = finite_min(control["ratio"], "ratios")
    out["LongFullControlMedian"] = finite_median(control["ratio"], "ratios")
    out["LongFullBkOverKeyMax"] = finite_max(small["bk_over_key_end"], "ratios")
    out["LongFullBkOverKeyMedian"] = finite_median(small["bk_over_key_end"], "ratios")
    out.update(per_run_range_macros(table))
    out.update(velocity_outside_macros(table))
    return out


def velocity_outside_macros(table: pd.DataFrame) -> dict[str, float]:
    """Adam's velocity for the gradient's bias (measured over predicted) and the noise's elasticity in
    the runs outside the small float32 model, where the mechanism is confirmed: the paper must say how
    far it fails there. A predicted velocity of the wrong sign gives a negative ratio, counted apart."""
    rest = table[~((table["dtype"] == FLOAT32) & (table["size"] == SMALL))]
    ratio = rest["velocity_measured"] / rest["velocity_predicted"]
    positive = ratio[ratio > 0]
    return {"LongFullVelocityOutsideRows": int(ratio.notna().sum()),
            "LongFullVelocityOutsideWrongSign": int((ratio <= 0).sum()),
            "LongFullVelocityOutsideRatioMin": finite_min(positive, "velocity ratios"),
            "LongFullVelocityOutsideRatioMax": finite_max(positive, "velocity ratios"),
            "LongFullElasticityOutsideMin": finite_min(rest["noise_elasticity"], "elasticities"),
            "LongFullElasticityOutsideMax": finite_max(rest["noise_elasticity"], "elasticities")}


def per_run_range_macros(table: pd.DataFrame) -> dict[str, float]:
    """Per regime, the range over runs (both sizes, each run's layers averaged, as the appendix
    table prints them) of the step rate and the drift exponent: the medians above pool layers, so
    a reader checking them against the per-run table needs these."""
    out: dict[str, float] = {}
    for (dtype, eps), word in _REGIME_WORD.items():
        sel = _select(table, dtype=dtype, eps=eps)
        for column, stem in (("step_rate", "Rate"), ("exponent", "Exponent")):
            runs = per_seed(sel, column)[column]
            out[f"LongFullRun{stem}{word}Min"] = finite_min(runs, f"per-run {column}")
            out[f"LongFullRun{stem}{word}Max"] = finite_max(runs, f"per-run {column}")
    return out


def findings_text(table: pd.DataFrame, spans: pd.DataFrame, m: dict) -> str:
    """The section's findings in two sentences, from the macros (the notebook shows them first)."""
    def span(size, word):
        key = f"LongFullExponent{size}{word}"
        return f"{m[key]:.2f} [{m[key + 'Low']:.2f}, {m[key + 'High']:.2f}]" if key in m else "not measured"

    walk = "faster than a random walk" if m["LongFullExponentMedianSmall"] > EXPONENT_BOUND else "no faster than a walk"
    low = m.get("LongFullExponentSmallFloatEpsTwelveLow", math.nan)
    caveat = (f", whose lower end {low:.2f} does not exclude a walk with {m['LongFullSeeds']} seeds"
              if low <= 0.5 else "")
    lo, hi = m["LongFullVelocityRatioMin"], m["LongFullVelocityRatioMax"]
    matched = lo >= 2.0 ** -VELOCITY_LOG2_BOUND and hi <= 2.0 ** VELOCITY_LOG2_BOUND
    why = ("The drift's velocity is the velocity Adam makes of the gradient's bias along the drift (measured over "
           f"predicted {lo:.2f} to {hi:.2f})" if matched else
           "The gradient's bias along the drift does not account for the drift's velocity (measured over predicted "
           f"{lo:.2f} to {hi:.2f})")
    z = m["LongFullBiasMinSe"]
    why += (f", and that bias exceeds {BIAS_SE_BOUND:g} standard errors in every small-model run"
            if z > BIAS_SE_BOUND else
            f", but in the weakest small-model run that bias is only {z:.1f} standard errors from zero")
    noise = ("the rounding noise does not grow with ||b_k||" if m["LongFullNoiseElasticity"] < ELASTICITY_BOUND
             else "the rounding noise does grow with ||b_k||")
    return (f"Over {m['LongFullRuns']} recorded runs ({m['LongFullSeeds']} fresh seeds, {m['LongFullSizes']} sizes, "
            f"3 Adam regimes), the small model's key bias drifts {walk} in float32 with eps = 1e-12: median growth "
            f"exponent {m['LongFullExponentMedianSmall']:.2f} over the seeds, mean {span('Small', 'FloatEpsTwelve')} "
            f"(95% interval across seeds){caveat}; the medium model's is {span('Medium', 'FloatEpsTwelve')} over its "
            "shorter run. "
            f"{why}; {noise} (elasticity {m['LongFullNoiseElasticity']:.2f}). "
            f"Adam's steps on b_k have full size in float32 at eps = 1e-12 (step rate r >= "
            f"{m['LongFullRateFloatEpsTwelveMin']:.2f}) and in bfloat16 at the default eps = 1e-8 (r >= "
            f"{m['LongFullRateBfloatEpsEightMin']:.2f}); in float32 at the default eps they are SGD-like "
            f"(r <= {m['LongFullRateFloatEpsEightMax']:.3f}, steps of at most "
            f"{math.sqrt(m['LongFullRateFloatEpsEightMax']):.2f} of full size), "
            f"and the drift is at most {m['LongFullDampingMax']:.2f} of the small-eps drift of the same seed.")

# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
LONGRUN_VELOCITY_FROM_GRADIENT_BIAS = register_claim(ClaimSpec(
    'longrun-velocity-from-gradient-bias', '08_longrun', 'consistency',
    bound=1.0,
    origin="Adam's update in the small-signal limit, a factor 2 for sqrt(v_i) ~ sigma; fixed before the runs; computed from the logged gradients by Adam's own rule, so a cross-check",
))
LONGRUN_VELOCITY_NULL_FAILS = register_claim(ClaimSpec(
    'longrun-velocity-null-fails', '08_longrun', 'control',
    comparison='<',
    bound=NULL_PASS_BOUND,
    origin='a 5% false-pass rate, fixed in the code before the null ran on the recorded grid',
))
LONGRUN_NOISE_NOT_TRACKING_BIAS = register_claim(ClaimSpec(
    'longrun-noise-not-tracking-bias', '08_longrun', 'test',
    comparison='<',
    bound=ELASTICITY_BOUND,
    origin='halfway between no growth and the proportional growth the candidate predicts; fixed before the runs',
    finding='long-run-drift',
))
ADAM_FULL_STEPS_FLOAT32_SMALL_EPS = register_claim(ClaimSpec(
    'adam-full-steps-float32-small-eps', '08_longrun', 'consistency',
    comparison='>=',
    bound=FULL_STEP_RATE,
    origin="theory: r ~ 1 when eps is far below the noise (the formula's own limit)",
))
ADAM_FULL_STEPS_BFLOAT16_DEFAULT_EPS = register_claim(ClaimSpec(
    'adam-full-steps-bfloat16-default-eps', '08_longrun', 'consistency',
    comparison='>=',
    bound=FULL_STEP_RATE,
    origin="theory: bfloat16's rounding noise is about 2^16 times float32's, far above 1e-8 (the formula's own limit)",
))
ADAM_SGD_STEPS_FLOAT32_DEFAULT_EPS = register_claim(ClaimSpec(
    'adam-sgd-steps-float32-default-eps', '08_longrun', 'test',
    bound=SGD_STEP_RATE,
    origin="theory: float32 rounding noise of b_k's gradient below eps",
    finding='adam-drift-regimes',
))
ADAM_DEFAULT_EPS_DAMPS_DRIFT = register_claim(ClaimSpec(
    'adam-default-eps-damps-drift', '08_longrun', 'test',
    bound=DAMPING_RATIO,
    origin='theory: the step shrinks by sigma / (sigma + eps) < 1/2 when sigma < eps',
    finding='adam-drift-regimes',
))
ADAM_DRIFT_RATIO_CONTROL_BFLOAT16 = register_claim(ClaimSpec(
    'adam-drift-ratio-control-bfloat16', '08_longrun', 'control',
    comparison='>',
    bound=DAMPING_RATIO,
    origin='the bound of the claim it protects',
))
